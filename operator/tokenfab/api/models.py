"""Pydantic models of the tokenfab custom resources: the single source of the CRD schema.

Every field carries a description (it becomes `kubectl explain` text), defaults live here, and the
cross-field rules live in `tokenfab.api.rules`, which the API server runs as CEL and these models run
in Python with the same messages. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from tokenfab.api.rules import BOUNDS_RULE, SPEC_RULES, check_spec, reserved_key_rule

GROUP = "tokenfab.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("mdep",)
CATEGORIES = ("tokenfab",)

MTP_MAX_DEPTH = 5
RATIO_PATTERN = r"^[1-9][0-9]{0,2}:[1-9][0-9]{0,2}$"
SOURCE_PATTERN = r"^(hf|pvc|s3)://.+$"

Mode = Literal["aggregated", "disaggregated"]
RouterMode = Literal["kv", "round-robin", "random"]
RatioPolicy = Literal["fixed", "independent"]
PlacementPolicy = Literal["pack", "spread"]
Engine = Literal["trtllm"]
RoleName = Literal["prefill", "decode", "worker"]
PlanSystem = Literal["gb200", "gb300", "b200", "h200", "h100"]
ROLES: tuple[RoleName, ...] = ("prefill", "decode", "worker")


def _cel_rules(rules: list[dict[str, str]]) -> dict[str, Any]:
    """Schema extra that installs CEL rules on an object."""
    return {"x-kubernetes-validations": rules}


class _Model(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


# --------------------------------------------------------------------------------------------- spec


class ModelSource(_Model):
    """What model to serve and where its weights come from."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="Served model name: the `model` field clients send to the OpenAI-compatible API "
        "(e.g. deepseek-ai/DeepSeek-R1).",
    )
    source: str = Field(
        pattern=SOURCE_PATTERN,
        max_length=2048,
        description="Where the weights live: hf://<org>/<repo> (a model hub), pvc://<claim>/<path> (a "
        "PersistentVolumeClaim in this namespace) or s3://<bucket>/<prefix>.",
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description="Revision of the weights: a hub commit or tag, or a version label for pvc:// and s3://. "
        "Pin it in production so every group loads the same weights.",
    )


class EnvVar(_Model):
    """One environment variable for the worker containers."""

    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, "
        "resourceFieldRef), passed through unchanged; e.g. a hub token from a Secret.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Resources(_Model):
    """CPU and memory for each worker container, beside the GPUs that parallelism implies."""

    requests: dict[str, int | str] = Field(
        default_factory=dict,
        description="Resource requests (cpu, memory, ephemeral-storage). GPUs are derived from "
        "parallelism: do not list the GPU resource here.",
    )
    limits: dict[str, int | str] = Field(
        default_factory=dict,
        description="Resource limits (cpu, memory, ephemeral-storage). GPUs are derived from parallelism.",
    )


# Engine keys that tokenfab sets from first-class fields; a user may not set them in extraEngineArgs.
RESERVED_ENGINE_KEYS: dict[str, str] = {
    "tensor_parallel_size": "the role's parallelism.tensor",
    "pipeline_parallel_size": "the role's parallelism.pipeline",
    "moe_expert_parallel_size": "the role's parallelism.expert",
    "enable_attention_dp": "the role's parallelism.attentionDataParallel",
    "max_batch_size": "the role's maxBatchSize",
    "max_num_tokens": "the role's maxNumTokens",
    "speculative_config": "spec.speculativeDecoding.mtpDepth",
}
RESERVED_KEY_RULES = tuple(reserved_key_rule(k, f) for k, f in RESERVED_ENGINE_KEYS.items())


def _refuse_reserved_keys(args: dict[str, Any]) -> dict[str, Any]:
    for key, rule in zip(RESERVED_ENGINE_KEYS, RESERVED_KEY_RULES, strict=True):
        if key in args:
            raise PydanticCustomError("tokenfab_reserved_key", rule.message)
    return args


def _engine_args_schema(schema: dict[str, Any]) -> None:
    """Free-form YAML object, but with the reserved keys declared so CEL rules can see them."""
    description = schema.get("description")
    schema.clear()
    schema["type"] = "object"
    schema["description"] = description
    schema["x-kubernetes-preserve-unknown-fields"] = True
    # Declared (with the type TensorRT-LLM expects) only so that CEL can see them and refuse them.
    types: dict[str, dict[str, Any]] = {
        "enable_attention_dp": {"type": "boolean"},
        "speculative_config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
    schema["properties"] = {
        key: {"description": f"Reserved: set through {field} instead.", **types.get(key, {"type": "integer"})}
        for key, field in RESERVED_ENGINE_KEYS.items()
    }
    schema["x-kubernetes-validations"] = [r.x_kubernetes_validation() for r in RESERVED_KEY_RULES]


EngineArgs = Annotated[
    dict[str, Any],
    AfterValidator(_refuse_reserved_keys),
    Field(
        default_factory=dict,
        description="Extra TensorRT-LLM LLM-API engine settings (YAML), merged into the generated engine "
        "config (e.g. kv_cache_config, cuda_graph_config, moe_config). Keys that tokenfab derives from "
        "first-class fields (" + ", ".join(sorted(RESERVED_ENGINE_KEYS)) + ") are refused.",
        json_schema_extra=_engine_args_schema,
    ),
]


class Runtime(_Model):
    """The worker container: image, engine, environment and resources."""

    image: str = Field(
        default="ghcr.io/tokenfab/worker:0.1.0",
        min_length=1,
        description="Worker image: NVIDIA's Dynamo TensorRT-LLM runtime plus tokenfab's launcher.",
    )
    engine: Engine = Field(
        default="trtllm", description="Inference engine. Only trtllm (TensorRT-LLM) today."
    )
    extra_engine_args: EngineArgs
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for every worker container.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="CPU and memory per worker container; GPUs follow from parallelism.",
    )


class Serving(_Model):
    """How requests reach the workers: mode, router and the prefill:decode ratio."""

    mode: Mode = Field(
        default="disaggregated",
        description="aggregated: one worker role does prefill and decode. disaggregated: separate prefill "
        "and decode roles exchange the KV cache (the fastest layout for reasoning models).",
    )
    router_mode: RouterMode = Field(
        default="kv",
        description="Dynamo frontend routing: kv (KV-cache-aware, sends a request where its prefix is "
        "cached), round-robin or random.",
    )
    frontend_replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Replicas of the Dynamo frontend (OpenAI-compatible HTTP API and router).",
    )
    prefill_decode_ratio: str | None = Field(
        default=None,
        pattern=RATIO_PATTERN,
        description='Prefill groups to decode groups, as "P:D" with positive integers (e.g. "1:3"). With '
        "ratioPolicy fixed, prefill groups = ceil(decode groups x P / D). Disaggregated mode only.",
    )
    ratio_policy: RatioPolicy = Field(
        default="fixed",
        description="fixed: prefill follows decode by prefillDecodeRatio (spec.prefill.replicas must be "
        "left out). independent: prefill has its own replicas and, with autoscaling, its own signal.",
    )


class Parallelism(_Model):
    """How one engine instance (a group) is split over GPUs."""

    tensor: int = Field(default=1, ge=1, le=1024, description="Tensor-parallel size (tensor_parallel_size).")
    pipeline: int = Field(
        default=1, ge=1, le=128, description="Pipeline-parallel size (pipeline_parallel_size)."
    )
    expert: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Expert-parallel size for mixture-of-experts models (moe_expert_parallel_size). Must "
        "divide tensor: TensorRT-LLM splits each tensor-parallel group's experts, and "
        "moe_expert_parallel_size x moe_tensor_parallel_size = tensor_parallel_size. Wide expert "
        "parallelism: expert = tensor across several NVL72 nodes.",
    )
    attention_data_parallel: bool = Field(
        default=False,
        description="Data-parallel attention (enable_attention_dp): each rank keeps its own requests' KV "
        "cache instead of sharding attention heads; best for large-batch MoE decode.",
    )


class Role(_Model):
    """One role of the deployment (prefill, decode, or the aggregated worker)."""

    parallelism: Parallelism = Field(
        default_factory=Parallelism,
        description="Parallelism of one group. A group uses tensor x pipeline GPUs on "
        "ceil(GPUs / topology.gpusPerNode) nodes, all inside one NVLink domain. Left out: 1 GPU, or, with "
        "spec.profile, the plan's parallelism.",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="Number of groups when autoscaling is off (default 1). With serving.ratioPolicy fixed, "
        "leave it out on prefill: prefill follows decode by the ratio.",
    )
    max_batch_size: int | None = Field(
        default=None, ge=1, le=65536, description="Largest batch one group schedules (max_batch_size)."
    )
    max_num_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1048576,
        description="Most tokens one group processes per iteration (max_num_tokens).",
    )
    extra_engine_args: EngineArgs


class SpeculativeDecoding(_Model):
    """Multi-token prediction (MTP) for models trained with MTP heads (DeepSeek-V3/R1 family)."""

    mtp_depth: int = Field(
        default=0,
        ge=0,
        le=MTP_MAX_DEPTH,
        description=f"MTP draft depth (TensorRT-LLM num_nextn_predict_layers): 0 turns MTP off; 1 to "
        f"{MTP_MAX_DEPTH} drafts that many tokens per step. 3 is the usual choice for DeepSeek-R1.",
    )


class Profile(_Model):
    """Service-level targets and traffic: the operator plans what the spec leaves out from them.

    With a profile, the parallelism of a role that leaves it out, serving.prefillDecodeRatio (when left out)
    and the MTP depth (when spec.speculativeDecoding is left out) come from NVIDIA aiconfigurator's
    performance model: the configuration with the most tokens/s per GPU that meets ttftMs and itlMs.
    The spec is never rewritten; the plan and its predicted figures are in status.profile.
    """

    isl: int = Field(ge=1, le=1048576, description="Typical input (prompt) length in tokens.")
    osl: int = Field(ge=1, le=1048576, description="Typical output length in tokens.")
    ttft_ms: float = Field(gt=0, le=600000, description="Time-to-first-token target in milliseconds.")
    itl_ms: float = Field(
        gt=0, le=10000, description="Inter-token latency (time per output token) target in milliseconds."
    )
    system: PlanSystem = Field(
        default="gb200", description="GPU system whose measured performance data the plan uses."
    )
    backend: Engine = Field(default="trtllm", description="Backend to plan for. Only trtllm today.")
    gpu_budget: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Plan the best configuration for this many GPUs (exactly one of gpuBudget, requestRate).",
    )
    request_rate: float | None = Field(
        default=None,
        gt=0,
        le=1000000,
        description="Plan the fewest GPUs that serve this many requests per second (exactly one of "
        "gpuBudget, requestRate).",
    )
    mtp_acceptance: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Acceptance rate of MTP draft tokens, in (0, 1]: set it to let the plan consider MTP; "
        "left out, the plan runs without MTP.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The model's name in aiconfigurator's model list, when it differs from spec.model.name "
        "(e.g. Qwen/Qwen3-235B-A22B-FP8).",
    )


class Topology(_Model):
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
        default=False,
        description="Create an NVIDIA ComputeDomain (IMEX channel, resource.nvidia.com) per multi-node "
        "group and claim it from its pods, for multi-node NVLink.",
    )
    node_failure_toleration_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a worker pod stays on a not-ready or unreachable node before eviction, so "
        "a dead node's group moves quickly.",
    )


class RoleBounds(_Model):
    """Autoscaling bounds for one role, in groups."""

    model_config = ConfigDict(json_schema_extra=_cel_rules([BOUNDS_RULE.x_kubernetes_validation()]))

    min_replicas: int = Field(default=1, ge=0, le=4096, description="Fewest groups.")
    max_replicas: int = Field(default=1, ge=0, le=4096, description="Most groups.")

    @model_validator(mode="after")
    def _min_le_max(self) -> RoleBounds:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("tokenfab_rule", BOUNDS_RULE.message)
        return self


class Autoscaling(_Model):
    """Scale prefill and decode groups to hold KV-cache utilization near a target."""

    enabled: bool = Field(default=False, description="Turn the built-in autoscaler on.")
    prometheus_url: str | None = Field(
        default=None,
        pattern=r"^https?://.+$",
        description="Prometheus base URL that scrapes the workers (e.g. http://prometheus.monitoring:9090).",
    )
    target_kv_cache_utilization: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Target average KV-cache utilization of ready groups, in (0, 1].",
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="No change while utilization / target is within 1 +- tolerance.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Scale up to the lowest recommendation seen over this window (0: at once).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Scale down only to the highest recommendation seen over this window.",
    )
    max_step_up: int = Field(
        default=2, ge=1, le=64, description="Most groups added per role in one decision."
    )
    max_step_down: int = Field(
        default=1, ge=1, le=64, description="Most groups removed per role in one decision."
    )
    warmup_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="A group Ready for less than this is left out of the utilization average (and blocks "
        "scale-down): the router has not yet spread load to it. Weight loading happens before Ready, so "
        "this is short.",
    )
    interval_seconds: int = Field(default=15, ge=5, le=600, description="Seconds between evaluations.")
    prefill: RoleBounds | None = Field(
        default=None,
        description="Bounds for prefill groups. With ratioPolicy fixed they clamp the ratio's result.",
    )
    decode: RoleBounds | None = Field(default=None, description="Bounds for decode groups.")
    worker: RoleBounds | None = Field(default=None, description="Bounds for aggregated worker groups.")
    target_queue_depth: float = Field(
        default=4,
        gt=0,
        le=10000,
        description="With ratioPolicy independent: target waiting requests per prefill group.",
    )
    query: str | None = Field(
        default=None,
        max_length=4096,
        description="PromQL override for the utilization signal, returning one sample per pod in [0, 1]. "
        "Placeholders {namespace}, {deployment} and {role} are filled in.",
    )


class ModelDeploymentSpec(_Model):
    """Desired state of a ModelDeployment."""

    model_config = ConfigDict(json_schema_extra=_cel_rules([r.x_kubernetes_validation() for r in SPEC_RULES]))
    model: ModelSource = Field(description="The model to serve.")
    runtime: Runtime = Field(default_factory=Runtime, description="Worker container settings.")
    serving: Serving = Field(default_factory=Serving, description="Serving mode, router and ratio.")
    prefill: Role | None = Field(default=None, description="Prefill role (disaggregated mode).")
    decode: Role | None = Field(default=None, description="Decode role (disaggregated mode).")
    worker: Role | None = Field(default=None, description="The single worker role (aggregated mode).")
    speculative_decoding: SpeculativeDecoding = Field(
        default_factory=SpeculativeDecoding, description="Multi-token prediction."
    )
    topology: Topology = Field(default_factory=Topology, description="NVLink domains and placement.")
    autoscaling: Autoscaling = Field(
        default_factory=Autoscaling, description="KV-cache-driven autoscaling of the roles."
    )
    profile: Profile | None = Field(
        default=None,
        description="SLA and traffic: the operator fills parallelism, prefillDecodeRatio and MTP depth that "
        "the spec leaves out from a plan made for them (NVIDIA aiconfigurator).",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ModelDeploymentSpec:
        check_spec(self)
        return self

    def role(self, name: RoleName) -> Role | None:
        """The role's spec, or None when the deployment has no such role."""
        role: Role | None = getattr(self, name)
        return role

    def roles(self) -> list[tuple[RoleName, Role]]:
        """The roles present, in a stable order."""
        return [(n, r) for n in ROLES if (r := self.role(n)) is not None]

    def left_to_plan(self) -> list[str]:
        """What a plan fills in (with spec.profile): roles without parallelism, the ratio, MTP depth."""
        if self.profile is None:
            return []
        out = [f"{n}.parallelism" for n, r in self.roles() if "parallelism" not in r.model_fields_set]
        if self.serving.mode == "disaggregated" and self.serving.prefill_decode_ratio is None:
            out.append("serving.prefillDecodeRatio")
        if "speculative_decoding" not in self.model_fields_set:
            out.append("speculativeDecoding.mtpDepth")
        return out


# ------------------------------------------------------------------------------------------- status


class Condition(_Model):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, Placed, CapacityLimited, MetricsUnavailable, Planned."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation the condition saw.")


class RoleStatus(_Model):
    """Observed groups and GPUs of one role."""

    desired_groups: int = Field(default=0, description="Groups the operator wants (spec or autoscaler).")
    ready_groups: int = Field(default=0, description="Groups whose every pod is Ready.")
    gpus_per_group: int = Field(default=0, description="GPUs in one group (tensor x pipeline).")
    desired_gpus: int = Field(default=0, description="GPUs of the desired groups.")
    ready_gpus: int = Field(default=0, description="GPUs of the ready groups.")
    groups: str = Field(default="0/0", description="ready/desired groups, for kubectl get.")


class GroupPlacement(_Model):
    """Where one group runs."""

    group: str = Field(description="Group name.")
    role: RoleName = Field(description="Role of the group.")
    domain: str = Field(description="NVLink domain (value of topology.domainLabel).")
    gpus: int = Field(description="GPUs of the group.")


class ScalingDecision(_Model):
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


class AutoscalingStatus(_Model):
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


class PlannedRole(_Model):
    """One role of a plan."""

    parallelism: Parallelism = Field(description="Parallelism of one group.")
    replicas: int = Field(description="Groups of this role in the plan.")


class PlanPrediction(_Model):
    """What the performance model predicts for the plan."""

    gpus: int = Field(description="GPUs of the whole plan.")
    tokens_per_second_per_gpu: float = Field(description="Output tokens/s per GPU the plan uses.")
    tokens_per_second_per_user: float = Field(description="Output tokens/s of one request.")
    ttft_ms: float = Field(description="Time to first token, milliseconds.")
    itl_ms: float = Field(description="Inter-token latency, milliseconds.")
    request_rate: float | None = Field(default=None, description="Requests/s the plan serves.")


class ProfileStatus(_Model):
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


class ModelDeploymentStatus(_Model):
    """Observed state of a ModelDeployment, written only by the operator."""

    observed_generation: int | None = Field(default=None, description="Spec generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Current conditions.")
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Per-role groups and GPUs.")
    gpus: str = Field(default="0/0", description="ready/desired GPUs over all roles, for kubectl get.")
    placement: list[GroupPlacement] = Field(default_factory=list, description="Group to NVLink domain.")
    endpoint: str | None = Field(default=None, description="In-cluster URL of the OpenAI-compatible API.")
    autoscaling: AutoscalingStatus | None = Field(default=None, description="Autoscaler state.")
    profile: ProfileStatus | None = Field(default=None, description="The plan made for spec.profile.")


class ObjectMeta(BaseModel):
    """The part of metadata tokenfab reads."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ModelDeployment(BaseModel):
    """A whole ModelDeployment object as read from YAML or the API server."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["tokenfab.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ModelDeployment"]
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


# ------------------------------------------------------------------------------------ NVLinkDomain

DOMAIN_KIND = "NVLinkDomain"
DOMAIN_PLURAL = "nvlinkdomains"
DOMAIN_SINGULAR = "nvlinkdomain"
DOMAIN_SHORT_NAMES = ("nvld",)


class DomainGroup(_Model):
    """A worker group placed in the domain."""

    namespace: str = Field(description="Namespace of the group's ModelDeployment.")
    group: str = Field(description="Group name.")
    gpus: int = Field(description="GPUs the group uses.")


class NVLinkDomainStatus(_Model):
    """Capacity of one NVLink domain (one NVL72 rack), kept current by the operator."""

    domain: str = Field(description="Value of the domain label on the domain's nodes.")
    label: str = Field(description="The node label that names domains (e.g. nvidia.com/gpu.clique).")
    nodes: int = Field(description="Nodes in the domain.")
    ready_nodes: int = Field(description="Ready nodes in the domain.")
    gpus: int = Field(description="Allocatable GPUs of all nodes.")
    free_gpus: int = Field(description="GPUs free on ready, schedulable nodes.")
    free_nodes: int = Field(description="Ready, schedulable nodes with every GPU free.")
    group_count: int = Field(description="tokenfab worker groups placed in the domain.")
    groups: list[DomainGroup] = Field(default_factory=list, description="The groups placed in the domain.")
    updated: str = Field(description="When the operator last refreshed this status (RFC 3339).")
