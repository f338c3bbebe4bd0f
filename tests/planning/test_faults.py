"""Hardware faults: what a Node's taints, conditions and cordon mean (tokenfab.planning.faults), how a
degraded NVLink domain takes no new group (capacity), how the group planner answers an announced fault
(replace first, then drain) and a sudden one (re-place at once), the pods force-deleted off a gone node,
and the status's fault records and HardwareFault condition (tokenfab.planning.fault_report).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.planning import test_one_pass as one
from tests.planning.test_groups import NEW, NOW, TOL, cluster, group, healthy, plan
from tokenfab.api.models import FaultRecord
from tokenfab.fleet.facts import node_facts
from tokenfab.planning import fault_report
from tokenfab.planning.capacity import Constraints, NodeFacts, snapshot
from tokenfab.planning.faults import FaultKeys, NodeFault, device_fault, node_faults
from tokenfab.planning.groups import Create, Delete, Drain, DrainPolicy, NodeHealth
from tokenfab.planning.lifecycle import group_fault
from tokenfab.planning.one_pass import orphans
from tokenfab.planning.one_pass import plan as plan_pass

KEYS = FaultKeys()
QUARANTINE = NodeFault("Quarantined", "taint nvidia.com/gpu-xid-error=true:NoSchedule")
EVICTING = NodeFault("Evicting", "taint nvidia.com/gpu-xid-error=true:NoExecute (its pods are evicted)", True)


# ----------------------------------------------------------------------------------------- the signals


@pytest.mark.parametrize(
    ("taints", "conditions", "annotations", "cordoned", "kinds"),
    [
        pytest.param([], {}, [], False, [], id="healthy"),
        pytest.param([], {}, [], True, [("Cordoned", False, False)], id="a cordon moves, degrades nothing"),
        pytest.param(
            [("nvidia.com/gpu-xid-error", "true", "NoSchedule")],
            {},
            [],
            True,
            [("Quarantined", False, True)],
            id="NVSentinel's NoSchedule taint",
        ),
        pytest.param(
            [("nvidia.com/gpu-nvlink-error", "true", "NoExecute")],
            {},
            [],
            False,
            [("Evicting", True, True)],
            id="a NoExecute quarantine taint is sudden",
        ),
        pytest.param(
            [],
            {"GpuNvlinkWatch": "[DCGM_FR_NVLINK_DOWN] link down"},
            [],
            False,
            [("Quarantined", False, True)],
            id="a fault condition alone",
        ),
        pytest.param(
            [], {}, ["quarantineHealthEvent"], True, [("Quarantined", False, True)], id="cordon + annotation"
        ),
        pytest.param([], {}, ["quarantineHealthEvent"], False, [], id="the annotation without a cordon"),
        pytest.param(
            [("example.com/other", "", "NoSchedule")],
            {"MemoryPressure": ""},
            [],
            False,
            [],
            id="taints and conditions of nobody's health system",
        ),
    ],
)
def test_node_signals_are_read_as_announced_sudden_or_degrading(
    taints, conditions, annotations, cordoned, kinds
):
    got = node_faults(taints, conditions, annotations, cordoned, KEYS)
    assert [(f.kind, f.sudden, f.degrades) for f in got] == kinds


def test_the_keys_are_configurable_with_prefixes():
    keys = FaultKeys.from_env({"TOKENFAB_FAULT_TAINTS": "gpu.health/*", "TOKENFAB_FAULT_CONDITIONS": ""})
    assert node_faults([("gpu.health/memory-error", "", "NoSchedule")], {}, [], False, keys)
    assert not node_faults([("nvidia.com/gpu-xid-error", "true", "NoSchedule")], {}, [], False, keys)
    assert not node_faults([], {"GpuMemWatch": ""}, [], False, keys)  # (conditions switched off)
    assert FaultKeys.from_env({}) == KEYS


def test_the_operators_fault_keys_come_from_its_settings_and_reach_the_cluster_view(monkeypatch):
    from tokenfab.controller import Controller
    from tokenfab.handlers import options_from_env

    monkeypatch.setenv("TOKENFAB_FAULT_TAINTS", "gpu.health/*")
    opts = options_from_env()
    assert opts.settings.fault_keys.taints == ("gpu.health/*",)
    view = Controller(kube=None, options=opts).view  # type: ignore[arg-type]
    taint = {"key": "gpu.health/ecc", "effect": "NoSchedule"}
    node = {
        "metadata": {"name": "n1"},
        "spec": {"taints": [taint]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    view.on_node("ADDED", node)
    assert [f.kind for f in view.node("n1").faults] == ["Quarantined"]
    # With the defaults, that taint is nobody's quarantine.
    default = Controller(kube=None).view  # type: ignore[arg-type]
    default.on_node("ADDED", node)
    assert default.node("n1").faults == ()


def test_a_device_taint_is_announced_unless_it_evicts():
    assert not device_fault("gpu.nvidia.com/n1/gpu-0", "k", "v", "NoSchedule").sudden
    evicting = device_fault("compute-domain.nvidia.com/n1/channel-0", "k", "", "NoExecute")
    assert evicting.sudden
    assert evicting.degrades
    assert "channel-0" in evicting.message


def test_node_facts_read_an_nvsentinel_quarantine_from_the_node_object():
    node = {
        "metadata": {"name": "n1", "labels": {}, "annotations": {"quarantineHealthEvent": "{...}"}},
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "GpuMemWatch", "status": "True", "message": "ECC errors on GPU 0"},
                {"type": "GpuThermalWatch", "status": "False"},
            ]
        },
    }
    facts = node_facts(node)
    assert [(f.kind, f.message) for f in facts.faults] == [
        ("Quarantined", "condition GpuMemWatch: ECC errors on GPU 0")
    ]


# ----------------------------------------------------------------------------------------- degraded domains


def _node(
    name: str, domain: str, faults: tuple[NodeFault, ...] = (), unschedulable: bool = False
) -> NodeFacts:
    return NodeFacts(
        name, {"clique": domain}, {"nvidia.com/gpu": 4}, unschedulable=unschedulable, faults=faults
    )


def test_a_quarantined_node_degrades_its_domain_a_cordon_does_not():
    nodes = [
        _node("a-0", "a", (QUARANTINE,)),
        _node("a-1", "a"),
        _node("b-0", "b", (NodeFault("Cordoned", "cordoned", degrades=False),), unschedulable=True),
        _node("b-1", "b"),
    ]
    domains = snapshot(nodes, {}, {"nvidia.com/gpu": 4}, Constraints(domain_label="clique"))
    assert dict(domains["a"].free) == {}
    assert "a-0" in domains["a"].degraded
    assert "Quarantined" in domains["a"].degraded or "quarantined" in domains["a"].degraded
    assert dict(domains["b"].free) == {"b-1": 4}
    assert domains["b"].degraded == ""
    assert domains["a"].total_gpus == 8  # (its GPUs still count: they come back when it heals)


# ----------------------------------------------------------------------------------------- announced


def _quarantined(nodes, *names, fault=QUARANTINE):
    return {**healthy(nodes), **{n: NodeHealth(True, schedulable=False, faults=(fault,)) for n in names}}


def test_an_announced_fault_starts_a_replacement_first_and_keeps_the_group_serving():
    nodes = cluster(a=4, b=2)
    g0, g1 = group(0, "a-0", "a-1"), group(1, "a-2", "a-3")
    health = _quarantined(nodes, "a-1")
    # (the degraded domain a offers nothing: the replacement goes to b)
    p, _ = plan(
        [g0, g1],
        2,
        [n for n in nodes if n.domain == "b"] + [n for n in nodes if n.domain == "a"],
        health=health,
        drain=DrainPolicy(600, {}),
    )
    assert p.faults["m-decode-0"].kind == "Quarantined"
    assert not p.faults["m-decode-0"].sudden
    assert p.states["m-decode-0"] == "serving"
    assert p.delete == []
    assert p.drain == []
    assert [(cond.reason, cond.replaces) for cond in p.create] == [("Evacuate", "m-decode-0")]


def test_the_faulted_group_drains_once_its_replacement_serves():
    nodes = cluster(a=2, b=2)
    g0, new = group(0, "a-0", "a-1"), group(2, "b-0", "b-1")
    health = _quarantined(nodes, "a-0")
    starting = group(2, "b-0", "b-1", ready=False)
    p, _ = plan([g0, starting], 1, nodes, health=health, drain=DrainPolicy(600, {}))
    assert (p.create, p.drain, p.delete) == ([], [], [])  # the replacement is not serving yet: both stay
    p, _ = plan([g0, new], 1, nodes, health=health, drain=DrainPolicy(600, {}))
    assert p.drain == [Drain("decode", "m-decode-0", "Evacuate", None)]
    assert p.create == []
    p, _ = plan([g0, new], 1, nodes, health=health)  # (no metrics: deleted at once, engines drain on SIGTERM)
    assert p.delete == [Delete("decode", "m-decode-0", "Evacuate")]


def test_a_draining_faulted_group_is_never_taken_back_into_routing():
    nodes = cluster(a=2, b=2)
    draining = group(0, "a-0", "a-1", draining_since=NOW - 5)
    p, _ = plan([draining], 1, nodes, health=_quarantined(nodes, "a-0"), drain=DrainPolicy(600, {}))
    assert p.undrain == []
    assert [(cond.domain, cond.reason) for cond in p.create] == [("b", "Missing")]


def test_with_no_room_for_a_replacement_the_faulted_group_keeps_serving():
    nodes = cluster(a=2)
    g0 = group(0, "a-0", "a-1")
    p, _ = plan([g0], 1, nodes, health=_quarantined(nodes, "a-0"), drain=DrainPolicy(600, {}))
    assert (p.create, p.drain, p.delete, p.unplaced) == ([], [], [], 1)
    assert p.states["m-decode-0"] == "serving"


def test_a_faulted_group_that_does_not_serve_goes_at_once():
    nodes = cluster(a=2, b=2)
    g0 = group(0, "a-0", "a-1", ready=False)
    p, _ = plan([g0], 1, nodes, health=_quarantined(nodes, "a-1"), drain=DrainPolicy(600, {}))
    assert p.delete == [Delete("decode", "m-decode-0", "Evacuate")]
    assert [(cond.domain, cond.replaces) for cond in p.create] == [("b", "m-decode-0")]


# ----------------------------------------------------------------------------------------- sudden


def test_a_noexecute_fault_loses_the_group_and_re_places_it_at_once():
    nodes = cluster(a=2, b=2)
    g0 = group(0, "a-0", "a-1")
    p, _ = plan([g0], 1, nodes, health=_quarantined(nodes, "a-1", fault=EVICTING))
    assert p.states["m-decode-0"] == "broken"
    assert p.faults["m-decode-0"].sudden
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert p.create == [Create("decode", 1, "b", NEW, "Replace", ("b-0", "b-1"), (), "m-decode-0")]


def test_group_fault_prefers_the_sudden_one_and_names_the_node():
    nodes = cluster(a=2)
    g0 = group(0, "a-0", "a-1")
    health = {"a-0": NodeHealth(True, faults=(QUARANTINE,))}  # a-1 gone
    f = group_fault(g0, health, NOW, TOL)
    assert (f.node, f.kind, f.sudden) == ("a-1", "Lost", True)
    health = {**healthy(nodes), "a-1": NodeHealth(False, NOW - TOL - 1)}
    assert group_fault(g0, health, NOW, TOL).kind == "NotReady"
    health = {**healthy(nodes), "a-1": NodeHealth(False, NOW - 1)}
    assert group_fault(g0, health, NOW, TOL) is None  # (within its toleration)


# ----------------------------------------------------------------------------------------- the status


def _lost_plan():
    nodes = cluster(a=2, b=2)
    health = {n: h for n, h in healthy(nodes).items() if n != "a-1"}
    p, _ = plan([group(0, "a-0", "a-1")], 1, nodes, health=health)
    return p


def name(role: str, slot: int) -> str:
    return f"m-{role}-{slot}"


def test_a_lost_group_is_recorded_with_its_replacement_and_timed_until_it_serves():
    p = _lost_plan()
    recs = fault_report.records([], [p], NOW, name, frozenset({"m-decode-1"}))
    assert len(recs) == 1
    r = recs[0]
    assert (r.group, r.node, r.kind, r.reaction, r.replacement, r.domain) == (
        "m-decode-0",
        "a-1",
        "Lost",
        "Replaced",
        "m-decode-1",
        "b",
    )
    cond = fault_report.condition(recs)
    assert (cond.status, cond.reason) == ("True", "NodeLost")
    assert "a-1" in cond.message
    assert "m-decode-1" in cond.message
    assert "domain b" in cond.message
    # 9 s later the replacement serves.
    later = plan([group(1, "b-0", "b-1")], 1, cluster(a=2, b=2))[0]
    recs = fault_report.records(recs, [later], NOW + 9, name, frozenset())
    assert recs[0].recovery_seconds == 9.0
    cond = fault_report.condition(recs)
    assert (cond.status, cond.reason) == ("False", "Recovered")
    assert "9 s" in cond.message
    # The same fault seen again by a later pass is not recorded twice; a record that was not created
    # whole names no replacement.
    again = fault_report.records(recs[:0], [p, p], NOW, name, frozenset())
    assert len(again) == 1
    assert again[0].replacement is None


def test_records_keep_the_latest_ten():
    old = [
        FaultRecord(
            time="2026-01-01T00:00:00Z",
            group=f"g{i}",
            role="decode",
            node="n",
            kind="Lost",
            reaction="Replaced",
            recovered="2026-01-01T00:00:10Z",
        )
        for i in range(12)
    ]
    recs = fault_report.records(old, [_lost_plan()], NOW, name, frozenset())
    assert len(recs) == fault_report.KEEP
    assert recs[-1].group == "m-decode-0"


def test_no_fault_is_a_quiet_condition():
    cond = fault_report.condition([])
    assert (cond.status, cond.reason) == ("False", "NoFault")


def test_the_plan_force_deletes_the_pods_on_a_gone_node_only():
    md = one.deployment()
    nodes = one.nodes_of({"r1": 4, "r2": 4})
    first = one.snapshot(md, nodes, {}, {})
    groups = one.materialize(first, plan_pass(first))
    snap = one.snapshot(md, nodes, one.used_by(groups, md), groups)
    assert orphans(snap) == ()
    pods = [p for gs in groups.values() for g in gs for p in g.pods]
    gone = pods[0].node
    lost = replace(snap, health={n: h for n, h in snap.health.items() if n != gone})
    assert orphans(lost) == tuple(sorted(p.name for p in pods if p.node == gone)) != ()
    assert plan_pass(lost).writes.names("Pod", force=True) == orphans(lost)


def test_a_lost_groups_replacement_written_a_pass_later_is_still_its_replacement():
    """A group with an IMEX channel is written once its ComputeDomain's template exists: the replacement
    of a lost group may come a pass later, as a Missing group (in the lost group's slot, freed by then)."""
    recs = fault_report.records([], [_lost_plan()], NOW, name, frozenset())
    assert recs[0].replacement is None
    nodes = cluster(a=2, b=2)
    p, _ = plan([], 1, nodes)
    (cr,) = p.create
    recs = fault_report.records(recs, [p], NOW + 1, name, frozenset({name(cr.role, cr.slot)}))
    assert (recs[0].replacement, recs[0].domain) == (name(cr.role, cr.slot), cr.domain)
    assert recs[0].recovered is None
    serving = plan([group(cr.slot, *cr.nodes)], 1, nodes)[0]
    recs = fault_report.records(recs, [serving], NOW + 4, name, frozenset())
    assert recs[0].recovery_seconds == 4.0


def test_a_device_taint_rule_faults_the_node_its_pool_names_until_it_goes():
    from tokenfab.fleet.view import ClusterView

    view = ClusterView()
    node = {
        "metadata": {"name": "n1", "labels": {}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    view.on_node("ADDED", node)
    rule = {
        "metadata": {"name": "xid-79"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"},
            "taint": {"key": "nvidia.com/gpu-xid", "value": "79", "effect": "NoExecute"},
        },
    }
    view.on_device_taint_rule("ADDED", rule)
    (f,) = view.node("n1").faults
    assert (f.kind, f.sudden) == ("DeviceTainted", True)
    assert "gpu.nvidia.com/n1/gpu-3" in f.message
    assert "nvidia.com/gpu-xid=79:NoExecute" in f.message
    assert view.nodes()[0].faults == (f,)
    none = {**rule, "spec": {**rule["spec"], "taint": {"key": "k", "effect": "None"}}}
    view.on_device_taint_rule("MODIFIED", none)  # (effect None: nothing a pod feels)
    assert view.node("n1").faults == ()
    view.on_device_taint_rule("MODIFIED", rule)
    change = view.replace("DeviceTaintRule", [])  # (listed again: the rule went while unwatched)
    assert view.node("n1").faults == ()
    assert change.freed


def test_two_lost_groups_never_share_a_replacement_and_a_vanished_one_is_forgotten():
    nodes = cluster(a=4, b=4, c=4)
    g0, g1 = group(0, "a-0", "a-1"), group(1, "a-2", "a-3")
    gone0 = {n: h for n, h in healthy(nodes).items() if n != "a-0"}
    p1, _ = plan([g0, g1], 2, nodes, health=gone0)  # g0 lost; its replacement not written yet
    recs = fault_report.records([], [p1], NOW, name, frozenset())
    left = [n for n in nodes if n.domain != "a"]
    gone_a = healthy(left)
    p2, _ = plan([g1], 2, left, health=gone_a)  # g1 lost too (rack a gone); both replacements written now
    made = frozenset(name(cr.role, cr.slot) for cr in p2.create)
    exact = next(cr for cr in p2.create if cr.replaces == "m-decode-1")
    recs = fault_report.records(recs, [p2], NOW + 1, name, made)
    by_group = {r.group: r for r in recs}
    assert by_group["m-decode-1"].replacement == name("decode", exact.slot)
    other = by_group["m-decode-0"].replacement
    assert other is not None
    assert other != by_group["m-decode-1"].replacement
    # The next pass no longer has g0's replacement (removed before it served): the record forgets it.
    p3, _ = plan([group(exact.slot, *exact.nodes)], 1, left, health=gone_a)
    recs = fault_report.records(recs, [p3], NOW + 2, name, frozenset())
    by_group = {r.group: r for r in recs}
    assert by_group["m-decode-1"].recovered is not None
    assert by_group["m-decode-0"].replacement is None
    assert by_group["m-decode-0"].recovered is not None  # (the role has all it wants, none faulted)


def test_a_replacement_lost_in_turn_hands_its_own_replacement_on_to_the_first_record():
    """A rack seen going node by node: the first lost group's replacement lands on a node of the same
    rack, which goes a second later. Its record names the replacement's replacement (seen in the fault
    smoke: the first record named none, and was closed only because the role was whole again)."""
    nodes = cluster(a=4, b=4)
    p1, _ = plan(
        [group(0, "a-0", "a-1")], 1, nodes, health={n: h for n, h in healthy(nodes).items() if n != "a-1"}
    )
    (cr1,) = p1.create
    first = name(cr1.role, cr1.slot)
    recs = fault_report.records([], [p1], NOW, name, frozenset({first}))
    assert recs[0].replacement == first
    gone = {"a-1", cr1.nodes[0]}
    p2, _ = plan(
        [group(cr1.slot, *cr1.nodes)],
        1,
        nodes,
        health={n: h for n, h in healthy(nodes).items() if n not in gone},
    )
    (cr2,) = p2.create
    assert cr2.replaces == first
    second = name(cr2.role, cr2.slot)
    recs = fault_report.records(recs, [p2], NOW + 1, name, frozenset({second}))
    by_group = {r.group: r for r in recs}
    assert by_group[first].replacement == second
    assert (by_group["m-decode-0"].replacement, by_group["m-decode-0"].domain) == (second, cr2.domain)
    serving = plan([group(cr2.slot, *cr2.nodes)], 1, nodes)[0]
    recs = fault_report.records(recs, [serving], NOW + 5, name, frozenset())
    assert [(r.group, r.replacement, r.recovery_seconds) for r in recs] == [
        ("m-decode-0", second, 5.0),
        (first, second, 4.0),
    ]


def test_a_recovered_records_replacement_name_does_not_stop_a_new_group_of_that_name_replacing():
    """Slots are reused: an old fault's replacement m-decode-1 left, and a new group named m-decode-1 is
    made for a new fault. Only open records claim a replacement."""
    old = FaultRecord(
        time="2026-11-26T10:00:00Z",
        group="m-decode-0",
        role="decode",
        node="a-0",
        kind="Lost",
        reaction="Replaced",
        replacement="m-decode-1",
        domain="a",
        recovered="2026-11-26T10:00:09Z",
        recovery_seconds=9.0,
    )
    p = _lost_plan()  # m-decode-0 lost now; its replacement written this pass
    made = frozenset(name(cr.role, cr.slot) for cr in p.create)
    assert made == {"m-decode-1"}
    recs = fault_report.records([old], [p], NOW, name, made)
    assert recs[-1].group == "m-decode-0"
    assert recs[-1].recovered is None
    assert recs[-1].replacement == "m-decode-1"
    assert recs[0] == old


# ----------------------------------------------------------------------------------------- the baselines


def test_plain_kubernetes_replaces_a_lost_group_only_once_its_pods_are_gone():
    from tests.planning.test_groups import BIND, SHAPE, domains_of
    from tokenfab.planning.groups import Judging, Placing, Wanted, plan_role
    from tokenfab.planning.role_plan import FaultReaction

    nodes = cluster(a=2, b=2)
    g0 = group(0, "a-0", "a-1")
    health = {n: h for n, h in healthy(nodes).items() if n != "a-1"}

    def run(groups, reaction, now=NOW):
        return plan_role(
            Wanted("decode", 1, NEW, SHAPE),
            groups,
            Placing(domains_of(nodes, groups)),
            Judging(health, now, TOL, BIND, reaction),
        )[0]

    plain = run([g0], FaultReaction("none"))
    assert plain.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert (plain.create, plain.held) == ([], 1)  # (its pods wait for the pod garbage collector)
    assert run([], FaultReaction("none")).create != []  # (gone: now it is replaced)
    # Gang deletion: the whole group goes `delay` seconds after the fault was seen, then is replaced.
    seen = {"m-decode-0": NOW - 10}
    early = run([g0], FaultReaction("gang-delete", 30, seen))
    assert (early.delete, early.create, early.held) == ([], [], 1)
    late = run([g0], FaultReaction("gang-delete", 30, seen), NOW + 25)
    assert late.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert [cond.domain for cond in late.create] == ["b"]
    # Neither moves a group off an announced fault.
    quarantined = _quarantined(nodes, "a-0")
    for mode in ("none", "gang-delete"):
        p = plan_role(
            Wanted("decode", 1, NEW, SHAPE),
            [g0],
            Placing(domains_of(nodes, [g0])),
            Judging(quarantined, NOW, TOL, BIND, FaultReaction(mode)),
        )[0]
        assert (p.faults, p.create, p.drain, p.delete) == ({}, [], [], [])


def test_a_compute_domain_gone_not_ready_under_a_serving_group_faults_its_nodes():
    from tokenfab.fleet.view import ClusterView
    from tokenfab.planning import contract

    view = ClusterView()
    for n in ("n1", "n2"):
        view.on_node("ADDED", {"metadata": {"name": n, "labels": {}}, "spec": {}, "status": {}})
    labels = {
        contract.MANAGED_BY: contract.MANAGED_BY_VALUE,
        contract.LABEL_DEPLOYMENT: "m",
        contract.LABEL_GROUP: "m-decode-0",
    }

    def pod(name: str, node: str, ready: bool) -> dict:
        cond = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        return {
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "uid": name},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "conditions": [cond]},
        }

    cd = {
        "metadata": {"name": "m-decode-0-imex", "namespace": "ns", "labels": labels},
        "status": {"status": "NotReady"},
    }
    view.on_pod("ADDED", pod("m-decode-0-0", "n1", ready=False))
    view.on_child("ComputeDomain", "ADDED", cd)
    assert view.node("n1").faults == ()  # (a group still starting: its domain is not Ready yet)
    view.on_pod("MODIFIED", pod("m-decode-0-0", "n1", ready=True))
    (f,) = view.node("n1").faults
    assert (f.kind, f.sudden, f.degrades) == ("ComputeDomainNotReady", True, True)
    assert "ns/m-decode-0-imex" in f.message
    assert view.node("n2").faults == ()
    change = view.on_child("ComputeDomain", "MODIFIED", {**cd, "status": {"status": "Ready"}})
    assert view.node("n1").faults == ()
    assert change.freed


def test_a_node_that_faults_again_soon_is_avoided_for_a_growing_while():
    from tokenfab.fleet.view import ClusterView
    from tokenfab.planning.capacity import feasible
    from tokenfab.planning.faults import FLAP_BASE, flapping

    assert flapping([NOW - 5], NOW) is None  # (once is not flapping)
    assert flapping([NOW - 700, NOW - 5], NOW) is None  # (the first one is out of the window)
    f = flapping([NOW - 100, NOW - 5], NOW)
    assert f is not None
    assert (f.kind, f.sudden, f.degrades, f.moves) == ("Flapping", False, False, False)
    assert flapping([NOW - 100, NOW - 5], NOW - 5 + FLAP_BASE) is None  # (its backoff ran out)
    assert flapping([NOW - 200, NOW - 100, NOW - 5], NOW - 5 + FLAP_BASE) is not None  # (twice as long)

    view = ClusterView()
    clock = [NOW]
    view.clock = lambda: clock[0]
    healthy_node = {
        "metadata": {"name": "n1", "labels": {"clique": "a"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    sick = {**healthy_node, "spec": {"taints": [{"key": "nvidia.com/gpu-xid-error", "effect": "NoSchedule"}]}}
    view.on_node("ADDED", healthy_node)
    for _ in range(2):  # quarantined and healed twice
        view.on_node("MODIFIED", sick)
        clock[0] += 10
        view.on_node("MODIFIED", healthy_node)
    (flap,) = view.node("n1").faults
    assert flap.kind == "Flapping"
    assert not feasible(view.node("n1"), Constraints(domain_label="clique"))
    clock[0] += FLAP_BASE + 1
    assert view.node("n1").faults == ()
    # A maintenance cordon is not a fault that counts.
    cordoned = {**healthy_node, "spec": {"unschedulable": True}}
    other = ClusterView()
    other.on_node("ADDED", healthy_node)
    for _ in range(3):
        other.on_node("MODIFIED", cordoned)
        other.on_node("MODIFIED", healthy_node)
    assert other.node("n1").faults == ()


# ----------------------------------------------------------------------------------------- a hung worker


START = "2026-11-26T10:00:00Z"


def _worker_pod(started: bool, cr_since: str, cr: str = "False", probe: bool = True) -> dict:
    ctr = {
        "name": "worker",
        **({"startupProbe": {"httpGet": {"path": "/health", "port": "metrics"}}} if probe else {}),
    }
    return {
        "metadata": {"name": "m-decode-0-0", "namespace": "ns"},
        "spec": {"nodeName": "a-0", "containers": [ctr]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "ContainersReady", "status": cr, "lastTransitionTime": cr_since}],
            "containerStatuses": [
                {
                    "name": "worker",
                    "started": started,
                    "state": {"running": {"startedAt": "2026-11-26T10:00:00Z"}},
                }
            ],
        },
    }


def test_pod_facts_tell_a_worker_that_stopped_answering_from_one_still_loading():
    from tokenfab.fleet.facts import parse_time, pod_facts

    later = "2026-11-26T10:20:00Z"
    assert pod_facts(_worker_pod(True, later)).unhealthy_since == parse_time(later)
    # Still loading: not started (its startup probe has not passed yet).
    assert pod_facts(_worker_pod(False, "2026-11-26T10:00:00Z")).unhealthy_since is None
    # Started but never ready since it started (its readiness probe has not run yet): not a fault.
    assert pod_facts(_worker_pod(True, "2026-11-26T10:00:00Z")).unhealthy_since is None
    # Ready: healthy.
    assert pod_facts(_worker_pod(True, later, cr="True")).unhealthy_since is None
    # No startup probe (a pod made before it had one): `started` says nothing, so nothing is concluded.
    assert pod_facts(_worker_pod(True, later, probe=False)).unhealthy_since is None


def test_a_worker_whose_health_endpoint_keeps_failing_loses_its_group_once_the_grace_is_over():
    from tests.planning.test_groups import with_pod
    from tokenfab.planning import recovery
    from tokenfab.planning.lifecycle import UNHEALTHY_GRACE

    nodes = cluster(a=2, b=2)
    hung = lambda since: with_pod(group(0, "a-0", "a-1"), 1, ready=False, unhealthy_since=since)  # noqa: E731
    # Within its grace the group is starting (not serving): nothing is replaced yet.
    p, _ = plan([hung(NOW - UNHEALTHY_GRACE + 5)], 1, nodes)
    assert p.states["m-decode-0"] == "starting"
    assert not p.faults
    assert p.create == []
    p, _ = plan([hung(NOW - UNHEALTHY_GRACE - 1)], 1, nodes)
    assert p.states["m-decode-0"] == "broken"
    f = p.faults["m-decode-0"]
    assert (f.node, f.kind, f.sudden, f.domain) == ("a-1", "WorkerUnhealthy", True, "a")
    assert "m-decode-0-1" in f.message
    assert "healthy node a-1" in f.message
    assert p.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert [(cond.replaces, cond.reason) for cond in p.create] == [("m-decode-0", "Replace")]
    # Replaced at once, as for a lost node: not an engine that keeps crashing (no role backoff).
    assert not recovery.recurring(p.broken_reasons["m-decode-0"])
    recs = fault_report.records([], [p], NOW, name, frozenset())
    assert (recs[0].kind, recs[0].faulted_domain) == ("WorkerUnhealthy", "a")
    assert fault_report.condition(recs).reason == "WorkerUnhealthy"
    # Plain Kubernetes only takes the hung pod out of its Service: the group stays, hung, for ever.
    from tests.planning.test_groups import BIND, SHAPE, domains_of
    from tokenfab.planning.groups import Judging, Placing, Wanted, plan_role
    from tokenfab.planning.role_plan import FaultReaction

    g = hung(NOW - 3600)
    plain, _ = plan_role(
        Wanted("decode", 1, NEW, SHAPE),
        [g],
        Placing(domains_of(nodes, [g])),
        Judging(healthy(nodes), NOW, TOL, BIND, FaultReaction("none")),
    )
    assert (plain.states["m-decode-0"], plain.faults, plain.delete, plain.create) == ("starting", {}, [], [])
    # A node fault comes first: the same group on a lost node is Lost.
    health = {n: h for n, h in healthy(nodes).items() if n != "a-0"}
    assert group_fault(hung(NOW - 100), health, NOW, TOL).kind == "Lost"


def _record(domain: str, age: float, kind: str = "WorkerUnhealthy") -> FaultRecord:
    from tokenfab.planning.status import rfc3339

    return FaultRecord(
        time=rfc3339(NOW - age),
        group=f"m-decode-{int(age)}",
        role="decode",
        node=f"{domain}-0",
        kind=kind,
        reaction="Replaced",
        faulted_domain=domain,
    )


def test_a_domain_where_the_deployments_groups_keep_failing_takes_none_of_them_for_a_while():
    from tests.planning.test_groups import SHAPE, domains_of
    from tokenfab.planning.faults import FLAP_BASE
    from tokenfab.planning.groups import Judging, Placing, Wanted, plan_role

    once = [_record("a", 100)]
    assert fault_report.avoided(once, NOW) == {}
    twice = [_record("a", 100), _record("a", 5)]
    avoided = fault_report.avoided(twice, NOW)
    assert set(avoided) == {"a"}
    assert "2 times" in avoided["a"]
    assert fault_report.avoided(twice, NOW - 5 + FLAP_BASE + 1) == {}  # (its backoff ran out)
    # A maintenance cordon is not a failure of the group.
    assert fault_report.avoided([_record("a", 100, "Cordoned"), _record("a", 5, "Cordoned")], NOW) == {}
    # Best fit would choose a (it fits exactly); avoided, the group goes to c.
    nodes = cluster(a=2, c=4)
    want, judge = Wanted("decode", 1, NEW, SHAPE), Judging(healthy(nodes), NOW, TOL)
    assert plan_role(want, [], Placing(domains_of(nodes, [])), judge)[0].create[0].domain == "a"
    p, _ = plan_role(want, [], Placing(domains_of(nodes, []), avoid=frozenset({"a"})), judge)
    assert p.create[0].domain == "c"
    # With nowhere else to go the group goes there all the same: serving beats waiting out the backoff
    # with room in the cluster (a lost rack's groups, the other racks avoided, waited up to 2 minutes).
    only_a = cluster(a=2)
    p, _ = plan_role(
        want, [], Placing(domains_of(only_a, []), avoid=frozenset({"a"})), Judging(healthy(only_a), NOW, TOL)
    )
    assert ([c.domain for c in p.create], p.unplaced) == (["a"], 0)
    # Records of one fault (a rack lost at once, two groups of the deployment there) are one onset.
    at_once = [_record("a", 100), _record("a", 99)]
    assert fault_report.avoided(at_once, NOW) == {}
    assert set(fault_report.avoided([*at_once, _record("a", 5)], NOW)) == {"a"}
    cond = fault_report.condition(twice, avoided)
    assert "NVLink domain a avoided" in cond.message


def test_flapping_nodes_take_new_groups_when_nowhere_else_has_room():
    """A node that faulted again soon after it healed takes no new group while others have room; when none
    has, it does (a rack lost twice in 10 minutes, the others full or lost: its groups would wait out the
    backoff, minutes, with GPUs free)."""
    from dataclasses import replace

    from tests.planning.test_one_pass import deployment, nodes_of, snapshot
    from tokenfab.planning.faults import flapping
    from tokenfab.planning.one_pass import plan

    flap = flapping([NOW - 100, NOW - 5], NOW)
    assert flap is not None
    md = deployment(decode=1)  # a decode group of 2 nodes and a prefill group of 1

    def flapping_rack(nodes):
        return [replace(n, faults=(flap,)) if n.labels["nvidia.com/gpu.clique"] == "r0" else n for n in nodes]

    # Room elsewhere: the flapping rack is left alone.
    p = plan(snapshot(md, flapping_rack(nodes_of({"r0": 6, "r1": 6})), {}, {}))
    assert {cr.domain for r in p.roles for cr in r.create} == {"r1"}
    # Nowhere else: it takes them.
    p = plan(snapshot(md, flapping_rack(nodes_of({"r0": 6})), {}, {}))
    assert {cr.domain for r in p.roles for cr in r.create} == {"r0"}
    assert not any(r.unplaced for r in p.roles)
    assert {r.group for r in p.reservations} == _groups(p)  # (the room promised is where they go)
    # Any other fault still keeps new groups off.
    sick = [replace(n, faults=(flap, replace(flap, kind="NodeQuarantined"))) for n in nodes_of({"r0": 6})]
    p = plan(snapshot(md, sick, {}, {}))
    assert [cr for r in p.roles for cr in r.create] == []


def _groups(p):
    from tokenfab.planning import builders

    owner = builders.Owner(name="deepseek-r1", namespace="ns", uid="uid-1")
    return {builders.group_name(owner, cr.role, cr.slot) for r in p.roles for cr in r.create}
