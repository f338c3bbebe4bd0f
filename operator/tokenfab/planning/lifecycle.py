"""The life of a worker group, as a pure state machine: observed pods in, one state out.

    reserved --> starting --> serving --> draining --> deleting
        |            |           |            |
        +------------+-----------+------------+--> broken --> deleting

- reserved: the group's capacity is held (its nodes are assigned) but the scheduler may not bind it yet:
  some ranks are still being created, or its pods are still behind their scheduling gate.
- starting: released to the scheduler; pods are binding (all or nothing) or booting, not all Ready.
- serving: every pod Running and Ready.
- draining: chosen for removal and out of routing, waiting for in-flight requests.
- deleting: every pod is terminating.
- broken: a pod failed or vanished, a node was lost (gone, not ready past the toleration, or its pods
  evicted by a NoExecute taint), a worker's health endpoint kept failing on a healthy node after it had
  served (`UNHEALTHY_GRACE` past its readiness probe's verdict), or the group could not bind in time; the
  whole group is deleted and placed again.

A group on a node with an announced fault (`NodeHealth.fault`) keeps its state: tokenfab.planning.groups
replaces it first and drains it once the replacement serves.

Placement, status, the autoscaler and the drain logic all read these states. Time is a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tokenfab.api.models import RoleName
from tokenfab.planning.faults import NodeFault

GroupState = Literal["reserved", "starting", "serving", "draining", "deleting", "broken"]
STATES: tuple[GroupState, ...] = ("reserved", "starting", "serving", "draining", "deleting", "broken")

# The moves between two observations of one group that the controller can cause or the cluster can
# produce. Anything else is a bug in classify or in the controller (the tests check every trace).
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    "reserved": frozenset({"reserved", "starting", "serving", "broken", "deleting"}),
    # (starting -> reserved: a released group not recorded yet that lost an unbound pod looks exactly like
    # an interrupted creation, and is completed like one.)
    "starting": frozenset({"starting", "reserved", "serving", "draining", "broken", "deleting"}),
    "serving": frozenset({"serving", "starting", "draining", "broken", "deleting"}),
    "draining": frozenset({"draining", "serving", "starting", "broken", "deleting"}),
    "broken": frozenset({"broken", "deleting"}),
    "deleting": frozenset({"deleting"}),
}
# Seconds a worker's health endpoint may fail (after its readiness probe's own 3 x 10 s) before its group
# counts as lost: an engine that stops answering /health while its node is healthy (a hung NCCL
# communicator after an Xid, a wedged GPU no health system flagged) does not recover on its own.
UNHEALTHY_GRACE = 30.0
# States that hold capacity and count as one of the role's groups.
ALIVE: frozenset[GroupState] = frozenset({"reserved", "starting", "serving", "draining"})


@dataclass(frozen=True)
class PodView:
    """What the lifecycle needs to know about one worker pod."""

    name: str
    rank: int
    phase: str
    ready: bool
    node: str | None  # the node it is bound to
    deleting: bool
    ready_since: float | None = None  # unix time the pod last became Ready
    waiting: str = ""  # why it is not running yet (the scheduler's or the kubelet's words), if known
    gated: bool = False  # still behind tokenfab's scheduling gate
    claims_pending: bool = False  # a ResourceClaim from one of its templates not made yet
    pinned: str | None = None  # the node placement assigned it (it may bind nowhere else)
    exit_message: str = ""  # why its container ended, when it did
    # When its health endpoint stopped answering after it had served (its container passed the startup
    # probe and was ready, then the readiness probe failed); None: healthy, or never ready yet.
    unhealthy_since: float | None = None
    containers_ready: bool = False  # its containers are ready (a leader then waits to be made routable)
    routable: bool | None = None  # its routable readiness gate's condition (None: not set)
    marked_draining: bool = False  # marked draining (taken out of routing)


@dataclass(frozen=True)
class NodeHealth:
    ready: bool
    not_ready_since: float | None = None  # unix time the node stopped being Ready
    schedulable: bool = True  # False when cordoned, or tainted against the group's pods
    faults: tuple[NodeFault, ...] = ()  # cordon, quarantine, device taints (tokenfab.planning.faults)

    @property
    def announced(self) -> NodeFault | None:
        """The first announced fault (its groups move: replaced first, then drained)."""
        return next((f for f in self.faults if not f.sudden and f.moves), None)

    @property
    def sudden(self) -> NodeFault | None:
        """The first sudden one (NoExecute: its pods are being evicted; its groups are lost now)."""
        return next((f for f in self.faults if f.sudden), None)


@dataclass(frozen=True)
class GroupFault:
    """A fault on a node of a group: the node, what (Lost, NotReady, Evicting, Quarantined, Cordoned,
    DeviceTainted, WorkerUnhealthy), the signal's words, and whether the group is lost (sudden) or moves
    (announced)."""

    node: str
    kind: str
    message: str
    sudden: bool
    domain: str = ""  # the group's NVLink domain


@dataclass(frozen=True)
class GroupView:
    """One observed group of a role."""

    name: str
    role: RoleName
    slot: int
    revision: str
    domain: str
    size: int  # pods the group should have
    gpus: int
    pods: tuple[PodView, ...]
    recorded: bool  # listed in status.placement: its creation had completed
    nodes: tuple[str, ...] = ()  # the node assigned to each rank (empty: assigned by the scheduler)
    released_at: float | None = None  # when the scheduler was allowed to bind it (None: not yet)
    draining_since: float | None = None  # when its drain started (None: not draining)
    created_at: float | None = None  # when its first pod was created (None: unknown)
    start_path: str = ""  # warm | fetching | cold: how its nodes' model caches stood when it was placed
    unit: int | None = None  # its prefill-decode unit, as written on its pods (None: none written)
    rdma: bool = False  # its pods hold an RDMA device and IPC_LOCK (labelled so: its unit spans domains)
    drain_inflight: str = ""  # the requests in flight when its drain began, as marked on its pods


def missing_ranks(group: GroupView) -> list[int]:
    ranks = {p.rank for p in group.pods}
    return sorted(set(range(group.size)) - ranks)


def _lost(
    pods: list[PodView], nodes: Mapping[str, NodeHealth], now: float, toleration: float, grace: float
) -> str:
    """Why the group is lost ("" when it is not): a pod failed or is being deleted, its node is gone, not
    ready past the toleration or evicting, the node it was assigned can no longer take it, or a worker's
    health endpoint kept failing."""
    for p in pods:
        if p.deleting:
            return f"pod {p.name} is being deleted"
        if p.phase in ("Failed", "Succeeded"):
            why = f": {p.exit_message}" if p.exit_message else ""
            return f"pod {p.name} {p.phase.lower()}{why}"
        if p.node is not None:
            health = nodes.get(p.node)
            if health is None:
                return f"node {p.node} of pod {p.name} is gone"
            if health.sudden is not None:
                f = health.sudden
                return f"node {p.node} of pod {p.name}: {f.kind.lower()}, {f.message}"
            if not health.ready and (
                health.not_ready_since is None or now - health.not_ready_since >= toleration
            ):
                return f"node {p.node} of pod {p.name} is not ready"
        elif p.pinned is not None:
            health = nodes.get(p.pinned)
            if health is None:
                return f"node {p.pinned} assigned to pod {p.name} is gone"
            if not health.ready or not health.schedulable:
                return f"node {p.pinned} assigned to pod {p.name} can no longer take it"
    for p in pods:
        if _unhealthy(p, now, grace):
            return _unhealthy_words(p, now)
    return ""


def classify(
    group: GroupView,
    nodes: Mapping[str, NodeHealth],
    now: float,
    toleration: float,
    bind_timeout: float = float("inf"),
    unhealthy_grace: float = UNHEALTHY_GRACE,
) -> tuple[GroupState, str]:
    """The group's state and, when broken, why (when starting, why it waits, if a pod says).
    `unhealthy_grace` inf: a hung worker never loses its group (plain Kubernetes, which only takes a
    failing readiness probe's pod out of its Service)."""
    if group.pods and all(p.deleting for p in group.pods):
        return "deleting", "being deleted"
    pods = sorted(group.pods, key=lambda p: p.rank)
    lost = _lost(pods, nodes, now, toleration, unhealthy_grace)
    if lost:
        return "broken", lost
    missing = missing_ranks(group)
    if missing:
        # A pinned pod binds only once every rank of its group exists (gates are lifted, or the PodGroup
        # admits it, when the group is whole): a group with a bound pinned pod lost the missing rank.
        if group.recorded or any(p.node is not None and p.pinned is not None for p in pods):
            return "broken", f"pod rank {missing[0]} is missing"
        return "reserved", f"ranks {missing} not created yet"
    if any(p.gated for p in pods):
        return "reserved", "waiting for the whole group to exist before the scheduler may bind it"
    unbound = [p for p in pods if p.node is None]
    if unbound:
        words = next((p.waiting for p in unbound if p.waiting), "")
        waited = now - group.released_at if group.released_at is not None else 0.0
        if waited >= bind_timeout:
            return "broken", (
                f"not bound within {bind_timeout:.0f} s ({len(unbound)} of {len(pods)} pods unbound"
                + (f": {words}" if words else "")
                + ")"
            )
        return ("draining" if group.draining_since is not None else "starting"), words
    if group.draining_since is not None:
        return "draining", ""
    if all(p.ready and p.phase == "Running" for p in pods):
        return "serving", ""
    sick = next((p for p in pods if p.unhealthy_since is not None), None)
    if sick is not None:  # (lost once UNHEALTHY_GRACE is over)
        return "starting", _unhealthy_words(sick, now)
    return "starting", next((p.waiting for p in pods if p.waiting and not p.ready), "")


def _unhealthy(p: PodView, now: float, grace: float) -> bool:
    since = p.unhealthy_since
    return since is not None and p.phase == "Running" and now - since >= grace


def _unhealthy_words(p: PodView, now: float) -> str:
    since = p.unhealthy_since or now
    return f"pod {p.name}'s health endpoint has not answered for {now - since:.0f} s on healthy node {p.node}"


def group_fault(
    group: GroupView,
    nodes: Mapping[str, NodeHealth],
    now: float,
    toleration: float,
    unhealthy_grace: float = UNHEALTHY_GRACE,
) -> GroupFault | None:
    """The first fault on a node the group's pods are bound to: a sudden one (the node gone, not ready
    past the toleration, evicting) before an announced one (cordoned, quarantined, a device tainted); with
    no node fault, a worker whose health endpoint keeps failing (sudden: the group is lost)."""
    announced: GroupFault | None = None
    d = group.domain
    pods = sorted(group.pods, key=lambda p: p.rank)
    for p in pods:
        if p.node is None:
            continue
        health = nodes.get(p.node)
        if health is None:
            return GroupFault(p.node, "Lost", f"node {p.node} is gone", True, d)
        if not health.ready and (
            health.not_ready_since is None or now - health.not_ready_since >= toleration
        ):
            return GroupFault(p.node, "NotReady", f"node {p.node} is not ready", True, d)
        if health.sudden is not None:
            return GroupFault(p.node, health.sudden.kind, f"node {p.node}: {health.sudden.message}", True, d)
        if announced is None and health.announced is not None:
            f = health.announced
            announced = GroupFault(p.node, f.kind, f"node {p.node}: {f.message}", False, d)
    if announced is not None:
        return announced
    sick = next((p for p in pods if p.node is not None and _unhealthy(p, now, unhealthy_grace)), None)
    if sick is not None and sick.node is not None:
        return GroupFault(sick.node, "WorkerUnhealthy", _unhealthy_words(sick, now), True, d)
    return None


def allowed(before: GroupState, after: GroupState) -> bool:
    return after in TRANSITIONS[before]
