"""The API adapter's own waits kept out of a pass: discovery of optional kinds (PodGroup, ComputeDomain)
asked once, then refreshed in the background; the writer's threads started before the first pass."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tokenfab.adapters import kube as kube_mod
from tokenfab.adapters.kube import ApiError, Kube

API = "scheduling.k8s.io/v1beta1"


class Discovery(Kube):
    """A Kube whose only request is discovery, answered from `served` (and held while `gate` is clear)."""

    def __init__(self) -> None:
        super().__init__(api_client=None, workers=2)
        self.served = True
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail: ApiError | None = None

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        assert (method, path) == ("GET", f"/apis/{API}")
        self.calls += 1
        self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        return {"resources": [{"kind": "PodGroup"}] if self.served else []}


def wait_until(cond: Any) -> None:
    deadline = time.monotonic() + 5
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_first_answer_is_asked_then_kept_while_fresh():
    k = Discovery()
    assert k.has_kind(API, "PodGroup") is True
    assert k.has_kind(API, "PodGroup") is True
    assert k.has_kind(API, "Other") is False  # another kind of the same group: asked for itself
    assert k.calls == 2


def test_a_stale_answer_is_given_at_once_and_refreshed_once_in_the_background(monkeypatch):
    k = Discovery()
    assert k.has_kind(API, "PodGroup") is True
    monkeypatch.setattr(kube_mod, "KIND_RECHECK_SECONDS", 0.0)
    k.served = False  # the CRD is removed
    k.gate.clear()  # the refresh hangs for now
    t0 = time.monotonic()
    assert k.has_kind(API, "PodGroup") is True  # the last answer, without waiting
    assert k.has_kind(API, "PodGroup") is True
    assert time.monotonic() - t0 < 1.0
    wait_until(lambda: k.calls == 2)
    time.sleep(0.05)
    assert k.calls == 2  # one refresh in flight, not one per call
    k.gate.set()
    wait_until(lambda: k.has_kind(API, "PodGroup") is False)


def test_warm_kinds_answers_before_the_first_pass_asks():
    k = Discovery()
    k.warm_kinds([(API, "PodGroup")])
    wait_until(lambda: k.calls == 1)
    wait_until(lambda: (API, "PodGroup") in k._kinds)
    assert k.has_kind(API, "PodGroup") is True
    assert k.calls == 1


def test_a_failed_refresh_keeps_the_last_answer(monkeypatch):
    k = Discovery()
    assert k.has_kind(API, "PodGroup") is True
    monkeypatch.setattr(kube_mod, "KIND_RECHECK_SECONDS", 0.0)
    k.fail = ApiError(500, "InternalError", "etcd is down", "GET", "discovery")
    assert k.has_kind(API, "PodGroup") is True
    wait_until(lambda: k.calls >= 2 and not k._rediscovering)
    assert k.has_kind(API, "PodGroup") is True
    # The very first answer is asked directly: its failure reaches the caller.
    fresh = Discovery()
    fresh.fail = k.fail
    with pytest.raises(ApiError):
        fresh.has_kind(API, "PodGroup")


def test_start_writers_starts_every_writer_thread_at_once():
    k = Discovery()
    k.start_writers()
    wait_until(lambda: len(k.pool._threads) == 2)
    before = set(k.pool._threads)
    for f in [k.pool.submit(time.sleep, 0.05) for _ in range(4)]:
        f.result()
    assert set(k.pool._threads) == before  # no thread started on demand later
