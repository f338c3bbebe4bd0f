"""The group planner: classifying observed groups and planning creates and deletes for one role.

Fixtures: a cluster is a few NVLink domains of 4-GPU nodes named `<domain>-<i>`; a group of `SHAPE` (8 GPUs)
is two pods of 4 GPUs, each bound to a node (or pending). Free capacity comes from `build_domains`, so the
groups' own pods hold their GPUs exactly as in the operator.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfab.planning.groups import (
    Create,
    Delete,
    GroupView,
    NodeHealth,
    PodView,
    classify,
    plan_role,
)
from tokenfab.planning.topology import GpuUse, GroupShape, NodeInfo, build_domains, reserve

NEW, OLD = "rev-new", "rev-old"
NOW = 10_000.0
TOL = 30.0
SHAPE = GroupShape(8, 4)


def cluster(**nodes_per_domain: int) -> list[NodeInfo]:
    """cluster(a=3, b=2): nodes a-0, a-1, a-2, b-0, b-1 with 4 GPUs each, all ready and schedulable."""
    return [
        NodeInfo(f"{domain}-{i}", domain, 4, True, True)
        for domain, n in nodes_per_domain.items()
        for i in range(n)
    ]


def group(
    slot: int,
    *where: str | None,
    revision: str = NEW,
    ready: bool = True,
    recorded: bool = True,
    size: int | None = None,
) -> GroupView:
    """A decode group at `slot` whose rank i runs on node where[i] (None: pending, not bound yet)."""
    name = f"m-decode-{slot}"
    pods = tuple(
        PodView(
            f"{name}-{rank}", rank, "Running" if node else "Pending", ready and node is not None, node, False
        )
        for rank, node in enumerate(where)
    )
    domain = next(n for n in where if n).split("-")[0]
    return GroupView(name, "decode", slot, revision, domain, size or len(where), SHAPE.gpus, pods, recorded)


def with_pod(g: GroupView, rank: int, **changes: object) -> GroupView:
    return replace(g, pods=tuple(replace(p, **changes) if p.rank == rank else p for p in g.pods))


def deleting(g: GroupView) -> GroupView:
    return replace(g, pods=tuple(replace(p, deleting=True) for p in g.pods))


def healthy(nodes: list[NodeInfo]) -> dict[str, NodeHealth]:
    return {n.name: NodeHealth(n.ready) for n in nodes}


def domains_of(nodes, groups, extra=(), shape=SHAPE):
    uses = [GpuUse(shape.pod_gpus, p.node, g.domain) for g in groups for p in g.pods]
    return build_domains(nodes, [*uses, *extra])


def plan(groups, desired, nodes, *, revision=NEW, policy="pack", health=None, extra=(), shape=SHAPE):
    """plan_role for the decode role, with free capacity derived from `nodes` and the groups' pods."""
    return plan_role(
        "decode",
        desired,
        revision,
        shape,
        groups,
        domains_of(nodes, groups, extra, shape),
        policy,
        healthy(nodes) if health is None else health,
        NOW,
        TOL,
    )


# --------------------------------------------------------------------------------------------- classify

G = group(0, "a-0", "a-1")
UP = {"a-0": NodeHealth(True), "a-1": NodeHealth(True)}


@pytest.mark.parametrize(
    ("g", "nodes", "state", "why"),
    [
        pytest.param(G, UP, "ready", "", id="every pod running and ready"),
        pytest.param(with_pod(G, 1, ready=False), UP, "starting", "", id="a pod not ready yet"),
        pytest.param(
            with_pod(G, 1, phase="Pending", ready=False, node=None), UP, "starting", "", id="a pod pending"
        ),
        pytest.param(
            with_pod(G, 1, phase="Failed", ready=False), UP, "broken", "pod m-decode-0-1 failed", id="failed"
        ),
        pytest.param(
            with_pod(G, 0, phase="Succeeded", ready=False),
            UP,
            "broken",
            "pod m-decode-0-0 succeeded",
            id="a rank exited",
        ),
        pytest.param(
            with_pod(G, 1, deleting=True),
            UP,
            "broken",
            "pod m-decode-0-1 is being deleted",
            id="a pod deleting",
        ),
        pytest.param(deleting(G), UP, "terminating", "being deleted", id="every pod deleting"),
        pytest.param(
            G, {"a-0": NodeHealth(True)}, "broken", "node a-1 of pod m-decode-0-1 is gone", id="node gone"
        ),
        pytest.param(
            G,
            {**UP, "a-1": NodeHealth(False, NOW - TOL - 1)},
            "broken",
            "node a-1 of pod m-decode-0-1 is not ready",
            id="node not ready past the toleration",
        ),
        pytest.param(
            G,
            {**UP, "a-1": NodeHealth(False, NOW - TOL)},
            "broken",
            "node a-1 of pod m-decode-0-1 is not ready",
            id="node not ready for exactly the toleration",
        ),
        pytest.param(
            G, {**UP, "a-1": NodeHealth(False, NOW - TOL + 1)}, "ready", "", id="node not ready briefly"
        ),
        pytest.param(
            G,
            {**UP, "a-0": NodeHealth(False, None)},
            "broken",
            "node a-0 of pod m-decode-0-0 is not ready",
            id="node not ready since unknown",
        ),
        pytest.param(
            group(0, "a-0", size=2), UP, "broken", "pod rank 1 is missing", id="recorded group lost a rank"
        ),
        pytest.param(
            group(0, "a-0", size=2, recorded=False),
            UP,
            "incomplete",
            "ranks [1] not created yet",
            id="creation interrupted",
        ),
    ],
)
def test_classify(g, nodes, state, why):
    assert classify(g, nodes, NOW, TOL) == (state, why)


def test_a_pending_pod_without_a_node_is_not_judged_by_node_health():
    g = with_pod(G, 1, phase="Pending", ready=False, node=None)
    assert classify(g, {"a-0": NodeHealth(True)}, NOW, TOL) == ("starting", "")


# ----------------------------------------------------------------------------------------- fresh groups


@pytest.mark.parametrize(
    ("policy", "domains"),
    [
        # pack: best fit. b and c have 8 free GPUs (tie: b first), then a, whose 24 free GPUs stay whole.
        ("pack", ["b", "c", "a", "a"]),
        # spread: the fewest of this deployment's groups, then the most free GPUs.
        ("spread", ["a", "b", "c", "a"]),
    ],
)
def test_fresh_groups_are_placed_whole_in_slots_0_to_n(policy, domains):
    nodes = cluster(a=6, b=3, c=2)
    p, after = plan([], 4, nodes, policy=policy, extra=[GpuUse(4, "b-0")])
    assert p.create == [Create("decode", i, d, NEW, "Missing") for i, d in enumerate(domains)]
    assert (p.delete, p.unplaced) == ([], 0)
    free = {name: d.free_gpus for name, d in after.items()}
    assert free == {
        "a": 24 - 8 * domains.count("a"),
        "b": 8 - 8 * domains.count("b"),
        "c": 8 - 8 * domains.count("c"),
    }


def test_spread_avoids_domains_holding_this_deployments_groups():
    nodes = cluster(a=6, b=4)
    p, _ = plan([group(0, "a-0", "a-1")], 2, nodes, policy="spread")
    assert p.create == [Create("decode", 1, "b", NEW, "Missing")]


def test_nothing_fits_creates_nothing_and_reports_the_largest_block():
    nodes = cluster(a=3, b=2)
    # a: one whole node free; b: 3 GPUs free on one node (a 4-GPU pod cannot use them).
    extra = [GpuUse(4, "a-0"), GpuUse(4, "a-1"), GpuUse(1, "b-0"), GpuUse(4, "b-1")]
    p, after = plan([], 1, nodes, extra=extra)
    assert p.create == []
    assert p.unplaced == 1
    assert p.largest_block == (4, "a")
    assert after == domains_of(nodes, [], extra)


def test_unplaced_counts_every_group_that_did_not_fit():
    nodes = cluster(a=3)
    p, _ = plan([], 3, nodes)  # room for one 2-node group
    assert len(p.create) == 1
    assert p.unplaced == 2


# --------------------------------------------------------------------------------------- broken groups


def _breaks():
    """(the group at slot 0 made broken, cluster nodes, node health, other pods' GPU uses)."""
    nodes = cluster(a=6, b=2)
    g0 = group(0, "a-0", "a-1")
    gone = [n for n in nodes if n.name != "a-1"]
    sick = [replace(n, ready=False) if n.name == "a-1" else n for n in nodes]
    return [
        pytest.param(
            with_pod(g0, 1, phase="Failed", ready=False), nodes, healthy(nodes), [], id="pod failed"
        ),
        pytest.param(with_pod(g0, 0, deleting=True), nodes, healthy(nodes), [], id="pod deleting"),
        pytest.param(g0, gone, healthy(gone), [], id="node gone"),
        pytest.param(
            g0, sick, {**healthy(sick), "a-1": NodeHealth(False, NOW - 60)}, [], id="node not ready too long"
        ),
        # (Another pod took the lost rank's node.)
        pytest.param(
            group(0, "a-0", size=2),
            nodes,
            healthy(nodes),
            [GpuUse(4, "a-1")],
            id="recorded group lost a rank",
        ),
    ]


@pytest.mark.parametrize(("g0", "nodes", "health", "extra"), _breaks())
def test_a_broken_group_is_deleted_and_replaced_in_a_free_slot(g0, nodes, health, extra):
    g1 = group(1, "a-2", "a-3")
    p, after = plan([g0, g1], 2, nodes, health=health, extra=extra)
    assert p.states == {"m-decode-0": "broken", "m-decode-1": "ready"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert p.broken_reasons.keys() == {"m-decode-0"}
    # Slot 0 is still held by the broken group's pods (being deleted): the replacement takes slot 2,
    # on the two nodes of domain a that nothing holds (best fit: a has 8 free GPUs like b, and comes first).
    assert p.create == [Create("decode", 2, "a", NEW, "Replace")]
    assert after["a"].free_gpus == 0


def test_a_node_not_ready_for_less_than_the_toleration_breaks_nothing():
    nodes = [replace(n, ready=False) if n.name == "a-1" else n for n in cluster(a=6)]
    health = {**healthy(nodes), "a-1": NodeHealth(False, NOW - TOL / 2)}
    p, _ = plan([group(0, "a-0", "a-1"), group(1, "a-2", "a-3")], 2, nodes, health=health)
    assert (p.create, p.delete, p.broken_reasons) == ([], [], {})


def test_an_incomplete_group_is_completed_where_it_was_started():
    nodes = cluster(a=4)
    g0 = group(0, "a-2", size=2, recorded=False)
    p, _ = plan([g0], 1, nodes)
    assert p.states == {"m-decode-0": "incomplete"}
    assert p.create == [Create("decode", 0, "a", NEW, "Complete")]
    assert p.delete == []


def test_an_incomplete_group_of_an_old_revision_is_started_over():
    # Completing it from the current spec would mix two revisions inside one group.
    nodes = cluster(a=4)
    g0 = group(0, "a-2", size=2, recorded=False, revision=OLD)
    p, _ = plan([g0], 1, nodes)
    assert p.states == {"m-decode-0": "broken"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert [cr.reason for cr in p.create] == ["Replace"]


def test_completing_a_group_reserves_room_for_its_missing_ranks():
    nodes = cluster(a=3)  # a-0 holds rank 0; a-1 and a-2 free: room for rank 1 and nothing else
    g0 = group(0, "a-0", size=2, recorded=False)
    p, _ = plan([g0], 2, nodes)
    assert p.create == [Create("decode", 0, "a", NEW, "Complete")]
    assert p.unplaced == 1


def test_a_surplus_incomplete_group_is_not_completed():
    g0 = group(0, "a-0", size=2, recorded=False)
    p, _ = plan([g0], 0, cluster(a=3))
    assert p.delete == [Delete("decode", "m-decode-0", "Surplus")]
    assert p.create == []


# ------------------------------------------------------------------------------------------ scale down


@pytest.mark.parametrize(
    ("desired", "deleted"),
    [(3, ["m-decode-1"]), (2, ["m-decode-1", "m-decode-3"]), (0, [f"m-decode-{i}" for i in (1, 3, 2, 0)])],
)
def test_scale_down_deletes_not_ready_groups_then_the_highest_slot(desired, deleted):
    groups = [group(i, f"a-{2 * i}", f"a-{2 * i + 1}") for i in range(4)]
    groups[1] = with_pod(groups[1], 0, ready=False)
    p, _ = plan(groups, desired, cluster(a=8))
    assert p.delete == [Delete("decode", name, "Surplus") for name in deleted]
    assert p.create == []


# --------------------------------------------------------------------------------------------- rollout

OLD0, OLD1 = group(0, "a-0", "a-1", revision=OLD), group(1, "a-2", "a-3", revision=OLD)


def test_rollout_surges_one_new_group_where_capacity_allows():
    p, _ = plan([OLD0, OLD1], 2, cluster(a=6))
    assert p.create == [Create("decode", 2, "a", NEW, "Surge")]
    assert p.delete == []
    assert (p.old_groups, p.rollout_blocked) == (2, False)


def test_rollout_deletes_nothing_while_the_surge_group_starts():
    surge = group(2, "a-4", "a-5", ready=False)
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=6))
    assert (p.create, p.delete) == ([], [])


def test_rollout_deletes_one_old_group_once_the_surge_group_is_ready():
    surge = group(2, "a-4", "a-5")
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=8))
    assert p.delete == [Delete("decode", "m-decode-1", "Rollout")]
    assert p.create == []


def test_rollout_without_capacity_replaces_one_old_group_in_place():
    p, _ = plan([OLD0, OLD1], 2, cluster(a=4))
    assert p.delete == [Delete("decode", "m-decode-1", "Rollout")]
    assert p.create == []
    assert not p.rollout_blocked


def test_rollout_of_a_single_group_without_capacity_is_blocked_and_keeps_the_old_group():
    p, _ = plan([OLD0], 1, cluster(a=3))
    assert (p.create, p.delete) == ([], [])
    assert p.rollout_blocked
    assert p.largest_block == (4, "a")


def test_an_in_place_rollout_goes_on_group_by_group():
    nodes = cluster(a=4)
    # Old slot 1 was deleted for the rollout and its pods are gone: a new group takes the room.
    p, _ = plan([OLD0], 2, nodes)
    assert p.create == [Create("decode", 1, "a", NEW, "Missing")]
    # While the new group starts, the last old group stays (and the rollout is not "blocked").
    p, _ = plan([OLD0, group(1, "a-2", "a-3", ready=False)], 2, nodes)
    assert (p.create, p.delete, p.rollout_blocked) == ([], [], False)
    # Once it is ready, the last old group is replaced in place.
    p, _ = plan([OLD0, group(1, "a-2", "a-3")], 2, nodes)
    assert p.delete == [Delete("decode", "m-decode-0", "Rollout")]
    assert p.create == []


def test_terminating_groups_hold_their_slot_but_are_not_alive():
    gone = deleting(group(1, "a-2", "a-3"))
    p, _ = plan([group(0, "a-0", "a-1"), gone], 2, cluster(a=6))
    assert p.states["m-decode-1"] == "terminating"
    assert p.create == [Create("decode", 2, "a", NEW, "Missing")]
    assert p.delete == []


# ---------------------------------------------------------------------------------------------- property

SHAPES = [GroupShape(2, 4), GroupShape(4, 4), GroupShape(8, 4), GroupShape(12, 4)]


def rarely(draw) -> bool:
    return draw(st.integers(0, 9)) == 0


@st.composite
def scenarios(draw):
    """A cluster of up to 3 domains, up to 5 observed groups in any state, a desired count and a policy."""
    shape = draw(st.sampled_from(SHAPES))
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    nodes, health = [], {}
    free = {d: [f"{d}-{i}" for i in range(n)] for d, n in zip("abc", sizes, strict=False)}
    for d, names in free.items():
        for name in names:
            if rarely(draw):
                continue  # the node is gone (its pods may still name it)
            ready = not rarely(draw)
            nodes.append(NodeInfo(name, d, 4, ready, True))
            health[name] = NodeHealth(ready, None if ready else draw(st.sampled_from([NOW - 5, NOW - 99])))
    groups = []
    for slot in sorted(draw(st.sets(st.integers(0, 7), max_size=5))):
        domain = draw(st.sampled_from(sorted(free)))
        terminating = rarely(draw)
        pods = []
        for rank in range(shape.nodes):
            if rarely(draw):
                continue  # rank missing
            node = free[domain].pop(0) if free[domain] and not rarely(draw) else None
            phase = "Pending" if node is None else ("Failed" if rarely(draw) else "Running")
            ready = phase == "Running" and draw(st.integers(0, 3)) > 0
            deleting = terminating or rarely(draw)
            pods.append(PodView(f"m-decode-{slot}-{rank}", rank, phase, ready, node, deleting))
        if not pods:
            continue
        groups.append(
            GroupView(
                name=f"m-decode-{slot}",
                role="decode",
                slot=slot,
                revision=draw(st.sampled_from([NEW, OLD])),
                domain=domain,
                size=shape.nodes,
                gpus=shape.gpus,
                pods=tuple(pods),
                recorded=not rarely(draw),
            )
        )
    desired = draw(st.one_of(st.just(len(groups)), st.integers(0, 6)))
    policy = draw(st.sampled_from(["pack", "spread"]))
    return shape, nodes, health, groups, desired, policy


def _run(shape, nodes, health, groups, desired, policy):
    domains = domains_of(nodes, groups, shape=shape)
    return domains, plan_role("decode", desired, NEW, shape, groups, domains, policy, health, NOW, TOL)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_plan_role_invariants(scenario):
    shape, nodes, health, groups, desired, policy = scenario
    domains, (p, after) = _run(*scenario)
    states = p.states
    alive = [g for g in groups if states[g.name] not in ("broken", "terminating")]

    # Every new group fits where it was put: reserving them in order never fails, and the domains returned
    # are exactly that. A completed group reserves room for its missing ranks only.
    placed = [cr for cr in p.create if cr.reason != "Complete"]
    state = dict(domains)
    by_slot = {g.slot: g for g in groups}
    for cr in p.create:
        if cr.reason == "Complete":
            g = by_slot[cr.slot]
            missing = g.size - len({pod.rank for pod in g.pods})
            rest = GroupShape(gpus=missing * shape.pod_gpus, gpus_per_node=shape.gpus_per_node)
            state[cr.domain] = reserve(state[cr.domain], rest)
    for cr in placed:
        state[cr.domain] = reserve(state[cr.domain], shape)
    assert after == state

    # New groups take fresh slots; completed groups keep theirs.
    used = {g.slot for g in groups}
    slots = [cr.slot for cr in placed]
    assert len(set(slots)) == len(slots)
    assert not used & set(slots)
    assert {cr.slot for cr in p.create if cr.reason == "Complete"} <= used

    # No more groups than asked for, except one surge group during a rollout.
    assert len(placed) <= max(desired - len(alive), 0) or [cr.reason for cr in placed] == ["Surge"]

    # Every broken group goes; a ready group of the current revision never goes while it is needed.
    broken = {g.name for g in groups if states[g.name] == "broken"}
    assert {d.name for d in p.delete if d.reason == "Broken"} == broken
    if len(alive) <= desired:
        current_ready = {g.name for g in groups if g.revision == NEW and states[g.name] == "ready"}
        assert not current_ready & {d.name for d in p.delete}

    # Deterministic, whatever order the groups are observed in.
    _, (again, after_again) = _run(*scenario)
    assert (again, after_again) == (p, after)
    _, (rev, after_rev) = _run(shape, nodes, health, list(reversed(groups)), desired, policy)
    assert after_rev == after
    assert rev.states == p.states
    assert sorted(map(repr, rev.create)) == sorted(map(repr, p.create))
    assert sorted(map(repr, rev.delete)) == sorted(map(repr, p.delete))
    assert (rev.unplaced, rev.largest_block, rev.rollout_blocked) == (
        p.unplaced,
        p.largest_block,
        p.rollout_blocked,
    )
