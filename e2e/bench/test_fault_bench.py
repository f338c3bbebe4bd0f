"""The fault benchmark's smoke version (the full one: `python -m e2e.bench.fault_bench`, three fault kinds,
three contestants, two runs): under steady load on a live Dynamo fleet (3 decode groups spread over the
racks), the rack holding a decode group is lost at once (its 18 Nodes deleted), once with tokenfab's
reaction and once with plain Kubernetes' (pod garbage collection, then a replacement), on the suite's
factory. The table is printed and the JSON kept in the run directory (outside the checkout).

Asserted, on every request the trace intended (intended = completed + failed + never sent): both runs
delivered their load; no group was ever seen split across NVLink domains; tokenfab was back to full
capacity within the observation with every lost group re-placed, named in a fault record (node, Lost,
replacement, domain) and an Event; and it lost fewer GPU-minutes of capacity than plain Kubernetes, whose
replacement waits for the pod garbage collector (the same run's baseline, not a wall-clock bound).
"""

from __future__ import annotations

import json

import pytest

from e2e.bench import fault_bench
from e2e.conftest import LIVENESS
from e2e.fleet import fleet
from e2e.helpers import operator_up
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow


def test_fault_benchmark_smoke(operator: Factory, record_property):
    tools = fleet.tools()
    plan = fault_bench.SMOKE
    names = fault_bench.namespaces(fault_bench.SMOKE_KINDS, fault_bench.SMOKE_CONTESTANTS, 1)
    fleet.start_runner(operator, tools, speedup_ratio=plan.speedup, namespaces=names)
    try:
        one = fault_bench.run(
            operator,
            tools,
            fault_bench.SMOKE_KINDS,
            fault_bench.SMOKE_CONTESTANTS,
            plan,
            operator.run / "fault-bench",
            0,
            LIVENESS,
        )
    finally:
        operator.stop_extra(fleet.RUNNER)
        operator_up(operator, LIVENESS)  # (the suite's operator, as it was: tokenfab's reaction)
    result = {"runs": [one]}
    (operator.run / "fault-bench" / "smoke.json").write_text(json.dumps(result, indent=1))
    record_property("shown", "\nfault benchmark smoke (a rack lost under load)\n" + fault_bench.table(result))
    pair = one["faults"]["rack_loss"]
    for who, r in pair.items():
        q = r["requests"]
        assert q["intended"] == q["completed"] + q["failed"] + q["never_sent"], (who, q)
        assert q["sent"] >= fault_bench.DELIVERED * q["intended"], (who, q)
        assert r["split_groups_seen"] == 0, who
        assert r["fault"]["nodes"] == 18, r["fault"]
    ours = pair["tokenfab"]
    assert ours["recovery_s"] is not None, ours
    lost = [x for x in ours["fault_records"] if x["kind"] == "Lost"]
    assert lost, ours["fault_records"]
    assert all(x["replacement"] and x["domain"] and x["recovered"] for x in lost), lost
    assert ours["event_reasons"].get("NodeLost"), ours["event_reasons"]
    assert ours["gpu_minutes_lost"] < pair["plain"]["gpu_minutes_lost"], pair
