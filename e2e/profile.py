"""The suite's profile: what each test module costs, and on which lane it ran (hooks of e2e/conftest.py).

`bash e2e/test.sh` runs the modules side by side, one lane per pytest-xdist worker (its scheduler by
`group`: a module stays on one lane, with its session factory). The modules that run live Dynamo
fleets (LIVE_CHAINS) are timed against a model of engine time and suffer when the two cores are shared by
three of them: they run in two chains, each on one lane, one module after another, so that at most two
fleets run at once. The other modules follow, longest first (LONGEST_FIRST, from the profile in
docs/testing.md), then the other end-to-end modules, then the unit tests, which fill the lanes at the end
at a lower priority (`prioritize`).

At the end of a run the profile is printed (seconds per module, setup and teardown included, and each
lane's busy time) and written as JSON to TOKENFAB_SUITE_PROFILE when that is set. A test's report for the
reader (a benchmark smoke's table) is recorded with `record_property("shown", text)` and printed at the
end, since what a lane prints is not shown.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

# Live fleets, in two chains of about equal time (docs/testing.md), longest chain first.
# The drain smoke and the drain tests never run at once: in two of four runs with both at once the drain
# smoke's baseline (plain deletion) cut no stream, so nothing was compared (docs/testing.md).
LIVE_CHAINS = (
    ("e2e/bench/test_drain_bench.py", "e2e/bench/test_fault_bench.py"),
    ("e2e/test_drain.py", "e2e/test_fleet.py", "e2e/bench/test_fleet_bench.py"),
)
LIVE = tuple(m for chain in LIVE_CHAINS for m in chain)
# Smokes that start their own factories and compare only within their own run: at nice 10 (prioritize).
NICE = (
    "e2e/bench/test_factory_bench.py",
    "e2e/bench/test_scale_bench.py",
    "e2e/bench/test_rack_loss_bench.py",
    "e2e/bench/test_burst_bench.py",
)
# Measured (docs/testing.md), longest first. A module not listed runs after these, e2e before unit tests.
LONGEST_FIRST = (
    *LIVE,
    "e2e/test_fleet_burst.py",
    "e2e/bench/test_factory_bench.py",
    "e2e/bench/test_operator_bench.py",
    "e2e/bench/test_burst_bench.py",
    "e2e/bench/test_rack_loss_bench.py",
    "tests/adapters/test_aic.py",
    "e2e/test_resilience.py",
    "e2e/test_autoscaling.py",
    "e2e/test_failures.py",
    "e2e/test_factory.py",
    "e2e/test_operator.py",
    "e2e/bench/test_scale_bench.py",
    "e2e/test_helm.py",
    "e2e/test_faults.py",
    "tests/launcher/test_launcher.py",
)

_seconds: dict[str, float] = defaultdict(float)
_lane: dict[str, str] = {}
_span: dict[str, list[float]] = {}
_shown: list[tuple[str, str]] = []  # (test, text): what a test recorded with record_property("shown", text)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].split("@", 1)[0]


def rank(nodeid: str) -> int:
    module = module_of(nodeid)
    if module in LONGEST_FIRST:
        return LONGEST_FIRST.index(module)
    return len(LONGEST_FIRST) + (0 if module.startswith("e2e/") else 1)


def group(nodeid: str) -> str:
    """The module's xdist group: its chain's when it runs a live fleet, else its own."""
    module = module_of(nodeid)
    for i, chain in enumerate(LIVE_CHAINS):
        if module in chain:
            return f"live-fleets-{i + 1}"
    return module


def prioritize(nodeid: str) -> None:
    """pytest_runtest_setup: a unit test, and a benchmark smoke that brings up factories of its own and
    asserts nothing of time (NICE), runs at nice 10 with what it starts, and so yields the cores to the live
    fleets beside it; anything else at the lane's own priority. Lowering it back needs root; without
    root the lane stays where it is."""
    module = module_of(nodeid)
    want = 10 if module.startswith("tests/") or module in NICE else 0
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != want:
            os.setpriority(os.PRIO_PROCESS, 0, want)
    except PermissionError:
        pass


def record(report: Any) -> None:
    """pytest_runtest_logreport: in the controller, every phase of every test, from every lane."""
    module = module_of(report.nodeid)
    _seconds[module] += float(getattr(report, "duration", 0.0) or 0.0)
    node = getattr(report, "node", None)
    _lane[module] = node.gateway.id if node is not None else "main"
    for key, text in getattr(report, "user_properties", ()):
        if key == "shown" and report.when == "call":
            _shown.append((report.nodeid, str(text)))
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        first, last = _span.get(module, [start, stop])
        _span[module] = [min(first, start), max(last, stop)]


def table() -> dict[str, Any]:
    modules = sorted(_seconds, key=lambda m: -_seconds[m])
    lanes: dict[str, float] = defaultdict(float)
    for m in modules:
        lanes[_lane[m]] += _seconds[m]
    starts = [s[0] for s in _span.values()]
    stops = [s[1] for s in _span.values()]
    wall = (max(stops) - min(starts)) if starts else 0.0
    return {
        "wall_seconds": round(wall, 1),
        "lanes": {k: round(v, 1) for k, v in sorted(lanes.items())},
        "modules": [{"module": m, "seconds": round(_seconds[m], 1), "lane": _lane[m]} for m in modules],
    }


def summary(terminalreporter: Any) -> None:
    """pytest_terminal_summary: the profile, printed, and saved where TOKENFAB_SUITE_PROFILE says."""
    if not _seconds or hasattr(terminalreporter.config, "workerinput"):
        return
    w = terminalreporter
    if _shown:  # (a lane's own output is not shown while it runs: benchmark smokes print their tables here)
        w.section("reports the tests made")
        for nodeid, text in _shown:
            w.write_line(f"{nodeid}:")
            w.write_line(text.strip("\n"))
    t = table()
    w.section("suite profile (seconds per module, setup and teardown included)")
    busy = ", ".join(f"{lane} {s:.0f} s" for lane, s in t["lanes"].items())
    w.write_line(f"tests ran for {t['wall_seconds']:.0f} s; each lane busy: {busy}")
    for row in t["modules"][:40]:
        w.write_line(f"{row['seconds']:8.1f}  {row['lane']:>5}  {row['module']}")
    rest = t["modules"][40:]
    if rest:
        w.write_line(f"{sum(r['seconds'] for r in rest):8.1f}         the other {len(rest)} modules")
    out = os.environ.get("TOKENFAB_SUITE_PROFILE")
    if out:
        Path(out).write_text(json.dumps(t, indent=2) + "\n")
