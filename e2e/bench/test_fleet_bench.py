"""Runs the live-fleet policy benchmark (tokenfab vs static peak vs a naive threshold baseline, the same
aiperf burst trace on three Dynamo fleets at once); prints the table and saves
e2e/bench/results/fleet_bench.json and fleet_bench.png. About 6-8 minutes on 2 cores.

Asserted: every policy ran the whole trace and served it; static peak provisioning holds the most
GPU-minutes; tokenfab's autoscaler holds fewer GPU-minutes than static. Latency and goodput are measured
and printed, never asserted (2 shared cores are noisy).
"""

from __future__ import annotations

import pytest

from e2e.bench.fleet_bench import configs, run, save, table
from e2e.fleet import fleet
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow


def test_fleet_benchmark(operator: Factory, capsys):
    tools = fleet.tools()
    fleet.start_runner(operator, tools, namespaces=tuple(c.namespace for c in configs().values()))
    try:
        bench = run(operator, tools, operator.run / "fleet-bench")
    finally:
        operator.stop_extra(fleet.RUNNER)
    paths = save(bench)
    with capsys.disabled():
        print("\n" + table(bench))
        print("saved: " + ", ".join(str(p) for p in paths.values()))
    assert not bench["errors"], bench["errors"]
    by = bench["policies"]
    assert set(by) == {"tokenfab", "static", "threshold"}
    for name, r in by.items():
        assert r["aiperf_exit_code"] == 0, name
        assert r["slo"]["requests"] > 100, name
    assert by["static"]["gpu_minutes"] >= max(r["gpu_minutes"] for r in by.values())
    assert by["tokenfab"]["gpu_minutes"] < by["static"]["gpu_minutes"]
