"""The NVLinkDomain resource: a cluster-scoped, status-only view of one NVLink domain's capacity and of the
groups placed in it, kept current by the operator."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenfab.api.models.base import StatusModel

DOMAIN_KIND = "NVLinkDomain"
DOMAIN_PLURAL = "nvlinkdomains"
DOMAIN_SINGULAR = "nvlinkdomain"
DOMAIN_SHORT_NAMES = ("nvld",)


class DomainGroup(StatusModel):
    """A worker group placed in the domain."""

    namespace: str = Field(description="Namespace of the group's ModelDeployment.")
    group: str = Field(description="Group name.")
    gpus: int = Field(description="GPUs the group uses.")


class CachedWeights(StatusModel):
    """Model weights held by the per-node model caches of the domain's nodes."""

    weights: str = Field(description="Source and revision (source@revision).")
    nodes: int = Field(description="Nodes whose cache holds them (a worker of them served from it).")
    deployments: list[str] = Field(default_factory=list, description="namespace/name of the deployments.")


class NVLinkDomainStatus(StatusModel):
    """Capacity of one NVLink domain (one NVL72 rack), kept current by the operator."""

    domain: str = Field(description="Value of the domain label on the domain's nodes.")
    label: str = Field(description="The node label that names domains (e.g. nvidia.com/gpu.clique).")
    nodes: int = Field(description="Nodes in the domain.")
    ready_nodes: int = Field(description="Ready nodes in the domain.")
    gpus: int = Field(description="Allocatable GPUs of all nodes.")
    free_gpus: int = Field(description="GPUs free on ready, schedulable nodes.")
    free_nodes: int = Field(description="Ready, schedulable nodes with every GPU free.")
    group_count: int = Field(description="tokenfab worker groups placed in the domain.")
    groups: list[DomainGroup] = Field(default_factory=list, description="The groups placed in the domain.")
    health: Literal["Healthy", "Degraded"] = Field(
        default="Healthy",
        description="Degraded: a node is quarantined by a GPU health system or has a tainted device, so "
        "tokenfab places no new group here until it heals (groups already here stay unless their own node "
        "is faulted).",
    )
    reason: str = Field(default="", description="Why the domain is degraded: the node and the signal.")
    cached: int = Field(
        default=0, description="Distinct model weights held by the model caches of the domain's nodes."
    )
    models: list[CachedWeights] = Field(
        default_factory=list,
        description="Which weights the domain's node-local model caches hold (model.cache.storageClassName): "
        "a new group of them starts warm here.",
    )
    updated: str = Field(description="When the operator last refreshed this status (RFC 3339).")
