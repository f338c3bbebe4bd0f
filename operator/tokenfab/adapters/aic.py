"""NVIDIA aiconfigurator, the performance model behind `tokenfab plan` and spec.profile (an optional extra).

`run` calls aiconfigurator's Python API (`aiconfigurator.cli.api.cli_default`, offline, CPU, about a minute
for a large MoE model) once per MTP depth to compare, reads its best-configuration tables (pandas
DataFrames: one row per candidate, with per-role tp/pp/dp/moe_tp/moe_ep, worker counts and predicted
figures) into `tokenfab.planning.sla.PlanRow`s and lets the pure planning module choose. Its generated
k8s_deploy.yaml is not used (it inflates GPU counts for attention-DP workers).

aiconfigurator is imported lazily, only here: the operator and the CLI work without it and report the
planner as unavailable. `BackgroundPlanner` runs plans in a separate process, off the reconcile path.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import multiprocessing
import os
import pickle
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from tokenfab.planning import sla

log = logging.getLogger(__name__)

# tokenfab's system names -> aiconfigurator's.
SYSTEMS = {"gb200": "gb200", "gb300": "gb300", "b200": "b200_sxm", "h200": "h200_sxm", "h100": "h100_sxm"}
INSTALL_HINT = 'install the plan extra: pip install "tokenfab[plan]"'


def version() -> str | None:
    """aiconfigurator's installed version, or None when it is not installed."""
    try:
        return metadata.version("aiconfigurator")
    except metadata.PackageNotFoundError:
        return None


def planner_name() -> str:
    v = version()
    return f"aiconfigurator {v}" if v else "aiconfigurator (not installed)"


def known_models() -> list[str]:
    """Model names aiconfigurator ships performance configs for (e.g. deepseek-ai/DeepSeek-R1)."""
    try:
        import aiconfigurator_core
    except ImportError:
        return []
    folder = Path(aiconfigurator_core.__file__).parent / "model_configs"
    names = []
    for path in folder.glob("*_config.json"):
        if path.name.endswith("_hf_quant_config.json"):
            continue
        names.append(path.name.removesuffix("_config.json").replace("--", "/", 1))
    return sorted(names)


def is_known_model(model: str) -> bool:
    """A listed model, or a local folder with a config.json (aiconfigurator reads either)."""
    return model in known_models() or (Path(model) / "config.json").is_file()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """aiconfigurator logs every skipped sweep point at WARNING and prints progress: keep them out."""
    loggers = [logging.getLogger(n) for n in ("aiconfigurator", "aiconfigurator_core", "")]
    levels = [lg.level for lg in loggers]
    for lg in loggers[:2]:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its own deprecations (sweep_agg, pandas inplace)
            yield
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.setLevel(lvl)


def _int(v: Any) -> int:
    return round(float(v))


def _worker(row: dict[str, Any], prefix: str, workers: int) -> sla.WorkerConfig:
    return sla.WorkerConfig(
        tp=_int(row[f"{prefix}tp"]),
        pp=_int(row[f"{prefix}pp"]),
        dp=_int(row[f"{prefix}dp"]),
        moe_tp=_int(row.get(f"{prefix}moe_tp", 1) or 1),
        moe_ep=_int(row.get(f"{prefix}moe_ep", 1) or 1),
        workers=workers,
        batch_size=_int(row[f"{prefix}bs"]),
    )


def row_from_record(record: dict[str, Any], mode: str, mtp: int) -> sla.PlanRow:
    """One row of aiconfigurator's best-configuration table (agg or disagg) as a PlanRow."""
    roles: dict[sla.PlanRoleName, sla.WorkerConfig]
    if mode == "disagg":
        roles = {
            "prefill": _worker(record, "(p)", _int(record["(p)workers"])),
            "decode": _worker(record, "(d)", _int(record["(d)workers"])),
        }
        plan_mode: sla.PlanMode = "disaggregated"
    else:
        roles = {"worker": _worker(record, "", 1)}
        plan_mode = "aggregated"
    return sla.PlanRow(
        mode=plan_mode,
        roles=roles,
        mtp=mtp,
        block_gpus=_int(record["num_total_gpus"]),
        tokens_per_s=float(record["tokens/s"]),
        tokens_per_s_per_gpu=float(record["tokens/s/gpu"]),
        tokens_per_s_per_user=float(record["tokens/s/user"]),
        ttft_ms=float(record["ttft"]),
        itl_ms=float(record["tpot"]),
        request_rate=float(record["request_rate"]),
    )


def rows_from_result(best_configs: dict[str, Any], mtp: int) -> list[sla.PlanRow]:
    """Every row of every experiment's DataFrame (keys 'agg' and 'disagg')."""
    out = []
    for exp, frame in best_configs.items():
        if frame is None or len(frame) == 0:
            continue
        mode = "disagg" if exp.startswith("disagg") else "agg"
        for record in frame.to_dict("records"):
            out.append(row_from_record(record, mode, mtp))
    return out


# The sweep is capped at one NVL72 domain's worth of GPUs when planning for a request rate.
RATE_SWEEP_GPUS = 72


def _cli_default(request: sla.PlanRequest, depth: int, save_dir: str | None) -> Any:
    from aiconfigurator.cli.api import cli_default

    kwargs: dict[str, Any] = {
        "backend": request.backend,
        "isl": request.isl,
        "osl": request.osl,
        "ttft": request.ttft_ms,
        "tpot": request.itl_ms,
        "top_n": 5,
        "save_dir": save_dir,
    }
    if depth > 0 and request.mtp_acceptance is not None:
        kwargs["nextn"] = depth
        kwargs["nextn_accepted"] = round(sla.accepted_tokens(request.mtp_acceptance, depth), 4)
    total = request.gpu_budget if request.gpu_budget is not None else RATE_SWEEP_GPUS
    with _quiet():
        return cli_default(request.model, total, SYSTEMS.get(request.system, request.system), **kwargs)


def _cache_path(request: sla.PlanRequest, cache_dir: str) -> Path:
    fields = {
        k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
        for k, v in dataclasses.asdict(request).items()
    }
    fields["depths"] = list(request.depths())
    fields.pop("mtp_depths")
    text = json.dumps([planner_name(), fields], sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    return Path(cache_dir) / f"plan-{key}.pickle"


def run(
    request: sla.PlanRequest, save_dir: str | None = None, cache_dir: str | None = None
) -> sla.PlanOutcome:
    """Plan with aiconfigurator; never raises for an unknown model, an unreachable SLA or a missing
    planner: the outcome says so (reason and message).

    `cache_dir` (default: $TOKENFAB_PLAN_CACHE, if set) keeps outcomes per request and planner version, so
    repeated runs (tests, a CLI run after a test) answer at once."""
    cache_dir = cache_dir or os.environ.get("TOKENFAB_PLAN_CACHE") or None
    if cache_dir and save_dir is None:
        path = _cache_path(request, cache_dir)
        if path.is_file():
            cached: sla.PlanOutcome = pickle.loads(path.read_bytes())
            return cached
        outcome = _run(request, None)
        if outcome.reason not in (sla.PLANNED, sla.SLA_UNREACHABLE, sla.UNKNOWN_MODEL):
            return outcome  # the planner failed: do not remember it
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(outcome))
        tmp.replace(path)
        return outcome
    return _run(request, save_dir)


def _run(request: sla.PlanRequest, save_dir: str | None) -> sla.PlanOutcome:
    planner = planner_name()
    if version() is None:
        return sla.PlanOutcome(
            ok=False,
            reason=sla.PLANNER_UNAVAILABLE,
            message=f"aiconfigurator is not installed here: {INSTALL_HINT}",
            planner=planner,
        )
    if not is_known_model(request.model):
        return sla.PlanOutcome(
            ok=False,
            reason=sla.UNKNOWN_MODEL,
            message=f"aiconfigurator has no performance config for model {request.model!r}: set "
            "spec.profile.model (tokenfab plan --aic-model) to a listed name (tokenfab plan --list-models) "
            "or to a local folder with the model's config.json",
            planner=planner,
        )
    from aiconfigurator.sdk.errors import NoFeasibleConfigError

    rows: list[sla.PlanRow] = []
    references: list[sla.PlanRow] = []
    for depth in request.depths():
        try:
            result = _cli_default(
                request, depth, None if save_dir is None else os.path.join(save_dir, f"mtp{depth}")
            )
        except NoFeasibleConfigError:
            continue
        except Exception as exc:  # aiconfigurator's own errors (missing perf data, bad inputs)
            log.warning("aiconfigurator failed for %s: %s", request.model, exc)
            return sla.PlanOutcome(
                ok=False, reason=sla.PLANNER_FAILED, message=f"aiconfigurator: {exc}", planner=planner
            )
        rows.extend(rows_from_result(result.best_configs, depth))
        own = result.best_configs.get(result.chosen_exp)
        if own is not None and len(own):
            mode = "disagg" if str(result.chosen_exp).startswith("disagg") else "agg"
            references.append(row_from_record(own.iloc[0].to_dict(), mode, depth))
    reference = sla.best_row(
        r for r in (sla.sized(x, request.gpu_budget, request.request_rate) for x in references) if r
    )
    return sla.outcome_from_rows(rows, request, planner, reference)


# ---------------------------------------------------------------------------------- background


def _run_quietly(request: sla.PlanRequest) -> sla.PlanOutcome:
    logging.basicConfig(level=logging.ERROR)
    return run(request)


class BackgroundPlanner:
    """Plans in a separate process (one at a time), keyed by the profile hash: `poll` submits a request
    the first time and returns its outcome once done, so a reconcile pass never waits for a plan."""

    def __init__(self, workers: int = 1) -> None:
        self._pool: cf.ProcessPoolExecutor | None = None
        self._workers = workers
        self._futures: dict[str, cf.Future[sla.PlanOutcome]] = {}

    def _executor(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self._workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def poll(self, key: str, request: sla.PlanRequest) -> sla.PlanOutcome | None:
        """The outcome for `key` when ready (then forgotten), else None (and the plan is under way)."""
        if version() is None:
            return run(request)  # answers PlannerUnavailable at once
        fut = self._futures.get(key)
        if fut is None:
            self._futures[key] = self._executor().submit(_run_quietly, request)
            return None
        if not fut.done():
            return None
        del self._futures[key]
        try:
            return fut.result()
        except Exception as exc:  # the worker process died, or aiconfigurator crashed in it
            return sla.PlanOutcome(
                ok=False, reason=sla.PLANNER_FAILED, message=f"planner process failed: {exc}"
            )

    def busy(self, key: str) -> bool:
        return key in self._futures

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
