"""The settle phase of a pass, its last: once the act phase's writes are answered, the deployment's own
object is written (its status, which tokenfab.planning.one_pass.settle makes, and the plan's patch that
takes old kopf bookkeeping off), the Events posted and the autoscaler's decisions reported. A status
whose content did not change is not written again, one that changes more often than STATUS_MIN_INTERVAL
is deferred to a later pass, and each API error is posted once as an Event."""

from __future__ import annotations

import logging
import time
from typing import Any

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.models import API_VERSION, KIND, Condition, ModelDeploymentStatus
from tokenfab.fleet.view import TEMPLATE, Key
from tokenfab.planning import one_pass
from tokenfab.planning.autoscaler import Decision
from tokenfab.planning.one_pass import Plan
from tokenfab.planning.status import event_for
from tokenfab.runtime import Context, Ended, Memory, Observed, Result

log = logging.getLogger(__name__)


def post_errors(ctx: Context, body: Obj, mem: Memory, result: Result, now: float) -> None:
    """One Warning Event per distinct refusal (not one per retry); counted per reason."""
    for err in result.errors:
        text = str(err)
        telemetry.RECONCILE_ERRORS.labels(
            body["metadata"]["namespace"], body["metadata"]["name"], err.reason
        ).inc()
        last = mem.errors_posted.get(text)
        if last is not None and now - last < 600:
            continue
        mem.errors_posted[text] = now
        ctx.kube.post_event(body, "Warning", "ReconcileError", f"the API server refused: {text}")
    if len(mem.errors_posted) > 64:
        for text, _ in sorted(mem.errors_posted.items(), key=lambda kv: kv[1])[:-32]:
            mem.errors_posted.pop(text, None)


def now_minus(t: float) -> float:
    return time.time() - t


def _comparable(status: Any) -> Any:
    """A status as written and compared: empty maps and lists are left out at every level. (Applying an
    empty map where this manager owned entries makes server-side apply send null, which the schema
    refuses; and the API server may default empty objects.)"""
    if isinstance(status, dict):
        out = {k: _comparable(v) for k, v in status.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(status, list):
        return [_comparable(v) for v in status]
    return status


# A deployment's status is written at most this often while nothing a user waits for changes (Ready
# flipping, an error, a new generation): a burst of pod events then costs one status write, not one each.
STATUS_MIN_INTERVAL = 1.0
# A pass parked for its pods' identity or its channel template is woken by their watch; this look backs it
# up (no pass holds a worker while it waits).
LOOK_SECONDS = 5.0


def status_defer(
    ctx: Context,
    key: Key,
    previous: dict[str, Condition],
    status: ModelDeploymentStatus,
    result: Result,
    now: float,
) -> float:
    """Seconds to hold this status back (0: write it now)."""
    mem = ctx.mem(key)
    if mem.status is None or result.errors:
        return 0.0
    since = now_minus(mem.status[2])
    if since >= STATUS_MIN_INTERVAL:
        return 0.0
    ready = next((cd for cd in status.conditions if cd.type == "Ready"), None)
    before = previous.get("Ready")
    if ready is None or before is None or ready.status != before.status:
        return 0.0
    last = mem.status[0]
    if (last.get("observedGeneration") or 0) != (status.observed_generation or 0):
        return 0.0
    new = _comparable(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    for memory in (
        "failures",
        "faults",
        "autoscaling",
        "profile",
        "placement",
    ):  # what later passes decide from
        if new.get(memory) != last.get(memory):
            return 0.0
    return STATUS_MIN_INTERVAL - since


def write_status(ctx: Context, key: Key, body: Obj, status: ModelDeploymentStatus, result: Result) -> None:
    new = _comparable(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    mem = ctx.mem(key)
    current = body.get("status")
    if (
        mem.status is not None
        and body["metadata"].get("resourceVersion") != mem.status[1]
        and now_minus(mem.status[2]) < ctx.settings.applied_grace
    ):
        current = mem.status[0]
    if _comparable(new) == _comparable(current):
        return
    try:
        written = ctx.kube.apply_status(key[0], key[1], new)
    except ApiError as exc:
        if exc.not_found:
            return
        result.errors.append(exc)
        return
    mem.status = (new, str((written or {}).get("metadata", {}).get("resourceVersion", "")), time.time())


def settle(ctx: Context, key: Key, seen: Observed | Ended, plan: Plan | None, result: Result) -> None:
    """The pass's status, made from the snapshot, the plan and what the API server answered
    (`one_pass.settle`), written now or deferred to the pass STATUS_MIN_INTERVAL later (which writes it
    with its Events); the Events of its conditions and of its plan; the autoscaler's metrics; one Event per
    new refusal; and when the deployment wants its next pass. A pass that ended at its observation writes
    the status and Events it came with, and takes old kopf bookkeeping off."""
    if isinstance(seen, Ended):
        if seen.legacy is not None:
            remove_legacy(ctx, key, dict(seen.legacy))
        if seen.status is not None:
            write_status(ctx, key, seen.body, seen.status, result)
        for kind, reason, message in seen.events:
            ctx.kube.post_event(seen.body, kind, reason, message)
        return
    assert plan is not None
    body, snap = seen.body, seen.snapshot
    if plan.writes.legacy is not None:
        remove_legacy(ctx, key, dict(plan.writes.legacy))
    written = one_pass.Written(frozenset(result.created), tuple(str(e) for e in result.errors))
    status, changed = one_pass.settle(snap, plan, written)
    report(ctx, key, body, plan, result)
    old = snap.md.status
    previous = {cd.type: cd for cd in (old.conditions if old else [])}
    defer = status_defer(ctx, key, previous, status, result, snap.now)
    if defer <= 0:
        write_status(ctx, key, body, status, result)
        for cond in changed:
            event_type = event_for(cond, previous.get(cond.type))
            if event_type is not None:
                ctx.kube.post_event(
                    body, event_type, cond.reason, f"{cond.type}={cond.status}: {cond.message}"
                )
            result.conditions_changed.append(f"{cond.type}={cond.status}/{cond.reason}")
    post_errors(ctx, body, ctx.mem(key), result, snap.now)
    result.waiting_for_capacity = plan.waiting_for_capacity
    waits = [w for w in (plan.requeue_after, defer if defer > 0 else None) if w is not None]
    if result.channel_waits:  # (the template's watch wakes the deployment: this backs it up; unwatched,
        # NVIDIA's DRA driver answers a ComputeDomain within a second or so)
        waits.append(LOOK_SECONDS if ctx.view.synced.get(TEMPLATE, False) else 1.0)
    if result.identity_waits:  # (the identity's watch wakes the deployment; this only backs it up)
        waits.append(LOOK_SECONDS)
    result.requeue_after = min(waits, default=None)


def remove_legacy(ctx: Context, key: Key, patch: Obj) -> None:
    """Take old kopf bookkeeping off the deployment (once per object in this process; a failure is logged
    and tried again by a later pass)."""
    mem = ctx.mem(key)
    version = str(patch["metadata"].get("resourceVersion", ""))
    if version and mem.legacy_checked == version:
        return  # (patched moments ago: the watch has not shown it yet)
    try:
        ctx.kube.merge_patch(API_VERSION, KIND, key[0], key[1], patch)
        mem.legacy_checked = version
    except ApiError as exc:
        log.warning("could not remove old kopf bookkeeping from %s/%s: %s", *key, exc)


def report(ctx: Context, key: Key, body: Obj, plan: Plan, result: Result) -> None:
    """The autoscaler's decisions: its metrics (each with the target the decision held its signal to),
    the plan's Events, the Result's record."""
    for role, metric, dec in plan.autoscaling.decisions:
        _decision_metrics(key, role, metric, dec)
        result.decisions.append(f"{role}:{dec.direction}:{dec.reason}")
    for kind, reason, message in plan.events:
        ctx.kube.post_event(body, kind, reason, message)


def _decision_metrics(key: Key, role: str, metric: str, d: Decision) -> None:
    telemetry.AUTOSCALER_TARGET.labels(key[0], key[1], role, metric).set(d.target)
    if d.signal is not None:
        telemetry.AUTOSCALER_SIGNAL.labels(key[0], key[1], role, metric).set(d.signal)
    telemetry.SCALING_DECISIONS.labels(key[0], key[1], role, d.direction).inc()
