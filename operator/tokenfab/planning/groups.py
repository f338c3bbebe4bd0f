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
    GroupState,
    GroupView,
    NodeHealth,
    PodView,
    classify,
    missing_ranks,
)
from tokenfab.planning.topology import (
    Domain,
    GroupShape,
    PlacementPolicy,
    best_fit_nodes,
    choose_domain,
    largest_block,
    take,
)

__all__ = ["Create", "Delete", "GroupState", "GroupView", "NodeHealth", "PodView", "RolePlan", "plan_role"]


@dataclass(frozen=True)
class Create:
    role: RoleName
    slot: int
    domain: str
    revision: str
    reason: str  # Missing | Replace | Surge | Complete
    nodes: tuple[str, ...] = ()  # the node of each created rank, in rank order
    ranks: tuple[int, ...] = ()  # the ranks to create (empty: all of them)


@dataclass(frozen=True)
class Delete:
    role: RoleName
    name: str
    reason: str  # Broken | Surplus | Rollout | Drained | DrainTimedOut
    inflight: float | None = None  # requests still in flight when it goes (drains only)
    drained_for: float | None = None  # seconds its drain took


@dataclass(frozen=True)
class Drain:
    role: RoleName
    name: str
    reason: str  # Surplus | Rollout
    inflight: float | None = None  # requests in flight when its drain starts, if known


@dataclass(frozen=True)
class DrainPolicy:
    """How groups leave. seconds 0: deleted at once. inflight None: no metrics (the deployment names no
    Prometheus), so a group is deleted at once too and its engine drains on SIGTERM within the pods' grace
    period. Otherwise a serving group is first taken out of routing and deleted once `inflight` says it
    is idle (after `settle` seconds, so the samples postdate its leaving routing) or after `seconds`."""

    seconds: float = 0.0
    inflight: Mapping[str, float] | None = None  # group -> requests in flight (missing: unknown)
    settle: float = 6.0

    @property
    def observed(self) -> bool:
        return self.seconds > 0 and self.inflight is not None


@dataclass
class RolePlan:
    role: RoleName
    desired: int
    revision: str
    shape: GroupShape
    states: dict[str, GroupState] = field(default_factory=dict)
    create: list[Create] = field(default_factory=list)
    delete: list[Delete] = field(default_factory=list)
    release: list[str] = field(default_factory=list)  # reserved groups whose pods all exist: ungate them
    unplaced: int = 0
    largest_block: tuple[int, str | None] = (0, None)
    rollout_blocked: bool = False
    old_groups: int = 0  # alive groups at an older revision (a rollout is under way)
    blocked: str = ""  # why new groups of this role cannot be created at all (set by the caller)
    broken_reasons: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)  # starting group -> why its first stuck pod waits
    unbound: dict[str, str] = field(default_factory=dict)  # alive group not fully bound yet -> why
    refused: dict[str, str] = field(
        default_factory=dict
    )  # group whose creation the API server refused -> why
    backoff: float = 0.0  # seconds until a new group may be created (the role's groups keep failing)
    drain: list[Drain] = field(default_factory=list)  # serving groups to take out of routing now
    undrain: list[str] = field(default_factory=list)  # draining groups needed again: back into routing
    draining: dict[str, float] = field(default_factory=dict)  # group -> seconds it has been draining

    @property
    def ready(self) -> int:
        """Groups serving (every pod Running and Ready)."""
        return sum(1 for s in self.states.values() if s == "serving")


def _order_for_removal(groups: Sequence[GroupView], states: Mapping[str, GroupState]) -> list[GroupView]:
    """Groups not serving first, then the highest slot."""
    return sorted(groups, key=lambda g: (states[g.name] == "serving", -g.slot))


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


def plan_role(
    role: RoleName,
    desired: int,
    revision: str,
    shape: GroupShape,
    groups: Sequence[GroupView],
    domains: dict[str, Domain],
    policy: PlacementPolicy,
    nodes: Mapping[str, NodeHealth],
    now: float,
    toleration: float,
    bind_timeout: float = float("inf"),
    hold_seconds: float | Callable[[list[str]], float] = 0.0,
    drain: DrainPolicy | None = None,
    other_roles_ready: bool = True,
    retired: bool = False,
    others_short: bool = False,
) -> tuple[RolePlan, dict[str, Domain]]:
    """Plan one role. Returns the plan and the domains with this plan's new pods taken out.

    `hold_seconds` > 0 (the role's groups keep failing: see tokenfab.planning.recovery) creates no new
    group in this pass; broken groups are still deleted, and interrupted ones still completed. It may be
    a function of the reasons of the groups this pass finds broken (so this pass's failures count).

    Groups leave through `drain` (see DrainPolicy). A rollout brings up groups of the new revision (a
    generation) wherever capacity allows; once the generation is ready (every role of the deployment has
    a serving group of it) the old groups are drained: all of them when the new ones all serve, or as
    many as new groups could not be placed (making room, batch by batch). `other_roles_ready` says whether
    the deployment's other roles have a serving group of the new generation.

    A `retired` role (it left the spec: serving.mode changed) keeps its groups serving until every role
    of the spec has a serving group (`other_roles_ready`); while the spec's new groups find no room
    (`others_short`) it gives up one group at a time, as long as another of its groups still serves."""
    policy_drain = drain or DrainPolicy()
    plan = RolePlan(role=role, desired=desired, revision=revision, shape=shape)
    alive: list[GroupView] = []
    for g in sorted(groups, key=lambda g: g.slot):  # (completions compete for room: a fixed order)
        state, why = classify(g, nodes, now, toleration, bind_timeout)
        plan.states[g.name] = state
        if state == "broken":
            plan.broken_reasons[g.name] = why
            plan.delete.append(Delete(role, g.name, "Broken"))
            continue
        if state not in ALIVE:
            continue
        missing = missing_ranks(g)
        if state == "reserved" and missing:
            # Finish a group the operator started before it stopped, on the nodes it was given, if they
            # still have room and its revision is current; otherwise start it over.
            targets = (
                _completion_nodes(g, missing, domains.get(g.domain), shape)
                if g.revision == revision
                else None
            )
            if targets is None:
                plan.states[g.name] = "broken"
                plan.broken_reasons[g.name] = "could not be completed where it was started"
                plan.delete.append(Delete(role, g.name, "Broken"))
                continue
            domains = {**domains, g.domain: take(domains[g.domain], targets, shape.pod_gpus)}
            plan.create.append(
                Create(role, g.slot, g.domain, g.revision, "Complete", tuple(targets), tuple(missing))
            )
            plan.unbound[g.name] = f"creating ranks {missing}"
        elif state == "reserved":
            plan.release.append(g.name)
            plan.unbound[g.name] = "released to the scheduler"
        elif any(p.claims_pending for p in g.pods):
            pending = next(p.name for p in sorted(g.pods, key=lambda p: p.rank) if p.claims_pending)
            plan.unbound[g.name] = f"waiting for the resource claims of its pods (pod {pending})"
        elif any(p.node is None for p in g.pods):
            plan.unbound[g.name] = why or "waiting for the scheduler to bind its pods"
        alive.append(g)
        stuck = [p for p in sorted(g.pods, key=lambda p: p.rank) if p.waiting and not p.ready]
        if state == "starting" and stuck:
            plan.waiting[g.name] = f"pod {stuck[0].name}: {stuck[0].waiting}"
    hold = hold_seconds(list(plan.broken_reasons.values())) if callable(hold_seconds) else hold_seconds
    plan.backoff = max(0.0, hold)
    used_slots = {g.slot for g in groups}
    per_domain: dict[str, int] = {}
    for g in alive:
        per_domain[g.domain] = per_domain.get(g.domain, 0) + 1

    def place(reason: str) -> bool:
        nonlocal domains
        if plan.backoff > 0:
            return False
        chosen = choose_domain(domains, shape, policy, per_domain)
        targets = (
            None if chosen is None else best_fit_nodes(domains[chosen].free, shape.nodes, shape.pod_gpus)
        )
        if chosen is None or targets is None:
            plan.unplaced = 1  # the caller counts the rest
            plan.largest_block = largest_block(domains, shape)
            return False
        slot = next(i for i in range(len(used_slots) + 1) if i not in used_slots)
        used_slots.add(slot)
        domains = {**domains, chosen: take(domains[chosen], targets, shape.pod_gpus)}
        per_domain[chosen] = per_domain.get(chosen, 0) + 1
        plan.create.append(Create(role, slot, chosen, revision, reason, tuple(targets)))
        return True

    states = plan.states
    counted = [g for g in alive if states[g.name] != "draining"]
    current = [g for g in counted if g.revision == revision]

    # Groups already draining: back into routing if needed again, else gone once idle or out of time.
    for g in sorted((g for g in alive if states[g.name] == "draining"), key=lambda g: g.slot):
        since = now - (g.draining_since or now)
        if g.revision == revision and len(current) < desired:
            plan.undrain.append(g.name)
            # (serving, or starting if a pod stopped being ready while it drained)
            back = replace(g, draining_since=None)
            states[g.name] = classify(back, nodes, now, toleration, bind_timeout)[0]
            counted.append(g)
            current.append(g)
            continue
        plan.draining[g.name] = since
        inflight = None if policy_drain.inflight is None else policy_drain.inflight.get(g.name)
        if not policy_drain.observed:
            plan.delete.append(Delete(role, g.name, "Drained", inflight, since))
        elif inflight == 0 and since >= policy_drain.settle:
            plan.delete.append(Delete(role, g.name, "Drained", 0, since))
        elif since >= policy_drain.seconds:
            plan.delete.append(Delete(role, g.name, "DrainTimedOut", inflight, since))

    def remove(g: GroupView, reason: str) -> None:
        """A serving group drains first (when drains are observed); any other goes at once."""
        if states[g.name] == "serving" and policy_drain.observed:
            known = policy_drain.inflight.get(g.name) if policy_drain.inflight is not None else None
            plan.drain.append(Drain(role, g.name, reason, known))
            states[g.name] = "draining"
        else:
            plan.delete.append(Delete(role, g.name, reason))

    new = [g for g in counted if g.revision == revision]
    old = [g for g in counted if g.revision != revision]
    plan.old_groups = len(old)
    new_all_ready = all(states[g.name] == "serving" for g in new)
    # Old groups already on their way out (draining, or their pods terminating): the room they hold comes
    # back (unless a pod of theirs sits on a node that is gone or not ready).
    leaving = sum(
        1
        for g in groups
        if g.revision != revision
        and (g.name in plan.draining or states[g.name] in ("deleting", "broken"))
        and all(nodes.get(p.node, NodeHealth(False)).ready for p in g.pods if p.node is not None)
    )

    if plan.backoff > 0 and len(new) + len(old) < desired:
        pass  # replacements wait for the backoff to run out
    elif not old:
        if len(new) < desired:
            reason = "Replace" if any(d.reason == "Broken" for d in plan.delete) else "Missing"
            for placed in range(desired - len(new)):
                if not place(reason):
                    plan.unplaced = desired - len(new) - placed
                    break
        elif len(new) > desired:
            for g in _order_for_removal(new, states)[: len(new) - desired]:
                remove(g, "Surplus")
    else:
        # A rollout: the new generation comes up where capacity allows, the old one drains once the new
        # one can serve (every role has a serving group of it).
        short = desired - len(new)
        if short > 0 and plan.backoff <= 0:
            for placed in range(short):
                if not place("Surge"):
                    plan.unplaced = short - placed
                    break
        elif short < 0:
            for g in _order_for_removal(new, states)[:-short]:
                remove(g, "Surplus")
        serving_new = [g for g in new if states[g.name] == "serving"]
        generation_ready = bool(serving_new) and other_roles_ready
        if retired and not other_roles_ready:
            serving_old = [g for g in old if states[g.name] == "serving"]
            if others_short and not leaving and len(serving_old) > 1:
                remove(_order_for_removal(old, states)[0], "Rollout")
        elif desired == 0 or (generation_ready and len(new) >= desired and new_all_ready):
            for g in _order_for_removal(old, states):
                remove(g, "Rollout")
        elif generation_ready and plan.unplaced > leaving:
            for g in _order_for_removal(old, states)[: plan.unplaced - leaving]:
                remove(g, "Rollout")  # room for the next new groups, batch by batch
        elif plan.unplaced and not new and not any(cr.reason == "Surge" for cr in plan.create):
            # No room for even one group of the new generation: make room with one old group, as long
            # as the old generation keeps one serving; a lone old group stays, and the rollout waits.
            serving_old = [g for g in old if states[g.name] == "serving"]
            if len(serving_old) > 1 and not leaving:
                remove(_order_for_removal(old, states)[0], "Rollout")
            elif not leaving:
                plan.rollout_blocked = True
                plan.largest_block = largest_block(domains, shape)
    # A group deleted by this plan is neither completed nor released.
    doomed = {d.name for d in plan.delete}
    doomed_slots = {g.slot for g in groups if g.name in doomed}
    for cr in plan.create:
        if cr.reason == "Complete" and cr.slot in doomed_slots:  # give its room back
            d = domains[cr.domain]
            free = {n: f + shape.pod_gpus * cr.nodes.count(n) for n, f in d.free.items()}
            domains = {**domains, cr.domain: replace(d, free=free)}
    plan.create = [cr for cr in plan.create if not (cr.reason == "Complete" and cr.slot in doomed_slots)]
    plan.release = [name for name in plan.release if name not in doomed]
    for name in doomed:
        plan.unbound.pop(name, None)
    return plan, domains
