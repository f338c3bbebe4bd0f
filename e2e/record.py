"""Where a benchmark's results go, written by code only.

A run on purpose (`python -m e2e.bench.<name>`) writes two files under its `--out` directory (by default
e2e/bench/results/): `<name>.json`, the latest run, which the README quotes, and
`history/<name>-<UTC time>-<commit>.json`, that run's own copy, which no later run touches. Each carries
`run`: the command line, the commit it ran at (and whether the checkout had changes then), when it started
and ended, and the machine's cores. The test suite's smoke versions write to their own temporary
directories: committed results change only when a benchmark is run on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "e2e" / "bench" / "results"
# The tree whose changes would make a run's commit not the whole story (results themselves excluded).
SOURCES = ("operator", "e2e", "crds", "charts", "pyproject.toml")


def _git(*args: str) -> str:
    """git's output, or "" when git fails (trailing whitespace removed; leading kept: porcelain status
    lines begin with a space)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.rstrip() if out.returncode == 0 else ""


def provenance(module: str, argv: list[str], started: float) -> dict[str, Any]:
    """What a result needs to be traced: the command that made it, the commit and the time."""
    changed = [
        line[3:]
        for line in _git("status", "--porcelain", "--", *SOURCES).splitlines()
        if not line[3:].startswith("e2e/bench/results/")
    ]
    return {
        "command": " ".join(["python", "-m", module, *argv]),
        "commit": _git("rev-parse", "HEAD") or None,
        "uncommitted_changes": changed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def stamp(run: dict[str, Any]) -> str:
    """The start time of a run as its history file names it (20261125T162001Z)."""
    return str(run["started"]).replace("-", "").replace(":", "")


def save(name: str, result: dict[str, Any], out: Path, module: str, argv: list[str], started: float) -> Path:
    """Writes `<out>/<name>.json` and its history copy; returns the former. `result` must not carry a
    `run` key of its own."""
    assert "run" not in result, "the run's provenance is written here"
    run = provenance(module, argv, started)
    doc = {"run": run, **result}
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1) + "\n"
    path = out / f"{name}.json"
    path.write_text(text)
    history = out / "history" / f"{name}-{stamp(run)}-{(run['commit'] or 'nocommit')[:7]}.json"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text(text)
    return path
