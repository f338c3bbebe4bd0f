"""Status is read leniently and spec strictly: an operator keeps working when a newer version wrote status
fields it does not know (they are dropped), while an unknown spec field is still refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from testing.cases import load_example
from tokenfab.api import models
from tokenfab.api.crd import model_deployment_crd, nvlink_domain_crd, openapi_schema
from tokenfab.api.errors import SpecError, parse_model_deployment


def status_with_unknown_fields() -> dict[str, Any]:
    return {
        "observedGeneration": 3,
        "futureSummary": {"anything": [1, 2]},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Serving", "severity": "Info"},
        ],
        "roles": {"decode": {"desiredGroups": 2, "readyGroups": 2, "drainingGroups": 1, "evictingGroups": 1}},
        "gpus": "64/64",
        "placement": [{"group": "g-0", "role": "decode", "domain": "rack-a", "gpus": 32, "zone": "z1"}],
        "autoscaling": {
            "desired": {"decode": 2},
            "lastDecision": {
                "time": "2025-01-01T00:00:00Z",
                "role": "decode",
                "fromGroups": 1,
                "toGroups": 2,
                "reason": "ScaleUp",
                "confidence": 0.9,
            },
            "forecast": [1, 2, 3],
        },
        "profile": {
            "profileHash": "abc",
            "roles": {
                "decode": {
                    "parallelism": {"tensor": 8, "expert": 8, "context": 2},
                    "replicas": 2,
                    "nodes": 2,
                }
            },
            "predicted": {
                "gpus": 16,
                "tokensPerSecondPerGpu": 1.0,
                "tokensPerSecondPerUser": 2.0,
                "ttftMs": 3.0,
                "itlMs": 4.0,
                "energyJoules": 5.0,
            },
            "plannerFlags": ["x"],
        },
    }


def test_a_status_written_by_a_newer_operator_is_read_and_its_unknown_fields_dropped():
    doc = load_example("deepseek-r1-disaggregated.yaml")
    doc["status"] = status_with_unknown_fields()
    md = parse_model_deployment(doc)
    status = md.status
    assert status is not None
    assert status.observed_generation == 3
    assert status.conditions[0].reason == "Serving"
    assert status.roles["decode"].ready_groups == 2
    assert status.roles["decode"].draining_groups == 1  # (a field this operator knows now)
    assert status.placement[0].domain == "rack-a"
    assert status.autoscaling is not None
    assert status.autoscaling.last_decision is not None
    assert status.autoscaling.last_decision.to_groups == 2
    assert status.profile is not None
    assert status.profile.roles["decode"].parallelism.tensor == 8
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    for unknown in ("futureSummary", "severity", "evictingGroups", "zone", "confidence", "forecast"):
        assert unknown not in repr(dumped), unknown
    for unknown in ("context", "nodes", "energyJoules", "plannerFlags"):
        assert unknown not in repr(dumped), unknown


def test_a_status_read_alone_is_lenient_too():
    status = models.ModelDeploymentStatus.model_validate(status_with_unknown_fields())
    assert status.gpus == "64/64"


def test_an_nvlink_domain_status_with_unknown_fields_is_read():
    status = models.NVLinkDomainStatus.model_validate(
        {
            "domain": "rack-a",
            "label": "nvidia.com/gpu.clique",
            "nodes": 18,
            "readyNodes": 18,
            "gpus": 72,
            "freeGpus": 8,
            "freeNodes": 2,
            "groupCount": 1,
            "groups": [{"namespace": "ns", "group": "g-0", "gpus": 64, "priority": 1}],
            "updated": "2025-01-01T00:00:00Z",
            "reservedGpus": 4,
        }
    )
    assert status.groups[0].gpus == 64


def test_an_unknown_spec_field_is_still_refused():
    doc = load_example("deepseek-r1-disaggregated.yaml")
    doc["status"] = status_with_unknown_fields()
    doc["spec"]["decode"]["parallelism"]["context"] = 2
    with pytest.raises(SpecError) as info:
        parse_model_deployment(doc)
    assert info.value.errors == ['unknown field "spec.decode.parallelism.context"']


def _models(root: type[BaseModel]) -> set[type[BaseModel]]:
    """Every model reachable from `root` through its fields."""
    seen: set[type[BaseModel]] = set()
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for info in model.model_fields.values():
            stack = [info.annotation]
            while stack:
                t = stack.pop()
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
                stack.extend(getattr(t, "__args__", ()))
    return seen


def test_every_status_model_ignores_unknown_fields_and_every_spec_model_forbids_them():
    for model in _models(models.ModelDeploymentStatus) | _models(models.NVLinkDomainStatus):
        # The plan's Parallelism is the spec's model, read leniently by its field (see the test above).
        if model is not models.Parallelism:
            assert model.model_config.get("extra") == "ignore", model.__name__
    for model in _models(models.ModelDeploymentSpec):
        assert model.model_config.get("extra") == "forbid", model.__name__


def test_leniency_leaves_the_status_schema_closed():
    """Unknown status fields are still pruned by the API server: leniency is the reader's, not the CRD's."""
    for schema in (
        model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"],
        nvlink_domain_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"],
        openapi_schema(models.ModelDeploymentStatus),
    ):
        assert "x-kubernetes-preserve-unknown-fields" not in repr(schema)
        assert "additionalProperties': False" not in repr(schema)
