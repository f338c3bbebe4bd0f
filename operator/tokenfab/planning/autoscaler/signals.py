"""What the autoscaler and the drains read from Prometheus, as plain values: the PromQL of each signal
(one sample per group, or one per deployment) and a `Reading`, its samples or the error that prevented
reading them. The reads themselves are tokenfab.adapters.metrics'; a pass reads every query it will need
before it plans, and the plan takes the readings as data.

The series are the ones Dynamo's TensorRT-LLM worker exports on its system port (/metrics) with
--publish-metrics, which tokenfab passes (see tokenfab.adapters.metrics for the labels they are selected by).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenfab.planning import contract
from tokenfab.planning.autoscaler.policy import Sample

KV_METRIC = "dynamo_component_gpu_cache_usage_percent"
QUEUE_METRIC = "trtllm_num_requests_waiting"


def _selector(name: str, namespace: str, deployment: str, role: str) -> str:
    where = f'{contract.PROM_LABEL_DEPLOYMENT}="{deployment}", {contract.PROM_LABEL_ROLE}="{role}"'
    return f'{name}{{namespace="{namespace}", {where}}}'


def kv_query(namespace: str, deployment: str, role: str, override: str | None = None) -> str:
    """PromQL returning one KV-cache utilization sample per group (its busiest rank)."""
    if override:
        return override.format(namespace=namespace, deployment=deployment, role=role)
    return f"max by ({contract.PROM_LABEL_GROUP}) ({_selector(KV_METRIC, namespace, deployment, role)})"


INFLIGHT_METRIC = "dynamo_component_inflight_requests"


def inflight_query(namespace: str, deployment: str) -> str:
    """PromQL returning the requests in flight per group of a deployment (every role), as each group's
    engine counts them at its request plane (prefill engines count too)."""
    return (
        f'sum by ({contract.PROM_LABEL_GROUP}) ({INFLIGHT_METRIC}{{namespace="{namespace}", '
        f'{contract.PROM_LABEL_DEPLOYMENT}="{deployment}", dynamo_endpoint="generate"}})'
    )


FRONTEND_REQUESTS = "dynamo_frontend_requests_started_total"
# requests the frontend finished, by its `status` label (success | error): the benchmarks' second observer
FRONTEND_REQUESTS_TOTAL = "dynamo_frontend_requests_total"
FRONTEND_INPUT_TOKENS = "dynamo_frontend_input_sequence_tokens_sum"
FRONTEND_INFLIGHT = "dynamo_frontend_inflight_requests"


def _frontend(namespace: str, deployment: str) -> str:
    return f'{{namespace="{namespace}", {contract.PROM_LABEL_DEPLOYMENT}="{deployment}"}}'


def arrival_query(namespace: str, deployment: str, window_seconds: int) -> str:
    """PromQL returning the requests/s arriving at a deployment's frontend (every replica), one sample."""
    return f"sum(rate({FRONTEND_REQUESTS}{_frontend(namespace, deployment)}[{window_seconds}s]))"


def frontend_inflight_query(namespace: str, deployment: str) -> str:
    """PromQL returning the requests in flight at a deployment's frontend (every replica; queued, in
    prefill or decoding), one sample: a gauge that rises with the first requests of a burst."""
    return f"sum({FRONTEND_INFLIGHT}{_frontend(namespace, deployment)})"


def fleet_inflight_query() -> str:
    """PromQL returning the requests in flight at every deployment's frontend, one sample per namespace and
    deployment: the burst watch asks it once per scrape for the whole fleet."""
    return f"sum by (namespace, {contract.PROM_LABEL_DEPLOYMENT}) ({FRONTEND_INFLIGHT})"


def input_tokens_query(namespace: str, deployment: str, window_seconds: int) -> str:
    """PromQL returning the input tokens/s arriving at a deployment's frontend, one sample."""
    return f"sum(rate({FRONTEND_INPUT_TOKENS}{_frontend(namespace, deployment)}[{window_seconds}s]))"


def queue_query(namespace: str, deployment: str, role: str) -> str:
    """PromQL returning the waiting requests per group."""
    return f"sum by ({contract.PROM_LABEL_GROUP}) ({_selector(QUEUE_METRIC, namespace, deployment, role)})"


_AGGREGATION = re.compile(r"^\s*(?:max|min|sum|avg|count)\s+by\s*\(([\w\s,]*)\)\s*\((.*)\)\s*$", re.S)


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def freshness_query(query: str) -> str:
    """PromQL for when each series of `query` was scraped. Prometheus stamps the result of an aggregation
    (and of any function) with the evaluation time, not the scrape time, and keeps answering a series for
    5 minutes after its last scrape: `timestamp(max by (g) (x))` is always "now" and a dead engine's last
    value would count as fresh. For an aggregation by labels this asks the oldest scrape among each
    group's series, `min by (g) (timestamp(x))`; anything else (a query from spec.autoscaling.query of
    another shape) falls back to `timestamp(query)`."""
    m = _AGGREGATION.match(query)
    if m and _balanced(m.group(2)):
        return f"min by ({m.group(1).strip()}) (timestamp({m.group(2).strip()}))"
    return f"timestamp({query})"


@dataclass(frozen=True)
class Reading:
    """Per-group samples, or the error that prevented reading them."""

    samples: dict[str, Sample] | None
    error: str = ""
    query: str = ""
