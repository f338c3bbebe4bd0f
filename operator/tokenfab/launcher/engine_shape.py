"""The engine YAML as the launcher checks it (pure): its parallelism must fill the group's GPUs.

The text comes in (tokenfab.launcher.run reads the mounted ConfigMap); an `EngineShape` or a
`ConfigError` naming the engine key at fault comes out. Key names come from tokenfab.planning.engine_config,
which the reconciler writes the file with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from tokenfab.launcher.identity import ConfigError, Identity
from tokenfab.planning import contract, engine_config


@dataclass(frozen=True)
class EngineShape:
    """What the launcher checks and reports of the engine YAML."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    context_parallel_size: int
    moe_expert_parallel_size: int | None
    enable_attention_dp: bool
    mtp_depth: int  # 0: no multi-token prediction

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size


def _positive(cfg: Mapping[str, Any], key: str, where: str, problems: list[str], default: int | None) -> int:
    value = cfg.get(key, default)
    if value is None:
        problems.append(f"{where}: {key} is missing (tokenfab writes it from the role's parallelism)")
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"{where}: {key} must be a positive integer, got {value!r}")
        return 1
    return value


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError([f"{where} is not valid YAML: {detail}"]) from exc
    if not isinstance(cfg, dict):
        raise ConfigError(
            [f"{where} must be a mapping of TensorRT-LLM LLM-API keys, got {type(cfg).__name__}"]
        )
    return cfg


def _mtp_depth(cfg: Mapping[str, Any], where: str, problems: list[str]) -> int:
    """Multi-token prediction's depth from the speculative config (0: none)."""
    spec_cfg = cfg.get(engine_config.SPECULATIVE_CONFIG)
    if spec_cfg is None:
        return 0
    if not isinstance(spec_cfg, dict):
        problems.append(f"{where}: {engine_config.SPECULATIVE_CONFIG} must be a mapping, got {spec_cfg!r}")
        return 0
    if spec_cfg.get("decoding_type") != engine_config.MTP_DECODING_TYPE:
        return 0
    legacy = engine_config.MTP_LAYERS not in spec_cfg and engine_config.LEGACY_MTP_LAYERS in spec_cfg
    key = engine_config.LEGACY_MTP_LAYERS if legacy else engine_config.MTP_LAYERS
    return _positive(spec_cfg, key, f"{where}: {engine_config.SPECULATIVE_CONFIG}", problems, None)


def _group_mismatch(tp: int, pp: int, cp: int, identity: Identity, where: str) -> str | None:
    """Why the engine's GPUs are not the group's (None: they are)."""
    group_gpus = identity.world_size * identity.gpus_per_pod
    if tp * pp * cp == group_gpus:
        return None
    factors = [
        f"{engine_config.TENSOR_PARALLEL_SIZE} x {engine_config.PIPELINE_PARALLEL_SIZE}",
        f"{tp} x {pp}",
    ]
    if cp != 1:
        factors = [f"{factors[0]} x {engine_config.CONTEXT_PARALLEL_SIZE}", f"{factors[1]} x {cp}"]
    return (
        f"{where}: {factors[0]} = {factors[1]} = {tp * pp * cp} GPUs, but the group has "
        f"{contract.ENV_WORLD_SIZE} x {contract.ENV_GPUS_PER_POD} = {identity.world_size} x "
        f"{identity.gpus_per_pod} = {group_gpus} GPUs: the engine ConfigMap and the pods come from "
        "different revisions of the ModelDeployment (or one was edited by hand); delete the "
        "group's pods so the operator recreates them from one revision"
    )


def engine_shape(text: str, identity: Identity) -> EngineShape:
    """Parse and check the engine YAML against the group: its GPUs must be world size x GPUs per pod."""
    where = f"engine config {identity.engine_config} (from {contract.ENV_ENGINE_CONFIG})"
    cfg = _parse(text, where)
    problems: list[str] = []
    tp = _positive(cfg, engine_config.TENSOR_PARALLEL_SIZE, where, problems, None)
    pp = _positive(cfg, engine_config.PIPELINE_PARALLEL_SIZE, where, problems, 1)
    cp = _positive(cfg, engine_config.CONTEXT_PARALLEL_SIZE, where, problems, 1)
    ep_raw = cfg.get(engine_config.MOE_EXPERT_PARALLEL_SIZE)
    ep = (
        _positive(cfg, engine_config.MOE_EXPERT_PARALLEL_SIZE, where, problems, 1)
        if ep_raw is not None
        else None
    )
    mtp = _mtp_depth(cfg, where, problems)
    if not problems:
        mismatch = _group_mismatch(tp, pp, cp, identity, where)
        if mismatch is not None:
            problems.append(mismatch)
    if problems:
        raise ConfigError(problems)
    return EngineShape(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        context_parallel_size=cp,
        moe_expert_parallel_size=ep,
        enable_attention_dp=bool(cfg.get(engine_config.ENABLE_ATTENTION_DP, False)),
        mtp_depth=mtp,
    )
