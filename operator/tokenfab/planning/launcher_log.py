"""What the operator reads from the launcher's log (pure): a weights download's bytes so far, and where a
pod's weights came from once they were in place (tokenfab.launcher.progress writes both lines):

    tokenfab-launcher: weights-progress {"bytes": 1234567, "seconds": 10.0}
    tokenfab-launcher: weights-result {"bytes": 2510000, "files": 3, "seconds": 12.5, "source": "download"}

A weights-fetch pod's last progress line feeds status.weightsCache.downloads, and so does a worker's while
its launcher downloads (no pre-staged cache); each worker's result line (printed before its engine
starts) feeds status.placement[].weights, which says "downloading" with the bytes so far until then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenfab.planning import contract


@dataclass(frozen=True)
class Progress:
    bytes: int  # the model cache grew by this much since the download began
    seconds: float  # since the download began


@dataclass(frozen=True)
class Outcome:
    source: str  # cache | download | copy | modelexpress | offline
    bytes: int
    files: int
    seconds: float  # the download's (0 from the cache)

    def words(self) -> str:
        return self.source if self.source in ("cache", "offline") else f"{self.source} {self.seconds:.0f} s"


@dataclass(frozen=True)
class LauncherLog:
    progress: Progress | None = None  # the last progress line
    result: Outcome | None = None  # the last result line


def _doc(text: str, marker: str) -> dict[str, object] | None:
    """The JSON object after `marker` on the last line that has it (None: no such line, or not JSON)."""
    for raw in reversed(text.splitlines()):
        _, found, rest = raw.partition(f": {marker} ")
        if not found:
            continue
        try:
            doc = json.loads(rest)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None
    return None


def _num(doc: dict[str, Any], key: str) -> float:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else 0.0


def outcome(doc: object) -> Outcome | None:
    """A result the launcher reported (its weights-result line, or a fetch pod's termination message):
    None without a source."""
    if not isinstance(doc, dict) or not (source := str(doc.get("source") or "")):
        return None
    return Outcome(source, int(_num(doc, "bytes")), int(_num(doc, "files")), _num(doc, "seconds"))


def read(text: str) -> LauncherLog:
    """The progress and result lines of a launcher's log (or of a part of it)."""
    p = _doc(text, contract.LOG_WEIGHTS_PROGRESS)
    progress = None if p is None else Progress(int(_num(p, "bytes")), _num(p, "seconds"))
    return LauncherLog(progress, outcome(_doc(text, contract.LOG_WEIGHTS_RESULT)))


def group_words(results: Iterable[Outcome | None]) -> str:
    """How a group's pods got their weights, in a few words: one source ("cache", "download 312 s": the
    slowest pod's seconds), or each source with how many of the pods that said took it
    ("download 312 s on 2, cache on 2"); "" when none said."""
    said = [r for r in results if r is not None]
    by: dict[str, list[Outcome]] = {}
    for r in said:
        by.setdefault(r.source, []).append(r)
    words = {s: max(rs, key=lambda r: r.seconds).words() for s, rs in by.items()}
    if len(words) <= 1:
        return next(iter(words.values()), "")
    slow = sorted(by, key=lambda s: (-max(r.seconds for r in by[s]), s))
    return ", ".join(f"{words[s]} on {len(by[s])}" for s in slow)


def downloading_words(progress: Iterable[Progress]) -> str:
    """A group whose pods' launchers are still downloading, in a few words: the bytes so far over its
    pods and the longest one's seconds ("downloading 41.3 GB, 312 s"); "" when none said."""
    said = list(progress)
    if not said:
        return ""
    gb = sum(x.bytes for x in said) / 1e9
    return f"downloading {gb:.1f} GB, {max(x.seconds for x in said):.0f} s"
