"""The NVLinkDomain inventory: one cluster-scoped, status-only object per NVLink domain with its total and
free GPUs and the groups on it, so capacity is visible from kubectl. Refreshed periodically."""

from __future__ import annotations

import os
import re
import time

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube import Kube
from tokenfab.api.models import API_VERSION, DOMAIN_KIND, DomainGroup, NVLinkDomainStatus
from tokenfab.planning import contract as c
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import Domain, build_domains
from tokenfab.reconcile import gpu_uses, node_views

DOMAIN_LABEL = os.environ.get("TOKENFAB_DOMAIN_LABEL", "nvidia.com/gpu.clique")
GPU_RESOURCE = os.environ.get("TOKENFAB_GPU_RESOURCE", "nvidia.com/gpu")


def object_name(domain: str) -> str:
    """A DNS-1123 name for a domain label value."""
    name = re.sub(r"[^a-z0-9.-]+", "-", domain.lower()).strip("-.")
    return name[:253] or "unnamed"


def domain_status(
    d: Domain, groups: list[DomainGroup], now: float, label: str, alloc_per_node: dict[str, int]
) -> NVLinkDomainStatus:
    return NVLinkDomainStatus(
        domain=d.name,
        label=label,
        nodes=d.nodes,
        ready_nodes=d.ready_nodes,
        gpus=d.total_gpus,
        free_gpus=d.free_gpus,
        free_nodes=sum(1 for n, f in d.free.items() if f and f == alloc_per_node.get(n)),
        group_count=len(groups),
        groups=sorted(groups, key=lambda g: (g.namespace, g.group)),
        updated=rfc3339(now),
    )


def sync_domains(kube: Kube, label: str = DOMAIN_LABEL, gpu_resource: str = GPU_RESOURCE) -> int:
    """Write every domain's NVLinkDomain status; delete the objects of domains that are gone."""
    nodes, _ = node_views(kube.nodes(), label, gpu_resource)
    pods = kube.gpu_pods()
    domains = build_domains(nodes, gpu_uses(pods, gpu_resource))
    alloc = {n.name: n.allocatable_gpus for n in nodes}
    groups: dict[str, dict[tuple[str, str], int]] = {}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        if (
            labels.get(c.MANAGED_BY) == c.MANAGED_BY_VALUE
            and c.LABEL_GROUP in labels
            and c.LABEL_DOMAIN in labels
        ):
            key = (p["metadata"]["namespace"], labels[c.LABEL_GROUP])
            per = groups.setdefault(labels[c.LABEL_DOMAIN], {})
            per[key] = int((p["metadata"].get("annotations") or {}).get(c.ANN_GROUP_GPUS, 0))
    now = time.time()
    wanted = {}
    for name, d in domains.items():
        members = [
            DomainGroup(namespace=ns, group=g, gpus=gpus) for (ns, g), gpus in groups.get(name, {}).items()
        ]
        status = domain_status(d, members, now, label, alloc)
        telemetry.DOMAIN_GPUS.labels(name).set(d.total_gpus)
        telemetry.DOMAIN_FREE_GPUS.labels(name).set(d.free_gpus)
        wanted[object_name(name)] = status
        kube.apply_cluster_status(
            API_VERSION,
            DOMAIN_KIND,
            object_name(name),
            status.model_dump(by_alias=True, mode="json"),
            {c.MANAGED_BY: c.MANAGED_BY_VALUE},
        )
    for obj in kube.list_objects(API_VERSION, DOMAIN_KIND, selector=f"{c.MANAGED_BY}={c.MANAGED_BY_VALUE}"):
        if obj["metadata"]["name"] not in wanted:
            kube.delete(API_VERSION, DOMAIN_KIND, obj["metadata"]["name"])
    return len(wanted)
