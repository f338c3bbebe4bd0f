"""What a role's Dynamo TensorRT-LLM worker runs: its arguments, its environment, its engine ConfigMap,
and the revision that says when running groups must be replaced."""

from __future__ import annotations

from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract
from tokenfab.planning.builders.common import (
    Manifest,
    Owner,
    child_meta,
    dynamo_namespace,
    engine_configmap_name,
    worker_address,
)
from tokenfab.planning.builders.placement import nccl_mnnvl, uses_compute_domain
from tokenfab.planning.builders.security import discovery_env
from tokenfab.planning.builders.volumes import fetches_weights
from tokenfab.planning.engine_config import content_hash, disaggregation_mode, engine_config, render
from tokenfab.planning.topology import GroupShape
from tokenfab.planning.units import UNIT_ROLES, rule


def model_path(spec: ModelDeploymentSpec) -> str:
    """What the worker loads: a hub id for hf://, <bucket>/<prefix> for s3:// (the launcher points the engine
    at the snapshot it fetched, for both), a mounted directory for pvc://."""
    scheme, rest = spec.model.source.split("://", 1)
    if scheme in ("hf", "s3"):
        return rest
    if scheme == "pvc":
        _, _, sub = rest.partition("/")
        return f"{contract.MODEL_MOUNT}/{sub}".rstrip("/")
    return contract.MODEL_MOUNT


def worker_args(spec: ModelDeploymentSpec, role: RoleName) -> list[str]:
    """Arguments of `python3 -m dynamo.trtllm` for a role: the single source of the Dynamo worker's
    arguments. They are the worker container's args; the launcher (its command) passes them on."""
    args = [
        "--model-path",
        model_path(spec),
        "--served-model-name",
        spec.model.name,
        "--extra-engine-args",
        contract.ENGINE_CONFIG_PATH,
    ]
    mode = disaggregation_mode(spec, role)
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    # Both publishers are off in Dynamo by default: KV events feed the KV-aware router, metrics are the
    # engine's KV-cache utilization and queue that the autoscaler reads.
    return [*args, contract.PUBLISH_KV_EVENTS_FLAG, contract.PUBLISH_METRICS_FLAG]


def worker_env(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: RoleName,
    group: str,
    rank: int,
    shape: GroupShape,
    revision: str,
    service: str,
    unit: int | None = None,
) -> list[dict[str, Any]]:
    """The worker container's environment: the rank's place in its group, the model, the engine, Dynamo's
    namespace and discovery, its prefill-decode unit's KV-transfer domain, then runtime.env."""
    drain = spec.serving.drain_seconds
    mode = disaggregation_mode(spec, role) or contract.MODE_AGGREGATED
    return [
        {"name": contract.ENV_ROLE, "value": role},
        {"name": contract.ENV_GROUP, "value": group},
        {"name": contract.ENV_RANK, "value": str(rank)},
        {"name": contract.ENV_WORLD_SIZE, "value": str(shape.nodes)},
        {"name": contract.ENV_GPUS_PER_POD, "value": str(shape.pod_gpus)},
        {"name": contract.ENV_LEADER_ADDRESS, "value": worker_address(group, 0, service, owner.namespace)},
        {"name": contract.ENV_WORKERS_SERVICE, "value": service},
        {"name": contract.ENV_NAMESPACE, "value": owner.namespace},
        {"name": contract.ENV_ENGINE_CONFIG, "value": contract.ENGINE_CONFIG_PATH},
        {"name": contract.ENV_MODEL_NAME, "value": spec.model.name},
        {"name": contract.ENV_MODEL_SOURCE, "value": spec.model.source},
        {"name": contract.ENV_MODEL_REVISION, "value": spec.model.revision or ""},
        {"name": contract.ENV_MODEL_PATH, "value": model_path(spec)},
        *(
            [{"name": contract.ENV_MODEL_CACHE, "value": contract.MODEL_CACHE_DIR}]
            if fetches_weights(spec)
            else []
        ),
        {"name": contract.ENV_DISAGGREGATION_MODE, "value": mode},
        {"name": contract.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace(owner, revision)},
        {"name": contract.ENV_DYN_SYSTEM_PORT, "value": str(contract.WORKER_METRICS_PORT)},
        # A SIGTERMed Dynamo worker leaves discovery at once and finishes its requests up to this bound.
        *([{"name": contract.ENV_DYN_SHUTDOWN_TIMEOUT, "value": str(drain)}] if drain else []),
        {"name": contract.ENV_DYN_HEALTH_ENDPOINTS, "value": '["generate"]'},
        *discovery_env(spec),
        *nccl_env(spec, role),
        *kv_fabric_env(spec, role),
        *kv_transfer_domain_env(unit),
        *({"name": name, "value": value} for name, value in contract.COMPILE_CACHE_ENV),
        *([{"name": contract.ENV_MPI_SSH_DIR, "value": contract.MPI_SSH_DIR}] if shape.nodes > 1 else []),
        *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
    ]


def nccl_env(spec: ModelDeploymentSpec, role: RoleName) -> list[dict[str, Any]]:
    """NCCL's multi-node NVLink settings, only for a pod of a multi-node group that holds an IMEX channel
    (a ComputeDomain claim): with NCCL_MNNVL_ENABLE=1 and no channel NCCL fails at communicator init, so
    a one-pod group (whose NCCL never leaves its tray; a unit member's channel is for its KV transfers) or
    a group without a ComputeDomain (topology.computeDomain false) gets none, and NCCL keeps its own
    default (2: MNNVL where it finds it, else NVLink inside the tray and the network between trays)."""
    if not nccl_mnnvl(spec, role):
        return []
    return [{"name": name, "value": "1"} for name in contract.NCCL_MNNVL_ENV]


def kv_fabric_env(spec: ModelDeploymentSpec, role: RoleName) -> list[dict[str, Any]]:
    """The KV transfer's multi-node NVLink settings, for a prefill-decode unit's pod that holds the unit's
    IMEX channel (none without one: a fabric allocation needs the channel, and UCX would look for a fabric
    that is not there)."""
    if role not in UNIT_ROLES or rule(spec) is None or not uses_compute_domain(spec, role):
        return []
    return [{"name": name, "value": value} for name, value in contract.KV_FABRIC_ENV]


def kv_transfer_domain_env(unit: int | None) -> list[dict[str, Any]]:
    """A unit member's KV-transfer domain: Dynamo's router prefers, after it picks a prefill worker, a
    decode worker of the same unit (the file `contract.KV_TRANSFER_DOMAIN` in the topology volume holds
    the pod's unit). Preferred, not required: a unit whose decode group is lost keeps serving through
    another unit's while it is replaced (required would fail those requests: Dynamo does not fall back)."""
    if unit is None:
        return []
    return [
        {"name": contract.ENV_DYN_TOPOLOGY_ENABLED, "value": "true"},
        {"name": contract.ENV_DYN_TOPOLOGY_MOUNT_PATH, "value": contract.TOPOLOGY_DIR},
        {"name": contract.ENV_DYN_KV_TRANSFER_DOMAIN, "value": contract.KV_TRANSFER_DOMAIN},
        {"name": contract.ENV_DYN_KV_TRANSFER_ENFORCEMENT, "value": contract.KV_TRANSFER_ENFORCEMENT},
        {
            "name": contract.ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT,
            "value": contract.KV_TRANSFER_PREFERRED_WEIGHT,
        },
    ]


def engine_configmap(owner: Owner, spec: ModelDeploymentSpec, role: RoleName) -> Manifest:
    revision = role_revision(spec, role)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_meta(
            owner,
            engine_configmap_name(owner, role, revision),
            "worker",
            {contract.LABEL_ROLE: role, contract.LABEL_REVISION: revision},
        ),
        "data": {contract.ENGINE_CONFIG_FILE: render(engine_config(spec, role))},
    }


# Bumped when the worker pods tokenfab builds change in a way running groups must adopt (a new security
# context, say): the revision of every role changes, so an operator upgrade rolls every group once, one
# group at a time, like a Deployment whose template changed.
# 4: NCCL's MNNVL settings only with an IMEX channel; 5: the weights init container, a startup budget
POD_TEMPLATE_VERSION = 5


def role_revision(spec: ModelDeploymentSpec, role: RoleName) -> str:
    """Hash of everything that shapes a role's pods: a change means new groups (a rollout). A
    disaggregated deployment's prefill and decode share one revision, a generation: a change to either
    rolls both, so a new generation of prefill and decode groups comes up together in its own Dynamo
    namespace and never exchanges KV caches with the old one."""
    if spec.serving.mode == "disaggregated" and role in ("prefill", "decode"):
        return content_hash({r: _revision_inputs(spec, r) for r in ("prefill", "decode") if spec.role(r)})
    return content_hash(_revision_inputs(spec, role))


def _revision_inputs(spec: ModelDeploymentSpec, role: RoleName) -> dict[str, Any]:
    r = spec.role(role)
    assert r is not None
    return {
        "engine": engine_config(spec, role),
        "args": worker_args(spec, role),
        "image": spec.runtime.image,
        "env": [e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
        "resources": spec.runtime.resources.model_dump(by_alias=True),
        **({"capabilities": list(spec.runtime.add_capabilities)} if spec.runtime.add_capabilities else {}),
        "model": spec.model.model_dump(by_alias=True, exclude_none=True, exclude={"cache"}),
        # (pre-staging changes where weights wait, not what a pod runs: no rollout)
        **(
            {"cache": spec.model.cache.model_dump(by_alias=True, exclude={"prestage_groups"})}
            if fetches_weights(spec)
            else {}
        ),
        "discovery": [spec.serving.discovery, spec.serving.etcd_endpoints],
        "topology": [
            spec.topology.gpus_per_node,
            spec.topology.gpu_resource,
            spec.topology.compute_domain,
            spec.topology.node_failure_toleration_seconds,
            spec.topology.domain_label,
        ],
        **(
            {"scheduling": spec.scheduling.model_dump(by_alias=True, exclude_none=True)}
            if spec.scheduling is not None
            else {}
        ),
        "template": POD_TEMPLATE_VERSION,
    }
