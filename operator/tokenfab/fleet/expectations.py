"""Expectations: writes a deployment's last pass made that the watch has not shown yet (after the
ReplicaSet controller's). While any is outstanding the next pass does nothing but wait, so a pass never
plans from a view older than its own writes (which would create a group twice). An expectation that is
never met (a lost event) lapses after `ttl` seconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tokenfab.fleet.view import ClusterView, Key


@dataclass
class Pending:
    created: set[str] = field(default_factory=set)  # pod names that must appear
    deleted: set[str] = field(default_factory=set)  # pod names that must be gone or terminating
    released: set[str] = field(default_factory=set)  # pod names whose gate must be lifted
    since: float = 0.0


class Expectations:
    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._pending: dict[Key, Pending] = {}

    def expect(
        self,
        key: Key,
        now: float,
        created: set[str] = frozenset(),  # type: ignore[assignment]
        deleted: set[str] = frozenset(),  # type: ignore[assignment]
        released: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        if not (created or deleted or released):
            return
        with self._lock:
            p = self._pending.setdefault(key, Pending(since=now))
            p.created |= set(created)
            p.deleted |= set(deleted)
            p.released |= set(released)
            p.since = now

    def satisfied(self, key: Key, view: ClusterView, now: float) -> bool:
        with self._lock:
            p = self._pending.get(key)
            if p is None:
                return True
            ns = key[0]
            p.created = {n for n in p.created if view.pod(ns, n) is None}
            p.deleted = {n for n in p.deleted if (f := view.pod(ns, n)) is not None and not f.deleting}
            p.released = {n for n in p.released if (f := view.pod(ns, n)) is not None and f.gated}
            if not (p.created or p.deleted or p.released) or now - p.since > self.ttl:
                del self._pending[key]
                return True
            return False

    def forget(self, key: Key) -> None:
        with self._lock:
            self._pending.pop(key, None)
