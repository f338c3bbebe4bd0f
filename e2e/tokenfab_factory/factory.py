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

from tokenfab_factory import components, files, process
from tokenfab_factory.config import COMPONENTS, PORT_OFFSETS, FactoryConfig, FactoryError, Layout
from tokenfab_factory.pki import make_pki
from tokenfab_factory.racks import FACTORY_LABEL, SYSTEMS, rack_nodes


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


class Factory(Layout):
    """Control of one factory run directory."""

    def __init__(self, config: FactoryConfig, say: Callable[[str], None] = print) -> None:
        super().__init__(config)
        self.say = say

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
                    files.write_env(self)
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
        files.write_kubeconfig(self)
        files.write_kwok_config(self)
        files.write_prometheus_config(self)
        state = State(racks=cfg.racks, gpu=cfg.gpu, port_base=cfg.port_base, started=time.time())
        self.write_state(state)
        deadline = t0 + timeout
        try:
            for comp in cfg.components:
                state.pids[comp] = process.start(components.argv(self, comp), self.log(comp))
                self.write_state(state)
                if comp in ("etcd", "kube-apiserver"):
                    self._wait(comp, state, deadline)
                    state.phases[f"{comp}_ready"] = round(time.monotonic() - t0, 2)
            if cfg.bare:
                state.ready_seconds = round(time.monotonic() - t0, 2)
                self.write_state(state)
                files.write_env(self)
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
        files.write_env(self)
        return state

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
        state.pids[comp] = process.start(components.argv(self, comp), self.log(comp))
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
    return {"drivers": components.DRIVERS_MODULE}.get(comp, comp)


def _get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            return int(resp.status), resp.read(2000).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(2000).decode(errors="replace")


def _program(pid: int) -> str:
    argv = process.cmdline(pid).split()
    return Path(argv[0]).name if argv else "?"
