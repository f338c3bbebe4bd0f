"""The fleet controller: what it watches (every stream filtered at the API server, each pod event once),
and how a pass hands its writes on without a worker waiting for them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from tokenfab.controller import Controller, Options
from tokenfab.fleet.workqueue import WorkQueue
from tokenfab.planning import contract
from tokenfab.runtime import Result


def sources(namespaces: list[str]) -> dict[str, Any]:
    ctl = Controller(kube=None, options=Options(namespaces=namespaces))  # type: ignore[arg-type]
    return {inf.source.name: inf.source for inf in ctl.informers}


def test_serving_every_namespace_tokenfab_pods_come_by_one_watch_only():
    s = sources([])
    managed = f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}"
    assert s["Pod"].label_selector == managed
    assert s["ForeignPod"].label_selector == f"{contract.MANAGED_BY}!={contract.MANAGED_BY_VALUE}"
    assert "spec.nodeName!=" in s["ForeignPod"].field_selector
    for name in ("ConfigMap", "Service", "Deployment", "PodDisruptionBudget"):
        assert s[name].label_selector == managed


def test_serving_some_namespaces_tokenfab_pods_elsewhere_count_as_anyones():
    s = sources(["ml", "serving"])
    assert s["ForeignPod"].label_selector == ""  # those of other namespaces hold GPUs too
    assert {n for n in s if n.startswith("Pod@")} == {"Pod@ml", "Pod@serving"}


def test_with_the_dra_driver_its_channel_templates_are_watched_by_the_drivers_label():
    ctl = Controller(kube=None, options=Options(namespaces=["ml"]))  # type: ignore[arg-type]
    s = {inf.source.name: inf.source for inf in ctl.driver_informers()}
    assert set(s) == {"ComputeDomain@ml", "ResourceClaimTemplate@ml"}
    assert s["ComputeDomain@ml"].label_selector == f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}"
    rct = s["ResourceClaimTemplate@ml"]
    assert (rct.api_version, rct.kind, rct.namespace) == ("resource.k8s.io/v1", "ResourceClaimTemplate", "ml")
    # (the driver's daemon templates say Daemon: not watched)
    assert rct.label_selector == "resource.nvidia.com/computeDomainTarget=Workload"


# ------------------------------------------------------------------ a pass hands its writes on


class Pass:
    """A stand-in for reconcile.Pass: a pass whose writes are the futures the test completes."""

    def __init__(self, writes: int, fail: bool = False) -> None:
        self.writes = [Future[Any]() for _ in range(writes)]
        self.completed = threading.Event()
        self.fail = fail

    def __call__(self, ctx: Any, key: Any, now: float) -> Pass:
        return self

    def begin(self) -> None:
        pass

    @property
    def pending(self) -> list[Future[Any]]:
        return list(self.writes)

    def finish(self) -> Result:
        assert all(f.done() for f in self.writes)  # only once the API server answered them all
        if self.fail:
            raise RuntimeError("boom")
        self.completed.set()
        return Result()


def controller() -> Controller:
    ctl = Controller(kube=None)  # type: ignore[arg-type]
    ctl.queue = WorkQueue(base_delay=30.0)  # a failure's retry stays out of the way of the test
    return ctl


def test_a_worker_does_not_wait_for_the_writes_of_its_pass(monkeypatch):
    ctl, key = controller(), ("ml", "m")
    p = Pass(writes=2)
    monkeypatch.setattr("tokenfab.controller.Pass", p)
    ctl.queue.add(key)
    assert ctl.queue.get(timeout=0) == key
    assert ctl.process(key) is True  # handed on: the worker is free
    assert not p.completed.is_set()
    assert f"writes:{key[0]}/{key[1]}" in ctl.busy
    ctl.queue.add(key)  # an event meanwhile: no second pass of the same deployment yet
    assert ctl.queue.get(timeout=0.05) is None
    p.writes[0].set_result(None)
    assert not p.completed.wait(0.1)
    p.writes[1].set_result(None)
    assert p.completed.wait(5)
    assert ctl.queue.get(timeout=5) == key  # done, and queued again for the event
    assert not ctl.busy


def test_a_pass_without_writes_in_flight_completes_in_the_worker(monkeypatch):
    ctl, key = controller(), ("ml", "m")
    p = Pass(writes=0)
    monkeypatch.setattr("tokenfab.controller.Pass", p)
    assert ctl.process(key) is False
    assert p.completed.is_set()


def test_a_pass_failing_after_its_writes_is_retried_with_backoff(monkeypatch):
    ctl, key = controller(), ("ml", "m")
    p = Pass(writes=1, fail=True)
    monkeypatch.setattr("tokenfab.controller.Pass", p)
    ctl.queue.add(key)
    ctl.queue.get(timeout=0)
    assert ctl.process(key) is True
    p.writes[0].set_exception(RuntimeError("refused"))
    deadline = time.monotonic() + 5
    while ctl.queue.failures(key) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctl.queue.failures(key) == 1  # retried later, not lost
    ctl.stop()


def test_a_graceful_stop_lets_started_writes_finish_and_drops_the_queued_ones():
    """Before the Lease is handed back: a write the API server is answering finishes, one not started
    yet never goes out (the next leader rebuilds from the cluster), and stop() returns within its bound."""
    from concurrent.futures import ThreadPoolExecutor

    class Kube:
        pool = ThreadPoolExecutor(1)

    ctl = Controller(kube=Kube())  # type: ignore[arg-type]
    done: list[str] = []

    def write(name: str, seconds: float) -> None:
        time.sleep(seconds)
        done.append(name)

    Kube.pool.submit(write, "in flight", 0.5)
    queued = Kube.pool.submit(write, "queued", 0.0)
    time.sleep(0.1)
    t0 = time.monotonic()
    ctl.stop(drain_seconds=5.0)
    assert done == ["in flight"]
    assert queued.cancelled()
    assert time.monotonic() - t0 < 3.0


def test_a_deleted_deployment_keeps_its_reservations_while_its_creates_may_be_in_flight():
    from tests import kube_objects

    ctl = Controller(kube=None)  # type: ignore[arg-type]
    body = kube_objects.model_deployment("m", "ml")
    ctl.on_model_deployment("ADDED", body)
    with ctl.ledger.session() as s:
        s.reserve(("ml", "m"), "m-worker-0", {"m-worker-0-0": ("a-0", {kube_objects.GPU: 4})}, time.time())
    ctl.on_model_deployment("DELETED", body)
    assert [r.group for r in ctl.ledger.reservations()] == ["m-worker-0"]
