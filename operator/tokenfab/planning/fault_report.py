"""What a deployment's status says of hardware faults, pure: the role plans of a pass in, fault records and
the HardwareFault condition out.

Each group a plan finds lost to a sudden fault (its node gone, not ready past the toleration, evicting) or
standing on a node with an announced one (cordoned, quarantined, a device tainted) gets one record: the
node, the fault in the signal's own words, how it was answered (Replaced: re-placed whole at once;
Evacuated: a replacement first, then drained), the replacement and its NVLink domain once placed, and when
the role served again. HardwareFault is True from the fault until the replacement serves; its transitions
are the Events (a Warning naming the node and the fault, then a Normal with the seconds it took).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenfab.api.models import Condition, FaultRecord
from tokenfab.planning.groups import RolePlan
from tokenfab.planning.scaler.memory import parse
from tokenfab.planning.status import rfc3339

KEEP = 10  # records kept in status, newest last

# The condition's reason per fault kind.
REASONS = {
    "Lost": "NodeLost",
    "NotReady": "NodeNotReady",
    "Evicting": "NodeEvicting",
    "Quarantined": "NodeQuarantined",
    "Cordoned": "NodeCordoned",
    "DeviceTainted": "DeviceTainted",
}


def _open(r: FaultRecord) -> bool:
    return r.recovered is None


def _replacement(
    plans: Sequence[RolePlan], group: str, name: Callable[[str, int], str], created: frozenset[str]
) -> tuple[str, str] | None:
    """(the new group, its domain) this pass created whole to replace `group`."""
    for p in plans:
        for cr in p.create:
            if cr.replaces == group and name(cr.role, cr.slot) in created:
                return name(cr.role, cr.slot), cr.domain
    return None


def _serving(plans: Sequence[RolePlan], group: str | None) -> bool:
    return group is not None and any(p.states.get(group) == "serving" for p in plans)


def _role_whole(plans: Sequence[RolePlan], role: str) -> bool:
    return any(p.role == role and p.desired > 0 and p.ready >= p.desired for p in plans)


def records(
    old: Sequence[FaultRecord],
    plans: Sequence[RolePlan],
    now: float,
    group_name: Callable[[str, int], str],
    created: frozenset[str],
) -> list[FaultRecord]:
    """The fault records after this pass: new faults added, replacements noted, recoveries timed."""
    out = [r.model_copy() for r in old]
    known = {(r.group, r.node, r.kind) for r in out if _open(r)}
    for p in plans:
        for group, f in sorted(p.faults.items()):
            if (group, f.node, f.kind) in known:
                continue
            out.append(
                FaultRecord(
                    time=rfc3339(now),
                    group=group,
                    role=p.role,
                    node=f.node,
                    kind=f.kind,
                    message=f.message[:300],
                    reaction="Replaced" if f.sudden else "Evacuated",
                )
            )
            known.add((group, f.node, f.kind))
    for i, r in enumerate(out):
        if not _open(r):
            continue
        update: dict[str, object] = {}
        if r.replacement is None:
            found = _replacement(plans, r.group, group_name, created)
            if found is not None:
                update["replacement"], update["domain"] = found
        replacement = str(update.get("replacement") or r.replacement or "") or None
        # Recovered: its replacement serves, or (none was needed, e.g. the role scaled down meanwhile) the
        # role has every group it wants serving and the group itself is gone or leaving.
        gone = not any(r.group in p.states and p.states[r.group] in ("serving", "starting") for p in plans)
        if _serving(plans, replacement) or (replacement is None and gone and _role_whole(plans, r.role)):
            started = parse(r.time)
            update["recovered"] = rfc3339(now)
            update["recovery_seconds"] = round(now - started, 1) if started is not None else None
        if update:
            out[i] = r.model_copy(update=update)
    return out[-KEEP:]


def condition(recs: Sequence[FaultRecord]) -> Condition:
    """HardwareFault: True while a faulted group's replacement does not serve yet."""
    active = [r for r in recs if _open(r)]
    if active:
        latest = active[-1]
        parts = []
        for r in active:
            where = (
                f"replaced by {r.replacement} in NVLink domain {r.domain}"
                if r.replacement
                else "no replacement placed yet"
            )
            verb = "lost" if r.reaction == "Replaced" else "moving"
            parts.append(f"group {r.group} {verb}: {r.message} ({r.kind}); {where}")
        return Condition(
            type="HardwareFault",
            status="True",
            reason=REASONS.get(latest.kind, "NodeFault"),
            message="; ".join(parts)[:900],
        )
    if recs:
        last = recs[-1]
        took = f" in {last.recovery_seconds:.0f} s" if last.recovery_seconds is not None else ""
        return Condition(
            type="HardwareFault",
            status="False",
            reason="Recovered",
            message=f"last fault: group {last.group}, {last.message} ({last.kind}); serving again{took}"
            + (f" with {last.replacement} in NVLink domain {last.domain}" if last.replacement else ""),
        )
    return Condition(type="HardwareFault", status="False", reason="NoFault", message="no hardware fault seen")
