"""The roles of a deployment (prefill, decode, or the aggregated worker): each role's parallelism, groups and
batch limits, multi-token prediction, and the profile (SLA and traffic) that a plan fills them from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenfab.api.models.base import SpecModel
from tokenfab.api.models.runtime import Engine, EngineArgs

MTP_MAX_DEPTH = 5

RoleName = Literal["prefill", "decode", "worker"]
ROLES: tuple[RoleName, ...] = ("prefill", "decode", "worker")
PlanSystem = Literal["gb200", "gb300", "b200", "h200", "h100"]


class Parallelism(SpecModel):
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


class Role(SpecModel):
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


class SpeculativeDecoding(SpecModel):
    """Multi-token prediction (MTP) for models trained with MTP heads (DeepSeek-V3/R1 family)."""

    mtp_depth: int = Field(
        default=0,
        ge=0,
        le=MTP_MAX_DEPTH,
        description=f"MTP draft depth (TensorRT-LLM speculative_config.max_draft_len, once "
        f"num_nextn_predict_layers): 0 turns MTP off; 1 to "
        f"{MTP_MAX_DEPTH} drafts that many tokens per step. 3 is the usual choice for DeepSeek-R1.",
    )


class Profile(SpecModel):
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
