"""SLA-driven planning (pure): a performance model's candidate configurations in, a ModelDeployment out.

The adapter `tokenfab.adapters.aic` runs NVIDIA aiconfigurator and turns its result tables into `PlanRow`s;
this module chooses among them (the same ranking aiconfigurator uses: output tokens/s per GPU of the
budget), turns the choice into tokenfab's terms (parallelism per role, a reduced prefill:decode ratio,
MTP depth, replicas), prints the comparison table and merges a plan into a spec in memory. No I/O.
`check_capacity` says whether a plan's groups fit the cluster's free GPUs: placed on the NVLink domains
with the operator's own placement policy, group by group, largest first.

aiconfigurator describes a worker as tp x pp x dp GPUs with MoE layers split moe_tp x moe_ep; TensorRT-LLM
(and tokenfab's `parallelism`) calls the same worker tensor_parallel_size = tp x dp with
enable_attention_dp when dp > 1, and moe_expert_parallel_size = moe_ep.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tokenfab.api.models import (
    API_VERSION,
    KIND,
    MTP_MAX_DEPTH,
    ModelDeploymentSpec,
    Parallelism,
    PlannedRole,
    PlanPrediction,
    Profile,
    ProfileStatus,
    Role,
    SpeculativeDecoding,
)
from tokenfab.planning.topology import Domain, GroupShape, PlacementPolicy, largest_block, place_sequence

PlanMode = Literal["aggregated", "disaggregated"]
PlanRoleName = Literal["prefill", "decode", "worker"]

# Outcome reasons (CamelCase, used as condition reasons).
PLANNED = "Planned"
UNKNOWN_MODEL = "UnknownModel"
SLA_UNREACHABLE = "SLAUnreachable"
PLANNER_UNAVAILABLE = "PlannerUnavailable"
PLANNER_FAILED = "PlannerFailed"


@dataclass(frozen=True)
class WorkerConfig:
    """One role's worker in aiconfigurator's terms, and how many of them one block has."""

    tp: int
    pp: int
    dp: int
    moe_tp: int
    moe_ep: int
    workers: int
    batch_size: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def parallelism(self) -> Parallelism:
        return Parallelism(
            tensor=self.tp * self.dp,
            pipeline=self.pp,
            expert=self.moe_ep,
            attention_data_parallel=self.dp > 1,
        )


@dataclass(frozen=True)
class PlanRow:
    """One candidate configuration: a block of workers (aggregated: one worker; disaggregated: P prefill
    and D decode workers) and the performance model's figures for one block."""

    mode: PlanMode
    roles: dict[PlanRoleName, WorkerConfig]
    mtp: int
    block_gpus: int
    tokens_per_s: float  # output tokens/s of one block
    tokens_per_s_per_gpu: float  # of the block's GPUs
    tokens_per_s_per_user: float
    ttft_ms: float
    itl_ms: float
    request_rate: float  # requests/s of one block
    blocks: int = 1  # blocks deployed (filled by `sized`)
    rank_metric: float = 0.0  # output tokens/s per GPU of the budget (aiconfigurator's tokens/s/gpu_cluster)

    @property
    def gpus(self) -> int:
        return self.blocks * self.block_gpus

    def groups(self) -> dict[PlanRoleName, int]:
        """Groups per role for all the blocks."""
        return {role: w.workers * self.blocks for role, w in self.roles.items()}

    def ratio(self) -> str | None:
        if self.mode != "disaggregated":
            return None
        return reduced_ratio(self.roles["prefill"].workers, self.roles["decode"].workers)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the profile in the planner's terms."""

    model: str
    system: str
    backend: str
    isl: int
    osl: int
    ttft_ms: float
    itl_ms: float
    gpu_budget: int | None
    request_rate: float | None
    mtp_acceptance: float | None
    mtp_depths: tuple[int, ...] = (1,)

    def depths(self) -> tuple[int, ...]:
        """MTP depths to compare (0 only, without an acceptance rate)."""
        return (0,) if self.mtp_acceptance is None else tuple(sorted(set(self.mtp_depths)))


@dataclass(frozen=True)
class PlanOutcome:
    """What the planner answered: every candidate (sized), its own best per mode, or why nothing."""

    ok: bool
    reason: str
    message: str = ""
    planner: str = ""
    rows: tuple[PlanRow, ...] = ()
    best: dict[PlanMode, PlanRow] = field(default_factory=dict)
    reference: PlanRow | None = None  # the planner's own pick (aiconfigurator's chosen experiment's top row)

    def chosen(self, mode: PlanMode | None = None) -> PlanRow | None:
        """The best row overall, or of one mode."""
        if mode is not None:
            return self.best.get(mode)
        return best_row(self.best.values())


def reduced_ratio(prefill: int, decode: int) -> str:
    """ "P:D" in lowest terms."""
    if prefill < 1 or decode < 1:
        raise ValueError(f"a ratio needs positive group counts, got {prefill}:{decode}")
    g = math.gcd(prefill, decode)
    return f"{prefill // g}:{decode // g}"


def accepted_tokens(rate: float, depth: int) -> float:
    """Mean accepted draft tokens per step with `depth` drafts each accepted with `rate` (in a chain)."""
    return sum(rate**i for i in range(1, depth + 1))


def sized(row: PlanRow, gpu_budget: int | None, request_rate: float | None) -> PlanRow | None:
    """The row replicated to the budget (as many whole blocks as fit) or to the request rate (the fewest
    blocks that serve it); None when not even one block fits the budget."""
    if gpu_budget is not None:
        blocks = gpu_budget // row.block_gpus
        if blocks < 1:
            return None
        metric = row.tokens_per_s * blocks / gpu_budget
    elif request_rate is not None:
        blocks = max(1, math.ceil(request_rate / row.request_rate - 1e-9)) if row.request_rate > 0 else 0
        if blocks < 1:
            return None
        metric = row.tokens_per_s_per_gpu
    else:
        raise ValueError("plan for a GPU budget or a request rate")
    return PlanRow(**{**row.__dict__, "blocks": blocks, "rank_metric": round(metric, 3)})


def best_row(rows: Iterable[PlanRow]) -> PlanRow | None:
    """The row with the most output tokens/s per GPU of the budget; ties: fewer GPUs, then faster users."""
    return max(rows, key=lambda r: (r.rank_metric, -r.gpus, r.tokens_per_s_per_user), default=None)


def outcome_from_rows(
    rows: Sequence[PlanRow], request: PlanRequest, planner: str, reference: PlanRow | None = None
) -> PlanOutcome:
    """Size the rows for the request and pick the best per mode (rows that fit nothing are dropped)."""
    fitted = [r for r in (sized(r, request.gpu_budget, request.request_rate) for r in rows) if r is not None]
    if not fitted:
        return PlanOutcome(
            ok=False,
            reason=SLA_UNREACHABLE,
            message=f"no configuration of {request.model} on {request.system} meets TTFT "
            f"{request.ttft_ms:g} ms and ITL {request.itl_ms:g} ms"
            + (f" within {request.gpu_budget} GPUs" if request.gpu_budget else ""),
            planner=planner,
        )
    best: dict[PlanMode, PlanRow] = {}
    for mode in ("aggregated", "disaggregated"):
        b = best_row(r for r in fitted if r.mode == mode)
        if b is not None:
            best[mode] = b
    ref = sized(reference, request.gpu_budget, request.request_rate) if reference is not None else None
    return PlanOutcome(ok=True, reason=PLANNED, planner=planner, rows=tuple(fitted), best=best, reference=ref)


# --------------------------------------------------------------------------------- spec and status


def role_settings(row: PlanRow) -> dict[PlanRoleName, Role]:
    """Each role's parallelism, batch size and groups (prefill: none, it follows decode by the ratio)."""
    out: dict[PlanRoleName, Role] = {}
    groups = row.groups()
    for name, w in row.roles.items():
        out[name] = Role(
            parallelism=w.parallelism(),
            replicas=None if name == "prefill" else groups[name],
            max_batch_size=max(1, w.batch_size),
        )
    return out


def profile_fields(request: PlanRequest) -> dict[str, Any]:
    """The profile section (wire names) that a request answers."""
    out: dict[str, Any] = {
        "isl": request.isl,
        "osl": request.osl,
        "ttftMs": request.ttft_ms,
        "itlMs": request.itl_ms,
        "system": request.system,
        "backend": request.backend,
    }
    if request.gpu_budget is not None:
        out["gpuBudget"] = request.gpu_budget
    if request.request_rate is not None:
        out["requestRate"] = request.request_rate
    if request.mtp_acceptance is not None:
        out["mtpAcceptance"] = request.mtp_acceptance
    return out


def manifest(
    row: PlanRow,
    request: PlanRequest,
    *,
    name: str,
    model_name: str,
    source: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A complete ModelDeployment for the row, every planned value explicit (the profile is kept as the
    record of what it was planned for; with nothing left out the operator does not plan again)."""
    roles = role_settings(row)
    spec: dict[str, Any] = {"model": {"name": model_name, "source": source}}
    serving: dict[str, Any] = {"mode": row.mode, "routerMode": "kv"}
    if row.mode == "disaggregated":
        serving |= {"prefillDecodeRatio": row.ratio(), "ratioPolicy": "fixed"}
    spec["serving"] = serving
    for role_name, role in roles.items():
        spec[role_name] = role.model_dump(by_alias=True, exclude_none=True, exclude_defaults=False)
        spec[role_name].pop("extraEngineArgs", None)
    spec["speculativeDecoding"] = {"mtpDepth": row.mtp}
    profile = profile_fields(request)
    if request.model != model_name:
        profile["model"] = request.model
    spec["profile"] = profile
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


def prediction(row: PlanRow) -> PlanPrediction:
    return PlanPrediction(
        gpus=row.gpus,
        tokens_per_second_per_gpu=round(row.tokens_per_s_per_gpu, 3),
        tokens_per_second_per_user=round(row.tokens_per_s_per_user, 3),
        ttft_ms=round(row.ttft_ms, 3),
        itl_ms=round(row.itl_ms, 3),
        request_rate=round(row.request_rate * row.blocks, 3),
    )


def profile_hash(spec: ModelDeploymentSpec) -> str:
    """What a plan answers: the profile, the model, the mode and what is left to plan."""
    assert spec.profile is not None
    doc = {
        "profile": spec.profile.model_dump(by_alias=True, mode="json"),
        "model": spec.model.name,
        "mode": spec.serving.mode,
        "gpusPerNode": spec.topology.gpus_per_node,
        "gpusPerDomain": spec.topology.gpus_per_domain,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def request_for(spec: ModelDeploymentSpec, mtp_depths: tuple[int, ...] = (1,)) -> PlanRequest:
    """The planner request of a spec's profile."""
    p: Profile | None = spec.profile
    if p is None:
        raise ValueError("the spec has no profile")
    return PlanRequest(
        model=p.model or spec.model.name,
        system=p.system,
        backend=p.backend,
        isl=p.isl,
        osl=p.osl,
        ttft_ms=p.ttft_ms,
        itl_ms=p.itl_ms,
        gpu_budget=p.gpu_budget,
        request_rate=p.request_rate,
        mtp_acceptance=p.mtp_acceptance,
        mtp_depths=mtp_depths,
    )


def groups_fit(row: PlanRow, gpus_per_node: int, gpus_per_domain: int) -> bool:
    """Whether every group of the row fills whole nodes and sits in one NVLink domain."""
    n, d = gpus_per_node, gpus_per_domain
    return all((w.gpus <= n or w.gpus % n == 0) and w.gpus <= d for w in row.roles.values())


def fits_topology(row: PlanRow, spec: ModelDeploymentSpec) -> bool:
    """`groups_fit` with the spec's topology."""
    return groups_fit(row, spec.topology.gpus_per_node, spec.topology.gpus_per_domain)


def plan_status(outcome: PlanOutcome, spec: ModelDeploymentSpec, now: str) -> ProfileStatus:
    """status.profile for an outcome: the plan for the spec's mode, or why there is none."""
    base = {"profile_hash": profile_hash(spec), "planner": outcome.planner, "time": now}
    if not outcome.ok:
        return ProfileStatus(**base, ok=False, reason=outcome.reason, message=outcome.message)
    rows = [r for r in outcome.rows if r.mode == spec.serving.mode and fits_topology(r, spec)]
    row = best_row(rows)
    if row is None:
        return ProfileStatus(
            **base,
            ok=False,
            reason=SLA_UNREACHABLE,
            message=f"no {spec.serving.mode} configuration meets the profile with groups that fit "
            f"topology (gpusPerNode {spec.topology.gpus_per_node}, gpusPerDomain "
            f"{spec.topology.gpus_per_domain})",
        )
    roles = role_settings(row)
    groups = row.groups()
    return ProfileStatus(
        **base,
        ok=True,
        reason=PLANNED,
        message=describe(row),
        mode=row.mode,
        roles={n: PlannedRole(parallelism=r.parallelism, replicas=groups[n]) for n, r in roles.items()},
        prefill_decode_ratio=row.ratio(),
        mtp_depth=min(row.mtp, MTP_MAX_DEPTH),
        predicted=prediction(row),
    )


def apply_plan(spec: ModelDeploymentSpec, plan: ProfileStatus) -> ModelDeploymentSpec:
    """The spec with what it leaves out filled from the plan (in memory; the stored spec is untouched).

    A role's parallelism and replicas come from the plan only when the role leaves its parallelism out
    (replicas the user gave are kept); the ratio when serving.prefillDecodeRatio is left out; the MTP depth
    when spec.speculativeDecoding is left out.
    """
    if not plan.ok:
        return spec
    update: dict[str, Any] = {}
    for name, role in spec.roles():
        planned = plan.roles.get(name)
        if planned is None or "parallelism" in role.model_fields_set:
            continue
        changes: dict[str, Any] = {"parallelism": planned.parallelism}
        if role.replicas is None and name != "prefill":
            changes["replicas"] = planned.replicas
        update[name] = role.model_copy(update=changes)
    if spec.serving.mode == "disaggregated" and spec.serving.prefill_decode_ratio is None:
        update["serving"] = spec.serving.model_copy(
            update={"prefill_decode_ratio": plan.prefill_decode_ratio}
        )
    if "speculative_decoding" not in spec.model_fields_set and plan.mtp_depth is not None:
        update["speculative_decoding"] = SpeculativeDecoding(mtp_depth=plan.mtp_depth)
    merged = spec.model_copy(update=update)
    # Re-run the rules on the merged spec (the plan might break one, e.g. a user's autoscaling bounds).
    return ModelDeploymentSpec.model_validate(merged.model_dump(by_alias=True, exclude_unset=False))


# --------------------------------------------------------------------------------------- reports


def _par(w: WorkerConfig) -> str:
    p = w.parallelism()
    text = f"tp{p.tensor}"
    if p.pipeline > 1:
        text += f" pp{p.pipeline}"
    if p.expert > 1:
        text += f" ep{p.expert}"
    if p.attention_data_parallel:
        text += " adp"
    return text


def describe(row: PlanRow, with_mode: bool = True) -> str:
    """One line: the groups, GPUs, ratio, MTP and predicted figures (tokens/s/GPU of the budget, as
    aiconfigurator ranks, and of the GPUs the plan uses when fewer)."""
    groups = row.groups()
    parts = [f"{groups[n]} {n} x {w.gpus} GPUs ({_par(w)})" for n, w in row.roles.items()]
    ratio = f", ratio {row.ratio()}" if row.ratio() else ""
    per_gpu = f"{row.rank_metric:.1f} tokens/s/GPU"
    if abs(row.tokens_per_s_per_gpu - row.rank_metric) >= 0.05:
        per_gpu += f" ({row.tokens_per_s_per_gpu:.1f} on the {row.gpus} GPUs used)"
    return (
        (f"{row.mode}: " if with_mode else "")
        + f"{' + '.join(parts)} = {row.gpus} GPUs{ratio}, MTP {row.mtp}; {per_gpu}, "
        f"{row.tokens_per_s_per_user:.1f} tokens/s/user, TTFT {row.ttft_ms:.0f} ms, ITL {row.itl_ms:.1f} ms"
    )


TABLE_COLUMNS = (
    "mode",
    "tok/s/GPU",
    "tok/s/user",
    "TTFT ms",
    "ITL ms",
    "GPUs",
    "groups per role",
    "parallelism",
    "MTP",
)


def table_rows(rows: Sequence[PlanRow]) -> list[list[str]]:
    out = []
    for r in rows:
        groups = r.groups()
        out.append(
            [
                r.mode,
                f"{r.rank_metric:.1f}",
                f"{r.tokens_per_s_per_user:.1f}",
                f"{r.ttft_ms:.0f}",
                f"{r.itl_ms:.1f}",
                str(r.gpus),
                " ".join(f"{n} {groups[n]}" for n in r.roles),
                "; ".join(f"{n} {_par(w)}" for n, w in r.roles.items()),
                str(r.mtp),
            ]
        )
    return out


def comparison_table(rows: Sequence[PlanRow]) -> str:
    """A plain-text table, one line per row (tokens/s/GPU is per GPU of the budget)."""
    body = table_rows(rows)
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(TABLE_COLUMNS)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(TABLE_COLUMNS, widths, strict=True)).rstrip()]
    for b in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip())
    return "\n".join(lines)


# Whether a plan fits the cluster.


@dataclass(frozen=True)
class CapacityReport:
    """Whether a plan's groups fit the free GPUs of the NVLink domains, group by group."""

    fits: bool
    placements: list[tuple[str, int, str | None]]  # (group, GPUs, domain or None)
    free_gpus: int
    lines: list[str]


def check_capacity(
    row: PlanRow,
    domains: Mapping[str, Domain],
    gpus_per_node: int = 4,
    policy: PlacementPolicy = "pack",
) -> CapacityReport:
    """Place the row's groups (largest first, as the operator plans decode before prefill) with the
    operator's own policy, and say where each would go or what is missing."""
    groups: list[tuple[str, int]] = []
    for role in ("decode", "worker", "prefill"):
        w = row.roles.get(role)
        if w is not None:
            groups.extend((f"{role}-{i}", w.gpus) for i in range(row.groups()[role]))
    shapes = [GroupShape(gpus=g, gpus_per_node=gpus_per_node) for _, g in groups]
    placed, _ = place_sequence(domains, shapes, policy)
    free = sum(d.free_gpus for d in domains.values())
    placements = [(name, g, where) for (name, g), where in zip(groups, placed, strict=True)]
    lines = [f"{name}: {g} GPUs -> " + (where or "does not fit") for name, g, where in placements]
    missing = [p for p in placements if p[2] is None]
    fits = not missing
    if fits:
        used = sorted({p[2] for p in placements if p[2]})
        where_all = ", ".join(used)
        lines.append(f"fits: {row.gpus} GPUs in {len(used)} NVLink domain(s) ({where_all}); {free} GPUs free")
    else:
        block, where = largest_block(domains, shapes[0]) if shapes else (0, None)
        lines.append(
            f"does not fit: {len(missing)} of {len(placements)} groups have no NVLink domain with room "
            f"({sum(p[1] for p in missing)} GPUs missing; {free} GPUs free over {len(domains)} domain(s), "
            f"the largest free block for a {shapes[0].gpus}-GPU group is {block} GPUs"
            + (f" in {where})" if where else ")")
        )
    return CapacityReport(fits=fits, placements=placements, free_gpus=free, lines=lines)
