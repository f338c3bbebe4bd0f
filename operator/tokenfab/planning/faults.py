"""Hardware faults read from a Node, pure: its taints, conditions, annotations and cordon in; faults out.

The signals, and where they come from:
- a GPU health system's quarantine: NVIDIA's NVSentinel (fault-quarantine module) cordons a node, marks it
  with the annotation `quarantineHealthEvent`, optionally taints it (keys chosen in its rulesets; its docs'
  examples: nvidia.com/gpu-xid-error, nvidia.com/gpu-nvlink-error, nvidia.com/syslog-xid-error,
  nvidia.com/gpu-error, effect NoSchedule) and sets node conditions named after its checks (GpuMemWatch,
  GpuNvlinkWatch, SysLogsXIDError, NVSwitchFatalError...; status True = fault). Every key is configurable
  (`FaultKeys.from_env`): TOKENFAB_FAULT_TAINTS, TOKENFAB_FAULT_CONDITIONS, TOKENFAB_FAULT_ANNOTATIONS, each
  a comma-separated list where a trailing `*` matches a prefix;
- a cordon (`kubectl cordon`/`drain`, a maintenance): spec.unschedulable;
- a DRA device taint (DeviceTaintRule, or a taint a driver publishes on a device of its ResourceSlice) on
  a node's GPU or IMEX channel: added by the cluster view, which knows the devices' nodes;
- a node NotReady, unreachable or gone: not here (tokenfab.planning.lifecycle reads the Ready condition
  and the node's absence, with the deployment's toleration).

A fault is *announced* (the node still runs its pods: cordon, a NoSchedule quarantine taint, a fault
condition, a NoSchedule device taint; its groups are replaced first, then drained) or *sudden* (NoExecute:
Kubernetes evicts the pods now; the group is lost and re-placed at once). A quarantine or a device taint
also *degrades* the node's NVLink domain: no new group is placed there until it heals. A plain cordon does
not (one node out for maintenance says nothing about its rack's fabric). A node that faults again soon
after it healed is *flapping*: new groups avoid it for a growing while (`flapping`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NVSENTINEL_TAINTS = (
    "nvidia.com/gpu-xid-error",
    "nvidia.com/gpu-nvlink-error",
    "nvidia.com/syslog-xid-error",
    "nvidia.com/gpu-error",
)
NVSENTINEL_CONDITIONS = (
    "GpuMemWatch",
    "GpuNvlinkWatch",
    "GpuSmWatch",
    "GpuPcieWatch",
    "GpuInforomWatch",
    "GpuDriverWatch",
    "GpuMcuWatch",
    "GpuPmuWatch",
    "SysLogsXIDError",
    "SysLogsSXIDError",
    "SysLogsGPUFallenOff",
    "NVSwitchFatalError",
    "NVSwitchDown",
)
NVSENTINEL_ANNOTATIONS = ("quarantineHealthEvent",)

Kind = str  # Cordoned | Quarantined | DeviceTainted | Evicting


@dataclass(frozen=True)
class NodeFault:
    """One fault on a node."""

    kind: Kind
    message: str  # what says so (the taint, the condition and its message...)
    sudden: bool = False  # NoExecute: its pods are being evicted now
    degrades: bool = True  # its NVLink domain takes no new group until it heals
    moves: bool = True  # its groups move (False: it only takes no new group)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def _split(value: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return default
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class FaultKeys:
    """The taint keys, node condition types and annotations that mean a GPU health system quarantined a
    node (a trailing `*` matches a prefix)."""

    taints: tuple[str, ...] = NVSENTINEL_TAINTS
    conditions: tuple[str, ...] = NVSENTINEL_CONDITIONS
    annotations: tuple[str, ...] = NVSENTINEL_ANNOTATIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FaultKeys:
        """TOKENFAB_FAULT_TAINTS / _CONDITIONS / _ANNOTATIONS (comma-separated; empty: none) or the
        NVSentinel defaults."""
        return cls(
            _split(env.get("TOKENFAB_FAULT_TAINTS"), NVSENTINEL_TAINTS),
            _split(env.get("TOKENFAB_FAULT_CONDITIONS"), NVSENTINEL_CONDITIONS),
            _split(env.get("TOKENFAB_FAULT_ANNOTATIONS"), NVSENTINEL_ANNOTATIONS),
        )


def node_faults(
    taints: Iterable[tuple[str, str, str]],
    conditions: Mapping[str, str],
    annotations: Iterable[str],
    unschedulable: bool,
    keys: FaultKeys,
) -> tuple[NodeFault, ...]:
    """A node's faults. `taints` are (key, value, effect); `conditions` the types whose status is True
    (Ready aside) with their messages; `annotations` the annotation keys it carries."""
    out: list[NodeFault] = []
    for key, value, effect in taints:
        if not _matches(key, keys.taints):
            continue
        taint = f"taint {key}={value}:{effect}" if value else f"taint {key}:{effect}"
        if effect == "NoExecute":
            out.append(NodeFault("Evicting", f"{taint} (its pods are evicted)", sudden=True))
        else:
            out.append(NodeFault("Quarantined", taint))
    for ctype, message in sorted(conditions.items()):
        if _matches(ctype, keys.conditions):
            out.append(NodeFault("Quarantined", f"condition {ctype}" + (f": {message}" if message else "")))
    marked = [a for a in annotations if _matches(a, keys.annotations)]
    if unschedulable and marked and not out:
        out.append(NodeFault("Quarantined", f"cordoned with annotation {marked[0]}"))
    if unschedulable and not out:
        out.append(NodeFault("Cordoned", "cordoned", degrades=False))
    return tuple(out)


def device_fault(device: str, key: str, value: str, effect: str) -> NodeFault:
    """A DRA device taint on one of the node's devices (`device` as driver/pool/name)."""
    taint = f"device {device} tainted {key}" + (f"={value}" if value else "") + f":{effect}"
    if effect == "NoExecute":
        return NodeFault("DeviceTainted", f"{taint} (its pods are evicted)", sudden=True)
    return NodeFault("DeviceTainted", taint)


# A node that faults again soon after it healed is avoided for a while: FLAP_WINDOW seconds of history,
# the second fault in it keeps new groups off the node for FLAP_BASE seconds once it heals, each further
# one twice as long, at most FLAP_CAP.
FLAP_WINDOW = 600.0
FLAP_BASE = 60.0
FLAP_CAP = 1800.0


def flapping(onsets: Iterable[float], now: float) -> NodeFault | None:
    """The fault of a healthy node that faulted repeatedly (`onsets`: when each fault began), while its
    backoff runs: new groups avoid it; the groups on it stay."""
    recent = sorted(t for t in onsets if now - t <= FLAP_WINDOW)
    if len(recent) < 2:
        return None
    until = recent[-1] + min(FLAP_CAP, FLAP_BASE * 2 ** (len(recent) - 2))
    if now >= until:
        return None
    return NodeFault(
        "Flapping",
        f"faulted {len(recent)} times in {FLAP_WINDOW / 60:.0f} min; no new group before {until - now:.0f} s",
        degrades=False,
        moves=False,
    )


def summary(faults: Iterable[NodeFault]) -> str:
    return "; ".join(f"{f.kind}: {f.message}" for f in faults)
