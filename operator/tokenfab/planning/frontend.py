"""The frontend off a node that is being left: a quarantined or cordoned node's groups move (replaced
first, then drained), and so does any frontend pod there. Its Deployment's pod template is marked with the
pods that leave; that rolls it like `kubectl rollout restart`: a new pod (its surge) goes onto a node that
takes pods, and the old one goes once the new one is available. A drainer that evicts the node later finds
nothing of the deployment there, and the API never loses its last frontend to the drain. A frontend pod
on a node that is gone is deleted at once, for its Deployment to replace it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenfab.planning.lifecycle import NodeHealth

Event = tuple[str, str, str]  # (type, reason, message)

# The faults of a node as a whole (a device taint concerns GPUs, which the frontend does not use; a sudden
# fault evicts the pod already, and its Deployment replaces it).
NODE_FAULTS = ("Quarantined", "Cordoned")


@dataclass(frozen=True)
class FrontendPod:
    name: str
    node: str  # bound to ("" not yet)
    deleting: bool = False


@dataclass(frozen=True)
class FrontendMove:
    moved: str  # the template's mark: the pods that left, comma-separated ("" none ever)
    events: tuple[Event, ...] = ()


def move(pods: tuple[FrontendPod, ...], health: Mapping[str, NodeHealth], moved: str) -> FrontendMove:
    """The template's mark after this pass (`moved`: the Deployment's now). It names the frontend pods on
    a node being left. A pod's name is new with every pod, so a later fault rolls again, while one rollout
    (the old pod waiting for its replacement) keeps the same mark. With no pod on such a node, the mark is
    kept: taking it away would roll the frontend once more for nothing."""
    leaving = sorted(
        (p.name, p.node, fault)
        for p in pods
        if p.node and not p.deleting and (fault := _leaving(health.get(p.node)))
    )
    mark = ",".join(name for name, _, _ in leaving)
    if not leaving or mark == moved:
        return FrontendMove(moved)
    events = tuple(
        (
            "Normal",
            "FrontendMoved",
            f"frontend pod {name} leaves node {node} ({why}): its replacement starts on another node first",
        )
        for name, node, why in leaving
    )
    return FrontendMove(mark, events)


def _leaving(h: NodeHealth | None) -> str:
    """Why the node is being left, as a fault's kind and words ("": it is not)."""
    faults = [] if h is None or h.sudden is not None else [f for f in h.faults if f.kind in NODE_FAULTS]
    return f"{faults[0].kind}: {faults[0].message}" if faults else ""


def gone(
    pods: tuple[FrontendPod, ...], health: Mapping[str, NodeHealth]
) -> tuple[tuple[str, ...], list[Event]]:
    """The frontend pods bound to a node that is gone (`health` knows every node the deployment's pods are
    on; one missing there is gone), to delete at once: nothing runs them, and their Deployment replaces
    them only once they are gone, which the pod garbage collector would do only after its own wait."""
    lost = sorted((p.name, p.node) for p in pods if p.node and p.node not in health)
    said = [
        (
            "Warning",
            "FrontendLost",
            f"frontend pod {name} was on node {node}, which is gone: deleted, its Deployment starts another",
        )
        for name, node in lost
    ]
    return tuple(name for name, _ in lost), said
