"""Hardware faults under steady load on a live Dynamo fleet: requests lost, seconds until full capacity,
GPU-minutes of capacity lost, per fault kind, for tokenfab and two baselines in the same run.

The faults (injected by tokenfab_factory.faults, as a real cluster signals them):
- rack_loss: every Node of the rack holding a decode group deleted at once, with no warning; the runner
  kills the processes of pods on a gone Node at once, as the machine's death would;
- node_quarantine: NVSentinel's quarantine of a decode group's node (cordon, annotation, SysLogsXIDError
  condition, NoSchedule taint), then `drain_after_s` later its node drainer evicts every pod there;
- device_taint: a NoSchedule DRA device taint (DeviceTaintRule) on that node's IMEX channel, made
  NoExecute `drain_after_s` later (Kubernetes' device taint eviction controller then evicts its pods);
- worker_hang: that group's engine process stopped (SIGSTOP) on a healthy node: its /health stops
  answering, and the runner, as a kubelet, turns the pod not ready after 3 failed probes (30 s). Not in
  KINDS (its own results file: `--kinds worker_hang --name faults_worker_hang`); observed 130 s, not 70.

The contestants, each the operator with another TOKENFAB_FAULT_REACTION (tokenfab.planning.role_plan):
- tokenfab (replace): announced faults replaced first and drained; lost groups re-placed at once, their
  pods on a gone Node force-deleted;
- plain (none): plain Kubernetes: nothing moves before the eviction; a lost group's replacement waits for
  the pod garbage collector to remove its pods; a hung worker's pod only leaves its Service;
- gang_delete: a lost group deleted whole 30 s after the fault (Grove's gang termination), then replaced.

aiperf plays a steady trace through the frontend; every intended request is counted once (intended =
completed + failed + never sent, e2e/fleet/load.py). Capacity is sampled every half second: the GPUs of the
groups whose every pod is Ready on a Node that exists. recovery_s: from the fault to the first sample with
the full capacity again and no group left on a faulted node (for a hung worker: its group gone; it counts
as capacity until its readiness probe fails, as a kubelet's would, though its streams hang);
gpu_minutes_lost: the missing GPUs integrated over the observation. Times are measured on the factory
(simulated nodes, mocker engines that start in a few seconds): they show the control plane's reaction, not
a real engine's start. Saved (e2e/record.py) to e2e/bench/results/faults.json as {"runs":
[{"faults": {kind: {contestant: {requests, recovery_s, gpu_minutes_lost, ...}}}}]}; nothing passes or
fails on a time.

    python -m e2e.bench.fault_bench                   # 3 kinds x 3 contestants, twice: about 35 minutes
    python -m e2e.bench.fault_bench --smoke --out /tmp/faults   # the suite's short pair
    python -m e2e.bench.fault_bench --kinds worker_hang --name faults_worker_hang   # about 15 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e import record
from e2e.fleet import fleet, load
from e2e.helpers import apply_yaml, get_json, kubectl, operator_up, wait_established, wait_for
from tokenfab.planning import contract
from tokenfab_factory import faults
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL, RACK_LABEL

KINDS = ("rack_loss", "node_quarantine", "device_taint")
ANNOUNCED = ("node_quarantine", "device_taint")
REACTIONS = {"tokenfab": "replace", "plain": "none", "gang_delete": "gang-delete"}
SMOKE_KINDS = ("rack_loss",)
SMOKE_CONTESTANTS = ("tokenfab", "plain")
DELIVERED = 0.8
NAME = "faulted"


@dataclass
class Plan:
    qps: float = 1.0
    osl: int = 150  # streams of 15-25 s at the runner's speedup
    isl: int = 96
    warm_s: float = 20.0
    after_s: float = 70.0  # (plain Kubernetes' pod garbage collector takes 40 s to remove a gone Node's pods)
    drain_after_s: float = 30.0  # announced faults: the eviction follows this long after the warning
    decode: int = 4
    speedup: float = 0.3
    concurrency: int = 64
    grace_s: float = 120.0

    hang_after_s: float = 130.0  # a hung worker: 30 s to its readiness verdict, then its group's fate

    def observed_s(self, kind: str) -> float:
        return self.hang_after_s if kind == "worker_hang" else self.after_s

    def points(self, kind: str) -> list[load.Point]:
        return load.steady(self.qps, self.warm_s + self.observed_s(kind))


SMOKE = Plan(warm_s=20, after_s=50, decode=3)


def namespace(kind: str, contestant: str, run: int = 0) -> str:
    return f"live-ft-{kind}-{contestant}-{run}".replace("_", "-")


def namespaces(kinds: tuple[str, ...], contestants: tuple[str, ...], runs: int) -> tuple[str, ...]:
    return tuple(namespace(k, x, r) for r in range(runs) for k in kinds for x in contestants)


def manifest(f: Factory, ns: str, plan: Plan) -> dict[str, Any]:
    doc = fleet.manifest(f, ns, NAME, autoscaling=False, decode_replicas=plan.decode)
    spec = doc["spec"]
    spec["serving"]["drainSeconds"], spec["serving"]["drainMode"] = 600, "routing"
    # One prefill group per decode group: each decode group is a prefill-decode unit of its own, kept whole
    # in one rack, and spread puts the units on several racks, so a lost rack takes one unit and the
    # others serve. (At 1:4, the deployment's decode groups and their prefill group are one unit in one
    # rack: a rack loss takes everything, the frontend too when it shares that rack.)
    spec["serving"]["prefillDecodeRatio"] = "1:1"
    spec.setdefault("topology", {})["placement"] = "spread"  # (units on several racks)
    return doc


def pods(f: Factory, ns: str) -> list[dict[str, Any]]:
    sel = f"{contract.LABEL_DEPLOYMENT}={NAME}"
    items: list[dict[str, Any]] = get_json(f, "pods", "-n", ns, "-l", sel)["items"]
    return items


def _role(p: dict[str, Any]) -> str:
    return str(p["metadata"]["labels"].get(contract.LABEL_ROLE, ""))


def _ready(p: dict[str, Any]) -> bool:
    conds = (p.get("status") or {}).get("conditions") or []
    return not p["metadata"].get("deletionTimestamp") and any(
        cd["type"] == "Ready" and cd["status"] == "True" for cd in conds
    )


@dataclass
class Sample:
    t: float
    gpus: int  # GPUs of serving groups on nodes that exist
    on_faulted: int  # groups with a pod on a faulted node
    split: int  # groups whose bound pods sit in two NVLink domains


def sample(f: Factory, ns: str, faulted: set[str], t0: float) -> Sample:
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(f, "nodes")["items"]}
    by_group: dict[str, list[dict[str, Any]]] = {}
    for p in pods(f, ns):
        if contract.LABEL_GROUP in p["metadata"]["labels"]:
            by_group.setdefault(p["metadata"]["labels"][contract.LABEL_GROUP], []).append(p)
    gpus = on_faulted = split = 0
    for group, members in by_group.items():
        bound = [p["spec"].get("nodeName") for p in members if p["spec"].get("nodeName")]
        if len({nodes.get(n, {}).get(CLIQUE_LABEL) for n in bound}) > 1:
            split += 1
        if group in faulted or any(n in faulted for n in bound):
            on_faulted += 1
        if all(_ready(p) and p["spec"].get("nodeName") in nodes for p in members):
            gpus += int(members[0]["metadata"]["annotations"].get(contract.ANN_GROUP_GPUS, 0))
    return Sample(round(time.monotonic() - t0, 2), gpus, on_faulted, split)


def target(f: Factory, ns: str) -> tuple[str, list[str]]:
    """The decode group to hit, and the nodes the fault takes: the rack holding it (not the frontend's
    rack, when another holds a decode group), or its node."""
    items = pods(f, ns)
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(f, "nodes")["items"]}
    front = {
        nodes[p["spec"]["nodeName"]][RACK_LABEL]
        for p in items
        if p["metadata"]["labels"].get(contract.COMPONENT) == "frontend"
    }
    decode = sorted(
        (p for p in items if _role(p) == "decode" and p["spec"].get("nodeName")),
        key=lambda p: (nodes[p["spec"]["nodeName"]][RACK_LABEL] in front, p["metadata"]["name"]),
    )
    node = decode[0]["spec"]["nodeName"]
    return node, [n for n, lab in nodes.items() if lab[RACK_LABEL] == nodes[node][RACK_LABEL]]


def inject(
    f: Factory, ns: str, kind: str, node: str, rack: list[str], plan: Plan
) -> tuple[set[str], threading.Thread | None]:
    """Start the fault; returns the faulted nodes (or, for a hung worker, its group) and the thread that
    escalates an announced one."""
    if kind == "rack_loss":
        faults.lose(f, rack)
        return set(rack), None
    if kind == "worker_hang":
        on_node = [p for p in pods(f, ns) if _role(p) == "decode" and p["spec"].get("nodeName") == node]
        worker = on_node[0]["metadata"]
        print(faults.hang(f, ns, worker["name"]), flush=True)
        return {worker["labels"][contract.LABEL_GROUP]}, None  # (recovered once that group is gone)
    if kind == "node_quarantine":
        faults.quarantine(f, node)
        later = lambda: faults.drain(f, node, timeout=60)  # noqa: E731
    else:
        faults.taint_device(f, node, effect="NoSchedule")
        later = lambda: faults.taint_device(f, node, effect="NoExecute")  # noqa: E731

    def escalate() -> None:
        time.sleep(plan.drain_after_s)
        later()

    thread = threading.Thread(target=escalate, daemon=True)
    thread.start()
    return {node}, thread


def observe(f: Factory, ns: str, faulted: set[str], full: int, seconds: float) -> list[Sample]:
    t0, out = time.monotonic(), []
    while time.monotonic() - t0 < seconds:
        out.append(sample(f, ns, faulted, t0))
        time.sleep(0.5)
    return out


def figures(samples: list[Sample], full: int, announced: bool, drain_after: float) -> dict[str, Any]:
    """recovery_s: first sample, after the fault took effect (at once for a sudden one, at the eviction
    for an announced one), with full capacity and nothing on a faulted node."""
    lost = 0.0
    for a, b in itertools.pairwise(samples):
        lost += max(0, full - a.gpus) * (b.t - a.t)
    effect = drain_after if announced else 0.0
    whole = [s.t for s in samples if s.gpus >= full and s.on_faulted == 0]
    # (an announced fault handled before the eviction: recovered at the first such sample, even before it)
    recovery = next((t for t in whole if announced or t >= effect), None)
    return {
        "recovery_s": None if recovery is None else round(recovery, 1),
        "gpu_minutes_lost": round(lost / 60, 3),
        "min_gpus": min((s.gpus for s in samples), default=0),
        "full_gpus": full,
        "split_groups_seen": max((s.split for s in samples), default=0),
    }


def run_one(
    f: Factory, tools: fleet.Tools, kind: str, contestant: str, plan: Plan, work: Path, run: int, port: int
) -> dict[str, Any]:
    operator_up(
        f, port, {"TOKENFAB_FAULT_REACTION": REACTIONS[contestant], "TOKENFAB_GANG_DELETE_SECONDS": "30"}
    )
    ns = namespace(kind, contestant, run)
    fleet.ensure_namespace(f, ns)
    apply_yaml(f, manifest(f, ns, plan))
    wait_for(
        f"{ns} ready",
        lambda: (fleet.role_status(f, ns, NAME).get("decode") or {}).get("readyGroups") == plan.decode,
        timeout=240,
    )
    url = fleet.serving(f, ns, NAME)
    full = sample(f, ns, set(), time.monotonic()).gpus
    aiperf = load.AiperfRun(
        aiperf=tools.aiperf,
        url=url,
        model=fleet.MODEL_NAME,
        tokenizer_dir=fleet.model_dir(tools),
        points=plan.points(kind),
        artifact_dir=work / f"{kind}-{contestant}-{run}",
        isl=plan.isl,
        osl=plan.osl,
        concurrency=plan.concurrency,
        grace_s=plan.grace_s,
    )
    started_before = fleet.requests_started(url)
    aiperf.start()
    node, rack = "", []
    try:
        time.sleep(plan.warm_s)
        node, rack = target(f, ns)
        faulted, escalation = inject(f, ns, kind, node, rack, plan)
        samples = observe(f, ns, faulted, full, plan.observed_s(kind))
        if escalation is not None:
            escalation.join(timeout=90)
        aiperf.wait(timeout=load.duration(plan.points(kind)) + aiperf.grace_s + 120)
    finally:
        aiperf.stop()
        faults.heal(f)
    records = aiperf.records()
    started_after = fleet.requests_started(url)
    sent = None if started_before is None or started_after is None else started_after - started_before
    requests = load.account(records, load.intended(plan.points(kind)), sent, plan.osl)
    if requests["sent"] < DELIVERED * requests["intended"]:
        raise RuntimeError(f"{ns}: the load was not delivered, so nothing was measured: {requests}")
    status = get_json(f, "mdep", NAME, "-n", ns).get("status") or {}
    reasons: dict[str, int] = {}
    for e in get_json(f, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME}")["items"]:
        reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
    fleet.delete_deployment(f, ns, NAME)
    return {
        "requests": requests,
        **figures(samples, full, kind in ANNOUNCED, plan.drain_after_s),
        "fault": {"kind": kind, "node": node, "nodes": len(rack) if kind == "rack_loss" else 1},
        "fault_records": status.get("faults", []),
        "event_reasons": reasons,
    }


def run(
    f: Factory,
    tools: fleet.Tools,
    kinds: tuple[str, ...],
    contestants: tuple[str, ...],
    plan: Plan,
    work: Path,
    run_index: int,
    port: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {"faults": {}}
    for kind in kinds:
        out["faults"][kind] = {}
        for contestant in contestants:
            print(f"fault bench run {run_index}: {kind} / {contestant}", flush=True)
            r = run_one(f, tools, kind, contestant, plan, work, run_index, port)
            out["faults"][kind][contestant] = r
            print(json.dumps({k: v for k, v in r.items() if k != "fault_records"}), flush=True)
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "run  fault            contestant    intended  sent  completed  failed  never sent  recovery s"
        "  GPU-min lost  min GPUs"
    ]
    for i, r in enumerate(result["runs"]):
        for kind, by in r["faults"].items():
            for who, x in by.items():
                q = x["requests"]
                lines.append(
                    f"{i:3}  {kind:16} {who:12} {q['intended']:9} {q['sent']:5} {q['completed']:10} "
                    f"{q['failed']:7} {q['never_sent']:11} {x['recovery_s']!s:>11} "
                    f"{x['gpu_minutes_lost']:13} {x['min_gpus']:4}/{x['full_gpus']}"
                )
    return "\n".join(lines)


def bring_up(
    run_dir: Path, port_base: int, tools: fleet.Tools, plan: Plan, names: tuple[str, ...]
) -> Factory:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    f.up()
    kubectl(f, "apply", "--server-side", "-f", str(record.ROOT / "crds"))
    wait_established(f)
    fleet.start_runner(f, tools, speedup_ratio=plan.speedup, namespaces=names)
    return f


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short pair: rack loss, tokenfab and plain")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--name", default="faults", help="results file name (without .json)")
    ap.add_argument("--port-base", type=int, default=30400)
    ap.add_argument(
        "--out", type=Path, default=record.RESULTS, help="directory (faults.json, faults_smoke.json)"
    )
    a = ap.parse_args(argv)
    started = time.time()
    tools = fleet.tools()
    kinds = SMOKE_KINDS if a.smoke else tuple(k for k in a.kinds.split(",") if k)
    contestants = SMOKE_CONTESTANTS if a.smoke else tuple(REACTIONS)
    runs = 1 if a.smoke else a.runs
    plan = SMOKE if a.smoke else Plan()
    run_dir = Path(tempfile.mkdtemp(prefix="tokenfab-faults-"))
    f = bring_up(run_dir, a.port_base, tools, plan, namespaces(kinds, contestants, runs))
    try:
        result: dict[str, Any] = {
            "benchmark": "faults",
            "plan": {
                "qps": plan.qps,
                "osl": plan.osl,
                "decode_groups": plan.decode,
                "drain_after_s": plan.drain_after_s,
                "observed_s": plan.after_s,
                "hang_observed_s": plan.hang_after_s,
                "runner_speedup": plan.speedup,
            },
            "runs": [
                run(f, tools, kinds, contestants, plan, run_dir / "work", i, a.port_base + 20)
                for i in range(runs)
            ],
        }
    finally:
        f.down()
    name = "faults_smoke" if a.smoke else a.name
    path = record.save(name, result, a.out, "e2e.bench.fault_bench", argv, started)
    print(table(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
