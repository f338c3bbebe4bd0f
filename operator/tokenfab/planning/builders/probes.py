"""When a worker or frontend pod is ready, and how a worker leaves: readiness probes, the routable
readiness gate of a group's leader, the preStop pause and the termination grace period that covers a
drain."""

from __future__ import annotations

from typing import Any

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


# A worker may load its weights for this long before the kubelet gives up on it (its pod fails, and the
# group is replaced): 1440 probes 5 s apart, 2 hours (a DeepSeek-R1 download from a hub takes minutes to
# tens of minutes). 5 s apart: a group is seen started at most 5 s after its engine answers.
STARTUP_PROBES = 1440


def worker_startup_probe() -> dict[str, Any]:
    """Started once the worker's health endpoint first answers: from then on a failing readiness probe
    means the engine stopped serving (tokenfab.planning.lifecycle counts it as a fault of the group once it
    lasts), not that it is still loading. Without it the kubelet says `started` as soon as the container
    runs, and a loading worker could not be told from a hung one."""
    return {
        "httpGet": {"path": contract.HEALTH_PATH, "port": "metrics"},
        "periodSeconds": 5,
        "failureThreshold": STARTUP_PROBES,
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
