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
- the ComputeDomains the fleet needs (one per unit, or one per multi-node group);
- a fault, twice: the fleet serving, then a rack lost (the one holding the most decode GPUs) or a tray of
  a decode group in the fullest rack, and the operator's passes run over every deployment until the fleet
  is quiet (groups come up at once in this model): the groups lost, the groups created by reason (Replace;
  Rejoin, a healthy group moved to gather its unit again, with its GPUs: what keeping units whole costs),
  the passes, and units whole, KV in a domain and GPUs serving before and after.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from e2e import record
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeployment, RoleName
from tokenfab.planning import builders
from tokenfab.planning.capacity import NodeFacts, Resources, add
from tokenfab.planning.lifecycle import GroupView, NodeHealth, PodView
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


# ------------------------------------------------------------------------------------------ a lost rack

Groups = dict[RoleName, list[GroupView]]


def owner_of(md: ModelDeployment) -> builders.Owner:
    return builders.Owner(name=md.metadata.name or "", namespace="bench", uid=md.metadata.uid or "")


def after(md: ModelDeployment, p: Plan, groups: Groups, now: float) -> Groups:
    """The deployment's groups once plan `p` is done: its new groups up and serving, the ones it deletes or
    drains gone (a drain taken as over at once)."""
    gone = {d.name for rp in p.roles for d in (*rp.delete, *rp.drain)}
    out = {role: [g for g in gs if g.name not in gone] for role, gs in groups.items()}
    for rp in p.roles:
        for cr in rp.create:
            name = builders.group_name(owner_of(md), cr.role, cr.slot)
            pods = tuple(
                PodView(
                    builders.pod_name(name, r), r, "Running", True, n, False, ready_since=now - 60, pinned=n
                )
                for r, n in enumerate(cr.nodes)
            )
            g = GroupView(
                name,
                cr.role,
                cr.slot,
                cr.revision,
                cr.domain,
                len(cr.nodes),
                rp.shape.gpus,
                pods,
                True,
                nodes=tuple(cr.nodes),
                released_at=now - 100,
                created_at=now - 120,
                unit=cr.unit,
                rdma=cr.rdma,
            )
            out.setdefault(cr.role, []).append(g)
    return out


def usage(fleet_groups: Sequence[tuple[ModelDeployment, Groups]]) -> dict[str, Resources]:
    """What every group's pods use, per node."""
    used: dict[str, Resources] = {}
    for md, groups in fleet_groups:
        for role, gs in groups.items():
            req = builders.pod_requests(md.spec, role)
            for g in gs:
                for pod in g.pods:
                    node = pod.node or pod.pinned or ""
                    used[node] = add(used.get(node, {}), req)
    return used


def settle_fleet(
    fleet_groups: list[tuple[ModelDeployment, Groups]], nodes: list[NodeFacts], units: bool, now: float
) -> tuple[list[tuple[ModelDeployment, Groups]], Counter[str], int]:
    """Passes over every deployment, one after another, until one changes nothing (at most 10): the groups
    then, the creates by reason (with `<reason> GPUs`), and the passes that changed something."""
    health = {n.name: NodeHealth(n.ready, n.not_ready_since) for n in nodes}
    made: Counter[str] = Counter()
    for passes in range(10):
        changed = False
        for i, (md, groups) in enumerate(fleet_groups):
            room = Room.fixed(nodes, usage(fleet_groups), builders.placement_constraints(md.spec))
            snap = Snapshot(
                owner=owner_of(md), md=md, groups=groups, health=health, room=room, now=now, units=units
            )
            p = plan(snap)
            for rp in p.roles:
                changed |= bool(rp.create or rp.delete or rp.drain)
                for cr in rp.create:
                    made[cr.reason] += 1
                    made[f"{cr.reason} GPUs"] += rp.shape.gpus
            fleet_groups[i] = (md, after(md, p, groups, now))
        now += 60
        if not changed:
            return fleet_groups, made, passes
    return fleet_groups, made, 10


def measure_groups(fleet_groups: Sequence[tuple[ModelDeployment, Groups]]) -> dict[str, Any]:
    """Units whole, the share of KV transfers inside a domain (kept in units / paired at random) and the
    GPUs serving, from the groups as they stand."""
    units_total = units_whole = kept_in = prefills = gpus = 0
    random_in = 0.0
    for _md, groups in fleet_groups:
        gpus += sum(g.gpus for gs in groups.values() for g in gs)
        by_unit: dict[int, set[str]] = {}
        for g in (*groups.get("decode", []), *groups.get("prefill", [])):
            if g.unit is not None:
                by_unit.setdefault(g.unit, set()).add(g.domain)
        decode_domains = Counter(g.domain for g in groups.get("decode", []))
        decodes = sum(decode_domains.values())
        units_total += len(by_unit)
        units_whole += sum(1 for d in by_unit.values() if len(d) == 1)
        for g in groups.get("prefill", []):
            prefills += 1
            kept_in += 1 if g.unit is not None and len(by_unit.get(g.unit, set())) == 1 else 0
            random_in += decode_domains[g.domain] / decodes if decodes else 0.0
    return {
        "gpus_serving": gpus,
        "units": units_total,
        "units_whole": units_whole,
        "kv_inside_domain_if_kept_in_unit": round(kept_in / prefills, 4)
        if prefills and units_total
        else None,
        "kv_inside_domain_if_paired_at_random": round(random_in / prefills, 4) if prefills else None,
    }


def lost_nodes(
    fleet_groups: Sequence[tuple[ModelDeployment, Groups]], nodes: list[NodeFacts], kind: str
) -> set[str]:
    """What a fault takes: `rack`, the rack holding the most GPUs of decode groups (ties by name); `tray`,
    a tray of a decode group in the fullest rack (most GPUs in use), so its replacement finds the least
    room beside its unit."""
    decode_gpus: Counter[str] = Counter()
    in_use: Counter[str] = Counter()
    trays: dict[str, list[str]] = {}
    for _md, groups in fleet_groups:
        for role, gs in groups.items():
            for g in gs:
                in_use[g.domain] += g.gpus
                if role == "decode":
                    decode_gpus[g.domain] += g.gpus
                    trays.setdefault(g.domain, []).extend(p.node or "" for p in g.pods)
    if kind == "rack":
        rack = max(decode_gpus, key=lambda d: (decode_gpus[d], d))
        return {n.name for n in nodes if n.labels[CLIQUE] == rack}
    rack = max(trays, key=lambda d: (in_use[d], d))
    return {sorted(trays[rack])[0]}


def fault(mds: Sequence[ModelDeployment], nodes: list[NodeFacts], units: bool, kind: str) -> dict[str, Any]:
    """The fleet placed and serving; then a rack or a tray is lost (`lost_nodes`: NotReady past their
    toleration) and the operator's passes run until the fleet is quiet: what was replaced, what moved to
    gather its unit again (Rejoin, with its GPUs: the cost), how many passes, and units and KV transfers
    before and after."""
    fleet_groups = [(md, after(md, p, {}, NOW)) for md, p in place(mds, nodes, units)]
    fleet_groups, _, _ = settle_fleet(fleet_groups, nodes, units, NOW)
    before = measure_groups(fleet_groups)
    gone = lost_nodes(fleet_groups, nodes, kind)
    lost = [replace(n, ready=False, not_ready_since=NOW - 400) if n.name in gone else n for n in nodes]
    hit = sum(
        1
        for _md, groups in fleet_groups
        for gs in groups.values()
        for g in gs
        if any(p.node in gone for p in g.pods)
    )
    fleet_groups, made, passes = settle_fleet(fleet_groups, lost, units, NOW + 60)
    return {
        "lost": sorted(gone)[0] if kind == "tray" else sorted(gone)[0].split("-")[0],
        "groups_lost": hit,
        "passes": passes,
        "created": dict(sorted(made.items())),
        "before": before,
        "after": measure_groups(fleet_groups),
    }


def run(rack_count: int, deployments: int, seed: int) -> dict[str, Any]:
    mds, nodes = fleet(deployments, seed), racks(rack_count)
    out: dict[str, Any] = {"racks": rack_count, "deployments": deployments, "seed": seed}
    for name, units in (("units", True), ("groups_alone", False)):
        out[name] = measure(place(mds, nodes, units))
        out[name]["rack_loss"] = fault(mds, nodes, units, "rack")
        out[name]["tray_loss"] = fault(mds, nodes, units, "tray")
    return out


def fault_table(runs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        "fleet  seed  placement     fault  lost groups  created (GPUs)                  passes  "
        "units whole before/after  GPUs serving before/after"
    ]
    for r in runs:
        for name in ("units", "groups_alone"):
            for kind in ("rack_loss", "tray_loss"):
                f = r[name][kind]
                made = ", ".join(
                    f"{k} {v} ({f['created'].get(k + ' GPUs', 0)})"
                    for k, v in f["created"].items()
                    if not k.endswith(" GPUs")
                )
                b, a = f["before"], f["after"]
                whole = (
                    f"{b['units_whole']}/{b['units']} -> {a['units_whole']}/{a['units']}"
                    if b["units"]
                    else "-"
                )
                where = f"{r['deployments']:<6} {r['seed']:<5} {name:<13} {kind.split('_')[0]:<6}"
                serving = f"{b['gpus_serving']:>5} -> {a['gpus_serving']}"
                lost = f"{f['groups_lost']:>11}  {made or '-':<31} {f['passes']:>6}"
                rows.append(f"{where} {lost}  {whole:>24}  {serving}")
    return "\n".join(rows)


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
    print(fault_table(runs))
    result = {
        "benchmark": "fabric placement",
        "modeled": "placement only, through the operator's plan; no KV transfer is measured; in the faults, "
        "groups come up at once and a drain is over at once",
        "runs": runs,
    }
    print(f"saved {record.save('fabric', result, a.out, 'e2e.bench.fabric_bench', args, started)}")


if __name__ == "__main__":
    main()
