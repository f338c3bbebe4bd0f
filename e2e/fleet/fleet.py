"""The live fleet's plumbing: tools (Dynamo and aiperf virtualenvs), the tiny local model, the runner
process, the ModelDeployment used by the scenario and the benchmark, and the Prometheus and status reads
the time series is made of."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.fleet import state
from e2e.helpers import get_json, kubectl, wait_for
from tokenfab.adapters import metrics
from tokenfab.planning import contract
from tokenfab_factory import lanes
from tokenfab_factory.factory import Factory

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TOKENFAB_CACHE", Path.home() / ".cache" / "tokenfab"))
VENVS = Path(os.environ.get("TOKENFAB_VENVS", CACHE / "venvs"))
MODEL_NAME = "tokenfab/tiny-llama"
MODEL_VERSION = "v1"
RUNNER = "fleet-runner"


@dataclass(frozen=True)
class Tools:
    dynamo_python: str
    aiperf: str


def tools() -> Tools:
    """The Dynamo and aiperf virtualenvs, installed by e2e/fleet/setup.sh when missing (idempotent)."""
    dyn, ap = VENVS / "dynamo" / "bin" / "python", VENVS / "aiperf" / "bin" / "aiperf"
    if not (
        (VENVS / "dynamo" / ".tokenfab-installed").exists()
        and (VENVS / "aiperf" / ".tokenfab-installed").exists()
    ):
        subprocess.run(["bash", str(ROOT / "e2e" / "fleet" / "setup.sh")], check=True)
    return Tools(str(dyn), str(ap))


def model_dir(t: Tools) -> Path:
    """The tiny local model (tokenizer trained here, no hub), generated once into the cache."""
    out = CACHE / "fleet-model" / MODEL_VERSION
    if not (out / ".complete").exists():
        subprocess.run([t.dynamo_python, str(ROOT / "e2e" / "fleet" / "model.py"), str(out)], check=True)
    return out


def state_dir(f: Factory) -> Path:
    return state.state_dir_of(f.run)


def start_runner(
    f: Factory,
    t: Tools,
    blocks_per_gpu: int = 48,
    speedup_ratio: float = 0.3,
    namespaces: tuple[str, ...] = (),
    start_delay: float = 0.0,
    name: str = "",
) -> int:
    """The fleet runner as a factory extra (the factory stops it by PID; it stops its children).
    `start_delay` holds each new engine back that long (a cold start); `name` runs a second runner."""
    argv = [
        sys.executable,
        "-m",
        "e2e.fleet.runner",
        "--kubeconfig",
        str(f.kubeconfig),
        "--state-dir",
        str(state_dir(f)),
        "--file-sd-dir",
        str(f.file_sd_dir),
        "--model-dir",
        str(model_dir(t)),
        "--dynamo-python",
        t.dynamo_python,
        "--blocks-per-gpu",
        str(blocks_per_gpu),
        "--speedup-ratio",
        str(speedup_ratio),
        *(["--namespaces", ",".join(namespaces)] if namespaces else []),
        *(["--start-delay", str(start_delay)] if start_delay else []),
        *_lane_ports(),
    ]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return f.start_extra(name or RUNNER, argv, env={"PYTHONPATH": pythonpath})


def _lane_ports() -> list[str]:
    """The runner's port ranges: its test lane's, so that runners of lanes side by side never meet."""
    (lo, hi), (slo, shi) = lanes.runner_ports()
    return ["--ports", f"{lo}-{hi}", "--system-ports", f"{slo}-{shi}"]


def runner_state(f: Factory) -> dict[str, Any]:
    return state.read_state(state_dir(f))


def frontend_url(f: Factory, namespace: str, name: str, timeout: float = 180) -> str:
    """Wait for the deployment's frontend process and for it to list the served model."""

    def ready() -> str | None:
        url = runner_state(f).get("frontends", {}).get(f"{namespace}/{name}")
        if not url:
            return None
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=3) as r:
                return str(url) if json.load(r).get("data") else None
        except OSError:
            return None

    return str(wait_for(f"the frontend of {namespace}/{name} serving the model", ready, timeout, 1.0))


def manifest(
    f: Factory,
    namespace: str,
    name: str,
    autoscaling: bool = True,
    decode_replicas: int = 1,
    max_decode: int = 4,
    target: float = 0.6,
    scale_down_window: int = 60,
    cache_class: str | None = None,
    prestage: int = 0,
) -> dict[str, Any]:
    """A small disaggregated deployment: decode groups of 2 GPUs, prefill groups of 1 GPU at 1:2.
    `cache_class`: keep the weights in a node-local model cache claim of that StorageClass on each node
    (model.cache.storageClassName), with `prestage` groups of headroom staged ahead of need; none: an
    emptyDir per pod, downloaded again by every pod."""
    model: dict[str, Any] = {"name": MODEL_NAME, "source": f"hf://{MODEL_NAME}"}
    if cache_class:
        model["cache"] = {"storageClassName": cache_class, "size": "20Gi", "prestageGroups": prestage}
    spec: dict[str, Any] = {
        "model": model,
        "serving": {
            "mode": "disaggregated",
            "routerMode": "kv",
            "prefillDecodeRatio": "1:2",
            "ratioPolicy": "fixed",
        },
        "prefill": {"parallelism": {"tensor": 1}},
        "decode": {"parallelism": {"tensor": 2}, "replicas": decode_replicas},
        "autoscaling": {
            "enabled": autoscaling,
            "prometheusUrl": f.prometheus_url,
            "targetKvCacheUtilization": target,
            "intervalSeconds": 5,
            "warmupSeconds": 10,
            "scaleDownStabilizationSeconds": scale_down_window,
            "maxStepUp": 2,
            "maxStepDown": 1,
            "decode": {"minReplicas": 1, "maxReplicas": max_decode},
        },
    }
    return {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# ------------------------------------------------------------------------------------------ reads


def prom(f: Factory, query: str) -> list[dict[str, Any]]:
    url = f"{f.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return list(json.load(r)["data"]["result"])
    except (OSError, ValueError, KeyError):
        return []


def by_group(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for row in rows:
        value = float(row["value"][1])
        if value == value:
            out[row["metric"].get(contract.PROM_LABEL_GROUP, "")] = value
    return out


def sel(namespace: str, name: str, role: str) -> str:
    deployment, role_label = contract.PROM_LABEL_DEPLOYMENT, contract.PROM_LABEL_ROLE
    return f'namespace="{namespace}", {deployment}="{name}", {role_label}="{role}"'


def kv_by_group(f: Factory, namespace: str, name: str, role: str) -> dict[str, float]:
    """The autoscaler's own signal: KV-cache utilization per group, as Prometheus has it."""
    return by_group(prom(f, metrics.kv_query(namespace, name, role)))


def requests_by_group(f: Factory, namespace: str, name: str, role: str) -> dict[str, float]:
    """Requests each group's engine has served (Dynamo's per-endpoint counter on the worker)."""
    q = (
        f"sum by ({contract.PROM_LABEL_GROUP}) "
        f"(dynamo_component_requests_total{{{sel(namespace, name, role)}, "
        'dynamo_endpoint="generate"})'
    )
    return by_group(prom(f, q))


def targets_up(f: Factory, namespace: str, name: str, role: str) -> int:
    rows = prom(f, f"sum(up{{{sel(namespace, name, role)}}})")
    return int(float(rows[0]["value"][1])) if rows else 0


def requests_started(url: str) -> int | None:
    """The frontend's own count of the requests it accepted (Dynamo's
    dynamo_frontend_requests_started_total, every model), read from its /metrics; None if it does not
    answer. The difference over a run is what the client sent."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] == metrics.FRONTEND_REQUESTS:
            total += float(line.rsplit(" ", 1)[1])
    return round(total)


def frontend_counts(url: str) -> dict[str, int] | None:
    """The frontend's own request counters, read from its /metrics (every model): `started`
    (dynamo_frontend_requests_started_total), `success` and `error` (dynamo_frontend_requests_total by its
    status label) and `inflight` (dynamo_frontend_inflight_requests, a gauge); None if it does not answer.
    The difference of two readings is what the frontend saw of a run."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return None
    out = {"started": 0.0, "success": 0.0, "error": 0.0, "inflight": 0.0}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        value = float(line.rsplit(" ", 1)[1])
        if name == metrics.FRONTEND_REQUESTS:
            out["started"] += value
        elif name == metrics.FRONTEND_REQUESTS_TOTAL:
            status = "success" if 'status="success"' in line else "error"
            out[status] += value
        elif name == metrics.FRONTEND_INFLIGHT:
            out["inflight"] += value
    return {k: round(v) for k, v in out.items()}


def frontend_delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """What the frontend counted between two readings (its in-flight gauge as of the second)."""
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in ("started", "success", "error")} | {
        "inflight": after["inflight"]
    }


def serving(f: Factory, namespace: str, name: str, timeout: float = 180) -> str:
    """Wait until the deployment serves: its frontend lists the model, then one small chat request is
    served end to end (retried while the router learns the workers; the engines export their KV gauges
    after their first request). Returns the frontend's URL. On a timeout the error says what the last
    try got, every role's ready groups, and the warnings and errors of the deployment's processes."""
    deadline = time.monotonic() + timeout
    try:
        url = frontend_url(f, namespace, name, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{process_warnings(f, namespace, name)}") from exc
    body = json.dumps(
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
    ).encode()
    last = "no try yet"
    while last == "no try yet" or time.monotonic() < deadline:  # (at least one try)
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                if r.status == 200:
                    return url
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
        except OSError as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(2.0)
    try:
        ready: Any = {
            role: (s or {}).get("readyGroups") for role, s in role_status(f, namespace, name).items()
        }
    except Exception as exc:  # (the status read failing must not hide what timed out)
        ready = f"not read: {exc}"
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for a first request served end to end by "
        f"{namespace}/{name} (last try: {last}; ready groups: {ready})\n"
        + process_warnings(f, namespace, name)
    )


def process_warnings(f: Factory, namespace: str, name: str, lines: int = 12) -> str:
    """The last warnings and errors each of the deployment's processes logged on the fleet (the runner's
    log files), colour codes removed: what a failed wait shows."""
    out = []
    ours = re.compile(rf"{re.escape(namespace)}_{re.escape(name)}-(frontend|decode|prefill|worker)-.*\.log")
    found = (state_dir(f) / "logs").glob(f"{namespace}_{name}-*.log")
    for log in sorted(x for x in found if ours.fullmatch(x.name)):
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        bad = [ln[:300] for ln in text.splitlines() if " WARN " in ln or " ERROR " in ln or "Traceback" in ln]
        head = f"--- {log.name}: {len(bad)} warning/error line(s)"
        out.append(head + "".join(f"\n{b}" for b in bad[-lines:]))
    return "\n".join(out) or f"(no process logs for {namespace}/{name})"


def waiting(f: Factory, namespace: str, name: str, role: str) -> float:
    return sum(waiting_by_group(f, namespace, name, role).values())


def waiting_by_group(f: Factory, namespace: str, name: str, role: str) -> dict[str, float]:
    """Requests waiting in each group's engine queue (the autoscaler's own query)."""
    return by_group(prom(f, metrics.queue_query(namespace, name, role)))


def frontend_ttft(f: Factory, namespace: str, name: str, window: str = "15s") -> dict[str, float]:
    """TTFT p50/p99 the frontend measured over the last window (its histogram, through Prometheus)."""
    out = {}
    s = f'namespace="{namespace}", {contract.PROM_LABEL_DEPLOYMENT}="{name}"'
    for q in (0.5, 0.99):
        rows = prom(
            f,
            f"histogram_quantile({q}, sum by (le) "
            f"(rate(dynamo_frontend_time_to_first_token_seconds_bucket{{{s}}}[{window}])))",
        )
        if rows:
            v = float(rows[0]["value"][1])
            if v == v:
                out[f"p{int(q * 100)}"] = v
    return out


def status(f: Factory, namespace: str, name: str) -> dict[str, Any]:
    try:
        obj = get_json(f, "mdep", name, "-n", namespace)
    except subprocess.CalledProcessError:
        return {}
    return dict(obj.get("status") or {})


def prestaged_warm(f: Factory, namespace: str, name: str) -> bool:
    """Whether the deployment's pre-staged headroom holds its weights (status.weightsCache: every node in
    prestaged among warmNodes). True without a cache or headroom."""
    cache = status(f, namespace, name).get("weightsCache") or {}
    return set(cache.get("prestaged") or []) <= set(cache.get("warmNodes") or [])


def role_status(f: Factory, namespace: str, name: str) -> dict[str, Any]:
    return dict(status(f, namespace, name).get("roles") or {})


def role_gpus(manifest_doc: dict[str, Any]) -> dict[str, int]:
    """GPUs per group of each role, from the manifest (tensor x pipeline)."""
    out = {}
    for role in ("prefill", "decode", "worker"):
        r = manifest_doc["spec"].get(role)
        if r:
            p = r.get("parallelism", {})
            out[role] = int(p.get("tensor", 1)) * int(p.get("pipeline", 1))
    return out


def ensure_namespace(f: Factory, namespace: str) -> None:
    kubectl(f, "create", "namespace", namespace, check=False)


def delete_deployment(f: Factory, namespace: str, name: str) -> None:
    kubectl(f, "delete", "mdep", name, "-n", namespace, "--wait=true", "--timeout=120s", check=False)


def now() -> float:
    return time.time()
