"""Leader election between operator replicas, on a coordination.k8s.io Lease (the official Kubernetes
client's `kubernetes.leaderelection`, with every Lease request bounded by a timeout).

Every replica keeps its watches and cluster view warm; only the one holding the Lease runs reconcile
passes and writes. The leader renews the Lease every `retry` seconds; if it cannot renew for `renew`
seconds it stops writing and exits (a fresh process rejoins as a follower), so a partitioned replica never
keeps acting. A follower takes the Lease once it has seen no renewal for `duration` seconds, counted from
when it last saw one (it looks every `retry` seconds): a SIGKILLed leader is replaced 13 to 19 seconds
later. A leader stopped gracefully finishes the writes it handed out, stops competing and hands the Lease
back (it clears the holder), so a rolling update fails over without waiting.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from tokenfab.adapters import telemetry

log = logging.getLogger("tokenfab")
# The election logs every renewal at INFO (one line each retry period); tokenfab logs the transitions.
logging.getLogger("leaderelection").setLevel(logging.WARNING)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE_NAME = "tokenfab-operator"
DURATION, RENEW, RETRY = 15, 10, 2  # seconds: the Lease's duration, the renew deadline, the retry period
# Each Lease request may take half the renew deadline: an API server slowed by a burst of writes (on a small
# control plane, seconds per request) still answers a renewal, with time for one more try before the
# deadline. (With a 2 s bound, every try of a 10 s deadline could fail under load: the leader exited and
# the fleet waited for the Lease to run out and the next leader to start.)
REQUEST_TIMEOUT_SHARE = 0.5


def lease_namespace() -> str:
    env = os.environ.get("TOKENFAB_LEASE_NAMESPACE")
    if env:
        return env
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return "default"


def identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class _Timed:
    """An API object whose every call carries a timeout, and whose transport failures (no answer) come
    back as an ApiException, which the election treats as a failed attempt to retry."""

    def __init__(self, api: Any, timeout: float, stopping: threading.Event | None = None) -> None:
        self._api = api
        self._timeout = timeout
        self._stopping = stopping or threading.Event()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._api, name)
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._stopping.is_set():  # handed back: the election may not take the Lease again
                raise ApiException(status=0, reason="this replica is stopping")
            kwargs.setdefault("_request_timeout", self._timeout)
            try:
                return fn(*args, **kwargs)
            except ApiException:
                raise
            except Exception as exc:
                raise ApiException(status=0, reason=f"no answer from the API server: {exc}") from exc

        return call


class Elector:
    def __init__(
        self,
        api_client: Any,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        name: str = LEASE_NAME,
        namespace: str | None = None,
        duration: int = DURATION,
        renew: int = RENEW,
        retry: int = RETRY,
    ) -> None:
        self.identity = identity()
        self.lock = LeaseLock(name, namespace or lease_namespace(), self.identity)
        self._stopping = threading.Event()
        leases = client.CoordinationV1Api(api_client)
        self.request_timeout = max(1.0, renew * REQUEST_TIMEOUT_SHARE)
        self._api = _Timed(leases, timeout=max(1.0, retry))  # release() only
        self.lock.api_instance = _Timed(leases, self.request_timeout, self._stopping)  # the election's
        self.leading = threading.Event()
        self._on_started = on_started
        self._on_stopped = on_stopped
        self.config = electionconfig.Config(
            self.lock,
            lease_duration=duration,
            renew_deadline=renew,
            retry_period=retry,
            onstarted_leading=self._started,
            onstopped_leading=self._stopped,
        )
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> Elector:
        log.info(
            "leader election: %s competes for Lease %s/%s", self.identity, self.lock.namespace, self.lock.name
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        leaderelection.LeaderElection(self.config).run()

    def _started(self) -> None:
        log.info("leader election: %s leads", self.identity)
        self.leading.set()
        telemetry.IS_LEADER.set(1)
        self._on_started()

    def _stopped(self) -> None:
        was = self.leading.is_set()
        self.leading.clear()
        telemetry.IS_LEADER.set(0)
        if self._stopping.is_set():
            return  # handed back on a graceful stop: nothing to do
        if was:
            log.error("leader election: %s could not renew the Lease; it stops writing", self.identity)
        self._on_stopped()

    def release(self) -> bool:
        """Hand the Lease back (graceful stop): a follower takes it at once instead of after `duration`.
        The election stops first, so this replica does not take the empty Lease again on its next
        renewal (a renewal already in flight fails on the changed resourceVersion)."""
        self._stopping.set()
        if not self.leading.is_set():
            return False
        self.leading.clear()
        telemetry.IS_LEADER.set(0)
        try:
            api = self._api
            lease = api.read_namespaced_lease(self.lock.name, self.lock.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return False
            lease.spec.holder_identity = None
            api.replace_namespaced_lease(self.lock.name, self.lock.namespace, lease)
            log.info("leader election: %s released the Lease", self.identity)
            return True
        except ApiException as exc:
            log.warning("leader election: could not release the Lease: %s", exc.reason)
            return False
