"""One reconcile pass's decisions, pure: `plan(snapshot) -> Plan`, and `settle(snapshot, plan, written)`,
the status once the API server has answered the plan's writes.

The snapshot is everything a pass observed (tokenfab.observe): the deployment with its freshest
status, its groups and their nodes' health, the readings taken from Prometheus, what the cluster cannot
serve, and the free NVLink capacity as the placement ledger saw it when the plan began. The plan is the
whole desired state: the groups per role (from the spec, or the autoscaler), what each role creates, keeps,
drains and deletes (tokenfab.planning.groups), the room each new group is promised, the shared children,
the failure counts, the autoscaler's decision and its Events, and when time alone may change the plan.
Nothing here reads or writes anything: a unit test hands `plan` a snapshot and reads the Plan whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tokenfab.api.models import (
    Condition,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    ProfileStatus,
    RoleFailures,
    RoleName,
    WeightsCacheStatus,
)
from tokenfab.planning import (
    autoscaler,
    builders,
    contract,
    fault_report,
    model_source,
    pod_security,
    recovery,
    weights_cache,
    writes,
)
from tokenfab.planning.autoscaler.signals import Reading
from tokenfab.planning.eviction import NodeCaches
from tokenfab.planning.fabric import CONDITION as FABRIC
from tokenfab.planning.fabric import condition as fabric_condition
from tokenfab.planning.fabric import kv_path_summary, renders_rdma, unit_statuses, without_rdma
from tokenfab.planning.frontend import FrontendPod, gone
from tokenfab.planning.frontend import move as move_frontend
from tokenfab.planning.groups import DrainPolicy, Judging, Leaving, Placing, RolePlan, Wanted, plan_role
from tokenfab.planning.launcher_log import Progress
from tokenfab.planning.lifecycle import UNHEALTHY_GRACE, GroupView, NodeHealth, classify
from tokenfab.planning.model_source import SourceClaim
from tokenfab.planning.role_plan import FaultReaction
from tokenfab.planning.room import FreeDomains, LazyDomains, Reservation, Room
from tokenfab.planning.status import Observed, build_status, parse_rfc3339, placement, rfc3339
from tokenfab.planning.topology import Domain, GroupShape
from tokenfab.planning.units import UNIT_ROLES, Units, units_of

Manifest = builders.Manifest
Event = tuple[str, str, str]  # (type, reason, message)

# Decode (or the aggregated worker) is planned first: it is the larger role and prefill follows it.
PLAN_ORDER: tuple[RoleName, ...] = ("decode", "worker", "prefill")
PROGRESS_SECONDS = 15.0  # a running download's bytes so far are read again this often
SOURCE_LOOK_SECONDS = 60.0  # a pass this often while the ModelSource condition is not True


@dataclass(frozen=True)
class Snapshot:
    """What one pass observed; immutable while it plans."""

    owner: builders.Owner
    md: ModelDeployment  # the freshest status; the spec with the profile's plan merged in
    groups: Mapping[RoleName, list[GroupView]]
    health: Mapping[str, NodeHealth]
    room: Room
    now: float
    asked: autoscaler.Queries = field(default_factory=autoscaler.Queries)  # what the autoscaler asked
    readings: Mapping[str, Reading] = field(default_factory=dict)  # their answers, by query
    drain: DrainPolicy | None = None  # how groups leave (with the engines' in-flight counts when read)
    blocked: Mapping[RoleName, str] = field(default_factory=dict)  # why a role can create no group here
    bind_timeout: float = float("inf")  # seconds a released group may take to bind
    frontend_available: int = 0
    frontend: tuple[FrontendPod, ...] = ()  # its frontend pods that have not ended
    frontend_replaces: str = ""  # the frontend's pod template: the pods it replaces (planning.frontend)
    profile: ProfileStatus | None = None  # spec.profile's plan, as status keeps it
    planned: Condition | None = None  # the Planned condition (None: the spec leaves nothing to plan)
    source: SourceClaim | None = None  # a pvc:// source's claim, as read (None: the source is no claim)
    pod_nodes: frozenset[str] = frozenset()  # the nodes the deployment's pods are on or pinned to
    # Its model cache claims: node -> the weights served from it ("" none yet; planning.weights_cache)
    claims: Mapping[str, str] = field(default_factory=dict)
    caches: NodeCaches = field(default_factory=NodeCaches)  # what the other deployments keep on the nodes
    fetch_pods: tuple[weights_cache.FetchPod, ...] = ()  # its weights-fetch pods (pre-staging)
    weights_sources: Mapping[str, str] = field(default_factory=dict)  # group -> how it got its weights
    loading: tuple[tuple[str, Progress], ...] = ()  # (node, bytes so far) of workers still downloading
    reaction: FaultReaction = field(default_factory=FaultReaction)  # tokenfab's, or a fault bench's baseline
    unit_domains: Mapping[str, int] = field(default_factory=dict)  # its units' ComputeDomains: name -> unit
    units_down: frozenset[int] = frozenset()  # the units whose ComputeDomain is NotReady
    units: bool = True  # prefill-decode units (False: each group placed alone, a benchmark's baseline)
    gang: builders.GangMode = "gates"  # how its multi-node groups bind all or nothing (the cluster's API)
    domains: writes.Domains = field(default_factory=writes.Domains)  # ComputeDomains and their channels
    children: writes.Seen = field(default_factory=writes.Seen)  # its children, for what is no longer wanted
    legacy: Mapping[str, object] | None = None  # the patch that removes old kopf bookkeeping (None: none)
    pod_security: str | None = None  # the level its namespace enforces ("" none; None: not read)
    rdma_resource: str = "rdma/rdma_shared_device_a"  # what a pod of a unit that spans domains asks for
    # The deployment's discovery identity objects in the view, (kind, name) (None: not read, taken as in
    # place; writes.identity_writes)
    identity: frozenset[tuple[str, str]] | None = None

    @property
    def spec(self) -> ModelDeploymentSpec:
        return self.md.spec

    @property
    def source_condition(self) -> Condition | None:
        """The ModelSource condition (None: the source is no claim; planning.model_source)."""
        return model_source.condition(self.owner.namespace, self.source)


@dataclass
class Plan:
    """The whole desired state of one pass."""

    spec: ModelDeploymentSpec  # the snapshot's, with the frontend sized by the autoscaler
    desired: dict[RoleName, int]  # groups per role
    roles: list[RolePlan]
    reservations: list[Reservation]
    writes: writes.Writes  # every write of the pass but the status, in the order they go out
    failures: dict[str, RoleFailures]  # per role, kept in status (a restart keeps the backoff)
    autoscaling: autoscaler.Outcome  # the groups per role (ratio applied), the autoscaler's memory
    events: list[Event] = field(default_factory=list)  # the autoscaler's ScaledUp / ScaledDown
    requeue_after: float | None = None  # when time alone may change this plan
    units: Units | None = None  # the prefill-decode units once this plan is done (None: it has none)
    weights_cache: WeightsCacheStatus | None = None  # status.weightsCache

    @property
    def waiting_for_capacity(self) -> bool:
        return any(p.unplaced or p.rollout_blocked for p in self.roles)


# ------------------------------------------------------------------------------------------ desired


def removing(
    spec: ModelDeploymentSpec, groups: Mapping[RoleName, list[GroupView]], desired: Mapping[RoleName, int]
) -> bool:
    """Whether groups drain or may start to: one is draining, a role has more groups than wanted, or a
    rollout is under way (the engines' in-flight counts are read then)."""
    return any(g.draining_since is not None for gs in groups.values() for g in gs) or any(
        len(gs) > desired.get(role, 0)
        or (spec.role(role) is not None and any(g.revision != builders.role_revision(spec, role) for g in gs))
        for role, gs in groups.items()
    )


# ------------------------------------------------------------------------------------------ failures


def _failures(f: RoleFailures) -> recovery.Failures:
    return recovery.Failures(f.failures, parse_rfc3339(f.last_failure) or 0.0, f.message)


def failures_of(status: ModelDeploymentStatus | None) -> dict[str, recovery.Failures]:
    return {role: _failures(f) for role, f in (status.failures if status else {}).items()}


def _hold(before: recovery.Failures | None, now: float) -> Callable[[list[str]], float]:
    """How long a role waits before replacing groups, counting the failures this pass finds."""

    def hold(broken: list[str]) -> float:
        return recovery.hold(recovery.update(before, broken, 0, 1, None, now), now)

    return hold


def next_failures(
    old: ModelDeploymentStatus | None, plans: list[RolePlan], now: float
) -> dict[str, RoleFailures]:
    """The roles' failure counts after this pass (kept in status, so a restart keeps the backoff)."""
    before = old.failures if old else {}
    out: dict[str, RoleFailures] = {}
    for plan in plans:
        prev = before.get(plan.role)
        broken = [plan.broken_reasons[d.name] for d in plan.delete if d.name in plan.broken_reasons]
        healthy = plan.desired > 0 and plan.ready >= plan.desired
        since = (
            (parse_rfc3339(prev.healthy_since) if prev and prev.healthy_since else None) if healthy else None
        )
        nxt = recovery.update(_failures(prev) if prev else None, broken, plan.ready, plan.desired, since, now)
        if nxt is None:
            continue
        out[plan.role] = RoleFailures(
            failures=nxt.count,
            last_failure=rfc3339(nxt.last),
            message=nxt.message[:500],
            retry_after=rfc3339(nxt.retry_at()),
            healthy_since=(prev.healthy_since if prev and prev.healthy_since else rfc3339(now))
            if healthy
            else None,
        )
    return out


# ------------------------------------------------------------------------------------------ roles


def observed_shape(groups: list[GroupView], spec: ModelDeploymentSpec) -> GroupShape:
    """The shape of a role that left the spec, from its groups as they were made (the spec's
    topology.gpusPerNode may have changed since)."""
    g = max(groups, key=lambda g: g.gpus)
    gpus = max(1, g.gpus)
    per_node = gpus // g.size if g.size > 1 and gpus % g.size == 0 else max(gpus, spec.topology.gpus_per_node)
    return GroupShape(gpus=gpus, gpus_per_node=per_node)


def serving_roles(
    spec: ModelDeploymentSpec,
    groups: Mapping[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    now: float,
) -> set[RoleName]:
    """The roles of the spec with a group serving at the current revision."""
    tol = float(spec.topology.node_failure_toleration_seconds)
    return {
        role
        for role, gs in groups.items()
        if spec.role(role) is not None
        and any(
            g.revision == builders.role_revision(spec, role) and classify(g, health, now, tol)[0] == "serving"
            for g in gs
        )
    }


@dataclass(frozen=True)
class RoleInputs:
    """What every role's plan of one pass shares."""

    spec: ModelDeploymentSpec
    desired: Mapping[RoleName, int]
    groups: Mapping[RoleName, list[GroupView]]
    health: Mapping[str, NodeHealth]
    now: float
    bind_timeout: float = float("inf")
    blocked: Mapping[RoleName, str] = field(default_factory=dict)
    holds: Mapping[str, Callable[[list[str]], float]] = field(default_factory=dict)
    drain: DrainPolicy | None = None
    reaction: FaultReaction = field(default_factory=FaultReaction)
    avoid: frozenset[str] = frozenset()  # NVLink domains where the deployment's groups keep failing
    warmth: Mapping[str, int] = field(default_factory=dict)  # node -> how warm its model cache is
    units_down: frozenset[int] = frozenset()  # units whose ComputeDomain is NotReady (planning.units)
    units: bool = True  # (False: no units, each group placed alone: a benchmark's baseline)
    rdma_resource: str = ""  # what a pod of a unit that spans domains asks for (Snapshot.rdma_resource)


def _plan_one(
    x: RoleInputs,
    role: RoleName,
    capacity: Callable[[RoleName], Mapping[str, Domain]],
    ready: set[RoleName],
    others_short: bool,
    units: Units | None = None,
) -> RolePlan:
    spec = x.spec
    in_spec = spec.role(role) is not None
    shape = builders.group_shape(spec, role) if in_spec else observed_shape(x.groups[role], spec)
    domains = LazyDomains((lambda: capacity(role)) if in_spec else dict)
    revision = builders.role_revision(spec, role) if in_spec else ""
    plan, _ = plan_role(
        Wanted(role, x.desired.get(role, 0), revision, shape),
        x.groups.get(role, []),
        Placing(domains, spec.topology.placement, x.avoid, x.warmth, units if in_spec else None),  # type: ignore[arg-type]
        Judging(
            x.health, x.now, float(spec.topology.node_failure_toleration_seconds), x.bind_timeout, x.reaction
        ),
        Leaving(
            x.holds.get(role, 0.0),
            x.drain,
            all(r in ready for r, _ in spec.roles() if r != role),
            retired=not in_spec,
            others_short=others_short,
        ),
    )
    if units is not None and units.rdma and x.rdma_resource:
        plan.pod_extra = (
            f"each pod with one {x.rdma_resource} ({units.rdma_why}; "
            "spec.topology.kvNetwork: tcp where the cluster has no RDMA devices)"
        )
    why = x.blocked.get(role, "") if in_spec and plan.create else ""
    if why:
        plan.create = [cr for cr in plan.create if cr.reason == "Complete"]
        plan.blocked = why
    return plan


def plan_roles(
    x: RoleInputs,
    capacity: Callable[[RoleName], Mapping[str, Domain]],
    commit: Callable[[RolePlan], None] | None = None,
) -> list[RolePlan]:
    """Plan every role present in the spec or in the cluster (a removed role plans 0 groups). `capacity`
    gives a role's free domains; `commit` reserves a role's new pods before the next role is planned."""
    plans: list[RolePlan] = []
    ready = serving_roles(x.spec, x.groups, x.health, x.now)
    # Roles that left the spec (serving.mode changed) are planned last: their groups serve until every
    # role of the spec has a serving group, and make room when the spec's new groups find none.
    for role in sorted(PLAN_ORDER, key=lambda r: x.spec.role(r) is None):
        if role not in x.desired and role not in x.groups:
            continue
        short = any(p.unplaced or p.rollout_blocked for p in plans)
        plan = _plan_one(x, role, capacity, ready, short, role_units(x, plans))
        if commit is not None:
            commit(plan)
        plans.append(plan)
    return plans


def role_units(x: RoleInputs, plans: list[RolePlan]) -> Units | None:
    """The deployment's prefill-decode units as the next role's plan sees them: the groups that stay and
    those the roles planned so far create (decode is planned before prefill)."""
    spec = x.spec
    if not x.units:
        return None
    roles = [r for r in UNIT_ROLES if spec.role(r) is not None]
    shapes = {r: builders.group_shape(spec, r) for r in roles}
    channel = {r: builders.uses_compute_domain(spec, r) for r in roles}
    return units_of(spec, x.groups, plans, x.desired.get("decode", 0), shapes, x.units_down, channel)


# ------------------------------------------------------------------------------------------ the plan


def _scale(s: Snapshot, capacity: FreeDomains) -> tuple[ModelDeploymentSpec, autoscaler.Outcome]:
    """The autoscaler's step: the groups per role, and the spec with the frontend's size."""
    spec, md = s.spec, s.md
    warmth = weights_cache.node_warmth(spec, s.claims, s.caches.staged_elsewhere)
    seen = autoscaler.Seen(s.now, s.asked, s.readings, s.groups, s.health)
    memory = md.status.autoscaling if md.status else None
    outcome = autoscaler.step(md, seen, memory, autoscaler.Capacity(capacity, warmth))
    if outcome.frontend_replicas is not None:  # the frontend sized from its ingress
        serving = spec.serving.model_copy(update={"frontend_replicas": outcome.frontend_replicas})
        spec = spec.model_copy(update={"serving": serving})
    return spec, outcome


def _scaling_events(outcome: autoscaler.Outcome) -> list[Event]:
    return [
        (
            "Normal",
            "ScaledUp" if d.direction == "up" else "ScaledDown",
            f"{role} {d.current} -> {d.desired} groups: {metric} {d.message} ({d.reason})",
        )
        for role, metric, d in outcome.decisions
        if d.direction != "hold"
    ]


def children(
    owner: builders.Owner,
    spec: ModelDeploymentSpec,
    roles: list[RolePlan],
    nodes: frozenset[str],
    weights: Mapping[str, str] | None = None,
    fetch: Iterable[str] = (),
    replaces: str = "",
) -> tuple[Manifest, tuple[Manifest, ...], tuple[Manifest, ...]]:
    """The shared children of the plan, in the order they are written: the workers' headless Service
    (before the new groups' pods it selects); the pods' discovery identity (a ServiceAccount and Role
    before the RoleBinding that names them, all before the first pods that name the ServiceAccount); then,
    after the new groups, the per-node model caches the pods mount, the frontend Deployment and Service,
    the engine ConfigMaps of the current revisions and a PodDisruptionBudget per role. `nodes` are those
    the deployment's pods are on or pinned to, and the pre-staged ones (the new groups' nodes are added:
    each gets its model cache, marked with the weights served from it); `fetch`: the nodes whose
    weights-fetch pod is to be made; `replaces`: the frontend pods its pod template replaces
    (planning.frontend)."""
    nodes = nodes | {n for r in roles for cr in r.create for n in cr.nodes}
    rest: list[Manifest] = [*builders.model_cache_claims(owner, spec, nodes, weights)]
    rest += [builders.weights_fetch_pod(owner, spec, n, weights_cache.weights_key(spec)) for n in fetch]
    rest += [builders.frontend_deployment(owner, spec, replaces), builders.frontend_service(owner)]
    rest += [builders.engine_configmap(owner, spec, role) for role, _ in spec.roles()]
    rest += [
        builders.pod_disruption_budget(owner, p.role, p.desired * p.shape.nodes)
        for p in roles
        if spec.role(p.role)
    ]
    return builders.workers_service(owner, spec), tuple(builders.discovery_rbac(owner, spec)), tuple(rest)


def plan(s: Snapshot) -> Plan:
    """Everything this pass decides, from what it observed."""
    capacity = FreeDomains(s.room, s.spec, s.owner, s.rdma_resource if renders_rdma(s.spec) else "")
    spec, outcome = _scale(s, capacity)
    desired = outcome.groups
    old = failures_of(s.md.status)
    inputs = RoleInputs(
        spec=spec,
        desired=desired,
        groups=s.groups,
        health=s.health,
        now=s.now,
        bind_timeout=s.bind_timeout,
        blocked=s.blocked,
        holds={role: _hold(old.get(role), s.now) for role in PLAN_ORDER},
        drain=s.drain,
        reaction=s.reaction,
        avoid=frozenset(fault_report.avoided(s.md.status.faults if s.md.status else [], s.now)),
        warmth=weights_cache.node_warmth(spec, s.claims, s.caches.staged_elsewhere),
        units_down=s.units_down,
        units=s.units,
        rdma_resource=s.rdma_resource,
    )
    roles = plan_roles(inputs, capacity, commit=capacity.reserve)
    if any(r.unplaced for r in roles) and capacity.room.holds_fault("Flapping"):
        # Nowhere else: nodes that faulted again soon after they healed (a rack lost twice in 10 minutes)
        # take new groups rather than leave them waiting out the backoff with room in the cluster.
        capacity = FreeDomains(capacity.room.tolerating("Flapping"), s.spec, s.owner, capacity.rdma)
        roles = plan_roles(inputs, capacity, commit=capacity.reserve)
    units = role_units(inputs, roles)
    live = set(units.members) if units is not None else set()
    placed = {n for r in roles for cr in r.create for n in cr.nodes} | s.pod_nodes
    observed, idle = (s.claims, s.groups, s.fetch_pods), weights_cache.idle_before(s.md.status)
    staged = weights_cache.staging(
        spec, s.owner, observed, capacity, outcome.headroom, placed, (s.caches, idle, s.now)
    )
    frontend = s.frontend if s.reaction.mode == "replace" else ()  # (a baseline leaves it to Kubernetes)
    off, (lost, said) = move_frontend(frontend, s.health, s.frontend_replaces), gone(frontend, s.health)
    kids = children(s.owner, spec, roles, s.pod_nodes | staged.nodes, staged.marks, staged.create, off.moved)
    # What the plan itself lets go: pods bound to a node that no longer exists, deleted at once (grace 0),
    # not left to the pod GC (nothing runs them, and until they go the group's name, PodGroup and IMEX
    # channels are held); weights-fetch pods done; model caches evicted; unit ComputeDomains left without
    # a group.
    gone_pods = orphans(s) + lost if s.reaction.mode == "replace" else ()
    evicted = [builders.model_cache_claim_name(s.owner, spec, n) for n in staged.evict]
    unit_domains = sorted(n for n, unit in s.unit_domains.items() if unit not in live)
    goes = (
        *(writes.Delete("v1", "Pod", pod, force=True) for pod in gone_pods),
        *(writes.Delete("v1", "Pod", pod) for pod in staged.delete),
        *(writes.Delete("v1", "PersistentVolumeClaim", claim) for claim in evicted),
        *(writes.Delete(contract.COMPUTE_DOMAIN_API, "ComputeDomain", cd) for cd in unit_domains),
    )
    return Plan(
        spec=spec,
        desired=desired,
        roles=roles,
        reservations=capacity.reservations,
        writes=plan_writes(s, spec, roles, kids, goes),
        failures=next_failures(s.md.status, roles, s.now),
        autoscaling=outcome,
        events=_scaling_events(outcome) + weights_cache.events(staged) + list(off.events) + said,
        requeue_after=requeue_after(s, roles, outcome.next_due),
        units=units,
        weights_cache=weights_cache.report(spec, staged, s.fetch_pods, s.md.status, s.loading),
    )


def plan_writes(
    s: Snapshot,
    spec: ModelDeploymentSpec,
    roles: list[RolePlan],
    kids: tuple[Manifest, tuple[Manifest, ...], tuple[Manifest, ...]],
    goes: tuple[writes.Delete, ...],
) -> writes.Writes:
    """Every write of the plan: the shared children (`kids`), the new groups, the children no longer
    wanted and what the plan lets go (`goes`), and the routing writes that follow."""
    service, wanted, rest = kids
    identity, ready = writes.identity_writes(wanted, s.identity)
    domains, groups, waits = writes.new_groups(
        s.owner, spec, roles, s.gang, s.domains, s.rdma_resource, identity_ready=ready
    )
    stale, releases = writes.stale(s.owner, spec, s.children)
    return writes.Writes(
        workers_service=service,
        identity=identity,
        domains=domains,
        groups=groups,
        waits=waits,
        rest=rest,
        deletes=(*stale, *goes),
        releases=tuple(releases),
        gated=writes.gated_pods(roles, s.groups),
        routable=writes.routable_leaders(roles, s.groups),
        legacy=s.legacy,
    )


def orphans(s: Snapshot) -> tuple[str, ...]:
    """The deployment's worker pods bound to a node that is gone (the snapshot's health knows every node
    its pods are on; one missing there is gone)."""
    pods = [(p.name, p.node) for gs in s.groups.values() for g in gs for p in g.pods]
    return tuple(sorted(name for name, node in pods if node and node not in s.health))


def requeue_after(s: Snapshot, roles: list[RolePlan], due: float | None = None) -> float | None:
    """When time alone (no event) may change this deployment's plan: the autoscaler's next evaluation,
    a binding deadline, a node's toleration running out, a hung worker's grace, an avoided domain's backoff
    (looked at every 10 s while a group waits for room), a download's progress to show, a pvc:// source's
    claim to read again."""
    waits: list[float] = []
    if due is not None:
        waits.append(due)
    tol = float(s.spec.topology.node_failure_toleration_seconds)
    for g in (g for gs in s.groups.values() for g in gs):
        if g.released_at is not None and any(p.node is None for p in g.pods):
            waits.append(g.released_at + s.bind_timeout - s.now)
        for p in g.pods:
            h = s.health.get(p.node or "")
            if h is not None and not h.ready and h.not_ready_since is not None:
                waits.append(h.not_ready_since + tol - s.now)
            if p.unhealthy_since is not None:  # (a hung worker's group is lost once its grace is over)
                waits.append(p.unhealthy_since + UNHEALTHY_GRACE - s.now)
    if any(p.waiting or p.unbound for p in roles):
        waits.append(10.0)
    if any(p.unplaced for p in roles) and s.md.status and fault_report.avoided(s.md.status.faults, s.now):
        waits.append(10.0)
    if any(p.held for p in roles):  # (a lost group waits for its pods to go, or for its delay)
        waits.append(1.0)
    if s.loading or any(f.progress is not None and f.phase == "Running" for f in s.fetch_pods):
        waits.append(PROGRESS_SECONDS)  # (a download's bytes so far, in status while it runs)
    if (source := s.source_condition) is not None and source.status != "True":
        waits.append(SOURCE_LOOK_SECONDS)  # (a pvc:// source's claim put right shows without another event)
    backoff = [p.backoff + 0.1 for p in roles if p.backoff > 0]
    out = None if not waits else max(0.2, min(waits) + 0.1)
    return min([*([] if out is None else [out]), *backoff], default=None)


# ------------------------------------------------------------------------------------------ settle


@dataclass(frozen=True)
class Written:
    """What the API server answered to a plan's writes."""

    created: frozenset[str] = frozenset()  # the new groups that exist whole
    errors: tuple[str, ...] = ()  # what it refused, in its own words


def settle(s: Snapshot, p: Plan, written: Written) -> tuple[ModelDeploymentStatus, list[Condition]]:
    """The status after the plan's writes were answered, and the conditions that changed (for Events)."""
    held = {r.role: f for r in p.roles if r.backoff > 0 and (f := p.failures.get(r.role)) is not None}
    obs = Observed(
        s.md.metadata.generation or 0,
        s.frontend_available,
        p.spec.serving.frontend_replicas,
        builders.endpoint(s.owner),
        written.errors,
        recovery.summary({r: _failures(f) for r, f in held.items()}, s.now) if held else "",
    )
    outcome = p.autoscaling
    units = unit_statuses(p.spec, p.units, lambda role, slot: builders.group_name(s.owner, role, slot))
    fabric = fabric_condition(p.spec, units, without_rdma(p.units))
    source = s.source_condition
    rdma = p.units is not None and (
        p.units.rdma or any(m.rdma for ms in p.units.members.values() for m in ms)
    )
    security = pod_security.condition(p.spec, s.owner.namespace, s.pod_security, rdma)
    faults = fault_report.records(
        s.md.status.faults if s.md.status else [],
        p.roles,
        s.now,
        lambda role, slot: builders.group_name(s.owner, role, slot),  # type: ignore[arg-type]
        written.created,
    )
    status, changed = build_status(
        p.roles,
        placement(s.owner, s.groups, p.roles, written.created, s.weights_sources),
        obs,
        s.md.status,
        s.now,
        autoscaling=outcome.status,
        extra=[
            *outcome.conditions,
            *filter(None, [s.planned, source, fabric, security]),
            fault_report.condition(faults, fault_report.avoided(faults, s.now)),
        ],
    )
    status.profile = s.profile
    status.failures = p.failures
    status.faults = faults
    status.weights_cache = p.weights_cache
    status.units = units
    status.kv_path = kv_path_summary(units)
    said = (
        ("Planned", s.planned),
        ("ModelSource", source),
        (FABRIC, fabric),
        (pod_security.CONDITION, security),
    )
    dropped = {kind for kind, cd in said if cd is None}
    status.conditions = [cd for cd in status.conditions if cd.type not in dropped]
    return status, changed
