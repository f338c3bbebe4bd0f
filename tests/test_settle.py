"""The settle phase (tokenfab.settle) writes the deployment's own object: the plan's patch that takes old
kopf bookkeeping off, then the status the plan and the answers make, then the Events; a pass that stopped
at its observation writes the status and Events it came with, and the same patch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.planning.test_one_pass import deployment, nodes_of, snapshot
from tokenfab import settle
from tokenfab.api.models import ModelDeploymentStatus
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import TEMPLATE, ClusterView
from tokenfab.planning.one_pass import plan
from tokenfab.runtime import Context, Ended, Observed, Result, Settings

LEGACY = {"metadata": {"resourceVersion": "3", "finalizers": None}}


class Kube:
    """Records every write of the deployment's own object."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def merge_patch(self, api: str, kind: str, ns: str, name: str, patch: Any) -> None:
        self.calls.append(("patch", kind, name))

    def apply_status(self, ns: str, name: str, status: Any) -> dict[str, Any]:
        self.calls.append(("status", name))
        return {"metadata": {"resourceVersion": "4"}}

    def post_event(self, body: Any, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))


def _context(kube: Kube) -> Context:
    view = ClusterView()
    return Context(kube=kube, view=view, ledger=Ledger(view), settings=Settings())  # type: ignore[arg-type]


def _body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u", "resourceVersion": "3"}}


def test_a_pass_writes_the_legacy_patch_then_its_status_and_events() -> None:
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    p = plan(snap)
    p = replace(p, writes=replace(p.writes, legacy=LEGACY))
    kube = Kube()
    name = md.metadata.name or ""
    settle.settle(_context(kube), ("ns", name), Observed(_body(name), snap), p, Result())
    assert kube.calls[:2] == [("patch", "ModelDeployment", name), ("status", name)]
    assert [c for c in kube.calls if c[0] == "event"], "the conditions' first Events"
    # the next pass, the watch not showing the patch yet, does not patch again
    again = Kube()
    ctx = _context(again)
    settle.settle(ctx, ("ns", name), Observed(_body(name), snap), p, Result())
    settle.settle(ctx, ("ns", name), Observed(_body(name), snap), p, Result())
    assert again.calls.count(("patch", "ModelDeployment", name)) == 1


def test_a_pass_that_stopped_writes_what_it_came_with() -> None:
    kube = Kube()
    status = ModelDeploymentStatus()
    ended = Ended(_body("m"), Result(), status, (("Warning", "InvalidSpec", "why"),), LEGACY)
    settle.settle(_context(kube), ("ns", "m"), ended, None, Result())
    assert kube.calls == [("patch", "ModelDeployment", "m"), ("status", "m"), ("event", "InvalidSpec")]


def test_a_pass_parked_for_its_channel_looks_again_as_a_backup_of_the_watch() -> None:
    """A group parked for its channel template is woken by the template's watch; the pass asks for one
    look LOOK_SECONDS later in case that event is missed. Where templates are not watched (the driver was
    installed after the operator started) it looks every second: the template is read by each pass."""
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    name = md.metadata.name or ""
    looks = {}
    for watched in (False, True):
        ctx = _context(Kube())
        if watched:
            ctx.view.replace(TEMPLATE, [], "ns")
        result = Result(channel_waits=[f"{name}-decode-0"])
        settle.settle(ctx, ("ns", name), Observed(_body(name), snap), plan(snap), result)
        looks[watched] = result.requeue_after
    assert looks == {False: 1.0, True: settle.LOOK_SECONDS}
    assert settle.LOOK_SECONDS >= 5.0
