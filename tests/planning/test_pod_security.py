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
from tokenfab.runtime import Memory

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
    mem = Memory()
    return SimpleNamespace(kube=kube, mem=lambda key: mem)


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
