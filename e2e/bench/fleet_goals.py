"""The fleet benchmarks' goals, judged in every run from the figures the run saved (e2e/bench/fleet_bench.py,
fleet_bench_cold.py): pure functions of the compacted traces, so that the file holds its own verdict.

- noise: the run-to-run noise of goodput, in points: the largest difference between two runs of the same
  contestant on the same trace (every contestant, static and the oracle too). With one run it is not
  measured and `DEFAULT_NOISE_POINTS` stands in, said so.
- bound: no contestant (static peak and the oracle are references) beats the bounding oracle's goodput
  by more than the noise; a run where one does fails and says so (the oracle is then no bound, or the
  run is broken).
- the goals against the real autoscalers (AUTOSCALERS): none dominates tokenfab (more goodput at no more
  GPU-minutes); tokenfab's goodput is at least each one's minus the noise, at no more than 1.05x its
  GPU-minutes; in the plain variant tokenfab is within 5 points of the oracle at no more than 0.8x static's
  GPU-minutes; in the cold variant the gap to the oracle is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

AUTOSCALERS = ("hpa", "keda", "planner_baseline", "threshold", "tokenfab_kv_only")
# not contestants: the bound itself, and static peak, the capacity reference (always at the maximum: the
# oracle's gap to it is reported, `oracle.points_below_static`)
REFERENCES = ("oracle", "static")
DEFAULT_NOISE_POINTS = 10.0  # (one run: no second to measure the noise against; the smoke's allowance)
ORACLE_POINTS = 5.0  # plain: tokenfab within this many points of the bounding oracle
GPU_VS_AUTOSCALER = 1.05
GPU_VS_STATIC = 0.8


def _gp(r: dict[str, Any] | None) -> float | None:
    v = None if not r else (r.get("slo") or {}).get("goodput_fraction")
    return None if v is None else 100.0 * float(v)


def noise(runs: Sequence[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The largest goodput difference, in points, between any two runs of one contestant on one trace, and
    where it was; `measured` false (and DEFAULT_NOISE_POINTS) with fewer than two runs."""
    worst, where = 0.0, None
    for trace in runs[0] if runs else {}:
        for policy in runs[0][trace]:
            gps = [g for run in runs if (g := _gp((run.get(trace) or {}).get(policy))) is not None]
            if len(gps) >= 2 and max(gps) - min(gps) >= worst:
                worst, where = max(gps) - min(gps), f"{trace}/{policy}"
    if len(runs) < 2:
        return {"points": DEFAULT_NOISE_POINTS, "measured": False, "where": None, "runs": len(runs)}
    return {"points": round(worst, 1), "measured": True, "where": where, "runs": len(runs)}


def beyond_oracle(traces: dict[str, dict[str, Any]], noise_points: float) -> list[str]:
    """Every contestant (not REFERENCES) whose goodput beats the oracle's by more than the noise (none:
    [])."""
    out = []
    for trace, by in traces.items():
        bound = _gp(by.get("oracle"))
        if bound is None:
            continue
        for policy, r in by.items():
            gp = _gp(r)
            if policy not in REFERENCES and gp is not None and gp > bound + noise_points:
                out.append(
                    f"{trace}: {policy}'s goodput {gp:.1f}% beats the bounding oracle's {bound:.1f}% by more "
                    f"than the noise ({noise_points:.1f} points)"
                )
    return out


def judge(traces: dict[str, dict[str, Any]], noise_points: float, variant: str) -> dict[str, Any]:
    """Per trace, each goal with its numbers and whether it is met; `met` over them all."""
    out: dict[str, Any] = {}
    every: list[bool] = []
    for trace, by in traces.items():
        tf = by.get("tokenfab")
        if not tf:
            continue
        gp, gpu = _gp(tf), tf["gpu_minutes"]
        goals: dict[str, Any] = {"tokenfab": {"goodput_pct": gp, "gpu_minutes": gpu}}
        vs: dict[str, Any] = {}
        for name in AUTOSCALERS:
            a = by.get(name)
            if not a or _gp(a) is None or gp is None:
                continue
            agp, agpu = _gp(a), a["gpu_minutes"]
            assert agp is not None
            dominates = agp > gp and agpu <= gpu
            goodput_ok = gp >= agp - noise_points
            gpu_ok = gpu <= GPU_VS_AUTOSCALER * agpu
            vs[name] = {
                "goodput_pct": agp,
                "gpu_minutes": agpu,
                "dominates_tokenfab": dominates,
                "tokenfab_goodput_within_noise": goodput_ok,
                "tokenfab_gpu_minutes_ratio": round(gpu / agpu, 3) if agpu else None,
                "tokenfab_gpu_within_1_05x": gpu_ok,
            }
            every += [not dominates, goodput_ok, gpu_ok]
        goals["vs_autoscalers"] = vs
        oracle, static = by.get("oracle"), by.get("static")
        ogp = _gp(oracle)
        gap = None if ogp is None or gp is None else round(ogp - gp, 1)
        ratio = tf.get("gpu_minutes_vs_static")
        sgp = _gp(static)
        goals["oracle"] = {
            "goodput_pct": ogp,
            "points_below": gap,
            "points_below_static": None if ogp is None or sgp is None else round(sgp - ogp, 1),
        }
        goals["gpu_minutes_vs_static"] = ratio
        if variant == "plain":
            near = gap is not None and gap <= ORACLE_POINTS
            cheap = ratio is not None and static is not None and ratio <= GPU_VS_STATIC
            goals["oracle"]["within_5_points"] = near
            goals["gpu_minutes_vs_static_at_most_0_8"] = cheap
            every += [near, cheap]
        out[trace] = goals
    out["met"] = bool(every) and all(every)
    return out
