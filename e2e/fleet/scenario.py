"""The closed autoscaling loop, live: `python -m e2e.fleet.scenario`.

Brings up (or reuses) a local AI factory, the tokenfab operator and the fleet runner (real Dynamo mocker
engines and a real Dynamo frontend for the pods the operator creates), applies a small disaggregated
ModelDeployment with autoscaling on, and drives it with aiperf: quiet -> burst -> quiet. While the load
runs it samples, every few seconds, the groups per role (the ModelDeployment's status), the KV-cache
utilization per group (Prometheus, the autoscaler's own signal), the requests each decode group served
and the frontend's TTFT; afterwards it adds aiperf's per-request view (offered load, TTFT p50/p99 per
window, SLO goodput). The time series is saved as JSON and plotted to PNG.

The same machinery runs the benchmark's other policies (e2e/bench/fleet_bench.py): `static` (autoscaling
off, decode replicas = the maximum) and `threshold` (autoscaling off, a naive +-1 threshold controller in
this process patches spec.decode.replicas: a baseline, not a tokenfab feature).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from e2e import record
from e2e.fleet import contestants, fleet, load
from e2e.fleet.config import Config as Config
from e2e.fleet.config import ci_config as ci_config
from e2e.helpers import apply_yaml, install_crds, start_operator, wait_for
from tokenfab.planning import contract
from tokenfab_factory import process
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

# every real autoscaler (tokenfab and the re-implementations of e2e/fleet/contestants.py), static peak as
# the capacity reference, and the bounding oracle
POLICIES = ("tokenfab", "hpa", "keda", "planner_baseline", "static", "oracle")
TRACES = ("single_burst", "repeated_burst", "ramp")


class Sampler(threading.Thread):
    """Samples status and Prometheus every few seconds into `rows`."""

    def __init__(self, f: Factory, cfg: Config) -> None:
        super().__init__(daemon=True)
        self.f, self.cfg = f, cfg
        self.rows: list[dict[str, Any]] = []
        self.stop_event = threading.Event()

    def sample(self) -> dict[str, Any]:
        f, ns, name = self.f, self.cfg.namespace, self.cfg.name
        st = fleet.status(f, ns, name)
        roles = st.get("roles") or {}
        row: dict[str, Any] = {"time": time.time(), "groups": {}, "ready": {}, "kv": {}, "requests": {}}
        auto = st.get("autoscaling") or {}
        arrivals = auto.get("arrivals") or []
        # what the operator's autoscaler read at the frontend (requests/s) and learned (requests/s per group)
        row["arrival_rate"] = arrivals[-1][1] if arrivals else None
        row["capacity"] = auto.get("capacity") or {}
        for role in ("prefill", "decode"):
            r = roles.get(role) or {}
            row["groups"][role] = r.get("desiredGroups")
            row["ready"][role] = r.get("readyGroups")
            row["kv"][role] = fleet.kv_by_group(f, ns, name, role)
        row["requests"]["decode"] = fleet.requests_by_group(f, ns, name, "decode")
        row["waiting_decode"] = fleet.waiting(f, ns, name, "decode")
        row["frontend_ttft_s"] = fleet.frontend_ttft(f, ns, name)
        return row

    def run(self) -> None:
        while not self.stop_event.is_set():
            t = time.monotonic()
            try:
                self.rows.append(self.sample())
            except Exception as exc:  # a sample lost is not a run lost
                print(f"sampler: {exc}", file=sys.stderr)
            self.stop_event.wait(max(0.2, self.cfg.sample_s - (time.monotonic() - t)))


def deployment(f: Factory, cfg: Config) -> dict[str, Any]:
    """The policy's ModelDeployment. tokenfab_nocache is tokenfab (policy leading) with no model cache."""
    cache = None if cfg.policy == "tokenfab_nocache" else cfg.cache_class
    staged = cfg.prestage_groups if cache else 0
    if cfg.policy in ("tokenfab", "tokenfab_kv_only", "tokenfab_nocache"):
        doc = fleet.manifest(
            f,
            cfg.namespace,
            cfg.name,
            True,
            1,
            cfg.max_decode,
            cfg.target,
            cfg.scale_down_window,
            cache,
            staged,
        )
        a = doc["spec"]["autoscaling"]
        a["policy"] = "kv" if cfg.policy == "tokenfab_kv_only" else "leading"
        a["rateWindowSeconds"] = cfg.rate_window_s
        return doc
    if cfg.policy == "static":
        return fleet.manifest(
            f,
            cfg.namespace,
            cfg.name,
            False,
            cfg.max_decode,
            cfg.max_decode,
            cache_class=cache,
            prestage=staged,
        )
    if cfg.policy in contestants.CONTROLLERS:
        return fleet.manifest(
            f, cfg.namespace, cfg.name, False, 1, cfg.max_decode, cache_class=cache, prestage=staged
        )
    raise ValueError(f"unknown policy {cfg.policy!r}")


def run_policy(f: Factory, tools: fleet.Tools, cfg: Config, out_dir: Path) -> dict[str, Any]:
    """Apply the deployment, play the trace with aiperf, sample; returns the result (also as JSON)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fleet.ensure_namespace(f, cfg.namespace)
    doc = deployment(f, cfg)
    applied = time.time()
    apply_yaml(f, doc)
    want_decode = doc["spec"]["decode"]["replicas"]
    wait_for(
        f"{cfg.namespace}/{cfg.name}: {want_decode} decode group(s) Ready",
        lambda: (
            (fleet.role_status(f, cfg.namespace, cfg.name).get("decode") or {}).get("readyGroups")
            == want_decode
        ),
        timeout=300,  # (with a cold start, each engine is held back before it serves)
    )
    url = fleet.serving(f, cfg.namespace, cfg.name)  # one request end to end; the engines' KV gauges follow
    staged = prestage_settled(f, cfg, doc)
    wait_for(
        "every decode engine scraped by Prometheus",
        lambda: fleet.targets_up(f, cfg.namespace, cfg.name, "decode") >= want_decode,
        timeout=120,
        interval=1,
    )
    run = load.AiperfRun(
        aiperf=tools.aiperf,
        url=url,
        model=fleet.MODEL_NAME,
        tokenizer_dir=fleet.model_dir(tools),
        points=cfg.trace(),
        artifact_dir=out_dir / "aiperf",
        isl=cfg.isl,
        osl=cfg.osl,
        slo=cfg.slo,
    )
    sampler = Sampler(f, cfg)
    kind = contestants.CONTROLLERS.get(cfg.policy)
    controller = kind(f, cfg) if kind else None
    sampler.start()
    if controller:
        controller.start()
    t_start = time.time()
    before = fleet.frontend_counts(url)
    run.start()
    try:
        rc = run.wait(timeout=load.duration(cfg.trace()) + run.grace_s + 240)
    finally:
        run.stop()
        sampler.stop_event.set()
        if controller:
            controller.stop_event.set()
        sampler.join(timeout=30)
        if controller:
            controller.join(timeout=30)
    records = run.records()
    frontend = fleet.frontend_delta(before, settled_counts(url))
    result = analyse(cfg, doc, sampler.rows, records, t_start, rc, frontend)
    result["weights_paths"] = weights_paths(fleet.runner_state(f), cfg.namespace, t_start, applied)
    result["prestage"] = staged
    result["parameters"] = parameters(cfg)
    if controller:
        result["controller_decisions"] = controller.decisions
    (out_dir / "result.json").write_text(json.dumps(result, indent=1))
    if not records:
        raise RuntimeError(f"aiperf sent no request (exit code {rc}): see {out_dir}/aiperf/aiperf.log")
    return result


def settled_counts(url: str, wait_s: float = 30.0) -> dict[str, int] | None:
    """The frontend's counters once the requests the client left behind have finished there (its in-flight
    gauge at 0), or after `wait_s`: the frontend counts a request when it ends."""
    deadline = time.monotonic() + wait_s
    counts = fleet.frontend_counts(url)
    while counts is not None and counts["inflight"] > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        counts = fleet.frontend_counts(url)
    return counts


def parameters(cfg: Config) -> dict[str, Any]:
    """What the contestant ran with: the controller's parameters, or tokenfab's autoscaling settings."""
    kind = contestants.CONTROLLERS.get(cfg.policy)
    if kind is not None:
        return {"controller": kind.__name__, **kind.parameters(cfg)}
    if cfg.policy == "static":
        return {"decode_replicas": cfg.max_decode}
    return {
        "autoscaling_policy": "kv" if cfg.policy == "tokenfab_kv_only" else "leading",
        "target": cfg.target,
        "scale_down_window_s": cfg.scale_down_window,
        "rate_window_s": cfg.rate_window_s,
        "max_decode": cfg.max_decode,
        "model_cache": None if cfg.policy == "tokenfab_nocache" else cfg.cache_class,
        "prestage_groups": cfg.prestage_groups if cfg.cache_class and cfg.policy != "tokenfab_nocache" else 0,
    }


PRESTAGE_WAIT_S = 300.0


def prestage_settled(f: Factory, cfg: Config, doc: dict[str, Any]) -> dict[str, Any]:
    """A cache's steady state before the trace: a deployment that pre-stages headroom (every policy given a
    cache) serves for a while before a burst comes, so the trace starts once that headroom holds the
    weights, or after PRESTAGE_WAIT_S (said in the result: `complete` false). GPU time is counted from
    the trace's start, so the wait costs no policy anything."""
    if not ((doc["spec"]["model"].get("cache") or {}).get("prestageGroups")):
        return {"wait_s": 0.0, "complete": True}
    t0 = time.monotonic()
    done = False
    while not done and time.monotonic() - t0 < PRESTAGE_WAIT_S:
        done = fleet.prestaged_warm(f, cfg.namespace, cfg.name)
        if not done:
            time.sleep(2.0)
    return {"wait_s": round(time.monotonic() - t0, 1), "complete": done}


def analyse(
    cfg: Config,
    doc: dict[str, Any],
    rows: list[dict[str, Any]],
    records: list[load.Request],
    t_start: float,
    rc: int,
    frontend: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Align samples and aiperf records on the trace's clock (0 = aiperf's first request); count every
    request the trace intended as the client and the frontend (`frontend`: its own counters over the run)
    saw them (`load.reconcile`: `requests.problems` names any disagreement)."""
    t0 = records[0].start if records else t_start
    trace = cfg.trace()
    gpus = fleet.role_gpus(doc)
    series = []
    gpu_seconds = 0.0
    prev_t: float | None = None
    prev_gpus = 0
    for row in rows:
        t = row["time"] - t0
        if t < -10:  # aiperf still starting up (tokenizer, dataset): no load yet
            continue
        held = sum((row["groups"].get(role) or 0) * g for role, g in gpus.items())
        if prev_t is not None and 0 <= t <= load.duration(trace) + 5:
            gpu_seconds += prev_gpus * (t - max(prev_t, 0.0))
        prev_t, prev_gpus = t, held
        kv_dec = row["kv"].get("decode") or {}
        series.append(
            {
                "t": round(t, 2),
                "offered_qps": round(load.rate_at(trace, t), 3),
                "groups": row["groups"],
                "ready": row["ready"],
                "gpus": held,
                "kv": row["kv"],
                "kv_decode_mean": round(sum(kv_dec.values()) / len(kv_dec), 4) if kv_dec else None,
                "kv_decode_max": max(kv_dec.values()) if kv_dec else None,
                "requests_decode": row["requests"].get("decode"),
                "waiting_decode": row.get("waiting_decode"),
                "frontend_ttft_s": row.get("frontend_ttft_s"),
                "arrival_rate": row.get("arrival_rate"),
                "capacity": row.get("capacity") or {},
            }
        )
    win = load.windows(records, t0, cfg.window_s, t0 + load.duration(trace))
    for w in win:
        w["offered_qps"] = round(load.rate_at(trace, w["t"]), 3)
    serve = first_serve(series, trace)
    requests = load.reconcile(records, load.intended(trace), frontend, cfg.osl)
    return {
        "policy": cfg.policy,
        "trace_name": cfg.trace_name,
        "reversals": reversals([r["groups"].get("decode") for r in series]),
        "first_serve_s": serve[0] if serve else None,
        "first_serve_per_rise_s": serve,
        "config": {**asdict(cfg), "slo": asdict(cfg.slo)},
        "trace": [asdict(p) for p in trace],
        "gpus_per_group": gpus,
        "aiperf_exit_code": rc,
        "gpu_minutes": round(gpu_seconds / 60, 2),
        "requests": requests,
        "slo": load.goodput(records, cfg.slo, requests, cfg.osl),
        "series": series,
        "windows": win,
    }


def reversals(counts: list[int | None]) -> int:
    """Direction reversals of a count over time: a change whose sign differs from the previous change's."""
    signs = []
    prev = None
    for n in counts:
        if n is None:
            continue
        if prev is not None and n != prev:
            signs.append(1 if n > prev else -1)
        prev = n
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def weights_paths(
    state: dict[str, Any], namespace: str, t_start: float, applied: float = 0.0
) -> dict[str, Any]:
    """The engines of `namespace` the runner started after `t_start` (wall clock) and how their weights
    came (e2e/fleet/weights_model: modeled): a count per path, and each with its start (seconds into
    the trace), role, path, modeled hold and `start_s`: from its pod's creation (the scale-up) to its
    first healthy readiness probe (serving; None if it never served); and how many weights-fetch pods it
    completed since the deployment was applied (`applied`; a namespace's earlier runs are not counted)."""
    engines = [
        {
            "t": round(h["started_at"] - t_start, 1),
            "role": h["labels"].get(contract.PROM_LABEL_ROLE, ""),
            "path": h["weights"]["path"],
            "hold_s": h["weights"]["hold_s"],
            "start_s": _span(h.get("created_at"), h.get("healthy_at")),
        }
        for h in state.get("history") or []
        if h.get("kind") == "mocker"
        and h["key"].startswith(f"{namespace}/")
        and h["started_at"] >= t_start
        and "weights" in h
    ]
    counts = {p: sum(e["path"] == p for e in engines) for p in ("warm", "fetching", "cold")}
    # weights-fetch pods of the namespace the runner completed (pre-staging) since the deployment was
    # applied (`applied`, wall clock): before the trace or during it
    staged = sum(
        1
        for x in state.get("fetches") or []
        if x["key"].startswith(f"{namespace}/") and x.get("completed_at", 0.0) >= applied
    )
    return {"counts": counts, "engines": engines, "fetch_pods_completed": staged}


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 1)


def first_serve(series: list[dict[str, Any]], trace: list[load.Point]) -> list[float | None]:
    """Per rise of the load (a burst's or ramp's start): seconds until more decode groups are Ready than
    were at that moment (None: none came before the next rise, or at all)."""
    rises = load.rises(trace)
    out: list[float | None] = []
    for i, start in enumerate(rises):
        end = rises[i + 1] if i + 1 < len(rises) else float("inf")
        before = [r for r in series if r["t"] <= start and r["ready"].get("decode") is not None]
        base = before[-1]["ready"]["decode"] if before else None
        hit = next(
            (
                r["t"]
                for r in series
                if start < r["t"] < end and base is not None and (r["ready"].get("decode") or 0) > base
            ),
            None,
        )
        out.append(None if hit is None else round(hit - start, 1))
    return out


# ------------------------------------------------------------------------------------------ checks


def loop_facts(result: dict[str, Any]) -> dict[str, Any]:
    """The closed loop in numbers: what the test asserts and the scenario prints."""
    cfg = result["config"]
    s = result["series"]
    burst_start = cfg["before_s"]
    burst_end = cfg["before_s"] + cfg["burst_s"]
    initial = next((r["groups"]["decode"] for r in s if r["groups"].get("decode")), None)
    during = [r for r in s if burst_start <= r["t"] <= burst_end]
    peak_groups = max((r["groups"].get("decode") or 0 for r in during), default=0)
    first_up = next((r["t"] for r in during if (r["groups"].get("decode") or 0) > (initial or 0)), None)
    kv_before_up = [
        r["kv_decode_mean"]
        for r in during
        if r["kv_decode_mean"] is not None and first_up and r["t"] <= first_up
    ]
    tail = [r for r in during if r["t"] >= burst_end - 30 and r["kv_decode_mean"] is not None]
    end_groups = next((r["groups"]["decode"] for r in reversed(s) if r["groups"].get("decode")), None)
    initial_groups = {g for r in s[:3] for g in (r["requests_decode"] or {})}
    served_by_new = {
        g: v for r in s for g, v in (r["requests_decode"] or {}).items() if g not in initial_groups and v > 0
    }
    kv_new = {
        g: v
        for r in s
        for g, v in ((r["kv"] or {}).get("decode") or {}).items()
        if g not in initial_groups and v > 0
    }
    win = result["windows"]
    ttft_burst = [w["ttft_p50_ms"] for w in win if burst_start <= w["t"] <= burst_end and w["ttft_p50_ms"]]
    return {
        "initial_decode_groups": initial,
        "peak_decode_groups": peak_groups,
        "first_scale_up_at_s": first_up,
        "kv_decode_peak_before_scale_up": max(kv_before_up, default=None),
        "kv_decode_mean_last_30s_of_burst": (
            round(sum(r["kv_decode_mean"] for r in tail) / len(tail), 4) if tail else None
        ),
        "decode_groups_at_end": end_groups,
        "new_groups_that_served": sorted(served_by_new),
        "new_groups_with_kv": sorted(kv_new),
        "ttft_p50_peak_in_burst_ms": max(ttft_burst, default=None),
        "ttft_p50_end_of_burst_ms": ttft_burst[-1] if ttft_burst else None,
    }


# ------------------------------------------------------------------------------------------ main


def factory_for(run_dir: Path | None, port_base: int) -> Factory:
    cfg = FactoryConfig(port_base=port_base, racks=4)
    if run_dir:
        cfg.run_dir = run_dir
    return Factory(cfg, say=print)


def already_up(run_dir: Path | None, port_base: int) -> bool:
    """Whether a factory runs there already (then it is the user's, and left running)."""
    f = factory_for(run_dir, port_base)
    state = f.read_state()
    return state is not None and all(s.running for s in f.component_status(state))


def bring_up(run_dir: Path | None, port_base: int) -> Factory:
    f = factory_for(run_dir, port_base)
    f.up()
    install_crds(f)
    return f


def ensure_operator(f: Factory) -> None:
    liveness = f.config.port_base + 20
    pid = f.extra_pids().get("operator")
    if pid and process.alive(pid):
        return
    start_operator(f, liveness)


def ensure_runner(f: Factory, tools: fleet.Tools, namespaces: tuple[str, ...]) -> None:
    """(Re)start the fleet runner for these namespaces only (a running one is stopped by PID first)."""
    fleet.start_runner(f, tools, namespaces=namespaces)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description="The closed autoscaling loop on a live local fleet.")
    ap.add_argument("--ci", action="store_true", help="the CI-sized trace (about 5 minutes of load)")
    ap.add_argument("--run-dir", type=Path, default=None, help="factory run directory (default: the user's)")
    ap.add_argument("--port-base", type=int, default=int(os.environ.get("TOKENFAB_E2E_PORT_BASE", "31000")))
    ap.add_argument("--out", type=Path, default=record.RESULTS)
    ap.add_argument("--keep", action="store_true", help="leave the deployment, runner and operator up")
    a = ap.parse_args(argv)
    started = time.time()
    tools = fleet.tools()
    users = already_up(a.run_dir, a.port_base)  # a factory this run starts, it also stops (unless --keep)
    f = bring_up(a.run_dir, a.port_base)
    ensure_operator(f)
    cfg = ci_config() if a.ci else Config()
    ensure_runner(f, tools, (cfg.namespace,))
    work = f.run / "fleet-scenario"
    try:
        result = run_policy(f, tools, cfg, work)
    finally:
        if not a.keep:
            fleet.delete_deployment(f, cfg.namespace, cfg.name)
            f.stop_extra(fleet.RUNNER)
            if not users:
                f.down()
    result["loop"] = loop_facts(result)
    out_json = record.save("fleet_closed_loop", result, a.out, "e2e.fleet.scenario", argv, started)
    from e2e.fleet import plot

    png = plot.closed_loop(result, a.out / "fleet_closed_loop.png")
    print(json.dumps(result["loop"], indent=1))
    print(json.dumps(dict(result["slo"].items()), indent=1))
    print(f"GPU-minutes: {result['gpu_minutes']}")
    print(f"saved {out_json} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
