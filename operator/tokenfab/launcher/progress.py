"""A download's progress in the launcher's log (thin I/O): while weights are fetched into the model cache, a
line every few seconds with the bytes the cache grew by, and once the weights are in place one line with
where they came from. The operator reads these lines from the pod's log (tokenfab.planning.launcher_log)
into the deployment's status: a weights-fetch pod's bytes so far, a worker's source.

    tokenfab-launcher: weights-progress {"bytes": 1234567, "seconds": 10.0}
    tokenfab-launcher: weights-result {"source": "download", "bytes": 2510000, "files": 3, "seconds": 12.5}
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tokenfab.planning import contract

ENV_PROGRESS_SECONDS = "TOKENFAB_PROGRESS_SECONDS"
DEFAULT_SECONDS = 10.0


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files under `root` (symbolic links not followed: a hub snapshot links
    to its blobs, which are counted once)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue  # (renamed or removed meanwhile: a download in flight)
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def interval(env: Mapping[str, str]) -> float:
    try:
        seconds = float(env.get(ENV_PROGRESS_SECONDS, "") or DEFAULT_SECONDS)
    except ValueError:
        return DEFAULT_SECONDS
    return seconds if seconds > 0 else DEFAULT_SECONDS


def line(marker: str, doc: Mapping[str, Any]) -> str:
    return f"{marker} {json.dumps(dict(doc), sort_keys=True)}"


class Progress:
    """A `downloading` callback (tokenfab.launcher.fetch.obtain): on True a thread starts writing
    `weights-progress` lines every `every` seconds, on False it stops after a last one."""

    def __init__(
        self,
        root: Path,
        every: float,
        emit: Callable[[str], None],
        inner: Callable[[bool], None] = lambda _on: None,
    ) -> None:
        self.root, self.every, self.emit, self.inner = root, every, emit, inner
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._base = 0
        self._t0 = 0.0

    def __call__(self, on: bool) -> None:
        self.inner(on)
        if on and self._thread is None:
            self._base, self._t0 = tree_bytes(self.root), time.monotonic()
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="weights-progress", daemon=True)
            self._thread.start()
        elif not on and self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self.every + 5)
            self._thread = None
            self.report()

    def report(self) -> None:
        grown = max(0, tree_bytes(self.root) - self._base)
        seconds = round(time.monotonic() - self._t0, 1)
        self.emit(line(contract.LOG_WEIGHTS_PROGRESS, {"bytes": grown, "seconds": seconds}))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.report()
