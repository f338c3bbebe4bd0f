"""The status and the Events of a pass, written: a status whose content did not change is not written
again, one that changes more often than STATUS_MIN_INTERVAL is deferred to a later pass, an invalid spec
gets its condition and one Event, and each API error is posted once as an Event."""

from __future__ import annotations

import logging
import time
from typing import Any

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.errors import SpecError
from tokenfab.api.models import API_VERSION, KIND, Condition, ModelDeployment, ModelDeploymentStatus
from tokenfab.fleet.view import Key
from tokenfab.planning import contract
from tokenfab.planning.status import merge_conditions
from tokenfab.runtime import Context, Memory, Result

log = logging.getLogger(__name__)


# Old kopf bookkeeping on objects made by earlier tokenfab versions (removed when seen).
LEGACY_FINALIZER = contract.FINALIZER


LEGACY_ANNOTATIONS = (f"{contract.DOMAIN}/last-handled-configuration", f"{contract.DOMAIN}/last-handled")


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


def last_status(ctx: Context, key: Key, body: Obj, md: ModelDeployment) -> ModelDeploymentStatus | None:
    """The status this pass builds on: the watched object's, or the one this process wrote moments ago
    if the watch has not shown it yet."""
    mem = ctx.mem(key)
    if mem.status is not None:
        written, rv, when = mem.status
        if body["metadata"].get("resourceVersion") != rv and now_minus(when) < ctx.settings.applied_grace:
            try:
                return ModelDeploymentStatus.model_validate(written)
            except ValueError:
                return md.status
    return md.status


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


def invalid(ctx: Context, body: Obj, exc: SpecError, now: float) -> Result:
    """A spec the API server accepted but the models refuse (an older CRD, or a rule the server cannot
    check): say so in a condition and an Event, and touch nothing that runs."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    message = "; ".join(exc.errors)[:1000]
    ready = Condition(type="Ready", status="False", reason="InvalidSpec", message=message)
    old = body.get("status") or {}
    try:
        base = ModelDeploymentStatus.model_validate(old)
    except ValueError:
        base = ModelDeploymentStatus()
    conds, changed = merge_conditions(
        base.conditions, [ready], int(body["metadata"].get("generation") or 0), now
    )
    status = base.model_copy(update={"conditions": conds})
    result = Result()
    write_status(ctx, key, body, status, result)
    if changed:
        ctx.kube.post_event(body, "Warning", "InvalidSpec", message)
    return result


def remove_legacy(ctx: Context, body: Obj) -> None:
    """Objects made by tokenfab versions that ran kopf's change handlers carry its finalizer and a copy of
    the spec in an annotation; neither is used any more (and the finalizer could block deletion)."""
    meta = body["metadata"]
    mem = ctx.mem((meta["namespace"], meta["name"]))
    if mem.legacy_checked == meta.get("uid"):
        return
    ann = meta.get("annotations") or {}
    legacy_ann = [k for k in ann if k in LEGACY_ANNOTATIONS or k.startswith(f"{contract.DOMAIN}/reconcile-")]
    finalizers = meta.get("finalizers") or []
    if LEGACY_FINALIZER not in finalizers and not legacy_ann:
        mem.legacy_checked = str(meta.get("uid"))
        return
    patch: Obj = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if LEGACY_FINALIZER in finalizers:
        patch["metadata"]["finalizers"] = [f for f in finalizers if f != LEGACY_FINALIZER]
    if legacy_ann:
        patch["metadata"]["annotations"] = dict.fromkeys(legacy_ann)
    try:
        ctx.kube.merge_patch(API_VERSION, KIND, meta["namespace"], meta["name"], patch)
        mem.legacy_checked = str(meta.get("uid"))
    except ApiError as exc:
        log.warning(
            "could not remove old kopf bookkeeping from %s/%s: %s", meta["namespace"], meta["name"], exc
        )
