"""The API server as the fleet runner talks to it: `Api`, one HTTP client for the runner's process (the
kubernetes package's transport, JSON in and out), whose failures are `pods.PodError`s."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as kclient
from kubernetes import config as kconfig
from urllib3.util.retry import Retry

from e2e.fleet import pods


class Api:
    """The API server as this simulated kubelet talks to it: one HTTP client in this process, JSON in and
    out. (A kubectl per call costs a Go process start: on 2 shared cores the pods of a burst each waited
    seconds for their own.)"""

    def __init__(self, kubeconfig: str, timeout: float = 30) -> None:
        cfg = kclient.Configuration()
        kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        # A dropped connection is tried again at once; a read that timed out is not (the loop's next
        # tick is), so a call waits at most its timeout, as a kubectl's did.
        cfg.retries = Retry(total=2, read=0, redirect=0)
        self.client = kclient.ApiClient(cfg)
        self.timeout = timeout

    def __call__(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
        try:
            m, url, hdrs, payload, _ = self.client.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.client.call_api(m, url, hdrs, payload, _request_timeout=self.timeout)
            data = resp.read()
        except Exception as exc:  # (the transport's: refused, timed out, TLS)
            raise pods.PodError(f"{method} {path}: {exc}") from exc
        if not 200 <= resp.status < 300:
            said = bytes(data or b"")[:300].decode(errors="replace")
            raise pods.PodError(f"{method} {path}: {resp.status} {said}")
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise pods.PodError(f"{method} {path}: not JSON: {exc}") from exc
