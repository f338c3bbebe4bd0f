"""A role that left the spec is planned with the shape its groups were made with, even when
topology.gpusPerNode changed in the same edit (the spec's value no longer divides its GPUs)."""

from __future__ import annotations

from dataclasses import replace

from testing.cases import load_example
from tests.planning.test_groups import group
from tokenfab.api.errors import parse_model_deployment
from tokenfab.planning.one_pass import observed_shape as _observed_shape


def test_the_shape_of_a_retired_role_comes_from_its_groups():
    doc = load_example("deepseek-r1-disaggregated.yaml")
    doc["spec"]["topology"]["gpusPerNode"] = 8
    spec = parse_model_deployment(doc).spec
    g = group(0, "a-0", "a-1", "a-2")  # 3 pods; made as 12 GPUs on 4-GPU nodes
    g = replace(g, gpus=12, size=3)
    shape = _observed_shape([g], spec)
    assert (shape.gpus, shape.nodes, shape.pod_gpus) == (12, 3, 4)
    one = replace(g, size=1, pods=g.pods[:1])
    assert _observed_shape([one], spec).nodes == 1


def test_drain_mode_sigterm_deletes_at_once_and_reads_nothing():
    from tokenfab.adapters import metrics
    from tokenfab.observe import drain_policy

    doc = load_example("deepseek-r1-disaggregated.yaml")
    doc["spec"]["serving"]["drainSeconds"] = 600
    doc["spec"].setdefault("autoscaling", {})["prometheusUrl"] = "http://127.0.0.1:9090"
    reads: list[str] = []

    def read(url: str, query: str) -> metrics.Reading:
        reads.append(query)
        return metrics.Reading(samples={})

    surplus = {"decode": [group(0, "a-0"), group(1, "a-1")]}  # one more group than wanted: one leaves
    doc["spec"]["serving"]["drainMode"] = "sigterm"
    policy = drain_policy(parse_model_deployment(doc).spec, surplus, {"decode": 1}, read, "ns", "ds")
    assert (policy.seconds, policy.inflight, reads) == (600.0, None, [])
    # routing (the default) reads the engines' in-flight requests for the group that leaves
    doc["spec"]["serving"].pop("drainMode")
    policy = drain_policy(parse_model_deployment(doc).spec, surplus, {"decode": 1}, read, "ns", "ds")
    assert (policy.seconds, policy.inflight, len(reads)) == (600.0, {}, 1)
