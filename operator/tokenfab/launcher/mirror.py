"""Keeping a snapshot in the model cache equal to a listing of files (thin I/O): what s3:// weights
(tokenfab.launcher.s3) and pvc:// weights copied from their claim (`copy`) share.

A listing names each file under the source with its size and a version stamp (an S3 ETag; a file's
modification time). The manifest written after a sync (tokenfab.launcher.manifest) records the stamps; a
later sync fetches only the files whose size or stamp differ or that are not on disk at their size,
removes the files the listing no longer has, and writes the manifest again, with the listing's digest as
its commit. Nothing differs and the snapshot verifies: the weights come from the cache. A file is fetched
to a temporary name and renamed; the manifest goes first, so a sync cut short leaves none.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tokenfab.launcher import manifest
from tokenfab.launcher.obtained import LaunchError, Obtained, log
from tokenfab.launcher.weights import Fetch
from tokenfab.planning import contract

Listing = dict[str, tuple[int, str]]  # file name under the source -> (bytes, version stamp)
ENV_MODEL_MOUNT = "TOKENFAB_MODEL_MOUNT"  # where the pvc:// claim is mounted (tests; the pod's is /models)


def unsafe(name: str) -> bool:
    """A name that would land outside the snapshot, or on the manifest's own files."""
    parts = PurePosixPath(name).parts
    return name.startswith("/") or ".." in parts or any(p.startswith(".tokenfab") for p in parts)


def digest(files: Listing) -> str:
    """The listing's identity: the same names, sizes and stamps give the same commit."""
    text = json.dumps(sorted((n, s, e) for n, (s, e) in files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def recorded(local: Path) -> Listing:
    """What the cache's manifest says it holds (name -> bytes, stamp); empty without a readable one."""
    try:
        doc = json.loads((local / manifest.MANIFEST).read_text())
        stamps: Mapping[str, str] = doc.get("etags") or {}
        return {n: (int(f["size"]), str(stamps.get(n, ""))) for n, f in doc["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def changed(local: Path, files: Listing) -> list[str]:
    """The files the cache lacks: not recorded as they are now, or not on disk at their size."""
    had = recorded(local)
    return sorted(
        n
        for n, (size, stamp) in files.items()
        if had.get(n) != (size, stamp) or not (local / n).is_file() or (local / n).stat().st_size != size
    )


def current(local: Path, files: Listing) -> str:
    """ ", complete ..." when the snapshot holds exactly the listing and verifies, else ""."""
    verdict = manifest.verify(local)
    ok = verdict.ok and not changed(local, files) and recorded(local).keys() == files.keys()
    return f", {verdict.words()}" if ok else ""


@contextmanager
def locked(local: Path, waiting: Callable[[bool], None] = lambda _on: None) -> Iterator[None]:
    """One sync of a snapshot at a time on a node: the pods of several groups, and of several deployments
    of one source, share the node's model cache; a second pod waits for the first's sync (an exclusive
    lock on a file beside the snapshot, released when its process ends) and then finds it current.
    `waiting` is told while it waits (as while it downloads: a signal then stops it at once)."""
    lock = local.with_name(local.name + ".tokenfab-lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:  # (read-write where it may: a lock over NFS needs it; read-only on another user's file)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            fd = os.open(lock, os.O_RDONLY)
    except OSError as exc:
        raise LaunchError(f"the model cache's lock {lock} could not be opened: {exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another pod on this node is syncing {local}: waiting for it")
            waiting(True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                waiting(False)
        yield
    finally:
        os.close(fd)  # (the lock goes with the descriptor)


def sync(local: Path, files: Listing, todo: list[str], get: Callable[[str, Path], object]) -> None:
    """Fetch `todo` into `local` (`get(name, part)` writes one file to `part`), remove what the listing no
    longer has, and write the manifest of the whole listing."""
    (local / manifest.MANIFEST).unlink(missing_ok=True)
    for name in todo:
        path = local / name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".tokenfab-part")
        get(name, part)
        part.replace(path)
    for path in [p for p in local.rglob("*") if p.is_file()]:
        name = path.relative_to(local).as_posix()
        if name not in files and not name.startswith(".tokenfab"):
            path.unlink()
    manifest.write(local, digest(files), extra={"etags": {n: e for n, (_, e) in files.items()}})


def tree(root: Path) -> Listing:
    """Every file under `root` (following symbolic links to files), with its size and modification time."""
    out: Listing = {}
    for base, _dirs, names in os.walk(root):
        for n in names:
            st = (Path(base) / n).stat()
            out[(Path(base) / n).relative_to(root).as_posix()] = (st.st_size, str(st.st_mtime_ns))
    return out


def copy(fetch: Fetch, env: Mapping[str, str], downloading: Callable[[bool], None]) -> Obtained:
    """pvc:// weights: from the claim mounted at /models into the model cache (pvc/<claim>/<path>), copying
    what changed since the last copy."""
    claim, _, sub = fetch.repo.partition("/")
    source = Path(env.get(ENV_MODEL_MOUNT) or contract.MODEL_MOUNT, *PurePosixPath(sub.strip("/")).parts)
    local = Path(fetch.cache_dir, "pvc", claim, *PurePosixPath(sub.strip("/")).parts)
    what = fetch.url()
    if not source.is_dir():
        raise LaunchError(f"weights {what}: {source} is not a directory (the claim is mounted at its root)")
    files = tree(source)
    if not files:
        raise LaunchError(f"weights {what}: no file under {source}")
    with locked(local, downloading):
        checked = current(local, files)
        if checked:
            return Obtained(str(local), "cache", 0.0, checked)
        todo = changed(local, files)
        t0 = time.monotonic()
        downloading(True)
        try:
            sync(local, files, todo, lambda name, part: shutil.copyfile(source / name, part))
        except OSError as exc:
            raise LaunchError(f"weights {what} could not be copied: {type(exc).__name__}: {exc}") from exc
        finally:
            downloading(False)
    log(f"weights {what}: {len(todo)} of {len(files)} files copied")
    return Obtained(str(local), "copy", time.monotonic() - t0, "")


__all__ = [
    "ENV_MODEL_MOUNT",
    "Listing",
    "changed",
    "copy",
    "current",
    "digest",
    "locked",
    "recorded",
    "sync",
    "tree",
    "unsafe",
]
