"""Capacity as the scheduler sees it: quantities, taints and tolerations, feasibility, usable GPUs and the
per-domain snapshot placement works from."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tokenfab.planning.capacity import (
    Constraints,
    NodeFacts,
    Taint,
    Toleration,
    add,
    feasible,
    parse_quantity,
    pods_that_fit,
    snapshot,
    to_units,
    untolerated,
    usable_gpus,
)
from tokenfab.planning.topology import Domain

GPU = "nvidia.com/gpu"
LABEL = "nvidia.com/gpu.clique"
GI = 2**30

# ------------------------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        ("500m", Decimal("0.5")),
        ("1.5", Decimal("1.5")),
        ("0.1", Decimal("0.1")),
        ("4Gi", Decimal(4 * GI)),
        ("1Ki", Decimal(1024)),
        ("1Mi", Decimal(2**20)),
        ("1Ti", Decimal(2**40)),
        ("1Pi", Decimal(2**50)),
        ("1Ei", Decimal(2**60)),
        ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)),
        ("1G", Decimal(10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("2E", Decimal(2 * 10**18)),  # E alone is exa, not an exponent
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("1e-3", Decimal("0.001")),
        ("5n", Decimal("5e-9")),
        ("5u", Decimal("5e-6")),
        ("+1", Decimal(1)),
        ("-1", Decimal(-1)),
        (" 8 ", Decimal(8)),
        (".5", Decimal("0.5")),
        (3, Decimal(3)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "abc",
        "1K",
        "1kb",
        "1Gb",
        "Gi",
        "1..2",
        ".",
        "1e",
        "1 Gi",
        "--1",
        "1/2",
        "1e3Mi",
        "1e3m",
        "2E-1k",
        True,
        float("inf"),
        float("nan"),
    ],
)
def test_parse_quantity_refuses_what_is_not_a_quantity(bad):
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)


@pytest.mark.parametrize(
    ("resource", "value", "units"),
    [
        ("cpu", "2", 2000),
        ("cpu", "500m", 500),
        ("cpu", "0.1", 100),
        ("cpu", "1.0005", 1001),  # a fraction of a millicore rounds up, as the scheduler counts
        ("cpu", "100u", 1),
        ("cpu", 4, 4000),
        ("memory", "4Gi", 4 * GI),
        ("memory", "1G", 10**9),
        ("memory", "1.5", 2),  # bytes: up
        ("memory", "100m", 1),
        (GPU, "8", 8),
        (GPU, 4, 4),
        ("ephemeral-storage", "10Gi", 10 * GI),
    ],
)
def test_to_units(resource, value, units):
    assert to_units(resource, value) == units
    assert isinstance(to_units(resource, value), int)


def test_to_units_refuses_bad_input():
    with pytest.raises(ValueError, match="not a quantity"):
        to_units("cpu", "two")
    with pytest.raises(ValueError, match="not a quantity"):
        to_units("memory", float("inf"))


def test_add_and_subtract_resources():
    assert add({"cpu": 1000, GPU: 4}, {"cpu": 500, "memory": 10}) == {"cpu": 1500, GPU: 4, "memory": 10}
    assert add({"cpu": 1000}, {"cpu": 1500, GPU: 1}, -1) == {"cpu": -500, GPU: -1}


# ------------------------------------------------------------------------------------ taints, tolerance

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        # Equal: key and value must match.
        (Toleration("nvidia.com/gpu", "Equal", "present", "NoSchedule"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "absent", "NoSchedule"), GPU_TAINT, False),
        (Toleration("other", "Equal", "present", "NoSchedule"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Equal", "", "NoSchedule"), GPU_TAINT, False),
        (Toleration("k", "Equal", "", ""), Taint("k", "", "NoSchedule"), True),  # empty values match
        # Exists: the key alone (any value).
        (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"), GPU_TAINT, True),
        (Toleration("other", "Exists", "", "NoSchedule"), GPU_TAINT, False),
        # Exists with an empty key tolerates every taint (of its effect, or every effect).
        (Toleration("", "Exists", "", ""), GPU_TAINT, True),
        (Toleration("", "Exists", "", ""), Taint("anything", "x", "NoExecute"), True),
        (Toleration("", "Exists", "", "NoExecute"), GPU_TAINT, False),
        # The effect: empty tolerates every effect; else it must match.
        (Toleration("nvidia.com/gpu", "Equal", "present", ""), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "present", "NoExecute"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Exists", "", "PreferNoSchedule"), GPU_TAINT, False),
        (
            Toleration("nvidia.com/gpu", "Exists", "", "NoExecute"),
            Taint("nvidia.com/gpu", "present", "NoExecute"),
            True,
        ),
        # The default operator is Equal.
        (Toleration("nvidia.com/gpu", value="present"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu"), GPU_TAINT, False),
    ],
)
def test_tolerates_follows_kubernetes(toleration, taint, tolerated):
    assert toleration.tolerates(taint) is tolerated


def node(
    name="a-0",
    domain: str | None = "a",
    gpus=4,
    cpu=64_000,
    memory=512 * GI,
    ready=True,
    unschedulable=False,
    taints=(),
    labels=None,
) -> NodeFacts:
    lab = {} if domain is None else {LABEL: domain}
    lab.update(labels or {})
    return NodeFacts(
        name,
        lab,
        {GPU: gpus, "cpu": cpu, "memory": memory},
        ready=ready,
        unschedulable=unschedulable,
        taints=tuple(taints),
    )


TOLERATE_GPU = Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")


def test_untolerated_lists_only_hard_taints_no_toleration_covers():
    soft = Taint("soft", "", "PreferNoSchedule")
    hard = Taint("hard", "", "NoExecute")
    n = node(taints=[GPU_TAINT, soft, hard])
    assert untolerated(n, [TOLERATE_GPU]) == [hard]
    assert untolerated(n, []) == [GPU_TAINT, hard]
    assert untolerated(n, [Toleration("", "Exists")]) == []


@pytest.mark.parametrize(
    ("n", "constraints", "ok"),
    [
        (node(), Constraints(), True),
        (node(ready=False), Constraints(), False),
        (node(unschedulable=True), Constraints(), False),
        (node(domain=None), Constraints(), False),  # not in any NVLink domain
        (node(), Constraints(domain_label="example.com/rack"), False),
        (node(taints=[GPU_TAINT]), Constraints(), False),
        (node(taints=[GPU_TAINT]), Constraints(tolerations=(TOLERATE_GPU,)), True),
        (node(taints=[Taint("evict", "", "NoExecute")]), Constraints(tolerations=(TOLERATE_GPU,)), False),
        (
            node(taints=[Taint("evict", "", "NoExecute")]),
            Constraints(tolerations=(Toleration("evict", "Exists"),)),
            True,
        ),
        (node(taints=[Taint("soft", "", "PreferNoSchedule")]), Constraints(), True),  # a preference only
        (node(labels={"pool": "inference"}), Constraints(node_selector=(("pool", "inference"),)), True),
        (node(labels={"pool": "training"}), Constraints(node_selector=(("pool", "inference"),)), False),
        (node(), Constraints(node_selector=(("pool", "inference"),)), False),
        (
            node(labels={"pool": "inference", "zone": "z1"}),
            Constraints(node_selector=(("pool", "inference"), ("zone", "z2"))),
            False,
        ),
    ],
)
def test_feasible(n, constraints, ok):
    assert feasible(n, constraints) is ok


# ---------------------------------------------------------------------------------------- usable GPUs


@pytest.mark.parametrize(
    ("free", "pod", "usable"),
    [
        # Only GPUs requested: every free GPU.
        ({GPU: 8, "cpu": 0}, {GPU: 2}, 8),
        # Plenty of CPU and memory.
        ({GPU: 8, "cpu": 64_000, "memory": 512 * GI}, {GPU: 2, "cpu": 8_000, "memory": 64 * GI}, 8),
        # CPU for one pod only: its 2 GPUs, the rest stranded.
        ({GPU: 8, "cpu": 10_000, "memory": 512 * GI}, {GPU: 2, "cpu": 8_000, "memory": 64 * GI}, 2),
        # Memory for two pods.
        ({GPU: 8, "cpu": 64_000, "memory": 150 * GI}, {GPU: 2, "cpu": 8_000, "memory": 64 * GI}, 4),
        # No room for one pod at all (over-committed CPU counts as none).
        ({GPU: 8, "cpu": -500, "memory": 512 * GI}, {GPU: 2, "cpu": 1}, 0),
        ({GPU: 8}, {GPU: 2, "cpu": 1}, 0),  # a node that does not list CPU has none
        # Pods of 4 GPUs on a node with 6 free: CPU for 3 pods does not add GPUs that do not exist.
        ({GPU: 6, "cpu": 30_000}, {GPU: 4, "cpu": 10_000}, 6),
        # Another requested resource runs out.
        ({GPU: 8, "example.com/ib": 1}, {GPU: 4, "example.com/ib": 1}, 4),
        # Zero requests of other resources do not limit.
        ({GPU: 8, "cpu": 0}, {GPU: 4, "cpu": 0}, 8),
        # No GPU in the request: all free GPUs (nothing to divide by).
        ({GPU: 8, "cpu": 0}, {"cpu": 1}, 8),
        # Negative free GPUs (over-committed) are none.
        ({GPU: -2, "cpu": 1000}, {GPU: 1}, 0),
    ],
)
def test_usable_gpus(free, pod, usable):
    assert usable_gpus(free, pod, GPU) == usable


def test_pods_that_fit():
    assert pods_that_fit({"cpu": 10_000, "memory": 10}, {"cpu": 3_000, "memory": 2}) == 3
    assert pods_that_fit({"cpu": 10_000}, {"cpu": 3_000, "memory": 1}) == 0
    assert pods_that_fit({"cpu": 10}, {}) >= 1_000_000  # nothing requested: no limit


# -------------------------------------------------------------------------------------------- snapshot

REQUEST = {GPU: 2, "cpu": 8_000, "memory": 64 * GI}


def test_snapshot_builds_domains_of_usable_gpus():
    nodes = [node("a-0"), node("a-1"), node("b-0", "b", gpus=8)]
    used = {"a-0": {GPU: 2, "cpu": 1000}, "b-0": {GPU: 8}, "elsewhere": {GPU: 4}}
    domains = snapshot(nodes, used, REQUEST, Constraints())
    assert domains == {
        "a": Domain("a", 8, {"a-0": 2, "a-1": 4}, 2, 2),
        "b": Domain("b", 8, {"b-0": 0}, 1, 1),
    }


def test_snapshot_counts_infeasible_nodes_in_totals_but_offers_nothing_on_them():
    nodes = [
        node("a-0"),
        node("a-1", ready=False),
        node("a-2", unschedulable=True),
        node("a-3", taints=[GPU_TAINT]),
        node("a-4", labels={"pool": "training"}),
    ]
    constraints = Constraints(node_selector=())
    domains = snapshot(nodes, {}, REQUEST, constraints)
    assert domains == {"a": Domain("a", 20, {"a-0": 4, "a-4": 4}, 5, 4)}
    # With a toleration and a selector, the tainted node is in and the other pool is out.
    constraints = Constraints(node_selector=(("pool", "training"),), tolerations=(TOLERATE_GPU,))
    assert dict(snapshot(nodes, {}, REQUEST, constraints)["a"].free) == {"a-4": 4}
    constraints = Constraints(tolerations=(TOLERATE_GPU,))
    assert dict(snapshot(nodes, {}, REQUEST, constraints)["a"].free) == {"a-0": 4, "a-3": 4, "a-4": 4}


def test_snapshot_ignores_nodes_without_the_domain_label():
    nodes = [node("a-0"), node("cpu-0", None), node("x-0", None, labels={"example.com/rack": "r1"})]
    assert set(snapshot(nodes, {}, REQUEST, Constraints())) == {"a"}
    by_rack = snapshot(nodes, {}, REQUEST, Constraints(domain_label="example.com/rack"))
    assert by_rack == {"r1": Domain("r1", 4, {"x-0": 4}, 1, 1)}


def test_snapshot_limits_gpus_by_cpu_and_memory_left():
    # a-0 has 4 GPUs free but only 10 CPUs: one pod of 2 GPUs fits.
    nodes = [node("a-0", cpu=64_000), node("a-1", memory=100 * GI)]
    used = {"a-0": {"cpu": 54_000}}
    domains = snapshot(nodes, used, REQUEST, Constraints())
    assert dict(domains["a"].free) == {"a-0": 2, "a-1": 2}
    assert domains["a"].total_gpus == 8


def test_snapshot_never_offers_negative_room():
    nodes = [node("a-0")]
    domains = snapshot(nodes, {"a-0": {GPU: 6}}, REQUEST, Constraints())
    assert dict(domains["a"].free) == {"a-0": 0}


def test_snapshot_gives_an_unchanged_domain_again_and_remakes_a_changed_one():
    # Made once per plan on every node of the cluster: a domain whose nodes and usage are what they were
    # is the same Domain again; any change to one of its nodes, to the usage on it or to the request
    # makes it anew (and the other domains stay as they were).
    nodes = [node("a-0"), node("a-1"), node("b-0", "b")]
    first = snapshot(nodes, {"a-0": {GPU: 2}}, REQUEST, Constraints())
    again = snapshot(list(nodes), {"a-0": {GPU: 2}}, REQUEST, Constraints())
    assert again["a"] is first["a"]
    assert again["b"] is first["b"]
    used_more = snapshot(nodes, {"a-0": {GPU: 4}}, REQUEST, Constraints())
    assert dict(used_more["a"].free) == {"a-0": 0, "a-1": 4}
    assert used_more["b"] is first["b"]
    cordoned = snapshot([nodes[0], node("a-1", unschedulable=True), nodes[2]], {}, REQUEST, Constraints())
    assert dict(cordoned["a"].free) == {"a-0": 4}
    bigger = snapshot(nodes, {}, {**REQUEST, GPU: 4}, Constraints())
    assert dict(bigger["a"].free) == {"a-0": 4, "a-1": 4}
    gone = snapshot(nodes[1:], {}, REQUEST, Constraints())
    assert dict(gone["a"].free) == {"a-1": 4}
    assert snapshot(nodes, {}, REQUEST, Constraints()) == {
        "a": Domain("a", 8, {"a-0": 4, "a-1": 4}, 2, 2),
        "b": Domain("b", 4, {"b-0": 4}, 1, 1),
    }
