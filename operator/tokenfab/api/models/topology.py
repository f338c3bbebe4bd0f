"""Where a deployment's groups run: the NVLink domains a group must sit inside, the placement policy, and
the worker pods' scheduling (node selector, tolerations, priority class, scheduler)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from tokenfab.api.cel import LABEL_KEY_MAX, LABEL_VALUE_PATTERN
from tokenfab.api.models.base import SpecModel, cel_of, cel_rules, refuse_broken
from tokenfab.api.rules import (
    NODE_SELECTOR_KEYS_RULE,
    PRIORITY_CLASS_RULE,
    SCHEDULER_NAME_RULE,
    TOLERATION_KEY_RULE,
    TOLERATION_RULES,
)

NODE_SELECTOR_MAX_ENTRIES = 32
TOLERATIONS_MAX = 32

PlacementPolicy = Literal["pack", "spread"]
KvNetwork = Literal["rdma", "tcp"]


class Topology(SpecModel):
    """The NVLink domains the groups are placed in."""

    domain_label: str = Field(
        default="nvidia.com/gpu.clique",
        min_length=1,
        max_length=317,
        description="Node label whose value names a node's NVLink domain (one value per NVL72 rack).",
    )
    gpus_per_node: int = Field(default=4, ge=1, le=64, description="GPUs per node (an NVL72 tray has 4).")
    gpu_resource: str = Field(
        default="nvidia.com/gpu", min_length=1, max_length=317, description="Extended resource name of a GPU."
    )
    gpus_per_domain: int = Field(
        default=72, ge=1, le=4096, description="GPUs per NVLink domain (72 for an NVL72 rack)."
    )
    placement: PlacementPolicy = Field(
        default="pack",
        description="pack: best fit, filling the fullest domain that still fits a group (leaves whole "
        "racks free). spread: put this deployment's groups on the domains holding the fewest of them.",
    )
    compute_domain: bool = Field(
        default=True,
        description="Create an NVIDIA ComputeDomain (resource.nvidia.com/v1beta1, from NVIDIA's DRA driver) "
        "per multi-node group and claim its IMEX channel from every pod of the group: multi-node NVLink "
        "(NCCL's MNNVL, wide expert parallelism across trays) needs it. One-node groups need none. Where "
        "the driver is not installed, multi-node groups wait with Placed=False/ComputeDomainUnavailable: "
        "install it, or set false to run them without IMEX (NCCL then falls back to InfiniBand between "
        "trays).",
    )
    kv_network: KvNetwork = Field(
        default="rdma",
        description="How a prefill-decode unit that cannot be kept in one NVLink domain moves its KV caches "
        "between domains. rdma (the default): the pods of such a unit ask for the operator's RDMA device "
        "resource (the chart's operator.rdmaResource) and IPC_LOCK, and wait where the nodes have none "
        "or the namespace's Pod Security refuses IPC_LOCK (a condition says which). tcp: they ask for "
        "neither, and UCX moves the KV over TCP (slower: for clusters without RDMA). A unit kept in one "
        "domain moves its KV over NVLink either way.",
    )
    node_failure_toleration_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How long a group's pods stay bound to a NotReady or unreachable node (the "
        "tolerationSeconds of their node.kubernetes.io/not-ready and unreachable tolerations) before the "
        "group is recreated elsewhere. The default, 300, is Kubernetes' own and rides out a kubelet "
        "restart; a lower value moves a large (e.g. 32-GPU) group sooner after a real node loss, at the "
        "cost of restarting it on a short blip. The frontend's pods tolerate the same, then their "
        "Deployment replaces them on another node.",
    )


class Toleration(SpecModel):
    """A taint the worker pods tolerate (as a Kubernetes pod toleration)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules([r.x_kubernetes_validation() for r in TOLERATION_RULES])
    )

    key: Annotated[str | None, AfterValidator(TOLERATION_KEY_RULE)] = Field(
        default=None,
        max_length=LABEL_KEY_MAX,
        description="Taint key the toleration matches; left out (with operator Exists) it matches every "
        "taint.",
        json_schema_extra=cel_of(TOLERATION_KEY_RULE),
    )
    operator: Literal["Equal", "Exists"] = Field(
        default="Equal",
        description="Equal: the taint's value must equal value. Exists: any value (then leave value out).",
    )
    value: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description="Taint value the toleration matches (operator Equal).",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect the toleration matches; left out, every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        description="With effect NoExecute only: how long the pod stays bound to a node after the taint "
        "appears (left out: forever).",
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        refuse_broken(
            [
                (TOLERATION_RULES[0], bool(self.key) or self.operator == "Exists"),
                (TOLERATION_RULES[1], self.operator != "Exists" or not self.value),
                (TOLERATION_RULES[2], self.toleration_seconds is None or self.effect == "NoExecute"),
            ]
        )
        return self


class Scheduling(SpecModel):
    """Where the worker pods may run, beyond their NVLink domain: node labels, taints, priority, scheduler.

    The worker pods carry these fields, and placement counts only the nodes whose labels match
    nodeSelector and whose NoSchedule/NoExecute taints the tolerations tolerate.
    """

    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]],
        AfterValidator(NODE_SELECTOR_KEYS_RULE),
    ] = Field(
        default_factory=dict,
        max_length=NODE_SELECTOR_MAX_ENTRIES,
        description=f"Node labels a worker node must carry (at most {NODE_SELECTOR_MAX_ENTRIES}): label keys "
        "mapped to label values (at most 63 characters), e.g. {nvidia.com/gpu.product: NVIDIA-GB200}.",
        json_schema_extra=cel_of(NODE_SELECTOR_KEYS_RULE),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=TOLERATIONS_MAX,
        description=f"Taints the worker pods tolerate (at most {TOLERATIONS_MAX}), e.g. a dedicated GPU "
        "pool's taint. The not-ready/unreachable tolerations come from "
        "topology.nodeFailureTolerationSeconds.",
    )
    priority_class_name: Annotated[str | None, AfterValidator(PRIORITY_CLASS_RULE)] = Field(
        default=None,
        max_length=253,
        description="PriorityClass of the worker pods.",
        json_schema_extra=cel_of(PRIORITY_CLASS_RULE),
    )
    scheduler_name: Annotated[str | None, AfterValidator(SCHEDULER_NAME_RULE)] = Field(
        default=None,
        max_length=253,
        description="Scheduler that binds the worker pods (default: the cluster's default scheduler).",
        json_schema_extra=cel_of(SCHEDULER_NAME_RULE),
    )
