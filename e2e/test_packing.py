"""The placement references the benchmarks compare tokenfab's best fit with (e2e/packing.py): the exact
optimum is checked against exhaustive search on small cases, and is never beaten by a greedy placer."""

from __future__ import annotations

import itertools
import random

import pytest

from e2e import packing
from tokenfab.planning.topology import Domain, GroupShape, first_fit

pytestmark = pytest.mark.unit  # (beside the code it tests; needs no factory)


def _fits(domain: Domain, shapes: list[GroupShape]) -> bool:
    """Whether the groups fit the domain's nodes together, one pod of a group per node (exhaustive)."""
    order = sorted(shapes, key=lambda s: -s.gpus)

    def place(k: int, free: dict[str, int]) -> bool:
        if k == len(order):
            return True
        s = order[k]
        room = [n for n, f in free.items() if f >= s.pod_gpus]
        for nodes in itertools.combinations(room, s.nodes):
            left = dict(free)
            for n in nodes:
                left[n] -= s.pod_gpus
            if place(k + 1, left):
                return True
        return False

    return place(0, dict(domain.free))


def exhaustive(domains: dict[str, Domain], shapes: list[GroupShape]) -> int:
    doms = list(domains.values())
    best = 0
    for assign in itertools.product(range(len(doms) + 1), repeat=len(shapes)):
        gpus = sum(s.gpus for s, a in zip(shapes, assign, strict=True) if a < len(doms))
        if gpus > best and all(
            _fits(d, [s for s, a in zip(shapes, assign, strict=True) if a == i]) for i, d in enumerate(doms)
        ):
            best = gpus
    return best


def _case(rng: random.Random) -> tuple[dict[str, Domain], list[GroupShape]]:
    domains = {}
    for d in range(2):
        free = {f"d{d}n{i}": rng.choice([0, 1, 2, 4, 4, 4]) for i in range(rng.randint(2, 4))}
        domains[f"d{d}"] = Domain(f"d{d}", 4 * len(free), free, len(free), len(free))
    shapes = [GroupShape(rng.choice([1, 2, 4, 8, 12]), 4) for _ in range(rng.randint(2, 5))]
    return domains, shapes


@pytest.mark.parametrize("seed", range(30))
def test_the_optimum_is_exact_and_no_greedy_placer_beats_it(seed: int) -> None:
    domains, shapes = _case(random.Random(seed))
    best = packing.optimal(domains, shapes)
    assert best.optimal
    assert best.gpus == best.bound == exhaustive(domains, shapes)
    for chooser in (None, first_fit):
        assert packing.sequential(domains, shapes, chooser).gpus <= best.gpus


def test_the_optimum_beats_best_fit_where_order_misleads_it() -> None:
    # Two domains of 3 free nodes; a 1-GPU group first takes a node of the fuller-looking domain, and the
    # two 12-GPU groups that follow cannot both fit. Ignoring the order, both do.
    free = {"a": {"a0": 4, "a1": 4, "a2": 4}, "b": {"b0": 4, "b1": 4, "b2": 4, "b3": 1}}
    domains = {n: Domain(n, 16, f, len(f), len(f)) for n, f in free.items()}
    shapes = [GroupShape(4, 4), GroupShape(12, 4), GroupShape(12, 4)]
    greedy = packing.sequential(domains, shapes, None)
    best = packing.optimal(domains, shapes)
    assert best.gpus == 24 > greedy.gpus == 16


def test_a_group_fits_nowhere_and_nothing_is_placed() -> None:
    domains = {"a": Domain("a", 8, {"a0": 4, "a1": 4}, 2, 2)}
    best = packing.optimal(domains, [GroupShape(16, 4)])
    assert (best.gpus, best.groups, best.optimal) == (0, 0, True)
