"""For end-to-end tests and benchmarks: drive the factory with its own kubectl, as a user would; poll
until something holds; run the operator as a process of the factory and wait until it is healthy."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from tokenfab.planning import contract
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import GPU_RESOURCE

ROOT = Path(__file__).resolve().parent.parent


def kubectl(
    f: Factory, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the factory's kubectl against it, as a user would. With `check`, a failure raises with
    kubectl's own words (its stderr), not only the exit code."""
    out = subprocess.run(
        [str(f.config.bin_dir / "kubectl"), f"--kubeconfig={f.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and out.returncode != 0:
        raise KubectlError(out.returncode, out.args, out.stdout, out.stderr)
    return out


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}: {(self.stderr or '').strip()[:2000]}"


def apply_yaml(
    f: Factory, doc: dict[str, Any] | list[dict[str, Any]], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    docs = doc if isinstance(doc, list) else [doc]
    return kubectl(f, "apply", *args, "-f", "-", input=yaml.safe_dump_all(docs), check=check)


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 90.0, interval: float = 0.5) -> Any:
    """Poll until probe() returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def repeat_for(seconds: float, interval: float, action: Callable[[], None]) -> None:
    """Call `action` every `interval` seconds (after it returns) until `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        action()
        time.sleep(interval)


def get_json(f: Factory, *args: str, timeout: float = 120) -> Any:
    return json.loads(kubectl(f, "get", *args, "-o", "json", timeout=timeout).stdout)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return None


def install_crds(f: Factory) -> None:
    """Apply this checkout's CRDs and wait until the ModelDeployment kind is served."""
    kubectl(f, "apply", "--server-side", "-f", str(ROOT / "crds"))
    wait_established(f)


def wait_established(f: Factory, crd: str = "modeldeployments.tokenfab.dev", timeout: float = 60) -> None:
    """Until the CRD is Established. (kubectl 1.37's `wait --for=condition=Established` fails at once on a
    CRD whose status has no conditions yet, instead of waiting.)"""

    def established() -> bool:
        status = get_json(f, "crd", crd).get("status") or {}
        return any(
            cd.get("type") == "Established" and cd.get("status") == "True"
            for cd in status.get("conditions") or []
        )

    wait_for(f"CRD {crd} Established", established, timeout=timeout)


def namespace_maker(f: Factory, delete: Callable[[Factory, str], Any]) -> Iterator[Callable[[str], str]]:
    """For a fixture to `yield from`: a function that creates a namespace by name and returns the name;
    when the fixture ends, `delete(f, name)` for every namespace it created, in order."""
    made: list[str] = []

    def make(name: str) -> str:
        kubectl(f, "create", "namespace", name)
        made.append(name)
        return name

    yield make
    for ns in made:
        delete(f, ns)


def healthy(port: int) -> bool:
    """Whether the operator whose health endpoint is on `port` answers /healthz with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait_healthy(
    port: int, what: str = "the operator's health endpoint", timeout: float = 60.0, interval: float = 0.5
) -> None:
    wait_for(what, lambda: healthy(port), timeout=timeout, interval=interval)


def start_operator(f: Factory, liveness_port: int, extra_env: dict[str, str] | None = None) -> int:
    """The operator as a real process against the factory, with short resync intervals for tests."""
    env = {"TOKENFAB_RESYNC_SECONDS": "5", "TOKENFAB_INVENTORY_SECONDS": "3", **(extra_env or {})}
    return f.start_operator(liveness_port, env=env)


def operator_up(
    f: Factory,
    liveness_port: int,
    extra_env: dict[str, str] | None = None,
    what: str = "the operator's health endpoint",
) -> int:
    """`start_operator` (a running operator is stopped by PID first), then wait up to 60 s for its health
    endpoint; returns its PID."""
    pid = start_operator(f, liveness_port, extra_env)
    wait_healthy(liveness_port, what)
    return pid


@contextlib.contextmanager
def operator_replaced(
    f: Factory, liveness_port: int, extra_env: dict[str, str] | None = None
) -> Iterator[None]:
    """The session's operator, for the block: stopped (without `extra_env`), or restarted with
    `extra_env`. However the block ends, the operator is started again as the session runs it, and
    healthy, before the caller goes on."""
    if extra_env is None:
        f.stop_extra("operator")
    else:
        operator_up(f, liveness_port, extra_env, what="the operator back")
    try:
        yield
    finally:
        operator_up(f, liveness_port, what="the operator back")


def gpu_deployment(name: str, namespace: str, replicas: int, gpus: int) -> dict[str, Any]:
    """A plain Deployment (no operator, no gang) of `replicas` worker pods of `gpus` GPUs each, its pods
    labelled app=<name>."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "w", "image": "worker", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}
                    ]
                },
            },
        },
    }


def restore_node(f: Factory, node: dict[str, Any]) -> None:
    """Create a node again from an earlier `kubectl get node -o json` (its capacity, without the rest of
    its status: kwok marks it Ready again)."""
    node = json.loads(json.dumps(node))
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        node["metadata"].pop(key, None)
    node["status"] = {"capacity": node["status"]["capacity"], "allocatable": node["status"]["allocatable"]}
    kubectl(f, "create", "-f", "-", input=json.dumps(node), check=False)


def engine_configmaps(f: Factory, namespace: str, deployment: str, role: str) -> list[dict[str, Any]]:
    """The engine ConfigMaps of one role (one per revision still in use), by label."""
    sel = f"{contract.LABEL_DEPLOYMENT}={deployment},{contract.LABEL_ROLE}={role},{contract.COMPONENT}=worker"
    items: list[dict[str, Any]] = get_json(f, "configmap", "-n", namespace, "-l", sel)["items"]
    return items


class MetricsHandler(BaseHTTPRequestHandler):
    """The HTTP handler of a test exporter: a GET is answered with `metrics()` in the Prometheus text
    format, or 404 when it returns None; requests are not logged."""

    def metrics(self) -> bytes | None:
        raise NotImplementedError

    def do_GET(self) -> None:
        body = self.metrics()
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass
