"""What every child of a ModelDeployment shares: its owner, owner reference, labels, metadata and names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenfab.api.models import API_VERSION, KIND, RoleName
from tokenfab.planning import contract
from tokenfab.planning.engine_config import content_hash

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
    return {contract.MANAGED_BY: contract.MANAGED_BY_VALUE, contract.LABEL_DEPLOYMENT: owner.name}


def child_meta(
    owner: Owner, name: str, component: str, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """A child's metadata: its name and namespace, the deployment's labels and the owner reference."""
    labels = {**selector_labels(owner), contract.COMPONENT: component, **(extra or {})}
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
    return f"http://{owner.name}.{owner.namespace}.svc.cluster.local:{contract.FRONTEND_PORT}/v1"


def compute_domain_name(group: str) -> str:
    return f"{group}-imex"


def unit_domain_name(owner: Owner, unit: int) -> str:
    """The ComputeDomain of a prefill-decode unit (planning.units), shared by its groups."""
    return f"{owner.name}-unit-{unit}-imex"


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
