"""The factory's simulated fabric (e2e/fleet/fabric.py), without a cluster: NCCL's multi-node NVLink fails
at init for a pod without an IMEX channel, for a group split over two ComputeDomains or two NVLink domains,
and comes up for every pod tokenfab renders once its claims are allocated."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from e2e.fleet import fabric
from testing.cases import DOMAIN, owner, spec_of
from tokenfab.planning import builders, contract

pytestmark = pytest.mark.unit  # (beside the code it tests; needs no factory)


def _group(
    example: str, role: str, patch: dict[str, Any] | None = None, rdma: str = ""
) -> list[dict[str, Any]]:
    spec = spec_of(example, patch)
    nodes = [f"gb200-r00-t{i:02d}" for i in range(builders.group_shape(spec, role).nodes)]
    pods = builders.group_pods(owner("ds"), spec, builders.GroupAt(role, 0, DOMAIN, "rev", nodes, rdma=rdma))  # type: ignore[arg-type]
    out = []
    for i, pod in enumerate(pods):
        pod = copy.deepcopy(pod)
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["spec"]["nodeName"] = nodes[i]
        claims = pod["spec"].get("resourceClaims") or []
        pod["status"] = {
            "resourceClaimStatuses": [
                {"name": cl["name"], "resourceClaimName": f"{pod['metadata']['name']}-{cl['name']}"}
                for cl in claims
            ]
        }
        out.append(pod)
    return out


def _claim(domain_id: str, allocated: bool = True) -> dict[str, Any]:
    config = {"opaque": {"driver": fabric.IMEX_DRIVER, "parameters": {"domainID": domain_id}}}
    claim: dict[str, Any] = {"spec": {"devices": {"config": [config]}}}
    if allocated:
        result = {"driver": fabric.IMEX_DRIVER, "pool": "n", "device": "channel-0", "request": "channel"}
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return claim


def _claims(group: list[dict[str, Any]], domain_of=lambda i: "cd-1", allocated: bool = True):
    return {
        name: _claim(domain_of(i), allocated)
        for i, pod in enumerate(group)
        for name in fabric.claim_names(pod)
    }


def _cliques(group: list[dict[str, Any]], clique=lambda i: DOMAIN) -> dict[str, str]:
    return {pod["spec"]["nodeName"]: clique(i) for i, pod in enumerate(group)}


def test_a_multi_node_group_with_its_channels_allocated_comes_up():
    group = _group("deepseek-r1-disaggregated.yaml", "decode")
    assert len(group) == 8
    assert fabric.asks_mnnvl(group[0])
    assert fabric.nccl_refusal(group, _claims(group), _cliques(group)) is None


def test_mnnvl_without_an_allocated_channel_fails_and_names_the_pods():
    group = _group("deepseek-r1-disaggregated.yaml", "decode")
    why = fabric.nccl_refusal(group, _claims(group, allocated=False), _cliques(group))
    assert why is not None
    assert "holds no IMEX channel" in why
    assert "ds-decode-0-0" in why
    assert "simulated NCCL" in why


def test_mnnvl_asked_by_a_pod_without_any_claim_fails():
    group = _group("qwen3-235b-autoscaled.yaml", "prefill")  # one pod, no ComputeDomain
    assert not fabric.asks_mnnvl(group[0])  # (tokenfab asks for none)
    group[0]["spec"]["containers"][0]["env"].append({"name": "NCCL_MNNVL_ENABLE", "value": "1"})
    why = fabric.nccl_refusal(group, {}, _cliques(group))
    assert why is not None
    assert "holds no IMEX channel" in why


def test_a_group_over_two_compute_domains_fails():
    group = _group("deepseek-r1-disaggregated.yaml", "decode")
    why = fabric.nccl_refusal(group, _claims(group, lambda i: f"cd-{i % 2}"), _cliques(group))
    assert why is not None
    assert "2 ComputeDomains" in why


def test_a_group_over_two_nvlink_domains_fails():
    group = _group("deepseek-r1-disaggregated.yaml", "decode")
    why = fabric.nccl_refusal(group, _claims(group), _cliques(group, lambda i: f"rack-{i // 4}"))
    assert why is not None
    assert "not in one NVLink domain" in why


@pytest.mark.parametrize(
    ("example", "role"),
    [
        ("deepseek-r1-disaggregated.yaml", "prefill"),
        ("llama-405b-multinode-tp.yaml", "worker"),
        ("qwen3-235b-autoscaled.yaml", "decode"),
        ("qwen3-235b-autoscaled.yaml", "prefill"),
        ("aggregated-small.yaml", "worker"),
    ],
)
def test_every_examples_groups_come_up_on_the_simulated_fabric(example, role):
    group = _group(example, role)
    assert fabric.nccl_refusal(group, _claims(group), _cliques(group)) is None


def test_without_a_compute_domain_a_spanning_group_asks_for_no_mnnvl_and_comes_up():
    group = _group("deepseek-r1-disaggregated.yaml", "decode", {"topology": {"computeDomain": False}})
    assert not any(fabric.claim_names(p) for p in group)
    assert fabric.nccl_refusal(group, {}, _cliques(group)) is None


def test_group_of_finds_the_ranks_in_order_and_leaves_deleting_pods_out():
    group = _group("deepseek-r1-disaggregated.yaml", "decode")
    other = _group("deepseek-r1-disaggregated.yaml", "prefill")
    gone = copy.deepcopy(group[3])
    gone["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    listed = [*reversed(group[:3]), gone, *group[4:], *other]
    found = fabric.group_of(group[0], listed)
    assert [p["metadata"]["labels"][contract.LABEL_RANK] for p in found] == [
        "0",
        "1",
        "2",
        "4",
        "5",
        "6",
        "7",
    ]


def _unit(example: str = "deepseek-r1-disaggregated.yaml", rdma: str = "") -> list[dict[str, Any]]:
    pods = []
    for role in ("decode", "prefill"):
        for pod in _group(example, role, rdma=rdma):
            pod["metadata"]["labels"][contract.LABEL_UNIT] = "0"
            pods.append(pod)
    for i, pod in enumerate(pods):  # (each pod on a node of its own, as the unit's placement has it)
        pod["spec"]["nodeName"] = f"gb200-r00-t{i:02d}"
    return pods


def test_a_whole_unit_holding_one_compute_domains_channels_hands_kv_over_nvlink():
    pods = _unit()
    prefill = next(p for p in pods if p["metadata"]["labels"][contract.LABEL_ROLE] == "prefill")
    assert fabric.unit_path(prefill, pods, _claims(pods), _cliques(pods)) == "nvlink"
    assert fabric.PATH_GBPS["nvlink"] > fabric.PATH_GBPS["rdma"] > fabric.PATH_GBPS["tcp"]


def test_a_unit_split_over_two_racks_or_without_channels_hands_kv_over_tcp():
    pods = _unit()
    prefill = next(p for p in pods if p["metadata"]["labels"][contract.LABEL_ROLE] == "prefill")
    split = _cliques(pods, lambda i: "r0" if i < 8 else "r1")
    assert fabric.unit_path(prefill, pods, _claims(pods), split) == "tcp"
    assert fabric.unit_path(prefill, pods, _claims(pods, allocated=False), _cliques(pods)) == "tcp"
    del prefill["metadata"]["labels"][contract.LABEL_UNIT]
    assert fabric.unit_path(prefill, pods, _claims(pods), _cliques(pods)) == "tcp"


def test_a_split_unit_whose_pods_the_operator_gave_rdma_hands_kv_over_rdma():
    """The pods the operator renders for a unit that spans racks (an RDMA device and IPC_LOCK each) move
    their KV over RDMA on the simulated fabric; one pod without the device, or without IPC_LOCK, leaves
    the unit on TCP."""
    pods = _unit(rdma="rdma/rdma_shared_device_a")
    prefill = next(p for p in pods if p["metadata"]["labels"][contract.LABEL_ROLE] == "prefill")
    split = _cliques(pods, lambda i: "r0" if i < 8 else "r1")
    assert all(fabric.holds_rdma(p) for p in pods)
    assert fabric.unit_path(prefill, pods, _claims(pods), split) == "rdma"
    ctr = pods[0]["spec"]["containers"][0]
    ctr["securityContext"]["capabilities"]["add"] = []
    assert not fabric.holds_rdma(pods[0])
    assert fabric.unit_path(prefill, pods, _claims(pods), split) == "tcp"
    bare = _unit()
    assert not any(fabric.holds_rdma(p) for p in bare)


def test_a_unit_on_one_node_hands_kv_over_nvlink_without_a_fabric():
    pods = _unit()
    for pod in pods:
        pod["spec"]["nodeName"] = "gb200-r00-t00"
    assert fabric.unit_path(pods[-1], pods, {}, _cliques(pods)) == "nvlink"
