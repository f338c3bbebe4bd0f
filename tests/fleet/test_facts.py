"""tokenfab.fleet.facts: what a pod's status says of its weights init container and of how it ended."""

from __future__ import annotations

from typing import Any

from tokenfab.fleet.facts import pod_facts
from tokenfab.planning import contract

WEIGHTS = contract.WEIGHTS_INIT_CONTAINER


def _pod(phase: str, init: dict[str, Any] | None, worker: dict[str, Any] | None, budget: int = 1200) -> Any:
    status: dict[str, Any] = {"phase": phase}
    if init is not None:
        status["initContainerStatuses"] = [{"name": WEIGHTS, "state": init}]
    if worker is not None:
        status["containerStatuses"] = [{"name": "worker", **worker}]
    probe = {
        "httpGet": {"path": "/health", "port": "metrics"},
        "periodSeconds": 5,
        "failureThreshold": budget // 5,
    }
    return pod_facts(
        {
            "metadata": {"name": "m-decode-0-0", "namespace": "ns"},
            "spec": {
                "nodeName": "n1",
                "initContainers": [{"name": WEIGHTS}],
                "containers": [{"name": "worker", "startupProbe": probe}],
            },
            "status": status,
        }
    )


def test_the_weights_init_container_state_and_why_the_pod_waits():
    running = _pod("Pending", {"running": {}}, {"state": {"waiting": {"reason": "PodInitializing"}}})
    assert (running.init, running.waiting) == ("running", "downloading the weights (init container weights)")
    assert _pod("Running", {"terminated": {"exitCode": 0}}, {"state": {"running": {}}}).init == "done"
    assert _pod("Pending", {"waiting": {"reason": "ErrImagePull"}}, None).init == "waiting"
    no_init = pod_facts({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running"}})
    assert no_init.init == ""


def test_a_failed_download_names_the_init_container_and_its_words():
    failed = _pod(
        "Failed",
        {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": "weights hf://x@y: the hub answered 401",
            }
        },
        {"state": {"waiting": {"reason": "PodInitializing"}}},
    )
    assert failed.init == "failed"
    assert (
        failed.exit_message
        == "init container weights, exit code 1, Error, weights hf://x@y: the hub answered 401"
    )


def test_a_worker_stopped_by_its_startup_probe_says_it_ran_past_its_budget_and_what_to_raise():
    term = {
        "exitCode": 143,
        "reason": "Error",
        "startedAt": "2026-12-07T10:00:00Z",
        "finishedAt": "2026-12-07T10:20:03Z",  # (1203 s: its 1200 s budget and the kubelet's kill)
    }
    late = _pod("Failed", {"terminated": {"exitCode": 0}}, {"started": False, "state": {"terminated": term}})
    assert late.exit_message.startswith("exit code 143, Error, its health endpoint never answered within its")
    assert "startup budget of 1200 s after its weights were on the node" in late.exit_message
    assert "spec.serving.startupSeconds" in late.exit_message
    # a worker that crashed early, or had started, ran past no budget
    early = {**term, "finishedAt": "2026-12-07T10:00:40Z"}
    crashed = _pod(
        "Failed", {"terminated": {"exitCode": 0}}, {"started": False, "state": {"terminated": early}}
    )
    assert crashed.exit_message == "exit code 143, Error"
    served = _pod("Failed", {"terminated": {"exitCode": 0}}, {"started": True, "state": {"terminated": term}})
    assert served.exit_message == "exit code 143, Error"
