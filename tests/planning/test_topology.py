"""Placement in NVLink domains: free GPUs from nodes and pods, best fit / spread, and its invariants."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenfab.planning.topology import (
    Domain,
    GpuUse,
    GroupShape,
    NodeInfo,
    build_domains,
    choose_domain,
    first_fit,
    fits,
    largest_block,
    place_sequence,
    reserve,
)

POLICIES = ["pack", "spread"]


def dom(name, *free):
    """A domain of 4-GPU nodes `<name>-00`, `<name>-01`, ... with these free GPUs, all ready."""
    return Domain(
        name, 4 * len(free), {f"{name}-{i:02d}": f for i, f in enumerate(free)}, len(free), len(free)
    )


def doms(*domains):
    return {d.name: d for d in domains}


def g(gpus):
    return GroupShape(gpus, 4)


def node(name, domain="a", gpus=4, ready=True, schedulable=True):
    return NodeInfo(name, domain, gpus, ready, schedulable)


def rack(domain, nodes=18):
    return [node(f"{domain}-{i:02d}", domain) for i in range(nodes)]


# --- shapes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "per_node", "nodes", "pod_gpus"),
    [(1, 4, 1, 1), (2, 4, 1, 2), (4, 4, 1, 4), (8, 4, 2, 4), (32, 4, 8, 4), (72, 4, 18, 4), (16, 8, 2, 8)],
)
def test_group_shape(gpus, per_node, nodes, pod_gpus):
    shape = GroupShape(gpus, per_node)
    assert (shape.nodes, shape.pod_gpus) == (nodes, pod_gpus)


@pytest.mark.parametrize(("gpus", "per_node"), [(0, 4), (4, 0), (6, 4), (12, 8)])
def test_group_shape_refuses_partial_nodes_and_empty_groups(gpus, per_node):
    with pytest.raises(ValueError, match="group"):
        GroupShape(gpus, per_node)


# --- build_domains --------------------------------------------------------------------------------------


def test_bound_pods_subtract_from_their_node_never_below_zero():
    nodes = [node("a-0"), node("a-1"), node("a-2"), node("b-0", "b", gpus=8)]
    uses = [GpuUse(3, "a-0"), GpuUse(1, "a-0"), GpuUse(1, "a-1"), GpuUse(6, "a-2"), GpuUse(2, "b-0")]
    domains = build_domains(nodes, uses)
    assert dict(domains["a"].free) == {"a-0": 0, "a-1": 3, "a-2": 0}
    assert dict(domains["b"].free) == {"b-0": 6}
    assert (domains["a"].total_gpus, domains["a"].free_gpus, domains["b"].free_gpus) == (12, 3, 6)


def test_not_ready_and_cordoned_nodes_count_in_totals_but_offer_nothing():
    nodes = [node("a-0"), node("a-1", ready=False), node("a-2", schedulable=False), node("a-3", gpus=8)]
    domain = build_domains(nodes, [GpuUse(4, "a-1")])["a"]
    assert domain == Domain("a", total_gpus=20, free={"a-0": 4, "a-3": 8}, nodes=4, ready_nodes=3)
    assert domain.free_gpus == 12


@pytest.mark.parametrize(
    ("uses", "free"),
    [
        # Best fit: the fullest node that still has room, ties by name.
        ([GpuUse(2, None, "a")], {"a-0": 4, "a-1": 0, "a-2": 3}),
        ([GpuUse(3, None, "a")], {"a-0": 4, "a-1": 2, "a-2": 0}),
        ([GpuUse(4, None, "a")], {"a-0": 0, "a-1": 2, "a-2": 3}),
        # Largest first, whatever the order the pods come in.
        ([GpuUse(1, None, "a"), GpuUse(4, None, "a")], {"a-0": 0, "a-1": 1, "a-2": 3}),
        ([GpuUse(4, None, "a"), GpuUse(1, None, "a")], {"a-0": 0, "a-1": 1, "a-2": 3}),
        ([GpuUse(1, None, "a"), GpuUse(2, None, "a")], {"a-0": 4, "a-1": 0, "a-2": 2}),
        ([GpuUse(2, None, "a"), GpuUse(1, None, "a")], {"a-0": 4, "a-1": 0, "a-2": 2}),
        # Pods that fit nowhere, pinned to an unknown domain, or not pinned at all reserve nothing.
        ([GpuUse(5, None, "a"), GpuUse(2, None, "zz"), GpuUse(2, None)], {"a-0": 4, "a-1": 2, "a-2": 3}),
        # A bound pod's node wins over its domain.
        ([GpuUse(2, "a-2", "b")], {"a-0": 4, "a-1": 2, "a-2": 1}),
    ],
)
def test_pending_pods_pinned_to_a_domain_are_reserved_there(uses, free):
    nodes = [node("a-0"), node("a-1"), node("a-2"), node("b-0", "b")]
    bound = [GpuUse(2, "a-1"), GpuUse(1, "a-2")]
    domains = build_domains(nodes, bound + uses)
    assert dict(domains["a"].free) == free
    assert dict(domains["b"].free) == {"b-0": 4}


def test_nodes_without_a_domain_label_are_ignored():
    domains = build_domains([node("a-0"), node("cpu-0", None), node("gpu-9", None)], [GpuUse(1, "gpu-9")])
    assert list(domains) == ["a"]
    assert domains["a"] == Domain("a", 4, {"a-0": 4}, 1, 1)
    assert build_domains([node("x", None)], []) == {}


def test_a_domain_is_read_only_and_reserve_returns_a_new_one():
    domain = dom("a", 4, 4)
    with pytest.raises(TypeError):
        domain.free["a-00"] = 0  # type: ignore[index]
    after = reserve(domain, g(4))
    assert dict(domain.free) == {"a-00": 4, "a-01": 4}
    assert dict(after.free) == {"a-00": 0, "a-01": 4}


# --- fits / reserve -------------------------------------------------------------------------------------

EIGHT_WHOLE = (4,) * 8 + (3, 3, 2)
SEVEN_WHOLE = (4,) * 7 + (3, 3, 3, 3, 3, 3, 3, 3)


@pytest.mark.parametrize(
    ("free", "gpus", "expected"),
    [
        (EIGHT_WHOLE, 32, True),  # 32 GPUs on 4-GPU nodes: 8 whole nodes
        (SEVEN_WHOLE, 32, False),  # 52 GPUs free, but only 7 whole nodes
        (SEVEN_WHOLE, 28, True),
        ((3, 3, 3), 4, False),
        ((1, 1, 1, 1), 2, False),  # 4 free GPUs, no node with 2
        ((1, 1, 2), 2, True),
        ((0, 0, 1), 1, True),
        ((0, 0, 0), 1, False),
        ((), 1, False),
    ],
)
def test_fits(free, gpus, expected):
    assert fits(dom("a", *free), g(gpus)) is expected


@pytest.mark.parametrize(
    ("free", "gpus", "after"),
    [
        ((4, 2, 3, 1), 1, (4, 2, 3, 0)),  # the fullest node that fits
        ((4, 2, 3, 1), 2, (4, 0, 3, 1)),
        ((4, 2, 3, 1), 3, (4, 2, 0, 1)),
        ((4, 3, 3, 1), 3, (4, 0, 3, 1)),  # ties by node name
        ((4, 2, 4, 4), 8, (0, 2, 0, 4)),
        (EIGHT_WHOLE, 32, (0,) * 8 + (3, 3, 2)),
        ((4,) * 10, 32, (0,) * 8 + (4, 4)),
    ],
)
def test_reserve_takes_the_best_fit_nodes(free, gpus, after):
    domain = dom("a", *free)
    reserved = reserve(domain, g(gpus))
    assert reserved == dom("a", *after)
    assert domain.free_gpus - reserved.free_gpus == gpus


@pytest.mark.parametrize(("free", "gpus"), [(SEVEN_WHOLE, 32), ((1, 1, 1, 1), 2), ((), 1)])
def test_reserve_refuses_a_group_that_does_not_fit(free, gpus):
    with pytest.raises(ValueError, match=f"a group of {gpus} GPUs does not fit in NVLink domain a"):
        reserve(dom("a", *free), g(gpus))


# --- choose_domain --------------------------------------------------------------------------------------

# a: a whole free rack (72), b: 8 free nodes (32), c: 2 free nodes (8), d: odd GPUs left on 3 nodes (6).
MIXED = doms(dom("a", *(4,) * 18), dom("b", *(4,) * 8, 0, 0), dom("c", 4, 4, 0, 0), dom("d", 1, 2, 3, 0))


@pytest.mark.parametrize(
    ("gpus", "pack", "spread"),
    [
        (1, "d", "a"),
        (2, "d", "a"),
        (3, "d", "a"),
        (4, "c", "a"),
        (8, "c", "a"),
        (16, "b", "a"),
        (32, "b", "a"),  # multi-node: 8 whole nodes
        (36, "a", "a"),
        (72, "a", "a"),
    ],
)
def test_choose_domain_pack_is_best_fit_spread_is_most_free(gpus, pack, spread):
    assert choose_domain(MIXED, g(gpus), "pack") == pack
    assert choose_domain(MIXED, g(gpus), "spread") == spread


@pytest.mark.parametrize(
    ("groups", "gpus", "expected"),
    [
        ({"a": 1}, 8, "b"),  # fewest of this deployment's groups, then most free
        ({"a": 1, "b": 1}, 8, "c"),
        ({"a": 2, "b": 1, "c": 1}, 8, "b"),
        ({"a": 2, "b": 1}, 32, "b"),  # c and d have fewer groups, but only a and b fit
        ({"a": 1, "b": 2}, 32, "a"),
        ({"b": 1, "c": 1, "d": 1}, 4, "a"),
        ({"x": 5}, 8, "a"),  # groups in unknown domains do not matter
    ],
)
def test_spread_prefers_domains_with_fewer_of_the_deployments_groups(groups, gpus, expected):
    assert choose_domain(MIXED, g(gpus), "spread", groups) == expected


@pytest.mark.parametrize("policy", POLICIES)
def test_ties_go_to_the_first_name(policy):
    twins = doms(dom("b", 4, 4), dom("a", 4, 4), dom("c", 4, 4))
    assert choose_domain(twins, g(4), policy) == "a"
    assert choose_domain(twins, g(4), policy, {"a": 1}) == ("a" if policy == "pack" else "b")
    assert first_fit(twins, g(4)) == "a"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("domains", "gpus"),
    [
        (doms(dom("a", *(0,) * 18), dom("b", 0, 0)), 1),
        (doms(dom("a", *(3,) * 18), dom("b", 1, 2)), 4),
        (doms(dom("a", *(0,) * 18), dom("b", 4, 3, 3, 3)), 8),
        (doms(dom("a", *(3,) * 18), dom("b", *(4,) * 7)), 32),
        (doms(dom("a", *(4,) * 18), dom("b", *(4,) * 18)), 76),
        ({}, 1),
    ],
)
def test_nothing_fits_gives_none(policy, domains, gpus):
    assert choose_domain(domains, g(gpus), policy) is None
    assert choose_domain(domains, g(gpus), policy, {"a": 0, "b": 1}) is None
    assert first_fit(domains, g(gpus)) is None
    assert place_sequence(domains, [g(gpus)], policy) == ([None], domains)


# b and c both fit 2 to 8 GPUs; first fit takes b (first name), best fit c (fuller).
FIRST_FIT = doms(dom("d", *(4,) * 8), dom("c", 4, 4, 0), dom("b", 4, 4, 4), dom("a", 1, 0))


@pytest.mark.parametrize(
    ("gpus", "first", "best"),
    [(1, "a", "a"), (2, "b", "c"), (4, "b", "c"), (8, "b", "c"), (16, "d", "d"), (36, None, None)],
)
def test_first_fit_takes_the_first_fitting_name(gpus, first, best):
    assert first_fit(FIRST_FIT, g(gpus)) == first
    assert choose_domain(FIRST_FIT, g(gpus), "pack") == best


# --- largest_block --------------------------------------------------------------------------------------


def unplaceable_message(domains, shape):
    block, domain = largest_block(domains, shape)
    return (
        f"needs {shape.gpus} GPUs in one NVLink domain; "
        f"the largest free block is {block} GPUs (domain {domain})"
    )


@pytest.mark.parametrize(
    ("domains", "gpus", "expected"),
    [
        # Multi-node: whole nodes times 4; GPUs left on part-used nodes do not count.
        (doms(dom("a", *(4,) * 5, 3, 3, 3), dom("b", *(4,) * 7, 0)), 32, (28, "b")),
        (doms(dom("a", *(4,) * 7), dom("b", *(4,) * 7)), 32, (28, "a")),  # ties: first name
        (doms(dom("a", 3, 3, 3, 3), dom("b", 4, 0)), 8, (4, "b")),
        # Single-node: the most free GPUs on one node.
        (doms(dom("a", 1, 1, 1), dom("b", 1, 0)), 2, (1, "a")),
        (doms(dom("a", 1, 1, 1), dom("b", 3, 0)), 4, (3, "b")),
        (doms(dom("a", 2, 4), dom("b", 3)), 2, (4, "a")),
        (doms(dom("a", 3, 3, 3, 3), dom("b", 4, 0)), 4, (4, "b")),
        # No usable GPU anywhere.
        (doms(dom("a", 3, 3), dom("b", 0)), 8, (0, None)),
        (doms(dom("a", 0, 0)), 1, (0, None)),
        ({}, 4, (0, None)),
    ],
)
def test_largest_block(domains, gpus, expected):
    assert largest_block(domains, g(gpus)) == expected


def test_largest_block_words_the_unplaceable_message():
    domains = doms(dom("a", *(4,) * 5, 3, 3, 3), dom("b", *(4,) * 7, 0))
    assert choose_domain(domains, g(32), "pack") is None
    assert unplaceable_message(domains, g(32)) == (
        "needs 32 GPUs in one NVLink domain; the largest free block is 28 GPUs (domain b)"
    )


# --- place_sequence -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "chooser", "shapes", "placed"),
    [
        ("pack", None, [8, 8, 8, 8], ["c", "c", "c", "a"]),
        ("spread", None, [8, 8, 8, 8], ["a", "b", "c", "a"]),  # counts its own groups as it goes
        ("pack", None, [64, 16, 8], ["a", "c", "a"]),
        ("spread", None, [64, 16, 8], ["a", "b", "c"]),
        ("pack", None, [72, 72, 24, 4], ["a", "b", "c", None]),
        ("pack", first_fit, [8, 8, 64], ["a", "a", "b"]),
        # c is a third of a rack: spread still gives it a group before a second one on a or b.
        ("spread", None, [4, 4, 4, 4], ["a", "b", "c", "a"]),
    ],
)
def test_place_sequence(policy, chooser, shapes, placed):
    fresh = build_domains(rack("a") + rack("b") + rack("c", 6), [])
    got, final = place_sequence(fresh, [g(s) for s in shapes], policy, chooser)
    assert got == placed
    used = {name: fresh[name].free_gpus - final[name].free_gpus for name in fresh}
    assert used == {name: sum(s for s, p in zip(shapes, placed, strict=True) if p == name) for name in fresh}


def test_best_fit_keeps_the_big_block_that_first_fit_breaks():
    domains = doms(dom("a", 4, 4, 4, 4), dom("b", 4, 4))
    assert place_sequence(domains, [g(8), g(16)], "pack")[0] == ["b", "a"]
    assert place_sequence(domains, [g(8), g(16)], "pack", first_fit)[0] == ["a", None]


def test_place_sequence_does_not_change_its_input():
    domains = build_domains(rack("a", 4), [])
    before = dict(domains)
    place_sequence(domains, [g(8), g(8)], "pack")
    assert domains == before


# --- properties -----------------------------------------------------------------------------------------

NODE_STATES = ["ready", "ready", "ready", "ready", "not-ready", "cordoned"]
NODES = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(NODE_STATES)), min_size=1, max_size=18)
SHAPES = st.lists(st.sampled_from([1, 2, 4, 8, 16, 32, 64]).map(g), max_size=14)


@st.composite
def clusters(draw):
    """Up to 4 domains of up to 18 four-GPU nodes, some used (a few overcommitted), some not ready or
    cordoned, a node outside any domain, and some pending pods pinned to a domain."""
    nodes, uses = [node("cpu-0", None)], [GpuUse(1, "cpu-0")]
    for d in range(draw(st.integers(1, 4))):
        for i, (used, state) in enumerate(draw(NODES)):
            nodes.append(node(f"d{d}-{i:02d}", f"d{d}", 4, state != "not-ready", state != "cordoned"))
            uses += [GpuUse(1, f"d{d}-{i:02d}")] * used
    pinned = st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from(["d0", "d1", "d2", "d3"]))
    uses += [GpuUse(gpus, None, domain) for gpus, domain in draw(st.lists(pinned, max_size=6))]
    return nodes, uses


@settings(max_examples=200, deadline=None)
@given(clusters(), SHAPES, st.sampled_from(POLICIES))
def test_property_a_group_is_never_split(cluster, shapes, policy):
    """Each group's pods all come from the one domain chosen: shape.nodes nodes, pod_gpus each."""
    state = build_domains(*cluster)
    placed, final = place_sequence(state, shapes, policy)
    for shape, name in zip(shapes, placed, strict=True):
        if name is None:
            continue
        assert fits(state[name], shape)
        before, after = state[name], reserve(state[name], shape)
        taken = [before.free[n] - after.free[n] for n in before.free if after.free[n] != before.free[n]]
        assert taken == [shape.pod_gpus] * shape.nodes
        assert before.free_gpus - after.free_gpus == shape.gpus
        state = {**state, name: after}
    assert state == final


@settings(max_examples=200, deadline=None)
@given(clusters(), SHAPES, st.sampled_from(POLICIES))
def test_property_never_overcommits(cluster, shapes, policy):
    nodes, uses = cluster
    start = build_domains(nodes, uses)
    placed, final = place_sequence(start, shapes, policy)
    allocatable = {n.name: n.allocatable_gpus for n in nodes}
    bound = {n.name: sum(u.gpus for u in uses if u.node == n.name) for n in nodes}
    assert list(final) == list(start)
    for name, domain in final.items():
        assert domain.free.keys() == start[name].free.keys()
        for n, free in domain.free.items():
            assert 0 <= free <= start[name].free[n] <= allocatable[n]
            taken = start[name].free[n] - free
            assert min(bound[n], allocatable[n]) + taken <= allocatable[n]
        reserved = sum(s.gpus for s, p in zip(shapes, placed, strict=True) if p == name)
        assert start[name].free_gpus - domain.free_gpus == reserved


@settings(max_examples=200, deadline=None)
@given(clusters(), SHAPES, st.sampled_from(POLICIES), st.randoms(use_true_random=False))
def test_property_deterministic_whatever_the_input_order(cluster, shapes, policy, rnd):
    nodes, uses = cluster
    domains = build_domains(nodes, uses)
    expected = place_sequence(domains, shapes, policy)
    assert place_sequence(domains, shapes, policy) == expected
    nodes, uses = list(nodes), list(uses)
    rnd.shuffle(nodes)
    rnd.shuffle(uses)
    shuffled = build_domains(nodes, uses)
    assert shuffled == domains
    items = list(shuffled.items())
    rnd.shuffle(items)
    assert place_sequence(dict(items), shapes, policy) == expected
    for shape in shapes:
        assert largest_block(dict(items), shape) == largest_block(domains, shape)


@settings(max_examples=200, deadline=None)
@given(clusters(), SHAPES, st.sampled_from(POLICIES))
def test_property_rejected_only_when_no_domain_fits(cluster, shapes, policy):
    state = build_domains(*cluster)
    placed, _ = place_sequence(state, shapes, policy)
    for shape, name in zip(shapes, placed, strict=True):
        fitting = {d for d in state if fits(state[d], shape)}
        assert (name is None) == (not fitting)
        assert (largest_block(state, shape)[0] >= shape.gpus) == bool(fitting)
        if name is not None:
            assert name in fitting
            state = {**state, name: reserve(state[name], shape)}


# --- best fit against first fit -------------------------------------------------------------------------

SIZES = [4, 8, 16, 32]
NVL72 = [n for d in "abcd" for n in rack(d)]  # 4 NVL72 racks: 4 domains x 18 nodes x 4 GPUs


def best_fit(domains, shape):
    return choose_domain(domains, shape, "pack")


def stranded_arrivals(shapes, chooser):
    """GPUs of groups rejected although the domains had that many free GPUs in total."""
    state, stranded = build_domains(NVL72, []), 0
    for shape in shapes:
        name = chooser(state, shape)
        if name is not None:
            state[name] = reserve(state[name], shape)
        elif shape.gpus <= sum(d.free_gpus for d in state.values()):
            stranded += shape.gpus
    return stranded


def churn(seed):
    """40-80 events: a group of 4-32 GPUs arrives, or (30%) an earlier arrival, by index, leaves."""
    rng, events, arrived = random.Random(seed), [], 0
    for _ in range(rng.randint(40, 80)):
        if arrived and rng.random() < 0.3:
            events.append(("leave", rng.randrange(arrived)))
        else:
            events.append(("arrive", rng.choice(SIZES)))
            arrived += 1
    return events


def stranded_churn(events, chooser):
    """Like `stranded_arrivals`, with departures. Each arrival sees the domains `build_domains` makes of
    the live groups' pods, pinned to their domains (every pod is a whole node, so which node is moot)."""
    live, stranded, index = {}, 0, -1
    for kind, value in events:
        if kind == "leave":
            live.pop(value, None)  # a rejected group has nothing to free
            continue
        shape, index = g(value), index + 1
        state = build_domains(NVL72, [GpuUse(4, None, d) for d, s in live.values() for _ in range(s.nodes)])
        name = chooser(state, shape)
        if name is not None:
            live[index] = (name, shape)
        elif shape.gpus <= sum(d.free_gpus for d in state.values()):
            stranded += shape.gpus
    return stranded


def arrivals(seed):
    """10-40 groups of 4-32 GPUs arriving one after another, none leaving."""
    rng = random.Random(seed)
    return [g(rng.choice(SIZES)) for _ in range(rng.randint(10, 40))]


@pytest.mark.parametrize(
    ("scenario", "stranded", "sequences"),
    [
        pytest.param(arrivals, stranded_arrivals, 500, id="arrivals"),
        pytest.param(churn, stranded_churn, 200, id="churn", marks=pytest.mark.slow),
    ],
)
def test_best_fit_strands_fewer_gpus_than_first_fit(scenario, stranded, sequences):
    """Best fit (pack) against first fit on 4 fresh NVL72 racks, over seeded random sequences.

    A group is stranded when it is rejected although the racks have as many free GPUs in total: the
    capacity is there, but fragmented over racks. First fit fills racks in name order and so breaks
    up whole racks for small groups that a part-used rack could have taken; best fit puts each group on
    the fullest rack that fits, keeping empty racks whole for large groups. With arrivals only the two
    often agree (most sequences strand nothing under either); departures (churn) leave holes and widen
    the gap. Measured: arrivals 2064 vs 2720 stranded GPUs, best fit worse on 5 of 500 sequences and
    better on 14; churn 4288 vs 7776, worse on 7 of 200 and better on 67. The test fails if pack were
    first fit (equal totals) or worst fit (25512 and 23824 GPUs).
    """
    results = [
        (stranded(scenario(seed), best_fit), stranded(scenario(seed), first_fit)) for seed in range(sequences)
    ]
    best, first = sum(b for b, _ in results), sum(f for _, f in results)
    worse, better = sum(b > f for b, f in results), sum(b < f for b, f in results)
    assert best < first
    assert worse <= 0.05 * sequences
    assert better > 2 * worse
