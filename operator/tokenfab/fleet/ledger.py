"""The placement ledger: the one authority over NVLink-domain capacity in an operator process.

Every decision that consumes capacity (a new group, a replacement, a rollout surge, an autoscaler
scale-up, the completion of an interrupted group) is planned inside `Ledger.session()`, which holds the
ledger's lock: the free capacity a plan sees is the cluster view's (bound pods, pinned pods) minus the
reservations of pods promised by earlier plans but not yet seen by the watch, and the plan's own pods
are reserved before the lock is released. Decisions for different deployments interleave, but the same
room is never promised twice.

A reservation lives until its pod appears in the view (the pod then holds the room itself, on the node
it is pinned to) or its group is given up (its creation failed). A deployment that goes away keeps its
reservations: creates of its last pass may still be in flight, and their pods must not land on room
promised to another. A reservation whose pod never appears (a lost write) expires after `ttl` seconds.
Nothing here survives a restart, and nothing needs to: pods are pinned to their nodes from the moment
they exist, so a restarted operator rebuilds the same picture from the cluster.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from tokenfab.fleet.view import ClusterView, Key
from tokenfab.planning.capacity import Constraints, NodeFacts, Resources, add, snapshot
from tokenfab.planning.topology import Domain

PodKey = tuple[str, str]  # (namespace, pod name)


@dataclass(frozen=True)
class Reservation:
    owner: Key  # the deployment
    group: str
    node: str
    requests: Mapping[str, int]
    time: float


class Session:
    """Capacity as one plan sees it, while it holds the ledger's lock."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._nodes: list[NodeFacts] | None = None
        self._used: dict[str, dict[str, int]] | None = None

    def nodes(self) -> list[NodeFacts]:
        if self._nodes is None:
            self._nodes = self._ledger.view.nodes()
        return self._nodes

    def used(self) -> dict[str, dict[str, int]]:
        if self._used is None:
            self._used = self._ledger._usage()
        return self._used

    def domains(self, request: Resources, constraints: Constraints) -> dict[str, Domain]:
        """Free capacity per domain for pods of `request` under `constraints`."""
        return snapshot(self.nodes(), self.used(), request, constraints)

    def reserve(self, owner: Key, group: str, pods: Mapping[str, tuple[str, Resources]], now: float) -> None:
        """Promise `pods` (pod name -> (node, requests)) of `group`; later sessions see the room taken."""
        used = self.used()  # (read before the promise is recorded, or it would be counted twice)
        self._ledger._reserve(owner, group, pods, now)
        for node, requests in pods.values():
            used[node] = add(used.get(node, {}), requests)


class Ledger:
    def __init__(self, view: ClusterView, ttl: float = 120.0) -> None:
        self.view = view
        self.ttl = ttl
        self._lock = threading.Lock()
        self._reserved: dict[PodKey, Reservation] = {}

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with self._lock:
            yield Session(self)

    def _usage(self) -> dict[str, dict[str, int]]:
        # The view's usage and the pods it holds are read together: a pod whose watch event lands in
        # between would otherwise count neither as used nor as reserved, and its room be promised again.
        used, present = self.view.used_and_present(list(self._reserved))
        for key, r in list(self._reserved.items()):
            if key in present:  # the pod exists: it holds the room itself now
                del self._reserved[key]
                continue
            used[r.node] = add(used.get(r.node, {}), r.requests)
        return used

    def _reserve(self, owner: Key, group: str, pods: Mapping[str, tuple[str, Resources]], now: float) -> None:
        for name, (node, requests) in pods.items():
            self._reserved[(owner[0], name)] = Reservation(owner, group, node, dict(requests), now)

    def release(self, owner: Key, group: str | None = None) -> int:
        """Give up the reservations of a group (or of every group of a deployment) not created."""
        with self._lock:
            doomed = [k for k, r in self._reserved.items() if r.owner == owner and group in (None, r.group)]
            for k in doomed:
                del self._reserved[k]
            return len(doomed)

    def expire(self, now: float) -> int:
        with self._lock:
            doomed = [k for k, r in self._reserved.items() if now - r.time > self.ttl]
            for k in doomed:
                del self._reserved[k]
            return len(doomed)

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._reserved.values())
