"""Where KV transfers go on a live fleet: the DeepSeek-R1 example (examples/deepseek-r1-disaggregated.yaml,
two prefill-decode units of one 32-GPU decode group and one 8-GPU prefill group) served by real Dynamo
1.6.1 processes (the mocker in place of TensorRT-LLM, the fleet runner playing the kubelet) in the factory.

Each run applies the example, waits until its 20 worker pods are Ready, and sends `--requests` streamed
chat completions, `--concurrency` at a time, each asking Dynamo for its worker pair
(`nvext.extra_fields: ["worker_id"]`, e2e/fleet/pairing.py). Two observers count every request: the
client (the pair in the response) and the frontend's own log (its `request completed` line with
`prefill_worker_id` and `decode_worker_id`), joined by request id. Each worker's instance id comes from its
own log, and its pod from that: so each KV hand-over is counted inside its unit, inside one NVLink domain,
or across. The same run's baseline: the share inside a domain that pairing at random among the decode
workers would give (what Dynamo's router does without a KV-transfer domain), computed from the run's own
layout. TTFT is the client's (first streamed chunk), on the mocker's timing: not a GPU's. The path of every
unit is the operator's status.units. Then unit 0's decode group is lost (its leader pod deleted) and half as
many requests are sent at once: counted the same way, they show what `preferred` enforcement does while the
group is replaced (`required` would fail the requests whose prefill worker is unit 0's).

    python -m e2e.bench.fabric_live_bench            # two runs of 200 requests, under a minute on 2 cores
Saved (e2e/record.py) to e2e/bench/results/fabric_live.json; nothing passes or fails on a figure. The test
suite's short version is e2e/test_fleet.py::test_each_requests_kv_stays_inside_its_unit_...
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import record
from e2e.fleet import fleet, pairing
from e2e.helpers import apply_yaml, get_json, kubectl, start_operator, wait_established, wait_for
from tokenfab.planning import contract
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

ROOT = record.ROOT
NS = "live-fabric"
EXAMPLE = ROOT / "examples" / "deepseek-r1-disaggregated.yaml"


def example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = NS
    return doc


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def random_share(client: dict[str, pairing.Pair], pods: dict[int, str], domain_of: dict[str, str]) -> float:
    """The share of the client's transfers that would stay in a domain if each request's decode worker
    were drawn at random among the decode workers (the baseline)."""
    decodes = sorted({d for _, d in client.values() if d in pods})
    if not client or not decodes:
        return 0.0
    total = 0.0
    for p, _ in client.values():
        same = sum(domain_of.get(pods.get(p, "")) == domain_of.get(pods[d]) for d in decodes)
        total += same / len(decodes)
    return round(total / len(client), 4)


def one_run(f: Factory, requests: int, concurrency: int) -> dict[str, Any]:
    doc = example()
    name, model = doc["metadata"]["name"], doc["spec"]["model"]["name"]
    apply_yaml(f, doc)
    sel = f"{contract.LABEL_DEPLOYMENT}={name},{contract.LABEL_ROLE} in (prefill,decode)"

    def ready() -> list[dict[str, Any]] | None:
        items = get_json(f, "pods", "-n", NS, "-l", sel)["items"]
        ok = items and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            for p in items
        )
        return items if ok and len(items) == 20 else None

    t0 = time.monotonic()
    workers = wait_for("the example's 20 worker pods Ready", ready, timeout=600)
    url = fleet.frontend_url(f, NS, name, timeout=300)
    wait_for("a first request served", lambda: pairing.send(url, model, 1).completed == 1, 120, 2.0)
    up_s = time.monotonic() - t0
    labels = {p["metadata"]["name"]: p["metadata"]["labels"] for p in workers}
    unit_of = {n: lb.get(contract.LABEL_UNIT, "") for n, lb in labels.items()}
    domain_of = {n: lb[contract.LABEL_DOMAIN] for n, lb in labels.items()}
    sent = pairing.send(url, model, requests, concurrency)
    logs = fleet.state_dir(f) / "logs"
    pods = pairing.instance_ids(logs, NS)

    def counted() -> pairing.Tally | None:
        text = "".join(p.read_text(errors="replace") for p in logs.glob(f"{NS}_{name}-frontend-*.log"))
        t = pairing.tally(sent.pairs, pairing.frontend_pairs(text), pods, unit_of, domain_of)
        return t if t.agree else None

    try:
        t = wait_for("the frontend's log to name every request the client saw", counted, 30, 1.0)
    except AssertionError:  # (counted as it is: the disagreement is the finding)
        text = "".join(p.read_text(errors="replace") for p in logs.glob(f"{NS}_{name}-frontend-*.log"))
        t = pairing.tally(sent.pairs, pairing.frontend_pairs(text), pods, unit_of, domain_of)
    status = fleet.status(f, NS, name)
    lost = lost_decode(f, url, model, name, requests // 2, concurrency, unit_of, domain_of)
    kubectl(f, "delete", "mdep", name, "-n", NS, "--wait=true", timeout=300)
    return {
        "while_a_decode_group_is_lost": lost,
        "requests": {
            "intended": sent.intended,
            "sent": sent.sent,
            "completed": sent.completed,
            "failed": sent.failed,
            "never_sent": sent.never_sent,
        },
        "errors": dict(sent.errors),
        "kv_transfers": t.as_dict(),
        "random_pairing_in_domain_share": random_share(sent.pairs, pods, domain_of),
        "ttft_ms": {
            "p50": round(1000 * (percentile(sent.ttft_s, 0.5) or 0.0), 1),
            "p99": round(1000 * (percentile(sent.ttft_s, 0.99) or 0.0), 1),
        },
        "units": [
            {"unit": u.get("unit"), "domains": u.get("domains"), "path": u.get("path")}
            for u in status.get("units") or []
        ],
        "kv_path": status.get("kvPath"),
        "ready_after_s": round(up_s, 1),
    }


def lost_decode(
    f: Factory,
    url: str,
    model: str,
    name: str,
    requests: int,
    concurrency: int,
    unit_of: dict[str, str],
    domain_of: dict[str, str],
) -> dict[str, Any]:
    """Unit 0's decode group is lost (its leader pod deleted: the group is broken and replaced) and
    `requests` more are sent at once: with `preferred` enforcement they go to another unit's decode group
    until the replacement serves (with `required` a request whose prefill worker is unit 0's would fail)."""
    victim = next(n for n, u in sorted(unit_of.items()) if u == "0" and "-decode-" in n and n.endswith("-0"))
    kubectl(f, "delete", "pod", victim, "-n", NS, "--wait=false")
    time.sleep(1.0)  # (the endpoint leaves routing with the pod's deletion)
    sent = pairing.send(url, model, requests, concurrency)
    # (the replacement's pods, made meanwhile: their unit and domain too)
    sel = f"{contract.LABEL_DEPLOYMENT}={name},{contract.LABEL_ROLE} in (prefill,decode)"
    now = {
        p["metadata"]["name"]: p["metadata"]["labels"]
        for p in get_json(f, "pods", "-n", NS, "-l", sel)["items"]
    }
    units = {**unit_of, **{n: lb.get(contract.LABEL_UNIT, "") for n, lb in now.items()}}
    domains = {**domain_of, **{n: lb[contract.LABEL_DOMAIN] for n, lb in now.items()}}
    logs = fleet.state_dir(f) / "logs"
    text = "".join(p.read_text(errors="replace") for p in logs.glob(f"{NS}_{name}-frontend-*.log"))
    t = pairing.tally(
        sent.pairs, pairing.frontend_pairs(text), pairing.instance_ids(logs, NS), units, domains
    )
    return {
        "lost": victim,
        "requests": {
            "intended": sent.intended,
            "sent": sent.sent,
            "completed": sent.completed,
            "failed": sent.failed,
            "never_sent": sent.never_sent,
        },
        "errors": dict(sent.errors),
        "kv_transfers": t.as_dict(),
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<4} {'intended/sent/completed/failed':>31} {'in unit':>8} {'in domain':>10} "
        f"{'random':>7} {'observers':>10} {'TTFT p50/p99 ms':>16}  units"
    ]
    for i, r in enumerate(runs, 1):
        q, kv = r["requests"], r["kv_transfers"]
        share = kv.get("in_domain_share")
        lines.append(
            f"{i:<4} {q['intended']:>9}/{q['sent']}/{q['completed']}/{q['failed']:<8} "
            f"{kv['in_unit']:>5}/{kv['transfers']:<3} {100 * (share or 0):>9.1f}% "
            f"{100 * r['random_pairing_in_domain_share']:>6.1f}% "
            f"{'agree' if kv['observers_agree'] else 'DIFFER':>10} "
            f"{r['ttft_ms']['p50']:>7}/{r['ttft_ms']['p99']:<8}  "
            + ", ".join(f"{u['unit']}:{'+'.join(u['domains'] or [])}:{u['path']}" for u in r["units"])
        )
        lost = r.get("while_a_decode_group_is_lost")
        if lost:
            lq, lk = lost["requests"], lost["kv_transfers"]
            lines.append(
                f"     while {lost['lost']} is lost: {lq['intended']}/{lq['sent']}/{lq['completed']}/"
                f"{lq['failed']} intended/sent/completed/failed, {lk['in_unit']}/{lk['transfers']} in their "
                f"unit, observers {'agree' if lk['observers_agree'] else 'DIFFER'}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=30500)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=record.RESULTS, help="directory (fabric_live.json)")
    a = ap.parse_args(argv)
    started = time.time()
    tools = fleet.tools()
    run_dir = a.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-fabric-"))
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=a.port_base), say=print)
    f.up()
    try:
        kubectl(f, "apply", "--server-side", "-f", str(ROOT / "crds"))
        wait_established(f)
        start_operator(f, a.port_base + 20)
        fleet.ensure_namespace(f, NS)
        fleet.start_runner(f, tools, namespaces=(NS,))
        runs = [one_run(f, a.requests, a.concurrency) for _ in range(a.runs)]
    finally:
        f.down()
    result = {
        "measured": "KV transfers counted per request by two observers on real Dynamo 1.6.1 processes; TTFT "
        "on the mocker's timing (not a GPU's); the random-pairing share is computed from each run's layout",
        "example": str(EXAMPLE.relative_to(ROOT)),
        "runs": runs,
    }
    path = record.save("fabric_live", result, a.out, "e2e.bench.fabric_live_bench", argv, started)
    print(table(runs))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
