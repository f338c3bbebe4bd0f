"""The fabric contracts of the pods tokenfab renders (tokenfab.planning.fabric, builders.nccl_env): NCCL is
asked for multi-node NVLink only by a pod that holds an IMEX channel, and a group that spans trays without
one is named in the Fabric condition."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cases import example_paths
from tests.test_builders import owner, spec_of
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning.fabric import condition
from tokenfab.planning.status import event_for

DOMAIN = "clique-a.0"


def _spec(example: str, patch: dict[str, Any] | None = None) -> Any:
    return spec_of(example, patch)


def _pods(example: str, patch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    spec = _spec(example, patch)
    own = owner("md")
    out: list[dict[str, Any]] = []
    for role, _ in spec.roles():
        nodes = [f"gb200-r00-t{i:02d}" for i in range(b.group_shape(spec, role).nodes)]
        out += b.group_pods(own, spec, role, 0, DOMAIN, b.role_revision(spec, role), nodes, gang="podgroup")
    return out


def _env(pod: dict[str, Any]) -> dict[str, str]:
    ctr = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in ctr.get("env") or []}


def _holds_channel(pod: dict[str, Any]) -> bool:
    claims = {r["name"] for r in pod["spec"].get("resourceClaims") or []}
    ctr = pod["spec"]["containers"][0]
    used = {r["name"] for r in (ctr.get("resources") or {}).get("claims") or []}
    return c.COMPUTE_DOMAIN_CLAIM in claims and c.COMPUTE_DOMAIN_CLAIM in used


VARIANTS = [(p.name, {}) for p in example_paths()] + [
    ("deepseek-r1-disaggregated.yaml", {"topology": {"computeDomain": False}}),
    ("llama-405b-multinode-tp.yaml", {"topology": {"computeDomain": False}}),
]


@pytest.mark.parametrize(("example", "patch"), VARIANTS, ids=lambda v: str(v))
def test_every_rendered_pod_asks_nccl_for_mnnvl_exactly_when_it_holds_an_imex_channel(example, patch):
    pods = _pods(example, patch)
    assert pods
    for pod in pods:
        env = _env(pod)
        asks = {name for name in c.NCCL_MNNVL_ENV if env.get(name) == "1"}
        if _holds_channel(pod):
            assert asks == set(c.NCCL_MNNVL_ENV), pod["metadata"]["name"]
        else:
            assert not asks, f"{pod['metadata']['name']} asks NCCL for {asks} without an IMEX channel"


def test_the_qwen3_examples_one_pod_prefill_group_asks_for_no_mnnvl_and_its_decode_group_does():
    pods = {p["metadata"]["labels"][c.LABEL_ROLE]: p for p in _pods("qwen3-235b-autoscaled.yaml")}
    assert "NCCL_MNNVL_ENABLE" not in _env(pods["prefill"])  # TP4: one tray, one pod
    assert not _holds_channel(pods["prefill"])
    assert _env(pods["decode"])["NCCL_MNNVL_ENABLE"] == "1"  # TP8: two trays, one ComputeDomain
    assert _holds_channel(pods["decode"])


def test_fabric_condition_is_true_when_every_spanning_group_claims_a_channel():
    cond = condition(_spec("deepseek-r1-disaggregated.yaml"))
    assert cond is not None
    assert (cond.type, cond.status, cond.reason) == ("Fabric", "True", "IMEXChannel")
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
