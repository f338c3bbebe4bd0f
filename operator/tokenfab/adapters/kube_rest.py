"""The Kubernetes REST API as tokenfab speaks it: the path of every kind it touches, and its errors.

Pure translation, no requests: `resource_path` turns (apiVersion, kind, namespace, name, subresource)
into the request path, `resource_of` turns a path back into the resource the request counters name, and
`error_of` turns a refused request's answer into an `ApiError` with the API server's own reason and message.
tokenfab.adapters.kube (the client) uses them and re-exports `ApiError` and `resource_path`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

from tokenfab.api.models import API_VERSION, DOMAIN_KIND, KIND
from tokenfab.planning import contract

# (apiVersion, kind) -> (plural, namespaced)
RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Pod"): ("pods", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Event"): ("events", True),
    ("v1", "Node"): ("nodes", False),
    ("v1", "Namespace"): ("namespaces", False),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    (API_VERSION, KIND): ("modeldeployments", True),
    (API_VERSION, DOMAIN_KIND): ("nvlinkdomains", False),
    (contract.COMPUTE_DOMAIN_API, "ComputeDomain"): ("computedomains", True),
    (contract.POD_GROUP_API, "PodGroup"): ("podgroups", True),
    (contract.DEVICE_TAINT_RULE_API, "DeviceTaintRule"): ("devicetaintrules", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    (contract.RESOURCE_CLAIM_TEMPLATE_API, "ResourceClaimTemplate"): ("resourceclaimtemplates", True),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("discovery.k8s.io/v1", "EndpointSlice"): ("endpointslices", True),
    (contract.DYNAMO_METADATA_API, contract.DYNAMO_METADATA_KIND): (contract.DYNAMO_METADATA_PLURAL, True),
}


@dataclass
class ApiError(Exception):
    """A request the API server refused (or that never got an answer)."""

    status: int  # HTTP status; 0 when there was no answer (timeout, connection refused)
    reason: str  # the API server's reason (Forbidden, Invalid, Conflict, ...) or the client's error
    message: str  # the API server's own words
    verb: str = ""
    what: str = ""  # "Pod ds/x-decode-0-1"

    def __str__(self) -> str:
        return f"{self.verb} {self.what}: {self.message}".strip(": ") if self.what else self.message

    @property
    def not_found(self) -> bool:
        return self.status == 404


def api_prefix(api_version: str) -> str:
    """/api/v1 for the core group, /apis/<group>/<version> for the others."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def resource_path(
    api_version: str, kind: str, namespace: str | None = None, name: str | None = None, sub: str = ""
) -> str:
    plural, namespaced = RESOURCES[(api_version, kind)]
    path = api_prefix(api_version)
    if namespaced and namespace:
        path += f"/namespaces/{quote(namespace)}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name)}"
    if sub:
        path += f"/{sub}"
    return path


def resource_of(path: str) -> str:
    """The resource of a request path, with its subresource: /api/v1/namespaces/x/pods/y -> pods,
    /apis/g/v/namespaces/x/modeldeployments/y/status -> modeldeployments/status."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts and parts[0] == "api" else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:] or ["namespaces"]
    if not rest:
        return "discovery"
    return rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")


def error_of(status: int, data: bytes, verb: str, what: str) -> ApiError:
    """The error of a refused request, from the API server's Status body (or its first bytes)."""
    try:
        body = json.loads(data)
        return ApiError(
            status, str(body.get("reason") or status), str(body.get("message") or data[:300]), verb, what
        )
    except ValueError:
        return ApiError(status, str(status), data[:300].decode(errors="replace"), verb, what)
