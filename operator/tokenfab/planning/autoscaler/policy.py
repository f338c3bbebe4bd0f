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

Leading signals (Config.leading, the default): the KV recommendation is a guard, and the demand ahead
leads. The arrival rate at the frontend is forecast a little ahead (tokenfab.planning.autoscaler.forecast) and
divided by a capacity per group (from the plan, or learned from the load being served); the requests in
flight at the frontend, divided by what one group holds at the target (learned from the cache), size the
groups for the load already there, a burst's first requests included; queues forming in the groups
(waiting requests above `queue_per_group`) add a group at once. The recommendation is the largest of the
four, so a burst scales up on its first samples, before KV saturates; scale-down still
waits out the long window, which also keeps the forecast's recent peak in view. Bad samples (a
utilization outside [0, 1], anything not finite, a negative count) are no data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenfab.api.models import Autoscaling
from tokenfab.planning.autoscaler import forecast

DEFAULT_HORIZON = 30.0  # seconds ahead, before a startup time has been learned


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
    leading: bool = False  # lead with the forecast demand and queues (KV stays the guard)
    forecast_window: float = 30.0  # seconds of rate history the trend is fitted to
    forecast_horizon: float = 30.0  # how far ahead the demand is forecast (about a group's time to serve)
    queue_per_group: float = 2.0  # waiting requests per group that mean a queue is forming
    utilization: bool = True  # the signal is a utilization in [0, 1] (else a count >= 0)


# Times in the autoscaler's memory this far ahead of the clock of the pass are taken as written by a
# clock that ran ahead (another replica's, or this one's before it was stepped back) and are not used.
CLOCK_SKEW_SECONDS = 5.0


@dataclass(frozen=True)
class Memory:
    """What the policy remembers between decisions (kept in the resource's status)."""

    recommendations: tuple[tuple[float, int], ...] = ()
    last_scale_time: float | None = None
    rates: tuple[tuple[float, float], ...] = ()  # (time, arrival requests/s) at the frontend
    capacity: float | None = None  # learned requests/s one group serves at the target
    inflight: tuple[tuple[float, float], ...] = ()  # (time, requests in flight) at the frontend
    streams: float | None = None  # learned requests in flight one group holds at the target


@dataclass(frozen=True)
class Demand:
    """Leading signals for one decision (all optional)."""

    rate: float | None = None  # arrival requests/s at the frontend now
    waiting: Mapping[str, float] | None = None  # waiting requests per group (counted groups only)
    capacity: float | None = None  # requests/s one group serves at the SLO, from a plan (beats learning)
    starting: int = 0  # groups on their way (created, not Ready yet): a queue waits for them
    inflight: float | None = None  # requests in flight at the frontend now (queued, prefilling, decoding)


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
    target: float = 0.0  # the target the signal was held against (telemetry and status read it here)

    @property
    def direction(self) -> str:
        return "up" if self.desired > self.current else "down" if self.desired < self.current else "hold"


KV_UTILIZATION = "kv_cache_utilization"  # the signal scaled to a utilization target; any other: a queue depth


def target_for(a: Autoscaling, metric: str) -> float:
    """The target a signal is held against: the KV-cache utilization target, or the queue-depth one. The
    one place it is derived; a Decision carries it on (Decision.target)."""
    return a.target_kv_cache_utilization if metric == KV_UTILIZATION else a.target_queue_depth


def config_for(
    a: Autoscaling,
    min_groups: int,
    max_groups: int,
    target: float | None = None,
    startup_seconds: float | None = None,
    utilization: bool = True,
) -> Config:
    """The policy's settings from a spec's autoscaling section (target defaults to the KV target; the
    signal is a utilization in [0, 1] unless `utilization` is False, a waiting count). The
    forecast looks spec.autoscaling.forecastSeconds ahead, else the learned startup time, else 30 s."""
    if a.forecast_seconds is not None:
        horizon = float(a.forecast_seconds)
    elif startup_seconds is not None:
        horizon = max(float(a.interval_seconds), startup_seconds)
    else:
        horizon = DEFAULT_HORIZON
    return Config(
        target=target_for(a, KV_UTILIZATION) if target is None else target,
        min_groups=min_groups,
        max_groups=max_groups,
        tolerance=a.tolerance,
        max_step_up=a.max_step_up,
        max_step_down=a.max_step_down,
        up_window=a.scale_up_stabilization_seconds,
        down_window=a.scale_down_stabilization_seconds,
        stale_after=max(60.0, 3.0 * a.interval_seconds),  # a few missed scrapes make a sample stale
        leading=a.policy == "leading",
        forecast_window=max(30.0, 3.0 * a.interval_seconds),
        forecast_horizon=horizon,
        utilization=utilization,
    )


def _clamp(n: int, cfg: Config) -> int:
    return max(cfg.min_groups, min(cfg.max_groups, n))


@dataclass(frozen=True)
class _Moment:
    """What one decision's leading signals are read against: the groups running (`current`), those whose
    samples counted and their mean signal, the policy, the time, the groups warming up and on their way,
    and the mean waiting requests per counted group."""

    current: int
    groups: int
    signal: float
    cfg: Config
    now: float
    warming: int = 0
    starting: int = 0
    queued: float = 0.0


def _lead(rec: int, at: _Moment, memory: Memory, d: Demand) -> tuple[int, str, Memory]:
    """The recommendation raised by the demand ahead, by the requests in flight and by forming queues
    (while no group is on its way: created, not Ready yet); the memory with the new samples and what was
    learned from them. Returns (recommendation, what led it, memory)."""
    notes = []
    mem = memory
    waits = [w for w in (d.waiting or {}).values() if forecast.valid_count(w)]
    queued = sum(waits) / len(waits) if waits else 0.0
    at = replace(at, starting=d.starting, queued=queued)
    current, cfg = at.current, at.cfg
    holds = None  # the groups that hold every request in flight now, the queued ones included
    if d.inflight is not None and forecast.valid_count(d.inflight):
        rec, note, mem = _in_flight(rec, at, mem, d.inflight)
        notes += note
        holds = forecast.groups_for(d.inflight, mem.streams)
    if d.rate is not None and forecast.valid_count(d.rate):
        rec, note, mem = _rate(rec, at, mem, d.rate, d.capacity)
        notes += note
    if (
        waits
        and queued > cfg.queue_per_group
        and rec <= current
        and not d.starting
        and (holds is None or holds > current)
    ):
        # (A group that is Ready but still warming up serves already: a queue that outlasts it needs more.
        # But a backlog the groups there hold once the new ones take their share is no reason for more.)
        rec = current + max(1, min(cfg.max_step_up, math.floor(queued / (2 * cfg.queue_per_group))))
        notes.append(f"queues forming ({queued:.1f} waiting per group)")
    return rec, ("; " + "; ".join(notes)) if notes else "", mem


def _rate(
    rec: int, at: _Moment, memory: Memory, rate: float, planned: float | None
) -> tuple[int, list[str], Memory]:
    """The recommendation raised by the arrival rate forecast ahead, divided by what one group serves
    (`planned`, from a plan, else learned from the load being served), and kept by the demand a
    scale-down must leave room for."""
    current, groups, signal, cfg, now, queued = at.current, at.groups, at.signal, at.cfg, at.now, at.queued
    notes = []
    capacity = memory.capacity
    prev = memory.rates[-1][1] if memory.rates else None
    # A fair sample of what a group serves: the cache not saturated, no queue, and the rate not in the
    # middle of a jump (the cache fills a request's duration after the rate moves).
    if (
        cfg.utilization
        and queued <= cfg.queue_per_group / 2
        and (prev is None or not forecast.jumped(prev, rate))
    ):
        capacity = forecast.learn(memory.capacity, rate, groups, signal, cfg.target)
    rates = forecast.observe(memory.rates, now, rate, cfg.forecast_window)
    f, held = _forecast_held(memory, rates, rate, now, cfg)
    per_group = planned or capacity
    # The same band as the KV target's: a group more once the demand passes the groups' capacity by
    # the tolerance; one fewer only while the rest would still have the tolerance to spare.
    up = forecast.groups_for(f.ahead, None if per_group is None else per_group * (1 + cfg.tolerance))
    keep = forecast.groups_for(held, None if per_group is None else per_group * (1 - cfg.tolerance))
    if up is not None and per_group is not None and up > rec:
        ahead = f" heading to {f.ahead:.2f}/s in {cfg.forecast_horizon:.0f} s" if f.ahead > f.rate_now else ""
        notes.append(f"demand {f.rate_now:.2f}/s{ahead} at {per_group:.2f}/s per group needs {up}")
        rec = up
    if keep is not None and rec < current and keep > rec:
        rec = min(current, keep)
        notes.append(f"demand {held:.2f}/s keeps {rec}")
    return rec, notes, replace(memory, rates=rates, capacity=capacity)


def _forecast_held(
    memory: Memory, rates: tuple[tuple[float, float], ...], rate: float, now: float, cfg: Config
) -> tuple[forecast.Forecast, float]:
    """The demand forecast ahead for a scale-up, and the demand a scale-down must leave room for."""
    f = forecast.forecast(rates, now, cfg.forecast_window, cfg.forecast_horizon)
    held = f.ahead
    prev = memory.rates[-1][1] if memory.rates else None
    if memory.rates and not (prev is not None and forecast.jumped(prev, rate)):
        # Short of a jump, demand must hold for two decisions in a row (a noisy sample, or a chance run
        # of them that reads as a trend, rarely does): the forecast made one decision ago caps this one.
        # For a scale-down the other way round: the higher of the two must fit the groups left (a
        # single low sample at a group boundary must not take a group that the next one needs).
        before = forecast.forecast(
            memory.rates, memory.rates[-1][0], cfg.forecast_window, cfg.forecast_horizon
        )
        held = max(f.ahead, before.ahead)
        f = replace(f, ahead=min(f.ahead, before.ahead))
    return f, held


def _in_flight(rec: int, at: _Moment, memory: Memory, inflight: float) -> tuple[int, list[str], Memory]:
    """The recommendation raised by the requests in flight at the frontend: the most immediate load
    signal (a burst's first requests count at once; the arrival rate needs its window to fill, and the
    cache fills only as requests get in). Groups needed = in flight / what one group holds at the target,
    learned from the cache (forecast.learn, with a lower floor) while no group is warming and nothing
    queues; a step is sized for twice the count it shows, which is still rising (once: not while groups are
    on their way or were just added). Only a step leads
    (forecast.stepped: a burst's first requests, beyond what the recent level reaches by chance); a steady
    count's own noise must not add groups, and the cache and the rate size them once it settles. Its mean
    over the window keeps groups from a scale-down."""
    current, groups, signal, cfg, now = at.current, at.groups, at.signal, at.cfg, at.now
    queued, warming, starting = at.queued, at.warming, at.starting
    prev = memory.inflight[-1][1] if memory.inflight else None
    streams = memory.streams
    step = streams is not None and forecast.stepped(memory.inflight, inflight, streams)
    # Learned only from a steady count: while it moves, the cache has not caught up with the requests yet.
    steady = prev is None or not forecast.jumped(prev, inflight)
    if cfg.utilization and not warming and steady and queued <= cfg.queue_per_group / 2:
        floor = forecast.MIN_STREAM_UTILIZATION
        streams = forecast.learn(memory.streams, inflight, groups, signal, cfg.target, floor=floor)
    seen = forecast.observe(memory.inflight, now, inflight, cfg.forecast_window)
    mem = replace(memory, inflight=seen, streams=streams)
    if streams is None:
        return rec, [], mem
    notes = []
    if step:  # (only a step leads: short of one, the cache and the rate size the groups)
        # A step is seen on its first samples, while the count still rises: it goes on rising for a
        # request's duration (arrivals at the new rate, departures at the old), so the groups are sized
        # for forecast.MAX_GROWTH times what is in flight now (the rate's forecast is capped the same way).
        # Not while groups are on their way or warming up (just added): the step was acted on, and what
        # rises since is the backlog that waits for them (doubling it at every decision would add groups
        # for requests counted twice).
        ahead = (1.0 if starting or warming else forecast.MAX_GROWTH) * inflight
        up = forecast.groups_for(ahead, streams * (1 + cfg.tolerance))
        if up is not None and up > rec:
            notes.append(
                f"{inflight:.0f} in flight, rising: {ahead:.0f} at {streams:.1f} per group needs {up}"
            )
            rec = up
    recent = mem.inflight
    held = sum(v for _, v in recent) / len(recent)  # the level over the window, not a noisy high
    keep = forecast.groups_for(held, streams * (1 - cfg.tolerance))
    if keep is not None and rec < current and keep > rec:
        rec = min(current, keep)
        notes.append(f"{held:.0f} in flight keeps {rec}")
    return rec, notes, mem


def decide(
    samples: Mapping[str, Sample] | None,
    counted: set[str],
    warming: int,
    current: int,
    cfg: Config,
    memory: Memory,
    now: float,
    demand: Demand | None = None,
) -> Decision:
    """One decision for one role.

    samples: per group, or None when the query failed. counted: groups that are ready and warm (only
    their samples count). warming: groups that exist but are not ready or still warming up.
    """
    history = in_window(memory.recommendations, now, max(cfg.up_window, cfg.down_window))
    fresh = _fresh(samples, counted, warming, cfg)
    if isinstance(fresh, _Hold):
        return _hold(fresh, current, cfg, memory, history, now)
    signal = sum(s.value for s in fresh.values()) / len(fresh)
    missing = len(counted) - len(fresh)  # groups that count but sent no fresh sample
    rec = _proportional(signal, len(fresh), current, cfg)
    leads = ""
    mem = memory
    if cfg.leading and demand is not None:
        at = _Moment(current, len(fresh), signal, cfg, now, warming)
        rec, leads, mem = _lead(rec, at, memory, demand)
    rec = _clamp(rec, cfg)  # the windows compare recommendations; the step caps come after them
    history = (*history, (now, rec))
    mem = replace(mem, recommendations=prune(history))
    desired, reason = _stabilized(rec, current, bool(warming or missing), warming, history, cfg, now)
    if desired != current:
        mem = replace(mem, last_scale_time=now)
    if reason == "Warming":
        message = f"{warming} group(s) still warming up: no scale-down yet"
    else:
        message = (
            f"mean {signal:.3f} over {len(fresh)} group(s) vs target {cfg.target:g}{leads}: recommend "
            f"{rec}, {current} -> {desired}"
        )
    if missing:
        message += f"; no fresh sample from {missing} of {len(counted)} ready group(s)" + (
            ": no scale-down" if rec < current else ""
        )
    return Decision(desired, current, reason, message, signal, rec, mem, not missing, cfg.target)


@dataclass(frozen=True)
class _Hold:
    """Why a decision holds the current count (no usable samples)."""

    reason: str
    message: str
    metrics_ok: bool


def _fresh(
    samples: Mapping[str, Sample] | None, counted: set[str], warming: int, cfg: Config
) -> dict[str, Sample] | _Hold:
    """The fresh samples of the groups that count, or why there is nothing to decide on."""
    if samples is None:
        return _Hold("MetricsUnavailable", "the metrics query failed: holding the current groups", False)
    valid = forecast.valid_utilization if cfg.utilization else forecast.valid_count
    # Only the groups that count can spoil a decision: a bad sample of a warming group is ignored.
    bad = {g: s.value for g, s in samples.items() if g in counted and not valid(s.value)}
    if bad:
        shown = ", ".join(f"{g}={v!r}" for g, v in sorted(bad.items())[:3])
        return _Hold("MetricsUnavailable", f"bad samples ({shown}): holding the current groups", False)
    fresh = {g: s for g, s in samples.items() if g in counted and s.age_seconds <= cfg.stale_after}
    if fresh:
        return fresh
    if counted:
        stale = [g for g in counted if g in samples]
        what = "stale" if stale else "missing"
        return _Hold(
            "MetricsUnavailable",
            f"samples {what} for {len(counted)} ready group(s): holding the current groups",
            False,
        )
    return _Hold("Warming", f"no group has finished warming up ({warming} warming)", True)


def _hold(
    why: _Hold,
    current: int,
    cfg: Config,
    memory: Memory,
    history: tuple[tuple[float, int], ...],
    now: float,
) -> Decision:
    """The current count (within the bounds) with no recommendation."""
    reason, message = why.reason, why.message
    desired = _clamp(current, cfg)
    if desired != current:
        reason, message = (
            "OutOfBounds",
            f"{current} groups is outside [{cfg.min_groups}, {cfg.max_groups}]",
        )
    # Without data the count that runs is the recommendation: once samples come back, a scale-down
    # still waits for a whole window of them.
    mem = replace(memory, recommendations=history if why.metrics_ok else prune((*history, (now, desired))))
    if desired != current:
        mem = replace(mem, last_scale_time=now)
    return Decision(desired, current, reason, message, None, None, mem, why.metrics_ok, cfg.target)


def _proportional(signal: float, groups: int, current: int, cfg: Config) -> int:
    """The groups that hold the mean signal of `groups` at the target (the current count within the
    tolerance band)."""
    if abs(signal / cfg.target - 1) <= cfg.tolerance:
        return current
    return max(math.ceil(groups * signal / cfg.target - 1e-9), 1 if signal > 0 else 0)


def _stabilized(
    rec: int,
    current: int,
    incomplete: bool,
    warming: int,
    history: tuple[tuple[float, int], ...],
    cfg: Config,
    now: float,
) -> tuple[int, str]:
    """The count to run and why: the lowest recommendation of the up window or the highest of the down
    window, capped by the steps and the bounds; no scale-down while groups warm or samples are missing
    (`incomplete`)."""
    if rec > current:
        window = [n for t, n in history if now - t <= cfg.up_window] if cfg.up_window > 0 else [rec]
        desired = min(current + cfg.max_step_up, max(current, min(window)))
        reason = "ScaleUp" if desired > current else "ScaleUpStabilizing"
    elif rec < current and incomplete:
        desired, reason = current, "Warming" if warming else "MetricsIncomplete"
    elif rec < current:
        window = [n for t, n in history if now - t <= cfg.down_window] if cfg.down_window > 0 else [rec]
        desired = max(current - cfg.max_step_down, min(current, max(window)))
        reason = "ScaleDown" if desired < current else "ScaleDownStabilizing"
    else:
        desired, reason = current, "WithinTolerance"
    if _clamp(desired, cfg) != desired:
        desired, reason = _clamp(desired, cfg), "OutOfBounds"
    return desired, reason


def in_window(
    entries: tuple[tuple[float, int], ...], now: float, seconds: float
) -> tuple[tuple[float, int], ...]:
    """The entries of the last `seconds` (an entry stamped further in the future than CLOCK_SKEW_SECONDS,
    by a clock that ran ahead, is dropped: it would otherwise stay in every window for as long as the
    clock was ahead)."""
    return tuple((t, n) for t, n in entries if -CLOCK_SKEW_SECONDS <= now - t <= seconds)


def prune(entries: tuple[tuple[float, int], ...]) -> tuple[tuple[float, int], ...]:
    """The recommendations a stabilization window can still need, oldest first: an entry with a later one
    at least as high (for the scale-down window's maximum) and a later one at least as low (for the
    scale-up window's minimum) never decides either, since every window that holds it holds the later
    ones too. What is left is bounded by the range of counts, not by window / interval."""
    kept: list[tuple[float, int]] = []
    hi, lo = -math.inf, math.inf
    for t, n in reversed(entries):
        if n > hi or n < lo:
            kept.append((t, n))
        hi, lo = max(hi, n), min(lo, n)
    return tuple(reversed(kept))


def initial_groups(replicas: int | None, cfg: Config) -> int:
    """The count to start from when autoscaling is turned on: the spec's replicas within the bounds."""
    return _clamp(cfg.min_groups if replicas is None else replicas, cfg)
