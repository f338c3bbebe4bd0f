"""The operator's own Prometheus metrics (served by `tokenfab operator --metrics-port`).

Names are prefixed `tokenfab_`; labels stay low-cardinality (namespace, deployment, role, result).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "tokenfab_reconciles_total",
    "Reconcile passes of a ModelDeployment.",
    ["namespace", "deployment", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "tokenfab_reconcile_duration_seconds",
    "Duration of one reconcile pass: observing, planning and handing its writes to the writer (a pass "
    "that wrote nothing includes its status write).",
    ["namespace", "deployment"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
WRITES_SECONDS = Histogram(
    "tokenfab_pass_writes_duration_seconds",
    "From a pass handing its writes to the writer until the pass is complete: the API server's answers, "
    "the gates lifted, the status written.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
GROUPS_DESIRED = Gauge(
    "tokenfab_groups_desired",
    "Worker groups wanted per role.",
    ["namespace", "deployment", "role"],
    registry=REGISTRY,
)
GROUPS_READY = Gauge(
    "tokenfab_groups_ready",
    "Worker groups ready per role.",
    ["namespace", "deployment", "role"],
    registry=REGISTRY,
)
GROUP_GPUS = Gauge(
    "tokenfab_group_gpus",
    "GPUs of one group of a role.",
    ["namespace", "deployment", "role"],
    registry=REGISTRY,
)
PLACEMENT_FAILURES = Counter(
    "tokenfab_placement_failures_total",
    "Groups that fit in no NVLink domain when the operator wanted them.",
    ["namespace", "deployment", "role"],
    registry=REGISTRY,
)
GROUPS_RECREATED = Counter(
    "tokenfab_groups_recreated_total",
    "Groups deleted because a pod failed, vanished or lost its node.",
    ["namespace", "deployment", "role"],
    registry=REGISTRY,
)
SCALING_DECISIONS = Counter(
    "tokenfab_autoscaling_decisions_total",
    "Autoscaling decisions by direction.",
    ["namespace", "deployment", "role", "direction"],
    registry=REGISTRY,
)
AUTOSCALER_SIGNAL = Gauge(
    "tokenfab_autoscaler_signal",
    "Signal the autoscaler last read (KV-cache utilization or queue depth).",
    ["namespace", "deployment", "role", "metric"],
    registry=REGISTRY,
)
AUTOSCALER_TARGET = Gauge(
    "tokenfab_autoscaler_target",
    "Target the autoscaler holds the signal to.",
    ["namespace", "deployment", "role", "metric"],
    registry=REGISTRY,
)
DOMAIN_GPUS = Gauge(
    "tokenfab_domain_gpus", "Allocatable GPUs per NVLink domain.", ["domain"], registry=REGISTRY
)
DOMAIN_FREE_GPUS = Gauge(
    "tokenfab_domain_free_gpus", "Free GPUs per NVLink domain.", ["domain"], registry=REGISTRY
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose the metrics on http://addr:port/metrics (a daemon thread)."""
    start_http_server(port, addr=addr, registry=REGISTRY)


API_REQUESTS = Counter(
    "tokenfab_api_requests_total",
    "Requests to the Kubernetes API server by verb, resource and HTTP status (0: no answer).",
    ["verb", "resource", "code"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "tokenfab_reconcile_errors_total",
    "Reconcile passes that failed, by reason (the API server's, or the operator's).",
    ["namespace", "deployment", "reason"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "tokenfab_workqueue_depth", "Deployments waiting for a reconcile pass.", registry=REGISTRY
)
LEDGER_RESERVED_PODS = Gauge(
    "tokenfab_ledger_reserved_pods",
    "Pods the placement ledger has promised capacity to that the watch has not seen yet.",
    registry=REGISTRY,
)
PARKED_GROUPS = Counter(
    "tokenfab_parked_groups_total",
    "New groups a pass parked instead of writing, by what they wait for (channel: their ComputeDomain's "
    "IMEX channel template; identity: their pods' ServiceAccount and Role). A watch wakes the deployment.",
    ["on"],
    registry=REGISTRY,
)
IS_LEADER = Gauge(
    "tokenfab_leader", "1 while this operator replica holds the leader Lease (and writes).", registry=REGISTRY
)
