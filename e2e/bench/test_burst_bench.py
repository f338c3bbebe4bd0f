"""The burst benchmark's short version (the full one: `python -m e2e.bench.burst_bench`, 3 runs each
way): 30 deployments applied at once on a 4-rack factory of its own, once with one operator and once with
two --leader-elect replicas. About 3 minutes.

Asserted: both bursts settled; with two replicas both are still alive after it (a leader that cannot renew
its Lease under the burst exits, and the fleet waits for the next) and the Lease never changed hands.
Times are printed, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.bench import burst_bench
from tokenfab_factory import lanes

pytestmark = pytest.mark.slow


def test_burst_benchmark_smoke(tmp_path: Path, record_property):
    out = tmp_path / "results"
    where = ["--run-dir", str(tmp_path / "run"), "--port-base", str(lanes.port_base() + 450)]
    burst_bench.main(["--runs", "1", "--cap", "240", *where, "--out", str(out)])
    result = json.loads((out / "burst.json").read_text())
    record_property("shown", "\nburst benchmark smoke\n" + burst_bench.report(result))
    by_mode = {r["mode"]: r for r in result["runs"]}
    assert set(by_mode) == {"one", "two"}
    for r in by_mode.values():
        assert r["settled_seconds"] is not None, r
        assert all(r["alive"].values()), r
    assert set(by_mode["two"]["alive"]) == {"replica-a", "replica-b"}
    assert by_mode["two"]["lease_transitions"] in (None, 0), by_mode["two"]
