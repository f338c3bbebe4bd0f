"""Cold starts with and without a model cache, on a live local fleet: `python -m e2e.bench.fleet_bench_cold`.

The fleet benchmark (e2e/bench/fleet_bench.py: the same three traces, the same small disaggregated
deployment, real mocker engines and frontends, aiperf) with every new engine held back while its weights
load. How long is a MODEL of time (e2e/fleet/weights_model.py, figures and sources in
docs/weights-timing.md): `--cold-start` seconds (60 by default) for weights from the hub, and the
published local-NVMe share of that (70/533, 7.9 s) for weights already in the node's model cache; an
engine whose node's cache is still downloading waits for that download. Policies:

- tokenfab:          the operator's autoscaler (policy leading) with a node-local model cache
                     (model.cache.storageClassName: the factory's `local-nvme` class) and the headroom
                     pre-staged (model.cache.prestageGroups, `--prestage`, 3 by default: up to the
                     maximum of 4 decode groups): weights-fetch pods download the weights onto the nodes
                     the next groups would take, new groups go to the warmest nodes they fit whole on,
                     and each learned start time per path is the autoscaler's forecast horizon;
- tokenfab_nocache:  the same with no model cache (an emptyDir per pod): every new engine is cold;
- hpa, keda, planner_baseline: the real autoscalers' algorithms (RE-IMPLEMENTATIONS,
                     e2e/fleet/contestants.py), with the same cache and pre-staged headroom;
- oracle:            the BOUND (contestants.BoundingOracle), with the same cache: it acts one warm group
                     start ahead of the trace;
- static:            autoscaling off at the maximum (peak provisioning), with the same cache: the capacity
                     reference.

A policy with a cache plays its trace once its pre-staged headroom holds the weights (the steady state of
a deployment that has served for a while before a burst), or after 300 s; each result's `prestage` says
how long that took and whether it completed. GPU time counts from the trace's start.

Each policy's result carries `weights_paths`: the engines started during the trace and how their weights
came (warm / fetching / cold), and `first_serve_per_rise_s`: per rise of the load, the seconds until a new
decode group served; and `start_s` per engine: from its pod's creation (the scale-up) to its first healthy
readiness probe, which `goals` compares per path (warm with the cache against cold without). `--repeat 2`
(the default) runs it all twice: the first run is `traces`, the others under `repeats`; `judged` holds the
noise between them, the oracle bound checked in each run and the goals against the autoscalers
(fleet_goals, variant cold). Saved to e2e/bench/results/fleet_bench_cold.json with its history copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from e2e import record
from e2e.bench import fleet_bench
from e2e.fleet import fleet, scenario, weights_model
from tokenfab_factory.drivers import STORAGE_CLASS

POLICIES = ("tokenfab", "tokenfab_nocache", "hpa", "keda", "planner_baseline", "static", "oracle")


def _gp(r: dict[str, Any] | None) -> float | None:
    return None if not r else (r.get("slo") or {}).get("goodput_fraction")


def _median_rise(r: dict[str, Any] | None) -> float | None:
    rises = [v for v in (r or {}).get("first_serve_per_rise_s") or [] if v is not None]
    return statistics.median(rises) if rises else None


def group_starts(r: dict[str, Any] | None) -> dict[str, float]:
    """Per weights path, the median seconds from a new engine's pod creation (the scale-up) to its first
    healthy readiness probe (serving), over the engines started during the trace that served."""
    engines = ((r or {}).get("weights_paths") or {}).get("engines") or []
    by: dict[str, list[float]] = {}
    for e in engines:
        if e.get("start_s") is not None:
            by.setdefault(e["path"], []).append(e["start_s"])
    return {path: round(statistics.median(v), 1) for path, v in sorted(by.items())}


def goals(traces: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trace, what the issue's goals compare: tokenfab's goodput against the oracle's (points), its
    GPU-minutes against static's, its median first serve per rise against tokenfab_nocache's, and a new
    group's own start (pod created to serving, median per path) warm against cold: tokenfab's warm
    engines against tokenfab_nocache's cold ones."""
    out: dict[str, dict[str, Any]] = {}
    for trace, by in traces.items():
        tf, oracle, nocache = by.get("tokenfab"), by.get("oracle"), by.get("tokenfab_nocache")
        gp, og = _gp(tf), _gp(oracle)
        warm, cold = _median_rise(tf), _median_rise(nocache)
        starts, cold_starts = group_starts(tf), group_starts(nocache)
        w, k = starts.get("warm"), cold_starts.get("cold")
        out[trace] = {
            "goodput_points_below_oracle": None if gp is None or og is None else round(100 * (og - gp), 1),
            "gpu_minutes_vs_static": (tf or {}).get("gpu_minutes_vs_static"),
            "first_serve_s": {"tokenfab": warm, "tokenfab_nocache": cold},
            "first_serve_vs_nocache": None if not warm or not cold else round(warm / cold, 2),
            "group_start_s": {"tokenfab": starts, "tokenfab_nocache": cold_starts},
            "warm_group_start_vs_cold": None if not w or not k else round(w / k, 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="factory run directory (default: the user's)")
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("TOKENFAB_E2E_PORT_BASE", "31000")))
    ap.add_argument("--out", type=Path, default=record.RESULTS)
    ap.add_argument("--traces", default=",".join(scenario.TRACES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--batch", type=int, default=0, help="contestants of one trace run at once (0: all)")
    ap.add_argument(
        "--cold-start", type=float, default=fleet_bench.COLD_START_S, help="the hub path, seconds"
    )
    ap.add_argument("--repeat", type=int, default=2, help="run everything this many times")
    ap.add_argument(
        "--prestage", type=int, default=3, help="model.cache.prestageGroups of the policies with a cache"
    )
    fleet_bench.add_scale_down_window(ap)
    a = ap.parse_args(argv)
    started = time.time()
    traces = tuple(t for t in a.traces.split(",") if t)
    policies = tuple(p for p in a.policies.split(",") if p)
    tools = fleet.tools()
    users = scenario.already_up(a.run_dir, a.port_base)  # a factory this run starts, it also stops
    f = scenario.bring_up(a.run_dir, a.port_base)
    scenario.ensure_operator(f)
    runs: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        for i in range(a.repeat):
            fleet.start_runner(
                f,
                tools,
                namespaces=tuple(fleet_bench.namespace(p) for p in policies),
                start_delay=a.cold_start,
            )
            work = f.run / "fleet-bench-cold" / str(i)
            bench = fleet_bench.run(
                f,
                tools,
                work,
                traces,
                policies,
                a.batch or len(policies),
                cache_class=STORAGE_CLASS,
                **fleet_bench.oracle_path(a.cold_start, cache=True),
                prestage_groups=a.prestage,
                **fleet_bench.scale_down_window(a),
            )
            f.stop_extra(fleet.RUNNER)
            runs.append(
                {
                    "traces": fleet_bench.compact(bench, keep_series=i == 0),
                    "batches": bench["batches"],
                    "wall_seconds": bench["wall_seconds"],
                }
            )
            errors.update({f"run{i + 1}/{k}": v for k, v in bench["errors"].items()})
            print(
                fleet_bench.table(
                    runs[-1]["traces"], f"run {i + 1}, cold start {a.cold_start:.0f} s (modeled)"
                )
            )
            save(runs, errors, a, time.monotonic() - t0, argv, started)  # after each run: nothing lost
    finally:
        f.stop_extra(fleet.RUNNER)
        if not users:
            f.down()
    path, doc = save(runs, errors, a, time.monotonic() - t0, argv, started)
    print(fleet_bench.verdict(doc))
    print(f"saved: {path}")
    return 0 if not doc["errors"] else 1


def save(
    runs: list[dict[str, Any]],
    errors: dict[str, str],
    a: argparse.Namespace,
    wall: float,
    argv: list[str],
    started: float,
) -> tuple[Path, dict[str, Any]]:
    """fleet_bench_cold.json: the first run's traces at the top (`traces`), the others under `repeats`,
    and the noise, the oracle bound and the goals (`judged`; a contestant above the oracle is an error)."""
    judged = fleet_bench.judged([r["traces"] for r in runs], "cold") if runs else None
    errors = dict(errors)
    for i, beyond in enumerate((judged or {}).get("beyond_oracle") or [], 1):
        for line in beyond:
            errors[f"run{i}/oracle"] = line
    doc = {
        "traces": runs[0]["traces"] if runs else {},
        "repeats": [r["traces"] for r in runs[1:]],
        "goals": [goals(r["traces"]) for r in runs],
        "judged": {"cold": judged} if judged else {},
        "modeled": {
            "what": "weight loading times are modeled (e2e/fleet/weights_model.py, docs/weights-timing.md)",
            "cold_s": a.cold_start,
            "prestage_groups": a.prestage,
            "warm_s": round(weights_model.warm_seconds(a.cold_start), 1),
            "published_s": weights_model.PUBLISHED_S,
        },
        "scale_down_window_s": scenario.Config.scale_down_window
        if a.scale_down_window is None
        else a.scale_down_window,
        "batches": [r["batches"] for r in runs],
        "errors": errors,
        "wall_seconds": round(wall, 1),
    }
    return record.save("fleet_bench_cold", doc, a.out, "e2e.bench.fleet_bench_cold", argv, started), doc


if __name__ == "__main__":
    sys.exit(main())
