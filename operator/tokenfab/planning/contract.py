"""The contract between the operator, the pods it creates and the worker launcher: label and annotation
keys, environment variable names, ports and paths. Both sides import these names; none is written twice."""

from __future__ import annotations

DOMAIN = "tokenfab.dev"
FIELD_MANAGER = "tokenfab"
# A model cache claim is applied by each deployment that uses it under a field manager of its own, so each
# owns only its entry of ownerReferences and its own annotations (planning.builders.volumes)
CACHE_FIELD_MANAGER_PREFIX = "tokenfab-cache-"
FINALIZER = f"{DOMAIN}/finalizer"

# Labels on every child object.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tokenfab"
COMPONENT = "app.kubernetes.io/component"  # worker | frontend | weights-fetch
COMPONENT_WEIGHTS_FETCH = "weights-fetch"  # a pod that stages hf:// weights in a node's model cache
# A worker pod's init container that downloads its weights into the model cache before the worker starts,
# so the worker's startup probe counts only what follows (planning.builders.probes.startup_budget).
WEIGHTS_INIT_CONTAINER = "weights"
COMPONENT_MODEL_CACHE = "model-cache"  # a node's model cache claim, shared by the deployments of one source
LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_GROUP = f"{DOMAIN}/group"
LABEL_SLOT = f"{DOMAIN}/slot"
LABEL_RANK = f"{DOMAIN}/rank"
LABEL_REVISION = f"{DOMAIN}/revision"
LABEL_DOMAIN = f"{DOMAIN}/nvlink-domain"
LABEL_UNIT = f"{DOMAIN}/unit"  # a disaggregated group's prefill-decode unit (planning.units)
# "rdma" on the pods of a unit that spans NVLink domains: they hold an RDMA device and IPC_LOCK
LABEL_KV_NETWORK = f"{DOMAIN}/kv-network"
KV_NETWORK_RDMA = "rdma"
# UCX registers (pins) the memory it moves over RDMA: a container needs CAP_IPC_LOCK for more than the
# default locked-memory limit.
CAP_IPC_LOCK = "IPC_LOCK"
LABEL_PEERS = (
    f"{DOMAIN}/peers"  # "true" on pods of multi-node groups (the headless workers Service selects them)
)

# Annotations.
ANN_ENGINE_HASH = f"{DOMAIN}/engine-config-hash"
ANN_GROUP_SIZE = f"{DOMAIN}/group-pods"
ANN_GROUP_GPUS = f"{DOMAIN}/group-gpus"
ANN_START_PATH = f"{DOMAIN}/start-path"  # a worker pod: warm | fetching | cold (its node's model cache)
ANN_WEIGHTS = f"{DOMAIN}/weights"  # a fetch pod: the weights (source@revision) it stages
# A model cache claim: one annotation per weights it holds (source@revision; the key's name is a hash of
# it), each written by the deployments that saw them served or staged there (planning.builders.volumes)
ANN_HOLDS_PREFIX = f"weights.{DOMAIN}/"
# A model cache claim: the hash of what each owning deployment last applied (the key's name: its uid)
ANN_APPLIED_BY_PREFIX = f"applied.{DOMAIN}/"
# A node: how much its local NVMe gives the model caches (a quantity, e.g. 28Ti; planning.eviction)
LABEL_CACHE_CAPACITY = f"{DOMAIN}/model-cache-capacity"
ANN_NODE = f"{DOMAIN}/node"  # the node placement assigned this pod (it is pinned there)
ANN_GROUP_NODES = f"{DOMAIN}/group-nodes"  # every rank's node, comma-separated in rank order
ANN_RELEASED = f"{DOMAIN}/released-at"  # unix time the group's scheduling gates were lifted
ANN_APPLIED_HASH = f"{DOMAIN}/applied-hash"  # hash of the manifest last applied (shared children)
ANN_DRAINING = f"{DOMAIN}/draining-since"  # unix time the group's drain started
ANN_DRAIN_INFLIGHT = f"{DOMAIN}/drain-inflight"  # requests in flight when it started (empty: unknown)
# The frontend's pod template: the frontend pods it replaces, off a node being left (planning.frontend)
ANN_REPLACES = f"{DOMAIN}/replaces"

# A group's leader pod is routable (a router following endpoint readiness sends it requests) only while
# this pod condition, a readiness gate, is True; the operator turns it False to drain the group.
ROUTABLE_CONDITION = f"{DOMAIN}/routable"

# All-or-nothing binding of a multi-node group: tokenfab's scheduling gate, or the cluster's gang API.
GANG_GATE = f"{DOMAIN}/gang"
POD_GROUP_API = "scheduling.k8s.io/v1beta1"

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
ENV_MODEL_CACHE = "TOKENFAB_MODEL_CACHE"  # where hf:// weights are downloaded (a volume: see MODEL_CACHE_DIR)
# The launcher's log lines the operator reads (tokenfab.launcher.progress, tokenfab.planning.launcher_log):
# a download's bytes so far, and where the weights came from once they are in place.
LOG_WEIGHTS_PROGRESS = "weights-progress"
LOG_WEIGHTS_RESULT = "weights-result"
ENV_DISAGGREGATION_MODE = "TOKENFAB_DISAGGREGATION_MODE"
ENV_WORKERS_SERVICE = "TOKENFAB_WORKERS_SERVICE"  # headless Service: rank r is <group>-<r>.<service>.<ns>...
ENV_NAMESPACE = "TOKENFAB_NAMESPACE"
ENV_MPI_SSH_DIR = "TOKENFAB_MPI_SSH_DIR"  # multi-node groups only: where the SSH key Secret is mounted
ENV_PEER_WAIT_SECONDS = "TOKENFAB_PEER_WAIT_SECONDS"  # optional: how long rank 0 waits for the other ranks
DEFAULT_PEER_WAIT_SECONDS = 1800  # its default (image pulls, a peer's weights download: many minutes)
ENV_DYNAMO_NAMESPACE = "DYN_NAMESPACE"
ENV_DYN_SYSTEM_PORT = "DYN_SYSTEM_PORT"  # Dynamo's system server (/health, /metrics) on rank 0
ENV_DYN_SYSTEM_HOST = "DYN_SYSTEM_HOST"  # its bind address (not set on pods: all interfaces)
ENV_DYN_HEALTH_ENDPOINTS = "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"
# NCCL's multi-node NVLink (MNNVL) and its cuMem allocations: set only on pods that claim an IMEX channel.
NCCL_MNNVL_ENV = ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE")
# KV transfers over multi-node NVLink, on a prefill-decode unit's pods that hold its IMEX channel: UCX's
# cuda_ipc across trays (its default, "try", already attempts it; said outright) on a KV pool TensorRT-LLM
# allocates with CUDA fabric handles (off by default: legacy allocations cannot leave the tray).
KV_FABRIC_ENV = (("UCX_CUDA_IPC_ENABLE_MNNVL", "y"), ("TRTLLM_KVCACHE_POOL_USE_FABRIC_MEMORY", "1"))
# Dynamo's topology-aware KV transfer (dynamo/common/utils/topology.py in 1.6.1, read by dynamo.trtllm's
# worker and by the mocker at registration): each file under the mount path is a topology domain, the one
# DYN_KV_TRANSFER_DOMAIN names constrains (required) or biases (preferred) the decode worker the router
# picks after a prefill worker. A unit's pods publish their unit there (a downward-API file of their label).
ENV_DYN_TOPOLOGY_ENABLED = "DYN_TOPOLOGY_ENABLED"
ENV_DYN_TOPOLOGY_MOUNT_PATH = "DYN_TOPOLOGY_MOUNT_PATH"
ENV_DYN_KV_TRANSFER_DOMAIN = "DYN_KV_TRANSFER_DOMAIN"
ENV_DYN_KV_TRANSFER_ENFORCEMENT = "DYN_KV_TRANSFER_ENFORCEMENT"
ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT = "DYN_KV_TRANSFER_PREFERRED_WEIGHT"
TOPOLOGY_DIR = "/etc/dynamo/topology"  # Dynamo's default mount path
KV_TRANSFER_DOMAIN = "unit"  # the topology domain (a file under TOPOLOGY_DIR) holding the pod's unit
KV_TRANSFER_ENFORCEMENT = "preferred"  # (required fails a request whose unit has no decode worker serving)
KV_TRANSFER_PREFERRED_WEIGHT = "1.0"  # the strongest preference Dynamo accepts (0-1)
ENV_DYN_SHUTDOWN_TIMEOUT = "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS"  # Dynamo's bound on its SIGTERM drain

# Dynamo's discovery (how workers and frontends find each other) and its planes. The kubernetes backend:
# each process writes a DynamoWorkerMetadata object named after its pod (owned by the pod, so POD_UID must be
# the pod's own) and counts a peer only while the peer's pod is ready in an EndpointSlice of a Service
# labelled DISCOVERY_LABELS, in its own namespace. The etcd backend: ETCD_ENDPOINTS.
ENV_DYN_DISCOVERY_BACKEND = "DYN_DISCOVERY_BACKEND"
ENV_DYN_REQUEST_PLANE = "DYN_REQUEST_PLANE"
ENV_DYN_EVENT_PLANE = "DYN_EVENT_PLANE"
ENV_ETCD_ENDPOINTS = "ETCD_ENDPOINTS"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_POD_UID = "POD_UID"
# Of the variables tokenfab sets, those runtime.env may set instead (its value replaces tokenfab's): the
# planes and the backend (e.g. a NATS event plane, or etcd set this way before serving.discovery existed).
OVERRIDABLE_ENV = (ENV_DYN_DISCOVERY_BACKEND, ENV_DYN_REQUEST_PLANE, ENV_DYN_EVENT_PLANE, ENV_ETCD_ENDPOINTS)
DISCOVERY_KUBERNETES = "kubernetes"
DISCOVERY_ETCD = "etcd"
REQUEST_PLANE = "tcp"
EVENT_PLANE = "zmq"
DISCOVERY_LABELS = {
    "nvidia.com/dynamo-discovery-enabled": "true",
    "nvidia.com/dynamo-discovery-backend": DISCOVERY_KUBERNETES,
}
DYNAMO_METADATA_API = "nvidia.com/v1alpha1"
DYNAMO_METADATA_KIND = "DynamoWorkerMetadata"
DYNAMO_METADATA_PLURAL = "dynamoworkermetadatas"

# What TOKENFAB_DISAGGREGATION_MODE says for a worker that is not disaggregated (else: prefill, decode).
MODE_AGGREGATED = "aggregated"

# Worker flags that turn Dynamo's publishers on (both are off by default): KV events feed the KV-aware
# router; metrics are the engine's own (KV-cache utilization, waiting requests) that the autoscaler reads.
PUBLISH_KV_EVENTS_FLAG = "--publish-kv-events"
PUBLISH_METRICS_FLAG = "--publish-metrics"

# Programs: every worker pod runs the launcher, which starts Dynamo's TensorRT-LLM worker.
PYTHON = "python3"
LAUNCHER_MODULE = "tokenfab.launcher"
DYNAMO_WORKER_MODULE = "dynamo.trtllm"
DYNAMO_FRONTEND_MODULE = "dynamo.frontend"

# Ports and paths.
WORKER_METRICS_PORT = 9090  # Dynamo system server: /health and /metrics (DYN_SYSTEM_PORT)
FRONTEND_PORT = 8000  # OpenAI-compatible HTTP API
ENGINE_CONFIG_DIR = "/etc/tokenfab/engine"
ENGINE_CONFIG_FILE = "engine.yaml"
ENGINE_CONFIG_PATH = f"{ENGINE_CONFIG_DIR}/{ENGINE_CONFIG_FILE}"
MODEL_MOUNT = "/models"
# The model cache volume (hf:// sources): Hugging Face's hub cache layout, one per deployment and node when
# spec.model.cache.storageClassName names a node-local class. The launcher downloads into it and gives the
# engine the snapshot's directory, so the engine and Dynamo (tokenizer, config) read only that.
MODEL_CACHE_DIR = "/var/cache/tokenfab/models"
CACHE_DIR = "/home/tokenfab/.cache"  # writable (an emptyDir): the images' HF_HOME and other caches live here
# Compile caches whose defaults lie outside CACHE_DIR and /tmp, so a read-only root would refuse them: moved
# under CACHE_DIR on every worker. Triton ~/.triton/cache (triton knobs.py), the CUDA JIT ~/.nv/ComputeCache,
# DeepGEMM ~/.deep_gemm (its compiler.hpp; bundled in TensorRT-LLM), TensorRT-LLM's DeepGEMM dump
# ~/.tensorrt_llm (compiler.cuh). Inductor (/tmp), FlashInfer, torch extensions and Hugging Face already
# default under ~/.cache or /tmp.
COMPILE_CACHE_ENV = (
    ("TRITON_CACHE_DIR", f"{CACHE_DIR}/triton"),
    ("CUDA_CACHE_PATH", f"{CACHE_DIR}/nv/ComputeCache"),
    ("DG_JIT_CACHE_DIR", f"{CACHE_DIR}/deep_gemm"),
    ("TRTLLM_DG_CACHE_DIR", f"{CACHE_DIR}/tensorrt_llm"),
)
HEALTH_PATH = "/health"  # readiness probe path, on the worker metrics port and the frontend port
METRICS_PATH = "/metrics"

# Multi-node groups run under MPI: rank 0 runs mpirun, which reaches the other ranks' SSH daemons with
# the key of this Secret (type kubernetes.io/ssh-auth, one per namespace, made by the installer); the
# other ranks derive the public key they accept from the same private key.
MPI_SSH_PORT = 2222
MPI_SSH_SECRET = "tokenfab-mpi-ssh"
MPI_SSH_DIR = "/etc/tokenfab/mpi-ssh"
MPI_SSH_PRIVATE_KEY = "ssh-privatekey"

# NVIDIA ComputeDomain (IMEX channels for multi-node NVLink), from NVIDIA's DRA driver.
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_CLAIM = "imex"
RESOURCE_CLAIM_TEMPLATE_API = "resource.k8s.io/v1"
# The driver labels the channel template it makes for a ComputeDomain's workloads (its daemons' templates
# say Daemon): the operator watches these, by this label, to go on with groups parked for their channel.
COMPUTE_DOMAIN_TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
COMPUTE_DOMAIN_TARGET_WORKLOAD = "Workload"
# DRA device taints set by an administrator or a health system (GA in Kubernetes 1.37): read as faults.
DEVICE_TAINT_RULE_API = "resource.k8s.io/v1"

# Worker metrics in Prometheus carry the pod labels above, named as a standard Kubernetes relabelling
# (`labelmap: __meta_kubernetes_pod_label_(.+)`) names them: dots and slashes become underscores.
PROM_LABEL_DEPLOYMENT = "tokenfab_dev_deployment"
PROM_LABEL_ROLE = "tokenfab_dev_role"
PROM_LABEL_GROUP = "tokenfab_dev_group"
