"""Launch plans (pure): the pod's environment, its engine YAML and the Dynamo arguments in, what to run out.

No I/O here: `tokenfab.launcher.run` reads the engine file, chooses the run directory and carries the plan
out. Every name the reconciler and the launcher share (environment variables, ports, paths, programs,
engine keys, DNS names) comes from tokenfab.planning, so the two agree by construction.

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

import yaml

from tokenfab.api.models import ROLES
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning import engine as eng

PROGRAM = "tokenfab-launcher"
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: a configuration error

MPIRUN = "mpirun"
LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # TensorRT-LLM's wrapper for multi-node LLM-API runs
SSHD = "sshd"
SSH_KEYGEN = "ssh-keygen"

DEFAULT_PEER_WAIT_SECONDS = 1800  # image pulls of a new node can take many minutes
DEFAULT_HEALTH_HOST = "0.0.0.0"  # the kubelet probes the pod IP

# Files in the run directory (a fresh private directory made by the process part).
RUN_KEY = "mpi_key"
RUN_AUTHORIZED_KEYS = "authorized_keys"
RUN_HOST_KEY = "ssh_host_ed25519_key"
RUN_SSHD_CONFIG = "sshd_config"
RUN_SSHD_PID = "sshd.pid"

MODES: tuple[str, ...] = (c.MODE_AGGREGATED, *eng.DISAGGREGATED_ROLES)

# Environment not forwarded by mpirun to the other ranks: per-host values and MPI's own settings.
NOT_FORWARDED = frozenset(
    {
        "HOSTNAME",
        c.ENV_RANK,
        c.ENV_POD_NAME,
        c.ENV_POD_UID,
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "ORTE_")
MPI_ENV = {"OMPI_MCA_orte_keep_fqdn_hostnames": "1", "PRTE_MCA_prte_keep_fqdn_hostnames": "1"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Kind = Literal["single", "leader", "follower"]


class ConfigError(Exception):
    """The pod's configuration cannot work; `problems` name each variable or key at fault and the fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# -------------------------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class Identity:
    """A worker pod's place in its group, as the reconciler wrote it into the environment."""

    role: str
    group: str
    rank: int
    world_size: int
    gpus_per_pod: int
    leader_address: str
    workers_service: str
    namespace: str
    mode: str
    engine_config: str
    model_name: str
    model_path: str
    model_source: str
    model_revision: str | None
    model_cache: str
    mpi_ssh_dir: str | None
    health_host: str
    health_port: int
    peer_wait_seconds: int

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every rank's stable DNS name, in rank order (rank 0 first)."""
        return tuple(
            b.worker_address(self.group, r, self.workers_service, self.namespace)
            for r in range(self.world_size)
        )


REQUIRED = (
    c.ENV_ROLE,
    c.ENV_GROUP,
    c.ENV_RANK,
    c.ENV_WORLD_SIZE,
    c.ENV_GPUS_PER_POD,
    c.ENV_LEADER_ADDRESS,
    c.ENV_WORKERS_SERVICE,
    c.ENV_NAMESPACE,
    c.ENV_ENGINE_CONFIG,
    c.ENV_MODEL_NAME,
    c.ENV_MODEL_PATH,
    c.ENV_DISAGGREGATION_MODE,
)


def _int(environ: Mapping[str, str], name: str, problems: list[str], *, low: int) -> int | None:
    """The variable as an integer >= low; None when unset or wrong (a wrong value is a problem)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{name}={raw!r} is not an integer")
        return None
    if value < low:
        problems.append(f"{name}={value} must be at least {low}")
        return None
    return value


def read_identity(environ: Mapping[str, str]) -> Identity:
    """The group identity from the environment; every problem is reported at once."""
    problems = [
        f"{name} is not set: the tokenfab operator sets it on every worker pod (run the launcher in a "
        "pod the operator created, or set it by hand)"
        for name in REQUIRED
        if not environ.get(name, "").strip()
    ]
    rank_or_none = _int(environ, c.ENV_RANK, problems, low=0)
    world_or_none = _int(environ, c.ENV_WORLD_SIZE, problems, low=1)
    gpus = _int(environ, c.ENV_GPUS_PER_POD, problems, low=1) or 1
    port = _int(environ, c.ENV_DYN_SYSTEM_PORT, problems, low=1) or c.WORKER_METRICS_PORT
    if port > 65535:
        problems.append(f"{c.ENV_DYN_SYSTEM_PORT}={port} is not a TCP port (1-65535)")
    wait = _int(environ, c.ENV_PEER_WAIT_SECONDS, problems, low=0)
    wait = DEFAULT_PEER_WAIT_SECONDS if wait is None else wait
    rank, world = rank_or_none or 0, world_or_none or 1
    if rank_or_none is not None and world_or_none is not None and rank >= world:
        problems.append(
            f"{c.ENV_RANK}={rank} is not below {c.ENV_WORLD_SIZE}={world}: a group's ranks are 0.."
            f"{world - 1}; this pod does not belong to the group it names (delete the group's pods so the "
            "operator recreates them)"
        )
    role = environ.get(c.ENV_ROLE, "").strip()
    if role and role not in ROLES:
        problems.append(f"{c.ENV_ROLE}={role!r} is not a role: use one of {', '.join(ROLES)}")
    mode = environ.get(c.ENV_DISAGGREGATION_MODE, "").strip()
    if mode and mode not in MODES:
        problems.append(f"{c.ENV_DISAGGREGATION_MODE}={mode!r} is not a mode: use one of {', '.join(MODES)}")
    elif role in ROLES and mode in MODES:
        expected = role if role in eng.DISAGGREGATED_ROLES else c.MODE_AGGREGATED
        if mode != expected:
            problems.append(
                f"{c.ENV_DISAGGREGATION_MODE}={mode!r} does not fit {c.ENV_ROLE}={role!r}: a {role} worker "
                f"runs in mode {expected!r}"
            )
    ssh_dir = environ.get(c.ENV_MPI_SSH_DIR, "").strip() or None
    if world > 1 and ssh_dir is None:
        problems.append(
            f"{c.ENV_MPI_SSH_DIR} is not set, but the group has {world} ranks: a multi-node group needs the "
            f"key pair of Secret {c.MPI_SSH_SECRET} mounted (the operator mounts it at {c.MPI_SSH_DIR} and "
            "sets the variable)"
        )
    group = environ.get(c.ENV_GROUP, "").strip()
    service = environ.get(c.ENV_WORKERS_SERVICE, "").strip()
    namespace = environ.get(c.ENV_NAMESPACE, "").strip()
    leader = environ.get(c.ENV_LEADER_ADDRESS, "").strip()
    if group and service and namespace and leader:
        expected_leader = b.worker_address(group, 0, service, namespace)
        if leader != expected_leader:
            problems.append(
                f"{c.ENV_LEADER_ADDRESS}={leader!r} is not rank 0's address {expected_leader!r} (from "
                f"{c.ENV_GROUP}, {c.ENV_WORKERS_SERVICE} and {c.ENV_NAMESPACE}): the pod's variables "
                "disagree; delete the group's pods so the operator recreates them"
            )
    if problems:
        raise ConfigError(problems)
    return Identity(
        role=role,
        group=group,
        rank=rank,
        world_size=world,
        gpus_per_pod=gpus,
        leader_address=leader,
        workers_service=service,
        namespace=namespace,
        mode=mode,
        engine_config=environ[c.ENV_ENGINE_CONFIG].strip(),
        model_name=environ[c.ENV_MODEL_NAME].strip(),
        model_path=environ[c.ENV_MODEL_PATH].strip(),
        model_source=environ.get(c.ENV_MODEL_SOURCE, "").strip(),
        model_revision=environ.get(c.ENV_MODEL_REVISION, "").strip() or None,
        model_cache=environ.get(c.ENV_MODEL_CACHE, "").strip() or c.MODEL_CACHE_DIR,
        mpi_ssh_dir=ssh_dir,
        health_host=environ.get(c.ENV_DYN_SYSTEM_HOST, "").strip() or DEFAULT_HEALTH_HOST,
        health_port=port,
        peer_wait_seconds=wait,
    )


# ---------------------------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class EngineShape:
    """What the launcher checks and reports of the engine YAML."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    context_parallel_size: int
    moe_expert_parallel_size: int | None
    enable_attention_dp: bool
    mtp_depth: int  # 0: no multi-token prediction

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size


def _positive(cfg: Mapping[str, Any], key: str, where: str, problems: list[str], default: int | None) -> int:
    value = cfg.get(key, default)
    if value is None:
        problems.append(f"{where}: {key} is missing (tokenfab writes it from the role's parallelism)")
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"{where}: {key} must be a positive integer, got {value!r}")
        return 1
    return value


def engine_shape(text: str, identity: Identity) -> EngineShape:
    """Parse and check the engine YAML against the group: its GPUs must be world size x GPUs per pod."""
    where = f"engine config {identity.engine_config} (from {c.ENV_ENGINE_CONFIG})"
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError([f"{where} is not valid YAML: {detail}"]) from exc
    if not isinstance(cfg, dict):
        raise ConfigError(
            [f"{where} must be a mapping of TensorRT-LLM LLM-API keys, got {type(cfg).__name__}"]
        )
    problems: list[str] = []
    tp = _positive(cfg, eng.TENSOR_PARALLEL_SIZE, where, problems, None)
    pp = _positive(cfg, eng.PIPELINE_PARALLEL_SIZE, where, problems, 1)
    cp = _positive(cfg, eng.CONTEXT_PARALLEL_SIZE, where, problems, 1)
    ep_raw = cfg.get(eng.MOE_EXPERT_PARALLEL_SIZE)
    ep = _positive(cfg, eng.MOE_EXPERT_PARALLEL_SIZE, where, problems, 1) if ep_raw is not None else None
    mtp = 0
    spec_cfg = cfg.get(eng.SPECULATIVE_CONFIG)
    if spec_cfg is not None:
        if not isinstance(spec_cfg, dict):
            problems.append(f"{where}: {eng.SPECULATIVE_CONFIG} must be a mapping, got {spec_cfg!r}")
        elif spec_cfg.get("decoding_type") == eng.MTP_DECODING_TYPE:
            legacy = eng.MTP_LAYERS not in spec_cfg and eng.LEGACY_MTP_LAYERS in spec_cfg
            key = eng.LEGACY_MTP_LAYERS if legacy else eng.MTP_LAYERS
            mtp = _positive(spec_cfg, key, f"{where}: {eng.SPECULATIVE_CONFIG}", problems, None)
    if not problems:
        group_gpus = identity.world_size * identity.gpus_per_pod
        if tp * pp * cp != group_gpus:
            factors = [f"{eng.TENSOR_PARALLEL_SIZE} x {eng.PIPELINE_PARALLEL_SIZE}", f"{tp} x {pp}"]
            if cp != 1:
                factors = [f"{factors[0]} x {eng.CONTEXT_PARALLEL_SIZE}", f"{factors[1]} x {cp}"]
            problems.append(
                f"{where}: {factors[0]} = {factors[1]} = {tp * pp * cp} GPUs, but the group has "
                f"{c.ENV_WORLD_SIZE} x {c.ENV_GPUS_PER_POD} = {identity.world_size} x "
                f"{identity.gpus_per_pod} = {group_gpus} GPUs: the engine ConfigMap and the pods come from "
                "different revisions of the ModelDeployment (or one was edited by hand); delete the "
                "group's pods so the operator recreates them from one revision"
            )
    if problems:
        raise ConfigError(problems)
    return EngineShape(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        context_parallel_size=cp,
        moe_expert_parallel_size=ep,
        enable_attention_dp=bool(cfg.get(eng.ENABLE_ATTENTION_DP, False)),
        mtp_depth=mtp,
    )


# ------------------------------------------------------------------------------------------------ plan


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
class Fetch:
    """Weights from a model hub, at a revision, into the node's model cache, before anything starts: every
    rank of a group loads its shard from the same local snapshot (the engine gets its path)."""

    repo: str
    revision: str | None  # None: the hub's main branch
    cache_dir: str


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


def fetch_of(identity: Identity) -> Fetch | None:
    """hf:// sources are downloaded by the launcher (at model.revision, into the model cache volume); pvc://
    weights are mounted and need nothing."""
    scheme, _, rest = identity.model_source.partition("://")
    if scheme != "hf" or not rest:
        return None
    return Fetch(rest, identity.model_revision, identity.model_cache)


# Written into a snapshot's directory once a download of it completed (an interrupted one leaves none).
COMPLETE_MARKER = ".tokenfab-complete"
_COMMIT = re.compile(r"[0-9a-f]{40}")

WeightsSource = Literal["cache", "download", "offline"]


def weights_source(revision: str | None, cached: bool, complete: bool, offline: bool) -> WeightsSource:
    """Where the launcher takes hf:// weights from:
    - "cache": a pinned commit whose snapshot a completed download left in the cache (what it is can
      never change);
    - "offline": HF_HUB_OFFLINE, whatever the cache holds;
    - "download" otherwise: the hub resolves a branch or tag to its current commit and fetches what the
      cache lacks (nothing, for a complete snapshot), so every rank of a group loads the same commit."""
    if offline:
        return "offline"
    if cached and complete and revision is not None and _COMMIT.fullmatch(revision):
        return "cache"
    return "download"


def with_model_path(command: Sequence[str], path: str) -> tuple[str, ...]:
    """The command with the engine's --model-path (or --model) pointing at `path`: the fetched snapshot."""
    out = list(command)
    for flag in ("--model-path", "--model"):
        if flag in out and out.index(flag) + 1 < len(out):
            out[out.index(flag) + 1] = path
            return tuple(out)
    raise ConfigError([f"the engine command has no --model-path to point at {path}: {' '.join(command)}"])


def dynamo_command(dynamo_args: Sequence[str]) -> tuple[str, ...]:
    return (c.PYTHON, "-m", c.DYNAMO_WORKER_MODULE, *dynamo_args)


def mpirun_command(
    identity: Identity, key: str, dynamo_args: Sequence[str], forwarded: Sequence[str], *, as_root: bool
) -> tuple[str, ...]:
    """rank 0's command for a multi-node group: one MPI process per GPU over every rank's pod."""
    slots = identity.gpus_per_pod
    ssh = (
        f"-p {c.MPI_SSH_PORT} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR"
    )
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
            f"Port {c.MPI_SSH_PORT}",
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
    assert identity.mpi_ssh_dir is not None  # read_identity requires it for multi-node groups
    if identity.rank == 0:
        key = f"{run_dir}/{RUN_KEY}"
        return LaunchPlan(
            kind="leader",
            command=mpirun_command(identity, key, dynamo_args, forwarded_names(environ), as_root=as_root),
            env=dict(MPI_ENV),
            run_dir=run_dir,
            copies=(Copy(f"{identity.mpi_ssh_dir}/{c.MPI_SSH_PRIVATE_KEY}", key),),
            wait_for=tuple(Endpoint(host, c.MPI_SSH_PORT) for host in identity.hosts[1:]),
            wait_seconds=identity.peer_wait_seconds,
            **common,
        )
    config = f"{run_dir}/{RUN_SSHD_CONFIG}"
    key = f"{run_dir}/{RUN_KEY}"
    return LaunchPlan(
        kind="follower",
        command=(SSHD, "-D", "-e", "-f", config),
        run_dir=run_dir,
        copies=(Copy(f"{identity.mpi_ssh_dir}/{c.MPI_SSH_PRIVATE_KEY}", key),),
        files=((config, sshd_config(identity, run_dir)),),
        setup=(
            # This pod's own host key, then the one key sshd accepts: the Secret's, as rank 0 uses it.
            Step((SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", f"{run_dir}/{RUN_HOST_KEY}")),
            Step((SSH_KEYGEN, "-y", "-f", key), stdout=f"{run_dir}/{RUN_AUTHORIZED_KEYS}"),
        ),
        health=Endpoint(identity.health_host, identity.health_port),
        **common,
    )
