"""A role that left the spec is planned with the shape its groups were made with, even when
topology.gpusPerNode changed in the same edit (the spec's value no longer divides its GPUs)."""

from __future__ import annotations

from dataclasses import replace

from tests.cases import load_example
from tests.test_groups import group
from tokenfab.api.errors import parse_model_deployment
from tokenfab.reconcile import _observed_shape


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
