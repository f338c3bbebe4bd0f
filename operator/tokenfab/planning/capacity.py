"""Capacity as the kube-scheduler sees it, per node and per NVLink domain (pure: facts in, domains out).

A node offers room to a group's pod only when the scheduler could bind the pod there: the node is Ready
and not cordoned, every NoSchedule/NoExecute taint is tolerated by the pod, its labels match the pod's
nodeSelector, and it has the pod's GPUs, CPU and memory free. `snapshot` turns nodes and what is in use
on them (bound pods, pods pinned but not bound yet, reservations not yet created) into `Domain`s whose
free GPUs count only what a pod of the given request can really use, so the placement functions of
`tokenfab.planning.topology` (best fit, spread, largest block) work unchanged.

Resources are integers: CPU in millicores, memory and storage in bytes, everything else in units.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from tokenfab.planning.faults import NodeFault
from tokenfab.planning.topology import Domain

Resources = Mapping[str, int]

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# A number with either a decimal exponent ("1e3") or a suffix ("500m", "4Gi"), never both ("1e3Mi").
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([a-zA-Z]{0,2})|[eE]([+-]?[0-9]+))$")


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("2", "500m", "4Gi", "1e3") as a Decimal; ValueError when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, (int, float)):
        q = Decimal(str(value))
        if not q.is_finite():  # inf and nan would break every sum (and int() of them raises)
            raise ValueError(f"not a quantity: {value!r}")
        return q
    match = _QUANTITY.match(value.strip())
    if not match or (match.group(2) or "") not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        if match.group(3) is not None:
            return Decimal(match.group(1)).scaleb(int(match.group(3)))
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None


def to_units(resource: str, value: str | int | float) -> int:
    """A quantity in the ledger's integer units: CPU in millicores (rounded up), the rest in units."""
    q = parse_quantity(value)
    if resource == "cpu":
        q *= 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def add(a: Resources, b: Resources, sign: int = 1) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + sign * v
    return out


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule: the effect matches (or is empty), then Exists matches the key (or every key
        when the key is empty) and Equal matches key and value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        if self.operator != "Equal":  # an operator this version does not know tolerates nothing
            return False
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class NodeFacts:
    """A node as placement needs it; `allocatable` in the units of `to_units`."""

    name: str
    labels: Mapping[str, str] = field(hash=False)
    allocatable: Mapping[str, int] = field(hash=False)
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    not_ready_since: float | None = None  # unix time the node stopped being Ready
    faults: tuple[NodeFault, ...] = ()  # what a health system, a cordon or a device taint says of it


@dataclass(frozen=True)
class Constraints:
    """Where a deployment's worker pods may run: the domain label they are grouped by, and the scheduling
    constraints of the pods (nodeSelector, tolerations)."""

    domain_label: str = "nvidia.com/gpu.clique"
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()


def untolerated(node: NodeFacts, tolerations: Iterable[Toleration]) -> list[Taint]:
    """The node's NoSchedule/NoExecute taints that no toleration tolerates (they keep the pod off)."""
    tols = list(tolerations)
    return [
        t
        for t in node.taints
        if t.effect in ("NoSchedule", "NoExecute") and not any(tol.tolerates(t) for tol in tols)
    ]


def feasible(node: NodeFacts, constraints: Constraints) -> bool:
    """Whether the scheduler could bind a worker pod of these constraints to the node (room aside)."""
    if not node.ready or node.unschedulable or node.faults or constraints.domain_label not in node.labels:
        return False
    if any(node.labels.get(k) != v for k, v in constraints.node_selector):
        return False
    return not untolerated(node, constraints.tolerations)


def pods_that_fit(free: Resources, request: Resources) -> int:
    """How many pods of `request` fit in `free` (every requested resource counts)."""
    n: int | None = None
    for res, want in request.items():
        if want <= 0:
            continue
        have = free.get(res, 0)
        k = max(0, have // want)
        n = k if n is None else min(n, k)
    return 1_000_000 if n is None else n


def usable_gpus(free: Resources, request: Resources, gpu_resource: str) -> int:
    """The free GPUs of a node that pods of `request` can use: all of them, unless CPU, memory or another
    requested resource runs out first (then as many as the pods that fit can take)."""
    gpus = max(0, free.get(gpu_resource, 0))
    pod_gpus = request.get(gpu_resource, 0)
    if pod_gpus <= 0:
        return gpus
    others = {k: v for k, v in request.items() if k != gpu_resource}
    return min(gpus, pods_that_fit(free, others) * pod_gpus) if others else gpus


def free_on(node: NodeFacts, used: Resources | None) -> dict[str, int]:
    return add(node.allocatable, used or {}, -1)


def degraded_by(nodes: Iterable[NodeFacts]) -> str:
    """Why a domain of these nodes takes no new group (a node quarantined or with a tainted device), or
    "" when it may."""
    for n in sorted(nodes, key=lambda n: n.name):
        for f in n.faults:
            if f.degrades:
                return f"node {n.name} {f.kind.lower()} ({f.message})"
    return ""


def snapshot(
    nodes: Iterable[NodeFacts],
    used: Mapping[str, Resources],
    request: Resources,
    constraints: Constraints,
) -> dict[str, Domain]:
    """Domains (by `constraints.domain_label`) with the GPUs pods of `request` could use on each feasible
    node. Infeasible nodes count in a domain's total and readiness but offer nothing; nodes without the
    label belong to no domain."""
    label = constraints.domain_label
    members: dict[str, list[NodeFacts]] = {}
    for node in nodes:
        domain = node.labels.get(label)
        if domain is not None:
            members.setdefault(domain, []).append(node)
    asked = tuple(sorted(request.items()))
    return {name: _domain(name, members[name], used, asked, constraints) for name in sorted(members)}


# The domains `snapshot` made, each with what it was made from. Every plan that places a group takes a
# snapshot of the whole cluster, and between two plans most domains did not change (on 128 racks, the
# snapshot was a quarter of the operator's CPU in a burst): a domain whose nodes and usage are the same
# is given again, found by identity and ==, without working out its room. Bounded; a lost race between
# two workers only computes a domain twice.
_Made = tuple[tuple[NodeFacts, ...], tuple[Resources | None, ...], Domain]
_MADE: dict[tuple[str, tuple[tuple[str, int], ...], Constraints], _Made] = {}
_MADE_MAX = 8192


def _domain(
    name: str,
    ns: list[NodeFacts],
    used: Mapping[str, Resources],
    asked: tuple[tuple[str, int], ...],
    constraints: Constraints,
) -> Domain:
    key = (name, asked, constraints)
    uses = tuple(used.get(n.name) for n in ns)
    made = _MADE.get(key)
    if (
        made is not None
        and len(made[0]) == len(ns)
        and all(a is b or a == b for a, b in zip(made[0], ns, strict=True))
        and made[1] == uses
    ):
        return made[2]
    request, gpu = dict(asked), constraints.gpu_resource
    degraded = degraded_by(ns)
    free = {
        n.name: usable_gpus(free_on(n, u), request, gpu)
        for n, u in zip(ns, uses, strict=True)
        if feasible(n, constraints) and not degraded
    }
    out = Domain(
        name=name,
        total_gpus=sum(n.allocatable.get(gpu, 0) for n in ns),
        free=free,
        nodes=len(ns),
        ready_nodes=sum(1 for n in ns if n.ready),
        degraded=degraded,
    )
    if len(_MADE) >= _MADE_MAX:
        _MADE.clear()
    _MADE[key] = (tuple(ns), uses, out)
    return out
