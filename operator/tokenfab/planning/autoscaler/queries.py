"""The autoscaler's signals: which Prometheus queries an evaluation asks (read by the pass before it
plans), and the deployment-wide values read from their answers (arrivals, input tokens and requests in
flight at the frontend), with what could not be read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenfab.api.models import AutoscalingStatus, ModelDeployment, RoleBounds, RoleName
from tokenfab.planning.autoscaler import forecast, signals
from tokenfab.planning.autoscaler.memory import URGENT_GAP_SECONDS, due, remembered
from tokenfab.planning.autoscaler.policy import KV_UTILIZATION


def not_read(query: str) -> signals.Reading:
    return signals.Reading(None, "not read by this pass", query)


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


@dataclass(frozen=True)
class Queries:
    """What one evaluation reads from Prometheus, decided once per pass: the roles due (each with its
    signal and that signal's query) and, when any is, the deployment-wide queries. `step` evaluates exactly
    these roles, from these readings."""

    url: str = ""
    roles: tuple[tuple[RoleName, str, str], ...] = ()  # (role, metric, query) of each role due
    shared: tuple[tuple[str, str], ...] = ()  # (name, query): arrivals, tokens, in flight, waiting
    burst: frozenset[RoleName] = frozenset()  # roles due only because the burst watch asked
    kept: bool = False  # the burst watch asked too soon after the last evaluation: kept for the next pass

    def texts(self) -> list[str]:
        """Every query to read, once each."""
        return list(dict.fromkeys([q for _, _, q in self.roles] + [q for _, q in self.shared]))

    @property
    def due(self) -> frozenset[RoleName]:
        return frozenset(r for r, _, _ in self.roles)


def queries(md: ModelDeployment, now: float, urgent: bool = False) -> Queries:
    """What the next `step` reads (the pass reads them before it takes the placement ledger). `urgent`:
    the burst watch saw a burst begin; a role is then due URGENT_GAP_SECONDS after its last evaluation."""
    a = md.spec.autoscaling
    if not a.enabled:
        return Queries()
    old = remembered(md, now)
    roles = tuple(
        (role, metric, signal_query(md, role, metric))
        for role, _, metric in scaled_roles(md)
        if due(old, role, now, a.interval_seconds, urgent)
    )
    burst = frozenset(r for r, _, _ in roles if not due(old, r, now, a.interval_seconds))
    shared = tuple(shared_queries(md).items()) if roles else ()
    return Queries(a.prometheus_url or "", roles, shared, burst, kept=urgent and not roles)


def next_due(
    md: ModelDeployment, memory: AutoscalingStatus, now: float, urgent: bool = False
) -> float | None:
    """Seconds until the next role is due for an evaluation, by `memory` (the autoscaler's status after
    this pass; None: autoscaling off); `urgent`: the burst watch asked for one, due URGENT_GAP_SECONDS
    after the last."""
    a = md.spec.autoscaling
    if not a.enabled:
        return None
    interval = min(a.interval_seconds, URGENT_GAP_SECONDS) if urgent else a.interval_seconds
    waits = [
        max(0.0, interval - (now - memory.last_evaluation[r]))
        for r, _, _ in scaled_roles(md)
        if r in memory.last_evaluation
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


def read_shared(asked: Queries, readings: Mapping[str, signals.Reading]) -> Shared:
    """The deployment-wide values from the readings of `asked.shared`."""
    out = Shared({k: readings.get(q) or not_read(q) for k, q in asked.shared})
    for key, attr, what in SHARED_VALUES:
        value, why = one_value(out.readings.get(key))
        setattr(out, attr, value)
        if why:
            out.unavailable.append(f"{what}: {why}")
            out.blind.add(key)
    return out
