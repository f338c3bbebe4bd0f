"""What the fleet runner runs for a pod: the pod's own container, as a kubelet would run it on this host.

The process gets the container's command, args and environment, with only these differences, each one
what simulating the hardware on one machine needs:

- **The engine.** A worker pod's command is tokenfab's launcher. What it would start is planned by
  `tokenfab.launcher.plan` (pure) from the pod's own environment, args and engine ConfigMap:
  `python3 -m dynamo.trtllm ARGS` for a one-pod group or rank 0 of a multi-node group (under mpirun
  there), an SSH daemon on the other ranks (nothing here: one engine per group). `dynamo.trtllm` becomes
  `dynamo.mocker` (`mocker_argv`): the same model name, disaggregation mode and Dynamo namespace, KV
  blocks for the group's GPUs, and the local tiny model in place of the weights (no hub, HF offline).
  Every other flag must be one the swap knows, so a flag tokenfab starts passing is noticed here.
- **The ports.** Every process shares 127.0.0.1, so the ports a pod names (the Dynamo system port, the
  frontend's HTTP port) are swapped for free ones, and the host part of every address Dynamo binds or
  advertises is 127.0.0.1: this pod's IP on this host (on a real node Dynamo finds the pod IP itself).
- **What a kubelet adds.** Downward-API fields (metadata.name, .namespace, .uid), and, when the pod
  mounts a ServiceAccount token, that token: a per-pod kubeconfig (the API server on loopback, a
  TokenRequest token bound to the pod) in place of the in-cluster files, and HOME an empty directory of
  the pod's, so no other kubeconfig is ever read. A pod that mounts no token gets none.

Nothing else is added: no discovery settings, no Dynamo namespace. Besides the addresses above, the
process environment carries only PATH and HOME (a kubelet's image defaults), HF_HUB_OFFLINE and
TRANSFORMERS_OFFLINE (the weights are the simulated part: the launcher's fetch is not played, see
tokenfab.launcher.run.Runner.fetch_weights, tested on its own) and PYTHONUNBUFFERED (logs).

A worker pod's weights init container (`launcher --fetch-only`, the download before the worker starts) is
the weights too: kwok marks it completed as the pod starts, and its download's modeled time is counted in
the engine's hold (e2e/fleet/weights_model.py), so a cold start takes as long as it would (and counts
against the worker's startup probe, which the runner plays: stricter than a cluster, e2e/fleet/probes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenfab.launcher.plan import ConfigError, plan_launch, read_identity
from tokenfab.launcher.run import parse_args as launcher_args
from tokenfab.planning import contract

Pod = dict[str, Any]
LOOPBACK = "127.0.0.1"
# Where Dynamo binds and what it advertises (1.6.1): unset, it picks the default route's address.
HOST_ENV = (
    "DYN_TCP_RPC_HOST",
    "DYN_TCP_RESPONSE_STREAM_HOST",
    "DYN_EVENT_PLANE_HOST",
    "DYN_SYSTEM_HOST",
    "DYN_HTTP_HOST",
)
LAUNCHER = [contract.PYTHON, "-m", contract.LAUNCHER_MODULE]
FRONTEND = [contract.PYTHON, "-m", contract.DYNAMO_FRONTEND_MODULE]


class PodError(Exception):
    """The pod cannot be run as it is; the message says why (a runner error, counted and logged)."""


def container(pod: Pod) -> dict[str, Any]:
    ctrs = (pod.get("spec") or {}).get("containers") or []
    if len(ctrs) != 1:
        raise PodError(f"expected one container, found {len(ctrs)}")
    return dict(ctrs[0])


def resolve_env(pod: Pod) -> dict[str, str]:
    """The container's environment as a kubelet resolves it (literal values and downward-API fields)."""
    meta = pod["metadata"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName") or "",
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName") or "default",
    }
    out: dict[str, str] = {}
    for e in container(pod).get("env") or []:
        source = e.get("valueFrom")
        if source is None:
            out[e["name"]] = str(e.get("value", ""))
            continue
        path = (source.get("fieldRef") or {}).get("fieldPath")
        if path not in fields:
            raise PodError(
                f"env {e['name']}: the runner resolves fieldRef {sorted(fields)} only, not {source}"
            )
        out[e["name"]] = fields[path]
    return out


def _field(pod: Pod, path: str) -> str:
    """A downward-API field of the pod, as a kubelet resolves it in a volume."""
    meta = pod["metadata"]
    for key in ("labels", "annotations"):
        prefix = f"metadata.{key}['"
        if path.startswith(prefix) and path.endswith("']"):
            return str((meta.get(key) or {}).get(path[len(prefix) : -2], ""))
    plain = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
    }
    if path not in plain:
        raise PodError(
            f"a downward-API volume names {path}: the runner projects labels, annotations, name, "
            "namespace and uid only"
        )
    return str(plain[path])


def downward_volumes(pod: Pod) -> list[tuple[str, str, dict[str, str]]]:
    """The container's downward-API volumes as a kubelet projects them: (volume, mountPath, {file: value})."""
    mounts = {m["name"]: m["mountPath"] for m in container(pod).get("volumeMounts") or []}
    out = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if "downwardAPI" in v and v["name"] in mounts:
            items = v["downwardAPI"].get("items") or []
            files = {i["path"]: _field(pod, i["fieldRef"]["fieldPath"]) for i in items if "fieldRef" in i}
            out.append((v["name"], mounts[v["name"]], files))
    return out


def mounts_token(pod: Pod) -> bool:
    """Whether a kubelet would mount the ServiceAccount token (the pod's setting; unset means yes)."""
    return (pod.get("spec") or {}).get("automountServiceAccountToken") is not False


def service_account(pod: Pod) -> str:
    return str((pod.get("spec") or {}).get("serviceAccountName") or "default")


def engine_configmap(pod: Pod) -> str:
    """The ConfigMap mounted at the engine config directory (the launcher reads the engine YAML there)."""
    mounts = {m["name"]: m["mountPath"] for m in container(pod).get("volumeMounts") or []}
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if mounts.get(v["name"]) == contract.ENGINE_CONFIG_DIR and "configMap" in v:
            return str(v["configMap"]["name"])
    raise PodError(f"no ConfigMap mounted at {contract.ENGINE_CONFIG_DIR}")


def argv_of(pod: Pod) -> list[str]:
    ctr = container(pod)
    return [*(ctr.get("command") or []), *(ctr.get("args") or [])]


def port_of(pod: Pod, name: str) -> int:
    for p in container(pod).get("ports") or []:
        if p.get("name") == name:
            return int(p["containerPort"])
    raise PodError(f"the container declares no port named {name}")


@dataclass(frozen=True)
class Engine:
    """The Dynamo engine command the launcher would run for this pod, or None (a rank that runs none)."""

    dynamo_args: tuple[str, ...]
    gpus: int


def engine_of(pod: Pod, env: Mapping[str, str], engine_yaml: str) -> Engine | None:
    """Plan the pod's launcher run (tokenfab.launcher.plan) and take the Dynamo worker command out of it."""
    argv = argv_of(pod)
    if argv[:3] != LAUNCHER:
        raise PodError(f"a worker pod runs {' '.join(LAUNCHER)}, not {' '.join(argv[:3])}")
    _help, _dry, dynamo_args = launcher_args(argv[3:])
    environ = {
        **env,
        contract.ENV_ENGINE_CONFIG: env.get(contract.ENV_ENGINE_CONFIG, contract.ENGINE_CONFIG_PATH),
    }
    try:
        identity = read_identity(environ)
        plan = plan_launch(identity, engine_yaml, dynamo_args, environ=environ, run_dir="/run", as_root=False)
    except ConfigError as exc:
        raise PodError(f"the launcher would exit: {exc}") from exc
    if plan.kind == "follower":
        return None
    command = list(plan.command)
    at = command.index(contract.DYNAMO_WORKER_MODULE)  # (rank 0 of a multi-node group: inside mpirun)
    if command[at - 2 : at] != [contract.PYTHON, "-m"]:
        raise PodError(f"unexpected engine command {command}")
    return Engine(tuple(command[at + 1 :]), plan.engine.gpus)


@dataclass(frozen=True)
class Mocker:
    """How dynamo.trtllm's flags become dynamo.mocker's: what the emulated engine needs of the hardware."""

    model_dir: str
    blocks_per_gpu: int
    block_size: int
    speedup_ratio: float
    engine_type: str  # trtllm | vllm (1.6.1's mocker hands KV over between engines only as vllm)
    # A prefill engine's KV hand-over cost: the modeled bandwidth of its unit's path, GB/s (None: the
    # mocker's own default), and the KV bytes per token of the model the factory stands for
    kv_transfer_gbps: float | None = None
    kv_bytes_per_token: int | None = None


# dynamo.trtllm flags with a value, and what becomes of them on the mocker.
_VALUED = {"--model-path", "--model", "--served-model-name", "--extra-engine-args", "--disaggregation-mode"}
# Flags the mocker does by itself: it always publishes KV events and its metrics.
_PUBLISHERS = {contract.PUBLISH_KV_EVENTS_FLAG, contract.PUBLISH_METRICS_FLAG}


def mocker_argv(engine: Engine, m: Mocker, bootstrap_port: int | None) -> list[str]:
    """`python -m dynamo.mocker` arguments for the engine's `python3 -m dynamo.trtllm` arguments."""
    flags: dict[str, str] = {}
    args = list(engine.dynamo_args)
    while args:
        flag = args.pop(0)
        if flag in _PUBLISHERS:
            continue
        if flag not in _VALUED or not args:
            raise PodError(f"dynamo.trtllm flag {flag!r} has no counterpart on the mocker: teach mocker_argv")
        flags[flag] = args.pop(0)
    name = flags.get("--served-model-name") or flags.get("--model-path") or flags.get("--model") or "model"
    out = [
        "-m",
        "dynamo.mocker",
        "--model-path",
        m.model_dir,  # the weights: a local tiny model with a real tokenizer
        "--model-name",
        name,
        "--num-gpu-blocks-override",
        str(m.blocks_per_gpu * engine.gpus),
        "--block-size",
        str(m.block_size),
        "--engine-type",
        m.engine_type,
        "--speedup-ratio",
        str(m.speedup_ratio),
        "--num-workers",
        "1",  # one Dynamo runtime per pod: its DynamoWorkerMetadata is named after the pod
        # aiperf's synthetic prompts repeat: without this the KV signal would depend on the dataset size
        "--no-enable-prefix-caching",
    ]
    mode = flags.get("--disaggregation-mode")
    if mode is not None:
        out += ["--disaggregation-mode", mode]
    if mode == "prefill":
        if bootstrap_port is None:
            raise PodError("a prefill engine needs a bootstrap port")
        out += ["--bootstrap-ports", str(bootstrap_port)]
        if m.kv_transfer_gbps is not None:  # (the hand-over is charged on the prefill side)
            out += ["--kv-transfer-bandwidth", str(m.kv_transfer_gbps)]
        if m.kv_bytes_per_token is not None:
            out += ["--kv-bytes-per-token", str(m.kv_bytes_per_token)]
    return out


def frontend_args(pod: Pod, http_port: int) -> list[str]:
    """The frontend pod's own Dynamo frontend arguments, its HTTP port swapped."""
    argv = argv_of(pod)
    if argv[:3] != FRONTEND:
        raise PodError(f"a frontend pod runs {' '.join(FRONTEND)}, not {' '.join(argv[:3])}")
    args = argv[3:]
    if "--http-port" in args:
        args[args.index("--http-port") + 1] = str(http_port)
    else:
        args += ["--http-port", str(http_port)]
    return ["-m", contract.DYNAMO_FRONTEND_MODULE, *args]


def process_env(
    env: Mapping[str, str], *, path: str, home: str, kubeconfig: str | None, ports: Mapping[str, str]
) -> dict[str, str]:
    """The process environment: the pod's, what a kubelet adds, loopback as the pod's IP, swapped ports.
    Built from nothing (no proxy or other variable of the runner's leaks in)."""
    out = {
        "PATH": path,
        "HOME": home,
        **env,
        **dict.fromkeys(HOST_ENV, LOOPBACK),
        **ports,
        # the weights are simulated: no hub
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if kubeconfig is not None:
        out["KUBECONFIG"] = kubeconfig
    return out


def kubeconfig(server: str, ca_file: str, token: str) -> dict[str, Any]:
    """A kubeconfig carrying a pod's ServiceAccount token (what its in-cluster files would hold)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "factory", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "factory", "user": "pod"}}],
        "current-context": "pod",
    }


def target_labels(pod: Pod, port_name: str) -> dict[str, str]:
    """The labels Prometheus' Kubernetes service discovery (role: pod) gives a pod's container port, so the
    factory's Prometheus relabels loopback targets with the very scrape config tokenfab documents."""
    meta = pod["metadata"]
    out = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_uid": meta["uid"],
        "__meta_kubernetes_pod_node_name": (pod.get("spec") or {}).get("nodeName") or "",
        "__meta_kubernetes_pod_container_name": container(pod)["name"],
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_phase": (pod.get("status") or {}).get("phase") or "",
    }
    for key, value in (meta.get("labels") or {}).items():
        name = sanitize(key)
        out[f"__meta_kubernetes_pod_label_{name}"] = value
        out[f"__meta_kubernetes_pod_labelpresent_{name}"] = "true"
    return out


def sanitize(label: str) -> str:
    """Prometheus' label-name sanitizing, as its Kubernetes discovery applies it to pod label keys."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in label)
