"""The autoscaling step of a reconcile pass: read the signals from Prometheus, ask the pure policy, check
that the groups it wants fit in the free NVLink capacity, size the frontend, and hand back the new
autoscaler state.

The result goes to status only (`status.autoscaling.desired`, `.frontendReplicas`), which the reconciler
then realises; the user's spec is never written, so a GitOps tool re-applying the manifest sees no drift.
The policy's memory (recent recommendations, last scale time, last evaluation, the arrival history, the
learned capacity per group and startup time) lives in status too, so a restart keeps it.

Signals (all read before the placement ledger is taken, one bounded attempt per query):
- per group: KV-cache utilization (decode, aggregated workers) or waiting requests (prefill, independent);
- with the leading policy: the waiting requests per decode/worker group, the requests in flight at the
  frontend, and the requests/s arriving there (and input tokens/s, for independent prefill and for the
  frontend's own size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

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
from tokenfab.planning import forecast
from tokenfab.planning.autoscaling import (
    CLOCK_SKEW_SECONDS,
    DEFAULT_HORIZON,
    Decision,
    Demand,
    Memory,
    config_for,
    decide,
    initial_groups,
)
from tokenfab.planning.lifecycle import GroupView, NodeHealth, classify
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain, GroupShape, place_sequence

Reader = Callable[[str, str], metrics.Reading]

# A group that has not served this long after its creation (no room to bind, an engine that never loads)
# stops holding back scale-down: it may never serve, and the autoscaler must not wait on it for ever.
WARMING_BOUND_SECONDS = 600.0


@dataclass
class Outcome:
    desired: dict[RoleName, int]
    status: AutoscalingStatus
    conditions: list[Condition]
    decisions: list[tuple[RoleName, str, Decision]] = field(default_factory=list)  # role, metric, decision
    frontend_replicas: int | None = None  # None: the spec's serving.frontendReplicas


def _parse(ts: str | None) -> float | None:
    """An RFC 3339 time from status, or None when it is missing or unreadable (status is only memory)."""
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else None
    except (ValueError, TypeError, AttributeError):
        return None


def _finite(*xs: object) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def sane(old: AutoscalingStatus, now: float) -> AutoscalingStatus:
    """The autoscaler's memory as status holds it, with what cannot be used dropped: rows of the wrong
    length or with non-finite numbers (status is writable by hand and by older versions), times in the
    future (a clock that ran ahead, or another replica's), and learned figures that are not positive and
    finite. Dropped memory is relearned; a pass never fails on it."""
    ahead = now + CLOCK_SKEW_SECONDS

    def rows(xs: list[list[float]], n: int) -> list[list[float]]:
        return [list(x) for x in xs if len(x) >= n and _finite(*x) and x[0] <= ahead]

    return old.model_copy(
        update={
            "recommendations": {r: rows(xs, 2) for r, xs in old.recommendations.items()},
            "frontend_recommendations": rows(old.frontend_recommendations, 2),
            "arrivals": [x for x in rows(old.arrivals, 3) if min(x[1:]) >= 0],
            "last_evaluation": {r: t for r, t in old.last_evaluation.items() if _finite(t) and t <= ahead},
            "last_scale_time": {r: t for r, t in old.last_scale_time.items() if _parse(t) is not None},
            "capacity": {r: v for r, v in old.capacity.items() if _finite(v) and v > 0},
            "concurrency": {r: v for r, v in old.concurrency.items() if _finite(v) and v > 0},
            "startup_seconds": old.startup_seconds
            if _finite(old.startup_seconds) and (old.startup_seconds or 0) >= 0
            else None,
        },
        deep=True,
    )


# A read that failed with one of these (the error text starts with the exception's name) could not
# reach Prometheus at all: the pass's other reads would wait out the same connect timeout, one after the
# other. (A read that timed out waiting for an answer may be one heavy query: the others are still asked.)
UNREACHABLE = ("ConnectionError", "ConnectTimeout", "NewConnectionError", "MaxRetryError")


def one_timeout_per_pass(reader: Reader) -> Reader:
    """`reader`, except that once a read finds Prometheus unreachable, the pass's remaining reads fail at
    once with the same words: an unreachable Prometheus costs a pass one connect timeout, not one per query
    (six for an autoscaled disaggregated deployment with a frontend), and the passes of other deployments
    are not held up behind it."""
    down: list[str] = []

    def read(url: str, query: str) -> metrics.Reading:
        if down:
            return metrics.Reading(None, down[0], query)
        reading = reader(url, query)
        if reading.samples is None and reading.error.startswith(UNREACHABLE):
            down.append(reading.error)
        return reading

    return read


# An early evaluation (the burst watch saw the requests in flight step up between evaluations) comes no
# sooner than this after the last one: about a Prometheus scrape, the most often the signal can change.
URGENT_GAP_SECONDS = 2.0


def _due(old: AutoscalingStatus, role: RoleName, now: float, interval: float, urgent: bool = False) -> bool:
    last = old.last_evaluation.get(role)
    return last is None or now - last >= (min(interval, URGENT_GAP_SECONDS) if urgent else interval)


def burst_watch(body: Mapping[str, Any], inflight: float, now: float) -> bool:
    """Whether the requests in flight at a deployment's frontend (`inflight`, from the burst watch's one
    fleet-wide query) stand well above what its evaluations saw over the forecast window: a burst has begun
    (forecast.stepped, with the requests one group holds as learned), and its next evaluation should not
    wait out the interval. Only for the leading policy with a learned group size and an evaluation at
    least URGENT_GAP_SECONDS old. It reads the raw object (hundreds of deployments every scrape): anything
    it cannot read is no burst, and the pass that follows reads and decides everything again."""
    try:
        spec_a = (body.get("spec") or {}).get("autoscaling") or {}
        if not spec_a.get("enabled") or spec_a.get("policy", "leading") != "leading":
            return False
        raw = ((body.get("status") or {}).get("autoscaling")) or {}
        st = sane(AutoscalingStatus.model_validate(raw), now)
        interval = float(spec_a.get("intervalSeconds", 15))
    except (ValidationError, AttributeError, TypeError, ValueError):
        return False
    streams = st.concurrency.get("decode") or st.concurrency.get("worker")
    last = max(st.last_evaluation.values(), default=None)
    if streams is None or last is None or now - last < URGENT_GAP_SECONDS:
        return False
    # A scale-up of the last startup time has groups on their way: what rises since is the backlog that
    # waits for them, which the evaluations at the interval size (no wake every look for a minute).
    coming = max(URGENT_GAP_SECONDS, st.startup_seconds or DEFAULT_HORIZON)
    scaled = [_parse(t) for t in st.last_scale_time.values()]
    if any(t is not None and 0 <= now - t < coming for t in scaled):
        return False
    if not forecast.valid_count(inflight):
        return False
    window = max(30.0, 3.0 * interval)
    seen = [(x[0], x[3]) for x in st.arrivals if len(x) >= 4 and 0 <= now - x[0] <= window]
    return forecast.stepped(seen, inflight, streams)


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


def _signal_query(md: ModelDeployment, role: RoleName, metric: str) -> str:
    a = md.spec.autoscaling
    name, namespace = md.metadata.name or "", md.metadata.namespace or ""
    if metric == "kv_cache_utilization":
        return metrics.kv_query(namespace, name, role, a.query)
    return metrics.queue_query(namespace, name, role)


def _shared_queries(md: ModelDeployment) -> dict[str, str]:
    """The deployment-wide queries of an evaluation: arrivals at the frontend, and the waiting requests
    of the KV-scaled roles (the leading policy's queue signal)."""
    spec, a = md.spec, md.spec.autoscaling
    name, namespace = md.metadata.name or "", md.metadata.namespace or ""
    out: dict[str, str] = {}
    leading = a.policy == "leading"
    if leading or a.frontend is not None:
        out["requests"] = metrics.arrival_query(namespace, name, a.rate_window_seconds)
    independent_prefill = any(r == "prefill" for r, _, _ in scaled_roles(md))
    if a.frontend is not None or (leading and independent_prefill):
        out["tokens"] = metrics.input_tokens_query(namespace, name, a.rate_window_seconds)
    if leading:
        for role, _, metric in scaled_roles(md):
            if metric == "kv_cache_utilization" and spec.role(role) is not None:
                out[f"waiting:{role}"] = metrics.queue_query(namespace, name, role)
                out["inflight"] = metrics.frontend_inflight_query(namespace, name)
    return out


def due_queries(md: ModelDeployment, now: float, urgent: bool = False) -> list[str]:
    """The Prometheus queries the next `autoscale` call will ask (read them before taking the ledger)."""
    a = md.spec.autoscaling
    old = sane((md.status.autoscaling if md.status else None) or AutoscalingStatus(), now)
    out = []
    for role, _, metric in scaled_roles(md):
        if not _due(old, role, now, a.interval_seconds, urgent):
            continue
        out.append(_signal_query(md, role, metric))
    if out:
        out += list(_shared_queries(md).values())
    return out


def next_due(md: ModelDeployment, now: float, urgent: bool = False) -> float | None:
    """Seconds until the next role is due for an evaluation (None: autoscaling off); `urgent`: the burst
    watch asked for one, due URGENT_GAP_SECONDS after the last."""
    a = md.spec.autoscaling
    if not a.enabled:
        return None
    old = sane((md.status.autoscaling if md.status else None) or AutoscalingStatus(), now)
    interval = min(a.interval_seconds, URGENT_GAP_SECONDS) if urgent else a.interval_seconds
    waits = [
        max(0.0, interval - (now - old.last_evaluation[r]))
        for r, _, _ in scaled_roles(md)
        if r in old.last_evaluation
    ]
    return min(waits, default=float(interval))


def _one(reading: metrics.Reading | None) -> tuple[float | None, str]:
    """The single value of a deployment-wide reading: (value or None, why not). No series at all is no
    value and no error (the frontend is not scraped, or nothing arrived yet); a failed read or a value
    that is negative or not finite is an error."""
    if reading is None:
        return None, ""
    if reading.samples is None:
        return None, reading.error or "the query failed"
    if not reading.samples:
        return None, ""
    value = sum(s.value for s in reading.samples.values())
    if not forecast.valid_count(value):
        return None, f"bad sample {value!r}"
    return value, ""


def profile_capacity(md: ModelDeployment, role: RoleName) -> float | None:
    """What one group of `role` serves at the SLO by the profile's plan: requests/s for decode and
    aggregated workers, input tokens/s for prefill (None: no plan with a predicted rate)."""
    prof = md.status.profile if md.status else None
    if prof is None or not prof.ok or prof.predicted is None or not prof.predicted.request_rate:
        return None
    planned = prof.roles.get(role)
    if planned is None or planned.replicas <= 0:
        return None
    per_group = prof.predicted.request_rate / planned.replicas
    if role == "prefill":
        isl = md.spec.profile.isl if md.spec.profile is not None else None
        return per_group * isl if isl else None
    return per_group


def learned_startup(
    groups: Mapping[RoleName, list[GroupView]], before: float | None, since: float | None
) -> float | None:
    """The startup time (creation to Ready) updated with the groups that became Ready after `since`."""
    out = before
    for gs in groups.values():
        for g in gs:
            readies = [p.ready_since for p in g.pods]
            if g.created_at is None or not readies or any(r is None for r in readies):
                continue
            ready = max(r for r in readies if r is not None)
            if since is not None and ready <= since:
                continue
            if ready - g.created_at > WARMING_BOUND_SECONDS:
                continue  # it waited for room (or a retry), not for its engine: no startup sample
            out = forecast.learn_startup(out, ready - g.created_at)
    return out


def _fit(
    md: ModelDeployment,
    role: RoleName,
    current: int,
    want: int,
    domains_for: Callable[[RoleName], Mapping[str, Domain]],
) -> tuple[int, str]:
    """How many of `want` groups fit whole, counting the prefill groups the fixed ratio adds alongside
    new decode groups: (groups that fit, what ran short)."""
    spec = md.spec
    shape = b.group_shape(spec, role)
    extra_prefill: list[GroupShape] = []
    follows = role == "decode" and spec.prefill is not None and spec.serving.ratio_policy == "fixed"
    prefill_now = b.follow_ratio(spec, current, 0) if follows else 0
    pshape = b.group_shape(spec, "prefill") if follows else None
    what = f"each needs {shape.gpus} GPUs on {shape.nodes} node(s) in one NVLink domain"
    if pshape is not None:
        what += f", with {pshape.gpus} GPU(s) per prefill group the ratio adds"
    for n in range(want, current, -1):
        shapes = [shape] * (n - current)
        if pshape is not None:
            extra_prefill = [pshape] * max(0, b.follow_ratio(spec, n, 0) - prefill_now)
        placed, _ = place_sequence(domains_for(role), [*shapes, *extra_prefill], spec.topology.placement)
        if all(d is not None for d in placed):
            return n, what
    return current, what


def autoscale(
    md: ModelDeployment,
    groups: dict[RoleName, list[GroupView]],
    health: dict[str, NodeHealth],
    domains_for: Callable[[RoleName], Mapping[str, Domain]],
    now: float,
    reader: Reader,
    urgent: bool = False,
) -> Outcome:
    """One autoscaling step. `domains_for(role)` is the free capacity for that role's groups (read under
    the placement ledger's lock); `reader` answers a Prometheus query. `urgent`: the burst watch saw a
    burst begin, and every role is due once URGENT_GAP_SECONDS have passed since its last evaluation."""
    spec, a = md.spec, md.spec.autoscaling
    old = sane((md.status.autoscaling if md.status else None) or AutoscalingStatus(), now)
    status = old.model_copy(deep=True)
    desired: dict[RoleName, int] = {}
    decisions: list[tuple[RoleName, str, Decision]] = []
    unavailable: list[str] = []
    limited: list[str] = []
    evaluated = False
    tol = float(spec.topology.node_failure_toleration_seconds)
    url = a.prometheus_url or ""
    shared: dict[str, metrics.Reading] | None = None
    blind: set[str] = set()  # leading signals whose read failed or came back bad
    rate: float | None = None
    tokens: float | None = None
    inflight: float | None = None
    since = max(old.last_evaluation.values(), default=None)
    startup = old.startup_seconds
    if any(_due(old, role, now, a.interval_seconds, urgent) for role, _, _ in scaled_roles(md)):
        # Learned at evaluations only: `since` moves on with them, so each group is one sample.
        startup = learned_startup(groups, old.startup_seconds, since)
    status.startup_seconds = None if startup is None else round(startup, 1)
    bound = max(WARMING_BOUND_SECONDS, 2.0 * (startup or 0.0))

    for role, bounds, metric in scaled_roles(md):
        r = spec.role(role)
        assert r is not None
        kv = metric == "kv_cache_utilization"
        target = a.target_kv_cache_utilization if kv else a.target_queue_depth
        cfg = config_for(a, bounds.min_replicas, bounds.max_replicas, target, startup, utilization=kv)
        current = old.desired.get(role)
        if current is None:
            current = initial_groups(r.replicas, cfg)
            status.desired[role] = current
        desired[role] = current
        last = old.last_evaluation.get(role)
        if not _due(old, role, now, a.interval_seconds, urgent):
            continue  # not due: keep the last decision

        if shared is None:
            shared = {k: reader(url, q) for k, q in _shared_queries(md).items()}
            rate, why = _one(shared.get("requests"))
            if why:
                unavailable.append(f"arrivals at the frontend: {why}")
                blind.add("requests")
            tokens, why = _one(shared.get("tokens"))
            if why:
                unavailable.append(f"input tokens at the frontend: {why}")
                blind.add("tokens")
            inflight, why = _one(shared.get("inflight"))
            if why:
                unavailable.append(f"requests in flight at the frontend: {why}")
                blind.add("inflight")
        counted, warming, starting = set(), 0, 0
        for g in groups.get(role, []):
            state, _ = classify(g, health, now, tol)
            since_ready = [p.ready_since for p in g.pods]
            warm = state == "serving" and all(
                s is not None and now - s >= a.warmup_seconds for s in since_ready
            )
            young = g.created_at is None or now - g.created_at < bound
            if warm:
                counted.add(g.name)
            elif state in ("serving", "starting", "reserved") and young:
                warming += 1
                starting += state != "serving"
        reading = reader(url, _signal_query(md, role, metric))
        evaluated = True
        remembered = old.recommendations.get(role)
        paused = last is None or now - last > max(
            2.0 * a.interval_seconds, a.scale_down_stabilization_seconds
        )
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
        memory = Memory(
            recommendations=tuple((float(x[0]), max(0, int(x[1]))) for x in remembered),
            last_scale_time=_parse(old.last_scale_time.get(role)),
            rates=tuple((float(t), float(v)) for t, v in history),
            capacity=old.capacity.get(role),
            inflight=tuple((float(x[0]), float(x[3])) for x in recent if len(x) >= 4) if kv else (),
            streams=old.concurrency.get(role),
        )
        waiting: dict[str, float] | None = None
        queue = shared.get(f"waiting:{role}") if kv else None
        if queue is not None and queue.samples is None:
            unavailable.append(f"{role}: waiting requests: {queue.error or 'the query failed'}")
        elif queue is not None and queue.samples is not None:
            waiting = {g: s.value for g, s in queue.samples.items() if g in counted}
        demand = Demand(
            rate=rate if kv else tokens,
            waiting=waiting,
            capacity=profile_capacity(md, role),
            starting=starting,
            inflight=inflight if kv else None,
        )
        decision = decide(reading.samples, counted, warming, current, cfg, memory, now, demand)
        if not _due(old, role, now, a.interval_seconds):  # (due only because the burst watch asked)
            decision = replace(decision, message=f"burst watch: {decision.message}")
        unread = {"requests", "inflight"} & blind if kv else {"tokens"} & blind
        floor = max(cfg.min_groups, min(cfg.max_groups, current))  # a bound still moves the count
        if cfg.leading and unread and decision.desired < floor:
            # The demand ahead is unknown: never a scale-down on missing data.
            what = "the arrival rate" if unread & {"requests", "tokens"} else "the requests in flight"
            decision = replace(
                decision,
                desired=floor,
                reason="MetricsIncomplete",
                message=f"{decision.message}; {what} could not be read: no scale-down",
                memory=replace(decision.memory, last_scale_time=memory.last_scale_time),
            )
        if not decision.metrics_ok:
            unavailable.append(
                f"{role}: {decision.message}" + (f" ({reading.error})" if reading.error else "")
            )

        target_n = decision.desired
        if target_n > current:  # capacity-aware: only as many new groups as fit whole somewhere
            fit, short = _fit(md, role, current, target_n, domains_for)
            if fit < target_n:
                limited.append(f"{role}: the autoscaler wants {target_n} groups but only {fit} fit: {short}")
                decision = replace(
                    decision,
                    desired=fit,
                    reason="CapacityLimited" if fit == current else decision.reason,
                    # Nothing changed when nothing fits: the last scale time stands.
                    memory=decision.memory
                    if fit > current
                    else replace(decision.memory, last_scale_time=memory.last_scale_time),
                )
                target_n = fit

        desired[role] = target_n
        status.desired[role] = target_n
        status.recommendations[role] = [[t, float(n)] for t, n in decision.memory.recommendations]
        if decision.memory.capacity is not None:
            status.capacity[role] = round(decision.memory.capacity, 6)
        if decision.memory.streams is not None:
            status.concurrency[role] = round(decision.memory.streams, 4)
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
    for stale in [r for r in status.capacity if r not in scaled]:
        status.capacity.pop(stale)
    for stale in [r for r in status.concurrency if r not in scaled]:
        status.concurrency.pop(stale)
    frontend = old.frontend_replicas if a.frontend is not None else None
    if not evaluated:  # nothing was due: the last conditions still stand
        return Outcome(desired, status, [], decisions, frontend)

    keep = max(30.0, 3.0 * a.interval_seconds)
    kept = [x for x in old.arrivals if len(x) >= 3 and now - x[0] <= keep and x[0] < now]
    status.arrivals = kept
    if (rate is not None or tokens is not None) and not {"requests", "tokens"} & blind:
        # A read that failed is no sample (not a zero); no series at all is nothing arriving.
        sample = [now, round(rate or 0.0, 6), round(tokens or 0.0, 3)]
        status.arrivals = [*kept, sample + ([round(inflight, 3)] if inflight is not None else [])]
    if a.frontend is not None:
        frontend = _size_frontend(md, status, rate, tokens, now, partial=bool({"requests", "tokens"} & blind))
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
    return Outcome(desired, status, conditions, decisions, frontend)


def _size_frontend(
    md: ModelDeployment,
    status: AutoscalingStatus,
    rate: float | None,
    tokens: float | None,
    now: float,
    partial: bool = False,
) -> int:
    """Frontend replicas for the forecast ingress: requests/s and input tokens/s over what one replica
    should take, within the bounds; up at once, down only to the highest recommendation of the
    scale-down window. Without a reading the count holds; with one of the two reads failed (`partial`)
    it may rise but not fall."""
    a = md.spec.autoscaling
    fs = a.frontend
    assert fs is not None
    current = status.frontend_replicas or md.spec.serving.frontend_replicas
    current = max(fs.min_replicas, min(fs.max_replicas, current))
    if rate is None and tokens is None:
        status.frontend_replicas = current
        return current
    horizon = float(a.forecast_seconds if a.forecast_seconds is not None else status.startup_seconds or 30.0)
    window = max(30.0, 3.0 * a.interval_seconds)
    reqs = [(x[0], x[1]) for x in status.arrivals if len(x) >= 3]
    toks = [(x[0], x[2]) for x in status.arrivals if len(x) >= 3]
    ahead_r = forecast.forecast(reqs, now, window, horizon).ahead
    ahead_t = forecast.forecast(toks, now, window, horizon).ahead
    need = max(
        math.ceil(ahead_r / fs.requests_per_second_per_replica - 1e-9),
        math.ceil(ahead_t / fs.input_tokens_per_second_per_replica - 1e-9),
    )
    rec = max(fs.min_replicas, min(fs.max_replicas, need))
    down = float(a.scale_down_stabilization_seconds)
    recs = [(x[0], x[1]) for x in status.frontend_recommendations if len(x) >= 2 and 0 <= now - x[0] <= down]
    recs.append((now, float(rec)))
    # Only the maximum of the window is read: an entry with a later one at least as high never is.
    status.frontend_recommendations = [[t, n] for t, n in recs if not any(m >= n for u, m in recs if u > t)]
    out = rec if rec >= current else min(current, int(max(n for _, n in recs)))
    if partial:
        out = max(out, current)
    status.frontend_replicas = out
    return out
