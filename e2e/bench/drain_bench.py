"""Zero dropped requests: groups removed under steady load with long outputs, on a live Dynamo fleet.

Three ways a group goes, each played by three contestants in the same run:
- tokenfab: its drain (drainSeconds 600, drainMode routing): out of routing first, deleted once its engine
  reports nothing in flight, pods with a grace period to match;
- baseline_long_grace: plain deletion with a grace period long enough for the longest stream
  (drainSeconds 600, drainMode sigterm: deleted at once, each engine finishing its streams on SIGTERM,
  Dynamo's own graceful shutdown, as a plain workload with a long terminationGracePeriodSeconds would);
- baseline: plain deletion with Kubernetes' default 30 s grace (drainSeconds 0).

The removals:
- scale_down: the autoscaler takes decode from 4 groups to 1 as the load stays low;
- rollout: the engine config changes, so every group is replaced by a new generation;
- node_drain: `kubectl drain` of a node under a decode group (an eviction, outside tokenfab's control).

aiperf plays a steady trace (0.5 requests/s of long streams: 450 tokens, 45-80 s each at the runner's
speedup 0.3, longer on fewer groups) through the frontend. Every request the trace intended is counted
once (e2e/fleet/load.py `account`): sent (the frontend's own counter), completed (every token asked
for), failed (an error, cut short, or still pending when aiperf stopped waiting), never sent. A run that
delivers less than 80% of what it intended fails loudly: it measured nothing. Saved (e2e/record.py)
to e2e/bench/results/drain.json and its history copy as {"scenarios": {scenario: {contestant: {requests:
{intended, sent, completed, failed, never_sent}, ttft_p99_ms, drain_seconds, ...}}}}; nothing passes or
fails on a time.

    python -m e2e.bench.drain_bench                 # every scenario, about 30 minutes
    python -m e2e.bench.drain_bench --smoke --out /tmp/drain   # the test suite's short pair
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import record
from e2e.fleet import fleet, load, plot
from e2e.helpers import apply_yaml, get_json, kubectl, start_operator, wait_established, wait_for
from tokenfab.planning import contract
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

ROOT = record.ROOT
SCENARIOS = ("scale_down", "rollout", "node_drain")
# contestant -> (drainSeconds, drainMode)
POLICIES = {"tokenfab": (600, "routing"), "baseline_long_grace": (600, "sigterm"), "baseline": (0, "routing")}
DELIVERED = 0.8  # of the intended requests, at least, or the run measured nothing


@dataclass
class Plan:
    """One scenario's load and timing."""

    qps: float = 0.5
    osl: int = 450  # at the runner's speedup 0.3 a stream lasts 45-80 s, longer on fewer groups
    grace_s: float = 300.0  # how long aiperf waits for the streams still open when the trace ends
    isl: int = 96
    warm_s: float = 40.0  # load before the event
    after_s: float = 110.0  # load after it
    decode: int = 4
    speedup: float = 0.3
    concurrency: int = 64
    extra: dict[str, Any] = field(default_factory=dict)

    def points(self) -> list[load.Point]:
        return load.steady(self.qps, self.warm_s + self.after_s)


SMOKE = Plan(decode=3, warm_s=30, after_s=70)


SMOKE_CONTESTANTS = ("tokenfab", "baseline")
# The rollout removes every group with streams open on each: the one scenario where the 30 s grace always
# has something to cut (a scale-down removes groups at low load; it may cut nothing).
SMOKE_SCENARIOS = ("rollout",)


def namespaces(scenarios: tuple[str, ...], contestants: tuple[str, ...] = tuple(POLICIES)) -> tuple[str, ...]:
    return tuple(namespace(s, p) for s in scenarios for p in contestants)


def namespace(scenario: str, policy: str) -> str:
    """A DNS label (a namespace name allows no underscore)."""
    return f"live-dr-{scenario}-{policy}".replace("_", "-")


def manifest(f: Factory, ns: str, scenario: str, policy: tuple[int, str], plan: Plan) -> dict[str, Any]:
    doc = fleet.manifest(f, ns, "drainee", autoscaling=scenario == "scale_down", decode_replicas=plan.decode)
    spec = doc["spec"]
    spec["serving"]["drainSeconds"], spec["serving"]["drainMode"] = policy
    spec["serving"]["prefillDecodeRatio"] = "1:4"
    a = spec["autoscaling"]
    a["prometheusUrl"] = f.prometheus_url  # drains read the engines' in-flight counts from Prometheus
    if scenario == "scale_down":
        a.update({"targetKvCacheUtilization": 0.9, "scaleDownStabilizationSeconds": 20, "warmupSeconds": 5})
        a["decode"] = {"minReplicas": 1, "maxReplicas": plan.decode}
    return doc


def groups(f: Factory, ns: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in get_json(f, "pods", "-n", ns, "-l", f"{contract.COMPONENT}=worker")["items"]:
        out.setdefault(p["metadata"]["labels"][contract.LABEL_GROUP], []).append(p)
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
        (g for g in groups(f, ns).items() if g[1][0]["metadata"]["labels"][contract.LABEL_ROLE] == "decode"),
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
    if scenario == "rollout" and any(
        p["metadata"]["labels"][contract.LABEL_REVISION] == old_revision for p in pods
    ):
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
    url = fleet.serving(f, ns, "drainee")
    old_revision = next(iter(groups(f, ns).values()))[0]["metadata"]["labels"][contract.LABEL_REVISION]
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
        grace_s=plan.grace_s,
    )
    started_before = fleet.requests_started(url)
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
    started_after = fleet.requests_started(url)
    sent = None if started_before is None or started_after is None else started_after - started_before
    requests = load.account(records, load.intended(plan.points()), sent, plan.osl)
    if requests["sent"] < DELIVERED * requests["intended"]:
        raise RuntimeError(
            f"{ns}: the load was not delivered, so nothing was measured: {requests} (see {run.artifact_dir})"
        )
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None and not r.error]
    streams = [r.latency_ms / 1000 for r in records if r.complete(plan.osl) and r.latency_ms is not None]
    events = get_json(f, "events", "-n", ns, "--field-selector", "involvedObject.name=drainee")["items"]
    reasons: dict[str, int] = {}
    for e in events:
        reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
    fleet.delete_deployment(f, ns, "drainee")
    return {
        "requests": requests,
        "errors": sum(1 for r in records if r.error),
        "cut_short": sum(1 for r in records if not r.error and r.output_tokens < plan.osl),
        # sent but never answered before aiperf stopped waiting (counted in failed)
        "pending_at_end": requests["sent"] - requests["recorded"],
        "stream_p50_s": None if not streams else round(load.percentile(streams, 0.5) or 0, 1),
        "ttft_p99_ms": None if not ttft else round(load.percentile(ttft, 0.99) or 0, 1),
        "drain_seconds": drain_s,
        "event": event,
        "event_reasons": reasons,
    }


def run(
    f: Factory,
    tools: fleet.Tools,
    scenarios: tuple[str, ...],
    plan: Plan,
    work: Path,
    contestants: tuple[str, ...] = tuple(POLICIES),
) -> dict[str, Any]:
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
        for policy in contestants:
            print(f"drain bench: {scenario} / {policy}", flush=True)
            out["scenarios"][scenario][policy] = run_one(f, tools, scenario, policy, plan, work)
            print(json.dumps(out["scenarios"][scenario][policy]), flush=True)
    return out


def rows(result: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(scenario, contestant, its requests, its figures) for each run of a drain.json."""
    for scenario, by in result["scenarios"].items():
        for policy, r in by.items():
            yield scenario, policy, r["requests"], r


def table(result: dict[str, Any]) -> str:
    lines = [
        "scenario     contestant           intended  sent  completed  failed  never sent  cut  pending"
        "  stream p50 s  TTFT p99 ms  drain s"
    ]
    for scenario, policy, q, r in rows(result):
        lines.append(
            f"{scenario:12} {policy:20} {q['intended']:8} {q['sent']:5} {q['completed']:10} "
            f"{q['failed']:7} {q['never_sent']:11} {r['cut_short']:4} {r.get('pending_at_end')!s:>8} "
            f"{r.get('stream_p50_s')!s:>13} {r['ttft_p99_ms']!s:>12} {r['drain_seconds']!s:>8}"
        )
    return "\n".join(lines)


def bring_up(
    run_dir: Path,
    port_base: int,
    tools: fleet.Tools,
    plan: Plan,
    scenarios: tuple[str, ...],
    contestants: tuple[str, ...],
) -> Factory:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    f.up()
    kubectl(f, "apply", "--server-side", "-f", str(ROOT / "crds"))
    wait_established(f)
    start_operator(f, port_base + 20)
    fleet.start_runner(f, tools, speedup_ratio=plan.speedup, namespaces=namespaces(scenarios, contestants))
    return f


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short rollout pair")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--port-base", type=int, default=30300)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument(
        "--out", type=Path, default=record.RESULTS, help="directory (drain.json, drain_smoke.json)"
    )
    a = ap.parse_args(argv)
    started = time.time()
    tools = fleet.tools()
    scenarios = SMOKE_SCENARIOS if a.smoke else tuple(s for s in a.scenarios.split(",") if s)
    plan = SMOKE if a.smoke else Plan()
    contestants = SMOKE_CONTESTANTS if a.smoke else tuple(POLICIES)
    run_dir = a.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-drain-"))
    f = bring_up(run_dir, a.port_base, tools, plan, scenarios, contestants)
    try:
        result = run(f, tools, scenarios, plan, run_dir / "work", contestants)
    finally:
        f.down()
    name = "drain_smoke" if a.smoke else "drain"
    path = record.save(name, result, a.out, "e2e.bench.drain_bench", argv, started)
    plot.drain(result, a.out / f"{name}.png")
    print(table(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
