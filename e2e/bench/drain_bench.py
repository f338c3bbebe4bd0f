"""Zero dropped requests: groups removed under steady load with long outputs, on a live Dynamo fleet.

Three ways a group goes, each played twice in the same run: with tokenfab's drain (drainSeconds 600: out
of routing first, deleted once its engine reports nothing in flight, pods with a grace period to match)
and with plain deletion (drainSeconds 0: deleted at once, Kubernetes' 30 s grace period, the baseline):

- scale_down: the autoscaler takes decode from 4 groups to 1 as the load stays low;
- rollout: the engine config changes, so every group is replaced by a new generation;
- node_drain: `kubectl drain` of a node under a decode group (an eviction, outside tokenfab's control).

aiperf plays a steady trace (long streams, about 40 s each) through the frontend; every request's record
says whether it completed (all its tokens), failed (an error) or was cut short. Saved to
e2e/bench/results/drain.json as {"scenarios": {scenario: {"tokenfab"|"baseline": {sent, completed,
failed, ttft_p99_ms, drain_seconds}}}}; nothing passes or fails on a time.

    python -m e2e.bench.drain_bench                 # every scenario, about 20 minutes
    python -m e2e.bench.drain_bench --smoke         # one short scale-down pair (the test suite's)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.fleet import fleet, load, plot
from e2e.helpers import apply_yaml, get_json, kubectl, start_operator, wait_for
from tokenfab.planning import contract as c
from tokenfab_factory.factory import Factory, FactoryConfig

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "e2e" / "bench" / "results"
SCENARIOS = ("scale_down", "rollout", "node_drain")
POLICIES = {"tokenfab": 600, "baseline": 0}  # drainSeconds


@dataclass
class Plan:
    """One scenario's load and timing."""

    qps: float = 0.5
    osl: int = 450  # at the runner's speedup 0.1 a stream lasts about 40 s
    isl: int = 96
    warm_s: float = 40.0  # load before the event
    after_s: float = 110.0  # load after it
    decode: int = 4
    speedup: float = 0.1
    concurrency: int = 64
    extra: dict[str, Any] = field(default_factory=dict)

    def points(self) -> list[load.Point]:
        return load.steady(self.qps, self.warm_s + self.after_s)


SMOKE = Plan(decode=3, warm_s=30, after_s=70)


def namespaces(scenarios: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(namespace(s, p) for s in scenarios for p in POLICIES)


def namespace(scenario: str, policy: str) -> str:
    return f"live-dr-{scenario.replace('_', '-')}-{policy}"


def manifest(f: Factory, ns: str, scenario: str, drain: int, plan: Plan) -> dict[str, Any]:
    doc = fleet.manifest(f, ns, "drainee", autoscaling=scenario == "scale_down", decode_replicas=plan.decode)
    spec = doc["spec"]
    spec["serving"]["drainSeconds"] = drain
    spec["serving"]["prefillDecodeRatio"] = "1:4"
    a = spec["autoscaling"]
    a["prometheusUrl"] = f.prometheus_url  # drains read the engines' in-flight counts from Prometheus
    if scenario == "scale_down":
        a.update({"targetKvCacheUtilization": 0.9, "scaleDownStabilizationSeconds": 20, "warmupSeconds": 5})
        a["decode"] = {"minReplicas": 1, "maxReplicas": plan.decode}
    return doc


def groups(f: Factory, ns: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in get_json(f, "pods", "-n", ns, "-l", f"{c.COMPONENT}=worker")["items"]:
        out.setdefault(p["metadata"]["labels"][c.LABEL_GROUP], []).append(p)
    return out


def trigger(f: Factory, ns: str, scenario: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Cause the scenario's removals; returns what was done (the node drained, the new revision...)."""
    if scenario == "scale_down":
        return {"what": "the autoscaler scales decode down as utilization stays low"}
    if scenario == "rollout":
        doc["spec"]["decode"]["maxBatchSize"] = 96  # an engine config change: a new generation
        apply_yaml(f, doc)
        return {"what": "decode maxBatchSize changed"}
    decode = sorted(
        (g for g in groups(f, ns).items() if g[1][0]["metadata"]["labels"][c.LABEL_ROLE] == "decode"),
        key=lambda kv: kv[0],
    )
    node = decode[0][1][0]["spec"]["nodeName"]
    kubectl(f, "drain", node, "--force", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s")
    return {"what": f"kubectl drain {node}", "node": node}


def settled(f: Factory, ns: str, scenario: str, plan: Plan, old_revision: str) -> bool:
    md = get_json(f, "mdep", "drainee", "-n", ns)
    status = md.get("status") or {}
    if status.get("drainingGroups"):
        return False
    pods = [p for g in groups(f, ns).values() for p in g]
    if scenario == "rollout" and any(p["metadata"]["labels"][c.LABEL_REVISION] == old_revision for p in pods):
        return False
    want = 1 if scenario == "scale_down" else plan.decode
    ready = ((status.get("roles") or {}).get("decode") or {}).get("readyGroups")
    return bool(ready == want)


def run_one(
    f: Factory, tools: fleet.Tools, scenario: str, policy: str, plan: Plan, work: Path
) -> dict[str, Any]:
    ns = namespace(scenario, policy)
    fleet.ensure_namespace(f, ns)
    doc = manifest(f, ns, scenario, POLICIES[policy], plan)
    apply_yaml(f, doc)
    wait_for(
        f"{ns}: {plan.decode} decode groups Ready",
        lambda: (fleet.role_status(f, ns, "drainee").get("decode") or {}).get("readyGroups") == plan.decode,
        timeout=240,
    )
    url = fleet.frontend_url(f, ns, "drainee")
    fleet.warm_up(url)
    old_revision = next(iter(groups(f, ns).values()))[0]["metadata"]["labels"][c.LABEL_REVISION]
    run = load.AiperfRun(
        aiperf=tools.aiperf,
        url=url,
        model=fleet.MODEL_NAME,
        tokenizer_dir=fleet.model_dir(tools),
        points=plan.points(),
        artifact_dir=work / f"{scenario}-{policy}",
        isl=plan.isl,
        osl=plan.osl,
        concurrency=plan.concurrency,
        grace_s=120,
    )
    run.start()
    event: dict[str, Any] = {}
    drain_s: float | None = None
    try:
        time.sleep(plan.warm_s)
        t_event = time.monotonic()
        event = trigger(f, ns, scenario, doc)
        try:
            wait_for(
                f"{ns} settled", lambda: settled(f, ns, scenario, plan, old_revision), timeout=900, interval=2
            )
            drain_s = round(time.monotonic() - t_event, 1)
        except AssertionError:
            drain_s = None
        run.wait(timeout=load.duration(plan.points()) + run.grace_s + 300)
    finally:
        run.stop()
        if event.get("node"):
            kubectl(f, "uncordon", event["node"], check=False)
    records = run.records()
    complete = [r for r in records if not r.error and r.output_tokens >= plan.osl]
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None and not r.error]
    events = get_json(f, "events", "-n", ns, "--field-selector", "involvedObject.name=drainee")["items"]
    reasons: dict[str, int] = {}
    for e in events:
        reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
    fleet.delete_deployment(f, ns, "drainee")
    return {
        "sent": len(records),
        "completed": len(complete),
        "failed": len(records) - len(complete),
        "errors": sum(1 for r in records if r.error),
        "cut_short": sum(1 for r in records if not r.error and r.output_tokens < plan.osl),
        "ttft_p99_ms": None if not ttft else round(load.percentile(ttft, 0.99) or 0, 1),
        "drain_seconds": drain_s,
        "event": event,
        "event_reasons": reasons,
    }


def run(f: Factory, tools: fleet.Tools, scenarios: tuple[str, ...], plan: Plan, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {
        "benchmark": "drain",
        "plan": {
            "qps": plan.qps,
            "isl": plan.isl,
            "osl": plan.osl,
            "decode_groups": plan.decode,
            "runner_speedup": plan.speedup,
        },
        "scenarios": {},
    }
    for scenario in scenarios:
        out["scenarios"][scenario] = {}
        for policy in ("baseline", "tokenfab"):
            print(f"drain bench: {scenario} / {policy}", flush=True)
            out["scenarios"][scenario][policy] = run_one(f, tools, scenario, policy, plan, work)
            print(json.dumps(out["scenarios"][scenario][policy]), flush=True)
    return out


def table(result: dict[str, Any]) -> str:
    lines = ["scenario     policy    sent  completed  failed  cut  TTFT p99 ms  drain s"]
    for scenario, pair in result["scenarios"].items():
        for policy, r in pair.items():
            lines.append(
                f"{scenario:12} {policy:8} {r['sent']:5} {r['completed']:10} {r['failed']:7} "
                f"{r['cut_short']:4} {r['ttft_p99_ms']!s:>12} {r['drain_seconds']!s:>8}"
            )
    return "\n".join(lines)


def bring_up(
    run_dir: Path, port_base: int, tools: fleet.Tools, plan: Plan, scenarios: tuple[str, ...]
) -> Factory:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    f.up()
    kubectl(f, "apply", "--server-side", "-f", str(ROOT / "crds"))
    kubectl(f, "wait", "--for=condition=Established", "crd/modeldeployments.tokenfab.dev", "--timeout=60s")
    start_operator(f, port_base + 20)
    fleet.start_runner(f, tools, speedup_ratio=plan.speedup, namespaces=namespaces(scenarios))
    return f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short scale-down pair")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--port-base", type=int, default=30300)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "drain.json")
    a = ap.parse_args(argv)
    tools = fleet.tools()
    scenarios = ("scale_down",) if a.smoke else tuple(s for s in a.scenarios.split(",") if s)
    plan = SMOKE if a.smoke else Plan()
    run_dir = a.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-drain-"))
    f = bring_up(run_dir, a.port_base, tools, plan, scenarios)
    try:
        result = run(f, tools, scenarios, plan, run_dir / "work")
    finally:
        f.down()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    if not a.smoke:
        plot.drain(result, a.out.with_suffix(".png"))
    print(table(result))
    print(f"saved {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
