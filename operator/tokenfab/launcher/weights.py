"""hf:// and s3:// weights (pure): what to fetch, where to take it from, and pointing the engine at the
snapshot.

tokenfab.launcher.run.Runner.fetch_weights asks the model cache and the source (tokenfab.launcher.fetch,
tokenfab.launcher.s3), then follows these decisions; pvc:// weights are mounted by the pod and need none
of this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tokenfab.launcher.identity import ConfigError, Identity

_COMMIT = re.compile(r"[0-9a-f]{40}")

WeightsSource = Literal["cache", "download", "offline", "modelexpress", "copy"]


FETCHED = ("hf", "s3", "pvc")  # the sources the launcher fetches (pvc://: copies) into a model cache


@dataclass(frozen=True)
class Fetch:
    """Weights from a model hub or an S3 bucket, at a revision, into the node's model cache, before anything
    starts: every rank of a group loads its shard from the same local snapshot (the engine gets its path)."""

    repo: str  # hf: <org>/<repo>; s3: <bucket>/<prefix>; pvc: <claim>/<path>
    revision: str | None  # hf: None is the hub's main branch; s3: a label (the objects are listed)
    cache_dir: str
    scheme: str = "hf"

    def url(self) -> str:
        """The weights as the log names them: source@revision."""
        return f"{self.scheme}://{self.repo}@{self.revision or ('main' if self.scheme == 'hf' else 'latest')}"


def fetch_of(identity: Identity) -> Fetch | None:
    """hf:// and s3:// sources are downloaded by the launcher (into the model cache volume); pvc:// weights
    are copied from their mounted claim into it when the pod has one (model.cache.storageClassName), and
    are loaded where they are mounted otherwise."""
    scheme, _, rest = identity.model_source.partition("://")
    if scheme not in FETCHED or not rest or (scheme == "pvc" and not identity.model_cache_set):
        return None
    return Fetch(rest, identity.model_revision, identity.model_cache, scheme)


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
