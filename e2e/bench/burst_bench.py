"""A burst of ModelDeployments on the local AI factory, with one operator and with two replicas.

30 mixed deployments (e2e.fleetmix's small mix, the suite's burst) are applied in one `kubectl apply` on
4 racks, and the benchmark looks every half second until the burst has settled: every deployment observed
and Ready (or Placed=False: no room), no worker pod Pending. It runs with one operator, and with two
replicas under --leader-elect (only the Lease's holder writes), alternately, `--runs` times each, on one
factory; each run in a namespace of its own, deleted before the next. Recorded per run: the seconds
`kubectl apply` took to send the burst, the seconds until settled, the Lease's holder and transitions,
and whether each replica is still alive (a leader that lost its Lease exits). Saved (e2e/record.py) to
e2e/bench/results/burst.json (or --out DIR); nothing passes or fails on a time. Times come from simulated
nodes whose pods turn Ready at once: they show the control plane's and the operator's work.

    python -m e2e.bench.burst_bench                  # 3 runs each way, about 6 minutes
    python -m e2e.bench.burst_bench --runs 1 --out /tmp/burst   # a smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import record
from e2e.fleetmix import fleet
from e2e.helpers import install_crds, kubectl, wait_for, wait_healthy
from e2e.test_fleet_burst import settled
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

DEPLOYMENTS = 30
GOAL_SECONDS = 10.0
LEASE_NS = "default"


def start(f: Factory, mode: str, port: int) -> None:
    if mode == "one":
        f.start_extra("operator", Factory.operator_argv(port))
        wait_healthy(port, "the operator healthy", timeout=120)
        return
    for i, name in enumerate(("replica-a", "replica-b")):
        argv = [*Factory.operator_argv(port + 2 * i), "--leader-elect"]
        f.start_extra(name, argv, env={"TOKENFAB_LEASE_NAMESPACE": LEASE_NS, "POD_NAME": name})
    for i in range(2):
        wait_healthy(port + 2 * i, "a replica healthy", timeout=120)
    wait_for("a leader", lambda: bool(lease(f).get("holderIdentity")), timeout=90)


def lease(f: Factory) -> dict[str, Any]:
    out = kubectl(f, "get", "lease", "tokenfab-operator", "-n", LEASE_NS, "-o", "json", check=False)
    return dict(json.loads(out.stdout)["spec"]) if out.returncode == 0 else {}


def one_run(f: Factory, mode: str, i: int, port: int, cap: float) -> dict[str, Any]:
    ns = f"burst-{mode}-{i}"
    start(f, mode, port)
    alive0 = dict(f.extra_pids())
    kubectl(f, "create", "namespace", ns)
    docs = fleet(DEPLOYMENTS, ns, prefix="b")
    t0 = time.monotonic()
    kubectl(f, "apply", "--server-side", "--field-manager=gitops", "-f", "-", input=yaml.safe_dump_all(docs))
    sent = time.monotonic() - t0
    took: float | None
    try:
        wait_for("settled", lambda: settled(f, ns, DEPLOYMENTS), timeout=cap, interval=0.5)
        took = round(time.monotonic() - t0, 1)
    except AssertionError:
        took = None
    held = lease(f) if mode == "two" else {}
    out = {
        "mode": mode,
        "run": i,
        "apply_seconds": round(sent, 1),
        "settled_seconds": took,
        "lease_transitions": held.get("leaseTransitions"),
        "alive": {name: Path(f"/proc/{pid}").exists() for name, pid in alive0.items()},
    }
    print(f"{mode} replica(s), run {i}: sent in {out['apply_seconds']} s, settled after {took} s")
    for name in alive0:
        f.stop_extra(name)
    kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=300s", check=False)
    kubectl(f, "delete", "lease", "tokenfab-operator", "-n", LEASE_NS, check=False)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("one", "two"):
        times = [r["settled_seconds"] for r in runs if r["mode"] == mode]
        done = [t for t in times if t is not None]
        out[mode] = {
            "runs": len(times),
            "settled": len(done),
            "within_goal": sum(1 for t in done if t <= GOAL_SECONDS),
            "median_seconds": round(statistics.median(done), 1) if done else None,
            "max_seconds": max(done) if done else None,
            "replicas_lost": sum(1 for r in runs if r["mode"] == mode and not all(r["alive"].values())),
        }
    return out


def run(runs: int, port_base: int, run_dir: Path, cap: float) -> dict[str, Any]:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    t0 = time.monotonic()
    f.up(timeout=600)
    result: dict[str, Any] = {"benchmark": "burst", "racks": 4, "deployments": DEPLOYMENTS}
    try:
        install_crds(f)
        port = port_base + 20
        result["runs"] = [one_run(f, mode, i, port, cap) for i in range(runs) for mode in ("one", "two")]
        result["summary"] = summary(result["runs"])
        result["goal_seconds"] = GOAL_SECONDS
    finally:
        f.down()
    result["total_seconds"] = round(time.monotonic() - t0, 1)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"a burst of {result['deployments']} deployments on {result['racks']} racks:"]
    for mode, s in result["summary"].items():
        times = ", ".join(str(r["settled_seconds"]) for r in result["runs"] if r["mode"] == mode)
        lines.append(
            f"  {mode} replica(s): {s['within_goal']} of {s['runs']} settled within {GOAL_SECONDS:.0f} s "
            f"(median {s['median_seconds']} s; {times}); replicas lost: {s['replicas_lost']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port-base", type=int, default=30000)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--cap", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=record.RESULTS, help="directory (burst.json)")
    args = ap.parse_args(argv)
    started = time.time()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-burst-"))
    result = run(args.runs, args.port_base, run_dir, args.cap)
    path = record.save("burst", result, args.out, "e2e.bench.burst_bench", argv, started)
    print(report(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
