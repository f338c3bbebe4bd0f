"""The rack-loss benchmark's short version (the full one: `python -m e2e.bench.rack_loss_bench
--baseline-ref REF`, 10 runs each): the DeepSeek-R1 example and 6 aggregated deployments on a 4-rack
factory of its own, the fullest rack lost twice in a row. About 2 minutes.

Asserted: both runs came back (every group serving whole off the lost rack, every deployment Ready) and
the fleet settled again after each rack returned; the operator logged its passes (--log-passes). Times are
printed, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.bench import rack_loss_bench
from tokenfab_factory import lanes

pytestmark = pytest.mark.slow


def test_rack_loss_benchmark_smoke(tmp_path: Path, record_property):
    out = tmp_path / "results"
    where = ["--run-dir", str(tmp_path / "run"), "--port-base", str(lanes.port_base() + 350)]
    rack_loss_bench.main(["--runs", "2", "--cap", "120", *where, "--out", str(out)])
    result = json.loads((out / "rack_loss.json").read_text())
    record_property("shown", "\nrack-loss benchmark smoke\n" + rack_loss_bench.report(result))
    runs = result["contestants"]["tokenfab"]["runs"]
    assert len(runs) == 2, runs
    for r in runs:
        assert r["nodes_lost"] == 18, r
        assert r["groups_hit"], r
        assert r["back_seconds"] is not None, r
        assert "settled_again" not in r, r
        assert r["passes"] > 0, r  # (the pass lines of its window)
