"""Runs the autoscaler benchmark (pure simulation, no cluster; printed, saved to
e2e/bench/results/autoscaler.json and autoscaler.png). Nothing is asserted about speed.

What is asserted was measured first (seed 7, the operator's defaults, bounds 1..16):

    policy     reversals  GPU-min  min >=95%
    tokenfab          11  36088.0      21.50
    threshold         38  33552.0      30.50
    hpa               11  35824.0      21.25
    tokenfab-warmup0  11  36416.0      21.25   (sensitivity: warmupSeconds 0)

- All three policies ran over the same trace, one decision per step, within the bounds.
- tokenfab reverses direction far less than the naive threshold policy (11 vs 38 here: the threshold policy
  keeps adding a group every 15 s while new ones load, then sheds them) and no more than the HPA-like one.
- Against the HPA-like policy tokenfab is level, not better, on this trace: about the same time at >= 95%
  of serving capacity (an SLO-risk proxy) and within 1% of its GPU-minutes. (With the earlier default
  warm-up of 120 s after Ready it used 11% fewer GPU-minutes but spent 4 more minutes above 95%; the
  default is now 30 s, since weights load before Ready.) Asserted: SLO risk at most 5% of the run worse
  than HPA's, GPU-minutes at most 3% above HPA's, reversals no more than HPA's.
"""

from __future__ import annotations

from e2e.bench.autoscaler_bench import MAX_GROUPS, MIN_GROUPS, STEP, report, run, save


def test_autoscaler_benchmark(capsys):
    result = run()
    paths = save(result)
    with capsys.disabled():
        print("\n" + report(result))
        print("saved: " + ", ".join(str(p) for p in paths.values()))

    by = {p["policy"]: p for p in result["policies"]}
    assert set(by) == {"tokenfab", "threshold", "hpa"}
    series = result["series"]
    assert len(series["load"]) == result["steps"] == 480
    for name in by:
        groups = series[f"groups_{name}"]
        assert len(groups) == result["steps"], f"{name} decided once per step over the same trace"
        assert all(MIN_GROUPS <= n <= MAX_GROUPS for n in groups)
        assert by[name]["scaling_changes"] > 0, f"{name} reacted to the trace"

    tf, naive, hpa = by["tokenfab"], by["threshold"], by["hpa"]
    assert tf["direction_reversals"] <= naive["direction_reversals"]
    assert tf["direction_reversals"] <= hpa["direction_reversals"]
    run_minutes = result["steps"] * STEP / 60
    assert tf["minutes_above_95pct"] <= hpa["minutes_above_95pct"] + 0.05 * run_minutes
    assert tf["gpu_minutes"] <= 1.03 * hpa["gpu_minutes"]

    # warm-up 0 (a sensitivity run) is as safe as HPA too
    (warm0,) = result["sensitivity"]
    assert warm0["minutes_above_95pct"] <= hpa["minutes_above_95pct"] + 1.0


def test_the_simulation_is_deterministic():
    a, b = run(), run()
    assert a == b
    assert run(seed=8)["series"]["load"] != a["series"]["load"]
