"""The worker pods of one group, composed from the per-concern parts: placement, engine, security,
probes and volumes.

One pod per node, ranks 0..n-1, each pinned by node affinity to the group's NVLink domain (and to the
node placement reserved for it); rank 0 is the group's leader. restartPolicy Never: a failed rank fails
its pod, and the operator recreates the whole group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract
from tokenfab.planning.builders.common import (
    Manifest,
    Owner,
    child_meta,
    group_name,
    pod_name,
    workers_service_name,
)
from tokenfab.planning.builders.fetch import weights_init_container
from tokenfab.planning.builders.placement import (
    GangMode,
    compute_domain_claims,
    container_claims,
    gang_fields,
    gang_of,
    node_affinity,
    scheduling_fields,
    worker_tolerations,
)
from tokenfab.planning.builders.probes import (
    readiness_gates,
    startup_budget,
    termination_grace_seconds,
    worker_lifecycle,
    worker_readiness_probe,
    worker_startup_probe,
)
from tokenfab.planning.builders.roles import group_shape, worker_resources
from tokenfab.planning.builders.security import POD_SECURITY, container_security, pod_identity
from tokenfab.planning.builders.volumes import (
    Volumes,
    fetches_weights,
    group_volumes,
    pod_mounts,
    pod_volumes,
    topology_volume,
)
from tokenfab.planning.builders.worker import worker_args, worker_env
from tokenfab.planning.engine_config import content_hash, engine_config
from tokenfab.planning.topology import GroupShape


@dataclass(frozen=True)
class _Group:
    """What every pod of one group shares."""

    owner: Owner
    spec: ModelDeploymentSpec
    role: RoleName
    slot: int
    domain: str
    revision: str
    shape: GroupShape
    name: str
    service: str
    gang: GangMode | None
    assigned: dict[int, str]  # rank -> the node placement reserved for it
    volumes: Volumes
    mounts: Volumes
    requests: dict[str, str]
    limits: dict[str, str]
    engine_hash: str
    unit: int | None = None  # its prefill-decode unit (planning.units)
    rdma: str = ""  # the RDMA device resource its pods hold (its unit spans NVLink domains), if any


@dataclass(frozen=True)
class GroupAt:
    """One group whose pods to render, and where they go: its role, slot and revision; the NVLink domain
    it is pinned to and, when `nodes` are given (one per rank of `ranks`, or per rank of the group), each
    pod's node; how it binds all or nothing (`gang`); how its nodes' model caches stand (`start_path`:
    warm, fetching, cold); its prefill-decode unit (planning.units), whose IMEX channel its pods claim; and
    the RDMA device resource each pod asks for, one, with IPC_LOCK, when its unit spans NVLink domains
    (its KV crosses the network: UCX over RDMA)."""

    role: RoleName
    slot: int
    domain: str
    revision: str
    nodes: Sequence[str] = ()
    ranks: Sequence[int] = ()
    gang: GangMode = "gates"
    start_path: str = ""
    unit: int | None = None
    rdma: str = ""


def group_pods(owner: Owner, spec: ModelDeploymentSpec, at: GroupAt) -> list[Manifest]:
    """Pods of one group (all ranks, or `at.ranks`), pinned to `at.domain` and, when `at.nodes` are given,
    each to its node.

    A multi-node group binds all or nothing: with `gang` "gates" its pods carry tokenfab's scheduling gate,
    lifted for the whole group once every pod exists; with "podgroup" they name the group's PodGroup
    (scheduling.k8s.io gang policy, minCount = all ranks), and the scheduler binds none before all fit.
    (With an IMEX channel claim the executor writes the PodGroup last, once every pod's claim exists:
    `admits_late`.) The start path is noted on each pod of a deployment that fetches its weights, so the
    autoscaler learns each path's start time: none given is cold (no cache kept, or none there yet); a
    deployment whose weights are mounted from a claim has no start path."""
    role = at.role
    r = spec.role(role)
    assert r is not None
    shape = group_shape(spec, role)
    wanted = list(at.ranks) if at.ranks else list(range(shape.nodes))
    if at.nodes and len(at.nodes) != len(wanted):
        raise ValueError(
            f"{len(at.nodes)} nodes for {len(wanted)} ranks of group {group_name(owner, role, at.slot)}"
        )
    assigned = dict(zip(wanted, at.nodes, strict=True)) if at.nodes else {}
    group = _group(owner, spec, at, shape, assigned, gang_of(spec, role, at.gang))
    if at.rdma:  # (a count the spec gives for the same resource stands)
        requests, limits = {at.rdma: "1", **group.requests}, {at.rdma: "1", **group.limits}
        group = replace(group, rdma=at.rdma, requests=requests, limits=limits)
    pods = [_pod(group, rank) for rank in wanted]
    path = (at.start_path or "cold") if fetches_weights(spec) else ""
    for p in pods if path else []:
        p["metadata"]["annotations"][contract.ANN_START_PATH] = path
    return pods


def _group(
    owner: Owner,
    spec: ModelDeploymentSpec,
    at: GroupAt,
    shape: GroupShape,
    assigned: dict[int, str],
    gang: GangMode | None,
) -> _Group:
    role, revision = at.role, at.revision
    volumes, mounts = group_volumes(owner, spec, role, revision, shape.nodes > 1)
    requests, limits = worker_resources(spec, role)
    return _Group(
        owner=owner,
        spec=spec,
        role=role,
        slot=at.slot,
        domain=at.domain,
        revision=revision,
        shape=shape,
        name=group_name(owner, role, at.slot),
        service=workers_service_name(owner),
        gang=gang,
        assigned=assigned,
        volumes=volumes,
        mounts=mounts,
        requests=requests,
        limits=limits,
        engine_hash=content_hash(engine_config(spec, role)),
        unit=at.unit,
    )


def _pod(g: _Group, rank: int) -> Manifest:
    node = g.assigned.get(rank)
    drain = g.spec.serving.drain_seconds
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(g.name, rank),
        "subdomain": g.service,
        **pod_identity(g.owner, g.spec),
        "securityContext": POD_SECURITY,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": termination_grace_seconds(drain),
        "affinity": node_affinity(g.spec, g.domain, node),
        "tolerations": worker_tolerations(g.spec),
        **_init_containers(g),
        "containers": [_container(g, rank)],
        "volumes": [*pod_volumes(g.owner, g.spec, g.volumes, node), *topology_volume(g.unit)[0]],
        **scheduling_fields(g.spec),
        **readiness_gates(rank, drain),
        **gang_fields(g.gang, g.name),
        **compute_domain_claims(g.owner, g.spec, g.role, g.name, g.unit),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_meta(g, rank, node), "spec": pod_spec}


# What the weights init container mounts of the worker's volumes: the source (pvc:// weights), the model
# cache it fills, /tmp and the caches (the hub client's own files).
FETCH_MOUNTS = frozenset({"model", "model-cache", "tmp", "cache"})


def _init_containers(g: _Group) -> dict[str, Any]:
    mounts = [m for m in pod_mounts(g.spec, g.mounts) if m["name"] in FETCH_MOUNTS]
    init = weights_init_container(g.spec, mounts)
    return {"initContainers": init} if init else {}


def _container(g: _Group, rank: int) -> dict[str, Any]:
    multi_node = g.shape.nodes > 1
    return {
        "name": "worker",
        "image": g.spec.runtime.image,
        # The launcher starts `python3 -m dynamo.trtllm <args>` (under mpirun on rank 0 of a
        # multi-node group; an SSH daemon for mpirun on the other ranks): see tokenfab.launcher.
        "command": [contract.PYTHON, "-m", contract.LAUNCHER_MODULE],
        "args": worker_args(g.spec, g.role),
        "env": worker_env(g.owner, g.spec, g.role, g.name, rank, g.shape, g.revision, g.service, g.unit),
        "ports": [
            {"name": "metrics", "containerPort": contract.WORKER_METRICS_PORT},
            *([{"name": "mpi-ssh", "containerPort": contract.MPI_SSH_PORT}] if multi_node else []),
        ],
        "startupProbe": worker_startup_probe(startup_budget(g.spec, g.shape.nodes)),
        "readinessProbe": worker_readiness_probe(),
        "resources": {"requests": g.requests, "limits": g.limits, **container_claims(g.spec, g.role)},
        "securityContext": container_security(g.spec, (contract.CAP_IPC_LOCK,) if g.rdma else ()),
        "volumeMounts": [*pod_mounts(g.spec, g.mounts), *topology_volume(g.unit)[1]],
        "lifecycle": worker_lifecycle(),
    }


def _pod_meta(g: _Group, rank: int, node: str | None) -> dict[str, Any]:
    """The pod's labels (its role, group, slot, rank, revision and domain) and annotations (its engine
    config's hash, its group's size, metrics scraping, and the nodes placement reserved)."""
    labels = {
        contract.LABEL_ROLE: g.role,
        contract.LABEL_GROUP: g.name,
        contract.LABEL_SLOT: str(g.slot),
        contract.LABEL_RANK: str(rank),
        contract.LABEL_REVISION: g.revision,
        contract.LABEL_DOMAIN: g.domain,
        **({contract.LABEL_PEERS: "true"} if g.shape.nodes > 1 else {}),
        **({contract.LABEL_UNIT: str(g.unit)} if g.unit is not None else {}),
        **({contract.LABEL_KV_NETWORK: contract.KV_NETWORK_RDMA} if g.rdma else {}),
    }
    meta = child_meta(g.owner, pod_name(g.name, rank), "worker", labels)
    meta["annotations"] = {
        contract.ANN_ENGINE_HASH: g.engine_hash,
        contract.ANN_GROUP_SIZE: str(g.shape.nodes),
        contract.ANN_GROUP_GPUS: str(g.shape.gpus),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(contract.WORKER_METRICS_PORT),
    }
    if node is not None:
        meta["annotations"][contract.ANN_NODE] = node
        if len(g.assigned) == g.shape.nodes:
            meta["annotations"][contract.ANN_GROUP_NODES] = ",".join(
                g.assigned[i] for i in sorted(g.assigned)
            )
    return meta
