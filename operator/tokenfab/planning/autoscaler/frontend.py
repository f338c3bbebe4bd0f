"""The frontend's size: replicas for the ingress the forecast expects, within spec.autoscaling.frontend's
bounds; up at once, down only to the highest recommendation of the scale-down window."""

from __future__ import annotations

import math

from tokenfab.api.models import AutoscalingStatus, ModelDeployment
from tokenfab.planning.autoscaler import forecast


def size_frontend(
    md: ModelDeployment,
    status: AutoscalingStatus,
    rate: float | None,
    tokens: float | None,
    now: float,
    partial: bool = False,
) -> int:
    """Frontend replicas for the forecast ingress: requests/s and input tokens/s over what one replica
    should take, within the bounds; up at once, down only to the highest recommendation of the
    scale-down window. Without a reading the count holds; with one of the two reads failed (`partial`)
    it may rise but not fall. The recommendation window is kept in `status`."""
    a = md.spec.autoscaling
    fs = a.frontend
    assert fs is not None
    current = status.frontend_replicas or md.spec.serving.frontend_replicas
    current = max(fs.min_replicas, min(fs.max_replicas, current))
    if rate is None and tokens is None:
        status.frontend_replicas = current
        return current
    rec = max(fs.min_replicas, min(fs.max_replicas, _needed(md, status, now)))
    down = float(a.scale_down_stabilization_seconds)
    recs = [(x[0], x[1]) for x in status.frontend_recommendations if len(x) >= 2 and 0 <= now - x[0] <= down]
    recs.append((now, float(rec)))
    # Only the maximum of the window is read: an entry with a later one at least as high never is.
    status.frontend_recommendations = [[t, n] for t, n in recs if not any(m >= n for u, m in recs if u > t)]
    out = rec if rec >= current else min(current, int(max(n for _, n in recs)))
    if partial:
        out = max(out, current)
    status.frontend_replicas = out
    return out


def _needed(md: ModelDeployment, status: AutoscalingStatus, now: float) -> int:
    """Replicas for the requests/s and input tokens/s forecast one horizon ahead."""
    a = md.spec.autoscaling
    fs = a.frontend
    assert fs is not None
    horizon = float(a.forecast_seconds if a.forecast_seconds is not None else status.startup_seconds or 30.0)
    window = max(30.0, 3.0 * a.interval_seconds)
    reqs = [(x[0], x[1]) for x in status.arrivals if len(x) >= 3]
    toks = [(x[0], x[2]) for x in status.arrivals if len(x) >= 3]
    ahead_r = forecast.forecast(reqs, now, window, horizon).ahead
    ahead_t = forecast.forecast(toks, now, window, horizon).ahead
    return max(
        math.ceil(ahead_r / fs.requests_per_second_per_replica - 1e-9),
        math.ceil(ahead_t / fs.input_tokens_per_second_per_replica - 1e-9),
    )
