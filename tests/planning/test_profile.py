"""The operator's side of spec.profile (tokenfab.planning.profile): a plan is asked for once per
profile, the spec is filled in memory while it waits nothing is planned, and an unknown model, an SLA
nothing meets or a missing planner become a Planned=False condition, never an exception."""

from __future__ import annotations

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import sla
from tokenfab.planning.autoscaler.groups import spec_groups
from tokenfab.planning.profile import plan_profile

SPEC = {
    "model": {"name": "deepseek-ai/DeepSeek-R1", "source": "hf://deepseek-ai/DeepSeek-R1"},
    "serving": {"mode": "disaggregated"},
    "prefill": {},
    "decode": {},
    "profile": {"isl": 4000, "osl": 1000, "ttftMs": 1000, "itlMs": 20, "gpuBudget": 72},
}


def row(mode="disaggregated"):
    p = sla.WorkerConfig(tp=1, pp=1, dp=8, moe_tp=2, moe_ep=4, workers=1, batch_size=1)
    d = sla.WorkerConfig(tp=1, pp=1, dp=16, moe_tp=4, moe_ep=4, workers=3, batch_size=9)
    return sla.PlanRow(
        mode=mode,
        roles={"prefill": p, "decode": d},
        mtp=0,
        block_gpus=56,
        tokens_per_s=19822.5,
        tokens_per_s_per_gpu=354.0,
        tokens_per_s_per_user=50.3,
        ttft_ms=653.8,
        itl_ms=19.9,
        request_rate=19.8,
    )


class FakePlanner:
    def __init__(self, outcome):
        self.outcome = outcome
        self.calls: list[str] = []

    def __call__(self, key, request):
        self.calls.append(key)
        return None if len(self.calls) == 1 else self.outcome


def spec(**changes):
    return ModelDeploymentSpec.model_validate(SPEC | changes)


def test_no_profile_or_nothing_left_out_needs_no_planner():
    full = spec(
        prefill={"parallelism": {"tensor": 8}},
        decode={"parallelism": {"tensor": 16}},
        serving={"mode": "disaggregated", "prefillDecodeRatio": "1:3"},
        speculativeDecoding={"mtpDepth": 0},
    )
    planning = plan_profile(full, None, None, 0.0)
    assert (planning.spec, planning.status, planning.condition, planning.wait) == (full, None, None, False)


def test_a_plan_is_made_off_the_reconcile_path_then_merged():
    s = spec()
    planner = FakePlanner(sla.outcome_from_rows([row()], sla.request_for(s), "aiconfigurator 0.12.0"))
    first = plan_profile(s, None, planner, 0.0)
    assert first.wait
    assert first.condition is not None
    assert (first.condition.status, first.condition.reason) == ("Unknown", "Planning")
    second = plan_profile(s, None, planner, 10.0)
    assert not second.wait
    assert second.status is not None
    assert second.status.ok
    assert second.status.profile_hash == sla.profile_hash(s)
    assert second.status.predicted is not None
    assert second.status.predicted.gpus == 56
    assert second.condition is not None
    assert second.condition.status == "True"
    assert spec_groups(second.spec) == {"decode": 3, "prefill": 1}
    # Next passes reuse status.profile: the planner is not asked again.
    third = plan_profile(s, second.status, planner, 20.0)
    assert planner.calls == [sla.profile_hash(s)] * 2
    assert third.spec == second.spec
    # A changed profile asks for a new plan.
    faster = spec(profile=SPEC["profile"] | {"itlMs": 10})
    assert plan_profile(faster, second.status, planner, 30.0).status is not None
    assert planner.calls[-1] == sla.profile_hash(faster)


def test_unknown_model_and_unreachable_sla_are_conditions():
    s = spec()
    for reason in (sla.UNKNOWN_MODEL, sla.SLA_UNREACHABLE):
        planner = FakePlanner(sla.PlanOutcome(ok=False, reason=reason, message="why"))
        plan_profile(s, None, planner, 0.0)
        planning = plan_profile(s, None, planner, 1.0)
        assert planning.wait
        assert planning.condition is not None
        assert (planning.condition.status, planning.condition.reason) == ("False", reason)
        assert planning.status is not None
        assert not planning.status.ok


def test_without_a_planner_the_condition_says_so():
    planning = plan_profile(spec(), None, None, 0.0)
    assert planning.wait
    assert planning.condition is not None
    assert planning.condition.reason == sla.PLANNER_UNAVAILABLE


def test_an_aggregated_spec_takes_only_an_aggregated_plan():
    s = ModelDeploymentSpec.model_validate(
        {
            k: v
            for k, v in (SPEC | {"serving": {"mode": "aggregated"}, "worker": {}}).items()
            if k not in ("prefill", "decode")
        }
    )
    planner = FakePlanner(sla.outcome_from_rows([row()], sla.request_for(s), "t"))
    plan_profile(s, None, planner, 0.0)
    planning = plan_profile(s, None, planner, 1.0)
    assert planning.wait
    assert planning.condition is not None
    assert planning.condition.reason == sla.SLA_UNREACHABLE


def test_a_missing_planner_is_asked_again_later_but_an_unknown_model_is_not():
    s = spec()
    missing = plan_profile(s, None, None, 0.0)
    assert missing.status is not None
    planner = FakePlanner(sla.outcome_from_rows([row()], sla.request_for(s), "aiconfigurator 0.12.0"))
    # Within the retry interval the old answer stands; after it the planner is asked again.
    assert plan_profile(s, missing.status, planner, 10.0).condition.reason == sla.PLANNER_UNAVAILABLE
    assert plan_profile(s, missing.status, planner, 120.0).condition.reason == "Planning"
    unknown = sla.plan_status(sla.PlanOutcome(ok=False, reason=sla.UNKNOWN_MODEL, message="x"), s, "t")
    assert plan_profile(s, unknown, planner, 1e9).condition.reason == sla.UNKNOWN_MODEL
