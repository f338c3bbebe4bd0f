"""One reconcile pass of a ModelDeployment, in three steps:

- observe: one immutable snapshot (tokenfab.planning.one_pass.Snapshot) from the cluster view, the
  deployment's freshest status, the readings taken from Prometheus and the answer of spec.profile's
  planner; the free capacity is read from the placement ledger, inside its session;
- plan: `one_pass.plan(snapshot)`, pure, inside the ledger's session, whose reservations are recorded
  before the session ends;
- act: the writer (tokenfab.execute) writes the plan; once the API server has answered, what its answers
  mean, then the status (`one_pass.settle`) and the Events.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from tokenfab import execute as ex
from tokenfab import pod_logs
from tokenfab import status_write as sw
from tokenfab.adapters import metrics, telemetry
from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.errors import SpecError, parse_model_deployment
from tokenfab.api.models import (
    Condition,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    ProfileStatus,
    RoleName,
)
from tokenfab.fleet.view import Key, PodFacts, parse_time
from tokenfab.observe import group_views, held, node_caches, node_health, usable_claims
from tokenfab.planning import builders, contract, launcher_log, model_source, one_pass, sla, weights_cache
from tokenfab.planning.autoscaling import Decision
from tokenfab.planning.capacity import NodeFacts
from tokenfab.planning.frontend import FrontendPod
from tokenfab.planning.groups import DrainPolicy
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.model_source import SourceClaim
from tokenfab.planning.one_pass import Plan, Snapshot, Written
from tokenfab.planning.role_plan import FaultReaction
from tokenfab.planning.room import Room
from tokenfab.planning.scaler import due_queries
from tokenfab.planning.status import event_for, merge_conditions, rfc3339
from tokenfab.runtime import Context, Result

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- spec.profile

# Polls a plan for (profile hash, request): the outcome once ready, None while it is being made.
Planner = Callable[[str, sla.PlanRequest], sla.PlanOutcome | None]


# Outcomes worth asking again for: the planner may be installed, or work, later.
RETRY_SECONDS = {sla.PLANNER_UNAVAILABLE: 60.0, sla.PLANNER_FAILED: 300.0}
SOURCE_READ_SECONDS = one_pass.SOURCE_LOOK_SECONDS  # a pvc:// source's claim is read again this often


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
    if status is not None and retry is not None and now - (parse_time(status.time) or 0.0) >= retry:
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


# ------------------------------------------------------------------------------------------- observe


def take(keys: set[Key], key: Key) -> bool:
    """Whether `key` was in `keys`, removed in one step (another thread may add it at any time)."""
    try:
        keys.remove(key)
    except KeyError:
        return False
    return True


def _default_reader(url: str, query: str) -> metrics.Reading:
    return metrics.read(url, query)


class Stopwatch:
    """Seconds spent in each phase of a pass (logged when a pass is slow)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._t, 4)
        self._t = now


def drain_policy(
    spec: ModelDeploymentSpec,
    groups: Mapping[RoleName, list[GroupView]],
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
    if not one_pass.removing(spec, groups, desired):
        return DrainPolicy(seconds, {})
    reading = read(url, metrics.inflight_query(namespace, name))
    inflight = {g: s.value for g, s in (reading.samples or {}).items() if s.age_seconds <= 30}
    return DrainPolicy(seconds, inflight)


def _read(ctx: Context, key: Key, md: ModelDeployment, groups: Mapping[RoleName, list[GroupView]], now: float
          ) -> tuple[dict[str, metrics.Reading], bool, bool, DrainPolicy]:  # fmt: skip
    """What the plan needs from Prometheus, read before the ledger is taken: the autoscaler's due
    queries (at once when the burst watch asked), and the engines' in-flight counts for drains."""
    spec = md.spec
    read = metrics.one_timeout_per_pass(ctx.reader or _default_reader)
    urgent = take(ctx.urgent, key)  # the burst watch saw a burst begin: evaluate without waiting the interval
    readings: dict[str, metrics.Reading] = {}
    kept = False
    if spec.autoscaling.enabled:
        due = due_queries(md, now, urgent)
        if urgent and not due:  # (not even the gap since the last evaluation has passed: kept for then)
            ctx.urgent.add(key)
            kept = True
        for q in due:
            readings[q] = read(spec.autoscaling.prometheus_url or "", q)
    drain = drain_policy(spec, groups, one_pass.desired_groups(md), read, key[0], key[1])
    return readings, urgent, kept, drain


def _parsed(ctx: Context, key: Key, now: float) -> tuple[Obj, ModelDeployment] | Result | None:
    """The deployment as the view has it, with its freshest status; None when it is gone (or going), a
    Result when its spec is invalid."""
    body = ctx.view.model_deployment(key)
    if body is None or body["metadata"].get("deletionTimestamp"):
        # (its reservations stay until its pods appear or they expire: see Controller.on_model_deployment)
        ctx.expectations.forget(key)
        ctx.memory.pop(key, None)
        ctx.urgent.discard(key)
        if body is not None:
            sw.remove_legacy(ctx, body)
        return None
    ctx.mem(key)  # (this deployment's memory exists from its first pass on)
    sw.remove_legacy(ctx, body)
    try:
        md = parse_model_deployment(body)
    except SpecError as exc:
        try:  # a status written by another operator version must not stop the spec from being served
            md = parse_model_deployment({**body, "status": None})
        except SpecError:
            return sw.invalid(ctx, body, exc, now)
    # Decide from the freshest status: this process's last write if the watch has not shown it yet
    # (the autoscaler's windows, the failure counts, the plan and the placement record live there).
    return body, md.model_copy(update={"status": sw.last_status(ctx, key, body, md)})


def _no_room() -> tuple[list[NodeFacts], dict[str, dict[str, int]]]:
    raise RuntimeError("free capacity is read inside the placement ledger's session only")


def observe(ctx: Context, key: Key, now: float) -> tuple[Obj, Snapshot] | Result | None:
    """The pass's snapshot (its room still to be read, inside the ledger's session); or the Result of a
    pass that ends here (an invalid spec, a profile not planned yet, writes the watch has not shown yet);
    or None when the deployment is gone."""
    parsed = _parsed(ctx, key, now)
    if parsed is None or isinstance(parsed, Result):
        return parsed
    body, md = parsed
    profile = plan_profile(md.spec, md.status.profile if md.status else None, ctx.planner, now)
    if profile.wait:  # no plan yet (or none possible): say so, and leave every child as it is
        return _wait_for_profile(ctx, key, body, md, profile, now)
    md = md.model_copy(update={"spec": profile.spec})
    if not ctx.expectations.satisfied(key, ctx.view, now):
        return Result(requeue_after=1.0, waited=True)
    owner = builders.Owner(name=key[1], namespace=key[0], uid=body["metadata"]["uid"])
    constraints = builders.placement_constraints(md.spec)
    pods = ctx.view.pods(key)
    groups = group_views(pods, {p.group for p in (md.status.placement if md.status else [])})
    health = node_health(ctx.view, pods, constraints)
    # What needs the API (discovery, Prometheus) is read before the ledger is taken.
    why = ex.compute_domain_block(ctx, md.spec)
    readings, urgent, kept, drain = _read(ctx, key, md, groups, now)
    frontend = ctx.view.child("Deployment", key[0], builders.frontend_name(owner))
    claims = usable_claims(ctx.view, owner, md.spec)
    logs = pod_logs.read(ctx, key, md.spec, pods, now)
    unit_domains = [ch for ch in ctx.view.children("ComputeDomain", key) if ch.unit.isdigit()]
    return body, Snapshot(
        owner=owner,
        md=md,
        groups=groups,
        health=health,
        room=Room(_no_room, constraints),
        now=now,
        readings=readings,
        drain=drain,
        blocked={role: why(role) for role, _ in md.spec.roles()},
        urgent=urgent,
        urgent_kept=kept,
        bind_timeout=ctx.settings.bind_timeout,
        frontend_available=frontend.available_replicas if frontend else 0,
        frontend=frontend_pods(pods),
        frontend_replaces=frontend.replaces if frontend else "",
        profile=profile.status,
        planned=profile.condition,
        source=model_source.condition(key[0], source_claim(ctx, key, md.spec, now)),
        pod_nodes=frozenset(n for p in pods if (n := p.pinned or p.node)),
        claims={pvc.node: held(pvc, builders.weights_key(md.spec)) for pvc in claims},
        fetch_pods=fetch_pods(pods, logs.progress),
        weights_sources=logs.weights,
        loading=logs.loading,
        caches=node_caches(ctx.view, key, [p.node for p in claims]),
        reaction=fault_reaction(ctx, md),
        unit_domains={ch.name: int(ch.unit) for ch in unit_domains},
        units_down=frozenset(int(ch.unit) for ch in unit_domains if ch.state == "NotReady"),
    )


def source_claim(ctx: Context, key: Key, spec: ModelDeploymentSpec, now: float) -> SourceClaim | None:
    """The claim a pvc:// source names, read again at most every SOURCE_READ_SECONDS (None: no pvc://)."""
    name = model_source.claim_name(spec)
    if name is None:
        return None
    mem = ctx.mem(key)
    last = mem.source_claim
    if last is not None and last[0].name == name and now - last[1] < SOURCE_READ_SECONDS:
        return last[0]
    try:
        obj = ctx.kube.get("v1", "PersistentVolumeClaim", name, key[0])
        modes = tuple((obj or {}).get("spec", {}).get("accessModes") or ())
        got = SourceClaim(name, obj is not None, modes)
    except ApiError as exc:
        got = SourceClaim(name, False, error=str(exc)[:500])
    mem.source_claim = (got, now)
    return got


def frontend_pods(pods: list[PodFacts]) -> tuple[FrontendPod, ...]:
    """The deployment's frontend pods that have not ended, and their nodes."""
    return tuple(
        FrontendPod(p.name, p.node or "", p.deleting)
        for p in pods
        if p.labels.get(contract.COMPONENT) == "frontend" and not p.terminal
    )


def fetch_pods(
    pods: list[PodFacts], progress: Mapping[str, launcher_log.Progress] | None = None
) -> tuple[weights_cache.FetchPod, ...]:
    """The deployment's weights-fetch pods (pre-staging), with the node each is pinned to and the download
    so far its log said (`progress`: pod -> bytes)."""
    return tuple(
        weights_cache.FetchPod(
            p.name,
            p.pinned or p.node or "",
            p.phase,
            p.annotations.get(contract.ANN_WEIGHTS, ""),
            p.waiting,
            p.deleting,
            p.exit_message,
            (progress or {}).get(p.name),
        )
        for p in pods
        if p.labels.get(contract.COMPONENT) == contract.COMPONENT_WEIGHTS_FETCH
    )


def fault_reaction(ctx: Context, md: ModelDeployment) -> FaultReaction:
    """The operator's way of answering faults, with when each open fault of the status was first seen."""
    mode = ctx.settings.fault_reaction
    if mode not in ("replace", "none", "gang-delete"):
        mode = "replace"
    seen = {
        r.group: t
        for r in (md.status.faults if md.status else [])
        if r.recovered is None and (t := parse_time(r.time))
    }
    return FaultReaction(mode, ctx.settings.gang_delete_seconds, seen)  # type: ignore[arg-type]


def _wait_for_profile(
    ctx: Context, key: Key, body: Obj, md: ModelDeployment, profile: Planning, now: float
) -> Result:
    waiting, changed_conds = _waiting_status(md.status, profile, md.metadata.generation or 0, now)
    result = Result(requeue_after=5.0)
    sw.write_status(ctx, key, body, waiting, result)
    for cond in changed_conds:
        kind = "Warning" if cond.status == "False" and cond.reason != "Planning" else "Normal"
        ctx.kube.post_event(body, kind, cond.reason, f"{cond.type}={cond.status}: {cond.message}")
    result.conditions_changed = [f"{cd.type}={cd.status}/{cd.reason}" for cd in changed_conds]
    return result


# ------------------------------------------------------------------------------------------- pass


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
    clock = Stopwatch()
    seen = observe(ctx, key, now)
    if not isinstance(seen, tuple):
        return seen
    body, snap = seen
    clock.lap("observe")
    # Plan: every decision that takes capacity is made and reserved inside one ledger session.
    with ctx.ledger.session() as session:
        clock.lap("ledger-wait")
        room = Room(lambda: (session.nodes(), dict(session.used())), snap.room.constraints)
        snap = replace(snap, room=room)
        plan = one_pass.plan(snap)
        for r in plan.reservations:
            session.reserve(key, r.group, r.pods, now)
    clock.lap("plan")
    # Act: the writes go to the writer's threads; what their answers mean, and the status, follow once
    # the API server has answered them all (`finish`, run by whoever waits for them).
    result = Result(plans=plan.roles)
    sub = ex.submit(ctx, key, snap.owner, plan, now)
    clock.lap("act")
    result.pending = sub.futures()
    result.finish = lambda: _finish(ctx, key, body, snap, plan, result, sub, clock)
    return result


def telemetry_hook(namespace: str, name: str, role: str, metric: str, d: Decision) -> None:
    telemetry.AUTOSCALER_TARGET.labels(namespace, name, role, metric).set(d.target)
    if d.signal is not None:
        telemetry.AUTOSCALER_SIGNAL.labels(namespace, name, role, metric).set(d.signal)
    telemetry.SCALING_DECISIONS.labels(namespace, name, role, d.direction).inc()


def _report(ctx: Context, key: Key, body: Obj, snap: Snapshot, plan: Plan, result: Result) -> None:
    """The autoscaler's decisions: its metrics, its Events, the Result's record."""
    for role, metric, dec in plan.autoscaling.decisions if plan.autoscaling else []:
        telemetry_hook(key[0], key[1], role, metric, dec)
        result.decisions.append(f"{role}:{dec.direction}:{dec.reason}")
    for kind, reason, message in plan.events:
        ctx.kube.post_event(body, kind, reason, message)


def _finish(
    ctx: Context,
    key: Key,
    body: Obj,
    snap: Snapshot,
    plan: Plan,
    result: Result,
    sub: ex.Submitted,
    clock: Stopwatch,
) -> None:
    """The rest of a pass once its writes are answered: act on the answers, then the status."""
    ex.complete(ctx, key, body, plan.spec, plan.roles, result, snap.now, sub)
    clock.lap("writes")
    written = Written(frozenset(result.created), tuple(str(e) for e in result.errors))
    status, changed = one_pass.settle(snap, plan, written)
    _report(ctx, key, body, snap, plan, result)
    old = snap.md.status
    previous = {cd.type: cd for cd in (old.conditions if old else [])}
    defer = sw.status_defer(ctx, key, previous, status, result, snap.now)
    if defer <= 0:  # (a deferred status is written, with its Events, by the pass `defer` seconds later)
        sw.write_status(ctx, key, body, status, result)
        for cond in changed:
            event_type = event_for(cond, previous.get(cond.type))
            if event_type is not None:
                ctx.kube.post_event(
                    body, event_type, cond.reason, f"{cond.type}={cond.status}: {cond.message}"
                )
            result.conditions_changed.append(f"{cond.type}={cond.status}/{cond.reason}")
    sw.post_errors(ctx, body, ctx.mem(key), result, snap.now)
    clock.lap("status")
    result.timings = clock.laps
    result.waiting_for_capacity = plan.waiting_for_capacity
    waits = [w for w in (plan.requeue_after, defer if defer > 0 else None) if w is not None]
    if result.channel_waits:  # (NVIDIA's DRA driver answers a ComputeDomain within a second or so)
        waits.append(1.0)
    result.requeue_after = min(waits, default=None)
