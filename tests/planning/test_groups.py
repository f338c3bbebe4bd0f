"""The group planner: planning creates (with their nodes), releases and deletes for one role.

Fixtures: a cluster is a few NVLink domains of 4-GPU nodes named `<domain>-<i>`; a group of `SHAPE` (8 GPUs)
is two pods of 4 GPUs, each pinned to a node and bound there (or not bound yet). Free capacity comes from
`build_domains`, with every pod holding its GPUs on the node it is bound or pinned to, exactly as the
cluster view counts them in the operator. (How one group is classified is tested in test_lifecycle.py.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfab.planning.groups import (
    Create,
    Delete,
    DrainPolicy,
    GroupView,
    Judging,
    Leaving,
    NodeHealth,
    Placing,
    PodView,
    Wanted,
    plan_role,
)
from tokenfab.planning.lifecycle import ALIVE, classify, missing_ranks
from tokenfab.planning.topology import GpuUse, GroupShape, NodeInfo, build_domains, take

NEW, OLD = "rev-new", "rev-old"
NOW = 10_000.0
TOL = 30.0
BIND = 300.0
SHAPE = GroupShape(8, 4)
WORDS = "0/8 nodes are available: 2 node(s) didn't match Pod's node affinity/selector"
WATCHED = DrainPolicy(600, {})  # drains observed (a Prometheus), in-flight counts unknown yet


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
    bound: bool = True,
    gated: bool = False,
    nodes: tuple[str, ...] | None = None,
    draining_since: float | None = None,
    pinned: bool = True,
) -> GroupView:
    """A decode group at `slot` whose rank i is pinned to node where[i] and bound there (None: placed before
    nodes were assigned, pending). `bound=False`: no pod bound yet; `gated`: not released yet either;
    `pinned=False`: placed before nodes were assigned (bound, but not pinned). `nodes` (the recorded node of
    every rank) defaults to `where` when it names every rank and the pods are pinned."""
    name = f"m-decode-{slot}"
    size = size or len(where)
    pods = tuple(
        PodView(
            f"{name}-{rank}",
            rank,
            "Running" if node and bound else "Pending",
            ready and bound and node is not None,
            node if bound else None,
            False,
            gated=gated,
            pinned=node if pinned else None,
        )
        for rank, node in enumerate(where)
    )
    domain = next(n for n in where if n).split("-")[0]
    if nodes is None:
        nodes = tuple(n for n in where if n) if pinned and len(where) == size and all(where) else ()
    return GroupView(
        name,
        "decode",
        slot,
        revision,
        domain,
        size,
        SHAPE.gpus,
        pods,
        recorded,
        nodes,
        released_at=None if gated else NOW - 60,
        draining_since=draining_since,
    )


def with_pod(g: GroupView, rank: int, **changes: object) -> GroupView:
    return replace(g, pods=tuple(replace(p, **changes) if p.rank == rank else p for p in g.pods))


def deleting(g: GroupView) -> GroupView:
    return replace(g, pods=tuple(replace(p, deleting=True) for p in g.pods))


def healthy(nodes: list[NodeInfo]) -> dict[str, NodeHealth]:
    return {n.name: NodeHealth(n.ready, schedulable=n.schedulable) for n in nodes}


def domains_of(nodes, groups, extra=(), shape=SHAPE):
    uses = [GpuUse(shape.pod_gpus, p.node or p.pinned, g.domain) for g in groups for p in g.pods]
    return build_domains(nodes, [*uses, *extra])


def plan(
    groups,
    desired,
    nodes,
    *,
    revision=NEW,
    policy="pack",
    health=None,
    extra=(),
    shape=SHAPE,
    bind=BIND,
    drain=None,
    other_roles_ready=True,
):
    """plan_role for the decode role, with free capacity derived from `nodes` and the groups' pods."""
    return plan_role(
        Wanted("decode", desired, revision, shape),
        groups,
        Placing(domains_of(nodes, groups, extra, shape), policy),
        Judging(healthy(nodes) if health is None else health, NOW, TOL, bind),
        Leaving(drain=drain, other_roles_ready=other_roles_ready),
    )


# ----------------------------------------------------------------------------------------- fresh groups


@pytest.mark.parametrize(
    ("policy", "placed"),
    [
        # pack: best fit. b and c have 8 free GPUs (tie: b first), then a, whose 24 free GPUs stay whole.
        ("pack", [("b", "b-1", "b-2"), ("c", "c-0", "c-1"), ("a", "a-0", "a-1"), ("a", "a-2", "a-3")]),
        # spread: the fewest of this deployment's groups, then the most free GPUs.
        ("spread", [("a", "a-0", "a-1"), ("b", "b-1", "b-2"), ("c", "c-0", "c-1"), ("a", "a-2", "a-3")]),
    ],
)
def test_fresh_groups_are_placed_whole_in_slots_0_to_n_on_nodes_of_their_domain(policy, placed):
    nodes = cluster(a=6, b=3, c=2)
    p, after = plan([], 4, nodes, policy=policy, extra=[GpuUse(4, "b-0")])
    assert p.create == [
        Create("decode", i, d, NEW, "Missing", tuple(ns)) for i, (d, *ns) in enumerate(placed)
    ]
    assert (p.delete, p.release, p.unplaced) == ([], [], 0)
    domains = [d for d, *_ in placed]
    free = {name: d.free_gpus for name, d in after.items()}
    assert free == {
        "a": 24 - 8 * domains.count("a"),
        "b": 8 - 8 * domains.count("b"),
        "c": 8 - 8 * domains.count("c"),
    }
    # The nodes given out are exactly the ones taken out of the returned domains.
    taken = {n for d in after.values() for n, gpus in d.free.items() if gpus == 0} - {"b-0"}
    assert taken == {n for cr in p.create for n in cr.nodes}


def test_spread_avoids_domains_holding_this_deployments_groups():
    nodes = cluster(a=6, b=4)
    p, _ = plan([group(0, "a-0", "a-1")], 2, nodes, policy="spread")
    assert p.create == [Create("decode", 1, "b", NEW, "Missing", ("b-0", "b-1"))]


def test_nodes_are_the_fullest_that_fit_inside_the_chosen_domain():
    # 8-GPU nodes, groups of two 4-GPU pods. Domain a is the best fit (fewest free GPUs that fit); inside
    # it, the two fullest nodes with 4 free (a-1 and a-3) take the ranks, in rank order (ties by name);
    # a-0 (8 free) stays whole, a-2 (3 free) cannot take a pod. b has fuller nodes but is another domain.
    nodes = [NodeInfo(f"a-{i}", "a", 8, True, True) for i in range(4)]
    nodes += [NodeInfo(f"b-{i}", "b", 8, True, True) for i in range(4)]
    extra = [GpuUse(4, "a-1"), GpuUse(5, "a-2"), GpuUse(4, "a-3")]
    extra += [GpuUse(4, "b-0"), GpuUse(4, "b-1")]
    p, after = plan([], 1, nodes, extra=extra)
    assert p.create == [Create("decode", 0, "a", NEW, "Missing", ("a-1", "a-3"))]
    assert dict(after["a"].free) == {"a-0": 8, "a-1": 0, "a-2": 3, "a-3": 0}
    assert after["b"] == domains_of(nodes, [], extra)["b"]


def test_sub_node_groups_pack_onto_the_fullest_node_that_fits():
    shape = GroupShape(2, 4)  # one pod of 2 GPUs
    nodes = cluster(a=4)
    # a-0: 4 free, a-1: 2 free, a-2: 1 free (too little), a-3: 3 free.
    extra = [GpuUse(2, "a-1"), GpuUse(3, "a-2"), GpuUse(1, "a-3")]
    p, after = plan([], 3, nodes, extra=extra, shape=shape)
    # a-1 fills up first, then a-3 (3 free), which is then too full; the last goes to a-0.
    assert [cr.nodes for cr in p.create] == [("a-1",), ("a-3",), ("a-0",)]
    assert dict(after["a"].free) == {"a-0": 2, "a-1": 0, "a-2": 1, "a-3": 1}


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
    assert [cr.nodes for cr in p.create] == [("a-0", "a-1")]
    assert p.unplaced == 2


# --------------------------------------------------------------------------------------- broken groups


def _breaks():
    """(the group at slot 0 made broken, cluster nodes, node health, other pods' GPU uses)."""
    nodes = cluster(a=6, b=2)
    g0 = group(0, "a-0", "a-1")
    gone = [n for n in nodes if n.name != "a-1"]
    sick = [replace(n, ready=False) if n.name == "a-1" else n for n in nodes]
    cordoned = [replace(n, schedulable=False) if n.name == "a-1" else n for n in nodes]
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
        pytest.param(
            group(0, "a-0", "a-1", bound=False, gated=True),
            cordoned,
            healthy(cordoned),
            [],
            id="gated, pinned node cordoned",
        ),
        pytest.param(
            replace(
                with_pod(group(0, "a-0", "a-1"), 1, node=None, phase="Pending", ready=False), released_at=0
            ),
            nodes,
            healthy(nodes),
            [],
            id="not bound in time",
        ),
    ]


@pytest.mark.parametrize(("g0", "nodes", "health", "extra"), _breaks())
def test_a_broken_group_is_deleted_and_replaced_in_a_free_slot(g0, nodes, health, extra):
    g1 = group(1, "a-2", "a-3")
    p, after = plan([g0, g1], 2, nodes, health=health, extra=extra)
    assert p.states == {"m-decode-0": "broken", "m-decode-1": "serving"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert p.broken_reasons.keys() == {"m-decode-0"}
    # Slot 0 is still held by the broken group's pods (being deleted): the replacement takes slot 2,
    # on the two nodes of domain a that nothing holds (best fit: a has 8 free GPUs like b, and comes first).
    # A group lost to its node (gone, or not ready past the toleration) is a hardware fault: the
    # replacement says which group it replaces; one that broke on its own (its pod failed) is not.
    lost = "m-decode-0" if p.faults else ""
    assert p.create == [Create("decode", 2, "a", NEW, "Replace", ("a-4", "a-5"), (), lost)]
    assert after["a"].free_gpus == 0
    assert (p.release, p.unbound) == ([], {})


def test_a_node_not_ready_for_less_than_the_toleration_breaks_nothing():
    nodes = [replace(n, ready=False) if n.name == "a-1" else n for n in cluster(a=6)]
    health = {**healthy(nodes), "a-1": NodeHealth(False, NOW - TOL / 2)}
    p, _ = plan([group(0, "a-0", "a-1"), group(1, "a-2", "a-3")], 2, nodes, health=health)
    assert (p.create, p.delete, p.broken_reasons) == ([], [], {})


def test_a_group_not_bound_in_time_is_broken_in_the_schedulers_words():
    g0 = with_pod(group(0, "a-0", "a-1"), 1, node=None, phase="Pending", ready=False, waiting=WORDS)
    nodes = cluster(a=4)
    # Within the timeout it is starting, and the plan says why it is not bound yet.
    p, _ = plan([replace(g0, released_at=NOW - BIND + 1)], 1, nodes)
    assert p.states == {"m-decode-0": "starting"}
    assert p.unbound == {"m-decode-0": WORDS}
    assert p.waiting == {"m-decode-0": f"pod m-decode-0-1: {WORDS}"}
    assert (p.create, p.delete) == ([], [])
    # Past it, the whole group goes and is placed again.
    p, _ = plan([replace(g0, released_at=NOW - BIND)], 1, nodes)
    assert p.states == {"m-decode-0": "broken"}
    assert p.broken_reasons == {"m-decode-0": f"not bound within 300 s (1 of 2 pods unbound: {WORDS})"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert p.create == [Create("decode", 1, "a", NEW, "Replace", ("a-2", "a-3"))]
    assert p.unbound == {}


# ----------------------------------------------------------------------------------- reserved groups


def test_a_whole_gated_group_is_released():
    g0 = group(0, "a-0", "a-1", bound=False, gated=True, recorded=False)
    p, after = plan([g0], 1, cluster(a=4))
    assert p.states == {"m-decode-0": "reserved"}
    assert p.release == ["m-decode-0"]
    assert p.unbound == {"m-decode-0": "released to the scheduler"}
    assert (p.create, p.delete, p.ready) == ([], [], 0)
    # Its pinned pods already hold their nodes: nothing more is taken.
    assert after == domains_of(cluster(a=4), [g0])


def test_a_group_whose_pods_wait_for_their_claims_says_so():
    # Every pod exists (its PodGroup comes last), but the resource claim controller has not made rank 1's
    # IMEX channel claim yet: the group is starting, and its status names the pod it waits for.
    g0 = with_pod(group(0, "a-0", "a-1", bound=False, recorded=False), 1, claims_pending=True)
    p, _ = plan([replace(g0, released_at=NOW)], 1, cluster(a=4))
    assert p.states == {"m-decode-0": "starting"}
    assert p.unbound == {"m-decode-0": "waiting for the resource claims of its pods (pod m-decode-0-1)"}
    assert (p.create, p.delete, p.release) == ([], [], [])
    p, _ = plan([replace(with_pod(g0, 1, claims_pending=False), released_at=NOW)], 1, cluster(a=4))
    assert p.unbound == {"m-decode-0": "waiting for the scheduler to bind its pods"}


def test_a_half_released_group_is_released_again():
    # The operator stopped while lifting the gates: one pod is free (and bound already), one is gated.
    g0 = with_pod(group(0, "a-0", "a-1", bound=False, gated=True), 0, gated=False, node="a-0")
    p, _ = plan([g0], 1, cluster(a=4))
    assert (p.states, p.release) == ({"m-decode-0": "reserved"}, ["m-decode-0"])


def test_a_surplus_gated_group_is_deleted_not_released():
    g0 = group(0, "a-0", "a-1")
    g1 = group(1, "a-2", "a-3", bound=False, gated=True)
    p, _ = plan([g0, g1], 1, cluster(a=4))
    assert p.delete == [Delete("decode", "m-decode-1", "Surplus")]
    assert (p.release, p.unbound) == ([], {})


def test_an_interrupted_group_is_completed_on_its_recorded_nodes():
    nodes = cluster(a=4)
    # Rank 0 exists (gated, pinned to a-2); rank 1 was assigned a-1 (a fuller choice exists: a-0 by name).
    g0 = group(0, "a-2", size=2, recorded=False, bound=False, gated=True, nodes=("a-2", "a-1"))
    p, after = plan([g0], 1, nodes)
    assert p.states == {"m-decode-0": "reserved"}
    assert p.create == [Create("decode", 0, "a", NEW, "Complete", ("a-1",), (1,))]
    assert (p.delete, p.release) == ([], [])  # released once every rank exists, next pass
    assert p.unbound == {"m-decode-0": "creating ranks [1]"}
    assert dict(after["a"].free) == {"a-0": 4, "a-1": 0, "a-2": 0, "a-3": 4}


def test_an_interrupted_group_whose_recorded_node_has_no_room_is_started_over():
    nodes = cluster(a=4)
    g0 = group(0, "a-2", size=2, recorded=False, bound=False, gated=True, nodes=("a-2", "a-1"))
    # Another pod took a-1 meanwhile (it had no reservation after a restart).
    p, _ = plan([g0], 1, nodes, extra=[GpuUse(1, "a-1")])
    assert p.states == {"m-decode-0": "broken"}
    assert p.broken_reasons == {"m-decode-0": "could not be completed where it was started"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert p.create == [Create("decode", 1, "a", NEW, "Replace", ("a-0", "a-3"))]
    assert p.unbound == {}


def test_an_interrupted_group_whose_recorded_node_is_cordoned_is_started_over():
    nodes = [replace(n, schedulable=False) if n.name == "a-1" else n for n in cluster(a=4)]
    g0 = group(0, "a-2", size=2, recorded=False, bound=False, gated=True, nodes=("a-2", "a-1"))
    p, _ = plan([g0], 1, nodes)
    assert p.states == {"m-decode-0": "broken"}
    assert [cr.reason for cr in p.create] == ["Replace"]


def test_an_interrupted_group_placed_before_nodes_were_assigned_is_completed_in_its_domain():
    # Its pods name no group nodes: the missing rank goes on the fullest free node of its domain.
    nodes = cluster(a=4, b=4)
    g0 = group(0, "a-2", size=2, recorded=False, pinned=False)
    p, _ = plan([g0], 1, nodes, extra=[GpuUse(2, "a-3")])
    assert p.states == {"m-decode-0": "reserved"}
    assert p.create == [Create("decode", 0, "a", NEW, "Complete", ("a-0",), (1,))]
    assert p.delete == []


def test_an_interrupted_group_of_an_old_revision_is_started_over():
    # Completing it from the current spec would mix two revisions inside one group.
    nodes = cluster(a=4)
    g0 = group(0, "a-2", size=2, recorded=False, revision=OLD, bound=False, gated=True, nodes=("a-2", "a-3"))
    p, _ = plan([g0], 1, nodes)
    assert p.states == {"m-decode-0": "broken"}
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert [cr.reason for cr in p.create] == ["Replace"]


def test_completing_a_group_reserves_room_for_its_missing_ranks():
    nodes = cluster(a=3)  # a-0 holds rank 0; a-1 and a-2 free: room for rank 1 and nothing else
    g0 = group(0, "a-0", size=2, recorded=False, bound=False, gated=True, nodes=("a-0", "a-1"))
    p, _ = plan([g0], 2, nodes)
    assert p.create == [Create("decode", 0, "a", NEW, "Complete", ("a-1",), (1,))]
    assert p.unplaced == 1


def test_a_surplus_interrupted_group_is_not_completed():
    g0 = group(0, "a-0", size=2, recorded=False, bound=False, gated=True, nodes=("a-0", "a-1"))
    p, after = plan([g0], 0, cluster(a=3))
    assert p.delete == [Delete("decode", "m-decode-0", "Surplus")]
    assert (p.create, p.release, p.unbound) == ([], [], {})
    assert after == domains_of(cluster(a=3), [g0])  # and takes no room for it


# ------------------------------------------------------------------------------------------ scale down


@pytest.mark.parametrize(
    ("desired", "deleted"),
    [(3, ["m-decode-1"]), (2, ["m-decode-1", "m-decode-3"]), (0, [f"m-decode-{i}" for i in (1, 3, 2, 0)])],
)
def test_scale_down_deletes_groups_not_serving_then_the_highest_slot(desired, deleted):
    groups = [group(i, f"a-{2 * i}", f"a-{2 * i + 1}") for i in range(4)]
    groups[1] = with_pod(groups[1], 0, ready=False)
    p, _ = plan(groups, desired, cluster(a=8))
    assert p.delete == [Delete("decode", name, "Surplus") for name in deleted]
    assert p.create == []


def test_a_draining_group_holds_its_slot_and_nodes_but_does_not_count():
    # (One of an older revision: a draining group of the current one would be taken back into routing
    # instead of creating a group, see test_drain.py.)
    draining = group(1, "a-2", "a-3", revision=OLD, draining_since=NOW - 10)
    p, _ = plan([group(0, "a-0", "a-1"), draining], 2, cluster(a=6), drain=WATCHED)
    assert p.states["m-decode-1"] == "draining"
    assert p.create == [Create("decode", 2, "a", NEW, "Missing", ("a-4", "a-5"))]
    assert (p.delete, p.drain, p.undrain, p.draining) == ([], [], [], {"m-decode-1": 10.0})
    # Scaled down to the group left serving: nothing to do, the drain goes on.
    draining = replace(draining, revision=NEW)
    p, _ = plan([group(0, "a-0", "a-1"), draining], 1, cluster(a=6), drain=WATCHED)
    assert (p.create, p.delete, p.drain, p.undrain) == ([], [], [], [])
    assert p.states["m-decode-1"] == "draining"


# --------------------------------------------------------------------------------------------- rollout

OLD0, OLD1 = group(0, "a-0", "a-1", revision=OLD), group(1, "a-2", "a-3", revision=OLD)


@pytest.mark.parametrize(
    ("nodes", "surged", "unplaced"),
    [(cluster(a=6), [("a-4", "a-5")], 1), (cluster(a=8), [("a-4", "a-5"), ("a-6", "a-7")], 0)],
    ids=["room for one", "room for all"],
)
def test_rollout_surges_new_groups_wherever_capacity_allows(nodes, surged, unplaced):
    p, _ = plan([OLD0, OLD1], 2, nodes)
    assert p.create == [Create("decode", 2 + i, "a", NEW, "Surge", ns) for i, ns in enumerate(surged)]
    assert (p.delete, p.drain) == ([], [])
    assert (p.old_groups, p.rollout_blocked, p.unplaced) == (2, False, unplaced)


def test_rollout_deletes_nothing_while_the_surge_group_starts():
    surge = group(2, "a-4", "a-5", ready=False)
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=6))
    assert (p.create, p.delete) == ([], [])


def test_rollout_deletes_nothing_while_the_surge_group_is_still_gated():
    surge = group(2, "a-4", "a-5", bound=False, gated=True)
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=6))
    assert (p.create, p.delete, p.release) == ([], [], ["m-decode-2"])


def test_rollout_deletes_as_many_old_groups_as_new_ones_do_not_fit_once_a_new_group_serves():
    surge = group(2, "a-4", "a-5")
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=6))
    assert p.delete == [Delete("decode", "m-decode-1", "Rollout")]
    assert (p.create, p.unplaced) == ([], 1)
    # With room for the second new group: it is created, and the old groups stay until both serve.
    p, _ = plan([OLD0, OLD1, surge], 2, cluster(a=8))
    assert p.create == [Create("decode", 3, "a", NEW, "Surge", ("a-6", "a-7"))]
    assert p.delete == []
    p, _ = plan([OLD0, OLD1, surge, group(3, "a-6", "a-7")], 2, cluster(a=8))
    assert p.delete == [Delete("decode", "m-decode-1", "Rollout"), Delete("decode", "m-decode-0", "Rollout")]
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
    assert p.create == [Create("decode", 1, "a", NEW, "Surge", ("a-2", "a-3"))]
    # While the new group starts, the last old group stays (and the rollout is not "blocked").
    p, _ = plan([OLD0, group(1, "a-2", "a-3", ready=False)], 2, nodes)
    assert (p.create, p.delete, p.rollout_blocked) == ([], [], False)
    # Once it serves, the last old group is replaced in place.
    p, _ = plan([OLD0, group(1, "a-2", "a-3")], 2, nodes)
    assert p.delete == [Delete("decode", "m-decode-0", "Rollout")]
    assert p.create == []


def test_deleting_groups_hold_their_slot_but_are_not_alive():
    gone = deleting(group(1, "a-2", "a-3"))
    p, _ = plan([group(0, "a-0", "a-1"), gone], 2, cluster(a=6))
    assert p.states["m-decode-1"] == "deleting"
    assert p.create == [Create("decode", 2, "a", NEW, "Missing", ("a-4", "a-5"))]
    assert p.delete == []


def test_ready_counts_serving_groups_only():
    groups = [
        group(0, "a-0", "a-1"),
        group(1, "a-2", "a-3", ready=False),
        group(2, "a-4", "a-5", bound=False, gated=True),
        group(3, "a-6", "a-7", draining_since=NOW),
    ]
    p, _ = plan(groups, 3, cluster(a=8), drain=WATCHED)
    assert p.states == {
        "m-decode-0": "serving",
        "m-decode-1": "starting",
        "m-decode-2": "reserved",
        "m-decode-3": "draining",
    }
    assert p.ready == 1


# ---------------------------------------------------------------------------------------------- property

SHAPES = [GroupShape(2, 4), GroupShape(4, 4), GroupShape(8, 4), GroupShape(12, 4)]
DRAIN_SECONDS, SETTLE = 600.0, 6.0


def rarely(draw) -> bool:
    return draw(st.integers(0, 9)) == 0


def seldom(draw) -> bool:
    return draw(st.integers(0, 19)) == 0


@st.composite
def drain_policies(draw, names: list[str]):
    """No policy, drains not observed (seconds 0, or no metrics), or observed with each group's in-flight
    count unknown, 0 or busy."""
    kind = draw(st.sampled_from(["none", "seconds 0", "no metrics", "observed", "observed"]))
    inflight = {n: v for n in names if (v := draw(st.sampled_from([None, 0.0, 3.0]))) is not None}
    if kind == "none":
        return None
    if kind == "seconds 0":
        return DrainPolicy(0, inflight)
    if kind == "no metrics":
        return DrainPolicy(DRAIN_SECONDS, None)
    return DrainPolicy(DRAIN_SECONDS, inflight, SETTLE)


@st.composite
def scenarios(draw):
    """A cluster of up to 3 domains, up to 5 observed groups in any state (some draining, some of an older
    revision), a desired count, a placement policy, a drain policy and whether the deployment's other
    roles serve the new generation.

    Every rank of a group is assigned a node of its domain (recorded on its pods, rarely not: placed before
    nodes were assigned); its pod may be missing, gated, released but unbound, or bound there."""
    shape = draw(st.sampled_from(SHAPES))
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    nodes, health = [], {}
    free = {d: [f"{d}-{i}" for i in range(n)] for d, n in zip("abc", sizes, strict=False)}
    for d, names in free.items():
        for name in names:
            if seldom(draw):
                continue  # the node is gone (its pods may still name it)
            ready = not seldom(draw)
            schedulable = not seldom(draw)
            nodes.append(NodeInfo(name, d, 4, ready, schedulable))
            since = None if ready else draw(st.sampled_from([NOW - 5, NOW - 99]))
            health[name] = NodeHealth(ready, since, schedulable)
    extra = []
    groups = []
    for slot in sorted(draw(st.sets(st.integers(0, 7), max_size=5))):
        domain = draw(st.sampled_from(sorted(free)))
        terminating = rarely(draw)
        # A creation the operator did not finish (not recorded, not released, some ranks missing).
        interrupted = shape.nodes > 1 and draw(st.integers(0, 3)) == 0
        gated = interrupted or (shape.nodes > 1 and rarely(draw))
        pinned = not rarely(draw)
        assigned = [free[domain].pop(0) if free[domain] else None for _ in range(shape.nodes)]
        pods = []
        for rank, node in enumerate(assigned):
            if rarely(draw) or (interrupted and draw(st.booleans())):
                if node is not None and rarely(draw):
                    extra.append(GpuUse(1, node))  # someone took its node meanwhile
                continue  # rank missing
            bound = node is not None and not gated and not rarely(draw)
            phase = "Pending" if not bound else ("Failed" if rarely(draw) else "Running")
            ready = phase == "Running" and draw(st.integers(0, 3)) > 0
            deleting = terminating or rarely(draw)
            words = draw(st.sampled_from(["", WORDS]))
            pods.append(
                PodView(
                    f"m-decode-{slot}-{rank}",
                    rank,
                    phase,
                    ready,
                    node if bound else None,
                    deleting,
                    waiting=words if not ready else "",
                    gated=gated,
                    pinned=node if pinned else None,
                )
            )
        if not pods:
            continue
        recorded_nodes = tuple(assigned) if pinned and all(assigned) else ()
        draining = not interrupted and draw(st.integers(0, 4)) == 0
        groups.append(
            GroupView(
                name=f"m-decode-{slot}",
                role="decode",
                slot=slot,
                revision=draw(st.sampled_from([NEW, NEW, NEW, OLD] if interrupted else [NEW, OLD])),
                domain=domain,
                size=shape.nodes,
                gpus=shape.gpus,
                pods=tuple(pods),
                recorded=not interrupted and not rarely(draw),
                nodes=recorded_nodes,
                released_at=None if gated else draw(st.sampled_from([NOW - 10, NOW - BIND - 1])),
                draining_since=(
                    NOW - draw(st.sampled_from([0.0, 1.0, SETTLE, 300.0, DRAIN_SECONDS, 900.0]))
                    if draining
                    else None
                ),
            )
        )
    desired = draw(st.one_of(st.just(len(groups)), st.integers(0, 6)))
    policy = draw(st.sampled_from(["pack", "spread"]))
    drain = draw(drain_policies([g.name for g in groups]))
    other_roles_ready = draw(st.integers(0, 3)) > 0
    return shape, nodes, health, groups, desired, policy, extra, drain, other_roles_ready


def _run(shape, nodes, health, groups, desired, policy, extra, drain, other_roles_ready):
    domains = domains_of(nodes, groups, extra, shape=shape)
    return domains, plan_role(
        Wanted("decode", desired, NEW, shape),
        groups,
        Placing(domains, policy),
        Judging(health, NOW, TOL, BIND),
        Leaving(0.0, drain, other_roles_ready),
    )


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_plan_role_invariants(scenario):
    shape, nodes, health, groups, desired, policy, extra, drain, other_roles_ready = scenario
    domains, (p, after) = _run(*scenario)
    states = p.states
    by_name = {g.name: g for g in groups}
    by_slot = {g.slot: g for g in groups}
    deleted = {d.name for d in p.delete}
    drained = {d.name for d in p.drain}
    observed = drain is not None and drain.seconds > 0 and drain.inflight is not None
    seen = {g.name: classify(g, health, NOW, TOL, BIND)[0] for g in groups}
    undrained_state = {
        g.name: classify(replace(g, draining_since=None), health, NOW, TOL, BIND)[0] for g in groups
    }

    # States are lifecycle's, except a reserved group that cannot be completed (then broken), a draining
    # group taken back into routing (then what it would be without the drain), and a group whose drain
    # starts now.
    for g in groups:
        state, now_state = seen[g.name], states[g.name]
        if g.name in p.undrain:
            assert (state, now_state) == ("draining", undrained_state[g.name])
        elif g.name in drained:
            assert (state, now_state) == ("serving", "draining")
        else:
            assert now_state == state or (state, now_state) == ("reserved", "broken")
    alive = [g for g in groups if seen[g.name] in ALIVE and states[g.name] != "broken"]
    # What counts toward `desired`: alive groups not draining (one taken back counts again).
    counted = [g for g in alive if seen[g.name] != "draining" or g.name in p.undrain]
    new = [g for g in counted if g.revision == NEW]
    old = [g for g in counted if g.revision != NEW]
    assert p.old_groups == len(old)

    # Every pod created has room on its node, inside its group's domain: taking them in order never
    # fails, and the domains returned are exactly that.
    state = dict(domains)
    for cr in p.create:
        want = len(cr.ranks) if cr.reason == "Complete" else shape.nodes
        assert len(cr.nodes) == want
        assert len(set(cr.nodes)) == want, "two ranks of a group on one node"
        assert set(cr.nodes) <= set(domains[cr.domain].free), "a group outside its domain"
        state[cr.domain] = take(state[cr.domain], cr.nodes, shape.pod_gpus)
    assert after == state
    # No plan gives room back: the GPUs of groups draining, or deleted by it, stay taken (they are
    # free once the pods are gone), so a new group never lands on them in the same plan.
    for name, d in after.items():
        assert all(d.free[n] <= domains[name].free[n] for n in d.free)

    # A completed group keeps its slot and domain, creates exactly its missing ranks, on its recorded nodes.
    for cr in p.create:
        if cr.reason == "Complete":
            g = by_slot[cr.slot]
            assert states[g.name] == "reserved"
            assert g.name not in deleted
            assert (cr.domain, cr.revision, list(cr.ranks)) == (g.domain, NEW, missing_ranks(g))
            if len(g.nodes) == g.size:
                assert cr.nodes == tuple(g.nodes[r] for r in cr.ranks)
            else:
                assert not set(cr.nodes) & {q.pinned or q.node for q in g.pods}
        else:
            assert cr.ranks == ()

    # New groups take fresh slots, at the current revision; exactly as many as the counted groups of the
    # current revision fall short of `desired`, less those that found no room (a rollout's are surges).
    placed = [cr for cr in p.create if cr.reason != "Complete"]
    slots = [cr.slot for cr in placed]
    assert len(set(slots)) == len(slots)
    assert not {g.slot for g in groups} & set(slots)
    assert all(cr.revision == NEW for cr in placed)
    assert len(placed) + p.unplaced == max(desired - len(new), 0)
    if old:
        assert {cr.reason for cr in placed} <= {"Surge"}
    else:
        assert {cr.reason for cr in placed} <= {"Missing", "Replace"}

    # Draining groups of the current revision are taken back, lowest slot first, before any group is
    # created, and only as many as are needed; never one of an older revision.
    draining_new = sorted(
        (g for g in groups if seen[g.name] == "draining" and g.revision == NEW), key=lambda g: g.slot
    )
    base = len([g for g in new if g.name not in p.undrain])
    assert p.undrain == [g.name for g in draining_new[: max(desired - base, 0)]]
    if placed:
        assert set(p.undrain) == {g.name for g in draining_new}
    # The drains under way are reported with how long they have taken, whether or not they end now.
    still = {g.name for g in groups if seen[g.name] == "draining" and g.name not in p.undrain}
    assert p.draining == {n: NOW - by_name[n].draining_since for n in still}
    assert p.drain_started == pytest.approx({n: by_name[n].draining_since for n in still})

    # A drain starts only for a serving group, only when drains are observed, for a surplus or a rollout;
    # a group is drained, deleted, taken back or created at most once.
    assert drained <= {g.name for g in counted if seen[g.name] == "serving"}
    assert not drained or observed
    assert all(d.reason in ("Surplus", "Rollout") for d in p.drain)
    assert all(d.inflight == (drain.inflight or {}).get(d.name) for d in p.drain)
    assert len(drained) == len(p.drain)
    assert not drained & deleted
    assert not drained & set(p.undrain)
    assert not deleted & set(p.undrain)
    assert len(deleted) == len(p.delete)

    # Every broken group goes; a draining group goes once idle (and settled) or out of time, or at once
    # when drains are not observed; a counted group goes only as a surplus (of the current revision) or
    # for the rollout (an older one), at once unless it serves and drains are observed.
    broken = {g.name for g in groups if states[g.name] == "broken"}
    for d in p.delete:
        g = by_name[d.name]
        if d.reason == "Broken":
            assert d.name in broken
        elif d.reason in ("Drained", "DrainTimedOut"):
            assert d.name in still
            since = NOW - g.draining_since
            known = None if drain is None or drain.inflight is None else drain.inflight.get(d.name)
            assert (d.inflight, d.drained_for) == (known, since)
            if not observed or (known == 0 and since >= SETTLE):
                assert d.reason == "Drained"
            else:
                assert (d.reason, since >= DRAIN_SECONDS) == ("DrainTimedOut", True)
        else:
            assert g in counted
            assert d.reason == ("Surplus" if g.revision == NEW else "Rollout")
            assert not (observed and seen[g.name] == "serving")
    assert broken <= deleted
    for name in still - deleted:  # a drain that goes on
        since, known = NOW - by_name[name].draining_since, (drain.inflight or {}).get(name)
        assert observed
        assert since < DRAIN_SECONDS
        assert not (known == 0 and since >= SETTLE)
    for d in p.drain:
        assert d.reason == ("Surplus" if by_name[d.name].revision == NEW else "Rollout")

    # A serving group of the current revision never leaves while it is needed.
    removed = deleted | drained
    if len(new) <= desired:
        assert not {g.name for g in new if states[g.name] == "serving"} & removed
    surplus = {d.name for d in [*p.delete, *p.drain] if d.reason == "Surplus"}
    assert len(surplus) == max(len(new) - desired, 0)

    # Old groups leave only once the new generation can serve (a serving group of it in every role), all
    # of them once the new ones all serve; else only as many as the new groups that found no room (less
    # the old groups already leaving, whose room comes back), or, with no new group at all and no room for
    # one, a single one while another old group keeps serving.
    rollout = {d.name for d in [*p.delete, *p.drain] if d.reason == "Rollout"}
    assert rollout <= {g.name for g in old}
    serving_new = [g for g in new if (undrained_state if g.name in p.undrain else seen)[g.name] == "serving"]
    ready = bool(serving_new) and other_roles_ready
    final = desired == 0 or (
        ready
        and len(new) >= desired
        and all(states[g.name] == "serving" for g in new if g.name not in removed)
    )
    leaving = sum(
        1
        for g in groups
        if g.revision != NEW
        and (g.name in still or states[g.name] in ("deleting", "broken"))
        and all(q.node in health and health[q.node].ready for q in g.pods if q.node is not None)
    )
    serving_old = [g for g in old if seen[g.name] == "serving"]
    if final:
        assert rollout == {g.name for g in old}
    elif ready:
        assert len(rollout) == min(max(p.unplaced - leaving, 0), len(old))
    elif p.unplaced and not new and not placed and len(serving_old) > 1 and not leaving:
        assert len(rollout) == 1
    else:
        assert rollout == set()
    blocked = bool(old) and not final and not ready and p.unplaced > 0 and not new and not placed
    assert p.rollout_blocked == (blocked and len(serving_old) <= 1 and not leaving)
    # ... so at least one group stays in routing while the role has one: never all of the old generation
    # out of it before a group of the new one serves.
    in_routing = [g for g in counted if states[g.name] == "serving" and g.name not in removed]
    if desired > 0 and any(states[g.name] == "serving" for g in counted):
        assert in_routing

    # Whole reserved groups are released, unless deleted; every kept group not fully bound is reported.
    whole_reserved = {g.name for g in alive if states[g.name] == "reserved" and not missing_ranks(g)}
    assert set(p.release) == whole_reserved - deleted
    assert len(p.release) == len(set(p.release))
    not_bound = {
        g.name
        for g in alive
        if g.name not in deleted and (states[g.name] == "reserved" or any(q.node is None for q in g.pods))
    }
    assert set(p.unbound) == not_bound
    assert p.ready == sum(1 for g in groups if states[g.name] == "serving")

    # Deterministic, whatever order the groups are observed in.
    _, (again, after_again) = _run(*scenario)
    assert (again, after_again) == (p, after)
    reordered = (
        shape,
        nodes,
        health,
        list(reversed(groups)),
        desired,
        policy,
        extra,
        drain,
        other_roles_ready,
    )
    _, (rev, after_rev) = _run(*reordered)
    assert after_rev == after
    assert rev.states == p.states
    for attr in ("create", "delete", "drain"):
        assert sorted(map(repr, getattr(rev, attr))) == sorted(map(repr, getattr(p, attr)))
    assert sorted(rev.release) == sorted(p.release)
    assert (rev.undrain, rev.draining) == (p.undrain, p.draining)
    assert (rev.unplaced, rev.largest_block, rev.rollout_blocked) == (
        p.unplaced,
        p.largest_block,
        p.rollout_blocked,
    )


# ------------------------------------------------------------------ a role that left the spec (mode change)


def retired_plan(groups, nodes, *, other_roles_ready, others_short=False):
    """plan_role for a role no longer in the spec, as plan_all calls it (desired 0, no revision)."""
    return plan_role(
        Wanted("decode", 0, "", SHAPE),
        groups,
        Placing(domains_of(nodes, groups)),
        Judging(healthy(nodes), NOW, TOL, BIND),
        Leaving(other_roles_ready=other_roles_ready, retired=True, others_short=others_short),
    )


def test_a_role_that_left_the_spec_serves_until_the_new_roles_serve():
    nodes = cluster(a=6)
    old = [group(0, "a-0", "a-1"), group(1, "a-2", "a-3")]
    p, _ = retired_plan(old, nodes, other_roles_ready=False)
    assert p.delete == []
    assert p.drain == []
    p, _ = retired_plan(old, nodes, other_roles_ready=True)
    assert sorted(d.name for d in p.delete) == ["m-decode-0", "m-decode-1"]


def test_a_role_that_left_the_spec_makes_room_one_group_at_a_time_keeping_one_serving():
    nodes = cluster(a=6)
    old = [group(0, "a-0", "a-1"), group(1, "a-2", "a-3"), group(2, "a-4", "a-5")]
    p, _ = retired_plan(old, nodes, other_roles_ready=False, others_short=True)
    assert [d.name for d in p.delete] == ["m-decode-2"]
    p, _ = retired_plan(old[:1], nodes, other_roles_ready=False, others_short=True)
    assert p.delete == [], "the last serving group stays: the new roles report that they wait for room"


def test_replicas_zero_of_a_role_in_the_spec_still_removes_its_groups():
    nodes = cluster(a=6)
    old = [group(0, "a-0", "a-1", revision=OLD), group(1, "a-2", "a-3", revision=OLD)]
    p, _ = plan(old, 0, nodes, other_roles_ready=False)
    assert sorted(d.name for d in p.delete) == ["m-decode-0", "m-decode-1"]
