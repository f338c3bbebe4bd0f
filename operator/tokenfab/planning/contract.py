"""The contract between the operator, the pods it creates and the worker launcher: label and annotation
keys, environment variable names, ports and paths. Both sides import these names; none is written twice."""

from __future__ import annotations

DOMAIN = "tokenfab.dev"
FIELD_MANAGER = "tokenfab"
FINALIZER = f"{DOMAIN}/finalizer"

# Labels on every child object.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tokenfab"
COMPONENT = "app.kubernetes.io/component"  # worker | frontend
LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_GROUP = f"{DOMAIN}/group"
LABEL_SLOT = f"{DOMAIN}/slot"
LABEL_RANK = f"{DOMAIN}/rank"
LABEL_REVISION = f"{DOMAIN}/revision"
LABEL_DOMAIN = f"{DOMAIN}/nvlink-domain"

# Annotations.
ANN_ENGINE_HASH = f"{DOMAIN}/engine-config-hash"
ANN_GROUP_SIZE = f"{DOMAIN}/group-pods"
ANN_GROUP_GPUS = f"{DOMAIN}/group-gpus"

# Environment the launcher reads (set on every worker pod).
ENV_ROLE = "TOKENFAB_ROLE"
ENV_GROUP = "TOKENFAB_GROUP"
ENV_RANK = "TOKENFAB_RANK"
ENV_WORLD_SIZE = "TOKENFAB_WORLD_SIZE"
ENV_GPUS_PER_POD = "TOKENFAB_GPUS_PER_POD"
ENV_LEADER_ADDRESS = "TOKENFAB_LEADER_ADDRESS"
ENV_ENGINE_CONFIG = "TOKENFAB_ENGINE_CONFIG"
ENV_MODEL_NAME = "TOKENFAB_MODEL_NAME"
ENV_MODEL_SOURCE = "TOKENFAB_MODEL_SOURCE"
ENV_MODEL_REVISION = "TOKENFAB_MODEL_REVISION"
ENV_MODEL_PATH = "TOKENFAB_MODEL_PATH"
ENV_DISAGGREGATION_MODE = "TOKENFAB_DISAGGREGATION_MODE"
ENV_DYNAMO_NAMESPACE = "DYN_NAMESPACE"

# Ports and paths.
WORKER_METRICS_PORT = 9090  # Dynamo system server: /health and /metrics (DYN_SYSTEM_PORT)
FRONTEND_PORT = 8000  # OpenAI-compatible HTTP API
ENGINE_CONFIG_DIR = "/etc/tokenfab/engine"
ENGINE_CONFIG_FILE = "engine.yaml"
MODEL_MOUNT = "/models"

# NVIDIA ComputeDomain (IMEX channels for multi-node NVLink), from NVIDIA's DRA driver.
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_CLAIM = "imex"

# Worker metrics in Prometheus carry the pod labels above, named as a standard Kubernetes relabelling
# (`labelmap: __meta_kubernetes_pod_label_(.+)`) names them: dots and slashes become underscores.
PROM_LABEL_DEPLOYMENT = "tokenfab_dev_deployment"
PROM_LABEL_ROLE = "tokenfab_dev_role"
PROM_LABEL_GROUP = "tokenfab_dev_group"
