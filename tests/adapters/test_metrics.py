"""A sample's age comes from its scrape time, checked with Prometheus' own PromQL engine (promtool, which
the test command installs with Prometheus): the freshness twin of each per-group query the autoscaler and
the drain ask gives when each group's series were last scraped, where `timestamp(<aggregation>)` gives
the evaluation time and would make a dead engine's last value look fresh for 5 minutes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tokenfab.adapters import metrics
from tokenfab.planning import contract

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool comes with Prometheus (e2e/test.sh)")

QUERIES = {
    "kv": (
        metrics.kv_query("ns", "llama", "decode"),
        metrics.KV_METRIC,
        {contract.PROM_LABEL_ROLE: "decode"},
    ),
    "queue": (
        metrics.queue_query("ns", "llama", "prefill"),
        metrics.QUEUE_METRIC,
        {contract.PROM_LABEL_ROLE: "prefill"},
    ),
    "inflight": (
        metrics.inflight_query("ns", "llama"),
        metrics.INFLIGHT_METRIC,
        {"dynamo_endpoint": "generate"},
    ),
}


def _series(name: str, extra: dict[str, str], group: str, rank: int) -> str:
    labels = {
        "__name__": name,
        "namespace": "ns",
        contract.PROM_LABEL_DEPLOYMENT: "llama",
        contract.PROM_LABEL_GROUP: group,
        "rank": str(rank),
        **extra,
    }
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _promtool(
    tmp_path: Path, expr: str, name: str, extra: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Group "live" is scraped every minute up to 3m; group "dead" lost one rank's scrapes after 1m (its
    other rank goes on): at 3m its oldest series was scraped at 60 s, the live one's at 180 s."""
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _series(name, extra, "live", 0), "values": "0.5 0.5 0.5 0.5"},
                    {"series": _series(name, extra, "dead", 0), "values": "0.5 0.5 _ _"},
                    {"series": _series(name, extra, "dead", 1), "values": "0.5 0.5 0.5 0.5"},
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "3m",
                        "exp_samples": [
                            {"labels": "{" + f'{contract.PROM_LABEL_GROUP}="live"' + "}", "value": 180},
                            {"labels": "{" + f'{contract.PROM_LABEL_GROUP}="dead"' + "}", "value": 60},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "freshness.yml"
    path.write_text(yaml.safe_dump(doc))
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


@needs_promtool
@pytest.mark.parametrize("which", sorted(QUERIES))
def test_freshness_twin_gives_the_oldest_scrape_of_each_group(tmp_path: Path, which: str) -> None:
    query, name, extra = QUERIES[which]
    out = _promtool(tmp_path, metrics.freshness_query(query), name, extra)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_timestamp_of_an_aggregation_is_the_evaluation_time(tmp_path: Path) -> None:
    """Why the twin is not `timestamp(query)`: Prometheus answers 180 s for both groups."""
    query, name, extra = QUERIES["kv"]
    out = _promtool(tmp_path, f"timestamp({query})", name, extra)
    assert out.returncode != 0
    assert 'got: {tokenfab_dev_group="dead"} 1.8E+02' in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("query", "twin"),
    [
        ("max by (group) (kv)", "min by (group) (timestamp(kv))"),
        ("sum by (a, b) (x{y='(z)'})", "min by (a, b) (timestamp(x{y='(z)'}))"),
        # not one aggregation of a selector: the plain twin (no age, but never a broken query)
        ("sum by (g) (a) / sum by (g) (b)", "timestamp(sum by (g) (a) / sum by (g) (b))"),
        ("kv", "timestamp(kv)"),
        ("max by (g) (rate(x[1m]))", "min by (g) (timestamp(rate(x[1m])))"),
    ],
)
def test_freshness_query_shapes(query: str, twin: str) -> None:
    assert metrics.freshness_query(query) == twin


def test_read_asks_the_twin_and_ages_samples_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    class Prom:
        def __init__(self, **_: object) -> None:
            pass

        def custom_query(self, q: str) -> list[dict[str, object]]:
            asked.append(q)
            value = "1000" if "timestamp" in q else "0.7"
            return [{"metric": {contract.PROM_LABEL_GROUP: "g0"}, "value": [1100, value]}]

    monkeypatch.setattr(metrics, "PrometheusConnect", Prom)
    query = metrics.kv_query("ns", "llama", "decode")
    reading = metrics.read("http://127.0.0.1:9", query, now=1100.0)
    assert asked == [query, metrics.freshness_query(query)]
    assert reading.samples is not None
    assert reading.samples["g0"].age_seconds == 100.0
