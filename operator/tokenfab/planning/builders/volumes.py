"""A worker pod's volumes: the engine ConfigMap, shared memory, scratch space, the model (a mounted
pvc:// claim, or the model cache hf:// weights are downloaded into, per node or per pod) and the SSH keys
of a multi-node group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract as c
from tokenfab.planning.builders.common import Manifest, Owner, child_meta, engine_configmap_name
from tokenfab.planning.engine import content_hash

Volumes = list[dict[str, Any]]


def model_volume(spec: ModelDeploymentSpec) -> tuple[Volumes, Volumes]:
    scheme, rest = spec.model.source.split("://", 1)
    if scheme == "pvc":
        claim = rest.split("/", 1)[0]
        return (
            [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
            [{"name": "model", "mountPath": c.MODEL_MOUNT, "readOnly": True}],
        )
    return [], []


def fetches_weights(spec: ModelDeploymentSpec) -> bool:
    """hf:// and s3:// weights are downloaded by the launcher into the model cache; pvc:// weights are
    mounted, and copied from there into a per-node model cache when the spec names a storage class."""
    if spec.model.source.startswith("pvc://"):
        return spec.model.cache.storage_class_name is not None
    return spec.model.source.startswith(("hf://", "s3://"))


def model_cache_claim_name(owner: Owner, spec: ModelDeploymentSpec, node: str) -> str:
    """The model cache of a deployment on one node (node names can be 253 characters: a hash of it), for
    one storage class and size: a claim's spec cannot change, so a new class or size is a new claim."""
    cache = spec.model.cache
    return f"{owner.name}-model-{content_hash([node, cache.storage_class_name, str(cache.size)], 10)}"


def model_cache_claim(owner: Owner, spec: ModelDeploymentSpec, node: str, weights: str = "") -> Manifest:
    """The node-local PersistentVolumeClaim that keeps a deployment's hf:// weights on `node` across pods,
    restarts and rollouts (spec.model.cache.storageClassName: a WaitForFirstConsumer class, so the volume
    is made on the node of the first pod that mounts it, and every pod there shares it)."""
    cache = spec.model.cache
    meta = child_meta(owner, model_cache_claim_name(owner, spec, node), "worker")
    meta["annotations"] = {c.ANN_NODE: node, **({c.ANN_WEIGHTS: weights} if weights else {})}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cache.storage_class_name,
            "resources": {"requests": {"storage": str(cache.size)}},
        },
    }


def uses_model_cache_claims(spec: ModelDeploymentSpec) -> bool:
    return fetches_weights(spec) and spec.model.cache.storage_class_name is not None


def model_cache_claims(
    owner: Owner, spec: ModelDeploymentSpec, nodes: Iterable[str], weights: Mapping[str, str] | None = None
) -> list[Manifest]:
    """The per-node model cache claims of the nodes the deployment's pods run on (none without a storage
    class), each marked with the weights served from it (`weights`: node -> source@revision, if known)."""
    if not uses_model_cache_claims(spec):
        return []
    marked = weights or {}
    return [model_cache_claim(owner, spec, node, marked.get(node, "")) for node in sorted(set(nodes))]


def pinned_nodes(pods: Iterable[Manifest]) -> set[str]:
    """The nodes placement pinned these (new) pods to."""
    return {n for p in pods if (n := (p["metadata"].get("annotations") or {}).get(c.ANN_NODE))}


def _model_cache_volume(owner: Owner, spec: ModelDeploymentSpec, node: str | None) -> dict[str, Any]:
    """Per node (a claim) when the spec names a node-local class and the pod's node is known, else per pod
    (an emptyDir that declares its size)."""
    cache = spec.model.cache
    if cache.storage_class_name is not None and node is not None:
        return {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": model_cache_claim_name(owner, spec, node)},
        }
    return {"name": "model-cache", "emptyDir": {"sizeLimit": str(cache.size)}}


def group_volumes(
    owner: Owner, spec: ModelDeploymentSpec, role: RoleName, revision: str, multi_node: bool
) -> tuple[Volumes, Volumes]:
    """The volumes and the worker container's mounts every pod of a group shares: the engine ConfigMap of
    its revision, shared memory, a pvc:// model, scratch space, and the SSH keys of a multi-node group."""
    model_volumes, model_mounts = model_volume(spec)
    volumes: Volumes = [
        {"name": "engine", "configMap": {"name": engine_configmap_name(owner, role, revision)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        *model_volumes,
    ]
    mounts: Volumes = [
        {"name": "engine", "mountPath": c.ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *model_mounts,
    ]
    volumes += [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts += [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": c.CACHE_DIR}]
    if multi_node:
        # mpirun on rank 0 reaches the other ranks' SSH daemons with this key pair.
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": c.MPI_SSH_SECRET}})
        mounts.append({"name": "mpi-ssh", "mountPath": c.MPI_SSH_DIR, "readOnly": True})
    return volumes, mounts


def pod_volumes(owner: Owner, spec: ModelDeploymentSpec, volumes: Volumes, node: str | None) -> Volumes:
    """One pod's volumes: its group's, and the model cache when the pod downloads hf:// weights."""
    return [*volumes, _model_cache_volume(owner, spec, node)] if fetches_weights(spec) else volumes


def pod_mounts(spec: ModelDeploymentSpec, mounts: Volumes) -> Volumes:
    """One worker container's mounts: its group's, and the model cache when it downloads hf:// weights."""
    if fetches_weights(spec):
        return [*mounts, {"name": "model-cache", "mountPath": c.MODEL_CACHE_DIR}]
    return mounts
