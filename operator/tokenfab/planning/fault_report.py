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

from collections.abc import Callable, Mapping, Sequence

from tokenfab.api.models import Condition, FaultRecord
from tokenfab.planning.faults import flapping
from tokenfab.planning.groups import Create, RolePlan
from tokenfab.planning.status import parse_rfc3339 as parse
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
    "ComputeDomainNotReady": "ComputeDomainNotReady",
    "WorkerUnhealthy": "WorkerUnhealthy",
}


def _open(r: FaultRecord) -> bool:
    return r.recovered is None


def _made(
    plans: Sequence[RolePlan], name: Callable[[str, int], str], created: frozenset[str]
) -> list[tuple[Create, str]]:
    """This pass's new groups that were created whole, with their names."""
    return [
        (cr, name(cr.role, cr.slot))
        for p in plans
        for cr in p.create
        if cr.reason != "Complete" and name(cr.role, cr.slot) in created
    ]


def _match(out: list[FaultRecord], made: list[tuple[Create, str]], alive: set[str], lost: set[str]) -> None:
    """Name each open record's replacement: the new group made for it, else (a lost group's replacement
    may be written a pass later, once its IMEX channel template exists) a new group of its role that no
    other record claims. A replacement that is gone again (never written, or removed) is forgotten."""
    # (only open records claim: a recovered one's replacement name may be a new group's again, its slot
    # reused after that group left)
    claimed = {r.replacement for r in out if _open(r) and r.replacement and r.replacement in alive}
    for exact in (True, False):
        for i, r in enumerate(out):
            if not _open(r) or (r.replacement and r.replacement in alive):
                continue
            for cr, group in made:
                fits = (
                    cr.replaces == r.group
                    if exact
                    else r.reaction == "Replaced"
                    and cr.role == r.role
                    and cr.reason in ("Replace", "Missing")
                )
                if fits and group not in claimed:
                    out[i] = r.model_copy(update={"replacement": group, "domain": cr.domain})
                    claimed.add(group)
                    break
            else:
                if r.replacement and r.replacement not in alive and r.replacement not in lost:
                    out[i] = r.model_copy(update={"replacement": None, "domain": None})
    _follow(out, lost)


def _follow(out: list[FaultRecord], lost: set[str]) -> None:
    """A replacement lost in turn (a rack seen going node by node, the first replacement on a node that
    goes next) hands its own replacement on: the first record names the group that replaced it last, and
    recovers when that one serves. Until that group is known the record keeps the lost one's name."""
    by_group = {r.group: r for r in out if _open(r)}
    for i, r in enumerate(out):
        if not _open(r):
            continue
        seen = {r.group}
        nxt = by_group.get(r.replacement or "")
        while (
            _open(r)
            and nxt is not None
            and r.replacement in lost
            and nxt.replacement
            and nxt.group not in seen
        ):
            seen.add(nxt.group)
            r = r.model_copy(update={"replacement": nxt.replacement, "domain": nxt.domain})
            out[i] = r
            nxt = by_group.get(nxt.replacement)


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
    known = {r.group for r in out if _open(r)}  # (one open record per group)
    for p in plans:
        for group, f in sorted(p.faults.items()):
            if group in known:
                continue
            out.append(
                FaultRecord(
                    time=rfc3339(now),
                    group=group,
                    role=p.role,
                    node=f.node,
                    faulted_domain=f.domain or None,
                    kind=f.kind,
                    message=f.message[:300],
                    reaction="Replaced" if f.sudden else "Evacuated",
                )
            )
            known.add(group)
    made = _made(plans, group_name, created)
    alive = {g for p in plans for g, st in p.states.items() if st not in ("broken", "deleting")}
    faulted = {g for p in plans for g in p.faults}
    alive |= {group for _, group in made}
    lost = faulted | {r.group for r in out if _open(r) and r.group not in alive}  # (deleted by now)
    _match(out, made, alive, lost)
    for i, r in enumerate(out):
        if not _open(r):
            continue
        # Recovered: its replacement serves; or, with none known (the role scaled down meanwhile, or the
        # fault healed), the role has every group it wants serving and none of them is faulted.
        if _serving(plans, r.replacement) or (
            r.replacement is None and r.group not in faulted and _role_whole(plans, r.role)
        ):
            started = parse(r.time)
            out[i] = r.model_copy(
                update={
                    "recovered": rfc3339(now),
                    "recovery_seconds": round(now - started, 1) if started is not None else None,
                }
            )
    return out[-KEEP:]


# Fault records of one domain this close together are one fault: a rack lost at once records each of the
# deployment's groups there, and that is one event, not a domain that keeps failing.
ONE_EVENT_SECONDS = 30.0


def distinct(times: Sequence[float]) -> list[float]:
    """The onsets of distinct faults: a record within ONE_EVENT_SECONDS of the onset before it is part of
    that fault."""
    out: list[float] = []
    for t in sorted(times):
        if not out or t - out[-1] > ONE_EVENT_SECONDS:
            out.append(t)
    return out


def avoided(recs: Sequence[FaultRecord], now: float) -> dict[str, str]:
    """The NVLink domains where the deployment's groups keep failing, while their backoff runs: domain ->
    why. A group that faults again in the domain it was lost in moves: the second fault there within
    FLAP_WINDOW keeps new groups out for FLAP_BASE seconds, each further one twice as long (as a flapping
    node, tokenfab.planning.faults). A cordon (maintenance) does not count."""
    onsets: dict[str, list[float]] = {}
    for r in recs:
        t = parse(r.time)
        if r.faulted_domain and t is not None and r.kind != "Cordoned":
            onsets.setdefault(r.faulted_domain, []).append(t)
    out = {}
    for domain, times in sorted(onsets.items()):
        f = flapping(distinct(times), now)
        if f is not None:
            out[domain] = f"this deployment's groups {f.message}"
    return out


def condition(recs: Sequence[FaultRecord], avoiding: Mapping[str, str] | None = None) -> Condition:
    """HardwareFault: True while a faulted group's replacement does not serve yet (its message names the
    domains new groups avoid)."""
    active = [r for r in recs if _open(r)]
    avoid = "".join(f"; NVLink domain {d} avoided: {why}" for d, why in sorted((avoiding or {}).items()))
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
            message=("; ".join(parts) + avoid)[:900],
        )
    if recs:
        last = recs[-1]
        took = f" in {last.recovery_seconds:.0f} s" if last.recovery_seconds is not None else ""
        return Condition(
            type="HardwareFault",
            status="False",
            reason="Recovered",
            message=f"last fault: group {last.group}, {last.message} ({last.kind}); serving again{took}"
            + (f" with {last.replacement} in NVLink domain {last.domain}" if last.replacement else "")
            + avoid,
        )
    return Condition(type="HardwareFault", status="False", reason="NoFault", message="no hardware fault seen")
