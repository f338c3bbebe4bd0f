"""Child manifests of a ModelDeployment, built from the spec and a placement (pure: dicts out, no I/O).

Children: per role an engine ConfigMap; per group its pods (one per node, ranks 0..n-1, pinned by node
affinity to the group's NVLink domain) and optionally an NVIDIA ComputeDomain; one headless Service
that gives every worker a stable DNS name (rank 0 is the group's leader); the Dynamo frontend
Deployment and its Service. Every child carries an owner reference, so deleting the ModelDeployment
deletes them all.

Why operator-managed pods rather than a StatefulSet per group: a group must be created, restarted and
moved as one. A StatefulSet restarts pods one by one and can only move by being replaced; managing the
pods directly gives whole-group recreation (restartPolicy Never: a failed rank fails its pod, and the
operator recreates the whole group), exact placement, and no second controller deciding replica counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tokenfab.api.models import API_VERSION, KIND, ModelDeploymentSpec, RoleName
from tokenfab.planning import contract as c
from tokenfab.planning.engine import content_hash, disaggregation_mode, engine_config, render
from tokenfab.planning.topology import GroupShape

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Owner:
    """The ModelDeployment that owns the children."""

    name: str
    namespace: str
    uid: str


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(owner: Owner) -> dict[str, str]:
    return {c.MANAGED_BY: c.MANAGED_BY_VALUE, c.LABEL_DEPLOYMENT: owner.name}


def _meta(owner: Owner, name: str, component: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {**selector_labels(owner), c.COMPONENT: component, **(extra or {})}
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(owner)],
    }


# ----------------------------------------------------------------------------------------------- names


def group_name(owner: Owner, role: RoleName, slot: int) -> str:
    return f"{owner.name}-{role}-{slot}"


def pod_name(group: str, rank: int) -> str:
    return f"{group}-{rank}"


def workers_service_name(owner: Owner) -> str:
    return f"{owner.name}-workers"


def worker_address(group: str, rank: int, service: str, namespace: str) -> str:
    """Stable DNS name of a group's rank (hostname = pod name, subdomain = the headless workers Service).

    The builders set the leader's address with it and the worker launcher derives every rank's host for
    mpirun with it, so both agree by construction."""
    return f"{pod_name(group, rank)}.{service}.{namespace}.svc.cluster.local"


def engine_configmap_name(owner: Owner, role: RoleName) -> str:
    return f"{owner.name}-{role}-engine"


def frontend_name(owner: Owner) -> str:
    return f"{owner.name}-frontend"


def endpoint(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc.cluster.local:{c.FRONTEND_PORT}/v1"


def dynamo_namespace(owner: Owner) -> str:
    return f"{owner.namespace}-{owner.name}"


# ------------------------------------------------------------------------------------------ role facts


def group_shape(spec: ModelDeploymentSpec, role: RoleName) -> GroupShape:
    r = spec.role(role)
    if r is None:
        raise ValueError(f"the deployment has no {role} role")
    return GroupShape(
        gpus=r.parallelism.tensor * r.parallelism.pipeline, gpus_per_node=spec.topology.gpus_per_node
    )


def ratio_prefill(decode_groups: int, ratio: str) -> int:
    """Prefill groups that follow `decode_groups` by a "P:D" ratio: ceil(decode x P / D)."""
    p, d = (int(x) for x in ratio.split(":"))
    return math.ceil(decode_groups * p / d)


def spec_groups(spec: ModelDeploymentSpec) -> dict[RoleName, int]:
    """Groups per role that the spec asks for (before the autoscaler, which may override them)."""
    out: dict[RoleName, int] = {}
    for name, role in spec.roles():
        out[name] = 1 if role.replicas is None else role.replicas
    if "prefill" in out and "decode" in out:
        out["prefill"] = follow_ratio(spec, out["decode"], out["prefill"])
    return out


def follow_ratio(spec: ModelDeploymentSpec, decode_groups: int, prefill_groups: int) -> int:
    """With the fixed ratio policy prefill follows decode (clamped to prefill bounds, if any)."""
    ratio = spec.serving.prefill_decode_ratio
    if spec.serving.ratio_policy != "fixed" or ratio is None:
        return prefill_groups
    n = ratio_prefill(decode_groups, ratio)
    bounds = spec.autoscaling.prefill
    if bounds is not None and spec.autoscaling.enabled:
        n = max(bounds.min_replicas, min(bounds.max_replicas, n))
    return n


def model_path(spec: ModelDeploymentSpec) -> str:
    """What the worker loads: a hub id for hf://, a mounted directory for pvc:// and s3://."""
    scheme, rest = spec.model.source.split("://", 1)
    if scheme == "hf":
        return rest
    if scheme == "pvc":
        _, _, sub = rest.partition("/")
        return f"{c.MODEL_MOUNT}/{sub}".rstrip("/")
    return c.MODEL_MOUNT


def worker_args(spec: ModelDeploymentSpec, role: RoleName) -> list[str]:
    """Arguments of `python3 -m dynamo.trtllm` for a role: the single source of the Dynamo worker's
    arguments. They are the worker container's args; the launcher (its command) passes them on."""
    args = [
        "--model-path",
        model_path(spec),
        "--served-model-name",
        spec.model.name,
        "--extra-engine-args",
        c.ENGINE_CONFIG_PATH,
    ]
    mode = disaggregation_mode(spec, role)
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    return args


def engine_configmap(owner: Owner, spec: ModelDeploymentSpec, role: RoleName) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, engine_configmap_name(owner, role), "worker", {c.LABEL_ROLE: role}),
        "data": {c.ENGINE_CONFIG_FILE: render(engine_config(spec, role))},
    }


def role_revision(spec: ModelDeploymentSpec, role: RoleName) -> str:
    """Hash of everything that shapes a role's pods: a change means new groups (a rollout)."""
    r = spec.role(role)
    assert r is not None
    return content_hash(
        {
            "engine": engine_config(spec, role),
            "args": worker_args(spec, role),
            "image": spec.runtime.image,
            "env": [e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
            "resources": spec.runtime.resources.model_dump(by_alias=True),
            "model": spec.model.model_dump(by_alias=True, exclude_none=True),
            "topology": [
                spec.topology.gpus_per_node,
                spec.topology.gpu_resource,
                spec.topology.compute_domain,
                spec.topology.node_failure_toleration_seconds,
                spec.topology.domain_label,
            ],
        }
    )


# ----------------------------------------------------------------------------------------------- pods


def _model_volume(spec: ModelDeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    scheme, rest = spec.model.source.split("://", 1)
    if scheme == "pvc":
        claim = rest.split("/", 1)[0]
        return (
            [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
            [{"name": "model", "mountPath": c.MODEL_MOUNT, "readOnly": True}],
        )
    return [], []


def compute_domain_name(group: str) -> str:
    return f"{group}-imex"


def uses_compute_domain(spec: ModelDeploymentSpec, role: RoleName) -> bool:
    return spec.topology.compute_domain and group_shape(spec, role).nodes > 1


def group_pods(
    owner: Owner, spec: ModelDeploymentSpec, role: RoleName, slot: int, domain: str, revision: str
) -> list[Manifest]:
    """All pods of one group, pinned to `domain`."""
    r = spec.role(role)
    assert r is not None
    shape = group_shape(spec, role)
    group = group_name(owner, role, slot)
    topo = spec.topology
    service = workers_service_name(owner)
    leader = worker_address(group, 0, service, owner.namespace)
    engine_hash = content_hash(engine_config(spec, role))
    volumes, mounts = _model_volume(spec)
    volumes = [
        {"name": "engine", "configMap": {"name": engine_configmap_name(owner, role)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        *volumes,
    ]
    mounts = [
        {"name": "engine", "mountPath": c.ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *mounts,
    ]
    gpu = {topo.gpu_resource: str(shape.pod_gpus)}
    resources = spec.runtime.resources
    mode = disaggregation_mode(spec, role) or c.MODE_AGGREGATED
    multi_node = shape.nodes > 1
    if multi_node:
        # mpirun on rank 0 reaches the other ranks' SSH daemons with this key pair.
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": c.MPI_SSH_SECRET}})
        mounts.append({"name": "mpi-ssh", "mountPath": c.MPI_SSH_DIR, "readOnly": True})
    pods = []
    for rank in range(shape.nodes):
        name = pod_name(group, rank)
        env = [
            {"name": c.ENV_ROLE, "value": role},
            {"name": c.ENV_GROUP, "value": group},
            {"name": c.ENV_RANK, "value": str(rank)},
            {"name": c.ENV_WORLD_SIZE, "value": str(shape.nodes)},
            {"name": c.ENV_GPUS_PER_POD, "value": str(shape.pod_gpus)},
            {"name": c.ENV_LEADER_ADDRESS, "value": leader},
            {"name": c.ENV_WORKERS_SERVICE, "value": service},
            {"name": c.ENV_NAMESPACE, "value": owner.namespace},
            {"name": c.ENV_ENGINE_CONFIG, "value": c.ENGINE_CONFIG_PATH},
            {"name": c.ENV_MODEL_NAME, "value": spec.model.name},
            {"name": c.ENV_MODEL_SOURCE, "value": spec.model.source},
            {"name": c.ENV_MODEL_REVISION, "value": spec.model.revision or ""},
            {"name": c.ENV_MODEL_PATH, "value": model_path(spec)},
            {"name": c.ENV_DISAGGREGATION_MODE, "value": mode},
            {"name": c.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace(owner)},
            {"name": c.ENV_DYN_SYSTEM_PORT, "value": str(c.WORKER_METRICS_PORT)},
            {"name": c.ENV_DYN_HEALTH_ENDPOINTS, "value": '["generate"]'},
            {"name": "NCCL_MNNVL_ENABLE", "value": "1"},
            {"name": "NCCL_CUMEM_ENABLE", "value": "1"},
            *([{"name": c.ENV_MPI_SSH_DIR, "value": c.MPI_SSH_DIR}] if multi_node else []),
            *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
        ]
        container: dict[str, Any] = {
            "name": "worker",
            "image": spec.runtime.image,
            # The launcher starts `python3 -m dynamo.trtllm <args>` (under mpirun on rank 0 of a
            # multi-node group; an SSH daemon for mpirun on the other ranks): see tokenfab.launcher.
            "command": [c.PYTHON, "-m", c.LAUNCHER_MODULE],
            "args": worker_args(spec, role),
            "env": env,
            "ports": [
                {"name": "metrics", "containerPort": c.WORKER_METRICS_PORT},
                *([{"name": "mpi-ssh", "containerPort": c.MPI_SSH_PORT}] if multi_node else []),
            ],
            "readinessProbe": {
                "httpGet": {"path": c.HEALTH_PATH, "port": "metrics"},
                "periodSeconds": 10,
                "failureThreshold": 3,
            },
            "resources": {
                "requests": {**{k: str(v) for k, v in resources.requests.items()}, **gpu},
                "limits": {**{k: str(v) for k, v in resources.limits.items()}, **gpu},
            },
            "volumeMounts": mounts,
        }
        pod_spec: dict[str, Any] = {
            "hostname": name,
            "subdomain": service,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": topo.domain_label, "operator": "In", "values": [domain]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": topo.node_failure_toleration_seconds,
                }
                for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ],
            "containers": [container],
            "volumes": volumes,
        }
        if uses_compute_domain(spec, role):
            pod_spec["resourceClaims"] = [
                {"name": c.COMPUTE_DOMAIN_CLAIM, "resourceClaimTemplateName": compute_domain_name(group)}
            ]
            container["resources"]["claims"] = [{"name": c.COMPUTE_DOMAIN_CLAIM}]
        meta = _meta(
            owner,
            name,
            "worker",
            {
                c.LABEL_ROLE: role,
                c.LABEL_GROUP: group,
                c.LABEL_SLOT: str(slot),
                c.LABEL_RANK: str(rank),
                c.LABEL_REVISION: revision,
                c.LABEL_DOMAIN: domain,
            },
        )
        meta["annotations"] = {
            c.ANN_ENGINE_HASH: engine_hash,
            c.ANN_GROUP_SIZE: str(shape.nodes),
            c.ANN_GROUP_GPUS: str(shape.gpus),
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(c.WORKER_METRICS_PORT),
        }
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec})
    return pods


def compute_domain(owner: Owner, spec: ModelDeploymentSpec, role: RoleName, slot: int) -> Manifest | None:
    """NVIDIA ComputeDomain (IMEX channel) for a multi-node group, if the spec asks for one."""
    if not uses_compute_domain(spec, role):
        return None
    group = group_name(owner, role, slot)
    return {
        "apiVersion": c.COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": _meta(
            owner, compute_domain_name(group), "worker", {c.LABEL_ROLE: role, c.LABEL_GROUP: group}
        ),
        "spec": {
            "numNodes": group_shape(spec, role).nodes,
            "channel": {
                "resourceClaimTemplate": {"name": compute_domain_name(group)},
                "allocationMode": "Single",
            },
        },
    }


# ------------------------------------------------------------------------------------- shared children


def workers_service(owner: Owner) -> Manifest:
    """Headless Service: stable DNS names for every worker pod (rank 0 of a group is its leader)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, workers_service_name(owner), "worker"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**selector_labels(owner), c.COMPONENT: "worker"},
            "ports": [{"name": "metrics", "port": c.WORKER_METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def frontend_deployment(owner: Owner, spec: ModelDeploymentSpec) -> Manifest:
    name = frontend_name(owner)
    labels = {**selector_labels(owner), c.COMPONENT: "frontend"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, name, "frontend"),
        "spec": {
            "replicas": spec.serving.frontend_replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "frontend",
                            "image": spec.runtime.image,
                            "command": [c.PYTHON, "-m", c.DYNAMO_FRONTEND_MODULE],
                            "args": [
                                "--http-port",
                                str(c.FRONTEND_PORT),
                                "--router-mode",
                                spec.serving.router_mode,
                            ],
                            "env": [
                                {"name": c.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace(owner)},
                                *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
                            ],
                            "ports": [{"name": "http", "containerPort": c.FRONTEND_PORT}],
                            "readinessProbe": {
                                "httpGet": {"path": c.HEALTH_PATH, "port": "http"},
                                "periodSeconds": 10,
                            },
                            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                        }
                    ]
                },
            },
        },
    }


def frontend_service(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, owner.name, "frontend"),
        "spec": {
            "selector": {**selector_labels(owner), c.COMPONENT: "frontend"},
            "ports": [{"name": "http", "port": c.FRONTEND_PORT, "targetPort": "http"}],
        },
    }
