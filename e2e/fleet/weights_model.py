"""How long a new engine's weights take to load in the factory: a MODEL of time, not a measurement.

The fleet runner plays the kubelet and the hardware; weight loading is part of the hardware it simulates
(the launcher's own fetch is tested on its own, tests/launcher/test_launcher.py). A new engine is held back
before it registers for as long as its weights would take on the path they come from, and that path follows
from the pod's model cache volume, as it would on a cluster:

- "cold": the weights come from the hub: a per-pod emptyDir (always), or a node-local model cache
  claim nothing has downloaded into yet (this engine starts that download);
- "fetching": the claim's download began for an earlier engine and is not done: this one waits for it,
  then loads from the local disk;
- "warm": the claim holds the weights (a download into it completed): loaded from the local NVMe.

A weights-fetch pod (pre-staging) downloads into its node's claim and completes: `download`.

The published figures (docs/weights-timing.md has them with their sources) are for one reference model:
ModelExpress' DeepSeek-V4-Pro on B200, TP8, weights alone: 533 s from Hugging Face, 196 s from S3, 70 s
from local NVMe, 11 s from a peer GPU over RDMA. Benchmarks compress time (a trace lasts minutes), so the
model keeps the published ratios and scales them to the run's cold start: `cold_s` is the hub path,
and a warm start takes cold_s x 70 / 533. A figure that comes from this model is labelled "modeled".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Path = Literal["warm", "fetching", "cold"]

# Seconds to load the reference model's weights, by where they come from (docs/weights-timing.md).
PUBLISHED_S = {"hf": 533.0, "s3": 196.0, "nvme": 70.0, "peer_rdma": 11.0}


def warm_seconds(cold_s: float) -> float:
    """The modeled local-NVMe load for a run whose hub path takes `cold_s`: the published ratio."""
    return cold_s * PUBLISHED_S["nvme"] / PUBLISHED_S["hf"]


@dataclass
class CacheModel:
    """The simulated model caches: for each cache (a claim's uid and the weights, source@revision), when
    its download completes. Lives as long as the runner (claims are deleted with their deployments, and a
    new claim has a new uid)."""

    cold_s: float
    done_at: dict[str, float] = field(default_factory=dict)

    def hold(self, cache: str | None, now: float) -> tuple[Path, float]:
        """(path, seconds) a new engine is held back at `now`: `cache` is its model cache's key, None for
        a per-pod emptyDir (downloaded again by every pod)."""
        warm = warm_seconds(self.cold_s)
        if cache is None:
            return "cold", self.cold_s
        done = self.done_at.get(cache)
        if done is None:
            self.done_at[cache] = now + self.cold_s - warm  # the download; the load from disk follows it
            return "cold", self.cold_s
        if done <= now:
            return "warm", warm
        return "fetching", done - now + warm

    def abandon(self, cache: str | None, now: float) -> None:
        """A weights-fetch pod was deleted before its download ended: the cache does not hold the weights
        (an engine there later starts cold; pessimistic: what was downloaded is not counted)."""
        if cache is not None and self.done_at.get(cache, now) > now:
            del self.done_at[cache]

    def download(self, cache: str | None, now: float) -> float:
        """Seconds until `cache` holds the weights, for a weights-fetch pod that stages them there: its
        download starts now unless one began (0 when the cache holds them)."""
        fetch = self.cold_s - warm_seconds(self.cold_s)
        if cache is None:
            return fetch
        return max(0.0, self.done_at.setdefault(cache, now + fetch) - now)


__all__ = ["PUBLISHED_S", "CacheModel", "Path", "warm_seconds"]
