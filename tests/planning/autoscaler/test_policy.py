"""The pure autoscaling policy `tokenfab.planning.autoscaler.policy.decide` and the prefill:decode coupling.

Table-driven cases of single decisions (spikes, noise around the target, missing, stale and partial
data, warming groups, step caps, bounds), sequences stepped through time with the policy's memory carried
from one decision to the next (a slow ramp, the scale-down and scale-up stabilization windows), the
fixed and independent ratio policies with autoscaler-chosen decode counts, and Hypothesis properties:
the decision stays within the bounds, missing or stale data never lowers the count, a constant signal
converges without reversing direction, and the same inputs give the same decision.

Unless a case says otherwise the settings are the operator's defaults (`models.Autoscaling()`: target
0.7, tolerance 0.1, steps +2/-1, no scale-up window, 300 s scale-down window, samples stale after 60 s)
with bounds 1..16, built the way `tokenfab.planning.autoscaler` builds them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfab.api.models import Autoscaling
from tokenfab.planning.autoscaler.policy import (
    Config,
    Decision,
    Memory,
    Sample,
    config_for,
    decide,
    initial_groups,
)

DEFAULTS = Autoscaling()
INTERVAL = float(DEFAULTS.interval_seconds)


def config(**overrides: Any) -> Config:
    """The operator's default policy settings with bounds 1..16 (as the autoscaler builds them)."""
    base = config_for(DEFAULTS, 1, 16)
    return replace(base, **overrides)


def test_the_defaults_are_what_the_cases_assume():
    cfg = config()
    assert (cfg.target, cfg.tolerance, cfg.max_step_up, cfg.max_step_down) == (0.7, 0.1, 2, 1)
    assert (cfg.up_window, cfg.down_window, cfg.stale_after, DEFAULTS.interval_seconds) == (0, 300, 60, 15)


# ------------------------------------------------------------------------------------ single decisions


@dataclass(frozen=True)
class Case:
    """One decision: `ready` are the samples of the groups that count (ready and warm), `warming` the
    samples of groups that exist but still warm up (None: no sample at all). `current` defaults to
    ready + warming groups."""

    id: str
    ready: tuple[float | None, ...]
    expect: int
    reason: str
    warming: tuple[float | None, ...] = ()
    current: int | None = None
    age: float = 0.0
    stale: tuple[int, ...] = ()  # indexes of ready groups whose sample is older than stale_after
    cfg: dict[str, Any] | None = None
    metrics_ok: bool = True


def run_case(case: Case, memory: Memory | None = None, now: float = 1000.0) -> Decision:
    samples: dict[str, Sample] = {}
    counted = set()
    for i, v in enumerate(case.ready):
        counted.add(f"r{i}")
        if v is not None:
            samples[f"r{i}"] = Sample(v, 600.0 if i in case.stale else case.age)
    for i, v in enumerate(case.warming):
        if v is not None:
            samples[f"w{i}"] = Sample(v, 0.0)
    current = len(case.ready) + len(case.warming) if case.current is None else case.current
    cfg = config(**(case.cfg or {}))
    return decide(samples, counted, len(case.warming), current, cfg, memory or Memory(), now)


CASES = [
    # spikes: proportional, capped by the step
    Case("spike 4 saturated -> ceil(4/0.7)=6", (1.0,) * 4, 6, "ScaleUp"),
    Case("spike 2 saturated -> 3", (1.0, 1.0), 3, "ScaleUp"),
    Case("spike 8 saturated wants 12, max step +2", (1.0,) * 8, 10, "ScaleUp"),
    Case("spike with maxStepUp 8", (1.0,) * 8, 12, "ScaleUp", cfg={"max_step_up": 8}),
    Case("spike hits max 16", (1.0,) * 15, 16, "ScaleUp"),
    Case("spike at max stays at max", (1.0,) * 16, 16, "WithinTolerance"),
    Case("just above the band: 1.114 x target", (0.78,) * 4, 5, "ScaleUp"),
    # noise around the target: nothing moves
    Case("noise around target", (0.66, 0.74, 0.70, 0.72), 4, "WithinTolerance"),
    Case("lower edge of the band", (0.64,) * 4, 4, "WithinTolerance"),
    Case("upper edge of the band", (0.76,) * 4, 4, "WithinTolerance"),
    Case("exact target", (0.7,) * 3, 3, "WithinTolerance"),
    # scale-down: one step per decision, never below min
    Case("low use, no memory: one step down", (0.2,) * 4, 3, "ScaleDown"),
    Case("idle 8 groups: max step -1", (0.05,) * 8, 7, "ScaleDown"),
    Case("idle with maxStepDown 4", (0.05,) * 8, 4, "ScaleDown", cfg={"max_step_down": 4}),
    Case("zero use -> min", (0.0,) * 3, 2, "ScaleDown"),
    Case("at min stays", (0.05,), 1, "WithinTolerance"),
    Case("min 2 holds", (0.05, 0.05), 2, "WithinTolerance", cfg={"min_groups": 2}),
    # missing and stale data: hold, say so
    Case("no samples for the ready groups", (None, None, None), 3, "MetricsUnavailable", metrics_ok=False),
    Case("all samples stale", (0.1,) * 3, 3, "MetricsUnavailable", age=120.0, metrics_ok=False),
    Case("stale but high", (1.0,) * 3, 3, "MetricsUnavailable", age=61.0, metrics_ok=False),
    Case("60 s old is still fresh", (0.1,) * 3, 2, "ScaleDown", age=60.0),
    Case(
        "samples only from warming groups",
        (None, None),
        2,
        "MetricsUnavailable",
        warming=(0.01,),
        current=2,
        metrics_ok=False,
    ),
    Case("nothing warm yet", (), 2, "Warming", warming=(0.0, 0.01)),
    # partial data: some ready groups without a fresh sample never allow a scale-down
    Case("1 of 4 fresh, low", (0.1, None, None, None), 4, "MetricsIncomplete", metrics_ok=False),
    Case("1 of 4 fresh, high", (0.95, None, None, None), 4, "MetricsIncomplete", metrics_ok=False),
    Case("1 of 4 stale, low", (0.1,) * 4, 4, "MetricsIncomplete", stale=(3,), metrics_ok=False),
    Case(
        "3 of 4 fresh, high: up on what was measured", (0.95,) * 3 + (None,), 5, "ScaleUp", metrics_ok=False
    ),
    # warming groups: left out of the mean, no scale-down while they warm, no runaway scale-up
    Case("warming near-zero does not lower the mean", (0.7, 0.7), 3, "WithinTolerance", warming=(0.01,)),
    Case("warming blocks scale-down", (0.2, 0.2), 3, "Warming", warming=(0.0,)),
    Case("warming without a sample blocks scale-down", (0.2, 0.2), 3, "Warming", warming=(None,)),
    Case("saturated with 2 warming: no more groups", (0.95, 0.95), 4, "Warming", warming=(0.01, 0.02)),
    Case("saturated with 1 warming: what is still missing", (1.0, 1.0, 1.0), 5, "ScaleUp", warming=(0.0,)),
    # bounds
    Case("above max, in tolerance -> max", (0.7,) * 3, 16, "OutOfBounds", current=20),
    Case("above max and saturated -> max", (1.0,) * 3, 16, "OutOfBounds", current=20),
    Case("above max while warming -> max", (0.7,) * 3, 16, "OutOfBounds", warming=(0.0,), current=20),
    Case("above max, no samples -> max", (None,) * 3, 16, "OutOfBounds", current=20, metrics_ok=False),
    Case("below min -> raised to min", (0.7,), 2, "ScaleUp", cfg={"min_groups": 2}),
    Case("below min, idle -> raised to min", (0.0,), 3, "ScaleUp", cfg={"min_groups": 3}),
    # prefill on queue depth (ratioPolicy independent): the same policy, target 4 waiting requests
    Case("queue 20 per group -> +2", (20.0, 20.0), 4, "ScaleUp", cfg={"target": 4.0, "utilization": False}),
    Case(
        "queue around 4 holds",
        (3.8, 4.3, 4.0),
        3,
        "WithinTolerance",
        cfg={"target": 4.0, "utilization": False},
    ),
    Case("empty queues -> -1", (0.0, 0.0, 0.0), 2, "ScaleDown", cfg={"target": 4.0, "utilization": False}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision(case: Case):
    d = run_case(case)
    assert (d.desired, d.reason, d.metrics_ok) == (case.expect, case.reason, case.metrics_ok), d.message
    assert d.current == (len(case.ready) + len(case.warming) if case.current is None else case.current)
    if not case.metrics_ok:
        assert d.message


def test_missing_data_is_not_a_scale_down():
    d = decide(None, {"r0", "r1", "r2"}, 0, 3, config(), Memory(), 0.0)
    assert (d.desired, d.reason, d.metrics_ok, d.signal) == (3, "MetricsUnavailable", False, None)
    assert "query failed" in d.message


def test_stale_and_missing_are_told_apart():
    counted = {"r0", "r1"}
    stale = decide({g: Sample(0.1, 300.0) for g in counted}, counted, 0, 2, config(), Memory(), 0.0)
    missing = decide({"w0": Sample(0.1, 0.0)}, counted, 1, 3, config(), Memory(), 0.0)
    assert "stale" in stale.message
    assert "missing" in missing.message


def test_a_warming_group_is_left_out_of_the_mean():
    counted = {"r0", "r1"}
    samples = {"r0": Sample(0.6, 0.0), "r1": Sample(0.8, 0.0), "w0": Sample(0.0, 0.0)}
    d = decide(samples, counted, 1, 3, config(), Memory(), 0.0)
    assert d.signal == pytest.approx(0.7)
    assert d.desired == 3


def test_partial_data_is_reported_in_the_message():
    counted = {"r0", "r1", "r2", "r3"}
    d = decide({"r0": Sample(0.1, 0.0)}, counted, 0, 4, config(), Memory(), 0.0)
    assert "no fresh sample from 3 of 4 ready group(s): no scale-down" in d.message


def test_memory_is_handed_back_and_pruned():
    old = Memory(recommendations=((0.0, 9), (650.0, 5), (700.0, 4)), last_scale_time=5.0)
    d = decide({"r0": Sample(0.7, 0.0)}, {"r0"}, 0, 1, config(), old, 1000.0)
    assert d.memory.recommendations == ((700.0, 4), (1000.0, 1)), "older than the 300 s window: dropped"
    assert d.memory.last_scale_time == 5.0, "no change: the last scale time stays"
    up = decide({"r0": Sample(1.0, 0.0)}, {"r0"}, 0, 1, config(), old, 1000.0)
    assert up.memory.last_scale_time == 1000.0


def test_initial_groups_is_the_spec_within_bounds():
    assert initial_groups(None, config(min_groups=2)) == 2
    assert initial_groups(5, config()) == 5
    assert initial_groups(40, config()) == 16
    assert initial_groups(0, config(min_groups=1)) == 1


# ------------------------------------------------------------------------------ sequences through time


def fleet_samples(n: int, value: float, age: float = 0.0) -> tuple[dict[str, Sample], set[str]]:
    return {f"g{i}": Sample(value, age) for i in range(n)}, {f"g{i}" for i in range(n)}


def drive(
    load: list[float], start: int, cfg: Config, memory: Memory | None = None, t0: float = 0.0
) -> tuple[list[Decision], Memory]:
    """One decision per interval on an offered load (in groups' worth at 100%); groups count at once
    and share the load evenly; utilization saturates at 1."""
    current, mem, out = start, memory or Memory(), []
    for k, x in enumerate(load):
        samples, counted = fleet_samples(current, min(1.0, x / current) if current else 0.0)
        d = decide(samples, counted, 0, current, cfg, mem, t0 + k * INTERVAL)
        out.append(d)
        current, mem = d.desired, d.memory
    return out, mem


def test_slow_ramp_steps_up_one_decision_at_a_time():
    load = [1.0 + 0.02 * k for k in range(240)]  # 1.0 -> 5.8 groups' worth over an hour
    decisions, _ = drive(load, 2, config())
    counts = [d.desired for d in decisions]
    assert all(b_ >= a for a, b_ in itertools.pairwise(counts)), "a ramp never scales down"
    assert all(b_ - a <= 2 for a, b_ in zip([2, *counts], counts, strict=False))
    assert counts[-1] == math.ceil(load[-1] / 0.7) or abs(load[-1] / counts[-1] / 0.7 - 1) <= 0.1
    assert {d.reason for d in decisions} <= {"ScaleUp", "WithinTolerance"}
    for d in decisions:  # each utilization it acted on was outside the band
        if d.reason == "ScaleUp":
            assert d.signal is not None
            assert d.signal / 0.7 > 1.1 - 1e-9


def test_spike_then_quiet_scales_up_at_once_and_down_only_after_the_window():
    load = [2.8] * 4 + [8.0] * 20 + [1.0] * 80
    decisions, _ = drive(load, 4, config())
    counts = [d.desired for d in decisions]
    assert counts[:4] == [4, 4, 4, 4]
    assert counts[4:8] == [6, 8, 10, 12], "+2 per decision while saturated"
    spike_end = 24
    assert max(counts) == 12
    # the quiet starts at decision 24; the last recommendation of 12 was made at decision 23
    last_high = max(k for k, d in enumerate(decisions) if d.recommendation == 12)
    window_end = last_high + int(300 / INTERVAL)
    assert all(c == 12 for c in counts[spike_end : window_end + 1]), "no scale-down inside the window"
    assert {decisions[k].reason for k in range(spike_end, window_end + 1)} == {"ScaleDownStabilizing"}
    after = counts[window_end + 1 :]
    assert after[:4] == [11, 10, 9, 8], "after the window: one step per decision, not one per window"
    assert after[-1] == 2, "ends at ceil(1.0 / 0.7)"


def test_the_highest_recommendation_in_the_window_wins():
    mem = Memory(recommendations=((0.0, 10), (100.0, 6), (200.0, 4)))
    cfg = config(max_step_down=9)
    samples, counted = fleet_samples(10, 0.05)
    at = {now: decide(samples, counted, 0, 10, cfg, mem, now) for now in (250.0, 300.0, 301.0, 401.0, 501.0)}
    assert (at[250.0].desired, at[250.0].reason) == (10, "ScaleDownStabilizing")
    assert at[300.0].desired == 10, "300 s old is still inside the window"
    assert at[301.0].desired == 6, "the 10 left the window: the highest left is 6"
    assert at[401.0].desired == 4
    assert at[501.0].desired == 1


def test_scale_down_waits_for_a_window_of_low_recommendations():
    cfg = config()
    quiet_at = 1000.0
    _, mem = drive([4.9] * 10, 7, cfg, t0=quiet_at - 10 * INTERVAL)  # 7 groups at 0.7: holding
    decisions, _ = drive([1.0] * 40, 7, cfg, mem, t0=quiet_at)
    counts = [d.desired for d in decisions]
    first_down = next(k for k, c in enumerate(counts) if c < 7)
    # the last recommendation of 7 was made at quiet_at - 15: it leaves the window after quiet_at + 285
    assert first_down == 20, "the first decision after the window passed"
    assert counts[first_down : first_down + 5] == [6, 5, 4, 3, 2]


def test_scale_up_stabilization_window():
    cfg = config(up_window=30.0)
    mem = Memory(recommendations=((-15.0, 4),))  # 15 s ago the recommendation was to hold at 4
    samples, counted = fleet_samples(4, 1.0)
    d0 = decide(samples, counted, 0, 4, cfg, mem, 0.0)
    assert (d0.desired, d0.reason, d0.recommendation) == (4, "ScaleUpStabilizing", 6)
    d1 = decide(samples, counted, 0, 4, cfg, d0.memory, 15.0)
    assert d1.desired == 4, "the 4 is 30 s old: still in the window"
    d2 = decide(samples, counted, 0, 4, cfg, d1.memory, 30.0)
    assert (d2.desired, d2.reason) == (6, "ScaleUp"), "every recommendation in the last 30 s said 6"
    # with the default (no window) the same spike scales up at once, whatever came before
    d = decide(samples, counted, 0, 4, config(), mem, 0.0)
    assert (d.desired, d.reason) == (6, "ScaleUp")


def test_warming_groups_neither_scale_up_nor_down_through_a_burst():
    """3 groups' worth of load on 2 groups (saturated): +1 (ceil(2 / 0.7) = 3); while the new group
    warms, reporting near zero, nothing moves; once it counts the 3 are still saturated: +2; while those
    2 warm the near-zero samples would pull the mean to 0.6 and invite a scale-down, but nothing moves;
    then 5 groups at 0.6 hold."""
    cfg = config()
    warm_after = 8  # decisions (2 minutes)
    created: dict[str, int] = {"g0": -100, "g1": -100}
    load, mem, history = 3.0, Memory(), []
    for k in range(30):
        now = k * INTERVAL
        counted = {g for g, c in created.items() if k - c >= warm_after}
        per = min(1.0, load / len(counted))  # KV-cache use saturates
        samples = {g: Sample(per if g in counted else 0.01, 0.0) for g in created}
        d = decide(samples, counted, len(created) - len(counted), len(created), cfg, mem, now)
        history.append((k, d.desired, d.reason))
        mem = d.memory
        for i in range(len(created), d.desired):
            created[f"g{i}"] = k
        for g in sorted(created, key=lambda g: -created[g])[: max(0, len(created) - d.desired)]:
            del created[g]
    counts = [n for _, n, _ in history]
    assert counts[0] == 3, "2 groups at 1.0 -> ceil(2 / 0.7) = 3"
    assert counts[1:warm_after] == [3] * (warm_after - 1), "no more scale-up on the warming group"
    assert counts[warm_after] == 5, "3 saturated groups -> ceil(3 / 0.7) = 5"
    assert counts[warm_after + 1 : 2 * warm_after] == [5] * (warm_after - 1)
    assert {r for k, _, r in history if warm_after < k < 2 * warm_after} == {"WithinTolerance"}
    assert counts[2 * warm_after :] == [5] * (30 - 2 * warm_after), "5 groups at 0.6 hold"


# ------------------------------------------------------------------------------------------ properties

PROPS = settings(max_examples=300, deadline=None, database=None)


@st.composite
def configs(draw) -> Config:
    lo = draw(st.integers(0, 6))
    hi = draw(st.integers(max(lo, 1), 20))
    target = draw(st.sampled_from([0.5, 0.7, 0.85, 1.0, 4.0]))
    return Config(
        target=target,
        utilization=target <= 1,  # KV-cache utilization, or (prefill) waiting requests
        min_groups=lo,
        max_groups=hi,
        tolerance=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
        max_step_up=draw(st.integers(1, 6)),
        max_step_down=draw(st.integers(1, 6)),
        up_window=draw(st.sampled_from([0.0, 15.0, 60.0])),
        down_window=draw(st.sampled_from([0.0, 60.0, 300.0])),
        stale_after=60.0,
    )


@st.composite
def situations(draw):
    """Random but consistent inputs: groups that count (some may lack a sample or have a stale one),
    warming groups (some reporting near zero), a remembered history and the current count."""
    cfg = draw(configs())
    n_counted = draw(st.integers(0, 12))
    n_warming = draw(st.integers(0, 4))
    value = st.floats(0.0, 1.0) if cfg.target <= 1 else st.floats(0.0, 40.0)
    samples: dict[str, Sample] = {}
    counted = set()
    for i in range(n_counted):
        counted.add(f"r{i}")
        kind = draw(st.sampled_from(["fresh", "fresh", "fresh", "stale", "none"]))
        if kind != "none":
            samples[f"r{i}"] = Sample(draw(value), 0.0 if kind == "fresh" else draw(st.floats(61.0, 900.0)))
    for i in range(n_warming):
        if draw(st.booleans()):
            samples[f"w{i}"] = Sample(draw(st.floats(0.0, 0.05)), 0.0)
    now = 10_000.0
    history = draw(
        st.lists(
            st.tuples(st.floats(now - 400.0, now), st.integers(cfg.min_groups, cfg.max_groups)), max_size=8
        )
    )
    memory = Memory(recommendations=tuple(sorted(history)))
    current = draw(st.integers(0, 24))
    return cfg, samples, counted, n_warming, current, memory, now


@PROPS
@given(situations())
def test_property_the_decision_is_within_the_bounds(s):
    cfg, samples, counted, warming, current, memory, now = s
    d = decide(samples, counted, warming, current, cfg, memory, now)
    assert cfg.min_groups <= d.desired <= cfg.max_groups
    if cfg.min_groups <= current <= cfg.max_groups:
        assert current - cfg.max_step_down <= d.desired <= current + cfg.max_step_up
    assert all(cfg.min_groups <= n <= cfg.max_groups for _, n in d.memory.recommendations)


@PROPS
@given(situations(), st.booleans())
def test_property_missing_or_stale_data_never_scales_down(s, query_failed):
    cfg, samples, counted, warming, current, memory, now = s
    if query_failed:
        samples = None
    else:
        samples = {g: Sample(v.value, cfg.stale_after + 1.0) for g, v in samples.items()}
    d = decide(samples, counted, warming, current, cfg, memory, now)
    assert d.desired == max(cfg.min_groups, min(cfg.max_groups, current)), "hold (within the bounds)"
    if current <= cfg.max_groups:
        assert d.desired >= current
    assert d.metrics_ok is (not query_failed and not counted)  # no group to ask is not missing data


@PROPS
@given(situations())
def test_property_partial_data_or_warming_groups_never_scale_down(s):
    cfg, samples, counted, warming, current, memory, now = s
    fresh = {g for g in counted if g in samples and samples[g].age_seconds <= cfg.stale_after}
    d = decide(samples, counted, warming, current, cfg, memory, now)
    if (warming or fresh != counted) and current <= cfg.max_groups:
        assert d.desired >= current, d.message
    assert d.metrics_ok is (fresh == counted)


@PROPS
@given(situations())
def test_property_deterministic(s):
    cfg, samples, counted, warming, current, memory, now = s
    a = decide(dict(samples), set(counted), warming, current, cfg, memory, now)
    b_ = decide(dict(samples), set(counted), warming, current, cfg, memory, now)
    assert a == b_


def changes(counts: list[int], start: int) -> list[int]:
    return [b_ - a for a, b_ in zip([start, *counts], counts, strict=False) if b_ != a]


@PROPS
@given(configs(), st.floats(0.0, 1.0), st.integers(0, 24))
def test_property_a_constant_per_group_signal_never_reverses(cfg, value, start):
    """Every group reports the same value, step after step (memory carried, time advancing)."""
    value = value * (cfg.target * 1.5 if cfg.target > 1 else 1.0)
    current, mem, counts = start, Memory(), []
    for k in range(200):
        samples, counted = fleet_samples(current, value)
        d = decide(samples, counted, 0, current, cfg, mem, k * INTERVAL)
        counts.append(d.desired)
        current, mem = d.desired, d.memory
    steps = changes(counts, start)
    assert all(c > 0 for c in steps) or all(c < 0 for c in steps), f"reversal: {counts}"
    assert len(set(counts[-5:])) == 1, f"did not converge: {counts}"


@PROPS
@given(configs(), st.floats(0.05, 30.0), st.integers(1, 24), st.integers(0, 12))
def test_property_a_constant_load_converges_without_reversing(cfg, load, start, warmup_steps):
    """A constant offered load shared by the groups that serve (utilization saturates at 1). New
    groups warm up for `warmup_steps` decisions, reporting near zero and serving nothing meanwhile."""
    if cfg.target > 1:
        cfg = replace(cfg, target=0.7)
    created = [-10_000] * start
    mem, counts = Memory(), []
    for k in range(250):
        warm = [i for i, c in enumerate(created) if k - c >= warmup_steps]
        per = min(1.0, load / len(warm)) if warm else 0.0
        samples = {f"g{i}": Sample(per if i in warm else 0.01, 0.0) for i in range(len(created))}
        counted = {f"g{i}" for i in warm}
        d = decide(samples, counted, len(created) - len(warm), len(created), cfg, mem, k * INTERVAL)
        counts.append(d.desired)
        mem = d.memory
        if d.desired > len(created):
            created += [k] * (d.desired - len(created))
        else:
            created = sorted(created)[: d.desired]  # the newest go first
    steps = changes(counts, start)
    assert all(c > 0 for c in steps) or all(c < 0 for c in steps), f"reversal: {counts}"
    assert len(set(counts[-5:])) == 1, f"did not converge: {counts}"
