"""A worker group's lifecycle: `classify` for every state and every broken reason (table-driven), and a
property test that realistic traces of one group move only along `lifecycle.TRANSITIONS`.

Fixture: `G` is a serving group of two ranks, each pinned to and bound on its node (a-0, a-1), released
100 s ago and recorded in the status.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfab.planning.lifecycle import (
    ALIVE,
    STATES,
    TRANSITIONS,
    GroupView,
    NodeHealth,
    PodView,
    allowed,
    classify,
    missing_ranks,
)

NOW = 10_000.0
TOL = 30.0  # how long a bound pod's node may be NotReady
BIND = 300.0  # how long a released group may take to bind
WORDS = "0/72 nodes are available: 2 Insufficient nvidia.com/gpu"


def pod(rank: int, at: str | None = None, **changes: object) -> PodView:
    """Rank `rank` of group g, pinned to node `at` (default a-<rank>), bound there, Running and Ready."""
    pinned = at or f"a-{rank}"
    p = PodView(f"g-{rank}", rank, "Running", True, pinned, False, NOW - 50, pinned=pinned)
    return replace(p, **changes)


G = GroupView(
    "g", "decode", 0, "r1", "a", 2, 8, (pod(0), pod(1)), True, ("a-0", "a-1"), released_at=NOW - 100
)
UP = {"a-0": NodeHealth(True), "a-1": NodeHealth(True)}


def with_pod(g: GroupView, rank: int, **changes: object) -> GroupView:
    return replace(g, pods=tuple(replace(p, **changes) if p.rank == rank else p for p in g.pods))


def unbound(g: GroupView, *ranks: int, waiting: str = "") -> GroupView:
    """The ranks (default: all) not bound yet: Pending on no node (still pinned)."""
    for r in ranks or range(g.size):
        g = with_pod(g, r, node=None, phase="Pending", ready=False, ready_since=None, waiting=waiting)
    return g


def gated(g: GroupView, *ranks: int) -> GroupView:
    """The ranks (default: all) still behind the scheduling gate (so not bound, and not released)."""
    g = unbound(g, *ranks)
    for r in ranks or range(g.size):
        g = with_pod(g, r, gated=True)
    return replace(g, released_at=None)


def without(g: GroupView, rank: int) -> GroupView:
    return replace(g, pods=tuple(p for p in g.pods if p.rank != rank))


def every_pod(g: GroupView, **changes: object) -> GroupView:
    return replace(g, pods=tuple(replace(p, **changes) for p in g.pods))


# --------------------------------------------------------------------------------------------- classify

CASES = [
    # ---- serving
    pytest.param(G, UP, ("serving", ""), id="serving: every pod Running and Ready"),
    pytest.param(
        G, {**UP, "a-1": NodeHealth(False, NOW - TOL + 1)}, ("serving", ""), id="node NotReady briefly"
    ),
    pytest.param(
        G,
        {**UP, "a-1": NodeHealth(True, schedulable=False)},
        ("serving", ""),
        id="bound pod on cordoned node",
    ),
    pytest.param(
        replace(G, nodes=(), pods=tuple(replace(p, pinned=None) for p in G.pods)),
        UP,
        ("serving", ""),
        id="serving: placed before nodes were assigned (no pins)",
    ),
    # ---- starting
    pytest.param(with_pod(G, 1, ready=False), UP, ("starting", ""), id="starting: a pod not ready"),
    pytest.param(
        with_pod(G, 1, ready=False, waiting="CrashLoopBackOff: back-off 5m0s"),
        UP,
        ("starting", "CrashLoopBackOff: back-off 5m0s"),
        id="starting: says why the first pod not ready waits",
    ),
    pytest.param(
        with_pod(G, 0, waiting="stale words of a ready pod"),
        UP,
        ("serving", ""),
        id="a ready pod's waiting words do not matter",
    ),
    pytest.param(
        with_pod(G, 1, phase="Pending", ready=False, waiting="ContainerCreating"),
        UP,
        ("starting", "ContainerCreating"),
        id="starting: bound, containers being created",
    ),
    pytest.param(unbound(G, 1, waiting=WORDS), UP, ("starting", WORDS), id="starting: released, binding"),
    pytest.param(unbound(G), UP, ("starting", ""), id="starting: released, no pod bound, no words"),
    pytest.param(
        replace(unbound(G, waiting=WORDS), released_at=NOW - BIND + 1),
        UP,
        ("starting", WORDS),
        id="starting: unbound just inside the bind timeout",
    ),
    pytest.param(
        replace(unbound(G, waiting=WORDS), released_at=None),
        UP,
        ("starting", WORDS),
        id="starting: unbound, release time unknown: never times out",
    ),
    pytest.param(
        replace(G, recorded=False), UP, ("serving", ""), id="not recorded yet, whole: judged by its pods"
    ),
    # ---- reserved
    pytest.param(
        replace(gated(without(G, 1)), recorded=False),
        UP,
        ("reserved", "ranks [1] not created yet"),
        id="reserved: creation interrupted",
    ),
    pytest.param(
        replace(
            gated(G),
            pods=(pod(2, "a-2", node=None, phase="Pending", ready=False, gated=True),),
            size=4,
            recorded=False,
        ),
        UP | {"a-2": NodeHealth(True)},
        ("reserved", "ranks [0, 1, 3] not created yet"),
        id="reserved: several ranks missing",
    ),
    pytest.param(
        gated(G),
        UP,
        ("reserved", "waiting for the whole group to exist before the scheduler may bind it"),
        id="reserved: whole, still gated",
    ),
    pytest.param(
        replace(gated(G, 1), released_at=None),
        UP,
        ("reserved", "waiting for the whole group to exist before the scheduler may bind it"),
        id="reserved: release interrupted (one gate lifted, that pod bound)",
    ),
    pytest.param(
        replace(gated(G), released_at=NOW - 10 * BIND),
        UP,
        ("reserved", "waiting for the whole group to exist before the scheduler may bind it"),
        id="reserved: a gated group never times out",
    ),
    # ---- draining
    pytest.param(replace(G, draining_since=NOW - 5), UP, ("draining", ""), id="draining"),
    pytest.param(
        replace(with_pod(G, 0, ready=False), draining_since=NOW - 5),
        UP,
        ("draining", ""),
        id="draining: a pod no longer ready",
    ),
    pytest.param(
        replace(unbound(G, 1, waiting=WORDS), draining_since=NOW - 5),
        UP,
        ("draining", WORDS),
        id="draining: a pod not bound yet",
    ),
    # (A drain ends in deleting, or breaks like any group: it is never a way around a failure.)
    pytest.param(
        replace(every_pod(G, deleting=True), draining_since=NOW - 5),
        UP,
        ("deleting", "being deleted"),
        id="draining, then deleted",
    ),
    pytest.param(
        replace(with_pod(G, 1, phase="Failed", ready=False), draining_since=NOW - 5),
        UP,
        ("broken", "pod g-1 failed"),
        id="broken: draining, a pod failed",
    ),
    pytest.param(
        replace(with_pod(G, 0, deleting=True), draining_since=NOW - 5),
        UP,
        ("broken", "pod g-0 is being deleted"),
        id="broken: draining, one pod deleted (evicted)",
    ),
    pytest.param(
        replace(without(G, 1), draining_since=NOW - 5),
        UP,
        ("broken", "pod rank 1 is missing"),
        id="broken: draining, a rank gone",
    ),
    pytest.param(
        replace(G, draining_since=NOW - 5),
        {"a-0": NodeHealth(True)},
        ("broken", "node a-1 of pod g-1 is gone"),
        id="broken: draining, a node gone",
    ),
    pytest.param(
        replace(G, draining_since=NOW - 5),
        {**UP, "a-1": NodeHealth(False, NOW - TOL / 2)},
        ("draining", ""),
        id="draining: a node not ready for less than the toleration",
    ),
    # ---- deleting
    pytest.param(every_pod(G, deleting=True), UP, ("deleting", "being deleted"), id="deleting"),
    pytest.param(
        every_pod(G, deleting=True, phase="Failed"),
        {},
        ("deleting", "being deleted"),
        id="deleting wins over failed pods and gone nodes",
    ),
    pytest.param(
        without(every_pod(G, deleting=True), 1),
        UP,
        ("deleting", "being deleted"),
        id="deleting: some pods already gone",
    ),
    # ---- broken: pods
    pytest.param(
        with_pod(G, 1, deleting=True), UP, ("broken", "pod g-1 is being deleted"), id="broken: a pod deleting"
    ),
    pytest.param(
        with_pod(G, 1, phase="Failed", ready=False),
        UP,
        ("broken", "pod g-1 failed"),
        id="broken: a pod failed",
    ),
    pytest.param(
        with_pod(G, 1, phase="Failed", ready=False, exit_message="exit code 137, OOMKilled"),
        UP,
        ("broken", "pod g-1 failed: exit code 137, OOMKilled"),
        id="broken: a pod failed, with its exit words",
    ),
    pytest.param(
        with_pod(G, 0, phase="Succeeded", ready=False),
        UP,
        ("broken", "pod g-0 succeeded"),
        id="broken: a rank exited",
    ),
    pytest.param(
        with_pod(with_pod(G, 1, deleting=True), 0, phase="Failed"),
        UP,
        ("broken", "pod g-0 failed"),
        id="broken: the lowest rank's reason first",
    ),
    pytest.param(
        without(G, 1), UP, ("broken", "pod rank 1 is missing"), id="broken: recorded group lost a rank"
    ),
    pytest.param(
        replace(without(G, 1), recorded=False),
        UP,
        ("broken", "pod rank 1 is missing"),
        id="broken: not recorded, but a pinned pod is bound: the group was whole, a rank was lost",
    ),
    pytest.param(
        replace(unbound(without(G, 1)), recorded=False),
        UP,
        ("reserved", "ranks [1] not created yet"),
        id="reserved: not recorded, released, no pod bound: completed like an interrupted creation",
    ),
    pytest.param(
        replace(without(G, 1), recorded=False, nodes=(), pods=(replace(pod(0), pinned=None),)),
        UP,
        ("reserved", "ranks [1] not created yet"),
        id="reserved: placed before pins, creation interrupted (its bound rank proves nothing)",
    ),
    # ---- broken: nodes of bound pods
    pytest.param(
        G, {"a-0": NodeHealth(True)}, ("broken", "node a-1 of pod g-1 is gone"), id="broken: node gone"
    ),
    pytest.param(
        G,
        {**UP, "a-1": NodeHealth(False, NOW - TOL - 1)},
        ("broken", "node a-1 of pod g-1 is not ready"),
        id="broken: node NotReady past the toleration",
    ),
    pytest.param(
        G,
        {**UP, "a-1": NodeHealth(False, NOW - TOL)},
        ("broken", "node a-1 of pod g-1 is not ready"),
        id="broken: node NotReady for exactly the toleration",
    ),
    pytest.param(
        G,
        {**UP, "a-0": NodeHealth(False, None)},
        ("broken", "node a-0 of pod g-0 is not ready"),
        id="broken: node NotReady since an unknown time",
    ),
    # ---- broken: pinned nodes before binding (gated or released)
    pytest.param(
        gated(G),
        {"a-0": NodeHealth(True)},
        ("broken", "node a-1 assigned to pod g-1 is gone"),
        id="broken: gated, pinned node gone",
    ),
    pytest.param(
        gated(G),
        {**UP, "a-1": NodeHealth(True, schedulable=False)},
        ("broken", "node a-1 assigned to pod g-1 can no longer take it"),
        id="broken: gated, pinned node cordoned",
    ),
    pytest.param(
        gated(G),
        {**UP, "a-1": NodeHealth(False, NOW - 1)},
        ("broken", "node a-1 assigned to pod g-1 can no longer take it"),
        id="broken: gated, pinned node NotReady (no toleration before binding)",
    ),
    pytest.param(
        unbound(G, 1),
        {"a-0": NodeHealth(True)},
        ("broken", "node a-1 assigned to pod g-1 is gone"),
        id="broken: released, pinned node gone",
    ),
    pytest.param(
        unbound(G, 1),
        {**UP, "a-1": NodeHealth(True, schedulable=False)},
        ("broken", "node a-1 assigned to pod g-1 can no longer take it"),
        id="broken: released, pinned node cordoned or tainted",
    ),
    pytest.param(
        unbound(G, 1),
        {**UP, "a-1": NodeHealth(False, None)},
        ("broken", "node a-1 assigned to pod g-1 can no longer take it"),
        id="broken: released, pinned node NotReady",
    ),
    pytest.param(
        replace(gated(without(G, 1)), recorded=False),
        {},
        ("broken", "node a-0 assigned to pod g-0 is gone"),
        id="broken: interrupted creation whose node is gone",
    ),
    # ---- broken: bind timeout
    pytest.param(
        replace(unbound(G, 1, waiting=WORDS), released_at=NOW - BIND),
        UP,
        ("broken", f"not bound within 300 s (1 of 2 pods unbound: {WORDS})"),
        id="broken: released, not bound within the bind timeout, in the scheduler's words",
    ),
    pytest.param(
        replace(unbound(G), released_at=NOW - BIND - 1),
        UP,
        ("broken", "not bound within 300 s (2 of 2 pods unbound)"),
        id="broken: not bound in time, no words",
    ),
    pytest.param(
        replace(unbound(G, 0, waiting=WORDS), released_at=NOW - BIND, draining_since=NOW - 9),
        UP,
        ("broken", f"not bound within 300 s (1 of 2 pods unbound: {WORDS})"),
        id="broken: draining and not bound in time",
    ),
]


@pytest.mark.parametrize(("g", "nodes", "expected"), CASES)
def test_classify(g, nodes, expected):
    assert classify(g, nodes, NOW, TOL, BIND) == expected


def test_every_state_is_reached_by_the_table():
    reached = {case.values[2][0] for case in CASES}
    assert reached == set(STATES)


def test_without_a_bind_timeout_a_released_group_waits_forever():
    g = replace(unbound(G, waiting=WORDS), released_at=NOW - 1e9)
    assert classify(g, UP, NOW, TOL) == ("starting", WORDS)


def test_an_unbound_pod_is_judged_by_its_pinned_node_a_bound_pod_by_its_node():
    # A pod bound somewhere (it cannot really be elsewhere than its pin, but the bound node is what counts).
    g = with_pod(G, 1, node="a-9")
    assert classify(g, {**UP, "a-9": NodeHealth(True)}, NOW, TOL) == ("serving", "")
    assert classify(g, UP, NOW, TOL) == ("broken", "node a-9 of pod g-1 is gone")
    # An unpinned pending pod (placed before nodes were assigned) is judged by no node.
    legacy = with_pod(unbound(G, 1), 1, pinned=None)
    assert classify(legacy, {"a-0": NodeHealth(True)}, NOW, TOL) == ("starting", "")


def test_missing_ranks():
    assert missing_ranks(G) == []
    assert missing_ranks(without(G, 0)) == [0]
    assert missing_ranks(replace(G, size=4)) == [2, 3]


# ------------------------------------------------------------------------------------------ transitions


def test_transitions_cover_every_state_and_end_in_deleting():
    assert set(TRANSITIONS) == set(STATES)
    for state, after in TRANSITIONS.items():
        assert state in after, f"{state} cannot stay {state}"
        assert after <= set(STATES)
        assert "deleting" in after, f"{state} cannot be deleted"
    assert TRANSITIONS["deleting"] == {"deleting"}
    assert TRANSITIONS["broken"] == {"broken", "deleting"}
    assert {"reserved", "starting", "serving", "draining"} == ALIVE
    assert allowed("reserved", "starting")
    assert allowed("starting", "reserved")  # a released group not recorded yet lost an unbound pod
    assert not allowed("deleting", "serving")
    assert not allowed("broken", "serving")


# --------------------------------------------------------------------------------------------- property
#
# One group, simulated from creation to deletion. The trace is what successive reconcile passes observe;
# between two passes any number of cluster events happen. A pass observes, then acts on what it saw (as
# the controller does): it deletes a broken group (and may delete any group: scale-down, rollout),
# completes an interrupted creation on the ranks' nodes (or gives the group up when a node cannot take its
# rank), lifts the gates of a whole reserved group, starts or ends a drain of a serving/draining group,
# and records the group in the status once all its ranks exist. Any pass may stop half-way (the operator
# crashed or lost its lease) between two API calls; then nothing after that point is done. The cluster:
# the scheduler binds an ungated pod to its pinned node when that node is Ready and schedulable (under a
# PodGroup only once every rank exists); the kubelet starts pods, readiness comes and goes, pods fail or
# exit; anyone may delete a pod (an unbound pod vanishes at once, a bound one terminates first, or is
# force-deleted); nodes go NotReady, recover, are cordoned or deleted; time passes.

GANGS = ("gates", "podgroup")
PROGRESS = frozenset({"bind", "start", "ready", "nodeready", "uncordon"})  # (trouble is rarer)


@dataclass
class Sim:
    size: int
    gang: str
    now: float = NOW
    pods: dict[int, PodView] = field(default_factory=dict)
    nodes: dict[str, NodeHealth] = field(default_factory=dict)
    status_fails: bool = False
    recorded: bool = False
    draining_since: float | None = None
    release_times: dict[int, float] = field(default_factory=dict)  # rank -> when its gate was lifted

    def __post_init__(self) -> None:
        self.nodes = {f"a-{r}": NodeHealth(True) for r in range(self.size)}

    @property
    def gated_mode(self) -> bool:
        return self.gang == "gates" and self.size > 1

    def view(self) -> GroupView:
        pods = tuple(self.pods[r] for r in sorted(self.pods))
        released = None
        if not any(p.gated for p in pods):  # as tokenfab.views computes it
            released = max((self.release_times[p.rank] for p in pods), default=None)
        return GroupView(
            "g",
            "decode",
            0,
            "r1",
            "a",
            self.size,
            4 * self.size,
            pods,
            self.recorded,
            tuple(f"a-{r}" for r in range(self.size)),
            released,
            self.draining_since,
        )

    def create(self, rank: int) -> None:
        gate = self.gated_mode
        self.pods[rank] = PodView(
            f"g-{rank}", rank, "Pending", False, None, False, gated=gate, pinned=f"a-{rank}"
        )
        self.release_times[rank] = self.now  # ungated pods are released when created

    def delete_pod(self, rank: int) -> None:
        p = self.pods[rank]
        if p.node is None:
            del self.pods[rank]  # nothing to terminate: gone at once
        else:
            self.pods[rank] = replace(p, deleting=True)


def _ok_to_bind(sim: Sim, p: PodView) -> bool:
    health = sim.nodes.get(p.pinned or "")
    whole = sim.gang == "gates" or len(sim.pods) == sim.size
    return (
        p.node is None
        and not p.gated
        and not p.deleting
        and whole
        and health is not None
        and health.ready
        and health.schedulable
    )


def cluster_events(sim: Sim) -> list[tuple[str, int | str | float]]:
    out: list[tuple[str, int | str | float]] = []
    for r, p in sim.pods.items():
        if _ok_to_bind(sim, p):
            out.append(("bind", r))
        if p.node is not None and not p.deleting and p.phase == "Pending":
            out.append(("start", r))
        if p.phase == "Running" and not p.deleting:
            out.append(("unready" if p.ready else "ready", r))
        if p.node is not None and p.phase in ("Pending", "Running"):
            out += [("fail", r), ("exit", r)]
        out.append(("delete", r))  # by anyone
        out.append(("vanish", r))  # terminated, force-deleted, evicted, or collected with its node
    for n, h in sim.nodes.items():
        out.append(("notready" if h.ready else "nodeready", n))
        out.append(("cordon" if h.schedulable else "uncordon", n))
        out.append(("nodegone", n))
    out += [("tick", 1.0), ("tick", TOL + 1), ("tick", BIND + 1)]
    return out


def apply_cluster(sim: Sim, event: str, arg: int | str | float) -> None:
    if event == "tick":
        assert isinstance(arg, float)
        sim.now += arg
        return
    if isinstance(arg, str):
        h = sim.nodes[arg]
        if event == "notready":
            sim.nodes[arg] = NodeHealth(False, sim.now, h.schedulable)
        elif event == "nodeready":
            sim.nodes[arg] = NodeHealth(True, None, h.schedulable)
        elif event in ("cordon", "uncordon"):
            sim.nodes[arg] = replace(h, schedulable=event == "uncordon")
        else:
            del sim.nodes[arg]
        return
    assert isinstance(arg, int)
    p = sim.pods[arg]
    if event == "bind":
        sim.pods[arg] = replace(p, node=p.pinned, waiting="ContainerCreating")
    elif event == "start":
        sim.pods[arg] = replace(p, phase="Running", waiting="")
    elif event == "ready":
        sim.pods[arg] = replace(p, ready=True, ready_since=sim.now)
    elif event == "unready":
        sim.pods[arg] = replace(p, ready=False, ready_since=None)
    elif event in ("fail", "exit"):
        sim.pods[arg] = replace(p, phase="Failed" if event == "fail" else "Succeeded", ready=False)
    elif event == "delete":
        sim.delete_pod(arg)
    else:
        del sim.pods[arg]


def controller_pass(sim: Sim, state: str, data: st.DataObject) -> None:
    """What a pass does after observing `state`; may stop half-way (a crash)."""
    steps = data.draw(st.integers(0, 20), label="steps before a crash (>= 20: none)")

    def step() -> bool:
        nonlocal steps
        steps -= 1
        return steps >= 0

    g = sim.view()
    doomed = state in ("broken",) or (
        state in ALIVE and data.draw(st.integers(0, 9), label="scale down / rollout") == 0
    )
    if state == "reserved" and missing_ranks(g):
        # Completion on the ranks' nodes; a plan that cannot complete it (the node cannot take its
        # rank) deletes it instead.
        fits = all(
            (h := sim.nodes.get(f"a-{r}")) is not None and h.ready and h.schedulable for r in missing_ranks(g)
        )
        doomed = doomed or not fits
    if doomed and state != "deleting":
        # One delete-collection call: the API server deletes every pod even if the operator stops. (A
        # broken group's delete is assumed to happen: if it did not, and the cause cleared before the
        # next pass, e.g. its node Ready again, that pass would find it alive: broken is a verdict, not
        # something the cluster remembers.)
        if state != "broken" and not step():
            return
        for r in sorted(sim.pods):
            sim.delete_pod(r)
        sim.recorded = False  # a deleted group leaves status.placement
        return
    if state == "reserved":
        for r in missing_ranks(g):
            if not step():
                return
            sim.create(r)
        if sim.gated_mode:
            for r in sorted(sim.pods):
                if not step():
                    return
                if sim.pods[r].gated:
                    sim.pods[r] = replace(sim.pods[r], gated=False)
                    sim.release_times[r] = sim.now
    if state == "serving" and data.draw(st.booleans(), label="drain"):
        sim.draining_since = sim.now
    elif state == "draining" and data.draw(st.booleans(), label="cancel the drain"):
        sim.draining_since = None
    # The status write: every group whose ranks all exist is recorded (unless status writes fail, e.g.
    # refused by the API server after an upgrade).
    if state != "deleting" and len(sim.pods) == sim.size and not sim.status_fails and step():
        sim.recorded = True


@st.composite
def traces(draw) -> list[tuple[str, str]]:
    """(state, why) as successive passes see one group, from its creation to its end."""
    data = draw(st.data())
    sim = Sim(draw(st.integers(1, 3), label="size"), draw(st.sampled_from(GANGS), label="gang"))
    sim.status_fails = draw(st.integers(0, 2), label="status writes fail") == 0
    # The creating pass (a plan's Create): a new group is "reserved" with every rank missing.
    controller_pass(sim, "reserved", data)
    observed: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(1, 40), label="passes")):
        for _ in range(draw(st.integers(0, 4), label="cluster events before the pass")):
            choices = cluster_events(sim)
            progress = [e for e in choices if e[0] in PROGRESS]
            if progress and data.draw(st.integers(0, 5), label="progress or trouble") > 0:
                choices = progress
            event, arg = data.draw(st.sampled_from(choices), label="event")
            apply_cluster(sim, event, arg)
            if not sim.pods:
                return observed  # nothing of the group is left: nothing more to observe
        if not sim.pods:
            return observed
        state, why = classify(sim.view(), sim.nodes, sim.now, TOL, BIND)
        observed.append((state, why))
        if observed[-2:] == [("deleting", why)] * 2:
            return observed  # deleting for good: only its pods' disappearance is left
        controller_pass(sim, state, data)
        if not sim.pods:
            return observed
    return observed


@settings(max_examples=600, deadline=None)
@given(traces())
def test_property_realistic_traces_follow_the_transitions(trace):
    for (before, _), (after, why) in itertools.pairwise(trace):
        assert allowed(before, after), f"{before} -> {after} ({why}) in {trace}"
    for state, why in trace:
        if state in ("broken", "reserved", "deleting"):
            assert why, f"{state} without a reason"
