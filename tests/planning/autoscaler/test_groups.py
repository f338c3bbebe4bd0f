"""Groups per role (tokenfab.planning.autoscaler.groups): the spec's counts, the autoscaler's remembered
decisions, and prefill following decode by the fixed prefill:decode ratio, the one place it is applied."""

from __future__ import annotations

import math
from typing import Any

import pytest

from testing.cases import load_example, merge_patch
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import AutoscalingStatus, ModelDeployment, ModelDeploymentStatus
from tokenfab.planning.autoscaler import scaled_roles
from tokenfab.planning.autoscaler.groups import follow_ratio, ratio_prefill, spec_groups
from tokenfab.planning.autoscaler.groups import remembered_groups as desired_groups

# ------------------------------------------------------------------------------- the autoscaler's counts


def spec_of(example: str, patch: dict[str, Any] | None = None):
    doc = load_example(example)
    if patch:
        doc["spec"] = merge_patch(doc["spec"], patch)
    return parse_model_deployment(doc, example).spec


def fixed(ratio: str, enabled: bool = True, prefill: tuple[int, int] | None = (1, 4)):
    autoscaling: dict[str, Any] = {
        "enabled": enabled,
        "prometheusUrl": "http://prometheus:9090",
        "decode": {"minReplicas": 1, "maxReplicas": 16},
        "prefill": {"minReplicas": prefill[0], "maxReplicas": prefill[1]} if prefill else None,
    }
    return spec_of(
        "deepseek-r1-disaggregated.yaml",
        {"serving": {"prefillDecodeRatio": ratio, "ratioPolicy": "fixed"}, "autoscaling": autoscaling},
    )


@pytest.mark.parametrize(
    ("ratio", "decode", "prefill"),
    [
        ("1:1", 1, 1),
        ("1:1", 3, 3),
        ("1:1", 9, 4),  # clamped to the prefill max
        ("1:3", 1, 1),
        ("1:3", 4, 2),
        ("1:3", 12, 4),
        ("2:3", 5, 4),
        ("1:4", 16, 4),
        ("1:8", 3, 1),
        ("3:1", 1, 3),
        ("3:1", 2, 4),
    ],
)
def test_fixed_ratio_prefill_follows_the_autoscaled_decode(ratio, decode, prefill):
    spec = fixed(ratio)
    p, d = (int(x) for x in ratio.split(":"))
    unclamped = math.ceil(decode * p / d)
    assert ratio_prefill(decode, ratio) == unclamped
    assert follow_ratio(spec, decode, 99) == prefill == max(1, min(4, unclamped))


def test_fixed_ratio_prefill_bounds_raise_the_floor():
    spec = fixed("1:8", prefill=(2, 6))
    assert [follow_ratio(spec, d, 0) for d in (1, 8, 16, 48)] == [2, 2, 2, 6]


def test_fixed_ratio_without_prefill_bounds_or_autoscaling_is_not_clamped():
    assert follow_ratio(fixed("1:1", prefill=None), 9, 0) == 9
    assert follow_ratio(fixed("1:1", enabled=False), 9, 0) == 9


def test_independent_ratio_policy_leaves_prefill_alone():
    spec = spec_of("qwen3-235b-autoscaled.yaml", {"prefill": {"replicas": 5}})
    assert spec.serving.ratio_policy == "independent"
    for decode in (1, 4, 8):
        assert follow_ratio(spec, decode, 5) == 5
        assert follow_ratio(spec, decode, 2) == 2
    assert spec_groups(spec) == {"prefill": 5, "decode": 2}


def test_who_scales_prefill():
    roles = {r for r, _, _ in scaled_roles(ModelDeployment.model_validate(wrap(fixed("1:2"))))}
    assert roles == {"decode"}, "fixed: prefill follows decode, it has no signal of its own"
    independent = spec_of("qwen3-235b-autoscaled.yaml")
    got = {(r, m) for r, _, m in scaled_roles(ModelDeployment.model_validate(wrap(independent)))}
    assert got == {("decode", "kv_cache_utilization"), ("prefill", "queue_depth")}


def wrap(spec, desired: dict[str, int] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": spec.model_dump(by_alias=True, exclude_none=True),
    }
    if desired is not None:
        doc["status"] = ModelDeploymentStatus(autoscaling=AutoscalingStatus(desired=desired)).model_dump(
            by_alias=True, exclude_none=True
        )
    return doc


@pytest.mark.parametrize(("decode", "prefill"), [(1, 1), (2, 1), (5, 3), (16, 4)])
def test_desired_groups_couple_prefill_to_the_autoscaler_decode(decode, prefill):
    md = ModelDeployment.model_validate(wrap(fixed("1:2"), {"decode": decode}))
    assert desired_groups(md) == {"prefill": prefill, "decode": decode}


def test_desired_groups_keep_an_independently_scaled_prefill():
    spec = spec_of("qwen3-235b-autoscaled.yaml")
    md = ModelDeployment.model_validate(wrap(spec, {"decode": 7, "prefill": 3}))
    assert desired_groups(md) == {"prefill": 3, "decode": 7}


# -------------------------------------------------------------------------------------------- spec_groups


@pytest.mark.parametrize(
    ("decode", "ratio", "prefill"),
    [(3, "1:3", 1), (4, "1:3", 2), (0, "1:3", 0), (2, "1:1", 2), (5, "2:3", 4), (1, "3:1", 3)],
)
def test_prefill_follows_decode_by_the_fixed_ratio(decode, ratio, prefill):
    spec = spec_of(
        "deepseek-r1-disaggregated.yaml",
        {"decode": {"replicas": decode}, "serving": {"prefillDecodeRatio": ratio}},
    )
    assert spec_groups(spec) == {"prefill": prefill, "decode": decode}


def test_fixed_ratio_is_clamped_by_prefill_bounds_when_autoscaling():
    spec = spec_of(
        "deepseek-r1-disaggregated.yaml",
        {
            "decode": {"replicas": 9},
            "serving": {"prefillDecodeRatio": "1:1"},
            "autoscaling": {
                "enabled": True,
                "prometheusUrl": "http://prometheus:9090",
                "prefill": {"minReplicas": 1, "maxReplicas": 4},
                "decode": {"minReplicas": 1, "maxReplicas": 9},
            },
        },
    )
    assert spec_groups(spec) == {"prefill": 4, "decode": 9}


def test_independent_ratio_policy_keeps_prefill_replicas():
    spec = spec_of("qwen3-235b-autoscaled.yaml", {"prefill": {"replicas": 5}, "decode": {"replicas": 1}})
    assert spec_groups(spec) == {"prefill": 5, "decode": 1}


def test_a_role_without_replicas_has_one_group():
    spec = spec_of("aggregated-small.yaml", {"worker": {"replicas": None}})
    assert spec_groups(spec) == {"worker": 1}
