"""The local AI factory: a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), kwok simulating NVL72 racks of GPU nodes, and Prometheus, all on loopback.

One run directory holds everything: certificates, kubeconfig, an env file to source, each component's
log and a state file with PIDs and ports. `up` is idempotent (a healthy factory is left alone, a
crashed one is cleaned up first), `down` stops every process by its PID.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenfab_factory import process
from tokenfab_factory.pki import Pki, make_pki
from tokenfab_factory.racks import FACTORY_LABEL, SYSTEMS, rack_nodes

COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "prometheus",
    "drivers",
)
PORT_OFFSETS = {
    "etcd": 0,
    "etcd-peer": 1,
    "kube-apiserver": 2,
    "kube-controller-manager": 3,
    "kube-scheduler": 4,
    "kwok": 5,
    "prometheus": 6,
    "drivers": 7,
}
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
# Pods in namespaces named live-* are run by the fleet runner (e2e/fleet/runner.py), which plays their
# kubelet's probes: kwok starts them (Running; a container with a startup probe not `started` yet) but leaves
# them not ready, and the runner sets `started` and ContainersReady when the engine's /health answers and
# Ready when the readiness gates hold too, as a kubelet does. Everywhere else kwok's fast stage makes a pod
# Ready (and its readiness gates True) at once.
# Both give the pod an IP from POD_CIDR, as a kubelet would: the EndpointSlice controller lists a pod only
# with one (Dynamo's kubernetes discovery never connects to it: its addresses come from DynamoWorkerMetadata).
LIVE_NAMESPACE_PREFIX = "live-"
LIVE_POD_START = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tokenfab-live-pod-start
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '.metadata.namespace | startswith("live-")'
      operator: 'In'
      values: ['true']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: PodScheduled
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: {{ if .startupProbe }}false{{ else }}true{{ end }}
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
         ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""
# A weights-fetch pod (tokenfab's pre-staging) outside the live namespaces completes two seconds after it
# runs, as its download would (the live namespaces' runner times it by the weights model instead).
FETCH_POD_COMPLETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tokenfab-weights-fetch-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.labels["app.kubernetes.io/component"]'
      operator: 'In'
      values: ['weights-fetch']
    - key: '.metadata.namespace | startswith("live-")'
      operator: 'NotIn'
      values: ['true']
  delay:
    durationMilliseconds: 2000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""
# kwok renews each simulated node's Lease; on a busy 2-core machine with 1,152 nodes a renewal can lag,
# so leases are long and the controller-manager waits several of them before calling a node NotReady.
NODE_LEASE_SECONDS = 60
NODE_MONITOR_GRACE = "180s"
# Kubernetes 1.37's gang scheduling (Workload and PodGroup, scheduling.k8s.io/v1beta1) is beta and off by
# default (a beta API group is not served unless asked, and the GenericWorkload gate, which also turns on
# the scheduler's GangScheduling plugin, defaults to false): turned on here so the operator's PodGroup path
# runs end to end (the operator falls back to its scheduling gates without it). DRA device taints
# (DeviceTaintRule, resource.k8s.io/v1) are GA and on by default.
GANG_FEATURE_GATES = "GenericWorkload=true"
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
# Simulated pods get addresses from 198.18.0.0/15 (RFC 2544: reserved for benchmarking, never routed), which
# the endpoint controllers accept (loopback addresses they refuse with a Warning per Service). Nothing ever
# connects to them: every real process of the factory and the live fleet serves on 127.0.0.1.
POD_CIDR = "198.18.0.0/15"


# The scrape job tokenfab documents for a plain Prometheus (the chart's PodMonitor says the same).
SCRAPE_CONFIG = Path(__file__).resolve().parents[2] / "charts/tokenfab/prometheus/scrape-config.yaml"
# The engine is simulated by Dynamo's mocker, which names its metrics after vLLM's (`vllm:` or `trtllm:`
# prefixed, DP rank in label `engine`), not as the real TensorRT-LLM worker does. The factory's Prometheus
# renames the series the autoscaler reads to the real worker's (dynamo_component_gpu_cache_usage_percent per
# dp_rank, trtllm_num_requests_waiting): a translation of the hardware's stand-in, never in the operator.
MOCKER_METRICS: list[dict[str, Any]] = [
    {
        "source_labels": ["__name__", "engine"],
        "regex": "(trtllm|vllm):kv_cache_usage_perc;(.*)",
        "target_label": "dp_rank",
        "replacement": "$2",
    },
    {
        "source_labels": ["__name__"],
        "regex": "(trtllm|vllm):kv_cache_usage_perc",
        "target_label": "__name__",
        "replacement": "dynamo_component_gpu_cache_usage_percent",
    },
    {
        "source_labels": ["__name__"],
        "regex": "(trtllm|vllm):num_requests_waiting",
        "target_label": "__name__",
        "replacement": "trtllm_num_requests_waiting",
    },
]


def documented_scrape_job() -> dict[str, Any]:
    jobs = yaml.safe_load(SCRAPE_CONFIG.read_text())
    if not isinstance(jobs, list) or len(jobs) != 1:
        raise FactoryError(f"{SCRAPE_CONFIG}: expected one scrape job")
    return dict(jobs[0])


DRIVERS_MODULE = "tokenfab_factory.drivers"


class FactoryError(RuntimeError):
    """Something the user must act on; the message says what."""


def default_run_dir() -> Path:
    env = os.environ.get("TOKENFAB_FACTORY_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tokenfab" / "factory"


def default_bin_dir() -> Path:
    env = os.environ.get("TOKENFAB_BIN")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tokenfab" / "bin" / "current"


@dataclass
class FactoryConfig:
    """What to bring up, and where."""

    run_dir: Path = field(default_factory=default_run_dir)
    racks: int = 4
    gpu: str = "gb200"
    port_base: int = 31000
    bin_dir: Path = field(default_factory=default_bin_dir)
    scrape_interval: str = "2s"
    gang_api: bool = True  # serve the alpha PodGroup gang API (feature gates on apiserver and scheduler)
    # An API server and its etcd only (no controllers, scheduler, nodes, Prometheus or drivers): a cluster
    # with nothing tokenfab needs, for the checks that say so.
    bare: bool = False

    @property
    def components(self) -> tuple[str, ...]:
        return ("etcd", "kube-apiserver") if self.bare else COMPONENTS

    def port(self, component: str) -> int:
        return self.port_base + PORT_OFFSETS[component]

    @property
    def name(self) -> str:
        """The run directory's name as a valid label value (it labels the factory's nodes)."""
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.run_dir.name)[:63].strip("-_.") or "factory"


@dataclass
class State:
    """What `up` started: persisted in the run directory so `down` and `status` work from any shell."""

    racks: int
    gpu: str
    port_base: int
    pids: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    ready_seconds: float | None = None
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str
    rss_bytes: int = 0


class Factory:
    """Control of one factory run directory."""

    def __init__(self, config: FactoryConfig, say: Callable[[str], None] = print) -> None:
        self.config = config
        self.run = config.run_dir
        self.say = say
        self.pki = Pki(self.run / "pki")

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> Path:
        return self.run / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.run / "env"

    @property
    def state_file(self) -> Path:
        return self.run / "state.json"

    @property
    def file_sd_dir(self) -> Path:
        """Drop Prometheus file_sd target files (*.json) here; they are picked up within seconds."""
        return self.run / "prometheus" / "file_sd"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port('prometheus')}"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.config.port('kube-apiserver')}"

    def log(self, component: str) -> Path:
        return self.run / "logs" / f"{component}.log"

    def binary(self, name: str) -> str:
        if name == "prometheus":
            found = shutil.which("prometheus")
            if not found:
                raise FactoryError(
                    "prometheus not found: install Debian's package (apt-get install prometheus)"
                )
            return found
        path = self.config.bin_dir / name
        if not path.exists():
            raise FactoryError(f"{path} missing: build the toolchain with e2e/toolchain/build.sh")
        return str(path)

    # ------------------------------------------------------------------ state
    def read_state(self) -> State | None:
        try:
            return State(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write_state(self, state: State) -> None:
        self.state_file.write_text(json.dumps(asdict(state), indent=2))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One `up`/`down` at a time per run directory."""
        self.run.mkdir(parents=True, exist_ok=True)
        with (self.run / "lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FactoryError(f"another `tokenfab factory` command is working on {self.run}") from None
            yield

    # ------------------------------------------------------------------ up
    def up(self, timeout: float = 600.0) -> State:
        """Bring the factory up (or confirm it is up). Returns the state with PIDs and ready time."""
        with self.locked():
            existing = self.read_state()
            if existing is not None:
                statuses = self.component_status(existing)
                if all(s.running and s.healthy for s in statuses):
                    if existing.racks != self.config.racks or existing.gpu != self.config.gpu:
                        raise FactoryError(
                            f"a factory of {existing.racks} {existing.gpu} racks already runs in {self.run}: "
                            "run `tokenfab factory down` first to change its size"
                        )
                    self.say(f"factory already running in {self.run}; nothing to do")
                    self._write_env()
                    return existing
                dead = [s.name for s in statuses if not s.running]
                self.say(
                    f"found a stale factory in {self.run} (not running: {', '.join(dead) or 'none'}; "
                    "left by a crash or a reboot): stopping what is left of it and starting fresh"
                )
                self._stop_all(existing)
            self._check_ports()
            return self._start(timeout)

    def _check_ports(self, linger: float = 90.0) -> None:
        """Refuse ports another process listens on; wait out sockets a killed process left behind."""
        deadline = time.monotonic() + linger
        while True:
            busy, owned = [], False
            for comp in PORT_OFFSETS:
                port = self.config.port(comp)
                if process.port_free(port):
                    continue
                owner = process.port_owner(port)
                owned = owned or owner is not None
                who = f"pid {owner} ({_program(owner)})" if owner else "a socket with no listener"
                busy.append(f"{port} ({comp}) is held by {who}")
            if not busy:
                return
            # Without a listener, the kernel is still closing a killed process's connections: wait.
            if owned or time.monotonic() > deadline:
                raise FactoryError(
                    "ports in use: " + "; ".join(busy) + ". Stop that process, or choose other ports with "
                    "--port-base (each factory uses 8 consecutive ports)."
                )
            time.sleep(1)

    def _start(self, timeout: float) -> State:
        t0 = time.monotonic()
        cfg = self.config
        for sub in ("etcd", "prometheus/data"):
            shutil.rmtree(self.run / sub, ignore_errors=True)
        (self.run / "logs").mkdir(parents=True, exist_ok=True)
        self.file_sd_dir.mkdir(parents=True, exist_ok=True)
        make_pki(self.run / "pki")
        self._write_kubeconfig()
        self._write_kwok_config()
        self._write_prometheus_config()
        state = State(racks=cfg.racks, gpu=cfg.gpu, port_base=cfg.port_base, started=time.time())
        self.write_state(state)
        deadline = t0 + timeout
        try:
            for comp in cfg.components:
                state.pids[comp] = process.start(self._argv(comp), self.log(comp))
                self.write_state(state)
                if comp in ("etcd", "kube-apiserver"):
                    self._wait(comp, state, deadline)
                    state.phases[f"{comp}_ready"] = round(time.monotonic() - t0, 2)
            if cfg.bare:
                state.ready_seconds = round(time.monotonic() - t0, 2)
                self.write_state(state)
                self._write_env()
                return state
            self._create_nodes()
            state.phases["nodes_created"] = round(time.monotonic() - t0, 2)
            for comp in cfg.components:
                self._wait(comp, state, deadline)
            state.phases["components_healthy"] = round(time.monotonic() - t0, 2)
            self._wait_nodes_ready(state, deadline)
            state.phases["nodes_ready"] = round(time.monotonic() - t0, 2)
            self._wait_default_service_account(state, deadline)
            state.phases["default_service_account"] = round(time.monotonic() - t0, 2)
        except BaseException:
            self.say(f"factory failed to start; stopping what was started (logs kept in {self.run / 'logs'})")
            self._stop_all(state)
            raise
        state.ready_seconds = round(time.monotonic() - t0, 2)
        self.write_state(state)
        self._write_env()
        return state

    def _argv(self, comp: str) -> list[str]:
        cfg, pki, run = self.config, self.pki, self.run
        kc = str(self.kubeconfig)
        if comp == "etcd":
            client, peer = f"http://127.0.0.1:{cfg.port('etcd')}", f"http://127.0.0.1:{cfg.port('etcd-peer')}"
            return [
                self.binary("etcd"),
                "--name=tokenfab",
                f"--data-dir={run / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=tokenfab={peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ]
        if comp == "kube-apiserver":
            return [
                self.binary("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{cfg.port('etcd')}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={cfg.port('kube-apiserver')}",
                f"--tls-cert-file={pki.server_crt}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_crt}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--event-ttl=2h",
                *(
                    [f"--feature-gates={GANG_FEATURE_GATES}", f"--runtime-config={GANG_RUNTIME_CONFIG}"]
                    if cfg.gang_api
                    else []
                ),
            ]
        if comp in ("kube-controller-manager", "kube-scheduler"):
            argv = [
                self.binary(comp),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={cfg.port(comp)}",
                "--leader-elect=false",
                "--profiling=false",
            ]
            if comp == "kube-controller-manager":
                argv += [
                    f"--root-ca-file={pki.ca_crt}",
                    f"--service-account-private-key-file={pki.sa_key}",
                    "--use-service-account-credentials=true",
                    f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                    "--concurrent-gc-syncs=10",
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                ]
                if cfg.gang_api:  # the PodGroup protection controller (removes PodGroups' finalizer)
                    argv.append(f"--feature-gates={GANG_FEATURE_GATES}")
            else:
                argv += ["--kube-api-qps=200", "--kube-api-burst=400"]
                if cfg.gang_api:
                    argv.append(f"--feature-gates={GANG_FEATURE_GATES}")
            return argv
        if comp == "kwok":
            return [
                self.binary("kwok"),
                f"--kubeconfig={kc}",
                f"--config={run / 'kwok.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-label-selector={FACTORY_LABEL}",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                f"--server-address=127.0.0.1:{cfg.port('kwok')}",
            ]
        if comp == "prometheus":
            return [
                self.binary("prometheus"),
                f"--config.file={run / 'prometheus' / 'prometheus.yml'}",
                f"--storage.tsdb.path={run / 'prometheus' / 'data'}",
                f"--web.listen-address=127.0.0.1:{cfg.port('prometheus')}",
                "--storage.tsdb.retention.time=1d",
                "--web.enable-lifecycle",
            ]
        if (
            comp == "drivers"
        ):  # simulated node drivers: NVIDIA DRA (ComputeDomains, IMEX channels), local volumes
            return [
                sys.executable,
                "-m",
                DRIVERS_MODULE,
                f"--kubeconfig={kc}",
                f"--port={cfg.port(comp)}",
            ]
        raise ValueError(comp)

    def _write_kubeconfig(self) -> None:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tokenfab",
                    "cluster": {"server": self.apiserver_url, "certificate-authority": str(self.pki.ca_crt)},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(self.pki.admin_crt),
                        "client-key": str(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "tokenfab",
                    "context": {"cluster": "tokenfab", "user": "admin", "namespace": "default"},
                }
            ],
            "current-context": "tokenfab",
        }
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _write_kwok_config(self) -> None:
        stage_dir = self.config.bin_dir / "kwok-stage"
        docs = [yaml.safe_load((stage_dir / s).read_text()) for s in KWOK_STAGES]
        for doc in docs:
            if doc["metadata"]["name"] == "pod-ready":  # not for the live namespaces (see LIVE_POD_START)
                doc["spec"]["selector"]["matchExpressions"].append(
                    {
                        "key": f'.metadata.namespace | startswith("{LIVE_NAMESPACE_PREFIX}")',
                        "operator": "NotIn",
                        "values": ["true"],
                    }
                )
        docs.append(yaml.safe_load(LIVE_POD_START))
        docs.append(yaml.safe_load(FETCH_POD_COMPLETE))
        (self.run / "kwok.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def _write_prometheus_config(self) -> None:
        pki = self.pki
        config = {
            "global": {
                "scrape_interval": self.config.scrape_interval,
                "evaluation_interval": self.config.scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": "kube-apiserver",
                    "scheme": "https",
                    "tls_config": {
                        "ca_file": str(pki.ca_crt),
                        "cert_file": str(pki.admin_crt),
                        "key_file": str(pki.admin_key),
                    },
                    "scrape_interval": "15s",
                    "static_configs": [{"targets": [f"127.0.0.1:{self.config.port('kube-apiserver')}"]}],
                },
                {
                    # tokenfab's documented scrape job (Kubernetes pod discovery and its relabelling) on
                    # the fleet runner's loopback targets, which carry the labels that discovery gives a
                    # pod; the only addition is the mocker's metric names (MOCKER_METRICS)
                    "job_name": "tokenfab",
                    "file_sd_configs": [
                        {"files": [str(self.file_sd_dir / "*.json")], "refresh_interval": "2s"}
                    ],
                    "relabel_configs": documented_scrape_job()["relabel_configs"],
                    "metric_relabel_configs": MOCKER_METRICS,
                },
            ],
        }
        path = self.run / "prometheus" / "prometheus.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _write_env(self) -> None:
        lines = [
            "# Source this file to use the local AI factory: `source " + str(self.env_file) + "`",
            f"export KUBECONFIG={self.kubeconfig}",
            f"export PATH={self.config.bin_dir}:{Path(sys.executable).parent}:$PATH",
            f"export TOKENFAB_FACTORY_DIR={self.run}",
            f"export TOKENFAB_PROMETHEUS_URL={self.prometheus_url}",
            f"export TOKENFAB_FILE_SD_DIR={self.file_sd_dir}",
        ]
        self.env_file.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ health
    def _https(self, url: str, client_cert: bool) -> tuple[int, str]:
        ctx = (
            ssl.create_default_context(cafile=str(self.pki.ca_crt))
            if client_cert
            else ssl._create_unverified_context()
        )
        if client_cert:
            ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return _get(url, ctx)

    def health(self, comp: str) -> tuple[bool, str]:
        cfg = self.config
        try:
            if comp == "etcd":
                code, body = _get(f"http://127.0.0.1:{cfg.port('etcd')}/health")
                return code == 200 and '"health":"true"' in body.replace(" ", ""), body.strip()[:80]
            if comp == "kube-apiserver":
                code, body = self._https(f"{self.apiserver_url}/readyz", client_cert=True)
            elif comp in ("kube-controller-manager", "kube-scheduler"):
                code, body = self._https(f"https://127.0.0.1:{cfg.port(comp)}/healthz", client_cert=False)
            elif comp == "kwok":
                code, body = _get(f"http://127.0.0.1:{cfg.port('kwok')}/healthz")
            elif comp == "prometheus":
                code, body = _get(f"{self.prometheus_url}/-/ready")
            elif comp == "drivers":
                code, body = _get(f"http://127.0.0.1:{cfg.port(comp)}/healthz")
            else:
                raise ValueError(comp)
        except (OSError, ssl.SSLError) as exc:
            return False, f"not answering: {exc}"[:120]
        return code == 200, f"HTTP {code} {body.strip()[:60]}"

    def _wait(self, comp: str, state: State, deadline: float) -> None:
        pid = state.pids[comp]
        while True:
            if not process.alive(pid):
                raise FactoryError(
                    f"{comp} exited during start-up; last lines of {self.log(comp)}:\n"
                    + process.tail(self.log(comp))
                )
            ok, detail = self.health(comp)
            if ok:
                return
            if time.monotonic() > deadline:
                raise FactoryError(f"{comp} not healthy in time ({detail}); see {self.log(comp)}")
            time.sleep(0.25)

    def component_status(self, state: State | None = None) -> list[ComponentStatus]:
        state = state or self.read_state()
        out = []
        for comp in self.config.components:
            pid = state.pids.get(comp) if state else None
            running = pid is not None and process.alive(pid, _expect(comp))
            healthy, detail = self.health(comp) if running else (False, "not running")
            out.append(
                ComponentStatus(
                    comp, pid, running, healthy, detail, process.rss_bytes(pid) if pid and running else 0
                )
            )
        return out

    # ------------------------------------------------------------------ nodes
    def api(self) -> Any:
        """An official kubernetes-client ApiClient for this factory (admin)."""
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    def _create_nodes(self) -> None:
        from kubernetes import client

        system = SYSTEMS[self.config.gpu]
        nodes = rack_nodes(system, self.config.racks, self.config.name)
        api = self.api()
        core = client.CoreV1Api(api)

        def create(node: dict[str, Any]) -> None:
            core.create_node(node)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, nodes))
        api.close()

    def node_counts(self) -> tuple[int, int]:
        """(Ready nodes, all nodes) of this factory."""
        from kubernetes import client

        api = self.api()
        try:
            nodes = client.CoreV1Api(api).list_node(label_selector=FACTORY_LABEL).items
        finally:
            api.close()
        ready = sum(
            1
            for n in nodes
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        )
        return ready, len(nodes)

    def _wait_nodes_ready(self, state: State, deadline: float) -> None:
        want = self.config.racks * 18
        while True:
            ready, _total = self.node_counts()
            if ready >= want:
                return
            for comp in self.config.components:
                if not process.alive(state.pids[comp]):
                    raise FactoryError(f"{comp} died; see {self.log(comp)}:\n" + process.tail(self.log(comp)))
            if time.monotonic() > deadline:
                raise FactoryError(f"only {ready}/{want} nodes Ready in time; see {self.log('kwok')}")
            time.sleep(0.5)

    def _wait_default_service_account(self, state: State, deadline: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = self.api()
        try:
            core = client.CoreV1Api(api)
            while True:
                try:
                    core.read_namespaced_service_account("default", "default")
                    return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                if time.monotonic() > deadline:
                    raise FactoryError(
                        "the default ServiceAccount never appeared; see "
                        f"{self.log('kube-controller-manager')}"
                    )
                time.sleep(0.25)
        finally:
            api.close()

    def restart_component(self, comp: str, timeout: float = 60.0) -> int:
        """Start a component that died (or was stopped) again with the same arguments; returns its pid."""
        state = self.read_state()
        if state is None:
            raise FactoryError(f"no factory in {self.run}")
        old = state.pids.get(comp)
        if old and process.alive(old, _expect(comp)):
            process.stop(old, _expect(comp))
        state.pids[comp] = process.start(self._argv(comp), self.log(comp))
        self.write_state(state)
        self._wait(comp, state, time.monotonic() + timeout)
        return state.pids[comp]

    @staticmethod
    def operator_argv(liveness_port: int) -> list[str]:
        """The operator's command line: health on `liveness_port`, metrics on `liveness_port + 1`."""
        return [
            sys.executable,
            "-m",
            "tokenfab.cli",
            "operator",
            "--liveness",
            f"http://127.0.0.1:{liveness_port}/healthz",
            "--metrics-port",
            str(liveness_port + 1),
        ]

    def start_operator(self, liveness_port: int, env: dict[str, str] | None = None) -> int:
        """The tokenfab operator as a process of this factory (stopped by PID with it), its health on
        `liveness_port` and its own metrics on `liveness_port + 1`."""
        return self.start_extra("operator", self.operator_argv(liveness_port), env=env)

    # ------------------------------------------------------------------ extra processes
    @property
    def procs_dir(self) -> Path:
        return self.run / "procs"

    def start_extra(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start a process that belongs with this factory (e.g. the operator); `down` stops it by PID."""
        self.stop_extra(name)
        pid = process.start(argv, self.log(name), env={"KUBECONFIG": str(self.kubeconfig), **(env or {})})
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        (self.procs_dir / f"{name}.json").write_text(json.dumps({"pid": pid, "argv": argv}))
        return pid

    def extra_pids(self) -> dict[str, int]:
        out = {}
        for f in sorted(self.procs_dir.glob("*.json")) if self.procs_dir.exists() else []:
            with contextlib.suppress(ValueError, OSError, KeyError):
                out[f.stem] = int(json.loads(f.read_text())["pid"])
        return out

    def stop_extra(self, name: str) -> bool:
        f = self.procs_dir / f"{name}.json"
        pid = self.extra_pids().get(name)
        stopped = pid is not None and process.stop(pid)
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
        return stopped

    # ------------------------------------------------------------------ down
    def _stop_all(self, state: State) -> list[str]:
        stopped = [name for name in self.extra_pids() if self.stop_extra(name)]
        for comp in reversed(COMPONENTS):
            pid = state.pids.get(comp)
            if pid is None:
                continue
            if pid and process.stop(pid, _expect(comp)):
                stopped.append(comp)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        return stopped

    def down(self, purge: bool = False) -> list[str]:
        """Stop every component by PID. Logs stay for diagnosis unless `purge`."""
        with self.locked():
            state = self.read_state()
            stopped = self._stop_all(state) if state else []
            for sub in ("etcd", "prometheus/data"):
                shutil.rmtree(self.run / sub, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                self.env_file.unlink()
        if purge:
            shutil.rmtree(self.run, ignore_errors=True)
        return stopped


def _expect(comp: str) -> str:
    return {"drivers": DRIVERS_MODULE}.get(comp, comp)


def _get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            return int(resp.status), resp.read(2000).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(2000).decode(errors="replace")


def _program(pid: int) -> str:
    argv = process.cmdline(pid).split()
    return Path(argv[0]).name if argv else "?"
