"""Pre-staging weights (model.cache.prestageGroups; tokenfab.planning.weights_cache.staging): the nodes each
role's next groups would take get a weights-fetch pod that downloads the weights into their model cache
claim; a completed fetch marks the claim, and the scale-up that follows lands on those nodes, warm."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.planning.test_one_pass import deployment, materialize, nodes_of, snapshot, used_by
from tokenfab.api.models import ModelDeployment, ModelDeploymentStatus, RoleBounds
from tokenfab.fleet.facts import child_facts
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import builders, contract, weights_cache
from tokenfab.planning.eviction import NodeCaches
from tokenfab.planning.one_pass import Plan, plan

NODES = nodes_of({"a": 4, "b": 4, "c": 4})


def staged(md: ModelDeployment, groups: int) -> ModelDeployment:
    spec = md.spec.model_copy(deep=True)
    spec.model.cache.prestage_groups = groups
    return md.model_copy(update={"spec": spec})


def fetch_pods(p: Plan) -> dict[str, dict[str, Any]]:
    """node -> the weights-fetch pod the plan makes there."""
    return {
        m["metadata"]["annotations"][contract.ANN_NODE]: m
        for m in p.writes.rest
        if m["kind"] == "Pod"
        and m["metadata"]["labels"][contract.COMPONENT] == contract.COMPONENT_WEIGHTS_FETCH
    }


def claim_marks(p: Plan) -> dict[str, str]:
    return {
        m["metadata"]["annotations"][contract.ANN_NODE]: "".join(
            child_facts("PersistentVolumeClaim", m).holds
        )
        for m in p.writes.rest
        if m["kind"] == "PersistentVolumeClaim"
    }


def test_the_next_groups_nodes_get_a_fetch_pod_and_a_claim_and_the_scale_up_lands_there():
    md = staged(deployment(decode=1), 1)
    first = plan(snapshot(md, NODES, {}, {}))
    placed = {n for r in first.roles for cr in r.create for n in cr.nodes}
    fetch = fetch_pods(first)
    # the next decode group (2 nodes) and the next prefill group (1 node), none of them the first groups'
    assert len(fetch) == 3
    assert not set(fetch) & placed
    claims = claim_marks(first)
    assert set(fetch) <= set(claims)  # each fetch pod's node has its model cache claim
    for node, pod in fetch.items():
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
        assert volume["persistentVolumeClaim"]["claimName"] == builders.model_cache_claim_name(
            first_owner(), md.spec, node
        )
        assert pod["metadata"]["annotations"][contract.ANN_WEIGHTS] == weights_cache.weights_key(md.spec)
    # The fetches complete: their claims are marked, and their pods go.
    groups = materialize(snapshot(md, NODES, {}, {}), first)
    after = snapshot(md, NODES, used_by(groups, md), groups)
    key = weights_cache.weights_key(md.spec)
    done = tuple(weights_cache.FetchPod(p["metadata"]["name"], n, "Succeeded", key) for n, p in fetch.items())
    second = plan(replace(after, pod_nodes=frozenset(placed), fetch_pods=done))
    assert {n: claim_marks(second)[n] for n in fetch} == dict.fromkeys(fetch, key)
    assert not fetch_pods(second)  # (nothing to fetch where a fetch just completed)
    assert not second.writes.names("Pod")  # (kept until the claims' marks are seen: no node is wanted again)
    seen = {**dict.fromkeys(placed, key), **dict.fromkeys(fetch, key)}
    third = plan(replace(after, pod_nodes=frozenset(placed), fetch_pods=done, claims=seen))
    assert sorted(third.writes.names("Pod")) == sorted(p.name for p in done)
    assert not fetch_pods(third)
    # status.weightsCache says where the weights are and what is staged
    assert first.weights_cache is not None
    assert first.weights_cache.prestaged == sorted(fetch)
    assert first.weights_cache.warm_nodes == []
    assert second.weights_cache is not None
    assert set(second.weights_cache.warm_nodes) == set(fetch) | placed  # (the first groups served too)
    # With the claims marked, a scale-up of decode takes the staged nodes: it starts warm.
    marked = {**dict.fromkeys(placed, key), **dict.fromkeys(fetch, key)}
    warm = plan(
        replace(after, md=staged(deployment(decode=2), 1), pod_nodes=frozenset(placed), claims=marked)
    )
    new = next(r for r in warm.roles if r.role == "decode").create
    assert len(new) == 1
    assert set(new[0].nodes) <= set(fetch)
    assert new[0].path == "warm"


def first_owner() -> builders.Owner:
    return builders.Owner(name="deepseek-r1", namespace="ns", uid="uid-1")


def test_stale_failed_or_unwanted_fetch_pods_go_and_running_ones_stay():
    md = staged(deployment(decode=1), 1)
    first = plan(snapshot(md, NODES, {}, {}))
    wanted = sorted(fetch_pods(first))
    key = weights_cache.weights_key(md.spec)

    def pod(
        node: str, phase: str = "Running", weights: str = key, name: str = "", **kw: Any
    ) -> weights_cache.FetchPod:
        return weights_cache.FetchPod(
            name or builders.weights_fetch_pod_name(first_owner(), md.spec, node), node, phase, weights, **kw
        )

    other_class = md.spec.model_copy(deep=True)
    other_class.model.cache.size = "2Ti"  # (a new size is a new claim: its pod has another name)
    pods = (
        pod(wanted[0]),
        pod(wanted[1], weights="hf://deepseek-ai/DeepSeek-R1@old"),
        pod(wanted[2], "Failed"),
        pod("c-3"),  # running where nothing is wanted any more
        pod("c-2", "Pending", waiting="CrashLoopBackOff: hub unreachable"),
        pod("c-1", "Succeeded", name=builders.weights_fetch_pod_name(first_owner(), other_class, "c-1")),
    )
    again = plan(replace(snapshot(md, NODES, {}, {}), fetch_pods=pods))
    names = {f.node: f.name for f in pods}
    assert sorted(again.writes.names("Pod")) == sorted(
        names[n] for n in (wanted[1], wanted[2], "c-3", "c-2", "c-1")
    )
    assert again.weights_cache is not None
    assert again.weights_cache.fetching == sorted(["c-2", "c-3", wanted[0]])  # (of the spec's weights)
    assert "CrashLoopBackOff: hub unreachable" in again.weights_cache.waiting
    assert "c-1" not in again.weights_cache.warm_nodes  # (a completed pod of another claim marks nothing)
    assert not fetch_pods(again)  # (each wanted node has a pod, to keep or to replace once it has gone)
    # A pod being deleted still holds its name: no new one on its node until it is gone.
    leaving = (pod(wanted[1], deleting=True),)
    assert sorted(fetch_pods(plan(replace(snapshot(md, NODES, {}, {}), fetch_pods=leaving)))) == [
        wanted[0],
        wanted[2],
    ]


def test_a_running_fetch_pod_stays_where_a_group_lands():
    md = staged(deployment(decode=1), 1)
    first = plan(snapshot(md, NODES, {}, {}))
    key = weights_cache.weights_key(md.spec)
    node = "c-3"  # out of the headroom (the staged nodes are the first free ones in best-fit order)
    assert node not in fetch_pods(first)
    running = weights_cache.FetchPod(
        builders.weights_fetch_pod_name(first_owner(), md.spec, node), node, "Running", key
    )
    # a group of the deployment is there: its download goes on
    kept = plan(replace(snapshot(md, NODES, {}, {}), fetch_pods=(running,), pod_nodes=frozenset({node})))
    assert kept.writes.names("Pod") == ()
    # nothing of the deployment there, and not in the headroom: it goes
    gone = plan(replace(snapshot(md, NODES, {}, {}), fetch_pods=(running,)))
    assert gone.writes.names("Pod") == (running.name,)


def test_no_prestaging_no_fetch_pods_and_no_rollout():
    md = deployment(decode=1)
    assert md.spec.model.cache.prestage_groups == 0
    p = plan(snapshot(md, NODES, {}, {}))
    assert not fetch_pods(p)
    assert not p.writes.names("Pod")
    # pre-staging changes where weights wait, not what a worker runs: the same revision
    for role in ("prefill", "decode"):
        assert builders.role_revision(staged(md, 3).spec, role) == builders.role_revision(md.spec, role)  # type: ignore[arg-type]


def test_the_fetch_pod_needs_no_gpu_and_no_api_access():
    md = staged(deployment(decode=1), 1)
    pod = builders.weights_fetch_pod(first_owner(), md.spec, "a-2", "hf://x/y@abc")
    spec = pod["spec"]
    ctr = spec["containers"][0]
    assert ctr["command"][-1] == "--fetch-only"
    assert not any("gpu" in k for k in ctr["resources"]["requests"])
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "OnFailure"
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a-2"]}]}]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env[contract.ENV_MODEL_SOURCE] == md.spec.model.source
    assert env[contract.ENV_MODEL_CACHE] == contract.MODEL_CACHE_DIR
    # the workers' security contexts (restricted; e2e/test_prestage.py runs it where restricted is enforced)
    assert spec["securityContext"] == builders.POD_SECURITY
    assert ctr["securityContext"] == builders.container_security()


def test_no_more_is_staged_than_the_autoscaler_may_still_add():
    from tokenfab.planning.autoscaler.groups import headroom

    spec = staged(deployment(decode=1), 3).spec.model_copy(deep=True)
    spec.autoscaling.enabled = False
    assert headroom(spec, "decode", {"decode": 1}) == 3  # (no autoscaler: scaled by hand)
    spec.autoscaling = spec.autoscaling.model_copy(
        update={"enabled": True, "decode": RoleBounds(min_replicas=1, max_replicas=2)}
    )
    assert headroom(spec, "decode", {"decode": 1}) == 1
    assert headroom(spec, "decode", {"decode": 2}) == 0
    # prefill follows decode 1:1 here: no more than decode's staged groups bring
    assert spec.serving.prefill_decode_ratio == "1:1"
    assert headroom(spec, "prefill", {"decode": 1, "prefill": 1}) == 1
    assert headroom(spec, "prefill", {"decode": 2, "prefill": 2}) == 0


def test_status_keeps_what_each_fetch_pod_reported_while_its_node_holds_the_weights():
    md = staged(deployment(decode=1), 1)
    key = weights_cache.weights_key(md.spec)
    said = 'exit code 0, Completed, {"source": "download", "bytes": 2500000000, "files": 3, "seconds": 41.5}'
    done = weights_cache.FetchPod("a-fetch", "n1", "Succeeded", key, result=said)
    running = weights_cache.FetchPod("b-fetch", "n2", "Running", key)
    staging = weights_cache.Staging(frozenset({"n1", "n2"}), {"n1": key, "n2": ""}, (), ())
    first = weights_cache.report(md.spec, staging, [done, running])
    assert first is not None
    assert [(r.node, r.source, r.bytes, r.files, r.seconds) for r in first.staged] == [
        ("n1", "download", 2500000000, 3, 41.5)
    ]
    assert first.summary == "1 warm, 1 fetching, 2.5 GB staged"
    # the completed pod is gone: what it said stays while n1 holds these weights
    later = weights_cache.report(md.spec, staging, [], ModelDeploymentStatus(weights_cache=first))
    assert later is not None
    assert later.staged == first.staged
    assert later.summary == "1 warm, 0 fetching, 2.5 GB staged"
    # n1 no longer holds them (another revision was marked), or the spec asks for other weights: gone
    moved = weights_cache.report(
        md.spec, replace(staging, marks={"n1": "hf://x@old"}), [], ModelDeploymentStatus(weights_cache=first)
    )
    assert moved is not None
    assert moved.staged == []
    assert moved.summary == "0 warm, 0 fetching"
    spec = md.spec.model_copy(deep=True)
    spec.model.revision = "0" * 40
    newer = {"n1": weights_cache.weights_key(spec)}  # (n1 holds the new weights, not what was reported)
    other = weights_cache.report(
        spec, replace(staging, marks=newer), [], ModelDeploymentStatus(weights_cache=first)
    )
    assert other is not None
    assert other.warm_nodes == ["n1"]
    assert other.staged == []


def test_a_deployment_leaves_the_nodes_another_one_pre_stages_while_others_fit():
    md = staged(deployment(decode=1), 1)
    first = plan(snapshot(md, NODES, {}, {}))
    assert first.weights_cache is not None
    theirs = frozenset(first.weights_cache.prestaged)
    placed = {n for r in first.roles for cr in r.create for n in cr.nodes}
    assert theirs
    assert not theirs & placed
    # a second deployment with a cache, on the same free nodes, told what the first pre-stages
    other = plan(replace(snapshot(md, NODES, {}, {}), caches=NodeCaches(staged_elsewhere=theirs)))
    other_placed = {n for r in other.roles for cr in r.create for n in cr.nodes}
    assert other_placed == placed  # (the same groups fit on the same clean nodes)
    assert other.weights_cache is not None
    assert not set(other.weights_cache.prestaged) & theirs  # its headroom goes elsewhere in the domain
    # without being told, it would have staged the very same nodes
    blind = plan(snapshot(md, NODES, {}, {}))
    assert blind.weights_cache is not None
    assert set(blind.weights_cache.prestaged) == theirs
    # a group lands on them when nothing else fits: its start path stays a plain cold one
    everything = frozenset(n.name for n in NODES)
    crowded = plan(replace(snapshot(md, NODES, {}, {}), caches=NodeCaches(staged_elsewhere=everything)))
    paths = {cr.path for r in crowded.roles for cr in r.create}
    assert paths == {"cold"}


def test_the_view_knows_what_each_deployment_pre_stages():
    view = ClusterView()

    def md(name: str, prestaged: list[str]) -> dict[str, Any]:
        status = {"weightsCache": {"weights": "hf://a/b@main", "prestaged": prestaged}}
        return {"metadata": {"namespace": "ns", "name": name}, "spec": {}, "status": status}

    view.on_model_deployment("ADDED", md("a", ["n1", "n2"]))
    view.on_model_deployment("ADDED", md("b", ["n3"]))
    assert view.staged_elsewhere(("ns", "a")) == {"n3"}
    assert view.staged_elsewhere(("ns", "b")) == {"n1", "n2"}
    assert view.staged_elsewhere(("ns", "c")) == {"n1", "n2", "n3"}
    view.on_model_deployment("MODIFIED", md("a", []))
    assert view.staged_elsewhere(("ns", "b")) == frozenset()
    view.on_model_deployment("DELETED", md("b", ["n3"]))
    assert view.staged_elsewhere(("ns", "a")) == frozenset()


def test_s3_weights_are_cached_and_pre_staged_like_hf_ones():
    md = staged(deployment(decode=1), 1)
    spec = md.spec.model_copy(deep=True)
    spec.model.source = "s3://weights/deepseek/r1"
    s3md = md.model_copy(update={"spec": spec})
    p = plan(snapshot(s3md, NODES, {}, {}))
    fetch = fetch_pods(p)
    assert len(fetch) == 3  # (the same headroom as for hf:// weights)
    for pod in fetch.values():
        envs = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert envs[contract.ENV_MODEL_SOURCE] == "s3://weights/deepseek/r1"
        assert pod["metadata"]["annotations"][contract.ANN_WEIGHTS] == "s3://weights/deepseek/r1@" + (
            spec.model.revision or "main"
        )
    # the workers mount their node's cache claim, and name the objects the launcher fetches and points at
    owner = first_owner()
    pod = builders.group_pods(
        owner,
        spec,
        builders.GroupAt("decode", 0, "a", builders.role_revision(spec, "decode"), ["a-0", "a-1"]),
    )[0]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
    assert volume["persistentVolumeClaim"]["claimName"] == builders.model_cache_claim_name(owner, spec, "a-0")
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--model-path") + 1] == "weights/deepseek/r1"


def test_a_deployment_without_a_cache_leaves_the_nodes_others_pre_stage_too():
    md = deployment(decode=1)
    spec = md.spec.model_copy(deep=True)
    spec.model.cache.storage_class_name = None
    plain = md.model_copy(update={"spec": spec})
    blind = plan(snapshot(plain, NODES, {}, {}))
    placed = {n for r in blind.roles for cr in r.create for n in cr.nodes}
    told = plan(
        replace(snapshot(plain, NODES, {}, {}), caches=NodeCaches(staged_elsewhere=frozenset(placed)))
    )
    assert not {n for r in told.roles for cr in r.create for n in cr.nodes} & placed
    assert told.weights_cache is None  # (it has no caches to report)


def test_the_next_unit_is_staged_whole_in_one_domain_where_its_scale_up_lands():
    """Prefill-decode units (1:1 here: a 2-node decode group and a 1-node prefill group): the headroom is
    the next unit, staged where the whole unit fits, as placement puts a new unit, not role by role. Racks
    a and c have 3 nodes, b 2: the first unit takes a; role by role the next decode group alone would fit
    best in b (pack) and its prefill group elsewhere, split; the whole unit fits only in c."""
    md = staged(deployment(decode=1), 1)
    nodes = nodes_of({"a": 3, "b": 2, "c": 3})
    first = plan(snapshot(md, nodes, {}, {}))
    placed = {n for r in first.roles for cr in r.create for n in cr.nodes}
    assert {n.rsplit("-", 1)[0] for n in placed} == {"a"}
    fetch = fetch_pods(first)
    assert sorted(fetch) == ["c-0", "c-1", "c-2"]
    # the scale-up (a second unit) lands on the staged nodes, warm
    key = weights_cache.weights_key(md.spec)
    groups = materialize(snapshot(md, nodes, {}, {}), first)
    after = snapshot(md, nodes, used_by(groups, md), groups)
    marked = {**dict.fromkeys(placed, key), **dict.fromkeys(fetch, key)}
    up = plan(replace(after, md=staged(deployment(decode=2), 1), pod_nodes=frozenset(placed), claims=marked))
    new = {n: cr.path for r in up.roles for cr in r.create for n in cr.nodes}
    assert set(new) == set(fetch)
    assert set(new.values()) == {"warm"}
