"""References for the placement of multi-node groups, to compare tokenfab's best fit with (pure, no I/O).

- `sequential(domains, shapes, chooser)`: the groups in the given order, each whole in one domain, by a
  greedy chooser (tokenfab's best fit, or first fit);
- `optimal(domains, shapes)`: the most GPUs any placement of the same groups can hold, order ignored
  (an offline bound no online placer can beat): an integer linear program solved exactly by HiGHS
  (scipy.optimize.milp). Each group is placed whole in one domain or not at all, one pod per node, and no
  node holds more than its free GPUs. With a time limit the solver may stop before it has proved its
  answer optimal; the result then says so, with the bound it proved.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

from tokenfab.planning.topology import Chooser, Domain, GroupShape, place_sequence


@dataclass(frozen=True)
class Packing:
    gpus: int  # GPUs of the groups placed
    groups: int  # groups placed
    optimal: bool  # proved optimal (always True for the greedy placers, which are exact about themselves)
    bound: int  # no placement holds more GPUs than this (== gpus when optimal)
    seconds: float


def sequential(
    domains: Mapping[str, Domain], shapes: Sequence[GroupShape], chooser: Chooser | None
) -> Packing:
    """The groups in order, by `chooser` (None: tokenfab's best fit, the `pack` policy)."""
    t0 = time.monotonic()
    placed, _ = place_sequence(domains, shapes, "pack", chooser=chooser)
    gpus = sum(s.gpus for s, d in zip(shapes, placed, strict=True) if d is not None)
    n = sum(1 for d in placed if d is not None)
    return Packing(gpus, n, True, gpus, round(time.monotonic() - t0, 3))


def optimal(
    domains: Mapping[str, Domain], shapes: Sequence[GroupShape], time_limit: float = 120.0
) -> Packing:
    """The most GPUs of `shapes` that fit the domains' free capacity, each group whole in one domain.

    Variables: y[g, d] = group g placed in domain d; x[g, n] = one pod of g on node n (only where a pod
    fits the node's free GPUs). Maximize sum gpus[g] * y[g, d] subject to: each group in at most one
    domain; a group placed in d has exactly its pod count of pods on d's nodes; a node's pods fit its
    free GPUs."""
    t0 = time.monotonic()
    doms = sorted(domains.values(), key=lambda d: d.name)
    nodes = [(d_i, name, free) for d_i, d in enumerate(doms) for name, free in d.free.items() if free > 0]
    y_index: dict[tuple[int, int], int] = {}
    x_index: dict[tuple[int, int], int] = {}
    for g, s in enumerate(shapes):
        for d_i, d in enumerate(doms):
            if sum(1 for free in d.free.values() if free >= s.pod_gpus) >= s.nodes:
                y_index[(g, d_i)] = len(y_index)
    ny = len(y_index)
    for g, s in enumerate(shapes):
        for n_i, (d_i, _, free) in enumerate(nodes):
            if (g, d_i) in y_index and free >= s.pod_gpus:
                x_index[(g, n_i)] = ny + len(x_index)
    nvars = ny + len(x_index)
    if ny == 0:
        return Packing(0, 0, True, 0, round(time.monotonic() - t0, 3))
    cost = np.zeros(nvars)
    for (g, _), i in y_index.items():
        cost[i] = -shapes[g].gpus  # milp minimizes

    rows: list[tuple[dict[int, float], float, float]] = []
    for g in range(len(shapes)):  # each group in at most one domain
        row = {i: 1.0 for (gg, _), i in y_index.items() if gg == g}
        if row:
            rows.append((row, -np.inf, 1.0))
    node_domain = [d_i for d_i, _, _ in nodes]
    for (g, d_i), yi in y_index.items():  # a group in d: its pods on d's nodes, none elsewhere
        row = {i: 1.0 for (gg, n_i), i in x_index.items() if gg == g and node_domain[n_i] == d_i}
        row[yi] = -float(shapes[g].nodes)
        rows.append((row, 0.0, 0.0))
    for n_i, (_, _, free) in enumerate(nodes):  # a node's pods fit its free GPUs
        row = {i: float(shapes[g].pod_gpus) for (g, nn), i in x_index.items() if nn == n_i}
        if row:
            rows.append((row, -np.inf, float(free)))
    a = lil_array((len(rows), nvars))
    lo, hi = np.empty(len(rows)), np.empty(len(rows))
    for r, (row, low, high) in enumerate(rows):
        for i, v in row.items():
            a[r, i] = v
        lo[r], hi[r] = low, high
    res = milp(
        cost,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=np.ones(nvars),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit, "disp": False},
    )
    if res.x is None:
        raise RuntimeError(f"the placement program found no solution: {res.message}")
    chosen = [g for (g, _), i in y_index.items() if res.x[i] > 0.5]
    gpus = sum(shapes[g].gpus for g in chosen)
    proved = res.status == 0
    bound = gpus if proved else int(np.floor(-getattr(res, "mip_dual_bound", -np.inf) + 1e-6))
    return Packing(gpus, len(chosen), proved, max(gpus, bound), round(time.monotonic() - t0, 3))
