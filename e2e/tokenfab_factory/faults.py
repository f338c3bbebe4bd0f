"""Hardware faults injected into the factory's simulated racks, each signalled the way a real GB200 cluster
signals it (`tokenfab factory fault ...`), and healed again.

- lose: Nodes deleted at once (a node, a tray, which is one node of 4 GPUs here, or a whole rack of 18),
  as a cloud node controller removes a machine that died; the Node objects are kept in the run directory
  so `heal` can bring them back;
- quarantine: what NVIDIA's NVSentinel does to a node whose GPU failed: cordon, its annotation
  `quarantineHealthEvent`, a fault node condition (SysLogsXIDError = True, with the XID in its message)
  and, as its rulesets can ask, the taint nvidia.com/gpu-xid-error=true:NoSchedule;
- drain: NVSentinel's node drainer afterwards: every pod on the node evicted through the Eviction API
  (PodDisruptionBudgets apply);
- taint-device: a DRA DeviceTaintRule (resource.k8s.io/v1) on a node's device (its IMEX channel by
  default), NoSchedule or NoExecute (Kubernetes' device taint eviction controller then evicts its pods);
- break-domain: a group's ComputeDomain turned NotReady (its IMEX daemons failed) by the simulated DRA
  driver;
- hang: a worker whose engine stops answering while its node stays healthy (a hung NCCL communicator after
  an Xid, a wedged GPU no health system flagged): a process the fleet runner runs is stopped (SIGSTOP), so
  its /health times out and the runner, as the kubelet, turns the pod not ready; any other pod gets the
  status a kubelet writes when a readiness probe fails after the startup probe passed;
- heal: everything above undone (lost Nodes re-created, quarantines lifted, the injector's rules deleted).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import RACK_LABEL

QUARANTINE_TAINT = {"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"}
QUARANTINE_ANNOTATION = "quarantineHealthEvent"
QUARANTINE_CONDITION = "SysLogsXIDError"
INJECTED = "tokenfab.dev/injected-fault"  # label on the DeviceTaintRules the injector made
IMEX_DRIVER = "compute-domain.nvidia.com"
DEVICE_TAINT_API = ("resource.k8s.io", "v1", "devicetaintrules")


def _saved(f: Factory) -> Path:
    path = f.run / "faults" / "nodes"
    path.mkdir(parents=True, exist_ok=True)
    return path


def nodes_of(f: Factory, node: str | None = None, rack: int | None = None) -> list[str]:
    """The node named, or every node of rack `rack` (0-based, as in the node names gb200-rRR-tTT)."""
    if node:
        return [node]
    if rack is None:
        raise ValueError("name a node or a rack")
    core = client.CoreV1Api(f.api())
    items = core.list_node(label_selector=f"{RACK_LABEL}=rack-{rack:02d}").items
    return sorted(n.metadata.name for n in items)


def lose(f: Factory, names: list[str]) -> float:
    """Delete the Nodes at once (kept for `heal`); returns the time the last deletion was answered."""
    api = f.api()
    core = client.CoreV1Api(api)
    for name in names:
        obj = api.sanitize_for_serialization(core.read_node(name))
        (_saved(f) / f"{name}.json").write_text(json.dumps(obj))
    for name in names:
        core.delete_node(name, grace_period_seconds=0)
    return time.time()


def quarantine(f: Factory, name: str, taint: bool = True, xid: int = 79) -> None:
    """NVSentinel's fault quarantine: cordon, annotation, node condition and (optionally) taint."""
    core = client.CoreV1Api(f.api())
    node = core.read_node(name)
    taints = [t for t in node.spec.taints or [] if t.key != QUARANTINE_TAINT["key"]]
    spec: dict[str, Any] = {"unschedulable": True}
    if taint:
        spec["taints"] = [*(core.api_client.sanitize_for_serialization(t) for t in taints), QUARANTINE_TAINT]
    event = {"checkName": "SysLogsXIDError", "isFatal": True, "errorCode": [str(xid)]}
    core.patch_node(
        name, {"metadata": {"annotations": {QUARANTINE_ANNOTATION: json.dumps(event)}}, "spec": spec}
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": QUARANTINE_CONDITION,
        "status": "True",
        "reason": "SysLogsXIDErrorIsNotHealthy",
        "message": f"[XID {xid}] GPU has fallen off the bus - RecommendedAction: RESTART_BM",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    core.patch_node_status(name, {"status": {"conditions": [condition]}})


def drain(f: Factory, name: str, timeout: float = 120.0) -> dict[str, int]:
    """Evict every pod on the node (as NVSentinel's node drainer, or `kubectl drain`, does), retrying those
    a PodDisruptionBudget holds until `timeout`. Returns {evicted, refused}."""
    core = client.CoreV1Api(f.api())
    deadline = time.monotonic() + timeout
    evicted, refused = 0, 0
    pending = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
    while pending and time.monotonic() < deadline:
        left = []
        for pod in pending:
            body = client.V1Eviction(
                metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace)
            )
            try:
                core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)
                evicted += 1
            except ApiException as exc:
                if exc.status == 404:
                    continue
                if exc.status != 429:
                    raise
                left.append(pod)
        pending = left
        if pending:
            time.sleep(2)
    refused = len(pending)
    return {"evicted": evicted, "refused": refused}


def taint_device(
    f: Factory, name: str, device: str = "channel-0", driver: str = IMEX_DRIVER, effect: str = "NoSchedule"
) -> str:
    """A DeviceTaintRule on one device of the node's pool (NVIDIA's drivers name a node's pool after it);
    returns the rule's name."""
    rule = f"fault-{name}-{device}".lower()
    group, version, plural = DEVICE_TAINT_API
    body = {
        "apiVersion": f"{group}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule, "labels": {INJECTED: "true"}},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": name, "device": device},
            "taint": {"key": "nvidia.com/device-health", "value": "unhealthy", "effect": effect},
        },
    }
    custom = client.CustomObjectsApi(f.api())
    try:
        custom.create_cluster_custom_object(group, version, plural, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        custom.patch_cluster_custom_object(group, version, plural, rule, {"spec": body["spec"]})
    return rule


def break_domain(f: Factory, namespace: str, name: str) -> None:
    """Turn a ComputeDomain NotReady, as NVIDIA's DRA driver reports failed IMEX daemons (the factory's
    driver keeps it so while the annotation is there)."""
    custom = client.CustomObjectsApi(f.api())
    patch = {"metadata": {"annotations": {INJECTED: "NotReady"}}}
    custom.patch_namespaced_custom_object(
        "resource.nvidia.com", "v1beta1", namespace, "computedomains", name, patch
    )


def hang(f: Factory, namespace: str, pod: str) -> str:
    """Make a worker stop answering its health endpoint; returns what was done."""
    # (the fleet runner's state, e2e/fleet/runner.py: its processes by <namespace>/<pod>)
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((f.run / "fleet" / "state.json").read_text())
        proc = (state.get("processes") or {}).get(f"{namespace}/{pod}")
        if proc and state.get("running"):
            os.kill(int(proc["pid"]), signal.SIGSTOP)
            stopped = _saved(f).parent / "stopped"
            stopped.mkdir(exist_ok=True)
            (stopped / str(proc["pid"])).write_text(f"{namespace}/{pod}")
            return f"process {proc['pid']} of {namespace}/{pod} stopped"
    core = client.CoreV1Api(f.api())
    obj = core.read_namespaced_pod(pod, namespace)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    failed = {
        "status": "False",
        "reason": "ContainersNotReady",
        "lastTransitionTime": now,
        "message": "containers with unready status: [worker]",
    }
    patch = {
        "status": {
            "conditions": [{"type": "ContainersReady", **failed}, {"type": "Ready", **failed}],
            # (the whole list: a status patch replaces it, there is no merge key)
            "containerStatuses": [
                {**s, "ready": False, "started": True}
                for s in client.ApiClient().sanitize_for_serialization(obj.status.container_statuses or [])
            ],
        }
    }
    core.patch_namespaced_pod_status(pod, namespace, patch)
    return f"pod {namespace}/{pod}: readiness probe failing (ContainersReady False)"


def heal(f: Factory, names: list[str] | None = None) -> list[str]:
    """Undo the faults on these nodes (None: every node the injector touched). Returns what was done."""
    api = f.api()
    core = client.CoreV1Api(api)
    done: list[str] = []
    for stopped in sorted((_saved(f).parent / "stopped").glob("*")) if names is None else []:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(stopped.name), signal.SIGCONT)
            done.append(f"process {stopped.name} of {stopped.read_text()} continued")
        stopped.unlink()
    saved = {p.stem: p for p in _saved(f).glob("*.json")}
    for name in sorted(saved if names is None else set(names) & set(saved)):
        obj = json.loads(saved[name].read_text())
        meta = obj["metadata"]
        obj["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
        status = obj.get("status") or {}
        obj["status"] = {k: status[k] for k in ("capacity", "allocatable", "nodeInfo") if k in status}
        try:
            core.create_node(obj)
            done.append(f"node {name} back")
        except ApiException as exc:
            if exc.status != 409:
                raise
        saved[name].unlink()
    for node in core.list_node().items:
        if names is not None and node.metadata.name not in names:
            continue
        ann = node.metadata.annotations or {}
        if QUARANTINE_ANNOTATION not in ann:
            continue
        taints = [
            api.sanitize_for_serialization(t)
            for t in node.spec.taints or []
            if t.key != QUARANTINE_TAINT["key"]
        ]
        patch = {
            "metadata": {"annotations": {QUARANTINE_ANNOTATION: None}},
            "spec": {"unschedulable": False, "taints": taints or None},
        }
        core.patch_node(node.metadata.name, patch)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cleared = {
            "type": QUARANTINE_CONDITION,
            "status": "False",
            "reason": "SysLogsXIDErrorIsHealthy",
            "message": "healthy",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        core.patch_node_status(node.metadata.name, {"status": {"conditions": [cleared]}})
        done.append(f"node {node.metadata.name} unquarantined")
    custom = client.CustomObjectsApi(api)
    if names is None:
        cds = custom.list_cluster_custom_object("resource.nvidia.com", "v1beta1", "computedomains")["items"]
        for cd in cds:
            if INJECTED in (cd["metadata"].get("annotations") or {}):
                meta = cd["metadata"]
                unmark = {"metadata": {"annotations": {INJECTED: None}}}
                custom.patch_namespaced_custom_object(
                    "resource.nvidia.com",
                    "v1beta1",
                    meta["namespace"],
                    "computedomains",
                    meta["name"],
                    unmark,
                )
                done.append(f"ComputeDomain {meta['namespace']}/{meta['name']} Ready again")
    group, version, plural = DEVICE_TAINT_API
    for rule in custom.list_cluster_custom_object(group, version, plural, label_selector=f"{INJECTED}=true")[
        "items"
    ]:
        pool = rule["spec"]["deviceSelector"].get("pool")
        if names is None or pool in names:
            custom.delete_cluster_custom_object(group, version, plural, rule["metadata"]["name"])
            done.append(f"device taint {rule['metadata']['name']} removed")
    return done
