"""The pure builders: engine configs, pods, Services, the frontend and ComputeDomains.

Golden files: for every example in examples/ (and DeepSeek variants without a ComputeDomain and with etcd
discovery)
`tests/golden/<name>.yaml` holds every child the builders render for it, in this order: the engine
ConfigMap of each role, the workers Service, the frontend Deployment and Service, then per role the
ComputeDomain (when the spec asks for one) and the pods of group slot 0 placed in domain "clique-a" at
the role's current revision. The owner is fixed (namespace "ml", uid ...0001) so the files are stable.

After an intended change to the builders, regenerate the files and review the diff:

    TOKENFAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_builders.py

The other tests here do not depend on the golden files.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cases import example_paths, load_example, merge_patch
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning.builders.engine import _revision_inputs
from tokenfab.planning.engine import content_hash, engine_config, render
from tokenfab.planning.units import rule

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("TOKENFAB_UPDATE_GOLDEN") == "1"
UID = "00000000-0000-0000-0000-000000000001"
DOMAIN = "clique-a"
GPU = "nvidia.com/gpu"


def owner(name: str) -> b.Owner:
    return b.Owner(name=name, namespace="ml", uid=UID)


def spec_of(example: str, patch: dict[str, Any] | None = None) -> ModelDeploymentSpec:
    """An example's spec, with an optional JSON merge patch on spec (validated like any manifest)."""
    doc = load_example(example)
    if patch:
        doc["spec"] = merge_patch(doc["spec"], patch)
    return parse_model_deployment(doc, example).spec


def env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment as a kubelet resolves it (downward API fields from the pod's metadata;
    a pod not yet created has no uid: a stand-in)."""
    meta = pod["metadata"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", f"uid-of-{meta['name']}"),
    }
    out = {}
    for e in pod["spec"]["containers"][0]["env"]:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        out[e["name"]] = fields[ref["fieldPath"]] if ref else e.get("value")
    return out


def gpus(pod: dict[str, Any]) -> tuple[str, str]:
    res = pod["spec"]["containers"][0]["resources"]
    return res["requests"][GPU], res["limits"][GPU]


# ------------------------------------------------------------------------------------------ golden files

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{p.stem: (p.name, {}) for p in example_paths()},
    "deepseek-r1-disaggregated-no-compute-domain": (
        "deepseek-r1-disaggregated.yaml",
        {"topology": {"computeDomain": False}},
    ),
    "deepseek-r1-disaggregated-etcd": (
        "deepseek-r1-disaggregated.yaml",
        {"serving": {"discovery": "etcd", "etcdEndpoints": "http://etcd.dynamo-system:2379"}},
    ),
}


def render_children(example: str, patch: dict[str, Any]) -> list[dict[str, Any]]:
    md = parse_model_deployment(merge_patch(load_example(example), {"spec": patch}), example)
    assert md.metadata.name is not None
    spec, own = md.spec, owner(md.metadata.name)
    docs = [b.engine_configmap(own, spec, role) for role, _ in spec.roles()]
    docs += [b.workers_service(own, spec), b.frontend_deployment(own, spec), b.frontend_service(own)]
    docs += b.discovery_rbac(own, spec)
    unit = 0 if rule(spec) is not None else None  # (slot 0 of each role: the first prefill-decode unit)
    for role, _ in spec.roles():
        cd = b.compute_domain(own, spec, role, 0, unit)
        if cd is not None and cd not in docs:
            docs.append(cd)
        if b.gang_of(spec, role, "podgroup"):
            docs.append(b.pod_group(own, spec, role, 0))
        nodes = [f"gb200-r00-t{i:02d}" for i in range(b.group_shape(spec, role).nodes)]
        # Multi-node groups: the PodGroup gang path (the gate path is tested below).
        rev = b.role_revision(spec, role)
        docs += b.group_pods(own, spec, role, 0, DOMAIN, rev, nodes, gang="podgroup", unit=unit)
    return docs


class _Dumper(yaml.SafeDumper):
    """Block style, builder key order, no anchors, multi-line strings (the engine YAML) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: list[dict[str, Any]], variant: str) -> str:
    header = (
        f"# Generated by tests/test_builders.py from {VARIANTS[variant][0]}"
        + (f" patched with {VARIANTS[variant][1]}" if VARIANTS[variant][1] else "")
        + ".\n# Regenerate: TOKENFAB_UPDATE_GOLDEN=1 pytest tests/test_builders.py (then review the diff)\n"
    )
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return header + body


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_children_match_golden_file(variant):
    example, patch = VARIANTS[variant]
    docs = render_children(example, patch)
    text = dump(docs, variant)
    path = GOLDEN / f"{variant}.yaml"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: run with TOKENFAB_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "rendered"
            )
        )
        pytest.fail(
            f"rendered children differ from {path.name} (TOKENFAB_UPDATE_GOLDEN=1 to accept):\n{diff}"
        )
    # The file round-trips: what reviewers read is what the builders produce.
    assert list(yaml.safe_load_all(expected)) == docs


def test_there_is_a_golden_file_for_every_variant_and_no_stale_one():
    if UPDATE:
        pytest.skip("regenerating golden files")
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == sorted(VARIANTS)


def test_a_units_groups_share_one_compute_domain_and_claim_it_unless_turned_off():
    plain = render_children(*VARIANTS["deepseek-r1-disaggregated-no-compute-domain"])
    with_cd = render_children("deepseek-r1-disaggregated.yaml", {})
    assert not [d for d in plain if d["kind"] == "ComputeDomain"]
    assert not [p for p in plain if p["kind"] == "Pod" and "resourceClaims" in p["spec"]]
    # the first prefill-decode unit: prefill 0 and decode 0, one ComputeDomain over all their pods
    [cd] = [d for d in with_cd if d["kind"] == "ComputeDomain"]
    assert cd["metadata"]["name"] == "deepseek-r1-unit-0-imex"
    assert cd["metadata"]["labels"][c.LABEL_UNIT] == "0"
    pods = [d for d in with_cd if d["kind"] == "Pod"]
    assert len(pods) == 2 + 8
    for pod in pods:
        assert pod["metadata"]["labels"][c.LABEL_UNIT] == "0"
        assert pod["spec"]["resourceClaims"] == [
            {"name": "imex", "resourceClaimTemplateName": "deepseek-r1-unit-0-imex"}
        ]
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "imex"}]


def test_an_aggregated_multi_node_group_claims_a_compute_domain_of_its_own():
    docs = render_children("llama-405b-multinode-tp.yaml", {})
    [cd] = [d for d in docs if d["kind"] == "ComputeDomain"]
    assert cd["metadata"]["name"] == "llama-405b-worker-0-imex"
    assert cd["metadata"]["labels"][c.LABEL_GROUP] == "llama-405b-worker-0"
    for pod in (d for d in docs if d["kind"] == "Pod"):
        assert c.LABEL_UNIT not in pod["metadata"]["labels"]
        assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "llama-405b-worker-0-imex"
    with_cd = [*docs, *render_children("deepseek-r1-disaggregated.yaml", {})]
    for cd in (d for d in with_cd if d["kind"] == "ComputeDomain"):
        # numNodes is deprecated and the spec immutable: 0 is valid on every driver release
        assert cd["apiVersion"] == "resource.nvidia.com/v1beta1"
        assert cd["spec"]["numNodes"] == 0
        assert cd["spec"]["channel"]["resourceClaimTemplate"]["name"] == cd["metadata"]["name"]


# ------------------------------------------------------------------------------------------------- pods


def test_a_32_gpu_decode_group_is_8_pods_of_4_gpus_with_one_leader():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    pods = b.group_pods(owner("deepseek-r1"), spec, "decode", 3, DOMAIN, "rev1")
    assert [p["metadata"]["name"] for p in pods] == [f"deepseek-r1-decode-3-{r}" for r in range(8)]
    assert [p["metadata"]["labels"][c.LABEL_RANK] for p in pods] == [str(r) for r in range(8)]
    assert [env(p)[c.ENV_RANK] for p in pods] == [str(r) for r in range(8)]
    assert {env(p)[c.ENV_WORLD_SIZE] for p in pods} == {"8"}
    assert {gpus(p) for p in pods} == {("4", "4")}
    assert {env(p)[c.ENV_GPUS_PER_POD] for p in pods} == {"4"}
    leader = "deepseek-r1-decode-3-0.deepseek-r1-workers.ml.svc.cluster.local"
    assert {env(p)[c.ENV_LEADER_ADDRESS] for p in pods} == {leader}
    # The leader's DNS name resolves: hostname + subdomain = the headless workers Service.
    assert (pods[0]["spec"]["hostname"], pods[0]["spec"]["subdomain"]) == (
        "deepseek-r1-decode-3-0",
        b.workers_service_name(owner("deepseek-r1")),
    )
    for p in pods:
        labels, ann = p["metadata"]["labels"], p["metadata"]["annotations"]
        assert labels[c.LABEL_SLOT] == "3"
        assert (labels[c.LABEL_REVISION], labels[c.LABEL_DOMAIN]) == ("rev1", DOMAIN)
        assert (ann[c.ANN_GROUP_SIZE], ann[c.ANN_GROUP_GPUS]) == ("8", "32")
        terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "In", "values": [DOMAIN]}]}
        ]
        assert p["spec"]["restartPolicy"] == "Never"


def test_a_1_gpu_aggregated_worker_is_one_pod_of_one_gpu_without_disaggregation_mode():
    spec = spec_of("aggregated-small.yaml")
    pods = b.group_pods(owner("llama-8b"), spec, "worker", 0, DOMAIN, "rev")
    assert len(pods) == 1
    assert gpus(pods[0]) == ("1", "1")
    args = pods[0]["spec"]["containers"][0]["args"]
    assert "--disaggregation-mode" not in args
    assert env(pods[0])[c.ENV_DISAGGREGATION_MODE] == "aggregated"
    assert env(pods[0])[c.ENV_WORLD_SIZE] == "1"


@pytest.mark.parametrize(("role", "mode"), [("prefill", "prefill"), ("decode", "decode")])
def test_disaggregated_pods_get_their_disaggregation_mode(role, mode):
    spec = spec_of("qwen3-235b-autoscaled.yaml")
    for pod in b.group_pods(owner("qwen3-235b"), spec, role, 0, DOMAIN, "rev"):
        args = pod["spec"]["containers"][0]["args"]
        i = args.index("--disaggregation-mode")
        assert args[i + 1] == mode
        assert env(pod)[c.ENV_DISAGGREGATION_MODE] == mode


def test_tolerations_follow_the_node_failure_toleration():
    spec = spec_of("aggregated-small.yaml", {"topology": {"nodeFailureTolerationSeconds": 7}})
    [pod] = b.group_pods(owner("llama-8b"), spec, "worker", 0, DOMAIN, "rev")
    assert {(t["key"], t["effect"], t["tolerationSeconds"]) for t in pod["spec"]["tolerations"]} == {
        ("node.kubernetes.io/not-ready", "NoExecute", 7),
        ("node.kubernetes.io/unreachable", "NoExecute", 7),
    }


def test_user_resources_and_env_reach_the_worker_beside_the_derived_gpus():
    spec = spec_of(
        "llama-405b-multinode-tp.yaml",
        {
            "runtime": {
                "resources": {"requests": {"cpu": 16, "memory": "200Gi"}, "limits": {"memory": "220Gi"}},
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
            }
        },
    )
    pods = b.group_pods(owner("llama-405b"), spec, "worker", 0, DOMAIN, "rev")
    assert len(pods) == 4
    res = pods[0]["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "16", "memory": "200Gi", GPU: "4"}
    assert res["limits"] == {"memory": "220Gi", GPU: "4"}
    hf = [e for e in pods[0]["spec"]["containers"][0]["env"] if e["name"] == "HF_TOKEN"]
    assert hf == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


# ----------------------------------------------------------------------------------------------- drains


def _pods_of(example: str, drain: int | None) -> list[dict[str, Any]]:
    """Every worker pod of slot 0 of every role of an example (drainSeconds set when not None)."""
    spec = spec_of(example, {"serving": {"drainSeconds": drain}} if drain is not None else None)
    own = owner(load_example(example)["metadata"]["name"])
    return [pod for role, _ in spec.roles() for pod in b.group_pods(own, spec, role, 0, DOMAIN, "rev")]


@pytest.mark.parametrize("example", [p.name for p in example_paths()])
@pytest.mark.parametrize("drain", [None, 1, 0])
def test_only_a_groups_leader_pod_has_the_routable_readiness_gate_and_only_when_groups_drain(example, drain):
    # The operator takes a group out of routing through its leader's readiness gate; with drainSeconds 0
    # groups are deleted at once, and a gate nobody turns True would keep the pods from ever being Ready.
    for pod in _pods_of(example, drain):
        gates = pod["spec"].get("readinessGates")
        leader = pod["metadata"]["labels"][c.LABEL_RANK] == "0"
        if leader and drain != 0:
            assert gates == [{"conditionType": c.ROUTABLE_CONDITION}]
        else:
            assert gates is None, pod["metadata"]["name"]


@pytest.mark.parametrize(("drain", "grace"), [(None, 600 + 5 + 25), (1, 31), (86400, 86430), (0, 30)])
def test_every_worker_pod_drains_on_sigterm_within_its_grace_period(drain, grace):
    pods = _pods_of("deepseek-r1-disaggregated.yaml", drain)
    assert len(pods) == 2 + 8
    seconds = 600 if drain is None else drain
    for pod in pods:
        assert pod["spec"]["terminationGracePeriodSeconds"] == grace
        [container] = pod["spec"]["containers"]
        # The endpoint's removal reaches the routers before the engine hears SIGTERM ...
        assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": b.PRESTOP_SECONDS}}}
        assert b.PRESTOP_SECONDS == 5
        # ... then Dynamo finishes its requests for up to drainSeconds, inside the grace period.
        if seconds:
            assert env(pod)[c.ENV_DYN_SHUTDOWN_TIMEOUT] == str(seconds)
            assert c.ENV_DYN_SHUTDOWN_TIMEOUT == "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS"
            assert grace >= b.PRESTOP_SECONDS + seconds
        else:
            assert c.ENV_DYN_SHUTDOWN_TIMEOUT not in env(pod)


def test_the_frontend_has_no_drain_settings_of_the_workers():
    own = owner("deepseek-r1")
    dep = b.frontend_deployment(own, spec_of("deepseek-r1-disaggregated.yaml"))
    pod = dep["spec"]["template"]["spec"]
    assert "readinessGates" not in pod
    assert c.ENV_DYN_SHUTDOWN_TIMEOUT not in {e["name"] for e in pod["containers"][0]["env"]}


@pytest.mark.parametrize(("pods", "min_available"), [(16, 15), (8, 7), (2, 1), (1, 0), (0, 0)])
def test_a_roles_disruption_budget_lets_one_of_its_pods_go_at_a_time(pods, min_available):
    own = owner("deepseek-r1")
    pdb = b.pod_disruption_budget(own, "decode", pods)
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert (pdb["metadata"]["name"], pdb["metadata"]["namespace"]) == ("deepseek-r1-decode", "ml")
    assert pdb["metadata"]["labels"][c.LABEL_ROLE] == "decode"
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID
    assert pdb["spec"]["minAvailable"] == min_available
    # (a pod that is not Ready, e.g. a draining leader, may always be evicted)
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_roles_disruption_budget_selects_exactly_its_worker_pods():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    selector = b.pod_disruption_budget(own, "decode", 16)["spec"]["selector"]["matchLabels"]
    for role in ("prefill", "decode"):
        for revision in ("rev1", "rev2"):  # every generation of the role
            for pod in b.group_pods(own, spec, role, 0, DOMAIN, revision):
                selected = selector.items() <= pod["metadata"]["labels"].items()
                assert selected == (role == "decode"), pod["metadata"]["name"]
    frontend = b.frontend_deployment(own, spec)["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= frontend.items()
    other = b.group_pods(owner("other"), spec, "decode", 0, DOMAIN, "rev1")[0]
    assert not selector.items() <= other["metadata"]["labels"].items()


# --------------------------------------------------------------------------------------------- revision


REVISION_CHANGES = {
    "image": {"runtime": {"image": "ghcr.io/tokenfab/worker:0.2.0"}},
    "runtime engine arg": {"runtime": {"extraEngineArgs": {"kv_cache_config": {"dtype": "auto"}}}},
    "role engine arg": {"decode": {"extraEngineArgs": {"cuda_graph_config": {"enable_padding": False}}}},
    "role batch size": {"decode": {"maxBatchSize": 128}},
    "mtp depth": {"speculativeDecoding": {"mtpDepth": 2}},
    "model revision": {"model": {"revision": "main"}},
}


@pytest.mark.parametrize("change", sorted(REVISION_CHANGES))
def test_revision_changes_with_what_shapes_the_pods(change):
    before = spec_of("deepseek-r1-disaggregated.yaml")
    after = spec_of("deepseek-r1-disaggregated.yaml", REVISION_CHANGES[change])
    assert b.role_revision(after, "decode") != b.role_revision(before, "decode")
    # Prefill and decode of a disaggregated deployment are one generation: they always share a revision.
    assert b.role_revision(after, "prefill") == b.role_revision(after, "decode")


@pytest.mark.parametrize(
    ("example", "role", "rolled"),
    [
        # Disaggregated: a change to either role rolls both (a new generation of prefill and decode comes up
        # together in its own Dynamo namespace), though only the changed role's engine config differs.
        ("deepseek-r1-disaggregated.yaml", "decode", ("prefill", "decode")),
        ("deepseek-r1-disaggregated.yaml", "prefill", ("prefill", "decode")),
        ("qwen3-235b-autoscaled.yaml", "decode", ("prefill", "decode")),
        # Aggregated: the worker role is its own generation.
        ("aggregated-small.yaml", "worker", ("worker",)),
        ("llama-405b-multinode-tp.yaml", "worker", ("worker",)),
    ],
)
def test_a_role_level_engine_arg_rolls_that_roles_generation(example, role, rolled):
    before = spec_of(example)
    after = spec_of(example, {role: {"extraEngineArgs": {"x": 1}}})
    roles = [r for r, _ in before.roles()]
    assert sorted(roles) == sorted(rolled)
    for r in roles:
        assert b.role_revision(after, r) != b.role_revision(before, r), r
        assert (engine_config(after, r) != engine_config(before, r)) == (r == role), r
    assert len({b.role_revision(after, r) for r in roles}) == 1
    assert len({b.role_revision(before, r) for r in roles}) == 1


def test_an_aggregated_revision_is_not_a_disaggregated_generations():
    # The same inputs hashed alone (aggregated) and as a generation (disaggregated) differ, and the
    # generation's hash covers both roles' inputs.
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    generation = b.role_revision(spec, "decode")
    assert generation != content_hash(_revision_inputs(spec, "decode"))
    assert generation == content_hash({r: _revision_inputs(spec, r) for r in ("prefill", "decode")})


@pytest.mark.parametrize(
    "patch",
    [
        {"decode": {"replicas": 7}},
        {"serving": {"frontendReplicas": 3}},
        {"serving": {"prefillDecodeRatio": "1:4"}},
        {"topology": {"placement": "spread"}},
    ],
    ids=["decode replicas", "frontend replicas", "ratio", "placement"],
)
def test_revision_ignores_counts_and_placement(patch):
    before = spec_of("deepseek-r1-disaggregated.yaml")
    after = spec_of("deepseek-r1-disaggregated.yaml", patch)
    for role in ("prefill", "decode"):
        assert b.role_revision(after, role) == b.role_revision(before, role)


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
    assert b.spec_groups(spec) == {"prefill": prefill, "decode": decode}


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
    assert b.spec_groups(spec) == {"prefill": 4, "decode": 9}


def test_independent_ratio_policy_keeps_prefill_replicas():
    spec = spec_of("qwen3-235b-autoscaled.yaml", {"prefill": {"replicas": 5}, "decode": {"replicas": 1}})
    assert b.spec_groups(spec) == {"prefill": 5, "decode": 1}


def test_a_role_without_replicas_has_one_group():
    spec = spec_of("aggregated-small.yaml", {"worker": {"replicas": None}})
    assert b.spec_groups(spec) == {"worker": 1}


# ------------------------------------------------------------------------------------------ engine config


def test_deepseek_engine_configs():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    mtp = {"decoding_type": "MTP", "max_draft_len": 3}
    assert engine_config(spec, "prefill") == {
        "cache_transceiver_config": {"backend": "DEFAULT"},
        "disable_overlap_scheduler": True,
        "enable_attention_dp": True,
        "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.85},
        "max_batch_size": 8,
        "max_num_tokens": 16384,
        "moe_config": {"backend": "AUTO"},
        "moe_expert_parallel_size": 8,
        "pipeline_parallel_size": 1,
        "speculative_config": mtp,
        "tensor_parallel_size": 8,
    }
    assert engine_config(spec, "decode") == {
        "cache_transceiver_config": {"backend": "DEFAULT"},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": 256},
        "enable_attention_dp": True,
        "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.85},
        "max_batch_size": 256,
        "max_num_tokens": 1024,
        "moe_config": {"backend": "AUTO"},
        "moe_expert_parallel_size": 32,
        "pipeline_parallel_size": 1,
        "speculative_config": mtp,
        "tensor_parallel_size": 32,
    }


def test_aggregated_engine_config_has_no_kv_transfer_and_no_mtp_by_default():
    cfg = engine_config(spec_of("aggregated-small.yaml"), "worker")
    assert cfg == {
        "enable_attention_dp": False,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
        "max_batch_size": 64,
        "moe_expert_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "tensor_parallel_size": 1,
    }


def test_extra_engine_args_merge_runtime_then_role_with_nested_dicts_merged():
    spec = spec_of(
        "aggregated-small.yaml",
        {
            "runtime": {
                "extraEngineArgs": {
                    "kv_cache_config": {"dtype": "fp8", "enable_block_reuse": True},
                    "backend": "pytorch",
                    "print_iter_log": True,
                }
            },
            "worker": {
                "extraEngineArgs": {
                    "kv_cache_config": {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.5},
                    "print_iter_log": False,
                }
            },
        },
    )
    cfg = engine_config(spec, "worker")
    assert cfg["kv_cache_config"] == {
        "dtype": "fp8",  # runtime level, untouched by the role
        "enable_block_reuse": False,  # role level wins over runtime level
        "free_gpu_memory_fraction": 0.5,  # role level wins over tokenfab's default
    }
    assert (cfg["backend"], cfg["print_iter_log"]) == ("pytorch", False)


def test_first_class_fields_win_over_extra_engine_args():
    # The API refuses these keys; a spec that slipped past validation must still not override them.
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    spec.runtime.extra_engine_args.update(tensor_parallel_size=1, max_batch_size=1, enable_attention_dp=False)
    assert spec.decode is not None
    spec.decode.extra_engine_args.update(
        moe_expert_parallel_size=2, speculative_config={"decoding_type": "Eagle"}, max_num_tokens=1
    )
    cfg = engine_config(spec, "decode")
    assert (cfg["tensor_parallel_size"], cfg["max_batch_size"], cfg["enable_attention_dp"]) == (32, 256, True)
    assert (cfg["moe_expert_parallel_size"], cfg["max_num_tokens"]) == (32, 1024)
    assert cfg["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 3}


def test_user_defaults_of_a_role_do_not_leak_into_another_role():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    assert "cuda_graph_config" not in engine_config(spec, "prefill")


def test_render_gives_the_text_of_its_config_also_once_kept():
    """The engine YAML is kept by the config's content: an equal config gets the same text, a config
    changed in place gets its own, and the text is PyYAML's safe_dump of the config."""
    cfg = engine_config(spec_of("deepseek-r1-disaggregated.yaml"), "decode")
    cfg["note"] = "ünïcode, 1e-5 and a: colon"
    cfg["fraction"] = 1e-5
    first = render(cfg)
    assert first == yaml.safe_dump(cfg, sort_keys=True)
    assert render(dict(reversed(list(cfg.items())))) == first
    cfg["max_batch_size"] = 7
    assert render(cfg) != first
    assert yaml.safe_load(render(cfg))["max_batch_size"] == 7


def test_engine_configmap_holds_the_rendered_engine_config_under_its_revisions_name():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    rev = b.role_revision(spec, "decode")
    cm = b.engine_configmap(own, spec, "decode")
    assert (
        cm["metadata"]["name"]
        == f"deepseek-r1-decode-engine-{rev}"
        == b.engine_configmap_name(own, "decode", rev)
    )
    labels = cm["metadata"]["labels"]
    assert (labels[c.LABEL_ROLE], labels[c.LABEL_REVISION]) == ("decode", rev)
    assert yaml.safe_load(cm["data"][c.ENGINE_CONFIG_FILE]) == engine_config(spec, "decode")
    # The pods of a revision mount that revision's ConfigMap, so a rollout never rewrites the engine
    # config under the old generation's pods: the new revision gets a ConfigMap of its own.
    for revision in (rev, "0123456789"):
        for pod in b.group_pods(own, spec, "decode", 0, DOMAIN, revision):
            [vol] = [v for v in pod["spec"]["volumes"] if v["name"] == "engine"]
            assert vol["configMap"]["name"] == f"deepseek-r1-decode-engine-{revision}"
    after = spec_of("deepseek-r1-disaggregated.yaml", {"decode": {"maxBatchSize": 128}})
    new = b.engine_configmap(own, after, "decode")
    assert new["metadata"]["name"] != cm["metadata"]["name"]
    assert new["metadata"]["name"] == f"deepseek-r1-decode-engine-{b.role_revision(after, 'decode')}"
    # (prefill's engine config is unchanged, but it is a new generation too: a ConfigMap of its own)
    assert (
        b.engine_configmap(own, after, "prefill")["metadata"]["name"]
        != b.engine_configmap(own, spec, "prefill")["metadata"]["name"]
    )


def test_each_generation_has_its_own_dynamo_namespace_and_the_frontend_routes_to_every_one():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    rev = b.role_revision(spec, "decode")
    prefix = b.dynamo_namespace_prefix(own)
    assert prefix.startswith("ml-deepseek-r1-")  # (readable: the deployment's namespace and name first)
    namespaces = {}
    for revision in (rev, "fedcba9876"):
        for role in ("prefill", "decode"):
            for pod in b.group_pods(own, spec, role, 0, DOMAIN, revision):
                namespaces.setdefault(revision, set()).add(env(pod)[c.ENV_DYNAMO_NAMESPACE])
    # One namespace per generation, shared by its prefill and decode workers; all under the prefix.
    assert namespaces == {rev: {f"{prefix}{rev[:8]}"}, "fedcba9876": {f"{prefix}fedcba98"}}
    assert b.dynamo_namespace(own, rev) == f"{prefix}{rev[:8]}"
    frontend = b.frontend_deployment(own, spec)["spec"]["template"]["spec"]["containers"][0]
    args = frontend["args"]
    assert args[args.index("--namespace-prefix") + 1] == prefix
    assert {e["name"]: e.get("value") for e in frontend["env"]}[c.ENV_DYNAMO_NAMESPACE] == prefix


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("ml", "llama"), ("ml", "llama-guard")),  # a name that extends another past "-g"
        (("ml", "qwen"), ("ml", "qwen-g2")),
        (("ml", "x-y"), ("ml-x", "y")),  # namespace and name joined by "-" alike
        (("a", "b"), ("a", "b")),
    ],
)
def test_a_frontend_never_discovers_another_deployments_workers(one, other):
    # The frontend discovers every Dynamo namespace that starts with its prefix (Dynamo's
    # --namespace-prefix is a plain string prefix), so no generation of another deployment may start with it.
    a, z = b.Owner(one[1], one[0], UID), b.Owner(other[1], other[0], UID)
    for rev in ("0123456789", "abcdef0123"):
        if (a.namespace, a.name) == (z.namespace, z.name):
            assert b.dynamo_namespace(z, rev).startswith(b.dynamo_namespace_prefix(a))
            continue
        assert not b.dynamo_namespace(z, rev).startswith(b.dynamo_namespace_prefix(a))
        assert not b.dynamo_namespace(a, rev).startswith(b.dynamo_namespace_prefix(z))


# -------------------------------------------------------------------------------------- shared children


def test_every_child_is_owned_by_the_model_deployment():
    for variant, (example, patch) in VARIANTS.items():
        for doc in render_children(example, patch):
            refs = doc["metadata"]["ownerReferences"]
            assert refs == [
                {
                    "apiVersion": "tokenfab.dev/v1alpha1",
                    "kind": "ModelDeployment",
                    "name": load_example(example)["metadata"]["name"],
                    "uid": UID,
                    "controller": True,
                }
            ], variant
            assert doc["metadata"]["namespace"] == "ml"


def test_workers_service_selects_every_worker_pod_and_publishes_ready_ones_for_discovery():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    svc = b.workers_service(own, spec)
    assert svc["spec"]["clusterIP"] == "None"
    # Dynamo's kubernetes discovery routes to a pod only while its EndpointSlice entry is ready: a draining
    # leader (readiness gate False) or a terminating pod must not be published as ready.
    assert "publishNotReadyAddresses" not in svc["spec"]
    # Dynamo 1.6.1 watches EndpointSlices by this label, which the EndpointSlice controller copies from
    # the Service
    assert svc["metadata"]["labels"]["nvidia.com/dynamo-discovery-enabled"] == "true"
    for role in ("prefill", "decode"):
        for pod in b.group_pods(own, spec, role, 0, DOMAIN, "rev"):
            labels = pod["metadata"]["labels"]
            assert svc["spec"]["selector"].items() <= labels.items()
            port = svc["spec"]["ports"][0]["targetPort"]
            assert port in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    etcd = spec_of("deepseek-r1-disaggregated.yaml", VARIANTS["deepseek-r1-disaggregated-etcd"][1])
    assert "nvidia.com/dynamo-discovery-enabled" not in b.workers_service(own, etcd)["metadata"]["labels"]


def test_frontend_service_selects_the_frontend_pods_only():
    own = owner("llama-405b")
    spec = spec_of("llama-405b-multinode-tp.yaml")
    dep, svc = b.frontend_deployment(own, spec), b.frontend_service(own)
    template = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"]["matchLabels"] == template
    assert svc["spec"]["selector"].items() <= template.items()
    pod = b.group_pods(own, spec, "worker", 0, DOMAIN, "rev")[0]
    assert not svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert b.endpoint(own) == "http://llama-405b.ml.svc.cluster.local:8000/v1"


# ------------------------------------------------------------------------------------------ discovery


def _value_from(container: dict[str, Any], name: str) -> Any:
    return next(e for e in container["env"] if e["name"] == name).get("valueFrom")


def test_workers_and_frontend_use_kubernetes_discovery_with_their_pod_identity():
    """Dynamo defaults to etcd at localhost: every process gets the backend and the downward-API identity
    its DynamoWorkerMetadata is named after and owned by (a wrong POD_UID would hide the worker)."""
    own, spec = owner("deepseek-r1"), spec_of("deepseek-r1-disaggregated.yaml")
    worker = b.group_pods(own, spec, "decode", 0, DOMAIN, "rev")[0]
    frontend = b.frontend_deployment(own, spec)["spec"]["template"]
    for pod_spec in (worker["spec"], frontend["spec"]):
        ctr = pod_spec["containers"][0]
        values = {e["name"]: e.get("value") for e in ctr["env"]}
        assert values[c.ENV_DYN_DISCOVERY_BACKEND] == "kubernetes"
        assert values[c.ENV_DYN_REQUEST_PLANE] == "tcp"
        assert values[c.ENV_DYN_EVENT_PLANE] == "zmq"
        assert c.ENV_ETCD_ENDPOINTS not in values
        for name, path in (
            (c.ENV_POD_NAME, "metadata.name"),
            (c.ENV_POD_NAMESPACE, "metadata.namespace"),
            (c.ENV_POD_UID, "metadata.uid"),
        ):
            assert _value_from(ctr, name) == {"fieldRef": {"fieldPath": path}}
        assert pod_spec["serviceAccountName"] == "deepseek-r1-dynamo"
        assert pod_spec["automountServiceAccountToken"] is True
    assert env(worker)[c.ENV_POD_UID] == f"uid-of-{worker['metadata']['name']}"


def test_etcd_discovery_needs_no_token_and_names_the_endpoints():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml", VARIANTS["deepseek-r1-disaggregated-etcd"][1])
    pod = b.group_pods(own, spec, "prefill", 0, DOMAIN, "rev")[0]
    assert env(pod)[c.ENV_DYN_DISCOVERY_BACKEND] == "etcd"
    assert env(pod)[c.ENV_ETCD_ENDPOINTS] == "http://etcd.dynamo-system:2379"
    assert c.ENV_POD_UID not in env(pod)
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod["spec"]
    assert b.discovery_rbac(own, spec) == []


def test_the_discovery_role_grants_what_dynamo_does_and_nothing_else():
    own, spec = owner("deepseek-r1"), spec_of("deepseek-r1-disaggregated.yaml")
    sa, role, binding = b.discovery_rbac(own, spec)
    assert (sa["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "Role", "RoleBinding")
    assert sa["metadata"]["name"] == role["metadata"]["name"] == binding["metadata"]["name"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    # Dynamo 1.6.1 (read from its API server audit): list/watch EndpointSlices; create (by server-side
    # apply), patch, list, watch its DynamoWorkerMetadata. No update, delete, secrets or pods.
    assert ("discovery.k8s.io", "endpointslices", "watch") in granted
    assert ("nvidia.com", "dynamoworkermetadatas", "create") in granted
    assert ("nvidia.com", "dynamoworkermetadatas", "patch") in granted
    assert not {v for _, _, v in granted} & {"delete", "deletecollection", "update", "*", "escalate", "bind"}
    assert {r for _, r, _ in granted} == {"endpointslices", "dynamoworkermetadatas"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "deepseek-r1-dynamo",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "deepseek-r1-dynamo", "namespace": "ml"}
    ]


def test_workers_publish_kv_events_and_metrics():
    """Both are off in Dynamo by default: without them the KV router routes blind and no KV series exists."""
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    for role in ("prefill", "decode"):
        args = b.worker_args(spec, role)
        assert c.PUBLISH_KV_EVENTS_FLAG in args
        assert c.PUBLISH_METRICS_FLAG in args


# ---------------------------------------------------------------------------------------- model cache


def test_hf_weights_go_to_a_per_node_cache_claim_that_declares_its_size():
    """Every pod on one node mounts the same claim (weights downloaded once per node, kept across pods
    and restarts); pods on other nodes mount theirs."""
    own, spec = owner("deepseek-r1"), spec_of("deepseek-r1-disaggregated.yaml")
    nodes = [f"gb200-r00-t{i:02d}" for i in range(8)]
    pods = b.group_pods(own, spec, "decode", 0, DOMAIN, "rev", nodes)
    claims = b.model_cache_claims(own, spec, b.pinned_nodes(pods))
    assert len(claims) == 8
    for pod, node in zip(pods, nodes, strict=True):
        vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
        assert vol["persistentVolumeClaim"]["claimName"] == b.model_cache_claim_name(own, spec, node)
        mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "model-cache")
        assert mount["mountPath"] == c.MODEL_CACHE_DIR
        assert env(pod)[c.ENV_MODEL_CACHE] == c.MODEL_CACHE_DIR
        assert env(pod)[c.ENV_MODEL_REVISION] == spec.model.revision
    claim = claims[0]
    assert claim["spec"]["storageClassName"] == "local-nvme"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Ti"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # a second group on the same node shares the claim
    again = b.group_pods(own, spec, "decode", 1, DOMAIN, "rev", nodes)
    assert {v["persistentVolumeClaim"]["claimName"] for p in again for v in p["spec"]["volumes"]
            if v["name"] == "model-cache"} == {c["metadata"]["name"] for c in claims}  # fmt: skip


def test_without_a_storage_class_the_cache_is_a_sized_empty_dir_and_pvc_weights_need_none():
    own = owner("deepseek-r1")
    spec = spec_of("deepseek-r1-disaggregated.yaml", {"model": {"cache": {"storageClassName": None}}})
    pod = b.group_pods(own, spec, "prefill", 0, DOMAIN, "rev", ["n1", "n2"])[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-cache")
    assert vol == {"name": "model-cache", "emptyDir": {"sizeLimit": "1Ti"}}
    assert b.model_cache_claims(own, spec, b.pinned_nodes([pod])) == []
    pvc = spec_of("qwen3-235b-autoscaled.yaml")
    pod = b.group_pods(owner("q"), pvc, "prefill", 0, DOMAIN, "rev")[0]
    assert "model-cache" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert c.ENV_MODEL_CACHE not in env(pod)


def test_extended_resources_in_limits_are_requested_too_so_the_ledger_counts_them():
    """The GB200 RDMA NICs (runtime.resources.limits rdma/ib): Kubernetes takes the limit as the request,
    and so must placement, or it would put four such pods on one tray's four NICs."""
    spec = spec_of(
        "llama-405b-multinode-tp.yaml",
        {"runtime": {"resources": {"limits": {"rdma/ib": 4}}, "addCapabilities": ["IPC_LOCK"]}},
    )
    requests, limits = b.worker_resources(spec, "worker")
    assert requests["rdma/ib"] == limits["rdma/ib"] == "4"
    assert b.pod_requests(spec, "worker")["rdma/ib"] == 4
    pod = b.group_pods(owner("l"), spec, "worker", 0, DOMAIN, "rev")[0]
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


def test_runtime_env_may_set_the_discovery_backend_and_planes_itself():
    """Before serving.discovery, etcd was set in runtime.env: such a spec stays valid, and its value is the
    only one (a second definition of a name would hide the first)."""
    spec = spec_of(
        "deepseek-r1-disaggregated.yaml",
        {"runtime": {"env": [{"name": "DYN_DISCOVERY_BACKEND", "value": "etcd"},
                             {"name": "ETCD_ENDPOINTS", "value": "http://etcd:2379"}]}},
    )  # fmt: skip
    pod = b.group_pods(owner("deepseek-r1"), spec, "decode", 0, DOMAIN, "rev")[0]
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count("DYN_DISCOVERY_BACKEND") == 1
    assert env(pod)["DYN_DISCOVERY_BACKEND"] == "etcd"
    assert env(pod)["ETCD_ENDPOINTS"] == "http://etcd:2379"
    assert len(names) == len(set(names)), "no variable defined twice"


@pytest.mark.parametrize("example", [p.name for p in example_paths()])
def test_every_worker_writes_its_compile_caches_under_a_writable_mount(example):
    """The root filesystem is read-only: each cache that would default outside ~/.cache and /tmp
    (contract.COMPILE_CACHE_ENV) is moved under a writable emptyDir the container mounts."""
    spec = spec_of(example)
    pods = [p for role, _ in spec.roles() for p in b.group_pods(owner("m"), spec, role, 0, DOMAIN, "rev")]
    for pod in pods:
        ctr = pod["spec"]["containers"][0]
        assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
        values = env(pod)
        writable = [m["mountPath"] for m in ctr["volumeMounts"] if not m.get("readOnly")]
        for name, _ in c.COMPILE_CACHE_ENV:
            assert any(values[name].startswith(f"{w}/") for w in writable), (name, values[name], writable)
