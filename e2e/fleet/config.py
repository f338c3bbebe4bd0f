"""One benchmark cell's settings: the contestant, the trace, the deployment's bounds and each contestant's
parameters (e2e/fleet/scenario.py runs it; e2e/fleet/contestants.py reads its parameters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from e2e.fleet import load


@dataclass
class Config:
    namespace: str = "live-fleet"  # live-*: the runner plays these pods' readiness
    name: str = "tiny"
    policy: str = "tokenfab"
    trace_name: str = "single_burst"
    quiet_qps: float = 0.3
    burst_qps: float = 2.0
    before_s: float = 30
    burst_s: float = 150
    after_s: float = 150
    isl: int = 160
    osl: int = 64
    max_decode: int = 4
    target: float = 0.6
    scale_down_window: int = 60
    rate_window_s: int = 10  # the arrival-rate query's window (Prometheus scrapes every 2 s here)
    sample_s: float = 3.0
    window_s: float = 10.0
    slo: load.Slo = field(default_factory=load.Slo)
    # the naive threshold baseline
    threshold_up: float = 0.8
    threshold_down: float = 0.3
    threshold_cooldown_s: float = 10.0
    # the planner baseline (see PlannerBaseline)
    planner_up: float = 1.0
    planner_down: float = 0.6
    kv_tokens_per_gpu: int = 48 * 16  # the runner's KV blocks per GPU x block size
    # the bounding oracle (contestants.BoundingOracle): which path its new groups start on (plain | warm |
    # cold) and, for cold, the runner's hold of a new engine (its start is that hold and a little more)
    oracle_path: str = "plain"
    engine_hold_s: float = 0.0
    # the KEDA-style scaler: requests in flight at the frontend per decode group (static at the peak holds
    # about 2.4: 2 requests/s x ~4.7 s each over 4 groups; a target a little above that)
    keda_inflight_per_group: float = 3.0
    # the StorageClass of a node-local model cache for the weights (none: an emptyDir per pod); the
    # policy tokenfab_nocache never has one
    cache_class: str | None = None
    prestage_groups: int = 0  # with a model cache: groups of headroom whose weights are staged ahead

    @property
    def total_s(self) -> float:
        return self.before_s + self.burst_s + self.after_s

    def trace(self) -> list[load.Point]:
        """The trace by name; every trace lasts total_s seconds and peaks at burst_qps."""
        q, b, t0, total = self.quiet_qps, self.burst_qps, self.before_s, self.total_s
        if self.trace_name == "single_burst":
            return load.burst(q, b, t0, self.burst_s, self.after_s)
        if self.trace_name == "repeated_burst":  # three bursts 90 s apart, a quarter of the burst each
            return load.repeated_burst(q, b, t0, self.burst_s / 4, 90.0, 3, total)
        if self.trace_name == "ramp":  # up and down over the burst's span and a little more
            span = total - 2 * t0
            return load.ramp_up_down(q, b, t0, span * 0.4, span * 0.2, span * 0.4, total)
        raise ValueError(f"unknown trace {self.trace_name!r}")


def ci_config(**kw: Any) -> Config:
    """Sized for CI on 2 shared cores: the whole loop in about 5 minutes of load."""
    base: dict[str, Any] = {"before_s": 20, "burst_s": 120, "after_s": 120}
    base.update(kw)
    return Config(**base)
