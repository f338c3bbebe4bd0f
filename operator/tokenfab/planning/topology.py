"""Placement of worker groups in NVLink domains (pure: node and pod facts in, decisions out).

A group (one engine instance, tensor x pipeline GPUs) must sit inside one NVLink domain (one NVL72
rack): a multi-node group takes whole nodes, a sub-node group one pod on one node. `build_domains`
turns nodes and the GPUs their pods use into free GPUs per domain, `choose_domain` picks a domain by
the deployment's policy (pack = best fit, spread = fewest of this deployment's groups) and `reserve`
takes a group's GPUs out of it. Every function is deterministic: ties are broken by name, so the same
facts, in any order, give the same placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

PlacementPolicy = Literal["pack", "spread"]  # the same values as tokenfab.api.models.PlacementPolicy


@dataclass(frozen=True)
class NodeInfo:
    """A node as placement sees it; `domain` is its NVLink domain label value (None: not in a domain)."""

    name: str
    domain: str | None
    allocatable_gpus: int
    ready: bool
    schedulable: bool  # False when cordoned or tainted NoSchedule


@dataclass(frozen=True)
class GpuUse:
    """GPUs a pod uses: on its node when bound, else in the domain it is pinned to (if any)."""

    gpus: int
    node: str | None
    domain: str | None = None


@dataclass(frozen=True)
class GroupShape:
    """One group: `gpus` GPUs as `nodes` pods of `pod_gpus` GPUs each."""

    gpus: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise ValueError(f"a group needs at least 1 GPU on nodes of at least 1 GPU, got {self}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"a multi-node group must fill whole nodes, got {self}")

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def pod_gpus(self) -> int:
        return min(self.gpus, self.gpus_per_node)


@dataclass(frozen=True)
class Domain:
    """An NVLink domain; `free` holds free GPUs of its ready, schedulable nodes only (read-only)."""

    name: str
    total_gpus: int  # allocatable GPUs of all its nodes, ready or not
    free: Mapping[str, int] = field(hash=False)  # node -> free GPUs; unhashable, so not hashed
    nodes: int
    ready_nodes: int
    degraded: str = ""  # why it takes no new group until it heals ("": it may)

    def __post_init__(self) -> None:
        # A read-only copy in name order: no caller can change a Domain, and its order never varies.
        object.__setattr__(self, "free", MappingProxyType(dict(sorted(self.free.items()))))

    @property
    def free_gpus(self) -> int:
        return sum(self.free.values())


Chooser = Callable[[Mapping[str, Domain], GroupShape], str | None]


# How near a node's model cache is to serving the deployment's weights (tokenfab.planning.weights_cache):
# 0 warm (they served from it), 1 fetching (a cache is there, partly filled or of another revision), 2 cold;
# 3 cold here and kept warm by another deployment (its pre-staged headroom): chosen last (nodes and domains),
# so deployments do not take each other's staged nodes while others fit; its start path is a cold one.
Warmth = Mapping[str, int]
COLD = 2
ELSEWHERE = 3
PATHS = ("warm", "fetching", "cold")  # a new group's start path, by its coldest node's warmth


def best_fit_nodes(
    free: Mapping[str, int], pods: int, pod_gpus: int, warmth: Warmth | None = None
) -> list[str] | None:
    """The nodes for `pods` pods of `pod_gpus` GPUs: the warmest nodes that fit (`warmth`; none given: all
    alike), then the fullest, one pod per node (ties by name), in rank order; None when fewer nodes fit."""
    w = warmth or {}
    fitting = sorted((w.get(name, COLD), gpus, name) for name, gpus in free.items() if gpus >= pod_gpus)
    if len(fitting) < pods:
        return None
    return [name for _, _, name in fitting[:pods]]


def group_warmth(domain: Domain, shape: GroupShape, warmth: Warmth) -> int:
    """How warm a group placed in `domain` would start: its coldest node's warmth (COLD if it fits not)."""
    chosen = best_fit_nodes(domain.free, shape.nodes, shape.pod_gpus, warmth)
    return max((warmth.get(n, COLD) for n in chosen), default=COLD) if chosen else COLD


def _best_fit_nodes(free: Mapping[str, int], pods: int, pod_gpus: int) -> dict[str, int] | None:
    """`free` with `pods` pods of `pod_gpus` taken from the fullest nodes that fit (ties by name)."""
    chosen = best_fit_nodes(free, pods, pod_gpus)
    if chosen is None:
        return None
    out = dict(free)
    for name in chosen:
        out[name] -= pod_gpus
    return out


def build_domains(nodes: Iterable[NodeInfo], uses: Iterable[GpuUse]) -> dict[str, Domain]:
    """Domains from nodes and pod GPU uses.

    A bound pod's GPUs come off its node (free never drops below 0). Nodes that are not ready or not
    schedulable count in `total_gpus` but offer nothing. Unbound pods pinned to a domain are then
    reserved there, largest first, on the fullest node that fits (ties by name); one that fits nowhere
    reserves nothing (it waits like any pending pod). Unbound, unpinned pods and nodes outside any
    domain are ignored.
    """
    members: dict[str, list[NodeInfo]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        if node.domain is not None:
            members.setdefault(node.domain, []).append(node)
    uses = list(uses)
    used: Counter[str] = Counter()
    for use in uses:
        if use.node is not None:
            used[use.node] += use.gpus
    free = {
        domain: {n.name: max(0, n.allocatable_gpus - used[n.name]) for n in ns if n.ready and n.schedulable}
        for domain, ns in members.items()
    }
    pinned = sorted((-u.gpus, u.domain) for u in uses if u.node is None and u.domain in members)
    for minus_gpus, domain in pinned:
        taken = _best_fit_nodes(free[domain], 1, -minus_gpus)
        if taken is not None:
            free[domain] = taken
    return {
        name: Domain(
            name=name,
            total_gpus=sum(n.allocatable_gpus for n in ns),
            free=free[name],
            nodes=len(ns),
            ready_nodes=sum(1 for n in ns if n.ready),
        )
        for name, ns in sorted(members.items())
    }


def fits(domain: Domain, shape: GroupShape) -> bool:
    """Whether the domain has `shape.nodes` nodes with `shape.pod_gpus` free each."""
    return sum(1 for gpus in domain.free.values() if gpus >= shape.pod_gpus) >= shape.nodes


def reserve(domain: Domain, shape: GroupShape) -> Domain:
    """A new Domain with the group's pods taken from the fullest nodes that fit (ties by name)."""
    free = _best_fit_nodes(domain.free, shape.nodes, shape.pod_gpus)
    if free is None:
        raise ValueError(f"a group of {shape.gpus} GPUs does not fit in NVLink domain {domain.name}")
    return Domain(domain.name, domain.total_gpus, free, domain.nodes, domain.ready_nodes, domain.degraded)


def take(domain: Domain, nodes: Sequence[str], pod_gpus: int) -> Domain:
    """A new Domain with one pod of `pod_gpus` taken from each of `nodes` (which must have room)."""
    free = dict(domain.free)
    for name in nodes:
        if free.get(name, 0) < pod_gpus:
            raise ValueError(f"node {name} of NVLink domain {domain.name} has no room for {pod_gpus} GPUs")
        free[name] -= pod_gpus
    return Domain(domain.name, domain.total_gpus, free, domain.nodes, domain.ready_nodes, domain.degraded)


def next_path(domains: Mapping[str, Domain], shape: GroupShape, warmth: Warmth) -> str:
    """The start path of the next group placed (the warmest it can have where it fits whole)."""
    ranks = [group_warmth(d, shape, warmth) for d in domains.values() if fits(d, shape)]
    return PATHS[min(COLD, min(ranks, default=COLD))]


def choose_domain(
    domains: Mapping[str, Domain],
    shape: GroupShape,
    policy: PlacementPolicy,
    groups_per_domain: Mapping[str, int] | None = None,
    warmth: Warmth | None = None,
) -> str | None:
    """The domain for a group, or None when it fits nowhere.

    With `warmth` (the nodes' model caches), the domains where the group would start warmest come first:
    warm, then fetching, then cold; only among the domains it fits whole in. Then pack (best fit): the
    fitting domain with the fewest free GPUs, keeping large blocks whole for large groups; or spread: the
    fitting domain with the fewest of this deployment's groups (`groups_per_domain`), then the most free
    GPUs. Ties go to the first name.
    """
    groups = groups_per_domain or {}
    fitting = [d for d in domains.values() if fits(d, shape)]
    if not fitting:
        return None

    def warm(d: Domain) -> int:
        return group_warmth(d, shape, warmth) if warmth else 0

    if policy == "pack":
        return min(fitting, key=lambda d: (warm(d), d.free_gpus, d.name)).name
    return min(fitting, key=lambda d: (warm(d), groups.get(d.name, 0), -d.free_gpus, d.name)).name


def first_fit(domains: Mapping[str, Domain], shape: GroupShape) -> str | None:
    """The first fitting domain in name order: a baseline to compare best fit with, not a policy."""
    return min((d.name for d in domains.values() if fits(d, shape)), default=None)


def _block(domain: Domain, shape: GroupShape) -> int:
    if shape.nodes == 1:
        return max(domain.free.values(), default=0)
    return sum(1 for gpus in domain.free.values() if gpus >= shape.pod_gpus) * shape.pod_gpus


def largest_block(domains: Mapping[str, Domain], shape: GroupShape) -> tuple[int, str | None]:
    """The most GPUs a group of this shape could use in one domain, and that domain (first name on ties).

    A single-node group uses one node, so its block is the most free GPUs on one node. A multi-node
    group takes whole pods of `pod_gpus`, so its block is the nodes with at least `pod_gpus` free times
    `pod_gpus` (GPUs left on fuller nodes cannot be used by it). The group fits somewhere exactly when the
    block is at least `shape.gpus`. (0, None) when no domain has any usable GPU.
    """
    blocks = sorted((-_block(d, shape), d.name) for d in domains.values())
    if not blocks or blocks[0][0] == 0:
        return 0, None
    return -blocks[0][0], blocks[0][1]


def place_sequence(
    domains: Mapping[str, Domain],
    shapes: Sequence[GroupShape],
    policy: PlacementPolicy,
    chooser: Chooser | None = None,
) -> tuple[list[str | None], dict[str, Domain]]:
    """Place groups one after another, reserving each: their domains (None: did not fit) and the final
    domains. The groups are taken as one deployment's, so spread counts the ones placed so far; `chooser`
    replaces the policy (e.g. `first_fit`, for comparison)."""
    state = dict(domains)
    groups: Counter[str] = Counter()
    placed: list[str | None] = []
    for shape in shapes:
        name = chooser(state, shape) if chooser is not None else choose_domain(state, shape, policy, groups)
        if name is not None:
            state[name] = reserve(state[name], shape)
            groups[name] += 1
        placed.append(name)
    return placed, state
