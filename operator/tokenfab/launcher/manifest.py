"""What a completed download of hf:// or s3:// weights left in the model cache, and the check that it is
still there intact before an engine loads it.

Once a snapshot is fully fetched, the launcher writes `MANIFEST` into it: the commit, and every file's size
and SHA-256 (hashed in parallel: the hashing runs outside the GIL). A later pod on the node loads the
snapshot from the cache only if every file the manifest names is there at its size (cheap: a stat per file)
and, with TOKENFAB_VERIFY_WEIGHTS=full, hashes to its SHA-256 (a full read of the weights: minutes for
hundreds of GB). Otherwise the hub is asked again, which fetches what is missing or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = ".tokenfab-manifest.json"
_SKIP = (MANIFEST, ".tokenfab-complete")
CHUNK = 8 << 20


@dataclass(frozen=True)
class Verdict:
    ok: bool
    files: int
    size: int  # bytes the manifest names
    problems: tuple[str, ...] = ()

    def words(self) -> str:
        gb = self.size / 1e9
        if self.ok:
            return f"{self.files} files, {gb:.1f} GB as its manifest says"
        return "; ".join(self.problems[:3]) + (
            f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
        )


def _files(snapshot: Path) -> list[Path]:
    return sorted(
        p
        for p in snapshot.rglob("*")
        if p.name not in _SKIP
        and not p.name.startswith(MANIFEST)  # (a manifest another pod is writing: its temporary file)
        and (p.is_file() or (p.is_symlink() and p.exists()))
    )


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def write(
    snapshot: Path, commit: str, workers: int = 8, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Hash every file of a completed snapshot and write its manifest (with `extra` keys, e.g. the S3
    ETags); returns it."""
    files = _files(snapshot)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        sums = list(pool.map(sha256, files))
    doc = {
        "commit": commit,
        "files": {
            str(p.relative_to(snapshot)): {"size": p.stat().st_size, "sha256": s}
            for p, s in zip(files, sums, strict=True)
        },
        **(extra or {}),
    }
    # (whole or absent: a crash mid-write leaves no manifest; a temporary file of its own, since the pods
    # of several groups and deployments on one node share its model cache and may finish together)
    fd, name = tempfile.mkstemp(prefix=MANIFEST + ".", suffix=".tmp", dir=snapshot)
    os.fchmod(fd, 0o644)  # (read by the pods of other deployments too, as a plain write leaves it)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(doc, indent=1))
    Path(name).replace(snapshot / MANIFEST)
    return doc


def verify(snapshot: Path, full: bool = False, workers: int = 8) -> Verdict:
    """Whether the snapshot is what its manifest says: every file there at its size (and, `full`, its
    SHA-256). No manifest, or one that cannot be read: not verified."""
    try:
        doc = json.loads((snapshot / MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = dict(doc["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return Verdict(False, 0, 0, ("no manifest of a completed download",))
    problems: list[str] = []
    total = sum(int(f.get("size", 0)) for f in files.values())
    for name, f in sorted(files.items()):
        path = snapshot / name
        if not path.exists():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != int(f["size"]):
            problems.append(f"{name} has {path.stat().st_size} bytes, not {f['size']}")
    if full and not problems:
        names = sorted(files)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            sums = list(pool.map(lambda n: sha256(snapshot / n), names))
        problems += [
            f"{n} does not match its SHA-256"
            for n, s in zip(names, sums, strict=True)
            if s != files[n]["sha256"]
        ]
    return Verdict(not problems, len(files), total, tuple(problems))
