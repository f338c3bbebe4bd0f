"""Least-recently-used eviction of model caches, per node (pure).

A node's local NVMe keeps the model cache of every source that ran there (one claim per source, shared by
the namespace's deployments of it, kept when their pods leave: tokenfab.planning.weights_cache). A node
labelled `tokenfab.dev/model-cache-capacity` (a quantity, e.g. 28Ti) gives the caches that much: when the
claims there ask for more, those nothing pins go, the longest idle first, until the rest fit. A claim is
pinned while a pod of a deployment that uses it is on the node or placed there, while the node is in such
a deployment's pre-staged headroom, and while a download into it runs; a claim several deployments use
is idle since the last of them let go. A deployment deletes only claims it uses, and every deployment's
pass ranks a node's claims the same way (idle since, then name; the others' idle times from their
status.weightsCache.idleSince, a claim missing there counted as pinned), so the passes agree on which go.
Pinned claims are never evicted: a node whose pinned caches exceed its capacity keeps them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheEntry:
    """A model cache claim on a node, of any deployment: its size (bytes asked for) and since when nothing
    pins it (unix time; None: pinned)."""

    claim: str  # namespace/name
    node: str
    size: int
    idle_since: float | None


@dataclass(frozen=True)
class NodeCaches:
    """What the other deployments keep on the nodes: the nodes they pre-stage, their model cache claims on
    the nodes this deployment has claims on, and those nodes' capacity for model caches (bytes)."""

    staged_elsewhere: frozenset[str] = frozenset()
    others: tuple[CacheEntry, ...] = ()
    capacity: Mapping[str, int] = field(default_factory=dict)


def evictions(entries: Iterable[CacheEntry], capacity: Mapping[str, int]) -> frozenset[str]:
    """The claims to delete: on each node with a capacity whose claims ask for more than it, the unpinned
    ones idle longest first (ties by claim), until the rest fit or none is left unpinned."""
    by_node: dict[str, list[CacheEntry]] = defaultdict(list)
    for e in merged(entries):
        by_node[e.node].append(e)
    out: set[str] = set()
    for node, es in by_node.items():
        if node not in capacity:
            continue
        over = sum(e.size for e in es) - capacity[node]
        for e in sorted((e for e in es if e.idle_since is not None), key=lambda e: (e.idle_since, e.claim)):
            if over <= 0:
                break
            out.add(e.claim)
            over -= e.size
    return frozenset(out)


def merged(entries: Iterable[CacheEntry]) -> list[CacheEntry]:
    """One entry per claim: one several deployments use is pinned while any of them pins it, and idle
    since the latest of their idle times."""
    by_claim: dict[str, CacheEntry] = {}
    for e in entries:
        seen = by_claim.get(e.claim)
        if seen is None:
            by_claim[e.claim] = e
            continue
        idle = None if seen.idle_since is None or e.idle_since is None else max(seen.idle_since, e.idle_since)
        by_claim[e.claim] = CacheEntry(e.claim, e.node, max(seen.size, e.size), idle)
    return list(by_claim.values())


def idle_times(
    nodes: Iterable[str], pinned: Iterable[str], before: Mapping[str, float], now: float
) -> dict[str, float]:
    """Since when each of a deployment's claim nodes is idle (not `pinned`): as before, or from now."""
    held = set(pinned)
    return {n: before.get(n, now) for n in sorted(set(nodes) - held)}


__all__ = ["CacheEntry", "NodeCaches", "evictions", "idle_times", "merged"]
