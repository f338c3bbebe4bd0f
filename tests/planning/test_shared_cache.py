"""One model cache per node and source, shared by the namespace's deployments of that source: its name does
not depend on the deployment, each deployment applies it under a field manager of its own (its owner
reference and annotations are its own), a claim another deployment filled starts this one warm, and a
claim several use is evicted only once every one of them lets it go."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.planning.test_one_pass import deployment, nodes_of, snapshot
from tokenfab.fleet.facts import child_facts
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import builders, contract, weights_cache
from tokenfab.planning.autoscaler.groups import headrooms
from tokenfab.planning.eviction import CacheEntry, NodeCaches, evictions, merged
from tokenfab.planning.one_pass import plan
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain
from tokenfab.views import held, node_caches, usable_claims

A = builders.Owner(name="r1-a", namespace="team", uid="uid-a")
B = builders.Owner(name="r1-b", namespace="team", uid="uid-b")
NOW = 1_000_000.0
TI = 2**40


def spec(source: str = "", size: str = "") -> Any:
    s = deployment(decode=1).spec.model_copy(deep=True)
    if source:
        s.model.source = source
    if size:
        s.model.cache.size = size
    return s


def test_the_claim_is_named_by_node_source_class_and_size_not_by_deployment():
    same = spec()
    assert builders.model_cache_claim_name(A, same, "n1") == builders.model_cache_claim_name(B, same, "n1")
    assert builders.model_cache_claim_name(A, same, "n1") != builders.model_cache_claim_name(A, same, "n2")
    assert builders.model_cache_claim_name(A, same, "n1") != builders.model_cache_claim_name(
        A, spec("hf://o/other"), "n1"
    )
    assert builders.model_cache_claim_name(A, same, "n1") != builders.model_cache_claim_name(
        A, spec(size="9Ti"), "n1"
    )
    # (each deployment's fetch pod is its own: two never collide on one name)
    assert builders.weights_fetch_pod_name(A, same, "n1") != builders.weights_fetch_pod_name(B, same, "n1")


def test_each_deployment_applies_the_claim_as_a_co_owner_with_its_own_manager_and_hash():
    s = spec()
    key = builders.weights_key(s)
    ma, mb = builders.model_cache_claim(A, s, "n1", key), builders.model_cache_claim(B, s, "n1", "")
    for m, owner in ((ma, A), (mb, B)):
        (ref,) = m["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"]) == (owner.uid, False)  # (no single controller)
        assert contract.LABEL_DEPLOYMENT not in m["metadata"]["labels"]
        assert builders.field_manager(m) == f"{contract.CACHE_FIELD_MANAGER_PREFIX}{owner.uid}"
        assert builders.applied_annotation(m) == f"{contract.ANN_APPLIED_BY_PREFIX}{owner.uid}"
    # the applied hashes live side by side: one deployment's write does not make the other's stale
    both = {
        **ma["metadata"]["annotations"],
        **builders.with_applied_hash(ma)["metadata"]["annotations"],
        **builders.with_applied_hash(mb)["metadata"]["annotations"],
    }
    obj = {
        **ma,
        "metadata": {
            **ma["metadata"],
            "annotations": both,
            "ownerReferences": [*ma["metadata"]["ownerReferences"], *mb["metadata"]["ownerReferences"]],
        },
    }
    facts = child_facts("PersistentVolumeClaim", obj)
    assert facts.owners == ("r1-a", "r1-b")
    assert facts.holds == (key,)
    applied = dict(facts.applied)
    assert applied[builders.applied_annotation(ma)] == builders.applied_hash(ma)
    assert applied[builders.applied_annotation(mb)] == builders.applied_hash(mb)
    # other children keep the one annotation and the one manager
    other = builders.with_applied_hash(builders.pod_disruption_budget(A, "decode", 2))
    assert builders.applied_annotation(other) == contract.ANN_APPLIED_HASH
    assert builders.field_manager(other) == contract.FIELD_MANAGER


def _claim(owner: builders.Owner, s: Any, node: str, weights: str, *more: builders.Owner) -> dict[str, Any]:
    m = builders.model_cache_claim(owner, s, node, weights)
    refs = [
        *m["metadata"]["ownerReferences"],
        *(builders.model_cache_claim(o, s, node)["metadata"]["ownerReferences"][0] for o in more),
    ]
    return {**m, "metadata": {**m["metadata"], "ownerReferences": refs}}


def test_a_claim_another_deployment_filled_starts_this_one_warm():
    s = spec()
    key = builders.weights_key(s)
    view = ClusterView()
    view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "b-2", key))
    view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "b-3", key))
    view.on_child(
        "PersistentVolumeClaim", "ADDED", _claim(A, spec("hf://o/other"), "a-0", "hf://o/other@main")
    )
    elsewhere = builders.Owner(name="r1-c", namespace="other-team", uid="uid-c")
    claims = usable_claims(view, B, s)
    assert sorted(p.node for p in claims) == ["b-2", "b-3"]  # (not another source's claim)
    assert usable_claims(view, elsewhere, s) == []  # (a claim is namespaced: never another namespace's)
    seen = {p.node: held(p, key) for p in claims}
    assert seen == {"b-2": key, "b-3": key}
    # B's first group goes where A's caches hold the weights, and B marks (co-owns) the claims it uses
    md = deployment(decode=1)
    snap = snapshot(md, nodes_of({"a": 4, "b": 4}), {}, {})
    p = plan(replace(snap, claims=seen))
    decode = next(r for r in p.roles if r.role == "decode").create[0]
    assert sorted(decode.nodes) == ["b-2", "b-3"]
    # B is no owner of A's claims yet: they are not B's children, and B's status still calls them warm
    assert view.children("PersistentVolumeClaim", ("team", "r1-b")) == []
    assert weights_cache.node_warmth(s, seen) == {"b-2": 0, "b-3": 0}


def test_a_claims_change_wakes_every_owner_and_it_is_a_child_of_each():
    s = spec()
    view = ClusterView()
    change = view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "n1", "", B))
    assert change.keys == {("team", "r1-a"), ("team", "r1-b")}
    for name in ("r1-a", "r1-b"):
        assert [p.node for p in view.children("PersistentVolumeClaim", ("team", name))] == ["n1"]
    # B lets go: the change still wakes B (it must see it is no owner any more)
    assert view.on_child("PersistentVolumeClaim", "MODIFIED", _claim(A, s, "n1", "")).keys == {
        ("team", "r1-a"),
        ("team", "r1-b"),
    }
    assert view.children("PersistentVolumeClaim", ("team", "r1-b")) == []


def test_a_shared_claim_is_evicted_only_when_every_user_lets_it_go():
    pinned, idle_a, idle_b = None, NOW - 600, NOW - 60
    # two entries of one claim: pinned by either, so pinned
    assert merged([CacheEntry("t/x", "n1", 4, idle_a), CacheEntry("t/x", "n1", 4, pinned)]) == [
        CacheEntry("t/x", "n1", 4, None)
    ]
    # idle for both: since the later of the two (the last user let go then)
    assert merged([CacheEntry("t/x", "n1", 4, idle_a), CacheEntry("t/x", "n1", 4, idle_b)]) == [
        CacheEntry("t/x", "n1", 4, idle_b)
    ]
    # capacity for one of two: the claim the other deployment still pins stays; the idle one goes, once
    entries = [
        CacheEntry("t/x", "n1", 4, idle_a),
        CacheEntry("t/x", "n1", 4, pinned),
        CacheEntry("t/y", "n1", 4, idle_b),
    ]
    assert evictions(entries, {"n1": 4}) == frozenset({"t/y"})  # (without the merge x, idler, would go)


def test_the_view_gives_each_other_owners_idle_time_of_a_shared_claim():
    s = spec()
    view = ClusterView()
    view.on_node(
        "ADDED", {"metadata": {"name": "n1", "labels": {contract.LABEL_CACHE_CAPACITY: "6Ti"}}, "status": {}}
    )
    third = builders.Owner(name="r1-c", namespace="team", uid="uid-c")
    view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "n1", "", B, third))
    status = {"weightsCache": {"weights": "x", "idleSince": {"n1": rfc3339(NOW - 60)}}}
    view.on_model_deployment(
        "ADDED", {"metadata": {"namespace": "team", "name": "r1-b"}, "spec": {}, "status": status}
    )
    got = node_caches(view, ("team", "r1-a"), ["n1"])
    name = f"team/{builders.model_cache_claim_name(A, s, 'n1')}"
    # B idle for a minute, C (no status: counted as pinned); A's own entry comes from its pass
    assert sorted((e.claim, e.idle_since or 0.0) for e in got.others) == [(name, 0.0), (name, NOW - 60)]


def test_another_deployments_staged_warm_nodes_take_this_ones_groups_but_not_its_headroom():
    md = deployment(decode=1)
    spec = md.spec.model_copy(deep=True)
    spec.model.cache.prestage_groups = 1
    key = builders.weights_key(spec)
    # A staged b-2 and b-3 (its headroom): the shared claims there hold the weights
    theirs = frozenset({"b-2", "b-3"})
    snap = replace(
        snapshot(md.model_copy(update={"spec": spec}), nodes_of({"a": 4, "b": 4, "c": 4}), {}, {}),
        claims=dict.fromkeys(theirs, key),
        caches=NodeCaches(staged_elsewhere=theirs),
    )
    p = plan(snap)
    decode = next(r for r in p.roles if r.role == "decode").create[0]
    assert set(decode.nodes) == theirs  # (B's group starts warm where A staged)
    assert decode.path == "warm"
    # B's headroom: decode's next group goes to free nodes other than A's, warm as they are for B too
    shape = builders.group_shape(spec, "decode")
    free = {"b": Domain("b", 16, {"b-0": 4, "b-1": 4, "b-2": 4, "b-3": 4}, 4, 4)}
    warm = weights_cache.node_warmth(spec, dict.fromkeys(theirs, key), theirs)
    assert warm == dict.fromkeys(theirs, 0)  # (placement: warm, whoever staged them)
    staged = weights_cache.staging(
        spec,
        A,
        (dict.fromkeys(theirs, key), {}, []),
        lambda role: free if role == "decode" else {},
        headrooms(spec, {"decode": 1}),
        caches=(NodeCaches(staged_elsewhere=theirs), {}, NOW),
    )
    assert len(staged.nodes) == shape.nodes
    assert not staged.nodes & theirs
    assert set(staged.create) == set(staged.nodes)  # (fetched into B's own headroom, not A's twice)


class FakeKube:
    """Records the writes release_claim makes; `answer` is what the apply returns (or raises), `stored`
    what a read gives."""

    def __init__(self, answer: Any, stored: dict[str, Any] | None = None) -> None:
        self.answer, self.stored, self.calls = answer, stored, []
        self.pool = self  # (submits run at once)

    def submit(self, fn: Any, *args: Any) -> Any:
        from concurrent.futures import Future

        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done

    def apply(self, manifest: dict[str, Any], manager: str) -> dict[str, Any]:
        self.calls.append(("apply", manifest, manager))
        if isinstance(self.answer, Exception):
            raise self.answer
        return dict(self.answer)

    def get(self, *args: Any) -> dict[str, Any] | None:
        self.calls.append(("get", args, {}))
        return self.stored

    def delete(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("delete", args, kwargs))


def test_letting_go_of_a_shared_claim_keeps_it_for_the_others_and_deletes_it_when_none_is_left():
    from tokenfab.act import release_claim
    from tokenfab.adapters.kube_rest import ApiError

    manager = builders.field_manager(builders.model_cache_claim(B, spec(), "n1"))
    a_ref = {"kind": "ModelDeployment", "name": "r1-a", "uid": "uid-a"}
    # another owner left: one empty apply under B's manager, nothing deleted
    kept = FakeKube({"metadata": {"uid": "c1", "resourceVersion": "7", "ownerReferences": [a_ref]}})
    release_claim(kept, B, "model-cache-x", manager)  # type: ignore[arg-type]
    ((verb, manifest, used),) = kept.calls
    assert (verb, used) == ("apply", f"{contract.CACHE_FIELD_MANAGER_PREFIX}uid-b")
    assert manifest == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "model-cache-x", "namespace": "team"},
    }
    # no owner left (the others let go meanwhile, or are gone): deleted, if still the object written
    orphan = FakeKube({"metadata": {"uid": "c1", "resourceVersion": "8", "ownerReferences": []}})
    release_claim(orphan, B, "model-cache-x", manager)  # type: ignore[arg-type]
    precondition = {"preconditions": {"uid": "c1", "resourceVersion": "8"}}
    assert orphan.calls[1] == (
        "delete",
        ("v1", "PersistentVolumeClaim", "model-cache-x", "team"),
        precondition,
    )
    # ... unless another deployment's pods mount it (it becomes the owner)
    mounted = FakeKube({"metadata": {"uid": "c1", "resourceVersion": "8", "ownerReferences": []}})
    release_claim(mounted, B, "model-cache-x", manager, True)  # type: ignore[arg-type]
    assert [v for v, *_ in mounted.calls] == ["apply"]
    # the spec was B's alone (the API server refuses an apply that takes it off): read, then deleted
    # the same way when no other deployment owns it, kept when one does
    stored = {
        "metadata": {"uid": "c1", "resourceVersion": "9", "ownerReferences": [{**a_ref, "uid": "uid-b"}]}
    }
    last = FakeKube(ApiError(422, "Invalid", "spec.accessModes: Required value"), stored)
    release_claim(last, B, "model-cache-x", manager)  # type: ignore[arg-type]
    assert [v for v, *_ in last.calls] == ["apply", "get", "delete"]
    assert last.calls[2][2] == {"preconditions": {"uid": "c1", "resourceVersion": "9"}}
    shared = FakeKube(ApiError(422, "Invalid", "no"), {"metadata": {"uid": "c1", "ownerReferences": [a_ref]}})
    release_claim(shared, B, "model-cache-x", manager)  # type: ignore[arg-type]
    assert [v for v, *_ in shared.calls] == ["apply", "get"]
    # any other refusal is the pass's error (its Event), not a deletion
    refused = FakeKube(ApiError(403, "Forbidden", "no"))
    with pytest.raises(ApiError) as raised:
        release_claim(refused, B, "model-cache-x", manager)  # type: ignore[arg-type]
    assert raised.value.status == 403
    assert [v for v, *_ in refused.calls] == ["apply"]


def test_a_pass_deletes_lets_go_of_and_keeps_the_right_claims():
    from types import SimpleNamespace

    from tokenfab.observe import children_seen
    from tokenfab.planning import writes

    s = spec()
    other_size = spec(size="9Ti")
    view = ClusterView()
    keep = _claim(A, s, "n1", "")  # (A mounts it: wanted)
    alone = _claim(A, other_size, "n2", "")  # (A's alone, of a size A no longer asks for: deleted)
    both = _claim(A, other_size, "n3", "", B)  # (B still owns it: let go of)
    orphan = {
        **_claim(A, other_size, "n4", ""),
        "metadata": {
            **_claim(A, other_size, "n4", "")["metadata"],
            "ownerReferences": [],
            "resourceVersion": "42",
        },
    }
    busy = {
        **_claim(A, other_size, "n5", ""),
        "metadata": {**_claim(A, other_size, "n5", "")["metadata"], "ownerReferences": []},
    }
    for obj in (keep, alone, both, orphan, busy):
        view.on_child("PersistentVolumeClaim", "ADDED", obj)
    view.on_pod("ADDED", _pod("team", "a-0", "r1-a", keep["metadata"]["name"], "n1", "n1"))
    view.on_pod("ADDED", _pod("team", "b-0", "r1-b", busy["metadata"]["name"], None, "n5"))
    key = ("team", "r1-a")
    seen = children_seen(SimpleNamespace(view=view), key, view.pods(key))  # type: ignore[arg-type]
    deletes, releases = writes.stale(A, s, seen)
    name = {n: o["metadata"]["name"] for n, o in (("alone", alone), ("both", both), ("orphan", orphan))}
    assert sorted(d.name for d in deletes if d.kind == "PersistentVolumeClaim") == sorted(
        [name["alone"], name["orphan"]]
    )
    assert [r.name for r in releases] == [name["both"]]
    assert [r.mounted for r in releases] == [False]
    (gone,) = [d for d in deletes if d.name == name["orphan"]]
    assert gone.unchanged == "42"  # (one taken up meanwhile is kept)


def _pod(ns: str, name: str, deployment: str, claim: str, node: str | None, pinned: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {contract.LABEL_DEPLOYMENT: deployment},
            "annotations": {contract.ANN_NODE: pinned},
        },
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}}],
        },
        "status": {"phase": "Pending"},
    }


def test_a_claim_another_deployments_pods_mount_before_owning_it_is_neither_evicted_nor_deleted():
    s = spec()
    name = builders.model_cache_claim_name(A, s, "n1")
    view = ClusterView()
    view.on_node(
        "ADDED", {"metadata": {"name": "n1", "labels": {contract.LABEL_CACHE_CAPACITY: "6Ti"}}, "status": {}}
    )
    view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "n1", ""))
    # B's new pod is pinned to n1 and mounts A's claim; B is no owner yet (not bound yet either)
    view.on_pod("ADDED", _pod("team", "r1-b-decode-0-0", "r1-b", name, None, "n1"))
    got = node_caches(view, ("team", "r1-a"), ["n1"])
    assert CacheEntry(f"team/{name}", "n1", 0, None) in got.others  # (pinned for A's eviction)
    assert view.mounted_elsewhere(("team", "r1-a")) == {name}  # (so A's pass does not delete it)
    assert view.mounted_elsewhere(("team", "r1-b")) == frozenset()  # (B's own pods do not count)
    assert view.mounted_elsewhere(("other", "r1-a")) == frozenset()  # (another namespace's claim)
    # pinned, it outlives an idle claim of the same size even though it is idle for A
    entries = [
        CacheEntry(f"team/{name}", "n1", 4 * TI, NOW - 600),
        *got.others,
        CacheEntry("team/y", "n1", 4 * TI, NOW - 60),
    ]
    assert evictions(entries, {"n1": 6 * TI}) == frozenset({"team/y"})


def test_an_owners_own_applied_hash_wakes_no_one_but_is_seen():
    s = spec()
    view = ClusterView()
    shared = _claim(A, s, "n1", "", B)
    view.on_child("PersistentVolumeClaim", "ADDED", shared)
    rewritten = builders.with_applied_hash(shared)  # (A applied again: only its hash annotation differs)
    assert view.on_child("PersistentVolumeClaim", "MODIFIED", rewritten).keys == set()
    seen = view.child("PersistentVolumeClaim", "team", shared["metadata"]["name"])
    assert seen is not None
    assert dict(seen.applied)[builders.applied_annotation(shared)] == builders.applied_hash(
        shared
    )  # (so not applied again)


def test_a_claims_change_wakes_the_deployments_whose_pods_mount_it_before_they_own_it():
    s = spec()
    name = builders.model_cache_claim_name(A, s, "n1")
    view = ClusterView()
    view.on_child("PersistentVolumeClaim", "ADDED", _claim(A, s, "n1", ""))
    view.on_pod("ADDED", _pod("team", "r1-b-decode-0-0", "r1-b", name, None, "n1"))
    view.on_pod("ADDED", _pod("team", "r1-b-decode-0-1", "r1-b", name, None, "n1"))
    filled = _claim(A, s, "n1", builders.weights_key(s))  # (A's fetch finished: the claim holds the weights)
    assert view.on_child("PersistentVolumeClaim", "MODIFIED", filled).keys == {
        ("team", "r1-a"),
        ("team", "r1-b"),
    }
    # another namespace's claim of the same name wakes no one of this one
    assert view.on_child(
        "PersistentVolumeClaim", "ADDED", _claim(replace(A, namespace="x"), s, "n1", "")
    ).keys == {("x", "r1-a")}
    # B's pods gone one by one: B is woken until the last of them goes
    view.on_pod("DELETED", _pod("team", "r1-b-decode-0-0", "r1-b", name, None, "n1"))
    assert ("team", "r1-b") in view.on_child("PersistentVolumeClaim", "MODIFIED", _claim(A, s, "n1", "")).keys
    view.on_pod("DELETED", _pod("team", "r1-b-decode-0-1", "r1-b", name, None, "n1"))
    assert view.on_child("PersistentVolumeClaim", "MODIFIED", filled).keys == {("team", "r1-a")}
