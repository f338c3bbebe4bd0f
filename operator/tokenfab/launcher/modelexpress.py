"""hf:// weights from a ModelExpress server's model cache, when the cluster runs one (thin I/O; optional).

ModelExpress (NVIDIA, `modelexpress` on PyPI) keeps models a server already downloaded and streams them to
workers over gRPC, much faster than the hub. When the pod's environment names a server (ModelExpress'
own variables: MODEL_EXPRESS_URL, or MX_SERVER_ADDRESS; set them through runtime.env) and the image has
the `modelexpress` package, the launcher asks that server before the hub: the metadata files, then the
weights, installed as a Hugging Face snapshot in the model cache (ModelCacheClient, pinned to the commit
the server resolves), then the manifest is written like after a hub download. Anything it cannot do
(no package, no answer, a refused revision) is said in the log and the hub serves the weights instead:
ModelExpress is never required. Its peer-to-peer GPU transfer is the engine's (TensorRT-LLM's ModelExpress
loader), not the launcher's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from tokenfab.launcher import manifest
from tokenfab.launcher.weights import Fetch

SERVER_VARIABLES = ("MODEL_EXPRESS_URL", "MX_SERVER_ADDRESS")  # ModelExpress' names, in its order


def server(env: Mapping[str, str]) -> str | None:
    return next((env[v] for v in SERVER_VARIABLES if env.get(v)), None)


def obtain(fetch: Fetch, env: Mapping[str, str], what: str, log: Callable[[str], None]) -> str | None:
    """The snapshot's directory once the ModelExpress server installed it in the model cache; None when
    no server is named, or it could not (the caller goes to the hub)."""
    url = server(env)
    if url is None or fetch.scheme != "hf":
        return None
    try:
        from modelexpress.model_client import ModelCacheClient
    except ImportError:
        log(
            f"weights {what}: {SERVER_VARIABLES[0]} names a ModelExpress server, but this image has no "
            "modelexpress package: from the hub"
        )
        return None
    try:
        with ModelCacheClient(server_url=url, cache_directory=fetch.cache_dir) as client:
            snapshot = Path(client.install_metadata_snapshot(fetch.repo, requested_revision=fetch.revision))
            client.install_weight_files(fetch.repo, snapshot)
    except Exception as exc:
        log(
            f"weights {what}: the ModelExpress server at {url} did not serve them "
            f"({type(exc).__name__}: {exc}): from the hub"
        )
        return None
    manifest.write(snapshot, snapshot.name)  # (a snapshot's directory is named after its commit)
    log(f"weights {what}: commit {snapshot.name} from the ModelExpress server at {url}")
    return str(snapshot)


__all__ = ["SERVER_VARIABLES", "obtain", "server"]
