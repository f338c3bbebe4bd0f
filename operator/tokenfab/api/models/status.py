"""The status of a ModelDeployment, written only by the operator: conditions, groups and GPUs per role,
placement, the autoscaler's memory, the plan made for spec.profile and the roles' failures.

Status objects are read leniently (`StatusModel`): fields a newer operator wrote are dropped on read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from tokenfab.api.models.base import StatusModel
from tokenfab.api.models.roles import Parallelism, RoleName
from tokenfab.api.models.serving import Mode


class Condition(StatusModel):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, Placed, CapacityLimited, MetricsUnavailable, Planned, "
        "HardwareFault, ModelSource."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation the condition saw.")


class RoleStatus(StatusModel):
    """Observed groups and GPUs of one role."""

    desired_groups: int = Field(default=0, description="Groups the operator wants (spec or autoscaler).")
    ready_groups: int = Field(default=0, description="Groups whose every pod is Ready.")
    gpus_per_group: int = Field(default=0, description="GPUs in one group (tensor x pipeline).")
    desired_gpus: int = Field(default=0, description="GPUs of the desired groups.")
    ready_gpus: int = Field(default=0, description="GPUs of the ready groups.")
    groups: str = Field(default="0/0", description="ready/desired groups, for kubectl get.")
    draining_groups: int = Field(default=0, description="Groups out of routing, finishing their requests.")


class GroupPlacement(StatusModel):
    """Where one group runs."""

    group: str = Field(description="Group name.")
    role: RoleName = Field(description="Role of the group.")
    domain: str = Field(description="NVLink domain (value of topology.domainLabel).")
    gpus: int = Field(description="GPUs of the group.")
    weights: str = Field(
        default="",
        description="How its pods' launchers got the weights, from their logs: cache (complete in the "
        "node's model cache), download, copy or modelexpress with the slowest pod's seconds, or offline; "
        "per source with its pods when they differ; while a pod's launcher still downloads, 'downloading' "
        "with the bytes so far. Empty until a pod's log said (the chart's rbac.readPodLogs).",
    )


KvPath = Literal["nvlink", "rdma", "tcp"]


class UnitStatus(StatusModel):
    """One prefill-decode unit: the decode groups and the prefill groups that feed them, and how KV
    caches move between them."""

    unit: int = Field(description="The unit's number (the pods' tokenfab.dev/unit label).")
    groups: list[str] = Field(default_factory=list, description="Its groups, decode first.")
    domains: list[str] = Field(default_factory=list, description="The NVLink domains its groups are in.")
    path: KvPath = Field(
        description="How its KV caches move from prefill to decode: nvlink (one NVLink domain, every pod "
        "holding the unit's IMEX channel, or all on one node), rdma (RDMA devices on its pods) or tcp."
    )


class ScalingDecision(StatusModel):
    """One autoscaling decision."""

    time: str = Field(description="When it was taken (RFC 3339).")
    role: RoleName = Field(description="Role it applies to.")
    from_groups: int = Field(description="Groups before.")
    to_groups: int = Field(description="Groups after.")
    metric: str = Field(default="", description="Signal used (e.g. kv_cache_utilization).")
    value: float | None = Field(default=None, description="Observed value of the signal.")
    target: float | None = Field(default=None, description="Target value of the signal.")
    reason: str = Field(
        description="Why, as a CamelCase reason (ScaleUp, ScaleDown, MetricsUnavailable, ...)."
    )
    message: str = Field(default="", description="The numbers behind the decision.")


class AutoscalingStatus(StatusModel):
    """The autoscaler's memory and results, kept in status so a restart keeps them."""

    desired: dict[str, int] = Field(default_factory=dict, description="Desired groups per role.")
    recommendations: dict[str, list[list[float]]] = Field(
        default_factory=dict,
        description="Recent recommendations per role as [unix time, groups] pairs (stabilization window).",
    )
    last_scale_time: dict[str, str] = Field(default_factory=dict, description="Last change per role.")
    last_decision: ScalingDecision | None = Field(default=None, description="The most recent decision.")
    last_evaluation: dict[str, float] = Field(
        default_factory=dict, description="Unix time of the last evaluation per role."
    )
    arrivals: list[list[float]] = Field(
        default_factory=list,
        description="Recent arrivals at the frontend as [unix time, requests/s, input tokens/s, requests in "
        "flight] (the forecast's window).",
    )
    capacity: dict[str, float] = Field(
        default_factory=dict,
        description="Requests/s one group of each role serves at the target, learned from the load it "
        "served (or from the profile's plan).",
    )
    concurrency: dict[str, float] = Field(
        default_factory=dict,
        description="Requests in flight one group of each role holds at the target, learned from the "
        "requests in flight at the frontend and the groups' KV-cache utilization.",
    )
    startup_seconds: float | None = Field(
        default=None, description="Learned seconds from a group's creation to Ready (the forecast horizon)."
    )
    startup_by_path: dict[str, float] = Field(
        default_factory=dict,
        description="The same, per start path: warm (its nodes' model caches held the weights), fetching "
        "(a cache begun), cold (none). The horizon is that of the path the next group would take.",
    )
    frontend_replicas: int | None = Field(default=None, description="Desired frontend replicas.")
    frontend_recommendations: list[list[float]] = Field(
        default_factory=list, description="Recent frontend recommendations as [unix time, replicas] pairs."
    )


def _drop_unknown(model: type[BaseModel]) -> BeforeValidator:
    """Read a spec model (strict) leniently inside status: unknown keys are dropped before validation."""
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}

    def drop(value: Any) -> Any:
        return {k: v for k, v in value.items() if k in known} if isinstance(value, dict) else value

    return BeforeValidator(drop)


class PlannedRole(StatusModel):
    """One role of a plan."""

    # The spec's own Parallelism (so a plan compares equal to a spec), read leniently.
    parallelism: Annotated[Parallelism, _drop_unknown(Parallelism)] = Field(
        description="Parallelism of one group."
    )
    replicas: int = Field(description="Groups of this role in the plan.")


class PlanPrediction(StatusModel):
    """What the performance model predicts for the plan."""

    gpus: int = Field(description="GPUs of the whole plan.")
    tokens_per_second_per_gpu: float = Field(description="Output tokens/s per GPU the plan uses.")
    tokens_per_second_per_user: float = Field(description="Output tokens/s of one request.")
    ttft_ms: float = Field(description="Time to first token, milliseconds.")
    itl_ms: float = Field(description="Inter-token latency, milliseconds.")
    request_rate: float | None = Field(default=None, description="Requests/s the plan serves.")


class ProfileStatus(StatusModel):
    """The plan made for spec.profile, kept so it is made once per profile."""

    profile_hash: str = Field(description="Hash of the profile (and model, mode) this plan answers.")
    planner: str = Field(default="", description="Planner and version (e.g. aiconfigurator 0.12.0).")
    time: str | None = Field(default=None, description="When the plan was made (RFC 3339).")
    ok: bool = Field(default=False, description="Whether a configuration meets the profile.")
    reason: str = Field(
        default="", description="CamelCase outcome: Planned, UnknownModel, SLAUnreachable, ..."
    )
    message: str = Field(default="", description="Details of the outcome.")
    mode: Mode | None = Field(default=None, description="Serving mode of the plan.")
    roles: dict[str, PlannedRole] = Field(default_factory=dict, description="Per-role plan.")
    prefill_decode_ratio: str | None = Field(default=None, description="Planned prefill:decode ratio.")
    mtp_depth: int | None = Field(default=None, description="Planned MTP depth.")
    predicted: PlanPrediction | None = Field(default=None, description="Predicted figures of the plan.")


class RoleFailures(StatusModel):
    """Consecutive failures of a role's groups (an engine that exits, pods that cannot bind in time), which
    space out its replacements: 10 s, 20 s, 40 s ... up to 5 minutes."""

    failures: int = Field(description="Groups of the role that failed in a row.")
    last_failure: str = Field(description="When the last one failed (RFC 3339).")
    message: str = Field(
        default="", description="Why the last one failed (the pod's exit, the scheduler's words)."
    )
    retry_after: str | None = Field(default=None, description="No replacement before this time (RFC 3339).")
    healthy_since: str | None = Field(
        default=None,
        description="Since when every group of the role serves (the count resets after 2 minutes).",
    )


class FaultRecord(StatusModel):
    """A hardware fault that hit one of the deployment's groups, and how tokenfab answered it."""

    time: str = Field(description="When the operator saw it (RFC 3339).")
    group: str = Field(description="The group it hit.")
    role: RoleName = Field(description="Role of that group.")
    node: str = Field(description="The faulted node.")
    kind: str = Field(
        description="Lost (the Node gone), NotReady (past the toleration), Evicting (a NoExecute taint), "
        "Quarantined (a GPU health system's taint, condition or annotation), Cordoned, DeviceTainted "
        "(a DRA device taint), ComputeDomainNotReady (the group's IMEX domain failed), or WorkerUnhealthy "
        "(a worker's health endpoint stopped answering after it had served, its node healthy)."
    )
    message: str = Field(default="", description="The signal's own words (the taint, the condition).")
    reaction: Literal["Replaced", "Evacuated"] = Field(
        description="Replaced: the group was lost and re-placed whole at once. Evacuated: a replacement "
        "was started first, then the group drained."
    )
    faulted_domain: str | None = Field(
        default=None,
        description="The NVLink domain the faulted group was in (two faults there within 10 min keep the "
        "deployment's new groups out of it for a while).",
    )
    replacement: str | None = Field(default=None, description="The group that replaces it.")
    domain: str | None = Field(default=None, description="The replacement's NVLink domain.")
    recovered: str | None = Field(default=None, description="When the replacement served (RFC 3339).")
    recovery_seconds: float | None = Field(default=None, description="From the fault seen to serving again.")


class StagedWeights(StatusModel):
    """What a weights-fetch pod reported when it completed (its container's termination message)."""

    node: str = Field(description="The node whose model cache claim it staged the weights in.")
    source: str = Field(
        default="",
        description="Where the weights came from: download (the source, what the cache lacked of it), "
        "cache (already complete there) or offline (HF_HUB_OFFLINE).",
    )
    bytes: int = Field(default=0, ge=0, description="Bytes of the staged snapshot (its manifest's files).")
    files: int = Field(default=0, ge=0, description="Files of the staged snapshot.")
    seconds: float = Field(default=0, ge=0, description="Seconds the download took (0 from the cache).")


class FetchProgress(StatusModel):
    """A download into a node's model cache so far (a weights-fetch pod's or a worker's), from its
    launcher's last progress line."""

    node: str = Field(description="The node whose model cache it downloads into.")
    bytes: int = Field(default=0, ge=0, description="Bytes the cache grew by since the download began.")
    seconds: float = Field(default=0, ge=0, description="Seconds since the download began.")


class WeightsCacheStatus(StatusModel):
    """The deployment's per-node model caches (model.cache.storageClassName) and what is staged in them."""

    weights: str = Field(description="The weights the caches are to hold: source@revision.")
    warm_nodes: list[str] = Field(
        default_factory=list,
        description="Nodes whose model cache claim holds them (a worker of the current revision served from "
        "it, or a weights-fetch pod completed there): a group placed there loads from local NVMe.",
    )
    prestaged: list[str] = Field(
        default_factory=list,
        description="Nodes kept warm for the next groups of each role (model.cache.prestageGroups).",
    )
    fetching: list[str] = Field(
        default_factory=list,
        description="Nodes where the weights are being downloaded now: by a weights-fetch pod, or by a "
        "worker's launcher (seen in its log, with the chart's rbac.readPodLogs).",
    )
    downloads: list[FetchProgress] = Field(
        default_factory=list,
        description="Per node downloading now, the bytes so far (read from the log of its weights-fetch pod "
        "or worker, with the chart's rbac.readPodLogs; refreshed every 15 s while it runs).",
    )
    waiting: str = Field(
        default="", description="A weights-fetch pod that is not running, and why (e.g. CrashLoopBackOff)."
    )
    staged: list[StagedWeights] = Field(
        default_factory=list,
        description="Per warm node a weights-fetch pod filled: where the weights came from, their bytes and "
        "the download's seconds (kept while the node's cache holds these weights).",
    )
    idle_since: dict[str, str] = Field(
        default_factory=dict,
        description="Per node whose model cache claim nothing pins (no pod of this deployment there, not "
        "pre-staged, no download): since when (RFC 3339). On a node labelled "
        "tokenfab.dev/model-cache-capacity, the longest idle caches are evicted first when the claims ask "
        "for more than it.",
    )
    summary: str = Field(
        default="",
        description="For kubectl get -o wide: warm nodes, downloads under way and bytes staged "
        '(e.g. "4 warm, 1 fetching, 689.4 GB staged").',
    )


class ModelDeploymentStatus(StatusModel):
    """Observed state of a ModelDeployment, written only by the operator."""

    observed_generation: int | None = Field(default=None, description="Spec generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Current conditions.")
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Per-role groups and GPUs.")
    gpus: str = Field(default="0/0", description="ready/desired GPUs over all roles, for kubectl get.")
    draining_groups: int = Field(
        default=0, description="Groups draining over all roles (out of routing, finishing their requests)."
    )
    placement: list[GroupPlacement] = Field(default_factory=list, description="Group to NVLink domain.")
    units: list[UnitStatus] = Field(
        default_factory=list, description="The prefill-decode units of a disaggregated deployment."
    )
    kv_path: str | None = Field(
        default=None,
        description="The units' KV paths at a glance, for kubectl get -o wide (e.g. '2 nvlink', "
        "'1 nvlink, 1 tcp').",
    )
    endpoint: str | None = Field(default=None, description="In-cluster URL of the OpenAI-compatible API.")
    autoscaling: AutoscalingStatus | None = Field(default=None, description="Autoscaler state.")
    profile: ProfileStatus | None = Field(default=None, description="The plan made for spec.profile.")
    failures: dict[str, RoleFailures] = Field(
        default_factory=dict, description="Roles whose groups keep failing, and when they may be replaced."
    )
    faults: list[FaultRecord] = Field(
        default_factory=list,
        description="The latest hardware faults that hit the deployment's groups (at most 10), newest last.",
    )
    weights_cache: WeightsCacheStatus | None = Field(
        default=None, description="The per-node model caches and pre-staging (none without them)."
    )
