"""The autoscaling step of a reconcile pass: read the signal from Prometheus, ask the pure policy, check
that the groups it wants fit in the free NVLink capacity, and hand back the new autoscaler state.

The result goes to status only (`status.autoscaling.desired`), which the reconciler then realises; the
user's spec is never written, so a GitOps tool re-applying the manifest sees no drift. The policy's memory
(recent recommendations, last scale time, last evaluation) lives in status too, so a restart keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from tokenfab.adapters import metrics
from tokenfab.api.models import (
    AutoscalingStatus,
    Condition,
    ModelDeployment,
    RoleBounds,
    RoleName,
    ScalingDecision,
)
from tokenfab.planning import builders as b
from tokenfab.planning.autoscaling import Decision, Memory, config_for, decide, initial_groups
from tokenfab.planning.groups import GroupView, NodeHealth, classify
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain, place_sequence

Reader = Callable[[str, str], metrics.Reading]


@dataclass
class Outcome:
    desired: dict[RoleName, int]
    status: AutoscalingStatus
    conditions: list[Condition]
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)  # role, metric, decision


def _parse(ts: str | None) -> float | None:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else None


def scaled_roles(md: ModelDeployment) -> list[tuple[RoleName, RoleBounds, str]]:
    """(role, bounds, signal) for each role the autoscaler drives itself."""
    spec, a = md.spec, md.spec.autoscaling
    out: list[tuple[RoleName, RoleBounds, str]] = []
    pairs: tuple[tuple[RoleName, RoleBounds | None], ...] = (("decode", a.decode), ("worker", a.worker))
    for role, bounds in pairs:
        if spec.role(role) is not None and bounds is not None:
            out.append((role, bounds, "kv_cache_utilization"))
    if spec.prefill is not None and a.prefill is not None and spec.serving.ratio_policy == "independent":
        out.append(("prefill", a.prefill, "queue_depth"))
    return out


def autoscale(
    md: ModelDeployment,
    groups: dict[RoleName, list[GroupView]],
    health: dict[str, NodeHealth],
    domains: dict[str, Domain],
    now: float,
    reader: Reader,
) -> Outcome:
    spec, a = md.spec, md.spec.autoscaling
    name, namespace = md.metadata.name or "", md.metadata.namespace or ""
    old = (md.status.autoscaling if md.status else None) or AutoscalingStatus()
    status = old.model_copy(deep=True)
    desired: dict[RoleName, int] = {}
    decisions: list[tuple[RoleName, str, Decision]] = []
    unavailable: list[str] = []
    limited: list[str] = []
    evaluated = False
    tol = float(spec.topology.node_failure_toleration_seconds)

    for role, bounds, metric in scaled_roles(md):
        r = spec.role(role)
        assert r is not None
        target = a.target_kv_cache_utilization if metric == "kv_cache_utilization" else a.target_queue_depth
        cfg = config_for(a, bounds.min_replicas, bounds.max_replicas, target)
        current = old.desired.get(role)
        if current is None:
            current = initial_groups(r.replicas, cfg)
            status.desired[role] = current
        desired[role] = current
        last = old.last_evaluation.get(role)
        if last is not None and now - last < a.interval_seconds:
            continue  # not due: keep the last decision

        counted, warming = set(), 0
        for g in groups.get(role, []):
            state, _ = classify(g, health, now, tol)
            since = [p.ready_since for p in g.pods]
            warm = state == "ready" and all(s is not None and now - s >= a.warmup_seconds for s in since)
            if warm:
                counted.add(g.name)
            elif state in ("ready", "starting", "incomplete"):
                warming += 1
        query = (
            metrics.kv_query(namespace, name, role, a.query)
            if metric == "kv_cache_utilization"
            else metrics.queue_query(namespace, name, role)
        )
        reading = reader(a.prometheus_url or "", query)
        evaluated = True
        remembered = old.recommendations.get(role)
        if remembered is None:
            # The first evaluation starts the windows at the current count (as the HPA does), so turning
            # the autoscaler on does not shed groups before a whole scale-down window has been observed.
            remembered = [[now, float(current)]]
        memory = Memory(
            recommendations=tuple((float(t), int(n)) for t, n in remembered),
            last_scale_time=_parse(old.last_scale_time.get(role)),
        )
        decision = decide(reading.samples, counted, warming, current, cfg, memory, now)
        if not decision.metrics_ok:
            unavailable.append(
                f"{role}: {decision.message}" + (f" ({reading.error})" if reading.error else "")
            )

        target_n = decision.desired
        if target_n > current:  # capacity-aware: only as many new groups as fit whole somewhere
            shape = b.group_shape(spec, role)
            placed, domains = place_sequence(domains, [shape] * (target_n - current), spec.topology.placement)
            fit = sum(1 for d in placed if d is not None)
            if fit < target_n - current:
                limited.append(
                    f"{role}: the autoscaler wants {target_n} groups but only {current + fit} fit: "
                    f"each needs {shape.gpus} GPUs on {shape.nodes} node(s) in one NVLink domain"
                )
                target_n = current + fit
                decision = Decision(
                    target_n,
                    current,
                    "CapacityLimited" if fit == 0 else decision.reason,
                    decision.message,
                    decision.signal,
                    decision.recommendation,
                    decision.memory,
                    decision.metrics_ok,
                )

        desired[role] = target_n
        status.desired[role] = target_n
        status.recommendations[role] = [[t, float(n)] for t, n in decision.memory.recommendations]
        if decision.memory.last_scale_time is not None:
            status.last_scale_time[role] = rfc3339(decision.memory.last_scale_time)
        status.last_evaluation[role] = now
        decisions.append((role, metric, decision))
        if decision.direction != "hold" or status.last_decision is None:
            status.last_decision = ScalingDecision(
                time=rfc3339(now),
                role=role,
                from_groups=current,
                to_groups=target_n,
                metric=metric,
                value=None if decision.signal is None else round(decision.signal, 4),
                target=target,
                reason=decision.reason,
                message=decision.message,
            )

    scaled = {r for r, _, _ in scaled_roles(md)}
    for stale in [r for r in status.desired if r not in scaled]:
        status.desired.pop(stale)
    if not evaluated:  # nothing was due: the last conditions still stand
        return Outcome(desired, status, [], decisions)
    conditions = [
        Condition(
            type="MetricsUnavailable",
            status="True" if unavailable else "False",
            reason="NoData" if unavailable else "MetricsOK",
            message="; ".join(unavailable) or "every scaled role has fresh samples",
        ),
        Condition(
            type="CapacityLimited",
            status="True" if limited else "False",
            reason="InsufficientCapacity" if limited else "CapacityAvailable",
            message="; ".join(limited) or "every group the autoscaler wants fits",
        ),
    ]
    return Outcome(desired, status, conditions, decisions)
