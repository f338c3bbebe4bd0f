"""Every committed benchmark result, as its own benchmark prints it, under the command and commit that
made it: `python -m e2e.bench.summary [DIR]` (DIR: e2e/bench/results by default); `--markdown
fleet_bench|drain [DIR]` prints that file's tables as the README shows them.

The README's figures are copied from this output; each of its benchmark figures names the result file, and
this prints that file's `run` (e2e/record.py) above its table. `check(DIR)` is what the unit tests
hold every committed result to: written by the code (a `run` with a commit and a `python -m` command) and
with a history copy of its own, and every request reconciled (intended = completed + failed + never sent).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from e2e import record
from e2e.bench import drain_bench


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _autoscaler(r: dict[str, Any]) -> str:
    from e2e.bench import autoscaler_bench

    return autoscaler_bench.report(r)


def _operator(r: dict[str, Any]) -> str:
    from e2e.bench import operator_bench

    return operator_bench.report(r)


def _factory(r: dict[str, Any]) -> str:
    from e2e.bench import factory_bench

    return factory_bench.report(r)


def _scale(r: dict[str, Any]) -> str:
    from e2e.bench import scale_bench

    return scale_bench.report(r)


def _rack_loss(r: dict[str, Any]) -> str:
    from e2e.bench import rack_loss_bench

    return rack_loss_bench.report(r)


def _burst(r: dict[str, Any]) -> str:
    from e2e.bench import burst_bench

    return burst_bench.report(r)


def _drain(r: dict[str, Any]) -> str:
    from e2e.bench import drain_bench

    return drain_bench.table(r)


def _faults(r: dict[str, Any]) -> str:
    from e2e.bench import fault_bench

    return fault_bench.table(r)


def _fleet(r: dict[str, Any]) -> str:
    from e2e.bench import fleet_bench

    out = []
    for i, run in enumerate(r.get("runs") or [], 1):
        for variant in ("plain", "cold_start"):
            traces = (run.get(variant) or {}).get("traces")
            if traces:
                out.append(fleet_bench.table(traces, f"run {i}, {variant}"))
    return "\n".join(out)


def _fleet_cold(r: dict[str, Any]) -> str:
    from e2e.bench import fleet_bench

    m = r.get("modeled") or {}
    out = [f"weights (modeled): hub {m.get('cold_s')} s, warm model cache {m.get('warm_s')} s"]
    for i, traces in enumerate([r.get("traces") or {}, *(r.get("repeats") or [])], 1):
        out.append(fleet_bench.table(traces, f"run {i}, cold start with and without the model cache"))
    for i, g in enumerate(r.get("goals") or [], 1):
        out.append(f"run {i} goals: " + json.dumps(g))
    return "\n".join(out)


def _closed_loop(r: dict[str, Any]) -> str:
    q, slo = r.get("requests") or {}, r.get("slo") or {}
    gp = slo.get("goodput_fraction")
    return "\n".join(
        [
            f"policy {r.get('policy')}, trace {r.get('trace_name')}",
            f"requests: intended {q.get('intended')} = completed {q.get('completed')} + failed "
            f"{q.get('failed')} + never sent {q.get('never_sent')} (sent {q.get('sent')})",
            f"SLO goodput {'-' if gp is None else f'{100 * gp:.1f}%'} of intended; TTFT p50/p99 "
            f"{_ms(slo.get('ttft_p50_ms'))}/{_ms(slo.get('ttft_p99_ms'))} ms; ITL p50/p99 "
            f"{_ms(slo.get('itl_p50_ms'))}/{_ms(slo.get('itl_p99_ms'))} ms; "
            f"GPU-minutes {r.get('gpu_minutes')}; reversals {r.get('reversals')}; "
            f"first serve {r.get('first_serve_per_rise_s')} s",
            "loop: " + json.dumps(r.get("loop")),
        ]
    )


def _figures(r: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in r.items() if k != "run"}, indent=1)


def _fabric(r: dict[str, Any]) -> str:
    from e2e.bench.fabric_bench import table

    return f"fabric placement ({r.get('modeled')}):\n" + table(r.get("runs") or [])


def _fabric_live(r: dict[str, Any]) -> str:
    from e2e.bench.fabric_live_bench import table

    return f"KV transfers on a live fleet ({r.get('measured')}):\n" + table(r.get("runs") or [])


REPORTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "fabric": _fabric,
    "fabric_live": _fabric_live,
    "autoscaler": _autoscaler,
    "operator": _operator,
    "operator_compare": _figures,  # operator_bench --compare-ref
    "factory": _factory,
    "scale": _scale,
    "scale_128": _scale,  # scale_bench --racks 128 --deployments 600 --name scale_128
    "rack_loss": _rack_loss,
    "burst": _burst,
    "drain": _drain,
    "faults": _faults,
    "faults_worker_hang": _faults,  # fault_bench --kinds worker_hang --name faults_worker_hang
    "fleet_bench": _fleet,
    "fleet_bench_cold": _fleet_cold,
    "fleet_closed_loop": _closed_loop,
}


def _requests(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every `requests` count in a result, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "requests" and isinstance(value, dict) and "intended" in value:
                yield where or "/", value
            else:
                yield from _requests(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _requests(value, f"{where}/{i}")


# History copies made from uncommitted code before the check read history files: kept, marked here with what
# differed; any other history copy from uncommitted code is a problem.
UNCOMMITTED_HISTORY = {
    "fabric-20261207T071437Z-53ff679.json": "fabric_bench.py, test_fabric_bench.py, planning/units.py edited",
    "fleet_bench-20261127T162007Z-917196b.json": "fleet_bench_cold.py edited (not the code this ran)",
    "fleet_bench_cold-20261127T160421Z-917196b.json": "fleet_bench_cold.py edited",
}


def _reconciled(name: str, doc: dict[str, Any]) -> list[str]:
    """Every request count in `doc` reconciles, and where two observers counted, they agree."""
    problems = []
    for where, q in _requests(doc):
        parts = (q.get("completed"), q.get("failed"), q.get("never_sent"))
        if None in parts or q["intended"] != sum(parts):
            problems.append(f"{name}{where}: requests do not reconcile: {q}")
        if q.get("problems"):
            problems.append(f"{name}{where}: the two observers disagree: {q['problems']}")
    return problems


def check_history(results: Path) -> list[str]:
    """What is wrong with the history copies: each written by a benchmark from committed code (or marked in
    UNCOMMITTED_HISTORY), each of a benchmark REPORTS knows, each reconciled."""
    problems = []
    for path in sorted((results / "history").glob("*.json")):
        doc = json.loads(path.read_text())
        run = doc.get("run") or {}
        name = path.name.rsplit("-", 2)[0]
        if name not in REPORTS:
            problems.append(f"history/{path.name}: no benchmark writes it (REPORTS)")
        if len(str(run.get("commit") or "")) != 40 or not str(run.get("command") or "").startswith(
            "python -m e2e."
        ):
            problems.append(f"history/{path.name}: no `run` naming the command and commit (written by hand?)")
        if run.get("uncommitted_changes") and path.name not in UNCOMMITTED_HISTORY:
            problems.append(f"history/{path.name}: ran with uncommitted changes {run['uncommitted_changes']}")
        problems += _reconciled(f"history/{path.name}", doc)
    return problems


# Results older than a later history copy of theirs, until their benchmark runs again in full (then the
# entry goes), each with why (none now).
NOT_NEWEST: dict[str, str] = {}


def not_newest(results: Path) -> list[str]:
    """Every result that is not its benchmark's newest history copy (results/*.json is always the latest
    run; the history keeps the rest), unless NOT_NEWEST says why."""
    problems = []
    for path in sorted(results.glob("*.json")):
        copies = [
            c
            for c in (results / "history").glob(f"{path.stem}-*.json")
            if c.name.rsplit("-", 2)[0] == path.stem
        ]
        newest = max(copies, key=lambda c: c.name.rsplit("-", 2)[1], default=None)
        if newest is None or path.stem in NOT_NEWEST:
            continue
        if json.loads(newest.read_text()) != json.loads(path.read_text()):
            problems.append(f"{path.name}: not the newest run; {newest.name} is newer")
    return problems


def check(results: Path) -> list[str]:
    """What is wrong with the committed results in `results` and their history copies (nothing: [])."""
    problems = check_history(results) + not_newest(results)
    for path in sorted(results.glob("*.json")):
        name = path.stem
        if name not in REPORTS:
            problems.append(f"{path.name}: no benchmark writes it (REPORTS)")
            continue
        doc = json.loads(path.read_text())
        run = doc.get("run") or {}
        commit = str(run.get("commit") or "")
        if len(commit) != 40 or not str(run.get("command") or "").startswith("python -m e2e."):
            problems.append(f"{path.name}: no `run` naming the command and commit (written by hand?)")
            continue
        if run.get("uncommitted_changes"):
            problems.append(f"{path.name}: ran with uncommitted changes {run['uncommitted_changes']}")
        copy = results / "history" / f"{name}-{record.stamp(run)}-{commit[:7]}.json"
        if not copy.exists() or json.loads(copy.read_text()) != doc:
            problems.append(f"{path.name}: its history copy {copy.name} is missing or differs")
        problems += _reconciled(path.name, doc)
    return problems


def summary(results: Path) -> str:
    out = []
    for path in sorted(results.glob("*.json")):
        report = REPORTS.get(path.stem)
        doc = json.loads(path.read_text())
        run = doc.get("run") or {}
        out.append(
            f"== {path.name}: `{run.get('command')}` at {str(run.get('commit'))[:7]}, "
            f"{run.get('started')} to {run.get('finished')}, {run.get('cpus')} cores"
        )
        try:
            out.append(report(doc) if report else "(no benchmark writes this file)")
        except (KeyError, TypeError, ValueError) as exc:  # a file of an older format
            out.append(f"(not in the format its benchmark writes today: {type(exc).__name__} {exc})")
        out.append("")
    return "\n".join(out)


def markdown_fleet(doc: dict[str, Any]) -> str:
    """fleet_bench.json's tables as the README shows them: per variant and trace, each contestant's figures
    of every run side by side (run 1 / run 2 / ...), then the judged noise and goals."""
    from e2e.bench.fleet_bench import row

    out = []
    for variant in ("plain", "cold_start"):
        runs = [(run.get(variant) or {}).get("traces") or {} for run in doc.get("runs") or []]
        runs = [r for r in runs if r]
        if not runs:
            continue
        label = " / ".join(f"run {i}" for i in range(1, len(runs) + 1))
        for trace in runs[0]:
            out += [
                f"**{trace}** ({variant.replace('_', ' ')}; {label})",
                "",
                "| contestant | GPU-min (vs static) | SLO goodput | intended = completed + failed + "
                "never sent | TTFT p50, p99 ms | reversals | first serve per rise |",
                "|---|---:|---:|---|---|---:|---|",
            ]
            for name in runs[0][trace]:
                xs = [row(name, r) for run in runs if (r := (run.get(trace) or {}).get(name))]
                out.append(
                    f"| {name} | {' / '.join(f'{x.gpu_minutes} ({x.vs_static})' for x in xs)} | "
                    f"{' / '.join(x.goodput for x in xs)} | {' / '.join(x.requests for x in xs)} | "
                    f"{' / '.join(f'{x.ttft_p50}, {x.ttft_p99}' for x in xs)} | "
                    f"{' / '.join(x.reversals for x in xs)} | "
                    f"{' / '.join(x.first_serve_per_rise for x in xs)} |"
                )
            out.append("")
    from e2e.bench.fleet_bench import verdict

    if doc.get("judged"):
        out += ["```", verdict(doc), "```", ""]
    return "\n".join(out)


def markdown_cold(doc: dict[str, Any]) -> str:
    """fleet_bench_cold.json's tables as the README shows them: per trace, each policy's figures of every
    run side by side (run 1 / run 2 / ...)."""
    from e2e.bench.fleet_bench import row

    runs = [doc.get("traces") or {}, *(doc.get("repeats") or [])]
    out = []
    label = " / ".join(f"run {i}" for i in range(1, len(runs) + 1))
    for trace in runs[0]:
        out += [
            f"**{trace}** (modeled cold start; {label})",
            "",
            "| policy | GPU-min (vs static) | SLO goodput | intended = completed + failed + never sent | "
            "first serve per rise | engines started warm-fetching-cold | group start, median per path |",
            "|---|---:|---:|---|---|---|---|",
        ]
        for name in runs[0][trace]:
            rs = [r for run in runs if (r := (run.get(trace) or {}).get(name))]
            xs = [row(name, r) for r in rs]
            paths = [(r.get("weights_paths") or {}).get("counts") or {} for r in rs]
            out.append(
                f"| {name} | {' / '.join(f'{x.gpu_minutes} ({x.vs_static})' for x in xs)} | "
                f"{' / '.join(x.goodput for x in xs)} | {' / '.join(x.requests for x in xs)} | "
                f"{' / '.join(x.first_serve_per_rise for x in xs)} | "
                + " / ".join(f"{p.get('warm', 0)}-{p.get('fetching', 0)}-{p.get('cold', 0)}" for p in paths)
                + " | "
                + " / ".join(_starts(r) for r in rs)
                + " |"
            )
        out.append("")
    if doc.get("judged"):
        from e2e.bench.fleet_bench import verdict

        out += ["```", verdict(doc), "```", ""]
    return "\n".join(out)


def _starts(r: dict[str, Any]) -> str:
    """A policy's median group start per weights path (fleet_bench_cold.group_starts), or -."""
    from e2e.bench.fleet_bench_cold import group_starts

    return ", ".join(f"{path} {s} s" for path, s in group_starts(r).items()) or "-"


def markdown_drain(doc: dict[str, Any]) -> str:
    """drain.json's table as the README shows it."""
    out = [
        "| scenario | contestant | intended | sent | completed | failed (cut short) | never sent "
        "| stream p50 | TTFT p99 | settled after |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, name, q, r in drain_bench.rows(doc):
        ttft = r.get("ttft_p99_ms")
        out.append(
            f"| {scenario} | {name} | {q['intended']} | {q['sent']} | {q['completed']} | {q['failed']} "
            f"({r.get('cut_short')}) | {q['never_sent']} | {r.get('stream_p50_s')} s | "
            f"{'-' if ttft is None else f'{ttft / 1000:.1f} s'} | {r.get('drain_seconds')} s |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--markdown":  # --markdown fleet_bench|fleet_bench_cold|drain [DIR]: README tables
        results = Path(argv[2]) if len(argv) > 2 else record.RESULTS
        doc = json.loads((results / f"{argv[1]}.json").read_text())
        tables = {"fleet_bench": markdown_fleet, "fleet_bench_cold": markdown_cold, "drain": markdown_drain}
        print(tables[argv[1]](doc))
        return 0
    results = Path(argv[0]) if argv else record.RESULTS
    print(summary(results))
    problems = check(results)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
