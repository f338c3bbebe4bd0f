"""A worker pod's group identity (pure): the environment the reconciler wrote, read and checked.

`read_identity` reports every problem of the environment at once, in a `ConfigError` whose messages name
the variable at fault and the fix; the launcher exits with EX_CONFIG on it. No I/O here: the caller passes
the environment in. The variable names come from tokenfab.planning.contract, as the reconciler's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenfab.api.models import ROLES
from tokenfab.planning import builders, contract, engine_config

DEFAULT_PEER_WAIT_SECONDS = contract.DEFAULT_PEER_WAIT_SECONDS  # image pulls of a new node take minutes
DEFAULT_HEALTH_HOST = "0.0.0.0"  # the kubelet probes the pod IP

MODES: tuple[str, ...] = (contract.MODE_AGGREGATED, *engine_config.DISAGGREGATED_ROLES)


class ConfigError(Exception):
    """The pod's configuration cannot work; `problems` name each variable or key at fault and the fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


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
    model_cache_set: bool = False  # TOKENFAB_MODEL_CACHE is set: the pod has a model cache volume

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every rank's stable DNS name, in rank order (rank 0 first)."""
        return tuple(
            builders.worker_address(self.group, r, self.workers_service, self.namespace)
            for r in range(self.world_size)
        )


REQUIRED = (
    contract.ENV_ROLE,
    contract.ENV_GROUP,
    contract.ENV_RANK,
    contract.ENV_WORLD_SIZE,
    contract.ENV_GPUS_PER_POD,
    contract.ENV_LEADER_ADDRESS,
    contract.ENV_WORKERS_SERVICE,
    contract.ENV_NAMESPACE,
    contract.ENV_ENGINE_CONFIG,
    contract.ENV_MODEL_NAME,
    contract.ENV_MODEL_PATH,
    contract.ENV_DISAGGREGATION_MODE,
)


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _int(environ: Mapping[str, str], name: str, problems: list[str], *, low: int) -> int | None:
    """The variable as an integer >= low; None when unset or wrong (a wrong value is a problem)."""
    raw = _get(environ, name)
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


def _missing(environ: Mapping[str, str]) -> list[str]:
    return [
        f"{name} is not set: the tokenfab operator sets it on every worker pod (run the launcher in a "
        "pod the operator created, or set it by hand)"
        for name in REQUIRED
        if not _get(environ, name)
    ]


def _numbers(environ: Mapping[str, str], problems: list[str]) -> tuple[int, int, int, int, int]:
    """(rank, world size, GPUs per pod, health port, peer wait seconds), defaults for unset ones."""
    rank_or_none = _int(environ, contract.ENV_RANK, problems, low=0)
    world_or_none = _int(environ, contract.ENV_WORLD_SIZE, problems, low=1)
    gpus = _int(environ, contract.ENV_GPUS_PER_POD, problems, low=1) or 1
    port = _int(environ, contract.ENV_DYN_SYSTEM_PORT, problems, low=1) or contract.WORKER_METRICS_PORT
    if port > 65535:
        problems.append(f"{contract.ENV_DYN_SYSTEM_PORT}={port} is not a TCP port (1-65535)")
    wait = _int(environ, contract.ENV_PEER_WAIT_SECONDS, problems, low=0)
    wait = DEFAULT_PEER_WAIT_SECONDS if wait is None else wait
    rank, world = rank_or_none or 0, world_or_none or 1
    if rank_or_none is not None and world_or_none is not None and rank >= world:
        problems.append(
            f"{contract.ENV_RANK}={rank} is not below {contract.ENV_WORLD_SIZE}={world}: a group's "
            f"ranks are 0.."
            f"{world - 1}; this pod does not belong to the group it names (delete the group's pods so the "
            "operator recreates them)"
        )
    return rank, world, gpus, port, wait


def _role_and_mode(environ: Mapping[str, str], problems: list[str]) -> tuple[str, str]:
    """The worker's role and disaggregation mode, which must fit each other."""
    role = _get(environ, contract.ENV_ROLE)
    if role and role not in ROLES:
        problems.append(f"{contract.ENV_ROLE}={role!r} is not a role: use one of {', '.join(ROLES)}")
    mode = _get(environ, contract.ENV_DISAGGREGATION_MODE)
    if mode and mode not in MODES:
        problems.append(
            f"{contract.ENV_DISAGGREGATION_MODE}={mode!r} is not a mode: use one of {', '.join(MODES)}"
        )
    elif role in ROLES and mode in MODES:
        expected = role if role in engine_config.DISAGGREGATED_ROLES else contract.MODE_AGGREGATED
        if mode != expected:
            problems.append(
                f"{contract.ENV_DISAGGREGATION_MODE}={mode!r} does not fit "
                f"{contract.ENV_ROLE}={role!r}: a {role} worker "
                f"runs in mode {expected!r}"
            )
    return role, mode


def _ssh_dir(environ: Mapping[str, str], world: int, problems: list[str]) -> str | None:
    """Where the MPI key pair is mounted: a multi-node group needs it."""
    ssh_dir = _get(environ, contract.ENV_MPI_SSH_DIR) or None
    if world > 1 and ssh_dir is None:
        problems.append(
            f"{contract.ENV_MPI_SSH_DIR} is not set, but the group has {world} ranks: a multi-node "
            f"group needs the "
            f"key pair of Secret {contract.MPI_SSH_SECRET} mounted (the operator mounts it at "
            f"{contract.MPI_SSH_DIR} and "
            "sets the variable)"
        )
    return ssh_dir


def _addresses(environ: Mapping[str, str], problems: list[str]) -> tuple[str, str, str, str]:
    """(group, workers Service, namespace, leader address); the leader must be rank 0's address."""
    group = _get(environ, contract.ENV_GROUP)
    service = _get(environ, contract.ENV_WORKERS_SERVICE)
    namespace = _get(environ, contract.ENV_NAMESPACE)
    leader = _get(environ, contract.ENV_LEADER_ADDRESS)
    if group and service and namespace and leader:
        expected_leader = builders.worker_address(group, 0, service, namespace)
        if leader != expected_leader:
            problems.append(
                f"{contract.ENV_LEADER_ADDRESS}={leader!r} is not rank 0's address {expected_leader!r} (from "
                f"{contract.ENV_GROUP}, {contract.ENV_WORKERS_SERVICE} and "
                f"{contract.ENV_NAMESPACE}): the pod's variables "
                "disagree; delete the group's pods so the operator recreates them"
            )
    return group, service, namespace, leader


def read_identity(environ: Mapping[str, str]) -> Identity:
    """The group identity from the environment; every problem is reported at once."""
    problems = _missing(environ)
    rank, world, gpus, port, wait = _numbers(environ, problems)
    role, mode = _role_and_mode(environ, problems)
    ssh_dir = _ssh_dir(environ, world, problems)
    group, service, namespace, leader = _addresses(environ, problems)
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
        engine_config=environ[contract.ENV_ENGINE_CONFIG].strip(),
        model_name=environ[contract.ENV_MODEL_NAME].strip(),
        model_path=environ[contract.ENV_MODEL_PATH].strip(),
        model_source=_get(environ, contract.ENV_MODEL_SOURCE),
        model_revision=_get(environ, contract.ENV_MODEL_REVISION) or None,
        model_cache=_get(environ, contract.ENV_MODEL_CACHE) or contract.MODEL_CACHE_DIR,
        mpi_ssh_dir=ssh_dir,
        health_host=_get(environ, contract.ENV_DYN_SYSTEM_HOST) or DEFAULT_HEALTH_HOST,
        health_port=port,
        peer_wait_seconds=wait,
        model_cache_set=bool(_get(environ, contract.ENV_MODEL_CACHE)),
    )
