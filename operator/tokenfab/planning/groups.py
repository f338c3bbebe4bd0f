"""The group planner: observed worker groups + desired counts + free capacity -> what to create and delete
(pure; time is a parameter).

A group is classified from its pods: ready, starting, incomplete (the operator stopped while creating it:
finish it), broken (a pod failed, was deleted, or lost its node: recreate the whole group, elsewhere if
need be) or terminating. Then, per role:
  - broken groups are deleted and replaced;
  - missing groups are created at the current revision, each placed whole in one NVLink domain;
  - surplus groups are deleted (older revision, not ready, highest slot first);
  - a rollout (groups at an older revision) replaces one group at a time: surge one new group where
    capacity allows, else delete one old group when the others are ready; with one group and no room,
    the old group stays and the plan says why.
A group that fits nowhere is not created at all (no partial group); the plan reports the GPUs it needs
and the largest free block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tokenfab.api.models import RoleName
from tokenfab.planning.topology import (
    Domain,
    GroupShape,
    PlacementPolicy,
    choose_domain,
    fits,
    largest_block,
    reserve,
)

GroupState = Literal["ready", "starting", "incomplete", "broken", "terminating"]


@dataclass(frozen=True)
class PodView:
    """What the planner needs to know about one worker pod."""

    name: str
    rank: int
    phase: str
    ready: bool
    node: str | None
    deleting: bool
    ready_since: float | None = None  # unix time the pod last became Ready
    waiting: str = ""  # why it is not running yet (the scheduler's or the kubelet's words), if known


@dataclass(frozen=True)
class NodeHealth:
    ready: bool
    not_ready_since: float | None = None  # unix time the node stopped being Ready


@dataclass(frozen=True)
class GroupView:
    """One observed group of a role."""

    name: str
    role: RoleName
    slot: int
    revision: str
    domain: str
    size: int  # pods the group should have
    gpus: int
    pods: tuple[PodView, ...]
    recorded: bool  # listed in status.placement: its creation had completed


def classify(
    group: GroupView, nodes: Mapping[str, NodeHealth], now: float, toleration: float
) -> tuple[GroupState, str]:
    """The group's state and, when broken, why."""
    if group.pods and all(p.deleting for p in group.pods):
        return "terminating", "being deleted"
    for p in sorted(group.pods, key=lambda p: p.rank):
        if p.deleting:
            return "broken", f"pod {p.name} is being deleted"
        if p.phase in ("Failed", "Succeeded"):
            return "broken", f"pod {p.name} {p.phase.lower()}"
        if p.node is not None:
            health = nodes.get(p.node)
            if health is None:
                return "broken", f"node {p.node} of pod {p.name} is gone"
            if not health.ready and (
                health.not_ready_since is None or now - health.not_ready_since >= toleration
            ):
                return "broken", f"node {p.node} of pod {p.name} is not ready"
    ranks = {p.rank for p in group.pods}
    if len(ranks) < group.size:
        missing = sorted(set(range(group.size)) - ranks)
        if group.recorded:
            return "broken", f"pod rank {missing[0]} is missing"
        return "incomplete", f"ranks {missing} not created yet"
    if all(p.ready and p.phase == "Running" for p in group.pods):
        return "ready", ""
    return "starting", ""


@dataclass(frozen=True)
class Create:
    role: RoleName
    slot: int
    domain: str
    revision: str
    reason: str  # Missing | Replace | Surge | Complete


@dataclass(frozen=True)
class Delete:
    role: RoleName
    name: str
    reason: str  # Broken | Surplus | Rollout


@dataclass
class RolePlan:
    role: RoleName
    desired: int
    revision: str
    shape: GroupShape
    states: dict[str, GroupState] = field(default_factory=dict)
    create: list[Create] = field(default_factory=list)
    delete: list[Delete] = field(default_factory=list)
    unplaced: int = 0
    largest_block: tuple[int, str | None] = (0, None)
    rollout_blocked: bool = False
    old_groups: int = 0  # alive groups at an older revision (a rollout is under way)
    blocked: str = ""  # why new groups of this role cannot be created at all (set by the caller)
    broken_reasons: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)  # starting group -> why its first stuck pod waits

    @property
    def ready(self) -> int:
        return sum(1 for s in self.states.values() if s == "ready")


def _order_for_removal(groups: Sequence[GroupView], states: Mapping[str, GroupState]) -> list[GroupView]:
    """Not-ready groups first, then the highest slot."""
    return sorted(groups, key=lambda g: (states[g.name] == "ready", -g.slot))


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
) -> tuple[RolePlan, dict[str, Domain]]:
    """Plan one role. Returns the plan and the domains with this plan's new groups reserved."""
    plan = RolePlan(role=role, desired=desired, revision=revision, shape=shape)
    alive: list[GroupView] = []
    for g in groups:
        state, why = classify(g, nodes, now, toleration)
        plan.states[g.name] = state
        if state == "broken":
            plan.broken_reasons[g.name] = why
            plan.delete.append(Delete(role, g.name, "Broken"))
        elif state == "incomplete":
            # Finish a group the operator started before it stopped, if its ranks still fit where it is
            # and its revision is current; otherwise start it over.
            missing = g.size - len({p.rank for p in g.pods})
            rest = GroupShape(gpus=missing * shape.pod_gpus, gpus_per_node=shape.gpus_per_node)
            where = domains.get(g.domain)
            if g.revision == revision and where is not None and fits(where, rest):
                domains = {**domains, g.domain: reserve(where, rest)}
                plan.create.append(Create(role, g.slot, g.domain, g.revision, "Complete"))
                alive.append(g)
            else:
                plan.states[g.name] = "broken"
                plan.broken_reasons[g.name] = "could not be completed where it was started"
                plan.delete.append(Delete(role, g.name, "Broken"))
        elif state != "terminating":
            alive.append(g)
            stuck = [p for p in sorted(g.pods, key=lambda p: p.rank) if p.waiting and not p.ready]
            if state == "starting" and stuck:
                plan.waiting[g.name] = f"pod {stuck[0].name}: {stuck[0].waiting}"
    used_slots = {g.slot for g in groups}
    per_domain: dict[str, int] = {}
    for g in alive:
        per_domain[g.domain] = per_domain.get(g.domain, 0) + 1

    def place(reason: str) -> bool:
        nonlocal domains
        chosen = choose_domain(domains, shape, policy, per_domain)
        if chosen is None:
            plan.unplaced = 1  # the caller counts the rest
            plan.largest_block = largest_block(domains, shape)
            return False
        slot = next(i for i in range(len(used_slots) + 1) if i not in used_slots)
        used_slots.add(slot)
        domains = {**domains, chosen: reserve(domains[chosen], shape)}
        per_domain[chosen] = per_domain.get(chosen, 0) + 1
        plan.create.append(Create(role, slot, chosen, revision, reason))
        return True

    new = [g for g in alive if g.revision == revision]
    old = [g for g in alive if g.revision != revision]
    plan.old_groups = len(old)
    states = plan.states
    total = len(new) + len(old)
    new_all_ready = all(states[g.name] == "ready" for g in new)

    if total < desired:
        reason = "Replace" if plan.delete else "Missing"
        for placed in range(desired - total):
            if not place(reason):
                plan.unplaced = desired - total - placed
                break
    elif total > desired and not (old and not new_all_ready):
        # (During a rollout a surge group may be starting: old groups go only once it is ready.)
        removable = _order_for_removal(old, states) + _order_for_removal(new, states)
        for g in removable[: total - desired]:
            plan.delete.append(Delete(role, g.name, "Rollout" if g.revision != revision else "Surplus"))
    elif old and new_all_ready and not plan.create:
        # Rollout, one group at a time: surge where capacity allows, else replace in place.
        if choose_domain(domains, shape, policy, per_domain) is not None:
            place("Surge")
        elif len(alive) > 1 and all(states[g.name] == "ready" for g in alive):
            victim = _order_for_removal(old, states)[0]
            plan.delete.append(Delete(role, victim.name, "Rollout"))
        else:
            plan.rollout_blocked = True
            plan.largest_block = largest_block(domains, shape)
    # A group deleted by this plan is not also completed.
    doomed = {g.slot for g in groups if g.name in {d.name for d in plan.delete}}
    plan.create = [cr for cr in plan.create if not (cr.reason == "Complete" and cr.slot in doomed)]
    return plan, domains
