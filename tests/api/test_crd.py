"""The committed CRDs match the models, and the schema is structural and documented."""

from __future__ import annotations

from typing import Any

from testing.cases import ROOT
from tokenfab.api.crd import model_deployment_crd
from tokenfab.cli import render_crds


def test_committed_crds_are_current():
    for name, text in render_crds().items():
        path = ROOT / "crds" / name
        assert path.exists(), f"{path} missing: run `tokenfab crds`"
        assert path.read_text() == text, f"{path} is stale: run `tokenfab crds` and commit the result"


def _walk(node: dict[str, Any], path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    out.append((path, node))
    for key, child in node.get("properties", {}).items():
        _walk(child, f"{path}.{key}", out)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", out)


def _schema() -> dict[str, Any]:
    crd = model_deployment_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_schema_is_structural():
    nodes: list[tuple[str, dict[str, Any]]] = []
    _walk(_schema(), "", nodes)
    for path, node in nodes:
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title", "const", "$defs"):
            assert forbidden not in node, f"{path} has {forbidden}"
        assert node.get("additionalProperties") not in (True, False), path
        assert not ("properties" in node and isinstance(node.get("additionalProperties"), dict)), path
        typed = (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        )
        assert typed, f"{path} has no type"


def test_every_field_has_a_description():
    nodes: list[tuple[str, dict[str, Any]]] = []
    _walk(_schema(), "", nodes)
    missing = [
        p for p, n in nodes if p.count(".") >= 2 and not p.endswith(("{}", "[]")) and not n.get("description")
    ]
    assert not missing, f"fields without description: {missing}"


def test_nested_defaults_apply_when_a_section_is_left_out():
    spec = _schema()["properties"]["spec"]["properties"]
    for section in ("runtime", "serving", "topology", "autoscaling"):
        assert spec[section]["default"] == {}, section
    # Left out, these ask spec.profile for a plan: the API server must not fill them in.
    assert "default" not in spec["speculativeDecoding"]
    assert "default" not in spec["decode"]["properties"]["parallelism"]
    assert spec["topology"]["properties"]["gpusPerNode"]["default"] == 4
    assert spec["topology"]["properties"]["domainLabel"]["default"] == "nvidia.com/gpu.clique"


def test_printer_columns_and_subresources():
    version = model_deployment_crd()["spec"]["versions"][0]
    names = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert names == ["Mode", "Ready", "Prefill", "Decode", "Workers", "GPUs", "Age"]
    assert version["subresources"] == {"status": {}}
    assert model_deployment_crd()["spec"]["names"]["shortNames"] == ["mdep"]
