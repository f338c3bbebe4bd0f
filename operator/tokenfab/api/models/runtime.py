"""The worker container: image, engine, environment variables, CPU and memory, capabilities, and the free-form
engine settings (extraEngineArgs) with the keys tokenfab keeps for itself."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tokenfab.api.cel import LABEL_KEY_MAX
from tokenfab.api.models.base import Quantity, SpecModel, cel_of, cel_rules, refuse_broken
from tokenfab.api.rules import (
    ENV_ONE_SOURCE,
    ENV_RESERVED_RULE,
    ENV_VALUE_OR_VALUE_FROM,
    IMAGE_RULE,
    reserved_key_rule,
    resource_keys_rule,
)

# Free-form extraEngineArgs: the API server counts top-level keys; the models also bound the whole size.
ENGINE_ARGS_MAX_KEYS = 64
ENGINE_ARGS_MAX_BYTES = 64 * 1024
RESOURCES_MAX_ENTRIES = 16

Engine = Literal["trtllm"]
Capability = Literal["IPC_LOCK", "SYS_RESOURCE", "SYS_NICE", "SYS_PTRACE", "NET_RAW", "NET_ADMIN"]


class KeySelector(SpecModel):
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


class ObjectFieldSelector(SpecModel):
    """A field of the worker pod (Kubernetes downward API)."""

    field_path: str = Field(
        min_length=1, max_length=512, description="Path of the field, e.g. metadata.name or status.podIP."
    )
    api_version: str | None = Field(
        default=None, max_length=64, description="Version of the schema the path is written in (v1)."
    )


class ResourceFieldSelector(SpecModel):
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


class EnvVarSource(SpecModel):
    """Where a variable's value comes from: exactly one of the sources (a Kubernetes EnvVarSource)."""

    model_config = ConfigDict(json_schema_extra=cel_rules([ENV_ONE_SOURCE.x_kubernetes_validation()]))

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
        refuse_broken([(ENV_ONE_SOURCE, sum(s is not None for s in sources) == 1)])
        return self


class EnvVar(SpecModel):
    """One environment variable for the worker containers."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules([ENV_VALUE_OR_VALUE_FROM.x_kubernetes_validation()])
    )

    name: Annotated[str, AfterValidator(ENV_RESERVED_RULE)] = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name (not one tokenfab sets on every worker: TOKENFAB_RANK, DYN_NAMESPACE, "
        "...).",
        json_schema_extra=cel_of(ENV_RESERVED_RULE),
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value (at most 32 KiB).")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="Where the value comes from, as in a Kubernetes container: secretKeyRef, "
        "configMapKeyRef, fieldRef or resourceFieldRef; e.g. a hub token from a Secret.",
    )

    @model_validator(mode="after")
    def _value_or_value_from(self) -> EnvVar:
        refuse_broken([(ENV_VALUE_OR_VALUE_FROM, self.value_from is None or not self.value)])
        return self


_REQUESTS_KEYS = resource_keys_rule("requests")

_LIMITS_KEYS = resource_keys_rule("limits")


class Resources(SpecModel):
    """CPU and memory for each worker container, beside the GPUs that parallelism implies."""

    requests: Annotated[dict[str, Quantity], AfterValidator(_REQUESTS_KEYS)] = Field(
        default_factory=dict,
        max_length=RESOURCES_MAX_ENTRIES,
        description=f"Resource requests (cpu, memory, ephemeral-storage), at most {RESOURCES_MAX_ENTRIES}, "
        "each a Kubernetes quantity (8, 500m, 64Gi). GPUs are derived from parallelism: do not list "
        "topology.gpuResource here.",
        json_schema_extra=cel_of(_REQUESTS_KEYS),
    )
    limits: Annotated[dict[str, Quantity], AfterValidator(_LIMITS_KEYS)] = Field(
        default_factory=dict,
        max_length=RESOURCES_MAX_ENTRIES,
        description=f"Resource limits (cpu, memory, ephemeral-storage), at most {RESOURCES_MAX_ENTRIES}, "
        "each a Kubernetes quantity. GPUs are derived from parallelism: do not list topology.gpuResource "
        "here.",
        json_schema_extra=cel_of(_LIMITS_KEYS),
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


class Runtime(SpecModel):
    """The worker container: image, engine, environment and resources."""

    image: Annotated[str, AfterValidator(IMAGE_RULE)] = Field(
        default="ghcr.io/tokenfab/worker:0.1.0",
        min_length=1,
        max_length=1024,
        description="Worker image: NVIDIA's Dynamo TensorRT-LLM runtime plus tokenfab's launcher (no "
        "whitespace).",
        json_schema_extra=cel_of(IMAGE_RULE),
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
        "for RDMA memory registration). Any of them takes the worker pods out of the restricted and "
        "baseline Pod Security Standards: their namespace must enforce privileged (the PodSecurity "
        "condition says when it does not).",
    )
