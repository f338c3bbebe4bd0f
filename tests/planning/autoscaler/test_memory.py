"""The autoscaler's memory in status and the reads it rests on, as they go wrong in a fleet: each case
here once moved groups, stopped autoscaling or failed every pass of a deployment.

- status is only memory: rows of the wrong shape, unreadable times, times from a clock that ran ahead
  are dropped (and relearned), never a failed pass or a frozen role;
- the startup time is learned once per group, and not from a group that waited for room;
- no data is no data: a failed read is not a zero in the arrival history, does not lower the frontend,
  is shown in MetricsUnavailable (the waiting requests too), and a window without samples (an outage, an
  operator that was down) does not let the first sample after it shed groups;
- a bound still moves the count when a leading read fails; a bad sample of a group that does not count
  does not freeze the role; a capacity-limited hold is not a scale;
- the recommendations kept in status stay bounded by the range of counts, not by window / interval.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testing.autoscaling import autoscale, due_queries, seconds_to_next
from tests.planning.autoscaler.test_leading import (
    NOW,
    Prom,
    conditions,
    deployment,
    domains,
    group,
    healthy,
    serving_decode,
    with_status,
)
from tokenfab.adapters.metrics import Reading
from tokenfab.planning.autoscaler import WARMING_BOUND_SECONDS
from tokenfab.planning.autoscaler.policy import prune


def run(md: Any, groups: Any, prom: Any, now: float = NOW, free: int = 400) -> Any:
    return autoscale(md, groups, healthy(groups), lambda _r: domains(free), now, prom)


def again(md: Any, out: Any) -> Any:
    """The deployment with the status a pass wrote (through JSON, as the API server keeps it)."""
    status = json.loads(json.dumps(out.status.model_dump(by_alias=True, exclude_none=True)))
    return with_status(md, status)


# ----------------------------------------------------------------------------------- status is memory


@pytest.mark.parametrize(
    "bad",
    [
        {"recommendations": {"decode": [[NOW - 10]]}},
        {"recommendations": {"decode": [[NOW - 10, 2, 0]]}},
        {"recommendations": {"decode": [[NOW - 10, -4]]}},
        {"lastScaleTime": {"decode": "yesterday"}},
        {"arrivals": [[NOW - 3, 0.5], [NOW - 2, -1.0, 3.0], [NOW - 1]]},
        {"capacity": {"decode": 0.0}, "concurrency": {"decode": -2.0}},
        {"capacity": {"decode": 1e-310}},
        {"startupSeconds": -5.0},
    ],
)
def test_a_malformed_memory_is_dropped_not_a_failed_pass(bad):
    md = with_status(deployment(), {"desired": {"decode": 2}, **bad})
    groups = serving_decode(2)
    out = run(md, groups, Prom({g.name: 0.99 for g in groups["decode"]}, rate=3.0))
    assert out.desired["decode"] > 2, out.decisions[0][2].message  # a saturated cache still scales up
    assert conditions(out)["MetricsUnavailable"][0] == "False"
    again(md, out)  # what it wrote reads back


def test_times_from_a_clock_that_ran_ahead_do_not_stop_autoscaling():
    ahead = NOW + 3600
    md = with_status(
        deployment({"scaleDownStabilizationSeconds": 300}),
        {
            "desired": {"decode": 8},
            "lastEvaluation": {"decode": ahead},
            "recommendations": {"decode": [[ahead, 8]]},
        },
    )
    assert due_queries(md, NOW), "an evaluation stamped in the future is due now"
    assert seconds_to_next(md, NOW) == 5.0
    groups = serving_decode(8)
    out = run(md, groups, Prom({g.name: 0.05 for g in groups["decode"]}, rate=None))
    # The future recommendation is no part of the window; the count seeds it (nothing observed yet).
    assert out.decisions[0][2].reason == "ScaleDownStabilizing", out.decisions[0][2].message
    assert all(t <= NOW for t, _ in out.status.recommendations["decode"])
    assert out.status.last_evaluation["decode"] == NOW


# ------------------------------------------------------------------------------------ startup learned


def test_the_startup_time_is_learned_once_per_group_not_on_every_pass():
    """A group Ready between two evaluations is one sample, taken at the next evaluation, however many
    passes (pod events, a resync) run in between."""
    md = with_status(deployment(), {"desired": {"decode": 2}, "startupSeconds": 60.0})
    starting = [
        group("m-decode-0", "decode", NOW - 3600, NOW - 3590),
        group("m-decode-1", "decode", NOW - 500, None),
    ]
    ready = [starting[0], group("m-decode-1", "decode", NOW - 500, NOW + 1)]
    prom = Prom({"m-decode-0": 0.7, "m-decode-1": 0.7})
    out = run(md, {"decode": starting}, prom)
    base = out.status.startup_seconds
    assert base == pytest.approx((60.0 + 10.0) / 2)  # the first evaluation learns the Ready group
    md = again(md, out)
    for dt in (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0):
        out = run(md, {"decode": ready}, prom, NOW + dt)
        md = again(md, out)
        expected = base if dt < 5 else (base + 501.0) / 2
        assert out.status.startup_seconds == pytest.approx(expected, abs=0.1), dt


def test_a_group_that_waited_for_room_is_no_startup_sample():
    waited = WARMING_BOUND_SECONDS + 5400
    groups = {"decode": [group("m-decode-0", "decode", NOW - waited, NOW - 1)]}
    md = with_status(deployment(), {"desired": {"decode": 1}, "startupSeconds": 60.0})
    out = run(md, groups, Prom({"m-decode-0": 0.7}))
    assert out.status.startup_seconds == 60.0


# --------------------------------------------------------------------------------- no data is no data


class Failing(Prom):
    """Prom with chosen queries failing (by a word of the query)."""

    def __init__(self, kv: dict[str, float], failing: tuple[str, ...], **kw: Any) -> None:
        super().__init__(kv, **kw)
        self.failing = failing

    def __call__(self, url: str, query: str) -> Reading:
        if any(word in query for word in self.failing):
            self.asked.append(query)
            return Reading(None, "TimeoutError: read timed out", query)
        return super().__call__(url, query)


def test_a_failed_arrival_read_is_no_sample_and_does_not_lower_the_frontend():
    patch = {"frontend": {"minReplicas": 1, "maxReplicas": 8, "requestsPerSecondPerReplica": 10}}
    md = with_status(
        deployment(patch),
        {
            "desired": {"decode": 2},
            "frontendReplicas": 6,
            "arrivals": [[NOW - 10, 55.0, 1000.0], [NOW - 5, 55.0, 1000.0]],
        },
    )
    groups = serving_decode(2)
    kv = {g.name: 0.7 for g in groups["decode"]}
    for failing in (("requests_started",), ("input_sequence_tokens",)):
        out = run(md, groups, Failing(kv, failing, rate=55.0))
        assert out.frontend_replicas == 6, failing
        assert [x[0] for x in out.status.arrivals] == [NOW - 10, NOW - 5], "no made-up zero"
        assert conditions(out)["MetricsUnavailable"][0] == "True"
    # with both reads the count follows the ingress (down, as the window is 0 s here)
    out = run(md, groups, Prom(kv, rate=15.0))
    assert out.frontend_replicas == 2


def test_a_failed_waiting_read_is_shown():
    md = with_status(deployment(), {"desired": {"decode": 2}})
    groups = serving_decode(2)
    out = run(md, groups, Failing({g.name: 0.7 for g in groups["decode"]}, ("num_requests_waiting",)))
    status, _, message = conditions(out)["MetricsUnavailable"]
    assert status == "True"
    assert "decode: waiting requests: TimeoutError" in message


def test_after_an_outage_longer_than_the_window_a_scale_down_still_waits_a_window():
    md = with_status(
        deployment({"scaleDownStabilizationSeconds": 120}),
        {"desired": {"decode": 8}, "recommendations": {"decode": [[NOW - 130, 8]]}},
    )
    groups = serving_decode(8)
    low = {g.name: 0.05 for g in groups["decode"]}
    now = NOW
    for _ in range(72):  # six minutes of failed KV reads, an evaluation every 5 s
        out = run(md, groups, Prom(None), now)
        assert out.desired["decode"] == 8
        md, now = again(md, out), now + 5
    out = run(md, groups, Prom(low, rate=None), now)
    assert out.desired["decode"] == 8, out.decisions[0][2].message
    assert out.decisions[0][2].reason == "ScaleDownStabilizing"
    # a whole window of fresh samples later it goes down
    md = again(md, out)
    for _ in range(25):
        now += 5
        out = run(md, groups, Prom(low, rate=None), now)
        md = again(md, out)
    assert out.desired["decode"] < 8


def test_after_the_operator_was_down_a_scale_down_still_waits_a_window():
    md = with_status(
        deployment({"scaleDownStabilizationSeconds": 120}),
        {
            "desired": {"decode": 8},
            "lastEvaluation": {"decode": NOW - 3600},
            "recommendations": {"decode": [[NOW - 3600, 8]]},
        },
    )
    groups = serving_decode(8)
    out = run(md, groups, Prom({g.name: 0.05 for g in groups["decode"]}, rate=None))
    assert out.desired["decode"] == 8
    assert out.decisions[0][2].reason == "ScaleDownStabilizing"


# -------------------------------------------------------------------------------------- the decision


def test_a_lowered_max_applies_even_when_a_leading_read_fails():
    md = with_status(
        deployment({"decode": {"minReplicas": 1, "maxReplicas": 3}}),
        {"desired": {"decode": 5}, "recommendations": {"decode": [[NOW - 100, 5]]}},
    )
    groups = serving_decode(5)
    out = run(md, groups, Prom({g.name: 0.3 for g in groups["decode"]}, fail_rate=True))
    assert out.desired["decode"] == 3, out.decisions[0][2].message


def test_a_bad_sample_of_a_group_that_does_not_count_does_not_freeze_the_role():
    md = with_status(deployment(), {"desired": {"decode": 3}})
    groups = serving_decode(3)
    groups["decode"].append(group("m-decode-3", "decode", NOW - 20, None))  # warming
    kv = {g.name: 1.0 for g in groups["decode"][:3]} | {"m-decode-3": 1.02}
    out = run(md, groups, Prom(kv, rate=None))
    assert out.desired["decode"] > 3, out.decisions[0][2].message
    assert conditions(out)["MetricsUnavailable"][0] == "False"


def test_a_capacity_limited_hold_is_not_a_scale():
    before = "2026-11-01T00:00:00Z"
    md = with_status(deployment(), {"desired": {"decode": 2}, "lastScaleTime": {"decode": before}})
    groups = serving_decode(2)
    out = run(md, groups, Prom({g.name: 0.99 for g in groups["decode"]}), free=0)
    assert out.desired["decode"] == 2
    assert out.decisions[0][2].reason == "CapacityLimited"
    assert out.status.last_scale_time["decode"] == before


# ----------------------------------------------------------------------------------- bounded memory


def test_recommendations_stay_bounded_over_a_long_window():
    md = with_status(
        deployment({"scaleDownStabilizationSeconds": 86400, "decode": {"minReplicas": 1, "maxReplicas": 8}}),
        {"desired": {"decode": 4}},
    )
    groups = serving_decode(4)
    rnd = random.Random(7)
    now = NOW
    for _ in range(2000):  # 10,000 s of noisy samples every 5 s
        kv = {g.name: min(1.0, max(0.0, rnd.gauss(0.6, 0.2))) for g in groups["decode"]}
        out = run(md, groups, Prom(kv, rate=None), now)
        md, now = again(md, out), now + 5
        assert len(out.status.recommendations["decode"]) <= 2 * 8 + 2


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=60),
    st.floats(0, 300),
    st.floats(0, 300),
)
def test_pruning_keeps_every_window_maximum_and_minimum(counts, down, up):
    entries = tuple((float(i * 5), n) for i, n in enumerate(counts))
    kept = prune(entries)
    now = entries[-1][0]
    for w in (down, up):
        full = [n for t, n in entries if now - t <= w]
        short = [n for t, n in kept if now - t <= w]
        assert (max(full), min(full)) == (max(short), min(short))
    assert len(kept) <= 2 * len(set(counts))


def test_an_unreachable_prometheus_costs_a_pass_one_timeout():
    """Once a read finds no Prometheus, the pass's other reads fail at once with the same words (each
    would wait out the same timeout), and the deployment holds with MetricsUnavailable."""
    from tokenfab.adapters.metrics import one_timeout_per_pass

    asked: list[str] = []

    def dead(_url: str, query: str) -> Reading:
        asked.append(query)
        return Reading(None, "ConnectTimeout: timed out after 5 s", query)

    read = one_timeout_per_pass(dead)
    first, second = read("http://p", "a"), read("http://p", "b")
    assert asked == ["a"]
    assert second.error == first.error
    assert second.query == "b"
    # a bad query is no outage: the next read is asked
    bad: list[str] = []

    def refusing(_url: str, query: str) -> Reading:
        bad.append(query)
        return Reading(None, "PrometheusApiClientException: HTTP 400: parse error", query)

    read = one_timeout_per_pass(refusing)
    read("http://p", "a")
    read("http://p", "b")
    assert bad == ["a", "b"]
    md = with_status(
        deployment({"frontend": {"minReplicas": 1, "maxReplicas": 4}}), {"desired": {"decode": 2}}
    )
    groups = serving_decode(2)
    asked.clear()
    out = run(md, groups, one_timeout_per_pass(dead))  # as reconcile reads before the ledger
    assert len(asked) == 1
    assert out.desired["decode"] == 2
    assert "ConnectTimeout" in conditions(out)["MetricsUnavailable"][2]
