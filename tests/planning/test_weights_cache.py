"""Per-node model caches and warm-first placement (tokenfab.planning.weights_cache): a new group goes to
the nodes whose cache already holds the deployment's weights, then to those with a cache begun, then to
cold ones, only among the domains it fits whole in; a claim is marked with the weights once a worker of
the current revision served from it. Each new group notes its start path (warm, fetching, cold); the
autoscaler learns each path's start time and forecasts as far ahead as the next group's path takes."""

from __future__ import annotations

from dataclasses import replace

from tests.planning.test_one_pass import deployment, materialize, nodes_of, snapshot, used_by
from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.fleet.facts import child_facts
from tokenfab.planning import builders, contract, weights_cache
from tokenfab.planning.one_pass import plan
from tokenfab.planning.role_plan import Create
from tokenfab.planning.topology import Domain, GroupShape, best_fit_nodes, choose_domain


def _domain(name: str, free: dict[str, int]) -> Domain:
    return Domain(name, 4 * len(free), free, len(free), len(free))


def test_the_warmest_nodes_that_fit_come_first_then_the_fullest():
    free = {"a-0": 4, "a-1": 2, "a-2": 4, "a-3": 4}
    assert best_fit_nodes(free, 2, 2) == ["a-1", "a-0"]  # (best fit: the fullest first)
    assert best_fit_nodes(free, 2, 2, {"a-3": 0, "a-2": 1}) == ["a-3", "a-2"]
    assert best_fit_nodes(free, 2, 4, {"a-1": 0}) == ["a-0", "a-2"]  # (a warm node without room is no use)


def test_a_warm_domain_wins_over_best_fit_only_where_the_group_fits_whole():
    shape = GroupShape(8, 4)  # two nodes of 4 GPUs
    domains = {"a": _domain("a", {"a-0": 4, "a-1": 4}), "b": _domain("b", {f"b-{i}": 4 for i in range(4)})}
    assert choose_domain(domains, shape, "pack") == "a"  # (best fit)
    assert choose_domain(domains, shape, "pack", warmth={"b-1": 0, "b-2": 0}) == "b"
    # One warm node is not a warm group: its coldest node decides; fetching beats cold.
    assert choose_domain(domains, shape, "pack", warmth={"b-1": 0}) == "a"
    assert choose_domain(domains, shape, "pack", warmth={"b-1": 0, "b-2": 1}) == "b"
    # A warm domain the group does not fit in whole is never chosen (nor split across).
    tight = {"a": _domain("a", {"a-0": 4, "a-1": 4}), "b": _domain("b", {"b-0": 4, "b-1": 0})}
    assert choose_domain(tight, shape, "pack", warmth={"b-0": 0, "b-1": 0}) == "a"
    assert choose_domain(domains, shape, "spread", {"b": 3}, warmth={"b-0": 0, "b-3": 0}) == "b"


def test_warmth_and_marks_follow_the_weights_served():
    key = "hf://deepseek-ai/DeepSeek-R1@abc"
    claims = {"n1": key, "n2": "", "n3": "hf://deepseek-ai/DeepSeek-R1@old"}
    assert weights_cache.warmth(claims, key) == {"n1": 0, "n2": 1, "n3": 1}
    assert weights_cache.marks(claims, ["n3"], key) == {"n1": key, "n2": "", "n3": key}


def test_a_scale_up_goes_to_the_nodes_whose_cache_holds_the_weights_and_serving_marks_them():
    md = deployment(decode=1)
    key = weights_cache.weights_key(md.spec)
    assert md.spec.model.cache.storage_class_name  # (the example keeps weights on per-node claims)
    nodes = nodes_of({"a": 4, "b": 4})
    cold = plan(snapshot(md, nodes, {}, {}))
    decode = next(r for r in cold.roles if r.role == "decode").create[0]
    assert decode.nodes[0].startswith("a")  # (nothing cached: best fit, the first domain)
    warm_snap = replace(snapshot(md, nodes, {}, {}), claims={"b-2": key, "b-3": key, "a-1": ""})
    warm = plan(warm_snap)
    decode = next(r for r in warm.roles if r.role == "decode").create[0]
    assert sorted(decode.nodes) == ["b-2", "b-3"]
    # A claim whose node served the weights is marked with them; one that did not keeps its mark.
    groups = materialize(warm_snap, warm)
    served = {n for r in warm.roles for cr in r.create for n in cr.nodes}
    after = snapshot(md, nodes, used_by(groups, md), groups)
    idle = sorted({n.name for n in nodes} - served)[0]
    again = plan(replace(after, claims={"b-2": "", idle: "x@y"}, pod_nodes=frozenset(served)))
    marked = {
        m["metadata"]["annotations"][contract.ANN_NODE]: child_facts("PersistentVolumeClaim", m).holds
        for m in again.writes.rest
        if m["kind"] == "PersistentVolumeClaim"
    }
    assert {n: marked[n] for n in served} == dict.fromkeys(served, (key,))
    # (a node with no pod now: its claim is not rendered, and so not rewritten)
    assert idle not in marked


def test_without_per_node_claims_placement_is_unchanged():
    md = deployment(decode=1)
    no_claims = md.model_copy(deep=True)
    no_claims.spec.model.cache.storage_class_name = None
    snap = replace(snapshot(no_claims, nodes_of({"a": 4, "b": 4}), {}, {}), claims={"b-2": "x", "b-3": "x"})
    decode = next(r for r in plan(snap).roles if r.role == "decode").create[0]
    assert decode.nodes[0].startswith("a")


def test_the_claims_mark_is_read_from_its_annotation():
    # (a claim made before claims were shared: one mark, and the deployment's label)
    annotations = {contract.ANN_NODE: "n1", contract.ANN_WEIGHTS: "hf://x@y"}
    labels = {contract.LABEL_DEPLOYMENT: "m"}
    obj = {"metadata": {"name": "m-model-1", "namespace": "ns", "labels": labels, "annotations": annotations}}
    facts = child_facts("PersistentVolumeClaim", obj)
    assert (facts.node, facts.holds, facts.deployment) == ("n1", ("hf://x@y",), "m")
    own = builders.Owner(name="m", namespace="ns", uid="u")
    spec = deployment().spec
    key = weights_cache.weights_key(spec)
    claim = child_facts("PersistentVolumeClaim", builders.model_cache_claim(own, spec, "n1", key))
    assert (claim.holds, claim.owners, claim.deployment) == ((key,), ("m",), None)
    # only the spec's own weights are marked by its deployment (another revision's mark is not its to make)
    assert (
        child_facts("PersistentVolumeClaim", builders.model_cache_claim(own, spec, "n1", "hf://x@y")).holds
        == ()
    )


# ------------------------------------------------------------------------ lead time per start path


def test_each_new_group_carries_its_start_path_onto_its_pods_and_back():
    from tokenfab.fleet.facts import pod_facts
    from tokenfab.views import group_views

    md = deployment(decode=1)
    key = weights_cache.weights_key(md.spec)
    snap = replace(
        snapshot(md, nodes_of({"a": 4, "b": 4}), {}, {}), claims={"b-2": key, "b-3": key, "a-0": ""}
    )
    p = plan(snap)
    paths = {cr.role: cr.path for r in p.roles for cr in r.create}
    assert paths["decode"] == "warm"  # (b-2 and b-3)
    assert paths["prefill"] in ("fetching", "cold")
    decode = next(cr for r in p.roles for cr in r.create if cr.role == "decode")
    pods = builders.group_pods(
        snap.owner,
        md.spec,
        builders.GroupAt(
            "decode", decode.slot, decode.domain, decode.revision, decode.nodes, start_path=decode.path
        ),
    )
    assert {pod["metadata"]["annotations"][contract.ANN_START_PATH] for pod in pods} == {"warm"}
    for pod in pods:
        pod["metadata"].update(namespace="ns", creationTimestamp="2026-11-26T10:00:00Z")
    (view,) = group_views([pod_facts(pod) for pod in pods], set())["decode"]
    assert view.start_path == "warm"
    # Without per-node caches placement knows no warmth, and each pod's download is a cold start: its
    # pods say so, as they do when other deployments' staged nodes gave placement a warmth map.
    cold = md.model_copy(deep=True)
    cold.spec.model.cache.storage_class_name = None
    creates = [cr for r in plan(snapshot(cold, nodes_of({"a": 4}), {}, {})).roles for cr in r.create]
    assert {cr.path for cr in creates} == {""}
    assert _paths(snap.owner, cold.spec, creates[0]) == {"cold"}
    # Weights mounted from a claim are not fetched: no start path at all.
    mounted = cold.model_copy(deep=True)
    mounted.spec.model.source = "pvc://weights/llama"
    assert _paths(snap.owner, mounted.spec, replace(creates[0], path="cold")) == set()


def _paths(owner: builders.Owner, spec: ModelDeploymentSpec, cr: Create) -> set[str]:
    """The start paths the pods of a planned group carry."""
    pods = builders.group_pods(
        owner, spec, builders.GroupAt(cr.role, cr.slot, cr.domain, cr.revision, cr.nodes, start_path=cr.path)
    )
    return {a for pod in pods if (a := pod["metadata"]["annotations"].get(contract.ANN_START_PATH))}


def test_the_start_time_is_learned_per_path_and_the_horizon_is_the_next_groups_path():
    from tests.planning.test_groups import group
    from tokenfab.planning.autoscaler import _lead_time, _Step
    from tokenfab.planning.autoscaler.memory import learned_startup_by_path
    from tokenfab.planning.topology import next_path

    def started(slot: int, path: str, seconds: float):
        g = group(slot, "a-0", "a-1")
        pods = tuple(replace(pod, ready_since=1000.0 + seconds) for pod in g.pods)
        return replace(g, pods=pods, created_at=1000.0, start_path=path)

    groups = {"decode": [started(0, "warm", 40), started(1, "cold", 900), started(2, "", 90)]}
    learned = learned_startup_by_path(groups, {}, None)
    # (a group placed knowing no path teaches none; a 15-minute cold start is one, not a wait for room)
    assert learned == {"warm": 40.0, "cold": 900.0}
    assert learned_startup_by_path({"decode": [started(0, "cold", 9000)]}, {}, None) == {}
    assert learned_startup_by_path(groups, {"warm": 60.0}, None)["warm"] == 50.0  # (smoothed)
    # The next group's path: the warmest where it fits whole.
    shape = GroupShape(8, 4)
    domains = {"a": _domain("a", {"a-0": 4, "a-1": 4}), "b": _domain("b", {"b-0": 4, "b-1": 0})}
    assert next_path(domains, shape, {"b-0": 0, "b-1": 0}) == "cold"  # (b is warm, but full)
    assert next_path(domains, shape, {"a-0": 0, "a-1": 1}) == "fetching"
    md = deployment()
    step = _Step(md, None, None, None, 0.0, 100.0, {"warm": 40.0, "cold": 900.0})  # type: ignore[arg-type]
    nodes = nodes_of({"a": 4})
    warm_a = {"a-0": 0, "a-1": 0, "a-2": 0, "a-3": 0}
    from tokenfab.planning.room import FreeDomains, Room

    capacity = FreeDomains(
        Room.fixed(nodes, {}, builders.placement_constraints(md.spec)),
        md.spec,
        builders.Owner(name="m", namespace="ns", uid="u"),
    )
    assert _lead_time(step, "decode", capacity) == 100.0  # (no warmth known: every path's)
    step.warmth = warm_a
    assert _lead_time(step, "decode", capacity) == 40.0
    step.warmth = {"a-0": 1}
    assert _lead_time(step, "decode", capacity) == 900.0  # (one node fetching, the other cold: cold)


def test_kubectl_get_nvlinkdomains_shows_which_weights_each_domains_caches_hold():
    from tokenfab.api.crd import nvlink_domain_crd
    from tokenfab.fleet.view import ClusterView
    from tokenfab.inventory import cached_models, domain_status

    view = ClusterView()
    for name, clique in (("a-0", "a"), ("a-1", "a"), ("b-0", "b")):
        view.on_node(
            "ADDED",
            {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.clique": clique}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
        )

    def claim(ns: str, dep: str, node: str, weights: str) -> dict:
        ann = {contract.ANN_NODE: node, **({contract.ANN_WEIGHTS: weights} if weights else {})}
        meta = {
            "name": f"{dep}-model-{node}",
            "namespace": ns,
            "labels": {contract.LABEL_DEPLOYMENT: dep},
            "annotations": ann,
        }
        return {"metadata": meta}

    r1 = "hf://deepseek-ai/DeepSeek-R1@abc"
    for obj in (
        claim("x", "r1", "a-0", r1),
        claim("y", "r1b", "a-1", r1),
        claim("x", "r1", "b-0", ""),
        claim("x", "llama", "a-1", "hf://meta/llama@def"),
    ):
        view.on_child("PersistentVolumeClaim", "ADDED", obj)
    got = cached_models(view, "nvidia.com/gpu.clique")
    assert set(got) == {"a"}  # (b-0's claim holds nothing verified yet)
    by = {m.weights: m for m in got["a"]}
    assert (by[r1].nodes, by[r1].deployments) == (2, ["x/r1", "y/r1b"])
    assert by["hf://meta/llama@def"].nodes == 1
    status = domain_status(_domain("a", {"a-0": 4, "a-1": 4}), [], 0.0, "clique", {}, got["a"])
    assert status.cached == 2
    cols = nvlink_domain_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {"name": "Cached", "type": "integer", "jsonPath": ".status.cached"} in cols
