"""The fleet runner's view of a pod (e2e/fleet/pods.py) and its loopback guard, without a cluster: a pod's
own command and environment, what a kubelet adds, the engine swap, and sockets read from the process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from e2e.fleet import pods
from e2e.fleet.procs import foreign_connections
from testing.cases import DOMAIN, owner, rendered, spec_of
from testing.upstream import parse_all
from tokenfab.planning import builders, contract
from tokenfab.planning.engine_config import engine_config, render

pytestmark = pytest.mark.unit  # (beside the code it tests; needs no factory)


def live(pod: dict) -> dict:
    pod = {**pod, "metadata": {**pod["metadata"], "uid": "1234-uid"}}
    pod["spec"] = {**pod["spec"], "nodeName": "n1"}
    return pod


def test_the_pods_own_environment_with_the_downward_api_resolved():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    pod = live(builders.group_pods(owner("ds"), spec, builders.GroupAt("decode", 0, DOMAIN, "rev"))[0])
    env = pods.resolve_env(pod)
    assert env[contract.ENV_POD_NAME] == "ds-decode-0-0"
    assert env[contract.ENV_POD_UID] == "1234-uid"
    assert env[contract.ENV_DYN_DISCOVERY_BACKEND] == "kubernetes"
    assert pods.mounts_token(pod)
    assert pods.service_account(pod) == "ds-dynamo"
    bad = live(pod)
    bad["spec"]["containers"] = [
        {
            **pod["spec"]["containers"][0],
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        }
    ]
    with pytest.raises(pods.PodError, match="fieldRef"):
        pods.resolve_env(bad)


def test_only_the_host_ports_and_kubelet_additions_differ_from_the_pod():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    pod = live(builders.group_pods(owner("ds"), spec, builders.GroupAt("prefill", 0, DOMAIN, "rev"))[0])
    env = pods.resolve_env(pod)
    out = pods.process_env(
        env, path="/bin", home="/h", kubeconfig="/k", ports={contract.ENV_DYN_SYSTEM_PORT: "26001"}
    )
    added = {k: v for k, v in out.items() if env.get(k) != v}
    assert set(added) == {
        "PATH",
        "HOME",
        "KUBECONFIG",
        contract.ENV_DYN_SYSTEM_PORT,
        *pods.HOST_ENV,
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "PYTHONUNBUFFERED",
    }
    assert all(out[h] == "127.0.0.1" for h in pods.HOST_ENV)
    # no discovery setting of the runner's own
    for name in ("DYN_FILE_KV", "ETCD_ENDPOINTS", "NATS_SERVER"):
        assert name not in out
    assert "KUBECONFIG" not in pods.process_env(env, path="/b", home="/h", kubeconfig=None, ports={})


def test_the_engine_is_what_the_launcher_plans_and_only_it_is_swapped():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    own = owner("ds")
    leader, follower = (
        live(p) for p in builders.group_pods(own, spec, builders.GroupAt("decode", 0, DOMAIN, "rev"))[:2]
    )
    text = render(engine_config(spec, "decode"))
    engine = pods.engine_of(leader, pods.resolve_env(leader), text)
    assert engine is not None
    assert engine.dynamo_args == tuple(builders.worker_args(spec, "decode"))  # mpirun's inner command
    assert engine.gpus == 32
    assert pods.engine_of(follower, pods.resolve_env(follower), text) is None  # sshd: no engine
    mocker = pods.mocker_argv(engine, pods.Mocker("/m", 48, 16, 0.3, "vllm"), None)
    assert mocker[:2] == ["-m", "dynamo.mocker"]
    assert mocker[mocker.index("--model-name") + 1] == spec.model.name
    assert mocker[mocker.index("--num-gpu-blocks-override") + 1] == str(48 * 32)
    assert mocker[mocker.index("--disaggregation-mode") + 1] == "decode"
    unknown = pods.Engine((*engine.dynamo_args, "--new-flag", "x"), 32)
    with pytest.raises(pods.PodError, match="--new-flag"):
        pods.mocker_argv(unknown, pods.Mocker("/m", 48, 16, 0.3, "vllm"), None)


def test_prometheus_sees_a_pod_as_its_kubernetes_discovery_would():
    spec = spec_of("aggregated-small.yaml")
    pod = live(builders.group_pods(owner("s"), spec, builders.GroupAt("worker", 0, DOMAIN, "rev"))[0])
    labels = pods.target_labels(pod, "metrics")
    assert labels["__meta_kubernetes_pod_label_tokenfab_dev_deployment"] == "s"
    assert labels["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"] == "tokenfab"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics"


@pytest.mark.parametrize(("address", "foreign"), [("127.0.0.1", False), ("198.18.0.7", True)])
def test_a_connection_outside_loopback_is_seen_in_the_process_sockets(address, foreign):
    # A connected UDP socket sends nothing, but has a remote address like any connection.
    script = (
        "import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"s.connect(('{address}', 9)); print('up', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        time.sleep(0.1)
        seen = foreign_connections(proc.pid)
        assert seen == ([f"{address}:9"] if foreign else [])
    finally:
        proc.kill()
        proc.wait()


def test_a_failed_wait_shows_each_process_warnings_of_that_deployment_only(tmp_path):
    from types import SimpleNamespace

    from e2e.fleet import fleet

    logs = tmp_path / "fleet" / "logs"
    logs.mkdir(parents=True)
    (logs / "ns_tiny-frontend-abc.log").write_text(
        "\x1b[2m2026\x1b[0m \x1b[32m INFO\x1b[0m started\n"
        "\x1b[2m2026\x1b[0m \x1b[33m WARN\x1b[0m Removing worker 7\n"
        "2026  ERROR no instances for prefill\n"
    )
    (logs / "ns_tiny-decode-0.log").write_text("2026  INFO all well\n")
    (logs / "ns_other-frontend-x.log").write_text("2026  ERROR not ours\n")
    f = SimpleNamespace(run=tmp_path)
    text = fleet.process_warnings(f, "ns", "tiny")  # type: ignore[arg-type]
    assert "ns_tiny-frontend-abc.log: 2 warning/error line(s)\n2026  WARN Removing worker 7\n" in text
    assert "no instances for prefill" in text
    assert "ns_tiny-decode-0.log: 0 warning/error line(s)" in text
    assert "not ours" not in text
    assert "started" not in text
    assert fleet.process_warnings(f, "ns", "gone") == "(no process logs for ns/gone)"  # type: ignore[arg-type]


def test_a_wait_for_serving_says_the_last_answer_or_returns_once_served(tmp_path, monkeypatch):
    import http.server
    import threading
    from types import SimpleNamespace

    from e2e.fleet import fleet

    answers = [(503, b"no instances for model"), (503, b"no instances for model")]

    class Frontend(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            code, body = answers.pop(0) if answers else (200, b"{}")
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Frontend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(fleet, "frontend_url", lambda *a: url)
    monkeypatch.setattr(fleet, "role_status", lambda *a: {"decode": {"readyGroups": 0}})
    monkeypatch.setattr(fleet, "process_warnings", lambda *a: "--- the processes' warnings")
    monkeypatch.setattr(fleet.time, "sleep", lambda s: None)
    f = SimpleNamespace(run=tmp_path)
    try:
        with pytest.raises(AssertionError) as failed:
            fleet.serving(f, "ns", "tiny", timeout=0.0)  # type: ignore[arg-type]
        said = str(failed.value)
        assert "last try: HTTP 503: no instances for model" in said
        assert "ready groups: {'decode': 0}" in said
        assert said.endswith("--- the processes' warnings")
        assert fleet.serving(f, "ns", "tiny", timeout=30.0) == url  # type: ignore[arg-type]
        assert answers == []  # (the second 503 retried, then served)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_runners_port_ranges_lie_below_the_kernels_ephemeral_ports():
    """A port the runner hands out is bound seconds later: in the ephemeral range, a socket bound to port 0
    meanwhile may take it first (a prefill mocker lost its bootstrap port so, and its worker answered 503)."""
    from itertools import pairwise
    from pathlib import Path

    from e2e.fleet import runner
    from tokenfab_factory import lanes

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ranges = [runner.DEFAULT_PORTS, runner.DEFAULT_SYSTEM_PORTS]
    ranges += [*lanes.RUNNER_PORTS, *lanes.RUNNER_SYSTEM_PORTS]
    ranges += [(base, base + lanes.LANE_SPAN - 1) for base in lanes.LANE_BASES]  # (each lane's factories)
    ranges += [(31000, 31499)]  # (the quick start's factory, never touched by the suite)
    for lo, hi in ranges:
        assert 1024 <= lo <= hi < min(low, 32768), (lo, hi, low)
    assert lanes.RUNNER_PORTS[0] == runner.DEFAULT_PORTS
    assert lanes.RUNNER_SYSTEM_PORTS[0] == runner.DEFAULT_SYSTEM_PORTS
    for one, two in pairwise(sorted(set(ranges))):
        assert one[1] < two[0], (one, two)  # (no two ranges meet: lanes side by side never share a port)


def test_downward_volumes_are_projected_from_the_pods_own_metadata():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    pod = live(
        builders.group_pods(owner("ds"), spec, builders.GroupAt("prefill", 1, DOMAIN, "rev", unit=4))[0]
    )
    [(name, mount, files)] = pods.downward_volumes(pod)
    assert (name, mount, files) == ("topology", contract.TOPOLOGY_DIR, {contract.KV_TRANSFER_DOMAIN: "4"})
    plain = live(builders.group_pods(owner("ds"), spec, builders.GroupAt("prefill", 1, DOMAIN, "rev"))[0])
    assert pods.downward_volumes(plain) == []


def test_a_prefill_engine_pays_its_units_kv_path_and_a_decode_engine_nothing():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    m = pods.Mocker("/m", 48, 16, 0.3, "vllm", 12.5, 35136)
    for role, port in (("prefill", 27100), ("decode", None)):
        pod = live(
            builders.group_pods(owner("ds"), spec, builders.GroupAt(role, 0, DOMAIN, "rev", unit=0))[0]
        )
        text = render(engine_config(spec, role))
        engine = pods.engine_of(pod, pods.resolve_env(pod), text)
        assert engine is not None
        argv = pods.mocker_argv(engine, m, port)
        if role == "prefill":
            assert argv[argv.index("--kv-transfer-bandwidth") + 1] == "12.5"
            assert argv[argv.index("--kv-bytes-per-token") + 1] == "35136"
        else:
            assert "--kv-transfer-bandwidth" not in argv


@pytest.mark.slow
def test_the_factorys_engine_swap_gives_the_mocker_arguments_it_takes():
    # (with the simulated fabric's KV hand-over cost, which prefill engines get)
    m = pods.Mocker("/models/tiny", 48, 16, 0.3, "vllm", 900.0, 35136)
    cases, engines = [], []
    for _variant, role, pod, spec in rendered():
        if role == "frontend":
            continue
        engine = pods.Engine(tuple(pod["spec"]["containers"][0]["args"]), 8)
        argv = pods.mocker_argv(engine, m, 36101 if role == "prefill" else None)
        assert argv[:2] == ["-m", "dynamo.mocker"]
        cases.append({"kind": "mocker", "argv": argv[2:], "env": {}})
        engines.append((spec, role))
    for (spec, _role), got in zip(engines, parse_all(cases), strict=True):
        assert "error" not in got, got
        assert got["parsed"]["model_name"] == spec.model.name
        assert got["parsed"]["num_workers"] == 1
        assert got["parsed"]["num_gpu_blocks"] == 48 * 8
