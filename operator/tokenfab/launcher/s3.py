"""s3:// weights into a node's model cache (thin I/O), with boto3 (in the worker image): what a worker
launcher fetches before its engine starts, and what a weights-fetch pod stages, for
model.source s3://<bucket>/<prefix>.

The objects under the prefix are listed; the endpoint, region and credentials are boto3's own, from the
pod's environment (runtime.env: AWS_ENDPOINT_URL for an S3-compatible store, AWS_REGION,
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from a Secret, or a web identity). Each object whose size or
ETag differs from what the cache's manifest recorded is downloaded (to a temporary name, then renamed),
files the listing no longer has are removed, and the manifest is written again (tokenfab.launcher.manifest;
its commit is a digest of the listing, so the same objects always give the same commit). When nothing
differs and the snapshot verifies, the weights come from the cache. An S3 that does not answer leaves a
verified snapshot in use, said so; with none, the launch fails with S3's words.

The snapshot lives at <cache>/s3/<bucket>/<prefix>. Object names that would leave it (`..`, absolute) or
that the manifest uses are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from tokenfab.launcher import manifest, mirror
from tokenfab.launcher.obtained import EXIT_NOT_FOUND, LaunchError, Obtained, log
from tokenfab.launcher.weights import Fetch

unsafe = mirror.unsafe


def snapshot_dir(fetch: Fetch) -> Path:
    bucket, _, prefix = fetch.repo.partition("/")
    return Path(fetch.cache_dir, "s3", bucket, *PurePosixPath(prefix.strip("/")).parts)


def listing(client: Any, bucket: str, prefix: str) -> mirror.Listing:
    """Every object under `prefix` (as a directory), by its name below it; "directory" markers skipped."""
    base = prefix.strip("/")
    base = f"{base}/" if base else ""
    out: mirror.Listing = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
        for obj in page.get("Contents") or []:
            name = str(obj["Key"])[len(base) :]
            if name and not name.endswith("/"):
                out[name] = (int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
    return out


def obtain(fetch: Fetch, downloading: Callable[[bool], None] = lambda _on: None) -> Obtained:
    """The weights of `fetch` (s3://) in its model cache, downloading what the cache lacks of them."""
    try:
        import boto3
    except ImportError as exc:
        raise LaunchError(
            f"boto3 is not installed: cannot fetch s3://{fetch.repo} (run the tokenfab worker image, "
            "runtime-images/worker)",
            EXIT_NOT_FOUND,
        ) from exc
    what, local = fetch.url(), snapshot_dir(fetch)
    bucket, _, prefix = fetch.repo.partition("/")
    client = boto3.client("s3")
    try:
        objects = listing(client, bucket, prefix)
    except Exception as exc:
        with mirror.locked(local, downloading):  # (not while another pod on the node syncs it)
            verdict = manifest.verify(local)
        if not verdict.ok:
            raise LaunchError(f"weights {what} could not be listed: {type(exc).__name__}: {exc}") from exc
        log(
            f"weights {what}: S3 did not answer ({type(exc).__name__}); the verified snapshot in the cache "
            "may be behind the bucket"
        )
        return Obtained(str(local), "cache", 0.0, f", {verdict.words()}")
    if not objects:
        raise LaunchError(f"weights {what}: no object under s3://{bucket}/{prefix.strip('/')}/")
    bad = sorted(n for n in objects if unsafe(n))
    if bad:
        raise LaunchError(f"weights {what}: object names that would leave the snapshot: {', '.join(bad[:3])}")
    with mirror.locked(local, downloading):  # (another pod on the node may be syncing the same snapshot)
        checked = mirror.current(local, objects)
        if checked:
            return Obtained(str(local), "cache", 0.0, checked)
        todo = mirror.changed(local, objects)
        t0 = time.monotonic()
        downloading(True)
        try:
            mirror.sync(local, objects, todo, lambda name, part: _get(client, bucket, prefix, name, part))
        finally:
            downloading(False)
    log(f"weights {what}: {len(todo)} of {len(objects)} objects fetched")
    return Obtained(str(local), "download", time.monotonic() - t0, "")


def _get(client: Any, bucket: str, prefix: str, name: str, part: Path) -> None:
    base = prefix.strip("/")
    key = f"{base}/{name}" if base else name
    try:
        client.download_file(bucket, key, str(part))
    except Exception as exc:
        raise LaunchError(
            f"weights s3://{bucket}/{key} could not be fetched: {type(exc).__name__}: {exc}"
        ) from exc


__all__ = ["listing", "obtain", "snapshot_dir", "unsafe"]
