"""The drain benchmark's smoke version (the full one: `python -m e2e.bench.drain_bench`, three contestants
and three scenarios): the autoscaler takes a live Dynamo fleet's decode from 3 groups to 1 under steady load
with long streams, once with tokenfab's drain and once with plain deletion at Kubernetes' default 30 s grace
(the baseline), on the suite's factory. About 8 minutes on 2 cores. The table is printed and the JSON kept in
the run directory (outside the checkout).

Asserted, on every request the trace intended (intended = completed + failed + never sent): both runs
delivered their load and settled at one decode group; with the drain not one request failed; the baseline
cut at least one stream (the 30 s grace is shorter than a stream, so the comparison can tell them apart).
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
    namespaces = drain_bench.namespaces(("scale_down",), drain_bench.SMOKE_CONTESTANTS)
    fleet.start_runner(operator, tools, speedup_ratio=plan.speedup, namespaces=namespaces)
    try:
        result = drain_bench.run(
            operator,
            tools,
            ("scale_down",),
            plan,
            operator.run / "drain-bench",
            drain_bench.SMOKE_CONTESTANTS,
        )
    finally:
        operator.stop_extra(fleet.RUNNER)
    (operator.run / "drain-bench" / "smoke.json").write_text(json.dumps(result, indent=1))
    with capsys.disabled():
        print("\ndrain benchmark smoke (scale-down 3 -> 1 decode groups)\n" + drain_bench.table(result))
    pair = result["scenarios"]["scale_down"]
    for policy, r in pair.items():
        q = r["requests"]
        assert q["intended"] == q["completed"] + q["failed"] + q["never_sent"], (policy, q)
        assert q["sent"] >= drain_bench.DELIVERED * q["intended"], (policy, q)
        assert r["drain_seconds"] is not None, f"{policy}: never settled at one decode group"
    drained = pair["tokenfab"]
    assert drained["requests"]["failed"] == 0, drained
    assert drained["event_reasons"].get("GroupDrained") or drained["event_reasons"].get("GroupDrainTimedOut")
    assert pair["baseline"]["requests"]["failed"] >= 1, "the short grace cut no stream: nothing compared"
