"""Expectations: a deployment waits until the view shows its own last writes, or until they lapse."""

from __future__ import annotations

from tests import kube_objects
from tokenfab.fleet.expectations import Expectations
from tokenfab.fleet.view import ClusterView

M, N = ("ml", "m"), ("ml", "n")


def test_nothing_expected_is_satisfied():
    e = Expectations()
    e.expect(M, 0.0)  # an empty expectation is no expectation
    assert e.satisfied(M, ClusterView(), 0.0)


def test_created_pods_must_appear():
    view, e = ClusterView(), Expectations()
    e.expect(M, 0.0, created={"m-g0-0", "m-g0-1"})
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("ADDED", kube_objects.pod("m-g0-0", gated=True))
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("ADDED", kube_objects.pod("m-g0-1", gated=True))
    assert e.satisfied(M, view, 1.0)
    # Met and forgotten: the pod going away later does not bring it back.
    view.on_pod("DELETED", kube_objects.pod("m-g0-1"))
    assert e.satisfied(M, view, 1.0)


def test_deleted_pods_must_be_gone_or_terminating():
    view, e = ClusterView(), Expectations()
    for name in ("m-g0-0", "m-g0-1"):
        view.on_pod("ADDED", kube_objects.pod(name, node="a-0", phase="Running"))
    e.expect(M, 0.0, deleted={"m-g0-0", "m-g0-1"})
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("MODIFIED", kube_objects.pod("m-g0-0", node="a-0", phase="Running", deleting=True))
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("DELETED", kube_objects.pod("m-g0-1", node="a-0"))
    assert e.satisfied(M, view, 1.0)


def test_released_pods_must_lose_their_gate():
    view, e = ClusterView(), Expectations()
    view.on_pod("ADDED", kube_objects.pod("m-g0-0", gated=True))
    view.on_pod("ADDED", kube_objects.pod("m-g0-1", gated=True))
    e.expect(M, 0.0, released={"m-g0-0", "m-g0-1"})
    view.on_pod("MODIFIED", kube_objects.pod("m-g0-0"))
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("DELETED", kube_objects.pod("m-g0-1"))  # gone: nothing more to wait for
    assert e.satisfied(M, view, 1.0)


def test_everything_expected_must_be_met():
    view, e = ClusterView(), Expectations()
    view.on_pod("ADDED", kube_objects.pod("m-g0-0", node="a-0"))
    e.expect(M, 0.0, created={"m-g1-0"}, deleted={"m-g0-0"})
    view.on_pod("ADDED", kube_objects.pod("m-g1-0", gated=True))
    assert not e.satisfied(M, view, 1.0)
    view.on_pod("DELETED", kube_objects.pod("m-g0-0"))
    assert e.satisfied(M, view, 1.0)


def test_expectations_lapse_after_the_ttl_since_the_last_write():
    view, e = ClusterView(), Expectations(ttl=30.0)
    e.expect(M, 0.0, created={"m-g0-0"})
    assert not e.satisfied(M, view, 30.0)
    e.expect(M, 20.0, created={"m-g1-0"})  # a later write: the clock starts again
    assert not e.satisfied(M, view, 45.0)
    assert e.satisfied(M, view, 50.5)  # a lost event does not stall the deployment for good
    assert e.satisfied(M, view, 50.6)  # and it is forgotten


def test_deployments_are_independent_and_can_be_forgotten():
    view, e = ClusterView(), Expectations()
    e.expect(M, 0.0, created={"m-g0-0"})
    e.expect(N, 0.0, created={"n-g0-0"})
    view.on_pod("ADDED", kube_objects.pod("n-g0-0", "n", gated=True))
    assert e.satisfied(N, view, 1.0)
    assert not e.satisfied(M, view, 1.0)
    e.forget(M)
    assert e.satisfied(M, view, 1.0)


def test_a_namespace_is_part_of_the_key():
    view, e = ClusterView(), Expectations()
    e.expect(M, 0.0, created={"m-g0-0"})
    view.on_pod("ADDED", kube_objects.pod("m-g0-0", "m", "team-b", gated=True))  # same name, other namespace
    assert not e.satisfied(M, view, 1.0)
