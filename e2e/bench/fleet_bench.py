"""Autoscalers on a live local fleet: `python -m e2e.bench.fleet_bench`.

Three load traces of the same length (aiperf, one request-rate series each) are played against copies of
one small disaggregated ModelDeployment (decode groups of 2 GPUs, prefill 1 GPU at 1:2), each copy in
its own namespace with its own Dynamo fleet (real mocker engines and a real frontend per copy, run by
e2e/fleet/runner.py), on one local AI factory:

- single_burst:   quiet -> 2.0 requests/s for most of the trace -> quiet;
- repeated_burst: three short bursts 90 s apart;
- ramp:           a linear ramp up to the peak, a hold, a ramp back down.

Contestants, all copies of one trace at once (so they share the machine's load; `--batch` runs them in
smaller groups when two cores cannot carry them all, and the JSON says so):

- tokenfab:          the operator's autoscaler, policy "leading" (forecast arrival rate, queues, KV guard);
- hpa:               Kubernetes' HPA algorithm on the decode KV-cache series (a RE-IMPLEMENTATION:
                     e2e/fleet/contestants.HpaStyle);
- keda:              a KEDA Prometheus trigger on the requests in flight at the frontend, through the HPA
                     algorithm (a RE-IMPLEMENTATION: contestants.KedaStyle);
- planner_baseline:  the published reactive logic of Dynamo's planner (a RE-IMPLEMENTATION:
                     contestants.PlannerBaseline; Dynamo's own cannot run here, PLANNER_NOTE);
- static:            autoscaling off, decode replicas = the maximum: the capacity reference, not a
                     competitor;
- oracle:            the BOUND (contestants.BoundingOracle): it knows the trace and the path's measured
                     group start time, starts each group that long before the trace needs it and holds
                     capacity through short gaps.
Also available (`--policies`): tokenfab_kv_only (the operator's KV-only policy), threshold (a naive +-1
controller), reactive_oracle (the trace known, no lead: the benchmark's oracle before it bounded).

With the baselines and the oracle the operator's autoscaler is off and they write spec.decode.replicas.
`--cold-start S` adds a variant where the runner holds each new engine back S seconds (no model cache;
fleet_bench_cold.py is the variant with the cache). `--repeat` (2 by default) runs everything again.

Reported per trace and contestant: GPU-minutes held (desired groups x GPUs, integrated), SLO goodput
(aiperf, per request: TTFT and ITL within the targets, of every request intended), TTFT/ITL p50/p99,
direction reversals of the decode count, the time from each rise of the load to the first new decode
group Ready, and every request counted by two observers (the load generator's records and the frontend's
own counters by status), which must agree (load.reconcile). Judged in the file (fleet_goals): the
run-to-run noise, no contestant above the oracle by more than it (a run where one is fails), and the
goals against the autoscalers. Saved to e2e/bench/results/fleet_bench.json and fleet_bench.png.

Absolute latencies on 2 shared cores are not those of GPUs (the mocker emulates engine timing); the
comparison between contestants under the same load is the point.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e import record
from e2e.bench import fleet_goals
from e2e.fleet import fleet, plot, scenario
from tokenfab_factory.factory import Factory

PLANNER_NOTE = (
    "Dynamo's planner (python -m dynamo.planner, ai-dynamo 1.6.1) cannot start here. Its import chain needs "
    "scikit-learn (undeclared) and then aisimulate_core (dynamo/planner/core/perf_model/ais_adapter.py: "
    "ModuleNotFoundError: No module named 'aisimulate_core'), which comes from the `aisimulate` package "
    "whose PyPI release is a placeholder that downloads from an unreachable index (REFERENCE §4); "
    "tried with scikit-learn installed, environment 'virtual', optimization_target 'load'. Even running, "
    "its actuators are a Kubernetes connector for DynamoGraphDeployment and a 'virtual' connector that "
    "only publishes decisions. planner_baseline follows its documented reactive logic instead."
)
COLD_START_S = 60.0
# Kept per policy in the JSON (the time series only for the first repeat, for the plot).
SUMMARY_KEYS = (
    "gpu_minutes",
    "requests",
    "slo",
    "reversals",
    "first_serve_s",
    "first_serve_per_rise_s",
    "aiperf_exit_code",
    "weights_paths",
    "prestage",
    "parameters",
)


def namespace(policy: str) -> str:
    return f"live-bench-{policy.replace('_', '-')}"


def configs(
    trace: str, policies: tuple[str, ...] = scenario.POLICIES, **kw: Any
) -> dict[str, scenario.Config]:
    return {
        p: scenario.ci_config(namespace=namespace(p), name="tiny", policy=p, trace_name=trace, **kw)
        for p in policies
    }


def run_trace(
    f: Factory, tools: fleet.Tools, trace: str, policies: tuple[str, ...], batch: int, work: Path, **kw: Any
) -> tuple[dict[str, dict[str, Any]], dict[str, str], list[list[str]]]:
    """Every policy on one trace, `batch` at a time (each batch at once, in threads)."""
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    cfgs = configs(trace, policies, **kw)
    order = list(cfgs)
    batches = [order[i : i + batch] for i in range(0, len(order), batch)]

    def one(policy: str, cfg: scenario.Config) -> None:
        try:
            results[policy] = r = scenario.run_policy(f, tools, cfg, work / trace / policy)
            if r["requests"]["problems"]:  # two observers disagree: nothing of this cell is trusted
                errors[policy] = "the counts disagree: " + "; ".join(r["requests"]["problems"])
        except Exception as exc:
            errors[policy] = f"{type(exc).__name__}: {exc}"
        finally:
            fleet.delete_deployment(f, cfg.namespace, cfg.name)

    for names in batches:
        threads = [threading.Thread(target=one, args=(p, cfgs[p])) for p in names]
        for i, t in enumerate(threads):
            t.start()
            if i < len(threads) - 1:
                time.sleep(2)
        for t in threads:
            t.join()
    return {p: results[p] for p in order if p in results}, errors, batches


def run(
    f: Factory,
    tools: fleet.Tools,
    work: Path,
    traces: tuple[str, ...] = scenario.TRACES,
    policies: tuple[str, ...] = scenario.POLICIES,
    batch: int = 5,
    **kw: Any,
) -> dict[str, Any]:
    """One pass over the traces (the runner, with or without a cold start, is the caller's)."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"traces": {}, "errors": {}, "batches": {}}
    for trace in traces:
        results, errors, batches = run_trace(f, tools, trace, policies, batch, work, **kw)
        out["traces"][trace] = results
        out["batches"][trace] = batches
        out["errors"].update({f"{trace}/{p}": e for p, e in errors.items()})
    out["wall_seconds"] = round(time.monotonic() - t0, 1)
    return out


def peak_decode(r: dict[str, Any]) -> int:
    return max(((x["groups"].get("decode") or 0) for x in r.get("series") or []), default=0)


def compact(bench: dict[str, Any], keep_series: bool) -> dict[str, Any]:
    """The figures the acceptance asks for per trace and policy (and the series, for the plot)."""
    out: dict[str, Any] = {}
    for trace, by in bench["traces"].items():
        out[trace] = {}
        static = (by.get("static") or {}).get("gpu_minutes")
        for p, r in by.items():
            row = {k: r.get(k) for k in SUMMARY_KEYS}
            row["peak_decode_groups"] = peak_decode(r)
            row["gpu_minutes_vs_static"] = round(r["gpu_minutes"] / static, 3) if static else None
            if keep_series:
                row["series"] = [
                    {"t": x["t"], "gpus": x["gpus"], "groups": x["groups"], "ready": x["ready"]}
                    for x in r["series"]
                ]
                row["windows"] = r["windows"]
                row["trace"] = r["trace"]
            out[trace][p] = row
    return out


def counts(requests: dict[str, int] | None) -> str:
    if not requests:
        return "-"
    r = requests
    return f"{r['intended']} = {r['completed']} + {r['failed']} + {r['never_sent']}"


def _ms(v: float | None) -> str:
    return f"{v:.0f}" if v is not None else "-"


def _seconds(v: float | None) -> str:
    return f"{v:.0f} s" if v is not None else "-"


@dataclass(frozen=True)
class Row:
    """One policy's figures on one trace, each as the tables print it (the text table of `table`, the
    README's of summary.markdown_fleet)."""

    policy: str
    gpu_minutes: str
    vs_static: str
    goodput: str
    ttft_p50: str
    ttft_p99: str
    itl_p50: str
    itl_p99: str
    reversals: str
    first_serve: str  # after the first rise of the load
    first_serve_per_rise: str
    peak_decode_groups: str
    requests: str  # intended = completed + failed + never sent


def row(name: str, r: dict[str, Any]) -> Row:
    slo = r["slo"]
    gp = slo.get("goodput_fraction")
    return Row(
        policy=name,
        gpu_minutes=f"{r['gpu_minutes']:.2f}",
        vs_static=f"{r.get('gpu_minutes_vs_static') or 0:.2f}",
        goodput=f"{100 * gp:.1f}%" if gp is not None else "-",
        ttft_p50=_ms(slo.get("ttft_p50_ms")),
        ttft_p99=_ms(slo.get("ttft_p99_ms")),
        itl_p50=_ms(slo.get("itl_p50_ms")),
        itl_p99=_ms(slo.get("itl_p99_ms")),
        reversals=str(r["reversals"]),
        first_serve=_seconds(r.get("first_serve_s")),
        first_serve_per_rise=", ".join(_seconds(v) for v in r.get("first_serve_per_rise_s") or []) or "-",
        peak_decode_groups=str(r.get("peak_decode_groups", 0)),
        requests=counts(r.get("requests")),
    )


def table(traces: dict[str, dict[str, Any]], title: str) -> str:
    rows = [title]
    for trace, by in traces.items():
        rows.append(f"  {trace}")
        rows.append(
            f"    {'policy':<17} {'GPU-min':>7} {'/static':>7} {'goodput':>8} {'TTFT p50':>8} {'p99':>6} "
            f"{'ITL p50':>7} {'p99':>5} {'revs':>4} {'1st serve':>9} {'peak':>4}  "
            "intended = completed + failed + never sent"
        )
        for name, r in by.items():
            x = row(name, r)
            rows.append(
                f"    {x.policy:<17} {x.gpu_minutes:>7} {x.vs_static:>7} {x.goodput:>8} {x.ttft_p50:>8} "
                f"{x.ttft_p99:>6} {x.itl_p50:>7} {x.itl_p99:>5} {x.reversals:>4} {x.first_serve:>9} "
                f"{x.peak_decode_groups:>4}  {x.requests}"
            )
    return "\n".join(rows)


def add_scale_down_window(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--scale-down-window",
        type=int,
        default=None,
        help="the tokenfab policies' scaleDownStabilizationSeconds (default: scenario.Config's, 60)",
    )


def scale_down_window(a: argparse.Namespace) -> dict[str, Any]:
    """The configs' keyword for --scale-down-window (none: scenario.Config's default)."""
    return {} if a.scale_down_window is None else {"scale_down_window": a.scale_down_window}


def oracle_path(delay: float, cache: bool = False) -> dict[str, Any]:
    """The configs' keywords for the bounding oracle's path: warm from a model cache, cold when the runner
    holds new engines back (`delay`), else plain."""
    if cache:
        return {"oracle_path": "warm"}
    return {"oracle_path": "cold", "engine_hold_s": delay} if delay > 0 else {"oracle_path": "plain"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=None, help="factory run directory (default: the user's)")
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("TOKENFAB_E2E_PORT_BASE", "31000")))
    ap.add_argument("--out", type=Path, default=record.RESULTS)
    ap.add_argument("--traces", default=",".join(scenario.TRACES))
    ap.add_argument("--policies", default=",".join(scenario.POLICIES))
    ap.add_argument("--batch", type=int, default=0, help="contestants of one trace run at once (0: all)")
    ap.add_argument("--cold-start", type=float, default=0.0, help="seconds; > 0 adds that variant")
    ap.add_argument("--repeat", type=int, default=2, help="run everything this many times")
    ap.add_argument("--cold-start-only", action="store_true", help="skip the plain variant")
    add_scale_down_window(ap)
    a = ap.parse_args(argv)
    started = time.time()
    traces = tuple(t for t in a.traces.split(",") if t)
    policies = tuple(p for p in a.policies.split(",") if p)
    batch = a.batch or len(policies)
    tools = fleet.tools()
    users = scenario.already_up(a.run_dir, a.port_base)  # a factory this run starts, it also stops
    f = scenario.bring_up(a.run_dir, a.port_base)
    scenario.ensure_operator(f)
    variants = {"plain": 0.0, **({"cold_start": a.cold_start} if a.cold_start > 0 else {})}
    if a.cold_start_only:
        variants.pop("plain")
    runs: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        for i in range(a.repeat):
            run_out: dict[str, Any] = {}
            for variant, delay in variants.items():
                fleet.start_runner(
                    f, tools, namespaces=tuple(namespace(p) for p in policies), start_delay=delay
                )
                kw = {**scale_down_window(a), **oracle_path(delay)}
                work = f.run / "fleet-bench" / f"{i}-{variant}"
                bench = run(f, tools, work, traces, policies, batch, **kw)
                f.stop_extra(fleet.RUNNER)
                run_out[variant] = {
                    "start_delay_s": delay,
                    "traces": compact(bench, keep_series=i == 0),
                    "batches": bench["batches"],
                    "wall_seconds": bench["wall_seconds"],
                }
                errors.update({f"run{i + 1}/{variant}/{k}": v for k, v in bench["errors"].items()})
                print(
                    table(run_out[variant]["traces"], f"run {i + 1}, {variant} (start delay {delay:.0f} s)")
                )
                # after each part: nothing lost (the same file and history copy, rewritten)
                save([*runs, run_out], errors, a.out, time.monotonic() - t0, argv, started)
            runs.append(run_out)
    finally:
        f.stop_extra(fleet.RUNNER)
        if not users:
            f.down()
    paths, doc = save(runs, errors, a.out, time.monotonic() - t0, argv, started)
    print(verdict(doc))
    print("saved: " + ", ".join(str(p) for p in paths.values()))
    return 0 if not doc["errors"] else 1


def judged(runs: list[dict[str, dict[str, Any]]], variant: str) -> dict[str, Any]:
    """The noise over `runs` (each a run's traces), the oracle bound checked in each run, and the goals of
    each run (fleet_goals)."""
    n = fleet_goals.noise(runs)
    return {
        "noise": n,
        "beyond_oracle": [fleet_goals.beyond_oracle(r, n["points"]) for r in runs],
        "goals": [fleet_goals.judge(r, n["points"], variant) for r in runs],
    }


def verdict(doc: dict[str, Any]) -> str:
    """The judged part of a saved document, printed after the tables."""
    out = []
    for variant, j in (doc.get("judged") or {}).items():
        n = j["noise"]
        how = f"measured over {n['runs']} runs, largest at {n['where']}" if n["measured"] else "one run"
        out.append(f"{variant}: noise {n['points']} points ({how})")
        for i, (beyond, goals) in enumerate(zip(j["beyond_oracle"], j["goals"], strict=True), 1):
            met = "met" if goals["met"] else "NOT met"
            out.append(f"  run {i}: goals {met}; above the oracle: {beyond or 'none'}")
    return "\n".join(out)


def save(
    runs: list[dict[str, Any]],
    errors: dict[str, str],
    out: Path,
    wall: float,
    argv: list[str],
    started: float,
) -> tuple[dict[str, Path], dict[str, Any]]:
    """fleet_bench.json (e2e/record.py): the first run's plain traces at the top (`traces`), its
    cold-start traces under `cold_start`, every run under `runs`, and per variant the noise, the oracle
    bound checked in each run (a contestant above it is an error) and the goals (`judged`)."""
    paths = {"png": out / "fleet_bench.png"}
    first = runs[0] if runs else {}
    verdicts: dict[str, Any] = {}
    errors = dict(errors)
    for variant in ("plain", "cold_start"):
        traces = [r[variant]["traces"] for r in runs if r.get(variant)]
        if traces:
            verdicts[variant] = judged(traces, variant)
            for i, beyond in enumerate(verdicts[variant]["beyond_oracle"], 1):
                for line in beyond:
                    errors[f"run{i}/{variant}/oracle"] = line
    doc = {
        "traces": (first.get("plain") or {}).get("traces", {}),
        "cold_start": first.get("cold_start"),
        "runs": runs,
        "judged": verdicts,
        "errors": errors,
        "dynamo_planner": {"ran": False, "why": PLANNER_NOTE},
        "wall_seconds": round(wall, 1),
    }
    paths["json"] = record.save("fleet_bench", doc, out, "e2e.bench.fleet_bench", argv, started)
    if doc["traces"]:
        plot.traces(doc, paths["png"])
    return paths, doc


if __name__ == "__main__":
    sys.exit(main())
