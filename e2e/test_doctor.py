"""`tokenfab doctor` against real API servers: on a bare one (an API server and its etcd, nothing else) it
names every missing prerequisite with its fix and exits 1; it exits 2 when no API server answers; and on
the factory it passes (checked on the live fleet, where Prometheus scrapes workers: e2e/test_fleet.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.conftest import E2E_PORT_BASE
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenfab.cli", "doctor", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def bare() -> Iterator[Factory]:
    run_dir = Path(tempfile.mkdtemp(prefix="tokenfab-bare-"))
    f = Factory(FactoryConfig(run_dir=run_dir, port_base=E2E_PORT_BASE + 400, bare=True), say=print)
    f.up()
    try:
        yield f
    finally:
        f.down(purge=True)


def test_doctor_names_every_missing_prerequisite_on_a_bare_api_server(bare: Factory) -> None:
    out = doctor("--kubeconfig", str(bare.kubeconfig), "--prometheus-url", "http://127.0.0.1:9", "-o", "json")
    assert out.returncode == 1, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["kubernetes"]["outcome"] == "pass"
    assert checks["rbac"]["outcome"] == "pass"  # (the factory's admin may do everything)
    for name, words in {
        "tokenfab-crds": "modeldeployments.tokenfab.dev",
        "dynamo-crd": "dynamoworkermetadatas.nvidia.com",
        "dra-driver": "ComputeDomain CRD",
        "gpu-nodes": "no node offers nvidia.com/gpu",
        "prometheus": "does not answer",
    }.items():
        assert checks[name]["outcome"] == "fail", checks[name]
        assert words in checks[name]["detail"], checks[name]
        assert checks[name]["fix"], checks[name]
    text = doctor("--kubeconfig", str(bare.kubeconfig))
    assert text.returncode == 1
    assert "FAIL  dra-driver" in text.stdout
    assert "fix: install NVIDIA's DRA driver" in text.stdout


def test_doctor_checks_a_service_accounts_rbac(bare: Factory) -> None:
    out = doctor(
        "--kubeconfig", str(bare.kubeconfig), "--service-account", "tokenfab-system/tokenfab", "-o", "json"
    )
    rbac = next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "rbac")
    assert rbac["outcome"] == "fail"
    assert "ServiceAccount tokenfab-system/tokenfab may not:" in rbac["detail"]
    assert "create pods" in rbac["detail"]
    assert "create dynamoworkermetadatas.nvidia.com" in rbac["detail"]


def test_doctor_exits_2_when_no_api_server_answers(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    out = doctor("--kubeconfig", str(config))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "the API server does not answer" in out.stderr
