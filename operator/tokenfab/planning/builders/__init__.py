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

Every name is importable from here; the modules split the builders by concern:
  - common: the owner, owner reference, labels, metadata and names of the children;
  - roles: a role's group shape, worker resources, placement constraints and group counts;
  - placement: node affinity, tolerations, scheduling fields, the gang (gate or PodGroup), ComputeDomain;
  - engine: the worker's arguments and environment, the engine ConfigMap, the role's revision;
  - security: security contexts, the ServiceAccount and RBAC of kubernetes discovery, discovery env;
  - probes: readiness probes and gates, the preStop pause, the termination grace period;
  - volumes: the worker's volumes, the model volume and the per-node model cache claims;
  - fetch: the weights-fetch pod that stages hf:// weights in a node's model cache ahead of need;
  - pods: the pods of one group, composed from the above;
  - shared: the workers Service, the frontend Deployment and Service, PodDisruptionBudgets.
"""

from __future__ import annotations

from tokenfab.planning.builders.common import (
    Manifest,
    Owner,
    child_meta,
    compute_domain_name,
    dynamo_namespace,
    dynamo_namespace_prefix,
    endpoint,
    engine_configmap_name,
    frontend_name,
    group_name,
    owner_reference,
    pod_name,
    selector_labels,
    unit_domain_name,
    worker_address,
    workers_service_name,
)
from tokenfab.planning.builders.fetch import fetch_env, weights_fetch_pod, weights_fetch_pod_name
from tokenfab.planning.builders.placement import (
    GangMode,
    admits_late,
    channel_domain,
    compute_domain,
    gang_of,
    nccl_mnnvl,
    pod_group,
    uses_compute_domain,
)
from tokenfab.planning.builders.pods import GroupAt, group_pods
from tokenfab.planning.builders.probes import ENGINE_START_SECONDS, PRESTOP_SECONDS, startup_budget
from tokenfab.planning.builders.roles import (
    DEFAULT_CPU_PER_GPU,
    DEFAULT_MEMORY_GI_PER_GPU,
    group_shape,
    placement_constraints,
    pod_requests,
    worker_resources,
)
from tokenfab.planning.builders.security import (
    DISCOVERY_RULES,
    POD_SECURITY,
    RUN_AS,
    container_security,
    discovery_env,
    discovery_rbac,
    dynamo_service_account_name,
    pod_identity,
    uses_kubernetes_discovery,
)
from tokenfab.planning.builders.shared import (
    applied_annotation,
    applied_hash,
    cache_field_manager,
    field_manager,
    frontend_deployment,
    frontend_service,
    pod_disruption_budget,
    with_applied_hash,
    workers_service,
)
from tokenfab.planning.builders.volumes import (
    fetches_weights,
    holds_annotation,
    model_cache_claim,
    model_cache_claim_name,
    model_cache_claims,
    pinned_nodes,
    released_claim,
    uses_model_cache_claims,
    weights_key,
)
from tokenfab.planning.builders.worker import (
    POD_TEMPLATE_VERSION,
    engine_configmap,
    model_path,
    role_revision,
    worker_args,
    worker_env,
)

__all__ = [
    "DEFAULT_CPU_PER_GPU",
    "DEFAULT_MEMORY_GI_PER_GPU",
    "DISCOVERY_RULES",
    "ENGINE_START_SECONDS",
    "POD_SECURITY",
    "POD_TEMPLATE_VERSION",
    "PRESTOP_SECONDS",
    "RUN_AS",
    "GangMode",
    "GroupAt",
    "Manifest",
    "Owner",
    "admits_late",
    "applied_annotation",
    "applied_hash",
    "cache_field_manager",
    "channel_domain",
    "child_meta",
    "compute_domain",
    "compute_domain_name",
    "container_security",
    "discovery_env",
    "discovery_rbac",
    "dynamo_namespace",
    "dynamo_namespace_prefix",
    "dynamo_service_account_name",
    "endpoint",
    "engine_configmap",
    "engine_configmap_name",
    "fetch_env",
    "fetches_weights",
    "field_manager",
    "frontend_deployment",
    "frontend_name",
    "frontend_service",
    "gang_of",
    "group_name",
    "group_pods",
    "group_shape",
    "holds_annotation",
    "model_cache_claim",
    "model_cache_claim_name",
    "model_cache_claims",
    "model_path",
    "nccl_mnnvl",
    "owner_reference",
    "pinned_nodes",
    "placement_constraints",
    "pod_disruption_budget",
    "pod_group",
    "pod_identity",
    "pod_name",
    "pod_requests",
    "released_claim",
    "role_revision",
    "selector_labels",
    "startup_budget",
    "unit_domain_name",
    "uses_compute_domain",
    "uses_kubernetes_discovery",
    "uses_model_cache_claims",
    "weights_fetch_pod",
    "weights_fetch_pod_name",
    "weights_key",
    "with_applied_hash",
    "worker_address",
    "worker_args",
    "worker_env",
    "worker_resources",
    "workers_service",
    "workers_service_name",
]
