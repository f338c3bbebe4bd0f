"""The autoscaling step of a pass, pure: from the signals already read from Prometheus, the groups and
the free NVLink capacity, the groups each scaled role should have, the frontend's size, and the new
autoscaler state.

The result goes to status only (`status.autoscaling.desired`, `.frontendReplicas`), which the plan then
realises; the user's spec is never written, so a GitOps tool re-applying the manifest sees no drift. The
policy's memory (recent recommendations, last scale time, last evaluation, the arrival history, the
learned capacity per group and startup time) lives in status too, so a restart keeps it.

- `queries`: which queries an evaluation asks (the pass reads them before it plans) and the
  deployment-wide values read from them;
- `role`: one role's evaluation, held to what is safe and to what fits;
- `frontend`: the frontend's size;
- `memory`: the memory in status, the startup time learned, the burst watch's test.

Signals: per group, KV-cache utilization (decode, aggregated workers) or waiting requests (prefill,
independent); with the leading policy, the waiting requests per decode/worker group, the requests in flight
at the frontend, and the requests/s arriving there (and input tokens/s, for independent prefill and for the
frontend's own size).

Part of the planning layer: it imports only tokenfab.api and planning's own modules;
tokenfab.planning.one_pass calls it, and the controller imports `burst_watch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenfab.api.models import AutoscalingStatus, Condition, ModelDeployment, RoleBounds, RoleName
from tokenfab.planning import builders
from tokenfab.planning.autoscaling import (
    KV_UTILIZATION,
    Decision,
    config_for,
    decide,
    initial_groups,
    target_for,
)
from tokenfab.planning.lifecycle import GroupView, NodeHealth
from tokenfab.planning.scaler import role as per_role
from tokenfab.planning.scaler.frontend import size_frontend
from tokenfab.planning.scaler.memory import (
    URGENT_GAP_SECONDS as URGENT_GAP_SECONDS,
)
from tokenfab.planning.scaler.memory import (
    WARMING_BOUND_SECONDS,
    due,
    learned_startup,
    learned_startup_by_path,
    remembered,
)
from tokenfab.planning.scaler.memory import burst_watch as burst_watch
from tokenfab.planning.scaler.memory import sane as sane
from tokenfab.planning.scaler.queries import Reader, Shared, read_shared, scaled_roles, signal_query
from tokenfab.planning.scaler.queries import due_queries as due_queries
from tokenfab.planning.scaler.queries import next_due as next_due
from tokenfab.planning.topology import next_path

__all__ = [
    "URGENT_GAP_SECONDS",
    "WARMING_BOUND_SECONDS",
    "Outcome",
    "autoscale",
    "burst_watch",
    "due_queries",
    "learned_startup",
    "next_due",
    "sane",
    "scaled_roles",
]


@dataclass
class Outcome:
    desired: dict[RoleName, int]  # the roles the autoscaler drives: their groups as it decided
    status: AutoscalingStatus
    conditions: list[Condition]
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)  # role, metric, decision
    frontend_replicas: int | None = None  # None: the spec's serving.frontendReplicas
    groups: dict[RoleName, int] = field(default_factory=dict)  # every role's groups, the ratio applied


@dataclass
class _Step:
    """One autoscaling step as it goes, role by role."""

    md: ModelDeployment
    old: AutoscalingStatus
    status: AutoscalingStatus
    now: float
    urgent: bool
    bound: float  # how long a group not serving yet is waited for
    startup: float | None
    by_path: Mapping[str, float] = field(default_factory=dict)  # learned startup per start path
    warmth: Mapping[str, int] = field(default_factory=dict)  # node -> its model cache's warmth
    desired: dict[RoleName, int] = field(default_factory=dict)
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    limited: list[str] = field(default_factory=list)
    shared: Shared | None = None  # read at the first role due


def _start(
    md: ModelDeployment, groups: Mapping[RoleName, list[GroupView]], now: float, urgent: bool
) -> _Step:
    a = md.spec.autoscaling
    old = remembered(md, now)
    startup, by_path = old.startup_seconds, dict(old.startup_by_path)
    if any(due(old, role, now, a.interval_seconds, urgent) for role, _, _ in scaled_roles(md)):
        # Learned at evaluations only: `since` moves on with them, so each group is one sample.
        since = max(old.last_evaluation.values(), default=None)
        startup = learned_startup(groups, old.startup_seconds, since)
        by_path = learned_startup_by_path(groups, old.startup_by_path, since)
    status = old.model_copy(deep=True)
    status.startup_seconds = None if startup is None else round(startup, 1)
    status.startup_by_path = {p: round(v, 1) for p, v in by_path.items()}
    bound = max(WARMING_BOUND_SECONDS, 2.0 * max([startup or 0.0, *by_path.values()]))
    return _Step(md, old, status, now, urgent, bound, startup, by_path)


def _lead_time(step: _Step, role: RoleName, domains_for: per_role.DomainsFor) -> float | None:
    """The forecast horizon's start time: what the path the role's next group would take (the warmest
    where it fits whole) has taken, when learned; else the startup time learned over every path."""
    if not step.by_path or not step.warmth:
        return step.startup
    path = next_path(domains_for(role), builders.group_shape(step.md.spec, role), step.warmth)
    return step.by_path.get(path, step.startup)


def _evaluate(
    step: _Step,
    role: RoleName,
    bounds: RoleBounds,
    metric: str,
    groups: Mapping[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    domains_for: per_role.DomainsFor,
    reader: Reader,
) -> None:
    """One scaled role: its count as last decided, and a new decision when it is due."""
    md, a, now, old = step.md, step.md.spec.autoscaling, step.now, step.old
    spec_role = md.spec.role(role)
    assert spec_role is not None
    kv = metric == KV_UTILIZATION
    target = target_for(a, metric)
    lead = _lead_time(step, role, domains_for)
    cfg = config_for(a, bounds.min_replicas, bounds.max_replicas, target, lead, utilization=kv)
    current = old.desired.get(role)
    if current is None:
        current = initial_groups(spec_role.replicas, cfg)
        step.status.desired[role] = current
    step.desired[role] = current
    if not due(old, role, now, a.interval_seconds, step.urgent):
        return  # not due: keep the last decision
    if step.shared is None:
        step.shared = read_shared(md, reader)
        step.unavailable += step.shared.unavailable
    tol = float(md.spec.topology.node_failure_toleration_seconds)
    counts = per_role.count_groups(groups.get(role, []), health, now, tol, a.warmup_seconds, step.bound)
    reading = reader(a.prometheus_url or "", signal_query(md, role, metric))
    memory = per_role.policy_memory(md, old, role, current, now, cfg, kv)
    demand = per_role.demand_of(md, role, kv, step.shared, counts, step.unavailable)
    decision = decide(reading.samples, counts.counted, counts.warming, current, cfg, memory, now, demand)
    if not due(old, role, now, a.interval_seconds):  # (due only because the burst watch asked)
        decision = replace(decision, message=f"burst watch: {decision.message}")
    decision = per_role.no_blind_scale_down(decision, cfg, kv, step.shared.blind, current, memory)
    if not decision.metrics_ok:
        step.unavailable.append(
            f"{role}: {decision.message}" + (f" ({reading.error})" if reading.error else "")
        )
    decision = per_role.limit_to_fit(md, role, current, decision, memory, domains_for, step.limited)
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
    md, now, status, a = step.md, step.now, step.status, step.md.spec.autoscaling
    scaled = {role for role, _, _ in scaled_roles(md)}
    for memory in (status.desired, status.capacity, status.concurrency):
        for stale in [role for role in memory if role not in scaled]:
            memory.pop(stale)
    frontend = step.old.frontend_replicas if a.frontend is not None else None
    shared = step.shared
    groups = builders.with_ratio(md.spec, {**builders.spec_groups(md.spec), **step.desired})
    if shared is None:  # nothing was due: the last conditions still stand
        return Outcome(step.desired, status, [], step.decisions, frontend, groups)
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
    return Outcome(step.desired, status, _conditions(step), step.decisions, frontend, groups)


def autoscale(
    md: ModelDeployment,
    groups: Mapping[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    domains_for: per_role.DomainsFor,
    now: float,
    reader: Reader,
    urgent: bool = False,
    warmth: Mapping[str, int] | None = None,
) -> Outcome:
    """One autoscaling step. `domains_for(role)` is the free capacity for that role's groups (as the
    placement ledger saw it when the plan began); `reader` answers a Prometheus query from the readings the
    pass took before it planned. `urgent`: the burst watch saw a burst begin, and every role is due once
    URGENT_GAP_SECONDS have passed since its last evaluation. `warmth`: the nodes' model caches (the
    forecast looks as far ahead as the next group's start path takes)."""
    step = _start(md, groups, now, urgent)
    step.warmth = warmth or {}
    for role, bounds, metric in scaled_roles(md):
        _evaluate(step, role, bounds, metric, groups, health, domains_for, reader)
    return _outcome(step)
