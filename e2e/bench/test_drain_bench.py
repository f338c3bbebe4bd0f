"""The drain benchmark's smoke version (the full one: `python -m e2e.bench.drain_bench`, about 25 minutes):
the autoscaler takes a live Dynamo fleet's decode from 3 groups to 1 under steady load with long streams,
once with tokenfab's drain and once with plain deletion (the baseline), on the suite's factory. About 8
minutes on 2 cores. The table is printed and the JSON kept in the run directory.

Asserted: both runs sent requests and settled at one decode group; with the drain no request failed or
was cut short. The baseline's failures are printed, not asserted (whether a stream is in flight on the
deleted group at that moment is up to the load's timing).
"""

from __future__ import annotations

import json

import pytest

from e2e.bench import drain_bench
from e2e.fleet import fleet
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow


def test_drain_benchmark_smoke(operator: Factory, capsys):
    tools = fleet.tools()
    plan = drain_bench.SMOKE
    namespaces = drain_bench.namespaces(("scale_down",))
    fleet.start_runner(operator, tools, speedup_ratio=plan.speedup, namespaces=namespaces)
    try:
        result = drain_bench.run(operator, tools, ("scale_down",), plan, operator.run / "drain-bench")
    finally:
        operator.stop_extra(fleet.RUNNER)
    (operator.run / "drain-bench" / "smoke.json").write_text(json.dumps(result, indent=1))
    with capsys.disabled():
        print("\ndrain benchmark smoke (scale-down 3 -> 1 decode groups)\n" + drain_bench.table(result))
    pair = result["scenarios"]["scale_down"]
    for policy, r in pair.items():
        assert r["sent"] > 0, policy
        assert r["drain_seconds"] is not None, f"{policy}: never settled at one decode group"
    drained = pair["tokenfab"]
    assert drained["failed"] == 0, drained
    assert drained["event_reasons"].get("GroupDrained") or drained["event_reasons"].get("GroupDrainTimedOut")
