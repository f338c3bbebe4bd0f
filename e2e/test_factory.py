"""The local AI factory behaves like a real cluster of NVL72 racks: the real scheduler places GPU pods,
controllers run, Prometheus scrapes, and the factory's own lifecycle is robust."""

from __future__ import annotations

import json
import socket
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest

from e2e.helpers import MetricsHandler, apply_yaml, gpu_deployment, kubectl, restore_node, wait_for
from tokenfab_factory import lanes, process
from tokenfab_factory.config import FactoryConfig, FactoryError
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL, GPU_RESOURCE


def pods(factory: Factory, selector: str) -> list[dict]:
    out = kubectl(factory, "get", "pods", "-l", selector, "-o", "json")
    return json.loads(out.stdout)["items"]


def running(items: list[dict]) -> list[dict]:
    return [p for p in items if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]


def test_racks_look_like_nvl72(factory):
    nodes = json.loads(kubectl(factory, "get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 4 * 18
    cliques: dict[str, int] = {}
    for node in nodes:
        labels = node["metadata"]["labels"]
        cliques[labels[CLIQUE_LABEL]] = cliques.get(labels[CLIQUE_LABEL], 0) + 1
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
        assert labels["nvidia.com/gpu.count"] == "4"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert sorted(cliques.values()) == [18, 18, 18, 18]


def test_gpu_deployment_is_scheduled_and_runs(factory):
    apply_yaml(factory, gpu_deployment("gpu-deploy", "default", replicas=3, gpus=4))
    ready = wait_for("3 Running GPU pods", lambda: len(running(pods(factory, "app=gpu-deploy"))) == 3)
    assert ready
    nodes = {p["spec"]["nodeName"] for p in pods(factory, "app=gpu-deploy")}
    assert len(nodes) == 3, "4-GPU pods on 4-GPU nodes must land on distinct nodes"
    kubectl(factory, "delete", "deployment", "gpu-deploy", "--wait=true")


def test_statefulset_runs_with_stable_names(factory):
    apply_yaml(
        factory,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "ranks", "namespace": "default"},
            "spec": {
                "replicas": 2,
                "serviceName": "ranks",
                "selector": {"matchLabels": {"app": "ranks"}},
                "template": {
                    "metadata": {"labels": {"app": "ranks"}},
                    "spec": {
                        "containers": [
                            {"name": "w", "image": "worker", "resources": {"limits": {GPU_RESOURCE: "1"}}}
                        ]
                    },
                },
            },
        },
    )
    wait_for("2 Running StatefulSet pods", lambda: len(running(pods(factory, "app=ranks"))) == 2)
    assert sorted(p["metadata"]["name"] for p in pods(factory, "app=ranks")) == ["ranks-0", "ranks-1"]
    kubectl(factory, "delete", "statefulset", "ranks", "--wait=true")


def test_pod_asking_more_gpus_than_a_node_stays_pending(factory):
    apply_yaml(
        factory,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "five-gpus", "namespace": "default"},
            "spec": {
                "containers": [{"name": "w", "image": "worker", "resources": {"limits": {GPU_RESOURCE: "5"}}}]
            },
        },
    )

    def failed_scheduling():
        out = kubectl(
            factory,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=five-gpus,reason=FailedScheduling",
            "-o",
            "json",
        )
        events = json.loads(out.stdout)["items"]
        return [e["message"] for e in events if "Insufficient nvidia.com/gpu" in e["message"]]

    assert wait_for("a FailedScheduling event for nvidia.com/gpu", failed_scheduling, timeout=60)
    pod = json.loads(kubectl(factory, "get", "pod", "five-gpus", "-o", "json").stdout)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    kubectl(factory, "delete", "pod", "five-gpus", "--wait=true")


def test_deleting_a_node_evicts_its_pods(factory):
    apply_yaml(
        factory,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim", "namespace": "default", "labels": {"app": "victim"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "gb200-r03-t17"},
                "containers": [
                    {"name": "w", "image": "worker", "resources": {"limits": {GPU_RESOURCE: "2"}}}
                ],
            },
        },
    )
    wait_for("the victim pod Running", lambda: running(pods(factory, "app=victim")))
    node = json.loads(kubectl(factory, "get", "node", "gb200-r03-t17", "-o", "json").stdout)
    kubectl(factory, "delete", "node", "gb200-r03-t17", "--wait=true")
    try:
        # The pod garbage collector deletes pods bound to a node that no longer exists.
        wait_for(
            "the pod on the deleted node to be gone", lambda: not pods(factory, "app=victim"), timeout=120
        )
    finally:
        restore_node(factory, node)


class _Exporter(MetricsHandler):
    def metrics(self) -> bytes:
        return b"tokenfab_e2e_probe 42\n"


def test_prometheus_scrapes_the_apiserver_and_file_sd_targets(factory):
    import urllib.parse
    import urllib.request

    def query(q: str) -> list[dict]:
        url = f"{factory.prometheus_url}/api/v1/query?query={urllib.parse.quote(q)}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())["data"]["result"]

    server = HTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = factory.file_sd_dir / "e2e-probe.json"
    try:
        target.write_text(
            json.dumps(
                [
                    {
                        "targets": [f"127.0.0.1:{server.server_port}"],
                        # what Kubernetes pod discovery gives a tokenfab worker's metrics port (the
                        # factory's Prometheus relabels with tokenfab's documented scrape job)
                        "labels": {
                            "__meta_kubernetes_namespace": "default",
                            "__meta_kubernetes_pod_name": "probe",
                            "__meta_kubernetes_pod_phase": "Running",
                            "__meta_kubernetes_pod_container_port_name": "metrics",
                            "__meta_kubernetes_pod_label_app_kubernetes_io_managed_by": "tokenfab",
                            "__meta_kubernetes_pod_label_app_kubernetes_io_component": "worker",
                        },
                    }
                ]
            )
        )
        assert wait_for(
            "the file_sd probe scraped", lambda: query('tokenfab_e2e_probe{pod="probe"}'), timeout=60
        )
        assert wait_for("the API server scraped", lambda: query('up{job="kube-apiserver"} == 1'), timeout=60)
    finally:
        target.unlink()
        server.shutdown()
        server.server_close()


def test_up_twice_keeps_the_same_cluster(factory):
    before = factory.read_state()
    again = Factory(factory.config, say=lambda s: None).up()
    assert before is not None
    assert again.pids == before.pids


# ---- lifecycle robustness, on a second small factory of its own


@pytest.fixture
def small_factory(tmp_path: Path):
    f = Factory(
        FactoryConfig(run_dir=tmp_path / "small", racks=1, port_base=factory_port_base()), say=lambda s: None
    )
    yield f
    f.down()


def factory_port_base() -> int:
    return lanes.port_base() + 100


def test_stale_run_and_dead_component_are_handled(small_factory):
    messages: list[str] = []
    small_factory.say = messages.append
    first = small_factory.up()
    # A component dies: status reports it.
    process.stop(first.pids["kube-scheduler"])
    status = {s.name: s for s in small_factory.component_status()}
    assert not status["kube-scheduler"].running
    assert status["kube-apiserver"].healthy
    # The whole factory crashes (SIGKILL, state file left behind): `up` detects it and starts fresh.
    for pid in first.pids.values():
        process.stop(pid, timeout=0)
    second = small_factory.up()
    assert any("stale factory" in m for m in messages)
    assert set(second.pids.values()).isdisjoint(first.pids.values())
    assert all(s.healthy for s in small_factory.component_status())
    assert small_factory.node_counts() == (18, 18)
    stopped = small_factory.down()
    assert set(stopped) == set(second.pids)
    assert not any(process.alive(pid) for pid in second.pids.values())


def test_busy_port_is_refused_with_its_owner(small_factory):
    port = small_factory.config.port("kube-apiserver")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(FactoryError) as info:
            small_factory.up()
    message = str(info.value)
    assert f"{port} (kube-apiserver)" in message
    assert "pid" in message
    assert "--port-base" in message
    assert small_factory.read_state() is None
