"""How groups leave (drains) and how a new revision replaces the old one (generations), in the group planner.

Table-driven: which groups start to drain, how a drain ends (idle and settled, or out of time), when a drain
is cancelled, and the rules of a generation rollout (surge wherever capacity allows, old groups removed
only once the generation can serve, room made batch by batch, a lone old group blocks). Then a property
test over random sequences of reconcile passes against a simulated cluster (pods becoming ready, drains
finishing, pods vanishing, capacity coming and going, scale changes and rollouts).

Fixtures are test_groups.py's: groups of two 4-GPU pods on 4-GPU nodes `<domain>-<i>`, so a node holding a
pod of any group (draining or deleting too) has no room left.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.planning.test_groups import (
    BIND,
    NEW,
    NOW,
    OLD,
    SHAPE,
    TOL,
    cluster,
    deleting,
    domains_of,
    group,
    healthy,
    with_pod,
)
from tokenfab.planning.groups import (
    Create,
    Delete,
    Drain,
    DrainPolicy,
    GroupView,
    Judging,
    Leaving,
    Placing,
    PodView,
    RolePlan,
    Wanted,
    plan_role,
)
from tokenfab.planning.lifecycle import NodeHealth, classify
from tokenfab.planning.topology import GpuUse, NodeInfo, build_domains, largest_block

SECONDS, SETTLE = 600.0, 6.0


def watched(**inflight: float) -> DrainPolicy:
    """Drains observed: a Prometheus reports these in-flight requests (by slot: g1=3 is m-decode-1's)."""
    return DrainPolicy(SECONDS, {f"m-decode-{k[1:]}": v for k, v in inflight.items()}, SETTLE)


def run(
    groups: list[GroupView],
    desired: int,
    nodes: list[NodeInfo],
    drain: DrainPolicy | None = None,
    *,
    revision: str = NEW,
    ready: bool = True,
    hold: float = 0.0,
    extra: tuple[GpuUse, ...] = (),
) -> RolePlan:
    plan, _ = plan_role(
        Wanted("decode", desired, revision, SHAPE),
        groups,
        Placing(domains_of(nodes, groups, extra)),
        Judging(healthy(nodes), NOW, TOL, BIND),
        Leaving(hold, drain, ready),
    )
    return plan


def draining(g: GroupView, since: float) -> GroupView:
    """The group has been draining for `since` seconds."""
    return replace(g, draining_since=NOW - since)


def serving(n: int, revision: str = NEW, first: int = 0) -> list[GroupView]:
    """n serving groups at slots first.. on nodes a-(2*slot) and a-(2*slot+1)."""
    return [group(s, f"a-{2 * s}", f"a-{2 * s + 1}", revision=revision) for s in range(first, first + n)]


G0, G1, G2 = serving(3)

# --------------------------------------------------------------------------------------- drains start


def test_a_surplus_serving_group_drains_instead_of_being_deleted():
    p = run([G0, G1, G2], 1, cluster(a=6), watched(g2=4))
    # Highest slot first; the in-flight count when it starts is reported when known.
    assert p.drain == [
        Drain("decode", "m-decode-2", "Surplus", 4),
        Drain("decode", "m-decode-1", "Surplus", None),
    ]
    assert (p.delete, p.create, p.undrain) == ([], [], [])
    assert p.states == {"m-decode-0": "serving", "m-decode-1": "draining", "m-decode-2": "draining"}
    assert p.ready == 1
    assert p.draining == {}  # (drains that started before this pass)


@pytest.mark.parametrize(
    "g1",
    [
        pytest.param(group(1, "a-2", "a-3", ready=False), id="starting"),
        pytest.param(group(1, "a-2", "a-3", bound=False), id="starting, not bound"),
        pytest.param(group(1, "a-2", "a-3", bound=False, gated=True), id="reserved"),
        pytest.param(with_pod(G1, 1, ready=False), id="serving no more: a pod not ready"),
    ],
)
def test_a_drain_is_never_started_for_a_group_that_does_not_serve(g1):
    p = run([G0, g1], 1, cluster(a=4), watched(g1=0))
    assert p.delete == [Delete("decode", "m-decode-1", "Surplus")]
    assert (p.drain, p.draining) == ([], {})


@pytest.mark.parametrize(
    "drain",
    [
        pytest.param(None, id="no policy"),
        pytest.param(DrainPolicy(0, {"m-decode-1": 0, "m-decode-2": 5}), id="drainSeconds 0"),
        pytest.param(DrainPolicy(SECONDS, None), id="no Prometheus"),
    ],
)
def test_without_observation_nothing_drains_groups_go_at_once(drain):
    # (Their engines drain on SIGTERM within the pods' grace period.)
    p = run([G0, G1, G2], 1, cluster(a=6), drain)
    assert p.delete == [Delete("decode", "m-decode-2", "Surplus"), Delete("decode", "m-decode-1", "Surplus")]
    assert (p.drain, p.draining) == ([], {})
    assert not DrainPolicy().observed


def test_a_rollout_drains_the_old_groups_that_serve_and_deletes_the_others():
    old = [*serving(2, OLD), group(2, "a-4", "a-5", revision=OLD, ready=False)]
    new = serving(3, first=3)
    p = run([*old, *new], 3, cluster(a=12), watched(g0=1, g1=0))
    assert p.delete == [Delete("decode", "m-decode-2", "Rollout")]
    assert p.drain == [
        Drain("decode", "m-decode-1", "Rollout", 0),
        Drain("decode", "m-decode-0", "Rollout", 1),
    ]
    assert (p.create, p.old_groups) == ([], 3)


# ----------------------------------------------------------------------------------------- drains end


@pytest.mark.parametrize(
    ("policy", "since", "expected"),
    [
        pytest.param(
            watched(g1=0), SETTLE, Delete("decode", "m-decode-1", "Drained", 0, SETTLE), id="idle, settled"
        ),
        pytest.param(watched(g1=0), SETTLE - 0.5, None, id="idle, not settled yet"),
        pytest.param(watched(g1=0), 0.0, None, id="idle, just started"),
        pytest.param(watched(g1=2), SECONDS - 0.5, None, id="busy"),
        pytest.param(
            watched(g1=2),
            SECONDS,
            Delete("decode", "m-decode-1", "DrainTimedOut", 2, SECONDS),
            id="busy at the deadline",
        ),
        pytest.param(
            watched(g1=2), 900.0, Delete("decode", "m-decode-1", "DrainTimedOut", 2, 900.0), id="busy past it"
        ),
        pytest.param(watched(), SECONDS - 1, None, id="unknown: waits"),
        pytest.param(
            watched(),
            SECONDS,
            Delete("decode", "m-decode-1", "DrainTimedOut", None, SECONDS),
            id="unknown at the deadline",
        ),
        pytest.param(
            watched(g1=0),
            700.0,
            Delete("decode", "m-decode-1", "Drained", 0, 700.0),
            id="idle past the deadline",
        ),
        pytest.param(DrainPolicy(SECONDS, {"m-decode-1": 0}, 30), 29.0, None, id="longer settle"),
        pytest.param(
            DrainPolicy(SECONDS, {"m-decode-1": 0}, 30),
            30.0,
            Delete("decode", "m-decode-1", "Drained", 0, 30.0),
            id="longer settle, settled",
        ),
        pytest.param(
            DrainPolicy(60, {"m-decode-1": 1}),
            60.0,
            Delete("decode", "m-decode-1", "DrainTimedOut", 1, 60.0),
            id="shorter deadline",
        ),
        # Drains no longer observed (the Prometheus went from the spec, or drainSeconds 0): it goes now.
        pytest.param(
            DrainPolicy(SECONDS, None),
            1.0,
            Delete("decode", "m-decode-1", "Drained", None, 1.0),
            id="no Prometheus any more",
        ),
        pytest.param(
            DrainPolicy(0, {"m-decode-1": 5}),
            1.0,
            Delete("decode", "m-decode-1", "Drained", 5, 1.0),
            id="drainSeconds 0 now",
        ),
        pytest.param(None, 2.0, Delete("decode", "m-decode-1", "Drained", None, 2.0), id="no policy"),
    ],
)
def test_a_draining_group_goes_once_idle_and_settled_or_out_of_time(policy, since, expected):
    p = run([G0, draining(G1, since)], 1, cluster(a=4), policy)
    assert p.delete == ([expected] if expected else [])
    assert p.states["m-decode-1"] == "draining"
    assert p.draining == {"m-decode-1": since}
    assert (p.create, p.drain, p.undrain, p.ready) == ([], [], [], 1)


def test_a_draining_group_that_breaks_is_deleted_as_broken():
    failed = with_pod(draining(G1, 10), 1, phase="Failed", ready=False)
    p = run([G0, failed], 1, cluster(a=4), watched(g1=3))
    assert p.delete == [Delete("decode", "m-decode-1", "Broken")]
    assert (p.states["m-decode-1"], p.draining) == ("broken", {})


# ------------------------------------------------------------------------------------------- capacity


def test_draining_groups_keep_their_nodes_and_never_count_toward_desired():
    # Two groups drain (an older revision's, so none is taken back); one serves; three are wanted.
    old = [draining(g, 10) for g in serving(2, OLD, first=1)]
    p = run([G0, *old], 3, cluster(a=8), watched())
    assert p.create == [Create("decode", 3, "a", NEW, "Missing", ("a-6", "a-7"))]
    assert p.unplaced == 1
    assert (p.delete, p.drain, p.undrain) == ([], [], [])
    assert set(p.draining) == {"m-decode-1", "m-decode-2"}


def test_the_room_of_a_group_deleted_after_its_drain_is_not_reused_in_the_same_plan():
    old = draining(group(1, "a-2", "a-3", revision=OLD), 60)
    p = run([G0, old], 2, cluster(a=4), watched(g1=0))
    assert p.delete == [Delete("decode", "m-decode-1", "Drained", 0, 60)]
    assert (p.create, p.unplaced) == ([], 1)  # its pods still hold a-2 and a-3 until they are gone


# --------------------------------------------------------------------------------------------- undrain


def test_a_scale_up_during_a_drain_takes_the_draining_group_back_instead_of_creating_one():
    p = run([G0, draining(G1, 30), draining(G2, 20)], 2, cluster(a=8), watched(g1=2, g2=1))
    assert p.undrain == ["m-decode-1"]  # lowest slot first, only as many as needed
    assert p.states == {"m-decode-0": "serving", "m-decode-1": "serving", "m-decode-2": "draining"}
    assert p.draining == {"m-decode-2": 20}  # the one taken back drains no more
    assert (p.create, p.delete, p.drain, p.ready) == ([], [], [], 2)


def test_every_draining_group_is_taken_back_before_any_group_is_created():
    p = run([G0, draining(G1, 30), draining(G2, 20)], 4, cluster(a=8), watched())
    assert p.undrain == ["m-decode-1", "m-decode-2"]
    assert p.create == [Create("decode", 3, "a", NEW, "Missing", ("a-6", "a-7"))]
    assert (p.delete, p.draining) == ([], {})


@pytest.mark.parametrize(
    "drain", [None, DrainPolicy(SECONDS, None), watched(g1=0)], ids=["none", "no metrics", "idle"]
)
def test_a_needed_draining_group_is_taken_back_whatever_the_drain_policy(drain):
    # (Taken back rather than deleted, and replaced by a new group.)
    p = run([G0, draining(G1, SECONDS + 1)], 2, cluster(a=6), drain)
    assert (p.undrain, p.delete, p.create) == (["m-decode-1"], [], [])


def test_a_group_taken_back_whose_pod_is_not_ready_is_starting_not_serving():
    g1 = with_pod(draining(G1, 5), 0, ready=False)
    p = run([G0, g1], 2, cluster(a=6), watched())
    assert p.undrain == ["m-decode-1"]
    assert p.states["m-decode-1"] == "starting"
    assert p.ready == 1


def test_a_draining_group_is_taken_back_during_a_backoff_too():
    p = run([draining(G0, 5)], 2, cluster(a=6), watched(), hold=30)
    assert (p.undrain, p.create, p.backoff) == (["m-decode-0"], [], 30)


def test_a_draining_group_of_an_older_revision_is_never_taken_back():
    old = draining(group(1, "a-2", "a-3", revision=OLD), 5)
    p = run([G0, old], 2, cluster(a=6), watched())
    assert p.undrain == []
    assert p.create == [Create("decode", 2, "a", NEW, "Missing", ("a-4", "a-5"))]
    assert p.draining == {"m-decode-1": 5}


# ------------------------------------------------------------------------------------------ generations


@pytest.mark.parametrize(("free_nodes", "surged"), [(6, 3), (5, 2), (2, 1)])
def test_a_rollout_creates_the_new_generation_wherever_capacity_allows(free_nodes, surged):
    p = run(serving(3, OLD), 3, cluster(a=6 + free_nodes), watched())
    assert [(c.slot, c.reason) for c in p.create] == [(3 + i, "Surge") for i in range(surged)]
    assert p.unplaced == 3 - surged
    assert (p.delete, p.drain, p.old_groups, p.rollout_blocked) == ([], [], 3, False)


def test_no_old_group_leaves_in_the_pass_that_surges_before_the_generation_serves():
    p = run(serving(2, OLD), 2, cluster(a=6), watched())
    assert [c.reason for c in p.create] == ["Surge"]
    assert (p.unplaced, p.drain, p.delete) == (1, [], [])


@pytest.mark.parametrize(
    ("new", "other_roles_ready", "removed"),
    [
        pytest.param(serving(2, first=2), True, ["m-decode-1", "m-decode-0"], id="all serve"),
        pytest.param(serving(2, first=2), False, [], id="another role has no serving group of it"),
        pytest.param(
            [*serving(1, first=2), group(3, "a-6", "a-7", ready=False)], True, [], id="one still starts"
        ),
        pytest.param([group(2, "a-4", "a-5", ready=False)], True, [], id="none serves, one not placed"),
    ],
)
def test_old_groups_leave_only_once_the_generation_is_ready(new, other_roles_ready, removed):
    p = run(
        [*serving(2, OLD), *new], 2, cluster(a=8 if len(new) == 2 else 6), watched(), ready=other_roles_ready
    )
    assert [d.name for d in p.drain] == removed
    assert all(d.reason == "Rollout" for d in p.drain)
    assert (p.delete, p.rollout_blocked) == ([], False)


def _view(groups: dict[str, GroupView], rollout_drains: list[str], now_since: float) -> list[GroupView]:
    return [draining(g, now_since) if g.name in rollout_drains else g for g in groups.values()]


def test_room_is_made_batch_by_batch():
    """4 old groups, room for one more: a step of the whole rollout per pass."""
    nodes = cluster(a=10)
    olds = {g.name: g for g in serving(4, OLD)}
    # Room for one new group: it surges; the others have no room.
    p = run(list(olds.values()), 4, nodes, watched())
    assert [(c.slot, c.nodes) for c in p.create] == [(4, ("a-8", "a-9"))]
    assert (p.unplaced, p.drain) == (3, [])
    surge = group(4, "a-8", "a-9", ready=False)
    p = run([*olds.values(), surge], 4, nodes, watched())
    assert (p.create, p.drain, p.unplaced) == ([], [], 3)  # not before it serves
    surge = group(4, "a-8", "a-9")
    p = run([*olds.values(), surge], 4, nodes, watched())
    batch = ["m-decode-3", "m-decode-2", "m-decode-1"]
    assert [d.name for d in p.drain] == batch  # room for the 3 that do not fit
    # While they drain, their room is on its way: no more old groups leave (m-decode-0 keeps serving).
    for since in (10.0, SECONDS - 1):
        p = run([*_view(olds, batch, since), surge], 4, nodes, watched())
        assert (p.drain, p.delete, p.rollout_blocked, p.unplaced) == ([], [], False, 3)
    # Drained: deleted, pods terminating (room still held); still nothing more leaves.
    p = run([*_view(olds, batch, 60), surge], 4, nodes, watched(g1=0, g2=0, g3=0))
    assert sorted(d.name for d in p.delete) == sorted(batch)
    terminating = [deleting(olds[n]) for n in batch]
    p = run([olds["m-decode-0"], *terminating, surge], 4, nodes, watched())
    assert (p.drain, p.delete, p.create) == ([], [], [])
    # Gone: the next batch of new groups takes their room; the last old group goes once they all serve.
    p = run([olds["m-decode-0"], surge], 4, nodes, watched())
    assert [c.slot for c in p.create] == [1, 2, 3]
    assert (p.drain, p.unplaced) == ([], 0)
    news = [surge, *(group(s, f"a-{2 * s}", f"a-{2 * s + 1}", ready=False) for s in (1, 2, 3))]
    p = run([olds["m-decode-0"], *news], 4, nodes, watched())
    assert (p.drain, p.delete, p.create) == ([], [], [])
    news = [surge, *serving(3, first=1)]
    p = run([olds["m-decode-0"], *news], 4, nodes, watched())
    assert p.drain == [Drain("decode", "m-decode-0", "Rollout", None)]
    assert p.old_groups == 1


@pytest.mark.parametrize("observed", [True, False])
def test_without_room_for_one_new_group_one_old_group_makes_room_and_no_second_one_while_it_goes(observed):
    drain = watched() if observed else None
    olds = serving(3, OLD)
    p = run(olds, 3, cluster(a=6), drain)
    leaving = [*p.drain, *p.delete]
    assert [(d.name, d.reason) for d in leaving] == [("m-decode-2", "Rollout")]
    assert (p.create, p.unplaced, p.rollout_blocked) == ([], 3, False)
    # Next pass: it drains (observed) or its pods terminate (not): the others stay.
    going = draining(olds[2], 10) if observed else deleting(olds[2])
    p = run([*olds[:2], going], 3, cluster(a=6), drain)
    assert (p.drain, p.delete, p.create, p.rollout_blocked) == ([], [], [], False)
    # Gone: a new group takes its room.
    p = run(olds[:2], 3, cluster(a=6), drain)
    assert [(c.slot, c.reason) for c in p.create] == [(2, "Surge")]


def test_a_terminating_old_group_on_a_lost_node_is_no_room_on_its_way():
    # (Its pods may stay Terminating as long as the node is gone: waiting for that room could be forever.)
    olds = serving(3, OLD)
    nodes = [n for n in cluster(a=6) if n.name != "a-5"]
    p = run([*olds[:2], deleting(olds[2])], 3, nodes, watched())
    assert [(d.name, d.reason) for d in p.drain] == [("m-decode-1", "Rollout")]


def test_a_lone_old_group_without_room_blocks_the_rollout():
    p = run(serving(1, OLD), 1, cluster(a=3), watched())
    assert (p.create, p.drain, p.delete) == ([], [], [])
    assert p.rollout_blocked
    assert p.largest_block == (4, "a")
    assert p.unplaced == 1


def test_a_lone_serving_old_group_beside_a_leaving_one_waits_unblocked():
    olds = serving(2, OLD)
    p = run([olds[0], draining(olds[1], 10)], 2, cluster(a=4), watched())
    assert (p.create, p.drain, p.delete, p.rollout_blocked) == ([], [], [], False)


@pytest.mark.parametrize("revision", [NEW, ""], ids=["scaled to zero", "role removed from the spec"])
def test_old_groups_of_a_role_wanted_no_more_all_leave(revision):
    groups = [*serving(2, OLD), group(2, "a-4", "a-5", revision=OLD, ready=False)]
    p = run(groups, 0, cluster(a=6), watched(), revision=revision, ready=False)
    assert p.delete == [Delete("decode", "m-decode-2", "Rollout")]
    assert [d.name for d in p.drain] == ["m-decode-1", "m-decode-0"]
    assert p.create == []
    p = run(groups, 0, cluster(a=6), None, revision=revision, ready=False)
    assert sorted(d.name for d in p.delete) == ["m-decode-0", "m-decode-1", "m-decode-2"]


def test_a_surplus_new_group_and_the_old_generation_leave_together_once_the_new_one_serves():
    p = run([*serving(1, OLD), *serving(2, first=1)], 1, cluster(a=6), watched())
    assert [(d.name, d.reason) for d in p.drain] == [("m-decode-2", "Surplus"), ("m-decode-0", "Rollout")]


# --------------------------------------------------------------------------------------------- property
#
# One role's groups against a simulated cluster, pass after pass. Between two passes, any of: a starting
# group becomes ready; a pod stops being ready or fails; a deleting group's pods vanish; a draining
# group's in-flight count becomes known, busy or 0; time passes; the desired count changes; the spec
# changes (a new revision); other tenants take or free room on a node; the deployment's other roles stop
# or start serving the new generation. A pass plans from what it sees and its plan is applied at once.
# At the end, the room taken by others is freed and the cluster settles: the plan must converge.

DOMAINS = {"a": 6, "b": 6}  # 4-GPU nodes: 3 groups of 8 GPUs per domain


@dataclass
class SimGroup:
    slot: int
    revision: str
    domain: str
    nodes: tuple[str, ...]
    ready: bool = False
    failed: bool = False
    deleting: bool = False
    draining_since: float | None = None
    left_for: str = ""  # the reason of the drain or delete that took it out


@dataclass
class Sim:
    observed: bool
    now: float = NOW
    revision: str = "r0"
    desired: int = 2
    other_roles_ready: bool = True
    groups: dict[str, SimGroup] = field(default_factory=dict)
    inflight: dict[str, float] = field(default_factory=dict)
    others: list[GpuUse] = field(default_factory=list)
    next_revision: int = 1

    @property
    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(f"{d}-{i}", d, 4, True, True) for d, n in DOMAINS.items() for i in range(n)]

    def view(self, name: str) -> GroupView:
        g = self.groups[name]
        pods = tuple(
            PodView(
                f"{name}-{r}",
                r,
                "Failed" if g.failed and r == 1 else "Running",
                g.ready and not g.failed,
                node,
                g.deleting,
                pinned=node,
            )
            for r, node in enumerate(g.nodes)
        )
        return GroupView(
            name,
            "decode",
            g.slot,
            g.revision,
            g.domain,
            len(g.nodes),
            SHAPE.gpus,
            pods,
            True,
            g.nodes,
            released_at=NOW,
            draining_since=g.draining_since,
        )

    def views(self) -> list[GroupView]:
        return [self.view(n) for n in sorted(self.groups)]

    def used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups.values():
            for n in g.nodes:
                out[n] = out.get(n, 0) + SHAPE.pod_gpus
        for u in self.others:
            out[u.node] = out.get(u.node, 0) + u.gpus
        return out

    def drain_policy(self) -> DrainPolicy | None:
        return DrainPolicy(SECONDS, dict(self.inflight), SETTLE) if self.observed else None

    def plan(self) -> RolePlan:
        groups = self.views()
        uses = [GpuUse(SHAPE.pod_gpus, p.node, g.domain) for g in groups for p in g.pods] + self.others
        plan, _ = plan_role(
            Wanted("decode", self.desired, self.revision, SHAPE),
            groups,
            Placing(build_domains(self.nodes, uses)),
            Judging({n.name: NodeHealth(True) for n in self.nodes}, self.now, TOL, BIND),
            Leaving(0.0, self.drain_policy(), self.other_roles_ready),
        )
        return plan

    def apply(self, plan: RolePlan) -> None:
        for d in plan.delete:
            g = self.groups[d.name]
            g.deleting = True
            g.left_for = g.left_for if d.reason in ("Drained", "DrainTimedOut") else d.reason
        for d in plan.drain:
            self.groups[d.name].draining_since = self.now
            self.groups[d.name].left_for = d.reason
        for name in plan.undrain:
            self.groups[name].draining_since = None
            self.groups[name].left_for = ""
            self.inflight.pop(name, None)
        for cr in plan.create:
            assert cr.reason != "Complete"
            self.groups[f"m-decode-{cr.slot}"] = SimGroup(cr.slot, cr.revision, cr.domain, cr.nodes)

    def in_routing(self) -> set[str]:
        """Groups a router sends requests to: serving, not draining, not being deleted."""
        health = {n.name: NodeHealth(True) for n in self.nodes}
        return {
            n
            for n, g in self.groups.items()
            if g.draining_since is None
            and classify(self.view(n), health, self.now, TOL, BIND)[0] == "serving"
        }

    def leaving_for_rollout(self) -> int:
        """Groups of an older revision out of routing for the rollout (draining, or pods terminating)."""
        return sum(
            1
            for g in self.groups.values()
            if g.revision != self.revision and g.left_for == "Rollout" and (g.deleting or g.draining_since)
        )

    def events(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = [("tick", "1"), ("tick", "7"), ("tick", "300"), ("tick", "601")]
        out += [("scale", str(n)) for n in range(5)] + [("rollout", ""), ("others", "")]
        for name, g in self.groups.items():
            if g.deleting:
                out.append(("gone", name))
                continue
            if not g.ready and not g.failed:
                out.append(("ready", name))
            if g.ready:
                out.append(("unready", name))
            out.append(("fail", name))
            if g.draining_since is not None:
                out += [("idle", name), ("busy", name), ("unknown", name)]
        used = self.used()
        out += [("take", n.name) for n in self.nodes if used.get(n.name, 0) < 4]
        out += [("free", u.node) for u in self.others]
        return out

    def event(self, kind: str, arg: str) -> None:
        g = self.groups.get(arg)
        if kind == "tick":
            self.now += float(arg)
        elif kind == "scale":
            self.desired = int(arg)
        elif kind == "rollout":
            self.revision = f"r{self.next_revision}"
            self.next_revision += 1
        elif kind == "others":
            self.other_roles_ready = not self.other_roles_ready
        elif kind == "take":
            self.others.append(GpuUse(4 - self.used().get(arg, 0), arg))
        elif kind == "free":
            self.others = [u for u in self.others if u.node != arg]
        elif kind == "gone":
            del self.groups[arg]
            self.inflight.pop(arg, None)
        elif g is not None and kind in ("ready", "unready"):
            g.ready = kind == "ready"
        elif g is not None and kind == "fail":
            g.failed = True
        elif kind in ("idle", "busy"):
            self.inflight[arg] = 0.0 if kind == "idle" else 3.0
        elif kind == "unknown":
            self.inflight.pop(arg, None)


def check_pass(sim: Sim, plan: RolePlan) -> None:
    """Invariants of one pass, checked around applying its plan."""
    before = {n: replace(g) for n, g in sim.groups.items()}
    routing_before = sim.in_routing()
    leaving_before = sim.leaving_for_rollout()
    # Each group is acted on at most once; only serving groups start to drain, only when drains are
    # observed; only draining groups of the current revision are taken back.
    acted = [d.name for d in plan.delete] + [d.name for d in plan.drain] + plan.undrain
    assert len(acted) == len(set(acted))
    assert not {f"m-decode-{c.slot}" for c in plan.create} & set(before)
    for d in plan.drain:
        assert sim.observed
        assert d.name in routing_before
    for name in plan.undrain:
        assert before[name].draining_since is not None
        assert before[name].revision == sim.revision
    # A drain never outlives its deadline (it ends, or is cancelled, in the first pass past it).
    for name, g in before.items():
        if g.draining_since is not None and not g.deleting and sim.now - g.draining_since >= SECONDS:
            assert name in {d.name for d in plan.delete} | set(plan.undrain)

    sim.apply(plan)

    # New groups only where there is room: no node holds more than it has (draining and terminating
    # pods hold theirs until they are gone).
    assert all(used <= 4 for used in sim.used().values()), sim.used()
    # A draining group never counts toward desired: the current revision's groups that are not leaving,
    # with those that found no room, are exactly what is wanted.
    counted = [
        g
        for g in sim.groups.values()
        if g.revision == sim.revision and not g.deleting and g.draining_since is None and not g.failed
    ]
    assert len(counted) + plan.unplaced == sim.desired
    # Never the last group in routing out of it while groups are wanted.
    if sim.desired >= 1 and routing_before:
        assert sim.in_routing(), "no group left in routing"
    # Old groups leave only once the new generation can serve (a group of it in routing, and the other
    # roles ready), except one, to make room, when no group of it exists and none could be placed.
    rollout = [d for d in [*plan.delete, *plan.drain] if d.reason == "Rollout"]
    ready = sim.other_roles_ready and any(sim.groups[n].revision == sim.revision for n in sim.in_routing())
    if rollout and sim.desired > 0 and not ready:
        assert len(rollout) == 1
        assert not plan.create
        assert plan.unplaced == sim.desired
        alive = [g for g in before.values() if not (g.failed or g.deleting or g.draining_since)]
        assert not any(g.revision == sim.revision for g in alive)
    # Room is made batch by batch: the old groups out of routing for the rollout never outnumber the new
    # groups that found no room (or one, to make room for the first), until the new generation serves.
    new_serving = [n for n in sim.in_routing() if sim.groups[n].revision == sim.revision]
    if sim.desired > 0 and len(new_serving) < sim.desired:
        assert sim.leaving_for_rollout() <= max(leaving_before, plan.unplaced, 1)


@st.composite
def histories(draw) -> tuple[Sim, list[RolePlan]]:
    data = draw(st.data())
    sim = Sim(observed=draw(st.booleans(), label="drains observed"))
    sim.desired = draw(st.integers(1, 4), label="desired")
    plans = []
    for _ in range(draw(st.integers(1, 30), label="passes")):
        for _ in range(draw(st.integers(0, 4), label="events before the pass")):
            events = sim.events()
            kind, arg = data.draw(st.sampled_from(events), label="event")
            sim.event(kind, arg)
        plan = sim.plan()
        check_pass(sim, plan)
        plans.append(plan)
    return sim, plans


def settle(sim: Sim) -> RolePlan:
    """Free the room others took; then let every pass find pods ready, drains idle and terminating pods gone.
    Returns the last plan."""
    sim.others = []
    sim.other_roles_ready = True
    plan = sim.plan()
    for _ in range(40):
        check_pass(sim, plan)
        for name, g in list(sim.groups.items()):
            if g.deleting:
                del sim.groups[name]
            elif g.draining_since is not None:
                sim.inflight[name] = 0.0
            else:
                g.ready = True
        sim.now += SETTLE + 1
        plan = sim.plan()
        if not (plan.create or plan.delete or plan.drain or plan.undrain or plan.draining):
            break
    return plan


@settings(max_examples=300, deadline=None)
@given(histories())
def test_property_passes_keep_routing_and_capacity_and_converge(history):
    sim, _ = history
    plan = settle(sim)
    # Converged: exactly `desired` groups, all of the current revision, serving and in routing.
    assert (plan.create, plan.delete, plan.drain, plan.undrain, plan.draining) == ([], [], [], [], {})
    assert (plan.old_groups, plan.unplaced, plan.rollout_blocked) == (0, 0, False)
    assert sorted(g.revision for g in sim.groups.values()) == [sim.revision] * sim.desired
    assert sim.in_routing() == set(sim.groups)
    assert plan.ready == sim.desired


def test_the_simulated_cluster_has_room_for_a_surge():
    # (Convergence needs room for the desired groups and one more: 4 + 1 <= 6.)
    sim = Sim(observed=True)
    domains = build_domains(sim.nodes, [])
    assert largest_block(domains, SHAPE)[0] == 24
    assert sum(d.free_gpus for d in domains.values()) // SHAPE.gpus == 6
