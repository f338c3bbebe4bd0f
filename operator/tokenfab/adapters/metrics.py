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

import time
from collections.abc import Callable

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from tokenfab.planning import contract
from tokenfab.planning.autoscaler.policy import Sample
from tokenfab.planning.autoscaler.signals import (
    FRONTEND_INFLIGHT as FRONTEND_INFLIGHT,
)
from tokenfab.planning.autoscaler.signals import (
    FRONTEND_INPUT_TOKENS as FRONTEND_INPUT_TOKENS,
)
from tokenfab.planning.autoscaler.signals import (
    FRONTEND_REQUESTS as FRONTEND_REQUESTS,
)
from tokenfab.planning.autoscaler.signals import (
    FRONTEND_REQUESTS_TOTAL as FRONTEND_REQUESTS_TOTAL,
)
from tokenfab.planning.autoscaler.signals import (
    INFLIGHT_METRIC as INFLIGHT_METRIC,
)
from tokenfab.planning.autoscaler.signals import (
    KV_METRIC as KV_METRIC,
)
from tokenfab.planning.autoscaler.signals import (
    QUEUE_METRIC as QUEUE_METRIC,
)
from tokenfab.planning.autoscaler.signals import (
    Reading as Reading,
)
from tokenfab.planning.autoscaler.signals import (
    arrival_query as arrival_query,
)
from tokenfab.planning.autoscaler.signals import (
    fleet_inflight_query as fleet_inflight_query,
)
from tokenfab.planning.autoscaler.signals import (
    freshness_query as freshness_query,
)
from tokenfab.planning.autoscaler.signals import (
    frontend_inflight_query as frontend_inflight_query,
)
from tokenfab.planning.autoscaler.signals import (
    inflight_query as inflight_query,
)
from tokenfab.planning.autoscaler.signals import (
    input_tokens_query as input_tokens_query,
)
from tokenfab.planning.autoscaler.signals import (
    kv_query as kv_query,
)
from tokenfab.planning.autoscaler.signals import (
    queue_query as queue_query,
)


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
        group = row.get("metric", {}).get(contract.PROM_LABEL_GROUP, "")
        ages[group] = max(0.0, now - float(row["value"][1]))
    samples = {}
    for row in values:
        group = row.get("metric", {}).get(contract.PROM_LABEL_GROUP, "")
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
            out[(labels.get("namespace", ""), labels.get(contract.PROM_LABEL_DEPLOYMENT, ""))] = value
    return out, ""


Reader = Callable[[str, str], Reading]  # (Prometheus URL, query) -> its reading


# A read that failed with one of these (the error text starts with the exception's name) could not
# reach Prometheus at all: the pass's other reads would wait out the same connect timeout, one after the
# other. (A read that timed out waiting for an answer may be one heavy query: the others are still asked.)
UNREACHABLE = ("ConnectionError", "ConnectTimeout", "NewConnectionError", "MaxRetryError")


def one_timeout_per_pass(reader: Reader) -> Reader:
    """`reader`, except that once a read finds Prometheus unreachable, the pass's remaining reads fail at
    once with the same words: an unreachable Prometheus costs a pass one connect timeout, not one per query
    (six for an autoscaled disaggregated deployment with a frontend), and the passes of other deployments
    are not held up behind it."""
    down: list[str] = []

    def read(url: str, query: str) -> Reading:
        if down:
            return Reading(None, down[0], query)
        reading = reader(url, query)
        if reading.samples is None and reading.error.startswith(UNREACHABLE):
            down.append(reading.error)
        return reading

    return read
