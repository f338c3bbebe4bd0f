"""Prometheus reads for the autoscaler, through prometheus-api-client.

Per deployment and role, one sample per group: the KV-cache utilization of the group's engine (Dynamo /
TensorRT-LLM worker metrics `trtllm:kv_cache_usage_perc`, or `vllm:kv_cache_usage_perc` from engines that
use that prefix) and, for prefill, the number of waiting requests. Worker series are selected by the
labels a standard Kubernetes pod relabelling (`labelmap __meta_kubernetes_pod_label_(.+)`) gives the
tokenfab pod labels: tokenfab_dev_deployment, tokenfab_dev_role, tokenfab_dev_group. Errors and timeouts
come back as a message, never as an exception into the reconcile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_api_client import PrometheusConnect

from tokenfab.planning import contract as c
from tokenfab.planning.autoscaling import Sample

KV_METRICS = ("trtllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")
QUEUE_METRICS = ("trtllm:num_requests_waiting", "vllm:num_requests_waiting")


def _selector(names: tuple[str, ...], namespace: str, deployment: str, role: str) -> str:
    return (
        f'{{__name__=~"{"|".join(names)}", namespace="{namespace}", '
        f'{c.PROM_LABEL_DEPLOYMENT}="{deployment}", {c.PROM_LABEL_ROLE}="{role}"}}'
    )


def kv_query(namespace: str, deployment: str, role: str, override: str | None = None) -> str:
    """PromQL returning one KV-cache utilization sample per group (its busiest rank)."""
    if override:
        return override.format(namespace=namespace, deployment=deployment, role=role)
    return f"max by ({c.PROM_LABEL_GROUP}) ({_selector(KV_METRICS, namespace, deployment, role)})"


def queue_query(namespace: str, deployment: str, role: str) -> str:
    """PromQL returning the waiting requests per group."""
    return f"sum by ({c.PROM_LABEL_GROUP}) ({_selector(QUEUE_METRICS, namespace, deployment, role)})"


@dataclass(frozen=True)
class Reading:
    """Per-group samples, or the error that prevented reading them."""

    samples: dict[str, Sample] | None
    error: str = ""
    query: str = ""


def read(url: str, query: str, timeout: float = 5.0, now: float | None = None) -> Reading:
    """Run `query` and its `timestamp()` twin; a sample's age is now minus its scrape time."""
    now = time.time() if now is None else now
    try:
        prom = PrometheusConnect(url=url, disable_ssl=True, timeout=int(max(1, timeout)))
        values = prom.custom_query(query)
        stamps = prom.custom_query(f"timestamp({query})")
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
