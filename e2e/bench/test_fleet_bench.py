"""The fleet benchmark's smoke version (the full one: `python -m e2e.bench.fleet_bench`, about 2 hours):
one short burst played at once against tokenfab's leading policy, its KV-only policy, static peak, the
planner baseline and the oracle bound, each on its own live Dynamo fleet. About 5 minutes on 2 cores. The
table is printed and the JSON kept in the run directory (outside the checkout; `python -m
e2e.bench.fleet_bench` saves the full run's to e2e/bench/results/).

Asserted: every policy ran the whole trace and every request the trace intended is accounted for (intended =
completed + failed + never sent); static peak sent at least 95% of them and tokenfab 80% (the load was
delivered; a baseline's unsent requests are misses in its goodput); static peak holds the most GPU-minutes;
both tokenfab policies hold fewer than static and brought a new decode group to serve during the burst; the
oracle asked for its new group within 8 s of the burst's start and it served. Quality, against floors
measured in the same run: tokenfab's goodput (completed within the SLO, of every request intended) is at
least that of the KV-only policy and of the planner baseline, less 5 points for the noise of 2 shared cores
(measured at f2914d2: 89.8% against 75.5% and 83.7%). Latency is printed, not asserted.
"""

from __future__ import annotations

import json

import pytest

from e2e.bench import fleet_bench
from e2e.fleet import fleet, load
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow
POLICIES = ("tokenfab", "tokenfab_kv_only", "static", "planner_baseline", "oracle")


def test_fleet_benchmark_smoke(operator: Factory, record_property):
    tools = fleet.tools()
    fleet.start_runner(operator, tools, namespaces=tuple(fleet_bench.namespace(p) for p in POLICIES))
    try:
        bench = fleet_bench.run(
            operator,
            tools,
            operator.run / "fleet-bench",
            ("single_burst",),
            POLICIES,
            batch=len(POLICIES),
            before_s=20,
            burst_s=60,
            after_s=70,
        )
        state = fleet.runner_state(operator)
    finally:
        operator.stop_extra(fleet.RUNNER)
    # Each engine's own start, as the cold-start benchmark reads it: from its pod's creation to its first
    # healthy readiness probe (the runner's history; creationTimestamp has whole seconds).
    engines = [h for h in state["history"] if h["kind"] == "mocker" and h["key"].startswith("live-bench-")]
    served = [h for h in engines if h["healthy_at"] is not None]
    assert served, "no engine of the benchmark ever answered its readiness probe"
    for h in served:
        assert h["created_at"] - 1 <= h["started_at"] <= h["healthy_at"], h
    traces = fleet_bench.compact(bench, keep_series=False)
    (operator.run / "fleet-bench" / "smoke.json").write_text(json.dumps(traces, indent=1))
    record_property("shown", "\n" + fleet_bench.table(traces, "fleet benchmark smoke (single short burst)"))
    assert not bench["errors"], bench["errors"]
    by = traces["single_burst"]
    assert set(by) == set(POLICIES)
    for name, r in by.items():
        assert r["aiperf_exit_code"] == 0, name
        q = r["requests"]
        assert q["intended"] == q["completed"] + q["failed"] + q["never_sent"], (name, q)
        assert q["intended"] > 50, (name, q)
    # The load was delivered: static peak is never short of capacity, so what it did not send the load
    # generator failed to send; tokenfab, whose goodput is asserted, delivered most of it. A baseline that
    # scales late leaves requests unsent behind aiperf's concurrency (the KV-only policy once sent 117 of
    # 147 here on 2 shared cores): those count as misses in its goodput, which divides by intended.
    assert by["static"]["requests"]["sent"] >= 0.95 * by["static"]["requests"]["intended"], by["static"]
    assert by["tokenfab"]["requests"]["sent"] >= 0.8 * by["tokenfab"]["requests"]["intended"], by["tokenfab"]
    assert by["static"]["gpu_minutes"] >= max(r["gpu_minutes"] for r in by.values())
    for name in ("tokenfab", "tokenfab_kv_only"):
        assert by[name]["gpu_minutes"] < by["static"]["gpu_minutes"], name
        assert by[name]["first_serve_s"] is not None, f"{name} brought no new group to serve in the burst"
    goodput = {name: r["slo"]["goodput_fraction"] or 0.0 for name, r in by.items()}
    floor = max(goodput["tokenfab_kv_only"], goodput["planner_baseline"])
    assert goodput["tokenfab"] >= floor - 0.05, goodput
    assert by["oracle"]["first_serve_s"] is not None, "the oracle brought no new group to serve in the burst"
    # The oracle acts on the trace, not on the load: its decode groups rise at the burst's start. Asserted on
    # the groups it asked for, not on when they served, which is the machine's group start time (14.5 s in the
    # committed full run, 16 s in suite runs here, 26 s once in CI on a slower machine).
    oracle = bench["traces"]["single_burst"]["oracle"]
    start = load.rises([load.Point(**p) for p in oracle["trace"]])[0]
    base = next(r["groups"].get("decode") or 0 for r in reversed(oracle["series"]) if r["t"] <= start)
    rose = [r["t"] for r in oracle["series"] if r["t"] > start and (r["groups"].get("decode") or 0) > base]
    assert rose, "the oracle never asked for another decode group"
    # (the committed full run: 3.8 s after the rise, one sampling interval and a reconcile)
    assert rose[0] - start < 8, (rose[0], start)
