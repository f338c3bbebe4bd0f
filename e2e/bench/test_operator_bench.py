"""The reconciler benchmarks' smoke version (the full one: `python -m e2e.bench.operator_bench`, which
saves e2e/bench/results/operator.json; here nothing is saved), on the suite's factory and operator.

Asserted, against baselines measured in the same run:
- tokenfab's worker groups sit whole in one NVLink domain in every trial (0 split), and its apply ->
  Ready is within 3x of the floor of whole-gang binding (the same PodGroups and pods written directly, no
  operator; measured 1.2-1.4x on 2 cores), so a reconciler that stalls or requeues late fails it;
- kube-scheduler without domain affinity splits groups across domains (the failure tokenfab prevents is
  real on this factory), and with podAffinity on the clique label splits none;
- tokenfab's best fit places at least as many GPUs in whole groups as either scheduler baseline, and no
  placement (best fit, first fit, either scheduler) holds more than the exact optimum.
"""

from __future__ import annotations

import pytest

from e2e.bench.operator_bench import report, run


@pytest.mark.slow
def test_operator_benchmark(operator, record_property):
    result = run(operator, trials=3, seeds=range(3))
    record_property("shown", "\n" + report(result))
    a = result["apply_to_ready"]
    assert len(a["tokenfab_seconds"]) == len(a["plain_deployment_seconds"]) == 3
    assert a["tokenfab_groups"] == [4, 4, 4], "the example's 2 prefill + 2 decode groups, every trial"
    assert a["tokenfab_split_groups"] == 0
    # The factory serves the gang API: the floor of whole-gang binding is measured too.
    assert len(a["gang_floor_seconds"]) == 3
    assert a["overhead_vs_gang_floor"] <= 3.0, a

    p = result["placement"]
    assert p["total_multi_node_groups"] > 0
    assert p["kube_scheduler"]["split_across_domains"] > 0, "the baseline never split a group: nothing shown"
    assert p["kube_scheduler_pod_affinity"]["split_across_domains"] == 0
    best = p["best_fit"]["gpus"]
    assert best >= p["kube_scheduler"]["gpus_in_whole_groups"]
    assert best >= p["kube_scheduler_pod_affinity"]["gpus_in_whole_groups"]
    assert p["optimal_proved"]
    for name in ("best_fit", "first_fit"):
        assert p[name]["gpus"] <= p["optimal"]["gpus"], name
    for name in ("kube_scheduler", "kube_scheduler_pod_affinity"):
        assert p[name]["gpus_in_whole_groups"] <= p["optimal"]["gpus"], name
