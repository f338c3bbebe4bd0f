"""The fabric contracts of the pods tokenfab renders (tokenfab.planning.fabric, builders.nccl_env): NCCL is
asked for multi-node NVLink only by a pod that holds an IMEX channel, and a group that spans trays without
one is named in the Fabric condition."""

from __future__ import annotations

from typing import Any

import pytest

from testing.cases import example_paths, owner, spec_of
from tokenfab.api.models import UnitStatus
from tokenfab.planning import builders, contract
from tokenfab.planning.fabric import condition, kv_path_summary
from tokenfab.planning.status import event_for
from tokenfab.planning.units import Member, path, rule

DOMAIN = "clique-a.0"


def _spec(example: str, patch: dict[str, Any] | None = None) -> Any:
    return spec_of(example, patch)


def _pods(example: str, patch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec = _spec(example, patch)
    own = owner("md")
    out: list[dict[str, Any]] = []
    unit = 0 if rule(spec) is not None else None  # (slot 0 of each role: unit 0)
    for role, _ in spec.roles():
        nodes = [f"gb200-r00-t{i:02d}" for i in range(builders.group_shape(spec, role).nodes)]
        rev = builders.role_revision(spec, role)
        out += builders.group_pods(
            own, spec, builders.GroupAt(role, 0, DOMAIN, rev, nodes, gang="podgroup", unit=unit)
        )
    return out


def _env(pod: dict[str, Any]) -> dict[str, str]:
    ctr = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in ctr.get("env") or []}


def _holds_channel(pod: dict[str, Any]) -> bool:
    claims = {r["name"] for r in pod["spec"].get("resourceClaims") or []}
    ctr = pod["spec"]["containers"][0]
    used = {r["name"] for r in (ctr.get("resources") or {}).get("claims") or []}
    return contract.COMPUTE_DOMAIN_CLAIM in claims and contract.COMPUTE_DOMAIN_CLAIM in used


VARIANTS = [(p.name, {}) for p in example_paths()] + [
    ("deepseek-r1-disaggregated.yaml", {"topology": {"computeDomain": False}}),
    ("llama-405b-multinode-tp.yaml", {"topology": {"computeDomain": False}}),
]


@pytest.mark.parametrize(("example", "patch"), VARIANTS, ids=lambda v: str(v))
def test_every_rendered_pod_asks_for_the_fabric_only_when_it_holds_an_imex_channel(example, patch):
    """NCCL's MNNVL exactly on the multi-node groups' pods that hold a channel; the KV transfer's fabric
    settings exactly on the unit members' pods that hold one."""
    pods = _pods(example, patch)
    assert pods
    for pod in pods:
        env, name = _env(pod), pod["metadata"]["name"]
        asks = {n for n in contract.NCCL_MNNVL_ENV if env.get(n) == "1"}
        kv = {n for n, v in contract.KV_FABRIC_ENV if env.get(n) == v}
        multi_node = int(pod["metadata"]["annotations"][contract.ANN_GROUP_SIZE]) > 1
        unit = contract.LABEL_UNIT in pod["metadata"]["labels"]
        if _holds_channel(pod):
            assert asks == (set(contract.NCCL_MNNVL_ENV) if multi_node else set()), name
            assert kv == ({n for n, _ in contract.KV_FABRIC_ENV} if unit else set()), name
        else:
            assert not asks, f"{name} asks NCCL for {asks} without an IMEX channel"
            assert not kv, f"{name} asks for {kv} without an IMEX channel"


def test_the_qwen3_examples_one_pod_prefill_group_asks_for_no_mnnvl_and_its_decode_group_does():
    pods = {p["metadata"]["labels"][contract.LABEL_ROLE]: p for p in _pods("qwen3-235b-autoscaled.yaml")}
    # TP4: one tray, one pod: NCCL never leaves it, but the pod holds its unit's channel for KV transfers
    assert "NCCL_MNNVL_ENABLE" not in _env(pods["prefill"])
    assert _holds_channel(pods["prefill"])
    assert _env(pods["prefill"])["TRTLLM_KVCACHE_POOL_USE_FABRIC_MEMORY"] == "1"
    assert _env(pods["decode"])["NCCL_MNNVL_ENABLE"] == "1"  # TP8: two trays, one ComputeDomain
    assert _holds_channel(pods["decode"])
    claims = {r["resourceClaimTemplateName"] for p in pods.values() for r in p["spec"]["resourceClaims"]}
    assert claims == {"md-unit-0-imex"}, "prefill and decode of one unit share one ComputeDomain"


def test_fabric_condition_is_true_when_every_spanning_group_claims_a_channel():
    cond = condition(_spec("deepseek-r1-disaggregated.yaml"))
    assert cond is not None
    assert (cond.type, cond.status, cond.reason) == ("Fabric", "True", "NVLink")
    assert "decode (8 nodes)" in cond.message
    assert "prefill (2 nodes)" in cond.message


def test_fabric_condition_names_the_groups_that_span_trays_without_a_channel_and_the_fix():
    cond = condition(_spec("deepseek-r1-disaggregated.yaml", {"topology": {"computeDomain": False}}))
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", "NoIMEXChannel")
    assert "prefill (2 nodes), decode (8 nodes)" in cond.message
    assert "spec.topology.computeDomain" in cond.message
    assert event_for(cond, None) == "Warning"
    fixed = condition(_spec("deepseek-r1-disaggregated.yaml"))
    assert fixed is not None
    assert event_for(fixed, cond) == "Normal"
    assert event_for(fixed, None) is None  # (True from the start: nothing to tell)


def test_fabric_condition_is_absent_when_no_group_spans_trays():
    assert condition(_spec("aggregated-small.yaml")) is None


def _unit(n: int, path: str, *domains: str) -> UnitStatus:
    return UnitStatus(unit=n, groups=[f"md-decode-{n}", f"md-prefill-{n}"], domains=list(domains), path=path)


def test_fabric_condition_names_the_units_whose_kv_crosses_the_network():
    spec = _spec("deepseek-r1-disaggregated.yaml")
    units = [_unit(0, "nvlink", "r0"), _unit(1, "tcp", "r1", "r2")]
    cond = condition(spec, units)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", "KVOverNetwork")
    assert "1 of 2 prefill-decode units" in cond.message
    assert "unit 1 (r1, r2): tcp" in cond.message
    assert event_for(cond, None) == "Warning"
    assert kv_path_summary(units) == "1 nvlink, 1 tcp"
    whole = condition(spec, [_unit(0, "nvlink", "r0"), _unit(1, "nvlink", "r1")])
    assert whole is not None
    assert (whole.status, whole.reason) == ("True", "NVLink")
    assert kv_path_summary([]) is None


def _member(role: str, domain: str, *nodes: str, labelled: bool = True) -> Member:
    return Member("", role, domain, 0, nodes, labelled)  # type: ignore[arg-type]


def test_a_units_path_is_nvlink_only_inside_one_domain_with_every_pod_holding_its_channel():
    both = {"decode": True, "prefill": True}
    one_rack = [_member("decode", "r0", "n1", "n2"), _member("prefill", "r0", "n3")]
    assert path(one_rack, both, rdma=False) == "nvlink"
    assert path(one_rack, {"decode": True, "prefill": False}, rdma=False) == "tcp"  # prefill shares a node
    split = [_member("decode", "r0", "n1"), _member("prefill", "r1", "m1")]
    assert path(split, both, rdma=False) == "tcp"
    assert path(split, both, rdma=True) == "rdma"
    same_node = [_member("decode", "r0", "n1"), _member("prefill", "r0", "n1")]
    assert path(same_node, {}, rdma=False) == "nvlink"  # (cuda_ipc inside one tray: no fabric needed)
    legacy = [_member("decode", "r0", "n1", "n2", labelled=False), _member("prefill", "r0", "n3")]
    assert path(legacy, both, rdma=False) == "tcp"  # (its own ComputeDomain: not the unit's)


def test_a_unit_member_publishes_its_unit_as_its_kv_transfer_domain_and_nothing_else_does():
    """Dynamo 1.6.1's topology-aware KV transfer (dynamo/common/utils/topology.py): the router prefers,
    after a prefill worker, a decode worker of the same unit; the value is the pod's unit label as a
    downward-API file under the mount path, named by DYN_KV_TRANSFER_DOMAIN."""
    for pod in _pods("deepseek-r1-disaggregated.yaml") + _pods("aggregated-small.yaml"):
        env, labels = _env(pod), pod["metadata"]["labels"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        if contract.LABEL_UNIT not in labels:
            assert "topology" not in volumes
            assert contract.ENV_DYN_TOPOLOGY_ENABLED not in env
            continue
        assert env[contract.ENV_DYN_TOPOLOGY_ENABLED] == "true"
        assert env[contract.ENV_DYN_KV_TRANSFER_ENFORCEMENT] in ("required", "preferred")
        assert 0.0 <= float(env[contract.ENV_DYN_KV_TRANSFER_PREFERRED_WEIGHT]) <= 1.0
        assert mounts["topology"]["mountPath"] == env[contract.ENV_DYN_TOPOLOGY_MOUNT_PATH]
        [item] = volumes["topology"]["downwardAPI"]["items"]
        assert item["path"] == env[contract.ENV_DYN_KV_TRANSFER_DOMAIN]
        assert item["fieldRef"]["fieldPath"] == f"metadata.labels['{contract.LABEL_UNIT}']"


def test_rdma_is_the_path_only_when_the_workers_hold_rdma_devices_and_may_lock_memory():
    """A unit's KV crosses the network over RDMA only when its workers ask for RDMA devices and for
    IPC_LOCK (UCX registers the memory it moves); either alone is TCP, and the condition names the fix."""
    from tokenfab.planning.fabric import holds_rdma, rdma_devices

    plain = _spec("deepseek-r1-disaggregated.yaml")
    nics = {"runtime": {"resources": {"limits": {"rdma/ib": "4"}}}}
    both = {"runtime": {"resources": {"limits": {"rdma/ib": "4"}}, "addCapabilities": ["IPC_LOCK"]}}
    efa = {
        "runtime": {"resources": {"limits": {"vpc.amazonaws.com/efa": "4"}}, "addCapabilities": ["IPC_LOCK"]}
    }
    assert rdma_devices(_spec("deepseek-r1-disaggregated.yaml", nics)) == ["rdma/ib"]
    assert not holds_rdma(plain)
    assert not holds_rdma(_spec("deepseek-r1-disaggregated.yaml", nics))
    assert holds_rdma(_spec("deepseek-r1-disaggregated.yaml", both))
    assert holds_rdma(_spec("deepseek-r1-disaggregated.yaml", efa))
    split = [_unit(0, "tcp", "r1", "r2")]
    told = condition(plain, split)
    assert told is not None
    assert "a whole unit fits in one NVLink domain" in told.message  # (split for a while: TCP)
    huge = _spec("deepseek-r1-disaggregated.yaml", {"topology": {"gpusPerDomain": 36}})
    assert "their groups hold no RDMA device" in (condition(huge, split) or told).message
    half = condition(_spec("deepseek-r1-disaggregated.yaml", nics), split)
    assert half is not None
    assert "rdma/ib but not for IPC_LOCK" in half.message
    # groups made while the unit was whole are named: they keep the unit on TCP until replaced
    held = condition(plain, split, {0: ["md-prefill-0"]})
    assert held is not None
    assert "md-prefill-0 (unit 0) were made without an RDMA device" in held.message
    asked = condition(_spec("deepseek-r1-disaggregated.yaml", {"topology": {"kvNetwork": "tcp"}}), split)
    assert asked is not None
    assert "spec.topology.kvNetwork is tcp" in asked.message
    over_rdma = condition(plain, [_unit(0, "rdma", "r1", "r2")])
    assert over_rdma is not None
    assert (over_rdma.status, over_rdma.reason) == ("False", "KVOverNetwork")
    assert over_rdma.message.endswith("crosses the network over RDMA.")


def test_the_rdma_of_a_unit_that_spans_domains_is_every_one_of_its_groups():
    """A unit's groups rendered with the operator's RDMA device (it spans domains) make its path rdma only
    when all of them hold one: a group made while the unit was whole keeps it on TCP."""
    both = {"decode": True, "prefill": True}
    held = [
        Member("", "decode", "r0", 0, ("n1",), rdma=True),
        Member("", "prefill", "r1", 0, ("m1",), rdma=True),
    ]
    assert path(held, both, rdma=False) == "rdma"
    partly = [held[0], Member("md-prefill-0", "prefill", "r1", 0, ("m1",))]
    assert path(partly, both, rdma=False) == "tcp"
