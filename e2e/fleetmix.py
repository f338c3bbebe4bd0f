"""Fleets of ModelDeployments for the burst tests and the scale benchmark, and the offline placements
they are compared with: best fit, first fit and the exact optimum (pure, seeded: the same arguments give
the same fleet)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from e2e import packing
from e2e.packing import Packing
from tokenfab.fleet.view import ClusterView
from tokenfab.planning.capacity import Constraints, snapshot
from tokenfab.planning.topology import GroupShape, first_fit

GPUS_PER_NODE = 4

# (weight, kind, prefill GPUs or None, decode/worker GPUs, groups) for the mixes.
SMALL_MIX: tuple[tuple[int, str, int | None, int, int], ...] = (
    (6, "aggregated", None, 1, 2),
    (5, "aggregated", None, 2, 2),
    (5, "aggregated", None, 4, 2),
    (4, "aggregated", None, 8, 1),
    (3, "aggregated", None, 16, 1),
    (2, "aggregated", None, 32, 1),
    (3, "disaggregated", 4, 8, 2),
    (2, "disaggregated", 8, 16, 1),
)

# The scale benchmark's mix: about 12 GPUs and 3.6 worker pods per deployment (200 deployments: ~2,500
# GPUs and ~750 worker pods, half an AI factory of 64 NVL72 racks).
SCALE_MIX: tuple[tuple[int, str, int | None, int, int], ...] = (
    (12, "aggregated", None, 1, 3),
    (10, "aggregated", None, 2, 3),
    (10, "aggregated", None, 4, 2),
    (8, "aggregated", None, 8, 1),
    (8, "aggregated", None, 16, 1),
    (6, "aggregated", None, 32, 1),
    (7, "disaggregated", 4, 8, 2),
    (5, "disaggregated", 8, 16, 1),
)


@dataclass(frozen=True)
class Wanted:
    """One group a fleet asks for, in the order the operator meets it (deployment by deployment,
    decode or worker first, then prefill)."""

    deployment: str
    role: str
    gpus: int


def model_deployment(
    name: str, namespace: str, kind: str, prefill: int | None, main: int, groups: int
) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": f"model-{name}", "source": f"hf://tokenfab-test/{name}"}}
    if kind == "aggregated":
        spec["serving"] = {"mode": "aggregated"}
        spec["worker"] = {"parallelism": {"tensor": main}, "replicas": groups}
    else:
        assert prefill is not None
        spec["serving"] = {"mode": "disaggregated", "prefillDecodeRatio": "1:2"}
        spec["prefill"] = {"parallelism": {"tensor": prefill}}
        spec["decode"] = {"parallelism": {"tensor": main}, "replicas": groups}
    return {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"tokenfab.dev/fleet": "burst"}},
        "spec": spec,
    }


def fleet(
    count: int, namespace: str, seed: int = 7, prefix: str = "m", mix: Sequence[Any] = SMALL_MIX
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    weights = [m[0] for m in mix]
    out = []
    for i in range(count):
        _, kind, prefill, main, groups = rng.choices(mix, weights)[0]
        out.append(model_deployment(f"{prefix}{i:03d}", namespace, kind, prefill, main, groups))
    return out


def wanted_groups(docs: Iterable[dict[str, Any]]) -> list[Wanted]:
    out = []
    for d in docs:
        spec, name = d["spec"], d["metadata"]["name"]
        for role in ("decode", "worker"):
            if role in spec:
                p = spec[role]["parallelism"]
                n = spec[role].get("replicas", 1)
                out += [Wanted(name, role, p["tensor"] * p.get("pipeline", 1))] * n
        if "prefill" in spec:
            p = spec["prefill"]["parallelism"]
            decode = spec["decode"].get("replicas", 1)
            num, den = (int(x) for x in spec["serving"]["prefillDecodeRatio"].split(":"))
            out += [Wanted(name, "prefill", p["tensor"] * p.get("pipeline", 1))] * -(-decode * num // den)
    return out


def asked_gpus(docs: Iterable[dict[str, Any]]) -> int:
    return sum(w.gpus for w in wanted_groups(docs))


def worker_pods(docs: Iterable[dict[str, Any]]) -> int:
    return sum(-(-w.gpus // GPUS_PER_NODE) for w in wanted_groups(docs))


def view_of(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ClusterView:
    """A cluster view from `kubectl get nodes,pods -A -o json` items."""
    view = ClusterView()
    view.replace("Node", nodes)
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    ours = [
        p
        for p in live
        if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "tokenfab"
    ]
    view.replace("Pod", ours)
    view.replace("ForeignPod", [p for p in live if (p.get("spec") or {}).get("nodeName")])
    return view


def references(view: ClusterView, groups: Sequence[Wanted]) -> dict[str, Packing]:
    """The GPUs the same groups take on the view's free capacity, each whole in one domain: in this order
    by tokenfab's best fit (the operator's `pack` policy) and by first fit; by best fit taking the
    smallest groups first (`best_fit_smallest_first`, the order that fragments the domains most: the
    live fleet packs in the order its passes reach the ledger, not the apply order); and by an exact
    optimum that ignores the order (e2e/packing.py: no placement holds more)."""
    domains = snapshot(view.nodes(), view.used(), {Constraints().gpu_resource: 1}, Constraints())
    shapes = [GroupShape(w.gpus, GPUS_PER_NODE) for w in groups]
    return {
        "best_fit": packing.sequential(domains, shapes, None),
        "best_fit_smallest_first": packing.sequential(domains, sorted(shapes, key=lambda s: s.gpus), None),
        "first_fit": packing.sequential(domains, shapes, first_fit),
        "optimal": packing.optimal(domains, shapes),
    }
