"""The leading policy: the forecast (tokenfab.planning.autoscaler.forecast), `decide` with demand, and the
autoscaling step (`tokenfab.planning.autoscaler.queries` then `step`) with a fake Prometheus.

Properties (Hypothesis): with any demand the decision stays within the bounds and the step caps; missing,
stale or bad data never lowers the count; a stationary noisy load never makes the count reverse
direction; on a ramp the leading policy asks for each group before the load needs it, and well before the
KV-only policy does. Single cases: bad samples (-3, +Inf) hold with MetricsUnavailable, a failed arrival
read blocks scale-down, the capacity check counts the prefill groups the ratio adds, a group stuck
starting stops holding back scale-down after a bound, the frontend is sized from its ingress, the startup
time is learned.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testing.autoscaling import autoscale
from testing.cases import load_example, merge_patch
from tokenfab.adapters.metrics import Reading
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import Autoscaling, ModelDeployment
from tokenfab.planning.autoscaler import WARMING_BOUND_SECONDS, forecast, learned_startup
from tokenfab.planning.autoscaler.policy import Config, Demand, Memory, Sample, config_for, decide
from tokenfab.planning.lifecycle import GroupView, NodeHealth, PodView
from tokenfab.planning.topology import Domain

PROPS = settings(max_examples=200, deadline=None, database=None)
INTERVAL = 5.0


def leading(**kw: Any) -> Config:
    base = config_for(Autoscaling(interval_seconds=5, scale_down_stabilization_seconds=60), 1, 16)
    return replace(base, **kw)


# ------------------------------------------------------------------------------------------ forecast


def test_forecast_follows_an_upward_trend_and_caps_a_step():
    ramp = [(float(t), 0.5 + 0.01 * t + (0.01 if t % 10 else -0.01)) for t in range(0, 31, 5)]
    f = forecast.forecast(ramp, 30.0, 30.0, 30.0)
    assert f.rate_now == pytest.approx(0.79)
    assert f.trend == pytest.approx(0.01, rel=0.2)
    assert f.ahead == pytest.approx(1.09, rel=0.05)
    noisy = [(float(t), 1.0 + (0.3 if t % 10 else -0.3)) for t in range(0, 31, 5)]
    assert forecast.forecast(noisy, 30.0, 30.0, 60.0).trend == 0.0, "noise is not a trend"
    rise = [(0.0, 0.3), (5.0, 0.4), (10.0, 0.5), (15.0, 0.6), (20.0, 0.9), (25.0, 1.0)]
    f = forecast.forecast(rise, 25.0, 30.0, 600.0)
    assert f.ahead == pytest.approx(2.0), "never more than twice the last rate"
    spike = [(0.0, 1.0), (5.0, 1.1), (10.0, 0.9), (15.0, 1.0), (20.0, 0.95), (25.0, 1.8)]
    assert forecast.forecast(spike, 25.0, 30.0, 60.0).ahead == pytest.approx(1.8), "a spike is no trend"
    falling = [(float(t), 2.0 - 0.05 * t) for t in range(0, 31, 5)]
    assert forecast.forecast(falling, 30.0, 30.0, 30.0).ahead == pytest.approx(0.5), "no forecast drop"


def test_capacity_is_learned_only_from_unsaturated_samples():
    assert forecast.learn(None, 1.0, 2, 0.35, 0.7) == pytest.approx(1.0)  # 0.5/s per group at 0.35 -> 1.0
    assert forecast.learn(1.0, 2.0, 1, 0.98, 0.7) == 1.0, "a saturated cache overstates what a group serves"
    assert forecast.learn(1.0, 0.0, 1, 0.5, 0.7) == 1.0
    assert forecast.learn(1.0, 1.0, 0, 0.5, 0.7) == 1.0
    assert forecast.learn(1.0, 1.0, 1, 0.01, 0.7) == 1.0
    assert forecast.groups_for(2.0, 1.0) == 2
    assert forecast.groups_for(2.01, 1.0) == 3
    assert forecast.groups_for(math.inf, 1.0) is None
    assert forecast.groups_for(1.0, None) is None
    assert forecast.learn_startup(None, 40.0) == 40.0
    assert forecast.learn_startup(40.0, 80.0) == 60.0
    assert forecast.learn_startup(40.0, -1.0) == 40.0
    assert forecast.jumped(0.3, 0.9)
    assert forecast.jumped(2.0, 0.3)
    assert not forecast.jumped(0.3, 0.5), "noise at a low rate"
    assert not forecast.jumped(1.8, 2.1)


# ------------------------------------------------------------------------------------------ decide


def kv_samples(n: int, value: float) -> tuple[dict[str, Sample], set[str]]:
    samples = {f"g{i}": Sample(value, 1.0) for i in range(n)}
    return samples, set(samples)


def test_demand_leads_before_the_cache_fills():
    cfg = leading()
    samples, counted = kv_samples(1, 0.3)  # the cache is fine...
    # ... but one group serves 0.5 requests/s at the target, and the rate just jumped from 0.4 to 1.8
    mem = Memory(capacity=0.5, rates=((95.0, 0.4),))
    d = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(rate=1.8))
    assert d.memory.capacity == 0.5, "nothing learned in a jump (the cache has not caught up yet)"
    assert d.desired == 3, d.message
    assert d.reason == "ScaleUp", d.message
    assert "demand 1.80/s" in d.message


def test_requests_in_flight_size_a_burst_before_the_rate_window_fills():
    """A step from 0.3 to 2 requests/s, 6 s in: the 10 s arrival rate reads 1.0/s (one group's worth at
    the learned 1/s), the cache of the one group is at 0.3, but 12 requests are in flight already (about
    1.3 before), and one group holds 4 at the target: three groups, at once (the step cap allows two)."""
    cfg = leading()
    samples, counted = kv_samples(1, 0.3)
    quiet = ((85.0, 1.0), (90.0, 2.0), (95.0, 1.0))
    mem = Memory(capacity=1.0, rates=((95.0, 0.3),), inflight=quiet, streams=4.0)
    d = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(rate=1.0, inflight=12.0))
    assert d.desired == 3, d.message
    assert "12 in flight, rising: 24 at 4.0 per group needs 6" in d.message
    assert d.memory.inflight[-1] == (100.0, 12.0)
    without = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(rate=1.0))
    assert without.desired == 1, "the rate and the cache alone see one group's worth"
    assert d.memory.streams == 4.0, "nothing learned in a step (the cache has not caught up yet)"


def test_a_step_is_sized_for_twice_what_it_shows_so_far():
    """A step seen on its first samples is still rising (arrivals at the new rate, departures at the old,
    for a request's duration): 11 in flight over a level of about 1.3, at 4 per group (4.4 with the
    tolerance), is 3 groups' worth now and 5 groups' worth once it settles. With room in the step cap, all
    5 come at once; a count that does not step up is sized as it is (the cache and the rate size it)."""
    cfg = leading(max_step_up=8)
    samples, counted = kv_samples(1, 0.3)
    quiet = ((85.0, 1.0), (90.0, 2.0), (95.0, 1.0))
    mem = Memory(capacity=None, rates=(), inflight=quiet, streams=4.0)
    d = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(inflight=11.0))
    assert d.desired == 5, d.message
    assert d.reason == "ScaleUp"
    steady = ((85.0, 10.0), (90.0, 11.0), (95.0, 10.0))
    same = decide(samples, counted, 0, 1, cfg, replace(mem, inflight=steady), 100.0, Demand(inflight=11.0))
    assert same.desired < 5, same.message


def test_a_chance_cluster_in_flight_moves_nothing_and_the_level_keeps_groups():
    """A light load (about 2 in flight) shows 6 once: a Poisson count of 2 reaches 6 in 1.7% of samples,
    no step; 14 is one (2e-8). Scaling down, the mean count over the window keeps groups, not a high."""
    cfg = leading()
    samples, counted = kv_samples(1, 0.25)
    quiet = ((85.0, 2.0), (90.0, 1.0), (95.0, 3.0))
    mem = Memory(inflight=quiet, streams=4.0)
    d = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(inflight=6.0))
    assert d.desired == 1, d.message
    assert d.memory.streams == 4.0, "nothing learned while the count moves (the cache lags)"
    d = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(inflight=14.0))
    assert d.desired == 3, d.message
    assert "14 in flight, rising: 28 at 4.0 per group needs 7" in d.message
    samples3, counted3 = kv_samples(3, 0.2)
    busy = ((85.0, 12.0), (90.0, 10.0), (95.0, 11.0))
    mem = Memory(inflight=busy, streams=4.0, recommendations=((0.0, 3),))
    down = replace(cfg, down_window=0.0)
    d = decide(samples3, counted3, 0, 3, down, mem, 100.0, Demand(inflight=3.0))
    assert d.desired == 3, d.message
    assert "9 in flight keeps 3" in d.message
    mem = Memory(inflight=((85.0, 2.0), (90.0, 30.0), (95.0, 1.0)), streams=4.0, recommendations=((0.0, 3),))
    mem = replace(mem, inflight=((85.0, 2.0), (90.0, 1.0), (95.0, 4.0)))  # 2.5 in flight: 1 group's worth
    d = decide(samples3, counted3, 0, 3, down, mem, 100.0, Demand(inflight=3.0))
    assert d.desired == 2, d.message


def test_what_a_group_holds_is_learned_from_a_light_load_but_not_while_warming_or_queued():
    floor = forecast.MIN_STREAM_UTILIZATION
    assert forecast.learn(None, 1.0, 1, 0.15, 0.6, floor=floor) == pytest.approx(4.0)
    assert forecast.learn(None, 1.0, 1, 0.15, 0.6) is None, "requests/s need the higher floor"
    assert forecast.learn(4.0, 2.0, 1, 0.95, 0.6, floor=floor) == 4.0, "a saturated cache"
    assert forecast.learn(4.0, 1.0, 1, 0.01, 0.6, floor=floor) == 4.0, "too little to say"
    assert forecast.learn(4.0, 0.0, 1, 0.3, 0.6, floor=floor) == 4.0
    assert forecast.learn(4.0, 1.0, 0, 0.3, 0.6, floor=floor) == 4.0
    assert forecast.poisson_tail(12, 4 / 3) == pytest.approx(1.934e-8, rel=1e-3)
    exact = 1 - sum(math.exp(-120.0 + i * math.log(120.0) - math.lgamma(i + 1)) for i in range(150))
    assert forecast.poisson_tail(150, 120.0) == pytest.approx(exact, rel=0.3), "the normal approximation"
    assert forecast.poisson_tail(1e12, 2.0) == 0.0, "a huge count answers at once (no loop up to it)"
    assert forecast.stepped([(0.0, 1.0)], 1e15, 4.0)
    quiet = [(0.0, 1.0), (5.0, 2.0), (10.0, 1.0)]
    assert forecast.stepped(quiet, 12.0, 4.0)
    assert not forecast.stepped(quiet, 8.0, 4.0), "a count of 1.3 reaches 8 once in 13,000 samples"
    assert not forecast.stepped(quiet, 5.0, 4.0), "less than a group's worth more than the level"
    assert not forecast.stepped(quiet, 6.0, 6.0)
    assert not forecast.stepped([(0.0, 20.0), (5.0, 14.0)], 30.0, 4.0), "within 4 sigmas of 17"
    assert forecast.stepped([(0.0, 20.0), (5.0, 14.0)], 45.0, 4.0)
    assert not forecast.stepped([], 40.0, 4.0)
    cfg = leading()
    samples, counted = kv_samples(1, 0.15)
    d = decide(samples, counted, 0, 1, cfg, Memory(), 100.0, Demand(inflight=1.0))
    assert d.memory.streams == pytest.approx(cfg.target / 0.15)
    d = decide(samples, counted, 1, 2, cfg, Memory(), 100.0, Demand(inflight=1.0))
    assert d.memory.streams is None, "a group warming up: the load is spread over more than the counted"
    d = decide(samples, counted, 0, 1, cfg, Memory(), 100.0, Demand(inflight=1.0, waiting={"g0": 3.0}))
    assert d.memory.streams is None, "requests queue: in flight overstates what the groups hold"


def test_forming_queues_add_a_group():
    cfg = leading()
    samples, counted = kv_samples(2, 0.65)  # within tolerance of the target
    d = decide(samples, counted, 0, 2, cfg, Memory(), 100.0, Demand(waiting={"g0": 6.0, "g1": 4.0}))
    assert d.desired == 3, d.message
    assert "queues forming (5.0 waiting per group)" in d.message


def test_a_long_queue_adds_up_to_the_step_and_waits_only_for_groups_not_ready_yet():
    cfg = leading()
    samples, counted = kv_samples(1, 0.97)  # saturated; a second group is Ready but warming up
    queue = {"g0": 9.0}
    d = decide(samples, counted, 1, 2, cfg, Memory(), 100.0, Demand(waiting=queue))
    assert d.desired == 4, "9 waiting at 2 per group: two groups more (the step cap), warming or not"
    assert "queues forming" in d.message
    d = decide(samples, counted, 1, 2, cfg, Memory(), 100.0, Demand(waiting=queue, starting=1))
    assert d.desired == 2, "a group on its way (not Ready yet): the queue waits for it"
    d = decide(samples, counted, 0, 1, cfg, Memory(), 100.0, Demand(waiting={"g0": 3.0}))
    assert d.desired == 2, d.message
    # Just after a burst was sized (3 groups, two of them Ready but warming): the first group's backlog
    # is part of the 12 in flight the three hold (4 each), so it adds nothing; 20 in flight would.
    held = Memory(streams=4.0, inflight=((95.0, 12.0),))
    d = decide(samples, counted, 2, 3, cfg, held, 100.0, Demand(waiting=queue, inflight=12.0))
    assert d.desired == 3, d.message
    d = decide(samples, counted, 2, 3, cfg, held, 100.0, Demand(waiting=queue, inflight=20.0))
    assert d.desired == 5, d.message


def test_the_kv_policy_ignores_demand():
    cfg = leading(leading=False)
    samples, counted = kv_samples(1, 0.3)
    d = decide(samples, counted, 0, 1, cfg, Memory(capacity=0.5), 100.0, Demand(rate=1.8))
    assert d.desired == 1


@pytest.mark.parametrize("bad", [-3.0, math.inf, -math.inf, 1.5])
def test_bad_utilization_holds_with_metrics_unavailable(bad):
    cfg = leading()
    samples = {"g0": Sample(0.5, 1.0), "g1": Sample(0.5, 1.0), "g2": Sample(bad, 1.0)}
    d = decide(samples, set(samples), 0, 3, cfg, Memory(), 100.0, Demand(rate=math.inf))
    assert (d.desired, d.reason, d.metrics_ok) == (3, "MetricsUnavailable", False)
    assert "bad samples" in d.message


def demands(draw: Any) -> Demand:
    rate = draw(st.one_of(st.none(), st.floats(0.0, 50.0), st.sampled_from([math.inf, -1.0, math.nan])))
    waits = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(["r0", "r1", "r2"]), st.floats(0, 40))))
    cap = draw(st.one_of(st.none(), st.floats(0.05, 10.0)))
    return Demand(rate=rate, waiting=waits, capacity=cap)


@st.composite
def situations(draw: Any) -> tuple[Any, ...]:
    lo = draw(st.integers(0, 4))
    hi = draw(st.integers(max(lo, 1), 16))
    cfg = leading(
        min_groups=lo,
        max_groups=hi,
        max_step_up=draw(st.integers(1, 4)),
        max_step_down=draw(st.integers(1, 3)),
        down_window=draw(st.sampled_from([0.0, 60.0, 300.0])),
        forecast_horizon=draw(st.sampled_from([5.0, 30.0, 120.0])),
    )
    n = draw(st.integers(0, 8))
    samples = {
        f"r{i}": Sample(draw(st.floats(0.0, 1.0)), draw(st.sampled_from([0.0, 0.0, 5.0, 200.0])))
        for i in range(n)
        if draw(st.integers(0, 5)) > 0
    }
    counted = {f"r{i}" for i in range(n)}
    history = draw(st.lists(st.tuples(st.floats(9600.0, 10_000.0), st.integers(lo, hi)), max_size=6))
    rates = draw(st.lists(st.tuples(st.floats(9960.0, 9999.0), st.floats(0.0, 20.0)), max_size=6))
    mem = Memory(
        recommendations=tuple(sorted(history)),
        rates=tuple(sorted(rates)),
        capacity=draw(st.one_of(st.none(), st.floats(0.05, 5.0))),
    )
    return cfg, samples, counted, draw(st.integers(0, 3)), draw(st.integers(0, 20)), mem, demands(draw)


@PROPS
@given(situations())
def test_property_with_demand_the_decision_stays_within_bounds_and_steps(s):
    cfg, samples, counted, warming, current, mem, demand = s
    d = decide(samples, counted, warming, current, cfg, mem, 10_000.0, demand)
    assert cfg.min_groups <= d.desired <= cfg.max_groups
    if cfg.min_groups <= current <= cfg.max_groups:
        assert current - cfg.max_step_down <= d.desired <= current + cfg.max_step_up
    assert all(cfg.min_groups <= n <= cfg.max_groups for _, n in d.memory.recommendations)
    assert d.memory.capacity is None or (math.isfinite(d.memory.capacity) and d.memory.capacity > 0)


@PROPS
@given(situations(), st.sampled_from(["failed", "stale", "bad"]))
def test_property_with_demand_missing_or_bad_data_never_scales_down(s, how):
    cfg, samples, counted, warming, current, mem, demand = s
    if how == "failed":
        samples = None
    elif how == "stale":
        samples = {g: Sample(v.value, cfg.stale_after + 1.0) for g, v in samples.items()}
    else:  # a counted group's sample is bad (an uncounted group's signal is never read)
        samples, counted = {**samples, "rX": Sample(-3.0, 0.0)}, counted | {"rX"}
    d = decide(samples, counted, warming, current, cfg, mem, 10_000.0, demand)
    if current <= cfg.max_groups:
        assert d.desired >= current, d.message


def simulate(
    cfg: Config,
    rate_at: Any,
    steps: int,
    start: int = 1,
    per_group: float = 1.0,
    startup_steps: int = 4,
    noise: float = 0.0,
    seed: int = 0,
    in_flight: str = "scaled",
) -> tuple[list[int], list[int]]:
    """A fleet in the loop: groups serve `per_group` requests/s at the KV target; a new group counts
    after `startup_steps` decisions; the KV of each counted group is the load it carries; a request stays
    in flight DURATION seconds: the requests in flight at the frontend are rate x DURATION with the same
    relative noise as the rest ("scaled"), or a Poisson count of that mean ("poisson"; drawn from a
    generator of their own), or not read (""). Returns the desired count and the serving count per step."""
    rnd = random.Random(seed)
    flight = random.Random(seed + 1)
    created = [-1000] * start
    mem = Memory()
    desired_counts, serving = [], []
    for k in range(steps):
        now = k * INTERVAL
        warm = [c for c in created if k - c >= startup_steps]
        rate = max(0.0, rate_at(now) * (1 + rnd.gauss(0, noise)))
        per = min(1.0, rate / max(1, len(warm)) / per_group * cfg.target) if warm else 0.0
        samples = {
            f"g{i}": Sample(max(0.0, min(1.0, per + rnd.gauss(0, noise * per))), 1.0)
            for i in range(len(warm))
        }
        queued = max(0.0, rate - len(warm) * per_group / cfg.target) * 4  # waiting once the groups saturate
        inflight = {
            "scaled": max(0.0, rate * DURATION * (1 + flight.gauss(0, noise))),
            "poisson": poisson(flight, rate * DURATION),
        }.get(in_flight)
        demand = Demand(rate=rate, waiting=dict.fromkeys(samples, queued), inflight=inflight)
        d = decide(samples, set(samples), len(created) - len(warm), len(created), cfg, mem, now, demand)
        mem = d.memory
        if d.desired > len(created):
            created += [k] * (d.desired - len(created))
        else:
            created = sorted(created)[: d.desired]
        desired_counts.append(d.desired)
        serving.append(len(warm))
    return desired_counts, serving


DURATION = 4.0  # seconds a request stays in flight in `simulate`


def poisson(rnd: random.Random, mean: float) -> float:
    """A Poisson draw (Knuth's method; a normal approximation above 30)."""
    if mean > 30:
        return float(max(0, round(rnd.gauss(mean, math.sqrt(mean)))))
    k, p, limit = 0, 1.0, math.exp(-mean)
    while True:
        p *= rnd.random()
        if p <= limit:
            return float(k)
        k += 1


def reversals(counts: list[int]) -> int:
    signs = [1 if b > a else -1 for a, b in itertools.pairwise(counts) if b != a]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def noisy_cases(n: int, noise: float, seed: int) -> list[tuple[float, int, int]]:
    """A fixed set of (level, seed, start): drawn from a seeded generator, so every run and every machine
    checks the same cases (hypothesis's derandomized examples change with its version)."""
    rnd = random.Random(seed * 1000 + round(noise * 100))
    return [(rnd.uniform(0.2, 6.0), rnd.randrange(10_000), rnd.randint(1, 8)) for _ in range(n)]


def flaps(
    cfg: Config, cases: list[tuple[float, int, int]], noise: float, in_flight: str = "scaled"
) -> tuple[int, int, list[Any]]:
    """How many cases reverse once, and more than once, after the first scale-down window (or more than
    once from the start), with the first few of them."""
    once, more, seen = 0, 0, []
    for level, seed, start in cases:
        counts, _ = simulate(
            cfg, lambda _t, lv=level: lv, 200, start=start, noise=noise, seed=seed, in_flight=in_flight
        )
        r = max(reversals(counts[int(cfg.down_window / INTERVAL) :]), reversals([start, *counts]) - 1)
        once += r == 1
        more += r > 1
        if r and len(seen) < 3:
            seen.append(((level, seed, start), counts))
    return once, more, seen


# Two cases that once failed a stricter form of this property: a chance run of rising samples at a
# group boundary reads as a trend and adds a group that the stabilization window later takes back.
KNOWN_NOISY = [(1.78125, 2282, 8), (1.75, 2837, 1)]


@pytest.mark.parametrize(("noise", "n"), [(0.01, 150), (0.03, 150), (0.05, 400)])
def test_property_a_stationary_noisy_load_does_not_flap(noise, n):
    """Noise within the tolerance band (on the rate and on each group's utilization, against a 10% band):
    from any start, once the first scale-down window has passed, the count moves in one direction at most.
    At 1-3% noise, never. At 5%, a load right at a group boundary can show a chance run of rising samples
    that reads as a trend (the forecast then adds a group, and 60 s later the window takes it back):
    measured in 2 of these 402 runs of 1,000 s and in none of 1,200 others; allowed here in at most 2%,
    never twice (a policy without its tolerance band flaps in over 40%: see the next test)."""
    cfg = leading()
    cases = noisy_cases(n, noise, seed=1) + (KNOWN_NOISY if noise == 0.05 else [])
    once, more, seen = flaps(cfg, cases, noise)
    assert more == 0, seen
    assert once <= (0 if noise < 0.05 else 0.02 * len(cases)), (once, seen)


def test_property_requests_in_flight_counted_as_they_come_rarely_read_as_a_step():
    """The requests in flight are a count: Poisson, far noisier than the tolerance band at low levels (2
    in flight often read 0 or 5). Only a step beyond what the recent level reaches by chance adds groups,
    so over 150 loads of 1,000 s each (30,000 decisions) at most 2 reverse once, and none twice."""
    cases = noisy_cases(150, 0.01, seed=3)
    once, more, seen = flaps(leading(), cases, 0.01, in_flight="poisson")
    assert more == 0, seen
    assert once <= 2, (once, seen)


def test_the_flapping_check_catches_a_policy_without_a_tolerance_band():
    """The same check on a policy with no tolerance band: the noise alone moves it back and forth."""
    cases = noisy_cases(60, 0.05, seed=2)
    once, more, _ = flaps(replace(leading(), tolerance=0.0), cases, 0.05)
    assert once + more >= 0.2 * len(cases), (once, more)


def ramp(t: float) -> float:
    return 0.3 + 0.01 * t  # 0.3 -> 6.3 requests/s over 600 s


def first_at_least(counts: list[int], n: int) -> float | None:
    return next((k * INTERVAL for k, c in enumerate(counts) if c >= n), None)


def test_on_a_ramp_the_leading_policy_asks_for_groups_before_the_load_needs_them():
    cfg = leading(forecast_horizon=20.0)  # about the simulated startup (4 decisions of 5 s)
    lead, lead_serving = simulate(cfg, ramp, 120)
    kv, kv_serving = simulate(replace(cfg, leading=False), ramp, 120)
    # the groups the load needs: those that hold it within the tolerance band over the target
    needed = [math.ceil(ramp(k * INTERVAL) / (1.0 * (1 + cfg.tolerance)) - 1e-9) for k in range(120)]
    leads, lags = [], []
    for n in range(2, 6):
        t_need = first_at_least(needed, n)
        t_lead, t_kv = first_at_least(lead, n), first_at_least(kv, n)
        assert t_need is not None
        assert t_lead is not None
        assert t_kv is not None
        leads.append(t_need - t_lead)
        lags.append(t_need - t_kv)
    assert all(x >= 0 for x in leads), f"leading asked late: {leads}"
    assert sum(leads) / len(leads) >= 10, f"lead times {leads}"
    assert sum(leads) > sum(lags) + 40, f"leading {leads} vs kv-only {lags}"
    short = sum(max(0, need - s) for need, s in zip(needed, lead_serving, strict=True))
    short_kv = sum(max(0, need - s) for need, s in zip(needed, kv_serving, strict=True))
    assert short < short_kv, (short, short_kv)


# ------------------------------------------------------------------------------------------ autoscale()


def deployment(patch: dict[str, Any] | None = None) -> ModelDeployment:
    """DeepSeek-R1 disaggregated at 1:2 (decode 32 GPUs, prefill 8), autoscaled every 5 s; `patch` is
    merged into spec.autoscaling."""
    doc = load_example("deepseek-r1-disaggregated.yaml")
    doc["metadata"]["namespace"] = "ml"
    doc["spec"] = merge_patch(
        doc["spec"],
        {
            "serving": {"prefillDecodeRatio": "1:2"},
            "decode": {"replicas": 2},
            "autoscaling": {
                "enabled": True,
                "prometheusUrl": "http://prometheus:9090",
                "intervalSeconds": 5,
                "scaleDownStabilizationSeconds": 0,
                "decode": {"minReplicas": 1, "maxReplicas": 8},
                **(patch or {}),
            },
        },
    )
    return parse_model_deployment(doc, "test")


def with_status(md: ModelDeployment, autoscaling: dict[str, Any]) -> ModelDeployment:
    from tokenfab.api.models import ModelDeploymentStatus

    status = ModelDeploymentStatus.model_validate({"autoscaling": autoscaling})
    return md.model_copy(update={"status": status})


def group(name: str, role: str, created: float, ready_since: float | None, gpus: int = 32) -> GroupView:
    nodes = gpus // 4
    pods = tuple(
        PodView(
            name=f"{name}-{r}",
            rank=r,
            phase="Running",
            ready=ready_since is not None,
            node=f"{name}-n{r}",
            deleting=False,
            ready_since=ready_since,
        )
        for r in range(nodes)
    )
    return GroupView(name, role, 0, "rev", "d0", nodes, gpus, pods, True, created_at=created)  # type: ignore[arg-type]


def healthy(groups: dict[str, list[GroupView]]) -> dict[str, NodeHealth]:
    return {p.node: NodeHealth(True) for gs in groups.values() for g in gs for p in g.pods if p.node}


def domains(free_gpus: int) -> dict[str, Domain]:
    nodes = {f"n{i}": 4 for i in range(free_gpus // 4)}
    return {"d0": Domain("d0", 72, nodes, 18, 18)}


class Prom:
    """Answers the autoscaler's queries: KV per decode group, waiting per group, arrivals."""

    def __init__(
        self,
        kv: dict[str, float] | None,
        rate: float | None = 0.5,
        fail_rate: bool = False,
        inflight: float | None = None,
        fail_inflight: bool = False,
    ) -> None:
        self.kv, self.rate, self.fail_rate = kv, rate, fail_rate
        self.inflight, self.fail_inflight = inflight, fail_inflight
        self.asked: list[str] = []

    def __call__(self, _url: str, query: str) -> Reading:
        self.asked.append(query)
        if "dynamo_frontend_inflight_requests" in query:
            if self.fail_inflight:
                return Reading(None, "TimeoutError: read timed out", query)
            return Reading({} if self.inflight is None else {"": Sample(self.inflight, 1.0)}, "", query)
        if "dynamo_frontend_requests_started_total" in query:
            if self.fail_rate:
                return Reading(None, "TimeoutError: read timed out", query)
            return Reading({} if self.rate is None else {"": Sample(self.rate, 1.0)}, "", query)
        if "input_sequence_tokens" in query:
            return Reading({"": Sample(1000.0, 1.0)}, "", query)
        if "num_requests_waiting" in query:
            return Reading({g: Sample(0.0, 1.0) for g in self.kv or {}}, "", query)
        if self.kv is None:
            return Reading(None, "ConnectionError: refused", query)
        return Reading({g: Sample(v, 1.0) for g, v in self.kv.items()}, "", query)


NOW = 100_000.0


def serving_decode(n: int) -> dict[str, list[GroupView]]:
    return {"decode": [group(f"m-decode-{i}", "decode", NOW - 3600, NOW - 3590) for i in range(n)]}


def conditions(out: Any) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in out.conditions}


@pytest.mark.parametrize("bad", [-3.0, math.inf])
def test_autoscale_holds_on_bad_samples_and_says_so(bad):
    md = with_status(deployment(), {"desired": {"decode": 3}})
    groups = serving_decode(3)
    prom = Prom({"m-decode-0": 0.1, "m-decode-1": bad, "m-decode-2": 0.1})
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert out.desired["decode"] == 3
    status, reason, message = conditions(out)["MetricsUnavailable"]
    assert (status, reason) == ("True", "NoData")
    assert "bad samples" in message


@pytest.mark.parametrize(
    ("failing", "shown", "why"),
    [
        ({"fail_rate": True}, "arrivals at the frontend: TimeoutError", "the arrival rate"),
        (
            {"fail_inflight": True},
            "requests in flight at the frontend: TimeoutError",
            "the requests in flight",
        ),
    ],
)
def test_a_failed_leading_read_blocks_scale_down_and_is_shown(failing, shown, why):
    md = with_status(
        deployment(), {"desired": {"decode": 3}, "recommendations": {"decode": [[NOW - 100, 3]]}}
    )
    groups = serving_decode(3)
    prom = Prom({g.name: 0.05 for g in groups["decode"]}, **failing)
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert out.desired["decode"] == 3, out.decisions[0][2].message
    assert out.decisions[0][2].reason == "MetricsIncomplete"
    assert f"{why} could not be read: no scale-down" in out.decisions[0][2].message
    status, _, message = conditions(out)["MetricsUnavailable"]
    assert status == "True"
    assert shown in message
    # the same with no frontend series at all (not scraped): KV alone decides, nothing is unavailable
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, Prom(prom.kv, rate=None))
    assert out.desired["decode"] == 2
    assert conditions(out)["MetricsUnavailable"][0] == "False"


def test_requests_in_flight_are_read_learned_and_kept_in_status():
    md = with_status(deployment(), {"desired": {"decode": 2}})
    groups = serving_decode(2)
    prom = Prom({g.name: 0.2 for g in groups["decode"]}, rate=0.5, inflight=3.0)
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert any("dynamo_frontend_inflight_requests" in q for q in prom.asked)
    assert out.status.concurrency["decode"] == pytest.approx(5.25)  # 1.5 per group at 0.2 -> 5.25 at 0.7
    assert out.status.arrivals[-1] == [NOW, 0.5, 0.0, 3.0]  # (input tokens: not read here)
    assert out.desired["decode"] == 1, "3 in flight are one group's worth (no scale-down window here)"
    # read back: 30 in flight, rising, are sized as 60: 60 / (5.25 * 1.1) -> 11 groups (3 with the cap)
    md = with_status(deployment(), out.status.model_dump(by_alias=True, exclude_none=True))
    prom = Prom({g.name: 0.2 for g in groups["decode"]}, rate=0.5, inflight=30.0)
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW + 5, prom)
    assert out.desired["decode"] == 3, out.decisions[0][2].message
    assert "30 in flight, rising: 60 at 5.2 per group needs 11" in out.decisions[0][2].message


def test_the_capacity_check_counts_the_prefill_groups_the_ratio_adds():
    md = with_status(deployment(), {"desired": {"decode": 1}, "capacity": {"decode": 0.5}})
    groups = serving_decode(1)
    prom = Prom({"m-decode-0": 0.95}, rate=1.4)  # 3 groups' worth of demand (a full cache: nothing learned)
    # Room for two more decode groups (64 GPUs) but then none for the prefill group (8 GPUs) the 1:2 ratio
    # adds with the second: only one new decode group (and no new prefill) fits.
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(68), NOW, prom)
    assert out.desired["decode"] == 2, out.decisions[0][2].message
    status, reason, message = conditions(out)["CapacityLimited"]
    assert (status, reason) == ("True", "InsufficientCapacity")
    assert "prefill group the ratio adds" in message
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(80), NOW, prom)
    assert out.desired["decode"] == 3
    assert conditions(out)["CapacityLimited"][0] == "False"


def test_a_group_stuck_starting_stops_holding_back_scale_down():
    md = with_status(
        deployment(), {"desired": {"decode": 3}, "recommendations": {"decode": [[NOW - 100, 3]]}}
    )
    groups = serving_decode(2)
    prom = Prom({g.name: 0.05 for g in groups["decode"]})
    young = group("m-decode-9", "decode", NOW - 60, None)
    groups["decode"].append(young)
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert out.desired["decode"] == 3
    assert out.decisions[0][2].reason == "Warming"
    stuck = group("m-decode-9", "decode", NOW - WARMING_BOUND_SECONDS - 1, None)
    groups["decode"][-1] = stuck
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert out.desired["decode"] == 2, out.decisions[0][2].message


def test_the_frontend_is_sized_from_its_ingress_within_bounds():
    patch = {"frontend": {"minReplicas": 1, "maxReplicas": 4, "requestsPerSecondPerReplica": 30}}
    md = with_status(deployment(patch), {"desired": {"decode": 2}})
    groups = serving_decode(2)
    kv = {g.name: 0.7 for g in groups["decode"]}
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, Prom(kv, rate=70.0))
    assert out.frontend_replicas == 3
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, Prom(kv, rate=500.0))
    assert out.frontend_replicas == 4, "within the bounds"
    # down only after the scale-down window (0 s here): at once to what the ingress needs
    md2 = with_status(
        deployment(patch),
        {"desired": {"decode": 2}, "frontendReplicas": 4, "frontendRecommendations": [[NOW - 100, 4]]},
    )
    out = autoscale(md2, groups, healthy(groups), lambda _r: domains(400), NOW, Prom(kv, rate=10.0))
    assert out.frontend_replicas == 1
    # without a frontend section the spec's count stands
    out = autoscale(
        with_status(deployment(), {}), groups, healthy(groups), lambda _r: domains(400), NOW, Prom(kv)
    )
    assert out.frontend_replicas is None


def test_the_startup_time_is_learned_from_groups_that_became_ready():
    groups = {"decode": [group("a", "decode", 1000.0, 1060.0), group("b", "decode", 1000.0, None)]}
    assert learned_startup(groups, None, None) == 60.0
    assert learned_startup(groups, 60.0, 1070.0) == 60.0, "already counted"
    groups["decode"].append(group("c", "decode", 1100.0, 1220.0))
    assert learned_startup(groups, 60.0, 1070.0) == 90.0
    md = with_status(deployment(), {"desired": {"decode": 2}})
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), 1300.0, Prom({"a": 0.7, "c": 0.7}))
    assert out.status.startup_seconds == pytest.approx(90.0)


# ------------------------------------------------------------------------------------------ burst watch


def watched_body(arrivals: list[list[float]], last: float, streams: float | None = 4.0) -> dict[str, Any]:
    """A raw ModelDeployment as the view holds it, with the autoscaler's memory in status."""
    md = deployment()
    body = md.model_dump(by_alias=True, exclude_none=True, mode="json")
    status: dict[str, Any] = {"lastEvaluation": {"decode": last}, "arrivals": arrivals}
    if streams is not None:
        status["concurrency"] = {"decode": streams}
    body["status"] = {"autoscaling": status}
    return body


QUIET = [[NOW - 15, 0.3, 0.0, 1.0], [NOW - 10, 0.3, 0.0, 2.0], [NOW - 5, 0.3, 0.0, 1.0]]


def test_the_burst_watch_wakes_a_deployment_whose_requests_in_flight_step_up():
    """About 1.3 in flight over the window; 14 is a burst (a Poisson count of 1.3 reaches it less than once
    in a million); 4 is not; the same 14 right after an evaluation waits (URGENT_GAP_SECONDS)."""
    from tokenfab.planning.autoscaler import URGENT_GAP_SECONDS, burst_watch

    body = watched_body(QUIET, NOW - 5)
    assert burst_watch(body, 14.0, NOW)
    assert not burst_watch(body, 4.0, NOW)
    assert not burst_watch(watched_body(QUIET, NOW - URGENT_GAP_SECONDS / 2), 14.0, NOW)
    assert not burst_watch(watched_body(QUIET, NOW - 5, streams=None), 14.0, NOW), "nothing learned yet"
    kv = watched_body(QUIET, NOW - 5)
    kv["spec"]["autoscaling"]["policy"] = "kv"
    assert not burst_watch(kv, 14.0, NOW), "the kv policy reads no leading signal"
    broken = watched_body(QUIET, NOW - 5)
    broken["status"]["autoscaling"]["arrivals"] = "nonsense"
    assert not burst_watch(broken, 14.0, NOW), "an unreadable status is no burst (and no exception)"
    assert not burst_watch(body, math.inf, NOW)


def test_an_urgent_evaluation_comes_before_the_interval_and_not_sooner_than_the_gap():
    """Evaluated 3 s ago with an interval of 5 s: a pass evaluates only when the burst watch asked for it;
    1 s after the last evaluation, not even then."""
    from testing.autoscaling import due_queries

    md = with_status(deployment(), {"desired": {"decode": 2}, "lastEvaluation": {"decode": NOW - 3}})
    groups = serving_decode(2)
    prom = Prom({g.name: 0.2 for g in groups["decode"]}, rate=0.5, inflight=30.0)
    assert due_queries(md, NOW) == []
    assert due_queries(md, NOW, urgent=True)
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom)
    assert out.decisions == [], "not due yet"
    out = autoscale(md, groups, healthy(groups), lambda _r: domains(400), NOW, prom, urgent=True)
    assert out.decisions
    assert out.status.last_evaluation["decode"] == NOW
    assert out.decisions[0][2].message.startswith("burst watch: "), "the early evaluation says why"
    soon = with_status(deployment(), {"desired": {"decode": 2}, "lastEvaluation": {"decode": NOW - 1}})
    assert due_queries(soon, NOW, urgent=True) == []


def test_the_controller_asks_one_query_per_prometheus_and_wakes_only_the_stepped():
    from tokenfab.controller import Controller

    asked: list[tuple[str, str]] = []

    def reader(url: str, query: str) -> tuple[dict[tuple[str, str], float] | None, str]:
        asked.append((url, query))
        if url == "http://down:9090":
            return None, "ConnectionError: refused"
        return {("ml", "a"): 14.0, ("ml", "b"): 1.0}, ""

    ctl = Controller(kube=None, fleet_reader=reader)  # type: ignore[arg-type]
    for name in ("a", "b", "c"):
        body = watched_body(QUIET, NOW - 5)
        body["metadata"] = {"name": name, "namespace": "ml", "uid": name}
        ctl.on_model_deployment("ADDED", body)
    off = watched_body(QUIET, NOW - 5)
    off["metadata"] = {"name": "off", "namespace": "ml", "uid": "off"}
    off["spec"]["autoscaling"]["enabled"] = False
    ctl.on_model_deployment("ADDED", off)
    elsewhere = watched_body(QUIET, NOW - 5)
    elsewhere["metadata"] = {"name": "a", "namespace": "other", "uid": "x"}
    elsewhere["spec"]["autoscaling"]["prometheusUrl"] = "http://down:9090"
    ctl.on_model_deployment("ADDED", elsewhere)
    while (queued := ctl.queue.get(timeout=0.01)) is not None:  # (each event queued its deployment)
        ctl.queue.done(queued)
    assert ctl.watch_bursts(NOW) == [("ml", "a")]
    assert sorted(u for u, _ in asked) == ["http://down:9090", "http://prometheus:9090"]
    assert all("dynamo_frontend_inflight_requests" in q for _, q in asked)
    assert ctl.ctx.urgent == {("ml", "a")}
    assert ctl.queue.get(timeout=0.1) == ("ml", "a")


def test_a_step_is_not_doubled_while_groups_are_on_their_way():
    """Once groups are on their way (or were just added) the step was acted on: what still rises is the
    backlog waiting for them, sized as it is (11 at 4.4 per group: 3), not doubled again at every decision
    (5)."""
    cfg = leading(max_step_up=8)
    samples, counted = kv_samples(1, 0.3)
    mem = Memory(inflight=((85.0, 1.0), (90.0, 2.0), (95.0, 1.0)), streams=4.0)
    first = decide(samples, counted, 0, 1, cfg, mem, 100.0, Demand(inflight=11.0))
    again = decide(samples, counted, 1, 1, cfg, mem, 100.0, Demand(inflight=11.0, starting=1))
    assert (first.desired, again.desired) == (5, 3), (first.message, again.message)
    # the same once the group just added serves but still warms up (Ready, not counted yet: warming 1)
    just = decide(samples, counted, 1, 1, cfg, mem, 100.0, Demand(inflight=11.0))
    assert just.desired == 3, just.message


def test_the_burst_watch_leaves_a_deployment_alone_while_its_new_groups_come():
    """A scale-up less than a startup time ago has groups on their way: no wake at every look while the
    backlog waiting for them grows (the evaluations at the interval size it); after that, a step wakes."""
    from tokenfab.planning.autoscaler import burst_watch
    from tokenfab.planning.status import rfc3339

    body = watched_body(QUIET, NOW - 5)
    body["status"]["autoscaling"]["startupSeconds"] = 20.0
    body["status"]["autoscaling"]["lastScaleTime"] = {"decode": rfc3339(NOW - 10)}
    assert not burst_watch(body, 14.0, NOW)
    body["status"]["autoscaling"]["lastScaleTime"] = {"decode": rfc3339(NOW - 25)}
    assert burst_watch(body, 14.0, NOW)


def test_an_urgent_pass_reads_exactly_what_it_evaluates_and_old_samples_are_no_level():
    """As a pass wires it: the queries `autoscaler.queries` names are all the step reads (a missing one
    would be a KeyError). Samples of the frontend from before a pause (two hours old) are no level to step up
    from: 14 in flight against them is no burst (decided from the cache, the rate and the level now)."""
    from testing.autoscaling import due_queries

    old = [[NOW - 7200 + i, 0.3, 0.0, 1.0] for i in range(0, 30, 5)]
    st = {"desired": {"decode": 2}, "lastEvaluation": {"decode": NOW - 3}, "arrivals": old}
    st["concurrency"] = {"decode": 4.0}
    md = with_status(deployment(), st)
    groups = serving_decode(2)
    prom = Prom({g.name: 0.2 for g in groups["decode"]}, rate=0.5, inflight=14.0)
    readings = {q: prom("", q) for q in due_queries(md, NOW, urgent=True)}
    out = autoscale(
        md, groups, healthy(groups), lambda _r: domains(400), NOW, lambda _u, q: readings[q], True
    )
    message = out.decisions[0][2].message
    assert message.startswith("burst watch: ")
    assert "rising" not in message, message


def test_only_the_leader_with_a_whole_view_looks_for_bursts():
    from tokenfab.controller import Controller

    asked: list[str] = []

    def reader(url: str, query: str) -> tuple[dict[tuple[str, str], float] | None, str]:
        asked.append(url)
        return {}, ""

    ctl = Controller(kube=None, fleet_reader=reader)  # type: ignore[arg-type]
    body = watched_body(QUIET, NOW - 5)
    body["metadata"] = {"name": "a", "namespace": "ml", "uid": "a"}
    ctl.on_model_deployment("ADDED", body)
    ctl.leading.clear()
    assert ctl.burst_look() == []
    assert asked == [], "a replica that does not lead asks nothing"
    ctl.leading.set()
    ctl.synced = lambda: True  # type: ignore[method-assign]
    ctl.burst_look()
    assert asked == ["http://prometheus:9090"]
