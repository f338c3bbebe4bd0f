"""Launch plans (pure): the pod's environment, its engine YAML and the Dynamo arguments in, what to run out.

No I/O here: `tokenfab.launcher.run` reads the engine file, chooses the run directory and carries the plan
out. The inputs are checked by tokenfab.launcher.identity (the environment) and
tokenfab.launcher.engine_shape (the engine YAML); tokenfab.launcher.weights decides about hf:// weights.
This module turns them into commands, and re-exports their names, so `tokenfab.launcher.plan` is the one
place callers import from. Every name the reconciler and the launcher share (environment variables, ports,
paths, programs, engine keys, DNS names) comes from tokenfab.planning, so the two agree by construction.

mpirun flags of a multi-node leader, and why:
- `-np W*G -H host0:G,...,host{W-1}:G --map-by slot`: one MPI process per GPU of the group, ranks
  0..G-1 on rank 0's pod, G..2G-1 on rank 1's pod and so on (TensorRT-LLM takes local rank = MPI rank
  modulo GPUs per node); hosts are the ranks' stable DNS names (`builders.worker_address`), kept as fully
  qualified names (OMPI_MCA_orte_keep_fqdn_hostnames=1, as NVIDIA Dynamo's operator does);
- `--bind-to none`: the processes start unbound and TensorRT-LLM/NCCL choose CPU and GPU affinity (Open
  MPI's default socket binding does not know which Grace CPU is next to which GPU);
- `--mca pml ob1`: MPI carries only TensorRT-LLM's control messages (NCCL moves the tensors over NVLink),
  so the plain TCP point-to-point layer is used and UCX's InfiniBand setup is skipped (as Dynamo does);
- `--mca plm_rsh_args "-p 2222 -i <key> ..."`: reach the followers' SSH daemons on contract.MPI_SSH_PORT
  with the Secret's key, non-interactively, without a known_hosts file (pods are recreated with new host
  keys; the network path is the cluster's);
- `-x NAME` for every variable of rank 0's environment but per-host ones: an SSH session starts with an
  empty environment, and all pods of a group have the same environment but rank and hostname;
- `--allow-run-as-root` only when the launcher runs as root (the worker image runs as a non-root user).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tokenfab.launcher.engine_shape import EngineShape, engine_shape
from tokenfab.launcher.identity import (
    DEFAULT_HEALTH_HOST,
    DEFAULT_PEER_WAIT_SECONDS,
    MODES,
    REQUIRED,
    ConfigError,
    Identity,
    read_identity,
)
from tokenfab.launcher.weights import (
    Fetch,
    WeightsSource,
    fetch_of,
    weights_source,
    with_model_path,
)
from tokenfab.planning import contract

__all__ = [
    "DEFAULT_HEALTH_HOST",
    "DEFAULT_PEER_WAIT_SECONDS",
    "EXIT_CONFIG",
    "LLMAPI_LAUNCH",
    "MODES",
    "MPIRUN",
    "MPI_ENV",
    "NOT_FORWARDED",
    "NOT_FORWARDED_PREFIXES",
    "PROGRAM",
    "REQUIRED",
    "RUN_AUTHORIZED_KEYS",
    "RUN_HOST_KEY",
    "RUN_KEY",
    "RUN_SSHD_CONFIG",
    "RUN_SSHD_PID",
    "SSHD",
    "SSH_KEYGEN",
    "ConfigError",
    "Copy",
    "Endpoint",
    "EngineShape",
    "Fetch",
    "Identity",
    "Kind",
    "LaunchPlan",
    "Step",
    "WeightsSource",
    "dynamo_command",
    "engine_shape",
    "fetch_of",
    "forwarded_names",
    "mpirun_command",
    "plan_launch",
    "read_identity",
    "sshd_config",
    "weights_source",
    "with_model_path",
]

PROGRAM = "tokenfab-launcher"
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: a configuration error

MPIRUN = "mpirun"
LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # TensorRT-LLM's wrapper for multi-node LLM-API runs
SSHD = "sshd"
SSH_KEYGEN = "ssh-keygen"

# Files in the run directory (a fresh private directory made by the process part).
RUN_KEY = "mpi_key"
RUN_AUTHORIZED_KEYS = "authorized_keys"
RUN_HOST_KEY = "ssh_host_ed25519_key"
RUN_SSHD_CONFIG = "sshd_config"
RUN_SSHD_PID = "sshd.pid"


# Environment not forwarded by mpirun to the other ranks: per-host values and MPI's own settings.
NOT_FORWARDED = frozenset(
    {
        "HOSTNAME",
        contract.ENV_RANK,
        contract.ENV_POD_NAME,
        contract.ENV_POD_UID,
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "ORTE_")
MPI_ENV = {
    "OMPI_MCA_orte_keep_fqdn_hostnames": "1",
    "PRTE_MCA_prte_keep_fqdn_hostnames": "1",
    # Open MPI's shared-memory single copy (CMA, process_vm_readv between a pod's ranks) needs ptrace rights
    # the hardened pods do not have (every capability dropped; RuntimeDefault seccomp allows the call only
    # on recent runtimes, and Yama may refuse siblings): "Read -1, expected ..., errno = 1" (open-mpi/ompi
    # issue 4948). Off, as its help text says: Open MPI 4's vader BTL, and 5's smsc framework (the
    # TensorRT-LLM image's default since 1.3.0rc27). An MCA variable one version does not know is ignored.
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_smsc": "^cma",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Kind = Literal["single", "leader", "follower"]


@dataclass(frozen=True)
class Copy:
    """Copy a mounted Secret file into the run directory, readable by the launcher's user only."""

    source: str
    target: str


@dataclass(frozen=True)
class Step:
    """A command that must succeed before the plan's command; `stdout` (if set) gets its output (0600)."""

    argv: tuple[str, ...]
    stdout: str | None = None


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


@dataclass(frozen=True)
class LaunchPlan:
    """What one worker pod does: prepare, wait, run `command`, answer health checks (followers)."""

    kind: Kind  # single: a one-pod group; leader: rank 0 of a multi-node group; follower: rank > 0
    role: str
    group: str
    rank: int
    world_size: int
    gpus_per_pod: int
    mode: str
    hosts: tuple[str, ...]
    engine: EngineShape
    dynamo_args: tuple[str, ...]
    command: tuple[str, ...]  # the long-running process; argv[0] is looked up on PATH
    env: Mapping[str, str] = field(default_factory=dict)  # added to the launcher's environment
    run_dir: str | None = None  # private directory (mode 0700) for the files below
    copies: tuple[Copy, ...] = ()  # written with mode 0600
    files: tuple[tuple[str, str], ...] = ()  # (path, content), written with mode 0600
    setup: tuple[Step, ...] = ()  # commands that must succeed before `command`
    wait_for: tuple[Endpoint, ...] = ()  # TCP endpoints that must accept connections first
    wait_seconds: int = 0
    health: Endpoint | None = None  # where the launcher itself answers /health and /metrics
    fetch: Fetch | None = None  # hf:// weights to download (or find in the cache) first

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["env"] = dict(self.env)
        out["files"] = dict(self.files)
        return out


def forwarded_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Variables mpirun forwards (-x) to the other ranks: rank 0's environment but per-host values."""
    return tuple(
        sorted(
            name
            for name in environ
            if _ENV_NAME.match(name)
            and name not in NOT_FORWARDED
            and not name.startswith(NOT_FORWARDED_PREFIXES)
        )
    )


def dynamo_command(dynamo_args: Sequence[str]) -> tuple[str, ...]:
    return (contract.PYTHON, "-m", contract.DYNAMO_WORKER_MODULE, *dynamo_args)


def ssh_args(key: str) -> str:
    """How mpirun reaches the followers' SSH daemons: their port, the Secret's key, no known_hosts."""
    return (
        f"-p {contract.MPI_SSH_PORT} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR"
    )


def mpirun_command(
    identity: Identity, key: str, dynamo_args: Sequence[str], forwarded: Sequence[str], *, as_root: bool
) -> tuple[str, ...]:
    """rank 0's command for a multi-node group: one MPI process per GPU over every rank's pod."""
    slots = identity.gpus_per_pod
    ssh = ssh_args(key)
    cmd = [MPIRUN, *(["--allow-run-as-root"] if as_root else [])]
    cmd += ["-np", str(identity.world_size * slots)]
    cmd += ["-H", ",".join(f"{host}:{slots}" for host in identity.hosts)]
    cmd += ["--map-by", "slot", "--bind-to", "none"]
    cmd += ["--mca", "pml", "ob1", "--mca", "plm_rsh_args", ssh]
    for name in forwarded:
        cmd += ["-x", name]
    return (*cmd, LLMAPI_LAUNCH, *dynamo_command(dynamo_args))


def sshd_config(identity: Identity, run_dir: str) -> str:
    """The followers' SSH daemon: the launcher's user, the Secret's public key, nothing else.

    StrictModes is off because the run directory lives under /tmp (world-writable, which StrictModes
    refuses as a parent); the files are the launcher's own, mode 0600 in a 0700 directory."""
    return "\n".join(
        [
            f"# Written by {PROGRAM}: rank {identity.rank} of group {identity.group}; mpirun on rank 0 "
            "connects here.",
            f"Port {contract.MPI_SSH_PORT}",
            f"HostKey {run_dir}/{RUN_HOST_KEY}",
            f"AuthorizedKeysFile {run_dir}/{RUN_AUTHORIZED_KEYS}",
            f"PidFile {run_dir}/{RUN_SSHD_PID}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "PermitUserEnvironment no",
            "StrictModes no",
            "UsePAM no",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PrintMotd no",
            "",
        ]
    )


def _checked_shape(identity: Identity, engine_text: str, dynamo_args: Sequence[str]) -> EngineShape:
    """The engine's shape, once the arguments and the engine YAML both hold (every problem at once)."""
    problems = []
    if not dynamo_args:
        problems.append(
            f"no arguments for `{' '.join(dynamo_command([]))}`: the pod's args (written by the operator "
            "from the ModelDeployment) are missing"
        )
    try:
        shape = engine_shape(engine_text, identity)
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return shape


def _leader_plan(
    identity: Identity,
    dynamo_args: Sequence[str],
    environ: Mapping[str, str],
    run_dir: str,
    as_root: bool,
    common: dict[str, Any],
) -> LaunchPlan:
    """Rank 0 of a multi-node group: wait for every other rank's SSH daemon, then mpirun over them all."""
    assert identity.mpi_ssh_dir is not None  # read_identity requires it for multi-node groups
    key = f"{run_dir}/{RUN_KEY}"
    return LaunchPlan(
        kind="leader",
        command=mpirun_command(identity, key, dynamo_args, forwarded_names(environ), as_root=as_root),
        # (Open MPI 5's launcher, PRRTE, reads its ssh arguments under this name; 4 reads plm_rsh_args)
        env={**MPI_ENV, "PRTE_MCA_plm_ssh_args": ssh_args(key)},
        run_dir=run_dir,
        copies=(Copy(f"{identity.mpi_ssh_dir}/{contract.MPI_SSH_PRIVATE_KEY}", key),),
        wait_for=tuple(Endpoint(host, contract.MPI_SSH_PORT) for host in identity.hosts[1:]),
        wait_seconds=identity.peer_wait_seconds,
        **common,
    )


def _follower_plan(identity: Identity, run_dir: str, common: dict[str, Any]) -> LaunchPlan:
    """Another rank of a multi-node group: an SSH daemon for rank 0's mpirun, and the health endpoint."""
    assert identity.mpi_ssh_dir is not None  # read_identity requires it for multi-node groups
    config = f"{run_dir}/{RUN_SSHD_CONFIG}"
    key = f"{run_dir}/{RUN_KEY}"
    return LaunchPlan(
        kind="follower",
        command=(SSHD, "-D", "-e", "-f", config),
        run_dir=run_dir,
        copies=(Copy(f"{identity.mpi_ssh_dir}/{contract.MPI_SSH_PRIVATE_KEY}", key),),
        files=((config, sshd_config(identity, run_dir)),),
        setup=(
            # This pod's own host key, then the one key sshd accepts: the Secret's, as rank 0 uses it.
            Step((SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", f"{run_dir}/{RUN_HOST_KEY}")),
            Step((SSH_KEYGEN, "-y", "-f", key), stdout=f"{run_dir}/{RUN_AUTHORIZED_KEYS}"),
        ),
        health=Endpoint(identity.health_host, identity.health_port),
        **common,
    )


def plan_launch(
    identity: Identity,
    engine_text: str,
    dynamo_args: Sequence[str],
    *,
    environ: Mapping[str, str],
    run_dir: str,
    as_root: bool,
) -> LaunchPlan:
    """The plan for one pod. `run_dir` is a fresh private directory (used by multi-node groups only)."""
    shape = _checked_shape(identity, engine_text, dynamo_args)
    common: dict[str, Any] = {
        "role": identity.role,
        "group": identity.group,
        "rank": identity.rank,
        "world_size": identity.world_size,
        "gpus_per_pod": identity.gpus_per_pod,
        "mode": identity.mode,
        "hosts": identity.hosts,
        "engine": shape,
        "dynamo_args": tuple(dynamo_args),
        "fetch": fetch_of(identity),
    }
    if identity.world_size == 1:
        return LaunchPlan(kind="single", command=dynamo_command(dynamo_args), **common)
    if identity.rank == 0:
        return _leader_plan(identity, dynamo_args, environ, run_dir, as_root, common)
    return _follower_plan(identity, run_dir, common)
