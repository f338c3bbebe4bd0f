"""Prefill-decode units, pure: which prefill and decode groups of a disaggregated deployment belong
together, where a new group of a unit goes, and which path the unit's KV transfers take.

A unit is a set of decode groups with the prefill groups that feed them. With ratioPolicy fixed and
prefillDecodeRatio P:D (reduced), unit k holds decode slots kD..kD+D-1 and prefill slots kP..kP+P-1,
so prefill = ceil(decode x P / D) fills units in order; with ratioPolicy independent (or no ratio) each
decode group is a unit and prefill slot j joins unit j mod (decode groups) when it is created. A group's
unit is written on its pods (`tokenfab.dev/unit`) when it is created and never changes.

Placement keeps a unit in one NVLink domain where it fits, as Dynamo's GB200 recipes do (one
ComputeDomain over the prefill and decode workers): a new group goes where its unit's other groups are
when that domain has room, and the first decode group of a unit goes where the whole unit fits (its
prefill groups beside it). Where it cannot, the unit spans domains and its KV crosses the network.

A unit's path (`path`): `nvlink` when every group of it is in one NVLink domain and its pods share the
unit's IMEX channel (multi-node NVLink: UCX's cuda_ipc with fabric handles); `rdma` when it spans domains
(or has no channel) and the workers hold RDMA devices; else `tcp`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenfab.api.models import KvNetwork, KvPath, ModelDeploymentSpec, RoleName
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.role_plan import RolePlan
from tokenfab.planning.topology import Domain, GroupShape, reserve

UNIT_ROLES: tuple[RoleName, ...] = ("decode", "prefill")
Path = KvPath  # nvlink | rdma | tcp
PATHS: tuple[Path, ...] = ("nvlink", "rdma", "tcp")  # fastest first


@dataclass(frozen=True)
class Rule:
    """How groups form units: `prefill` prefill groups and `decode` decode groups per unit; `fixed`: by
    slot (ratioPolicy fixed), else prefill groups are dealt over the decode groups."""

    prefill: int
    decode: int
    fixed: bool


def rule(spec: ModelDeploymentSpec) -> Rule | None:
    """The deployment's unit rule; None when it has no units (aggregated, or one role only)."""
    if spec.serving.mode != "disaggregated" or not all(spec.role(r) for r in UNIT_ROLES):
        return None
    ratio = spec.serving.prefill_decode_ratio
    if spec.serving.ratio_policy == "fixed" and ratio:
        p, d = (int(x) for x in ratio.split(":"))
        g = math.gcd(p, d)
        return Rule(p // g, d // g, True)
    return Rule(1, 1, False)


def unit_of(r: Rule, role: RoleName, slot: int, decode_groups: int) -> int:
    """The unit a new group of `role` in `slot` joins (`decode_groups`: the decode groups wanted)."""
    if role == "decode":
        return slot // r.decode
    if r.fixed:
        return slot // r.prefill
    return slot % max(1, decode_groups)


def group_unit(r: Rule, g: GroupView, decode_groups: int) -> int:
    """A group's unit: as written on its pods, else (a group made before units) from its slot."""
    return g.unit if g.unit is not None else unit_of(r, g.role, g.slot, decode_groups)


@dataclass(frozen=True)
class Member:
    """A group of a unit, where it is (or is being created)."""

    group: str  # its name ("" for one this plan creates: see slot)
    role: RoleName
    domain: str
    slot: int = 0
    nodes: tuple[str, ...] = ()  # the nodes of its pods (bound, or placed)
    labelled: bool = True  # its pods carry the unit (a group made before units claims its own channel)
    rdma: bool = False  # its pods hold an RDMA device and IPC_LOCK


@dataclass
class Units:
    """The deployment's units as one plan sees them: their members, kept or being created."""

    rule: Rule
    decode_groups: int
    shapes: Mapping[RoleName, GroupShape]
    members: dict[int, list[Member]] = field(default_factory=dict)
    # units whose ComputeDomain is NotReady (its IMEX daemons failed): no new group joins them, so their
    # replacements form a new unit with a new ComputeDomain, and theirs goes with their last group
    down: frozenset[int] = frozenset()
    # how a unit that spans domains moves its KV (spec.topology.kvNetwork), and whether each role's pods
    # hold the unit's IMEX channel (without one, KV between trays crosses the network even in one domain)
    network: KvNetwork = "rdma"
    channel: Mapping[RoleName, bool] = field(default_factory=dict)
    rdma: bool = False  # every group of a unit holds an RDMA device and IPC_LOCK (`needs_rdma`)
    rdma_why: str = ""  # and why (`rdma_reason`), for the Placed condition's message

    def add(self, unit: int, member: Member) -> None:
        self.members.setdefault(unit, []).append(member)

    # room kept in a domain for the groups still to come beside a unit's first decode group (its other
    # decode groups, and its prefill groups, planned after decode), so a later unit does not take it
    kept: dict[str, list[tuple[int, GroupShape]]] = field(default_factory=dict)  # domain -> (unit, shape)

    def new_member(self, role: RoleName, replaces: str, gone: Iterable[str]) -> int:
        """The unit of a new group: the one of the group it replaces (unless that unit is down), else the
        first short of the role (`assign`)."""
        unit = self.unit_of_group(replaces) if replaces else None
        return unit if unit is not None else self.assign(role, gone)

    def _kept_beside(self, domain: str, unit: int, shape: GroupShape) -> tuple[list[GroupShape], bool]:
        """The room kept in `domain` for groups still to come, less one kept for this unit's group of
        this shape (the group being placed); and whether there was one."""
        rest = list(self.kept.get(domain, []))
        mine = (unit, shape) in rest
        if mine:
            rest.remove((unit, shape))
        return [s for _, s in rest], mine

    def choose(
        self,
        role: RoleName,
        shape: GroupShape,
        unit: int,
        open_domains: Mapping[str, Domain],
        pick: Callable[[Mapping[str, Domain]], str | None],
        leaving: Iterable[str] = (),
    ) -> str | None:
        """The domain for a new group of `unit`: beside the unit's other groups where that domain has room
        (beside the room kept for other units; the domain holding most of the unit's GPUs first); else,
        for a group of a unit that has others (a replacement), where it fits with all of them, so they can
        follow (`rejoin_room`); for a unit's first decode group, where the whole unit fits (its companions'
        room is then kept there); else `pick`'s (the placement policy) among all. `leaving`: groups this
        one replaces (no longer the unit's)."""
        for name in self.domains(unit):
            others, mine = self._kept_beside(name, unit, shape)
            if name in open_domains and fits_all(open_domains[name], (shape, *others)):
                if mine:
                    self.kept[name].remove((unit, shape))
                return name
        gone = {n for n in leaving if n}
        staying = [self.shapes[m.role] for m in self.members.get(unit, []) if m.group not in gone]
        if staying:
            together = {
                k: d
                for k, d in open_domains.items()
                if fits_all(d, (shape, *staying, *(s for _, s in self.kept.get(k, ()))))
            }
            chosen = pick(together) if together else None
            if chosen is not None:
                return chosen
        companions = self.companions(role, unit)
        if companions:
            whole = {
                k: d
                for k, d in open_domains.items()
                if fits_all(d, (shape, *companions, *(s for _, s in self.kept.get(k, ()))))
            }
            chosen = pick(whole) if whole else None
            if chosen is not None:
                self.kept.setdefault(chosen, []).extend((unit, c) for c in companions)
                return chosen
        return pick(open_domains)

    def home(self, unit: int) -> str | None:
        """Where the unit's groups gather: the domain of its decode groups (the most of their GPUs; a
        replacement goes where the whole unit fits, and the prefill groups follow it), then of all its
        GPUs, then by name."""
        order = self.domains(unit)
        return order[0] if order else None

    def _gpus(self, unit: int, roles: tuple[RoleName, ...] = UNIT_ROLES) -> Counter[str]:
        gpus: Counter[str] = Counter()
        for m in self.members.get(unit, []):
            if m.domain and m.role in roles:
                gpus[m.domain] += self.shapes[m.role].gpus if m.role in self.shapes else 0
        return gpus

    def rejoin_room(self, group: str, shape: GroupShape, domains: Mapping[str, Domain]) -> str | None:
        """The domain a kept group away from its unit's home (`home`) would move to: the home, when it has
        room for the group (beside the room kept for groups still to come); None when it is at home, has
        no unit, or the home is full."""
        unit = self.unit_of_group(group)
        if unit is None:
            return None
        home = self.home(unit)
        where = next((m.domain for m in self.members[unit] if m.group == group), "")
        if home is None or home == where or home not in domains:
            return None
        others, _ = self._kept_beside(home, unit, shape)
        return home if fits_all(domains[home], (shape, *others)) else None

    def unit_of_group(self, group: str) -> int | None:
        """The unit a kept group belongs to (None: not one of the units' groups, or its unit is down)."""
        unit = next((u for u, ms in self.members.items() for m in ms if m.group == group), None)
        return None if unit in self.down else unit

    def assign(self, role: RoleName, gone: Iterable[str] = ()) -> int:
        """The unit a new group of `role` joins: the first one short of the role's groups (decode: D per
        unit; prefill with a fixed ratio: P per unit), or, with prefill dealt over decode groups, the
        unit with the fewest prefill groups; `gone`: groups this plan deletes (no longer members)."""
        out = set(gone)
        count = Counter(
            u for u, ms in self.members.items() for m in ms if m.role == role and m.group not in out
        )
        if role == "decode" or self.rule.fixed:
            quota = self.rule.decode if role == "decode" else self.rule.prefill
            last = max([*self.members, *self.down], default=-1) + 1
            return next(u for u in range(last + 1) if count[u] < quota and u not in self.down)
        decode_units = sorted(
            u
            for u, ms in self.members.items()
            if u not in self.down and any(m.role == "decode" and m.group not in out for m in ms)
        )
        fresh = next(u for u in range(len(self.members) + len(self.down) + 1) if u not in self.down)
        return min(decode_units or [fresh], key=lambda u: (count[u], u))

    def domains(self, unit: int) -> list[str]:
        """The domains the unit's groups are in, its home first (`home`: the most decode GPUs, then the
        most GPUs, then by name)."""
        count = Counter(m.domain for m in self.members.get(unit, []) if m.domain)
        decode, gpus = self._gpus(unit, ("decode",)), self._gpus(unit)
        return sorted(count, key=lambda d: (-decode[d], -gpus[d], d))

    def companions(self, role: RoleName, unit: int) -> tuple[GroupShape, ...]:
        """The groups still to come beside a unit's first decode group: its other decode groups and its
        prefill groups (so the first goes where the whole unit fits); none once the unit has a group."""
        if role != "decode" or self.members.get(unit):
            return ()
        return (self.shapes["decode"],) * (self.rule.decode - 1) + (
            self.shapes["prefill"],
        ) * self.rule.prefill


def units_of(
    spec: ModelDeploymentSpec,
    groups: Mapping[RoleName, Sequence[GroupView]],
    plans: Iterable[RolePlan],
    decode_groups: int,
    shapes: Mapping[RoleName, GroupShape],
    down: Iterable[int] = (),
    channel: Mapping[RoleName, bool] | None = None,
) -> Units | None:
    """The units of the groups that stay (not deleted by `plans`) and of the groups `plans` create;
    `down`: the units whose ComputeDomain is NotReady; `channel`: whether each role's pods hold the
    unit's IMEX channel (builders.uses_compute_domain)."""
    r = rule(spec)
    if r is None:
        return None
    channel = channel or {}
    out = Units(
        r, decode_groups, shapes, down=frozenset(down), network=spec.topology.kv_network, channel=channel
    )
    out.rdma_why = rdma_reason(spec, shapes, channel)
    out.rdma = bool(out.rdma_why)
    plans = list(plans)
    gone = {d.name for p in plans for d in p.delete}
    for role in UNIT_ROLES:
        for g in groups.get(role, []):
            if g.name not in gone:
                nodes = tuple(n for p in g.pods if (n := p.node or p.pinned)) or g.nodes
                member = Member(g.name, role, g.domain, g.slot, nodes, g.unit is not None, g.rdma)
                out.add(group_unit(r, g, decode_groups), member)
    for p in plans:
        for cr in p.create:
            if cr.reason != "Complete" and cr.unit is not None:
                out.add(cr.unit, Member("", p.role, cr.domain, cr.slot, cr.nodes, rdma=cr.rdma))
    return out


def needs_rdma(
    spec: ModelDeploymentSpec, shapes: Mapping[RoleName, GroupShape], channel: Mapping[RoleName, bool]
) -> bool:
    """Whether every group of a unit holds an RDMA device and IPC_LOCK (spec.topology.kvNetwork rdma):
    when a whole unit is larger than an NVLink domain (spec.topology.gpusPerDomain), so every unit spans
    domains, or a role of it holds no IMEX channel (`channel`; its KV between trays then crosses the
    network even inside one domain). A unit that fits in one domain but is split for a while (no room
    beside a replacement, a rollout under pressure) crosses over TCP until it gathers again
    (`Units.rejoin_room`), and the Fabric condition says so: asking every unit for RDMA for that would
    leave pods Pending where a cluster has no RDMA devices."""
    return bool(rdma_reason(spec, shapes, channel))


def rdma_reason(
    spec: ModelDeploymentSpec, shapes: Mapping[RoleName, GroupShape], channel: Mapping[RoleName, bool]
) -> str:
    """Why a unit's groups hold RDMA devices (`needs_rdma`), in words for the Placed condition; "" when
    they hold none."""
    r = rule(spec)
    if r is None or spec.topology.kv_network != "rdma":
        return ""
    per_role: dict[RoleName, int] = {"decode": r.decode, "prefill": r.prefill}
    gpus = sum(n * shapes[role].gpus for role, n in per_role.items() if role in shapes)
    if gpus > spec.topology.gpus_per_domain:
        return (
            f"its unit's {gpus} GPUs span NVLink domains of {spec.topology.gpus_per_domain} "
            "(spec.topology.gpusPerDomain)"
        )
    bare = [role for role in UNIT_ROLES if not channel.get(role, True)]
    if bare:
        return (
            f"its unit's {'/'.join(bare)} pods hold no IMEX channel "
            "(spec.topology.computeDomain), so KV between trays crosses the network"
        )
    return ""


def fits_all(domain: Domain, shapes: Sequence[GroupShape]) -> bool:
    """Whether the groups fit in the domain together (taken one after another, best fit)."""
    try:
        for shape in shapes:
            domain = reserve(domain, shape)
    except ValueError:
        return False
    return True


def path(members: Sequence[Member], channel: Mapping[RoleName, bool], rdma: bool) -> Path:
    """A unit's KV path: NVLink when its groups are all on one node (cuda_ipc, no fabric needed) or all
    in one domain with every pod holding the unit's IMEX channel (`channel`: per role), else RDMA when
    the workers hold RDMA devices (`rdma`: every worker of the deployment, by its spec; else every group
    of the unit, rendered so because it spans domains), else TCP. A unit with prefill and no decode group
    hands its KV over to other units': not NVLink."""
    rdma = rdma or (bool(members) and all(m.rdma for m in members))
    if not any(m.role == "decode" for m in members):
        return "rdma" if rdma else "tcp"  # (its prefill hands KV over to another unit's decode)
    nodes = {n for m in members for n in m.nodes}
    if len(nodes) == 1:
        return "nvlink"
    whole = len({m.domain for m in members}) == 1
    if whole and all(channel.get(m.role, False) and m.labelled for m in members):
        return "nvlink"
    return "rdma" if rdma else "tcp"
