"""hf:// weights (pure): what to fetch, where to take it from, and pointing the engine at the snapshot.

tokenfab.launcher.run.Runner.fetch_weights asks the model cache and the hub, then follows these decisions;
pvc:// weights are mounted by the pod and need none of this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tokenfab.launcher.identity import ConfigError, Identity

_COMMIT = re.compile(r"[0-9a-f]{40}")

WeightsSource = Literal["cache", "download", "offline"]


@dataclass(frozen=True)
class Fetch:
    """Weights from a model hub, at a revision, into the node's model cache, before anything starts: every
    rank of a group loads its shard from the same local snapshot (the engine gets its path)."""

    repo: str
    revision: str | None  # None: the hub's main branch
    cache_dir: str


def fetch_of(identity: Identity) -> Fetch | None:
    """hf:// sources are downloaded by the launcher (at model.revision, into the model cache volume); pvc://
    weights are mounted and need nothing."""
    scheme, _, rest = identity.model_source.partition("://")
    if scheme != "hf" or not rest:
        return None
    return Fetch(rest, identity.model_revision, identity.model_cache)


def weights_source(revision: str | None, cached: bool, complete: bool, offline: bool) -> WeightsSource:
    """Where the launcher takes hf:// weights from:
    - "cache": a pinned commit whose snapshot a completed download left in the cache, verified against
      the manifest that download wrote (tokenfab.launcher.manifest; what a commit is can never change);
    - "offline": HF_HUB_OFFLINE, whatever the cache holds;
    - "download" otherwise: the hub resolves a branch or tag to its current commit and fetches what the
      cache lacks (nothing, for a complete snapshot), so every rank of a group loads the same commit."""
    if offline:
        return "offline"
    if cached and complete and revision is not None and _COMMIT.fullmatch(revision):
        return "cache"
    return "download"


def with_model_path(command: Sequence[str], path: str) -> tuple[str, ...]:
    """The command with the engine's --model-path (or --model) pointing at `path`: the fetched snapshot."""
    out = list(command)
    for flag in ("--model-path", "--model"):
        if flag in out and out.index(flag) + 1 < len(out):
            out[out.index(flag) + 1] = path
            return tuple(out)
    raise ConfigError([f"the engine command has no --model-path to point at {path}: {' '.join(command)}"])
