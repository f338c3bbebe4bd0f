"""Runs the factory benchmark (4 racks as the baseline, 64 racks = 1,152 nodes) and checks what must
hold regardless of speed: both come up with every node Ready and stay healthy. Figures are printed, not
saved (`python -m e2e.bench.factory_bench` saves e2e/bench/results/factory.json); no time is asserted."""

from __future__ import annotations

import pytest

from e2e.bench.factory_bench import report, run
from tokenfab_factory import lanes


@pytest.mark.slow
def test_factory_benchmark_64_racks_stays_healthy(record_property):
    result = run([4, 64], hold=60, port_base=lanes.port_base() + 250)
    record_property("shown", "\n" + report(result))
    for start in result["starts"]:
        assert start["stayed_healthy"], (
            f"{start['racks']}-rack factory was not healthy: {start['samples'][-3:]}"
        )
        assert start["samples"], "no health samples taken"
    assert result["starts"][1]["nodes"] == 1152
