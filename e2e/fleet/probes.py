"""The kubelet's probes, as the fleet runner plays them, and the pod status it writes from them: `probe`
(a live pod's ContainersReady and Ready, from `readiness`, its engine's or frontend's health endpoint asked
as a readiness probe, `http_ok`, and its readiness gates; a container whose startup probe gives up is
killed and its pod Failed: `startup_expired`, `stop_late`), `patch_status` (a status patch, as a kubelet
writes it), and the history entries a process's probes and counters leave: when its pod first answered
(`mark_healthy`) and the engine's own request counters at each step of its termination
(`record_counters`, read by `scrape_counters`)."""

from __future__ import annotations

import calendar
import contextlib
import sys
import time
from typing import Any

from e2e.fleet import pods
from e2e.fleet.api import Api
from e2e.fleet.podview import wanted
from e2e.fleet.procs import Proc

COUNTERS = ("dynamo_component_requests_total", "dynamo_component_inflight_requests")


def scrape_counters(url: str) -> dict[str, float]:
    """Requests served and in flight (the `generate` endpoint) from an engine's /metrics; {} if gone."""
    import urllib.request

    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS and 'dynamo_endpoint="generate"' in line:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def http_ok(url: str) -> bool:
    """A readiness probe: the URL answers 2xx within a second."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return 200 <= int(r.status) < 300
    except (OSError, urllib.error.URLError, ValueError):
        return False


def probe(api: Api, history: list[dict[str, Any]], key: str, pod: dict[str, Any], proc: Proc | None) -> bool:
    """The kubelet's readiness bookkeeping for a live pod: ContainersReady from its probe, Ready from
    that and its readiness gates; the pod's status is patched when either differs. `proc` is the process
    run for the pod's key, if any. False when the patch failed (said on stderr; the runner counts it as
    one of its errors)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return True
    late = startup_expired(pod, time.time())
    if late is not None and not (
        proc is not None and proc.uid == pod["metadata"]["uid"] and http_ok(proc.health_url)
    ):
        return stop_late(api, key, pod, late)
    conds = {x.get("type"): x.get("status") == "True" for x in status.get("conditions") or []}
    if wanted(pod) is None:
        healthy = True  # a rank that runs nothing: its container started, nothing to probe
    elif proc is None or proc.uid != pod["metadata"]["uid"]:
        healthy = False  # not started yet (a cold start) or restarting
    else:
        healthy = readiness(proc, pod, conds.get("ContainersReady") is True)
        if healthy:
            mark_healthy(history, proc)
    gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
    ready = healthy and all(conds.get(g) is True for g in gates)
    # A container with a startup probe is `started` from its first healthy answer until it ends.
    had = {s.get("name"): s for s in status.get("containerStatuses") or []}
    was = {name: bool(s.get("started")) for name, s in had.items()}
    names = [ctr["name"] for ctr in pod["spec"].get("containers") or []]
    started = {name: was.get(name, False) or healthy for name in names}
    if conds.get("ContainersReady") == healthy and conds.get("Ready") == ready and started == was:
        return True
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def cond(kind: str, value: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind, "status": "True" if value else "False"}
        if conds.get(kind) != value:
            out["lastTransitionTime"] = now
        if not value:
            out["reason"] = "ContainersNotReady" if not healthy else "ReadinessGatesNotReady"
        else:
            out["reason"] = None
        return out

    patch = {
        "status": {
            "conditions": [cond("ContainersReady", healthy), cond("Ready", ready)],
            # (the whole list, as a kubelet writes it: a status patch replaces it, no merge key)
            "containerStatuses": [
                {**had.get(name, {"name": name}), "ready": healthy, "started": on}
                for name, on in started.items()
            ],
        }
    }
    try:
        patch_status(api, pod, patch)
    except pods.PodError as exc:
        print(f"runner: readiness of {key} not written: {exc}", file=sys.stderr, flush=True)
        return False
    print(f"runner: {key} ContainersReady={healthy} Ready={ready}", flush=True)
    return True


def _time(value: object) -> float | None:
    try:
        return calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def startup_expired(pod: dict[str, Any], now: float) -> tuple[str, int, str] | None:
    """(container, budget, startedAt) of a container whose startup probe's budget (failureThreshold x
    periodSeconds from its start) ran out before it was `started`: the kubelet stops it; None otherwise."""
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    for ctr in pod["spec"].get("containers") or []:
        probe, st = ctr.get("startupProbe"), statuses.get(ctr.get("name")) or {}
        if not probe or st.get("started"):
            continue
        began = ((st.get("state") or {}).get("running") or {}).get("startedAt")
        start = _time(began)
        budget = int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))
        if start is not None and now - start >= budget:
            return str(ctr["name"]), budget, str(began)
    return None


def stop_late(api: Api, key: str, pod: dict[str, Any], late: tuple[str, int, str]) -> bool:
    """The kubelet's part when a startup probe gives up: the container is killed (SIGTERM: exit 143) and,
    under restartPolicy Never, its pod is Failed (the runner then stops its process)."""
    name, budget, began = late
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    had = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    term = {"exitCode": 143, "reason": "Error", "startedAt": began, "finishedAt": now}
    patch = {
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "ContainersReady", "status": "False", "reason": "PodFailed"},
                {"type": "Ready", "status": "False", "reason": "PodFailed"},
            ],
            "containerStatuses": [
                {**s, "ready": False, "started": False, "state": {"terminated": term}} if n == name else s
                for n, s in had.items()
            ],
        }
    }
    try:
        patch_status(api, pod, patch)
    except pods.PodError as exc:
        print(f"runner: the failed startup of {key} not written: {exc}", file=sys.stderr, flush=True)
        return False
    print(f"runner: {key} container {name} failed its startup probe ({budget} s): killed", flush=True)
    return True


def patch_status(api: Api, pod: dict[str, Any], patch: dict[str, Any]) -> None:
    """A strategic-merge patch of the pod's status, as a kubelet writes it."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
    api("PATCH", path, body=patch, content_type="application/strategic-merge-patch+json")


def mark_healthy(history: list[dict[str, Any]], proc: Proc) -> None:
    """Note in the process's history entry when its pod first answered its readiness probe."""
    for h in reversed(history):
        if h["key"] == proc.key and h["pid"] == proc.pid:
            if h.get("healthy_at") is None:
                h["healthy_at"] = time.time()
            return


def readiness(proc: Proc, pod: dict[str, Any], was_ready: bool) -> bool:
    """The readiness probe's verdict, as the kubelet's: a ready container turns not ready only once its
    probe has failed failureThreshold times periodSeconds apart (3 x 10 s by default), not on the
    first slow answer."""
    if http_ok(proc.health_url):
        proc.failing_since = None
        return True
    if not was_ready:
        return False
    now = time.monotonic()
    proc.failing_since = proc.failing_since or now
    probe = next((ctr.get("readinessProbe") or {} for ctr in pod["spec"].get("containers") or []), {})
    window = float(probe.get("failureThreshold", 3)) * float(probe.get("periodSeconds", 10))
    return now - proc.failing_since < window


def record_counters(history: list[dict[str, Any]], proc: Proc, when: str) -> None:
    """The engine's own request counters, kept in the history (an engine's counters die with it)."""
    if proc.kind != "mocker":
        return
    counters = scrape_counters(proc.metrics_url)
    for h in history:
        if h["pid"] == proc.pid:
            h[when] = counters
            h["labels"] = proc.labels
