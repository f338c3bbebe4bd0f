"""TensorRT-LLM engine configuration (LLM-API YAML) of a role, built from the spec (pure).

First-class fields (parallelism, batch limits, MTP depth, disaggregation) are written by tokenfab; the
user's `extraEngineArgs` (deployment-wide, then per role) are merged underneath for everything else. The
API refuses user keys that would contradict a first-class field, so nothing here has to arbitrate.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from tokenfab.api.models import ModelDeploymentSpec, RoleName

DEFAULT_KV_CACHE = {"free_gpu_memory_fraction": 0.85}

# The roles that run with --disaggregation-mode <role> when the deployment is disaggregated.
DISAGGREGATED_ROLES: tuple[RoleName, ...] = ("prefill", "decode")

# Engine YAML keys that tokenfab writes (and the worker launcher checks against the group's shape).
TENSOR_PARALLEL_SIZE = "tensor_parallel_size"
PIPELINE_PARALLEL_SIZE = "pipeline_parallel_size"
CONTEXT_PARALLEL_SIZE = "context_parallel_size"  # not written by tokenfab; multiplies the GPUs if set
MOE_EXPERT_PARALLEL_SIZE = "moe_expert_parallel_size"
ENABLE_ATTENTION_DP = "enable_attention_dp"
SPECULATIVE_CONFIG = "speculative_config"
MTP_DECODING_TYPE = "MTP"
# The MTP depth: TensorRT-LLM's MTPDecodingConfig.max_draft_len (num_nextn_predict_layers, the older key, is
# still read, with a deprecation, and moved there).
MTP_LAYERS = "max_draft_len"
LEGACY_MTP_LAYERS = "num_nextn_predict_layers"


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`; nested dicts merge, everything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def disaggregation_mode(spec: ModelDeploymentSpec, role: RoleName) -> str | None:
    """The worker's --disaggregation-mode: prefill or decode, or None when aggregated."""
    return role if role in DISAGGREGATED_ROLES and spec.serving.mode == "disaggregated" else None


def engine_config(spec: ModelDeploymentSpec, role_name: RoleName) -> dict[str, Any]:
    """The engine YAML (as a dict) for one role."""
    role = spec.role(role_name)
    if role is None:
        raise ValueError(f"the deployment has no {role_name} role")
    defaults: dict[str, Any] = {"kv_cache_config": dict(DEFAULT_KV_CACHE)}
    mode = disaggregation_mode(spec, role_name)
    if mode is not None:
        # KV-cache transfer between prefill and decode groups.
        defaults["cache_transceiver_config"] = {"backend": "DEFAULT"}
        if mode == "prefill":
            defaults["disable_overlap_scheduler"] = True
    cfg = deep_merge(deep_merge(defaults, spec.runtime.extra_engine_args), role.extra_engine_args)
    p = role.parallelism
    cfg[TENSOR_PARALLEL_SIZE] = p.tensor
    cfg[PIPELINE_PARALLEL_SIZE] = p.pipeline
    cfg[MOE_EXPERT_PARALLEL_SIZE] = p.expert
    cfg[ENABLE_ATTENTION_DP] = p.attention_data_parallel
    if role.max_batch_size is not None:
        cfg["max_batch_size"] = role.max_batch_size
    if role.max_num_tokens is not None:
        cfg["max_num_tokens"] = role.max_num_tokens
    depth = spec.speculative_decoding.mtp_depth
    if depth > 0:
        cfg[SPECULATIVE_CONFIG] = {"decoding_type": MTP_DECODING_TYPE, MTP_LAYERS: depth}
    return dict(sorted(cfg.items()))


# LibYAML's emitter where PyYAML has it: the same text, several times faster.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_RENDERED: dict[str, str] = {}


def render(cfg: dict[str, Any]) -> str:
    """The engine YAML of a config. Every pass renders each role's to compare with its ConfigMap, so
    the text is kept by the config's JSON (a few hundred bytes; the cache is emptied past 512 configs)."""
    key = json.dumps(cfg, sort_keys=True, default=repr)
    text = _RENDERED.get(key)
    if text is None:
        text = yaml.dump(cfg, Dumper=_DUMPER, sort_keys=True)
        if len(_RENDERED) >= 512:
            _RENDERED.clear()
        _RENDERED[key] = text
    return text


def content_hash(obj: Any, length: int = 10) -> str:
    """Stable short hash of any JSON-serialisable value."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:length]
