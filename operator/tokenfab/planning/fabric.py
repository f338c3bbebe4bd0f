"""What the fabric gives a deployment, pure: its prefill-decode units' KV paths (status.units) and the
Fabric condition.

A group that spans trays moves its tensors over multi-node NVLink (NCCL's MNNVL) only when its pods hold
an IMEX channel, which NVIDIA's DRA driver hands out through a ComputeDomain claim
(topology.computeDomain). Without one NCCL falls back to the network between trays, and tokenfab does not
ask it for MNNVL (`builders.nccl_env`). A prefill-decode unit's KV caches move over NVLink only inside one
NVLink domain with every pod holding the unit's channel (planning.units.path); else over the network.
Either way the deployment runs, slower, and this condition says so where a user looks instead of leaving
it to be found in a profile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from tokenfab.api.models import Condition, ModelDeploymentSpec, RoleName, UnitStatus
from tokenfab.planning import contract
from tokenfab.planning.builders.placement import uses_compute_domain
from tokenfab.planning.builders.roles import group_shape
from tokenfab.planning.units import PATHS, UNIT_ROLES, Units, needs_rdma, path

CONDITION = "Fabric"
# RDMA device resources as their device plugins name them (a spec may list its own in runtime.resources;
# else the operator's, Settings.rdma_resource, is rendered on the pods of a unit that spans domains):
# NVIDIA's Network Operator (rdma/*: its shared
# device plugin, e.g. rdma/ib, rdma/rdma_shared_device_a), SR-IOV RDMA pools named so, AWS's EFA plugin.
RDMA_RESOURCE_PREFIXES = ("rdma/",)
RDMA_RESOURCES = ("vpc.amazonaws.com/efa",)
MEMORY_LOCK = contract.CAP_IPC_LOCK  # (UCX pins the memory it moves over RDMA)


def rdma_devices(spec: ModelDeploymentSpec) -> list[str]:
    """The RDMA device resources the workers ask for (runtime.resources)."""
    names = {*spec.runtime.resources.requests, *spec.runtime.resources.limits}
    return sorted(
        n
        for n in names
        if n.startswith(RDMA_RESOURCE_PREFIXES) or n in RDMA_RESOURCES or "rdma" in n.rsplit("/", 1)[-1]
    )


def renders_rdma(spec: ModelDeploymentSpec) -> bool:
    """Whether tokenfab gives every prefill-decode unit's pods an RDMA device and IPC_LOCK: its units
    span NVLink domains by size, or hold no IMEX channel (planning.units.needs_rdma)."""
    shapes = {r: group_shape(spec, r) for r in UNIT_ROLES if spec.role(r) is not None}
    return needs_rdma(spec, shapes, {r: uses_compute_domain(spec, r) for r in shapes})


def holds_rdma(spec: ModelDeploymentSpec) -> bool:
    """Whether the workers can move KV over RDMA: they hold RDMA devices and may lock the memory UCX
    registers (runtime.addCapabilities IPC_LOCK). Either alone leaves UCX on TCP."""
    return bool(rdma_devices(spec)) and MEMORY_LOCK in spec.runtime.add_capabilities


def unit_statuses(
    spec: ModelDeploymentSpec, units: Units | None, name: Callable[[RoleName, int], str]
) -> list[UnitStatus]:
    """status.units: each unit's groups (decode first), domains and KV path; `name`: a group's name from
    its role and slot."""
    if units is None:
        return []
    channel = {r: uses_compute_domain(spec, r) for r in UNIT_ROLES if spec.role(r) is not None}
    out = []
    for unit, members in sorted(units.members.items()):
        ordered = sorted(members, key=lambda m: (m.role != "decode", m.slot))
        out.append(
            UnitStatus(
                unit=unit,
                groups=[m.group or name(m.role, m.slot) for m in ordered],
                domains=sorted({m.domain for m in members if m.domain}),
                path=path(members, channel, rdma=holds_rdma(spec)),
            )
        )
    return out


def kv_path_summary(units: Sequence[UnitStatus]) -> str | None:
    """The units' paths at a glance ('2 nvlink', '1 nvlink, 1 tcp'); None without units."""
    count = Counter(u.path for u in units)
    return ", ".join(f"{count[p]} {p}" for p in PATHS if count[p]) or None


def without_rdma(units: Units | None) -> dict[int, list[str]]:
    """The groups, by unit, that hold no RDMA device where the units' groups are given one (made before,
    e.g. under kvNetwork tcp): the unit's KV stays on TCP until they are replaced."""
    if units is None or not units.rdma:
        return {}
    out = {}
    for unit, members in units.members.items():
        bare = sorted(m.group for m in members if not m.rdma and m.group)
        if bare:
            out[unit] = bare
    return out


def condition(
    spec: ModelDeploymentSpec, units: Sequence[UnitStatus] = (), bare: Mapping[int, list[str]] | None = None
) -> Condition | None:
    """Fabric: True when every multi-node group claims an IMEX channel and every unit's KV moves over
    NVLink; False when a group spans trays without a channel (NoIMEXChannel) or a unit's KV crosses
    the network (KVOverNetwork). None when there is nothing to say (no multi-node group, no unit).
    `bare`: the groups of a unit that hold no RDMA device where the unit's others do (`without_rdma`)."""
    spanning = [(role, group_shape(spec, role).nodes) for role, _ in spec.roles()]
    spanning = [(role, nodes) for role, nodes in spanning if nodes > 1]
    if not spanning and not units:
        return None
    without = [(role, nodes) for role, nodes in spanning if not uses_compute_domain(spec, role)]
    if without:
        roles = ", ".join(f"{role} ({nodes} nodes)" for role, nodes in without)
        return Condition(
            type=CONDITION,
            status="False",
            reason="NoIMEXChannel",
            message=f"the {roles} groups span trays without an IMEX channel (spec.topology.computeDomain "
            "is false): NCCL runs between their trays over the network, not multi-node NVLink, and so do "
            "their KV transfers. Set spec.topology.computeDomain to true, with NVIDIA's DRA driver "
            "installed, for NVLink.",
        )
    slow = [u for u in units if u.path != "nvlink"]
    if slow:
        said = "; ".join(f"unit {u.unit} ({', '.join(u.domains) or 'not placed'}): {u.path}" for u in slow)
        tcp = [u for u in slow if u.path == "tcp"]
        return Condition(
            type=CONDITION,
            status="False",
            reason="KVOverNetwork",
            message=f"{len(slow)} of {len(units)} prefill-decode units move their KV caches over the "
            f"network, not NVLink: {said}. A unit is kept in one NVLink domain where it fits, with one "
            "ComputeDomain over its pods that fill their nodes; one that spans domains, or whose groups "
            "share nodes with others, crosses the network"
            + (f": {_over_tcp(spec, tcp, bare or {})}" if tcp else " over RDMA."),
        )
    parts = []
    if spanning:
        roles = ", ".join(f"{role} ({nodes} nodes)" for role, nodes in spanning)
        parts.append(f"the {roles} groups claim an IMEX channel: NCCL uses multi-node NVLink")
    if units:
        parts.append(f"every prefill-decode unit ({len(units)}) moves its KV caches over NVLink")
    return Condition(type=CONDITION, status="True", reason="NVLink", message="; ".join(parts))


def _over_tcp(spec: ModelDeploymentSpec, tcp: Sequence[UnitStatus], bare: Mapping[int, list[str]]) -> str:
    """Why a network path is TCP, and the fix."""
    if spec.topology.kv_network == "tcp":
        return (
            "spec.topology.kvNetwork is tcp, so their pods hold no RDMA device and UCX uses TCP, as asked "
            "(set it to rdma, the default, for RDMA between NVLink domains)"
        )
    held = [f"{', '.join(bare[u.unit])} (unit {u.unit})" for u in tcp if u.unit in bare]
    if held:
        return (
            f"the groups {'; '.join(held)} were made without an RDMA device, so UCX uses TCP until they "
            "are replaced (new groups hold one)"
        )
    devices = rdma_devices(spec)
    if devices and MEMORY_LOCK not in spec.runtime.add_capabilities:
        return (
            f"the workers ask for {', '.join(devices)} but not for {MEMORY_LOCK} "
            f"(runtime.addCapabilities), so UCX cannot register memory and uses TCP"
        )
    if not renders_rdma(spec) and not holds_rdma(spec):
        return (
            "a whole unit fits in one NVLink domain, so its groups hold no RDMA device; split for lack of "
            "room (a replacement with none beside its unit, a rollout short of room), it moves its KV over "
            "TCP until it gathers again: a group away from the domain holding most of its unit's GPUs moves "
            "there once that domain has room"
        )
    return "their groups hold no RDMA device, so UCX uses TCP"
