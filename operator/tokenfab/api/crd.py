"""CustomResourceDefinitions generated from the pydantic models (pure: models in, dicts out).

The JSON schema pydantic produces is turned into a Kubernetes structural schema: references inlined,
optional fields unwrapped, exclusive bounds in OpenAPI v3.0 form, object defaults so nested defaults
apply; the models carry their rules' CEL as `x-kubernetes-validations` (`tokenfab.api.rules`, and the spec's
cross-field rules in `tokenfab.api.models.spec`), and metadata.name gets the name rules here.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from tokenfab.api import models
from tokenfab.api.rules import NAME_RULE, NAME_SUFFIX_RULE

JSON = dict[str, Any]

# Object-typed fields that get `default: {}` so the API server fills in their nested defaults.
# Not parallelism nor speculativeDecoding: with spec.profile, leaving them out asks for a plan, so the API
# server must not fill them in (absent, they mean 1 GPU per group and no MTP, as the models say).
_DEFAULT_EMPTY_OBJECTS = {
    "runtime",
    "serving",
    "topology",
    "autoscaling",
    "resources",
}


def _inline(node: Any, defs: JSON) -> Any:
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        target_desc = target.get("description")
        target.update(node)
        if "description" not in node and target_desc:
            target["description"] = target_desc
        node = target
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        inner = _inline(inner, defs)
        inner.update(node)
        node = inner
    return {k: _inline(v, defs) for k, v in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            node.pop("anyOf")
            merged = dict(options[0])
            merged.update(node)
            node = merged
            if node.get("default", 0) is None:
                node.pop("default")
        elif {o.get("type") for o in options} == {"integer", "string"}:
            node.pop("anyOf")
            node["x-kubernetes-int-or-string"] = True
    node.pop("title", None)
    if node.get("default", 0) is None:
        node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[plain] = node[bound]
            node[bound] = True
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    if node.get("additionalProperties") is True:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    out = {k: _structural(v) for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        for name, prop in props.items():
            if name in _DEFAULT_EMPTY_OBJECTS and prop.get("type") == "object" and "default" not in prop:
                prop["default"] = {}
    return out


def _no_object_defaults(node: Any) -> Any:
    """Status carries no defaults for objects: only the operator writes it, and a defaulted empty object
    would make every status it writes differ from the stored one."""
    if isinstance(node, list):
        return [_no_object_defaults(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _no_object_defaults(v) for k, v in node.items()}
    if out.get("type") == "object" and out.get("default") == {}:
        out.pop("default")
    return out


def openapi_schema(model: type[BaseModel]) -> JSON:
    """Structural OpenAPI v3 schema of a model (by alias, inlined)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    result: JSON = _structural(_inline(raw, defs))
    return result


def _wide_columns(ready: str) -> list[JSON]:
    """The ModelDeployment columns `kubectl get -o wide` adds (priority 1)."""
    return [
        {
            "name": "Draining",
            "type": "integer",
            "jsonPath": ".status.drainingGroups",
            "description": "groups finishing their requests before they go",
            "priority": 1,
        },
        {
            "name": "Ratio",
            "type": "string",
            "jsonPath": ".spec.serving.prefillDecodeRatio",
            "priority": 1,
            "description": "prefill:decode ratio",
        },
        {
            "name": "MTP",
            "type": "integer",
            "jsonPath": ".spec.speculativeDecoding.mtpDepth",
            "priority": 1,
            "description": "MTP depth",
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": f"{ready}.reason",
            "priority": 1,
            "description": "reason of the Ready condition",
        },
        {
            "name": "Endpoint",
            "type": "string",
            "jsonPath": ".status.endpoint",
            "priority": 1,
            "description": "OpenAI-compatible endpoint",
        },
        {
            "name": "KV-Path",
            "type": "string",
            "jsonPath": ".status.kvPath",
            "priority": 1,
            "description": "how the prefill-decode units move KV caches: nvlink, rdma or tcp, with counts",
        },
        {
            "name": "Weights",
            "type": "string",
            "jsonPath": ".status.weightsCache.summary",
            "priority": 1,
            "description": "per-node model caches: warm nodes, downloads under way, bytes staged",
        },
    ]


def printer_columns() -> list[JSON]:
    """The ModelDeployment columns of `kubectl get`: mode, readiness, groups and GPUs (more with -o wide)."""
    ready = '.status.conditions[?(@.type=="Ready")]'
    return [
        {
            "name": "Mode",
            "type": "string",
            "jsonPath": ".spec.serving.mode",
            "description": "aggregated or disaggregated",
        },
        {"name": "Ready", "type": "string", "jsonPath": f"{ready}.status", "description": "Ready condition"},
        {
            "name": "Prefill",
            "type": "string",
            "jsonPath": ".status.roles.prefill.groups",
            "description": "ready/desired prefill groups",
        },
        {
            "name": "Decode",
            "type": "string",
            "jsonPath": ".status.roles.decode.groups",
            "description": "ready/desired decode groups",
        },
        {
            "name": "Workers",
            "type": "string",
            "jsonPath": ".status.roles.worker.groups",
            "description": "ready/desired aggregated worker groups",
        },
        {"name": "GPUs", "type": "string", "jsonPath": ".status.gpus", "description": "ready/desired GPUs"},
        *_wide_columns(ready),
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def _crd(
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    scope: str,
    description: str,
    properties: JSON,
    columns: list[JSON],
    required: tuple[str, ...] = (),
    metadata: JSON | None = None,
) -> JSON:
    """A CustomResourceDefinition of one served, stored version with a status subresource."""
    root: JSON = {"type": "object", "description": description}
    if required:
        root["required"] = list(required)
    root["properties"] = {
        "apiVersion": {"type": "string", "description": f"APIVersion of this object: {models.API_VERSION}."},
        "kind": {"type": "string", "description": f"Kind of this object: {kind}."},
        "metadata": metadata or {"type": "object"},
        **properties,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(models.CATEGORIES),
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def model_deployment_metadata() -> JSON:
    """The root `metadata` schema: the API server lets a CRD constrain only name and generateName; the
    rule on name makes it print `metadata.name: Invalid value: "<name>": <message>`."""
    return {
        "type": "object",
        "properties": {
            "name": {
                "type": "string",
                "description": "Name of the deployment; its pods, Services and labels are named after it.",
                "x-kubernetes-validations": [
                    NAME_RULE.x_kubernetes_validation(),
                    NAME_SUFFIX_RULE.x_kubernetes_validation(),
                ],
            }
        },
    }


def model_deployment_crd() -> JSON:
    """The ModelDeployment CRD."""
    spec_schema = openapi_schema(models.ModelDeploymentSpec)
    status_schema = _no_object_defaults(openapi_schema(models.ModelDeploymentStatus))
    spec_schema["description"] = models.ModelDeploymentSpec.__doc__
    status_schema["description"] = models.ModelDeploymentStatus.__doc__
    return _crd(
        models.KIND,
        models.PLURAL,
        models.SINGULAR,
        models.SHORT_NAMES,
        "Namespaced",
        "A model served by TensorRT-LLM worker groups behind an NVIDIA Dynamo frontend, each group placed "
        "whole inside one NVLink (NVL72) domain, scaled from KV-cache utilization.",
        {"spec": spec_schema, "status": status_schema},
        printer_columns(),
        required=("spec",),
        metadata=model_deployment_metadata(),
    )


def nvlink_domain_crd() -> JSON:
    """NVLinkDomain: cluster-scoped, status-only view of each domain's capacity (`kubectl get nvld`)."""
    columns: list[JSON] = [
        {"name": "Domain", "type": "string", "jsonPath": ".status.domain", "priority": 1},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyNodes"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
        {"name": "Free", "type": "integer", "jsonPath": ".status.freeGpus"},
        {"name": "Free-Nodes", "type": "integer", "jsonPath": ".status.freeNodes"},
        {"name": "Groups", "type": "integer", "jsonPath": ".status.groupCount"},
        {"name": "Health", "type": "string", "jsonPath": ".status.health"},
        {"name": "Cached", "type": "integer", "jsonPath": ".status.cached"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Updated", "type": "date", "jsonPath": ".status.updated"},
    ]
    return _crd(
        models.DOMAIN_KIND,
        models.DOMAIN_PLURAL,
        models.DOMAIN_SINGULAR,
        models.DOMAIN_SHORT_NAMES,
        "Cluster",
        "One NVLink domain (an NVL72 rack) and its free GPUs, as tokenfab sees it. Written by the operator; "
        "read it with `kubectl get nvlinkdomains`.",
        {"status": openapi_schema(models.NVLinkDomainStatus)},
        columns,
    )


# NVIDIA Dynamo's discovery object (the kubernetes discovery backend): its group, version and names are
# Dynamo's (tokenfab.planning.contract has them for the builders); the schema is written here.
DYNAMO_GROUP = "nvidia.com"
DYNAMO_VERSION = "v1alpha1"
DYNAMO_METADATA_KIND = "DynamoWorkerMetadata"
DYNAMO_METADATA_PLURAL = "dynamoworkermetadatas"


def dynamo_worker_metadata_crd() -> JSON:
    """DynamoWorkerMetadata: what one Dynamo process registered (endpoints, model cards, event channels),
    written by the process itself and owned by its pod, for Dynamo's kubernetes discovery backend. The same
    names and shape as NVIDIA Dynamo's platform installs: where it is installed already, this is skipped
    (Helm keeps an existing CRD; `kubectl apply` of the same schema changes nothing)."""
    root: JSON = {
        "type": "object",
        "description": "Discovery data of one NVIDIA Dynamo worker or frontend process, named after its pod.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {
                        "type": "object",
                        "description": "What the process registered: endpoints, model cards, event channels "
                        "(written by Dynamo, read by its peers).",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{DYNAMO_METADATA_PLURAL}.{DYNAMO_GROUP}",
            "annotations": {"helm.sh/resource-policy": "keep"},
        },
        "spec": {
            "group": DYNAMO_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": DYNAMO_METADATA_KIND,
                "listKind": f"{DYNAMO_METADATA_KIND}List",
                "plural": DYNAMO_METADATA_PLURAL,
                "singular": DYNAMO_METADATA_KIND.lower(),
                "shortNames": ["dwm"],
            },
            "versions": [
                {
                    "name": DYNAMO_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "additionalPrinterColumns": [
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                    ],
                }
            ],
        },
    }


def all_crds() -> dict[str, JSON]:
    """File name -> CRD, for everything tokenfab installs."""
    return {
        f"{models.GROUP}_{models.PLURAL}.yaml": model_deployment_crd(),
        f"{models.GROUP}_{models.DOMAIN_PLURAL}.yaml": nvlink_domain_crd(),
        f"{DYNAMO_GROUP}_{DYNAMO_METADATA_PLURAL}.yaml": dynamo_worker_metadata_crd(),
    }
