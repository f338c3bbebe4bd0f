"""Who a worker or frontend pod is and what it may do: its security contexts, its ServiceAccount and the
RBAC of Dynamo's kubernetes discovery, and the discovery environment that goes with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import contract
from tokenfab.planning.builders.common import Manifest, Owner, child_meta

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


def container_security(spec: ModelDeploymentSpec | None = None, also: Sequence[str] = ()) -> dict[str, Any]:
    """A container's security context; capabilities a deployment asks for (runtime.addCapabilities,
    e.g. IPC_LOCK for RDMA) and `also` (IPC_LOCK for a unit that spans NVLink domains) are added back,
    and take its pods out of the restricted standard."""
    add = list(getattr(spec.runtime, "add_capabilities", None) or []) if spec is not None else []
    add += [c for c in also if c not in add]
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        caps["add"] = add
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": caps,
    }


# ------------------------------------------------------------------------------------------ discovery


def dynamo_service_account_name(owner: Owner) -> str:
    """The ServiceAccount of a deployment's worker and frontend pods (kubernetes discovery)."""
    return f"{owner.name}-dynamo"


def uses_kubernetes_discovery(spec: ModelDeploymentSpec) -> bool:
    return spec.serving.discovery == contract.DISCOVERY_KUBERNETES


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
        {"name": contract.ENV_DYN_DISCOVERY_BACKEND, "value": spec.serving.discovery},
        {"name": contract.ENV_DYN_REQUEST_PLANE, "value": contract.REQUEST_PLANE},
        {"name": contract.ENV_DYN_EVENT_PLANE, "value": contract.EVENT_PLANE},
    ]
    if uses_kubernetes_discovery(spec):
        return [
            *env,
            _field_env(contract.ENV_POD_NAME, "metadata.name"),
            _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
            _field_env(contract.ENV_POD_UID, "metadata.uid"),
        ]
    return [*env, {"name": contract.ENV_ETCD_ENDPOINTS, "value": spec.serving.etcd_endpoints or ""}]


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
        "apiGroups": [contract.DYNAMO_METADATA_API.split("/")[0]],
        "resources": [contract.DYNAMO_METADATA_PLURAL],
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
            "metadata": child_meta(owner, name, "discovery"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": child_meta(owner, name, "discovery"),
            "rules": DISCOVERY_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": child_meta(owner, name, "discovery"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]
