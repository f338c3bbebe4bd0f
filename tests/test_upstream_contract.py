"""tokenfab's contract with the software it drives, checked against the pinned packages themselves, so a test
fails when either side drifts:

- the worker and frontend command lines tokenfab renders (every example and variant), with the pods' own
  environment, parsed by NVIDIA Dynamo 1.6.1's argument parsers (testing/dynamo_parse.py, run by
  the Python of the pinned ai-dynamo);
- every DYN_* variable tokenfab sets is one the ai-dynamo 1.6.1 package reads (its Python sources, or its
  compiled runtime), and none is one it declares deprecated;
- the engine YAML's keys and values are TensorRT-LLM LLM-API fields of the version ai-dynamo 1.6.1 pins
  (tests/data/upstream/tensorrt_llm.json, with its source);
- the metric names the autoscaler queries are the names Dynamo's worker and frontend export
  (dynamo.prometheus_names, and TensorRT-LLM's MetricsCollector for trtllm_*);
- the hub calls the launcher makes (snapshot_download, HfApi.model_info, disable_progress_bars) are in the
  huggingface_hub ai-dynamo 1.6.1 brings.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from testing.cases import VARIANTS, env, rendered, spec_of
from testing.upstream import DYNAMO_PYTHON, dynamo_site, parse_all
from tokenfab.adapters import metrics
from tokenfab.api.models import RESERVED_ENGINE_KEYS
from tokenfab.planning import builders, contract
from tokenfab.planning.engine_config import engine_config

ROOT = Path(__file__).resolve().parents[1]
TRTLLM = json.loads((ROOT / "tests" / "data" / "upstream" / "tensorrt_llm.json").read_text())
# Variables ai-dynamo 1.6.1 logs as "deprecated and no longer used" that still decide its behaviour.
STILL_EFFECTIVE = {
    contract.ENV_DYN_HEALTH_ENDPOINTS: "without it a worker's /health stays 503 (status notready, every "
    "endpoint ready) for ever, so its pod never becomes Ready and never routable; with it /health is 200 "
    "within a second (dynamo.mocker 1.6.1, measured)",
}
# Engine YAML sections and the LLM-API class each is validated as.
SECTIONS = {
    "kv_cache_config": "KvCacheConfig",
    "moe_config": "MoeConfig",
    "cuda_graph_config": "CudaGraphConfig",
    "cache_transceiver_config": "CacheTransceiverConfig",
}


@pytest.mark.slow
def test_rendered_command_lines_parse_with_dynamo_1_6_1():
    """The real parsers, with the pod's environment (downward API resolved), read what tokenfab meant."""
    cases, expected = [], []
    for variant, role, pod, spec in rendered():
        ctr = pod["spec"]["containers"][0]
        environ = {k: v for k, v in env(pod).items() if v is not None}
        if role == "frontend":
            cases.append({"kind": "frontend", "argv": ctr["args"], "env": environ})
            expected.append(
                (
                    variant,
                    role,
                    {
                        "http_port": contract.FRONTEND_PORT,
                        "router_mode": spec.serving.router_mode,
                        "namespace_prefix": ctr["args"][ctr["args"].index("--namespace-prefix") + 1],
                        "discovery_backend": spec.serving.discovery,
                        "request_plane": contract.REQUEST_PLANE,
                    },
                )
            )
            continue
        assert ctr["command"] == [contract.PYTHON, "-m", contract.LAUNCHER_MODULE]
        cases.append({"kind": "worker", "argv": ctr["args"], "env": environ})
        mode = "prefill" if role == "prefill" and spec.serving.mode == "disaggregated" else None
        expected.append(
            (
                variant,
                role,
                {
                    "model": builders.model_path(spec),
                    "served_model_name": spec.model.name,
                    "extra_engine_args": contract.ENGINE_CONFIG_PATH,
                    "publish_kv_events": True,
                    "publish_metrics": True,
                    "discovery_backend": spec.serving.discovery,
                    "request_plane": contract.REQUEST_PLANE,
                    "namespace": environ[contract.ENV_DYNAMO_NAMESPACE],
                    "component": mode or "backend",
                },
            )
        )
    results = parse_all(cases)
    assert len(results) == len(cases)
    for (variant, role, want), got in zip(expected, results, strict=True):
        assert "error" not in got, f"{variant} {role}: {got['error']}"
        parsed = got["parsed"]
        for key, value in want.items():
            assert parsed[key] == value, f"{variant} {role}: {key} = {parsed[key]!r}, meant {value!r}"


@pytest.mark.slow
def test_the_parsers_refuse_what_dynamo_does_not_know():
    """The probe can fail: a renamed flag is refused by the same parsers (so the test above means it)."""
    results = parse_all(
        [
            {"kind": "worker", "argv": ["--model-path", "m", "--publish-events-and-metricz"], "env": {}},
            {"kind": "frontend", "argv": ["--http-port", "8000", "--namespace-prefixes", "x"], "env": {}},
            {"kind": "mocker", "argv": ["--model-path", "m", "--num-gpu-blocks", "x"], "env": {}},
        ]
    )
    assert all("error" in r for r in results), results


def _set_dyn_variables() -> set[str]:
    names = set()
    for _variant, _role, pod, _spec in rendered():
        names |= {e["name"] for e in pod["spec"]["containers"][0]["env"] if e["name"].startswith("DYN_")}
    return names


@pytest.mark.slow
def test_the_kubernetes_discovery_names_tokenfab_relies_on_are_in_dynamos_runtime():
    """The pod identity variables, the EndpointSlice label and the metadata object's group, version and
    plural are all in the compiled runtime of the pinned ai-dynamo (its kubernetes discovery backend)."""
    runtime = b"".join(p.read_bytes() for p in dynamo_site().glob("_core*.so"))
    names = [
        *(
            contract.ENV_POD_NAME,
            contract.ENV_POD_UID,
            contract.ENV_POD_NAMESPACE,
            contract.ENV_ETCD_ENDPOINTS,
            contract.DISCOVERY_KUBERNETES,
        ),
        *(
            *contract.DISCOVERY_LABELS,
            contract.DYNAMO_METADATA_API,
            contract.DYNAMO_METADATA_KIND,
            contract.DYNAMO_METADATA_PLURAL,
        ),
    ]
    missing = [n for n in names if n.encode() not in runtime]
    assert not missing, f"not in ai-dynamo-runtime 1.6.1: {missing}"


@pytest.mark.slow
def test_every_dyn_variable_tokenfab_sets_is_read_by_dynamo_1_6_1():
    site = dynamo_site()
    names = _set_dyn_variables()
    assert {
        contract.ENV_DYN_DISCOVERY_BACKEND,
        contract.ENV_DYN_SYSTEM_PORT,
        contract.ENV_DYNAMO_NAMESPACE,
    } <= names
    sources = "\n".join(p.read_text(errors="replace") for p in site.rglob("*.py"))
    runtime = b"".join(p.read_bytes() for p in site.glob("_core*.so"))
    assert runtime, f"no compiled runtime under {site}"
    unknown = [n for n in sorted(names) if not re.search(rf"\b{n}\b", sources) and n.encode() not in runtime]
    assert not unknown, f"DYN_* variables the pinned ai-dynamo does not read: {unknown}"
    # Nor one it says it ignores, unless measured otherwise (kept with the reason, so that a release that
    # stops warning, or warns about another, fails here and is looked at).
    deprecated = {n for n in names if f"{n} is deprecated and no longer used".encode() in runtime}
    assert deprecated == set(STILL_EFFECTIVE), f"DYN_* variables ai-dynamo 1.6.1 calls unused: {deprecated}"


def test_engine_yaml_keys_and_values_are_tensorrt_llm_fields():
    fields = TRTLLM["fields"]
    for variant, (example, patch) in VARIANTS.items():
        spec = spec_of(example, patch)
        for role, _ in spec.roles():
            cfg = engine_config(spec, role)
            unknown = set(cfg) - set(fields["TorchLlmArgs"])
            assert not unknown, f"{variant} {role}: not LLM-API fields: {unknown}"
            for section, cls in SECTIONS.items():
                extra = set(cfg.get(section) or {}) - set(fields[cls])
                assert not extra, f"{variant} {role}: {section} keys {extra} are not {cls} fields"
            spec_cfg = cfg.get("speculative_config")
            if spec_cfg:
                assert spec_cfg["decoding_type"] in TRTLLM["values"]["speculative_config.decoding_type"]
                assert set(spec_cfg) - {"decoding_type"} <= set(fields["MTPDecodingConfig"])
            moe = (cfg.get("moe_config") or {}).get("backend")
            assert moe is None or moe in TRTLLM["values"]["MoeConfig.backend"], (
                f"{variant}: moe backend {moe}"
            )
            transceiver = (cfg.get("cache_transceiver_config") or {}).get("backend")
            assert transceiver is None or transceiver in TRTLLM["values"]["CacheTransceiverConfig.backend"]


def test_the_engine_keys_tokenfab_owns_are_tensorrt_llm_fields():
    """The keys refused in extraEngineArgs (tokenfab writes them) exist: a rename would leave a hole."""
    torch = set(TRTLLM["fields"]["TorchLlmArgs"])
    assert set(RESERVED_ENGINE_KEYS) <= torch, set(RESERVED_ENGINE_KEYS) - torch


@pytest.mark.slow
def test_the_metric_names_the_autoscaler_reads_are_dynamos():
    """Dynamo's own name constants (dynamo.prometheus_names, which its Rust and Python exporters share)
    compose the names tokenfab queries; trtllm_* names are TensorRT-LLM's MetricsCollector's."""
    program = (
        "import json; from dynamo import prometheus_names as p; print(json.dumps({"
        "'kv': p.name_prefix.COMPONENT + '_' + p.kvstats.GPU_CACHE_USAGE_PERCENT,"
        "'dp_rank': p.labels.DP_RANK,"
        "'inflight': p.name_prefix.COMPONENT + '_' + p.work_handler.INFLIGHT_REQUESTS,"
        "'started': p.name_prefix.FRONTEND + '_' + p.frontend_service.REQUESTS_STARTED_TOTAL,"
        "'finished': p.name_prefix.FRONTEND + '_' + p.frontend_service.REQUESTS_TOTAL,"
        "'statuses': [p.frontend_service.status.SUCCESS, p.frontend_service.status.ERROR],"
        "'frontend_inflight': p.name_prefix.FRONTEND + '_' + p.frontend_service.INFLIGHT_REQUESTS,"
        "'input_tokens': p.name_prefix.FRONTEND + '_' + p.frontend_service.INPUT_SEQUENCE_TOKENS}))"
    )
    dynamo_site()
    out = subprocess.run([str(DYNAMO_PYTHON), "-c", program], capture_output=True, text=True, check=True)
    names = json.loads(out.stdout)
    assert names["kv"] == metrics.KV_METRIC
    assert names["dp_rank"] == "dp_rank"
    assert names["inflight"] == metrics.INFLIGHT_METRIC
    assert names["started"] == metrics.FRONTEND_REQUESTS
    assert names["finished"] == metrics.FRONTEND_REQUESTS_TOTAL
    assert names["statuses"] == ["success", "error"]  # (the benchmarks' frontend counts by status)
    assert names["frontend_inflight"] == metrics.FRONTEND_INFLIGHT
    assert names["input_tokens"] + "_sum" == metrics.FRONTEND_INPUT_TOKENS
    assert metrics.QUEUE_METRIC in TRTLLM["metrics"]
    # Dynamo's TensorRT-LLM worker keeps TensorRT-LLM's own trtllm_ names on its /metrics.
    worker = (dynamo_site() / "trtllm" / "workers" / "llm_worker.py").read_text()
    assert '_metric_prefixes = ["trtllm_"]' in worker


def test_the_hub_calls_the_launcher_makes_are_in_the_pinned_huggingface_hub():
    """tokenfab.launcher.fetch asks huggingface_hub (the one ai-dynamo 1.6.1 brings) for a snapshot, a
    commit, and quiet progress bars: those names and keywords are there."""
    probe = (
        "import inspect, json, huggingface_hub as h; "
        "from huggingface_hub.utils import disable_progress_bars; "
        "print(json.dumps({'version': h.__version__, "
        "'snapshot_download': list(inspect.signature(h.snapshot_download).parameters), "
        "'model_info': list(inspect.signature(h.HfApi.model_info).parameters), "
        "'disable_progress_bars': callable(disable_progress_bars)}))"
    )
    out = subprocess.run(
        [str(DYNAMO_PYTHON), "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout)
    assert {"repo_id", "revision", "cache_dir", "local_files_only"} <= set(got["snapshot_download"]), got
    assert {"repo_id", "revision", "timeout"} <= set(got["model_info"]), got
    assert got["disable_progress_bars"] is True, got
