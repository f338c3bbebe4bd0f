"""Status of a ModelDeployment from a plan and what was observed (pure; time is a parameter).

Conditions follow Kubernetes conventions: type, status, CamelCase reason, message, lastTransitionTime
(kept while the status does not change) and observedGeneration. `changed_conditions` tells the caller
which conditions moved, so an Event is emitted on a change and not on every pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tokenfab.api.models import (
    AutoscalingStatus,
    Condition,
    GroupPlacement,
    ModelDeployment,
    ModelDeploymentStatus,
    ProfileStatus,
    RoleName,
    RoleStatus,
)
from tokenfab.planning.builders.common import Owner, group_name
from tokenfab.planning.groups import RolePlan
from tokenfab.planning.lifecycle import GroupView

CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "Placed")


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(ts: str | None) -> float | None:
    """An RFC 3339 time from status, or None when it is missing or unreadable (status is only memory)."""
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else None
    except (ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Observed:
    """Facts besides the plan that status depends on."""

    generation: int
    frontend_available: int
    frontend_desired: int
    endpoint: str
    errors: tuple[str, ...] = ()  # what the API server refused this pass, in its own words
    crashloop: str = ""  # roles whose failing groups are replaced only after a backoff, and why


def _cond(type_: str, ok: bool, reason: str, message: str) -> Condition:
    return Condition(type=type_, status="True" if ok else "False", reason=reason, message=message)


def _placement_message(p: RolePlan) -> str:
    block, where = p.largest_block
    return (
        f"a {p.role} group needs {p.shape.gpus} GPUs on {p.shape.nodes} node(s) in one NVLink domain"
        + (f", {p.pod_extra}" if p.pod_extra else "")
        + f"; the largest free block is {block} GPUs"
        + (f" (domain {where})" if where else "")
    )


def conditions(plans: Sequence[RolePlan], obs: Observed) -> list[Condition]:
    """Ready, Progressing, Degraded and Placed, in that order."""
    placed = _placed(plans)
    return [_ready(plans, obs), _progressing(plans), _degraded(plans, obs, placed), placed]


def _broken(plans: Sequence[RolePlan]) -> dict[str, str]:
    """Broken group -> why."""
    return {name: why for p in plans for name, why in p.broken_reasons.items()}


def _errors(obs: Observed) -> str:
    return "; ".join(obs.errors)[:900]


def _placed(plans: Sequence[RolePlan]) -> Condition:
    """Placed: every group bound whole inside one NVLink domain, or what keeps one from it."""
    unplaced = [p for p in plans if p.unplaced]
    blocked = [p for p in plans if p.rollout_blocked]
    held = [p for p in plans if p.blocked]
    refused = [f"{g}: {why}" for p in plans for g, why in sorted(p.refused.items())]
    if held:
        return _cond("Placed", False, "ComputeDomainUnavailable", "; ".join(p.blocked for p in held))
    if refused:
        return _cond(
            "Placed",
            False,
            "CreateRefused",
            f"{len(refused)} group(s) not created, the API server refused them (tried again with backoff): "
            + "; ".join(refused)[:600],
        )
    if unplaced:
        return _cond(
            "Placed",
            False,
            "InsufficientCapacity",
            "; ".join(f"{p.unplaced} {_placement_message(p)}" for p in unplaced),
        )
    if blocked:
        return _cond(
            "Placed",
            False,
            "RolloutBlocked",
            "; ".join(f"new revision not started, old groups kept: {_placement_message(p)}" for p in blocked),
        )
    if any(p.unbound for p in plans):
        waiting = [f"{g} ({why})" for p in plans for g, why in sorted(p.unbound.items())]
        return Condition(
            type="Placed",
            status="Unknown",
            reason="Binding",
            message=f"{len(waiting)} group(s) placed but not bound yet: " + "; ".join(waiting)[:600],
        )
    return _cond("Placed", True, "AllGroupsPlaced", "every group is bound whole inside one NVLink domain")


def _ready(plans: Sequence[RolePlan], obs: Observed) -> Condition:
    """Ready: every role has its desired groups serving and the frontend is available."""
    short = [p for p in plans if p.ready < p.desired]
    counts = ", ".join(f"{p.role} {p.ready}/{p.desired}" for p in plans)
    if obs.crashloop and short:
        return _cond("Ready", False, "CrashLooping", f"ready groups: {counts}; {obs.crashloop}"[:900])
    if obs.errors and (short or obs.frontend_available < 1):
        return _cond(
            "Ready",
            False,
            "ReconcileError",
            f"ready groups: {counts}; the API server refused: {_errors(obs)}",
        )
    if short:
        waiting = [why for p in short for _, why in sorted(p.waiting.items())]
        detail = f"; waiting: {waiting[0][:300]}" if waiting else ""
        return _cond("Ready", False, "GroupsNotReady", f"ready groups: {counts}{detail}")
    if obs.frontend_available < 1:
        return _cond(
            "Ready", False, "FrontendNotReady", f"frontend {obs.frontend_available}/{obs.frontend_desired}"
        )
    return _cond("Ready", True, "AllGroupsReady", f"ready groups: {counts}; serving at {obs.endpoint}")


def _progressing(plans: Sequence[RolePlan]) -> Condition:
    """Progressing: draining, rolling out, recovering broken groups, scaling, or stable."""
    rolling = [
        p
        for p in plans
        if any(c.reason == "Surge" for c in p.create)
        or any(d.reason == "Rollout" for d in p.delete)
        or any(d.reason == "Rollout" for d in p.drain)
    ]
    creating = sum(len(p.create) for p in plans)
    deleting = sum(len(p.delete) for p in plans)
    starting = sum(1 for p in plans for s in p.states.values() if s in ("starting", "reserved"))
    # When each drain started, not for how long: the status changes when a drain does, not every second.
    drains = {
        g: f"since {rfc3339(p.drain_started[g])}" if g in p.drain_started else "draining"
        for p in plans
        for g in p.draining
    } | {d.name: "from now" for p in plans for d in p.drain}
    broken = _broken(plans)
    if drains and not (rolling or any(p.old_groups for p in plans)):
        return _cond(
            "Progressing",
            True,
            "Draining",
            f"{len(drains)} group(s) out of routing, finishing their requests: "
            + ", ".join(f"{g} ({since})" for g, since in sorted(drains.items())),
        )
    if rolling or any(p.old_groups for p in plans):
        return _cond(
            "Progressing",
            True,
            "RollingOut",
            f"replacing groups one at a time ({creating} creating, {deleting} deleting)",
        )
    moving = sorted(g for p in plans for g, f in p.faults.items() if not f.sudden)
    if moving:
        return _cond(
            "Progressing",
            True,
            "Evacuating",
            f"moving {len(moving)} group(s) off faulted nodes, each replaced before it drains: "
            + ", ".join(moving),
        )
    if broken:
        return _cond("Progressing", True, "Recovering", f"recreating {len(broken)} broken group(s)")
    if creating or deleting or starting:
        return _cond(
            "Progressing",
            True,
            "Scaling",
            f"{creating} group(s) creating, {starting} starting, {deleting} deleting",
        )
    return _cond("Progressing", False, "Stable", "nothing to do")


def _degraded(plans: Sequence[RolePlan], obs: Observed, placed: Condition) -> Condition:
    """Degraded: the API server refused something, groups crash-loop or failed, or capacity is short
    (with the Placed condition's message)."""
    broken = _broken(plans)
    if obs.errors:
        return _cond("Degraded", True, "ReconcileError", f"the API server refused: {_errors(obs)}")
    if obs.crashloop:
        return _cond("Degraded", True, "CrashLooping", obs.crashloop[:900])
    if broken:
        return _cond(
            "Degraded",
            True,
            "GroupFailed",
            "; ".join(f"{name}: {why}" for name, why in sorted(broken.items()))[:900],
        )
    if any(p.unplaced for p in plans):
        return _cond("Degraded", True, "InsufficientCapacity", placed.message)
    return _cond("Degraded", False, "AsExpected", "no failed groups")


def merge_conditions(
    old: Sequence[Condition],
    new: Sequence[Condition],
    generation: int,
    now: float,
    drop: frozenset[str] = frozenset(),
) -> tuple[list[Condition], list[Condition]]:
    """New conditions with lastTransitionTime carried over when the status did not change.

    Returns (all conditions, the ones whose status or reason changed)."""
    previous = {c.type: c for c in old}
    out, changed = [], []
    for cond in new:
        prev = previous.get(cond.type)
        moved = prev is None or prev.status != cond.status
        ltt = rfc3339(now) if moved or prev is None else prev.last_transition_time
        merged = cond.model_copy(update={"last_transition_time": ltt, "observed_generation": generation})
        out.append(merged)
        if prev is None or prev.status != cond.status or prev.reason != cond.reason:
            changed.append(merged)
    # Keep conditions owned by other parts of the operator (e.g. the autoscaler's).
    out += [c for c in old if c.type not in {n.type for n in new} and c.type not in drop]
    return out, changed


def role_statuses(plans: Sequence[RolePlan]) -> dict[str, RoleStatus]:
    out: dict[str, RoleStatus] = {}
    for p in plans:
        g = p.shape.gpus
        out[p.role] = RoleStatus(
            desired_groups=p.desired,
            ready_groups=p.ready,
            gpus_per_group=g,
            desired_gpus=p.desired * g,
            ready_gpus=p.ready * g,
            groups=f"{p.ready}/{p.desired}",
            draining_groups=len(set(p.draining) | {d.name for d in p.drain}),
        )
    return out


AUTOSCALER_CONDITIONS = frozenset({"MetricsUnavailable", "CapacityLimited"})


def build_status(
    plans: Sequence[RolePlan],
    placement: list[GroupPlacement],
    obs: Observed,
    old: ModelDeploymentStatus | None,
    now: float,
    autoscaling: AutoscalingStatus | None = None,
    extra: Sequence[Condition] = (),
) -> tuple[ModelDeploymentStatus, list[Condition]]:
    """The whole status, and the conditions that changed (for Events).

    `autoscaling` is the autoscaler's new state (None when it is off: its conditions are then dropped);
    `extra` are conditions computed outside the plan (the autoscaler's)."""
    conds, changed = merge_conditions(
        old.conditions if old else [],
        [*conditions(plans, obs), *extra],
        obs.generation,
        now,
        drop=frozenset() if autoscaling is not None else AUTOSCALER_CONDITIONS,
    )
    roles = role_statuses(plans)
    ready = sum(r.ready_gpus for r in roles.values())
    desired = sum(r.desired_gpus for r in roles.values())
    status = ModelDeploymentStatus(
        observed_generation=obs.generation,
        conditions=conds,
        roles=roles,
        gpus=f"{ready}/{desired}",
        draining_groups=sum(r.draining_groups for r in roles.values()),
        placement=sorted(placement, key=lambda p: (p.role, p.group)),
        endpoint=obs.endpoint,
        autoscaling=autoscaling,
    )
    return status, changed


# Conditions whose change is news to a user (Events), and the type of the Event. Transient progress (a
# new group binding, a pass scaling) is left to the conditions themselves.
_WARN_WHEN_TRUE = frozenset({"Degraded", "MetricsUnavailable", "CapacityLimited", "HardwareFault"})


def placement(
    owner: Owner,
    groups: Mapping[RoleName, list[GroupView]],
    plans: Sequence[RolePlan],
    created: frozenset[str],
    weights: Mapping[str, str],
) -> list[GroupPlacement]:
    """status.placement: the groups kept and those created whole this pass, each with its NVLink domain,
    and how its pods got their weights (`weights`: group -> words, from the launchers' logs)."""
    out = []
    for role in plans:
        gone = {d.name for d in role.delete}
        for g in groups.get(role.role, []):
            if g.name not in gone and role.states.get(g.name) != "deleting":
                w = weights.get(g.name, "")
                out.append(GroupPlacement(group=g.name, role=g.role, domain=g.domain, gpus=g.gpus, weights=w))
        for cr in role.create:
            name = group_name(owner, cr.role, cr.slot)
            if name in created and not any(x.group == name for x in out):
                out.append(GroupPlacement(group=name, role=cr.role, domain=cr.domain, gpus=role.shape.gpus))
    return out


def event_for(cond: Condition, before: Condition | None) -> str | None:
    """The Event type ("Normal" or "Warning") to post for a condition that changed, or None for none."""
    if cond.reason == "ReconcileError":
        return None  # the refusal itself gets one Event of its own, with the API server's words
    if cond.type == "Ready":
        if cond.status == "True":
            return "Normal"
        if before is not None and before.status == "True":
            return "Warning"  # it was serving and is not any more
        return "Warning" if cond.reason not in ("GroupsNotReady", "FrontendNotReady", "Planning") else None
    if cond.type == "Placed":
        if cond.status == "False":
            return "Warning"
        return "Normal" if cond.status == "True" and before is not None and before.status == "False" else None
    if cond.type in _WARN_WHEN_TRUE:
        if cond.status == "True":
            return "Warning"
        return "Normal" if before is not None and before.status == "True" else None
    if cond.type == "Progressing":
        wanted = ("RollingOut", "Recovering", "Evacuating")
        return "Normal" if cond.status == "True" and cond.reason in wanted else None
    if cond.type == "Planned":
        return "Normal" if cond.status != "False" else "Warning"
    if cond.type in ("ModelSource", "Fabric"):  # (said when it goes wrong, and when it is put right)
        if cond.status != "True":
            return "Warning"
        return "Normal" if before is not None else None
    return "Normal"


def invalid_status(
    body: Mapping[str, Any], errors: Sequence[str], now: float
) -> tuple[ModelDeploymentStatus, list[Condition]]:
    """The status of a spec the API server accepted but the models refuse (an older CRD, or a rule the
    server cannot check): Ready False with reason InvalidSpec, in the models' words; the rest of the
    status as it was. Returns it with the conditions that changed."""
    message = "; ".join(errors)[:1000]
    ready = Condition(type="Ready", status="False", reason="InvalidSpec", message=message)
    try:
        base = ModelDeploymentStatus.model_validate(body.get("status") or {})
    except ValueError:
        base = ModelDeploymentStatus()
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    conds, changed = merge_conditions(base.conditions, [ready], generation, now)
    return base.model_copy(update={"conditions": conds}), changed


Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class Stop:
    """The status of a deployment on which no groups are planned, the Events it brings and when to look
    again (None: at the next event)."""

    status: ModelDeploymentStatus
    events: tuple[Event, ...]
    changed: tuple[Condition, ...]
    requeue_after: float | None


def stopped(
    body: Mapping[str, Any],
    md: ModelDeployment | None,
    errors: Sequence[str],
    planned: Condition | None,
    profile: ProfileStatus | None,
    now: float,
) -> Stop:
    """A deployment whose spec the models refuse (`errors`), or whose spec.profile has no plan yet or none
    possible (`planned`, the Planned condition, with status.profile): Ready says why, and every child is
    left as it is. Asked again in 5 s while a profile is being planned."""
    if md is None or planned is None:
        status, changed = invalid_status(body, errors, now)
        return Stop(status, tuple(("Warning", "InvalidSpec", cd.message) for cd in changed[:1]), (), None)
    reason = "Planning" if planned.status == "Unknown" else planned.reason
    ready = Condition(type="Ready", status="False", reason=reason, message=planned.message)
    base = md.status or ModelDeploymentStatus()
    generation = md.metadata.generation or 0
    conds, changes = merge_conditions(base.conditions, [ready, planned], generation, now)
    status = base.model_copy(
        update={"conditions": conds, "profile": profile, "observed_generation": generation}
    )
    events = tuple(
        (
            "Warning" if cd.status == "False" and cd.reason != "Planning" else "Normal",
            cd.reason,
            f"{cd.type}={cd.status}: {cd.message}",
        )
        for cd in changes
    )
    return Stop(status, events, tuple(changes), 5.0)
