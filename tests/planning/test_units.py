"""Prefill-decode units (tokenfab.planning.units) and how a pass places them: the unit rule from the ratio,
each unit kept in one NVLink domain where it fits (the DeepSeek-R1 example on four racks, against the
placement that ignores units), a lost decode group re-placed beside its prefill groups, a unit that fits
nowhere whole spread rather than left unplaced, and a unit's ComputeDomain deleted once it has no group."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from testing.cases import load_example
from tests.planning.test_one_pass import materialize, nodes_of, snapshot, used_by
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeployment
from tokenfab.planning import builders, units
from tokenfab.planning.faults import NodeFault
from tokenfab.planning.one_pass import Plan, Snapshot, Written, plan, settle


def deepseek(**spec: Any) -> ModelDeployment:
    """The DeepSeek-R1 example as it is (decode 32 GPUs on 8 trays, prefill 8 on 2, 1:1, 2 decode
    groups), with `spec` merged into its spec."""
    doc: dict[str, Any] = copy.deepcopy(load_example("deepseek-r1-disaggregated.yaml"))
    doc["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return parse_model_deployment(doc)


def unit_domains(snap: Snapshot, p: Plan) -> dict[int, set[str]]:
    """Each unit's NVLink domains once the plan's creates are made."""
    out: dict[int, set[str]] = {}
    for rp in p.roles:
        for cr in rp.create:
            assert cr.unit is not None
            out.setdefault(cr.unit, set()).add(cr.domain)
    return out


@pytest.mark.parametrize(
    ("ratio", "policy", "expected"),
    [
        ("1:1", "fixed", units.Rule(1, 1, True)),
        ("2:4", "fixed", units.Rule(1, 2, True)),
        ("2:1", "fixed", units.Rule(2, 1, True)),
        ("1:1", "independent", units.Rule(1, 1, False)),
    ],
)
def test_the_unit_rule_comes_from_the_reduced_ratio(ratio, policy, expected):
    md = deepseek(serving={"prefillDecodeRatio": ratio, "ratioPolicy": policy})
    if policy == "independent":
        md = deepseek(serving={"ratioPolicy": policy}, prefill={"replicas": 3})
    assert units.rule(md.spec) == expected


def test_an_aggregated_deployment_has_no_units():
    doc = load_example("aggregated-small.yaml")
    assert units.rule(parse_model_deployment(doc).spec) is None


def test_slots_fill_units_in_order_and_independent_prefill_is_dealt_over_the_decode_groups():
    one_two = units.Rule(1, 2, True)
    assert [units.unit_of(one_two, "decode", s, 3) for s in range(4)] == [0, 0, 1, 1]
    assert [units.unit_of(one_two, "prefill", s, 3) for s in range(2)] == [0, 1]
    two_one = units.Rule(2, 1, True)
    assert [units.unit_of(two_one, "prefill", s, 2) for s in range(4)] == [0, 0, 1, 1]
    dealt = units.Rule(1, 1, False)
    assert [units.unit_of(dealt, "prefill", s, 2) for s in range(5)] == [0, 1, 0, 1, 0]


def test_the_deepseek_example_places_each_unit_inside_one_nvlink_domain():
    """Two units of 40 GPUs on four empty 72-GPU racks: best fit alone packs both 32-GPU decode groups
    into one rack and leaves room for one prefill group beside them, so one unit spans two racks."""
    md = deepseek()
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}), {}, {})
    p = plan(snap)
    per_unit = unit_domains(snap, p)
    assert sorted(per_unit) == [0, 1]
    assert all(len(d) == 1 for d in per_unit.values()), per_unit


def units_ignored(snap: Snapshot) -> Plan:
    """The plan made with units turned off (what tokenfab did before them)."""
    return plan(replace(snap, units=False))


def test_best_fit_alone_splits_a_deepseek_unit_across_racks():
    """The baseline the test above improves on: it must show the split, or that test proves nothing."""
    md = deepseek()
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}), {}, {})
    p = units_ignored(snap)
    by_role = {rp.role: {cr.slot: cr.domain for cr in rp.create} for rp in p.roles}
    pairs = [(by_role["decode"][s], by_role["prefill"][s]) for s in (0, 1)]
    assert any(d != pf for d, pf in pairs), pairs


def test_a_lost_decode_group_is_replaced_beside_its_units_prefill_group():
    md = deepseek()
    nodes = nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18})
    first = snapshot(md, nodes, {}, {})
    groups = materialize(first, plan(first))
    decode0 = next(g for g in groups["decode"] if g.slot == 0)
    prefill0 = next(g for g in groups["prefill"] if g.slot == 0)
    assert decode0.domain == prefill0.domain
    # decode 0's first node is lost: the group is broken, deleted and replaced in the same pass
    down = frozenset({decode0.pods[0].node or ""})
    lost = nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}, down)
    snap = snapshot(md, lost, used_by(groups, md), groups)
    p = plan(snap)
    [new] = [cr for rp in p.roles if rp.role == "decode" for cr in rp.create]
    assert new.reason == "Replace"
    assert new.unit == 0
    assert new.domain == prefill0.domain, "re-placed beside the prefill group it serves"


def test_a_unit_split_for_lack_of_room_crosses_over_tcp_and_says_it_gathers_again():
    """The unit filled rack r0 (10 trays); a tray of its decode group is lost and neither r0 nor r1 (9
    trays) holds the whole unit, so the replacement goes to r1 alone. A whole unit fits in one domain, so
    no group asks for RDMA (a cluster without RDMA devices would leave it Pending): the unit's path is tcp
    until it gathers again, and the Fabric condition says so."""
    md = deepseek(decode={"replicas": 1})
    first = snapshot(md, nodes_of({"r0": 10, "r1": 9}), {}, {})
    groups = materialize(first, plan(first))
    assert {g.domain for gs in groups.values() for g in gs} == {"r0"}
    assert not any(g.rdma for gs in groups.values() for g in gs)
    decode0 = groups["decode"][0]
    lost = nodes_of({"r0": 10, "r1": 9}, frozenset({decode0.pods[0].node or ""}))
    snap = snapshot(md, lost, used_by(groups, md), groups)
    p = plan(snap)
    [new] = [cr for rp in p.roles if rp.role == "decode" for cr in rp.create]
    assert (new.domain, new.unit, new.rdma) == ("r1", 0, False)
    status, _ = settle(snap, p, Written())
    assert [(u.domains, u.path) for u in status.units] == [(["r0", "r1"], "tcp")]
    fabric = next(cd for cd in status.conditions if cd.type == "Fabric")
    assert "split for lack of room" in fabric.message
    assert "until it gathers again" in fabric.message


def test_a_lost_decode_group_with_no_room_beside_moves_the_unit_where_it_fits_whole():
    """The unit filled rack r0; a tray of its decode group is lost and r0 has no room for a new one. The
    replacement goes to r1, where the whole unit fits, and needs no RDMA: the prefill group follows it
    there in the same pass (a Rejoin: replaced in r1 first, then drained once the new one serves), and
    the unit is whole again, over NVLink."""
    md = deepseek(decode={"replicas": 1})
    racks = {"r0": 10, "r1": 18}
    first = snapshot(md, nodes_of(racks), {}, {})
    groups = materialize(first, plan(first))
    assert {g.domain for gs in groups.values() for g in gs} == {"r0"}
    decode0, prefill0 = groups["decode"][0], groups["prefill"][0]
    lost = nodes_of(racks, frozenset({decode0.pods[0].node or ""}))
    snap = snapshot(md, lost, used_by(groups, md), groups)
    p = plan(snap)
    made = {cr.role: cr for rp in p.roles for cr in rp.create}
    assert (made["decode"].reason, made["decode"].domain, made["decode"].rdma) == ("Replace", "r1", False)
    assert (made["prefill"].reason, made["prefill"].domain, made["prefill"].rdma) == ("Rejoin", "r1", False)
    assert made["prefill"].replaces == prefill0.name
    prefill_plan = next(rp for rp in p.roles if rp.role == "prefill")
    assert not prefill_plan.drain, "the away group serves until its replacement does"
    assert not prefill_plan.delete
    # Next pass: both new groups serve; the away prefill group leaves (drained first), nothing else moves.
    after = materialize(snap, p)
    after["decode"] = [g for g in after["decode"] if g.name != decode0.name]
    snap2 = snapshot(md, lost, used_by(after, md), after)
    p2 = plan(snap2)
    assert not [cr for rp in p2.roles for cr in rp.create]
    leaving = [(x.name, x.reason) for rp in p2.roles for x in (*rp.drain, *rp.delete)]
    assert leaving == [(prefill0.name, "Rejoin")]
    # Once it is gone, the unit is whole in r1 and nothing more moves.
    after["prefill"] = [g for g in after["prefill"] if g.name != prefill0.name]
    snap3 = snapshot(md, lost, used_by(after, md), after)
    p3 = plan(snap3)
    assert not [x for rp in p3.roles for x in (*rp.create, *rp.drain, *rp.delete)]
    status, _ = settle(snap3, p3, Written())
    assert [(u.domains, u.path) for u in status.units] == [(["r1"], "nvlink")]


def test_a_group_away_from_its_unit_stays_while_the_home_has_no_room():
    """Rack r0 holds the decode group and has no room for the prefill group, which runs in r1: nothing
    moves, pass after pass (no churn). Once r0 has room, the prefill group rejoins it."""
    md = deepseek(decode={"replicas": 1})
    first = snapshot(md, nodes_of({"r0": 9, "r1": 9}), {}, {})
    groups = materialize(first, plan(first))
    assert sorted(g.domain for gs in groups.values() for g in gs) == ["r0", "r1"]
    snap = snapshot(md, nodes_of({"r0": 9, "r1": 9}), used_by(groups, md), groups)
    p = plan(snap)
    assert not [x for rp in p.roles for x in (*rp.create, *rp.drain, *rp.delete)]
    # r0 gains a tray (capacity freed, or added): the prefill group's replacement goes there
    grown = snapshot(md, nodes_of({"r0": 11, "r1": 9}), used_by(groups, md), groups)
    decode_domain = groups["decode"][0].domain
    p = plan(grown)
    [cr] = [cr for rp in p.roles for cr in rp.create]
    assert (cr.role, cr.reason, cr.domain) == ("prefill", "Rejoin", decode_domain)


def test_a_unit_that_fits_no_domain_whole_still_places_its_groups():
    """Racks of 9 trays (36 GPUs): a 32-GPU decode group and its 8-GPU prefill group cannot share one,
    so the unit spans two racks rather than wait."""
    md = deepseek(decode={"replicas": 1})
    snap = snapshot(md, nodes_of({"r0": 9, "r1": 9}), {}, {})
    p = plan(snap)
    assert not any(rp.unplaced for rp in p.roles)
    assert unit_domains(snap, p) == {0: {"r0", "r1"}}


def test_a_units_compute_domain_is_deleted_once_the_unit_has_no_group():
    md = deepseek(decode={"replicas": 1})
    nodes = nodes_of({"r0": 18, "r1": 18})
    first = snapshot(md, nodes, {}, {})
    groups = materialize(first, plan(first))
    snap = snapshot(md, nodes, used_by(groups, md), groups)
    owner = snap.owner
    stale = {builders.unit_domain_name(owner, 0): 0, builders.unit_domain_name(owner, 7): 7}
    p = plan(replace(snap, unit_domains=stale))
    assert p.writes.names("ComputeDomain") == (builders.unit_domain_name(owner, 7),)
    assert p.units is not None
    assert sorted(p.units.members) == [0]


def test_ratio_one_to_two_keeps_two_decode_groups_and_their_prefill_group_together():
    md = deepseek(
        serving={"prefillDecodeRatio": "1:2"},
        decode={"replicas": 4, "parallelism": {"tensor": 8, "expert": 8, "attentionDataParallel": True}},
    )
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18}), {}, {})
    p = plan(snap)
    per_unit = unit_domains(snap, p)
    assert sorted(per_unit) == [0, 1]
    assert all(len(d) == 1 for d in per_unit.values()), per_unit


def test_status_names_each_units_groups_domain_and_path():
    md = deepseek()
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}), {}, {})
    p = plan(snap)
    created = frozenset(
        builders.group_name(snap.owner, cr.role, cr.slot) for rp in p.roles for cr in rp.create
    )
    status, _ = settle(snap, p, Written(created=created))
    assert [(u.unit, u.groups, u.path) for u in status.units] == [
        (0, ["deepseek-r1-decode-0", "deepseek-r1-prefill-0"], "nvlink"),
        (1, ["deepseek-r1-decode-1", "deepseek-r1-prefill-1"], "nvlink"),
    ]
    assert all(len(u.domains) == 1 for u in status.units)
    assert status.kv_path == "2 nvlink"
    fabric = next(cd for cd in status.conditions if cd.type == "Fabric")
    assert (fabric.status, fabric.reason) == ("True", "NVLink")


def test_a_unit_that_spans_domains_holds_rdma_unless_the_spec_asks_for_tcp():
    """Racks of 9 trays (36 GPUs, gpusPerDomain 36): a 40-GPU unit fits in none, so each of its groups is
    made with the operator's RDMA device and IPC_LOCK (kvNetwork rdma, the default), and status names the
    path; with kvNetwork tcp neither, the path is tcp, and the Fabric condition says it was asked for."""
    md = deepseek(decode={"replicas": 1}, topology={"gpusPerDomain": 36})
    # trays without the RDMA device take no group of it: placement counts the device like the GPUs
    bare = replace(snapshot(md, nodes_of({"r0": 9, "r1": 9}), {}, {}), rdma_resource="rdma/hca")
    p = plan(bare)
    assert not [cr for rp in p.roles for cr in rp.create]
    status, _ = settle(bare, p, Written())
    placed = next(cd for cd in status.conditions if cd.type == "Placed")
    assert placed.status == "False"
    assert "each pod with one rdma/hca (its unit's 40 GPUs span NVLink domains of 36" in placed.message
    assert "spec.topology.kvNetwork: tcp where the cluster has no RDMA devices" in placed.message
    trays = [replace(n, allocatable={**n.allocatable, "rdma/hca": 16}) for n in nodes_of({"r0": 9, "r1": 9})]
    snap = replace(snapshot(md, trays, {}, {}), rdma_resource="rdma/hca")
    p = plan(snap)
    assert [cr.rdma for rp in p.roles for cr in rp.create] == [True, True]
    pods = [m for g in p.writes.groups for m in g.objects if m["kind"] == "Pod"]
    assert len(pods) == 10
    for pod in pods:
        ctr = pod["spec"]["containers"][0]
        assert ctr["resources"]["limits"]["rdma/hca"] == ctr["resources"]["requests"]["rdma/hca"] == "1"
        assert ctr["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert pod["metadata"]["labels"]["tokenfab.dev/kv-network"] == "rdma"
    status, changed = settle(snap, p, Written())
    [unit] = status.units
    assert (unit.domains, unit.path) == (["r0", "r1"], "rdma")
    fabric = next(cd for cd in changed if cd.type == "Fabric")
    assert (fabric.status, fabric.reason) == ("False", "KVOverNetwork")
    tcp = deepseek(decode={"replicas": 1}, topology={"kvNetwork": "tcp", "gpusPerDomain": 36})
    snap = snapshot(tcp, nodes_of({"r0": 9, "r1": 9}), {}, {})
    p = plan(snap)
    assert not any(cr.rdma for rp in p.roles for cr in rp.create)
    pods = [m for g in p.writes.groups for m in g.objects if m["kind"] == "Pod"]
    assert not any("tokenfab.dev/kv-network" in pod["metadata"]["labels"] for pod in pods)
    assert not any("add" in pod["spec"]["containers"][0]["securityContext"]["capabilities"] for pod in pods)
    status, changed = settle(snap, p, Written())
    assert [(u.domains, u.path) for u in status.units] == [(["r0", "r1"], "tcp")]
    fabric = next(cd for cd in changed if cd.type == "Fabric")
    assert "spec.topology.kvNetwork is tcp" in fabric.message


def test_a_unit_without_an_imex_channel_holds_rdma_and_placed_says_why_and_how_to_do_without():
    """computeDomain false: a unit's trays share no IMEX channel, so its KV between trays crosses the
    network even inside one rack; its pods hold the RDMA device, and on trays without one the Placed
    condition names the device, the reason and kvNetwork tcp as the way to run without."""
    md = deepseek(decode={"replicas": 1}, topology={"computeDomain": False})
    bare = [
        replace(n, allocatable={k: v for k, v in n.allocatable.items() if not k.startswith("rdma/")})
        for n in nodes_of({"r0": 18})
    ]
    snap = snapshot(md, bare, {}, {})
    p = plan(snap)
    assert not [cr for rp in p.roles for cr in rp.create]
    status, _ = settle(snap, p, Written())
    placed = next(cd for cd in status.conditions if cd.type == "Placed")
    assert placed.status == "False"
    why = "one rdma/rdma_shared_device_a (its unit's decode/prefill pods hold no IMEX channel"
    assert why in placed.message
    assert "spec.topology.kvNetwork: tcp" in placed.message
    tcp = deepseek(decode={"replicas": 1}, topology={"computeDomain": False, "kvNetwork": "tcp"})
    p = plan(snapshot(tcp, bare, {}, {}))
    assert [cr.rdma for rp in p.roles for cr in rp.create] == [False, False]


def test_a_unit_kept_whole_holds_no_rdma():
    md = deepseek()
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}), {}, {})
    p = plan(snap)
    assert p.writes.groups
    assert not any(cr.rdma for rp in p.roles for cr in rp.create)
    for g in p.writes.groups:
        for m in g.objects:
            assert "rdma/rdma_shared_device_a" not in str(m)


def test_status_says_a_split_unit_crosses_the_network_over_the_specs_own_rdma():
    # With the tray's NICs and IPC_LOCK in the spec the split unit's KV goes over RDMA, and status says so.
    rdma = deepseek(decode={"replicas": 1})
    runtime = rdma.spec.runtime.model_copy(update={"add_capabilities": ["IPC_LOCK"]})
    runtime.resources.limits["rdma/ib"] = "4"
    rdma = rdma.model_copy(update={"spec": rdma.spec.model_copy(update={"runtime": runtime})})
    trays = [replace(n, allocatable={**n.allocatable, "rdma/ib": 4}) for n in nodes_of({"r0": 9, "r1": 9})]
    snap = snapshot(rdma, trays, {}, {})
    status, _ = settle(snap, plan(snap), Written())
    assert [(u.domains, u.path) for u in status.units] == [(["r0", "r1"], "rdma")]
    assert status.kv_path == "1 rdma"


def test_a_unit_whose_compute_domain_failed_is_replaced_as_a_new_unit_and_its_domain_deleted():
    """A ComputeDomain gone NotReady loses every group of its unit (the view faults all their nodes): the
    replacements form a new unit, with a new ComputeDomain, and the broken one goes with its groups."""
    md = deepseek()
    nodes = nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18})
    first = snapshot(md, nodes, {}, {})
    groups = materialize(first, plan(first))
    lost = {n for gs in groups.values() for g in gs if g.slot == 0 for p in g.pods if (n := p.node)}
    fault = NodeFault("ComputeDomainNotReady", "ComputeDomain ns/deepseek-r1-unit-0-imex is NotReady", True)
    snap = snapshot(md, nodes, used_by(groups, md), groups)
    health = {n: replace(h, faults=(fault,)) if n in lost else h for n, h in snap.health.items()}
    names = {builders.unit_domain_name(snap.owner, u): u for u in (0, 1)}
    p = plan(replace(snap, health=health, unit_domains=names, units_down=frozenset({0})))
    creates = [cr for rp in p.roles for cr in rp.create]
    assert sorted((cr.role, cr.unit) for cr in creates) == [("decode", 2), ("prefill", 2)]
    assert len({cr.domain for cr in creates}) == 1
    assert p.writes.names("ComputeDomain") == (builders.unit_domain_name(snap.owner, 0),)


def test_independent_prefill_groups_are_dealt_over_the_decode_groups_and_placed_beside_them():
    """The qwen3 example's policy (independent): 3 prefill groups over 2 decode groups, each prefill
    group in the unit with the fewest, in its decode group's domain."""
    md = deepseek(serving={"ratioPolicy": "independent"}, prefill={"replicas": 3})
    snap = snapshot(md, nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18}), {}, {})
    p = plan(snap)
    by_role = {rp.role: {cr.slot: cr for cr in rp.create} for rp in p.roles}
    assert sorted(cr.unit for cr in by_role["prefill"].values()) == [0, 0, 1]
    for cr in by_role["prefill"].values():
        assert cr.domain == by_role["decode"][cr.unit].domain


def test_groups_leave_by_whole_units_when_slots_and_units_disagree():
    """After a replacement the slots no longer follow the units (a new decode group of unit 0 took slot
    2): a scale-down still empties the highest unit, prefill and decode alike."""
    md = deepseek()
    nodes = nodes_of({"r0": 18, "r1": 18, "r2": 18, "r3": 18})
    first = snapshot(md, nodes, {}, {})
    groups = materialize(first, plan(first))
    units_of_group = {g.name: g.slot for gs in groups.values() for g in gs}  # (fresh: unit == slot)
    relabelled = {role: [replace(g, unit=units_of_group[g.name]) for g in gs] for role, gs in groups.items()}
    # decode 0 was replaced by a group in slot 2 of unit 0
    d0 = next(g for g in relabelled["decode"] if g.slot == 0)
    relabelled["decode"] = [g for g in relabelled["decode"] if g.slot != 0] + [
        replace(d0, name="deepseek-r1-decode-2", slot=2, unit=0)
    ]
    down = deepseek(decode={"replicas": 1})
    snap = snapshot(down, nodes, used_by(relabelled, down), relabelled)
    p = plan(snap)
    removed = sorted(d.name for rp in p.roles for d in [*rp.delete, *rp.drain])
    assert removed == ["deepseek-r1-decode-1", "deepseek-r1-prefill-1"], removed
