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
    domains = writes.Domains(seen, watched, channel_reader(ctx, OWNER.namespace))  # type: ignore[arg-type]
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
