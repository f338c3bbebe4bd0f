"""The contestants' decisions (e2e/fleet/contestants.py), alone: HPA's algorithm, KEDA's AverageValue rule,
HPA's default stabilization, and the bounding oracle's lead and hold."""

from __future__ import annotations

import pytest

from e2e.fleet import contestants as c
from e2e.fleet import load
from e2e.fleet.config import Config, ci_config

pytestmark = pytest.mark.unit


def test_hpa_scales_by_the_ratio_to_its_target_and_holds_within_the_tolerance():
    assert c.hpa_recommend(2, [0.9, 0.9], 0.6) == 3  # ceil(2 x 1.5)
    assert c.hpa_recommend(4, [0.1, 0.1, 0.2, 0.2], 0.6) == 1  # ceil(4 x 0.25)
    assert c.hpa_recommend(2, [0.64, 0.64], 0.6) == 2  # ratio 1.067: within 10%
    assert c.hpa_recommend(2, [0.55, 0.55], 0.6) == 2  # 0.917: within 10%
    assert c.hpa_recommend(3, [], 0.6) == 3  # nothing reported: no change


def test_hpa_counts_pods_not_reporting_yet_against_the_move():
    # Scale up: the two new groups count as 0 -> mean 0.45 / 0.6 = 0.75: the direction turns, no change.
    assert c.hpa_recommend(4, [0.9, 0.9], 0.6, missing=2) == 4
    # Still above with them at 0: ceil(1.2 x 3) = 4.
    assert c.hpa_recommend(3, [1.0, 1.0], 0.6, missing=1) == 4
    # Scale down: missing count as the target: (0.1 + 0.6) / 2 / 0.6 = 0.58 -> ceil(1.17) = 2.
    assert c.hpa_recommend(2, [0.1], 0.6, missing=1) == 2


def test_keda_average_value_is_the_total_over_the_target_per_replica():
    assert c.keda_recommend(1, 10.0, 3.0) == 4
    assert c.keda_recommend(4, 2.0, 3.0) == 1
    assert c.keda_recommend(3, 9.5, 3.0) == 3  # 9.5 / 9 = 1.056: within 10%
    assert c.keda_recommend(2, 0.0, 3.0) == 0  # (the controller keeps at least one)


def test_hpa_stabilization_scales_down_only_to_the_highest_recent_recommendation():
    s = c.Stabilizer(down_s=300, up_pods=4)
    assert s(0.0, 1, 4) == 4  # up at once
    assert s(15.0, 4, 1) == 4  # 4 was recommended within 300 s
    assert s(200.0, 4, 2) == 4
    assert s(301.0, 4, 1) == 2  # the 4 aged out; 2 (at 200 s) is the highest left
    assert s(501.0, 2, 1) == 1
    # up by at most max(current, 4) pods per sync
    assert c.Stabilizer(up_pods=4)(0.0, 10, 40) == 20


TRACE = [load.Point(0, 0.3), load.Point(20, 0.3), load.Point(20.01, 2.0), load.Point(80, 2.0),
         load.Point(80.01, 0.3), load.Point(200, 0.3)]  # fmt: skip


def test_the_bounding_oracle_has_its_groups_one_lead_before_the_trace_needs_them():
    # 2.0 requests/s at 0.5 per group: 4 groups from 20 s; asked for `lead` earlier.
    assert c.need(TRACE, 10, 0.5, 4) == 1
    assert c.need(TRACE, 30, 0.5, 4) == 4
    assert c.bounding_want(TRACE, 0.0, 1, lead_s=19.0, hold_s=0.0, per_group_qps=0.5, most=4) == 1
    assert c.bounding_want(TRACE, 1.5, 1, lead_s=19.0, hold_s=0.0, per_group_qps=0.5, most=4) == 4
    # It never holds fewer than the trace needs at any time it covers.
    for t in range(0, 200):
        want = c.bounding_want(TRACE, float(t), 4, 19.0, 0.0, 0.5, 4)
        assert want >= c.need(TRACE, float(t), 0.5, 4)


def test_the_bounding_oracle_holds_through_a_gap_shorter_than_a_start_time_plus_the_window():
    p = load.Point
    gap = [p(0, 2.0), p(30, 2.0), p(30.01, 0.3), p(70, 0.3), p(70.01, 2.0), p(100, 2.0), p(100.01, 0.3),
           p(300, 0.3)]  # fmt: skip
    # At 35 s the load is quiet but comes back at 70 s, within lead 20 + hold 60: it keeps its 4.
    assert c.bounding_want(gap, 35.0, 4, lead_s=20.0, hold_s=60.0, per_group_qps=0.5, most=4) == 4
    # With no hold it lets them go until the lead brings them back.
    assert c.bounding_want(gap, 35.0, 4, lead_s=20.0, hold_s=0.0, per_group_qps=0.5, most=4) == 1
    # After the last burst nothing comes back: it scales down.
    assert c.bounding_want(gap, 200.0, 4, lead_s=20.0, hold_s=60.0, per_group_qps=0.5, most=4) == 1


def test_the_oracle_lead_is_its_paths_measured_start_and_saved_with_its_parameters():
    assert c.oracle_lead("plain") == c.START_S["plain"] + c.ORACLE_MARGIN_S
    assert c.oracle_lead("warm") == c.START_S["warm"] + c.ORACLE_MARGIN_S
    assert c.oracle_lead("cold", 60.0) == 60.0 + c.COLD_OVER_HOLD_S + c.ORACLE_MARGIN_S
    cfg = ci_config(policy="oracle", oracle_path="cold", engine_hold_s=60.0)
    p = c.BoundingOracle.parameters(cfg)
    assert (p["path"], p["lead_s"]) == ("cold", c.oracle_lead("cold", 60.0))
    assert p["hold_s"] == p["lead_s"] + cfg.scale_down_window
    assert p["per_group_qps"] == cfg.burst_qps / cfg.max_decode


def test_every_contestant_of_the_benchmark_is_a_real_autoscaler_static_or_the_bound():
    from e2e.fleet import scenario

    assert set(scenario.POLICIES) == {"tokenfab", "hpa", "keda", "planner_baseline", "static", "oracle"}
    for name in ("hpa", "keda", "planner_baseline", "oracle", "reactive_oracle", "threshold"):
        params = c.CONTROLLERS[name].parameters(Config(policy=name))
        assert params["period_s"] > 0, name
    assert c.HpaStyle.parameters(Config())["scale_down_stabilization_s"] == 300.0
