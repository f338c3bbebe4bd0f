"""The placement ledger: reservations on top of a real cluster view, under random interleavings of
placements, pod events, node events and releases, and under concurrent sessions.

Invariants, after every step: no node has more promised (the view's usage plus the reservations of pods
not seen yet) than it has; the ledger holds exactly the reservations of pods promised and not seen yet
(a pod that appears holds its room itself: counted once); every group sits in one NVLink domain.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests import kube_objects
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import contract
from tokenfab.planning.capacity import Constraints, add
from tokenfab.planning.groups import Judging, Placing, Wanted, plan_role
from tokenfab.planning.topology import GroupShape, best_fit_nodes, choose_domain

GPU = kube_objects.GPU
GI = 2**30
CONSTRAINTS = Constraints()
M = ("ml", "m")

# Three NVLink domains of unequal nodes, and a node in none.
NODES = {
    **{f"a-{i}": kube_objects.node(f"a-{i}", "a", 8) for i in range(4)},
    **{f"b-{i}": kube_objects.node(f"b-{i}", "b", 4) for i in range(3)},
    **{f"c-{i}": kube_objects.node(f"c-{i}", "c", 8, cpu="32") for i in range(5)},
    "cpu-0": kube_objects.node("cpu-0", None, 8),
}
DOMAIN_OF = {name: (obj["metadata"]["labels"] or {}).get(kube_objects.LABEL) for name, obj in NODES.items()}
OWNERS = [("ml", "m"), ("ml", "n"), ("team-b", "m")]
SHAPES = [
    GroupShape(1, 8),
    GroupShape(2, 8),
    GroupShape(4, 4),
    GroupShape(8, 4),
    GroupShape(8, 8),
    GroupShape(16, 8),
    GroupShape(12, 4),
]


def request(shape: GroupShape, cpus: int) -> dict[str, int]:
    return {GPU: shape.pod_gpus, "cpu": cpus * 1000, "memory": 64 * GI}


def pod_obj(owner, group: str, pod: str, pin: str, req: dict[str, int], **changes) -> dict:
    return kube_objects.pod(
        pod,
        owner[1],
        owner[0],
        pinned=pin,
        gpus=req[GPU],
        cpu=str(req["cpu"] // 1000),
        memory=f"{req['memory'] // GI}Gi",
        group=group,
        **changes,
    )


def promised(view: ClusterView, ledger: Ledger) -> dict[str, dict[str, int]]:
    """What is promised per node: the view's usage plus every reservation whose pod it does not show
    (a session hands the reservations of pods that appeared over to them first)."""
    with ledger.session() as s:
        s.used()
    out = view.used()
    for r in ledger.reservations():
        out[r.node] = add(out.get(r.node, {}), r.requests)
    return out


def assert_never_over_promised(view: ClusterView, ledger: Ledger) -> None:
    total = promised(view, ledger)
    for n in view.nodes():
        for res in (GPU, "cpu", "memory"):
            assert total.get(n.name, {}).get(res, 0) <= n.allocatable.get(res, 0), (
                f"node {n.name}: {res} promised {total.get(n.name)} of {n.allocatable}"
            )


def normal(used: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {n: {r: v for r, v in u.items() if v} for n, u in used.items() if any(u.values())}


# ------------------------------------------------------------------------------------------ unit tests


def fresh() -> tuple[ClusterView, Ledger]:
    view = ClusterView()
    for obj in NODES.values():
        view.on_node("ADDED", obj)
    return view, Ledger(view, ttl=60.0)


REQ = {GPU: 4, "cpu": 8000, "memory": 64 * GI}


def test_a_reservation_takes_room_from_the_next_sessions_until_its_pod_appears():
    view, ledger = fresh()
    with ledger.session() as s:
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 8
        s.reserve(M, "m-g0", {"m-g0-0": ("a-0", REQ)}, 0.0)
        # The same session sees its own promise at once.
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 4
    with ledger.session() as s:
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 4
    # The pod appears (pinned, gated): it holds the room itself, the reservation is dropped.
    view.on_pod("ADDED", pod_obj(M, "m-g0", "m-g0-0", "a-0", REQ, gated=True))
    with ledger.session() as s:
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 4
        assert s.used()["a-0"][GPU] == 4
    assert ledger.reservations() == []
    # It fails: the room is free again.
    view.on_pod("MODIFIED", pod_obj(M, "m-g0", "m-g0-0", "a-0", REQ, node="a-0", phase="Failed"))
    with ledger.session() as s:
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 8


def test_a_reservation_made_before_capacity_is_read_is_counted_once():
    _, ledger = fresh()
    with ledger.session() as s:
        s.reserve(M, "m-g0", {"m-g0-0": ("a-0", REQ)}, 0.0)
        assert s.used()["a-0"][GPU] == 4
        assert s.domains(REQ, CONSTRAINTS)["a"].free["a-0"] == 4


def test_release_of_a_group_or_of_a_deployment():
    _, ledger = fresh()
    with ledger.session() as s:
        s.reserve(M, "m-g0", {"m-g0-0": ("a-0", REQ), "m-g0-1": ("a-1", REQ)}, 0.0)
        s.reserve(M, "m-g1", {"m-g1-0": ("a-2", REQ)}, 0.0)
        s.reserve(("ml", "n"), "n-g0", {"n-g0-0": ("b-0", REQ)}, 0.0)
    assert ledger.release(M, "m-g0") == 2
    assert ledger.release(M, "m-g0") == 0
    assert sorted(r.group for r in ledger.reservations()) == ["m-g1", "n-g0"]
    assert ledger.release(M) == 1
    assert [r.group for r in ledger.reservations()] == ["n-g0"]
    with ledger.session() as s:
        assert dict(s.domains(REQ, CONSTRAINTS)["a"].free) == {f"a-{i}": 8 for i in range(4)}


def test_a_reservation_whose_pod_never_comes_expires():
    _, ledger = fresh()
    with ledger.session() as s:
        s.reserve(M, "m-g0", {"m-g0-0": ("a-0", REQ)}, 100.0)
        s.reserve(M, "m-g1", {"m-g1-0": ("a-1", REQ)}, 150.0)
    assert ledger.expire(160.0) == 0
    assert ledger.expire(160.5) == 1
    assert [r.group for r in ledger.reservations()] == ["m-g1"]


def test_reservations_of_two_namespaces_do_not_collide():
    view, ledger = fresh()
    with ledger.session() as s:
        s.reserve(("ml", "m"), "m-g0", {"m-g0-0": ("a-0", REQ)}, 0.0)
        s.reserve(("team-b", "m"), "m-g0", {"m-g0-0": ("a-1", REQ)}, 0.0)
    view.on_pod("ADDED", pod_obj(("team-b", "m"), "m-g0", "m-g0-0", "a-1", REQ))
    with ledger.session() as s:
        free = s.domains(REQ, CONSTRAINTS)["a"].free
        assert (free["a-0"], free["a-1"]) == (4, 4)
    assert [(r.owner, r.node) for r in ledger.reservations()] == [(("ml", "m"), "a-0")]


# ------------------------------------------------------------------------------------ random interleavings


@dataclass
class Group:
    owner: tuple[str, str]
    domain: str
    request: dict[str, int]
    pods: dict[str, str]  # pod name -> node
    time: float
    state: dict[str, str] = field(default_factory=dict)  # pod -> promised | created | ended | gone | lost


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.view, self.ledger = fresh()
        self.ledger.ttl = 100.0
        self.now = 0.0
        self.serial = 0
        self.groups: dict[str, Group] = {}
        self.down: set[str] = set()  # nodes deleted from the view

    # --------------------------------------------------------------------------- placement
    @rule(
        owner=st.sampled_from(OWNERS),
        shape=st.sampled_from(SHAPES),
        count=st.integers(1, 3),
        policy=st.sampled_from(["pack", "spread"]),
        cpus=st.sampled_from([4, 8, 16]),
    )
    def place_groups(self, owner, shape, count, policy, cpus):
        req = request(shape, cpus)
        with self.ledger.session() as s:
            domains = s.domains(req, CONSTRAINTS)
            want, judge = Wanted("decode", count, "r1", shape), Judging({}, self.now, 30.0)
            plan, after = plan_role(want, [], Placing(domains, policy), judge)
            for cr in plan.create:
                name = f"{owner[1]}-g{self.serial}"
                self.serial += 1
                pods = {f"{name}-{r}": node for r, node in enumerate(cr.nodes)}
                s.reserve(owner, name, {p: (n, req) for p, n in pods.items()}, self.now)
                self.groups[name] = Group(
                    owner, cr.domain, req, pods, self.now, dict.fromkeys(pods, "promised")
                )
            # What the plan left is what the session now offers.
            again = s.domains(req, CONSTRAINTS)
            assert {d: dict(x.free) for d, x in again.items()} == {d: dict(x.free) for d, x in after.items()}

    @rule(data=st.data(), cpus=st.sampled_from([4, 8]))
    def place_one_by_hand(self, data, cpus):
        """choose_domain + best_fit_nodes on the session's domains, as the autoscaler's surge would."""
        shape = data.draw(st.sampled_from(SHAPES))
        owner = data.draw(st.sampled_from(OWNERS))
        req = request(shape, cpus)
        with self.ledger.session() as s:
            domains = s.domains(req, CONSTRAINTS)
            chosen = choose_domain(domains, shape, "pack")
            if chosen is None:
                return
            nodes = best_fit_nodes(domains[chosen].free, shape.nodes, shape.pod_gpus)
            assert nodes is not None
            name = f"{owner[1]}-g{self.serial}"
            self.serial += 1
            pods = {f"{name}-{r}": n for r, n in enumerate(nodes)}
            s.reserve(owner, name, {p: (n, req) for p, n in pods.items()}, self.now)
            self.groups[name] = Group(owner, chosen, req, pods, self.now, dict.fromkeys(pods, "promised"))

    # -------------------------------------------------------------------------------- pods
    def _pods_in(self, *states: str) -> list[tuple[str, str]]:
        return sorted(
            (g, p) for g, grp in self.groups.items() for p, st_ in grp.state.items() if st_ in states
        )

    def _pod(self, group: str, pod: str, **changes) -> dict:
        g = self.groups[group]
        return pod_obj(g.owner, group, pod, g.pods[pod], g.request, **changes)

    @precondition(lambda self: self._pods_in("promised"))
    @rule(data=st.data())
    def pod_created(self, data):
        group, pod = data.draw(st.sampled_from(self._pods_in("promised")))
        self.view.on_pod("ADDED", self._pod(group, pod, gated=True))
        self.groups[group].state[pod] = "created"

    @precondition(lambda self: self._pods_in("created"))
    @rule(data=st.data(), phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded"]))
    def pod_bound(self, data, phase):
        group, pod = data.draw(st.sampled_from(self._pods_in("created")))
        self.view.on_pod("MODIFIED", self._pod(group, pod, node=self.groups[group].pods[pod], phase=phase))
        if phase in ("Failed", "Succeeded"):
            self.groups[group].state[pod] = "ended"  # for good: its room is free

    @precondition(lambda self: self._pods_in("created", "ended"))
    @rule(data=st.data())
    def pod_deleted(self, data):
        group, pod = data.draw(st.sampled_from(self._pods_in("created", "ended")))
        self.view.on_pod("DELETED", self._pod(group, pod))
        self.groups[group].state[pod] = "gone"

    @precondition(lambda self: self.groups)
    @rule(data=st.data())
    def group_given_up(self, data):
        """Deleted (broken, surplus) or not created whole: its reservations and pods go."""
        name = data.draw(st.sampled_from(sorted(self.groups)))
        g = self.groups.pop(name)
        self.ledger.release(g.owner, name)
        for pod, state in g.state.items():
            if state in ("created", "ended"):
                self.view.on_pod("DELETED", pod_obj(g.owner, name, pod, g.pods[pod], g.request))

    @rule(owner=st.sampled_from(OWNERS))
    def deployment_deleted(self, owner):
        self.ledger.release(owner)
        for name in [n for n, g in self.groups.items() if g.owner == owner]:
            g = self.groups.pop(name)
            for pod, state in g.state.items():
                if state in ("created", "ended"):
                    self.view.on_pod("DELETED", pod_obj(g.owner, name, pod, g.pods[pod], g.request))

    @rule(seconds=st.sampled_from([1.0, 50.0, 101.0]))
    def time_passes(self, seconds):
        """Reservations whose pod never came (lost writes) expire; those pods are never created."""
        self.now += seconds
        self.ledger.expire(self.now)
        for g in self.groups.values():
            if self.now - g.time > self.ledger.ttl:
                for pod, state in g.state.items():
                    if state == "promised":
                        g.state[pod] = "lost"

    # ------------------------------------------------------------------------------- nodes
    @rule(name=st.sampled_from(sorted(NODES)))
    def node_lost(self, name):
        self.view.on_node("DELETED", NODES[name])
        self.down.add(name)

    @precondition(lambda self: self.down)
    @rule(data=st.data())
    def node_back(self, data):
        name = data.draw(st.sampled_from(sorted(self.down)))
        self.view.on_node("ADDED", NODES[name])
        self.down.discard(name)

    @rule(name=st.sampled_from(sorted(NODES)), how=st.sampled_from(["cordon", "notready", "healthy"]))
    def node_changed(self, name, how):
        if name in self.down:
            return
        base = NODES[name]
        changed = kube_objects.node(
            name,
            DOMAIN_OF[name],
            base["status"]["allocatable"][GPU],
            cpu=base["status"]["allocatable"]["cpu"],
            ready=how != "notready",
            unschedulable=how == "cordon",
        )
        self.view.on_node("MODIFIED", changed)

    # -------------------------------------------------------------------------- invariants
    @invariant()
    def reservations_are_exactly_the_pods_not_seen_yet(self):
        with self.ledger.session() as s:
            used = s.used()
        waiting = Counter(
            (g.owner, name, g.pods[p])
            for name, g in self.groups.items()
            for p, st_ in g.state.items()
            if st_ == "promised"
        )
        assert Counter((r.owner, r.group, r.node) for r in self.ledger.reservations()) == waiting
        # The session counted the view once and each reservation once.
        assert normal(used) == normal(promised(self.view, self.ledger))

    @invariant()
    def never_over_promised(self):
        assert_never_over_promised(self.view, self.ledger)

    @invariant()
    def every_group_in_one_domain(self):
        for name, g in self.groups.items():
            assert {DOMAIN_OF[n] for n in g.pods.values()} == {g.domain}
            assert len(set(g.pods.values())) == len(g.pods), f"two ranks of {name} on one node"
        per_group: dict[tuple, set[str | None]] = {}
        for r in self.ledger.reservations():
            per_group.setdefault((r.owner, r.group), set()).add(DOMAIN_OF[r.node])
        for p in self.view.all_pods():
            per_group.setdefault(((p.namespace, p.deployment), p.labels[contract.LABEL_GROUP]), set()).add(
                DOMAIN_OF[p.pinned or ""]
            )
        assert all(len(ds) == 1 for ds in per_group.values()), per_group


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_ledger_under_random_interleavings = LedgerMachine.TestCase


# ------------------------------------------------------------------------------------------ concurrency


def test_concurrent_sessions_never_promise_the_same_room_twice():
    view, ledger = fresh()
    placed: list[tuple[str, tuple[str, ...]]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        shape = SHAPES[i % len(SHAPES)]
        req = request(shape, 4)
        owner = ("ml", f"d{i}")
        start.wait()
        for j in range(12):
            with ledger.session() as s:
                domains = s.domains(req, CONSTRAINTS)
                chosen = choose_domain(domains, shape, "pack" if j % 2 else "spread")
                if chosen is None:
                    continue
                nodes = best_fit_nodes(domains[chosen].free, shape.nodes, shape.pod_gpus)
                assert nodes is not None
                group = f"d{i}-g{j}"
                s.reserve(owner, group, {f"{group}-{r}": (n, req) for r, n in enumerate(nodes)}, 0.0)
            with lock:
                placed.append((group, tuple(nodes)))
            if j % 3 == 0:  # and some pods appear meanwhile
                for r, n in enumerate(nodes):
                    view.on_pod("ADDED", pod_obj(owner, group, f"{group}-{r}", n, req, gated=True))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert placed, "nothing was placed at all"
    with ledger.session() as s:
        s.used()  # hand the reservations of pods that appeared over to them
    assert_never_over_promised(view, ledger)
    # Every GPU given out is held exactly once: by its pod, or by its reservation.
    given = sum(SHAPES[int(g.split("-")[0][1:]) % len(SHAPES)].pod_gpus * len(ns) for g, ns in placed)
    assert sum(u.get(GPU, 0) for u in promised(view, ledger).values()) == given
    # And the cluster was contended: some placements found no room.
    assert len(placed) < 8 * 12


# ------------------------------------------------------------------- a pod arriving while a plan reads


class DeliveringView(ClusterView):
    """A view whose watch thread tries to deliver `deliver` while a plan reads the usage (it gets 0.3 s:
    a view that holds its lock across the read makes it wait until the read is done)."""

    deliver = None

    def used(self):  # type: ignore[no-untyped-def]
        snap = super().used()
        if self.deliver is not None:
            d, self.deliver = self.deliver, None
            t = threading.Thread(target=d)
            t.start()
            t.join(0.3)
        return snap


def test_a_pod_seen_while_the_ledger_reads_is_counted_once_not_never():
    """The reserved pod's watch event lands while the next plan reads capacity: it must count either as
    the view's (the pod) or the ledger's (the reservation), never as neither."""
    view = DeliveringView()
    view.on_node("ADDED", kube_objects.node("a-0", "a", 4))
    ledger = Ledger(view)
    req = {kube_objects.GPU: 4}
    with ledger.session() as s:
        s.reserve(("ml", "m"), "m-w-0", {"m-w-0-0": ("a-0", req)}, 0.0)
    view.deliver = lambda: view.on_pod(
        "ADDED", kube_objects.pod("m-w-0-0", "m", pinned="a-0", gpus=4, group="m-w-0")
    )
    with ledger.session() as s:  # another deployment's pass
        free = s.domains(req, Constraints())["a"].free.get("a-0", 0)
    assert free == 0, f"a-0 is full, but a plan saw {free} GPUs free there"
