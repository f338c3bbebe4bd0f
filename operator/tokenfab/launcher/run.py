"""The launcher's process part: read the files, carry a LaunchPlan out, forward signals, serve health.

Kept thin on purpose: every decision is in tokenfab.launcher.plan and the pure modules it draws on
(identity, engine, weights). This module only touches the world: it reads the engine YAML, prepares the
private run directory (copies of the SSH key, sshd's config and host key), fetches hf:// weights into the
model cache, waits for the other ranks' SSH daemons, starts the command in its own process group, forwards
signals to that group, reaps orphaned processes (the launcher is PID 1 of the worker container), answers
/health and /metrics on followers and exits with the command's exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from tokenfab.launcher.fetch import log_result, main_fetch_only, obtain
from tokenfab.launcher.identity import ConfigError, read_identity
from tokenfab.launcher.obtained import EXIT_NOT_FOUND, LaunchError, log
from tokenfab.launcher.plan import EXIT_CONFIG, Endpoint, LaunchPlan, plan_launch
from tokenfab.launcher.weights import with_model_path
from tokenfab.planning import contract

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

USAGE = f"""usage: python3 -m {contract.LAUNCHER_MODULE} [--dry-run] [--] DYNAMO_WORKER_ARGS...

Start this pod's part of a tokenfab worker group:
`{contract.PYTHON} -m {contract.DYNAMO_WORKER_MODULE} DYNAMO_WORKER_ARGS` on a one-pod group, the same
under mpirun on rank 0 of a multi-node group, an SSH daemon for mpirun on the other ranks. The group
identity comes from the TOKENFAB_* environment the operator sets.

  --dry-run   validate the configuration, print the launch plan as JSON and exit

python3 -m {contract.LAUNCHER_MODULE} --fetch-only
  download the hf:// weights of TOKENFAB_MODEL_SOURCE at TOKENFAB_MODEL_REVISION into TOKENFAB_MODEL_CACHE
  (verified by their manifest when already there) and exit: what a weights-fetch pod runs
"""


class FetchInterruptedError(Exception):
    """A signal came while the weights were being downloaded."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def parse_args(argv: Sequence[str]) -> tuple[bool, bool, list[str]]:
    """(help, dry_run, dynamo args): launcher flags first, then an optional `--`, then Dynamo's."""
    dry_run = False
    args = list(argv)
    while args:
        if args[0] in ("-h", "--help"):
            return True, dry_run, []
        if args[0] == "--dry-run":
            dry_run = True
            args.pop(0)
            continue
        if args[0] == "--":
            args.pop(0)
        break
    return False, dry_run, args


def read_engine(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(
            [
                f"engine config {path} (from {contract.ENV_ENGINE_CONFIG}) cannot be read: "
                f"{exc.strerror or exc}; "
                f"the operator mounts the role's engine ConfigMap at {contract.ENGINE_CONFIG_DIR}"
            ]
        ) from exc


def resolve(program: str, environ: Mapping[str, str]) -> str:
    """The program's absolute path (sshd must be started by absolute path; mpirun by absolute path passes
    its installation prefix to the remote daemons)."""
    found = shutil.which(program, path=environ.get("PATH"))
    if found is None:
        raise LaunchError(
            f"{program} is not on PATH ({environ.get('PATH', '')}): run the tokenfab worker image "
            "(runtime-images/worker)",
            EXIT_NOT_FOUND,
        )
    return os.path.abspath(found)


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class Runner:
    """Carries one plan out; `run()` returns the exit code."""

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str]) -> None:
        self.plan = plan
        self.command = plan.command  # (its --model-path becomes the fetched snapshot's directory)
        self.fetching = False
        self.env = {**environ, **plan.env}
        self.child: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        self.started = time.time()
        self.server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------------------------- signals

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled = signum
        if self.fetching:  # a download holds no child: stop it now (the grace period would only wait)
            raise FetchInterruptedError(signum)
        child = self.child
        if child is not None and child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    def install_signal_handlers(self) -> None:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self._on_signal)

    # ------------------------------------------------------------------------------------- prepare

    def prepare(self) -> None:
        plan = self.plan
        if plan.run_dir is not None:
            os.makedirs(plan.run_dir, mode=0o700, exist_ok=True)
            os.chmod(plan.run_dir, 0o700)
        for copy in plan.copies:
            try:
                data = Path(copy.source).read_bytes()
            except OSError as exc:
                raise LaunchError(
                    f"{copy.source} cannot be read ({exc.strerror or exc}): a multi-node group needs the "
                    f"SSH key of Secret {contract.MPI_SSH_SECRET} (key "
                    f"{contract.MPI_SSH_PRIVATE_KEY}) mounted at "
                    f"{contract.ENV_MPI_SSH_DIR}; create it as runtime-images/README.md shows",
                    EXIT_CONFIG,
                ) from exc
            _write_private(copy.target, data)
        for path, content in plan.files:
            _write_private(path, content.encode())
        for step in plan.setup:
            full = [resolve(step.argv[0], self.env), *step.argv[1:]]
            out = subprocess.PIPE if step.stdout is not None else None
            done = subprocess.run(full, env=self.env, stdin=subprocess.DEVNULL, stdout=out, check=False)
            if done.returncode != 0:
                raise LaunchError(f"`{shlex.join(step.argv)}` failed with exit code {done.returncode}")
            if step.stdout is not None:
                _write_private(step.stdout, done.stdout)

    def fetch_weights(self) -> None:
        """hf:// weights at model.revision into the model cache (a node-local volume keeps them across pods
        and restarts), then the engine's --model-path points at that snapshot (not on followers: their
        command is the SSH daemon); the log says where they came from (tokenfab.launcher.fetch.obtain)."""
        fetch = self.plan.fetch
        if fetch is None:
            return
        got = obtain(fetch, self.env, self._downloading)
        log(f"weights {fetch.url()}: {got.path} ({got.origin()})")
        log_result(got)
        if self.plan.kind != "follower":
            try:
                self.command = with_model_path(self.command, got.path)
            except ConfigError as err:
                raise LaunchError("; ".join(err.problems), EXIT_CONFIG) from err

    def _downloading(self, on: bool) -> None:
        self.fetching = on

    def wait_for_peers(self) -> None:
        """Rank 0 of a multi-node group: wait until every other rank's SSH daemon accepts connections."""
        pending: list[Endpoint] = list(self.plan.wait_for)
        if not pending:
            return
        log(f"waiting up to {self.plan.wait_seconds} s for {len(pending)} rank(s) to accept SSH")
        deadline = time.monotonic() + self.plan.wait_seconds
        next_report = time.monotonic() + 30
        while pending:
            if self.signalled is not None:
                return
            for ep in list(pending):
                try:
                    with socket.create_connection((ep.host, ep.port), timeout=2):
                        pending.remove(ep)
                except OSError:
                    pass
            if not pending:
                break
            now = time.monotonic()
            if now >= deadline:
                raise LaunchError(
                    f"gave up after {self.plan.wait_seconds} s waiting for "
                    + ", ".join(f"{ep.host}:{ep.port}" for ep in pending)
                    + ": are those pods running? (raise "
                    + f"{contract.ENV_PEER_WAIT_SECONDS} if image pulls are slow)"
                )
            if now >= next_report:
                log("still waiting for " + ", ".join(ep.host for ep in pending))
                next_report = now + 30
            time.sleep(1)
        log("every rank accepts SSH")

    # ---------------------------------------------------------------------------------------- health

    def metrics_text(self) -> str:
        p = self.plan
        labels = (
            f'group="{p.group}",role="{p.role}",rank="{p.rank}",world_size="{p.world_size}",kind="{p.kind}"'
        )
        up = 1 if self.child is not None and self.child.returncode is None else 0
        return (
            "# HELP tokenfab_launcher_info The tokenfab worker launcher of a group rank.\n"
            "# TYPE tokenfab_launcher_info gauge\n"
            f"tokenfab_launcher_info{{{labels}}} 1\n"
            "# HELP tokenfab_launcher_child_up 1 while the rank's process runs.\n"
            "# TYPE tokenfab_launcher_child_up gauge\n"
            f"tokenfab_launcher_child_up {up}\n"
            "# HELP tokenfab_launcher_start_time_seconds When the launcher started (Unix time).\n"
            "# TYPE tokenfab_launcher_start_time_seconds gauge\n"
            f"tokenfab_launcher_start_time_seconds {self.started:.3f}\n"
        )

    def serve_health(self, endpoint: Endpoint) -> None:
        runner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == contract.HEALTH_PATH:
                    alive = runner.child is not None and runner.child.returncode is None
                    body = json.dumps({"status": "ready" if alive else "notready", "rank": runner.plan.rank})
                    self._send(200 if alive else 503, "application/json", body)
                elif path == contract.METRICS_PATH:
                    self._send(200, "text/plain; version=0.0.4", runner.metrics_text())
                else:
                    self._send(404, "text/plain", "not found\n")

            def _send(self, code: int, kind: str, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        try:
            self.server = ThreadingHTTPServer((endpoint.host, endpoint.port), Handler)
        except OSError as exc:
            raise LaunchError(f"cannot serve health on {endpoint.host}:{endpoint.port}: {exc}") from exc
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="health", daemon=True).start()
        log(
            f"answering {contract.HEALTH_PATH} and {contract.METRICS_PATH} on {endpoint.host}:{endpoint.port}"
        )

    # ------------------------------------------------------------------------------------------ run

    def start(self) -> None:
        argv = [resolve(self.command[0], self.env), *self.command[1:]]
        log(
            f"rank {self.plan.rank}/{self.plan.world_size} of {self.plan.group} ({self.plan.kind}): "
            + shlex.join(self.command)
        )
        self.child = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self) -> int:
        """Reap every child until the command exits (orphans are re-parented to PID 1: the launcher)."""
        child = self.child
        assert child is not None
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:  # already reaped (cannot happen unless someone else waits)
                return child.wait()
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)
                return child.returncode

    def run(self) -> int:
        self.install_signal_handlers()
        try:
            self.prepare()
            try:
                self.fetch_weights()
            except FetchInterruptedError as sig:
                log(f"stopped by signal {sig.signum} while fetching the weights")
                return 128 + sig.signum
            self.wait_for_peers()
            if self.signalled is not None:
                log(f"stopped by signal {self.signalled} before starting")
                return 128 + self.signalled
            self.start()
            if self.plan.health is not None:
                self.serve_health(self.plan.health)
        except LaunchError as err:
            log(str(err))
            if self.child is not None and self.child.returncode is None:
                os.killpg(self.child.pid, signal.SIGTERM)
                self.wait()
            return err.code
        code = self.wait()
        if self.server is not None:
            self.server.shutdown()
        exit_code = 128 - code if code < 0 else code
        log(f"{self.plan.command[0]} exited with code {exit_code}")
        return exit_code


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    if args == ["--fetch-only"]:  # a weights-fetch pod: stage the weights in the node's cache and exit
        return main_fetch_only(env)
    want_help, dry_run, dynamo_args = parse_args(args)
    if want_help:
        print(USAGE, end="")
        return 0
    run_dir: str | None = None
    try:
        identity = read_identity(env)
        engine_text = read_engine(identity.engine_config)
        if identity.world_size > 1 and not dry_run:
            run_dir = tempfile.mkdtemp(prefix="tokenfab-mpi-")
        plan = plan_launch(
            identity,
            engine_text,
            dynamo_args,
            environ=env,
            run_dir=run_dir or os.path.join(tempfile.gettempdir(), "tokenfab-mpi"),
            as_root=os.geteuid() == 0,
        )
    except ConfigError as err:
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        log("bad configuration:")
        for problem in err.problems:
            print(f"  - {problem}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if dry_run:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    return Runner(plan, env).run()
