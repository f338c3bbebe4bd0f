"""What the group planner decides for one role (tokenfab.planning.groups): the groups to create, delete and
drain, and everything the status reports of the role, as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tokenfab.api.models import RoleName
from tokenfab.planning.lifecycle import GroupFault, GroupState
from tokenfab.planning.topology import GroupShape


@dataclass(frozen=True)
class Create:
    role: RoleName
    slot: int
    domain: str
    revision: str
    reason: str  # Missing | Replace | Evacuate | Rejoin | Surge | Complete
    nodes: tuple[str, ...] = ()  # the node of each created rank, in rank order
    ranks: tuple[int, ...] = ()  # the ranks to create (empty: all of them)
    replaces: str = ""  # the group lost to, or moving off, a fault that this one replaces
    path: str = ""  # how it starts: warm | fetching | cold (its nodes' model caches; "" none kept)
    unit: int | None = None  # its prefill-decode unit (planning.units; None: the deployment has none)
    rdma: bool = False  # its pods hold an RDMA device and IPC_LOCK (its unit spans NVLink domains)


@dataclass(frozen=True)
class Delete:
    role: RoleName
    name: str
    reason: str  # Broken | Surplus | Rollout | Evacuate | Rejoin | Drained | DrainTimedOut
    inflight: float | None = None  # requests still in flight when it goes (drains only)
    drained_for: float | None = None  # seconds its drain took


@dataclass(frozen=True)
class Drain:
    role: RoleName
    name: str
    reason: str  # Surplus | Rollout | Evacuate | Rejoin
    inflight: float | None = None  # requests in flight when its drain starts, if known


@dataclass(frozen=True)
class DrainPolicy:
    """How groups leave. seconds 0: deleted at once. inflight None: no metrics (the deployment names no
    Prometheus), so a group is deleted at once too and its engine drains on SIGTERM within the pods' grace
    period. Otherwise a serving group is first taken out of routing and deleted once `inflight` says it
    is idle (after `settle` seconds, so the samples postdate its leaving routing) or after `seconds`."""

    seconds: float = 0.0
    inflight: Mapping[str, float] | None = None  # group -> requests in flight (missing: unknown)
    settle: float = 6.0

    @property
    def observed(self) -> bool:
        return self.seconds > 0 and self.inflight is not None


@dataclass
class RolePlan:
    role: RoleName
    desired: int
    revision: str
    shape: GroupShape
    states: dict[str, GroupState] = field(default_factory=dict)
    create: list[Create] = field(default_factory=list)
    delete: list[Delete] = field(default_factory=list)
    release: list[str] = field(default_factory=list)  # reserved groups whose pods all exist: ungate them
    unplaced: int = 0
    held: int = 0  # lost groups that still stand in for their replacement (see FaultReaction)
    largest_block: tuple[int, str | None] = (0, None)
    rollout_blocked: bool = False
    old_groups: int = 0  # alive groups at an older revision (a rollout is under way)
    blocked: str = ""  # why new groups of this role cannot be created at all (set by the caller)
    broken_reasons: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)  # starting group -> why its first stuck pod waits
    unbound: dict[str, str] = field(default_factory=dict)  # alive group not fully bound yet -> why
    refused: dict[str, str] = field(
        default_factory=dict
    )  # group whose creation the API server refused -> why
    backoff: float = 0.0  # seconds until a new group may be created (the role's groups keep failing)
    drain: list[Drain] = field(default_factory=list)  # serving groups to take out of routing now
    undrain: list[str] = field(default_factory=list)  # draining groups needed again: back into routing
    draining: dict[str, float] = field(default_factory=dict)  # group -> seconds it has been draining
    # group -> when its drain started (epoch seconds): what the status states, so that it changes when a
    # drain does, not every second
    drain_started: dict[str, float] = field(default_factory=dict)
    # Groups hit by a hardware fault: lost to a sudden one (deleted, re-placed at once) or moving off an
    # announced one (replaced first, then drained).
    faults: dict[str, GroupFault] = field(default_factory=dict)
    # A group away from the NVLink domain holding most of its prefill-decode unit, moving there now that
    # the domain has room (replaced there first, then drained: planning.units.Units.home)
    rejoin: list[str] = field(default_factory=list)
    pod_extra: str = ""  # what each pod needs besides its GPUs, for the Placed condition's message

    @property
    def ready(self) -> int:
        """Groups serving (every pod Running and Ready)."""
        return sum(1 for s in self.states.values() if s == "serving")


@dataclass(frozen=True)
class FaultReaction:
    """How hardware faults are answered.

    - replace (tokenfab): a group on a node with an announced fault is replaced first, then drained; a
      group lost to a sudden one is deleted and re-placed whole at once, its pods on a gone Node deleted
      with grace period 0.
    - none (plain Kubernetes, a baseline of the fault benchmark): announced faults are not acted on (a
      group leaves when its pods are evicted); pods on a gone Node wait for the pod garbage collector, and
      a broken group's replacement waits until its pods are gone, as a StatefulSet or LeaderWorkerSet
      recreates a pod only once the old one is deleted; a hung worker (its readiness probe failing) only
      leaves its Service, and its group stays.
    - gang-delete (Grove's gang termination, a baseline): a group lost to a sudden fault is deleted whole
      `delay` seconds after the fault was seen (`seen`, from the status's fault records), then replaced;
      announced faults are not acted on; nothing is force-deleted."""

    mode: Literal["replace", "none", "gang-delete"] = "replace"
    delay: float = 30.0
    seen: Mapping[str, float] = field(default_factory=dict)  # group -> when its fault was first seen
