"""A new multi-node group's IMEX channel: its ComputeDomain is written once, and its pods only once NVIDIA's
DRA driver has made the domain's claim template (planning.writes.new_groups, with the observe phase's reader
of the template and a fake API)."""

from __future__ import annotations

import copy
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from testing.cases import load_example
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.fleet.view import ClusterView
from tokenfab.observe import channel_reader
from tokenfab.planning import builders, writes
from tokenfab.planning.role_plan import Create, RolePlan

OWNER = builders.Owner(name="r1", namespace="ns", uid="uid-1")


class Api:
    """Counts what a pass asks of the API server; `templates` are the claim templates that exist."""

    def __init__(self, templates: set[str]) -> None:
        self.templates, self.calls = templates, []
        self.pool = self

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done

    def apply(self, manifest: dict[str, Any], manager: str = "") -> dict[str, Any]:
        self.calls.append(("apply", manifest["kind"], manifest["metadata"]["name"]))
        return manifest

    def get(self, api: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return {"metadata": {"name": name}} if name in self.templates else None


def _spec() -> ModelDeploymentSpec:
    doc: dict[str, Any] = copy.deepcopy(load_example("deepseek-r1-disaggregated.yaml"))
    doc["metadata"].update(name="r1", namespace="ns", uid="uid-1", generation=1)
    doc["spec"]["decode"]["parallelism"] = {"tensor": 8, "expert": 8, "attentionDataParallel": True}
    doc["spec"]["topology"]["computeDomain"] = True
    return parse_model_deployment(doc).spec


def _pass(view: ClusterView, api: Api, spec: ModelDeploymentSpec) -> tuple[list[str], list[str]]:
    """One pass's creates for a new two-node decode group: (the groups whose pods are written, the groups
    that wait for their channel)."""
    shape = builders.group_shape(spec, "decode")
    assert shape.nodes == 2, "a multi-node group"
    plan = RolePlan(role="decode", desired=1, revision="rev1", shape=shape)
    plan.create.append(Create("decode", 0, "rack-a", "rev1", "Missing", nodes=("a-0", "a-1")))
    ctx = SimpleNamespace(view=view, kube=api)
    seen = frozenset(ch.name for ch in view.children("ComputeDomain", (OWNER.namespace, OWNER.name)))
    watched = view.synced.get("ComputeDomain", False)
    reader = channel_reader(ctx, OWNER, seen, watched, {})  # type: ignore[arg-type]
    domains = writes.Domains(seen, watched, reader)
    cds, groups, waits = writes.new_groups(OWNER, spec, [plan], "podgroup", domains)
    for m in (*cds, *(m for g in groups for m in g.objects)):  # (as the act phase writes them)
        api.apply(m)
    return [g.name for g in groups], [w.group for w in waits]


def test_a_compute_domain_is_written_once_and_its_template_looked_for_once_it_is_seen():
    spec = _spec()
    group = builders.group_name(OWNER, "decode", 0)
    domain = builders.compute_domain(OWNER, spec, "decode", 0)
    assert domain is not None
    name = domain["metadata"]["name"]
    view = ClusterView()
    view.replace("ComputeDomain", [])  # (the kind is watched: served when the operator started)
    # first pass: the domain is written; its template cannot exist yet, so it is not looked for
    api = Api(templates=set())
    assert _pass(view, api, spec) == ([], [group])
    assert api.calls == [("apply", "ComputeDomain", name)]
    # once seen (its watch event), it is not written again; its template is looked for
    view.on_child("ComputeDomain", "ADDED", domain)
    api = Api(templates=set())
    assert _pass(view, api, spec) == ([], [group])
    assert api.calls == [("get", "ResourceClaimTemplate", builders.compute_domain_name(group))]
    # the driver made it: the group's pods are written, the domain still not again
    api = Api(templates={builders.compute_domain_name(group)})
    assert _pass(view, api, spec) == ([group], [])
    assert ("apply", "ComputeDomain", name) not in api.calls
    assert sum(1 for verb, kind, _ in api.calls if verb == "apply" and kind == "Pod") == 2
    # a domain deleted meanwhile (its watch event) is written again
    view.on_child("ComputeDomain", "DELETED", domain)
    api = Api(templates={builders.compute_domain_name(group)})
    assert _pass(view, api, spec) == ([], [group])
    assert api.calls == [("apply", "ComputeDomain", name)]


def test_where_compute_domains_are_not_watched_the_domain_is_written_and_its_template_looked_for():
    """(The kind came after the operator started: no watch tells that the domain exists.)"""
    spec = _spec()
    group = builders.group_name(OWNER, "decode", 0)
    name = builders.compute_domain_name(group)
    api = Api(templates=set())
    assert _pass(ClusterView(), api, spec) == ([], [group])
    assert api.calls == [("get", "ResourceClaimTemplate", name), ("apply", "ComputeDomain", name)]
    api = Api(templates={name})
    assert _pass(ClusterView(), api, spec) == ([group], [])
    assert api.calls[:2] == [("get", "ResourceClaimTemplate", name), ("apply", "ComputeDomain", name)]


# ------------------------------------------------------------------------------------------ what goes


def test_the_plan_names_the_stale_children_and_the_discovery_identity_once_nothing_needs_it():
    """What execute used to decide while writing is in the plan: engine ConfigMaps of revisions no pod
    uses, the budget of a role that left the spec, and (discovery off, every pod current) the identity."""
    from dataclasses import replace

    from tests.planning.test_one_pass import NOW, deployment, nodes_of, snapshot
    from tokenfab.planning.one_pass import plan

    md = deployment()
    snap = snapshot(md, nodes_of({"r0": 6}), {}, {})
    current = {(r, builders.role_revision(md.spec, r)) for r, _ in md.spec.roles()}
    kids = (
        writes.Child("ConfigMap", "old-engine", "decode", "rev0"),  # (no pod of rev0 is left)
        writes.Child("ConfigMap", "kept-engine", "decode", "rev9"),  # (a pod still runs rev9)
        writes.Child("PodDisruptionBudget", "m-worker", "worker"),  # (worker left the spec)
        writes.Child("PodDisruptionBudget", "m-decode", "decode"),
        writes.Child("ServiceAccount", "m-dynamo"),
    )
    seen = writes.Seen(children=kids, revisions=frozenset(current | {("decode", "rev9")}))
    p = plan(replace(snap, children=seen, now=NOW))
    assert p.writes.names("ConfigMap") == ("old-engine",)
    assert p.writes.names("PodDisruptionBudget") == ("m-worker",)
    # the identity stays while a pod of an older revision may need it; with every pod current it goes
    uses = builders.uses_kubernetes_discovery(md.spec)
    assert p.writes.names("ServiceAccount") == ()
    if not uses:
        now_current = plan(replace(snap, children=replace(seen, revisions=frozenset(current))))
        assert now_current.writes.names("ServiceAccount") == ("m-dynamo",)


def test_the_discovery_identity_goes_only_when_kubernetes_discovery_is_off():
    spec = _spec()
    kids = (writes.Child("ServiceAccount", "r1-dynamo"), writes.Child("Role", "r1-dynamo"))
    current = frozenset((r, builders.role_revision(spec, r)) for r, _ in spec.roles())
    deletes, _ = writes.stale(OWNER, spec, writes.Seen(children=kids, revisions=current))
    if builders.uses_kubernetes_discovery(spec):
        assert deletes == []
    off = spec.model_copy(update={"serving": spec.serving.model_copy(update={"discovery": "etcd"})})
    # (the pods of the revisions before the switch still need it; once every pod is of the new ones, not)
    deletes, _ = writes.stale(OWNER, off, writes.Seen(children=kids, revisions=current))
    assert deletes == []
    renewed = frozenset((r, builders.role_revision(off, r)) for r, _ in off.roles())
    deletes, _ = writes.stale(OWNER, off, writes.Seen(children=kids, revisions=renewed))
    assert sorted((d.kind, d.name) for d in deletes) == [
        ("Role", "r1-dynamo"),
        ("ServiceAccount", "r1-dynamo"),
    ]


def test_the_mounted_claims_are_read_only_when_a_claim_is_to_go():
    spec = _spec()
    asked: list[int] = []

    def mounted() -> frozenset[str]:
        asked.append(1)
        return frozenset()

    writes.stale(OWNER, spec, writes.Seen(mounted=mounted))
    assert asked == [], "no claim to judge: the walk over the pods is not taken"


def test_legacy_kopf_bookkeeping_is_a_patch_named_by_the_plan():
    meta = {
        "resourceVersion": "7",
        "finalizers": [writes.LEGACY_FINALIZER, "other/keep"],
        "annotations": {writes.LEGACY_ANNOTATIONS[0]: "{}", "mine": "x"},
    }
    patch = writes.legacy_patch(meta)
    assert patch == {
        "metadata": {
            "resourceVersion": "7",
            "finalizers": ["other/keep"],
            "annotations": {writes.LEGACY_ANNOTATIONS[0]: None},
        }
    }
    assert writes.legacy_patch({"resourceVersion": "7", "annotations": {"mine": "x"}}) is None


def test_the_leaders_to_route_and_the_gated_pods_to_release_come_from_the_snapshot():
    from tokenfab.planning.lifecycle import GroupView, PodView

    def pod(name: str, rank: int, **kw: Any) -> PodView:
        return PodView(name=name, rank=rank, phase="Running", ready=True, node="n", deleting=False, **kw)

    ready = GroupView(
        "g0",
        "decode",
        0,
        "rev1",
        "d",
        2,
        8,
        (pod("g0-0", 0, containers_ready=True), pod("g0-1", 1, containers_ready=True)),
        True,
    )
    routed = GroupView(
        "g1", "decode", 1, "rev1", "d", 1, 4, (pod("g1-0", 0, containers_ready=True, routable=True),), True
    )
    draining = GroupView(
        "g2",
        "decode",
        2,
        "rev1",
        "d",
        1,
        4,
        (pod("g2-0", 0, containers_ready=True, marked_draining=True),),
        True,
    )
    gated = GroupView(
        "g3", "decode", 3, "rev1", "d", 2, 8, (pod("g3-0", 0, gated=True), pod("g3-1", 1, gated=True)), True
    )
    groups = {"decode": [ready, routed, draining, gated]}
    rp = RolePlan(role="decode", desired=4, revision="rev1", shape=builders.group_shape(_spec(), "decode"))
    rp.states = {"g0": "serving", "g1": "serving", "g2": "serving", "g3": "starting"}
    rp.release.append("g3")
    assert writes.routable_leaders([rp], groups) == ("g0-0",)
    assert writes.gated_pods([rp], groups) == {"g3": ("g3-0", "g3-1")}


def test_the_templates_are_read_before_the_ledger_and_only_for_domains_no_pod_claims_yet():
    """The observe phase reads each seen ComputeDomain's template once, before the plan takes the placement
    ledger's lock; a domain whose pods already claim it is not read (its template exists)."""
    from tokenfab.planning.lifecycle import GroupView, PodView

    pod = PodView("r1-decode-0-0", 0, "Running", True, "n", False)
    busy = GroupView("r1-decode-0", "decode", 0, "rev1", "d", 1, 4, (pod,), True, unit=0)
    taken = builders.unit_domain_name(OWNER, 0)
    fresh = builders.unit_domain_name(OWNER, 1)
    api = Api(templates={fresh})
    ctx = SimpleNamespace(view=ClusterView(), kube=api)
    ready = channel_reader(ctx, OWNER, frozenset({taken, fresh}), True, {"decode": [busy]})  # type: ignore[arg-type]
    assert api.calls == [("get", "ResourceClaimTemplate", fresh)]  # (read once, up front)
    assert ready(taken) is True
    assert ready(fresh) is True
    assert ready(builders.unit_domain_name(OWNER, 2)) is False  # (not seen: never asked when watched)
    assert len(api.calls) == 1


# ------------------------------------------------------------------------------------------ identity


def test_new_groups_are_parked_until_the_view_shows_their_pods_serviceaccount_and_role():
    """A pod naming a ServiceAccount that does not exist is refused, and a RoleBinding is checked against
    the Role it names: the ServiceAccount and Role go first, and the new groups and the binding wait,
    parked (no pass waits for the API server's answer), until the view shows both."""
    spec = _spec()
    identity = tuple(builders.discovery_rbac(OWNER, spec))
    assert [m["kind"] for m in identity] == ["ServiceAccount", "Role", "RoleBinding"]
    names = {m["kind"]: m["metadata"]["name"] for m in identity}
    first, ready = writes.identity_writes(identity, frozenset())
    assert [m["kind"] for m in first] == ["ServiceAccount", "Role"]
    assert not ready
    only_sa = frozenset({("ServiceAccount", names["ServiceAccount"])})
    assert writes.identity_writes(identity, only_sa) == (first, False)
    both = only_sa | {("Role", names["Role"])}
    assert writes.identity_writes(identity, both) == (identity, True)
    assert writes.identity_writes(identity, None) == (identity, True)  # (not read: taken as in place)
    plan = RolePlan(role="prefill", desired=1, revision="rev1", shape=builders.group_shape(spec, "prefill"))
    plan.create.append(Create("prefill", 0, "rack-a", "rev1", "Missing"))
    cd = builders.compute_domain(OWNER, spec, "prefill", 0, None)
    seen = frozenset({cd["metadata"]["name"]}) if cd is not None else frozenset()
    domains = writes.Domains(seen, True, lambda name: True)  # (its channel is there)
    _, groups, waits = writes.new_groups(OWNER, spec, [plan], "gates", domains, identity_ready=False)
    assert groups == ()
    assert [(w.group, w.domain) for w in waits] == [(builders.group_name(OWNER, "prefill", 0), "")]
    _, groups, waits = writes.new_groups(OWNER, spec, [plan], "gates", domains, identity_ready=True)
    assert [g.name for g in groups] == [builders.group_name(OWNER, "prefill", 0)]
    assert waits == ()
