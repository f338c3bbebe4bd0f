"""The PodSecurity condition (tokenfab.planning.pod_security): a namespace's enforced Pod Security level
against the capabilities the workers add, and the observe phase's read of it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from testing.cases import spec_of
from tokenfab.adapters.kube import ApiError
from tokenfab.observe import POD_SECURITY_READ_SECONDS, pod_security_level
from tokenfab.planning import pod_security

RDMA = {"runtime": {"resources": {"limits": {"rdma/ib": "4"}}, "addCapabilities": ["IPC_LOCK"]}}


@pytest.mark.parametrize(
    ("level", "status"),
    [("restricted", "False"), ("baseline", "False"), ("privileged", "True"), ("", "True")],
)
def test_a_namespace_that_refuses_the_workers_capabilities_is_named_before_their_pods_are_refused(
    level, status
):
    spec = spec_of("llama-405b-multinode-tp.yaml", RDMA)
    cond = pod_security.condition(spec, "rdma", level)
    assert cond is not None
    assert cond.status == status
    if status == "False":
        assert cond.reason == "CapabilitiesForbidden"
        assert "IPC_LOCK" in cond.message
        assert f"{pod_security.ENFORCE_LABEL}=privileged" in cond.message
    else:
        assert cond.reason == "CapabilitiesAllowed"


def test_a_unit_that_spans_domains_adds_ipc_lock_and_a_namespace_refusing_it_is_named_with_both_fixes():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    assert pod_security.condition(spec, "ns", "baseline") is None  # (no unit spans: nothing added)
    cond = pod_security.condition(spec, "ns", "baseline", rdma=True)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", "CapabilitiesForbidden")
    assert "IPC_LOCK (RDMA for a prefill-decode unit that spans NVLink domains)" in cond.message
    assert "set spec.topology.kvNetwork to tcp" in cond.message
    assert "runtime.addCapabilities" not in cond.message
    allowed = pod_security.condition(spec, "ns", "privileged", rdma=True)
    assert allowed is not None
    assert (allowed.status, allowed.reason) == ("True", "CapabilitiesAllowed")
    assert "IPC_LOCK" in allowed.message


def test_no_condition_without_added_capabilities_or_a_level_read():
    assert pod_security.condition(spec_of("llama-405b-multinode-tp.yaml"), "ns", "restricted") is None
    assert pod_security.condition(spec_of("llama-405b-multinode-tp.yaml", RDMA), "ns", None) is None


def test_every_capability_a_spec_may_add_needs_a_privileged_namespace():
    from typing import get_args

    from tokenfab.api.models.runtime import Capability

    for cap in get_args(Capability):
        assert pod_security.forbidden("baseline", [cap]) == [cap]
        assert pod_security.forbidden("restricted", [cap]) == [cap]
        assert pod_security.forbidden("privileged", [cap]) == []


class Kube:
    def __init__(self, answer: Any) -> None:
        self.answer, self.gets = answer, 0

    def get(self, api: str, kind: str, name: str, namespace: str | None = None) -> Any:
        self.gets += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _ctx(kube: Kube) -> Any:
    return SimpleNamespace(kube=kube, levels={})


def test_the_level_is_read_only_while_capabilities_are_added_and_at_most_every_few_seconds():
    labelled = {"metadata": {"name": "rdma", "labels": {pod_security.ENFORCE_LABEL: "baseline"}}}
    kube = Kube(labelled)
    ctx = _ctx(kube)
    spec = spec_of("llama-405b-multinode-tp.yaml", RDMA)
    assert pod_security_level(ctx, ("rdma", "m"), spec_of("llama-405b-multinode-tp.yaml"), 0.0) is None
    assert kube.gets == 0
    assert pod_security_level(ctx, ("rdma", "m"), spec, 0.0) == "baseline"
    assert pod_security_level(ctx, ("rdma", "m"), spec, POD_SECURITY_READ_SECONDS - 1) == "baseline"
    assert kube.gets == 1
    kube.answer = {"metadata": {"name": "rdma"}}
    assert pod_security_level(ctx, ("rdma", "m"), spec, POD_SECURITY_READ_SECONDS + 1) == ""
    refused = _ctx(Kube(ApiError(403, "Forbidden", "namespaces is forbidden")))
    assert pod_security_level(refused, ("rdma", "m"), spec, 0.0) is None  # (no permission: no condition)


def test_the_level_is_read_for_units_that_span_over_rdma_once_per_namespace():
    """A disaggregated deployment whose units are larger than an NVLink domain adds IPC_LOCK to their pods
    (kvNetwork rdma, the default): its namespace's level is read; with kvNetwork tcp, or with units that
    fit in a domain, it is not. Deployments of one namespace share one read."""
    labelled = {"metadata": {"name": "ns", "labels": {pod_security.ENFORCE_LABEL: "restricted"}}}
    kube = Kube(labelled)
    ctx = _ctx(kube)
    disagg = spec_of("deepseek-r1-disaggregated.yaml", {"topology": {"gpusPerDomain": 36}})
    tcp = spec_of("deepseek-r1-disaggregated.yaml", {"topology": {"kvNetwork": "tcp", "gpusPerDomain": 36}})
    assert pod_security_level(ctx, ("ns", "a"), tcp, 0.0) is None
    assert pod_security_level(ctx, ("ns", "a"), spec_of("deepseek-r1-disaggregated.yaml"), 0.0) is None
    assert kube.gets == 0
    assert pod_security_level(ctx, ("ns", "a"), disagg, 0.0) == "restricted"
    assert pod_security_level(ctx, ("ns", "b"), disagg, 1.0) == "restricted"
    assert kube.gets == 1
    assert pod_security_level(ctx, ("other", "c"), disagg, 1.0) == "restricted"
    assert kube.gets == 2


def test_the_status_carries_the_condition_only_while_it_has_something_to_say():
    from dataclasses import replace

    from tests.planning.test_one_pass import deployment, nodes_of, snapshot
    from tokenfab.planning.one_pass import Written, plan, settle

    md = deployment()
    runtime = md.spec.runtime.model_copy(update={"add_capabilities": ["IPC_LOCK"]})
    md = md.model_copy(update={"spec": md.spec.model_copy(update={"runtime": runtime})})
    snap = replace(snapshot(md, nodes_of({"r0": 6}), {}, {}), pod_security="restricted")
    status, changed = settle(snap, plan(snap), Written())
    (cond,) = [cd for cd in status.conditions if cd.type == "PodSecurity"]
    assert (cond.status, cond.reason) == ("False", "CapabilitiesForbidden")
    assert cond in changed
    unread = replace(snap, pod_security=None)
    status, _ = settle(unread, plan(unread), Written())
    assert not [cd for cd in status.conditions if cd.type == "PodSecurity"]
