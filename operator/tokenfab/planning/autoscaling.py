"""The autoscaling policy: (samples, current groups, bounds, remembered recommendations, now) -> a decision
with a reason (pure; time is a parameter, memory is passed in and handed back).

Proportional: the load of the groups that count (ready and past warm-up) is `mean signal x their number`;
the groups needed to hold the signal at the target are `ceil(load / target)`. A tolerance band keeps
noise around the target from moving anything. Scale-up takes the lowest recommendation of a short window
and scale-down the highest of a long one (HPA-style stabilization). As in HPA the windows hold the
recommendations themselves (clamped to the bounds only) and the step caps apply after stabilization: once
the long window has passed, a scale-down goes on one step per decision, not one step per window. Results
are clamped to the bounds. Groups that are not ready or still warming up are left out of the average, and
while any group is warming nothing is scaled down: a fresh group reports near-zero use and must trigger
neither. No data, a failed query or stale samples hold the current count: never a scale-down on missing
data. That includes partial data: while a group that counts has no fresh sample nothing is scaled down
(and the decision says metrics are missing); a scale-up still may, on the load that was measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenfab.api.models import Autoscaling


@dataclass(frozen=True)
class Sample:
    """The signal of one group (KV-cache utilization in [0, 1], or waiting requests) and its age."""

    value: float
    age_seconds: float


@dataclass(frozen=True)
class Config:
    target: float
    min_groups: int
    max_groups: int
    tolerance: float = 0.1
    max_step_up: int = 2
    max_step_down: int = 1
    up_window: float = 0.0
    down_window: float = 300.0
    stale_after: float = 60.0


@dataclass(frozen=True)
class Memory:
    """What the policy remembers between decisions (kept in the resource's status)."""

    recommendations: tuple[tuple[float, int], ...] = ()
    last_scale_time: float | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    current: int
    reason: str  # CamelCase
    message: str
    signal: float | None  # mean signal over the groups that counted
    recommendation: int | None  # before stabilization and step caps (within the bounds)
    memory: Memory = field(default_factory=Memory)
    metrics_ok: bool = True  # False: no data, or a group that counts sent no fresh sample

    @property
    def direction(self) -> str:
        return "up" if self.desired > self.current else "down" if self.desired < self.current else "hold"


def config_for(a: Autoscaling, min_groups: int, max_groups: int, target: float | None = None) -> Config:
    """The policy's settings from a spec's autoscaling section (target defaults to the KV target)."""
    return Config(
        target=a.target_kv_cache_utilization if target is None else target,
        min_groups=min_groups,
        max_groups=max_groups,
        tolerance=a.tolerance,
        max_step_up=a.max_step_up,
        max_step_down=a.max_step_down,
        up_window=a.scale_up_stabilization_seconds,
        down_window=a.scale_down_stabilization_seconds,
        stale_after=max(60.0, 3.0 * a.interval_seconds),  # a few missed scrapes make a sample stale
    )


def _clamp(n: int, cfg: Config) -> int:
    return max(cfg.min_groups, min(cfg.max_groups, n))


def decide(
    samples: Mapping[str, Sample] | None,
    counted: set[str],
    warming: int,
    current: int,
    cfg: Config,
    memory: Memory,
    now: float,
) -> Decision:
    """One decision for one role.

    samples: per group, or None when the query failed. counted: groups that are ready and warm (only
    their samples count). warming: groups that exist but are not ready or still warming up.
    """
    keep = max(cfg.up_window, cfg.down_window)
    history = tuple((t, n) for t, n in memory.recommendations if now - t <= keep)

    def hold(reason: str, message: str, metrics_ok: bool, signal: float | None = None) -> Decision:
        desired = _clamp(current, cfg)
        if desired != current:
            reason, message = (
                "OutOfBounds",
                f"{current} groups is outside [{cfg.min_groups}, {cfg.max_groups}]",
            )
        mem = replace(memory, recommendations=history)
        if desired != current:
            mem = replace(mem, last_scale_time=now)
        return Decision(desired, current, reason, message, signal, None, mem, metrics_ok)

    if samples is None:
        return hold("MetricsUnavailable", "the metrics query failed: holding the current groups", False)
    fresh = {g: s for g, s in samples.items() if g in counted and s.age_seconds <= cfg.stale_after}
    if not fresh:
        if counted:
            stale = [g for g in counted if g in samples]
            what = "stale" if stale else "missing"
            return hold(
                "MetricsUnavailable",
                f"samples {what} for {len(counted)} ready group(s): holding the current groups",
                False,
            )
        return hold("Warming", f"no group has finished warming up ({warming} warming)", True)

    signal = sum(s.value for s in fresh.values()) / len(fresh)
    missing = len(counted) - len(fresh)  # groups that count but sent no fresh sample
    ratio = signal / cfg.target
    if abs(ratio - 1) <= cfg.tolerance:
        rec = current
    else:
        rec = math.ceil(len(fresh) * signal / cfg.target - 1e-9)
        rec = max(rec, 1 if signal > 0 else 0)
    rec = _clamp(rec, cfg)  # the windows compare recommendations; the step caps come after them
    history = (*history, (now, rec))
    mem = replace(memory, recommendations=history)

    if rec > current:
        window = [n for t, n in history if now - t <= cfg.up_window]
        desired = min(current + cfg.max_step_up, max(current, min(window)))
        reason = "ScaleUp" if desired > current else "ScaleUpStabilizing"
    elif rec < current and (warming or missing):
        desired, reason = current, "Warming" if warming else "MetricsIncomplete"
    elif rec < current:
        window = [n for t, n in history if now - t <= cfg.down_window]
        desired = max(current - cfg.max_step_down, min(current, max(window)))
        reason = "ScaleDown" if desired < current else "ScaleDownStabilizing"
    else:
        desired, reason = current, "WithinTolerance"
    if _clamp(desired, cfg) != desired:
        desired, reason = _clamp(desired, cfg), "OutOfBounds"
    if desired != current:
        mem = replace(mem, last_scale_time=now)
    if reason == "Warming":
        message = f"{warming} group(s) still warming up: no scale-down yet"
    else:
        message = (
            f"mean {signal:.3f} over {len(fresh)} group(s) vs target {cfg.target:g}: recommend {rec}, "
            f"{current} -> {desired}"
        )
    if missing:
        message += f"; no fresh sample from {missing} of {len(counted)} ready group(s)" + (
            ": no scale-down" if rec < current else ""
        )
    return Decision(desired, current, reason, message, signal, rec, mem, metrics_ok=not missing)


def initial_groups(replicas: int | None, cfg: Config) -> int:
    """The count to start from when autoscaling is turned on: the spec's replicas within the bounds."""
    return _clamp(cfg.min_groups if replicas is None else replicas, cfg)
