"""Synthetic Kubernetes objects (plain dicts, as a watch delivers them) for the fleet tests: nodes, tokenfab's
worker pods, other pods and shared children. Only the fields `tokenfab.fleet.view` reads are filled in."""

from __future__ import annotations

from typing import Any

from tokenfab.planning import contract

GPU = "nvidia.com/gpu"
LABEL = "nvidia.com/gpu.clique"
T0 = "2024-05-01T12:00:00Z"
T0_UNIX = 1714564800.0

Obj = dict[str, Any]


def node(
    name: str,
    domain: str | None = "a",
    gpus: int | str | None = 4,
    *,
    ready: bool = True,
    since: str = T0,
    unschedulable: bool = False,
    taints: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    extra: dict[str, str] | None = None,
) -> Obj:
    lab = {} if domain is None else {LABEL: domain}
    lab.update(labels or {})
    alloc = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
    if gpus is not None:
        alloc[GPU] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "resourceVersion": "1"},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": alloc,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since},
            ],
        },
    }


def pod(
    name: str,
    deployment: str | None = "m",
    namespace: str = "ml",
    *,
    node: str | None = None,
    pinned: str | None = None,
    gpus: int = 4,
    cpu: str = "8",
    memory: str = "64Gi",
    phase: str = "Pending",
    ready: bool = False,
    gated: bool = False,
    deleting: bool = False,
    group: str | None = None,
    rank: int = 0,
    annotations: dict[str, str] | None = None,
    status: Obj | None = None,
    managed: bool = True,
) -> Obj:
    """A tokenfab worker pod of deployment `deployment` (or, with managed=False, anyone's pod)."""
    labels: dict[str, str] = {}
    if managed:
        labels = {
            contract.MANAGED_BY: contract.MANAGED_BY_VALUE,
            contract.COMPONENT: "worker",
            contract.LABEL_RANK: str(rank),
        }
        if deployment is not None:
            labels[contract.LABEL_DEPLOYMENT] = deployment
        labels[contract.LABEL_GROUP] = group or name.rsplit("-", 1)[0]
    ann = dict(annotations or {})
    if pinned is not None:
        ann[contract.ANN_NODE] = pinned
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "annotations": ann,
        "creationTimestamp": T0,
        "resourceVersion": "1",
    }
    if deleting:
        meta["deletionTimestamp"] = T0
    spec: Obj = {
        "containers": [
            {
                "name": "worker",
                "resources": {"limits": {GPU: str(gpus)}, "requests": {"cpu": cpu, "memory": memory}},
            }
        ]
    }
    if node is not None:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": contract.GANG_GATE}]
    st: Obj = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    st.update(status or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": st}


def child(kind: str, name: str, deployment: str | None = "m", namespace: str = "ml") -> Obj:
    labels = {contract.MANAGED_BY: contract.MANAGED_BY_VALUE}
    if deployment is not None:
        labels[contract.LABEL_DEPLOYMENT] = deployment
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def model_deployment(name: str = "m", namespace: str = "ml") -> Obj:
    return {"kind": "ModelDeployment", "metadata": {"name": name, "namespace": namespace, "uid": "u-" + name}}
