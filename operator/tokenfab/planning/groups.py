"""The group planner: observed worker groups + desired counts + free capacity -> what to create, release and
delete (pure; time is a parameter).

Each group's state comes from `tokenfab.planning.lifecycle`. Then, per role:
  - broken groups are deleted and replaced;
  - a reserved group whose creation was interrupted is completed on the nodes assigned to it (if they
    still have room and its revision is current), else started over; a reserved group whose pods all
    exist is released to the scheduler (its scheduling gates lifted together);
  - missing groups are created at the current revision, each placed whole in one NVLink domain on the
    nodes best fit chooses there (the pods are pinned to those nodes, so what the ledger promised is what
    the scheduler binds);
  - surplus groups leave (not serving first, then the highest slot): drained first when they serve and
    drains are observed (see DrainPolicy), else deleted at once; a draining group needed again is taken
    back before any group is created;
  - a rollout (groups at another revision) brings up the new generation wherever capacity allows, and
    removes old groups once it can serve: all of them once the new groups all serve, else as many as new
    groups found no room (less the old groups already leaving); with no room for even one new group, one
    old group makes room while another serves; a lone old group stays, and the plan says why.
A group that fits nowhere is not created at all (no partial group); the plan reports the GPUs it needs
and the largest free block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tokenfab.api.models import RoleName
from tokenfab.planning.lifecycle import (
    ALIVE,
    UNHEALTHY_GRACE,
    GroupFault,
    GroupState,
    GroupView,
    NodeHealth,
    PodView,
    classify,
    group_fault,
    missing_ranks,
)
from tokenfab.planning.role_plan import Create, Delete, Drain, DrainPolicy, FaultReaction, RolePlan
from tokenfab.planning.topology import (
    COLD,
    PATHS,
    Domain,
    GroupShape,
    PlacementPolicy,
    best_fit_nodes,
    choose_domain,
    largest_block,
    take,
)
from tokenfab.planning.units import Member, Units

__all__ = [
    "Create",
    "Delete",
    "Drain",
    "DrainPolicy",
    "GroupState",
    "GroupView",
    "NodeHealth",
    "PodView",
    "RolePlan",
    "plan_role",
]


def _order_for_removal(groups: Sequence[GroupView], states: Mapping[str, GroupState]) -> list[GroupView]:
    """Groups not serving first, then those of the highest prefill-decode unit (so prefill and decode
    groups leave by whole units, as they came), then the highest slot."""
    return sorted(
        groups,
        key=lambda g: (states[g.name] == "serving", -(g.unit if g.unit is not None else g.slot), -g.slot),
    )


def _completion_nodes(
    g: GroupView, missing: list[int], domain: Domain | None, shape: GroupShape
) -> list[str] | None:
    """The nodes for a reserved group's missing ranks: those assigned to it when it was placed (recorded on
    its pods), if they still have room; else None (the group starts over)."""
    if domain is None:
        return None
    if len(g.nodes) == g.size:
        targets = [g.nodes[r] for r in missing]
        free = dict(domain.free)
        for node in targets:
            if free.get(node, 0) < shape.pod_gpus:
                return None
            free[node] -= shape.pod_gpus
        return targets
    # Placed before nodes were assigned: any fitting nodes of its domain not used by its other ranks.
    own = {p.pinned or p.node for p in g.pods}
    return best_fit_nodes(
        {n: f for n, f in domain.free.items() if n not in own}, len(missing), shape.pod_gpus
    )


@dataclass(frozen=True)
class Wanted:
    """What a role should run: `desired` groups of `shape` at `revision`."""

    role: RoleName
    desired: int
    revision: str
    shape: GroupShape


@dataclass(frozen=True)
class Placing:
    """Where a role's new groups may go: the free NVLink `domains`, the placement policy, the domains to
    stay out of (fault_report.avoided), how warm each node's model cache is (weights_cache), and the
    deployment's prefill-decode units to place them beside (planning.units)."""

    domains: dict[str, Domain]
    policy: PlacementPolicy = "pack"
    avoid: frozenset[str] = frozenset()
    warmth: Mapping[str, int] = field(default_factory=dict)
    units: Units | None = None


@dataclass(frozen=True)
class Leaving:
    """How a role's groups leave and are replaced: `hold_seconds` > 0 (the role's groups keep failing:
    planning.recovery; or a function of this pass's broken groups' reasons) creates no new group; groups
    go through `drain`; a rollout waits for the other roles (`other_roles_ready`); a `retired` role (left
    the spec) gives up a group at a time while the spec's new groups find no room (`others_short`)."""

    hold_seconds: float | Callable[[list[str]], float] = 0.0
    drain: DrainPolicy | None = None
    other_roles_ready: bool = True
    retired: bool = False
    others_short: bool = False


@dataclass(frozen=True)
class Judging:
    """How a plan classifies a group: its nodes' health, the clock, how long a node may be NotReady
    (`toleration`), how long a released group may take to bind, and how faults are answered."""

    nodes: Mapping[str, NodeHealth]
    now: float
    toleration: float
    bind_timeout: float = float("inf")
    reaction: FaultReaction = field(default_factory=FaultReaction)

    @property
    def grace(self) -> float:
        """How long a hung worker keeps its group (for ever the plain Kubernetes way)."""
        return float("inf") if self.reaction.mode == "none" else UNHEALTHY_GRACE

    def classify(self, g: GroupView) -> tuple[GroupState, str]:
        return classify(g, self.nodes, self.now, self.toleration, self.bind_timeout, self.grace)

    def fault(self, g: GroupView) -> GroupFault | None:
        return group_fault(g, self.nodes, self.now, self.toleration, self.grace)


@dataclass(frozen=True)
class _Generation:
    """Where the deployment's other roles stand in a rollout (see `plan_role`)."""

    other_roles_ready: bool
    retired: bool
    others_short: bool


@dataclass
class _Placer:
    """Creates groups of the plan's revision, each whole in one NVLink domain on the nodes best fit
    chooses there, keeping the room this plan takes out of `domains` and the slots it uses."""

    plan: RolePlan
    domains: dict[str, Domain]
    policy: PlacementPolicy
    used_slots: set[int]
    per_domain: dict[str, int]  # alive groups per domain (placement may spread them)
    avoid: frozenset[str] = frozenset()  # domains where this deployment's groups keep failing
    warmth: Mapping[str, int] = field(default_factory=dict)  # node -> its model cache's warmth
    units: Units | None = None  # the deployment's prefill-decode units (None: it has none)

    def choose(self, open_domains: Mapping[str, Domain], unit: int | None, replaces: str = "") -> str | None:
        """The domain for a new group: by its prefill-decode unit (planning.units), else the policy's."""
        shape, warm = self.plan.shape, self.warmth or None

        def pick(domains: Mapping[str, Domain]) -> str | None:
            return choose_domain(domains, shape, self.policy, self.per_domain, warm)

        if self.units is not None and unit is not None:
            return self.units.choose(self.plan.role, shape, unit, open_domains, pick, (replaces,))
        return pick(open_domains)

    def rejoin(self, group: str) -> bool:
        """The replacement of a group away from its unit's home, in the home only (`Units.rejoin_room`);
        nothing when the home has no room left."""
        if self.units is None or self.plan.backoff > 0:
            return False
        open_domains = {k: v for k, v in self.domains.items() if k not in self.avoid}
        if self.units.rejoin_room(group, self.plan.shape, open_domains) is None:
            return False
        return self.place("Rejoin", group)

    def place(self, reason: str, replaces: str = "") -> bool:
        plan, shape = self.plan, self.plan.shape
        if plan.backoff > 0:
            return False
        open_domains = {k: v for k, v in self.domains.items() if k not in self.avoid}
        slot = next(i for i in range(len(self.used_slots) + 1) if i not in self.used_slots)
        gone = [d.name for d in plan.delete]
        unit = self.units.new_member(plan.role, replaces, gone) if self.units is not None else None
        chosen, targets = self._fit(open_domains, unit, replaces)
        if chosen is None and len(open_domains) < len(self.domains):
            # Nowhere else: a domain where this deployment's groups failed before serves rather than
            # nothing (the backoff would leave the group waiting with room in the cluster).
            chosen, targets = self._fit(self.domains, unit, replaces)
        if chosen is None or targets is None:
            plan.unplaced = 1  # the caller counts the rest
            plan.largest_block = largest_block(self.domains, shape)
            return False
        self.used_slots.add(slot)
        self.domains = {**self.domains, chosen: take(self.domains[chosen], targets, shape.pod_gpus)}
        self.per_domain[chosen] = self.per_domain.get(chosen, 0) + 1
        path = PATHS[min(COLD, max(self.warmth.get(n, COLD) for n in targets))] if self.warmth else ""
        rdma = self.units is not None and unit is not None and self.units.rdma
        plan.create.append(
            Create(
                plan.role, slot, chosen, plan.revision, reason, tuple(targets), (), replaces, path, unit, rdma
            ),
        )
        if self.units is not None and unit is not None:
            self.units.add(unit, Member("", plan.role, chosen, slot, tuple(targets), rdma=rdma))
        return True

    def _fit(
        self, open_domains: Mapping[str, Domain], unit: int | None, replaces: str
    ) -> tuple[str | None, list[str] | None]:
        chosen = self.choose(open_domains, unit, replaces)
        if chosen is None:
            return None, None
        warm = self.warmth or None
        targets = best_fit_nodes(
            self.domains[chosen].free, self.plan.shape.nodes, self.plan.shape.pod_gpus, warm
        )
        return (chosen, targets) if targets is not None else (None, None)

    def place_up_to(self, count: int, reason: str, replacing: Sequence[str] = ()) -> None:
        """Up to `count` groups (the first ones replacing the groups `replacing` names); the plan counts
        those that found no room."""
        for placed in range(count):
            if not self.place(reason, replacing[placed] if placed < len(replacing) else ""):
                self.plan.unplaced = count - placed
                break


def plan_role(
    want: Wanted,
    groups: Sequence[GroupView],
    placing: Placing,
    judge: Judging,
    leaving: Leaving = Leaving(),
) -> tuple[RolePlan, dict[str, Domain]]:
    """Plan one role. Returns the plan and the domains with this plan's new pods taken out.

    While `leaving.hold_seconds` > 0 no new group is created (broken ones are deleted, interrupted ones
    done). Groups leave through `leaving.drain` (see DrainPolicy). A rollout brings up groups of the new
    revision (a generation) wherever capacity allows; once the generation is ready (every role of the
    deployment has a serving group of it) the old groups are drained: all of them when the new ones all
    serve, or as many as new groups could not be placed (making room, batch by batch).

    A retired role (left the spec) serves until every spec role has a serving group; while the spec's new
    groups find no room it gives up one group at a time while another still serves. New groups stay out
    of the avoided domains, on the warmest nodes, beside their prefill-decode unit (`placing`)."""
    role, desired, revision, shape = want.role, want.desired, want.revision, want.shape
    domains, policy = placing.domains, placing.policy
    hold_seconds = leaving.hold_seconds
    leave = leaving.drain or DrainPolicy()
    plan = RolePlan(role=role, desired=desired, revision=revision, shape=shape)
    alive, domains = _classify_groups(plan, groups, domains, judge)
    hold = hold_seconds(list(plan.broken_reasons.values())) if callable(hold_seconds) else hold_seconds
    plan.backoff = max(0.0, hold)
    slots = {g.slot for g in groups}
    placer = _Placer(
        plan, domains, policy, slots, _per_domain(alive), placing.avoid, placing.warmth, placing.units
    )
    counted = [g for g in alive if plan.states[g.name] != "draining"]
    _note_moving(plan, groups, alive, judge)
    _settle_draining(plan, alive, counted, judge, leave)
    _note_rejoining(plan, counted, placer, judge)
    moving = [g for g in counted if g.name in plan.faults or g.name in plan.rejoin]
    new = [
        g
        for g in counted
        if g.revision == revision and g.name not in plan.faults and g.name not in plan.rejoin
    ]
    old = [g for g in counted if g.revision != revision]
    plan.old_groups = len(old)
    going = _leaving(plan, groups, judge.nodes)
    if plan.backoff > 0 and len(new) + len(old) < desired:
        pass  # replacements wait for the backoff to run out
    elif not old:
        _scale(plan, placer, new, leave)
    else:
        generation = _Generation(leaving.other_roles_ready, leaving.retired, leaving.others_short)
        _rollout(plan, placer, new, old, going, leave, generation)
    _evacuate(plan, new, moving, leave)
    return plan, _drop_doomed(plan, groups, placer.domains)


def _classify_groups(
    plan: RolePlan, groups: Sequence[GroupView], domains: dict[str, Domain], judge: Judging
) -> tuple[list[GroupView], dict[str, Domain]]:
    """Each group's state: broken groups are deleted, reserved ones completed or released, and the groups
    still alive are returned with the domains less the room their completion takes."""
    alive: list[GroupView] = []
    for g in sorted(groups, key=lambda g: g.slot):  # (completions compete for room: a fixed order)
        state, why = judge.classify(g)
        plan.states[g.name] = state
        if state == "broken":
            plan.broken_reasons[g.name] = why
            fault = judge.fault(g)
            if fault is not None and fault.sudden:
                plan.faults[g.name] = fault
                since = judge.reaction.seen.get(g.name, judge.now)
                if judge.reaction.mode == "gang-delete" and judge.now - since < judge.reaction.delay:
                    plan.held += 1  # (deleted whole once the delay is over)
                    continue
            plan.delete.append(Delete(plan.role, g.name, "Broken"))
            continue
        if state not in ALIVE:
            continue
        if state == "reserved":
            completed = _reserved(plan, g, domains)
            if completed is None:
                continue
            domains = completed
        else:
            _note_binding(plan, g, why)
        alive.append(g)
        stuck = [p for p in sorted(g.pods, key=lambda p: p.rank) if p.waiting and not p.ready]
        if state == "starting" and stuck:
            plan.waiting[g.name] = f"pod {stuck[0].name}: {stuck[0].waiting}"
    return alive, domains


def _reserved(plan: RolePlan, g: GroupView, domains: dict[str, Domain]) -> dict[str, Domain] | None:
    """A reserved group whose pods all exist is released to the scheduler. One whose creation was
    interrupted is finished on the nodes it was given, if they still have room and its revision is
    current (the domains less that room are returned); otherwise it is deleted to start over (None)."""
    missing = missing_ranks(g)
    if not missing:
        plan.release.append(g.name)
        plan.unbound[g.name] = "released to the scheduler"
        return domains
    shape = plan.shape
    targets = (
        _completion_nodes(g, missing, domains.get(g.domain), shape) if g.revision == plan.revision else None
    )
    if targets is None:
        plan.states[g.name] = "broken"
        plan.broken_reasons[g.name] = "could not be completed where it was started"
        plan.delete.append(Delete(plan.role, g.name, "Broken"))
        return None
    plan.create.append(
        Create(
            plan.role,
            g.slot,
            g.domain,
            g.revision,
            "Complete",
            tuple(targets),
            tuple(missing),
            unit=g.unit,
            rdma=g.rdma,
        )
    )
    plan.unbound[g.name] = f"creating ranks {missing}"
    return {**domains, g.domain: take(domains[g.domain], targets, shape.pod_gpus)}


def _note_binding(plan: RolePlan, g: GroupView, why: str) -> None:
    """Why an alive group is not fully bound yet, if it is not."""
    if any(p.claims_pending for p in g.pods):
        pending = next(p.name for p in sorted(g.pods, key=lambda p: p.rank) if p.claims_pending)
        plan.unbound[g.name] = f"waiting for the resource claims of its pods (pod {pending})"
    elif any(p.node is None for p in g.pods):
        plan.unbound[g.name] = why or "waiting for the scheduler to bind its pods"


def _per_domain(alive: Sequence[GroupView]) -> dict[str, int]:
    per_domain: dict[str, int] = {}
    for g in alive:
        per_domain[g.domain] = per_domain.get(g.domain, 0) + 1
    return per_domain


def _settle_draining(
    plan: RolePlan, alive: Sequence[GroupView], counted: list[GroupView], judge: Judging, leave: DrainPolicy
) -> None:
    """Groups already draining: back into routing if needed again (they count again: `counted`), else
    gone once idle or out of time."""
    states = plan.states
    current = [g for g in counted if g.revision == plan.revision and g.name not in plan.faults]
    for g in sorted((g for g in alive if states[g.name] == "draining"), key=lambda g: g.slot):
        since = judge.now - (g.draining_since or judge.now)
        if g.revision == plan.revision and g.name not in plan.faults and len(current) < plan.desired:
            plan.undrain.append(g.name)
            # (serving, or starting if a pod stopped being ready while it drained)
            states[g.name] = judge.classify(replace(g, draining_since=None))[0]
            counted.append(g)
            current.append(g)
            continue
        plan.draining[g.name] = since
        plan.drain_started[g.name] = judge.now - since
        inflight = None if leave.inflight is None else leave.inflight.get(g.name)
        if not leave.observed:
            plan.delete.append(Delete(plan.role, g.name, "Drained", inflight, since))
        elif inflight == 0 and since >= leave.settle:
            plan.delete.append(Delete(plan.role, g.name, "Drained", 0, since))
        elif since >= leave.seconds:
            plan.delete.append(Delete(plan.role, g.name, "DrainTimedOut", inflight, since))


def _leaving(plan: RolePlan, groups: Sequence[GroupView], nodes: Mapping[str, NodeHealth]) -> int:
    """Old groups already on their way out (draining, or their pods terminating): the room they hold comes
    back (unless a pod of theirs sits on a node that is gone or not ready)."""
    states = plan.states
    return sum(
        1
        for g in groups
        if g.revision != plan.revision
        and (g.name in plan.draining or states[g.name] in ("deleting", "broken"))
        and all(nodes.get(p.node, NodeHealth(False)).ready for p in g.pods if p.node is not None)
    )


def _remove(plan: RolePlan, g: GroupView, reason: str, leave: DrainPolicy) -> None:
    """A serving group drains first (when drains are observed); any other goes at once."""
    if plan.states[g.name] == "serving" and leave.observed:
        known = leave.inflight.get(g.name) if leave.inflight is not None else None
        plan.drain.append(Drain(plan.role, g.name, reason, known))
        plan.states[g.name] = "draining"
    else:
        plan.delete.append(Delete(plan.role, g.name, reason))


def _replacing(plan: RolePlan) -> tuple[str, list[str]]:
    """The reason of this pass's new groups, and the faulted groups they replace (lost ones first)."""
    lost = [n for n, f in sorted(plan.faults.items()) if f.sudden]
    moving = [n for n, f in sorted(plan.faults.items()) if not f.sudden and plan.states.get(n) != "draining"]
    if any(d.reason == "Broken" for d in plan.delete):
        return "Replace", lost + moving
    if not moving and plan.rejoin:
        return "Rejoin", list(plan.rejoin)
    return ("Evacuate" if moving else "Missing"), moving


def _scale(plan: RolePlan, placer: _Placer, new: Sequence[GroupView], leave: DrainPolicy) -> None:
    """No rollout: missing groups are created (replacements when groups broke or stand on a faulted
    node), surplus ones leave."""
    if len(new) + plan.held < plan.desired:
        reason, replacing = _replacing(plan)
        if reason == "Rejoin":  # (one group, exactly: `_note_rejoining`)
            placer.rejoin(replacing[0])
        else:
            placer.place_up_to(plan.desired - len(new) - plan.held, reason, replacing)
    elif len(new) > plan.desired:
        for g in _order_for_removal(new, plan.states)[: len(new) - plan.desired]:
            _remove(plan, g, "Surplus", leave)


def _note_moving(
    plan: RolePlan, groups: Sequence[GroupView], alive: Sequence[GroupView], judge: Judging
) -> None:
    """The alive groups of the current revision standing on a node with an announced fault: they move
    (answering faults the plain Kubernetes way, nothing moves, and a broken group's replacement waits
    until its pods are gone)."""
    if judge.reaction.mode == "none":
        plan.held = sum(1 for g in groups if plan.states[g.name] in ("broken", "deleting"))
    if judge.reaction.mode != "replace":
        return
    for g in alive:
        if g.revision != plan.revision:
            continue  # (a rollout replaces it anyway)
        fault = judge.fault(g)
        if fault is not None and not fault.sudden:
            plan.faults[g.name] = fault


def _note_rejoining(plan: RolePlan, counted: Sequence[GroupView], placer: _Placer, judge: Judging) -> None:
    """A group of a prefill-decode unit away from the NVLink domain holding most of the unit's GPUs moves
    there, drain-first like an evacuation: once the home has room for it (its replacement is then made
    there), and while that replacement comes up (the role holds one group more than it wants). One
    group at a time, only while the role is otherwise steady: every group serving, of the current
    revision, none faulted, no backoff, and tokenfab answering faults (not a benchmark's baseline)."""
    units = placer.units
    if units is None or judge.reaction.mode != "replace" or plan.faults or plan.backoff > 0:
        return
    current = [g for g in counted if g.revision == plan.revision]
    if len(current) != len(counted) or len(current) < plan.desired:
        return
    made = len(current) > plan.desired  # a replacement exists: the away group leaves once it serves
    if not made and any(plan.states[g.name] != "serving" for g in counted):
        return
    for g in sorted(current, key=lambda g: g.slot):
        unit = units.unit_of_group(g.name)
        home = units.home(unit) if unit is not None and g.unit is not None else None
        if home is None or home == g.domain or plan.states[g.name] != "serving":
            continue
        if made or units.rejoin_room(g.name, plan.shape, placer.domains) is not None:
            plan.rejoin.append(g.name)
            return


def _evacuate(
    plan: RolePlan, new: Sequence[GroupView], moving: Sequence[GroupView], leave: DrainPolicy
) -> None:
    """Groups on a faulted node leave once their replacements serve: a serving one for each group serving
    beyond what the role needs without it (drained first), one that does not serve at once. With no room
    for a replacement, a serving group stays where it is until its node is lost."""
    removed = {d.name for d in plan.delete} | {d.name for d in plan.drain}
    states = plan.states
    serving_new = sum(1 for g in new if g.name not in removed and states[g.name] == "serving")
    serving_moving = sum(1 for g in moving if states[g.name] == "serving")
    spare = max(0, serving_new + serving_moving - plan.desired)
    for g in _order_for_removal(moving, states):
        if g.name in removed:
            continue
        why = "Rejoin" if g.name in plan.rejoin else "Evacuate"
        if states[g.name] != "serving":
            _remove(plan, g, why, leave)
        elif spare > 0:
            spare -= 1
            _remove(plan, g, why, leave)


def _rollout(
    plan: RolePlan,
    placer: _Placer,
    new: Sequence[GroupView],
    old: Sequence[GroupView],
    leaving: int,
    leave: DrainPolicy,
    gen: _Generation,
) -> None:
    """A rollout: the new generation comes up where capacity allows, the old one drains once the new
    one can serve (every role has a serving group of it)."""
    short = plan.desired - len(new) - plan.held
    if short > 0 and plan.backoff <= 0:
        placer.place_up_to(short, "Surge")
    elif short < 0:
        for g in _order_for_removal(new, plan.states)[:-short]:
            _remove(plan, g, "Surplus", leave)
    # The new generation is whole once the groups it keeps all serve (a surplus group leaving by this
    # plan does not hold the old one back for another pass).
    removed = {d.name for d in plan.delete} | {d.name for d in plan.drain}
    new_all_ready = all(plan.states[g.name] == "serving" for g in new if g.name not in removed)
    _retire_old(plan, placer.domains, new, old, new_all_ready, leaving, leave, gen)


def _retire_old(
    plan: RolePlan,
    domains: dict[str, Domain],
    new: Sequence[GroupView],
    old: Sequence[GroupView],
    new_all_ready: bool,
    leaving: int,
    leave: DrainPolicy,
    gen: _Generation,
) -> None:
    """Which old groups leave: all once the new generation serves whole, else as many as new groups found
    no room, else one to make room while another old one serves; a lone old group stays."""
    states = plan.states
    serving_new = [g for g in new if states[g.name] == "serving"]
    generation_ready = bool(serving_new) and gen.other_roles_ready
    serving_old = [g for g in old if states[g.name] == "serving"]
    if gen.retired and not gen.other_roles_ready:
        if gen.others_short and not leaving and len(serving_old) > 1:
            _remove(plan, _order_for_removal(old, states)[0], "Rollout", leave)
    elif plan.desired == 0 or (generation_ready and len(new) >= plan.desired and new_all_ready):
        for g in _order_for_removal(old, states):
            _remove(plan, g, "Rollout", leave)
    elif generation_ready and plan.unplaced > leaving:
        for g in _order_for_removal(old, states)[: plan.unplaced - leaving]:
            _remove(plan, g, "Rollout", leave)  # room for the next new groups, batch by batch
    elif plan.unplaced and not new and not any(cr.reason == "Surge" for cr in plan.create):
        # No room for even one group of the new generation: make room with one old group, as long
        # as the old generation keeps one serving; a lone old group stays, and the rollout waits.
        if len(serving_old) > 1 and not leaving:
            _remove(plan, _order_for_removal(old, states)[0], "Rollout", leave)
        elif not leaving:
            plan.rollout_blocked = True
            plan.largest_block = largest_block(domains, plan.shape)


def _drop_doomed(
    plan: RolePlan, groups: Sequence[GroupView], domains: dict[str, Domain]
) -> dict[str, Domain]:
    """A group deleted by this plan is neither completed (its room is given back) nor released."""
    doomed = {d.name for d in plan.delete}
    doomed_slots = {g.slot for g in groups if g.name in doomed}
    for cr in plan.create:
        if cr.reason == "Complete" and cr.slot in doomed_slots:  # give its room back
            d = domains[cr.domain]
            free = {n: f + plan.shape.pod_gpus * cr.nodes.count(n) for n, f in d.free.items()}
            domains = {**domains, cr.domain: replace(d, free=free)}
    plan.create = [cr for cr in plan.create if not (cr.reason == "Complete" and cr.slot in doomed_slots)]
    plan.release = [name for name in plan.release if name not in doomed]
    for name in doomed:
        plan.unbound.pop(name, None)
    return domains
