"""Failures a user can cause or suffer are visible where they look, deletion always works, and the pods
tokenfab creates pass the restricted Pod Security Standard.

- A namespace whose ResourceQuota allows no pods: the ModelDeployment says so in a condition carrying the
  API server's quota message, posts one Event for it (not one per retry), and deletes cleanly.
- A pvc:// source on a claim only one node can attach (ReadWriteOnce) is named in the ModelSource
  condition and one Warning Event, with the fix.
- Every example runs Ready in a namespace enforcing the restricted Pod Security Standard.
- A ModelDeployment carrying the finalizer and spec copy of an older operator is cleaned up and deletes.
- The quick start (`e2e/up.sh`) leaves no Warning event behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from e2e.conftest import E2E_PORT_BASE, ROOT
from e2e.helpers import apply_yaml, condition, get_json, kubectl, wait_for
from testing.cases import EXAMPLES
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory


def small(name: str, ns: str) -> dict:
    return {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"name": "small", "source": "hf://tokenfab-test/small"},
            "serving": {"mode": "aggregated"},
            "worker": {"parallelism": {"tensor": 1}},
        },
    }


def test_a_refused_write_is_shown_in_a_condition_and_one_event_and_deletion_works(operator: Factory) -> None:
    f = operator
    ns = "quota"
    kubectl(f, "create", "namespace", ns)
    try:
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-pods", "namespace": ns},
            "spec": {"hard": {"pods": "0"}},
        }
        apply_yaml(f, quota)
        apply_yaml(f, small("starved", ns))

        def refused() -> dict | None:
            md = get_json(f, "mdep", "starved", "-n", ns)
            cond = condition(md, "Degraded")
            return md if cond and cond["reason"] == "ReconcileError" else None

        md = wait_for("Degraded=True with the API server's words", refused, timeout=60)
        degraded, ready = condition(md, "Degraded"), condition(md, "Ready")
        assert degraded["status"] == "True"
        assert "exceeded quota: no-pods" in degraded["message"], degraded["message"]
        assert ready["status"] == "False"
        assert ready["reason"] == "ReconcileError"
        assert "exceeded quota" in ready["message"]
        placed = condition(md, "Placed")  # no group exists: never "every group is bound whole"
        assert (placed["status"], placed["reason"]) == ("False", "CreateRefused"), placed
        assert "exceeded quota: no-pods" in placed["message"]
        row = kubectl(f, "get", "mdep", "starved", "-n", ns, "-o", "wide").stdout
        assert "ReconcileError" in row
        time.sleep(8)  # several retries (with backoff) later: still one Event for the one refusal
        events = get_json(f, "events", "-n", ns, "--field-selector", "involvedObject.name=starved")["items"]
        refusals = [e for e in events if e["reason"] == "ReconcileError"]
        assert len(refusals) == 1, [e["message"] for e in refusals]
        assert "exceeded quota" in refusals[0]["message"]
        assert refusals[0]["type"] == "Warning"
        # No finalizer to wait for: deletion finishes at once.
        assert not get_json(f, "mdep", "starved", "-n", ns)["metadata"].get("finalizers")
        t0 = time.monotonic()
        kubectl(f, "delete", "mdep", "starved", "-n", ns, "--timeout=30s")
        assert time.monotonic() - t0 < 30
    finally:
        kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def test_a_pvc_source_that_one_node_only_can_attach_is_named_in_a_condition_and_an_event(
    operator: Factory,
) -> None:
    f = operator
    ns = "pvc-source"
    kubectl(f, "create", "namespace", ns)
    try:
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "weights", "namespace": ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        apply_yaml(f, claim)
        md = small("from-pvc", ns)
        md["spec"]["model"]["source"] = "pvc://weights/small"
        apply_yaml(f, md)

        def said() -> dict | None:
            cond = condition(get_json(f, "mdep", "from-pvc", "-n", ns), "ModelSource")
            return cond if cond and cond["reason"] == "ClaimNotShared" else None

        cond = wait_for("ModelSource=False ClaimNotShared", said, timeout=60)
        assert cond["status"] == "False"
        assert f"{ns}/weights" in cond["message"]
        assert "ReadOnlyMany" in cond["message"]
        events = get_json(f, "events", "-n", ns, "--field-selector", "involvedObject.name=from-pvc")["items"]
        (event,) = [e for e in events if e["reason"] == "ClaimNotShared"]
        assert event["type"] == "Warning"
        assert "Multi-Attach" in event["message"]
    finally:
        kubectl(f, "delete", "namespace", ns, "--wait=false", check=False)


def test_an_object_left_by_an_older_operator_is_cleaned_and_deletes(operator: Factory) -> None:
    """Operators before the fleet controller kept kopf's finalizer and a copy of the spec on the object."""
    f = operator
    ns = "legacy"
    kubectl(f, "create", "namespace", ns)
    try:
        doc = small("old", ns)
        doc["metadata"]["finalizers"] = ["tokenfab.dev/finalizer"]
        doc["metadata"]["annotations"] = {"tokenfab.dev/last-handled-configuration": '{"spec": {}}'}
        apply_yaml(f, doc)

        def cleaned() -> bool:
            meta = get_json(f, "mdep", "old", "-n", ns)["metadata"]
            ours = [k for k in meta.get("annotations") or {} if k.startswith("tokenfab.dev/")]
            return not meta.get("finalizers") and not ours

        wait_for("the old finalizer and annotation removed", cleaned, timeout=60)
        kubectl(f, "delete", "mdep", "old", "-n", ns, "--timeout=30s")
    finally:
        kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_runs_ready_under_the_restricted_pod_security_standard(
    operator: Factory, path: Path
) -> None:
    f = operator
    ns = "restricted"
    if kubectl(f, "get", "namespace", ns, check=False).returncode != 0:
        kubectl(f, "create", "namespace", ns)
        kubectl(f, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
        # pvc:// examples mount their claim: a bound one (the factory has no storage provisioner).
        apply_yaml(
            f,
            [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": "restricted-models"},
                    "spec": {
                        "capacity": {"storage": "1Ti"},
                        "accessModes": ["ReadOnlyMany"],
                        "storageClassName": "",
                        "hostPath": {"path": "/models"},
                        "claimRef": {"namespace": ns, "name": "models"},
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "models", "namespace": ns},
                    "spec": {
                        "accessModes": ["ReadOnlyMany"],
                        "storageClassName": "",
                        "volumeName": "restricted-models",
                        "resources": {"requests": {"storage": "1Ti"}},
                    },
                },
            ],
        )
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = ns
    if doc["spec"].get("autoscaling", {}).get("enabled"):
        doc["spec"]["autoscaling"]["prometheusUrl"] = f.prometheus_url  # loopback only
    name = doc["metadata"]["name"]
    apply_yaml(f, doc, "--server-side", "--field-manager=e2e")
    try:

        def ready() -> bool:
            cond = condition(get_json(f, "mdep", name, "-n", ns), "Ready")
            return bool(cond and cond["status"] == "True")

        wait_for(f"{name} Ready in a restricted namespace", ready, timeout=120)
        pods = get_json(f, "pods", "-n", ns, "-l", f"tokenfab.dev/deployment={name}")["items"]
        assert pods
        for p in pods:
            spec = p["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            # the token Dynamo's kubernetes discovery needs, of the deployment's own ServiceAccount
            assert spec["automountServiceAccountToken"] is True
            assert spec["serviceAccountName"] == f"{name}-dynamo"
            for ctr in spec["containers"]:
                sc = ctr["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert sc["readOnlyRootFilesystem"] is True
                assert {"cpu", "memory"} <= set(ctr["resources"]["requests"])
        warnings = get_json(f, "events", "-n", ns, "--field-selector", "type=Warning")["items"]
        assert not [e for e in warnings if "PodSecurity" in e.get("message", "")]
    finally:
        kubectl(f, "delete", "mdep", name, "-n", ns, "--wait=true", "--timeout=120s")


def _apiserver_startup_repair(event: dict) -> bool:
    """The kube-apiserver's own start-up race on a fresh etcd: its IP repair controller can find the
    `default/kubernetes` Service before that Service's ClusterIP is recorded, and repairs it with this
    Warning (kube-apiserver pkg/registry/core/service/ipallocator/controller/repairip.go). It is the control
    plane's, about its own Service, on any fresh cluster; nothing tokenfab or the example made."""
    obj = event.get("involvedObject", {})
    return (
        event.get("reason") == "ClusterIPNotAllocated"
        and event.get("reportingComponent") == "ipallocator-repair-controller"
        and (obj.get("kind"), obj.get("namespace"), obj.get("name")) == ("Service", "default", "kubernetes")
    )


def test_the_quick_start_leaves_no_warning_event(factory: Factory) -> None:
    """`e2e/up.sh` on a factory of its own (its own run directory and ports), then every Warning event."""
    run_dir = Path(tempfile.mkdtemp(prefix="tokenfab-quickstart-"))
    port_base = E2E_PORT_BASE + 300  # (below 32768: outside the kernel's ephemeral port range)
    env = {**os.environ, "TOKENFAB_FACTORY_DIR": str(run_dir)}
    own = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=port_base), say=print)
    try:
        out = subprocess.run(
            ["bash", str(ROOT / "e2e" / "up.sh"), "--port-base", str(port_base)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]

        def ready() -> bool:
            md = get_json(own, "mdep", "deepseek-r1")
            cond = condition(md, "Ready")
            return bool(cond and cond["status"] == "True")

        wait_for("the quick start's example Ready", ready, timeout=120)
        time.sleep(10)  # endpoint controllers and the operator's later passes
        warnings = get_json(own, "events", "-A", "--field-selector", "type=Warning")["items"]
        warnings = [e for e in warnings if not _apiserver_startup_repair(e)]
        assert warnings == [], [(e["reason"], e["message"]) for e in warnings]
        # `tokenfab factory status` finds the factory where it runs (its own port base, not the default).
        status = subprocess.run(
            [sys.executable, "-m", "tokenfab.cli", "factory", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"{port_base + 2}" in status.stdout, status.stdout  # the API server's port
        services = get_json(own, "endpointslices", "-n", "default")["items"]
        assert any(ep.get("addresses") for s in services for ep in s.get("endpoints") or []), (
            "no Service has endpoints"
        )
    finally:
        own.down(purge=False)
