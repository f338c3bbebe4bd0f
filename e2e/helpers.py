"""Helpers for end-to-end tests: drive the factory with its own kubectl, as a user would."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from tokenfab.planning import contract as c
from tokenfab_factory.factory import Factory


def kubectl(
    f: Factory, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the factory's kubectl against it, as a user would. With `check`, a failure raises with
    kubectl's own words (its stderr), not only the exit code."""
    out = subprocess.run(
        [str(f.config.bin_dir / "kubectl"), f"--kubeconfig={f.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
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


def get_json(f: Factory, *args: str) -> Any:
    return json.loads(kubectl(f, "get", *args, "-o", "json").stdout)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return None


def start_operator(f: Factory, liveness_port: int, extra_env: dict[str, str] | None = None) -> int:
    """The operator as a real process against the factory, with short resync intervals for tests."""
    env = {"TOKENFAB_RESYNC_SECONDS": "5", "TOKENFAB_INVENTORY_SECONDS": "3", **(extra_env or {})}
    return f.start_operator(liveness_port, env=env)


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
    sel = f"{c.LABEL_DEPLOYMENT}={deployment},{c.LABEL_ROLE}={role},{c.COMPONENT}=worker"
    items: list[dict[str, Any]] = get_json(f, "configmap", "-n", namespace, "-l", sel)["items"]
    return items
