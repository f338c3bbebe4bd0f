"""A worker pod's volumes: the engine ConfigMap, shared memory, scratch space, the model (a mounted
pvc:// claim, or the model cache hf:// weights are downloaded into, per node or per pod) and the SSH keys
of a multi-node group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract
from tokenfab.planning.builders.common import Manifest, Owner, engine_configmap_name, owner_reference
from tokenfab.planning.engine_config import content_hash

Volumes = list[dict[str, Any]]


def model_volume(spec: ModelDeploymentSpec) -> tuple[Volumes, Volumes]:
    scheme, rest = spec.model.source.split("://", 1)
    if scheme == "pvc":
        claim = rest.split("/", 1)[0]
        return (
            [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
            [{"name": "model", "mountPath": contract.MODEL_MOUNT, "readOnly": True}],
        )
    return [], []


def fetches_weights(spec: ModelDeploymentSpec) -> bool:
    """hf:// and s3:// weights are downloaded by the launcher into the model cache; pvc:// weights are
    mounted, and copied from there into a per-node model cache when the spec names a storage class."""
    if spec.model.source.startswith("pvc://"):
        return spec.model.cache.storage_class_name is not None
    return spec.model.source.startswith(("hf://", "s3://"))


def model_cache_claim_name(owner: Owner, spec: ModelDeploymentSpec, node: str) -> str:
    """The model cache of one source on one node, for one storage class and size (node names can be 253
    characters: a hash of them all). It does not name the deployment: every deployment of the namespace
    that loads the same source with the same class and size mounts the same claim there, so the weights
    are staged once per node. `owner` gives the namespace only (a claim is namespaced). A claim's spec
    cannot change, so a new class or size is a new claim; revisions of one source share one (the hub's
    cache keeps each revision's files once)."""
    cache = spec.model.cache
    parts = [node, cache.storage_class_name, str(cache.size), spec.model.source]
    return f"model-cache-{content_hash(parts, 12)}"


def holds_annotation(weights: str) -> str:
    """The annotation that says a model cache claim holds `weights` (source@revision), verified: a worker
    of those weights served from it, or a weights-fetch pod completed into it."""
    return f"{contract.ANN_HOLDS_PREFIX}{content_hash(weights, 16)}"


def model_cache_claim(owner: Owner, spec: ModelDeploymentSpec, node: str, weights: str = "") -> Manifest:
    """The node-local PersistentVolumeClaim that keeps a source's weights on `node` across pods, restarts,
    rollouts and deployments (spec.model.cache.storageClassName: a WaitForFirstConsumer class, so the
    volume is made on the node of the first pod that mounts it, and every pod there shares it).

    Several deployments may own one claim. Each applies it under its own field manager (see
    builders.shared.field_manager) with only its own owner reference (not the controller: a claim has no
    single one) and, when `weights` are the spec's, the annotation that the claim holds them: server-side
    apply keeps the other deployments' references and annotations, and the garbage collector deletes the
    claim once every owner is gone."""
    ref = {**owner_reference(owner), "controller": False}
    held = {holds_annotation(weights): weights} if weights and weights == weights_key(spec) else {}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": model_cache_claim_name(owner, spec, node),
            "namespace": owner.namespace,
            "labels": {
                contract.MANAGED_BY: contract.MANAGED_BY_VALUE,
                contract.COMPONENT: contract.COMPONENT_MODEL_CACHE,
            },
            "annotations": {contract.ANN_NODE: node, **held},
            "ownerReferences": [ref],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": spec.model.cache.storage_class_name,
            "resources": {"requests": {"storage": str(spec.model.cache.size)}},
        },
    }


def released_claim(owner: Owner, name: str) -> Manifest:
    """What a deployment applies to let go of a model cache claim other deployments still own: nothing,
    under its field manager, so its owner reference and annotations go and the others' stay."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": owner.namespace},
    }


def weights_key(spec: ModelDeploymentSpec) -> str:
    """What a model cache holds: the source at its revision (the hub's main branch when none is pinned)."""
    return f"{spec.model.source}@{spec.model.revision or 'main'}"


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
    return {n for p in pods if (n := (p["metadata"].get("annotations") or {}).get(contract.ANN_NODE))}


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
        {"name": "engine", "mountPath": contract.ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *model_mounts,
    ]
    volumes += [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts += [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": contract.CACHE_DIR}]
    if multi_node:
        # mpirun on rank 0 reaches the other ranks' SSH daemons with this key pair.
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": contract.MPI_SSH_SECRET}})
        mounts.append({"name": "mpi-ssh", "mountPath": contract.MPI_SSH_DIR, "readOnly": True})
    return volumes, mounts


def topology_volume(unit: int | None) -> tuple[Volumes, Volumes]:
    """A unit member's topology volume and mount: the pod's unit label as the file Dynamo reads its
    KV-transfer domain from (a downward-API file: no other object, and it cannot disagree with the label)."""
    if unit is None:
        return [], []
    field = f"metadata.labels['{contract.LABEL_UNIT}']"
    item = {"path": contract.KV_TRANSFER_DOMAIN, "fieldRef": {"fieldPath": field}}
    volume = {"name": "topology", "downwardAPI": {"items": [item]}}
    return [volume], [{"name": "topology", "mountPath": contract.TOPOLOGY_DIR, "readOnly": True}]


def pod_volumes(owner: Owner, spec: ModelDeploymentSpec, volumes: Volumes, node: str | None) -> Volumes:
    """One pod's volumes: its group's, and the model cache when the pod downloads hf:// weights."""
    return [*volumes, _model_cache_volume(owner, spec, node)] if fetches_weights(spec) else volumes


def pod_mounts(spec: ModelDeploymentSpec, mounts: Volumes) -> Volumes:
    """One worker container's mounts: its group's, and the model cache when it downloads hf:// weights."""
    if fetches_weights(spec):
        return [*mounts, {"name": "model-cache", "mountPath": contract.MODEL_CACHE_DIR}]
    return mounts
