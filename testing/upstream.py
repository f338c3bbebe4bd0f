"""The pinned ai-dynamo package, asked in its own virtualenv (installed by e2e/fleet/setup.sh, run by
e2e/test.sh): where its sources are, and what its own argument parsers make of tokenfab's command lines
(testing/dynamo_parse.py, run by that Python; this module is not named dynamo, since the probe beside it
imports the real one)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

VENVS = Path(os.environ.get("TOKENFAB_VENVS", Path.home() / ".cache" / "tokenfab" / "venvs"))
DYNAMO_PYTHON = VENVS / "dynamo" / "bin" / "python"
PROBE = Path(__file__).resolve().parent / "dynamo_parse.py"


def dynamo_site() -> Path:
    assert DYNAMO_PYTHON.exists(), (
        f"{DYNAMO_PYTHON} missing: e2e/fleet/setup.sh (run by e2e/test.sh) installs it"
    )
    out = subprocess.run(
        [str(DYNAMO_PYTHON), "-c", "import dynamo; print(list(dynamo.__path__)[0])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(out.stdout.strip())


def parse_all(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    dynamo_site()
    done = subprocess.run(
        [str(DYNAMO_PYTHON), str(PROBE)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results
