"""A whole rack lost under a small fleet, again and again: is the fleet back, whole, every time?

The fleet is what a user tries first on the local AI factory (4 racks): the DeepSeek-R1 example (2 decode
groups of 32 GPUs, 2 prefill groups of 8, in prefill-decode units) and 6 aggregated deployments (2 groups
of 1 GPU each, autoscaling off so that the count of groups wanted stays put). In each run the rack that
holds the most of the fleet's GPUs loses its 18 Nodes at once (tokenfab_factory.faults.lose: deleted, with
no warning), and the benchmark looks every quarter second until the fleet is back: every deployment Ready,
as many groups serving as before the fault, every group whole (each pod Ready and bound, none on a lost
Node, no group split across NVLink domains). Then the Nodes come back (`heal`) and the fleet settles
before the next run.

The operator runs with `--log-passes` (one log line per reconcile pass: what it wrote, what it parked and
waits for, when it looks again); each run keeps the count of passes in its window, the slowest pass, and
for a run over `--slow` seconds every pass line of it, so that an outlier says what it waited for.

Saved (e2e/record.py) to e2e/bench/results/rack_loss.json (or --out DIR). Times come from simulated Nodes
and pods that turn Ready at once (no engine starts): they show the control plane's reaction. Nothing passes
or fails on a time; the report says how many runs were back within 15 s.

    python -m e2e.bench.rack_loss_bench --baseline-ref 380a8ac   # 10 runs each, about 12 minutes
    python -m e2e.bench.rack_loss_bench --runs 2 --out /tmp/rack-loss   # the suite's short one
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import record
from e2e.helpers import apply_yaml, condition, get_json, install_crds, kubectl, wait_for, wait_healthy
from testing.cases import EXAMPLES
from tokenfab.planning import contract
from tokenfab_factory import faults
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL, RACK_LABEL

NS = "rack-loss"
AGGREGATED = 6
GROUPS = 4 + 2 * AGGREGATED  # the example's 2 decode and 2 prefill groups, 2 groups each of the others
GOAL_SECONDS = 15.0
Pods = dict[tuple[str, str], list[dict[str, Any]]]  # (deployment, group) -> its worker pods


def fleet() -> list[dict[str, Any]]:
    """The DeepSeek-R1 example and AGGREGATED small aggregated deployments, in NS."""
    deepseek = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
    small = yaml.safe_load((EXAMPLES / "aggregated-small.yaml").read_text())
    small["spec"].pop("autoscaling", None)
    docs = [deepseek]
    for i in range(AGGREGATED):
        doc = copy.deepcopy(small)
        doc["metadata"]["name"] = f"agg-{i}"
        docs.append(doc)
    for doc in docs:
        doc["metadata"]["namespace"] = NS
    return docs


def worker_groups(f: Factory) -> Pods:
    out: Pods = {}
    for p in get_json(f, "pods", "-n", NS, "-l", f"{contract.COMPONENT}=worker")["items"]:
        labels = p["metadata"]["labels"]
        out.setdefault((labels[contract.LABEL_DEPLOYMENT], labels[contract.LABEL_GROUP]), []).append(p)
    return out


def _ready(p: dict[str, Any]) -> bool:
    conds = (p.get("status") or {}).get("conditions") or []
    return (
        any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        and not p["metadata"].get("deletionTimestamp")
        and bool(p["spec"].get("nodeName"))
    )


def serving(f: Factory, labels: dict[str, dict[str, str]], lost: set[str]) -> dict[str, int]:
    """Groups serving per deployment: every pod Ready and bound off the lost Nodes, all in one domain."""
    out: dict[str, int] = {}
    for (dep, _), pods in worker_groups(f).items():
        out.setdefault(dep, 0)
        whole = all(_ready(p) and p["spec"]["nodeName"] not in lost for p in pods)
        domains = {labels.get(p["spec"].get("nodeName") or "", {}).get(CLIQUE_LABEL) for p in pods}
        if whole and len(domains) == 1:
            out[dep] += 1
    return out


def all_ready(f: Factory) -> bool:
    items = get_json(f, "mdep", "-n", NS)["items"]
    return bool(items) and all((condition(md, "Ready") or {}).get("status") == "True" for md in items)


def back(f: Factory, labels: dict[str, dict[str, str]], lost: set[str], wanted: dict[str, int]) -> bool:
    """The fleet back: as many groups serving whole as before, nothing on a lost Node, all Ready."""
    if serving(f, labels, lost) != wanted:
        return False
    on_lost = [p for ps in worker_groups(f).values() for p in ps if p["spec"].get("nodeName") in lost]
    return not on_lost and all_ready(f)


def node_labels(f: Factory) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(f, "nodes")["items"]}


def fullest_rack(f: Factory, labels: dict[str, dict[str, str]]) -> str:
    """The rack holding the most of the fleet's GPUs (worker pods by GPU count)."""
    gpus: dict[str, int] = {}
    for pods in worker_groups(f).values():
        for p in pods:
            node = p["spec"].get("nodeName")
            if not node:
                continue
            limits = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
            rack = labels[node][RACK_LABEL]
            gpus[rack] = gpus.get(rack, 0) + int(limits.get("nvidia.com/gpu", 0))
    return max(sorted(gpus), key=lambda r: gpus[r])


def pass_lines(log: Path, start: int) -> list[str]:
    """The operator's pass lines (logger tokenfab.passes) written since byte `start` of its log."""
    with log.open("rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    return [line for line in text.splitlines() if "tokenfab.passes" in line or ": took " in line]


def slowest_pass(lines: list[str]) -> float:
    took = []
    for line in lines:
        _, _, rest = line.partition(": took ")
        if rest:
            try:
                took.append(float(rest.split(" ", 1)[0]))
            except ValueError:
                continue
    return max(took, default=0.0)


def one_run(f: Factory, i: int, log: Path, cap: float, slow: float, settle: float) -> dict[str, Any]:
    labels = node_labels(f)
    wanted = serving(f, labels, set())
    rack = fullest_rack(f, labels)
    lost = faults.nodes_of(f, rack=int(rack.split("-")[1]))
    hit = sorted(
        f"{dep}/{group}"
        for (dep, group), pods in worker_groups(f).items()
        if any(p["spec"].get("nodeName") in lost for p in pods)
    )
    start = log.stat().st_size
    faults.lose(f, lost)
    t0 = time.monotonic()
    took: float | None = None
    while time.monotonic() - t0 < cap:
        if back(f, labels, set(lost), wanted):
            took = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.25)
    lines = pass_lines(log, start)
    out: dict[str, Any] = {
        "run": i,
        "rack": rack,
        "nodes_lost": len(lost),
        "groups_hit": hit,
        "back_seconds": took,
        "passes": len(lines),
        "slowest_pass_seconds": slowest_pass(lines),
    }
    if took is None or took > slow:
        out["pass_lines"] = lines[-200:]
        out["serving_at_end"] = serving(f, labels, set(lost))
        out["wanted"] = wanted
    print(f"run {i}: rack {rack} ({len(hit)} groups hit) back after {took} s, {len(lines)} passes")
    faults.heal(f, lost)
    try:
        wait_for("the rack's Nodes back", lambda: set(lost) <= set(node_labels(f)), timeout=60)
        wait_for("the fleet settled again", lambda: back(f, node_labels(f), set(), wanted), timeout=settle)
    except AssertionError as exc:  # (the next run would measure this one's tail)
        out["settled_again"] = str(exc)[:300]
        return out
    time.sleep(2)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["back_seconds"] for r in runs if r["back_seconds"] is not None]
    return {
        "runs": len(runs),
        "back": len(times),
        "within_goal": sum(1 for t in times if t <= GOAL_SECONDS),
        "goal_seconds": GOAL_SECONDS,
        "median_seconds": round(statistics.median(times), 2) if times else None,
        "max_seconds": max(times) if times else None,
        "min_seconds": min(times) if times else None,
    }


def contestant(
    f: Factory, name: str, runs: int, port: int, cap: float, slow: float, path: Path | None
) -> dict[str, Any]:
    """One operator (this checkout's, or an earlier commit's from `path`) through `runs` rack losses, on a
    fleet applied afresh and deleted after."""
    argv = [*Factory.operator_argv(port), "--log-passes"]
    env = {"PYTHONPATH": str(path / "operator")} if path is not None else None
    if path is not None:
        argv = [a for a in argv if a != "--log-passes"]  # (an earlier operator may not have it)
    kubectl(f, "apply", "--server-side", "--force-conflicts", "-f", str((path or record.ROOT) / "crds"))
    kubectl(f, "create", "namespace", NS, check=False)
    f.start_extra(name, argv, env=env)
    try:
        wait_healthy(port, f"{name} healthy", timeout=120)
        apply_yaml(f, fleet(), "--server-side", "--field-manager=gitops")
        wait_for("the fleet Ready", lambda: all_ready(f), timeout=300, interval=1)
        labels = node_labels(f)
        wait_for(
            "every group serving",
            lambda: sum(serving(f, labels, set()).values()) == GROUPS,
            timeout=120,
        )
        log = f.log(name)
        out: list[dict[str, Any]] = []
        for i in range(runs):
            out.append(one_run(f, i, log, cap, slow, 2 * cap))
            if "settled_again" in out[-1]:
                break  # (it did not settle after the rack came back: the runs stop there)
        kubectl(f, "delete", "namespace", NS, "--wait=true", "--timeout=300s", check=False)
    finally:
        f.stop_extra(name)
    return {"runs": out, "summary": summary(out)}


def run(
    runs: int, port_base: int, run_dir: Path, cap: float, slow: float, baseline_ref: str | None
) -> dict[str, Any]:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    t0 = time.monotonic()
    f.up(timeout=600)
    result: dict[str, Any] = {"benchmark": "rack_loss", "racks": 4, "aggregated": AGGREGATED}
    try:
        install_crds(f)
        port = port_base + 20
        contestants: dict[str, Any] = {}
        if baseline_ref:
            from e2e.bench.scale_bench import baseline_checkout

            path = baseline_checkout(baseline_ref)
            print(f"baseline: the operator of {baseline_ref} ({path})")
            contestants["baseline_operator"] = {
                "ref": baseline_ref,
                **contestant(f, "baseline-operator", runs, port, cap, slow, path),
            }
        print("tokenfab (this checkout)")
        contestants["tokenfab"] = contestant(f, "operator", runs, port, cap, slow, None)
        result["contestants"] = contestants
    finally:
        f.down()
    result["total_seconds"] = round(time.monotonic() - t0, 1)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"rack loss under the DeepSeek-R1 example and {result['aggregated']} aggregated deployments:"]
    for name, c in result["contestants"].items():
        s = c["summary"]
        times = ", ".join(str(r["back_seconds"]) for r in c["runs"])
        lines.append(
            f"  {name:18} {s['within_goal']} of {s['runs']} runs back within {s['goal_seconds']:.0f} s "
            f"(median {s['median_seconds']} s, max {s['max_seconds']} s): {times}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=30000)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument(
        "--cap", type=float, default=180.0, help="seconds a run may take before it counts as not back"
    )
    ap.add_argument(
        "--slow", type=float, default=GOAL_SECONDS, help="keep the pass lines of runs slower than this"
    )
    ap.add_argument("--out", type=Path, default=record.RESULTS, help="directory (rack_loss.json)")
    ap.add_argument(
        "--baseline-ref", default=None, help="an earlier commit's operator, run first on the same factory"
    )
    args = ap.parse_args(argv)
    started = time.time()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-rack-loss-"))
    result = run(args.runs, args.port_base, run_dir, args.cap, args.slow, args.baseline_ref)
    path = record.save("rack_loss", result, args.out, "e2e.bench.rack_loss_bench", argv, started)
    print(report(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
