"""The ModelDeployment models refuse bad specs with the API server's words, and accept the examples."""

from __future__ import annotations

from typing import Any

import pytest

from testing.cases import example_paths, invalid_cases
from tokenfab.api.crd import model_deployment_crd
from tokenfab.api.errors import SpecError, load_manifests, parse_model_deployment
from tokenfab.api.models import SPEC_RULES

CASES = invalid_cases()


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_every_example_validates(path):
    docs = load_manifests(path.read_text(), str(path))
    assert len(docs) == 1
    assert docs[0].spec.roles(), "an example must describe at least one role"


def test_there_are_at_least_40_invalid_cases():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_invalid_spec_is_refused_with_its_message(case):
    with pytest.raises(SpecError) as info:
        parse_model_deployment(case.manifest)
    assert info.value.errors == [case.expect]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_message_names_a_field(case):
    assert case.expect.startswith(("spec.", 'unknown field "spec.', "metadata.name: "))


def _cel_messages(node: Any, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            out.append(rule["message"])
        for value in node.values():
            _cel_messages(value, out)
    elif isinstance(node, list):
        for value in node:
            _cel_messages(value, out)
    return out


def test_every_field_and_object_rule_in_the_crd_has_an_invalid_case():
    """Each x-kubernetes-validations rule beside the spec rules (covered above) is refused at least once by
    the table, so, in e2e, by the API server."""
    schema = model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec_rules = {r.message for r in SPEC_RULES}
    expects = [c.expect for c in CASES]
    for message in _cel_messages(schema, []):
        if message not in spec_rules:
            assert any(message in e for e in expects), f"no invalid case for the CEL rule: {message}"


def test_every_spec_rule_has_an_invalid_case():
    covered = {c.rule for c in CASES}
    per_role_rules = {r.name for r in SPEC_RULES if r.name.startswith(("prefill-", "decode-", "worker-"))}
    # Role rules are generated from one template; one role's case covers the template, but every mode rule
    # and every spec-wide rule needs a case of its own.
    templates = {name.split("-", 1)[1] for name in per_role_rules}
    for template in templates:
        assert any(c and c.endswith(template) for c in covered), f"no invalid case for *-{template}"
    for rule in SPEC_RULES:
        if rule.name not in per_role_rules:
            assert rule.name in covered, f"no invalid case for rule {rule.name}"


def test_all_violations_are_reported_together():
    case = next(c for c in CASES if c.id == "disaggregated-without-prefill")
    manifest = case.manifest
    manifest["spec"]["serving"]["prefillDecodeRatio"] = None
    del manifest["spec"]["serving"]["prefillDecodeRatio"]
    with pytest.raises(SpecError) as info:
        parse_model_deployment(manifest)
    names = [r.name for r in SPEC_RULES if r.error_text() in info.value.errors]
    assert names == ["disaggregated-needs-prefill", "fixed-ratio-needs-ratio"]


def test_defaults_fill_in_a_minimal_spec():
    md = parse_model_deployment(
        {
            "apiVersion": "tokenfab.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {
                "model": {"name": "m", "source": "pvc://models/m"},
                "serving": {"mode": "aggregated"},
                "worker": {},
            },
        }
    )
    assert md.spec.topology.domain_label == "nvidia.com/gpu.clique"
    assert md.spec.topology.gpus_per_node == 4
    assert md.spec.topology.gpus_per_domain == 72
    assert md.spec.worker is not None
    assert md.spec.worker.parallelism.tensor == 1
    assert md.spec.speculative_decoding.mtp_depth == 0
    assert md.spec.serving.router_mode == "kv"
