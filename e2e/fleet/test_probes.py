"""The runner's kubelet part for startup probes: a container not `started` within its startup probe's
budget is killed and its pod Failed, as under restartPolicy Never."""

from __future__ import annotations

import calendar
import time
from typing import Any

from e2e.fleet import probes


def _pod(started: bool, began: str, threshold: int = 12) -> dict[str, Any]:
    probe = {
        "httpGet": {"path": "/health", "port": "metrics"},
        "periodSeconds": 5,
        "failureThreshold": threshold,
    }
    return {
        "metadata": {"name": "m-decode-0-0", "namespace": "live-x", "uid": "u1"},
        "spec": {"containers": [{"name": "worker", "startupProbe": probe}, {"name": "side"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "worker", "started": started, "state": {"running": {"startedAt": began}}},
                {"name": "side", "started": True, "state": {"running": {"startedAt": began}}},
            ],
        },
    }


BEGAN = "2026-12-07T10:00:00Z"
T0 = float(calendar.timegm(time.strptime(BEGAN, "%Y-%m-%dT%H:%M:%SZ")))


def test_a_container_not_started_within_its_budget_is_killed_and_its_pod_fails():
    assert probes.startup_expired(_pod(False, BEGAN), T0 + 59) is None
    assert probes.startup_expired(_pod(False, BEGAN), T0 + 60) == ("worker", 60, BEGAN)
    assert probes.startup_expired(_pod(True, BEGAN), T0 + 6000) is None  # (started: the probe is done)
    no_probe = _pod(False, BEGAN)
    del no_probe["spec"]["containers"][0]["startupProbe"]
    assert probes.startup_expired(no_probe, T0 + 6000) is None
    writes: list[tuple[str, str, Any]] = []

    def api(method: str, path: str, body: Any = None, content_type: str = "") -> dict[str, Any]:
        writes.append((method, path, body))
        return {}

    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    pod = _pod(False, began)
    # (no process for the pod: nothing answers; its budget was over long ago)
    assert probes.probe(api, [], "live-x/m-decode-0-0", pod, None)  # type: ignore[arg-type]
    [(method, path, body)] = writes
    assert (method, path) == ("PATCH", "/api/v1/namespaces/live-x/pods/m-decode-0-0/status")
    status = body["status"]
    assert status["phase"] == "Failed"
    worker, side = status["containerStatuses"]
    term = worker["state"]["terminated"]
    assert (term["exitCode"], term["startedAt"], worker["started"]) == (143, began, False)
    assert side["state"] == {"running": {"startedAt": began}}  # (the other container's status is kept)
