"""hf:// weights into a node's model cache (thin I/O): the worker launcher's fetch before its engine starts,
and `python3 -m tokenfab.launcher --fetch-only`, which a weights-fetch pod runs to stage them ahead of need.

`obtain` asks the model cache, then the hub, following tokenfab.launcher.weights.weights_source: a pinned
commit whose snapshot a completed download left and its manifest verifies loads from the cache; otherwise
the hub names the commit and what the cache lacks of it is fetched, then the manifest is written
(tokenfab.launcher.manifest). `main_fetch_only` runs it alone, from the pod's environment.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tokenfab.launcher import manifest, modelexpress, progress
from tokenfab.launcher.obtained import EXIT_FAILED, EXIT_NOT_FOUND, LaunchError, Obtained, log
from tokenfab.launcher.weights import FETCHED, Fetch, weights_source
from tokenfab.planning import contract

TERMINATION_LOG = "/dev/termination-log"  # the container's terminationMessagePath (Kubernetes' default)
ENV_TERMINATION_LOG = "TOKENFAB_TERMINATION_LOG"  # another path (tests)


def obtain(
    fetch: Fetch, env: Mapping[str, str], downloading: Callable[[bool], None] = lambda _on: None
) -> Obtained:
    """The weights of `fetch` in its model cache, downloaded if they must be (`downloading` is told while
    a download runs: a signal then stops it at once; the log then has its bytes so far every few seconds,
    tokenfab.launcher.progress)."""
    downloading = progress.Progress(Path(fetch.cache_dir), progress.interval(env), log, downloading)
    if fetch.scheme == "s3":
        from tokenfab.launcher import s3  # (the same I/O layer; boto3 is imported there, when needed)

        return s3.obtain(fetch, downloading)
    if fetch.scheme == "pvc":
        from tokenfab.launcher import mirror

        return mirror.copy(fetch, env, downloading)
    try:  # both names now: a missing one is the image's fault (127), before anything is fetched
        from huggingface_hub import HfApi, snapshot_download  # noqa: F401  (HfApi: _download's)
    except ImportError as exc:
        raise LaunchError(
            f"huggingface_hub is not installed: cannot fetch hf://{fetch.repo} (run the tokenfab worker "
            "image, runtime-images/worker)",
            EXIT_NOT_FOUND,
        ) from exc
    what = f"hf://{fetch.repo}@{fetch.revision or 'main'}"
    try:
        local = snapshot_download(
            fetch.repo, revision=fetch.revision, cache_dir=fetch.cache_dir, local_files_only=True
        )
    except Exception:
        local = None
    full = env.get("TOKENFAB_VERIFY_WEIGHTS", "").lower() == "full"
    verdict = manifest.verify(Path(local), full) if local is not None else None
    if verdict is not None and not verdict.ok:
        log(f"weights {what}: the cached snapshot is not verified: {verdict.words()}")
    offline = env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    source = weights_source(fetch.revision, local is not None, bool(verdict and verdict.ok), offline)
    t0 = time.monotonic()
    if source == "download":
        downloading(True)
        try:
            peer = modelexpress.obtain(fetch, env, what, log)
            source, local = ("modelexpress", peer) if peer else (source, _download(fetch, what, local))
        finally:
            downloading(False)
    if local is None:
        raise LaunchError(f"weights {what} are not in the model cache {fetch.cache_dir} and the hub is off")
    checked = f", {verdict.words()}" + (" and SHA-256" if full else "") if verdict and verdict.ok else ""
    return Obtained(local, source, time.monotonic() - t0, checked)


def _download(fetch: Fetch, what: str, local: str | None) -> str | None:
    """The hub names the commit (a branch or tag may have moved), then what the cache lacks of it is
    fetched and the snapshot marked complete; a hub that does not answer leaves the cached snapshot
    (`local`), said so. Returns the snapshot's directory (None: none)."""
    from huggingface_hub import HfApi, snapshot_download  # imported by obtain already

    try:
        commit = HfApi().model_info(fetch.repo, revision=fetch.revision, timeout=60).sha
    except Exception as exc:
        if local is None:
            raise LaunchError(f"weights {what} could not be fetched: {type(exc).__name__}: {exc}") from exc
        log(
            f"weights {what}: the hub did not answer ({type(exc).__name__}); the cached snapshot "
            "may be incomplete or behind the branch"
        )
        return local
    log(f"weights {what}: commit {commit}, fetching what {fetch.cache_dir} lacks of it")
    _quiet_hub()
    try:
        fetched: str = snapshot_download(fetch.repo, revision=commit, cache_dir=fetch.cache_dir)
    except Exception as exc:
        raise LaunchError(f"weights {what} could not be fetched: {type(exc).__name__}: {exc}") from exc
    t0 = time.monotonic()
    doc = manifest.write(Path(fetched), commit)
    log(f"weights {what}: manifest of {len(doc['files'])} files written in {time.monotonic() - t0:.0f} s")
    return fetched


def _quiet_hub() -> None:
    """The hub client's progress bars off: the launcher's weights-progress lines say how far a download
    is, and a bar's updates (carriage returns, many a second) would fill the head of the log, where the
    operator reads the weights-result line."""
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        return
    disable_progress_bars()


def fetch_of_env(env: Mapping[str, str]) -> Fetch | None:
    """The hf:// or s3:// weights a weights-fetch pod stages (its model source, revision and cache
    directory, the names a worker pod carries too); None for another source or a missing variable."""
    scheme, _, repo = env.get(contract.ENV_MODEL_SOURCE, "").partition("://")
    cache = env.get(contract.ENV_MODEL_CACHE, "")
    if scheme not in FETCHED or not repo or not cache:
        return None
    return Fetch(repo, env.get(contract.ENV_MODEL_REVISION) or None, cache, scheme)


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # (PID 1 ignores SIGTERM without a handler: the pod would wait its grace)


def main_fetch_only(env: Mapping[str, str]) -> int:
    """Stage the weights and exit: 0 once they are complete in the cache and their manifest verifies (the
    log says where they came from), 78 for a pod without hf:// weights to fetch, 1 (or 127) when they
    cannot be had or are not verified (a hub that did not answer leaves an unverified snapshot: it does
    not count as staged). SIGTERM or SIGINT stops a download at once."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    fetch = fetch_of_env(env)
    if fetch is None:
        log(
            f"--fetch-only needs {contract.ENV_MODEL_SOURCE}=hf://<org>/<repo> or s3://<bucket>/<prefix> and "
            f"{contract.ENV_MODEL_CACHE} (the model cache's directory): nothing to fetch"
        )
        return 78
    what = fetch.url()
    try:
        got = obtain(fetch, env)
    except LaunchError as err:
        log(str(err))
        return err.code
    # (a cached snapshot was verified by obtain; a fresh download wrote its manifest, checked by size here;
    # the hub's silence or HF_HUB_OFFLINE leaves a snapshot only a manifest can vouch for)
    verdict = None if got.source == "cache" else manifest.verify(Path(got.path))
    if verdict is not None and not verdict.ok:
        log(f"weights {what}: {got.path} is not verified ({verdict.words()}): not staged")
        return EXIT_FAILED
    log(f"weights {what}: {got.path} ({got.origin()}); staged")
    report(env, got)
    return 0


def result(got: Obtained) -> dict[str, object]:
    """Where the weights came from, their bytes and files (the manifest's), and the download's seconds."""
    v = manifest.verify(Path(got.path))  # (a stat per file)
    return {"source": got.source, "bytes": v.size, "files": v.files, "seconds": round(got.seconds, 1)}


def log_result(got: Obtained) -> dict[str, object]:
    """`result` as the log's weights-result line (the operator reads it into the group's status)."""
    doc = result(got)
    log(progress.line(contract.LOG_WEIGHTS_RESULT, doc))
    return doc


def report(env: Mapping[str, str], got: Obtained) -> None:
    """The pod's termination message (read by the operator into status.weightsCache.staged) and its log's
    weights-result line: `result`. Best effort: a container without the file only loses the figures."""
    message = log_result(got)
    try:
        Path(env.get(ENV_TERMINATION_LOG) or TERMINATION_LOG).write_text(json.dumps(message))
    except OSError as exc:
        log(f"the termination message was not written ({exc}): {json.dumps(message)}")
