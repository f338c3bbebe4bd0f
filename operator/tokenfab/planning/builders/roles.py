"""Facts of a role that follow from the spec: its group shape, a worker's resources, where its pods may
run."""

from __future__ import annotations

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning.capacity import Constraints, Toleration, to_units
from tokenfab.planning.topology import GroupShape

# Requests per GPU when runtime.resources leaves CPU or memory out (a GB200 tray has 144 cores and
# 960 GiB for 4 GPUs): the scheduler and the placement ledger count them.
DEFAULT_CPU_PER_GPU = 4
DEFAULT_MEMORY_GI_PER_GPU = 32


def group_shape(spec: ModelDeploymentSpec, role: RoleName) -> GroupShape:
    r = spec.role(role)
    if r is None:
        raise ValueError(f"the deployment has no {role} role")
    return GroupShape(
        gpus=r.parallelism.tensor * r.parallelism.pipeline, gpus_per_node=spec.topology.gpus_per_node
    )


def pod_requests(spec: ModelDeploymentSpec, role: RoleName) -> dict[str, int]:
    """What one worker pod of the role requests, in the ledger's units (GPUs, CPU, memory, ...)."""
    requests, _ = worker_resources(spec, role)
    out: dict[str, int] = {}
    for name, value in requests.items():
        try:
            out[name] = to_units(name, value)
        except ValueError:
            continue
    return out


def worker_resources(spec: ModelDeploymentSpec, role: RoleName) -> tuple[dict[str, str], dict[str, str]]:
    """Requests and limits of one worker container: the spec's, the GPUs parallelism implies, and CPU and
    memory requests per GPU where the spec leaves them out."""
    res = spec.runtime.resources
    gpus = group_shape(spec, role).pod_gpus
    gpu = {spec.topology.gpu_resource: str(gpus)}
    requests = {k: str(v) for k, v in res.requests.items()}
    limits = {k: str(v) for k, v in res.limits.items()}
    for name, value in limits.items():  # as Kubernetes defaults them (and the ledger must count them), e.g.
        requests.setdefault(name, value)  # the RDMA devices of runtime.resources.limits
    requests.setdefault("cpu", limits.get("cpu", str(DEFAULT_CPU_PER_GPU * gpus)))
    requests.setdefault("memory", limits.get("memory", f"{DEFAULT_MEMORY_GI_PER_GPU * gpus}Gi"))
    return {**requests, **gpu}, {**limits, **gpu}


def placement_constraints(spec: ModelDeploymentSpec) -> Constraints:
    """Which nodes the deployment's worker pods may run on, for placement."""
    sched = spec.scheduling
    selector = dict(sched.node_selector) if sched is not None else {}
    tolerations = tuple(
        Toleration(t.key or "", t.operator, t.value or "", t.effect or "")
        for t in (sched.tolerations if sched is not None else [])
    )
    return Constraints(
        domain_label=spec.topology.domain_label,
        gpu_resource=spec.topology.gpu_resource,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tolerations,
    )
