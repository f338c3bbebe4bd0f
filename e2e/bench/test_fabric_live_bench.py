"""The live fabric benchmark's own arithmetic (its live run is e2e/test_fleet.py's pairing test, short)."""

from __future__ import annotations

from e2e.bench import fabric_live_bench as bench


def test_the_random_pairing_baseline_is_the_share_of_decode_workers_in_the_prefill_workers_domain():
    pods = {1: "p0", 2: "d0", 3: "d1", 4: "p1", 5: "d2"}
    domain = {"p0": "r0", "d0": "r0", "d1": "r1", "p1": "r1", "d2": "r1"}
    client = {"a": (1, 2), "b": (4, 3), "c": (4, 5), "d": (1, 2)}
    # p0 (r0): 1 of 3 decode workers in r0; p1 (r1): 2 of 3 in r1
    assert bench.random_share(client, pods, domain) == round((1 / 3 + 2 / 3 + 2 / 3 + 1 / 3) / 4, 4)
    assert bench.random_share({}, pods, domain) == 0.0


def test_the_table_shows_every_count_and_both_shares():
    run = {
        "requests": {"intended": 10, "sent": 10, "completed": 9, "failed": 1, "never_sent": 0},
        "kv_transfers": {"transfers": 9, "in_unit": 9, "in_domain_share": 1.0, "observers_agree": True},
        "random_pairing_in_domain_share": 0.5,
        "ttft_ms": {"p50": 140.6, "p99": 241.0},
        "units": [{"unit": 0, "domains": ["r0"], "path": "nvlink"}],
    }
    run["while_a_decode_group_is_lost"] = {
        "lost": "m-decode-0-0",
        "requests": {"intended": 4, "sent": 4, "completed": 4, "failed": 0, "never_sent": 0},
        "kv_transfers": {"transfers": 4, "in_unit": 2, "observers_agree": True},
    }
    line, lost = bench.table([run]).splitlines()[1:]
    assert "while m-decode-0-0 is lost: 4/4/4/0 intended/sent/completed/failed, 2/4 in their unit" in lost
    assert "10/10/9/1" in line
    assert "9/9" in line
    assert "100.0%" in line
    assert "50.0%" in line
    assert "agree" in line
    assert "0:r0:nvlink" in line
    assert bench.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
