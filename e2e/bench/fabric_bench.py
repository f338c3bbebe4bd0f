"""Fabric placement benchmark: prefill-decode units against each group placed alone (what tokenfab did
before units), on the same racks and fleets, through the operator's own pure plan (planning.one_pass).

A model of placement: no KV transfer is measured here. For each fleet (disaggregated deployments, the
DeepSeek-R1 example among them, applied one after another to empty NVL72 racks, each plan's reservations
taken before the next) it reports:
- groups and GPUs asked and placed (the GPUs units leave unused, if any, are the difference);
- units: how many, and how many sit whole in one NVLink domain;
- the share of KV transfers that stay inside one NVLink domain, two ways: if each transfer stays inside
  its unit (what Dynamo's KV-transfer domain would enforce) it is the share of prefill groups whose unit
  is whole; if the router pairs a prefill worker with any decode worker of the deployment alike (no
  enforcement) it is, per prefill group, the share of the deployment's decode groups in its domain;
- the ComputeDomains the fleet needs (one per unit, or one per multi-node group).

Run: `python -m e2e.bench.fabric_bench [--racks 16] [--deployments 20 28] [--seeds 1 2]` (seconds: the
fleets fill the 16 racks to about 70% and to 100%); it prints the table and saves
e2e/bench/results/fabric.json. The suite runs a small version (e2e/bench/test_fabric_bench.py). The plan
is deterministic: a seed is a different fleet, not a noisy rerun.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e import record
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeployment
from tokenfab.planning import builders
from tokenfab.planning.capacity import NodeFacts, Resources, add
from tokenfab.planning.lifecycle import NodeHealth
from tokenfab.planning.one_pass import Plan, Snapshot, plan
from tokenfab.planning.room import Room

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "e2e" / "bench" / "results"
CLIQUE = "nvidia.com/gpu.clique"
GPU = "nvidia.com/gpu"
NODE = {"cpu": 144_000, "memory": 1536 * 2**30, GPU: 4}  # a GB200 tray: 4 GPUs
TRAYS = 18  # an NVL72 rack
NOW = 1_000_000.0

# (weight, decode GPUs, prefill GPUs, ratio, decode groups): the disaggregated shapes of the fleets.
MIX: tuple[tuple[int, int, int, str, int], ...] = (
    (3, 32, 8, "1:1", 2),  # the DeepSeek-R1 example: wide-EP decode on 8 trays, prefill on 2
    (3, 16, 8, "1:2", 2),
    (4, 8, 4, "1:2", 2),  # the scale mix's small disaggregated kind
    (2, 16, 4, "2:1", 1),
    (2, 8, 8, "1:1", 3),
)


def example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "deepseek-r1-disaggregated.yaml").read_text())
    return doc


def fleet(count: int, seed: int) -> list[ModelDeployment]:
    """`count` disaggregated deployments drawn from MIX (seeded), as the DeepSeek-R1 example with its
    shapes changed."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        _, decode, prefill, ratio, groups = rng.choices(MIX, [m[0] for m in MIX])[0]
        doc = copy.deepcopy(example())
        doc["metadata"].update(name=f"d{i:03d}", namespace="bench", uid=f"uid-{i}", generation=1)
        spec = doc["spec"]
        spec["decode"].update(parallelism={"tensor": decode, "expert": decode}, replicas=groups)
        spec["decode"].pop("extraEngineArgs", None)
        spec["prefill"]["parallelism"] = {"tensor": prefill, "expert": prefill}
        spec["serving"]["prefillDecodeRatio"] = ratio
        out.append(parse_model_deployment(doc))
    return out


def racks(count: int) -> list[NodeFacts]:
    return [
        NodeFacts(f"r{r:02d}-t{t:02d}", {CLIQUE: f"r{r:02d}"}, NODE)
        for r in range(count)
        for t in range(TRAYS)
    ]


def place(
    mds: Sequence[ModelDeployment], nodes: list[NodeFacts], units: bool
) -> list[tuple[ModelDeployment, Plan]]:
    """Each deployment's first plan, one after another on the same racks (each plan's reservations taken
    before the next), with units on or off."""
    used: dict[str, Resources] = {}
    health = {n.name: NodeHealth(True) for n in nodes}
    out = []
    for md in mds:
        owner = builders.Owner(name=md.metadata.name or "", namespace="bench", uid=md.metadata.uid or "")
        room = Room.fixed(nodes, dict(used), builders.placement_constraints(md.spec))
        snap = Snapshot(owner=owner, md=md, groups={}, health=health, room=room, now=NOW, units=units)
        p = plan(snap)
        for r in p.reservations:
            for node, req in r.pods.values():
                used[node] = add(used.get(node, {}), req)
        out.append((md, p))
    return out


def measure(placed: Sequence[tuple[ModelDeployment, Plan]]) -> dict[str, Any]:
    """The figures of one placement (see the module's docstring)."""
    asked = placed_gpus = groups_asked = groups_placed = 0
    units_total = units_whole = 0
    kept_in = kept_all = 0
    random_in = 0.0
    domains_needed = 0
    for md, p in placed:
        spec = md.spec
        for rp in p.roles:
            groups_asked += rp.desired
            asked += rp.desired * rp.shape.gpus
            groups_placed += len(rp.create)
            placed_gpus += len(rp.create) * rp.shape.gpus
        creates = {(cr.role, cr.slot): cr for rp in p.roles for cr in rp.create}
        decode_domains = Counter(cr.domain for (role, _), cr in creates.items() if role == "decode")
        decodes = sum(decode_domains.values())
        prefills = [cr for (role, _), cr in creates.items() if role == "prefill"]
        for cr in prefills:
            random_in += decode_domains[cr.domain] / decodes if decodes else 0.0
        by_unit: dict[int, set[str]] = {}
        if p.units is not None:
            for unit, members in p.units.members.items():
                by_unit[unit] = {m.domain for m in members}
            units_total += len(by_unit)
            units_whole += sum(1 for d in by_unit.values() if len(d) == 1)
            for cr in prefills:
                kept_all += 1
                kept_in += 1 if cr.unit is not None and len(by_unit.get(cr.unit, set())) == 1 else 0
            domains_needed += len(by_unit) if spec.topology.compute_domain else 0
        else:
            domains_needed += sum(1 for rp in p.roles for _ in rp.create if rp.shape.nodes > 1)
    prefill_total = sum(1 for _, p in placed for rp in p.roles if rp.role == "prefill" for _ in rp.create)
    return {
        "groups_asked": groups_asked,
        "groups_placed": groups_placed,
        "gpus_asked": asked,
        "gpus_placed": placed_gpus,
        "units": units_total,
        "units_whole": units_whole,
        "kv_inside_domain_if_kept_in_unit": round(kept_in / kept_all, 4) if kept_all else None,
        "kv_inside_domain_if_paired_at_random": round(random_in / prefill_total, 4)
        if prefill_total
        else None,
        "compute_domains": domains_needed,
    }


def run(rack_count: int, deployments: int, seed: int) -> dict[str, Any]:
    mds, nodes = fleet(deployments, seed), racks(rack_count)
    out: dict[str, Any] = {"racks": rack_count, "deployments": deployments, "seed": seed}
    for name, units in (("units", True), ("groups_alone", False)):
        out[name] = measure(place(mds, nodes, units))
    return out


def table(runs: Sequence[Mapping[str, Any]]) -> str:
    rows = ["fleet  seed  placement     GPUs placed/asked  units whole  KV in domain (kept / random)  CDs"]
    for r in runs:
        for name in ("units", "groups_alone"):
            m = r[name]
            whole = f"{m['units_whole']}/{m['units']}" if m["units"] else "-"
            kept = m["kv_inside_domain_if_kept_in_unit"]
            rows.append(
                f"{r['deployments']:<6} {r['seed']:<5} {name:<13} "
                f"{m['gpus_placed']:>6}/{m['gpus_asked']:<10} {whole:>11}  "
                f"{'-' if kept is None else f'{kept:.1%}':>8} / "
                f"{m['kv_inside_domain_if_paired_at_random']:.1%}{'':>12}{m['compute_domains']:>6}"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    started = time.time()
    args = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--racks", type=int, default=16)
    ap.add_argument("--deployments", type=int, nargs="+", default=[20, 28])  # ~70% and ~100% full
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(args)
    runs = [run(a.racks, d, s) for d in a.deployments for s in a.seeds]
    print(table(runs))
    result = {
        "benchmark": "fabric placement",
        "modeled": "placement only, through the operator's plan; no KV transfer is measured",
        "runs": runs,
    }
    print(f"saved {record.save('fabric', result, a.out, 'e2e.bench.fabric_bench', args, started)}")


if __name__ == "__main__":
    main()
