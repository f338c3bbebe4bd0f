"""The autoscaler's memory as status keeps it (`status.autoscaling`), and what is read from it: whether a
role is due for an evaluation, the startup time learned from the groups, and the burst watch's test.

Status is writable by hand and by older versions: `sane` drops what cannot be used, so a pass never fails on
it (dropped memory is relearned)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tokenfab.api.models import AutoscalingStatus, ModelDeployment, RoleName
from tokenfab.planning.autoscaler import forecast
from tokenfab.planning.autoscaler.policy import CLOCK_SKEW_SECONDS, DEFAULT_HORIZON
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.status import parse_rfc3339 as parse
from tokenfab.planning.topology import PATHS

# A group that has not served this long after its creation (no room to bind, an engine that never loads)
# stops holding back scale-down: it may never serve, and the autoscaler must not wait on it for ever.
WARMING_BOUND_SECONDS = 600.0
PATH_BOUND_SECONDS = 7200.0  # (the workers' startup probe gives up after 2 h)

# An early evaluation (the burst watch saw the requests in flight step up between evaluations) comes no
# sooner than this after the last one: about a Prometheus scrape, the most often the signal can change.
URGENT_GAP_SECONDS = 2.0


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
            "last_scale_time": {r: t for r, t in old.last_scale_time.items() if parse(t) is not None},
            "capacity": {r: v for r, v in old.capacity.items() if _finite(v) and v > 0},
            "concurrency": {r: v for r, v in old.concurrency.items() if _finite(v) and v > 0},
            "startup_by_path": {
                p: v for p, v in old.startup_by_path.items() if p in PATHS and _finite(v) and v >= 0
            },
            "startup_seconds": old.startup_seconds
            if _finite(old.startup_seconds) and (old.startup_seconds or 0) >= 0
            else None,
        },
        deep=True,
    )


def remembered(md: ModelDeployment, now: float) -> AutoscalingStatus:
    """The deployment's autoscaler memory, made sane."""
    return sane((md.status.autoscaling if md.status else None) or AutoscalingStatus(), now)


def due(old: AutoscalingStatus, role: RoleName, now: float, interval: float, urgent: bool = False) -> bool:
    last = old.last_evaluation.get(role)
    return last is None or now - last >= (min(interval, URGENT_GAP_SECONDS) if urgent else interval)


def _burst_memory(body: Mapping[str, Any], now: float) -> tuple[AutoscalingStatus, float] | None:
    """The leading policy's memory and interval from the raw object, or None (not leading, unreadable)."""
    try:
        spec_a = (body.get("spec") or {}).get("autoscaling") or {}
        if not spec_a.get("enabled") or spec_a.get("policy", "leading") != "leading":
            return None
        raw = ((body.get("status") or {}).get("autoscaling")) or {}
        return sane(AutoscalingStatus.model_validate(raw), now), float(spec_a.get("intervalSeconds", 15))
    except (ValidationError, AttributeError, TypeError, ValueError):
        return None


def burst_watch(body: Mapping[str, Any], inflight: float, now: float) -> bool:
    """Whether the requests in flight at a deployment's frontend (`inflight`, from the burst watch's one
    fleet-wide query) stand well above what its evaluations saw over the forecast window: a burst has begun
    (forecast.stepped, with the requests one group holds as learned), and its next evaluation should not
    wait out the interval. Only for the leading policy with a learned group size and an evaluation at
    least URGENT_GAP_SECONDS old. It reads the raw object (hundreds of deployments every scrape): anything
    it cannot read is no burst, and the pass that follows reads and decides everything again."""
    memory = _burst_memory(body, now)
    if memory is None:
        return False
    st, interval = memory
    streams = st.concurrency.get("decode") or st.concurrency.get("worker")
    last = max(st.last_evaluation.values(), default=None)
    if streams is None or last is None or now - last < URGENT_GAP_SECONDS:
        return False
    # A scale-up of the last startup time has groups on their way: what rises since is the backlog that
    # waits for them, which the evaluations at the interval size (no wake every look for a minute).
    coming = max(URGENT_GAP_SECONDS, st.startup_seconds or DEFAULT_HORIZON)
    scaled = [parse(t) for t in st.last_scale_time.values()]
    if any(t is not None and 0 <= now - t < coming for t in scaled):
        return False
    if not forecast.valid_count(inflight):
        return False
    window = max(30.0, 3.0 * interval)
    seen = [(x[0], x[3]) for x in st.arrivals if len(x) >= 4 and 0 <= now - x[0] <= window]
    return forecast.stepped(seen, inflight, streams)


def _startups(
    groups: Mapping[RoleName, list[GroupView]], since: float | None, bound: float = WARMING_BOUND_SECONDS
) -> list[tuple[str, float]]:
    """(start path, seconds from creation to Ready) of the groups that became Ready after `since`, within
    `bound` seconds of their creation (longer: it waited for room or a retry, not for its engine)."""
    out = []
    for gs in groups.values():
        for g in gs:
            readies = [p.ready_since for p in g.pods]
            if g.created_at is None or not readies or any(r is None for r in readies):
                continue
            ready = max(r for r in readies if r is not None)
            if since is not None and ready <= since:
                continue
            if ready - g.created_at > bound:
                continue  # it waited for room (or a retry), not for its engine: no startup sample
            out.append((g.start_path, ready - g.created_at))
    return out


def learned_startup(
    groups: Mapping[RoleName, list[GroupView]], before: float | None, since: float | None
) -> float | None:
    """The startup time (creation to Ready) updated with the groups that became Ready after `since`."""
    out = before
    for _, seconds in _startups(groups, since):
        out = forecast.learn_startup(out, seconds)
    return out


def learned_startup_by_path(
    groups: Mapping[RoleName, list[GroupView]], before: Mapping[str, float], since: float | None
) -> dict[str, float]:
    """The same per start path (warm, fetching, cold), from the groups placed knowing their path (a cold
    start may take up to PATH_BOUND_SECONDS: a download of hundreds of GB)."""
    out = dict(before)
    for path, seconds in _startups(groups, since, PATH_BOUND_SECONDS):
        if path in PATHS:
            learned = forecast.learn_startup(out.get(path), seconds)
            if learned is not None:
                out[path] = learned
    return out


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
