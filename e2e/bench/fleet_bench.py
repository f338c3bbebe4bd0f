"""Autoscaling policies on a live local fleet: `python -m e2e.bench.fleet_bench`.

The same burst trace (aiperf, quiet -> burst -> quiet) is played against three copies of one small
disaggregated ModelDeployment, each in its own namespace and its own Dynamo fleet (real mocker engines
and a real frontend per copy, run by e2e/fleet/runner.py), all at once on one local AI factory:

- tokenfab:  the operator's built-in autoscaler (KV-cache utilization from Prometheus, target 0.6);
- static:    autoscaling off, decode replicas = the maximum (peak provisioning);
- threshold: autoscaling off and a naive controller in this benchmark that adds a decode group when the
             mean decode KV utilization is above 0.8 and removes one below 0.3, every 5 s with a 10 s
             cooldown (a BASELINE written here, not a tokenfab feature).

Reported per policy: GPU-minutes held over the trace (desired groups x GPUs per group, integrated) and SLO
goodput (the fraction of issued requests with TTFT and ITL within the targets, from aiperf's per-request
records). Printed as a table; saved to e2e/bench/results/fleet_bench.json and fleet_bench.png.

Dynamo's own planner (load mode) is not run: see PLANNER_NOTE (also saved in the JSON).

The copies share 2 CPU cores, so all three see the same contention; absolute latencies on this machine
are not those of GPUs (the mocker emulates engine timing), the comparison between policies is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from e2e.fleet import fleet, plot, scenario
from tokenfab_factory.factory import Factory

RESULTS = Path(__file__).resolve().parent / "results"
PLANNER_NOTE = (
    "Dynamo's planner (python -m dynamo.planner, ai-dynamo 1.6.1) cannot start here. Its import chain needs "
    "scikit-learn (undeclared) and then aisimulate_core (dynamo/planner/core/perf_model/ais_adapter.py: "
    "ModuleNotFoundError: No module named 'aisimulate_core'), which comes from the `aisimulate` package "
    "whose PyPI release is a placeholder that downloads from an unreachable index (REFERENCE §4); "
    "tried with scikit-learn installed, environment 'virtual', optimization_target 'load'. Even running, "
    "its actuators are a Kubernetes connector for DynamoGraphDeployment and a 'virtual' connector that "
    "only publishes decisions, so it would need a bridge to spec.decode.replicas."
)


def configs(**kw: Any) -> dict[str, scenario.Config]:
    return {
        p: scenario.ci_config(namespace=f"bench-{p}", name="tiny", policy=p, **kw) for p in scenario.POLICIES
    }


def run(f: Factory, tools: fleet.Tools, work: Path, **kw: Any) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}

    def one(policy: str, cfg: scenario.Config) -> None:
        try:
            results[policy] = scenario.run_policy(f, tools, cfg, work / policy)
        except Exception as exc:
            errors[policy] = f"{type(exc).__name__}: {exc}"
        finally:
            fleet.delete_deployment(f, cfg.namespace, cfg.name)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(p, c)) for p, c in configs(**kw).items()]
    for i, t in enumerate(threads):
        t.start()
        if i < len(threads) - 1:
            time.sleep(2)
    for t in threads:
        t.join()
    return {
        "policies": {p: results[p] for p in scenario.POLICIES if p in results},
        "errors": errors,
        "dynamo_planner": {"ran": False, "why": PLANNER_NOTE},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


def table(bench: dict[str, Any]) -> str:
    rows = [
        f"{'policy':<10} {'GPU-min':>8} {'goodput':>8} {'requests':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p99':>8} {'peak dec':>8}",
    ]
    for name, r in bench["policies"].items():
        s = r["slo"]
        peak = max((x["groups"].get("decode") or 0) for x in r["series"]) if r["series"] else 0

        def ms(v: float | None) -> str:
            return f"{v:.0f}" if v is not None else "-"

        gp = s["goodput_fraction"]
        rows.append(
            f"{name:<10} {r['gpu_minutes']:>8.2f} {(f'{100 * gp:.1f}%' if gp is not None else '-'):>8} "
            f"{s['requests']:>8} {ms(s['ttft_p50_ms']):>9} {ms(s['ttft_p99_ms']):>9} "
            f"{ms(s['itl_p99_ms']):>8} {peak:>8}"
        )
    any_r = next(iter(bench["policies"].values()), None)
    if any_r:
        slo = any_r["slo"]["slo"]
        rows.append(
            f"SLO: TTFT <= {slo['ttft_ms']:.0f} ms and ITL <= {slo['itl_ms']:.0f} ms (aiperf, per request)"
        )
    rows.append(
        "dynamo planner (load mode): not run - " + bench["dynamo_planner"]["why"].split(". ")[0] + "."
    )
    for p, e in bench["errors"].items():
        rows.append(f"{p}: FAILED {e}")
    return "\n".join(rows)


def save(bench: dict[str, Any], out: Path = RESULTS) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "fleet_bench.json", "png": out / "fleet_bench.png"}
    paths["json"].write_text(json.dumps(bench, indent=1))
    if bench["policies"]:
        plot.comparison(bench["policies"], paths["png"])
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="factory run directory (default: the user's)")
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("TOKENFAB_E2E_PORT_BASE", "31000")))
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    tools = fleet.tools()
    f = scenario.bring_up(a.run_dir, a.port_base)
    scenario.ensure_operator(f)
    scenario.ensure_runner(f, tools, tuple(c.namespace for c in configs().values()))
    try:
        bench = run(f, tools, f.run / "fleet-bench")
    finally:
        f.stop_extra(fleet.RUNNER)
    print(table(bench))
    paths = save(bench, a.out)
    print("saved: " + ", ".join(str(p) for p in paths.values()))
    return 0 if not bench["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
