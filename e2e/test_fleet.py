"""The closed autoscaling loop on a live local fleet: real Dynamo engines (mocker) and frontend for the
pods the operator creates, real load from aiperf, real Prometheus.

A burst arrives at the frontend; the operator's leading policy sees the arrival rate (or the queues) rise
and adds decode groups (prefill follows the ratio) with KV-cache utilization as the guard; the new engines
join the router and serve, utilization and TTFT fall; when the load
drops, groups go away after the stabilization window. Every process the runner started is stopped.
Sized for CI on 2 cores (4:48 measured, factory included). The time series and plot land in the run
directory; `python -m e2e.fleet.scenario` saves them to e2e/bench/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.fleet import fleet, load, pairing, plot, scenario
from e2e.helpers import apply_yaml, get_json, wait_for
from tokenfab.planning import contract
from tokenfab.planning.autoscaler import signals
from tokenfab_factory import process
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow
NS = "live-fleet"  # the runner serves only this namespace: other tests' deployments get no engines


def test_aiperf_keeps_its_dataset_files_in_the_directory_it_is_given(tmp_path: Path) -> None:
    """The pinned aiperf reads the variable that moves its memory-mapped dataset out of /tmp."""
    tools = fleet.tools()
    run = load.AiperfRun(tools.aiperf, "http://127.0.0.1:1", "m", tmp_path, [], tmp_path / "out")
    python = str(Path(tools.aiperf).parent / "python")
    code = "from aiperf.common.environment import Environment; print(Environment.DATASET.MMAP_BASE_PATH)"
    try:
        out = subprocess.run([python, "-c", code], env=run.env(), capture_output=True, text=True, check=True)
        assert out.stdout.strip() == str(run.ipc_dir())
    finally:
        run.stop()
    assert not run.ipc_dir().exists()


@pytest.fixture(scope="module")
def live(operator: Factory) -> Iterator[tuple[Factory, fleet.Tools]]:
    tools = fleet.tools()
    fleet.start_runner(operator, tools, namespaces=(NS,))
    yield operator, tools
    operator.stop_extra(fleet.RUNNER)


def test_closed_loop_scales_decode_with_the_burst_and_back(live):
    f, tools = live
    cfg = scenario.ci_config(namespace=NS, name="loop", before_s=20, burst_s=100, after_s=100)
    t0 = time.monotonic()
    out = f.run / "fleet-e2e"
    result = scenario.run_policy(f, tools, cfg, out)
    # The leading signals came from the real frontend: the arrival rate it counted (2 requests/s in the
    # burst) and a capacity per decode group learned from the load served, as status showed them.
    arrivals = [r["arrival_rate"] for r in result["series"] if r.get("arrival_rate") is not None]
    learned = [r["capacity"].get("decode", 0) for r in result["series"] if r.get("capacity")]
    result["loop"] = loop = scenario.loop_facts(result)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    plot.closed_loop(result, out / "closed_loop.png")
    print(f"\nclosed loop ({time.monotonic() - t0:.0f} s): {json.dumps(loop)}")
    print(
        f"SLO: {json.dumps(result['slo'])}; GPU-minutes {result['gpu_minutes']}; plot {out}/closed_loop.png"
    )

    assert result["aiperf_exit_code"] == 0, f"aiperf failed: see {out}/aiperf/aiperf.log"
    # As on a real cluster: Dynamo's kubernetes discovery (each process's own DynamoWorkerMetadata, no
    # file discovery anywhere), every connection on loopback, and `tokenfab doctor` passes.
    assert_real_discovery(f, cfg.namespace)
    # Every series the operator reads, by the name it queries, was on the live scrape of this fleet.
    for name in (
        signals.KV_METRIC,
        signals.QUEUE_METRIC,
        signals.INFLIGHT_METRIC,
        signals.FRONTEND_REQUESTS,
        signals.FRONTEND_REQUESTS_TOTAL,
        signals.FRONTEND_INPUT_TOKENS,
        signals.FRONTEND_INFLIGHT,
    ):
        assert fleet.prom(f, f'count(last_over_time({name}{{namespace="{cfg.namespace}"}}[30m]))'), name
    dr = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenfab.cli",
            "doctor",
            "--kubeconfig",
            str(f.kubeconfig),
            "--prometheus-url",
            f.prometheus_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dr.returncode == 0, dr.stdout + dr.stderr
    assert result["slo"]["requests"] > 100
    assert loop["initial_decode_groups"] == 1
    assert loop["peak_decode_groups"] > loop["initial_decode_groups"], "decode groups added during the burst"
    assert loop["new_groups_that_served"], "new decode engines joined the router and served requests"
    assert loop["kv_decode_mean_last_30s_of_burst"] < cfg.target + 0.1
    # Every scale-up is an Event saying what led it (here the KV guard and the demand move within seconds
    # of each other: the trace's short outputs fill the cache at once).
    ups = [
        e["message"]
        for e in get_json(
            f, "events", "-n", cfg.namespace, "--field-selector", f"involvedObject.name={cfg.name}"
        )["items"]
        if e["reason"] == "ScaledUp" and e["message"].startswith("decode")
    ]
    assert ups, "no ScaledUp Event for decode"
    print(f"scale-ups: {ups}")  # (those the burst watch brought forward start "decode: ... burst watch:")
    assert arrivals, "no arrival rate read from the frontend"
    assert max(arrivals) > 0.75 * cfg.burst_qps, arrivals
    assert learned, "no capacity per decode group learned"
    assert max(learned) > 0
    assert loop["ttft_p50_end_of_burst_ms"] < loop["ttft_p50_peak_in_burst_ms"], "TTFT recovers"
    peak = max(r["groups"]["prefill"] or 0 for r in result["series"])
    assert peak >= 2, "prefill followed decode by the 1:2 ratio"

    # load dropped: groups go after the stabilization window (the trace may end first: wait a little)
    wait_for(
        "decode back to 1 group after the window",
        lambda: (fleet.role_status(f, cfg.namespace, cfg.name).get("decode") or {}).get("desiredGroups") == 1,
        timeout=90,
        interval=2,
    )
    burst_end = cfg.before_s + cfg.burst_s
    downs = [r["t"] for r in result["series"] if r["t"] > burst_end and r["groups"]["decode"] == 1]
    assert not downs or downs[0] >= burst_end + cfg.scale_down_window - 15, "no scale-down inside the window"

    # the engines of removed groups are stopped, and only Running rank-0 pods have one
    fleet.delete_deployment(f, cfg.namespace, cfg.name)

    def left() -> list[str]:
        state = fleet.runner_state(f)
        procs = [*state.get("processes", {}).values(), *state.get("terminating", {}).values()]
        return [p["key"] for p in procs if p["key"].startswith(f"{cfg.namespace}/")]

    # (as the kubelet does: preStop, then SIGTERM; an idle engine exits within seconds of it)
    wait_for("the runner stopped every process of the deployment", lambda: not left(), timeout=90)
    history = fleet.runner_state(f)["history"]
    started = [h for h in history if h["key"].startswith(f"{cfg.namespace}/")]
    assert any(h["kind"] == "frontend" for h in started)
    assert sum(1 for h in started if h["kind"] == "mocker" and "decode" in h["key"]) >= 2
    alive = [h for h in started if process.alive(h["pid"])]
    assert not alive, f"processes left running: {alive}"


def assert_real_discovery(f: Factory, namespace: str) -> None:
    state = fleet.runner_state(f)
    assert state["foreign_connections"] == [], state["foreign_connections"]
    procs = [p for k, p in state["processes"].items() if k.startswith(f"{namespace}/")]
    assert procs
    for p in procs:
        environ = dict(
            kv.split("=", 1) for kv in Path(f"/proc/{p['pid']}/environ").read_text().split("\0") if "=" in kv
        )
        assert "DYN_FILE_KV" not in environ
        assert environ["DYN_DISCOVERY_BACKEND"] == "kubernetes"
    workers = {p["key"].split("/", 1)[1] for p in procs if p["kind"] == "mocker"}
    metadata = get_json(f, "dynamoworkermetadatas", "-n", namespace)["items"]
    assert workers <= {m["metadata"]["name"] for m in metadata}, "each engine registered as its pod"
    assert_no_shared_filesystem(f, state, procs)


def assert_no_shared_filesystem(f: Factory, state: dict, procs: list[dict]) -> None:
    """Each process saw its own pod directory only, and the frontend no model files: it served the model
    with the card files the workers serve on their system ports, as on a cluster."""
    assert state["isolated"], "the runner gave each pod a mount namespace of its own (it runs as root)"
    pods_dir = fleet.state_dir(f) / "pods"
    for p in procs:
        root = Path(f"/proc/{p['pid']}/root")
        assert len(os.listdir(f"{root}{pods_dir}")) == 1, f"{p['key']} sees other pods' directories"
        model = os.listdir(f"{root}{state['model_dir']}")
        if p["kind"] == "frontend":
            assert model == [], f"the frontend {p['key']} sees the model files: {model}"
        else:
            assert "tokenizer.json" in model, f"the engine {p['key']} lost the model it mounts"


def test_the_simulated_fabric_serves_a_group_on_its_imex_channel_and_fails_mnnvl_without_one(live):
    """NCCL's multi-node NVLink as the factory simulates it (e2e/fleet/fabric.py): a decode group over two
    trays asks for MNNVL and holds its ComputeDomain's channel on both pods, so its engine comes up and
    serves; a one-pod group whose user env asks for MNNVL holds none, so its engine fails at NCCL init
    and the user reads why in the deployment's Event, as a crash on a cluster would show."""
    f, _ = live
    doc = fleet.manifest(f, NS, "fabric", autoscaling=False)
    doc["spec"]["decode"]["parallelism"] = {"tensor": 8}  # two trays: one ComputeDomain, NCCL's MNNVL
    apply_yaml(f, doc)
    fleet.serving(f, NS, "fabric", timeout=240)
    sel = f"{contract.LABEL_DEPLOYMENT}=fabric,{contract.LABEL_ROLE}=decode"
    decode = get_json(f, "pods", "-n", NS, "-l", sel)["items"]
    assert len(decode) == 2
    for pod in decode:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env.get("NCCL_MNNVL_ENABLE") == "1"
        assert pod["status"].get("resourceClaimStatuses"), "each rank holds its IMEX channel claim"
    refused = [r for r in fleet.runner_state(f).get("refused", []) if r["key"].startswith(f"{NS}/fabric-")]
    assert not refused, refused
    fleet.delete_deployment(f, NS, "fabric")

    bad = fleet.manifest(f, NS, "mnnvl", autoscaling=False)
    bad["spec"]["runtime"] = {"env": [{"name": "NCCL_MNNVL_ENABLE", "value": "1"}]}  # one-pod groups
    apply_yaml(f, bad)

    def told() -> list[str]:
        events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=mnnvl")["items"]
        return [
            e["message"]
            for e in events
            if e["reason"] == "GroupDeletedBroken" and "holds no IMEX channel" in e["message"]
        ]

    said = wait_for("an Event naming the engine NCCL failed without an IMEX channel", told, timeout=150)
    assert "simulated NCCL" in said[0]

    def refused_here() -> list[
        dict[str, str]
    ]:  # (the runner writes its state once per pass: after the Event)
        return [r for r in fleet.runner_state(f)["refused"] if r["key"].startswith(f"{NS}/mnnvl-")]

    wait_for("the runner's record of the engine NCCL refused", refused_here, timeout=30)
    fleet.delete_deployment(f, NS, "mnnvl")


def test_each_requests_kv_stays_inside_its_unit_as_the_client_and_the_frontend_both_count(live):
    """Two prefill-decode units (1:2: one prefill group and two decode groups each), each in one NVLink
    domain with its ComputeDomain; every worker publishes its unit as Dynamo's KV-transfer domain. The
    client asks Dynamo for each request's worker pair (nvext worker_id) and the frontend's own log names
    it too: every request is counted by both, and each KV hand-over stays inside its unit."""
    f, _ = live
    fleet.ensure_namespace(f, NS)
    apply_yaml(f, fleet.manifest(f, NS, "pairs", autoscaling=False, decode_replicas=4))
    url = fleet.serving(f, NS, "pairs", timeout=240)
    sel = f"{contract.LABEL_DEPLOYMENT}=pairs,{contract.LABEL_ROLE} in (prefill,decode)"

    def all_ready() -> list[dict[str, Any]] | None:
        items = get_json(f, "pods", "-n", NS, "-l", sel)["items"]
        ok = len(items) == 6 and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            for p in items
        )
        return items if ok else None

    workers = wait_for("the six workers of two units ready", all_ready, timeout=180)
    labels = {p["metadata"]["name"]: p["metadata"]["labels"] for p in workers}
    unit_of = {n: lb[contract.LABEL_UNIT] for n, lb in labels.items()}
    domain_of = {n: lb[contract.LABEL_DOMAIN] for n, lb in labels.items()}
    assert sorted(unit_of.values()) == ["0", "0", "0", "1", "1", "1"]
    time.sleep(3)  # (the router hears of the last workers' endpoints)
    sent = pairing.send(url, fleet.MODEL_NAME, 48, concurrency=4)
    assert (sent.sent, sent.completed, sent.failed, sent.never_sent) == (48, 48, 0, 0), sent.errors
    logs = fleet.state_dir(f) / "logs"

    def counted() -> pairing.Tally | None:
        frontend = "".join(p.read_text(errors="replace") for p in logs.glob(f"{NS}_pairs-frontend-*.log"))
        t = pairing.tally(
            sent.pairs, pairing.frontend_pairs(frontend), pairing.instance_ids(logs, NS), unit_of, domain_of
        )
        return t if t.agree else None

    t = wait_for("the frontend's log naming every request's workers as the client saw them", counted, 30)
    print(f"\nKV transfers: {json.dumps(t.as_dict())}")
    assert (t.transfers, t.frontend, t.unknown) == (48, 48, 0)
    assert t.in_unit == t.transfers, t.by_pair
    assert t.in_domain == t.transfers, t.by_pair
    units = fleet.status(f, NS, "pairs").get("units") or []
    assert len(units) == 2, units
    assert all(len(u["domains"]) == 1 for u in units), units
    fleet.delete_deployment(f, NS, "pairs")


def test_runner_stops_every_process_it_started(live):
    f, _ = live
    pids = [h["pid"] for h in fleet.runner_state(f).get("history", [])]
    assert pids
    f.stop_extra(fleet.RUNNER)
    state = fleet.runner_state(f)
    assert state["running"] is False
    assert not state["processes"]
    left = [pid for pid in pids if process.alive(pid)]
    assert not left, f"still running: {left}"
    assert not list(f.file_sd_dir.glob("fleet-*.json")), "file_sd targets removed with their processes"
