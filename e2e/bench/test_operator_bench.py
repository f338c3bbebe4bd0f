"""Runs the reconciler benchmarks (printed, saved to e2e/bench/results/operator.json). What is asserted is
not speed but what must hold: tokenfab reaches Ready, the floor is measured in the same run, and the
kube-scheduler baseline was really exercised."""

from __future__ import annotations

import pytest

from e2e.bench.operator_bench import report, run


@pytest.mark.slow
def test_operator_benchmark(operator, capsys):
    result = run(operator)
    with capsys.disabled():
        print("\n" + report(result))
    a = result["apply_to_ready"]
    assert len(a["tokenfab_seconds"]) == len(a["plain_deployment_seconds"]) == 3
    # The factory serves the gang API: the floor of whole-gang binding is measured too.
    assert len(a["gang_floor_seconds"]) == 3
    p = result["placement"]
    assert p["total_multi_node_groups"] > 0
    for r in p["runs"]:
        assert r["kube_scheduler"]["groups"] == len(r["sizes"])
        assert r["best_fit"]["placed"] <= len(r["sizes"])
