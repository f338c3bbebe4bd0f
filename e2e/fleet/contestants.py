"""The autoscalers tokenfab is measured against on a live fleet, and the bound on them all.

None of these is a tokenfab feature. Each is written here from its project's published algorithm (a
RE-IMPLEMENTATION, named so: the real one cannot drive a ModelDeployment here, see each class) and acts
as a controller outside the operator: the deployment's own autoscaler is off, and every period it reads
Prometheus (or, for the oracle, the trace) and may write spec.decode.replicas.

- hpa:              Kubernetes' HorizontalPodAutoscaler algorithm on the decode KV-cache series;
- keda:             a KEDA ScaledObject's Prometheus trigger (AverageValue) on the requests in flight at
                    the frontend, which KEDA hands to the same HPA algorithm;
- planner_baseline: the published reactive logic of NVIDIA Dynamo's planner;
- threshold:        a naive +-1 controller (kept for older results, not a real autoscaler);
- oracle:           the BOUND: it knows the trace and each path's start time (BoundingOracle);
- reactive_oracle:  the trace known, no lead: what the benchmark called its oracle before (it reacts at
                    the midpoint of each rise, later than a forecasting policy can).

The decisions are pure functions (hpa_recommend, keda_recommend, Stabilizer, bounding_want), tested alone
in test_contestants.py; the threads only read and write.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from e2e.fleet import fleet, load
from e2e.helpers import kubectl
from tokenfab.planning.autoscaler import signals

if TYPE_CHECKING:
    from e2e.fleet.config import Config
    from tokenfab_factory.factory import Factory

# ------------------------------------------------------------------------------- HPA's algorithm
# https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ (algorithm details; defaults
# of pkg/controller/podautoscaler): sync every 15 s, tolerance 0.1, scale-down stabilization 300 s, scale
# up at most max(100% of current, 4 pods) per 15 s, scale down at most 100% per 15 s.
HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1
HPA_DOWN_STABILIZATION_S = 300.0
HPA_UP_PODS = 4


def hpa_recommend(
    current: int, values: Sequence[float], target: float, missing: int = 0, tolerance: float = HPA_TOLERANCE
) -> int:
    """HPA's replica count for a per-pod metric (an average over the pods that report it): ceil(current x
    mean / target), unchanged within the tolerance. Pods that do not report yet (`missing`) count as 0 on
    a scale up and as the target on a scale down, and if that turns the direction or lands within the
    tolerance nothing changes (HPA's conservative rule for missing and unready pods)."""
    if current <= 0 or not values:
        return current
    ratio = (sum(values) / len(values)) / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    if missing > 0:
        fill = 0.0 if ratio > 1.0 else target
        again = (sum(values) + fill * missing) / (len(values) + missing) / target
        if abs(again - 1.0) <= tolerance or (again > 1.0) != (ratio > 1.0):
            return current
        ratio = again
    return math.ceil(ratio * (len(values) + missing) - 1e-9)


def keda_recommend(current: int, total: float, per_replica: float, tolerance: float = HPA_TOLERANCE) -> int:
    """A KEDA Prometheus trigger of metricType AverageValue: HPA's external-metric rule, ceil(total /
    per_replica), unchanged while total / (per_replica x current) is within the tolerance."""
    if current <= 0:
        return current
    ratio = total / (per_replica * current)
    if abs(ratio - 1.0) <= tolerance:
        return current
    return max(0, math.ceil(total / per_replica - 1e-9))


class Stabilizer:
    """HPA's default behavior: a scale down takes the highest recommendation of the last `down_s` seconds;
    a scale up is applied at once but by at most max(current, `up_pods`) pods per sync."""

    def __init__(self, down_s: float = HPA_DOWN_STABILIZATION_S, up_pods: int = HPA_UP_PODS) -> None:
        self.down_s, self.up_pods = down_s, up_pods
        self.recent: deque[tuple[float, int]] = deque()

    def __call__(self, now: float, current: int, recommended: int) -> int:
        self.recent.append((now, recommended))
        while self.recent and self.recent[0][0] < now - self.down_s:
            self.recent.popleft()
        if recommended < current:
            return min(current, max(n for _, n in self.recent))
        if recommended > current:
            return min(recommended, current + max(current, self.up_pods))
        return current


# ------------------------------------------------------------------------------- the bounding oracle
# Each path's start (a new group's pod created -> serving), measured, and frozen here: plain (the mocker
# registers at once) 14.5 s (fleet_bench.json at b863035, the oracle's first serve); warm, from the
# node's model cache, 13.8 s; cold, from the hub, the modeled hold plus 3.6 s (63.6 s at a 60 s hold;
# fleet_bench_cold.json at a8c3363, `group_start_s`). The oracle adds ORACLE_MARGIN_S for its own write
# and the operator's reconcile.
START_S = {"plain": 14.5, "warm": 13.8}
COLD_OVER_HOLD_S = 3.6
ORACLE_MARGIN_S = 5.0


def oracle_lead(path: str, hold_s: float = 0.0) -> float:
    """How far ahead of the trace the bounding oracle acts on `path` (plain | warm | cold)."""
    start = hold_s + COLD_OVER_HOLD_S if path == "cold" else START_S[path]
    return round(start + ORACLE_MARGIN_S, 1)


def need(trace: list[load.Point], t: float, per_group_qps: float, most: int) -> int:
    """The decode groups the trace needs at t: its rate over one group's share of the peak (static at the
    peak is the reference that meets the SLO), at least 1, at most `most`."""
    return max(1, min(most, math.ceil(load.rate_at(trace, t) / per_group_qps - 1e-9)))


def bounding_want(
    trace: list[load.Point],
    t: float,
    held: int,
    lead_s: float,
    hold_s: float,
    per_group_qps: float,
    most: int,
) -> int:
    """The bounding oracle's decode count at trace time t: whatever the trace needs at any time in [t, t +
    lead_s] (a group asked for now serves one start time later), and never fewer than it holds while the
    need comes back within lead_s + hold_s (it keeps capacity through a gap shorter than a start time
    plus the window)."""
    step = 0.5
    ahead = max(need(trace, t + i * step, per_group_qps, most) for i in range(int(lead_s / step) + 1))
    later = max(
        need(trace, t + i * step, per_group_qps, most) for i in range(int((lead_s + hold_s) / step) + 1)
    )
    return max(ahead, min(held, later))


# ------------------------------------------------------------------------------- the threads


class Controller(threading.Thread):
    """A controller outside the operator: every `period_s` it may write spec.decode.replicas (the
    operator's own autoscaler is off for these deployments)."""

    period_s = 5.0

    def __init__(self, f: Factory, cfg: Config) -> None:
        super().__init__(daemon=True)
        self.f, self.cfg = f, cfg
        self.replicas = 1
        self.last_change = 0.0
        self.decisions: list[dict[str, Any]] = []
        self.stop_event = threading.Event()

    def want(self) -> tuple[int, dict[str, Any]] | None:
        raise NotImplementedError

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        """What this contestant was run with (saved with each result)."""
        return {"period_s": cls.period_s}

    def run(self) -> None:
        cfg = self.cfg
        while not self.stop_event.wait(self.period_s):
            try:
                got = self.want()
            except Exception as exc:  # a lost decision is not a lost run
                print(f"{cfg.policy}: {exc}", file=sys.stderr)
                continue
            if got is None:
                continue
            want, why = got
            want = max(1, min(cfg.max_decode, want))
            if want == self.replicas:
                continue
            kubectl(
                self.f,
                "patch",
                "mdep",
                cfg.name,
                "-n",
                cfg.namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"decode": {"replicas": want}}}),
            )
            self.decisions.append({"time": time.time(), "from": self.replicas, "to": want, **why})
            self.replicas, self.last_change = want, time.monotonic()


class HpaStyle(Controller):
    """Kubernetes' HPA algorithm (a re-implementation: the ModelDeployment CRD has no scale subresource for
    a real HPA to drive) on the decode groups' KV-cache utilization, the series tokenfab's autoscaler
    reads, with the same target. Every 15 s, tolerance 10%, 300 s scale-down stabilization."""

    period_s = HPA_SYNC_S

    def __init__(self, f: Factory, cfg: Config) -> None:
        super().__init__(f, cfg)
        self.stabilize = Stabilizer()

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        return {
            "period_s": cls.period_s,
            "metric": "decode KV-cache utilization, mean per group",
            "target": cfg.target,
            "tolerance": HPA_TOLERANCE,
            "scale_down_stabilization_s": HPA_DOWN_STABILIZATION_S,
        }

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        kv = fleet.kv_by_group(self.f, cfg.namespace, cfg.name, "decode")
        if not kv:
            return None
        missing = max(0, self.replicas - len(kv))
        rec = hpa_recommend(self.replicas, list(kv.values()), cfg.target, missing)
        return self.stabilize(time.monotonic(), self.replicas, rec), {"kv": kv, "recommended": rec}


class KedaStyle(Controller):
    """A KEDA ScaledObject with a Prometheus trigger (a re-implementation: KEDA needs a scale subresource
    too), metricType AverageValue on the requests in flight at the frontend (queued, in prefill or
    decoding): the path llm-d documents for scaling on queue depth. KEDA hands the value to the HPA
    algorithm (every 15 s, tolerance 10%, 300 s scale-down stabilization). The target per group is
    Config.keda_inflight_per_group."""

    period_s = HPA_SYNC_S

    def __init__(self, f: Factory, cfg: Config) -> None:
        super().__init__(f, cfg)
        self.stabilize = Stabilizer()

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        return {
            "period_s": cls.period_s,
            "metric": "requests in flight at the frontend (AverageValue)",
            "per_group": cfg.keda_inflight_per_group,
            "tolerance": HPA_TOLERANCE,
            "scale_down_stabilization_s": HPA_DOWN_STABILIZATION_S,
        }

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        rows = fleet.prom(self.f, signals.frontend_inflight_query(cfg.namespace, cfg.name))
        if not rows:
            return None
        total = float(rows[0]["value"][1])
        rec = keda_recommend(self.replicas, total, cfg.keda_inflight_per_group)
        return self.stabilize(time.monotonic(), self.replicas, rec), {"inflight": total, "recommended": rec}


class ThresholdController(Controller):
    """The naive baseline: mean decode KV > up -> replicas + 1, < down -> replicas - 1, after a short
    cooldown."""

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        return {
            "period_s": cls.period_s,
            "up": cfg.threshold_up,
            "down": cfg.threshold_down,
            "cooldown_s": cfg.threshold_cooldown_s,
        }

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        kv = fleet.kv_by_group(self.f, cfg.namespace, cfg.name, "decode")
        if not kv or time.monotonic() - self.last_change < cfg.threshold_cooldown_s:
            return None
        mean = sum(kv.values()) / len(kv)
        if mean > cfg.threshold_up:
            return self.replicas + 1, {"kv": mean}
        if mean < cfg.threshold_down:
            return self.replicas - 1, {"kv": mean}
        return None


class PlannerBaseline(Controller):
    """A baseline that follows the published logic of NVIDIA Dynamo's planner in its reactive, load-based
    form with static thresholds (the planner guide's default "throughput" target: no profile, no SLA
    model), written here from that description (Dynamo's own planner cannot start here:
    fleet_bench.PLANNER_NOTE): every 5 s, each decode worker's load is the KV cache its running requests
    hold plus the KV its queued requests will need, over its KV capacity. Any worker above the scale-up
    threshold (1.0: demand exceeds its cache) adds one worker; every worker below the scale-down threshold
    (0.6), with the load of all of them spread over one worker fewer still below the scale-up threshold,
    removes one. Prefill follows decode by the deployment's fixed ratio."""

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        return {"period_s": cls.period_s, "up": cfg.planner_up, "down": cfg.planner_down}

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        kv = fleet.kv_by_group(self.f, cfg.namespace, cfg.name, "decode")
        waiting = fleet.waiting_by_group(self.f, cfg.namespace, cfg.name, "decode")
        if not kv:
            return None
        capacity = cfg.kv_tokens_per_gpu * 2  # decode groups of 2 GPUs (fleet.manifest)
        load_ = {g: v + waiting.get(g, 0.0) * (cfg.isl + cfg.osl) / capacity for g, v in kv.items()}
        n = len(load_)
        if any(u > cfg.planner_up for u in load_.values()):
            return self.replicas + 1, {"load": load_}
        spread = sum(load_.values()) / (n - 1) if n > 1 else float("inf")
        if all(u < cfg.planner_down for u in load_.values()) and spread < cfg.planner_up:
            return self.replicas - 1, {"load": load_}
        return None


class _TraceClock(Controller):
    """A controller that knows the trace: its clock starts at the first request the frontend counts after
    the warm-up (read from the frontend's own /metrics every 0.2 s)."""

    period_s = 0.2

    def __init__(self, f: Factory, cfg: Config) -> None:
        super().__init__(f, cfg)
        self.url = fleet.frontend_url(f, cfg.namespace, cfg.name)
        self.baseline: float | None = None
        self.t0: float | None = None

    def started(self) -> float:
        n = fleet.requests_started(self.url)
        if n is None:
            raise RuntimeError(f"the frontend at {self.url} does not answer")
        return float(n)

    def clock(self) -> float | None:
        """Seconds into the trace, or None before its first request."""
        if self.t0 is None:
            n = self.started()
            if self.baseline is None:
                self.baseline = n
                return None
            if n <= self.baseline:
                return None
            self.t0 = time.monotonic()
        return time.monotonic() - self.t0


class ReactiveOracle(_TraceClock):
    """The trace known, no lead: max_decode from the moment the offered load passes the midpoint of quiet
    and burst, 1 otherwise. Not a bound: it reacts at the midpoint of a rise, later than a policy that
    forecasts can (the benchmark's `oracle` before it bounded)."""

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        return {"period_s": cls.period_s, "lead_s": 0.0, "rule": "max above the midpoint, else 1"}

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        t = self.clock()
        if t is None:
            return None
        high = load.rate_at(cfg.trace(), t) > (cfg.quiet_qps + cfg.burst_qps) / 2
        return (cfg.max_decode if high else 1), {"t": round(t, 2)}


@dataclass(frozen=True)
class OraclePlan:
    lead_s: float
    hold_s: float
    per_group_qps: float


def oracle_plan(cfg: Config) -> OraclePlan:
    """The bounding oracle's lead (its path's start time), hold (lead plus the scale-down window) and one
    group's share of the peak."""
    lead = oracle_lead(cfg.oracle_path, cfg.engine_hold_s)
    return OraclePlan(lead, lead + cfg.scale_down_window, cfg.burst_qps / cfg.max_decode)


class BoundingOracle(_TraceClock):
    """The BOUND: it knows the trace and its path's start time (oracle_lead), starts each group one start
    time before the trace needs it, holds capacity through a gap shorter than a start time plus the
    scale-down window, and never has fewer groups than the trace needs (bounding_want). No policy that
    learns of the load from the load can serve it sooner, so no contestant should beat its goodput by more
    than the run-to-run noise (the benchmark checks that in every run)."""

    @classmethod
    def parameters(cls, cfg: Config) -> dict[str, Any]:
        plan = oracle_plan(cfg)
        return {
            "period_s": cls.period_s,
            "path": cfg.oracle_path,
            "lead_s": plan.lead_s,
            "hold_s": plan.hold_s,
            "per_group_qps": plan.per_group_qps,
            "start_s": round(plan.lead_s - ORACLE_MARGIN_S, 1),  # its path's measured group start
        }

    def want(self) -> tuple[int, dict[str, Any]] | None:
        cfg = self.cfg
        t = self.clock()
        if t is None:  # before the trace: what its first seconds need
            t = 0.0
        plan = oracle_plan(cfg)
        n = bounding_want(
            cfg.trace(), t, self.replicas, plan.lead_s, plan.hold_s, plan.per_group_qps, cfg.max_decode
        )
        return n, {"t": round(t, 2)}


CONTROLLERS: dict[str, type[Controller]] = {
    "hpa": HpaStyle,
    "keda": KedaStyle,
    "threshold": ThresholdController,
    "planner_baseline": PlannerBaseline,
    "oracle": BoundingOracle,
    "reactive_oracle": ReactiveOracle,
}
