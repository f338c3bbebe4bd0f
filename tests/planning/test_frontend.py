"""The frontend off a node being left (planning.frontend): its Deployment's pod template names the pods it
replaces, which rolls it onto nodes that take pods, a new pod before the old one goes."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.planning.test_one_pass import deployment, nodes_of, snapshot
from tokenfab.fleet.facts import child_facts
from tokenfab.planning import builders, contract
from tokenfab.planning.faults import NodeFault
from tokenfab.planning.frontend import FrontendPod, gone, move
from tokenfab.planning.lifecycle import NodeHealth
from tokenfab.planning.one_pass import plan
from tokenfab.planning.role_plan import FaultReaction

QUARANTINED = NodeHealth(
    True,
    schedulable=False,
    faults=(NodeFault("Quarantined", "cordoned with annotation quarantineHealthEvent"),),
)
CORDONED = NodeHealth(True, schedulable=False, faults=(NodeFault("Cordoned", "cordoned", degrades=False),))
HEALTHY = NodeHealth(True)
PODS = (FrontendPod("fe-a", "n1"), FrontendPod("fe-b", "n2"))


def test_a_frontend_pod_on_a_quarantined_node_is_named_with_the_node_and_the_fault() -> None:
    out = move(PODS, {"n1": QUARANTINED, "n2": HEALTHY}, "")
    assert out.moved == "fe-a"
    ((kind, reason, message),) = out.events
    assert (kind, reason) == ("Normal", "FrontendMoved")
    assert "fe-a" in message
    assert "n1" in message
    assert "Quarantined" in message
    assert "fe-b" not in message


def test_a_cordon_moves_it_too_and_two_pods_are_named_in_order() -> None:
    out = move(PODS, {"n1": CORDONED, "n2": QUARANTINED}, "")
    assert out.moved == "fe-a,fe-b"
    assert [e[2].split()[2] for e in out.events] == ["fe-a", "fe-b"]


def test_while_the_old_pod_waits_for_its_replacement_the_mark_is_kept_without_a_new_event() -> None:
    out = move(PODS, {"n1": QUARANTINED}, "fe-a")
    assert (out.moved, out.events) == ("fe-a", ())


def test_with_no_pod_on_a_node_being_left_the_mark_stays_and_nothing_rolls() -> None:
    moved = (FrontendPod("fe-c", "n3"),)
    assert move(moved, {"n3": HEALTHY, "n1": QUARANTINED}, "fe-a") == move(moved, {}, "fe-a")
    assert move(moved, {"n1": QUARANTINED}, "fe-a").moved == "fe-a"
    assert move((FrontendPod("fe-c", ""),), {"": QUARANTINED}, "").moved == ""  # (not bound yet)


def test_a_later_fault_under_a_new_pod_rolls_again() -> None:
    again = (FrontendPod("fe-c", "n1"),)
    out = move(again, {"n1": QUARANTINED}, "fe-a")
    assert out.moved == "fe-c"
    assert len(out.events) == 1


def test_a_device_taint_or_a_sudden_fault_leaves_the_frontend_where_it_is() -> None:
    device = NodeHealth(True, faults=(NodeFault("DeviceTainted", "device gpu-0 tainted x:NoSchedule"),))
    sudden = NodeHealth(
        True,
        schedulable=False,
        faults=(NodeFault("Evicting", "NoExecute", sudden=True), NodeFault("Cordoned", "cordoned")),
    )
    assert move(PODS, {"n1": device, "n2": sudden}, "").moved == ""


def _frontend(p: Any) -> dict[str, Any]:
    (dep,) = [m for m in p.writes.rest if m["kind"] == "Deployment"]
    return dep  # type: ignore[no-any-return]


def test_a_pass_marks_the_frontend_template_and_says_so_once() -> None:
    md = deployment()
    nodes = nodes_of({"a": 4, "b": 4})
    snap = snapshot(md, nodes, {}, {})
    health = {**snap.health, "a-0": QUARANTINED}
    first = plan(dataclasses.replace(snap, health=health, frontend=(FrontendPod("fe-1", "a-0"),)))
    template = _frontend(first)["spec"]["template"]["metadata"]
    assert template["annotations"] == {contract.ANN_REPLACES: "fe-1"}
    assert [e[1] for e in first.events if e[1] == "FrontendMoved"] == ["FrontendMoved"]
    # The next pass sees the Deployment marked, the old pod still there: the same manifest, no event.
    again = plan(
        dataclasses.replace(
            snap, health=health, frontend=(FrontendPod("fe-1", "a-0"),), frontend_replaces="fe-1"
        )
    )
    assert _frontend(again) == _frontend(first)
    assert "FrontendMoved" not in {e[1] for e in again.events}
    # Once the old pod is gone, the mark stays (the frontend does not roll back).
    after = plan(dataclasses.replace(snap, frontend=(FrontendPod("fe-2", "b-0"),), frontend_replaces="fe-1"))
    assert builders.applied_hash(_frontend(after)) == builders.applied_hash(_frontend(first))
    # A deployment whose frontend never moved has no mark at all (the manifest it always had).
    plain = _frontend(plan(snap))["spec"]["template"]["metadata"]
    assert "annotations" not in plain


def test_the_cluster_view_reads_the_mark_from_the_deployments_template() -> None:
    md = deployment()
    owner = builders.Owner(name="deepseek-r1", namespace="ns", uid="uid-1")
    dep = builders.frontend_deployment(owner, md.spec, "fe-1,fe-2")
    assert child_facts("Deployment", dep).replaces == "fe-1,fe-2"
    assert child_facts("Deployment", builders.frontend_deployment(owner, md.spec)).replaces == ""


def test_the_frontend_rolls_a_new_pod_before_an_old_one_goes_and_spreads_over_nodes() -> None:
    md = deployment()
    owner = builders.Owner(name="deepseek-r1", namespace="ns", uid="uid-1")
    dep = builders.frontend_deployment(owner, md.spec)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (spread,) = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # (never keeps a frontend pod from starting)
    assert spread["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_a_frontend_pod_on_a_gone_node_is_deleted_at_once_and_said_once_per_pod() -> None:
    pods = (FrontendPod("fe-a", "n1"), FrontendPod("fe-b", "n2", deleting=True), FrontendPod("fe-c", ""))
    names, said = gone(pods, {"n1": HEALTHY})
    assert names == ("fe-b",)  # (a pod being deleted too: no kubelet is there to end it)
    ((kind, reason, message),) = said
    assert (kind, reason) == ("Warning", "FrontendLost")
    assert "fe-b" in message
    assert "n2" in message
    assert gone(pods, {"n1": HEALTHY, "n2": QUARANTINED}) == ((), [])


def test_a_pass_force_deletes_a_frontend_pod_whose_node_is_gone_with_the_workers_orphans() -> None:
    md = deployment()
    snap = snapshot(md, nodes_of({"a": 4, "b": 4}), {}, {})
    p = plan(dataclasses.replace(snap, frontend=(FrontendPod("fe-1", "gone-0"), FrontendPod("fe-2", "a-1"))))
    assert p.writes.names("Pod", force=True) == ("fe-1",)
    assert [e[1] for e in p.events if e[1].startswith("Frontend")] == ["FrontendLost"]
    # A fault benchmark's plain-Kubernetes baseline leaves both to Kubernetes.
    none = FaultReaction("none")
    plain = dataclasses.replace(snap, frontend=(FrontendPod("fe-1", "gone-0"),), reaction=none)
    assert plan(plain).writes.names("Pod", force=True) == ()
    health = {**snap.health, "a-0": QUARANTINED}
    there = (FrontendPod("fe-2", "a-0"),)
    left = plan(dataclasses.replace(snap, health=health, frontend=there, reaction=none))
    assert "annotations" not in _frontend(left)["spec"]["template"]["metadata"]


def test_a_frontend_pod_being_deleted_on_a_quarantined_node_rolls_nothing() -> None:
    assert move((FrontendPod("fe-a", "n1", deleting=True),), {"n1": QUARANTINED}, "").moved == ""


def test_the_frontend_tolerates_a_failed_node_as_long_as_the_workers_do() -> None:
    md = deployment()
    spec = md.spec.model_copy(
        update={"topology": md.spec.topology.model_copy(update={"node_failure_toleration_seconds": 30})}
    )
    dep = builders.frontend_deployment(builders.Owner(name="x", namespace="ns", uid="u"), spec)
    tolerations = dep["spec"]["template"]["spec"]["tolerations"]
    assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in tolerations} == {
        ("node.kubernetes.io/not-ready", "NoExecute", 30),
        ("node.kubernetes.io/unreachable", "NoExecute", 30),
    }
