"""The scale benchmark's smoke version (the full one: `python -m e2e.bench.scale_bench`, 64 racks and 200
deployments, about 15 minutes): 8 racks (144 simulated nodes) and 25 mixed ModelDeployments applied in
one `kubectl apply`, on a factory of its own, with the control-plane floor (plain Deployments of the same
pods) and the objects floor (the objects tokenfab made, sent again with no operator) measured in the
same run. About 2.5 minutes. The report is printed and the JSON kept in a temporary
directory (e2e/bench/results/scale.json holds the full run's).

Asserted: every deployment became Ready, and an idle pass reads nothing from the API server and writes
(almost) nothing; outside the passes only the background discovery of optional kinds reads, boundedly.
Times are printed, never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.bench import scale_bench
from tokenfab.adapters.kube import KIND_RECHECK_SECONDS
from tokenfab_factory import lanes

pytestmark = pytest.mark.slow


def test_scale_benchmark_smoke(tmp_path: Path, record_property):
    out = tmp_path / "results"
    argv = ["--racks", "8", "--deployments", "25", "--no-baseline-ref", "--idle", "35", "--cap", "300"]
    where = ["--run-dir", str(tmp_path / "run"), "--port-base", str(lanes.port_base() + 200)]
    scale_bench.main([*argv, *where, "--out", str(out)])
    result = json.loads((out / "scale.json").read_text())
    assert result["run"]["command"].startswith("python -m e2e.bench.scale_bench --racks 8")
    record_property("shown", "\nscale benchmark smoke\n" + scale_bench.report(result))
    ours = result["runs"]["tokenfab"]
    assert ours["ready_at_end"] == 25, ours["timeline"]
    assert ours["all_ready_seconds"] is not None
    assert result["runs"]["plain_deployments"]["all_available_seconds"] is not None
    # The objects floor sent every object tokenfab made again, with no operator, and they all ran.
    alone = result["runs"]["tokenfab_objects"]
    assert alone["pods"] == result["fleet"]["worker_pods"]
    assert alone["frontends"] == 25
    assert alone["all_ready_seconds"] is not None, alone
    steady = ours["steady"]
    assert steady["passes"] > 0
    assert steady["reads_per_pass"] == 0, steady
    # Outside the passes: API discovery of the two optional kinds (PodGroup, ComputeDomain), each at
    # most once per KIND_RECHECK_SECONDS, however many deployments there are.
    assert steady["discovery_reads"] <= 2 * (steady["seconds"] // KIND_RECHECK_SECONDS + 1), steady
    assert steady["writes_per_pass"] < 0.5, steady
