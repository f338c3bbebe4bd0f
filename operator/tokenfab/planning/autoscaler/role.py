"""One role's evaluation: count its groups (warm, warming, starting), rebuild the policy's memory from
status, ask the pure policy (tokenfab.planning.autoscaler.policy.decide), then hold it to what is safe (no
scale-down on missing demand signals) and to what fits (only as many new groups as fit whole in the free
NVLink capacity), and record the decision in the autoscaler's status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from tokenfab.api.models import AutoscalingStatus, ModelDeployment, RoleName, ScalingDecision
from tokenfab.planning import builders
from tokenfab.planning.autoscaler.groups import follow_ratio
from tokenfab.planning.autoscaler.memory import profile_capacity
from tokenfab.planning.autoscaler.policy import Config, Decision, Demand, Memory
from tokenfab.planning.autoscaler.queries import Shared
from tokenfab.planning.lifecycle import GroupView, NodeHealth, classify
from tokenfab.planning.status import parse_rfc3339 as parse
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain, GroupShape, place_sequence

DomainsFor = Callable[[RoleName], Mapping[str, Domain]]


@dataclass(frozen=True)
class Counts:
    counted: set[str]  # groups serving for at least the warm-up: their signal counts
    warming: int  # groups on their way (or serving for less than the warm-up), not too old to wait for
    starting: int  # of those, the ones not serving yet


def count_groups(
    groups: list[GroupView],
    health: Mapping[str, NodeHealth],
    now: float,
    tol: float,
    warmup: float,
    bound: float,
) -> Counts:
    counted, warming, starting = set(), 0, 0
    for g in groups:
        state, _ = classify(g, health, now, tol)
        warm = state == "serving" and all(
            s is not None and now - s >= warmup for s in (p.ready_since for p in g.pods)
        )
        young = g.created_at is None or now - g.created_at < bound
        if warm:
            counted.add(g.name)
        elif state in ("serving", "starting", "reserved") and young:
            warming += 1
            starting += state != "serving"
    return Counts(counted, warming, starting)


def policy_memory(
    md: ModelDeployment,
    old: AutoscalingStatus,
    role: RoleName,
    current: int,
    now: float,
    cfg: Config,
    kv: bool,
) -> Memory:
    """The policy's memory of `role` as status keeps it."""
    a = md.spec.autoscaling
    last = old.last_evaluation.get(role)
    remembered = old.recommendations.get(role)
    paused = last is None or now - last > max(2.0 * a.interval_seconds, a.scale_down_stabilization_seconds)
    if remembered is None or (
        paused and not any(now - x[0] <= a.scale_down_stabilization_seconds for x in remembered)
    ):
        # The first evaluation starts the windows at the current count (as the HPA does), so turning
        # the autoscaler on does not shed groups before a whole scale-down window has been observed;
        # so does the first after a pause longer than the window (the operator was down, or the role
        # had no evaluations), which has no recommendation of that window to go by.
        remembered = [[now, float(current)]]
    # (the forecast's window only: after a pause, hours-old samples are no level to step up from)
    recent = [x for x in old.arrivals if len(x) >= 3 and 0 <= now - x[0] <= cfg.forecast_window]
    history = [(x[0], x[1] if kv else x[2]) for x in recent]
    return Memory(
        recommendations=tuple((float(x[0]), max(0, int(x[1]))) for x in remembered),
        last_scale_time=parse(old.last_scale_time.get(role)),
        rates=tuple((float(t), float(v)) for t, v in history),
        capacity=old.capacity.get(role),
        inflight=tuple((float(x[0]), float(x[3])) for x in recent if len(x) >= 4) if kv else (),
        streams=old.concurrency.get(role),
    )


def demand_of(
    md: ModelDeployment, role: RoleName, kv: bool, shared: Shared, counts: Counts, unavailable: list[str]
) -> Demand:
    """What the leading policy knows of the demand ahead of `role`."""
    waiting: dict[str, float] | None = None
    queue = shared.readings.get(f"waiting:{role}") if kv else None
    if queue is not None and queue.samples is None:
        unavailable.append(f"{role}: waiting requests: {queue.error or 'the query failed'}")
    elif queue is not None and queue.samples is not None:
        waiting = {g: s.value for g, s in queue.samples.items() if g in counts.counted}
    return Demand(
        rate=shared.rate if kv else shared.tokens,
        waiting=waiting,
        capacity=profile_capacity(md, role),
        starting=counts.starting,
        inflight=shared.inflight if kv else None,
    )


def no_blind_scale_down(
    decision: Decision, cfg: Config, kv: bool, blind: set[str], current: int, memory: Memory
) -> Decision:
    """The leading policy never scales down while a demand signal it reads could not be read."""
    unread = {"requests", "inflight"} & blind if kv else {"tokens"} & blind
    floor = max(cfg.min_groups, min(cfg.max_groups, current))  # a bound still moves the count
    if not (cfg.leading and unread and decision.desired < floor):
        return decision
    what = "the arrival rate" if unread & {"requests", "tokens"} else "the requests in flight"
    return replace(
        decision,
        desired=floor,
        reason="MetricsIncomplete",
        message=f"{decision.message}; {what} could not be read: no scale-down",
        memory=replace(decision.memory, last_scale_time=memory.last_scale_time),
    )


def fit(
    md: ModelDeployment, role: RoleName, current: int, want: int, domains_for: DomainsFor
) -> tuple[int, str]:
    """How many of `want` groups fit whole, counting the prefill groups the fixed ratio adds alongside
    new decode groups: (groups that fit, what ran short)."""
    spec = md.spec
    shape = builders.group_shape(spec, role)
    extra_prefill: list[GroupShape] = []
    follows = role == "decode" and spec.prefill is not None and spec.serving.ratio_policy == "fixed"
    prefill_now = follow_ratio(spec, current, 0) if follows else 0
    pshape = builders.group_shape(spec, "prefill") if follows else None
    what = f"each needs {shape.gpus} GPUs on {shape.nodes} node(s) in one NVLink domain"
    if pshape is not None:
        what += f", with {pshape.gpus} GPU(s) per prefill group the ratio adds"
    for n in range(want, current, -1):
        shapes = [shape] * (n - current)
        if pshape is not None:
            extra_prefill = [pshape] * max(0, follow_ratio(spec, n, 0) - prefill_now)
        placed, _ = place_sequence(domains_for(role), [*shapes, *extra_prefill], spec.topology.placement)
        if all(d is not None for d in placed):
            return n, what
    return current, what


def limit_to_fit(
    md: ModelDeployment,
    role: RoleName,
    current: int,
    decision: Decision,
    memory: Memory,
    domains_for: DomainsFor,
    limited: list[str],
) -> Decision:
    """A scale-up holds to as many new groups as fit whole somewhere."""
    want = decision.desired
    if want <= current:
        return decision
    n, short = fit(md, role, current, want, domains_for)
    if n >= want:
        return decision
    limited.append(f"{role}: the autoscaler wants {want} groups but only {n} fit: {short}")
    return replace(
        decision,
        desired=n,
        reason="CapacityLimited" if n == current else decision.reason,
        # Nothing changed when nothing fits: the last scale time stands.
        memory=decision.memory
        if n > current
        else replace(decision.memory, last_scale_time=memory.last_scale_time),
    )


def record(
    status: AutoscalingStatus,
    role: RoleName,
    metric: str,
    current: int,
    d: Decision,
    now: float,
) -> None:
    """The decision into the autoscaler's status (its memory and the last decision shown)."""
    status.desired[role] = d.desired
    status.recommendations[role] = [[t, float(n)] for t, n in d.memory.recommendations]
    if d.memory.capacity is not None:
        status.capacity[role] = round(d.memory.capacity, 6)
    if d.memory.streams is not None:
        status.concurrency[role] = round(d.memory.streams, 4)
    if d.memory.last_scale_time is not None:
        status.last_scale_time[role] = rfc3339(d.memory.last_scale_time)
    status.last_evaluation[role] = now
    if d.direction != "hold" or status.last_decision is None:
        status.last_decision = ScalingDecision(
            time=rfc3339(now),
            role=role,
            from_groups=current,
            to_groups=d.desired,
            metric=metric,
            value=None if d.signal is None else round(d.signal, 4),
            target=d.target,
            reason=d.reason,
            message=d.message,
        )
