"""checkov's Kubernetes checks over everything tokenfab puts in a cluster: the children the builders render
for every example (worker pods, frontend Deployments, Services, ConfigMaps, PodGroups, ComputeDomains) and
the Helm chart. Every finding that remains is skipped below with the reason beside it, and a skip that no
longer fires fails the test, so the list stays true."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from testing.chart import helm
from tests.planning.test_builders import VARIANTS, render_children

CHECKOV = (
    Path(os.environ.get("TOKENFAB_VENVS", Path.home() / ".cache" / "tokenfab" / "venvs"))
    / "checkov/bin/checkov"
)

CHILDREN_SKIPS = {
    "CKV_K8S_43": "the image is the user's (spec.runtime.image): pin it by digest there",
    "CKV_K8S_15": "IfNotPresent suits large engine images pinned by tag or digest",
    "CKV_K8S_8": "a group restarts whole (by the operator); the frontend /health is 503 while it drains",
    "CKV2_K8S_6": "NetworkPolicies are the cluster's: NCCL, MPI and KV-transfer traffic depend on its fabric",
    "CKV_K8S_11": "CPU limits would throttle engine host threads (CFS quota); CPU requests are set",
    "CKV_K8S_13": "memory limits are runtime.resources.limits: a default one could OOM-kill a whole group",
    "CKV_K8S_38": "Dynamo's kubernetes discovery: each worker and frontend writes its DynamoWorkerMetadata "
    "and watches EndpointSlices, as the deployment's own ServiceAccount, whose Role grants only that "
    "(etcd discovery mounts no token)",
}
CHART_SKIPS = {
    "CKV_K8S_43": "the chart pins the image by tag by default; image.digest pins it by digest",
    "CKV_K8S_15": "IfNotPresent with a pinned tag or digest (image.pullPolicy)",
    "CKV_K8S_11": "no CPU limit on the operator (CFS throttling stalls its watches); requests are set",
    "CKV_K8S_38": "the operator talks to the API server: it needs its service-account token",
    "CKV2_K8S_6": "NetworkPolicies are the cluster's; the operator only reaches the API server and "
    "Prometheus",
}


def checkov(directory: Path) -> dict[str, list[str]]:
    """Failed check id -> the resources it failed on."""
    assert CHECKOV.exists(), f"{CHECKOV} missing: e2e/fleet/setup.sh (run by e2e/test.sh) installs it"
    out = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(directory),
            "--framework",
            "kubernetes",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = json.loads(out.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed: dict[str, list[str]] = {}
    for report in reports:
        for check in report["results"]["failed_checks"]:
            failed.setdefault(check["check_id"], []).append(check["resource"])
    passed = sum(r["summary"]["passed"] for r in reports)
    assert passed > 100, "checkov checked next to nothing: is the input empty?"
    return failed


@pytest.mark.slow
def test_the_children_tokenfab_creates_pass_checkov(tmp_path: Path) -> None:
    for variant, (example, patch) in VARIANTS.items():
        (tmp_path / f"{variant}.yaml").write_text(yaml.safe_dump_all(render_children(example, patch)))
    failed = checkov(tmp_path)
    unexplained = {k: v[:3] for k, v in failed.items() if k not in CHILDREN_SKIPS}
    assert not unexplained, f"findings without a reason: {unexplained}"
    stale = set(CHILDREN_SKIPS) - set(failed)
    assert not stale, f"skips that no longer fire (remove them): {stale}"


@pytest.mark.slow
def test_the_chart_passes_checkov(tmp_path: Path) -> None:
    out = helm(
        "template",
        "tokenfab",
        str(Path(__file__).parent.parent / "charts" / "tokenfab"),
        "-n",
        "tokenfab-system",
        "--kube-version",
        "1.37.2",
        check=True,
    )
    (tmp_path / "chart.yaml").write_text(out.stdout)
    failed = checkov(tmp_path)
    unexplained = {k: v[:3] for k, v in failed.items() if k not in CHART_SKIPS}
    assert not unexplained, f"findings without a reason: {unexplained}"
    stale = set(CHART_SKIPS) - set(failed)
    assert not stale, f"skips that no longer fire (remove them): {stale}"
