"""Whether an SLA plan fits the cluster (pure): its groups placed on the free GPUs of the NVLink domains
with the operator's own placement policy, group by group, largest first. Reached as
`tokenfab.planning.sla.check_capacity`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenfab.planning.topology import Domain, GroupShape, PlacementPolicy, largest_block, place_sequence

if TYPE_CHECKING:
    from tokenfab.planning.sla import PlanRow


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
