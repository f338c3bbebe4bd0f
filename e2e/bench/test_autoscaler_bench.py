"""Runs the autoscaler benchmark (pure simulation, no cluster; printed, saved to
e2e/bench/results/autoscaler.json and autoscaler.png). Nothing is asserted about speed.

What is asserted was measured first (seed 7, the operator's defaults, bounds 1..16):

    policy     reversals  GPU-min  min >=95%
    tokenfab           7  31904.0      25.50
    threshold         38  33552.0      30.50
    hpa               11  35824.0      21.25
    tokenfab-warmup0  11  36416.0      21.25   (sensitivity: warmupSeconds 0)

- All three policies ran over the same trace, one decision per step, within the bounds.
- tokenfab reverses direction no more often than the naive threshold policy (7 vs 38 here: the threshold
  policy keeps adding a group every 15 s while new ones load, then sheds them).
- tokenfab is NOT better than HPA on SLO risk with the defaults: it spends about 4 more minutes (of 120)
  with demand at or above 95% of the serving capacity. The cause is the default 120 s warm-up after Ready,
  on top of the 120 s weights load: a group that already serves is left out of the mean, so on a burst
  each proportional step waits about 240 s instead of HPA's 120 s. With warmupSeconds 0 tokenfab matches
  HPA (21.25 min). What is asserted is the honest bound: at most 5% of the run (6 minutes) worse than
  HPA, and in return fewer GPU-minutes than HPA (about 11% fewer here) and no more reversals. Over seeds
  1-5 the gap to HPA was 3.5-7.25 minutes, so the bound is specific to this seeded trace.
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
    assert tf["gpu_minutes"] < hpa["gpu_minutes"]

    # the SLO gap to HPA comes from the warm-up after Ready: without it tokenfab is as safe as HPA
    (warm0,) = result["sensitivity"]
    assert warm0["minutes_above_95pct"] <= hpa["minutes_above_95pct"] + 1.0


def test_the_simulation_is_deterministic():
    a, b = run(), run()
    assert a == b
    assert run(seed=8)["series"]["load"] != a["series"]["load"]
