"""Benchmark of the autoscaling policy on a simulated fleet (pure and seeded: no cluster, no clock).

A bursty, noisy offered-load trace (2 hours at 15 s steps: quiet periods, a slow ramp, sudden bursts,
noise) drives a simple fleet model, the same trace for every policy in the same run:

- a group serves `CAPACITY` load units; the utilization each serving group reports is
  min(1, load / (serving groups x CAPACITY)) plus measurement noise (KV-cache use saturates at 1);
- a new group loads its weights for `STARTUP` seconds: it serves nothing and reports near-zero use until
  then, and Kubernetes sees it Ready (serving) only after that;
- removed groups go at once (the newest first); one decision per step;
- the frontend's signals, for the leading policy: requests arrive at `RPS_PER_UNIT` per load unit (with
  measurement noise); a request stays in flight `SERVICE` seconds; what the serving groups cannot take
  waits in a backlog (in flight and waiting, spread over the serving groups) that drains as capacity
  allows, and clients give up on what has waited `GIVE_UP` seconds. This is a model of time, not a
  measurement: its figures compare policies on one trace, nothing more.

Policies, each started at the same count with empty memory:

- tokenfab: `tokenfab.planning.autoscaler.policy.decide` with the operator's defaults (`models.Autoscaling()`:
  the leading policy, target 0.7, tolerance 0.1, steps +2/-1, no scale-up window, 300 s scale-down
  window, 30 s warm-up after Ready during which a group is left out of the mean and blocks scale-down),
  bounds 1..16, fed what operator/tokenfab/planning/autoscaler/ feeds it: KV-cache use per group, the arrival
  rate and requests in flight at the frontend, the waiting requests per group and the groups on their way;
- tokenfab_kv_only: the same with `policy: kv` (KV-cache use alone, no demand signals);
- threshold: the naive policy, +1 when the mean utilization of serving groups is above target + 0.1,
  -1 below target - 0.1, no windows;
- hpa: the Kubernetes HPA algorithm with default settings (tolerance 0.1; ceil(ready x mean / target)
  over ready pods, with not-yet-ready pods set aside and, on scale-up, counted at 0 and the result
  dropped when that reverses the direction; no scale-up stabilization; scale-up rate max(4 pods, 100%)
  per 15 s; a 300 s scale-down stabilization window on the raw recommendations, started at the current
  count; scale-down rate 100% per 15 s). Setting loading groups aside is generous to HPA: on a pods
  metric (not CPU) the real controller sets aside only Pending pods and averages in the near-zero use of
  Running, not-yet-Ready ones.

A sensitivity row (not part of the comparison) runs tokenfab with warmupSeconds 0, i.e. a group counts as
soon as it is Ready, to show what the default extra warm-up after Ready costs in SLO risk and saves.
Requests are counted too: intended (arrivals of the model), completed (served), failed (given up after
waiting `GIVE_UP` s) and never sent (none: the model's clients send every request), intended = completed
+ failed + never sent.

Reported per policy: direction reversals (a change in the opposite direction of the previous change),
GPU-minutes (groups, warming ones included, x 32 GPUs x minutes), minutes when the demand on the serving
groups was at or above 95% of their capacity (SLO risk: queues build, KV cache is full) and minutes at
or above the 0.7 target. Printed as a table and saved to e2e/bench/results/autoscaler.json, with a plot
in autoscaler.png when matplotlib is installed.

Run: python -m e2e.bench.autoscaler_bench [--seed 7] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from e2e import record
from tokenfab.api.models import Autoscaling
from tokenfab.planning.autoscaler.policy import Demand, Memory, Sample, config_for, decide

STEP = 15.0  # seconds between decisions (the operator's default intervalSeconds)
DURATION = 2 * 3600.0
CAPACITY = 1.0  # load units one group serves at 100% utilization
STARTUP = 120.0  # weights load: from creation to serving
GPUS_PER_GROUP = 32
MIN_GROUPS, MAX_GROUPS = 1, 16
START_GROUPS = 2
NOISE = 0.04  # standard deviation of the per-group utilization measurement noise
SLO_UTILIZATION = 0.95
SEED = 7
RPS_PER_UNIT = 2.0  # requests/s one group serves at 100% utilization
SERVICE = 20.0  # seconds a served request stays in flight
GIVE_UP = 120.0  # seconds a client waits in the backlog before it gives up (a failed request)


# ---------------------------------------------------------------------------------------------- trace


def _base(minute: float) -> float:
    """The shape of the offered load: quiet, a slow ramp, a plateau, a drop, quiet again."""
    if minute < 10:
        return 1.2
    if minute < 40:
        return 1.2 + (6.5 - 1.2) * (minute - 10) / 30
    if minute < 55:
        return 6.5
    if minute < 60:
        return 6.5 - (6.5 - 2.0) * (minute - 55) / 5
    return 2.0


# (start minute, length in minutes, extra load): sudden bursts on top of the base
BURSTS = ((22, 4, 3.0), (47, 6, 4.0), (70, 8, 6.0), (88, 3, 5.0), (100, 10, 7.0), (114, 2, 4.0))


def load_trace(seed: int = SEED) -> list[float]:
    """Offered load per step, in load units: the base, fixed and random bursts, slow wander and noise."""
    rng = random.Random(seed)
    steps = int(DURATION / STEP)
    extra = [0.0] * steps
    for start, length, height in BURSTS:
        for k in range(int(start * 60 / STEP), int((start + length) * 60 / STEP)):
            extra[k] += height
    for _ in range(8):  # short random bursts of 1-3 minutes
        start, length = rng.randrange(steps), rng.randint(4, 12)
        height = rng.uniform(1.0, 3.0)
        for k in range(start, min(steps, start + length)):
            extra[k] += height
    out, wander = [], 0.0
    for k in range(steps):
        wander = 0.9 * wander + rng.gauss(0, 0.05)  # slow AR(1) drift
        base = _base(k * STEP / 60) + extra[k]
        out.append(max(0.1, base * (1 + wander + rng.gauss(0, 0.06))))
    return out


# ---------------------------------------------------------------------------------------------- fleet


@dataclass
class Group:
    name: str
    created: float

    def serving(self, now: float) -> bool:
        return now - self.created >= STARTUP

    def ready_since(self) -> float:
        return self.created + STARTUP


@dataclass(frozen=True)
class View:
    """What a policy sees at one step: every group's sample (loading ones report near zero)."""

    now: float
    groups: tuple[Group, ...]
    samples: dict[str, float]
    rate: float = 0.0  # arrivals at the frontend, requests/s (measured)
    inflight: float = 0.0  # requests in flight at the frontend (served and waiting)
    waiting: float = 0.0  # waiting requests per serving group

    @property
    def current(self) -> int:
        return len(self.groups)

    def ready(self) -> list[Group]:
        return [g for g in self.groups if g.serving(self.now)]


class Policy(Protocol):
    name: str

    def decide(self, view: View) -> int: ...


class Tokenfab:
    """tokenfab's pure policy with the operator's defaults, called the way its autoscaler package
    (operator/tokenfab/planning/autoscaler/) calls it: counted = Ready for at least warmupSeconds,
    warming = every other group; with the leading policy (the default) the frontend's arrival rate and
    requests in flight, the waiting requests of the counted groups and the groups on their way."""

    def __init__(
        self, warmup: float | None = None, name: str = "tokenfab", policy: str | None = None
    ) -> None:
        a = Autoscaling() if policy is None else Autoscaling(policy=policy)
        assert a.interval_seconds == STEP
        self.name = name
        self.warmup = float(a.warmup_seconds if warmup is None else warmup)
        self.cfg = config_for(a, MIN_GROUPS, MAX_GROUPS)
        self.memory = Memory()
        self.reasons: dict[str, int] = {}

    def decide(self, view: View) -> int:
        counted = {
            g.name for g in view.groups if g.serving(view.now) and view.now - g.ready_since() >= self.warmup
        }
        samples = {n: Sample(v, 0.0) for n, v in view.samples.items()}
        demand = None
        if self.cfg.leading:
            demand = Demand(
                rate=view.rate,
                inflight=view.inflight,
                waiting=dict.fromkeys(counted, view.waiting),
                starting=sum(1 for g in view.groups if not g.serving(view.now)),
            )
        d = decide(
            samples,
            counted,
            view.current - len(counted),
            view.current,
            self.cfg,
            self.memory,
            view.now,
            demand,
        )
        self.memory = d.memory
        self.reasons[d.reason] = self.reasons.get(d.reason, 0) + 1
        return d.desired


class Threshold:
    """+1 above target + 0.1, -1 below target - 0.1 (mean over serving groups), no windows."""

    name = "threshold"

    def __init__(self, target: float = 0.7, band: float = 0.1) -> None:
        self.target, self.band = target, band

    def decide(self, view: View) -> int:
        ready = view.ready()
        if not ready:
            return view.current
        mean = sum(view.samples[g.name] for g in ready) / len(ready)
        n = view.current + (mean > self.target + self.band) - (mean < self.target - self.band)
        return max(MIN_GROUPS, min(MAX_GROUPS, n))


class HpaLike:
    """The HPA controller's algorithm (replica calculator + default behavior) on a pods metric."""

    name = "hpa"

    def __init__(self, target: float = 0.7, tolerance: float = 0.1) -> None:
        self.target, self.tolerance = target, tolerance
        self.up_window, self.down_window, self.period = 0.0, 300.0, 15.0
        self.recommendations: list[tuple[float, int]] = []
        self.events: list[tuple[float, int]] = []  # (time, change) for the rate limits

    def raw(self, view: View) -> int:
        ready = view.ready()
        if not ready:
            return view.current  # no metrics: HPA does not scale
        usage = sum(view.samples[g.name] for g in ready)
        ratio = usage / len(ready) / self.target
        unready = view.current - len(ready)
        if unready == 0 or ratio <= 1:  # on scale-down unready pods are simply left out
            if abs(ratio - 1) <= self.tolerance:
                return view.current
            return math.ceil(ratio * len(ready))
        new_ratio = usage / view.current / self.target  # scale-up: unready pods counted at 0
        if abs(new_ratio - 1) <= self.tolerance or new_ratio < 1:
            return view.current
        n = math.ceil(new_ratio * view.current)
        return view.current if n < view.current else n

    def decide(self, view: View) -> int:
        now, current = view.now, view.current
        if not self.recommendations:  # maybeInitScaleDownStabilizationWindow
            self.recommendations.append((now - 1e-6, current))
        rec = self.raw(view)
        up = min([rec] + [n for t, n in self.recommendations if t > now - self.up_window])
        down = max([rec] + [n for t, n in self.recommendations if t > now - self.down_window])
        self.recommendations = [(t, n) for t, n in self.recommendations if t > now - self.down_window]
        self.recommendations.append((now, rec))
        stabilized = min(max(current, up), down)
        # rate limits relative to the count at the start of the 15 s period (changes inside it excluded)
        added = sum(c for t, c in self.events if t > now - self.period and c > 0)
        start = current - added
        up_limit = max(start + 4, 2 * start)  # scaleUp policies: 4 pods or 100%, selectPolicy Max
        down_limit = 0  # scaleDown policy: 100% per period
        n = max(MIN_GROUPS, min(MAX_GROUPS, max(down_limit, min(up_limit, stabilized))))
        if n != current:
            self.events = [(t, c) for t, c in self.events if t > now - self.period] + [(now, n - current)]
        return n


POLICIES: tuple[Callable[[], Policy], ...] = (
    Tokenfab,
    lambda: Tokenfab(name="tokenfab_kv_only", policy="kv"),
    Threshold,
    HpaLike,
)
# Sensitivity, not part of the comparison: tokenfab with warmupSeconds 0 (a group counts as soon as it is
# Ready, like HPA's), to show what the default 30 s warm-up after Ready costs and buys.
SENSITIVITY: tuple[Callable[[], Policy], ...] = (lambda: Tokenfab(warmup=0.0, name="tokenfab-warmup0"),)


# ----------------------------------------------------------------------------------------- simulation


@dataclass
class Run:
    name: str
    groups: list[int] = field(default_factory=list)  # groups after the decision of each step
    serving: list[int] = field(default_factory=list)  # serving groups at each step (before it)
    utilization: list[float] = field(default_factory=list)  # true demand / serving capacity
    changes: list[int] = field(default_factory=list)
    intended: float = 0.0  # requests the trace offered
    completed: float = 0.0  # served


def simulate(policy: Policy, trace: list[float], seed: int = SEED) -> Run:
    """Run one policy over the trace. Measurement noise comes from its own stream seeded alike (the
    policies that read no frontend signals draw them all the same, so every policy sees the same noise)."""
    rng = random.Random(seed * 1000 + 1)
    groups = [Group(f"g{i}", -STARTUP - 3600.0) for i in range(START_GROUPS)]  # warm at the start
    serial = START_GROUPS
    run = Run(policy.name)
    backlog: list[float] = []  # requests waiting, per step of arrival (oldest first)
    admitted: list[float] = []  # requests the groups took, per step (newest last)
    for k, load in enumerate(trace):
        now = k * STEP
        serving = [g for g in groups if g.serving(now)]
        demand = load / (len(serving) * CAPACITY) if serving else math.inf
        samples = {}
        for g in groups:
            # a loading group reports near-zero use
            value = min(1.0, demand) + rng.gauss(0, NOISE) if g.serving(now) else rng.uniform(0.0, 0.02)
            samples[g.name] = max(0.0, min(1.0, value))
        # the frontend: this step's arrivals join the backlog; the serving groups take what they can
        arrivals = load * RPS_PER_UNIT * STEP
        run.intended += arrivals
        backlog.append(arrivals)
        room = len(serving) * CAPACITY * RPS_PER_UNIT * STEP
        while backlog and room > 0:
            took = min(room, backlog[0])
            run.completed += took
            room -= took
            backlog[0] -= took
            if backlog[0] <= 1e-9:
                backlog.pop(0)
        while len(backlog) * STEP > GIVE_UP:
            backlog.pop(0)  # given up: failed
        admitted.append(len(serving) * CAPACITY * RPS_PER_UNIT * STEP - room)
        waiting = sum(backlog)
        # in flight: each step's admissions (spread over the step) for SERVICE seconds each, so the count
        # rises over a request's duration after the rate moves, to rate x SERVICE (Little's law)
        serving_now = sum(
            took / STEP * max(0.0, min(STEP, SERVICE - age * STEP))
            for age, took in enumerate(reversed(admitted[-(int(SERVICE // STEP) + 1) :]))
        )
        rate = max(0.0, load * RPS_PER_UNIT * (1 + rng.gauss(0, NOISE)))
        view = View(
            now,
            tuple(groups),
            samples,
            rate=rate,
            inflight=serving_now + waiting,
            waiting=waiting / max(1, len(serving)),
        )
        run.serving.append(len(serving))
        run.utilization.append(demand)
        desired = policy.decide(view)
        if desired > len(groups):
            for _ in range(desired - len(groups)):
                groups.append(Group(f"g{serial}", now))
                serial += 1
        elif desired < len(groups):
            groups.sort(key=lambda g: g.created)
            del groups[desired:]  # the newest go first (still loading ones before serving ones)
        if desired != (run.groups[-1] if run.groups else START_GROUPS):
            run.changes.append(desired - (run.groups[-1] if run.groups else START_GROUPS))
        run.groups.append(desired)
    # (what still waits when the trace ends was never served: failed too)
    return run


def reversals(changes: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(changes) if (a > 0) != (b > 0))


def summary(run: Run, target: float) -> dict[str, Any]:
    minutes = STEP / 60
    # the groups during step k are those of the previous decision (START_GROUPS before the first)
    during = [START_GROUPS, *run.groups[:-1]]
    return {
        "policy": run.name,
        "direction_reversals": reversals(run.changes),
        "scaling_changes": len(run.changes),
        "gpu_minutes": round(sum(during) * GPUS_PER_GROUP * minutes, 1),
        "minutes_above_95pct": round(sum(minutes for u in run.utilization if u >= SLO_UTILIZATION), 2),
        "minutes_at_or_above_target": round(sum(minutes for u in run.utilization if u >= target), 2),
        "max_groups": max(run.groups),
        "requests": requests(run),
    }


def requests(run: Run) -> dict[str, int]:
    """The model's requests, rounded to whole ones: intended = completed + failed + never sent (failed:
    given up after GIVE_UP s, or still waiting when the trace ended)."""
    intended, completed = round(run.intended), round(run.completed)
    return {
        "intended": intended,
        "sent": intended,
        "completed": completed,
        "failed": intended - completed,
        "never_sent": 0,
    }


def run(seed: int = SEED) -> dict[str, Any]:
    trace = load_trace(seed)
    target = Autoscaling().target_kv_cache_utilization
    runs = [simulate(make(), trace, seed) for make in POLICIES]
    extra = [simulate(make(), trace, seed) for make in SENSITIVITY]
    oracle = [max(MIN_GROUPS, min(MAX_GROUPS, math.ceil(x / (CAPACITY * target)))) for x in trace]
    return {
        "seed": seed,
        "steps": len(trace),
        "step_seconds": STEP,
        "startup_seconds": STARTUP,
        "gpus_per_group": GPUS_PER_GROUP,
        "bounds": [MIN_GROUPS, MAX_GROUPS],
        "target": target,
        "policies": [summary(r, target) for r in runs],
        "sensitivity": [summary(r, target) for r in extra],
        "oracle_gpu_minutes": round(sum(oracle) * GPUS_PER_GROUP * STEP / 60, 1),
        "series": {
            "load": [round(x, 4) for x in trace],
            **{f"groups_{r.name}": r.groups for r in runs},
            **{f"utilization_{r.name}": [round(min(u, 9.99), 4) for u in r.utilization] for r in runs},
        },
    }


def report(result: dict[str, Any]) -> str:
    head = (
        f"{'policy':<16} {'reversals':>9} {'changes':>8} {'GPU-min':>9} {'min >=95%':>10} "
        f"{'min >=target':>12} {'max groups':>10} {'intended':>9} {'completed':>9} {'failed':>7}"
    )
    lines = [
        f"autoscaler benchmark: {result['steps']} steps of {result['step_seconds']:g} s, seed "
        f"{result['seed']}, startup {result['startup_seconds']:g} s, {result['gpus_per_group']} GPUs/group, "
        f"bounds {result['bounds'][0]}..{result['bounds'][1]}, target {result['target']:g}",
        head,
        "-" * len(head),
    ]
    for p in [*result["policies"], *result["sensitivity"]]:
        if p is result["sensitivity"][0]:
            lines.append("sensitivity (not in the comparison):")
        lines.append(
            f"{p['policy']:<16} {p['direction_reversals']:>9} {p['scaling_changes']:>8} "
            f"{p['gpu_minutes']:>9.1f} {p['minutes_above_95pct']:>10.2f} "
            f"{p['minutes_at_or_above_target']:>12.2f} {p['max_groups']:>10} {p['requests']['intended']:>9} "
            f"{p['requests']['completed']:>9} {p['requests']['failed']:>7}"
        )
    lines.append(
        f"(oracle, ceil(load / target) with no delay or noise: {result['oracle_gpu_minutes']:.1f} GPU-min)"
    )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    """Load, groups per policy and utilization per policy over time; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = result["series"]
    minutes = [k * result["step_seconds"] / 60 for k in range(result["steps"])]
    names = [p["policy"] for p in result["policies"]]
    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    axes[0].plot(minutes, s["load"], color="black", lw=1)
    axes[0].set_ylabel("offered load\n(groups' worth at 100%)")
    for n in names:
        axes[1].step(minutes, s[f"groups_{n}"], where="post", label=n, lw=1.2)
        axes[2].plot(minutes, [min(u, 1.5) for u in s[f"utilization_{n}"]], label=n, lw=0.8)
    axes[1].set_ylabel("groups")
    axes[1].legend(loc="upper left")
    axes[2].axhline(result["target"], color="grey", ls="--", lw=0.8)
    axes[2].axhline(SLO_UTILIZATION, color="red", ls=":", lw=0.8)
    axes[2].set_ylabel("demand / serving capacity\n(capped at 1.5)")
    axes[2].set_xlabel("minutes")
    axes[2].legend(loc="upper left")
    fig.suptitle("tokenfab autoscaling policy vs threshold vs HPA-like (same trace)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def save(result: dict[str, Any], out: Path, argv: list[str], started: float) -> dict[str, Path]:
    paths = {"json": record.save("autoscaler", result, out, "e2e.bench.autoscaler_bench", argv, started)}
    if plot(result, out / "autoscaler.png"):
        paths["png"] = out / "autoscaler.png"
    return paths


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    started = time.time()
    result = run(args.seed)
    print(report(result))
    for kind, path in save(result, args.out, argv, started).items():
        print(f"{kind}: {path}")


if __name__ == "__main__":
    main()
