"""Backoff for groups that keep failing (pure; time is a parameter).

A group whose pod fails (the engine exits, or its pods cannot bind in time) is deleted whole and replaced
at once. When that keeps happening to a role, each further replacement waits longer: 10 s after the
second failure in a row, then 20, 40, ... up to 5 minutes, so a crash-looping engine does not churn the
cluster (and its scheduler) in a hot loop. A failure caused by the infrastructure (a node lost) does not
count: the group is replaced at once. The count is kept in the resource's status and forgotten once the
role serves all its groups for `HEALTHY_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BASE_SECONDS = 10.0
CAP_SECONDS = 300.0
HEALTHY_SECONDS = 120.0
# Broken reasons that a replacement would likely meet again (see lifecycle.classify).
_RECURRING = (" failed", " succeeded", "not bound within", "could not be completed")


@dataclass(frozen=True)
class Failures:
    """Consecutive group failures of one role."""

    count: int
    last: float  # unix time of the last one
    message: str  # why the last one failed

    def retry_at(self) -> float:
        if self.count <= 1:
            return float(self.last)  # one failure: replaced at once
        return float(self.last + min(CAP_SECONDS, BASE_SECONDS * 2 ** (self.count - 2)))


def recurring(why: str) -> bool:
    """Whether a broken group's reason is its own (an engine that exits, pods that cannot bind), rather
    than the infrastructure's (a lost node)."""
    return any(marker in why for marker in _RECURRING)


def update(
    old: Failures | None,
    broken: Sequence[str],
    serving: int,
    desired: int,
    healthy_since: float | None,
    now: float,
) -> Failures | None:
    """A role's failures after one pass: `broken` are the reasons of the groups it found broken,
    `healthy_since` when the role last had all its desired groups serving (None: it does not now)."""
    own = [why for why in broken if recurring(why)]
    if own:
        return Failures((old.count if old else 0) + len(own), now, own[0])
    if old is not None and desired > 0 and serving >= desired:
        since = healthy_since if healthy_since is not None else now
        if now - max(since, old.last) >= HEALTHY_SECONDS:
            return None
    return old


def hold(failures: Failures | None, now: float) -> float:
    """Seconds to wait before the role may create a replacement group (0: it may now)."""
    if failures is None:
        return 0.0
    return max(0.0, failures.retry_at() - now)


def summary(per_role: Mapping[str, Failures], now: float) -> str:
    parts = []
    for role, f in sorted(per_role.items()):
        wait = hold(f, now)
        when = f"next attempt in {wait:.0f} s" if wait > 0 else "retrying now"
        parts.append(f"{role}: {f.count} group failure(s) in a row ({when}); last: {f.message}")
    return "; ".join(parts)
