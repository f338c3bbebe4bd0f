"""Edges of the admission rules that tests/data/invalid-specs.yaml cannot hold: what is accepted right at a
limit, refusals with more than one line, and the bounds only the models enforce (the API server cannot see
inside free-form YAML, so `tokenfab validate` and the operator refuse what admission let through)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testing.cases import load_example, merge_patch
from tokenfab.api import models
from tokenfab.api.crd import model_deployment_crd
from tokenfab.api.errors import SpecError, parse_model_deployment
from tokenfab.api.rules import NAME_RULE, NAME_SUFFIX_RULE, RESERVED_ENV, SOURCE_RULE
from tokenfab.planning import contract


def manifest(base: str, patch: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
    doc = load_example(base)
    doc["spec"] = merge_patch(doc["spec"], patch or {})
    if name is not None:
        doc["metadata"]["name"] = name
    return doc


def refusal(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_model_deployment(doc)
    return info.value.errors


# ------------------------------------------------------------------------------------------ metadata.name


def test_a_name_of_40_characters_is_accepted():
    name = "a" + "-b" * 19 + "c"
    assert len(name) == 40
    assert parse_model_deployment(manifest("aggregated-small.yaml", name=name)).metadata.name == name


def test_a_name_that_is_no_dns_subdomain_gets_the_api_servers_line_too():
    """Every object's name must be a DNS subdomain; the API server says so before the CRD's own rule."""
    errors = refusal(manifest("aggregated-small.yaml", name="Llama-8b"))
    assert len(errors) == 2
    assert errors[0].startswith('metadata.name: Invalid value: "Llama-8b": a lowercase RFC 1123 subdomain')
    assert errors[1] == f'metadata.name: Invalid value: "Llama-8b": {NAME_RULE.message}'


def test_a_manifest_without_name_is_left_to_generate_name():
    doc = manifest("aggregated-small.yaml")
    doc["metadata"] = {"generateName": "llama-"}
    assert parse_model_deployment(doc).metadata.name is None


def test_the_crd_constrains_only_metadata_name():
    """The API server refuses a CRD whose metadata schema says anything but name and generateName."""
    root = model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    meta = root["properties"]["metadata"]
    assert set(meta["properties"]) == {"name"}
    assert meta["properties"]["name"]["x-kubernetes-validations"] == [
        NAME_RULE.x_kubernetes_validation(),
        NAME_SUFFIX_RULE.x_kubernetes_validation(),
    ]


def test_the_reserved_env_names_are_those_tokenfab_sets():
    """The API layer cannot import the contract (it is below it): the two lists are kept equal here."""
    set_on_workers = {
        v
        for k, v in vars(contract).items()
        if k.startswith("ENV_") and k not in ("ENV_PEER_WAIT_SECONDS", "ENV_DYN_SYSTEM_HOST")
    }
    assert set(RESERVED_ENV) == set_on_workers - set(contract.OVERRIDABLE_ENV)


# ------------------------------------------------------------------------------------ extraEngineArgs


def test_engine_args_of_64_keys_are_accepted():
    args = {f"k{i:02d}": i for i in range(64)}
    doc = manifest("qwen3-235b-autoscaled.yaml", {"runtime": {"extraEngineArgs": args}})
    assert len(parse_model_deployment(doc).spec.runtime.extra_engine_args) == 64


def _blob_args(size: int) -> dict[str, Any]:
    """Engine args of exactly `size` bytes of compact JSON, the bulk nested where CEL cannot look."""
    empty = {"moe_config": {"load_balancer": {"slots": ""}}}
    pad = size - models.engine_args_bytes(empty)
    return {"moe_config": {"load_balancer": {"slots": "x" * pad}}}


def test_engine_args_up_to_64_kib_are_accepted():
    args = _blob_args(models.ENGINE_ARGS_MAX_BYTES)
    assert models.engine_args_bytes(args) == 64 * 1024
    doc = manifest("qwen3-235b-autoscaled.yaml", {"decode": {"extraEngineArgs": args}})
    assert parse_model_deployment(doc).spec.decode is not None


@pytest.mark.parametrize("where", ["runtime", "decode"])
def test_engine_args_over_64_kib_are_refused_by_the_models(where):
    args = _blob_args(models.ENGINE_ARGS_MAX_BYTES + 1)
    errors = refusal(manifest("qwen3-235b-autoscaled.yaml", {where: {"extraEngineArgs": args}}))
    assert errors == [
        f"spec.{where}.extraEngineArgs: Invalid value: extraEngineArgs must be at most 65536 bytes as JSON "
        "(64 KiB), and it is 65537: tokenfab writes it into each role's engine ConfigMap (1 MiB at most); "
        "keep bulky data in the image or on the model volume and point to it"
    ]


def test_a_one_megabyte_blob_is_refused():
    """The case that broke the engine ConfigMap: one top-level string the API server lets through."""
    doc = manifest("deepseek-r1-disaggregated.yaml", {"runtime": {"extraEngineArgs": {"blob": "x" * 2**20}}})
    [error] = refusal(doc)
    assert error.startswith("spec.runtime.extraEngineArgs: Invalid value: extraEngineArgs must be at most")


def test_engine_args_size_counts_utf8_bytes():
    assert models.engine_args_bytes({"k": "é"}) == len('{"k":"é"}'.encode())


def test_engine_args_limits_are_documented_for_kubectl_explain():
    spec = model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    args = spec["properties"]["runtime"]["properties"]["extraEngineArgs"]
    assert args["maxProperties"] == 64
    assert "64 top-level keys" in args["description"]
    assert "64 KiB" in args["description"]


# -------------------------------------------------------------------------------------------- resources


@pytest.mark.parametrize("value", [0, 8, "8", "500m", "64Gi", "1e3", "+1", ".5", "1.5", "100M", "2Ki"])
def test_kubernetes_quantities_are_accepted(value):
    doc = manifest("deepseek-r1-disaggregated.yaml", {"runtime": {"resources": {"requests": {"cpu": value}}}})
    assert parse_model_deployment(doc).spec.runtime.resources.requests["cpu"] == value


@pytest.mark.parametrize("value", ["lots", "-1", "1.5.2", "Gi", "8 Gi", "", "0x10", "1gi"])
def test_what_is_no_quantity_is_refused(value):
    doc = manifest(
        "deepseek-r1-disaggregated.yaml", {"runtime": {"resources": {"limits": {"memory": value}}}}
    )
    [error] = refusal(doc)
    assert error.startswith(f"spec.runtime.resources.limits.memory: Invalid value: {json.dumps(value)}: ")


def test_sixteen_resources_are_accepted():
    requests = {f"example.com/r{i:02d}": 1 for i in range(16)}
    doc = manifest("deepseek-r1-disaggregated.yaml", {"runtime": {"resources": {"requests": requests}}})
    assert len(parse_model_deployment(doc).spec.runtime.resources.requests) == 16


def test_the_gpu_rule_follows_topology_gpu_resource():
    """With another GPU resource, nvidia.com/gpu is an ordinary resource and the other one is refused."""
    patch = {
        "topology": {"gpuResource": "example.com/gb200"},
        "runtime": {"resources": {"limits": {"nvidia.com/gpu": 1}}},
    }
    assert parse_model_deployment(manifest("llama-405b-multinode-tp.yaml", patch))


# ------------------------------------------------------------------------------------------ model.source


@pytest.mark.parametrize(
    "source",
    [
        "hf://deepseek-ai/DeepSeek-R1",
        "hf://gpt2",
        "pvc://models/llama/fp8",
        "pvc://a.b/c",
    ],
)
def test_good_sources_are_accepted(source):
    assert parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml", {"model": {"source": source}}))


def test_s3_and_pvc_sources_go_to_the_model_cache_and_may_be_pre_staged():
    """s3:// weights are the launcher's to download (tokenfab.launcher.s3), like hf://, and pvc:// ones to
    copy into the node's cache with a storage class (tokenfab.launcher.mirror): accepted, pre-staging too."""
    cache = {"storageClassName": "local-nvme", "prestageGroups": 2}
    patch = {"model": {"source": "s3://m/q", "cache": cache}}
    md = parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml", patch))
    assert md.spec.model.source == "s3://m/q"
    # pvc:// weights with a storage class are copied into it, so they may be pre-staged too
    pvc = {"model": {"source": "pvc://m/q", "cache": cache}}
    assert (
        parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml", pvc)).spec.model.source
        == "pvc://m/q"
    )


def test_the_source_message_states_the_expected_forms():
    for form in ("hf://<org>/<repo>", "s3://<bucket>/<prefix>", "pvc://<claim>/<path>", "whitespace"):
        assert form in SOURCE_RULE.message


# --------------------------------------------------------------------------------------- autoscaling


@pytest.mark.parametrize(
    "query",
    [
        'avg by (tokenfab_dev_group) (kv_cache_usage{{namespace="{namespace}", deployment="{deployment}"}})',
        'max(kv{{role="{role}"}}) / 100',
        "{{literal braces}} and {role}",
    ],
)
def test_queries_with_doubled_braces_are_accepted_and_format(query):
    patch = {"autoscaling": {"query": query}}
    spec = parse_model_deployment(manifest("aggregated-small.yaml", patch)).spec
    assert spec.autoscaling.query is not None
    filled = spec.autoscaling.query.format(namespace="ns", deployment="llama-8b", role="worker")
    assert "{namespace}" not in filled
    assert "{{" not in filled


def test_a_role_is_parked_with_replicas_zero_and_autoscaling_off():
    """Bounds stay in the spec but do nothing while autoscaling is off, so they do not hold replicas."""
    patch = {"worker": {"replicas": 0}, "autoscaling": {"enabled": False}}
    spec = parse_model_deployment(manifest("aggregated-small.yaml", patch)).spec
    assert spec.worker is not None
    assert spec.worker.replicas == 0
    assert spec.autoscaling.worker is not None
    assert spec.autoscaling.worker.min_replicas == 1


def test_replicas_zero_with_autoscaling_on_is_refused():
    errors = refusal(manifest("aggregated-small.yaml", {"worker": {"replicas": 0}}))
    assert errors == [
        "spec.worker.replicas: Invalid value: spec.worker.replicas must lie within "
        "autoscaling.worker.minReplicas and maxReplicas when autoscaling is enabled: change the replicas or "
        "the bounds"
    ]


def test_min_replicas_of_one_is_accepted():
    patch = {"worker": {"replicas": None}, "autoscaling": {"worker": {"minReplicas": 1, "maxReplicas": 1}}}
    assert parse_model_deployment(manifest("aggregated-small.yaml", patch))


# ------------------------------------------------------------------------------------------- scheduling


def test_a_full_scheduling_section_is_accepted():
    scheduling = {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB200", "example.com/pool": ""},
        "tolerations": [
            {"operator": "Exists"},
            {"key": "dedicated", "operator": "Exists"},
            {"key": "dedicated", "operator": "Exists", "value": ""},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {
                "key": "example.com/maintenance",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 0,
            },
        ],
        "priorityClassName": "inference-high",
        "schedulerName": "kai-scheduler",
    }
    spec = parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml", {"scheduling": scheduling})).spec
    assert spec.scheduling is not None
    assert spec.scheduling.tolerations[0].operator == "Exists"
    assert spec.scheduling.tolerations[3].operator == "Equal"  # the default
    assert spec.scheduling.node_selector["nvidia.com/gpu.product"] == "NVIDIA-GB200"


def test_scheduling_is_optional_and_has_no_default():
    spec = parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml")).spec
    assert spec.scheduling is None
    schema = model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "default" not in schema["properties"]["scheduling"]


def test_thirty_two_tolerations_and_node_labels_are_accepted():
    scheduling = {
        "nodeSelector": {f"example.com/l{i:02d}": "v" for i in range(32)},
        "tolerations": [{"key": f"t{i:02d}", "operator": "Exists"} for i in range(32)],
    }
    assert parse_model_deployment(manifest("deepseek-r1-disaggregated.yaml", {"scheduling": scheduling}))


def test_every_toleration_violation_is_reported():
    toleration = {"operator": "Exists", "value": "x", "effect": "NoSchedule", "tolerationSeconds": 1}
    errors = refusal(
        manifest("deepseek-r1-disaggregated.yaml", {"scheduling": {"tolerations": [toleration]}})
    )
    assert [e.split(":")[0] for e in errors] == [
        "spec.scheduling.tolerations[0].value",
        "spec.scheduling.tolerations[0].tolerationSeconds",
    ]


# -------------------------------------------------------------------------------------------- topology


def test_node_failure_toleration_defaults_to_kubernetes_300_seconds():
    spec = parse_model_deployment(manifest("aggregated-small.yaml")).spec
    assert spec.topology.node_failure_toleration_seconds == 300
    schema = model_deployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert schema["properties"]["topology"]["properties"]["nodeFailureTolerationSeconds"]["default"] == 300
