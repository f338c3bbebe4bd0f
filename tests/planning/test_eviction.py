"""Least-recently-used eviction of model caches per node (tokenfab.planning.eviction), in one pass and
across deployments through the cluster view."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.planning.test_one_pass import NOW, deployment, snapshot
from tests.planning.test_prestage import NODES
from tokenfab.api.models import ModelDeploymentStatus, WeightsCacheStatus
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import builders, contract, weights_cache
from tokenfab.planning.eviction import CacheEntry, NodeCaches, evictions, idle_times
from tokenfab.planning.one_pass import plan
from tokenfab.planning.status import rfc3339
from tokenfab.views import node_caches

TI = 2**40


def test_the_longest_idle_go_first_until_the_rest_fit_and_pinned_ones_never():
    entries = [
        CacheEntry("ns/a", "n1", 3 * TI, 100.0),
        CacheEntry("ns/b", "n1", 3 * TI, 50.0),  # idle longest
        CacheEntry("ns/c", "n1", 3 * TI, None),  # pinned
        CacheEntry("ns/d", "n2", 3 * TI, 10.0),  # n2 has room
        CacheEntry("ns/e", "n3", 9 * TI, 10.0),  # n3 has no capacity label: never evicted
    ]
    capacity = {"n1": 7 * TI, "n2": 4 * TI}
    assert evictions(entries, capacity) == {"ns/b"}  # 9 Ti asked for on n1, 6 once b goes
    assert evictions(entries, {"n1": 4 * TI}) == {"ns/a", "ns/b"}  # both idle ones, and c stays
    assert evictions(entries, {"n1": TI}) == {"ns/a", "ns/b"}  # pinned c alone is over: kept anyway
    ties = [CacheEntry("ns/y", "n1", TI, 5.0), CacheEntry("ns/x", "n1", TI, 5.0)]
    assert evictions(ties, {"n1": TI}) == {"ns/x"}  # (ties by name: every pass picks the same)


def test_idle_times_start_when_nothing_pins_a_cache_and_are_kept():
    assert idle_times(["n1", "n2", "n3"], ["n2"], {"n1": 50.0}, 100.0) == {"n1": 50.0, "n3": 100.0}
    assert idle_times(["n1"], ["n1"], {"n1": 50.0}, 100.0) == {}  # pinned again: not idle


def cached(md: Any) -> Any:
    spec = md.spec.model_copy(deep=True)
    spec.model.cache.size = "4Ti"
    return md.model_copy(update={"spec": spec})


def test_a_pass_evicts_its_own_idle_cache_where_the_node_is_full_and_says_so():
    md = cached(deployment(decode=1))
    own = builders.Owner(name=md.metadata.name or "", namespace="ns", uid="uid-1")
    key = weights_cache.weights_key(md.spec)
    first = plan(snapshot(md, NODES, {}, {}))
    used = {n for r in first.roles for cr in r.create for n in cr.nodes}
    idle_node = next(n.name for n in NODES if n.name not in used)
    # its cache on idle_node has been idle since NOW - 600 (as its status says); another deployment's cache
    # there is idle since NOW - 60, and the node gives model caches 6 Ti: one of the two 4 Ti claims goes
    status = ModelDeploymentStatus(
        weights_cache=WeightsCacheStatus(weights=key, idle_since={idle_node: rfc3339(NOW - 600)})
    )
    claims = {**dict.fromkeys(used, key), idle_node: key}
    theirs = CacheEntry("other/x-model-1", idle_node, 4 * TI, NOW - 60)
    caches = NodeCaches(others=(theirs,), capacity={idle_node: 6 * TI})
    snap = replace(
        snapshot(md.model_copy(update={"status": status}), NODES, {}, {}),
        claims=claims,
        caches=caches,
        pod_nodes=frozenset(used),
    )
    p = plan(snap)
    assert p.writes.names("PersistentVolumeClaim") == (
        builders.model_cache_claim_name(own, md.spec, idle_node),
    )
    assert [e[1] for e in p.events] == ["ModelCacheEvicted"]
    assert idle_node in p.events[0][2]
    assert p.weights_cache is not None
    assert idle_node not in p.weights_cache.warm_nodes
    assert idle_node not in p.weights_cache.idle_since
    # the other deployment's cache idle longer: it goes, not this one (its pass deletes it)
    older = replace(snap, caches=replace(caches, others=(replace(theirs, idle_since=NOW - 6000),)))
    kept = plan(older)
    assert kept.writes.names("PersistentVolumeClaim") == ()
    assert kept.weights_cache is not None
    assert kept.weights_cache.idle_since == {idle_node: rfc3339(NOW - 600)}
    # a group of this deployment on the node pins its cache: never evicted
    pinned = plan(replace(snap, pod_nodes=frozenset(used | {idle_node})))
    assert pinned.writes.names("PersistentVolumeClaim") == ()
    # no capacity label: nothing is evicted
    assert plan(replace(snap, caches=NodeCaches())).writes.names("PersistentVolumeClaim") == ()


def test_the_view_gives_other_deployments_caches_and_idle_times_on_labelled_nodes():
    view = ClusterView()
    for name, labels in (
        ("n1", {contract.LABEL_CACHE_CAPACITY: "6Ti"}),
        ("n2", {}),
        ("n3", {contract.LABEL_CACHE_CAPACITY: "x"}),
    ):
        view.on_node("ADDED", {"metadata": {"name": name, "labels": labels}, "status": {}})

    def claim(ns: str, dep: str, node: str) -> dict[str, Any]:
        return {
            "metadata": {
                "namespace": ns,
                "name": f"{dep}-model-{node}",
                "labels": {contract.LABEL_DEPLOYMENT: dep},
                "annotations": {contract.ANN_NODE: node},
            },
            "spec": {"resources": {"requests": {"storage": "4Ti"}}},
        }

    for ns, dep, node in (("a", "one", "n1"), ("b", "two", "n1"), ("b", "two", "n2"), ("b", "two", "n3")):
        view.on_child("PersistentVolumeClaim", "ADDED", claim(ns, dep, node))
    status = {"weightsCache": {"weights": "hf://x/y@main", "idleSince": {"n1": rfc3339(NOW - 60)}}}
    view.on_model_deployment(
        "ADDED", {"metadata": {"namespace": "b", "name": "two"}, "spec": {}, "status": status}
    )
    got = node_caches(view, ("a", "one"), ["n1", "n2", "n3"])
    assert got.capacity == {"n1": 6 * TI}  # (n2 unlabelled, n3's label is no quantity)
    assert got.others == (CacheEntry("b/two-model-n1", "n1", 4 * TI, NOW - 60),)
    # nothing labelled: no claims read at all
    assert node_caches(view, ("a", "one"), ["n2"]) == NodeCaches()


def test_a_capacity_label_wakes_the_deployments_with_a_cache_on_the_node():
    view = ClusterView()
    node = {"metadata": {"name": "n1", "labels": {}}, "status": {}}
    view.on_node("ADDED", node)
    pvc = {
        "metadata": {
            "namespace": "a",
            "name": "one-model-n1",
            "labels": {contract.LABEL_DEPLOYMENT: "one"},
            "annotations": {contract.ANN_NODE: "n1"},
        },
        "spec": {"resources": {"requests": {"storage": "4Ti"}}},
    }
    view.on_child("PersistentVolumeClaim", "ADDED", pvc)
    labelled = {"metadata": {"name": "n1", "labels": {contract.LABEL_CACHE_CAPACITY: "6Ti"}}, "status": {}}
    assert view.on_node("MODIFIED", labelled).keys == {("a", "one")}
    other = {
        "metadata": {"name": "n1", "labels": {contract.LABEL_CACHE_CAPACITY: "6Ti", "x": "y"}},
        "status": {},
    }
    assert view.on_node("MODIFIED", other).keys == set()  # (another label: nothing to evict anew)
