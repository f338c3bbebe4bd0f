"""The act phase (tokenfab.act) applies the plan's writes and nothing else: every write the plan names goes
out once, in the plan's order, and a shared child the cluster already holds is not written again."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from tests.planning.test_one_pass import NOW, deployment, nodes_of, snapshot
from tokenfab import act
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import builders, writes
from tokenfab.planning.one_pass import plan
from tokenfab.runtime import Context, Result, Settings


class Kube:
    """Records every write; each answers at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.pool = self

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done

    def apply(self, m: dict[str, Any], manager: str = "") -> dict[str, Any]:
        self.calls.append(("apply", m["kind"], m["metadata"]["name"]))
        return m

    def delete(self, api: str, kind: str, name: str, ns: str, preconditions: Any = None) -> None:
        self.calls.append(("delete", kind, name, preconditions))

    def force_delete_pod(self, ns: str, name: str) -> None:
        self.calls.append(("force-delete", "Pod", name))

    def delete_group(self, ns: str, group: str, cd: bool = False) -> None:
        self.calls.append(("delete-group", group))

    def merge_patch(self, api: str, kind: str, ns: str, name: str, patch: Any) -> None:
        self.calls.append(("patch", kind, name))


def _context(kube: Kube) -> Context:
    view = ClusterView()
    return Context(kube=kube, view=view, ledger=Ledger(view), settings=Settings())  # type: ignore[arg-type]


def test_every_write_the_plan_names_goes_out_and_nothing_else():
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    p = plan(snap)
    goes = (
        writes.Delete("v1", "ConfigMap", "old-engine"),
        writes.Delete("v1", "Pod", "lost-0", force=True),
        writes.Delete("v1", "PersistentVolumeClaim", "orphan", unchanged="42"),
    )
    w = replace(p.writes, deletes=goes, legacy={"metadata": {"resourceVersion": "3"}})
    p = replace(p, writes=w)
    kube = Kube()
    sub = act.submit(_context(kube), ("ns", md.metadata.name or ""), snap, p)
    assert all(f.done() for f in sub.futures())
    shared = [("apply", m["kind"], m["metadata"]["name"]) for m in (w.workers_service, *w.identity, *w.rest)]
    groups = [("apply", m["kind"], m["metadata"]["name"]) for g in w.groups for m in g.objects]
    deletes = [
        ("delete", "ConfigMap", "old-engine", None),
        ("force-delete", "Pod", "lost-0"),
        ("delete", "PersistentVolumeClaim", "orphan", {"resourceVersion": "42"}),
    ]
    assert sorted(kube.calls, key=str) == sorted([*shared, *groups, *deletes], key=str)
    # (the deployment's own object, its status and the legacy patch, is the settle phase's: test_settle)
    assert len(groups) == sum(len(g.objects) for g in w.groups) > 0
    # the workers' Service goes before the new groups' pods it selects
    first_pod = next(i for i, c in enumerate(kube.calls) if c[1] == "Pod")
    assert kube.calls.index(("apply", "Service", w.workers_service["metadata"]["name"])) < first_pod


def test_a_shared_child_the_cluster_holds_is_not_written_again():
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    p = plan(snap)
    kube = Kube()
    ctx = _context(kube)
    service = builders.with_applied_hash(p.writes.workers_service)
    ctx.view.on_child("Service", "ADDED", service)
    act.submit(ctx, ("ns", md.metadata.name or ""), snap, p)
    assert ("apply", "Service", service["metadata"]["name"]) not in kube.calls
    assert any(c[:2] == ("apply", "Deployment") for c in kube.calls)


class Shown(Kube):
    """Records every write, and shows each written object in the view (the watch, at once)."""

    def __init__(self, view: ClusterView) -> None:
        super().__init__()
        self.view = view

    def apply(self, m: dict[str, Any], manager: str = "") -> dict[str, Any]:
        self.view.on_child(m["kind"], "MODIFIED", m)
        return super().apply(m, manager)


def test_a_shared_child_is_written_again_once_its_manifest_changes():
    # Each pass builds the manifests anew; an unchanged one is recognised by comparison (not hashed
    # again) and not written, and a changed one is hashed and written.
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    p = plan(snap)
    view = ClusterView()
    kube = Shown(view)
    ctx = Context(kube=kube, view=view, ledger=Ledger(view), settings=Settings())  # type: ignore[arg-type]
    key = ("ns", md.metadata.name or "")
    name = p.writes.workers_service["metadata"]["name"]
    act.submit(ctx, key, snap, p)
    assert kube.calls.count(("apply", "Service", name)) == 1
    act.submit(ctx, key, snap, plan(snap))  # the same manifests, built again
    assert kube.calls.count(("apply", "Service", name)) == 1
    service = p.writes.workers_service
    changed = {**service, "spec": {**service["spec"], "ports": [{"name": "metrics", "port": 9999}]}}
    act.submit(ctx, key, snap, replace(p, writes=replace(p.writes, workers_service=changed)))
    assert kube.calls.count(("apply", "Service", name)) == 2
    act.submit(ctx, key, snap, p)  # and back
    assert kube.calls.count(("apply", "Service", name)) == 3


class Unanswered(Kube):
    """A writer whose writes are never answered (a loaded API server)."""

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        self.calls.append(("submitted", getattr(fn, "__name__", "")))
        return Future()


def test_no_write_is_waited_for_while_the_pass_holds_a_worker():
    """The first pass of a deployment hands its identity and its groups to the writer and returns: its
    groups' pods wait, parked, for the ServiceAccount to show in the view, not for the write's answer."""
    md = deployment(decode=1)
    p = plan(replace(snapshot(md, nodes_of({"r0": 6}), {}, {}), identity=frozenset()))
    assert p.writes.groups == ()
    assert [m["kind"] for m in p.writes.identity] == ["ServiceAccount", "Role"]
    assert p.writes.waits
    kube = Unanswered()
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    sub = act.submit(_context(kube), ("ns", md.metadata.name or ""), snap, p)
    assert sub.futures()
    assert not any(f.done() for f in sub.futures())  # (it returned with every write in flight)


def test_parked_groups_say_what_they_wait_for_and_give_their_room_back():
    md = deployment(decode=1)
    snap = replace(snapshot(md, nodes_of({"r0": 6}), {}, {}), identity=frozenset())
    p = plan(snap)
    ctx = _context(Kube())
    key = ("ns", md.metadata.name or "")
    with ctx.ledger.session() as session:
        for r in p.reservations:
            session.reserve(key, r.group, r.pods, NOW)
    result = Result()
    act._channel_waits(ctx, key, p, result)
    parked = {w.group for w in p.writes.waits}
    assert set(result.identity_waits) == parked
    assert result.channel_waits == []
    messages = {g: m for rp in p.roles for g, m in rp.unbound.items()}
    assert all("ServiceAccount" in messages[g] for g in parked)
    assert not [r for r in ctx.ledger.reservations() if r.group in parked]
