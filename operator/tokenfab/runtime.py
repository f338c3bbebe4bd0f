"""The state one operator process keeps for its reconcile passes: settings, the context (the writer, the
cluster view, the placement ledger, the expectations) and what a pass did (`Result`).

`Memory` is only a cache of this process's own recent writes, which the watch may not have shown yet: it
never decides anything on its own, and losing it (a restart) costs at most one repeated write.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tokenfab.adapters.kube import ApiError, Kube, Obj
from tokenfab.adapters.metrics import Reader
from tokenfab.api.models import Condition, ModelDeployment, ModelDeploymentStatus, ProfileStatus
from tokenfab.fleet.expectations import Expectations
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import ClusterView, Key
from tokenfab.planning.faults import FaultKeys
from tokenfab.planning.groups import RolePlan
from tokenfab.planning.launcher_log import Outcome, Progress
from tokenfab.planning.model_source import SourceClaim
from tokenfab.planning.one_pass import Snapshot


@dataclass
class Settings:
    gang: str = "auto"  # auto (PodGroup where the cluster serves it, else gates) | podgroup | gates
    bind_timeout: float = 90.0  # seconds a released group may take to bind before it is placed again
    applied_grace: float = 10.0  # seconds a write is trusted before the watch shows it
    # How hardware faults are answered: replace (tokenfab), or a baseline of the fault benchmark (none:
    # plain Kubernetes; gang-delete: whole-group deletion `gang_delete_seconds` after the fault, as Grove's
    # gang termination). See tokenfab.planning.role_plan.FaultReaction.
    fault_reaction: str = "replace"
    gang_delete_seconds: float = 30.0
    # The taints, node conditions and annotations that mean a GPU health system quarantined a node
    # (TOKENFAB_FAULT_TAINTS / _CONDITIONS / _ANNOTATIONS; NVSentinel's by default).
    fault_keys: FaultKeys = field(default_factory=FaultKeys)
    # Read the launcher's lines from pods' logs (TOKENFAB_READ_POD_LOGS=1: the chart's rbac.readPodLogs,
    # which grants pods/log get): download progress and each group's weights source in status.
    read_pod_logs: bool = False
    # The RDMA device resource a pod of a prefill-decode unit that spans NVLink domains asks for, one per
    # pod (TOKENFAB_RDMA_RESOURCE, the chart's operator.rdmaResource; NVIDIA Network Operator's RDMA shared
    # device plugin names it so by default).
    rdma_resource: str = "rdma/rdma_shared_device_a"


@dataclass
class Memory:
    """What this process wrote for one deployment that the watch may not show yet."""

    applied: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)  # child -> hash, when
    # child -> (the manifest last hashed, its hash with the annotation on): an unchanged manifest, which
    # most passes build, is compared (a deep ==) instead of serialized and hashed again
    hashed: dict[tuple[str, str], tuple[Obj, Obj]] = field(default_factory=dict)
    status: tuple[Obj, str, float] | None = None  # status written, resourceVersion returned, when
    errors_posted: dict[str, float] = field(default_factory=dict)  # error text -> when its Event went out
    legacy_checked: str = ""  # the resourceVersion whose old kopf bookkeeping was patched off
    pod_writes: dict[tuple[str, str], float] = field(default_factory=dict)  # (pod, what) -> when written
    # per worker pod (name@created): where its launcher got the weights (its log), and when to read again
    launcher: dict[str, tuple[Outcome | None, float]] = field(default_factory=dict)
    progress: dict[str, Progress] = field(default_factory=dict)  # a pod downloading -> its download so far
    log_reads: dict[tuple[str, str], Future[str]] = field(default_factory=dict)  # pod logs being read
    tail_read_at: dict[str, float] = field(default_factory=dict)  # a pod's tail -> when last asked for
    source_claim: tuple[SourceClaim, float] | None = None  # a pvc:// source's claim as read, and when


@dataclass
class Context:
    kube: Kube
    view: ClusterView
    ledger: Ledger
    expectations: Expectations = field(default_factory=Expectations)
    settings: Settings = field(default_factory=Settings)
    reader: Reader | None = None
    planner: Any = None  # Planner | None
    memory: dict[Key, Memory] = field(default_factory=dict)
    urgent: set[Key] = field(default_factory=set)  # deployments the burst watch saw a burst begin in
    # The Pod Security level each namespace enforces, as last read, and when (observe.pod_security_level)
    levels: dict[str, tuple[str | None, float]] = field(default_factory=dict)

    def mem(self, key: Key) -> Memory:
        return self.memory.setdefault(key, Memory())


@dataclass
class Result:
    """What one pass did (for logs, tests and the operator's metrics)."""

    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    draining: list[str] = field(default_factory=list)  # groups this pass took out of routing
    channel_waits: list[str] = field(default_factory=list)  # new groups waiting for their IMEX channel
    identity_waits: list[str] = field(default_factory=list)  # new groups waiting for their pods' identity
    applied: list[str] = field(default_factory=list)
    conditions_changed: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    plans: list[RolePlan] = field(default_factory=list)
    errors: list[ApiError] = field(default_factory=list)
    requeue_after: float | None = None
    waiting_for_capacity: bool = False
    waited: bool = False  # the pass only waited for the watch to show its last writes
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase of the pass

    @property
    def wrote(self) -> bool:
        return bool(self.created or self.deleted or self.released or self.applied)


@dataclass(frozen=True)
class Observed:
    """A pass's observation: the deployment's object and the snapshot its plan is made from."""

    body: Obj
    snapshot: Snapshot


@dataclass(frozen=True)
class Ended:
    """A pass that ends at its observation: the status to write and the Events to post, if any, and the
    old kopf bookkeeping to take off (nothing else is written)."""

    body: Obj
    result: Result
    status: ModelDeploymentStatus | None = None
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, message)
    legacy: Mapping[str, object] | None = None
    gone: bool = False  # the deployment is going: only its old bookkeeping is taken off


@dataclass(frozen=True)
class Stopped:
    """An observation on which no groups are planned: a spec the models refuse (`errors`), or spec.profile
    with no plan yet, or none possible (`planned`: the Planned condition, with status.profile). The plan
    phase makes its status (tokenfab.planning.status.stopped); nothing else is written."""

    body: Obj
    md: ModelDeployment | None = None
    errors: tuple[str, ...] = ()
    planned: Condition | None = None
    profile: ProfileStatus | None = None
    legacy: Mapping[str, object] | None = None
