"""Facts: what the operator reads of a Kubernetes object, reduced to a few frozen fields.

Every object the watches bring (pods, nodes, the shared children tokenfab applies) is reduced here, so the
cluster view (tokenfab.fleet.view) holds small immutable records at the scale of an AI factory, and equal
facts mean nothing a pass reads has changed. Pure functions of the object: no I/O, no state. Also here: the
comparisons the view uses to decide whether an event concerns anyone (a node's changes, a
ModelDeployment's status-only updates).

A pod's effective requests are counted as the scheduler counts them (the sum over containers, at least the
largest init container, plus the pod overhead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tokenfab.api.models import KIND
from tokenfab.planning import contract
from tokenfab.planning.capacity import NodeFacts, Taint, add, parse_quantity, to_units
from tokenfab.planning.faults import FaultKeys, NodeFault, device_fault, node_faults

Obj = dict[str, Any]
NVSENTINEL = FaultKeys()  # NVSentinel's quarantine signals (tokenfab.planning.faults)


def parse_time(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_requests(spec: Obj) -> dict[str, int]:
    """A pod's effective requests, as the scheduler counts them: the sum over containers (limits stand in
    for missing requests), at least the largest init container, plus the pod overhead."""

    def of(ctr: Obj) -> dict[str, int]:
        res = ctr.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        out = {}
        for name, value in merged.items():
            try:
                out[name] = to_units(name, value)
            except ValueError:
                continue
        return out

    total: dict[str, int] = {}
    for ctr in spec.get("containers") or []:
        total = add(total, of(ctr))
    for ctr in spec.get("initContainers") or []:
        for name, value in of(ctr).items():
            total[name] = max(total.get(name, 0), value)
    overhead = {}
    for name, value in (spec.get("overhead") or {}).items():
        try:
            overhead[name] = to_units(name, value)
        except ValueError:
            continue
    return add(total, overhead)


@dataclass(frozen=True)
class PodFacts:
    """One pod, reduced to what the operator reads (equal facts: nothing a pass reads has changed)."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(hash=False)
    annotations: Mapping[str, str] = field(hash=False)  # tokenfab's own annotations only
    node: str | None  # bound to
    pinned: str | None  # assigned by placement (tokenfab pods)
    phase: str
    ready: bool
    ready_since: float | None
    waiting: str
    deleting: bool
    gated: bool
    requests: Mapping[str, int] = field(hash=False)
    created: float | None
    exit_message: str
    containers_ready: bool = False
    routable: bool | None = None  # the tokenfab.dev/routable readiness gate's condition (None: not set)
    claims_pending: bool = False  # a ResourceClaim of one of its templates not made yet
    unhealthy_since: float | None = None  # its health endpoint stopped answering after it had served
    cache_claim: str = ""  # the node-local model cache claim it mounts (planning.builders.volumes)
    init: str = ""  # its weights init container: "" (none), waiting, running, done or failed

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def usage_node(self) -> str | None:
        """The node whose room this pod holds (None: none)."""
        if self.terminal:
            return None
        return self.node or self.pinned

    @property
    def deployment(self) -> str | None:
        return self.labels.get(contract.LABEL_DEPLOYMENT)


def _init(status: Obj) -> str:
    """The state of a worker pod's weights init container (planning.builders.fetch.weights_init_container):
    "" (none), waiting, running, done or failed."""
    for ctr in status.get("initContainerStatuses") or []:
        if ctr.get("name") != contract.WEIGHTS_INIT_CONTAINER:
            continue
        state = ctr.get("state") or {}
        if "terminated" in state:
            return "done" if state["terminated"].get("exitCode") == 0 else "failed"
        return "running" if "running" in state else "waiting"
    return ""


def _waiting(status: Obj) -> str:
    """Why a pod is not running yet: the scheduler's message, its weights init container's download, or a
    container's waiting reason."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled")
    for ctr in status.get("initContainerStatuses") or []:
        state = ctr.get("state") or {}
        if "running" in state and ctr.get("name") == contract.WEIGHTS_INIT_CONTAINER:
            return f"downloading the weights (init container {contract.WEIGHTS_INIT_CONTAINER})"
        waiting = state.get("waiting")
        if waiting:
            words = f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".rstrip(": ")
            return f"init container {ctr.get('name')}: {words}"
    for ctr in status.get("containerStatuses") or []:
        waiting = (ctr.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".rstrip(": ")
    return ""


def _exit_message(spec: Obj, status: Obj) -> str:
    """How a pod's containers ended: a failed init container first (its weights download), then the
    first container that ended; a container stopped by its startup probe says it ran past its budget."""
    failed_init = [
        (ctr, term)
        for ctr in status.get("initContainerStatuses") or []
        if (term := (ctr.get("state") or {}).get("terminated")) and term.get("exitCode") != 0
    ]
    ended = [
        (ctr, term)
        for ctr in status.get("containerStatuses") or []
        if (term := _terminated(ctr.get("state")) or _terminated(ctr.get("lastState")))
    ]
    for ctr, term in [*failed_init, *ended]:
        words = [f"exit code {term.get('exitCode')}"]
        if failed_init:
            words.insert(0, f"init container {ctr.get('name')}")
        if term.get("reason"):
            words.append(str(term["reason"]))
        if term.get("message"):
            words.append(str(term["message"])[:300].strip())
        budget = _startup_budget(spec, str(ctr.get("name") or ""))
        if not failed_init and budget and not ctr.get("started") and _ran(term) >= budget - 2 * STARTUP_SLACK:
            words.append(
                f"its health endpoint never answered within its startup budget of {budget} s after its "
                "weights were on the node (waiting for its group's pods, loading the weights, compiling "
                "kernels, capturing graphs): raise spec.serving.startupSeconds if the engine needs longer"
            )
        return ", ".join(words)
    return str(status.get("message") or status.get("reason") or "")[:300]


def _terminated(state: Obj | None) -> Obj | None:
    got = (state or {}).get("terminated")
    return got if isinstance(got, dict) else None


STARTUP_SLACK = 5.0  # (seconds: the kubelet's probes and its kill are not to the second)


def _startup_budget(spec: Obj, container: str) -> int:
    """Seconds the container's startup probe allows (failureThreshold x periodSeconds), 0 without one."""
    for ctr in spec.get("containers") or []:
        probe = ctr.get("startupProbe")
        if ctr.get("name") == container and probe:
            return int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))
    return 0


def _ran(term: Obj) -> float:
    start, end = parse_time(term.get("startedAt")), parse_time(term.get("finishedAt"))
    return end - start if start is not None and end is not None else 0.0


def pod_facts(obj: Obj) -> PodFacts:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    conds = {str(cd.get("type")): cd for cd in status.get("conditions") or []}
    ready_cond: Obj = conds.get("Ready", {})
    ready = ready_cond.get("status") == "True"
    routable = conds.get(contract.ROUTABLE_CONDITION)
    ann = meta.get("annotations") or {}
    return PodFacts(
        namespace=meta.get("namespace") or "",
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        annotations={k: v for k, v in ann.items() if k.startswith(contract.DOMAIN + "/")},
        node=spec.get("nodeName") or None,
        pinned=ann.get(contract.ANN_NODE),
        phase=status.get("phase") or "Pending",
        ready=ready,
        ready_since=parse_time(ready_cond.get("lastTransitionTime")) if ready else None,
        waiting=_waiting(status),
        deleting=bool(meta.get("deletionTimestamp")),
        gated=any(g.get("name") == contract.GANG_GATE for g in spec.get("schedulingGates") or []),
        requests=pod_requests(spec),
        created=parse_time(meta.get("creationTimestamp")),
        exit_message=_exit_message(spec, status) if status.get("phase") in ("Failed", "Succeeded") else "",
        init=_init(status),
        containers_ready=conds.get("ContainersReady", {}).get("status") == "True",
        routable=None if routable is None else routable.get("status") == "True",
        claims_pending=_claims_pending(spec, status),
        unhealthy_since=_unhealthy_since(spec, status, conds.get("ContainersReady", {})),
        cache_claim=next(
            (
                str(v["persistentVolumeClaim"].get("claimName") or "")
                for v in spec.get("volumes") or ()
                if v.get("name") == "model-cache" and "persistentVolumeClaim" in v
            ),
            "",
        ),
    )


def _unhealthy_since(spec: Obj, status: Obj, containers_ready: Obj) -> float | None:
    """When a running pod's health endpoint stopped answering after it had served: its containers passed
    their startup probes (`started`: only a container with one says when) and were ready, then a readiness
    probe failed (ContainersReady False since a time after the containers started; False since their
    start means never ready yet, i.e. still loading). None otherwise."""
    if status.get("phase") != "Running" or containers_ready.get("status") != "False":
        return None
    probed = {ctr.get("name") for ctr in spec.get("containers") or [] if ctr.get("startupProbe")}
    statuses = [s for s in status.get("containerStatuses") or [] if s.get("name") in probed]
    if not probed or len(statuses) != len(probed) or not all(s.get("started") for s in statuses):
        return None
    since = parse_time(containers_ready.get("lastTransitionTime"))
    starts = [parse_time(((s.get("state") or {}).get("running") or {}).get("startedAt")) for s in statuses]
    if since is None or any(t is None for t in starts):
        return None
    return since if since > max(t for t in starts if t is not None) + 1.0 else None


def _claims_pending(spec: Obj, status: Obj) -> bool:
    """Whether a claim the pod asks for from a ResourceClaimTemplate has not been made yet (the
    resource claim controller writes an entry into status.resourceClaimStatuses once it has made it, with
    the claim's name, or without one when no claim was needed)."""
    made = {s.get("name") for s in status.get("resourceClaimStatuses") or []}
    return any(
        rc.get("resourceClaimTemplateName") and rc.get("name") not in made
        for rc in spec.get("resourceClaims") or []
    )


def node_facts(obj: Obj, keys: FaultKeys = NVSENTINEL) -> NodeFacts:
    """A Node, reduced; `keys` are the taints, conditions and annotations that mean a GPU health system
    quarantined it (NVSentinel's by default: tokenfab.planning.faults; the operator's come from its
    settings)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    cond: Obj = next((cd for cd in status.get("conditions") or [] if cd.get("type") == "Ready"), {})
    ready = cond.get("status") == "True"
    alloc = {}
    for name, value in (status.get("allocatable") or {}).items():
        try:
            alloc[name] = to_units(name, value)
        except ValueError:
            continue
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
    )
    true = {
        str(cd.get("type")): str(cd.get("message") or "")[:200]
        for cd in status.get("conditions") or []
        if cd.get("status") == "True" and cd.get("type") != "Ready"
    }
    unschedulable = bool(spec.get("unschedulable"))
    return NodeFacts(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        allocatable=alloc,
        ready=ready,
        unschedulable=unschedulable,
        taints=taints,
        not_ready_since=None if ready or not cond else parse_time(cond.get("lastTransitionTime")),
        faults=node_faults(
            ((t.key, t.value, t.effect) for t in taints),
            true,
            (meta.get("annotations") or {}).keys(),
            unschedulable,
            keys,
        ),
    )


def device_taint_rule_facts(obj: Obj) -> tuple[str, NodeFault] | None:
    """The node a DRA DeviceTaintRule (resource.k8s.io/v1, GA in Kubernetes 1.37) taints a device of, and
    the fault, or None when it names no node's pool or has no effect a pod feels (effect None). NVIDIA's
    DRA drivers (GPUs, ComputeDomain IMEX channels) publish one pool per node, named after the node, so
    `deviceSelector.pool` is the node; a rule that names no pool (a whole driver) is not read here."""
    spec = obj.get("spec") or {}
    sel, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
    pool, effect = str(sel.get("pool") or ""), str(taint.get("effect") or "")
    if not pool or effect not in ("NoSchedule", "NoExecute"):
        return None
    device = f"{sel.get('driver') or '*'}/{pool}/{sel.get('device') or '*'}"
    return pool, device_fault(device, str(taint.get("key", "")), str(taint.get("value") or ""), effect)


@dataclass(frozen=True)
class ChildFacts:
    """A shared child (ConfigMap, Service, Deployment, PodGroup) tokenfab applied."""

    kind: str
    namespace: str
    name: str
    deployment: str | None
    applied_hash: str
    available_replicas: int
    role: str = ""
    revision: str = ""
    node: str = ""  # a model cache claim's node
    group: str = ""  # a ComputeDomain's group (one made for a group alone)
    unit: str = ""  # a ComputeDomain's prefill-decode unit (one made for a unit)
    state: str = ""  # a ComputeDomain's status.status (Ready | NotReady)
    holds: tuple[str, ...] = ()  # a model cache claim: the weights it holds (contract.ANN_HOLDS_PREFIX)
    size: int = 0  # a model cache claim: the bytes it asks for
    owners: tuple[str, ...] = ()  # a model cache claim: the ModelDeployments that own it (by name)
    # every applied-hash annotation (key, value); not compared: a shared claim's owners need not wake for
    # one another's hashes (what they read of it, its owners and marks, is)
    applied: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    version: str = field(default="", compare=False)  # its resourceVersion (a delete's precondition)
    replaces: str = ""  # the frontend Deployment's pod template: the pods it replaces (contract.ANN_REPLACES)


def child_facts(kind: str, obj: Obj) -> ChildFacts:
    meta = obj["metadata"]
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    return ChildFacts(
        kind=kind,
        namespace=meta.get("namespace") or "",
        name=meta["name"],
        deployment=labels.get(contract.LABEL_DEPLOYMENT),
        applied_hash=(meta.get("annotations") or {}).get(contract.ANN_APPLIED_HASH, ""),
        available_replicas=int(status.get("availableReplicas") or 0),
        role=labels.get(contract.LABEL_ROLE, ""),
        revision=labels.get(contract.LABEL_REVISION, ""),
        node=(meta.get("annotations") or {}).get(contract.ANN_NODE, ""),
        group=labels.get(contract.LABEL_GROUP, "") if kind == "ComputeDomain" else "",
        unit=labels.get(contract.LABEL_UNIT, "") if kind == "ComputeDomain" else "",
        state=str(status.get("status") or "") if kind == "ComputeDomain" else "",
        holds=_holds(meta) if kind == "PersistentVolumeClaim" else (),
        size=_claim_size(obj) if kind == "PersistentVolumeClaim" else 0,
        owners=_owners(meta) if kind == "PersistentVolumeClaim" else (),
        applied=tuple(
            sorted(
                (k, v)
                for k, v in (meta.get("annotations") or {}).items()
                if k == contract.ANN_APPLIED_HASH or k.startswith(contract.ANN_APPLIED_BY_PREFIX)
            )
        ),
        replaces=_template_annotations(obj).get(contract.ANN_REPLACES, "") if kind == "Deployment" else "",
        version=str(meta.get("resourceVersion") or "") if kind == "PersistentVolumeClaim" else "",
    )


def _holds(meta: Obj) -> tuple[str, ...]:
    """The weights a model cache claim is marked as holding (also the one mark of claims made before
    they were shared)."""
    ann = meta.get("annotations") or {}
    marks = {
        v for k, v in ann.items() if k.startswith(contract.ANN_HOLDS_PREFIX) or k == contract.ANN_WEIGHTS
    }
    return tuple(sorted(m for m in marks if m))


def _owners(meta: Obj) -> tuple[str, ...]:
    return tuple(
        sorted(str(r.get("name", "")) for r in meta.get("ownerReferences") or [] if r.get("kind") == KIND)
    )


def _template_annotations(obj: Obj) -> dict[str, str]:
    template = (obj.get("spec") or {}).get("template") or {}
    return dict((template.get("metadata") or {}).get("annotations") or {})


def _claim_size(obj: Obj) -> int:
    asked = (((obj.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage", 0)
    try:
        return int(parse_quantity(asked))
    except (ValueError, ArithmeticError, TypeError):
        return 0


def status_only(before: Obj, after: Obj) -> bool:
    """Whether two versions of a ModelDeployment differ in their status only."""
    keys = ("generation", "labels", "annotations", "deletionTimestamp", "finalizers", "uid")
    b, a = before.get("metadata") or {}, after.get("metadata") or {}
    return before.get("spec") == after.get("spec") and all(b.get(k) == a.get(k) for k in keys)


def same_node(a: NodeFacts, b: NodeFacts) -> bool:
    """Whether nothing placement reads of a node has changed."""
    return (
        a.ready == b.ready
        and a.unschedulable == b.unschedulable
        and a.taints == b.taints
        and a.labels == b.labels
        and a.allocatable == b.allocatable
        and a.faults == b.faults
    )


def more_room(before: NodeFacts, after: NodeFacts) -> bool:
    """Whether a node's change may let a pod fit where it did not before."""
    return (
        (after.ready and not before.ready)
        or (before.unschedulable and not after.unschedulable)
        or not set(before.taints) <= set(after.taints)
        or any(v > before.allocatable.get(k, 0) for k, v in after.allocatable.items())
        or after.labels != before.labels
        or not set(before.faults) <= set(after.faults)
    )


def node_times(stamps: object) -> dict[str, float]:
    """node -> unix time, from a status map of RFC 3339 times (what cannot be read is left out)."""
    if not isinstance(stamps, dict):
        return {}
    return {str(n): t for n, ts in stamps.items() if (t := parse_time(str(ts))) is not None}
