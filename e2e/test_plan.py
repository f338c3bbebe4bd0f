"""SLA-driven planning against the local AI factory: `tokenfab plan` (real aiconfigurator) writes a
ModelDeployment the API server accepts, checks it against the racks' free GPUs and says where each group
would go; the operator fills a spec.profile deployment from a plan and reports it in status.

aiconfigurator takes a minute or more per plan: plans are shared through the session's
TOKENFAB_PLAN_CACHE (the unit tests make the same DeepSeek-R1 plan), so each is made once per session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.helpers import apply_yaml, condition, get_json, kubectl, wait_for
from tokenfab.adapters import aic
from tokenfab.api.errors import load_manifests
from tokenfab_factory.factory import Factory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(aic.version() is None, reason='needs the plan extra: pip install -e ".[plan]"'),
]

NS = "plan"
MODEL = "deepseek-ai/DeepSeek-R1"
SLA = ["--isl", "4000", "--osl", "1000", "--ttft", "1000", "--itl", "20"]


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenfab.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ),
    )


@pytest.fixture(scope="module")
def planned(factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("plan") / "deepseek-r1.yaml"
    result = run_plan(
        "--model",
        MODEL,
        "--system",
        "gb200",
        "--gpus",
        "72",
        *SLA,
        "--name",
        "planned-r1",
        "--namespace",
        NS,
        "--out",
        str(out),
        "--kubeconfig",
        str(factory.kubeconfig),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    kubectl(factory, "create", "namespace", NS, check=False)
    return out, result.stdout


def test_the_emitted_yaml_passes_the_api_servers_dry_run(factory, planned):
    path, _ = planned
    (md,) = load_manifests(path.read_text(), str(path))
    assert md.spec.serving.mode == "disaggregated"
    out = kubectl(factory, "apply", "--dry-run=server", "-f", str(path))
    assert "created (server dry run)" in out.stdout


def test_plan_compares_the_modes_and_checks_the_factorys_capacity(planned):
    _, stdout = planned
    header = next(line for line in stdout.splitlines() if line.startswith("mode"))
    for column in ("tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms", "GPUs", "groups per role"):
        assert column in header
    assert "best aggregated:" in stdout
    assert "best disaggregated:" in stdout
    capacity = stdout[stdout.index("capacity (") :].splitlines()
    groups = [line.strip() for line in capacity[1:] if " GPUs -> " in line]
    assert groups, stdout
    assert all("does not fit" not in g for g in groups)
    assert any(line.strip().startswith("fits:") for line in capacity)


def profile_deployment(name: str, model: str) -> dict:
    return {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"name": model, "source": "hf://deepseek-ai/DeepSeek-R1"},
            "serving": {"mode": "disaggregated"},
            "prefill": {},
            "decode": {},
            "profile": {"isl": 4000, "osl": 1000, "ttftMs": 1000, "itlMs": 20, "gpuBudget": 72},
        },
    }


def test_the_operator_plans_a_profile_and_becomes_ready(operator, planned):
    f = operator
    path, _ = planned
    (cli_md,) = load_manifests(path.read_text(), str(path))
    apply_yaml(f, profile_deployment("profiled-r1", MODEL), "--server-side", "--field-manager=e2e")
    try:

        def planned_status() -> dict | None:
            obj = get_json(f, "mdep", "profiled-r1", "-n", NS)
            return (obj.get("status") or {}).get("profile")

        plan = wait_for("status.profile", planned_status, timeout=600, interval=2)
        assert plan["ok"], plan
        assert plan["reason"] == "Planned"
        # The operator's plan is the one `tokenfab plan` wrote.
        assert plan["prefillDecodeRatio"] == cli_md.spec.serving.prefill_decode_ratio
        assert cli_md.spec.decode is not None
        assert plan["roles"]["decode"]["replicas"] == cli_md.spec.decode.replicas
        assert plan["roles"]["decode"]["parallelism"]["tensor"] == cli_md.spec.decode.parallelism.tensor
        assert plan["predicted"]["gpus"] > 0
        wait_for(
            "profiled-r1 Ready",
            lambda: (
                (condition(get_json(f, "mdep", "profiled-r1", "-n", NS), "Ready") or {}).get("status")
                == "True"
            ),
            timeout=240,
            interval=2,
        )
        obj = get_json(f, "mdep", "profiled-r1", "-n", NS)
        assert (condition(obj, "Planned") or {}).get("status") == "True"
        assert obj["status"]["gpus"] == f"{plan['predicted']['gpus']}/{plan['predicted']['gpus']}"
        # The user's spec is never written: what was left out is still left out.
        assert obj["spec"]["decode"] == {}
        assert "prefillDecodeRatio" not in obj["spec"]["serving"]
    finally:
        kubectl(f, "delete", "mdep", "profiled-r1", "-n", NS, "--wait=false", check=False)


def test_an_unknown_model_is_a_condition_and_an_event(operator):
    f = operator
    apply_yaml(f, profile_deployment("unknown-model", "example/NoSuchModel-1B"), "--server-side")
    try:

        def planned_false() -> dict | None:
            cond = condition(get_json(f, "mdep", "unknown-model", "-n", NS), "Planned")
            return cond if cond and cond["status"] == "False" else None

        cond = wait_for("Planned=False", planned_false, timeout=120, interval=1)
        assert cond["reason"] == "UnknownModel"
        ready = condition(get_json(f, "mdep", "unknown-model", "-n", NS), "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "UnknownModel")
        events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=unknown-model")
        assert any(e["reason"] == "UnknownModel" for e in events["items"])
        assert not get_json(f, "pods", "-n", NS, "-l", "tokenfab.dev/deployment=unknown-model")["items"]
    finally:
        kubectl(f, "delete", "mdep", "unknown-model", "-n", NS, "--wait=false", check=False)


def test_the_planned_yaml_is_plain_yaml(planned):
    path, _ = planned
    doc = yaml.safe_load(path.read_text())
    assert doc["spec"]["profile"]["gpuBudget"] == 72
