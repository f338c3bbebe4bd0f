"""One reconcile pass of a ModelDeployment: observe (from the cluster view) -> plan (pure, capacity from the
placement ledger) -> act (the writer) -> status.

Every trigger (the deployment changed, one of its pods or children changed, a node it uses changed,
capacity freed up, a timer) runs the same `reconcile`, which compares desired with observed state, so a
restart at any point converges. Everything that matters is in the cluster: the pods carry their group,
revision, domain and assigned node; the resource's status carries placement and the autoscaler's memory.
`Memory` only remembers what this process wrote and the watch has not shown yet, so nothing is written
twice; losing it costs at most one repeated write.

A pass that finds everything in place makes no request at all: it reads the view, and a shared child is
applied only when its manifest's hash differs from the one recorded on the object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from tokenfab import execute as ex
from tokenfab.adapters import metrics, telemetry
from tokenfab.adapters.kube import Obj
from tokenfab.api.errors import SpecError, parse_model_deployment
from tokenfab.api.models import (
    Autoscaling,
    Condition,
    GroupPlacement,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    ProfileStatus,
    RoleFailures,
    RoleName,
)
from tokenfab.autoscale import Outcome, autoscale, due_queries, next_due, one_timeout_per_pass
from tokenfab.fleet.ledger import Session
from tokenfab.fleet.view import Key, parse_time
from tokenfab.observe import group_views, node_health
from tokenfab.planning import builders as b
from tokenfab.planning import recovery, sla
from tokenfab.planning.autoscaling import Decision
from tokenfab.planning.capacity import Constraints
from tokenfab.planning.groups import DrainPolicy, RolePlan, plan_role
from tokenfab.planning.lifecycle import GroupView, NodeHealth, classify
from tokenfab.planning.status import Observed, build_status, event_for, merge_conditions, rfc3339
from tokenfab.planning.topology import Domain, GroupShape
from tokenfab.runtime import Context, Result, Settings

log = logging.getLogger(__name__)

# Decode (or the aggregated worker) is planned first: it is the larger role and prefill follows it.
PLAN_ORDER: tuple[RoleName, ...] = ("decode", "worker", "prefill")


def _time(ts: str | None) -> float | None:
    return parse_time(ts)


def desired_groups(md: ModelDeployment) -> dict[RoleName, int]:
    """Groups per role: the spec's, or the autoscaler's decision (kept in status) when it is on."""
    spec = md.spec
    wanted = b.spec_groups(spec)
    scaler = md.status.autoscaling if md.status else None
    if spec.autoscaling.enabled and scaler is not None:
        for role, n in scaler.desired.items():
            if role in wanted:
                wanted[role] = n
        if "prefill" in wanted and "decode" in wanted and "prefill" not in scaler.desired:
            wanted["prefill"] = b.follow_ratio(spec, wanted["decode"], wanted["prefill"])
    return wanted


# ---------------------------------------------------------------------------------- spec.profile

# Polls a plan for (profile hash, request): the outcome once ready, None while it is being made.
Planner = Callable[[str, sla.PlanRequest], sla.PlanOutcome | None]


# Outcomes worth asking again for: the planner may be installed, or work, later.
RETRY_SECONDS = {sla.PLANNER_UNAVAILABLE: 60.0, sla.PLANNER_FAILED: 300.0}


@dataclass(frozen=True)
class Planning:
    """The spec with the plan merged in (in memory), status.profile, and the Planned condition; `wait`
    when no groups can be planned yet (no plan, or none possible)."""

    spec: ModelDeploymentSpec
    status: ProfileStatus | None
    condition: Condition | None
    wait: bool


def plan_profile(
    spec: ModelDeploymentSpec, old: ProfileStatus | None, planner: Planner | None, now: float
) -> Planning:
    """Fill what the spec leaves out from the plan for its profile (made once per profile hash, off the
    reconcile path by `planner`)."""
    if not spec.left_to_plan():
        return Planning(spec, None, None, wait=False)
    key = sla.profile_hash(spec)
    status = old if old is not None and old.profile_hash == key else None
    # The planner, not the profile, failed: ask again after a while.
    retry = RETRY_SECONDS.get(status.reason) if status is not None else None
    if status is not None and retry is not None and now - (_time(status.time) or 0.0) >= retry:
        status = None
    if status is None:
        if planner is None:
            outcome: sla.PlanOutcome | None = sla.PlanOutcome(
                ok=False, reason=sla.PLANNER_UNAVAILABLE, message="this operator runs without a planner"
            )
        else:
            outcome = planner(key, sla.request_for(spec))
        if outcome is None:
            msg = f"planning {', '.join(spec.left_to_plan())} for spec.profile with aiconfigurator"
            cond = Condition(type="Planned", status="Unknown", reason="Planning", message=msg)
            return Planning(spec, old, cond, wait=True)
        status = sla.plan_status(outcome, spec, rfc3339(now))
    if not status.ok:
        cond = Condition(type="Planned", status="False", reason=status.reason, message=status.message)
        return Planning(spec, status, cond, wait=True)
    try:
        merged = sla.apply_plan(spec, status)
    except ValueError as exc:
        cond = Condition(type="Planned", status="False", reason="PlanInvalid", message=str(exc))
        return Planning(spec, status, cond, wait=True)
    cond = Condition(type="Planned", status="True", reason=sla.PLANNED, message=status.message)
    return Planning(merged, status, cond, wait=False)


def _waiting_status(
    old: ModelDeploymentStatus | None, planning: Planning, generation: int, now: float
) -> tuple[ModelDeploymentStatus, list[Condition]]:
    assert planning.condition is not None
    planned = planning.condition
    reason = "Planning" if planned.status == "Unknown" else planned.reason
    ready = Condition(type="Ready", status="False", reason=reason, message=planned.message)
    base = old or ModelDeploymentStatus()
    conds, changed = merge_conditions(base.conditions, [ready, planned], generation, now)
    status = base.model_copy(
        update={"conditions": conds, "profile": planning.status, "observed_generation": generation}
    )
    return status, changed


# ------------------------------------------------------------------------------------------- pass


def take(keys: set[Key], key: Key) -> bool:
    """Whether `key` was in `keys`, removed in one step (another thread may add it at any time)."""
    try:
        keys.remove(key)
    except KeyError:
        return False
    return True


def _default_reader(url: str, query: str) -> metrics.Reading:
    return metrics.read(url, query)


def telemetry_hook(namespace: str, name: str, role: str, metric: str, d: Decision, a: Autoscaling) -> None:
    target = a.target_kv_cache_utilization if metric == "kv_cache_utilization" else a.target_queue_depth
    telemetry.AUTOSCALER_TARGET.labels(namespace, name, role, metric).set(target)
    if d.signal is not None:
        telemetry.AUTOSCALER_SIGNAL.labels(namespace, name, role, metric).set(d.signal)
    telemetry.SCALING_DECISIONS.labels(namespace, name, role, d.direction).inc()


def _observed_shape(groups: list[GroupView], spec: ModelDeploymentSpec) -> GroupShape:
    """The shape of a role that left the spec, from its groups as they were made (the spec's
    topology.gpusPerNode may have changed since)."""
    g = max(groups, key=lambda g: g.gpus)
    gpus = max(1, g.gpus)
    per_node = gpus // g.size if g.size > 1 and gpus % g.size == 0 else max(gpus, spec.topology.gpus_per_node)
    return GroupShape(gpus=gpus, gpus_per_node=per_node)


class LazyDomains(Mapping[str, Domain]):
    """Free capacity computed on first use (most passes never need it)."""

    def __init__(self, make: Callable[[], dict[str, Domain]]) -> None:
        self._make = make
        self._value: dict[str, Domain] | None = None

    def _get(self) -> dict[str, Domain]:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __getitem__(self, key: str) -> Domain:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    @property
    def computed(self) -> bool:
        return self._value is not None


class RoleCapacity:
    """Per-role free capacity inside one ledger session, recomputed after each reservation."""

    def __init__(self, session: Session, spec: ModelDeploymentSpec, constraints: Constraints) -> None:
        self.session = session
        self.spec = spec
        self.constraints = constraints
        self._cache: dict[RoleName, dict[str, Domain]] = {}

    def __call__(self, role: RoleName) -> dict[str, Domain]:
        if role not in self._cache:
            self._cache[role] = self.session.domains(b.pod_requests(self.spec, role), self.constraints)
        return self._cache[role]

    def reserve(self, key: Key, owner: b.Owner, plan: RolePlan, now: float) -> None:
        if not plan.create:
            return
        requests = b.pod_requests(self.spec, plan.role)
        for cr in plan.create:
            group = b.group_name(owner, cr.role, cr.slot)
            ranks = cr.ranks or tuple(range(len(cr.nodes)))
            pods = {b.pod_name(group, r): (n, requests) for r, n in zip(ranks, cr.nodes, strict=True)}
            self.session.reserve(key, group, pods, now)
        self._cache.clear()


class Stopwatch:
    """Seconds spent in each phase of a pass (logged when a pass is slow)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._t, 4)
        self._t = now


def _failures(f: RoleFailures) -> recovery.Failures:
    return recovery.Failures(f.failures, _time(f.last_failure) or 0.0, f.message)


def drain_policy(
    spec: ModelDeploymentSpec,
    groups: dict[RoleName, list[GroupView]],
    desired: Mapping[RoleName, int],
    read: Callable[[str, str], metrics.Reading],
    namespace: str,
    name: str,
) -> DrainPolicy:
    """How this pass's groups leave. With a Prometheus (spec.autoscaling.prometheusUrl) and drainSeconds,
    drains are observed: the engines' in-flight requests are read when a group drains or may start to
    (more groups than wanted, or a rollout); a failed read leaves every group's count unknown (a drain
    then waits for its deadline). Without one, or with serving.drainMode sigterm, groups go at once and
    drain on SIGTERM."""
    seconds = float(spec.serving.drain_seconds)
    url = spec.autoscaling.prometheus_url
    if seconds <= 0 or not url or spec.serving.drain_mode == "sigterm":
        return DrainPolicy(seconds, None)
    removing = any(g.draining_since is not None for gs in groups.values() for g in gs) or any(
        len(gs) > desired.get(role, 0)
        or (spec.role(role) is not None and any(g.revision != b.role_revision(spec, role) for g in gs))
        for role, gs in groups.items()
    )
    if not removing:
        return DrainPolicy(seconds, {})
    reading = read(url, metrics.inflight_query(namespace, name))
    inflight = {g: s.value for g, s in (reading.samples or {}).items() if s.age_seconds <= 30}
    return DrainPolicy(seconds, inflight)


def _hold(before: recovery.Failures | None, now: float) -> Callable[[list[str]], float]:
    """How long a role waits before replacing groups, counting the failures this pass finds."""

    def hold(broken: list[str]) -> float:
        return recovery.hold(recovery.update(before, broken, 0, 1, None, now), now)

    return hold


def failures_of(status: ModelDeploymentStatus | None) -> dict[str, recovery.Failures]:
    return {role: _failures(f) for role, f in (status.failures if status else {}).items()}


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
        since = (_time(prev.healthy_since) if prev and prev.healthy_since else None) if healthy else None
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


def _capacity_of(
    capacity: Callable[[RoleName], Mapping[str, Domain]], role: RoleName
) -> Callable[[], dict[str, Domain]]:
    return lambda: dict(capacity(role))


def plan_all(
    spec: ModelDeploymentSpec,
    desired: dict[RoleName, int],
    groups: dict[RoleName, list[GroupView]],
    capacity: Callable[[RoleName], Mapping[str, Domain]],
    health: dict[str, NodeHealth],
    now: float,
    bind_timeout: float = float("inf"),
    commit: Callable[[RolePlan], None] | None = None,
    blocked: Callable[[RoleName], str] | None = None,
    holds: Mapping[str, Callable[[list[str]], float]] | None = None,
    drain: DrainPolicy | None = None,
) -> list[RolePlan]:
    """Plan every role present in the spec or in the cluster (a removed role plans 0 groups). `capacity`
    gives a role's free domains; `commit` reserves a role's new pods before the next role is planned;
    `drain` says how groups leave."""
    plans: list[RolePlan] = []
    ready_roles = {
        role
        for role, gs in groups.items()
        if spec.role(role) is not None
        and any(
            g.revision == b.role_revision(spec, role)
            and classify(g, health, now, float(spec.topology.node_failure_toleration_seconds))[0] == "serving"
            for g in gs
        )
    }
    # Roles that left the spec (serving.mode changed) are planned last: their groups serve until every
    # role of the spec has a serving group, and make room when the spec's new groups find none.
    order = sorted(PLAN_ORDER, key=lambda r: spec.role(r) is None)
    for role in order:
        if role not in desired and role not in groups:
            continue
        in_spec = spec.role(role) is not None
        shape = b.group_shape(spec, role) if in_spec else _observed_shape(groups[role], spec)
        revision = b.role_revision(spec, role) if in_spec else ""
        domains: Mapping[str, Domain] = LazyDomains(_capacity_of(capacity, role) if in_spec else dict)
        plan, _ = plan_role(
            role,
            desired.get(role, 0),
            revision,
            shape,
            groups.get(role, []),
            domains,  # type: ignore[arg-type]
            spec.topology.placement,
            health,
            now,
            float(spec.topology.node_failure_toleration_seconds),
            bind_timeout,
            (holds or {}).get(role, 0.0),
            drain,
            all(r in ready_roles for r, _ in spec.roles() if r != role),
            retired=not in_spec,
            others_short=any(p.unplaced or p.rollout_blocked for p in plans),
        )
        why = blocked(role) if blocked is not None and in_spec and plan.create else ""
        if why:
            plan.create = [cr for cr in plan.create if cr.reason == "Complete"]
            plan.blocked = why
        if commit is not None:
            commit(plan)
        plans.append(plan)
    return plans


def reconcile(ctx: Context, key: Key, now: float) -> Result | None:
    """One pass, its writes seen through before it returns. Returns None when the ModelDeployment is
    gone."""
    result = begin(ctx, key, now)
    if result is not None:
        result.complete()
    return result


def begin(ctx: Context, key: Key, now: float) -> Result | None:
    """One pass up to its writes: observe, plan, and hand the writes to the writer. The Result's
    `pending` are the writes in flight and `complete()` the rest of the pass (what their answers mean,
    then the status), to run once they are answered; a pass with nothing in flight may complete at once.
    Returns None when the ModelDeployment is gone."""
    namespace, name = key
    body = ctx.view.model_deployment(key)
    if body is None or body["metadata"].get("deletionTimestamp"):
        # (its reservations stay until its pods appear or they expire: see Controller.on_model_deployment)
        ctx.expectations.forget(key)
        ctx.memory.pop(key, None)
        ctx.urgent.discard(key)
        if body is not None:
            ex.remove_legacy(ctx, body)
        return None
    ctx.mem(key)  # (this deployment's memory exists from its first pass on)
    ex.remove_legacy(ctx, body)
    try:
        md = parse_model_deployment(body)
    except SpecError as exc:
        try:  # a status written by another operator version must not stop the spec from being served
            md = parse_model_deployment({**body, "status": None})
        except SpecError:
            return ex.invalid(ctx, body, exc, now)
    # Decide from the freshest status: this process's last write if the watch has not shown it yet
    # (the autoscaler's windows, the failure counts, the plan and the placement record live there).
    md = md.model_copy(update={"status": ex.last_status(ctx, key, body, md)})
    planning = plan_profile(md.spec, md.status.profile if md.status else None, ctx.planner, now)
    if planning.wait:  # no plan yet (or none possible): say so, and leave every child as it is
        waiting, changed_conds = _waiting_status(md.status, planning, md.metadata.generation or 0, now)
        result = Result(requeue_after=5.0)
        ex.write_status(ctx, key, body, waiting, result)
        for cond in changed_conds:
            kind = "Warning" if cond.status == "False" and cond.reason != "Planning" else "Normal"
            ctx.kube.post_event(body, kind, cond.reason, f"{cond.type}={cond.status}: {cond.message}")
        result.conditions_changed = [f"{cd.type}={cd.status}/{cd.reason}" for cd in changed_conds]
        return result
    md = md.model_copy(update={"spec": planning.spec})
    spec = md.spec
    if not ctx.expectations.satisfied(key, ctx.view, now):
        return Result(requeue_after=1.0, waited=True)
    owner = b.Owner(name=name, namespace=namespace, uid=body["metadata"]["uid"])
    constraints = b.placement_constraints(spec)
    pods = ctx.view.pods(key)
    recorded = {p.group for p in (md.status.placement if md.status else [])}
    groups = group_views(pods, recorded)
    health = node_health(ctx.view, pods, constraints)

    clock = Stopwatch()
    # What needs the API (discovery, Prometheus) is read before the ledger is taken.
    blocked = ex.compute_domain_block(ctx, spec)
    readings: dict[str, metrics.Reading] = {}
    read = one_timeout_per_pass(ctx.reader or _default_reader)
    urgent = take(ctx.urgent, key)  # the burst watch saw a burst begin: evaluate without waiting the interval
    if spec.autoscaling.enabled:
        due = due_queries(md, now, urgent)
        if urgent and not due:  # (not even the gap since the last evaluation has passed: kept for then)
            ctx.urgent.add(key)
        for q in due:
            readings[q] = read(spec.autoscaling.prometheus_url or "", q)
    drain = drain_policy(spec, groups, desired_groups(md), read, namespace, name)

    clock.lap("observe")
    # Plan: every decision that takes capacity is made and reserved inside one ledger session.
    with ctx.ledger.session() as session:
        clock.lap("ledger-wait")
        capacity = RoleCapacity(session, spec, constraints)
        desired = desired_groups(md)
        outcome: Outcome | None = None
        if spec.autoscaling.enabled:
            outcome = autoscale(md, groups, health, capacity, now, lambda _url, q: readings[q], urgent)
            desired.update(outcome.desired)
            if "prefill" in desired and "decode" in desired and spec.serving.ratio_policy == "fixed":
                desired["prefill"] = b.follow_ratio(spec, desired["decode"], desired["prefill"])
            if outcome.frontend_replicas is not None:  # the frontend sized from its ingress
                serving = spec.serving.model_copy(update={"frontend_replicas": outcome.frontend_replicas})
                spec = spec.model_copy(update={"serving": serving})
        old_failures = failures_of(md.status)
        plans = plan_all(
            spec,
            desired,
            groups,
            capacity,
            health,
            now,
            ctx.settings.bind_timeout,
            commit=lambda plan: capacity.reserve(key, owner, plan, now),
            blocked=blocked,
            holds={role: _hold(old_failures.get(role), now) for role in PLAN_ORDER},
            drain=drain,
        )

    clock.lap("plan")
    # Act: the writes go to the writer's threads; what their answers mean, and the status, follow once
    # the API server has answered them all (`finish`, run by whoever waits for them).
    result = Result(plans=plans)
    sub = ex.submit(ctx, key, owner, spec, plans, now)
    clock.lap("act")
    result.pending = sub.futures()
    final_spec = spec

    def finish() -> None:
        _finish(
            ctx, key, body, md, final_spec, owner, planning, outcome, plans, groups, health, result, sub,
            clock, now,
        )  # fmt: skip

    result.finish = finish
    return result


def _finish(
    ctx: Context,
    key: Key,
    body: Obj,
    md: ModelDeployment,
    spec: ModelDeploymentSpec,
    owner: b.Owner,
    planning: Planning,
    outcome: Outcome | None,
    plans: list[RolePlan],
    groups: dict[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    result: Result,
    sub: ex.Submitted,
    clock: Stopwatch,
    now: float,
) -> None:
    """The rest of a pass once its writes are answered: act on the answers, then the status."""
    namespace, name = key
    mem = ctx.mem(key)
    ex.complete(ctx, key, body, spec, plans, result, now, sub)
    clock.lap("writes")

    # Status.
    frontend = ctx.view.child("Deployment", namespace, b.frontend_name(owner))
    placement = _placement(plans, groups, owner, result)
    failures = next_failures(md.status, plans, now)
    held = {p.role: f for p in plans if p.backoff > 0 and (f := failures.get(p.role)) is not None}
    obs = Observed(
        md.metadata.generation or 0,
        frontend.available_replicas if frontend else 0,
        spec.serving.frontend_replicas,
        b.endpoint(owner),
        tuple(str(e) for e in result.errors),
        recovery.summary({r: _failures(f) for r, f in held.items()}, now) if held else "",
    )
    old_status = ex.last_status(ctx, key, body, md)
    status, changed = build_status(
        plans,
        placement,
        obs,
        old_status,
        now,
        autoscaling=outcome.status if outcome else None,
        extra=[*(outcome.conditions if outcome else ()), *filter(None, [planning.condition])],
    )
    status.profile = planning.status
    status.failures = failures
    if planning.condition is None:
        status.conditions = [cd for cd in status.conditions if cd.type != "Planned"]
    for role, metric, dec in outcome.decisions if outcome else []:
        telemetry_hook(namespace, name, role, metric, dec, spec.autoscaling)
        if dec.direction != "hold":
            ctx.kube.post_event(
                body,
                "Normal",
                "ScaledUp" if dec.direction == "up" else "ScaledDown",
                f"{role} {dec.current} -> {dec.desired} groups: {metric} {dec.message} ({dec.reason})",
            )
        result.decisions.append(f"{role}:{dec.direction}:{dec.reason}")
    previous = {cd.type: cd for cd in (old_status.conditions if old_status else [])}
    defer = ex.status_defer(ctx, key, previous, status, result, now)
    if defer <= 0:  # (a deferred status is written, with its Events, by the pass `defer` seconds later)
        ex.write_status(ctx, key, body, status, result)
        for cond in changed:
            event_type = event_for(cond, previous.get(cond.type))
            if event_type is not None:
                ctx.kube.post_event(
                    body, event_type, cond.reason, f"{cond.type}={cond.status}: {cond.message}"
                )
            result.conditions_changed.append(f"{cond.type}={cond.status}/{cond.reason}")
    ex.post_errors(ctx, body, mem, result, now)
    clock.lap("status")
    result.timings = clock.laps
    result.waiting_for_capacity = any(p.unplaced or p.rollout_blocked for p in plans)
    result.requeue_after = _requeue_after(md, plans, groups, health, ctx.settings, now, key in ctx.urgent)
    if defer > 0:
        result.requeue_after = min(result.requeue_after or defer, defer)
    if result.channel_waits:  # (NVIDIA's DRA driver answers a ComputeDomain within a second or so)
        result.requeue_after = min(result.requeue_after or 1.0, 1.0)
    if any(p.backoff > 0 for p in plans):
        wait = min(p.backoff for p in plans if p.backoff > 0) + 0.1
        result.requeue_after = min(result.requeue_after or wait, wait)


def _requeue_after(
    md: ModelDeployment,
    plans: list[RolePlan],
    groups: dict[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    settings: Settings,
    now: float,
    urgent: bool = False,
) -> float | None:
    """When time alone (no event) may change this deployment's plan: the autoscaler's next evaluation,
    a binding deadline, a node's toleration running out."""
    waits: list[float] = []
    due = next_due(md, now, urgent)
    if due is not None:
        waits.append(due)
    tol = float(md.spec.topology.node_failure_toleration_seconds)
    for role_groups in groups.values():
        for g in role_groups:
            if g.released_at is not None and any(p.node is None for p in g.pods):
                waits.append(g.released_at + settings.bind_timeout - now)
            for p in g.pods:
                h = health.get(p.node or "")
                if h is not None and not h.ready and h.not_ready_since is not None:
                    waits.append(h.not_ready_since + tol - now)
    if any(p.waiting or p.unbound for p in plans):
        waits.append(10.0)
    return None if not waits else max(0.2, min(waits) + 0.1)


def _placement(
    plans: list[RolePlan], groups: dict[RoleName, list[GroupView]], owner: b.Owner, result: Result
) -> list[GroupPlacement]:
    out = []
    created = set(result.created)
    for plan in plans:
        gone = {d.name for d in plan.delete}
        for g in groups.get(plan.role, []):
            if g.name not in gone and plan.states.get(g.name) != "deleting":
                out.append(GroupPlacement(group=g.name, role=g.role, domain=g.domain, gpus=g.gpus))
        for cr in plan.create:
            name = b.group_name(owner, cr.role, cr.slot)
            if name in created and not any(p.group == name for p in out):
                out.append(GroupPlacement(group=name, role=cr.role, domain=cr.domain, gpus=plan.shape.gpus))
    return out
