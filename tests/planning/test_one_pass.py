"""`planning.one_pass.plan(snapshot) -> Plan`, read whole: a worked example on a fresh cluster, and
properties that hold for any snapshot hypothesis makes (a fleet that ran one pass, then lost nodes, was
rescaled or rolled out, on racks with other tenants' pods on them):

- a Plan never splits a group across NVLink domains;
- it never promises more room on a node than the ledger saw free there;
- it never deletes or drains the last serving group of a role;
- what it reserves is exactly the pods of the groups it creates.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testing.cases import load_example
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeployment, RoleName
from tokenfab.planning import builders
from tokenfab.planning.capacity import NodeFacts
from tokenfab.planning.lifecycle import GroupView, NodeHealth, PodView, classify
from tokenfab.planning.one_pass import Plan, Snapshot, plan
from tokenfab.planning.room import Room

NOW = 1_000_000.0
GPU = "nvidia.com/gpu"
CLIQUE = "nvidia.com/gpu.clique"
RDMA = "rdma/rdma_shared_device_a"
# a GB200 tray: 4 GPUs and an RDMA device shared by its pods (the groups below hold no IMEX channel, so
# their units' KV between trays crosses the network: planning.units.needs_rdma)
NODE = {"cpu": 128_000, "memory": 1024 * 2**30, GPU: 4, RDMA: 1000}


def deployment(decode: int = 2, batch: int = 256) -> ModelDeployment:
    """DeepSeek-R1 disaggregated, with groups small enough for a small cluster: decode 8 GPUs on 2 nodes,
    prefill 4 GPUs on 1, prefill following decode 1:1."""
    doc: dict[str, Any] = copy.deepcopy(load_example("deepseek-r1-disaggregated.yaml"))
    doc["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    spec = doc["spec"]
    spec["decode"]["parallelism"] = {"tensor": 8, "expert": 8, "attentionDataParallel": True}
    spec["decode"]["replicas"] = decode
    spec["decode"]["maxBatchSize"] = batch
    spec["decode"]["extraEngineArgs"] = {}
    spec["prefill"]["parallelism"] = {"tensor": 4, "expert": 4, "attentionDataParallel": True}
    spec["topology"]["computeDomain"] = False
    return parse_model_deployment(doc)


def nodes_of(racks: dict[str, int], down: frozenset[str] = frozenset()) -> list[NodeFacts]:
    return [
        NodeFacts(
            f"{rack}-{i}",
            {CLIQUE: rack},
            NODE,
            ready=f"{rack}-{i}" not in down,
            not_ready_since=NOW - 400 if f"{rack}-{i}" in down else None,
        )
        for rack, n in racks.items()
        for i in range(n)
    ]


def snapshot(
    md: ModelDeployment,
    nodes: list[NodeFacts],
    used: dict[str, dict[str, int]],
    groups: dict[RoleName, list[GroupView]],
) -> Snapshot:
    owner = builders.Owner(name=md.metadata.name or "", namespace="ns", uid="uid-1")
    health = {n.name: NodeHealth(n.ready, n.not_ready_since) for n in nodes}
    room = Room.fixed(nodes, used, builders.placement_constraints(md.spec))
    return Snapshot(owner=owner, md=md, groups=groups, health=health, room=room, now=NOW, bind_timeout=90.0)


def materialize(snap: Snapshot, p: Plan) -> dict[RoleName, list[GroupView]]:
    """The groups after the plan's creates were made and came up serving (a minute ago)."""
    out = {role: list(gs) for role, gs in snap.groups.items()}
    for rp in p.roles:
        for cr in rp.create:
            name = builders.group_name(snap.owner, cr.role, cr.slot)
            pods = tuple(
                PodView(
                    builders.pod_name(name, r), r, "Running", True, n, False, ready_since=NOW - 60, pinned=n
                )
                for r, n in enumerate(cr.nodes)
            )
            shape = (cr.domain, len(cr.nodes), rp.shape.gpus)
            g = GroupView(
                name,
                cr.role,
                cr.slot,
                cr.revision,
                *shape,
                pods,
                True,
                tuple(cr.nodes),
                NOW - 100,
                None,
                NOW - 120,
                unit=cr.unit,
                rdma=cr.rdma,
            )
            out.setdefault(cr.role, []).append(g)
    return out


def used_by(groups: dict[RoleName, list[GroupView]], md: ModelDeployment) -> dict[str, dict[str, int]]:
    used: dict[str, dict[str, int]] = {}
    for role, gs in groups.items():
        req = builders.pod_requests(md.spec, role)
        for g in gs:
            for pod in g.pods:
                node = used.setdefault(pod.node or pod.pinned or "", {})
                for k, v in req.items():
                    node[k] = node.get(k, 0) + v
    return used


def check(snap: Snapshot, p: Plan) -> None:
    """The properties every Plan keeps."""
    nodes, used = snap.room.read()
    domain_of = {n.name: n.labels[CLIQUE] for n in nodes}
    free = {n.name: n.allocatable[GPU] - used.get(n.name, {}).get(GPU, 0) for n in nodes}
    # One group, one domain; and what is reserved is exactly the new groups' pods.
    reserved = {r.group: r for r in p.reservations}
    for rp in p.roles:
        for cr in rp.create:
            assert {domain_of[n] for n in cr.nodes} == {cr.domain}, (cr, "split across domains")
            r = reserved.pop(builders.group_name(snap.owner, cr.role, cr.slot))
            assert sorted(node for node, _ in r.pods.values()) == sorted(cr.nodes)
    assert not reserved, f"reservations for groups not created: {sorted(reserved)}"
    # Never more room promised than free.
    promised: dict[str, int] = {}
    for r in p.reservations:
        for node, req in r.pods.values():
            promised[node] = promised.get(node, 0) + req.get(GPU, 0)
    for node, gpus in promised.items():
        assert gpus <= free[node], (node, gpus, free[node])
    # Never the last serving group of a role removed.
    tol = float(snap.spec.topology.node_failure_toleration_seconds)
    for rp in p.roles:
        serving = {
            g.name for g in snap.groups.get(rp.role, []) if classify(g, snap.health, NOW, tol)[0] == "serving"
        }
        removed = {d.name for d in rp.delete} | {d.name for d in rp.drain}
        assert not serving or serving - removed, (rp.role, serving, removed)


def test_a_fresh_cluster_gets_every_group_whole_and_the_plan_says_everything():
    md = deployment(decode=2)
    snap = snapshot(md, nodes_of({"r0": 6, "r1": 6}), {}, {})
    p = plan(snap)
    check(snap, p)
    assert p.desired == {"decode": 2, "prefill": 2}
    creates = {rp.role: [(cr.slot, cr.domain, len(cr.nodes)) for cr in rp.create] for rp in p.roles}
    # pack: best fit puts both decode groups (2 nodes each) and then both prefill groups (1 node) in r0.
    assert creates == {"decode": [(0, "r0", 2), (1, "r0", 2)], "prefill": [(0, "r0", 1), (1, "r0", 1)]}
    assert len(p.reservations) == 4
    assert all(not rp.delete and not rp.drain for rp in p.roles)
    kinds = [m["kind"] for m in p.writes.rest]
    assert p.writes.workers_service["kind"] == "Service"
    assert [m["kind"] for m in p.writes.identity] == ["ServiceAccount", "Role", "RoleBinding"]
    assert "Deployment" in kinds
    assert kinds.count("ConfigMap") == 2
    assert kinds.count("PodDisruptionBudget") == 2
    assert p.failures == {}
    assert p.events == []
    assert p.autoscaling.status is None
    assert not p.autoscaling.decisions
    assert not p.waiting_for_capacity


def test_a_full_cluster_plans_no_partial_group_and_says_it_waits_for_capacity():
    md = deployment(decode=2)
    nodes = nodes_of({"r0": 3})  # room for one decode group (2 nodes) and one prefill group
    snap = snapshot(md, nodes, {}, {})
    p = plan(snap)
    check(snap, p)
    decode = next(rp for rp in p.roles if rp.role == "decode")
    assert len(decode.create) == 1
    assert decode.unplaced == 1
    assert p.waiting_for_capacity
    assert p.requeue_after is None  # freed capacity wakes it (the controller), not a timer


racks = st.dictionaries(st.sampled_from(["r0", "r1", "r2", "r3"]), st.integers(1, 8), min_size=1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    racks=racks,
    first=st.integers(1, 4),
    second=st.integers(1, 4),
    rollout=st.booleans(),
    others=st.dictionaries(
        st.tuples(st.sampled_from(["r0", "r1", "r2", "r3"]), st.integers(0, 7)),
        st.integers(1, 4),
        max_size=10,
    ),
    lost=st.sets(st.tuples(st.sampled_from(["r0", "r1", "r2", "r3"]), st.integers(0, 7)), max_size=4),
)
def test_any_second_pass_keeps_the_plan_properties(racks, first, second, rollout, others, lost):
    """Pass 1 on a cluster shared with other tenants' pods; its groups come up; then nodes are lost (past
    their toleration), decode is rescaled, and maybe rolled out (an engine change): pass 2 keeps every
    property, and pass 1 did too."""
    nodes = nodes_of(racks)
    names = {n.name for n in nodes}
    tenant = {f"{r}-{i}": {GPU: g} for (r, i), g in others.items() if f"{r}-{i}" in names}
    md = deployment(decode=first)
    snap1 = snapshot(md, nodes, tenant, {})
    p1 = plan(snap1)
    check(snap1, p1)
    groups = materialize(snap1, p1)
    down = frozenset(f"{r}-{i}" for r, i in lost) & names
    md2 = deployment(decode=second, batch=128 if rollout else 256)
    used = used_by(groups, md2)
    for node, req in tenant.items():
        used.setdefault(node, {})[GPU] = used.get(node, {}).get(GPU, 0) + req[GPU]
    snap2 = snapshot(md2, nodes_of(racks, down), used, groups)
    p2 = plan(snap2)
    check(snap2, p2)
    assert p2.desired["decode"] == second
