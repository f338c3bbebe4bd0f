"""Pydantic models of the tokenfab custom resources: the single source of the CRD schema.

Every field carries a description (it becomes `kubectl explain` text), defaults live here, and the
cross-field rules live in `tokenfab.api.rules`, which the API server runs as CEL and these models run
in Python with the same messages. Nothing here does I/O.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, PydanticKnownError

from tokenfab.api.rules import (
    BOUNDS_RULE,
    ENDPOINTS_NEED_ETCD,
    ENV_ONE_SOURCE,
    ENV_RESERVED_RULE,
    ENV_VALUE_OR_VALUE_FROM,
    ETCD_NEEDS_ENDPOINTS,
    IMAGE_RULE,
    LABEL_KEY_MAX,
    LABEL_VALUE_PATTERN,
    MIN_REPLICAS_RULE,
    NODE_SELECTOR_KEYS_RULE,
    PRIORITY_CLASS_RULE,
    QUANTITY_PATTERN,
    QUERY_RULE,
    S3_SOURCE_RULE,
    SCHEDULER_NAME_RULE,
    SOURCE_RULE,
    SPEC_RULES,
    STORAGE_CLASS_RULE,
    TOLERATION_KEY_RULE,
    TOLERATION_RULES,
    KeysRule,
    ObjectRule,
    ValueRule,
    check_spec,
    matches,
    name_errors,
    object_rules_error,
    reserved_key_rule,
    resource_keys_rule,
)

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
# Free-form extraEngineArgs: the API server counts top-level keys; the models also bound the whole size.
ENGINE_ARGS_MAX_KEYS = 64
ENGINE_ARGS_MAX_BYTES = 64 * 1024
RESOURCES_MAX_ENTRIES = 16
NODE_SELECTOR_MAX_ENTRIES = 32
TOLERATIONS_MAX = 32

Mode = Literal["aggregated", "disaggregated"]
RouterMode = Literal["kv", "round-robin", "random"]
RatioPolicy = Literal["fixed", "independent"]
Discovery = Literal["kubernetes", "etcd"]
PlacementPolicy = Literal["pack", "spread"]
Engine = Literal["trtllm"]
RoleName = Literal["prefill", "decode", "worker"]
Capability = Literal["IPC_LOCK", "SYS_RESOURCE", "SYS_NICE", "SYS_PTRACE", "NET_RAW", "NET_ADMIN"]
PlanSystem = Literal["gb200", "gb300", "b200", "h200", "h100"]
ROLES: tuple[RoleName, ...] = ("prefill", "decode", "worker")


def _cel_rules(rules: list[dict[str, str]]) -> dict[str, Any]:
    """Schema extra that installs CEL rules on an object."""
    return {"x-kubernetes-validations": rules}


def _cel_of(rule: ValueRule | KeysRule) -> dict[str, Any]:
    """Schema extra that installs a field's CEL rule; `AfterValidator(rule)` is its Python twin."""
    return _cel_rules([rule.x_kubernetes_validation()])


def _refuse_broken(checks: list[tuple[ObjectRule, bool]]) -> None:
    """Raise the object rules that do not hold (rule, holds), in the API server's words and order."""
    broken = [rule for rule, holds in checks if not holds]
    if broken:
        raise object_rules_error(broken)


def _quantity(value: Any) -> int | str:
    """A Kubernetes quantity as the CRD schema checks it: an integer >= 0 or a quantity string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError(
            "tokenfab_type", "must be of type integer,string", {"expected": "integer,string"}
        )
    if isinstance(value, int) and value < 0:
        raise PydanticKnownError("greater_than_equal", {"ge": 0})
    if isinstance(value, str) and not matches(QUANTITY_PATTERN)(value):
        raise PydanticKnownError("string_pattern_mismatch", {"pattern": QUANTITY_PATTERN})
    return value


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]


class _Model(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


# --------------------------------------------------------------------------------------------- spec


class ModelCache(_Model):
    """Where hf:// weights are kept on the GPU nodes: the worker launcher downloads model.revision into
    this volume once, and every later pod that finds it there loads it from there."""

    size: Quantity = Field(
        default="1Ti",
        description="Declared size of the cache: the PersistentVolumeClaim's request, or the emptyDir's "
        "sizeLimit (DeepSeek-R1 in FP8 is about 690 GB).",
    )
    storage_class_name: Annotated[str | None, AfterValidator(STORAGE_CLASS_RULE)] = Field(
        default=None,
        max_length=253,
        description="A node-local StorageClass (volumeBindingMode WaitForFirstConsumer: local NVMe through "
        "local-path-provisioner, TopoLVM, OpenEBS LocalPV...). tokenfab then makes one "
        "PersistentVolumeClaim per node the deployment's pods run on, named <name>-model-<hash of the node, "
        "class and size>, so the deployment's weights are downloaded once per node and kept across pods, "
        "restarts and rollouts (a new class or size is a new claim; the old one goes once unused). Unset: an "
        "emptyDir of `size` per pod, downloaded again by every new pod.",
        json_schema_extra=_cel_of(STORAGE_CLASS_RULE),
    )


class ModelSource(_Model):
    """What model to serve and where its weights come from."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="Served model name: the `model` field clients send to the OpenAI-compatible API "
        "(e.g. deepseek-ai/DeepSeek-R1).",
    )
    source: Annotated[str, AfterValidator(SOURCE_RULE), AfterValidator(S3_SOURCE_RULE)] = Field(
        max_length=2048,
        description="Where the weights live: hf://<org>/<repo> (a model hub: the worker launcher downloads "
        "model.revision into its model cache before the engine starts) or pvc://<claim>/<path> (a "
        "PersistentVolumeClaim in this namespace, and the weights' directory in it). s3:// is refused "
        "until tokenfab fetches it. No whitespace, and a non-empty path after the scheme.",
        json_schema_extra=_cel_rules(
            [SOURCE_RULE.x_kubernetes_validation(), S3_SOURCE_RULE.x_kubernetes_validation()]
        ),
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description="Revision of hf:// weights: a hub commit, branch or tag, downloaded by the worker "
        "launcher and loaded by the engine (unset: the hub's main branch). For pvc:// a label only. Pin a "
        "commit in production so every group loads the same weights.",
    )
    cache: ModelCache = Field(
        default_factory=ModelCache,
        description="The model cache hf:// weights are downloaded into (pvc:// weights are mounted as they "
        "are).",
    )


class KeySelector(_Model):
    """A key of a Secret or ConfigMap in this namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret or ConfigMap.")
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key whose value the variable takes.",
    )
    optional: bool | None = Field(
        default=None, description="Start the container even when the object or the key is missing."
    )


class ObjectFieldSelector(_Model):
    """A field of the worker pod (Kubernetes downward API)."""

    field_path: str = Field(
        min_length=1, max_length=512, description="Path of the field, e.g. metadata.name or status.podIP."
    )
    api_version: str | None = Field(
        default=None, max_length=64, description="Version of the schema the path is written in (v1)."
    )


class ResourceFieldSelector(_Model):
    """A resource request or limit of a worker container (Kubernetes downward API)."""

    resource: str = Field(
        min_length=1,
        max_length=LABEL_KEY_MAX,
        description="The resource, e.g. limits.memory or requests.cpu.",
    )
    container_name: str | None = Field(
        default=None, max_length=63, description="Container whose resource is read (default: this one)."
    )
    divisor: Quantity | None = Field(default=None, description="Unit the value is expressed in (default 1).")


class EnvVarSource(_Model):
    """Where a variable's value comes from: exactly one of the sources (a Kubernetes EnvVarSource)."""

    model_config = ConfigDict(json_schema_extra=_cel_rules([ENV_ONE_SOURCE.x_kubernetes_validation()]))

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret, e.g. a model hub token."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource request or limit of the container."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        sources = [self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref]
        _refuse_broken([(ENV_ONE_SOURCE, sum(s is not None for s in sources) == 1)])
        return self


class EnvVar(_Model):
    """One environment variable for the worker containers."""

    model_config = ConfigDict(
        json_schema_extra=_cel_rules([ENV_VALUE_OR_VALUE_FROM.x_kubernetes_validation()])
    )

    name: Annotated[str, AfterValidator(ENV_RESERVED_RULE)] = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name (not one tokenfab sets on every worker: TOKENFAB_RANK, DYN_NAMESPACE, "
        "...).",
        json_schema_extra=_cel_of(ENV_RESERVED_RULE),
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value (at most 32 KiB).")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="Where the value comes from, as in a Kubernetes container: secretKeyRef, "
        "configMapKeyRef, fieldRef or resourceFieldRef; e.g. a hub token from a Secret.",
    )

    @model_validator(mode="after")
    def _value_or_value_from(self) -> EnvVar:
        _refuse_broken([(ENV_VALUE_OR_VALUE_FROM, self.value_from is None or not self.value)])
        return self


_REQUESTS_KEYS = resource_keys_rule("requests")
_LIMITS_KEYS = resource_keys_rule("limits")


class Resources(_Model):
    """CPU and memory for each worker container, beside the GPUs that parallelism implies."""

    requests: Annotated[dict[str, Quantity], AfterValidator(_REQUESTS_KEYS)] = Field(
        default_factory=dict,
        max_length=RESOURCES_MAX_ENTRIES,
        description=f"Resource requests (cpu, memory, ephemeral-storage), at most {RESOURCES_MAX_ENTRIES}, "
        "each a Kubernetes quantity (8, 500m, 64Gi). GPUs are derived from parallelism: do not list "
        "topology.gpuResource here.",
        json_schema_extra=_cel_of(_REQUESTS_KEYS),
    )
    limits: Annotated[dict[str, Quantity], AfterValidator(_LIMITS_KEYS)] = Field(
        default_factory=dict,
        max_length=RESOURCES_MAX_ENTRIES,
        description=f"Resource limits (cpu, memory, ephemeral-storage), at most {RESOURCES_MAX_ENTRIES}, "
        "each a Kubernetes quantity. GPUs are derived from parallelism: do not list topology.gpuResource "
        "here.",
        json_schema_extra=_cel_of(_LIMITS_KEYS),
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
    # Not a first-class field (yet): it multiplies a group's GPUs, which tokenfab derives from parallelism.
    "context_parallel_size": "",
}
_UNSUPPORTED_KEYS = {
    "context_parallel_size": "context_parallel_size multiplies the GPUs of a group, which tokenfab derives "
    "from parallelism (tensor x pipeline, or expert): context parallelism is not supported yet; remove it "
    "from extraEngineArgs",
}
RESERVED_KEY_RULES = tuple(
    reserved_key_rule(k, f, _UNSUPPORTED_KEYS.get(k)) for k, f in RESERVED_ENGINE_KEYS.items()
)


def _refuse_reserved_keys(args: dict[str, Any]) -> dict[str, Any]:
    for key, rule in zip(RESERVED_ENGINE_KEYS, RESERVED_KEY_RULES, strict=True):
        if key in args:
            raise PydanticCustomError("tokenfab_reserved_key", rule.message)
    return args


def engine_args_bytes(args: dict[str, Any]) -> int:
    """Size of extraEngineArgs as compact JSON, the measure of ENGINE_ARGS_MAX_BYTES."""
    return len(json.dumps(args, separators=(",", ":"), ensure_ascii=False).encode())


def _bound_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    # The API server cannot see inside free-form YAML (CEL sees no undeclared field), so this bound is
    # the models' alone: `tokenfab validate` and the operator refuse what admission let through.
    size = engine_args_bytes(args)
    if size > ENGINE_ARGS_MAX_BYTES:
        raise PydanticCustomError(
            "tokenfab_rule",
            "extraEngineArgs must be at most {limit} bytes as JSON (64 KiB), and it is {size}: tokenfab "
            "writes it into each role's engine ConfigMap (1 MiB at most); keep bulky data in the image or on "
            "the model volume and point to it",
            {"limit": ENGINE_ARGS_MAX_BYTES, "size": size},
        )
    return args


def _engine_args_schema(schema: dict[str, Any]) -> None:
    """Free-form YAML object, but with the reserved keys declared so CEL rules can see them."""
    description = schema.get("description")
    schema.clear()
    schema["type"] = "object"
    schema["description"] = description
    schema["x-kubernetes-preserve-unknown-fields"] = True
    schema["maxProperties"] = ENGINE_ARGS_MAX_KEYS
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
    AfterValidator(_bound_engine_args),
    Field(
        default_factory=dict,
        max_length=ENGINE_ARGS_MAX_KEYS,
        description="Extra TensorRT-LLM LLM-API engine settings (YAML), merged into the generated engine "
        "config (e.g. kv_cache_config, cuda_graph_config, moe_config). Keys that tokenfab derives from "
        "first-class fields (" + ", ".join(sorted(RESERVED_ENGINE_KEYS)) + ") are refused. Limits: at most "
        f"{ENGINE_ARGS_MAX_KEYS} top-level keys (the API server refuses more) and at most "
        f"{ENGINE_ARGS_MAX_BYTES // 1024} KiB as JSON in all (the operator and `tokenfab validate` refuse "
        "more; the API server cannot see inside free-form YAML), as the engine config must fit a ConfigMap.",
        json_schema_extra=_engine_args_schema,
    ),
]


class Runtime(_Model):
    """The worker container: image, engine, environment and resources."""

    image: Annotated[str, AfterValidator(IMAGE_RULE)] = Field(
        default="ghcr.io/tokenfab/worker:0.1.0",
        min_length=1,
        max_length=1024,
        description="Worker image: NVIDIA's Dynamo TensorRT-LLM runtime plus tokenfab's launcher (no "
        "whitespace).",
        json_schema_extra=_cel_of(IMAGE_RULE),
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
    add_capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=8,
        description="Linux capabilities the worker containers get back after dropping all (e.g. IPC_LOCK "
        "for RDMA memory registration). Any of them takes the worker pods out of the restricted Pod "
        "Security Standard: their namespace must allow baseline or privileged.",
    )


class Serving(_Model):
    """How requests reach the workers: mode, router and the prefill:decode ratio."""

    model_config = ConfigDict(
        json_schema_extra=_cel_rules(
            [ETCD_NEEDS_ENDPOINTS.x_kubernetes_validation(), ENDPOINTS_NEED_ETCD.x_kubernetes_validation()]
        )
    )

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
    drain_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="How long a group that is being removed (scale-down, rollout, a smaller spec) may take "
        "to finish its requests: it is first taken out of routing (its leader pod's readiness gate "
        "tokenfab.dev/routable turns False, so the router sends it nothing new), then deleted as soon as "
        "its engine reports no request in flight, or after drainSeconds (the requests still running are "
        "cut). Also the pods' terminationGracePeriodSeconds (plus 30 s) and Dynamo's graceful-shutdown "
        "bound, so a pod evicted by Kubernetes drains too. 600 s fits long reasoning outputs; 0 deletes "
        "at once.",
    )
    drain_mode: Literal["routing", "sigterm"] = Field(
        default="routing",
        description="How a group drains (with drainSeconds > 0). routing: out of routing first (its "
        "leader's readiness gate), deleted once its engine reports no request in flight (read from "
        "autoscaling.prometheusUrl; without one, as sigterm) or after drainSeconds. sigterm: deleted at "
        "once, each engine finishing its requests on SIGTERM (Dynamo's graceful shutdown) within "
        "drainSeconds, as a plain workload with a long termination grace period would.",
    )
    discovery: Discovery = Field(
        default="kubernetes",
        description="How Dynamo's frontend and workers find each other. kubernetes: each process writes a "
        "DynamoWorkerMetadata object (nvidia.com/v1alpha1, its CRD installed with tokenfab) and a worker is "
        "routed to only while its pod is ready in the EndpointSlice of the deployment's workers Service; "
        "tokenfab gives the pods a ServiceAccount <name>-dynamo with just those rights. etcd: an etcd "
        "cluster you run (serving.etcdEndpoints).",
    )
    etcd_endpoints: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=r"^\S+$",
        description="etcd client URLs for serving.discovery etcd, comma-separated (Dynamo's "
        "ETCD_ENDPOINTS), e.g. http://etcd.dynamo-system:2379.",
    )

    @model_validator(mode="after")
    def _etcd(self) -> Serving:
        _refuse_broken(
            [
                (ETCD_NEEDS_ENDPOINTS, self.discovery != "etcd" or self.etcd_endpoints is not None),
                (ENDPOINTS_NEED_ETCD, self.etcd_endpoints is None or self.discovery == "etcd"),
            ]
        )
        return self


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
        description="Number of groups when autoscaling is off (default 1; 0 parks the role), and the "
        "starting number when it is on. With serving.ratioPolicy fixed, leave it out on prefill: prefill "
        "follows decode by the ratio.",
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
        description=f"MTP draft depth (TensorRT-LLM speculative_config.max_draft_len, once "
        f"num_nextn_predict_layers): 0 turns MTP off; 1 to "
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
        default=True,
        description="Create an NVIDIA ComputeDomain (resource.nvidia.com/v1beta1, from NVIDIA's DRA driver) "
        "per multi-node group and claim its IMEX channel from every pod of the group: multi-node NVLink "
        "(NCCL's MNNVL, wide expert parallelism across trays) needs it. One-node groups need none. Where "
        "the driver is not installed, multi-node groups wait with Placed=False/ComputeDomainUnavailable: "
        "install it, or set false to run them without IMEX (NCCL then falls back to InfiniBand between "
        "trays).",
    )
    node_failure_toleration_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How long a group's pods stay bound to a NotReady or unreachable node (the "
        "tolerationSeconds of their node.kubernetes.io/not-ready and unreachable tolerations) before the "
        "group is recreated elsewhere. The default, 300, is Kubernetes' own and rides out a kubelet "
        "restart; a lower value moves a large (e.g. 32-GPU) group sooner after a real node loss, at the "
        "cost of restarting it on a short blip.",
    )


class RoleBounds(_Model):
    """Autoscaling bounds for one role, in groups."""

    model_config = ConfigDict(json_schema_extra=_cel_rules([BOUNDS_RULE.x_kubernetes_validation()]))

    min_replicas: Annotated[int, AfterValidator(MIN_REPLICAS_RULE)] = Field(
        default=1,
        le=4096,
        description="Fewest groups, at least 1: scale-to-zero is not supported. To park a role, set "
        "autoscaling.enabled to false and the role's replicas to 0.",
        json_schema_extra=_cel_of(MIN_REPLICAS_RULE),
    )
    max_replicas: int = Field(default=1, ge=0, le=4096, description="Most groups.")

    @model_validator(mode="after")
    def _min_le_max(self) -> RoleBounds:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("tokenfab_rule", BOUNDS_RULE.message)
        return self


class FrontendScaling(_Model):
    """Bounds and per-replica capacity for sizing the Dynamo frontend from its own ingress."""

    model_config = ConfigDict(json_schema_extra=_cel_rules([BOUNDS_RULE.x_kubernetes_validation()]))

    min_replicas: int = Field(default=1, ge=1, le=64, description="Fewest frontend replicas.")
    max_replicas: int = Field(default=1, ge=1, le=64, description="Most frontend replicas.")
    requests_per_second_per_replica: float = Field(
        default=30.0,
        gt=0,
        le=100000,
        description="Requests/s one frontend replica should take (a replica tops out near 40/s at 60k-token "
        "inputs): replicas = forecast requests/s / this, rounded up.",
    )
    input_tokens_per_second_per_replica: float = Field(
        default=1_000_000.0,
        gt=0,
        le=1e9,
        description="Input tokens/s one frontend replica should tokenize and route: replicas also cover "
        "forecast input tokens/s / this.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> FrontendScaling:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("tokenfab_rule", BOUNDS_RULE.message)
        return self


class Autoscaling(_Model):
    """Scale prefill and decode groups (and the frontend) with the load: led by the forecast arrival rate
    and forming queues, with KV-cache utilization near a target as the guard."""

    enabled: bool = Field(default=False, description="Turn the built-in autoscaler on.")
    policy: Literal["leading", "kv"] = Field(
        default="leading",
        description="leading: size from the demand ahead (the frontend's arrival rate, forecast "
        "forecastSeconds ahead, divided by what one group serves) and from queues forming in the groups, "
        "with the KV-cache target as the guard. kv: KV-cache utilization alone (reacts only once the cache "
        "fills).",
    )
    forecast_seconds: int | None = Field(
        default=None,
        ge=0,
        le=1800,
        description="How far ahead the arrival rate is forecast: about the time a new group needs to serve "
        "(scheduling, weight loading, registration). Left out, it is learned from how long this "
        "deployment's groups took from creation to Ready.",
    )
    rate_window_seconds: int = Field(
        default=30,
        ge=5,
        le=600,
        description="Window of the arrival-rate query (PromQL rate over the frontend's request counter): "
        "at least twice the Prometheus scrape interval; shorter reacts sooner.",
    )
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
    frontend: FrontendScaling | None = Field(
        default=None,
        description="Size the frontend Deployment from its request and input-token ingress within these "
        "bounds (left out: serving.frontendReplicas, fixed).",
    )
    target_queue_depth: float = Field(
        default=4,
        gt=0,
        le=10000,
        description="With ratioPolicy independent: target waiting requests per prefill group.",
    )
    query: Annotated[str | None, AfterValidator(QUERY_RULE)] = Field(
        default=None,
        max_length=4096,
        description="PromQL override for the utilization signal, returning one sample in [0, 1] per group "
        "(keyed by its tokenfab_dev_group label). It is filled in by Python's str.format: the placeholders "
        "{namespace}, {deployment} and {role} (written bare, nothing else inside the braces) become the "
        "deployment's values, and every literal brace, such as those of PromQL label matchers, must be "
        'doubled: max by (tokenfab_dev_group) (kv_cache_usage{{namespace="{namespace}", role="{role}"}}).',
        json_schema_extra=_cel_of(QUERY_RULE),
    )


class Toleration(_Model):
    """A taint the worker pods tolerate (as a Kubernetes pod toleration)."""

    model_config = ConfigDict(
        json_schema_extra=_cel_rules([r.x_kubernetes_validation() for r in TOLERATION_RULES])
    )

    key: Annotated[str | None, AfterValidator(TOLERATION_KEY_RULE)] = Field(
        default=None,
        max_length=LABEL_KEY_MAX,
        description="Taint key the toleration matches; left out (with operator Exists) it matches every "
        "taint.",
        json_schema_extra=_cel_of(TOLERATION_KEY_RULE),
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
        _refuse_broken(
            [
                (TOLERATION_RULES[0], bool(self.key) or self.operator == "Exists"),
                (TOLERATION_RULES[1], self.operator != "Exists" or not self.value),
                (TOLERATION_RULES[2], self.toleration_seconds is None or self.effect == "NoExecute"),
            ]
        )
        return self


class Scheduling(_Model):
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
        json_schema_extra=_cel_of(NODE_SELECTOR_KEYS_RULE),
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
        json_schema_extra=_cel_of(PRIORITY_CLASS_RULE),
    )
    scheduler_name: Annotated[str | None, AfterValidator(SCHEDULER_NAME_RULE)] = Field(
        default=None,
        max_length=253,
        description="Scheduler that binds the worker pods (default: the cluster's default scheduler).",
        json_schema_extra=_cel_of(SCHEDULER_NAME_RULE),
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
    scheduling: Scheduling | None = Field(
        default=None,
        description="Node selector, tolerations, priority class and scheduler of the worker pods. Placement "
        "counts only the nodes whose labels match nodeSelector and whose NoSchedule/NoExecute taints the "
        "tolerations tolerate.",
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


class _Status(_Model):
    """Base for what the operator writes to status: read leniently, so an operator keeps working when the
    stored status has fields a newer version wrote (they are dropped on read). The schema is the same."""

    model_config = ConfigDict(extra="ignore")


class Condition(_Status):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, Placed, CapacityLimited, MetricsUnavailable, Planned."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation the condition saw.")


class RoleStatus(_Status):
    """Observed groups and GPUs of one role."""

    desired_groups: int = Field(default=0, description="Groups the operator wants (spec or autoscaler).")
    ready_groups: int = Field(default=0, description="Groups whose every pod is Ready.")
    gpus_per_group: int = Field(default=0, description="GPUs in one group (tensor x pipeline).")
    desired_gpus: int = Field(default=0, description="GPUs of the desired groups.")
    ready_gpus: int = Field(default=0, description="GPUs of the ready groups.")
    groups: str = Field(default="0/0", description="ready/desired groups, for kubectl get.")
    draining_groups: int = Field(default=0, description="Groups out of routing, finishing their requests.")


class GroupPlacement(_Status):
    """Where one group runs."""

    group: str = Field(description="Group name.")
    role: RoleName = Field(description="Role of the group.")
    domain: str = Field(description="NVLink domain (value of topology.domainLabel).")
    gpus: int = Field(description="GPUs of the group.")


class ScalingDecision(_Status):
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


class AutoscalingStatus(_Status):
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


class PlannedRole(_Status):
    """One role of a plan."""

    # The spec's own Parallelism (so a plan compares equal to a spec), read leniently.
    parallelism: Annotated[Parallelism, _drop_unknown(Parallelism)] = Field(
        description="Parallelism of one group."
    )
    replicas: int = Field(description="Groups of this role in the plan.")


class PlanPrediction(_Status):
    """What the performance model predicts for the plan."""

    gpus: int = Field(description="GPUs of the whole plan.")
    tokens_per_second_per_gpu: float = Field(description="Output tokens/s per GPU the plan uses.")
    tokens_per_second_per_user: float = Field(description="Output tokens/s of one request.")
    ttft_ms: float = Field(description="Time to first token, milliseconds.")
    itl_ms: float = Field(description="Inter-token latency, milliseconds.")
    request_rate: float | None = Field(default=None, description="Requests/s the plan serves.")


class ProfileStatus(_Status):
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


class RoleFailures(_Status):
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


class ModelDeploymentStatus(_Status):
    """Observed state of a ModelDeployment, written only by the operator."""

    observed_generation: int | None = Field(default=None, description="Spec generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Current conditions.")
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Per-role groups and GPUs.")
    gpus: str = Field(default="0/0", description="ready/desired GPUs over all roles, for kubectl get.")
    draining_groups: int = Field(
        default=0, description="Groups draining over all roles (out of routing, finishing their requests)."
    )
    placement: list[GroupPlacement] = Field(default_factory=list, description="Group to NVLink domain.")
    endpoint: str | None = Field(default=None, description="In-cluster URL of the OpenAI-compatible API.")
    autoscaling: AutoscalingStatus | None = Field(default=None, description="Autoscaler state.")
    profile: ProfileStatus | None = Field(default=None, description="The plan made for spec.profile.")
    failures: dict[str, RoleFailures] = Field(
        default_factory=dict, description="Roles whose groups keep failing, and when they may be replaced."
    )


class ObjectMeta(BaseModel):
    """The part of metadata tokenfab reads."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ModelDeploymentMeta(ObjectMeta):
    """Metadata of a ModelDeployment: its name must suit the children named after it."""

    @field_validator("name")
    @classmethod
    def _name_names_children(cls, name: str | None) -> str | None:
        # The API server checks every object's name (a DNS subdomain), then the CRD's NAME_RULE.
        texts = [] if name is None else name_errors(name)
        if texts:
            raise PydanticCustomError(
                "tokenfab_rules", "{summary}", {"summary": "; ".join(texts), "texts": texts}
            )
        return name


class ModelDeployment(BaseModel):
    """A whole ModelDeployment object as read from YAML or the API server."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["tokenfab.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ModelDeployment"]
    metadata: ModelDeploymentMeta = Field(default_factory=ModelDeploymentMeta)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


# ------------------------------------------------------------------------------------ NVLinkDomain

DOMAIN_KIND = "NVLinkDomain"
DOMAIN_PLURAL = "nvlinkdomains"
DOMAIN_SINGULAR = "nvlinkdomain"
DOMAIN_SHORT_NAMES = ("nvld",)


class DomainGroup(_Status):
    """A worker group placed in the domain."""

    namespace: str = Field(description="Namespace of the group's ModelDeployment.")
    group: str = Field(description="Group name.")
    gpus: int = Field(description="GPUs the group uses.")


class NVLinkDomainStatus(_Status):
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
