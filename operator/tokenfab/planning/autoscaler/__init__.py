"""The autoscaler, pure, in one package with two entries:

- `queries(md, now, urgent)`: what an evaluation reads from Prometheus (the roles due, each with its
  signal's query, and the deployment-wide queries); the pass reads them before it plans;
- `step(md, seen, memory, capacity) -> Outcome`: from those readings, the groups and their nodes' health,
  the autoscaler's memory (status.autoscaling) and the free NVLink capacity, every role's groups with the
  prefill:decode ratio applied (`groups.with_ratio`, the one place it is), the frontend's size, the new
  memory, the decisions (each with the target it held its signal to) and when the next one is due.

The result goes to status only (`status.autoscaling.desired`, `.frontendReplicas`), which the plan then
realises; the user's spec is never written, so a GitOps tool re-applying the manifest sees no drift. The
memory (recent recommendations, last scale time, last evaluation, the arrival history, the learned capacity
per group and startup time) lives in status too, so a restart keeps it.

Inside: `policy` (one signal -> a decision, HPA-style, with the leading signals), `forecast` (the demand
ahead), `signals` (the PromQL of each signal), `queries` (what is due, and the deployment-wide values read),
`role` (one role's evaluation, held to what is safe and to what fits), `frontend` (its size), `memory`
(status as memory, the startup time learned, the burst watch's test), `groups` (groups per role, the ratio).

Signals: per group, KV-cache utilization (decode, aggregated workers) or waiting requests (prefill,
independent); with the leading policy, the waiting requests per decode/worker group, the requests in flight
at the frontend, and the requests/s arriving there (and input tokens/s, for independent prefill and for the
frontend's own size).

Part of the planning layer: it imports only tokenfab.api and planning's own modules;
tokenfab.planning.one_pass calls `step`, the observe phase `queries`, the controller `burst_watch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenfab.api.models import AutoscalingStatus, Condition, ModelDeployment, RoleBounds, RoleName
from tokenfab.planning import builders
from tokenfab.planning.autoscaler import role as per_role
from tokenfab.planning.autoscaler.frontend import size_frontend
from tokenfab.planning.autoscaler.groups import headrooms, remembered_groups, with_ratio
from tokenfab.planning.autoscaler.memory import (
    URGENT_GAP_SECONDS,
    WARMING_BOUND_SECONDS,
    burst_watch,
    learned_startup,
    learned_startup_by_path,
    sane,
)
from tokenfab.planning.autoscaler.policy import (
    KV_UTILIZATION,
    Decision,
    config_for,
    decide,
    initial_groups,
    target_for,
)
from tokenfab.planning.autoscaler.queries import Queries, Shared, next_due, queries, read_shared, scaled_roles
from tokenfab.planning.autoscaler.signals import Reading
from tokenfab.planning.lifecycle import GroupView, NodeHealth
from tokenfab.planning.topology import next_path

__all__ = [
    "KV_UTILIZATION",
    "URGENT_GAP_SECONDS",
    "WARMING_BOUND_SECONDS",
    "Capacity",
    "Decision",
    "Outcome",
    "Queries",
    "Seen",
    "burst_watch",
    "learned_startup",
    "queries",
    "remembered_groups",
    "step",
]


@dataclass(frozen=True)
class Seen:
    """What the pass observed that a step decides from: the queries it asked and their readings (by query
    text), the groups and their nodes' health, and the time."""

    now: float
    asked: Queries = field(default_factory=Queries)
    readings: Mapping[str, Reading] = field(default_factory=dict)
    groups: Mapping[RoleName, list[GroupView]] = field(default_factory=dict)
    health: Mapping[str, NodeHealth] = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    """The free NVLink capacity as the placement ledger saw it when the plan began (`domains_for(role)`),
    and how warm each node's model cache is (node -> warmth: the forecast looks as far ahead as the next
    group's start path takes)."""

    domains_for: per_role.DomainsFor
    warmth: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Outcome:
    """One step's result: what the plan, status and telemetry read."""

    groups: dict[RoleName, int]  # every role's groups, the prefill:decode ratio applied
    status: AutoscalingStatus | None = None  # the autoscaler's new memory (None: autoscaling off)
    conditions: list[Condition] = field(default_factory=list)  # MetricsUnavailable, CapacityLimited
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)  # role, metric, decision
    frontend_replicas: int | None = None  # None: the spec's serving.frontendReplicas
    next_due: float | None = None  # seconds until the next role is due (None: autoscaling off)
    headroom: dict[RoleName, int] = field(default_factory=dict)  # next groups per role (pre-staging)

    @property
    def desired(self) -> dict[str, int]:
        """The roles the autoscaler drives, with their groups as it decided."""
        return dict(self.status.desired) if self.status is not None else {}


@dataclass
class _Step:
    """One autoscaling step as it goes, role by role."""

    md: ModelDeployment
    seen: Seen
    old: AutoscalingStatus
    status: AutoscalingStatus
    bound: float  # how long a group not serving yet is waited for
    startup: float | None
    by_path: Mapping[str, float] = field(default_factory=dict)  # learned startup per start path
    warmth: Mapping[str, int] = field(default_factory=dict)  # node -> its model cache's warmth
    desired: dict[RoleName, int] = field(default_factory=dict)
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    limited: list[str] = field(default_factory=list)
    shared: Shared | None = None  # read at the first role due


def _start(md: ModelDeployment, seen: Seen, old: AutoscalingStatus) -> _Step:
    startup, by_path = old.startup_seconds, dict(old.startup_by_path)
    if seen.asked.roles:
        # Learned at evaluations only: `since` moves on with them, so each group is one sample.
        since = max(old.last_evaluation.values(), default=None)
        startup = learned_startup(seen.groups, old.startup_seconds, since)
        by_path = learned_startup_by_path(seen.groups, old.startup_by_path, since)
    status = old.model_copy(deep=True)
    status.startup_seconds = None if startup is None else round(startup, 1)
    status.startup_by_path = {p: round(v, 1) for p, v in by_path.items()}
    bound = max(WARMING_BOUND_SECONDS, 2.0 * max([startup or 0.0, *by_path.values()]))
    return _Step(md, seen, old, status, bound, startup, by_path)


def _lead_time(step: _Step, role: RoleName, domains_for: per_role.DomainsFor) -> float | None:
    """The forecast horizon's start time: what the path the role's next group would take (the warmest
    where it fits whole) has taken, when learned; else the startup time learned over every path."""
    if not step.by_path or not step.warmth:
        return step.startup
    path = next_path(domains_for(role), builders.group_shape(step.md.spec, role), step.warmth)
    return step.by_path.get(path, step.startup)


def _evaluate(step: _Step, role: RoleName, bounds: RoleBounds, metric: str, capacity: Capacity) -> None:
    """One scaled role: its count as last decided, and a new decision when it is due."""
    md, a, seen, old = step.md, step.md.spec.autoscaling, step.seen, step.old
    now = seen.now
    spec_role = md.spec.role(role)
    assert spec_role is not None
    kv = metric == KV_UTILIZATION
    target = target_for(a, metric)
    lead = _lead_time(step, role, capacity.domains_for)
    cfg = config_for(a, bounds.min_replicas, bounds.max_replicas, target, lead, utilization=kv)
    current = old.desired.get(role)
    if current is None:
        current = initial_groups(spec_role.replicas, cfg)
        step.status.desired[role] = current
    step.desired[role] = current
    query = next((q for r, _, q in seen.asked.roles if r == role), None)
    if query is None:
        return  # not due: keep the last decision
    if step.shared is None:
        step.shared = read_shared(seen.asked, seen.readings)
        step.unavailable += step.shared.unavailable
    tol = float(md.spec.topology.node_failure_toleration_seconds)
    counts = per_role.count_groups(
        seen.groups.get(role, []), seen.health, now, tol, a.warmup_seconds, step.bound
    )
    reading = seen.readings.get(query) or Reading(None, "not read by this pass", query)
    memory = per_role.policy_memory(md, old, role, current, now, cfg, kv)
    demand = per_role.demand_of(md, role, kv, step.shared, counts, step.unavailable)
    decision = decide(reading.samples, counts.counted, counts.warming, current, cfg, memory, now, demand)
    if role in seen.asked.burst:  # (due only because the burst watch asked)
        decision = replace(decision, message=f"burst watch: {decision.message}")
    decision = per_role.no_blind_scale_down(decision, cfg, kv, step.shared.blind, current, memory)
    if not decision.metrics_ok:
        step.unavailable.append(
            f"{role}: {decision.message}" + (f" ({reading.error})" if reading.error else "")
        )
    decision = per_role.limit_to_fit(md, role, current, decision, memory, capacity.domains_for, step.limited)
    step.desired[role] = decision.desired
    per_role.record(step.status, role, metric, current, decision, now)
    step.decisions.append((role, metric, decision))


def _conditions(step: _Step) -> list[Condition]:
    return [
        Condition(
            type="MetricsUnavailable",
            status="True" if step.unavailable else "False",
            reason="NoData" if step.unavailable else "MetricsOK",
            message="; ".join(step.unavailable) or "every scaled role has fresh samples",
        ),
        Condition(
            type="CapacityLimited",
            status="True" if step.limited else "False",
            reason="InsufficientCapacity" if step.limited else "CapacityAvailable",
            message="; ".join(step.limited) or "every group the autoscaler wants fits",
        ),
    ]


def _outcome(step: _Step) -> Outcome:
    md, now, status, a = step.md, step.seen.now, step.status, step.md.spec.autoscaling
    scaled = {role for role, _, _ in scaled_roles(md)}
    for memory in (status.desired, status.capacity, status.concurrency):
        for stale in [role for role in memory if role not in scaled]:
            memory.pop(stale)
    frontend = step.old.frontend_replicas if a.frontend is not None else None
    shared = step.shared
    groups = with_ratio(md.spec, {**remembered_groups(md), **step.desired})
    urgent_kept = step.seen.asked.kept
    if shared is None:  # nothing was due: the last conditions still stand
        due_in = next_due(md, status, now, urgent_kept)
        return Outcome(groups, status, [], step.decisions, frontend, due_in, headrooms(md.spec, groups))
    keep = max(30.0, 3.0 * a.interval_seconds)
    kept = [x for x in step.old.arrivals if len(x) >= 3 and now - x[0] <= keep and x[0] < now]
    status.arrivals = kept
    partial = bool({"requests", "tokens"} & shared.blind)
    if (shared.rate is not None or shared.tokens is not None) and not partial:
        # A read that failed is no sample (not a zero); no series at all is nothing arriving.
        sample = [now, round(shared.rate or 0.0, 6), round(shared.tokens or 0.0, 3)]
        status.arrivals = [
            *kept,
            sample + ([round(shared.inflight, 3)] if shared.inflight is not None else []),
        ]
    if a.frontend is not None:
        frontend = size_frontend(md, status, shared.rate, shared.tokens, now, partial=partial)
    due_in = next_due(md, status, now, urgent_kept)
    return Outcome(
        groups, status, _conditions(step), step.decisions, frontend, due_in, headrooms(md.spec, groups)
    )


def step(md: ModelDeployment, seen: Seen, memory: AutoscalingStatus | None, capacity: Capacity) -> Outcome:
    """One autoscaling step: every role's groups (the ratio applied), and, with autoscaling on, the roles
    `seen.asked` found due evaluated from `seen.readings`, held to the free capacity. `memory`: the
    autoscaler's status as the deployment keeps it (made sane here: status is writable by hand)."""
    if not md.spec.autoscaling.enabled:
        groups = remembered_groups(md)
        return Outcome(groups, headroom=headrooms(md.spec, groups))
    old = sane(memory or AutoscalingStatus(), seen.now)
    s = _start(md, seen, old)
    s.warmth = capacity.warmth
    for role, bounds, metric in scaled_roles(md):
        _evaluate(s, role, bounds, metric, capacity)
    return _outcome(s)
