"""`tokenfab plan` with the real aiconfigurator (the `plan` extra): DeepSeek-R1 on GB200 and Qwen3-235B on
GB300. The chosen configuration must be aiconfigurator's own best (within rounding) and the emitted YAML
must pass the API's validation. Each model is planned once per session (about 1-2 minutes each on 2
cores); outcomes are cached for the session (TOKENFAB_PLAN_CACHE), which `tokenfab plan` also reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenfab.adapters import aic
from tokenfab.api.errors import load_manifests
from tokenfab.cli import app
from tokenfab.planning import sla
from tokenfab.planning.autoscaler.groups import spec_groups

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(aic.version() is None, reason='needs the plan extra: pip install -e ".[plan]"'),
]

CASES = {
    "deepseek-r1-gb200": {"model": "deepseek-ai/DeepSeek-R1", "system": "gb200", "gpus": 72},
    "qwen3-235b-gb300": {"model": "Qwen/Qwen3-235B-A22B-FP8", "system": "gb300", "gpus": 72},
}
SLA = {"isl": 4000, "osl": 1000, "ttft": 1000, "itl": 20}


def plan_request(case: str) -> sla.PlanRequest:
    c = CASES[case]
    return sla.PlanRequest(
        model=str(c["model"]),
        system=str(c["system"]),
        backend="trtllm",
        isl=SLA["isl"],
        osl=SLA["osl"],
        ttft_ms=SLA["ttft"],
        itl_ms=SLA["itl"],
        gpu_budget=int(c["gpus"]),
        request_rate=None,
        mtp_acceptance=None,
    )


@pytest.fixture(scope="session")
def plan_cache() -> Path:
    """The session's plan cache (tests/conftest.py), shared with `tokenfab plan` runs and the operator."""
    return Path(os.environ["TOKENFAB_PLAN_CACHE"])


@pytest.fixture(scope="session", params=sorted(CASES))
def planned(request: pytest.FixtureRequest, plan_cache: Path) -> tuple[str, sla.PlanOutcome]:
    return request.param, aic.run(plan_request(request.param), cache_dir=str(plan_cache))


def test_the_chosen_configuration_is_aiconfigurators_own_best(planned):
    case, outcome = planned
    assert outcome.ok, outcome.message
    chosen, own = outcome.chosen(), outcome.reference
    assert chosen is not None
    assert own is not None
    assert chosen.mode == own.mode
    assert chosen.rank_metric == pytest.approx(own.rank_metric, rel=1e-3)
    assert chosen.groups() == own.groups(), sla.describe(chosen) + " vs " + sla.describe(own)
    assert {r: w.parallelism() for r, w in chosen.roles.items()} == {
        r: w.parallelism() for r, w in own.roles.items()
    }
    assert chosen.gpus <= CASES[case]["gpus"]
    assert chosen.ttft_ms <= SLA["ttft"]
    # Both modes were compared.
    assert set(outcome.best) == {"aggregated", "disaggregated"}


def test_deepseek_r1_on_gb200_disaggregates(plan_cache):
    outcome = aic.run(plan_request("deepseek-r1-gb200"), cache_dir=str(plan_cache))  # the fixture's plan
    chosen = outcome.chosen()
    assert chosen is not None
    assert chosen.mode == "disaggregated"
    assert chosen.rank_metric > outcome.best["aggregated"].rank_metric


def test_the_emitted_yaml_passes_the_apis_validation(planned, tmp_path):
    case, outcome = planned
    c = CASES[case]
    out = tmp_path / f"{case}.yaml"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--model",
            str(c["model"]),
            "--system",
            str(c["system"]),
            "--gpus",
            str(c["gpus"]),
            "--isl",
            str(SLA["isl"]),
            "--osl",
            str(SLA["osl"]),
            "--ttft",
            str(SLA["ttft"]),
            "--itl",
            str(SLA["itl"]),
            "--name",
            case,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    for column in ("tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms", "GPUs", "groups per role"):
        assert column in result.output
    assert "aggregated" in result.output
    assert "disaggregated" in result.output
    (md,) = load_manifests(out.read_text(), str(out))
    chosen = outcome.chosen()
    assert chosen is not None
    assert md.spec.serving.mode == chosen.mode
    assert spec_groups(md.spec) == chosen.groups()
    assert md.spec.serving.prefill_decode_ratio == chosen.ratio()
    gpus = sum(n * (md.spec.role(r).parallelism.tensor) for r, n in spec_groups(md.spec).items())  # type: ignore[union-attr]
    assert gpus == chosen.gpus


def test_an_unknown_model_is_an_outcome_not_a_crash(plan_cache):
    req = sla.PlanRequest("example/NoSuchModel-1B", "gb200", "trtllm", 1000, 100, 500, 20, 8, None, None)
    outcome = aic.run(req, cache_dir=str(plan_cache))
    assert not outcome.ok
    assert outcome.reason == sla.UNKNOWN_MODEL
    assert "NoSuchModel" in outcome.message


def test_list_models_names_the_tested_models():
    result = CliRunner().invoke(
        app,
        ["plan", "--list-models", "--model", "x", "--isl", "1", "--osl", "1", "--ttft", "1", "--itl", "1"],
    )
    assert result.exit_code == 0
    for c in CASES.values():
        assert str(c["model"]) in result.output.splitlines()
