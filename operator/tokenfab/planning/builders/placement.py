"""Where a group's pods run and how they bind: node affinity to the group's NVLink domain (and to the
node reserved for each rank), tolerations and the spec's scheduling fields, the all-or-nothing gang (a
scheduling gate or a PodGroup) and the NVIDIA ComputeDomain whose IMEX channel the pods claim: one per
prefill-decode unit of a disaggregated deployment (planning.units: every pod of the unit that fills its
nodes claims it, prefill and decode alike, as Dynamo's GB200 recipes share one), else one per multi-node
group."""

from __future__ import annotations

from typing import Any, Literal

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract
from tokenfab.planning.builders.common import (
    Manifest,
    Owner,
    child_meta,
    compute_domain_name,
    group_name,
    unit_domain_name,
)
from tokenfab.planning.builders.roles import group_shape
from tokenfab.planning.units import UNIT_ROLES, rule

GangMode = Literal["podgroup", "gates"]


def uses_compute_domain(spec: ModelDeploymentSpec, role: RoleName) -> bool:
    """Whether the role's pods claim an IMEX channel: a multi-node group's, or a unit member's that fills
    its node (each node offers one channel, so a pod that shares its node claims none)."""
    if not spec.topology.compute_domain:
        return False
    shape = group_shape(spec, role)
    return shape.nodes > 1 or (
        role in UNIT_ROLES and rule(spec) is not None and shape.pod_gpus == spec.topology.gpus_per_node
    )


def nccl_mnnvl(spec: ModelDeploymentSpec, role: RoleName) -> bool:
    """Whether NCCL is asked for multi-node NVLink: its communicator spans pods and they hold a channel."""
    return uses_compute_domain(spec, role) and group_shape(spec, role).nodes > 1


def channel_domain(owner: Owner, group: str, unit: int | None) -> str:
    """The ComputeDomain a group's pods claim their channel from: their unit's, else the group's own."""
    return unit_domain_name(owner, unit) if unit is not None else compute_domain_name(group)


def gang_of(spec: ModelDeploymentSpec, role: RoleName, mode: GangMode) -> GangMode | None:
    """How a group of this role binds all or nothing: None for a one-pod group (nothing to coordinate),
    else the cluster's PodGroup gang API or tokenfab's scheduling gate."""
    return mode if group_shape(spec, role).nodes > 1 else None


def admits_late(spec: ModelDeploymentSpec, role: RoleName, mode: GangMode) -> bool:
    """Whether a group's PodGroup is written only after its pods. Never on Kubernetes 1.37: its resource
    claim controller makes a pod's claims from their templates only once the PodGroup the pod names
    exists (a claim may belong to the PodGroup there), so the PodGroup is written with the pods. (On
    1.36, with v1alpha2, the PodGroup waited for the pods' IMEX channel claims, so the scheduler would
    not try the gang in part before the last claim was made; 1.36's API is no longer used.)"""
    del spec, role, mode
    return False


def pod_group(owner: Owner, spec: ModelDeploymentSpec, role: RoleName, slot: int) -> Manifest:
    """The gang PodGroup of a multi-node group (scheduling.k8s.io/v1beta1, Kubernetes 1.37 with the beta
    API group served and the GenericWorkload feature gate on): the scheduler binds none of its pods until
    all of them can bind."""
    group = group_name(owner, role, slot)
    return {
        "apiVersion": contract.POD_GROUP_API,
        "kind": "PodGroup",
        "metadata": child_meta(
            owner, group, "worker", {contract.LABEL_ROLE: role, contract.LABEL_GROUP: group}
        ),
        "spec": {"schedulingPolicy": {"gang": {"minCount": group_shape(spec, role).nodes}}},
    }


def compute_domain(
    owner: Owner, spec: ModelDeploymentSpec, role: RoleName, slot: int, unit: int | None = None
) -> Manifest | None:
    """NVIDIA ComputeDomain (IMEX channel) a new group's pods claim, if they claim one: its unit's (shared
    by every group of the unit, and deleted once the unit has none), else the group's own."""
    if not uses_compute_domain(spec, role):
        return None
    group = group_name(owner, role, slot)
    name = channel_domain(owner, group, unit)
    labels = (
        {contract.LABEL_UNIT: str(unit)}
        if unit is not None
        else {contract.LABEL_ROLE: role, contract.LABEL_GROUP: group}
    )
    return {
        "apiVersion": contract.COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": child_meta(owner, name, "worker", labels),
        "spec": {
            # Deprecated by the driver and immutable: 0 (its recommended value since IMEX daemons find each
            # other by DNS) is valid on every release; a count would only gate the object's own status.
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": name},
                "allocationMode": "Single",
            },
        },
    }


# ----------------------------------------------------------------------------------- pod-spec fields


def node_affinity(spec: ModelDeploymentSpec, domain: str, node: str | None) -> dict[str, Any]:
    """Required node affinity to the group's NVLink domain and, when placement reserved one, the rank's
    node."""
    term: dict[str, Any] = {
        "matchExpressions": [{"key": spec.topology.domain_label, "operator": "In", "values": [domain]}]
    }
    if node is not None:
        # The node the ledger reserved for this rank: the scheduler binds it there or nowhere.
        term["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": [node]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def failure_tolerations(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    """How long a pod stays on a node that is not ready or unreachable
    (topology.nodeFailureTolerationSeconds): a worker, and a frontend pod (its Deployment replaces it)."""
    return [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": spec.topology.node_failure_toleration_seconds,
        }
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]


def worker_tolerations(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    """The failure tolerations, then the taints scheduling.tolerations tolerates."""
    sched = spec.scheduling
    return [
        *failure_tolerations(spec),
        *(t.model_dump(by_alias=True, exclude_none=True) for t in (sched.tolerations if sched else [])),
    ]


def scheduling_fields(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """The pod-spec fields of spec.scheduling that are set: node selector, priority class, scheduler."""
    sched = spec.scheduling
    out: dict[str, Any] = {}
    if sched is not None:
        if sched.node_selector:
            out["nodeSelector"] = dict(sched.node_selector)
        if sched.priority_class_name:
            out["priorityClassName"] = sched.priority_class_name
        if sched.scheduler_name:
            out["schedulerName"] = sched.scheduler_name
    return out


def gang_fields(gang: GangMode | None, group: str) -> dict[str, Any]:
    """How a pod of a multi-node group waits for the rest of its gang: tokenfab's scheduling gate (lifted
    once every pod exists) or the group's PodGroup."""
    if gang == "gates":
        return {"schedulingGates": [{"name": contract.GANG_GATE}]}
    if gang == "podgroup":
        return {"schedulingGroup": {"podGroupName": group}}
    return {}


def compute_domain_claims(
    owner: Owner, spec: ModelDeploymentSpec, role: RoleName, group: str, unit: int | None = None
) -> dict[str, Any]:
    """The pod-spec field that claims an IMEX channel from its ComputeDomain's template (the unit's, else
    the group's; none without a ComputeDomain); the worker container names the claim
    (`container_claims`)."""
    if not uses_compute_domain(spec, role):
        return {}
    template = channel_domain(owner, group, unit)
    return {
        "resourceClaims": [{"name": contract.COMPUTE_DOMAIN_CLAIM, "resourceClaimTemplateName": template}]
    }


def container_claims(spec: ModelDeploymentSpec, role: RoleName) -> dict[str, Any]:
    """The worker container's resources.claims: the IMEX channel claim, with a ComputeDomain."""
    if not uses_compute_domain(spec, role):
        return {}
    return {"claims": [{"name": contract.COMPUTE_DOMAIN_CLAIM}]}
