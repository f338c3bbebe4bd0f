"""A deployment's per-node model caches, pure: which nodes would start a new group warm.

With `model.cache.storageClassName`, hf:// weights are kept on each node the deployment ran on, in a
node-local PersistentVolumeClaim that outlives its pods (tokenfab.planning.builders.volumes). Once a worker
of the current revision served from a node's cache, the claim is marked with the weights it holds
(`contract.ANN_WEIGHTS`: source@revision): those weights load from local NVMe there, with no download.
A node's warmth (tokenfab.planning.topology.Warmth) is then:
- 0 warm: its claim is marked with the weights the spec asks for;
- 1 fetching: it has a claim, not (yet) marked with them: a download began there, or it holds another
  revision (the hub's client fetches only the files that changed);
- 2 cold: no claim: the weights come from their source.
New groups go to the warmest nodes they fit whole on (topology.choose_domain / best_fit_nodes); the
ledger and the whole-group rule come first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import builders as b
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.topology import COLD


def weights_key(spec: ModelDeploymentSpec) -> str:
    """What a cache holds: the source at its revision (the hub's main branch when none is pinned)."""
    return f"{spec.model.source}@{spec.model.revision or 'main'}"


def warmth(claims: Mapping[str, str], key: str) -> dict[str, int]:
    """Node -> warmth, from the deployment's model cache claims (node -> the weights they are marked
    with, "" when none yet)."""
    return {node: 0 if held == key else 1 for node, held in claims.items()}


def marks(claims: Mapping[str, str], served: Iterable[str], key: str) -> dict[str, str]:
    """What each claim is to be marked with: `key` where a worker of the current revision served (its
    cache holds those weights now), else what it was marked with."""
    return {**claims, **dict.fromkeys(served, key)}


def node_warmth(spec: ModelDeploymentSpec, claims: Mapping[str, str]) -> dict[str, int]:
    """The nodes' model cache warmth for this spec's weights (none without per-node caches)."""
    if not b.uses_model_cache_claims(spec):
        return {}
    return warmth(claims, weights_key(spec))


def served_nodes(spec: ModelDeploymentSpec, groups: Mapping[RoleName, list[GroupView]]) -> frozenset[str]:
    """The nodes where a worker of its role's current revision (so of the spec's weights) is Ready: their
    model caches hold those weights."""
    return frozenset(
        p.node
        for role, gs in groups.items()
        if spec.role(role) is not None
        for g in gs
        if g.revision == b.role_revision(spec, role)
        for p in g.pods
        if p.ready and p.node is not None
    )


def claim_marks(
    spec: ModelDeploymentSpec, claims: Mapping[str, str], groups: Mapping[RoleName, list[GroupView]]
) -> dict[str, str]:
    """What each of the deployment's model cache claims is to be marked with (see `marks`)."""
    return marks(claims, served_nodes(spec, groups), weights_key(spec))


__all__ = ["COLD", "claim_marks", "marks", "node_warmth", "served_nodes", "warmth", "weights_key"]
