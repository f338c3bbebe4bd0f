"""Free NVLink-domain capacity as one plan sees it: `Room`, what the placement ledger saw free when the
plan began (read at most once, and only by a plan that needs it), and `FreeDomains`, the free domains per
role with the plan's own reservations taken off as it goes, role by role. Pure: the ledger
(tokenfab.fleet.ledger) hands the plan its nodes and usage, and records the plan's `Reservation`s once the
plan is made. (Not in tokenfab.planning.capacity, the scheduler's view of a node, which the builders
import: a plan's room names its pods with the builders.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import builders
from tokenfab.planning.capacity import Constraints, NodeFacts, Resources, add, snapshot
from tokenfab.planning.groups import RolePlan
from tokenfab.planning.topology import Domain


class Room:
    """Free capacity as the placement ledger saw it when the plan began: the nodes and what is used on
    each (bound pods, pinned pods, the reservations of earlier plans). `load` is asked at most once, and
    only by a plan that needs room (most passes never do); the ledger's lock holds it still meanwhile."""

    def __init__(
        self,
        load: Callable[[], tuple[Sequence[NodeFacts], Mapping[str, Resources]]],
        constraints: Constraints,
    ) -> None:
        self._load = load
        self.constraints = constraints
        self._value: tuple[Sequence[NodeFacts], Mapping[str, Resources]] | None = None

    @classmethod
    def fixed(
        cls, nodes: Sequence[NodeFacts], used: Mapping[str, Resources], constraints: Constraints
    ) -> Room:
        return cls(lambda: (nodes, used), constraints)

    def read(self) -> tuple[Sequence[NodeFacts], Mapping[str, Resources]]:
        if self._value is None:
            self._value = self._load()
        return self._value

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def holds_fault(self, kind: str) -> bool:
        """Whether a node of the room (read already) has a fault of `kind`."""
        return self._value is not None and any(f.kind == kind for n in self._value[0] for f in n.faults)

    def tolerating(self, kind: str) -> Room:
        """The same room with faults of `kind` taken off its nodes (a node with no other fault offers its
        GPUs again)."""
        nodes, used = self.read()
        eased = [
            replace(n, faults=tuple(f for f in n.faults if f.kind != kind)) if n.faults else n for n in nodes
        ]
        return Room.fixed(eased, used, self.constraints)


@dataclass(frozen=True)
class Reservation:
    """Room promised to the pods of a new group (pod name -> (node, requests))."""

    group: str
    pods: Mapping[str, tuple[str, Resources]]


class FreeDomains:
    """Per-role free domains inside one plan, the plan's own reservations taken off."""

    def __init__(self, room: Room, spec: ModelDeploymentSpec, owner: builders.Owner, rdma: str = "") -> None:
        """`rdma`: the RDMA device each pod of a prefill-decode unit holds, one (planning.units.needs_rdma):
        counted like the GPUs, so a group goes only where its nodes have one free."""
        self.room, self.spec, self.owner, self.rdma = room, spec, owner, rdma
        self.reserved: dict[str, dict[str, int]] = {}
        self.reservations: list[Reservation] = []
        self._cache: dict[RoleName, dict[str, Domain]] = {}

    def __call__(self, role: RoleName) -> dict[str, Domain]:
        if role not in self._cache:
            nodes, used = self.room.read()
            mine = {n: add(used.get(n, {}), r) for n, r in self.reserved.items()}
            request = self.request(role)
            self._cache[role] = snapshot(nodes, {**used, **mine}, request, self.room.constraints)
        return self._cache[role]

    def request(self, role: RoleName) -> dict[str, int]:
        """What one pod of the role asks for, in the ledger's units."""
        request = builders.pod_requests(self.spec, role)
        if self.rdma and role in ("prefill", "decode"):
            request.setdefault(self.rdma, 1)
        return request

    def reserve(self, plan: RolePlan) -> None:
        if not plan.create:
            return
        requests = self.request(plan.role)
        for cr in plan.create:
            group = builders.group_name(self.owner, cr.role, cr.slot)
            ranks = cr.ranks or tuple(range(len(cr.nodes)))
            pods = {builders.pod_name(group, r): (n, requests) for r, n in zip(ranks, cr.nodes, strict=True)}
            self.reservations.append(Reservation(group, pods))
            for node, req in pods.values():
                self.reserved[node] = add(self.reserved.get(node, {}), req)
        self._cache.clear()


class LazyDomains(Mapping[str, Domain]):
    """A role's free domains computed on first use (most role plans never need them)."""

    def __init__(self, make: Callable[[], Mapping[str, Domain]]) -> None:
        self._make = make
        self._value: Mapping[str, Domain] | None = None

    def _get(self) -> Mapping[str, Domain]:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __getitem__(self, key: str) -> Domain:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())
