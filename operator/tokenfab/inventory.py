"""The NVLinkDomain inventory: one cluster-scoped, status-only object per NVLink domain with its total and
free GPUs and the groups on it, so capacity is visible from kubectl. Computed from the cluster view and
the placement ledger (no list of the cluster), and written only when a domain's figures changed."""

from __future__ import annotations

import os
import re
from typing import Any

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube import Kube
from tokenfab.api.models import API_VERSION, DOMAIN_KIND, CachedWeights, DomainGroup, NVLinkDomainStatus
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import ClusterView
from tokenfab.planning import contract
from tokenfab.planning.capacity import Constraints, Toleration
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain

DOMAIN_LABEL = os.environ.get("TOKENFAB_DOMAIN_LABEL", "nvidia.com/gpu.clique")
GPU_RESOURCE = os.environ.get("TOKENFAB_GPU_RESOURCE", "nvidia.com/gpu")


def object_name(domain: str) -> str:
    """A DNS-1123 name for a domain label value."""
    name = re.sub(r"[^a-z0-9.-]+", "-", domain.lower()).strip("-.")
    return name[:253] or "unnamed"


def domain_status(
    d: Domain,
    groups: list[DomainGroup],
    now: float,
    label: str,
    alloc_per_node: dict[str, int],
    models: list[CachedWeights] | None = None,
) -> NVLinkDomainStatus:
    return NVLinkDomainStatus(
        cached=len(models or []),
        models=models or [],
        domain=d.name,
        label=label,
        nodes=d.nodes,
        ready_nodes=d.ready_nodes,
        gpus=d.total_gpus,
        free_gpus=d.free_gpus,
        free_nodes=sum(1 for n, f in d.free.items() if f and f == alloc_per_node.get(n)),
        group_count=len(groups),
        groups=sorted(groups, key=lambda g: (g.namespace, g.group)),
        health="Degraded" if d.degraded else "Healthy",
        reason=d.degraded,
        updated=rfc3339(now),
    )


def domains(
    view: ClusterView, ledger: Ledger, label: str = DOMAIN_LABEL, gpu_resource: str = GPU_RESOURCE
) -> tuple[dict[str, Domain], dict[str, list[DomainGroup]], dict[str, int]]:
    """Free GPUs per domain on ready, uncordoned nodes (whatever their taints: tolerations differ per
    deployment), the groups placed in each, and every node's allocatable GPUs."""
    everything = Constraints(
        domain_label=label, gpu_resource=gpu_resource, tolerations=(Toleration("", "Exists"),)
    )
    with ledger.session() as session:
        found = session.domains({gpu_resource: 1}, everything)
        nodes = session.nodes()
    groups: dict[str, dict[tuple[str, str], int]] = {}
    for p in view.all_pods():
        if contract.LABEL_GROUP in p.labels and contract.LABEL_DOMAIN in p.labels and not p.terminal:
            per = groups.setdefault(p.labels[contract.LABEL_DOMAIN], {})
            per[(p.namespace, p.labels[contract.LABEL_GROUP])] = int(
                p.annotations.get(contract.ANN_GROUP_GPUS, 0)
            )
    members = {
        d: [DomainGroup(namespace=ns, group=g, gpus=gpus) for (ns, g), gpus in per.items()]
        for d, per in groups.items()
    }
    alloc = {n.name: n.allocatable.get(gpu_resource, 0) for n in nodes}
    return found, members, alloc


def cached_models(view: ClusterView, label: str = DOMAIN_LABEL) -> dict[str, list[CachedWeights]]:
    """Per domain, the weights its nodes' model cache claims hold (contract.ANN_HOLDS_PREFIX), and the
    deployments that own those claims."""
    held: dict[str, dict[str, tuple[set[str], set[str]]]] = {}
    for claim in view.all_children("PersistentVolumeClaim"):
        node = view.node(claim.node) if claim.node and claim.holds else None
        domain = node.labels.get(label, "") if node is not None else ""
        owners = {*claim.owners, *((claim.deployment,) if claim.deployment else ())}
        for weights in claim.holds if domain else ():
            nodes, deps = held.setdefault(domain, {}).setdefault(weights, (set(), set()))
            nodes.add(claim.node)
            deps.update(f"{claim.namespace}/{o}" for o in owners)
    return {
        d: [
            CachedWeights(weights=w, nodes=len(n), deployments=sorted(deps))
            for w, (n, deps) in sorted(per.items())
        ]
        for d, per in held.items()
    }


def sync_domains(kube: Kube, view: ClusterView, ledger: Ledger, written: dict[str, Any], now: float) -> int:
    """Write the NVLinkDomain status of every domain whose figures changed since the last write (`written`
    remembers them); delete the objects of domains that are gone. Returns the writes made."""
    found, members, alloc = domains(view, ledger)
    models = cached_models(view)
    writes = 0
    if "__listed__" not in written:  # first run: what the objects already say needs no write
        managed = f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}"
        for item in kube.list_objects(API_VERSION, DOMAIN_KIND, selector=managed):
            stored = {k: v for k, v in (item.get("status") or {}).items() if k != "updated"}
            written[item["metadata"]["name"]] = stored
        written["__listed__"] = True
    for name, d in found.items():
        status = domain_status(d, members.get(name, []), now, DOMAIN_LABEL, alloc, models.get(name))
        telemetry.DOMAIN_GPUS.labels(name).set(d.total_gpus)
        telemetry.DOMAIN_FREE_GPUS.labels(name).set(d.free_gpus)
        body = status.model_dump(by_alias=True, mode="json")
        same = {k: v for k, v in body.items() if k != "updated"}
        obj = object_name(name)
        if written.get(obj) == same:
            continue
        kube.apply_cluster_status(
            API_VERSION, DOMAIN_KIND, obj, body, {contract.MANAGED_BY: contract.MANAGED_BY_VALUE}
        )
        written[obj] = same
        writes += 1
    wanted = {object_name(n) for n in found}
    for obj in sorted(set(written) - {"__listed__"} - wanted):  # domains that are gone
        kube.delete(API_VERSION, DOMAIN_KIND, obj)
        written.pop(obj, None)
        writes += 1
    return writes
