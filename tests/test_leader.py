"""Leader election on a Lease (tokenfab.leader) against an in-memory Lease API with the API server's
optimistic concurrency: a leader stopped gracefully hands the Lease back and does not take it again,
and another replica leads at once."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tokenfab import leader


class Leases:
    """read/create/replace of one namespace's Leases, with resourceVersion checks (409 on a stale write)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: dict[str, client.V1Lease] = {}
        self.version = 0

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> client.V1Lease:
        with self.lock:
            if name not in self.leases:
                missing = ApiException(status=404, reason="NotFound")
                missing.body = '{"kind": "Status", "code": 404, "reason": "NotFound"}'
                raise missing
            return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease, **_: Any) -> client.V1Lease:
        with self.lock:
            name = body.metadata["name"] if isinstance(body.metadata, dict) else body.metadata.name
            if name in self.leases:
                raise ApiException(status=409, reason="AlreadyExists")
            self.version += 1
            stored = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name, resource_version=str(self.version)), spec=body.spec
            )
            self.leases[name] = copy.deepcopy(stored)
            return stored

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease, **_: Any) -> Any:
        with self.lock:
            if self.leases[name].metadata.resource_version != body.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            self.version += 1
            body = copy.deepcopy(body)
            body.metadata.resource_version = str(self.version)
            self.leases[name] = body
            return copy.deepcopy(body)

    def holder(self, name: str = leader.LEASE_NAME) -> str | None:
        with self.lock:
            lease = self.leases.get(name)
            return None if lease is None or lease.spec is None else lease.spec.holder_identity


def wait(what: str, cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_released_lease_is_not_taken_back_and_another_replica_leads_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leases = Leases()
    monkeypatch.setattr(leader.client, "CoordinationV1Api", lambda _api=None: leases)
    stopped: list[str] = []

    def elector(name: str) -> leader.Elector:
        return leader.Elector(
            None, lambda: None, lambda: stopped.append(name), namespace="ns", duration=3, renew=2, retry=1
        )

    old = elector("old").start()
    wait("the first replica to lead", old.leading.is_set)
    assert leases.holder() == old.identity
    assert old.release()
    assert leases.holder() is None
    time.sleep(2.5)  # more than two retry periods of the old replica's election
    assert leases.holder() is None, "the replica that handed the Lease back took it again"
    assert stopped == [], "a graceful hand-over is no lost Lease (which would exit the process)"
    new = elector("new").start()
    t0 = time.monotonic()
    wait("the second replica to lead", new.leading.is_set)
    assert time.monotonic() - t0 < 2.5, "an empty Lease is taken at once, not after its duration"
    assert leases.holder() == new.identity


def test_a_renewal_may_take_half_the_renew_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Lease request is bounded by half the renew deadline (5 s of 10), not by the retry period: an API
    server slowed by a burst answers in seconds, and a leader whose every try timed out at 2 s exited."""
    leases = Leases()
    monkeypatch.setattr(leader.client, "CoordinationV1Api", lambda _api=None: leases)
    e = leader.Elector(None, lambda: None, lambda: None, namespace="ns")
    assert e.request_timeout == leader.RENEW * leader.REQUEST_TIMEOUT_SHARE == 5.0
    assert e.lock.api_instance._timeout == 5.0
