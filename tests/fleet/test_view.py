"""The cluster view: facts read from objects, usage per node, the deployments each event wakes, relists."""

from __future__ import annotations

import pytest

from tests import kube_objects
from tokenfab.fleet.view import TEMPLATE, Change, ClusterView, node_facts, pod_facts
from tokenfab.planning import contract
from tokenfab.planning.capacity import Taint

GPU = kube_objects.GPU
GI = 2**30
M = ("ml", "m")


def view_with(*events: tuple[str, dict]) -> ClusterView:
    v = ClusterView()
    for kind, obj in events:
        {"Node": v.on_node, "Pod": v.on_pod, "ForeignPod": v.on_foreign_pod}[kind]("ADDED", obj)
    return v


def gpus_used(v: ClusterView) -> dict[str, int]:
    return {n: u.get(GPU, 0) for n, u in v.used().items() if u.get(GPU)}


# ----------------------------------------------------------------------------------------------- facts


def test_node_facts():
    obj = kube_objects.node(
        "a-0",
        gpus=8,
        ready=False,
        unschedulable=True,
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "x", "effect": "NoExecute"},
        ],
        extra={"example.com/bad": "lots"},
    )
    f = node_facts(obj)
    assert (f.name, f.labels, f.ready, f.unschedulable) == ("a-0", {kube_objects.LABEL: "a"}, False, True)
    assert f.allocatable == {GPU: 8, "cpu": 64_000, "memory": 512 * GI, "pods": 110}  # the bad one dropped
    assert f.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"), Taint("x", "", "NoExecute"))
    assert f.not_ready_since == kube_objects.T0_UNIX
    assert node_facts(kube_objects.node("a-0")).not_ready_since is None
    assert node_facts({"metadata": {"name": "bare"}}).ready is False


def test_pod_facts_of_a_pending_gated_pinned_pod():
    obj = kube_objects.pod(
        "m-decode-0-1",
        pinned="a-1",
        gated=True,
        rank=1,
        annotations={"other.io/x": "y", contract.ANN_GROUP_NODES: "a-0,a-1"},
        status={
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}
            ]
        },
    )
    f = pod_facts(obj)
    assert (f.namespace, f.name, f.node, f.pinned, f.gated, f.phase) == (
        "ml",
        "m-decode-0-1",
        None,
        "a-1",
        True,
        "Pending",
    )
    assert f.deployment == "m"
    assert f.annotations == {
        contract.ANN_NODE: "a-1",
        contract.ANN_GROUP_NODES: "a-0,a-1",
    }  # only tokenfab's own
    assert f.requests == {GPU: 4, "cpu": 8000, "memory": 64 * GI}
    assert (f.waiting, f.ready, f.ready_since, f.deleting) == ("gated", False, None, False)
    assert f.created == kube_objects.T0_UNIX
    assert f.usage_node == "a-1"


def test_a_pod_waits_for_the_claims_of_its_templates_only():
    template = {"name": "imex", "resourceClaimTemplateName": "m-decode-0-imex"}
    named = {"name": "shared", "resourceClaimName": "made-by-the-user"}
    obj = kube_objects.pod("m-decode-0-0", pinned="a-0", gated=True, status={})
    obj["spec"]["resourceClaims"] = [template, named]
    assert pod_facts(obj).claims_pending  # the controller has not made the template's claim yet
    obj["status"]["resourceClaimStatuses"] = [{"name": "imex", "resourceClaimName": "m-decode-0-0-imex-x7"}]
    assert not pod_facts(obj).claims_pending
    obj["status"]["resourceClaimStatuses"] = [{"name": "imex"}]  # the controller found no claim needed
    assert not pod_facts(obj).claims_pending
    del obj["spec"]["resourceClaims"]
    assert not pod_facts(obj).claims_pending


def test_pod_facts_requests_as_the_scheduler_counts_them():
    obj = kube_objects.pod("p-0")
    obj["spec"] = {
        "containers": [
            {"resources": {"limits": {GPU: "4", "cpu": "4"}, "requests": {"cpu": "2"}}},  # requests win
            {"resources": {"limits": {"memory": "1Gi"}}},  # limits stand in for requests
            {},
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "3", "memory": "4Gi"}}}
        ],  # the max, not the sum
        "overhead": {"cpu": "250m", "bogus": "?"},
    }
    assert pod_facts(obj).requests == {GPU: 4, "cpu": 3250, "memory": 4 * GI}


def test_pod_facts_of_running_and_failed_pods():
    running = kube_objects.pod(
        "p-0",
        node="a-0",
        phase="Running",
        status={"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": kube_objects.T0}]},
    )
    f = pod_facts(running)
    assert (f.ready, f.ready_since, f.exit_message, f.terminal) == (True, kube_objects.T0_UNIX, "", False)
    waiting = kube_objects.pod(
        "p-1",
        node="a-0",
        status={
            "containerStatuses": [
                {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
            ]
        },
    )
    assert pod_facts(waiting).waiting == "ImagePullBackOff: no such image"
    failed = kube_objects.pod(
        "p-2",
        node="a-0",
        phase="Failed",
        status={
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "killed "}}}
            ]
        },
    )
    f = pod_facts(failed)
    assert (f.terminal, f.exit_message, f.usage_node) == (True, "exit code 137, OOMKilled, killed", None)
    evicted = kube_objects.pod(
        "p-3", node="a-0", phase="Failed", status={"reason": "Evicted", "message": "low on memory"}
    )
    assert pod_facts(evicted).exit_message == "low on memory"


# ----------------------------------------------------------------------------------------------- usage


def test_bound_and_pinned_pods_hold_their_node():
    v = view_with(
        ("Node", kube_objects.node("a-0")),
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0", pinned="a-0", phase="Running")),
        (
            "Pod",
            kube_objects.pod("m-d-0-1", pinned="a-1", gated=True),
        ),  # not bound yet: holds its pinned node
        ("Pod", kube_objects.pod("m-d-1-0", gpus=2)),  # neither bound nor pinned: holds nothing
    )
    assert v.used() == {
        "a-0": {GPU: 4, "cpu": 8000, "memory": 64 * GI},
        "a-1": {GPU: 4, "cpu": 8000, "memory": 64 * GI},
    }


def test_binding_moves_nothing_and_counts_once():
    v = view_with(("Pod", kube_objects.pod("m-d-0-0", pinned="a-0", gated=True)))
    v.on_pod("MODIFIED", kube_objects.pod("m-d-0-0", pinned="a-0"))  # released
    change = v.on_pod("MODIFIED", kube_objects.pod("m-d-0-0", pinned="a-0", node="a-0", phase="Running"))
    assert gpus_used(v) == {"a-0": 4}
    assert change == Change({M}, False)


def test_terminal_pods_free_their_node_terminating_ones_do_not():
    v = view_with(("Pod", kube_objects.pod("m-d-0-0", node="a-0", pinned="a-0", phase="Running")))
    change = v.on_pod(
        "MODIFIED", kube_objects.pod("m-d-0-0", node="a-0", pinned="a-0", phase="Running", deleting=True)
    )
    assert (gpus_used(v), change.freed) == ({"a-0": 4}, False)  # still running until it is gone
    change = v.on_pod(
        "MODIFIED", kube_objects.pod("m-d-0-0", node="a-0", pinned="a-0", phase="Failed", deleting=True)
    )
    assert (gpus_used(v), change) == ({}, Change({M}, True))
    # Already free: its deletion frees nothing more.
    change = v.on_pod("DELETED", kube_objects.pod("m-d-0-0", node="a-0", pinned="a-0", phase="Failed"))
    assert (gpus_used(v), change) == ({}, Change({M}, False))
    assert v.pod("ml", "m-d-0-0") is None


def test_a_deleted_pod_frees_its_node_and_wakes_its_deployment():
    v = view_with(
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0", phase="Running")),
        ("Pod", kube_objects.pod("m-d-0-1", node="a-0")),
    )
    assert gpus_used(v) == {"a-0": 8}
    change = v.on_pod("DELETED", kube_objects.pod("m-d-0-0", node="a-0", phase="Running"))
    assert (gpus_used(v), change) == ({"a-0": 4}, Change({M}, True))
    # A deletion of a pod never seen changes nothing (and frees nothing).
    assert v.on_pod("DELETED", kube_objects.pod("m-d-9-9", node="a-0")) == Change({M}, False)
    assert gpus_used(v) == {"a-0": 4}


def test_foreign_pods_count_while_bound_and_not_terminal():
    v = ClusterView()
    other = kube_objects.pod("web-0", None, "default", node="a-0", gpus=1, managed=False, phase="Running")
    assert v.on_foreign_pod("ADDED", other) == Change(set(), False)
    assert gpus_used(v) == {"a-0": 1}
    # Unbound or finished pods of others hold nothing.
    v.on_foreign_pod("ADDED", kube_objects.pod("web-1", None, "default", gpus=1, managed=False))
    v.on_foreign_pod(
        "ADDED",
        kube_objects.pod("job-0", None, "default", node="a-1", gpus=2, managed=False, phase="Succeeded"),
    )
    assert gpus_used(v) == {"a-0": 1}
    # tokenfab's own pods are counted by on_pod only (never twice).
    ours = kube_objects.pod("m-d-0-0", node="a-0", phase="Running")
    assert v.on_foreign_pod("ADDED", ours) == Change()
    v.on_pod("ADDED", ours)
    assert gpus_used(v) == {"a-0": 5}
    # It finishes: freed.
    done = kube_objects.pod("web-0", None, "default", node="a-0", gpus=1, managed=False, phase="Failed")
    assert v.on_foreign_pod("MODIFIED", done) == Change(set(), True)
    assert gpus_used(v) == {"a-0": 4}
    assert v.on_foreign_pod("DELETED", done) == Change(set(), False)


def test_a_scoped_view_counts_tokenfab_pods_of_other_namespaces_as_others_pods():
    # An operator serving only "ml" sees no tokenfab pod elsewhere through on_pod: the GPUs they hold must
    # still count, or it would promise them again.
    v = ClusterView(namespaces=["ml"])
    elsewhere = kube_objects.pod("x-d-0-0", "x", "other", node="a-0", phase="Running")
    assert v.on_foreign_pod("ADDED", elsewhere) == Change(set(), False)
    assert gpus_used(v) == {"a-0": 4}
    ours = kube_objects.pod("m-d-0-0", node="a-1", phase="Running")
    assert v.on_foreign_pod("ADDED", ours) == Change()
    v.on_pod("ADDED", ours)
    assert gpus_used(v) == {"a-0": 4, "a-1": 4}


def test_used_returns_copies_and_drops_what_is_back_to_zero():
    v = view_with(("Pod", kube_objects.pod("m-d-0-0", node="a-0")))
    v.used()["a-0"][GPU] = 99
    assert gpus_used(v) == {"a-0": 4}
    v.on_pod("DELETED", kube_objects.pod("m-d-0-0", node="a-0"))
    assert v.used().get("a-0", {}) == {}


# -------------------------------------------------------------------------------------- wake and freed


def test_pod_events_wake_their_deployment_only():
    v = ClusterView()
    assert v.on_pod("ADDED", kube_objects.pod("m-d-0-0")) == Change({M})
    assert v.on_pod("ADDED", kube_objects.pod("n-d-0-0", "n", "other")) == Change({("other", "n")})
    assert v.on_pod("ADDED", kube_objects.pod("stray-0", None)) == Change()
    assert v.pods(M) == [pod_facts(kube_objects.pod("m-d-0-0"))]
    assert v.deployments() == set()  # deployments are ModelDeployments, not pod owners


def test_a_pod_update_wakes_its_deployment_only_when_what_a_pass_reads_changed():
    v = ClusterView()
    v.on_pod("ADDED", kube_objects.pod("m-d-0-0"))
    same = kube_objects.pod("m-d-0-0", status={"podIP": "10.0.0.7", "qosClass": "Burstable"})
    same["metadata"]["resourceVersion"] = "2"
    assert v.on_pod("MODIFIED", same) == Change()  # a status detail and a new resourceVersion
    bound = kube_objects.pod("m-d-0-0", node="a-0")
    assert v.on_pod("MODIFIED", bound) == Change({M})
    assert v.on_pod(
        "MODIFIED", kube_objects.pod("m-d-0-0", node="a-0", phase="Running", ready=True)
    ) == Change({M})
    assert v.on_pod("DELETED", kube_objects.pod("m-d-0-0", node="a-0", phase="Running", ready=True)).keys == {
        M
    }


def test_a_child_update_wakes_its_deployment_only_when_what_a_pass_reads_changed():
    v = ClusterView()
    pdb = kube_objects.child("PodDisruptionBudget", "m-decode")
    assert v.on_child("PodDisruptionBudget", "ADDED", pdb) == Change({M})
    pdb = kube_objects.child("PodDisruptionBudget", "m-decode")
    pdb["metadata"]["resourceVersion"] = "9"
    pdb["status"] = {"currentHealthy": 3, "disruptionsAllowed": 1}
    assert v.on_child("PodDisruptionBudget", "MODIFIED", pdb) == Change()  # the disruption controller's
    dep = kube_objects.child("Deployment", "m-frontend")
    assert v.on_child("Deployment", "ADDED", dep) == Change({M})
    dep["status"] = {"availableReplicas": 1}
    assert v.on_child("Deployment", "MODIFIED", dep) == Change({M})  # the frontend became available
    dep["metadata"]["annotations"] = {contract.ANN_APPLIED_HASH: "abc"}
    assert v.on_child("Deployment", "MODIFIED", dep) == Change({M})
    assert v.on_child("Deployment", "MODIFIED", dep) == Change()


def test_a_model_deployment_whose_status_alone_changed_wakes_nothing():
    v = ClusterView()
    md = kube_objects.model_deployment()
    assert v.on_model_deployment("ADDED", md) == Change({M})
    written = {**md, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert v.on_model_deployment("MODIFIED", written) == Change()  # e.g. the operator's own write
    assert v.model_deployment(M) == written  # but the view holds it
    changed = {**written, "spec": {"x": 1}, "metadata": {**md["metadata"], "generation": 2}}
    assert v.on_model_deployment("MODIFIED", changed) == Change({M})
    deleting = {**changed, "metadata": {**changed["metadata"], "deletionTimestamp": kube_objects.T0}}
    assert v.on_model_deployment("MODIFIED", deleting) == Change({M})


def test_node_events_wake_the_deployments_with_pods_bound_or_pinned_there():
    v = view_with(
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0")),
        ("Pod", kube_objects.pod("n-d-0-0", "n", pinned="a-0", gated=True)),
        ("Pod", kube_objects.pod("o-d-0-0", "o", node="a-1")),
    )
    assert v.on_node("ADDED", kube_objects.node("a-0")) == Change({M, ("ml", "n")}, True)  # a new node: room
    assert v.on_node("MODIFIED", kube_objects.node("a-0")) == Change()  # nothing that matters changed
    assert v.node_holders("a-0") == {M, ("ml", "n")}


@pytest.mark.parametrize(
    ("before", "after", "freed"),
    [
        (kube_objects.node("a-0"), kube_objects.node("a-0", ready=False), False),
        (kube_objects.node("a-0", ready=False), kube_objects.node("a-0"), True),
        (kube_objects.node("a-0"), kube_objects.node("a-0", unschedulable=True), False),
        (kube_objects.node("a-0", unschedulable=True), kube_objects.node("a-0"), True),
        (
            kube_objects.node("a-0"),
            kube_objects.node("a-0", taints=[{"key": "x", "effect": "NoSchedule"}]),
            False,
        ),
        (
            kube_objects.node("a-0", taints=[{"key": "x", "effect": "NoSchedule"}]),
            kube_objects.node("a-0"),
            True,
        ),
        (kube_objects.node("a-0", gpus=4), kube_objects.node("a-0", gpus=8), True),
        (kube_objects.node("a-0", gpus=8), kube_objects.node("a-0", gpus=4), False),
        # The device plugin registers the GPUs of a node that had none listed.
        (kube_objects.node("a-0", gpus=None), kube_objects.node("a-0", gpus=8), True),
        # A hard taint replaced by a soft one: room may have grown although there are as many taints.
        (
            kube_objects.node("a-0", taints=[{"key": "x", "effect": "NoSchedule"}]),
            kube_objects.node("a-0", taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
            True,
        ),
        (
            kube_objects.node("a-0"),
            kube_objects.node("a-0", labels={"pool": "inference"}),
            True,
        ),  # may now match a selector
    ],
)
def test_a_changed_node_wakes_its_holders_and_says_whether_room_may_have_grown(before, after, freed):
    v = view_with(("Pod", kube_objects.pod("m-d-0-0", node="a-0")), ("Node", before))
    assert v.on_node("MODIFIED", after) == Change({M}, freed)


def test_a_deleted_node_wakes_its_holders_and_frees_nothing():
    v = view_with(("Node", kube_objects.node("a-0")), ("Pod", kube_objects.pod("m-d-0-0", node="a-0")))
    assert v.on_node("DELETED", kube_objects.node("a-0")) == Change({M}, False)
    assert v.node("a-0") is None
    assert v.nodes() == []


def test_a_deployment_stops_being_woken_by_a_node_once_its_pods_left_it():
    v = view_with(
        ("Node", kube_objects.node("a-0")),
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0")),
        ("Pod", kube_objects.pod("m-d-0-1", pinned="a-0", gated=True)),
    )
    v.on_pod("DELETED", kube_objects.pod("m-d-0-0", node="a-0"))
    assert v.node_holders("a-0") == {M}  # m-d-0-1 is still pinned there
    v.on_pod("DELETED", kube_objects.pod("m-d-0-1", pinned="a-0"))
    assert v.node_holders("a-0") == set()
    assert v.on_node("MODIFIED", kube_objects.node("a-0", ready=False)) == Change(set(), False)


def test_children_and_model_deployments_wake_their_deployment():
    v = ClusterView()
    assert v.on_child("ConfigMap", "ADDED", kube_objects.child("ConfigMap", "m-engine")) == Change({M})
    assert v.child("ConfigMap", "ml", "m-engine") is not None
    assert [ch.name for ch in v.children("ConfigMap", M)] == ["m-engine"]
    assert v.children("Service", M) == []
    assert v.on_child("ConfigMap", "ADDED", kube_objects.child("ConfigMap", "unowned", None)) == Change()
    assert v.on_child("ConfigMap", "DELETED", kube_objects.child("ConfigMap", "m-engine")) == Change({M})
    assert v.child("ConfigMap", "ml", "m-engine") is None
    md = kube_objects.model_deployment()
    assert v.on_model_deployment("ADDED", md) == Change({M})
    assert (v.model_deployment(M), v.deployments()) == (md, {M})
    assert v.on_model_deployment("DELETED", md) == Change({M})
    assert v.model_deployment(M) is None


def test_a_channel_template_wakes_the_deployment_of_its_compute_domain():
    v = ClusterView()
    assert v.channel_template("ml", "m-unit-0") is None  # not watched (yet): the caller reads it
    v.on_child("ComputeDomain", "ADDED", kube_objects.child("ComputeDomain", "m-unit-0"))
    assert v.replace(TEMPLATE, [], "ml") == Change()
    assert v.channel_template("ml", "m-unit-0") is False
    rct = kube_objects.child(TEMPLATE, "m-unit-0", None)  # the driver's: no label of tokenfab's
    assert v.on_channel_template("ADDED", rct) == Change({M})  # its domain's deployment goes on
    assert v.channel_template("ml", "m-unit-0") is True
    assert v.on_channel_template("MODIFIED", rct) == Change()  # (only whether it exists is read)
    assert v.on_channel_template("ADDED", kube_objects.child(TEMPLATE, "x", None)) == Change()  # no domain
    assert v.on_channel_template("DELETED", rct) == Change({M})
    assert v.channel_template("ml", "m-unit-0") is False
    assert v.replace(TEMPLATE, [rct], "ml") == Change({M})  # a relist shows it: woken too
    assert v.channel_template("ml", "m-unit-0") is True
    assert v.replace(TEMPLATE, [], "ml") == Change({M})  # gone while unwatched
    assert v.channel_template("ml", "m-unit-0") is False


# --------------------------------------------------------------------------------------------- relists


def test_a_pod_relist_deletes_what_vanished_frees_it_and_wakes_its_owner():
    v = view_with(
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0", phase="Running")),
        ("Pod", kube_objects.pod("n-d-0-0", "n", node="a-1", phase="Running")),
    )
    change = v.replace("Pod", [kube_objects.pod("n-d-0-0", "n", node="a-1", phase="Running")])
    assert v.pod("ml", "m-d-0-0") is None
    assert gpus_used(v) == {"a-1": 4}
    assert change.freed
    assert M in change.keys
    assert v.synced["Pod"]


def test_a_relist_keeps_what_is_still_there_counted_once():
    pods = [
        kube_objects.pod("m-d-0-0", node="a-0", phase="Running"),
        kube_objects.pod("m-d-0-1", pinned="a-1", gated=True),
    ]
    v = view_with(*(("Pod", p) for p in pods))
    change = v.replace("Pod", pods)
    assert gpus_used(v) == {"a-0": 4, "a-1": 4}
    assert not change.freed


def test_a_namespace_relist_speaks_for_its_namespace_only():
    v = view_with(
        ("Pod", kube_objects.pod("m-d-0-0", node="a-0")),
        ("Pod", kube_objects.pod("m-d-0-0", "m", "team-b", node="a-1")),
    )
    change = v.replace("Pod", [], namespace="team-b")
    assert v.pod("ml", "m-d-0-0") is not None  # another namespace's stream says nothing of it
    assert v.pod("team-b", "m-d-0-0") is None
    assert gpus_used(v) == {"a-0": 4}
    assert change.keys == {("team-b", "m")}


def test_a_node_relist_deletes_vanished_nodes_and_wakes_their_holders():
    v = view_with(
        ("Node", kube_objects.node("a-0")),
        ("Node", kube_objects.node("a-1")),
        ("Pod", kube_objects.pod("m-d-0-0", node="a-1")),
    )
    change = v.replace("Node", [kube_objects.node("a-0")])
    assert [n.name for n in v.nodes()] == ["a-0"]
    assert M in change.keys


def test_a_foreign_pod_relist_frees_what_vanished():
    v = view_with(
        ("ForeignPod", kube_objects.pod("web-0", None, "default", node="a-0", gpus=1, managed=False)),
        ("ForeignPod", kube_objects.pod("web-1", None, "default", node="a-0", gpus=2, managed=False)),
    )
    change = v.replace(
        "ForeignPod", [kube_objects.pod("web-1", None, "default", node="a-0", gpus=2, managed=False)]
    )
    assert gpus_used(v) == {"a-0": 2}
    assert change.freed


def test_a_child_relist_deletes_vanished_children_and_wakes_their_owner():
    v = ClusterView()
    v.on_child("Deployment", "ADDED", kube_objects.child("Deployment", "m-frontend"))
    v.on_child("Deployment", "ADDED", kube_objects.child("Deployment", "n-frontend", "n"))
    change = v.replace("Deployment", [kube_objects.child("Deployment", "n-frontend", "n")])
    assert v.child("Deployment", "ml", "m-frontend") is None
    assert v.child("Deployment", "ml", "n-frontend") is not None
    # The frontend of m was deleted while the watch was down: m must apply it again.
    assert M in change.keys


def test_a_relist_of_one_namespace_keeps_a_pod_another_namespace_adds_meanwhile():
    import threading

    threads: list[threading.Thread] = []

    class Delivering(ClusterView):
        deliver = None

        def _keys_of(self, kind):  # type: ignore[no-untyped-def]
            keys = super()._keys_of(kind)
            if self.deliver is not None:
                d, self.deliver = self.deliver, None
                threads.append(threading.Thread(target=d))
                threads[0].start()
                threads[0].join(0.3)
            return keys

    view = Delivering(["ml", "team-b"])
    view.on_node("ADDED", kube_objects.node("a-0", "a", 8))
    view.deliver = lambda: view.on_pod(
        "ADDED", kube_objects.pod("x-w-0-0", "x", "team-b", pinned="a-0", gpus=8, group="x-w-0")
    )
    view.replace("Pod", [], namespace="ml")  # the Pod@ml stream relists (after a 410 Gone, say)
    threads[0].join(5)
    assert view.pod("team-b", "x-w-0-0") is not None
    assert view.used()["a-0"][kube_objects.GPU] == 8


def test_a_deployments_children_are_read_from_its_namespace_alone_and_follow_every_event():
    """children() and model_caches() read an index by kind and namespace; after adds, updates, deletes and
    a relist they say what a walk over every child says."""
    import random

    view = ClusterView()
    rng = random.Random(7)
    kinds = ("ConfigMap", "PodDisruptionBudget", "PersistentVolumeClaim")
    live: dict[tuple[str, str, str], dict] = {}
    for step in range(400):
        kind, ns = rng.choice(kinds), rng.choice(["a", "b"])
        name = f"c{rng.randrange(30)}"
        dep = rng.choice(["m", "n"])
        meta = {"namespace": ns, "name": name, "labels": {contract.LABEL_DEPLOYMENT: dep}}
        if kind == "PersistentVolumeClaim":
            meta["annotations"] = {contract.ANN_NODE: f"node-{step % 3}"}
        if rng.random() < 0.3:
            view.on_child(kind, "DELETED", {"metadata": meta})
            live.pop((kind, ns, name), None)
        else:
            view.on_child(kind, "MODIFIED", {"metadata": meta})
            live[(kind, ns, name)] = meta
    view.replace(
        "ConfigMap", [{"metadata": m} for (k, ns, _), m in live.items() if k == "ConfigMap" and ns == "a"]
    )
    for key in [k for k in live if k[0] == "ConfigMap" and k[1] == "b"]:
        live.pop(key)
    for kind in kinds:
        for ns in ("a", "b"):
            for dep in ("m", "n"):
                got = sorted(ch.name for ch in view.children(kind, (ns, dep)))
                want = sorted(
                    ch.name
                    for ch in view.all_children(kind)
                    if ch.namespace == ns and (ch.deployment == dep or dep in ch.owners)
                )
                assert got == want
                assert got == sorted(
                    n
                    for (k, s, n), m in live.items()
                    if k == kind and s == ns and m["labels"][contract.LABEL_DEPLOYMENT] == dep
                )
    for ns in ("a", "b"):
        assert sorted(c.name for c in view.model_caches(ns)) == sorted(
            n for (k, s, n) in live if k == "PersistentVolumeClaim" and s == ns
        )
