"""Simulated NVL72 racks: the Node objects of N racks x 18 trays x 4 GPUs (pure, no I/O).

Labels follow NVIDIA GPU feature discovery: one `nvidia.com/gpu.clique` value (<ClusterUUID>.<CliqueID>)
per NVLink domain, plus product, count and memory. Capacity matches a Grace-Blackwell compute tray.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

TRAYS_PER_RACK = 18
GPUS_PER_TRAY = 4
CLIQUE_LABEL = "nvidia.com/gpu.clique"
RACK_LABEL = "tokenfab.dev/rack"
FACTORY_LABEL = "tokenfab.dev/factory"
GPU_RESOURCE = "nvidia.com/gpu"
RDMA_RESOURCE = "rdma/ib"
# NVIDIA Network Operator's RDMA shared device plugin (the operator's default rdmaResource): one pool of
# the tray's NICs that many pods share (its config's rdmaHcaMax)
RDMA_SHARED_RESOURCE = "rdma/rdma_shared_device_a"
RDMA_SHARED_PODS = 1000
_UUID_NAMESPACE = uuid.UUID("7c1f0a4e-2f43-4f57-9a55-6b8a2b0e7d10")


@dataclass(frozen=True)
class GpuSystem:
    """What one kind of NVL72 tray looks like to Kubernetes."""

    name: str
    product: str
    memory_mib: int
    cpu: int
    memory: str


SYSTEMS = {
    "gb200": GpuSystem("gb200", "NVIDIA-GB200", 189_471, 144, "960Gi"),
    "gb300": GpuSystem("gb300", "NVIDIA-GB300", 284_208, 144, "960Gi"),
}


def clique_id(rack: int) -> str:
    """The clique label value of a rack: a cluster UUID per NVLink domain and its clique number."""
    return f"{uuid.uuid5(_UUID_NAMESPACE, f'rack-{rack}')}.{32766 - rack % 2}"


def node_name(system: GpuSystem, rack: int, tray: int) -> str:
    return f"{system.name}-r{rack:02d}-t{tray:02d}"


def rack_nodes(system: GpuSystem, racks: int, factory: str) -> list[dict[str, Any]]:
    """Node manifests (with status capacity, which the API server accepts on create) for `racks` racks."""
    nodes = []
    capacity = {
        "cpu": str(system.cpu),
        "memory": system.memory,
        "pods": "110",
        "ephemeral-storage": "3840Gi",
        GPU_RESOURCE: str(GPUS_PER_TRAY),
        # the tray's four ConnectX NICs, as NVIDIA's Network Operator (RDMA shared device plugin) exposes them
        RDMA_RESOURCE: str(GPUS_PER_TRAY),
        RDMA_SHARED_RESOURCE: str(RDMA_SHARED_PODS),
    }
    for rack in range(racks):
        for tray in range(TRAYS_PER_RACK):
            name = node_name(system, rack, tray)
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "arm64",
                            "type": "kwok",
                            FACTORY_LABEL: factory,
                            RACK_LABEL: f"rack-{rack:02d}",
                            CLIQUE_LABEL: clique_id(rack),
                            "nvidia.com/gpu.present": "true",
                            "nvidia.com/gpu.product": system.product,
                            "nvidia.com/gpu.count": str(GPUS_PER_TRAY),
                            "nvidia.com/gpu.memory": str(system.memory_mib),
                        },
                    },
                    "spec": {},
                    "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
                }
            )
    return nodes
