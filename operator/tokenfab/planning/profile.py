"""spec.profile's plan, as a pass takes it: the planner (aiconfigurator, in a process of its own) is asked
once per profile hash and its answer is kept in status.profile; a planner that was unavailable or failed is
asked again after a while. The spec with the plan merged in is what the rest of the pass reads and plans
from; while there is no plan, or none is possible, the Planned condition says why and no group is planned
(tokenfab.planning.status.stopped)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenfab.api.models import Condition, ModelDeploymentSpec, ProfileStatus
from tokenfab.planning import sla
from tokenfab.planning.status import parse_rfc3339, rfc3339

# Polls a plan for (profile hash, request): the outcome once ready, None while it is being made.
Planner = Callable[[str, sla.PlanRequest], sla.PlanOutcome | None]

# Outcomes worth asking again for: the planner may be installed, or work, later.
RETRY_SECONDS = {sla.PLANNER_UNAVAILABLE: 60.0, sla.PLANNER_FAILED: 300.0}


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
    if status is not None and retry is not None and now - (parse_rfc3339(status.time) or 0.0) >= retry:
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
