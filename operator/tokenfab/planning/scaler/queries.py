"""The autoscaler's signals: which Prometheus queries an evaluation asks (read by the pass before it
plans), and the deployment-wide values read from their answers (arrivals, input tokens and requests in
flight at the frontend), with what could not be read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenfab.api.models import ModelDeployment, RoleBounds, RoleName
from tokenfab.planning import forecast, signals
from tokenfab.planning.autoscaling import KV_UTILIZATION
from tokenfab.planning.scaler.memory import URGENT_GAP_SECONDS, due, remembered

Reader = Callable[[str, str], signals.Reading]  # (Prometheus URL, query) -> its reading


def scaled_roles(md: ModelDeployment) -> list[tuple[RoleName, RoleBounds, str]]:
    """(role, bounds, signal) for each role the autoscaler drives itself."""
    spec, a = md.spec, md.spec.autoscaling
    out: list[tuple[RoleName, RoleBounds, str]] = []
    pairs: tuple[tuple[RoleName, RoleBounds | None], ...] = (("decode", a.decode), ("worker", a.worker))
    for role, bounds in pairs:
        if spec.role(role) is not None and bounds is not None:
            out.append((role, bounds, KV_UTILIZATION))
    if spec.prefill is not None and a.prefill is not None and spec.serving.ratio_policy == "independent":
        out.append(("prefill", a.prefill, "queue_depth"))
    return out


def signal_query(md: ModelDeployment, role: RoleName, metric: str) -> str:
    a = md.spec.autoscaling
    name, namespace = md.metadata.name or "", md.metadata.namespace or ""
    if metric == KV_UTILIZATION:
        return signals.kv_query(namespace, name, role, a.query)
    return signals.queue_query(namespace, name, role)


def shared_queries(md: ModelDeployment) -> dict[str, str]:
    """The deployment-wide queries of an evaluation: arrivals at the frontend, and the waiting requests
    of the KV-scaled roles (the leading policy's queue signal)."""
    spec, a = md.spec, md.spec.autoscaling
    name, namespace = md.metadata.name or "", md.metadata.namespace or ""
    out: dict[str, str] = {}
    leading = a.policy == "leading"
    if leading or a.frontend is not None:
        out["requests"] = signals.arrival_query(namespace, name, a.rate_window_seconds)
    independent_prefill = any(r == "prefill" for r, _, _ in scaled_roles(md))
    if a.frontend is not None or (leading and independent_prefill):
        out["tokens"] = signals.input_tokens_query(namespace, name, a.rate_window_seconds)
    if leading:
        for role, _, metric in scaled_roles(md):
            if metric == KV_UTILIZATION and spec.role(role) is not None:
                out[f"waiting:{role}"] = signals.queue_query(namespace, name, role)
                out["inflight"] = signals.frontend_inflight_query(namespace, name)
    return out


def due_queries(md: ModelDeployment, now: float, urgent: bool = False) -> list[str]:
    """The Prometheus queries the next `autoscale` call will ask (read them before taking the ledger)."""
    a = md.spec.autoscaling
    old = remembered(md, now)
    out = [
        signal_query(md, role, metric)
        for role, _, metric in scaled_roles(md)
        if due(old, role, now, a.interval_seconds, urgent)
    ]
    if out:
        out += list(shared_queries(md).values())
    return out


def next_due(md: ModelDeployment, now: float, urgent: bool = False) -> float | None:
    """Seconds until the next role is due for an evaluation (None: autoscaling off); `urgent`: the burst
    watch asked for one, due URGENT_GAP_SECONDS after the last."""
    a = md.spec.autoscaling
    if not a.enabled:
        return None
    old = remembered(md, now)
    interval = min(a.interval_seconds, URGENT_GAP_SECONDS) if urgent else a.interval_seconds
    waits = [
        max(0.0, interval - (now - old.last_evaluation[r]))
        for r, _, _ in scaled_roles(md)
        if r in old.last_evaluation
    ]
    return min(waits, default=float(interval))


def one_value(reading: signals.Reading | None) -> tuple[float | None, str]:
    """The single value of a deployment-wide reading: (value or None, why not). No series at all is no
    value and no error (the frontend is not scraped, or nothing arrived yet); a failed read or a value
    that is negative or not finite is an error."""
    if reading is None:
        return None, ""
    if reading.samples is None:
        return None, reading.error or "the query failed"
    if not reading.samples:
        return None, ""
    value = sum(x.value for x in reading.samples.values())
    if not forecast.valid_count(value):
        return None, f"bad sample {value!r}"
    return value, ""


@dataclass
class Shared:
    """The deployment-wide values of one evaluation, and what could not be read."""

    readings: dict[str, signals.Reading]
    rate: float | None = None  # requests/s arriving at the frontend
    tokens: float | None = None  # input tokens/s arriving there
    inflight: float | None = None  # requests in flight there
    blind: set[str] = field(default_factory=set)  # leading signals whose read failed or came back bad
    unavailable: list[str] = field(default_factory=list)


SHARED_VALUES = (
    ("requests", "rate", "arrivals at the frontend"),
    ("tokens", "tokens", "input tokens at the frontend"),
    ("inflight", "inflight", "requests in flight at the frontend"),
)


def read_shared(md: ModelDeployment, reader: Reader) -> Shared:
    url = md.spec.autoscaling.prometheus_url or ""
    out = Shared({k: reader(url, q) for k, q in shared_queries(md).items()})
    for key, attr, what in SHARED_VALUES:
        value, why = one_value(out.readings.get(key))
        setattr(out, attr, value)
        if why:
            out.unavailable.append(f"{what}: {why}")
            out.blind.add(key)
    return out
