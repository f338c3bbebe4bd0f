"""What the fleet runner reads off a pod object, as a kubelet does, without I/O: whether it runs something
here and what (`wanted`), whether it is being deleted, its grace period and preStop sleep, its routable
condition, and the labels Prometheus gets for its process. (What the process itself is, is e2e/fleet/pods.py.)
"""

from __future__ import annotations

import datetime
from typing import Any

from tokenfab.planning import contract


def pod_labels(pod: dict[str, Any], role: str, group: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "namespace": meta["namespace"],
        "pod": meta["name"],
        contract.PROM_LABEL_DEPLOYMENT: meta.get("labels", {}).get(contract.LABEL_DEPLOYMENT, ""),
        contract.PROM_LABEL_ROLE: role,
        contract.PROM_LABEL_GROUP: group,
    }


def grace(pod: dict[str, Any]) -> tuple[float, float]:
    """(terminationGracePeriodSeconds, preStop sleep seconds) of a pod."""
    spec = pod.get("spec") or {}
    prestop = 0.0
    for ctr in spec.get("containers") or []:
        sleep = ((ctr.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        prestop = max(prestop, float(sleep.get("seconds") or 0))
    return float(spec.get("terminationGracePeriodSeconds", 30)), prestop


def routable(pod: dict[str, Any]) -> bool | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == contract.ROUTABLE_CONDITION:
            return bool(cond.get("status") == "True")
    return None


def epoch(stamp: str | None) -> float | None:
    """A Kubernetes timestamp (RFC 3339, whole seconds) as seconds since the epoch."""
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def deleting(pod: dict[str, Any] | None) -> bool:
    return bool(pod is not None and pod["metadata"].get("deletionTimestamp"))


def is_fetch(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("labels", {}).get(contract.COMPONENT) == contract.COMPONENT_WEIGHTS_FETCH)


def wanted(pod: dict[str, Any]) -> str | None:
    """'mocker', 'frontend' or None: what this pod runs on the fleet, if it is Running and not leaving."""
    meta = pod["metadata"]
    if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") != "Running":
        return None
    if not pod["spec"].get("nodeName"):
        return None
    labels = meta.get("labels", {})
    if labels.get(contract.MANAGED_BY) != contract.MANAGED_BY_VALUE:
        return None
    component = labels.get(contract.COMPONENT)
    if component == "worker" and labels.get(contract.LABEL_RANK, "0") == "0":
        return "mocker"
    if component == "frontend":
        return "frontend"
    return None
