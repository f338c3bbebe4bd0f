"""Leading signals for the autoscaler (pure; time is a parameter, memory is passed in and handed back).

KV-cache utilization saturates only once queues have formed: by then requests already wait. The arrival
rate at the frontend moves first. This module keeps a short history of it, forecasts it a little ahead
(the last level plus the recent upward trend, over the time a new group needs to serve), and turns the
forecast into groups through a capacity per group: the requests per second one group serves at the KV
target, from spec.profile when the plan predicts it, else learned online from the load it is serving
now (rate / groups, scaled by target / utilization) and smoothed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

KEEP_SECONDS = 300.0  # history kept (in status)
MIN_UTILIZATION = 0.25  # below this, utilization says too little about capacity (a lightly loaded engine
# runs short batches: rate / utilization there overstates what it serves under load by 2-3x)
MAX_UTILIZATION = 0.9  # above this the cache is saturated: requests queue, and rate / groups overstates
JUMP_SLACK = 0.1  # requests/s: a jump must exceed this too (a few requests more or less at a low rate)
TREND_AGREEMENT = 0.85  # share of pairwise slopes that must agree in sign for a trend to count
MAX_GROWTH = 2.0  # the forecast never more than doubles the last measured rate
MIN_LIFT = 0.05  # a trend counts only once the rate rose by this share of its level over the window
MIN_STREAM_UTILIZATION = 0.05  # in-flight requests vs cache: a request holds its blocks whatever the
# batch, so even a light load says what a group holds (below this, one request more or less is all it says)


@dataclass(frozen=True)
class Forecast:
    rate_now: float  # requests/s now
    trend: float  # requests/s per second, over the trend window (>= 0 only is used to scale up)
    ahead: float  # forecast rate `horizon` seconds ahead
    peak: float  # highest rate seen over the trend window (scale-down keeps room for it)


def observe(
    history: Sequence[tuple[float, float]], now: float, rate: float, keep: float = KEEP_SECONDS
) -> tuple[tuple[float, float], ...]:
    """The history with a new (time, rate) sample; samples older than `keep` seconds dropped."""
    kept = [(t, r) for t, r in history if now - t <= keep and t < now]
    return (*kept, (now, rate))


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The trend of rate over time, robust to a single spike: the median of the pairwise slopes
    (Theil-Sen), used only when it is clearly there - at least 5 points, and at least TREND_AGREEMENT of
    the pairs agree on its sign (Mann-Kendall's idea: noise alone agrees about half the time)."""
    pairs = [
        (r2 - r1) / (t2 - t1) for i, (t1, r1) in enumerate(points) for t2, r2 in points[i + 1 :] if t2 != t1
    ]
    if len(points) < 5 or not pairs:
        return 0.0
    pairs.sort()
    mid = len(pairs) // 2
    median = pairs[mid] if len(pairs) % 2 else (pairs[mid - 1] + pairs[mid]) / 2
    agree = sum(1 for x in pairs if x * median > 0) / len(pairs)
    return median if agree >= TREND_AGREEMENT else 0.0


def forecast(history: Sequence[tuple[float, float]], now: float, window: float, horizon: float) -> Forecast:
    """Where the rate is headed `horizon` seconds from now: the last rate plus the upward trend of the
    last `window` seconds, at most MAX_GROWTH times the last rate (a step seen mid-rise must not read as a
    slope that goes on for minutes). A falling trend forecasts no drop: scale-down is left to the
    stabilization window."""
    recent = [(t, r) for t, r in history if now - t <= window]
    if not recent:
        return Forecast(0.0, 0.0, 0.0, 0.0)
    rate_now = recent[-1][1]
    trend = slope(recent)
    span = recent[-1][0] - recent[0][0]
    if trend * span < MIN_LIFT * rate_now:
        trend = min(trend, 0.0)  # a rise smaller than the noise of a steady load is no trend
    ahead = min(rate_now + max(0.0, trend) * horizon, MAX_GROWTH * rate_now)
    return Forecast(rate_now, trend, max(rate_now, ahead), max(r for _, r in recent))


def learn(
    capacity: float | None,
    load: float,
    groups: int,
    utilization: float,
    target: float,
    alpha: float = 0.3,
    floor: float = MIN_UTILIZATION,
) -> float | None:
    """What one group takes at the target, smoothed (EWMA), from the `load` (requests/s, or requests in
    flight) its `groups` carry at `utilization`: load / groups x target / utilization. Unchanged when the
    sample says too little (no load, no groups, utilization under `floor`) or the cache is saturated (the
    groups then serve less than arrives, and the sample would overstate them). Requests/s need the
    default floor (a lightly loaded engine runs short batches); requests in flight do not
    (MIN_STREAM_UTILIZATION: a request holds its blocks whatever the batch, so a quiet period teaches
    what a group holds before the first burst)."""
    if groups <= 0 or load <= 0 or not floor <= utilization <= MAX_UTILIZATION or target <= 0:
        return capacity
    sample = load / groups * target / utilization
    if not math.isfinite(sample) or sample <= 0:
        return capacity
    return sample if capacity is None else (1 - alpha) * capacity + alpha * sample


STEP_CHANCE = 1e-6  # a step in a count: a steady count of the recent level reaches it less often than this


def poisson_tail(k: float, mean: float) -> float:
    """P(X >= k) for a Poisson count X of this mean (a normal approximation above a mean of 100)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if mean > 100:
        return 0.5 * math.erfc((math.ceil(k) - 0.5 - mean) / math.sqrt(2 * mean))
    if k > mean + 20 * math.sqrt(mean) + 40:  # far past any threshold (< 1e-30): no loop to k
        return 0.0
    term = total = math.exp(-mean)  # P(X = 0), then the terms below k summed
    for i in range(1, math.ceil(k)):
        term *= mean / i
        total += term
    return max(0.0, 1.0 - total)


def stepped(history: Sequence[tuple[float, float]], now: float, per_group: float) -> bool:
    """Whether the requests in flight stand well above their recent level (the mean of `history`): by
    half, by more than a group holds, and beyond what a steady count of that level reaches by chance
    (a Poisson count: less than STEP_CHANCE). A burst's first requests, not a chance cluster."""
    if not history:
        return False
    level = max(0.0, sum(v for _, v in history) / len(history))
    return now > 1.5 * level and now - level > per_group and poisson_tail(now, level) < STEP_CHANCE


def jumped(before: float, now: float) -> bool:
    """Whether the rate moved by half or more between two samples (beyond a little noise at low rates)."""
    return now > 1.5 * before + JUMP_SLACK or before > 1.5 * now + JUMP_SLACK


def groups_for(rate: float, capacity: float | None) -> int | None:
    """Groups that serve `rate` at `capacity` each (None: capacity unknown)."""
    if capacity is None or capacity <= 0 or not math.isfinite(rate) or not math.isfinite(capacity):
        return None
    groups = rate / capacity
    if not math.isfinite(groups):  # a tiny capacity (a hand-edited status) overflows the quotient
        return None
    return max(0, math.ceil(groups - 1e-9))


def learn_startup(startup: float | None, sample: float, alpha: float = 0.5) -> float | None:
    """Seconds from a group's creation to Ready, smoothed (EWMA); non-finite or negative samples ignored."""
    if not math.isfinite(sample) or sample < 0:
        return startup
    return sample if startup is None else (1 - alpha) * startup + alpha * sample


def valid_utilization(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


def valid_count(value: float) -> bool:
    return math.isfinite(value) and value >= 0.0
