"""The autoscaler driven as a pass drives it: its queries read, then its step."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tokenfab.api.models import ModelDeployment, RoleName
from tokenfab.planning import autoscaler
from tokenfab.planning.autoscaler.memory import remembered
from tokenfab.planning.autoscaler.queries import next_due
from tokenfab.planning.autoscaler.role import DomainsFor
from tokenfab.planning.autoscaler.signals import Reading
from tokenfab.planning.lifecycle import GroupView, NodeHealth


def autoscale(
    md: ModelDeployment,
    groups: Mapping[RoleName, list[GroupView]],
    health: Mapping[str, NodeHealth],
    domains_for: DomainsFor,
    now: float,
    reader: Callable[[str, str], Reading],
    urgent: bool = False,
    warmth: Mapping[str, int] | None = None,
) -> autoscaler.Outcome:
    """`autoscaler.queries`, each read once with `reader` (Prometheus URL, query), then `autoscaler.step`
    from those readings: what the observe phase and the plan do in a pass."""
    asked = autoscaler.queries(md, now, urgent)
    readings = {q: reader(asked.url, q) for q in asked.texts()}
    seen = autoscaler.Seen(now, asked, readings, groups, health)
    memory = md.status.autoscaling if md.status else None
    return autoscaler.step(md, seen, memory, autoscaler.Capacity(domains_for, warmth or {}))


def due_queries(md: ModelDeployment, now: float, urgent: bool = False) -> list[str]:
    """The queries the next step reads."""
    return autoscaler.queries(md, now, urgent).texts()


def seconds_to_next(md: ModelDeployment, now: float) -> float | None:
    """Seconds until the deployment's next evaluation, by the memory its status holds."""
    return next_due(md, remembered(md, now), now)
