"""Prometheus reads for the autoscaler, through prometheus-api-client.

Per deployment and role, one sample per group: the KV-cache utilization of the group's engine and, for
prefill, the number of waiting requests. The series are the ones Dynamo's TensorRT-LLM worker exports on
its system port (/metrics) with --publish-metrics, which tokenfab passes:
- `dynamo_component_gpu_cache_usage_percent`: KV-cache use as a 0-1 fraction, one series per attention-DP
  rank (label dp_rank), set by every Dynamo engine publisher (trtllm, vllm, sglang) alike; a group's
  sample is its busiest rank;
- `trtllm_num_requests_waiting`: TensorRT-LLM's own queue, summed over the group's ranks.
Worker series are selected by the labels a standard Kubernetes pod relabelling (`labelmap
__meta_kubernetes_pod_label_(.+)`, see charts/tokenfab/prometheus/scrape-config.yaml) gives the tokenfab pod
labels: tokenfab_dev_deployment, tokenfab_dev_role, tokenfab_dev_group. Errors and timeouts come back as a
message, never as an exception into the reconcile.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from tokenfab.planning import contract as c
from tokenfab.planning.autoscaling import Sample

KV_METRIC = "dynamo_component_gpu_cache_usage_percent"
QUEUE_METRIC = "trtllm_num_requests_waiting"


def _selector(name: str, namespace: str, deployment: str, role: str) -> str:
    where = f'{c.PROM_LABEL_DEPLOYMENT}="{deployment}", {c.PROM_LABEL_ROLE}="{role}"'
    return f'{name}{{namespace="{namespace}", {where}}}'


def kv_query(namespace: str, deployment: str, role: str, override: str | None = None) -> str:
    """PromQL returning one KV-cache utilization sample per group (its busiest rank)."""
    if override:
        return override.format(namespace=namespace, deployment=deployment, role=role)
    return f"max by ({c.PROM_LABEL_GROUP}) ({_selector(KV_METRIC, namespace, deployment, role)})"


INFLIGHT_METRIC = "dynamo_component_inflight_requests"


def inflight_query(namespace: str, deployment: str) -> str:
    """PromQL returning the requests in flight per group of a deployment (every role), as each group's
    engine counts them at its request plane (prefill engines count too)."""
    return (
        f'sum by ({c.PROM_LABEL_GROUP}) ({INFLIGHT_METRIC}{{namespace="{namespace}", '
        f'{c.PROM_LABEL_DEPLOYMENT}="{deployment}", dynamo_endpoint="generate"}})'
    )


FRONTEND_REQUESTS = "dynamo_frontend_requests_started_total"
FRONTEND_INPUT_TOKENS = "dynamo_frontend_input_sequence_tokens_sum"
FRONTEND_INFLIGHT = "dynamo_frontend_inflight_requests"


def _frontend(namespace: str, deployment: str) -> str:
    return f'{{namespace="{namespace}", {c.PROM_LABEL_DEPLOYMENT}="{deployment}"}}'


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
    return f"sum by (namespace, {c.PROM_LABEL_DEPLOYMENT}) ({FRONTEND_INFLIGHT})"


def input_tokens_query(namespace: str, deployment: str, window_seconds: int) -> str:
    """PromQL returning the input tokens/s arriving at a deployment's frontend, one sample."""
    return f"sum(rate({FRONTEND_INPUT_TOKENS}{_frontend(namespace, deployment)}[{window_seconds}s]))"


def queue_query(namespace: str, deployment: str, role: str) -> str:
    """PromQL returning the waiting requests per group."""
    return f"sum by ({c.PROM_LABEL_GROUP}) ({_selector(QUEUE_METRIC, namespace, deployment, role)})"


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


def _connect(url: str, timeout: float) -> PrometheusConnect:
    """A client making one bounded attempt per query (the library retries 3 times by default); an
    https:// Prometheus must show a certificate the system trusts."""
    return PrometheusConnect(
        url=url, disable_ssl=False, timeout=int(max(1, timeout)), retry=Retry(total=0, raise_on_status=False)
    )


def read(url: str, query: str, timeout: float = 5.0, now: float | None = None) -> Reading:
    """Run `query` and its freshness twin; a sample's age is now minus its scrape time."""
    now = time.time() if now is None else now
    try:
        # One bounded attempt per query (the client retries 3 times by default): a slow Prometheus costs a
        # pass at most `timeout` seconds per query, and the next pass asks again.
        prom = _connect(url, timeout)
        values = prom.custom_query(query)
        stamps = prom.custom_query(freshness_query(query))
    except Exception as exc:  # connection refused, timeout, bad query: all mean "no data"
        return Reading(None, f"{type(exc).__name__}: {str(exc)[:200]}", query)
    ages: dict[str, float] = {}
    for row in stamps:
        group = row.get("metric", {}).get(c.PROM_LABEL_GROUP, "")
        ages[group] = max(0.0, now - float(row["value"][1]))
    samples = {}
    for row in values:
        group = row.get("metric", {}).get(c.PROM_LABEL_GROUP, "")
        try:
            value = float(row["value"][1])
        except (KeyError, ValueError, IndexError):
            continue
        if value == value:  # not NaN
            samples[group] = Sample(value=value, age_seconds=ages.get(group, 0.0))
    return Reading(samples, "", query)


def read_by_deployment(
    url: str, query: str, timeout: float = 2.0
) -> tuple[dict[tuple[str, str], float] | None, str]:
    """Run `query` (one sample per namespace and deployment label): ({(namespace, deployment): value}, "")
    or (None, why). One bounded attempt; values that are not numbers are left out."""
    try:
        rows = _connect(url, timeout).custom_query(query)
    except Exception as exc:  # connection refused, timeout, bad query: no reading this time
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    out: dict[tuple[str, str], float] = {}
    for row in rows:
        try:
            labels = row.get("metric", {})
            value = float(row["value"][1])
        except (AttributeError, KeyError, ValueError, IndexError, TypeError):
            continue
        if not isinstance(labels, dict):
            continue
        if value == value:
            out[(labels.get("namespace", ""), labels.get(c.PROM_LABEL_DEPLOYMENT, ""))] = value
    return out, ""
