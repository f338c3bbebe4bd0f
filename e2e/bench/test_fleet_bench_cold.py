"""The factory's modeled weight loading (e2e/fleet/weights_model.py) and how the cold-start benchmark
reads it (e2e/fleet/scenario.weights_paths, e2e/bench/fleet_bench_cold.goals)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.bench import fleet_bench_cold
from e2e.fleet import scenario, weights_model

pytestmark = pytest.mark.unit  # (beside the code it tests; needs no factory)

COLD = 60.0
WARM = COLD * 70 / 533


def test_warm_takes_the_published_share_of_the_hub_path():
    assert weights_model.warm_seconds(COLD) == pytest.approx(7.88, abs=0.01)
    assert (
        weights_model.PUBLISHED_S["hf"] > weights_model.PUBLISHED_S["s3"] > weights_model.PUBLISHED_S["nvme"]
    )


def test_an_emptydir_is_cold_every_time():
    m = weights_model.CacheModel(COLD)
    assert m.hold(None, 0.0) == ("cold", COLD)
    assert m.hold(None, 500.0) == ("cold", COLD)


def test_a_claim_is_cold_once_then_fetching_then_warm():
    m = weights_model.CacheModel(COLD)
    assert m.hold("uid-a:hf://m@main", 100.0) == ("cold", COLD)
    # a second engine on the same claim while the download runs waits for it, then loads from disk
    path, hold = m.hold("uid-a:hf://m@main", 110.0)
    assert path == "fetching"
    assert hold == pytest.approx(COLD - WARM - 10 + WARM)
    # once the download is done (the load from disk is each engine's own), every engine starts warm
    assert m.hold("uid-a:hf://m@main", 100.0 + COLD - WARM) == ("warm", pytest.approx(WARM))
    assert m.hold("uid-a:hf://m@main", 1000.0) == ("warm", pytest.approx(WARM))


def test_a_fetch_pod_downloads_once_and_an_engine_after_it_starts_warm():
    m = weights_model.CacheModel(COLD)
    assert m.download("uid-a:hf://m@main", 0.0) == pytest.approx(COLD - WARM)
    assert m.download("uid-a:hf://m@main", 20.0) == pytest.approx(COLD - WARM - 20)  # (the same download)
    assert m.hold("uid-a:hf://m@main", 10.0)[0] == "fetching"
    assert m.hold("uid-a:hf://m@main", COLD) == ("warm", pytest.approx(WARM))
    assert m.download("uid-a:hf://m@main", COLD) == 0.0
    assert m.download(None, 0.0) == pytest.approx(COLD - WARM)
    # a fetch pod deleted before its download ended leaves nothing behind; one that ended, its weights
    m.download("uid-b:hf://m@main", 0.0)
    m.abandon("uid-b:hf://m@main", 10.0)
    assert m.hold("uid-b:hf://m@main", 11.0)[0] == "cold"
    m.abandon("uid-a:hf://m@main", COLD)
    assert m.hold("uid-a:hf://m@main", COLD)[0] == "warm"


def test_another_claim_or_revision_is_its_own_cache():
    m = weights_model.CacheModel(COLD)
    m.hold("uid-a:hf://m@main", 0.0)
    assert m.hold("uid-b:hf://m@main", 500.0)[0] == "cold"  # another node (or a recreated claim)
    assert m.hold("uid-a:hf://m@abc123", 500.0)[0] == "cold"  # another revision


def _history(key: str, started_at: float, path: str | None, kind: str = "mocker") -> dict[str, Any]:
    h: dict[str, Any] = {
        "key": key,
        "kind": kind,
        "started_at": started_at,
        "labels": {"tokenfab_dev_role": "decode"},
    }
    if path:
        hold = 7.9 if path == "warm" else 60.0
        h["weights"] = {"path": path, "hold_s": hold}
        # created 2 s before its hold began; healthy 1 s after its process started
        h["created_at"], h["healthy_at"] = started_at - hold - 2.0, started_at + 1.0
    return h


def test_weights_paths_counts_the_namespaces_engines_started_during_the_trace():
    state = {
        "history": [
            _history("ns/a-0", 90.0, "cold"),  # before the trace: its first group
            _history("ns/b-0", 130.0, "warm"),
            _history("ns/c-0", 140.0, "cold"),
            _history("other/d-0", 140.0, "warm"),  # another policy's namespace
            _history("ns/fe", 140.0, None, kind="frontend"),
        ]
    }
    state["fetches"] = [
        {"key": "ns/tiny-model-1-fetch", "completed_at": 95.0},
        {"key": "ns/tiny-model-1-fetch", "completed_at": 40.0},  # (an earlier run in the namespace)
        {"key": "other/tiny-model-2-fetch", "completed_at": 95.0},
    ]
    got = scenario.weights_paths(state, "ns", 100.0, applied=80.0)
    assert got["counts"] == {"warm": 1, "fetching": 0, "cold": 1}
    assert got["fetch_pods_completed"] == 1
    assert [(e["t"], e["role"], e["path"], e["start_s"]) for e in got["engines"]] == [
        (30.0, "decode", "warm", 10.9),
        (40.0, "decode", "cold", 63.0),
    ]


def test_an_engine_that_never_served_has_no_start_time():
    h = _history("ns/b-0", 130.0, "warm")
    h["healthy_at"] = None
    (engine,) = scenario.weights_paths({"history": [h]}, "ns", 100.0)["engines"]
    assert engine["start_s"] is None
    assert fleet_bench_cold.group_starts({"weights_paths": {"engines": [engine]}}) == {}


def _policy(
    goodput: float,
    rises: list[float | None],
    vs_static: float = 0.7,
    starts: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    engines = [{"path": path, "start_s": s} for path, v in (starts or {}).items() for s in v]
    return {
        "slo": {"goodput_fraction": goodput},
        "first_serve_per_rise_s": rises,
        "gpu_minutes_vs_static": vs_static,
        "weights_paths": {"engines": engines},
    }


def test_goals_compare_tokenfab_with_the_oracle_and_with_no_cache():
    traces = {
        "repeated_burst": {
            "tokenfab": _policy(
                0.93, [60.0, 12.0, 10.0], starts={"warm": [11.0, 12.0, 30.0], "fetching": [40.0]}
            ),
            "tokenfab_nocache": _policy(0.70, [62.0, 61.0, 63.0], starts={"cold": [64.0, 66.0]}),
            "oracle": _policy(0.96, [61.0, 9.0, 9.0], 0.8),
            "static": _policy(0.99, [], 1.0),
        }
    }
    g = fleet_bench_cold.goals(traces)["repeated_burst"]
    assert g["goodput_points_below_oracle"] == 3.0
    assert g["gpu_minutes_vs_static"] == 0.7
    assert g["first_serve_s"] == {"tokenfab": 12.0, "tokenfab_nocache": 62.0}
    assert g["first_serve_vs_nocache"] == pytest.approx(0.19)
    # a new group's own start: medians per path, warm with the cache against cold without
    assert g["group_start_s"] == {
        "tokenfab": {"fetching": 40.0, "warm": 12.0},
        "tokenfab_nocache": {"cold": 65.0},
    }
    assert g["warm_group_start_vs_cold"] == pytest.approx(0.18)


def test_goals_say_none_where_a_policy_is_missing():
    g = fleet_bench_cold.goals({"ramp": {"tokenfab": _policy(0.9, [None])}})["ramp"]
    assert g["goodput_points_below_oracle"] is None
    assert g["first_serve_vs_nocache"] is None
    assert g["warm_group_start_vs_cold"] is None
