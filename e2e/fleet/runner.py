"""The fleet runner: plays the kubelet for inference pods on the factory's simulated nodes.

kwok runs the pods the operator creates only on paper. This loop watches them and, for each Running pod,
runs the real NVIDIA Dynamo process the pod's container would run, on loopback:

- rank 0 of every worker group -> `python -m dynamo.mocker` (a multi-node group is one engine, so the
  other ranks run nothing), emulating the group's engine: its disaggregation mode from the pod env
  TOKENFAB_DISAGGREGATION_MODE (prefill workers get a bootstrap port), KV blocks scaled by the group's
  GPUs (annotation tokenfab.dev/group-gpus), DYN_NAMESPACE from the pod env, so each deployment is its
  own fleet;
- every frontend pod -> `python -m dynamo.frontend` (OpenAI API + Dynamo's router, the pod's
  --router-mode), which discovers the workers of its Dynamo namespace.

Discovery is file-based and the request plane TCP, all on 127.0.0.1 (../shared/REFERENCE.md §4). The
runner plays the kubelet's part faithfully where it matters to a drain:
- a pod being deleted leaves routing at once (as its endpoint leaves an EndpointSlice), runs its preStop
  (the sleep it declares), then its process gets SIGTERM and, after the pod's
  terminationGracePeriodSeconds, SIGKILL; a pod that Failed is stopped at once;
- a leader pod whose readiness gate tokenfab.dev/routable turns False leaves routing (its discovery entry
  is removed, as a router following endpoint readiness would drop it) while its process keeps running,
  and comes back when it turns True;
- readiness, in the live-* namespaces (where kwok starts pods but leaves them not ready, see
  tokenfab_factory.factory.LIVE_POD_START): a pod's ContainersReady follows its readiness probe (the
  engine's or the frontend's /health answering 200; a rank that runs nothing is ready once started) and
  Ready is ContainersReady with every readiness gate True, so a group counts as ready when its engine has
  loaded and registered, not when its pod was scheduled.
Each process is stopped by PID when it is done and when the runner stops. Each is
published to Prometheus as one file_sd target file (written atomically) with the pod's labels as a
Kubernetes pod relabelling would name them: namespace, pod, tokenfab_dev_deployment, tokenfab_dev_role,
tokenfab_dev_group - exactly what the autoscaler's PromQL selects.

The runner's state (processes, their ports, the frontend URLs, every PID it ever started) is written to
`<state-dir>/state.json` after every pass, for the scenario and the tests.

Run it through `Factory.start_extra` (see `start`) so the factory also stops it by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenfab.planning import contract as c
from tokenfab_factory import process

# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit integer: a port above 32767 makes every worker
# exit ("invalid value unsigned int `36901`, expected i16"). The workers' system servers (/health,
# /metrics) therefore take their ports from a second range below 32768 (and below the kernel's ephemeral
# range); everything else comes from the main range.
DEFAULT_PORTS = (36100, 36899)
DEFAULT_SYSTEM_PORTS = (26100, 26899)
# Dynamo 1.6.1's mocker refuses disaggregated serving with --engine-type trtllm ("mocker handoff does not
# support TRT-LLM"): disaggregated workers emulate the engine with the vllm timing and metric names
# (`vllm:kv_cache_usage_perc`, which the autoscaler's query also selects); aggregated workers use trtllm.
ENGINE_AUTO = "auto"
LIVE_PREFIX = "live-"  # the namespaces whose pods' readiness the runner plays (see probe)


@dataclass
class Options:
    kubeconfig: str
    kubectl: str
    state_dir: Path
    file_sd_dir: Path
    model_dir: Path
    dynamo_python: str
    ports: tuple[int, int] = DEFAULT_PORTS
    system_ports: tuple[int, int] = DEFAULT_SYSTEM_PORTS
    blocks_per_gpu: int = 48
    block_size: int = 16
    speedup_ratio: float = 0.3
    engine_type: str = ENGINE_AUTO
    namespaces: tuple[str, ...] = ()  # only pods of these Kubernetes namespaces (empty = all)
    poll_seconds: float = 1.0
    restart_backoff_seconds: float = 5.0
    start_delay_seconds: float = 0.0  # hold a new engine back this long (cold start: weights loading)


@dataclass
class Proc:
    """One Dynamo process standing in for one pod."""

    key: str  # <namespace>/<pod>
    uid: str
    kind: str  # mocker | frontend
    pid: int
    ports: dict[str, int]
    labels: dict[str, str]
    started_at: float
    url: str = ""
    metrics_url: str = ""
    health_url: str = ""  # what the pod's readiness probe asks
    argv: list[str] = field(default_factory=list)
    grace: float = 30.0  # the pod's terminationGracePeriodSeconds
    prestop: float = 0.0  # the pod's preStop sleep
    terminating_since: float | None = None
    sigterm_at: float | None = None  # when SIGTERM is due (after preStop)
    sigterm_sent: bool = False
    cordoned: dict[str, str] = field(default_factory=dict)  # discovery file -> content, while out of routing


class PortPool:
    def __init__(self, lo: int, hi: int) -> None:
        self.free = list(range(lo, hi + 1))
        self.used: set[int] = set()

    def take(self) -> int:
        for i, p in enumerate(self.free):
            if process.port_free(p):
                del self.free[i]
                self.used.add(p)
                return p
        raise RuntimeError("no free port left in the fleet's range")

    def give(self, port: int) -> None:
        if port in self.used:
            self.used.discard(port)
            self.free.append(port)  # reuse last: a port leaves TIME_WAIT before it comes round again


def dynamo_env(opts: Options, namespace: str) -> dict[str, str]:
    """Environment for every Dynamo process: no NATS/etcd, loopback only, offline."""
    return {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(opts.state_dir / "discovery"),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_HTTP_RPC_HOST": "127.0.0.1",
        "DYN_NAMESPACE": namespace,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DYN_LOG": os.environ.get("DYN_LOG", "warn"),
        "PYTHONUNBUFFERED": "1",
    }


def _env(pod: dict[str, Any]) -> dict[str, str]:
    out = {}
    for container in pod["spec"].get("containers", []):
        for e in container.get("env") or []:
            if "value" in e:
                out[e["name"]] = str(e["value"])
    return out


def _arg(pod: dict[str, Any], flag: str, default: str) -> str:
    for container in pod["spec"].get("containers", []):
        args = [*(container.get("command") or []), *(container.get("args") or [])]
        if flag in args and args.index(flag) + 1 < len(args):
            return str(args[args.index(flag) + 1])
    return default


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the runner dies without stopping us (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: Sequence[str], log: Path, env: dict[str, str]) -> int:
    """Start a Dynamo process in its own session, output appended to `log`; it dies with the runner."""
    return process.start(argv, log, env, preexec=_die_with_parent)


def pod_labels(pod: dict[str, Any], role: str, group: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "namespace": meta["namespace"],
        "pod": meta["name"],
        c.PROM_LABEL_DEPLOYMENT: meta.get("labels", {}).get(c.LABEL_DEPLOYMENT, ""),
        c.PROM_LABEL_ROLE: role,
        c.PROM_LABEL_GROUP: group,
    }


def _grace(pod: dict[str, Any]) -> tuple[float, float]:
    """(terminationGracePeriodSeconds, preStop sleep seconds) of a pod."""
    spec = pod.get("spec") or {}
    prestop = 0.0
    for ctr in spec.get("containers") or []:
        sleep = ((ctr.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        prestop = max(prestop, float(sleep.get("seconds") or 0))
    return float(spec.get("terminationGracePeriodSeconds", 30)), prestop


def _routable(pod: dict[str, Any]) -> bool | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == c.ROUTABLE_CONDITION:
            return bool(cond.get("status") == "True")
    return None


COUNTERS = ("dynamo_component_requests_total", "dynamo_component_inflight_requests")


def scrape_counters(url: str) -> dict[str, float]:
    """Requests served and in flight (the `generate` endpoint) from an engine's /metrics; {} if gone."""
    import urllib.request

    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS and 'dynamo_endpoint="generate"' in line:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def http_ok(url: str) -> bool:
    """A readiness probe: the URL answers 2xx within a second."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return 200 <= int(r.status) < 300
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _deleting(pod: dict[str, Any] | None) -> bool:
    return bool(pod is not None and pod["metadata"].get("deletionTimestamp"))


def wanted(pod: dict[str, Any]) -> str | None:
    """'mocker', 'frontend' or None: what this pod runs on the fleet, if it is Running and not leaving."""
    meta = pod["metadata"]
    if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") != "Running":
        return None
    if not pod["spec"].get("nodeName"):
        return None
    labels = meta.get("labels", {})
    if labels.get(c.MANAGED_BY) != c.MANAGED_BY_VALUE:
        return None
    component = labels.get(c.COMPONENT)
    if component == "worker" and labels.get(c.LABEL_RANK, "0") == "0":
        return "mocker"
    if component == "frontend":
        return "frontend"
    return None


class Runner:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.ports = PortPool(*opts.ports)
        self.system_ports = PortPool(*opts.system_ports)
        self.procs: dict[str, Proc] = {}
        self.history: list[dict[str, Any]] = []  # every process ever started, with start/stop times
        self.backoff: dict[str, float] = {}
        self.pending: dict[str, float] = {}  # engines held back for their cold start: key -> first seen
        self.terminating: dict[str, Proc] = {}  # pod uid -> process of a deleted pod, draining
        self.stop_event = threading.Event()
        self.errors = 0
        self.logs = opts.state_dir / "logs"
        for d in (opts.state_dir, opts.file_sd_dir, self.logs, opts.state_dir / "discovery"):
            d.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------- observe
    def pods(self) -> list[dict[str, Any]] | None:
        ns = self.opts.namespaces
        scope = ["-n", ns[0]] if len(ns) == 1 else ["-A"]
        try:
            out = subprocess.run(
                [
                    self.opts.kubectl,
                    f"--kubeconfig={self.opts.kubeconfig}",
                    "get",
                    "pods",
                    *scope,
                    "-l",
                    f"{c.MANAGED_BY}={c.MANAGED_BY_VALUE}",
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            items = json.loads(out.stdout)["items"]
            return [p for p in items if not ns or p["metadata"]["namespace"] in ns]
        except (subprocess.SubprocessError, ValueError, KeyError) as exc:
            self.errors += 1
            print(f"runner: listing pods failed: {exc}", file=sys.stderr, flush=True)
            return None

    # ----------------------------------------------------------------------------- act
    def argv_for(self, kind: str, pod: dict[str, Any]) -> tuple[list[str], dict[str, str], Proc]:
        o = self.opts
        env = _env(pod)
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        dyn_ns = env.get(c.ENV_DYNAMO_NAMESPACE) or f"{meta['namespace']}-{labels.get(c.LABEL_DEPLOYMENT)}"
        penv = dynamo_env(o, dyn_ns)
        ports: dict[str, int] = {"rpc": self.ports.take()}
        penv["DYN_TCP_RPC_PORT"] = str(ports["rpc"])
        key = f"{meta['namespace']}/{meta['name']}"
        if kind == "frontend":
            ports["http"] = self.ports.take()
            argv = [
                o.dynamo_python,
                "-m",
                c.DYNAMO_FRONTEND_MODULE,
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(ports["http"]),
                "--router-mode",
                _arg(pod, "--router-mode", "kv"),
                "--kv-cache-block-size",
                str(o.block_size),
                *(
                    ["--namespace-prefix", _arg(pod, "--namespace-prefix", dyn_ns)]
                    if _arg(pod, "--namespace-prefix", "")
                    else ["--namespace", dyn_ns]
                ),
            ]
            url = f"http://127.0.0.1:{ports['http']}"
            proc = Proc(key, meta["uid"], kind, 0, ports, pod_labels(pod, "frontend", ""), time.time(), url)
            proc.metrics_url = f"{url}/metrics"
            proc.health_url = f"{url}{c.HEALTH_PATH}"
            return argv, penv, proc
        mode = env.get(c.ENV_DISAGGREGATION_MODE, c.MODE_AGGREGATED)
        role = labels.get(c.LABEL_ROLE, "worker")
        group = labels.get(c.LABEL_GROUP, meta["name"])
        gpus = int(meta.get("annotations", {}).get(c.ANN_GROUP_GPUS, "1") or 1)
        engine = o.engine_type
        if engine == ENGINE_AUTO:
            engine = "trtllm" if mode == c.MODE_AGGREGATED else "vllm"
        ports["system"] = self.system_ports.take()
        penv["DYN_SYSTEM_PORT"] = str(ports["system"])
        penv["DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"] = '["generate"]'
        argv = [
            o.dynamo_python,
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(o.model_dir),
            "--model-name",
            env.get(c.ENV_MODEL_NAME, "model"),
            "--num-gpu-blocks-override",
            str(o.blocks_per_gpu * gpus),
            "--block-size",
            str(o.block_size),
            "--engine-type",
            engine,
            "--speedup-ratio",
            str(o.speedup_ratio),
            # aiperf's synthetic prompts repeat (a small dataset, cycled): without this, repeats would
            # hit cached prefixes and the KV signal would depend on the dataset size, not the load
            "--no-enable-prefix-caching",
        ]
        if mode in ("prefill", "decode"):
            argv += ["--disaggregation-mode", mode]
        if mode == "prefill":
            ports["bootstrap"] = self.ports.take()
            argv += ["--bootstrap-ports", str(ports["bootstrap"])]
        proc = Proc(key, meta["uid"], "mocker", 0, ports, pod_labels(pod, role, group), time.time())
        proc.metrics_url = f"http://127.0.0.1:{ports['system']}/metrics"
        proc.health_url = f"http://127.0.0.1:{ports['system']}{c.HEALTH_PATH}"
        proc.labels["engine_type"] = engine
        proc.labels["group_gpus"] = str(gpus)
        return argv, penv, proc

    def start(self, kind: str, pod: dict[str, Any]) -> None:
        argv, env, proc = self.argv_for(kind, pod)
        proc.grace, proc.prestop = _grace(pod)
        name = proc.key.replace("/", "_")
        proc.pid = spawn(argv, self.logs / f"{name}.log", env)
        proc.argv = argv
        self.procs[proc.key] = proc
        self.history.append(
            {
                "key": proc.key,
                "kind": kind,
                "pid": proc.pid,
                "started_at": proc.started_at,
                "stopped_at": None,
                "generation": pod["metadata"].get("labels", {}).get(c.LABEL_REVISION, "")[:8],
                "labels": proc.labels,
            }
        )
        self.publish(proc)
        print(f"runner: started {kind} for {proc.key} pid {proc.pid} ports {proc.ports}", flush=True)

    def target_file(self, proc: Proc) -> Path:
        return self.opts.file_sd_dir / f"fleet-{proc.key.replace('/', '_')}-{proc.uid[:8]}.json"

    def publish(self, proc: Proc) -> None:
        port = proc.ports["http"] if proc.kind == "frontend" else proc.ports["system"]
        labels = {k: v for k, v in proc.labels.items() if k not in ("engine_type", "group_gpus")}
        doc = [{"targets": [f"127.0.0.1:{port}"], "labels": {**labels, "fleet_kind": proc.kind}}]
        target = self.target_file(proc)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(target)

    def stop(self, key: str, reason: str) -> None:
        """Stop a process at once (SIGTERM, SIGKILL after 8 s): its pod failed, or the runner stops."""
        proc = self.procs.pop(key)
        process.stop(proc.pid, expect="dynamo", timeout=8)
        self.finish(proc, reason)

    def sync(self) -> None:
        pods = self.pods()
        if pods is None:
            return
        by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        desired: dict[str, tuple[str, dict[str, Any]]] = {}
        for key, pod in by_key.items():
            kind = wanted(pod)
            if kind:
                desired[key] = (kind, pod)
        now = time.monotonic()
        for proc in list(self.terminating.values()):
            self.progress(proc, now)
        for key in list(self.procs):
            proc = self.procs[key]
            pod = by_key.get(key)
            same = pod is not None and pod["metadata"]["uid"] == proc.uid
            if same and pod is not None and pod.get("status", {}).get("phase") == "Failed":
                self.stop(key, "pod failed")
            elif not same or key not in desired:
                self.terminate(proc, now, "pod deleted" if not same or _deleting(pod) else "pod stopped")
            elif not process.alive(proc.pid):
                print(f"runner: {proc.kind} for {key} (pid {proc.pid}) exited; restarting", flush=True)
                self.stop(key, "exited")
                self.backoff[key] = time.monotonic() + self.opts.restart_backoff_seconds
            elif proc.kind == "mocker" and pod is not None:
                routable = _routable(pod)
                if routable is False and not proc.cordoned:
                    self.cordon(proc)
                elif routable is not False and proc.cordoned:
                    self.uncordon(proc)
        for key, (kind, pod) in sorted(desired.items()):
            if key not in self.procs and self.backoff.get(key, 0) <= now:
                if kind == "mocker" and self.opts.start_delay_seconds > 0:
                    # Cold start: a real engine loads its weights for minutes before it registers.
                    first = self.pending.setdefault(key, now)
                    if now - first < self.opts.start_delay_seconds:
                        continue
                try:
                    self.start(kind, pod)
                    self.pending.pop(key, None)
                except Exception as exc:
                    self.errors += 1
                    print(f"runner: could not start {kind} for {key}: {exc}", file=sys.stderr, flush=True)
        for key, pod in by_key.items():
            if pod["metadata"]["namespace"].startswith(LIVE_PREFIX) and not _deleting(pod):
                self.probe(key, pod)

    # --------------------------------------------------------------------------- readiness
    def probe(self, key: str, pod: dict[str, Any]) -> None:
        """The kubelet's readiness bookkeeping for a live pod: ContainersReady from its probe, Ready from
        that and its readiness gates; the pod's status is patched when either differs."""
        status = pod.get("status") or {}
        if status.get("phase") != "Running":
            return
        conds = {x.get("type"): x.get("status") == "True" for x in status.get("conditions") or []}
        proc = self.procs.get(key)
        if wanted(pod) is None:
            healthy = True  # a rank that runs nothing: its container started, nothing to probe
        elif proc is None or proc.uid != pod["metadata"]["uid"]:
            healthy = False  # not started yet (a cold start) or restarting
        else:
            healthy = http_ok(proc.health_url)
        gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
        ready = healthy and all(conds.get(g) is True for g in gates)
        if conds.get("ContainersReady") == healthy and conds.get("Ready") == ready:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def cond(kind: str, value: bool) -> dict[str, Any]:
            out: dict[str, Any] = {"type": kind, "status": "True" if value else "False"}
            if conds.get(kind) != value:
                out["lastTransitionTime"] = now
            if not value:
                out["reason"] = "ContainersNotReady" if not healthy else "ReadinessGatesNotReady"
            else:
                out["reason"] = None
            return out

        patch = {
            "status": {
                "conditions": [cond("ContainersReady", healthy), cond("Ready", ready)],
                "containerStatuses": [
                    {"name": ctr["name"], "ready": healthy} for ctr in pod["spec"].get("containers") or []
                ],
            }
        }
        try:
            subprocess.run(
                [
                    self.opts.kubectl,
                    f"--kubeconfig={self.opts.kubeconfig}",
                    "patch",
                    "pod",
                    pod["metadata"]["name"],
                    "-n",
                    pod["metadata"]["namespace"],
                    "--subresource=status",
                    "--type=strategic",
                    "-p",
                    json.dumps(patch),
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
        except subprocess.SubprocessError as exc:
            self.errors += 1
            print(f"runner: readiness of {key} not written: {exc}", file=sys.stderr, flush=True)
            return
        print(f"runner: {key} ContainersReady={healthy} Ready={ready}", flush=True)

    # ------------------------------------------------------------------ routing and termination
    def instance_files(self, proc: Proc) -> list[Path]:
        """The discovery entries of a worker: the instance files naming its request-plane port."""
        where = self.opts.state_dir / "discovery" / "v1" / "instances"
        needle = f"127.0.0.1:{proc.ports.get('rpc')}/"
        out = []
        for f in where.glob("*") if where.exists() else []:
            with contextlib.suppress(OSError):
                if needle in f.read_text():
                    out.append(f)
        return out

    def record_counters(self, proc: Proc, when: str) -> None:
        """The engine's own request counters, kept in the history (an engine's counters die with it)."""
        if proc.kind != "mocker":
            return
        counters = scrape_counters(proc.metrics_url)
        for h in self.history:
            if h["pid"] == proc.pid:
                h[when] = counters
                h["labels"] = proc.labels

    def cordon(self, proc: Proc) -> None:
        """Out of routing, still running: its discovery entries are removed (saved to put back)."""
        self.record_counters(proc, "at_cordon")
        for f in self.instance_files(proc):
            with contextlib.suppress(OSError):
                proc.cordoned[str(f)] = f.read_text()
                f.unlink()
        print(f"runner: {proc.key} out of routing ({len(proc.cordoned)} entries)", flush=True)

    def uncordon(self, proc: Proc) -> None:
        for name, content in proc.cordoned.items():
            path = Path(name)
            tmp = path.with_name(f".{path.name}.tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(content)
                tmp.replace(path)
        proc.cordoned.clear()
        print(f"runner: {proc.key} back in routing", flush=True)

    def terminate(self, proc: Proc, now: float, reason: str) -> None:
        """As the kubelet does for a deleted pod: out of routing now, preStop, SIGTERM, then SIGKILL."""
        # (A new pod of the same name may come while this one drains: it is tracked by uid from now on.)
        self.procs.pop(proc.key, None)
        self.terminating[proc.uid] = proc
        proc.terminating_since = now
        proc.sigterm_at = now + proc.prestop
        if proc.kind == "mocker" and not proc.cordoned:
            self.cordon(proc)
        for h in self.history:
            if h["pid"] == proc.pid and h["stopped_at"] is None:
                h["terminating_at"] = time.time()
                h["reason"] = reason
        print(f"runner: {proc.key} terminating ({reason}): SIGTERM in {proc.prestop:.0f} s, "
              f"SIGKILL after {proc.grace:.0f} s", flush=True)  # fmt: skip
        self.progress(proc, now)

    def progress(self, proc: Proc, now: float) -> None:
        assert proc.terminating_since is not None
        assert proc.sigterm_at is not None
        if not process.alive(proc.pid):
            self.finish(proc, "exited after SIGTERM" if proc.sigterm_sent else "exited")
            return
        if not proc.sigterm_sent and now >= proc.sigterm_at:
            self.record_counters(proc, "at_sigterm")
            self.target_file(proc).unlink(missing_ok=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            proc.sigterm_sent = True
        if now >= proc.terminating_since + proc.grace:
            process.stop(proc.pid, expect="dynamo", timeout=0)  # SIGKILL: the grace period is over
            self.finish(proc, "killed after the grace period")

    def finish(self, proc: Proc, reason: str) -> None:
        self.terminating.pop(proc.uid, None)
        self.target_file(proc).unlink(missing_ok=True)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, os.WNOHANG)
        for name, port in proc.ports.items():
            (self.system_ports if name == "system" else self.ports).give(port)
        for h in self.history:
            if h["pid"] == proc.pid and h["stopped_at"] is None:
                h["stopped_at"] = time.time()
                h["end"] = reason
        print(f"runner: {proc.kind} for {proc.key} pid {proc.pid} done ({reason})", flush=True)

    def write_state(self, running: bool = True) -> None:
        frontends = {
            f"{p.labels['namespace']}/{p.labels[c.PROM_LABEL_DEPLOYMENT]}": p.url
            for p in self.procs.values()
            if p.kind == "frontend"
        }
        doc = {
            "runner_pid": os.getpid(),
            "running": running,
            "updated_at": time.time(),
            "errors": self.errors,
            "model_dir": str(self.opts.model_dir),
            "frontends": frontends,
            "processes": {k: asdict(p) for k, p in sorted(self.procs.items())},
            "terminating": {uid: asdict(p) for uid, p in sorted(self.terminating.items())},
            "history": self.history,
        }
        path = self.opts.state_dir / "state.json"
        tmp = path.with_name(".state.json.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.sync()
            self.write_state()
            self.stop_event.wait(self.opts.poll_seconds)
        self.shutdown()

    def shutdown(self) -> None:
        """SIGTERM every process at once, then reap each by PID (the factory waits 15 s for us)."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.terminating.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for key in list(self.procs):
            self.stop(key, "runner stopped")
        for proc in list(self.terminating.values()):
            process.stop(proc.pid, expect="dynamo", timeout=8)
            self.finish(proc, "runner stopped")
        self.write_state(running=False)


def state_dir_of(run_dir: Path) -> Path:
    return run_dir / "fleet"


def read_state(state_dir: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((state_dir / "state.json").read_text()))
    return {}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--state-dir", required=True, type=Path)
    ap.add_argument("--file-sd-dir", required=True, type=Path)
    ap.add_argument("--model-dir", required=True, type=Path)
    ap.add_argument("--dynamo-python", required=True)
    ap.add_argument("--ports", default=f"{DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}")
    ap.add_argument("--system-ports", default=f"{DEFAULT_SYSTEM_PORTS[0]}-{DEFAULT_SYSTEM_PORTS[1]}")
    ap.add_argument("--blocks-per-gpu", type=int, default=48)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--speedup-ratio", type=float, default=0.3)
    ap.add_argument("--engine-type", default=ENGINE_AUTO, choices=[ENGINE_AUTO, "trtllm", "vllm", "sglang"])
    ap.add_argument("--namespaces", default="", help="comma-separated namespaces to serve (default: all)")
    ap.add_argument("--start-delay", type=float, default=0.0, help="seconds each new engine is held back")
    a = ap.parse_args(argv)

    def rng(s: str) -> tuple[int, int]:
        lo, hi = s.split("-")
        return int(lo), int(hi)

    runner = Runner(
        Options(
            kubeconfig=a.kubeconfig,
            kubectl=a.kubectl,
            state_dir=a.state_dir,
            file_sd_dir=a.file_sd_dir,
            model_dir=a.model_dir,
            dynamo_python=a.dynamo_python,
            ports=rng(a.ports),
            system_ports=rng(a.system_ports),
            blocks_per_gpu=a.blocks_per_gpu,
            block_size=a.block_size,
            speedup_ratio=a.speedup_ratio,
            engine_type=a.engine_type,
            namespaces=tuple(n for n in a.namespaces.split(",") if n),
            start_delay_seconds=a.start_delay,
        )
    )

    def on_signal(signum: int, _frame: object) -> None:
        runner.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.run()
    finally:
        if runner.procs or runner.terminating:
            runner.shutdown()


if __name__ == "__main__":
    main()
