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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenfab.api.models import API_VERSION, KIND, ModelDeploymentSpec, RoleName
from tokenfab.planning import contract as c
from tokenfab.planning.capacity import Constraints, Toleration, to_units
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
        # No blockOwnerDeletion: it would need update on modeldeployments/finalizers where
        # OwnerReferencesPermissionEnforcement is on, and nothing here waits for foreground deletion.
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


def engine_configmap_name(owner: Owner, role: RoleName, revision: str) -> str:
    """One engine ConfigMap per role and revision: a pod of an old revision that restarts during a
    rollout still reads its own engine YAML."""
    return f"{owner.name}-{role}-engine-{revision[:10]}"


def frontend_name(owner: Owner) -> str:
    return f"{owner.name}-frontend"


def endpoint(owner: Owner) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc.cluster.local:{c.FRONTEND_PORT}/v1"


def dynamo_namespace_prefix(owner: Owner) -> str:
    """The frontend routes to every Dynamo namespace starting with this (one per generation). A hash of
    the deployment's namespace and name follows them: Dynamo matches a plain string prefix, and the
    generations of another deployment whose name merely extends this one ("llama" and "llama-guard"), or
    joins namespace and name at another hyphen, must not match."""
    return f"{owner.namespace}-{owner.name}-{content_hash([owner.namespace, owner.name], 6)}-g"


def dynamo_namespace(owner: Owner, revision: str) -> str:
    """The Dynamo namespace of one generation: its groups discover each other only, so a prefill group
    never hands a KV cache to a decode group of another revision."""
    return f"{dynamo_namespace_prefix(owner)}{revision[:8]}"


# ------------------------------------------------------------------------------------------ role facts


def group_shape(spec: ModelDeploymentSpec, role: RoleName) -> GroupShape:
    r = spec.role(role)
    if r is None:
        raise ValueError(f"the deployment has no {role} role")
    return GroupShape(
        gpus=r.parallelism.tensor * r.parallelism.pipeline, gpus_per_node=spec.topology.gpus_per_node
    )


def pod_requests(spec: ModelDeploymentSpec, role: RoleName) -> dict[str, int]:
    """What one worker pod of the role requests, in the ledger's units (GPUs, CPU, memory, ...)."""
    requests, _ = worker_resources(spec, role)
    out: dict[str, int] = {}
    for name, value in requests.items():
        try:
            out[name] = to_units(name, value)
        except ValueError:
            continue
    return out


# The worker and frontend images run as this non-root uid (runtime-images/*/Dockerfile).
RUN_AS = 10001
# Every pod tokenfab creates meets the restricted Pod Security Standard: non-root, RuntimeDefault seccomp,
# no privilege escalation, every capability dropped, a read-only root filesystem (with /tmp and the cache
# directory as emptyDirs), no service-account token.
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Seconds a terminating worker waits before its engine hears SIGTERM (endpoint removal propagates).
PRESTOP_SECONDS = 5
# Requests per GPU when runtime.resources leaves CPU or memory out (a GB200 tray has 144 cores and
# 960 GiB for 4 GPUs): the scheduler and the placement ledger count them.
DEFAULT_CPU_PER_GPU = 4
DEFAULT_MEMORY_GI_PER_GPU = 32


def container_security(spec: ModelDeploymentSpec | None = None) -> dict[str, Any]:
    """A container's security context; capabilities a deployment asks for (runtime.addCapabilities,
    e.g. IPC_LOCK for RDMA) are added back, and take its pods out of the restricted standard."""
    add = list(getattr(spec.runtime, "add_capabilities", None) or []) if spec is not None else []
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        caps["add"] = add
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": caps,
    }


def worker_resources(spec: ModelDeploymentSpec, role: RoleName) -> tuple[dict[str, str], dict[str, str]]:
    """Requests and limits of one worker container: the spec's, the GPUs parallelism implies, and CPU and
    memory requests per GPU where the spec leaves them out."""
    res = spec.runtime.resources
    gpus = group_shape(spec, role).pod_gpus
    gpu = {spec.topology.gpu_resource: str(gpus)}
    requests = {k: str(v) for k, v in res.requests.items()}
    limits = {k: str(v) for k, v in res.limits.items()}
    for name, value in limits.items():  # as Kubernetes defaults them (and the ledger must count them), e.g.
        requests.setdefault(name, value)  # the RDMA devices of runtime.resources.limits
    requests.setdefault("cpu", limits.get("cpu", str(DEFAULT_CPU_PER_GPU * gpus)))
    requests.setdefault("memory", limits.get("memory", f"{DEFAULT_MEMORY_GI_PER_GPU * gpus}Gi"))
    return {**requests, **gpu}, {**limits, **gpu}


def placement_constraints(spec: ModelDeploymentSpec) -> Constraints:
    """Which nodes the deployment's worker pods may run on, for placement."""
    sched = spec.scheduling
    selector = dict(sched.node_selector) if sched is not None else {}
    tolerations = tuple(
        Toleration(t.key or "", t.operator, t.value or "", t.effect or "")
        for t in (sched.tolerations if sched is not None else [])
    )
    return Constraints(
        domain_label=spec.topology.domain_label,
        gpu_resource=spec.topology.gpu_resource,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tolerations,
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
    # Both publishers are off in Dynamo by default: KV events feed the KV-aware router, metrics are the
    # engine's KV-cache utilization and queue that the autoscaler reads.
    return [*args, c.PUBLISH_KV_EVENTS_FLAG, c.PUBLISH_METRICS_FLAG]


# ------------------------------------------------------------------------------------------ discovery


def dynamo_service_account_name(owner: Owner) -> str:
    """The ServiceAccount of a deployment's worker and frontend pods (kubernetes discovery)."""
    return f"{owner.name}-dynamo"


def uses_kubernetes_discovery(spec: ModelDeploymentSpec) -> bool:
    return spec.serving.discovery == c.DISCOVERY_KUBERNETES


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def discovery_env(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    """What Dynamo's processes need to find each other: the backend, the planes, and for the kubernetes
    backend the pod's own identity (its DynamoWorkerMetadata is named after the pod and owned by it).
    runtime.env may set the backend and planes itself (contract.OVERRIDABLE_ENV): its value is then the
    only one."""
    own = {e.name for e in spec.runtime.env}
    return [e for e in _discovery_env(spec) if e["name"] not in own]


def _discovery_env(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    env = [
        {"name": c.ENV_DYN_DISCOVERY_BACKEND, "value": spec.serving.discovery},
        {"name": c.ENV_DYN_REQUEST_PLANE, "value": c.REQUEST_PLANE},
        {"name": c.ENV_DYN_EVENT_PLANE, "value": c.EVENT_PLANE},
    ]
    if uses_kubernetes_discovery(spec):
        return [
            *env,
            _field_env(c.ENV_POD_NAME, "metadata.name"),
            _field_env(c.ENV_POD_NAMESPACE, "metadata.namespace"),
            _field_env(c.ENV_POD_UID, "metadata.uid"),
        ]
    return [*env, {"name": c.ENV_ETCD_ENDPOINTS, "value": spec.serving.etcd_endpoints or ""}]


def pod_identity(owner: Owner, spec: ModelDeploymentSpec) -> dict[str, Any]:
    """The pod-spec fields that say who a worker or frontend pod is to the API server: with kubernetes
    discovery the deployment's ServiceAccount and its token (Dynamo's processes write and watch discovery
    objects); otherwise no token at all (the pods never talk to the API server)."""
    if uses_kubernetes_discovery(spec):
        return {
            "serviceAccountName": dynamo_service_account_name(owner),
            "automountServiceAccountToken": True,
        }
    return {"automountServiceAccountToken": False}


# What a pod's Dynamo process does with the API server, and no more (checked against Dynamo 1.6.1): list
# and watch the EndpointSlices of its namespace (a peer is routable while ready there), create its own
# DynamoWorkerMetadata by server-side apply and re-apply it as it registers, list and watch its peers'.
DISCOVERY_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [c.DYNAMO_METADATA_API.split("/")[0]],
        "resources": [c.DYNAMO_METADATA_PLURAL],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
]


def discovery_rbac(owner: Owner, spec: ModelDeploymentSpec) -> list[Manifest]:
    """The ServiceAccount, Role and RoleBinding of a deployment's pods for kubernetes discovery (none for
    etcd). Namespaced: the pods see their own namespace's discovery objects only."""
    if not uses_kubernetes_discovery(spec):
        return []
    name = dynamo_service_account_name(owner)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(owner, name, "discovery"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(owner, name, "discovery"),
            "rules": DISCOVERY_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, name, "discovery"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]


def engine_configmap(owner: Owner, spec: ModelDeploymentSpec, role: RoleName) -> Manifest:
    revision = role_revision(spec, role)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            owner,
            engine_configmap_name(owner, role, revision),
            "worker",
            {c.LABEL_ROLE: role, c.LABEL_REVISION: revision},
        ),
        "data": {c.ENGINE_CONFIG_FILE: render(engine_config(spec, role))},
    }


# Bumped when the worker pods tokenfab builds change in a way running groups must adopt (a new security
# context, say): the revision of every role changes, so an operator upgrade rolls every group once, one
# group at a time, like a Deployment whose template changed.
POD_TEMPLATE_VERSION = 3


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
        **({"cache": spec.model.cache.model_dump(by_alias=True)} if fetches_weights(spec) else {}),
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


def fetches_weights(spec: ModelDeploymentSpec) -> bool:
    """hf:// weights are downloaded by the launcher into the model cache; pvc:// weights are mounted."""
    return spec.model.source.startswith("hf://")


def model_cache_claim_name(owner: Owner, spec: ModelDeploymentSpec, node: str) -> str:
    """The model cache of a deployment on one node (node names can be 253 characters: a hash of it), for
    one storage class and size: a claim's spec cannot change, so a new class or size is a new claim."""
    cache = spec.model.cache
    return f"{owner.name}-model-{content_hash([node, cache.storage_class_name, str(cache.size)], 10)}"


def model_cache_claim(owner: Owner, spec: ModelDeploymentSpec, node: str) -> Manifest:
    """The node-local PersistentVolumeClaim that keeps a deployment's hf:// weights on `node` across pods,
    restarts and rollouts (spec.model.cache.storageClassName: a WaitForFirstConsumer class, so the volume
    is made on the node of the first pod that mounts it, and every pod there shares it)."""
    cache = spec.model.cache
    meta = _meta(owner, model_cache_claim_name(owner, spec, node), "worker")
    meta["annotations"] = {c.ANN_NODE: node}
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


def model_cache_claims(owner: Owner, spec: ModelDeploymentSpec, nodes: Iterable[str]) -> list[Manifest]:
    """The per-node model cache claims of the nodes the deployment's pods run on (none without a storage
    class)."""
    if not uses_model_cache_claims(spec):
        return []
    return [model_cache_claim(owner, spec, node) for node in sorted(set(nodes))]


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


def compute_domain_name(group: str) -> str:
    return f"{group}-imex"


def uses_compute_domain(spec: ModelDeploymentSpec, role: RoleName) -> bool:
    return spec.topology.compute_domain and group_shape(spec, role).nodes > 1


GangMode = Literal["podgroup", "gates"]


def gang_of(spec: ModelDeploymentSpec, role: RoleName, mode: GangMode) -> GangMode | None:
    """How a group of this role binds all or nothing: None for a one-pod group (nothing to coordinate),
    else the cluster's PodGroup gang API or tokenfab's scheduling gate."""
    return mode if group_shape(spec, role).nodes > 1 else None


def group_pods(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: RoleName,
    slot: int,
    domain: str,
    revision: str,
    nodes: Sequence[str] = (),
    ranks: Sequence[int] = (),
    gang: GangMode = "gates",
) -> list[Manifest]:
    """Pods of one group (all ranks, or `ranks`), pinned to `domain` and, when `nodes` are given (one per
    rank of `ranks`, or per rank of the group), each to its node.

    A multi-node group binds all or nothing: with `gang` "gates" its pods carry tokenfab's scheduling gate,
    lifted for the whole group once every pod exists; with "podgroup" they name the group's PodGroup
    (scheduling.k8s.io gang policy, minCount = all ranks), and the scheduler binds none before all fit.
    (With an IMEX channel claim the executor writes the PodGroup last, once every pod's claim exists:
    `admits_late`.)"""
    r = spec.role(role)
    assert r is not None
    shape = group_shape(spec, role)
    wanted = list(ranks) if ranks else list(range(shape.nodes))
    if nodes and len(nodes) != len(wanted):
        raise ValueError(
            f"{len(nodes)} nodes for {len(wanted)} ranks of group {group_name(owner, role, slot)}"
        )
    assigned = dict(zip(wanted, nodes, strict=True)) if nodes else {}
    group_gang = gang_of(spec, role, gang)
    sched = spec.scheduling
    drain = spec.serving.drain_seconds
    group = group_name(owner, role, slot)
    topo = spec.topology
    service = workers_service_name(owner)
    leader = worker_address(group, 0, service, owner.namespace)
    engine_hash = content_hash(engine_config(spec, role))
    volumes, mounts = _model_volume(spec)
    volumes = [
        {"name": "engine", "configMap": {"name": engine_configmap_name(owner, role, revision)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        *volumes,
    ]
    mounts = [
        {"name": "engine", "mountPath": c.ENGINE_CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *mounts,
    ]
    volumes += [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts += [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": c.CACHE_DIR}]
    requests, limits = worker_resources(spec, role)
    mode = disaggregation_mode(spec, role) or c.MODE_AGGREGATED
    multi_node = shape.nodes > 1
    if multi_node:
        # mpirun on rank 0 reaches the other ranks' SSH daemons with this key pair.
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": c.MPI_SSH_SECRET}})
        mounts.append({"name": "mpi-ssh", "mountPath": c.MPI_SSH_DIR, "readOnly": True})
    pods = []
    for rank in wanted:
        name = pod_name(group, rank)
        node = assigned.get(rank)
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
            *([{"name": c.ENV_MODEL_CACHE, "value": c.MODEL_CACHE_DIR}] if fetches_weights(spec) else []),
            {"name": c.ENV_DISAGGREGATION_MODE, "value": mode},
            {"name": c.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace(owner, revision)},
            {"name": c.ENV_DYN_SYSTEM_PORT, "value": str(c.WORKER_METRICS_PORT)},
            # A SIGTERMed Dynamo worker leaves discovery at once and finishes its requests up to this bound.
            *([{"name": c.ENV_DYN_SHUTDOWN_TIMEOUT, "value": str(drain)}] if drain else []),
            {"name": c.ENV_DYN_HEALTH_ENDPOINTS, "value": '["generate"]'},
            *discovery_env(spec),
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
            "resources": {"requests": requests, "limits": limits},
            "securityContext": container_security(spec),
            "volumeMounts": mounts,
        }
        term: dict[str, Any] = {
            "matchExpressions": [{"key": topo.domain_label, "operator": "In", "values": [domain]}]
        }
        if node is not None:
            # The node the ledger reserved for this rank: the scheduler binds it there or nowhere.
            term["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": [node]}]
        container["lifecycle"] = {
            # Let the endpoint's removal reach the routers before the engine hears SIGTERM.
            "preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}
        }
        if fetches_weights(spec):
            container["volumeMounts"] = [*mounts, {"name": "model-cache", "mountPath": c.MODEL_CACHE_DIR}]
        pod_spec: dict[str, Any] = {
            "hostname": name,
            "subdomain": service,
            **pod_identity(owner, spec),
            "securityContext": POD_SECURITY,
            "restartPolicy": "Never",
            # Dynamo drains on SIGTERM: the grace period covers drainSeconds, so an eviction drains too
            # (drainSeconds 0: Kubernetes' default 30 s).
            "terminationGracePeriodSeconds": drain + PRESTOP_SECONDS + 25 if drain else 30,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "tolerations": [
                *(
                    {
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": topo.node_failure_toleration_seconds,
                    }
                    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
                ),
                *(
                    t.model_dump(by_alias=True, exclude_none=True)
                    for t in (sched.tolerations if sched else [])
                ),
            ],
            "containers": [container],
            "volumes": [*volumes, _model_cache_volume(owner, spec, node)]
            if fetches_weights(spec)
            else volumes,
        }
        if sched is not None:
            if sched.node_selector:
                pod_spec["nodeSelector"] = dict(sched.node_selector)
            if sched.priority_class_name:
                pod_spec["priorityClassName"] = sched.priority_class_name
            if sched.scheduler_name:
                pod_spec["schedulerName"] = sched.scheduler_name
        if rank == 0 and drain > 0:
            # The operator turns this False to take the group out of routing before removing it (a
            # router following endpoint readiness sends it nothing new), and True when it may serve.
            pod_spec["readinessGates"] = [{"conditionType": c.ROUTABLE_CONDITION}]
        if group_gang == "gates":
            pod_spec["schedulingGates"] = [{"name": c.GANG_GATE}]
        elif group_gang == "podgroup":
            pod_spec["schedulingGroup"] = {"podGroupName": group}
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
                **({c.LABEL_PEERS: "true"} if multi_node else {}),
            },
        )
        meta["annotations"] = {
            c.ANN_ENGINE_HASH: engine_hash,
            c.ANN_GROUP_SIZE: str(shape.nodes),
            c.ANN_GROUP_GPUS: str(shape.gpus),
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(c.WORKER_METRICS_PORT),
        }
        if node is not None:
            meta["annotations"][c.ANN_NODE] = node
            if len(assigned) == shape.nodes:
                meta["annotations"][c.ANN_GROUP_NODES] = ",".join(assigned[i] for i in sorted(assigned))
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec})
    return pods


def admits_late(spec: ModelDeploymentSpec, role: RoleName, mode: GangMode) -> bool:
    """Whether a group's PodGroup is written only after its pods, once the resource claim controller has
    made every pod's IMEX channel claim from the ComputeDomain's template. Until its PodGroup exists the
    scheduler holds every pod of the gang back, quietly; a pod whose claim is not made yet is held back
    too, so a PodGroup written with the pods would let the scheduler try the gang in part, and turn it
    away with a FailedScheduling Warning, until the last claim is made."""
    return gang_of(spec, role, mode) == "podgroup" and uses_compute_domain(spec, role)


def pod_group(owner: Owner, spec: ModelDeploymentSpec, role: RoleName, slot: int) -> Manifest:
    """The gang PodGroup of a multi-node group (scheduling.k8s.io, Kubernetes 1.35+ with the
    GenericWorkload and GangScheduling feature gates): the scheduler binds none of its pods until all
    of them can bind."""
    group = group_name(owner, role, slot)
    return {
        "apiVersion": c.POD_GROUP_API,
        "kind": "PodGroup",
        "metadata": _meta(owner, group, "worker", {c.LABEL_ROLE: role, c.LABEL_GROUP: group}),
        "spec": {"schedulingPolicy": {"gang": {"minCount": group_shape(spec, role).nodes}}},
    }


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
            # Deprecated by the driver and immutable: 0 (its recommended value since IMEX daemons find each
            # other by DNS) is valid on every release; a count would only gate the object's own status.
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": compute_domain_name(group)},
                "allocationMode": "Single",
            },
        },
    }


# ------------------------------------------------------------------------------------- shared children


def workers_service(owner: Owner, spec: ModelDeploymentSpec) -> Manifest:
    """Headless Service over every worker pod of the deployment, for two things:
    - Dynamo's kubernetes discovery: its EndpointSlices (labelled for discovery) say which pods are ready,
      and a worker is routed to only while its pod is; a draining group's leader turns its readiness gate
      tokenfab.dev/routable False and leaves routing the way Dynamo sees it. Not-ready pods are therefore
      not published.
    - stable DNS names for the ranks of multi-node groups (rank 0 runs mpirun to the others, each ready
      once its SSH daemon answers; a pod resolves its own name from its /etc/hosts)."""
    meta = _meta(owner, workers_service_name(owner), "worker")
    if uses_kubernetes_discovery(spec):
        meta["labels"].update(c.DISCOVERY_LABELS)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
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
                    **pod_identity(owner, spec),
                    "securityContext": POD_SECURITY,
                    "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
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
                                # every generation's namespace: during a rollout, each request goes to
                                # one generation (weighted by its routable workers), never across two
                                "--namespace-prefix",
                                dynamo_namespace_prefix(owner),
                            ],
                            "env": [
                                {"name": c.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace_prefix(owner)},
                                *discovery_env(spec),
                                *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
                            ],
                            "ports": [{"name": "http", "containerPort": c.FRONTEND_PORT}],
                            "readinessProbe": {
                                "httpGet": {"path": c.HEALTH_PATH, "port": "http"},
                                "periodSeconds": 10,
                            },
                            "resources": {
                                "requests": {"cpu": "2", "memory": "4Gi"},
                                "limits": {"cpu": "4", "memory": "4Gi"},
                            },
                            "securityContext": container_security(),
                            "volumeMounts": [
                                {"name": "tmp", "mountPath": "/tmp"},
                                {"name": "cache", "mountPath": c.CACHE_DIR},
                            ],
                        }
                    ],
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


def applied_hash(manifest: Manifest) -> str:
    """Hash of a shared child's manifest (without its own hash annotation)."""
    meta = dict(manifest["metadata"])
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k != c.ANN_APPLIED_HASH}
    meta["annotations"] = ann
    return content_hash({**manifest, "metadata": meta})


def with_applied_hash(manifest: Manifest) -> Manifest:
    """The manifest with its hash in an annotation, so an unchanged child is never applied again."""
    h = applied_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), c.ANN_APPLIED_HASH: h}
    return {**manifest, "metadata": meta}


def pod_disruption_budget(owner: Owner, role: RoleName, pods: int) -> Manifest:
    """At most one pod of a role evicted at a time (`pods` = the role's desired pods): an eviction breaks
    the pod's group, so a node drain takes one group of the role down at a time, never two."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, f"{owner.name}-{role}", "worker", {c.LABEL_ROLE: role}),
        "spec": {
            "minAvailable": max(0, pods - 1),
            "selector": {
                "matchLabels": {**selector_labels(owner), c.COMPONENT: "worker", c.LABEL_ROLE: role}
            },
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
