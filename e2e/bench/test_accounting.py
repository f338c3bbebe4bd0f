"""How the benchmarks count requests and where they write (e2e/fleet/load.py, e2e/record.py): every
request a trace intended is completed, failed or never sent, goodput divides by what was intended, and
a result file names the command and commit that made it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e import record
from e2e.fleet import load

pytestmark = pytest.mark.unit  # (beside the code it tests; needs no factory)

OSL = 100


def req(tokens: int = OSL, error: str = "", ttft: float | None = 100.0) -> load.Request:
    return load.Request(
        start=0.0, ttft_ms=ttft, itl_ms=20.0, latency_ms=2000.0, output_tokens=tokens, error=error
    )


def test_a_trace_intends_the_integral_of_its_rate():
    assert load.intended(load.steady(0.5, 150)) == 75
    assert load.intended([load.Point(0, 0.0), load.Point(100, 2.0), load.Point(200, 2.0)]) == 300


def test_every_intended_request_is_completed_failed_or_never_sent():
    records = [req(), req(), req(tokens=40), req(error="500")]  # 2 complete, 1 cut short, 1 error
    # The server counted 6 started: 2 more were sent and never came back (pending when the client stopped).
    q = load.account(records, intended_n=10, sent=6, osl=OSL)
    assert q == {"intended": 10, "sent": 6, "completed": 2, "failed": 4, "never_sent": 4, "recorded": 4}
    assert q["intended"] == q["completed"] + q["failed"] + q["never_sent"]
    # Without the server's counter, what was recorded was sent.
    assert load.account(records, 10, None, OSL)["never_sent"] == 6
    # A client that sent more than the rounded integral: intended grows to what was sent.
    assert load.account(records, 3, None, OSL)["intended"] == 4


def test_goodput_divides_by_what_was_intended_not_what_was_recorded():
    records = [req(), req(), req(ttft=5000.0)]  # one too slow to be good
    q = load.account(records, intended_n=8, sent=4, osl=OSL)
    g = load.goodput(records, load.Slo(), q, OSL)
    assert (g["good"], g["requests"], g["goodput_fraction"]) == (2, 8, 0.25)


def test_goodput_keeps_what_the_failed_requests_were_told():
    records = [req(), req(error="502 Bad Gateway"), req(error="502 Bad Gateway"), req(error="reset")]
    q = load.account(records, intended_n=4, sent=4, osl=OSL)
    g = load.goodput(records, load.Slo(), q, OSL)
    assert g["errors"] == 3
    assert g["error_texts"] == [{"text": "502 Bad Gateway", "count": 2}, {"text": "reset", "count": 1}]


def test_a_result_names_its_command_and_commit_and_keeps_a_copy_of_its_own(tmp_path: Path):
    path = record.save("thing", {"figure": 1}, tmp_path, "e2e.bench.thing", ["--fast"], 1_700_000_000.0)
    doc = json.loads(path.read_text())
    assert path == tmp_path / "thing.json"
    assert doc["figure"] == 1
    run = doc["run"]
    assert run["command"] == "python -m e2e.bench.thing --fast"
    assert run["started"] == "2023-11-14T22:13:20Z"
    assert run["commit"] is None or len(run["commit"]) == 40
    (copy,) = (tmp_path / "history").iterdir()
    assert copy.name == f"thing-20231114T221320Z-{(run['commit'] or 'nocommit')[:7]}.json"
    assert json.loads(copy.read_text()) == doc
    # A later run replaces the latest, never an earlier run's copy.
    record.save("thing", {"figure": 2}, tmp_path, "e2e.bench.thing", [], 1_700_000_100.0)
    assert json.loads(path.read_text())["figure"] == 2
    assert len(list((tmp_path / "history").iterdir())) == 2
    with pytest.raises(AssertionError):
        record.save("thing", {"run": {}}, tmp_path, "e2e.bench.thing", [], 0.0)


def test_provenance_names_changed_sources_but_not_results(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "e2e" / "bench" / "results").mkdir(parents=True)
    (tmp_path / "e2e" / "x.py").write_text("a\n")
    (tmp_path / "e2e" / "bench" / "results" / "r.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "init")
    (tmp_path / "e2e" / "x.py").write_text("b\n")  # " M e2e/x.py": the leading space is part of the line
    (tmp_path / "e2e" / "bench" / "results" / "r.json").write_text("[]\n")
    monkeypatch.setattr(record, "ROOT", tmp_path)
    run = record.provenance("e2e.bench.x", ["--a"], 0.0)
    assert run["uncommitted_changes"] == ["e2e/x.py"]
    assert run["command"] == "python -m e2e.bench.x --a"
    assert len(run["commit"]) == 40


def test_every_committed_result_was_written_by_its_benchmark_and_reconciles() -> None:
    from e2e.bench import summary

    assert summary.check(record.RESULTS) == []
    assert "== autoscaler.json: `python -m e2e.bench.autoscaler_bench`" in summary.summary(record.RESULTS)


def test_the_results_check_catches_hand_written_and_unreconciled_files(tmp_path: Path, monkeypatch) -> None:
    from e2e.bench import summary

    git = record._git
    monkeypatch.setattr(record, "_git", lambda *a: "" if a[0] == "status" else git(*a))  # a clean checkout
    record.save("drain", {"scenarios": {}}, tmp_path, "e2e.bench.drain_bench", [], 0.0)
    assert summary.check(tmp_path) == []
    doc = json.loads((tmp_path / "drain.json").read_text())
    doc["scenarios"] = {
        "s": {"p": {"requests": {"intended": 5, "completed": 3, "failed": 1, "never_sent": 0}}}
    }
    (tmp_path / "drain.json").write_text(json.dumps(doc))  # merged by hand: differs from its history copy
    (tmp_path / "scale.json").write_text(json.dumps({"runs": {}}))  # no provenance
    (tmp_path / "other.json").write_text("{}")
    problems = "\n".join(summary.check(tmp_path))
    assert "drain.json: its history copy" in problems
    assert "drain.json/scenarios/s/p: requests do not reconcile" in problems
    assert "scale.json: no `run`" in problems
    assert "other.json: no benchmark writes it" in problems


def test_every_drain_bench_namespace_is_a_dns_label() -> None:
    import re

    from e2e.bench import drain_bench

    names = drain_bench.namespaces(drain_bench.SCENARIOS)
    assert len(names) == len(drain_bench.SCENARIOS) * len(drain_bench.POLICIES)
    for name in names:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name), name


def test_the_cold_start_tables_show_every_run_side_by_side() -> None:
    from e2e.bench import summary

    def result(goodput: float, counts: dict[str, int]) -> dict[str, object]:
        return {
            "gpu_minutes": 30.0,
            "gpu_minutes_vs_static": 0.7,
            "slo": {"goodput_fraction": goodput},
            "requests": {"intended": 10, "completed": 9, "failed": 0, "never_sent": 1},
            "first_serve_per_rise_s": [31.0],
            "reversals": 1,
            "weights_paths": {"counts": counts, "engines": [{"path": "warm", "start_s": 12.5}]},
        }

    doc = {
        "traces": {"ramp": {"tokenfab": result(0.9, {"warm": 3, "fetching": 1, "cold": 0})}},
        "repeats": [{"ramp": {"tokenfab": result(0.8, {"warm": 2, "fetching": 0, "cold": 2})}}],
    }
    text = summary.markdown_cold(doc)
    assert "**ramp** (modeled cold start; run 1 / run 2)" in text
    line = next(x for x in text.splitlines() if x.startswith("| tokenfab |"))
    assert "90.0% / 80.0%" in line
    assert line.endswith("| 3-1-0 / 2-0-2 | warm 12.5 s / warm 12.5 s |")


def test_a_cache_benchmark_starts_its_trace_once_the_headroom_is_staged_or_after_its_wait(monkeypatch):
    from e2e.fleet import fleet, scenario

    answers = [False, False, True]
    monkeypatch.setattr(fleet, "prestaged_warm", lambda *a: answers.pop(0))
    monkeypatch.setattr(scenario.time, "sleep", lambda s: None)
    cfg = scenario.Config(policy="tokenfab")
    cached = {"spec": {"model": {"cache": {"prestageGroups": 3, "storageClassName": "local"}}}}
    assert scenario.prestage_settled(None, cfg, cached)["complete"] is True  # type: ignore[arg-type]
    assert answers == []
    plain = {"spec": {"model": {}}}
    assert scenario.prestage_settled(None, cfg, plain) == {"wait_s": 0.0, "complete": True}  # type: ignore[arg-type]
    # never staged: the trace starts after the wait, said so
    monkeypatch.setattr(fleet, "prestaged_warm", lambda *a: False)
    monkeypatch.setattr(scenario, "PRESTAGE_WAIT_S", 0.0)
    assert scenario.prestage_settled(None, cfg, cached)["complete"] is False  # type: ignore[arg-type]


def test_two_observers_agree_on_a_run_and_one_record_dropped_is_caught():
    """The load generator's records and the frontend's own counters are counted apart; dropping one record
    (or one success at the frontend) makes them disagree, and the problem says which count."""
    records = [req(), req(), req(tokens=40), req(error="500")]
    # (the stream of 40 tokens ended without an error: a success to the frontend, short to the client)
    frontend = {"started": 4, "success": 3, "error": 1, "inflight": 0}
    q = load.reconcile(records, 10, frontend, OSL)
    assert q["problems"] == []
    assert (q["intended"], q["sent"], q["completed"], q["failed"], q["never_sent"]) == (10, 4, 2, 2, 6)
    assert q["short"] == 1
    dropped = load.reconcile(records[1:], 10, frontend, OSL)
    assert dropped["problems"] == [
        "the client recorded 3 requests, the frontend started 4",
        "the client got 2 answers without an error, the frontend counted 3 successes",
    ]
    one_less = load.reconcile(records, 10, {**frontend, "success": 2}, OSL)
    assert one_less["problems"] == [
        "the client got 3 answers without an error, the frontend counted 2 successes"
    ]
    assert load.reconcile(records, 10, None, OSL)["problems"] == ["the frontend's counters could not be read"]
    # More sent than the trace intended (beyond the integral's rounding) is not clamped away.
    assert "more than the 2 the trace intended" in load.reconcile(records, 2, frontend, OSL)["problems"][-1]


def test_the_results_check_reads_history_copies_and_flags_uncommitted_code(tmp_path: Path, monkeypatch):
    from e2e.bench import summary

    git = record._git
    monkeypatch.setattr(record, "_git", lambda *a: "" if a[0] == "status" else git(*a))
    record.save("drain", {"scenarios": {}}, tmp_path, "e2e.bench.drain_bench", [], 0.0)
    assert summary.check(tmp_path) == []
    monkeypatch.setattr(record, "_git", lambda *a: " M e2e/x.py\n" if a[0] == "status" else git(*a))
    record.save("drain", {"scenarios": {}}, tmp_path / "other", "e2e.bench.drain_bench", [], 100.0)
    (copy,) = (tmp_path / "other" / "history").iterdir()
    copy.rename(tmp_path / "history" / copy.name)
    problems = summary.check(tmp_path)
    assert f"history/{copy.name}: ran with uncommitted changes ['e2e/x.py']" in problems
    # A history copy whose observers disagree is caught too.
    doc = json.loads((tmp_path / "history" / copy.name).read_text())
    doc["run"]["uncommitted_changes"] = []
    doc["x"] = {"requests": {"intended": 2, "completed": 1, "failed": 0, "never_sent": 1, "problems": ["p"]}}
    (tmp_path / "history" / copy.name).write_text(json.dumps(doc))
    problems = summary.check(tmp_path)
    assert f"history/{copy.name}/x: the two observers disagree: ['p']" in problems
    assert not any("uncommitted" in p for p in problems)


def test_the_goals_are_judged_against_the_noise_and_the_oracle_bounds():
    from e2e.bench import fleet_goals

    def r(gp: float, gpu: float, vs_static: float | None = None) -> dict[str, object]:
        return {"slo": {"goodput_fraction": gp}, "gpu_minutes": gpu, "gpu_minutes_vs_static": vs_static}

    run1 = {"ramp": {"tokenfab": r(0.90, 20, 0.5), "hpa": r(0.85, 20), "static": r(0.99, 40, 1.0),
                     "oracle": r(0.93, 30)}}  # fmt: skip
    run2 = {"ramp": {"tokenfab": r(0.88, 21, 0.52), "hpa": r(0.80, 19), "static": r(0.98, 40, 1.0),
                     "oracle": r(0.94, 30)}}  # fmt: skip
    n = fleet_goals.noise([run1, run2])
    assert (n["points"], n["where"], n["measured"]) == (5.0, "ramp/hpa", True)
    assert fleet_goals.noise([run1])["measured"] is False
    assert fleet_goals.beyond_oracle(run1, 5.0) == []
    g = fleet_goals.judge(run1, 5.0, "plain")
    assert g["ramp"]["vs_autoscalers"]["hpa"]["dominates_tokenfab"] is False
    assert g["ramp"]["oracle"] == {
        "goodput_pct": 93.0,
        "points_below": 3.0,
        "points_below_static": 6.0,
        "within_5_points": True,
    }
    assert g["met"] is True
    # An autoscaler with more goodput at no more GPU-minutes dominates: the goal is not met.
    run1["ramp"]["hpa"] = r(0.92, 19)
    g = fleet_goals.judge(run1, 5.0, "plain")
    assert g["ramp"]["vs_autoscalers"]["hpa"]["dominates_tokenfab"] is True
    assert g["met"] is False
    # A contestant above the oracle by more than the noise: the bound broke, said so.
    run1["ramp"]["hpa"] = r(0.99, 19)
    assert fleet_goals.beyond_oracle(run1, 5.0) == [
        "ramp: hpa's goodput 99.0% beats the bounding oracle's 93.0% by more than the noise (5.0 points)"
    ]


def test_a_result_is_its_benchmarks_newest_run(tmp_path: Path, monkeypatch):
    from e2e.bench import summary

    git = record._git
    monkeypatch.setattr(record, "_git", lambda *a: "" if a[0] == "status" else git(*a))
    first = record.save("drain", {"scenarios": {"a": {}}}, tmp_path, "e2e.bench.drain_bench", [], 0.0)
    kept = first.read_text()
    record.save("drain", {"scenarios": {"b": {}}}, tmp_path, "e2e.bench.drain_bench", [], 100.0)
    assert summary.check(tmp_path) == []
    first.write_text(kept)  # the older run put back: a later one exists
    (newer,) = [c for c in (tmp_path / "history").iterdir() if "19700101T000140Z" in c.name]
    problems = summary.check(tmp_path)
    assert f"drain.json: not the newest run; {newer.name} is newer" in problems


def test_the_fleet_tables_show_every_run_side_by_side_with_the_verdict() -> None:
    from e2e.bench import summary

    def result(goodput: float) -> dict[str, object]:
        return {
            "gpu_minutes": 30.0,
            "gpu_minutes_vs_static": 0.7,
            "slo": {"goodput_fraction": goodput, "ttft_p50_ms": 200.0, "ttft_p99_ms": 900.0},
            "requests": {"intended": 10, "completed": 9, "failed": 0, "never_sent": 1},
            "first_serve_per_rise_s": [12.0],
            "reversals": 1,
        }

    runs = [{"plain": {"traces": {"ramp": {"tokenfab": result(g)}}}} for g in (0.9, 0.8)]
    noise = {"points": 10.0, "measured": True, "runs": 2, "where": "ramp/tokenfab"}
    judged = {"noise": noise, "beyond_oracle": [[], []], "goals": [{"met": True}, {"met": False}]}
    doc = {"runs": runs, "judged": {"plain": judged}}
    text = summary.markdown_fleet(doc)
    assert "**ramp** (plain; run 1 / run 2)" in text
    line = next(x for x in text.splitlines() if x.startswith("| tokenfab |"))
    assert line == (
        "| tokenfab | 30.00 (0.70) / 30.00 (0.70) | 90.0% / 80.0% | 10 = 9 + 0 + 1 / 10 = 9 + 0 + 1 | "
        "200, 900 / 200, 900 | 1 / 1 | 12 s / 12 s |"
    )
    assert "plain: noise 10.0 points (measured over 2 runs, largest at ramp/tokenfab)" in text
    assert "  run 2: goals NOT met; above the oracle: none" in text
