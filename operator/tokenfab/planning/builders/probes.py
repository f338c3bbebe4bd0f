"""When a worker or frontend pod is ready, and how a worker leaves: readiness probes, the routable
readiness gate of a group's leader, the preStop pause and the termination grace period that covers a
drain."""

from __future__ import annotations

from typing import Any

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import contract

# Seconds a terminating worker waits before its engine hears SIGTERM (endpoint removal propagates).
PRESTOP_SECONDS = 5


def worker_readiness_probe() -> dict[str, Any]:
    """Ready while the Dynamo worker's health endpoint answers (its engine generates)."""
    return {
        "httpGet": {"path": contract.HEALTH_PATH, "port": "metrics"},
        "periodSeconds": 10,
        "failureThreshold": 3,
    }


# How long a worker may take to start once its weights are on its node (downloads happen before, in the
# pod's weights init container, with no time limit): 1200 s unless serving.startupSeconds says otherwise.
# Sized from a DeepSeek-class cold start (ai-dynamo/modelexpress docs/BENCHMARKS.md, DeepSeek-V4-Pro TP8 on
# B200: weights from local NVMe in 1m10s, the API ready 8m01s after a cold start, kernel compilation and
# graph capture included): 8 minutes with a 2.5x margin, the same for every model unless its spec says.
ENGINE_START_SECONDS = 1200
STARTUP_PERIOD_SECONDS = 5  # a group is seen started at most 5 s after its engine answers


def startup_budget(spec: ModelDeploymentSpec, nodes: int) -> int:
    """Seconds a worker pod of a group of `nodes` pods may take from its container's start to its first
    healthy answer: serving.startupSeconds (or ENGINE_START_SECONDS), plus, for a multi-node group, the
    launcher's wait for the group's other pods (TOKENFAB_PEER_WAIT_SECONDS from runtime.env, else its
    default): the leader waits for them inside its own budget, and their weights download may end later."""
    engine = spec.serving.startup_seconds or ENGINE_START_SECONDS
    if nodes <= 1:
        return engine
    peers = contract.DEFAULT_PEER_WAIT_SECONDS
    for e in spec.runtime.env:
        if e.name == contract.ENV_PEER_WAIT_SECONDS and e.value is not None and e.value.strip().isdigit():
            peers = int(e.value)
    return engine + peers


def worker_startup_probe(budget: int) -> dict[str, Any]:
    """Started once the worker's health endpoint first answers: from then on a failing readiness probe
    means the engine stopped serving (tokenfab.planning.lifecycle counts it as a fault of the group once it
    lasts), not that it is still loading. Without it the kubelet says `started` as soon as the container
    runs, and a loading worker could not be told from a hung one. `budget` (startup_budget) seconds after
    the container started (its weights already local) the kubelet stops it: its pod fails (restartPolicy
    Never) and its group is replaced, the status saying it ran past its budget (tokenfab.fleet.facts)."""
    return {
        "httpGet": {"path": contract.HEALTH_PATH, "port": "metrics"},
        "periodSeconds": STARTUP_PERIOD_SECONDS,
        "failureThreshold": -(-budget // STARTUP_PERIOD_SECONDS),
    }


def worker_lifecycle() -> dict[str, Any]:
    return {
        # Let the endpoint's removal reach the routers before the engine hears SIGTERM.
        "preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}
    }


def termination_grace_seconds(drain: int) -> int:
    """Dynamo drains on SIGTERM: the grace period covers drainSeconds, so an eviction drains too
    (drainSeconds 0: Kubernetes' default 30 s)."""
    return drain + PRESTOP_SECONDS + 25 if drain else 30


def readiness_gates(rank: int, drain: int) -> dict[str, Any]:
    """The pod-spec field that lets the operator take a group out of routing before removing it (its
    leader, when groups drain): the operator turns the condition False to stop new requests (a router
    following endpoint readiness sends it nothing new), and True when it may serve."""
    if rank == 0 and drain > 0:
        return {"readinessGates": [{"conditionType": contract.ROUTABLE_CONDITION}]}
    return {}


def frontend_readiness_probe() -> dict[str, Any]:
    return {
        "httpGet": {"path": contract.HEALTH_PATH, "port": "http"},
        "periodSeconds": 10,
    }
