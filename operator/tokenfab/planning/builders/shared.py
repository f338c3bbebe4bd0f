"""The children a deployment has one of (or one per role), whatever its groups: the headless workers
Service, the Dynamo frontend Deployment and its Service, the PodDisruptionBudget of each role, and the
applied-hash annotation that keeps an unchanged child from being applied again."""

from __future__ import annotations

from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import contract
from tokenfab.planning.builders.common import (
    Manifest,
    Owner,
    child_meta,
    dynamo_namespace_prefix,
    frontend_name,
    selector_labels,
    workers_service_name,
)
from tokenfab.planning.builders.placement import failure_tolerations
from tokenfab.planning.builders.probes import frontend_readiness_probe
from tokenfab.planning.builders.security import (
    POD_SECURITY,
    container_security,
    discovery_env,
    pod_identity,
    uses_kubernetes_discovery,
)
from tokenfab.planning.engine_config import content_hash


def workers_service(owner: Owner, spec: ModelDeploymentSpec) -> Manifest:
    """Headless Service over every worker pod of the deployment, for two things:
    - Dynamo's kubernetes discovery: its EndpointSlices (labelled for discovery) say which pods are ready,
      and a worker is routed to only while its pod is; a draining group's leader turns its readiness gate
      tokenfab.dev/routable False and leaves routing the way Dynamo sees it. Not-ready pods are therefore
      not published.
    - stable DNS names for the ranks of multi-node groups (rank 0 runs mpirun to the others, each ready
      once its SSH daemon answers; a pod resolves its own name from its /etc/hosts)."""
    meta = child_meta(owner, workers_service_name(owner), "worker")
    if uses_kubernetes_discovery(spec):
        meta["labels"].update(contract.DISCOVERY_LABELS)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "selector": {**selector_labels(owner), contract.COMPONENT: "worker"},
            "ports": [{"name": "metrics", "port": contract.WORKER_METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def frontend_deployment(owner: Owner, spec: ModelDeploymentSpec, replaces: str = "") -> Manifest:
    """`replaces`: the frontend pods its template replaces, on a node being left (planning.frontend)."""
    name = frontend_name(owner)
    labels = {**selector_labels(owner), contract.COMPONENT: "frontend"}
    template_meta: dict[str, Any] = {"labels": labels}
    if replaces:
        template_meta["annotations"] = {contract.ANN_REPLACES: replaces}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_meta(owner, name, "frontend"),
        "spec": {
            "replicas": spec.serving.frontend_replicas,
            "selector": {"matchLabels": labels},
            # a new pod available before an old one goes (a spec change, or a node being left)
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": template_meta,
                "spec": {
                    **pod_identity(owner, spec),
                    "securityContext": POD_SECURITY,
                    "tolerations": failure_tolerations(spec),
                    # several frontend pods on several nodes where they fit: one node's loss is not all
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
                    "containers": [_frontend_container(owner, spec)],
                },
            },
        },
    }


def _frontend_container(owner: Owner, spec: ModelDeploymentSpec) -> dict[str, Any]:
    """The Dynamo frontend: the OpenAI-compatible HTTP API and the router over every generation."""
    return {
        "name": "frontend",
        "image": spec.runtime.image,
        "command": [contract.PYTHON, "-m", contract.DYNAMO_FRONTEND_MODULE],
        "args": [
            "--http-port",
            str(contract.FRONTEND_PORT),
            "--router-mode",
            spec.serving.router_mode,
            # every generation's namespace: during a rollout, each request goes to one generation
            # (weighted by its routable workers), never across two
            "--namespace-prefix",
            dynamo_namespace_prefix(owner),
        ],
        "env": [
            {"name": contract.ENV_DYNAMO_NAMESPACE, "value": dynamo_namespace_prefix(owner)},
            *discovery_env(spec),
            *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
        ],
        "ports": [{"name": "http", "containerPort": contract.FRONTEND_PORT}],
        "readinessProbe": frontend_readiness_probe(),
        "resources": {
            "requests": {"cpu": "2", "memory": "4Gi"},
            "limits": {"cpu": "4", "memory": "4Gi"},
        },
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": contract.CACHE_DIR},
        ],
    }


def frontend_service(owner: Owner) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(owner, owner.name, "frontend"),
        "spec": {
            "selector": {**selector_labels(owner), contract.COMPONENT: "frontend"},
            "ports": [{"name": "http", "port": contract.FRONTEND_PORT, "targetPort": "http"}],
        },
    }


def applied_hash(manifest: Manifest) -> str:
    """Hash of a shared child's manifest (without its own hash annotation)."""
    meta = dict(manifest["metadata"])
    mine = applied_annotation(manifest)
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k != mine}
    meta["annotations"] = ann
    return content_hash({**manifest, "metadata": meta})


def applied_annotation(manifest: Manifest) -> str:
    """The annotation a child's applied hash is kept in: one per owner on a model cache claim (several
    deployments apply it, each its own manifest), else one."""
    if (uid := _cache_owner(manifest)) is not None:
        return f"{contract.ANN_APPLIED_BY_PREFIX}{uid}"
    return contract.ANN_APPLIED_HASH


def field_manager(manifest: Manifest) -> str:
    """The field manager a child is applied with: each owner's own on a model cache claim."""
    uid = _cache_owner(manifest)
    return contract.FIELD_MANAGER if uid is None else cache_field_manager(uid)


def cache_field_manager(uid: str) -> str:
    """The field manager of one owner's share of a model cache claim (its reference, marks and hash)."""
    return f"{contract.CACHE_FIELD_MANAGER_PREFIX}{uid}"


def _cache_owner(manifest: Manifest) -> str | None:
    """The uid of the deployment whose share of a model cache claim this manifest is (the one claim kind
    with several owners, each applying its own manifest), else None."""
    refs = manifest["metadata"].get("ownerReferences")
    return str(refs[0]["uid"]) if manifest["kind"] == "PersistentVolumeClaim" and refs else None


def with_applied_hash(manifest: Manifest) -> Manifest:
    """The manifest with its hash in an annotation, so an unchanged child is never applied again."""
    h = applied_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), applied_annotation(manifest): h}
    return {**manifest, "metadata": meta}


def pod_disruption_budget(owner: Owner, role: RoleName, pods: int) -> Manifest:
    """At most one pod of a role evicted at a time (`pods` = the role's desired pods): an eviction breaks
    the pod's group, so a node drain takes one group of the role down at a time, never two."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_meta(owner, f"{owner.name}-{role}", "worker", {contract.LABEL_ROLE: role}),
        "spec": {
            "minAvailable": max(0, pods - 1),
            "selector": {
                "matchLabels": {
                    **selector_labels(owner),
                    contract.COMPONENT: "worker",
                    contract.LABEL_ROLE: role,
                }
            },
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
