"""A pvc:// source's claim (planning.model_source, read by observe.source_claim): the ModelSource
condition says, before any pod waits, that the claim is missing or that a second node cannot attach it."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from tests.planning.test_one_pass import deployment, nodes_of, snapshot
from tokenfab import observe
from tokenfab.adapters.kube import ApiError
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeployment
from tokenfab.planning import model_source
from tokenfab.planning.model_source import SourceClaim
from tokenfab.planning.one_pass import Written, plan, requeue_after, settle
from tokenfab.planning.status import event_for
from tokenfab.runtime import Memory


def pvc_deployment(source: str = "pvc://weights/deepseek-r1") -> ModelDeployment:
    doc: dict[str, Any] = copy.deepcopy(deployment().model_dump(by_alias=True, exclude_none=True))
    doc["spec"]["model"]["source"] = source
    doc.pop("status", None)
    return parse_model_deployment(doc)


def test_the_claim_of_a_pvc_source_and_none_for_the_others() -> None:
    assert model_source.claim_name(pvc_deployment().spec) == "weights"
    assert model_source.claim_name(pvc_deployment("pvc://w.x/a/b").spec) == "w.x"
    assert model_source.claim_name(deployment().spec) is None  # (hf://)


ROX, RWX, RWO, RWOP = ("ReadOnlyMany",), ("ReadWriteMany",), ("ReadWriteOnce",), ("ReadWriteOncePod",)


@pytest.mark.parametrize(
    ("claim", "status", "reason", "words"),
    [
        pytest.param(SourceClaim("w", True, ROX), "True", "ClaimShared", "ReadOnlyMany", id="ROX"),
        pytest.param(SourceClaim("w", True, RWX), "True", "ClaimShared", "ReadWriteMany", id="RWX"),
        pytest.param(SourceClaim("w", True, RWO), "False", "ClaimNotShared", "Multi-Attach", id="RWO"),
        pytest.param(SourceClaim("w", True, RWOP), "False", "ClaimNotShared", "ReadOnlyMany", id="RWOP"),
        pytest.param(SourceClaim("w", False), "False", "ClaimNotFound", "does not exist", id="missing"),
        pytest.param(
            SourceClaim("w", False, error="forbidden: cannot get"),
            "Unknown",
            "ClaimUnreadable",
            "forbidden",
            id="unreadable",
        ),
    ],
)
def test_the_condition_names_the_claim_and_the_fix(
    claim: SourceClaim, status: str, reason: str, words: str
) -> None:
    cond = model_source.condition("ns", claim)
    assert cond is not None
    assert (cond.type, cond.status, cond.reason) == ("ModelSource", status, reason)
    assert "ns/w" in cond.message
    assert "spec.model.source" in cond.message
    assert words in cond.message
    assert model_source.condition("ns", None) is None


def _settled(md: ModelDeployment, source: SourceClaim | None) -> Any:
    snap = dataclasses.replace(snapshot(md, nodes_of({"a": 4}), {}, {}), source=source)
    status, _ = settle(snap, plan(snap), Written())
    return status


def test_status_keeps_the_condition_while_the_source_is_a_claim_and_drops_it_after() -> None:
    md = pvc_deployment()
    status = _settled(md, SourceClaim("weights", True, ("ReadWriteOnce",)))
    (cond,) = [cd for cd in status.conditions if cd.type == "ModelSource"]
    assert cond.reason == "ClaimNotShared"
    # a pass whose source is no claim (source None: hf://, s3://) drops the condition it had
    after = deployment().model_copy(update={"status": status})
    assert not [cd for cd in _settled(after, None).conditions if cd.type == "ModelSource"]


def test_its_events_a_warning_when_it_goes_wrong_a_normal_one_when_put_right() -> None:
    bad = model_source.condition("ns", SourceClaim("w", True, ("ReadWriteOnce",)))
    good = model_source.condition("ns", SourceClaim("w", True, ("ReadOnlyMany",)))
    assert bad is not None
    assert good is not None
    assert event_for(bad, None) == "Warning"
    assert event_for(good, bad) == "Normal"
    assert event_for(good, None) is None  # (fine from the start: nothing to say)


class FakeKube:
    def __init__(self, answers: list[dict[str, Any] | Exception | None]) -> None:
        self.answers, self.reads = answers, 0

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        assert (api_version, kind, name, namespace) == ("v1", "PersistentVolumeClaim", "weights", "ns")
        said = self.answers[self.reads]
        self.reads += 1
        if isinstance(said, Exception):
            raise said
        return said


class FakeCtx:
    def __init__(self, kube: FakeKube) -> None:
        self.kube, self.memory = kube, Memory()

    def mem(self, _key: Any) -> Memory:
        return self.memory


def test_the_claim_is_read_once_a_minute_and_its_refusal_is_said() -> None:
    rwo = {"spec": {"accessModes": ["ReadWriteOnce"]}}
    rox = {"spec": {"accessModes": ["ReadOnlyMany"]}}
    kube = FakeKube([rwo, rox, None, ApiError(403, "Forbidden", "cannot get persistentvolumeclaims")])
    ctx: Any = FakeCtx(kube)
    spec, key = pvc_deployment().spec, ("ns", "deepseek-r1")
    assert observe.source_claim(ctx, key, spec, 100.0) == SourceClaim("weights", True, ("ReadWriteOnce",))
    assert observe.source_claim(ctx, key, spec, 159.0) == SourceClaim("weights", True, ("ReadWriteOnce",))
    assert kube.reads == 1
    assert observe.source_claim(ctx, key, spec, 160.0) == SourceClaim("weights", True, ("ReadOnlyMany",))
    assert observe.source_claim(ctx, key, spec, 220.0) == SourceClaim("weights", False)
    refused = observe.source_claim(ctx, key, spec, 280.0)
    assert refused is not None
    assert "cannot get persistentvolumeclaims" in refused.error
    assert observe.source_claim(ctx, key, deployment().spec, 281.0) is None  # (hf://: nothing read)
    assert kube.reads == 4


def test_a_pass_looks_again_within_a_minute_while_the_source_is_not_right() -> None:
    md = pvc_deployment()
    snap = snapshot(md, nodes_of({"a": 4}), {}, {})
    bad = SourceClaim("weights", False)
    good = SourceClaim("weights", True, ("ReadOnlyMany",))
    p = plan(dataclasses.replace(snap, source=bad))
    assert requeue_after(dataclasses.replace(snap, source=bad), p.roles) is not None
    assert requeue_after(dataclasses.replace(snap, source=bad), []) == pytest.approx(60.1)
    assert requeue_after(dataclasses.replace(snap, source=good), []) is None
