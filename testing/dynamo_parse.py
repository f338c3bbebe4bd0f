"""Parse tokenfab's command lines with NVIDIA Dynamo's own argument parsers (run with the Python of the
pinned ai-dynamo; see tests/test_upstream_contract.py).

Reads a JSON list of {"kind": "worker" | "frontend" | "mocker", "argv": [...], "env": {...}} on stdin and
prints one JSON object per case: the parsed settings, or {"error": ...}. Each case runs in a fresh process
(the parsers read and write os.environ). tensorrt_llm is not installable here: its parse-time use is the
defaults of four BaseLlmArgs fields, which a stub module provides (values as in TensorRT-LLM 1.3).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import types
from typing import Any

WORKER_KEYS = (
    "model",
    "served_model_name",
    "extra_engine_args",
    "disaggregation_mode",
    "publish_kv_events",
    "publish_metrics",
    "discovery_backend",
    "request_plane",
    "event_plane",
    "namespace",
    "component",
    "endpoint",
    "revision",
)
FRONTEND_KEYS = (
    "http_port",
    "router_mode",
    "namespace",
    "namespace_prefix",
    "discovery_backend",
    "request_plane",
    "event_plane",
)
MOCKER_KEYS = (
    "model_path",
    "model_name",
    "num_gpu_blocks",
    "block_size",
    "engine_type",
    "disaggregation_mode",
    "bootstrap_ports",
    "num_workers",
    "discovery_backend",
    "speedup_ratio",
)


def stub_tensorrt_llm() -> None:
    defaults = {"max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": None, "max_beam_width": 1}

    base = types.SimpleNamespace(
        model_fields={k: types.SimpleNamespace(default=v) for k, v in defaults.items()}
    )
    names = ("tensorrt_llm", "tensorrt_llm.llmapi", "tensorrt_llm.llmapi.llm_args")
    trt, llmapi, llm_args = (types.ModuleType(n) for n in names)
    trt.__path__, llmapi.__path__ = [], []  # type: ignore[attr-defined]
    llm_args.BaseLlmArgs = base  # type: ignore[attr-defined]
    trt.llmapi, llmapi.llm_args = llmapi, llm_args  # type: ignore[attr-defined]
    sys.modules.update({m.__name__: m for m in (trt, llmapi, llm_args)})


def plain(value: Any) -> Any:
    value = getattr(value, "value", value)
    return value if isinstance(value, (str, int, float, bool, list, type(None))) else repr(value)


def parse(case: dict[str, Any]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(case["env"])
    argv = list(case["argv"])
    if case["kind"] == "worker":
        stub_tensorrt_llm()
        from dynamo.trtllm.args import parse_args

        cfg = parse_args(argv)
        return {k: plain(getattr(cfg, k, None)) for k in WORKER_KEYS}
    if case["kind"] == "frontend":
        sys.argv = ["dynamo.frontend", *argv]
        from dynamo.frontend.main import parse_args as frontend_args

        config, _, _ = frontend_args()
        return {k: plain(getattr(config, k, None)) for k in FRONTEND_KEYS}
    from dynamo.mocker.args import parse_args as mocker_args

    ns = mocker_args(argv)
    return {k: plain(getattr(ns, k, None)) for k in MOCKER_KEYS}


def one(case: dict[str, Any]) -> dict[str, Any]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            return {"parsed": parse(case)}
    except SystemExit as exc:
        return {"error": f"exit {exc.code}: {err.getvalue()[-1500:]}"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc} {err.getvalue()[-1500:]}"}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(one(json.loads(sys.stdin.read())), default=repr))
        return
    out = []
    for case in json.loads(sys.stdin.read()):
        done = subprocess.run(
            [sys.executable, __file__, "--one"],
            input=json.dumps(case),
            capture_output=True,
            text=True,
            timeout=120,
        )
        out.append(json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-1500:]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
