"""SLA planning (pure): performance-model rows -> the chosen configuration, a valid ModelDeployment, a
comparison table, a plan merged into a spec, and the capacity check against NVLink domains."""

from __future__ import annotations

import pytest
import yaml

from tokenfab.api.errors import load_manifests, parse_model_deployment
from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import sla
from tokenfab.planning.autoscaler.groups import spec_groups
from tokenfab.planning.topology import Domain

REQ = sla.PlanRequest(
    model="deepseek-ai/DeepSeek-R1",
    system="gb200",
    backend="trtllm",
    isl=4000,
    osl=1000,
    ttft_ms=1000,
    itl_ms=20,
    gpu_budget=72,
    request_rate=None,
    mtp_acceptance=None,
)


def worker(tp=1, dp=1, ep=1, workers=1, bs=8, moe_tp=1, pp=1):
    return sla.WorkerConfig(tp=tp, pp=pp, dp=dp, moe_tp=moe_tp, moe_ep=ep, workers=workers, batch_size=bs)


def disagg(p_workers=1, d_workers=3, tokens=19822.5, mtp=0, p=None, d=None):
    p = p or worker(dp=8, ep=4, moe_tp=2, workers=p_workers, bs=1)
    d = d or worker(dp=16, ep=4, moe_tp=4, workers=d_workers, bs=9)
    gpus = p.gpus * p_workers + d.gpus * d_workers
    return sla.PlanRow(
        mode="disaggregated",
        roles={"prefill": p, "decode": d},
        mtp=mtp,
        block_gpus=gpus,
        tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / gpus,
        tokens_per_s_per_user=50.3,
        ttft_ms=653.8,
        itl_ms=19.9,
        request_rate=19.8,
    )


def agg(tp=8, tokens=1664.6):
    return sla.PlanRow(
        mode="aggregated",
        roles={"worker": worker(tp=tp, ep=4, moe_tp=2, bs=32)},
        mtp=0,
        block_gpus=tp,
        tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / tp,
        tokens_per_s_per_user=52.6,
        ttft_ms=280.4,
        itl_ms=19.0,
        request_rate=1.67,
    )


@pytest.mark.parametrize(
    ("p", "d", "ratio"), [(1, 3, "1:3"), (2, 6, "1:3"), (4, 2, "2:1"), (3, 3, "1:1"), (6, 4, "3:2")]
)
def test_ratio_is_reduced(p, d, ratio):
    assert sla.reduced_ratio(p, d) == ratio


def test_ratio_needs_positive_counts():
    with pytest.raises(ValueError, match="positive"):
        sla.reduced_ratio(0, 3)


def test_attention_dp_worker_maps_to_tensor_times_dp():
    par = worker(tp=1, dp=16, ep=4, moe_tp=4).parallelism()
    assert (par.tensor, par.pipeline, par.expert, par.attention_data_parallel) == (16, 1, 4, True)
    par = worker(tp=8, dp=1, ep=2, moe_tp=4).parallelism()
    assert (par.tensor, par.expert, par.attention_data_parallel) == (8, 2, False)


def test_sizing_fills_the_budget_with_whole_blocks():
    row = sla.sized(disagg(), 72, None)
    assert row is not None
    assert (row.blocks, row.gpus) == (1, 56)
    assert row.rank_metric == pytest.approx(19822.5 / 72, abs=1e-3)  # aiconfigurator's tokens/s/gpu_cluster
    row = sla.sized(agg(), 72, None)
    assert row is not None
    assert (row.blocks, row.gpus) == (9, 72)
    assert sla.sized(disagg(), 40, None) is None


def test_sizing_for_a_request_rate_takes_the_fewest_blocks():
    row = sla.sized(disagg(), None, 50.0)
    assert row is not None
    assert row.blocks == 3
    assert row.groups() == {"prefill": 3, "decode": 9}
    assert row.ratio() == "1:3"


def test_best_row_and_ties_prefer_fewer_gpus():
    fewer = disagg(d_workers=3)
    more = disagg(d_workers=4, d=worker(dp=16, ep=4, workers=4), tokens=19822.5)
    outcome = sla.outcome_from_rows([agg(), more, fewer], REQ, "test")
    assert outcome.ok
    assert outcome.best["aggregated"].mode == "aggregated"
    chosen = outcome.chosen()
    assert chosen is not None
    assert chosen.gpus == 56
    assert outcome.chosen("aggregated") is outcome.best["aggregated"]


def test_nothing_that_fits_is_sla_unreachable():
    outcome = sla.outcome_from_rows([], REQ, "test")
    assert not outcome.ok
    assert outcome.reason == sla.SLA_UNREACHABLE
    assert "TTFT 1000 ms" in outcome.message


def test_manifest_is_a_valid_model_deployment_with_the_plan():
    row = sla.sized(disagg(mtp=1), 72, None)
    assert row is not None
    doc = sla.manifest(row, REQ, name="deepseek-r1", model_name="deepseek-ai/DeepSeek-R1", source="hf://x/y")
    (md,) = load_manifests(yaml.safe_dump(doc))
    spec = md.spec
    assert spec.serving.mode == "disaggregated"
    assert spec.serving.prefill_decode_ratio == "1:3"
    assert spec.serving.ratio_policy == "fixed"
    assert spec.decode is not None
    assert spec.prefill is not None
    assert spec.decode.parallelism.tensor == 16
    assert spec.decode.parallelism.attention_data_parallel
    assert spec.prefill.parallelism.tensor == 8
    assert spec.prefill.replicas is None
    assert spec.speculative_decoding.mtp_depth == 1
    assert spec_groups(spec) == {"decode": 3, "prefill": 1}
    assert spec.left_to_plan() == []  # everything explicit: the operator will not plan again
    assert spec.profile is not None
    assert spec.profile.gpu_budget == 72


def test_aggregated_manifest():
    row = sla.sized(agg(), 72, None)
    assert row is not None
    doc = sla.manifest(row, REQ, name="r1", model_name="deepseek-ai/DeepSeek-R1", source="hf://x/y")
    md = parse_model_deployment(doc)
    assert md.spec.worker is not None
    assert md.spec.worker.replicas == 9
    assert md.spec.serving.prefill_decode_ratio is None


def test_table_has_a_line_per_row_and_the_columns():
    rows = [r for r in (sla.sized(x, 72, None) for x in (agg(), disagg())) if r]
    text = sla.comparison_table(rows)
    lines = text.splitlines()
    assert len(lines) == 3
    for col in ("tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms", "GPUs", "groups per role"):
        assert col in lines[0]
    assert "prefill 1 decode 3" in lines[2]
    assert "275.3" in lines[2]


PROFILE_SPEC = {
    "model": {"name": "deepseek-ai/DeepSeek-R1", "source": "hf://deepseek-ai/DeepSeek-R1"},
    "serving": {"mode": "disaggregated"},
    "prefill": {},
    "decode": {"maxBatchSize": 64},
    "profile": {"isl": 4000, "osl": 1000, "ttftMs": 1000, "itlMs": 20, "gpuBudget": 72},
}


def test_a_profile_lets_the_spec_leave_out_what_the_plan_fills():
    spec = ModelDeploymentSpec.model_validate(PROFILE_SPEC)
    assert spec.left_to_plan() == [
        "prefill.parallelism",
        "decode.parallelism",
        "serving.prefillDecodeRatio",
        "speculativeDecoding.mtpDepth",
    ]
    outcome = sla.outcome_from_rows([agg(), disagg(mtp=1)], REQ, "test")
    status = sla.plan_status(outcome, spec, "2026-01-01T00:00:00Z")
    assert status.ok
    assert status.mode == "disaggregated"
    assert status.profile_hash == sla.profile_hash(spec)
    merged = sla.apply_plan(spec, status)
    assert merged.decode is not None
    assert merged.decode.parallelism.tensor == 16
    assert merged.decode.replicas == 3
    assert merged.decode.max_batch_size == 64  # the user's value is kept
    assert merged.serving.prefill_decode_ratio == "1:3"
    assert merged.speculative_decoding.mtp_depth == 1
    assert spec_groups(merged) == {"decode": 3, "prefill": 1}
    # The user's spec object itself is untouched.
    assert spec.serving.prefill_decode_ratio is None


def test_what_the_user_gave_wins_over_the_plan():
    data = PROFILE_SPEC | {
        "decode": {"parallelism": {"tensor": 8}, "replicas": 2},
        "speculativeDecoding": {"mtpDepth": 0},
    }
    spec = ModelDeploymentSpec.model_validate(data)
    outcome = sla.outcome_from_rows([disagg(mtp=1)], REQ, "test")
    merged = sla.apply_plan(spec, sla.plan_status(outcome, spec, "t"))
    assert merged.decode is not None
    assert merged.decode.parallelism.tensor == 8
    assert merged.decode.replicas == 2
    assert merged.speculative_decoding.mtp_depth == 0
    assert merged.prefill is not None
    assert merged.prefill.parallelism.tensor == 8


def test_the_profile_hash_follows_the_profile_only():
    spec = ModelDeploymentSpec.model_validate(PROFILE_SPEC)
    other = ModelDeploymentSpec.model_validate(PROFILE_SPEC | {"decode": {"maxBatchSize": 8}})
    assert sla.profile_hash(spec) == sla.profile_hash(other)
    faster = ModelDeploymentSpec.model_validate(
        PROFILE_SPEC | {"profile": PROFILE_SPEC["profile"] | {"itlMs": 10}}
    )
    assert sla.profile_hash(spec) != sla.profile_hash(faster)


def test_a_failed_outcome_becomes_a_status_without_a_plan():
    spec = ModelDeploymentSpec.model_validate(PROFILE_SPEC)
    bad = sla.PlanOutcome(ok=False, reason=sla.UNKNOWN_MODEL, message="no such model")
    status = sla.plan_status(bad, spec, "t")
    assert (status.ok, status.reason, status.roles) == (False, sla.UNKNOWN_MODEL, {})
    assert sla.apply_plan(spec, status) is spec


def test_rows_of_the_other_mode_or_too_big_for_the_topology_are_not_planned():
    spec = ModelDeploymentSpec.model_validate(PROFILE_SPEC | {"topology": {"gpusPerDomain": 12}})
    outcome = sla.outcome_from_rows([disagg()], REQ, "test")
    status = sla.plan_status(outcome, spec, "t")
    assert not status.ok
    assert status.reason == sla.SLA_UNREACHABLE
    assert "gpusPerDomain 12" in status.message


def domain(name, free_nodes, gpus=4, nodes=18):
    free = {f"{name}-n{i:02d}": gpus if i < free_nodes else 0 for i in range(nodes)}
    return Domain(name=name, total_gpus=nodes * gpus, free=free, nodes=nodes, ready_nodes=nodes)


def test_capacity_check_places_every_group_or_says_what_is_missing():
    row = sla.sized(disagg(), 72, None)
    assert row is not None
    report = sla.check_capacity(row, {"rack-a": domain("rack-a", 18)})
    assert report.fits
    assert [p[0] for p in report.placements] == ["decode-0", "decode-1", "decode-2", "prefill-0"]
    assert {p[2] for p in report.placements} == {"rack-a"}
    assert report.lines[-1].startswith("fits: 56 GPUs in 1 NVLink domain(s) (rack-a)")

    # Two half-full racks: each 16-GPU decode group needs 4 whole free nodes of one rack.
    report = sla.check_capacity(row, {"rack-a": domain("rack-a", 5), "rack-b": domain("rack-b", 5)})
    assert not report.fits
    missing = [p for p in report.placements if p[2] is None]
    assert [p[0] for p in missing] == ["decode-2", "prefill-0"]
    assert "does not fit: 2 of 4 groups" in report.lines[-1]
    assert "decode-2: 16 GPUs -> does not fit" in report.lines
