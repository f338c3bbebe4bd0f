"""The fleet runner: plays the kubelet for inference pods on the factory's simulated nodes.

kwok runs the pods the operator creates only on paper. This loop watches them and, for each Running pod,
runs the process the pod's container would run, on loopback (e2e/fleet/pods.py says exactly what differs
from the pod spec: the engine, the ports, and what a kubelet adds):

- a worker pod: its launcher's plan, from the pod's env, args and engine ConfigMap, with dynamo.trtllm
  swapped for `python -m dynamo.mocker` (a multi-node group is one engine, on rank 0; the other ranks
  run nothing);
- a frontend pod: its own `python -m dynamo.frontend` command line.

The processes find each other as they would on a real cluster: Dynamo's kubernetes discovery, against the
factory's API server, with each pod's ServiceAccount token (a TokenRequest bound to the pod). A worker is
routed to while its pod is ready in the EndpointSlice of its deployment's workers Service; the runner
plays the kubelet's part in that:
- readiness, in the live-* namespaces (where kwok starts pods but leaves them not ready, see
  tokenfab_factory.files.LIVE_POD_START): a pod's ContainersReady follows its readiness probe (the
  engine's or the frontend's /health answering 200; a rank that runs nothing is ready once started) and
  Ready is ContainersReady with every readiness gate True, so a leader whose tokenfab.dev/routable gate
  turns False leaves routing through its EndpointSlice, as on a real cluster;
- a pod being deleted leaves its EndpointSlice at once (the endpoint controller sees the deletion), runs
  its preStop (the sleep it declares), then its process gets SIGTERM and, after the pod's
  terminationGracePeriodSeconds, SIGKILL; a pod that Failed is stopped at once.
Each process is stopped by PID when it is done and when the runner stops. Each is published to
Prometheus as one file_sd target file (written atomically) carrying the labels Prometheus' Kubernetes
discovery gives a pod, which the factory's Prometheus relabels with the scrape config tokenfab documents
(charts/tokenfab/prometheus/scrape-config.yaml).

The runner's state (processes, their ports, the frontend URLs, every PID it ever started) is written to
`<state-dir>/state.json` after every pass, for the scenario and the tests (e2e/fleet/state.py).

This module is the loop (`Runner`) and its command line; its parts live beside it: the processes and their
ports (procs.py), what it reads off a pod object (podview.py), its API client (api.py), the kubelet's probes
and the pod status written from them (probes.py), and the state file (state.py).

Run it through `Factory.start_extra` (see `start`) so the factory also stops it by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.fleet import fabric, isolation, pods, podview, probes, state, weights_model
from e2e.fleet.api import Api
from e2e.fleet.procs import PortPool, Proc, foreign_connections, spawn
from tokenfab.planning import contract
from tokenfab_factory import process

# Both ranges lie below the kernel's ephemeral range (32768-60999 by default). A port the runner gives a
# process is free when it is taken, and bound by the process a few seconds later, after its start: in
# the ephemeral range, a socket another process binds to port 0 meanwhile (Dynamo's ZMQ publishers, its
# TCP request plane, any outgoing connection) could take it first. That happened: a prefill mocker's
# bootstrap port was taken so, its engine never started, and the worker it registered answered every
# request routed to it with 503 for a whole benchmark run.
# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit integer: a port above 32767 makes every worker
# exit ("invalid value unsigned int `36901`, expected i16"); the workers' system servers (/health,
# /metrics) take theirs from the second range, everything else (frontends, prefill bootstrap) from the first.
DEFAULT_PORTS = (27100, 27899)
DEFAULT_SYSTEM_PORTS = (26100, 26899)
# Dynamo 1.6.1's mocker refuses disaggregated serving with --engine-type trtllm ("mocker handoff does not
# support TRT-LLM"): disaggregated workers emulate the engine with the vllm timing and metric names;
# aggregated workers use trtllm. Either way the factory's Prometheus renames the mocker's engine metrics to
# the real worker's (see tokenfab_factory.files.MOCKER_METRICS).
ENGINE_AUTO = "auto"
LIVE_PREFIX = "live-"  # the namespaces whose pods' readiness the runner plays (see probes.probe)


@dataclass
class Options:
    kubeconfig: str
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
    # A new engine's weights from the hub take this long (a cold start); a warm model cache takes its
    # published share of it (e2e/fleet/weights_model.py: a model of time).
    start_delay_seconds: float = 0.0


class Runner:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.api = Api(opts.kubeconfig)
        self.ports = PortPool(*opts.ports)
        self.system_ports = PortPool(*opts.system_ports)
        self.procs: dict[str, Proc] = {}
        self.history: list[dict[str, Any]] = []  # every process ever started, with start/stop times
        self.backoff: dict[str, float] = {}
        self.pending: dict[str, float] = {}  # engines held back while their weights load: key -> due
        self.weights = weights_model.CacheModel(opts.start_delay_seconds)
        self.paths: dict[str, dict[str, Any]] = {}  # key -> its modeled weights path and seconds
        # weights-fetch pods: key -> when their download completes, and their model cache
        self.fetch_due: dict[str, tuple[float, str | None]] = {}
        self.fetches: list[dict[str, Any]] = []  # every weights-fetch pod completed, with its modeled time
        self.terminating: dict[str, Proc] = {}  # pod uid -> process of a deleted pod, draining
        self.stop_event = threading.Event()
        self.errors = 0
        self.foreign: list[dict[str, str]] = []  # connections outside loopback seen (must stay empty)
        self.cliques: dict[str, str] = {}  # node -> its NVLink domain (the simulated fabric)
        self.listed: dict[str, list[dict[str, Any]]] = {}  # this pass's pods by namespace
        self.refused: list[dict[str, Any]] = []  # engines the simulated fabric failed at NCCL init
        # every process in a mount namespace of its own, seeing its own pod directory and volumes only
        self.isolate = isolation.available()
        if not self.isolate:
            print("runner: not root (or no unshare): pods share one filesystem", file=sys.stderr, flush=True)
        (opts.state_dir / "pods").mkdir(parents=True, exist_ok=True)
        (opts.state_dir / ".stage").mkdir(parents=True, exist_ok=True)
        self.logs = opts.state_dir / "logs"
        for d in (opts.state_dir, opts.file_sd_dir, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------- observe
    def pods(self) -> list[dict[str, Any]] | None:
        ns = self.opts.namespaces
        path = f"/api/v1/namespaces/{ns[0]}/pods" if len(ns) == 1 else "/api/v1/pods"
        try:
            items = self.api(
                "GET", path, [("labelSelector", f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}")]
            )["items"]
            return [p for p in items if not ns or p["metadata"]["namespace"] in ns]
        except (pods.PodError, ValueError, KeyError, TypeError) as exc:
            self.errors += 1
            print(f"runner: listing pods failed: {exc}", file=sys.stderr, flush=True)
            return None

    def node_names(self) -> set[str] | None:
        """The Nodes that exist (a pod bound to one that does not is on a machine that died); their NVLink
        domains are kept for the simulated fabric."""
        try:
            items = self.api("GET", "/api/v1/nodes")["items"]
            self.cliques = {
                n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(fabric.CLIQUE_LABEL, "")
                for n in items
            }
            return set(self.cliques)
        except (pods.PodError, ValueError, KeyError, TypeError) as exc:
            self.errors += 1
            print(f"runner: listing nodes failed: {exc}", file=sys.stderr, flush=True)
            return None

    # ----------------------------------------------------------------------------- act
    def argv_for(self, kind: str, pod: dict[str, Any]) -> tuple[list[str], dict[str, str], Proc]:
        """The pod's own process (see e2e/fleet/pods.py), its ports swapped for free ones."""
        o = self.opts
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        labels = meta.get("labels", {})
        env = pods.resolve_env(pod)
        home = self.pod_dir(pod) / "home"
        home.mkdir(parents=True, exist_ok=True)
        config = self.pod_kubeconfig(pod) if pods.mounts_token(pod) else None
        path = f"{Path(o.dynamo_python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        ports: dict[str, int] = {}
        if kind == "frontend":
            ports["http"] = self.ports.take()
            argv = [o.dynamo_python, *pods.frontend_args(pod, ports["http"])]
            penv = pods.process_env(env, path=path, home=str(home), kubeconfig=config, ports={})
            url = f"http://127.0.0.1:{ports['http']}"
            proc = Proc(
                key, meta["uid"], kind, 0, ports, podview.pod_labels(pod, "frontend", ""), time.time(), url
            )
            proc.node = pod["spec"].get("nodeName") or ""
            proc.metrics_url = f"{url}/metrics"
            proc.health_url = f"{url}{contract.HEALTH_PATH}"
            proc.target = pods.target_labels(pod, "http")
            return argv, penv, proc
        engine = pods.engine_of(pod, env, self.configmap(meta["namespace"], pods.engine_configmap(pod)))
        if engine is None:
            raise pods.PodError("a follower rank runs no engine")
        mode = env.get(contract.ENV_DISAGGREGATION_MODE, contract.MODE_AGGREGATED)
        engine_type = o.engine_type
        if engine_type == ENGINE_AUTO:
            engine_type = "trtllm" if mode == contract.MODE_AGGREGATED else "vllm"
        ports["system"] = self.system_ports.take()
        if mode == "prefill":
            ports["bootstrap"] = self.ports.take()
        gbps = fabric.PATH_GBPS[self.kv_path(pod)] if mode == "prefill" else None
        mocker = pods.Mocker(
            str(o.model_dir),
            o.blocks_per_gpu,
            o.block_size,
            o.speedup_ratio,
            engine_type,
            gbps,
            fabric.KV_BYTES_PER_TOKEN if mode == "prefill" else None,
        )
        argv = [o.dynamo_python, *pods.mocker_argv(engine, mocker, ports.get("bootstrap"))]
        swapped = {contract.ENV_DYN_SYSTEM_PORT: str(ports["system"])}
        penv = pods.process_env(env, path=path, home=str(home), kubeconfig=config, ports=swapped)
        role = labels.get(contract.LABEL_ROLE, "worker")
        group = labels.get(contract.LABEL_GROUP, meta["name"])
        proc = Proc(key, meta["uid"], "mocker", 0, ports, podview.pod_labels(pod, role, group), time.time())
        proc.node = pod["spec"].get("nodeName") or ""
        proc.metrics_url = f"http://127.0.0.1:{ports['system']}/metrics"
        proc.health_url = f"http://127.0.0.1:{ports['system']}{contract.HEALTH_PATH}"
        proc.target = pods.target_labels(pod, "metrics")
        return argv, penv, proc

    def refuse(self, pod: dict[str, Any], running: list[dict[str, Any]]) -> bool:
        """Whether the simulated fabric fails this engine at NCCL init (e2e/fleet/fabric.py): then, as a
        kubelet reports a container that exited 1 under restartPolicy Never, its pod is Failed with the
        error as its termination message, and nothing is started."""
        if not fabric.asks_mnnvl(pod):
            return False
        ns = pod["metadata"]["namespace"]
        group = fabric.group_of(pod, [p for p in running if p["metadata"]["namespace"] == ns])
        claims = {
            str(cl["metadata"]["name"]): cl
            for cl in self.api("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
        }
        why = fabric.nccl_refusal(group, claims, self.cliques)
        if why is None:
            return False
        key = f"{ns}/{pod['metadata']['name']}"
        (self.logs / f"{key.replace('/', '_')}.log").write_text(f"NCCL WARN {why}\n")
        probes.patch_status(
            self.api,
            pod,
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": pods.container(pod)["name"],
                            "image": pods.container(pod).get("image", ""),
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": why}},
                        }
                    ],
                }
            },
        )
        self.refused.append({"key": key, "at": time.time(), "why": why})
        print(f"runner: engine of {key} failed at NCCL init: {why}", flush=True)
        return True

    def kv_path(self, pod: dict[str, Any]) -> str:
        """The simulated fabric's path for a prefill engine's KV hand-over (fabric.unit_path)."""
        ns = pod["metadata"]["namespace"]
        listed = self.listed.get(ns, [])
        claims = {
            str(cl["metadata"]["name"]): cl
            for cl in self.api("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
        }
        return fabric.unit_path(pod, listed, claims, self.cliques)

    def project(self, pod: dict[str, Any]) -> list[tuple[Path, str]]:
        """The pod's downward-API volumes written into its directory, as a kubelet projects them: (the
        directory, where the container mounts it)."""
        out = []
        for name, mount, files in pods.downward_volumes(pod):
            where = self.pod_dir(pod) / "volumes" / name
            where.mkdir(parents=True, exist_ok=True)
            for path, value in files.items():
                (where / path).write_text(value)
            out.append((where, mount))
        return out

    def pod_dir(self, pod: dict[str, Any]) -> Path:
        meta = pod["metadata"]
        return self.opts.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"

    def configmap(self, namespace: str, name: str) -> str:
        """The engine YAML the pod mounts (as the kubelet would project the ConfigMap)."""
        doc = self.api("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return str((doc.get("data") or {}).get(contract.ENGINE_CONFIG_FILE, ""))

    def pod_kubeconfig(self, pod: dict[str, Any]) -> str:
        """The pod's ServiceAccount token, as a kubelet projects it: a TokenRequest bound to the pod (void
        once the pod is gone), written into a kubeconfig for the API server on loopback."""
        meta = pod["metadata"]
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],  # (the API server's own)
                "expirationSeconds": 24 * 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{pods.service_account(pod)}/token"
        token = str(self.api("POST", path, body=request)["status"]["token"])
        cluster = yaml.safe_load(Path(self.opts.kubeconfig).read_text())["clusters"][0]["cluster"]
        doc = pods.kubeconfig(cluster["server"], cluster["certificate-authority"], token)
        kubeconfig = self.pod_dir(pod) / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(doc))
        kubeconfig.chmod(0o600)
        return str(kubeconfig)

    def model_cache(self, pod: dict[str, Any]) -> str | None:
        """The pod's model cache, as the weights model knows it: its node-local claim's uid and the
        weights (source@revision) the pod loads; None for a per-pod emptyDir (or no cache at all)."""
        meta = pod["metadata"]
        claim = next(
            (
                v["persistentVolumeClaim"]["claimName"]
                for v in pod["spec"].get("volumes") or []
                if v.get("name") == "model-cache" and "persistentVolumeClaim" in v
            ),
            None,
        )
        if claim is None:
            return None
        try:
            got = self.api("GET", f"/api/v1/namespaces/{meta['namespace']}/persistentvolumeclaims/{claim}")
            uid = str(got["metadata"]["uid"])
        except (pods.PodError, KeyError, TypeError):
            uid = f"{meta['namespace']}/{claim}"
        env = {
            e["name"]: e.get("value", "") for ctr in pod["spec"]["containers"] for e in ctr.get("env") or []
        }
        source, revision = env.get(contract.ENV_MODEL_SOURCE, ""), env.get(contract.ENV_MODEL_REVISION)
        return f"{uid.strip()}:{source}@{revision or 'main'}"

    def start(self, kind: str, pod: dict[str, Any]) -> None:
        argv, env, proc = self.argv_for(kind, pod)
        proc.grace, proc.prestop = podview.grace(pod)
        name = proc.key.replace("/", "_")
        if self.isolate:  # (the pod's own directory only; a frontend mounts no model: isolation.py)
            hide = [self.opts.model_dir] if kind == "frontend" else []
            pods_dir, stage = self.opts.state_dir / "pods", self.opts.state_dir / ".stage"
            argv = isolation.isolated(
                argv, own=self.pod_dir(pod), pods=pods_dir, stage=stage, hide=hide, volumes=self.project(pod)
            )
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
                # the pod's creation (the scale-up) and its first healthy probe (serving), wall clock
                "created_at": podview.epoch(pod["metadata"].get("creationTimestamp")),
                "healthy_at": None,
                "generation": pod["metadata"].get("labels", {}).get(contract.LABEL_REVISION, "")[:8],
                "labels": proc.labels,
                # the modeled weights path and hold (weights_model), for an engine held back
                **({"weights": self.paths.pop(proc.key)} if proc.key in self.paths else {}),
            }
        )
        self.publish(proc)
        print(f"runner: started {kind} for {proc.key} pid {proc.pid} ports {proc.ports}", flush=True)

    def target_file(self, proc: Proc) -> Path:
        return self.opts.file_sd_dir / f"fleet-{proc.key.replace('/', '_')}-{proc.uid[:8]}.json"

    def publish(self, proc: Proc) -> None:
        port = proc.ports["http"] if proc.kind == "frontend" else proc.ports["system"]
        doc = [{"targets": [f"127.0.0.1:{port}"], "labels": proc.target}]
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
        self.listed = {}  # (this pass's pods by namespace, for the simulated fabric)
        for p in pods:
            self.listed.setdefault(p["metadata"]["namespace"], []).append(p)
        nodes = self.node_names()
        lost = (
            set()
            if nodes is None
            else {k for k, p in by_key.items() if p["spec"].get("nodeName") not in nodes}
        )
        desired: dict[str, tuple[str, dict[str, Any]]] = {}
        for key, listed in by_key.items():
            kind = podview.wanted(listed)
            if kind and key not in lost:
                desired[key] = (kind, listed)
        now = time.monotonic()
        if nodes is not None:  # a machine that died takes its processes with it, at once (no grace)
            for proc in [*self.procs.values(), *self.terminating.values()]:
                if proc.node and proc.node not in nodes:
                    if self.procs.get(proc.key) is proc:
                        del self.procs[proc.key]
                    process.stop(proc.pid, expect="dynamo", timeout=0)
                    self.finish(proc, "node lost")
                    print(f"runner: {proc.kind} for {proc.key} killed: node {proc.node} is gone", flush=True)
        for proc in list(self.terminating.values()):
            self.progress(proc, now)
        for key in list(self.procs):
            proc = self.procs[key]
            pod = by_key.get(key)
            same = pod is not None and pod["metadata"]["uid"] == proc.uid
            if same and pod is not None and pod.get("status", {}).get("phase") == "Failed":
                self.stop(key, "pod failed")
            elif not same or key not in desired:
                self.terminate(
                    proc, now, "pod deleted" if not same or podview.deleting(pod) else "pod stopped"
                )
            elif not process.alive(proc.pid):
                print(f"runner: {proc.kind} for {key} (pid {proc.pid}) exited; restarting", flush=True)
                self.stop(key, "exited")
                self.backoff[key] = time.monotonic() + self.opts.restart_backoff_seconds
            elif proc.kind == "mocker" and pod is not None:
                routable = podview.routable(pod)
                if routable is False and not proc.out_of_routing:
                    # (the EndpointSlice drops it once probes.probe writes Ready=False: Dynamo stops routing)
                    probes.record_counters(self.history, proc, "at_cordon")
                    proc.out_of_routing = True
                elif routable is not False and proc.out_of_routing:
                    proc.out_of_routing = False
        for key, (kind, pod) in sorted(desired.items()):
            if key not in self.procs and self.backoff.get(key, 0) <= now:
                if kind == "mocker" and self.opts.start_delay_seconds > 0:
                    # A real engine loads its weights before it registers: for minutes from the hub,
                    # for seconds from a node's warm model cache (weights_model, a model of time).
                    if key not in self.pending:
                        path, hold = self.weights.hold(self.model_cache(pod), now)
                        self.pending[key], self.paths[key] = (
                            now + hold,
                            {"path": path, "hold_s": round(hold, 1)},
                        )
                    if now < self.pending[key]:
                        continue
                try:
                    if kind == "mocker" and self.refuse(pod, list(by_key.values())):
                        continue
                    self.start(kind, pod)
                    self.pending.pop(key, None)
                except Exception as exc:
                    self.errors += 1
                    print(f"runner: could not start {kind} for {key}: {exc}", file=sys.stderr, flush=True)
        for key in [k for k in self.pending if k not in desired]:  # deleted while its weights loaded
            self.pending.pop(key)
            self.paths.pop(key, None)
        for key, pod in by_key.items():
            if not pod["metadata"]["namespace"].startswith(LIVE_PREFIX) or podview.deleting(pod):
                continue
            if podview.is_fetch(pod):
                self.play_fetch(key, pod, now)
            elif not probes.probe(self.api, self.history, key, pod, self.procs.get(key)):
                self.errors += 1  # (its readiness was not written)
        for key in [k for k in self.fetch_due if k not in by_key]:  # deleted before its download ended
            _due, cache = self.fetch_due.pop(key)
            self.weights.abandon(cache, now)

    # --------------------------------------------------------------------------- weights-fetch pods
    def play_fetch(self, key: str, pod: dict[str, Any], now: float) -> None:
        """A weights-fetch pod runs no process here: its download into the node's model cache is the
        weights model's (weights_model.CacheModel.download), and once that is done its container exits 0
        and the pod Succeeds, as a kubelet reports it."""
        if pod.get("status", {}).get("phase") != "Running":
            return
        if key not in self.fetch_due:
            cache = self.model_cache(pod)
            seconds = self.weights.download(cache, now) if self.opts.start_delay_seconds else 0.0
            self.fetch_due[key] = (now + seconds, cache)
            print(f"runner: {key} downloads its weights in {seconds:.1f} s (modeled)", flush=True)
        if now < self.fetch_due[key][0]:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = [
            {
                "name": ctr["name"],
                "image": ctr.get("image", ""),
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": stamp}},
            }
            for ctr in pod["spec"]["containers"]
        ]
        patch = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
        try:
            probes.patch_status(self.api, pod, patch)
        except pods.PodError as exc:
            self.errors += 1
            print(f"runner: completion of {key} not written: {exc}", file=sys.stderr, flush=True)
            return
        due, _cache = self.fetch_due.pop(key)
        self.fetches.append(
            {"key": key, "node": pod["spec"].get("nodeName", ""), "completed_at": time.time()}
        )
        print(f"runner: {key} Succeeded (its download was due at {due:.1f})", flush=True)

    # ------------------------------------------------------------------ routing and termination
    def terminate(self, proc: Proc, now: float, reason: str) -> None:
        """As the kubelet does for a deleted pod: out of routing now, preStop, SIGTERM, then SIGKILL."""
        # (A new pod of the same name may come while this one drains: it is tracked by uid from now on.)
        self.procs.pop(proc.key, None)
        self.terminating[proc.uid] = proc
        proc.terminating_since = now
        proc.sigterm_at = now + proc.prestop
        if proc.kind == "mocker" and not proc.out_of_routing:
            # (its EndpointSlice entry turned not ready with the deletion: Dynamo stops routing to it)
            probes.record_counters(self.history, proc, "at_cordon")
            proc.out_of_routing = True
        for h in self.history:
            if h["pid"] == proc.pid and h["stopped_at"] is None:
                h["terminating_at"] = time.time()
                h["reason"] = reason
        print(
            f"runner: {proc.key} terminating ({reason}): SIGTERM in {proc.prestop:.0f} s, "
            f"SIGKILL after {proc.grace:.0f} s",
            flush=True,
        )
        self.progress(proc, now)

    def progress(self, proc: Proc, now: float) -> None:
        assert proc.terminating_since is not None
        assert proc.sigterm_at is not None
        if not process.alive(proc.pid):
            self.finish(proc, "exited after SIGTERM" if proc.sigterm_sent else "exited")
            return
        if not proc.sigterm_sent and now >= proc.sigterm_at:
            probes.record_counters(self.history, proc, "at_sigterm")
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
        state.write_state(
            self.opts.state_dir,
            running=running,
            errors=self.errors,
            foreign=self.foreign,
            model_dir=self.opts.model_dir,
            procs=self.procs,
            terminating=self.terminating,
            history=self.history,
            fetches=self.fetches,
            refused=self.refused,
            isolated=self.isolate,
        )

    def check_sockets(self) -> None:
        """Read every process's sockets: a connection to anything but 127.0.0.1 is recorded (and tested)."""
        for proc in [*self.procs.values(), *self.terminating.values()]:
            for remote in foreign_connections(proc.pid):
                entry = {"key": proc.key, "kind": proc.kind, "remote": remote}
                if entry not in self.foreign:
                    self.foreign.append(entry)
                    print(f"runner: {proc.key} is connected to {remote}, outside loopback", flush=True)

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.sync()
            self.check_sockets()
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
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
