"""The fleet runner's state file, `<state-dir>/state.json`, for the scenario and the tests: written
atomically after every pass (`write_state`: its processes, their ports, the frontend URLs, every PID it
ever started) and read back (`read_state`); `state_dir_of` is where a factory run keeps it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from e2e.fleet.procs import Proc
from tokenfab.planning import contract


def write_state(
    state_dir: Path,
    *,
    running: bool,
    errors: int,
    foreign: list[dict[str, str]],
    model_dir: Path,
    procs: dict[str, Proc],
    terminating: dict[str, Proc],
    history: list[dict[str, Any]],
    fetches: list[dict[str, Any]],
    refused: list[dict[str, Any]],
    isolated: bool,
) -> None:
    """The runner's state as of now (`running` False once it has stopped), written atomically."""
    frontends = {
        f"{p.labels['namespace']}/{p.labels[contract.PROM_LABEL_DEPLOYMENT]}": p.url
        for p in procs.values()
        if p.kind == "frontend"
    }
    doc = {
        "runner_pid": os.getpid(),
        "running": running,
        "updated_at": time.time(),
        "errors": errors,
        "foreign_connections": foreign,
        "model_dir": str(model_dir),
        "frontends": frontends,
        "processes": {k: asdict(p) for k, p in sorted(procs.items())},
        "terminating": {uid: asdict(p) for uid, p in sorted(terminating.items())},
        "history": history,
        "fetches": fetches,
        "refused": refused,  # engines the simulated fabric failed at NCCL init
        "isolated": isolated,  # each process in a mount namespace of its own
    }
    path = state_dir / "state.json"
    tmp = path.with_name(".state.json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def state_dir_of(run_dir: Path) -> Path:
    return run_dir / "fleet"


def read_state(state_dir: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((state_dir / "state.json").read_text()))
    return {}
