"""The API server itself enforces the ModelDeployment API: the CRD installs, every example passes a
server-side dry run, and every invalid spec is refused by admission with the same words as the models."""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.helpers import apply_yaml, kubectl
from testing.cases import example_paths, invalid_cases
from tokenfab.api.errors import SpecError, parse_model_deployment

CASES = invalid_cases()


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_example_passes_server_side_dry_run(factory, path):
    out = kubectl(factory, "apply", "--dry-run=server", "-f", str(path))
    assert "created (server dry run)" in out.stdout


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_api_server_refuses_invalid_spec_with_the_models_words(factory, case):
    out = apply_yaml(factory, case.manifest, "--dry-run=server", check=False)
    assert out.returncode != 0, f"the API server accepted {case.id}"
    assert case.expect in out.stderr, out.stderr
    with pytest.raises(SpecError) as info:
        parse_model_deployment(case.manifest)
    assert case.expect in info.value.errors


def test_nothing_running_is_disturbed_by_a_refused_update(factory):
    doc = yaml.safe_load((example_paths()[0].parent / "deepseek-r1-disaggregated.yaml").read_text())
    doc["metadata"]["name"] = "admission-keep"
    apply_yaml(factory, doc, "--server-side", "--field-manager=e2e")
    try:
        bad = json.loads(json.dumps(doc))
        bad["spec"]["decode"]["parallelism"]["tensor"] = 6
        out = apply_yaml(factory, bad, "--server-side", "--field-manager=e2e", check=False)
        assert out.returncode != 0
        assert "spec.decode.parallelism" in out.stderr
        stored = json.loads(kubectl(factory, "get", "mdep", "admission-keep", "-o", "json").stdout)
        assert stored["spec"]["decode"]["parallelism"]["tensor"] == 32
        assert stored["metadata"]["generation"] == 1
    finally:
        kubectl(factory, "delete", "mdep", "admission-keep")


def test_defaults_are_applied_by_the_api_server(factory):
    doc = yaml.safe_load((example_paths()[0].parent / "aggregated-small.yaml").read_text())
    doc["metadata"]["name"] = "defaults"
    out = apply_yaml(factory, doc, "--dry-run=server", "-o", "json")
    spec = json.loads(out.stdout)["spec"]
    assert spec["topology"] == {
        "domainLabel": "nvidia.com/gpu.clique",
        "gpusPerNode": 4,
        "gpuResource": "nvidia.com/gpu",
        "gpusPerDomain": 72,
        "placement": "pack",
        "computeDomain": True,
        "kvNetwork": "rdma",
        "nodeFailureTolerationSeconds": 300,
    }
    assert "speculativeDecoding" not in spec  # left out: no MTP, or with spec.profile the plan's depth
    assert spec["worker"]["parallelism"]["pipeline"] == 1


def test_kubectl_explain_reads_the_field_reference(factory):
    out = kubectl(factory, "explain", "modeldeployment.spec.decode.parallelism").stdout
    for field in ("tensor", "pipeline", "expert", "attentionDataParallel", "moe_expert_parallel_size"):
        assert field in out
    out = kubectl(factory, "explain", "mdep.spec.speculativeDecoding.mtpDepth").stdout
    assert "max_draft_len" in out


def test_kubectl_get_shows_the_columns(factory):
    doc = yaml.safe_load((example_paths()[0].parent / "llama-405b-multinode-tp.yaml").read_text())
    apply_yaml(factory, doc)
    try:
        header = kubectl(factory, "get", "mdep").stdout.splitlines()[0].split()
        assert header == ["NAME", "MODE", "READY", "PREFILL", "DECODE", "WORKERS", "GPUS", "AGE"]
        wide = kubectl(factory, "get", "mdep", "-o", "wide").stdout.splitlines()
        assert wide[0].split()[-7:] == ["RATIO", "MTP", "REASON", "ENDPOINT", "KV-PATH", "WEIGHTS", "AGE"]
        assert "aggregated" in wide[1]
        names = kubectl(factory, "get", "tokenfab").stdout
        assert "llama-405b" in names
    finally:
        kubectl(factory, "delete", "mdep", "llama-405b")
