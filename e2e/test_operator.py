"""The operator, running as a real process against the local AI factory, reconciles ModelDeployments into
NVL72-pinned worker groups: Ready on 4 racks, whole-group recovery from a lost node, convergence through
SIGKILLs during a rollout, no partial groups when capacity runs out, and clean deletion."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import yaml

from e2e.conftest import LIVENESS
from e2e.helpers import (
    apply_yaml,
    condition,
    engine_configmaps,
    get_json,
    kubectl,
    restore_node,
    start_operator,
    wait_for,
    wait_healthy,
)
from testing.cases import EXAMPLES
from tokenfab.planning import contract
from tokenfab_factory import process
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL

NS = "ds"


@pytest.fixture(scope="module", autouse=True)
def namespaces(operator: Factory) -> None:
    for ns in (NS, "big"):
        kubectl(operator, "create", "namespace", ns, check=False)


def deepseek() -> dict:
    doc = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    return doc


def md(f: Factory, name: str = "deepseek-r1", ns: str = NS) -> dict:
    return get_json(f, "mdep", name, "-n", ns)


def is_ready(f: Factory, name: str = "deepseek-r1", ns: str = NS) -> bool:
    cond = condition(md(f, name, ns), "Ready")
    return bool(cond and cond["status"] == "True")


def worker_pods(f: Factory, ns: str = NS, owner: str = "deepseek-r1") -> list[dict]:
    sel = f"{contract.LABEL_DEPLOYMENT}={owner},{contract.COMPONENT}=worker"
    return get_json(f, "pods", "-n", ns, "-l", sel)["items"]


def groups(pods: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in pods:
        out.setdefault(p["metadata"]["labels"][contract.LABEL_GROUP], []).append(p)
    return out


def node_cliques(f: Factory) -> dict[str, str]:
    return {
        n["metadata"]["name"]: n["metadata"]["labels"][CLIQUE_LABEL] for n in get_json(f, "nodes")["items"]
    }


def test_deepseek_becomes_ready_with_every_group_in_one_clique(operator):
    f = operator
    apply_yaml(f, deepseek(), "--server-side", "--field-manager=e2e")
    wait_for("deepseek-r1 Ready", lambda: is_ready(f), timeout=120)
    obj = md(f)
    assert obj["status"]["roles"]["decode"]["groups"] == "2/2"
    assert obj["status"]["roles"]["prefill"]["groups"] == "2/2"
    assert obj["status"]["gpus"] == "80/80"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    cliques = node_cliques(f)
    by_group = groups(worker_pods(f))
    sizes = sorted(len(p) for p in by_group.values())
    assert sizes == [2, 2, 8, 8], "2 prefill groups of 2 pods (8 GPUs), 2 decode groups of 8 pods (32 GPUs)"
    placement = {p["group"]: p["domain"] for p in obj["status"]["placement"]}
    for name, members in by_group.items():
        domains = {cliques[p["spec"]["nodeName"]] for p in members}
        assert len(domains) == 1, f"group {name} split across NVLink domains: {domains}"
        assert placement[name] == domains.pop()
        assert sorted(int(p["metadata"]["labels"][contract.LABEL_RANK]) for p in members) == list(
            range(len(members))
        )
    # Two prefill-decode units (a decode group and the prefill group that feeds it), each in one NVLink
    # domain with one ComputeDomain over its 10 pods. Every pod holds an IMEX channel of its unit's
    # ComputeDomain, allocated by the scheduler on its own node (the factory's simulated NVIDIA DRA driver
    # publishes one per node), and mounts its node's model cache claim, bound to a volume on that node.
    claims = {rc["metadata"]["name"]: rc for rc in get_json(f, "resourceclaims", "-n", NS)["items"]}
    domains = {cd["metadata"]["name"] for cd in get_json(f, "computedomains", "-n", NS)["items"]}
    assert domains == {"deepseek-r1-unit-0-imex", "deepseek-r1-unit-1-imex"}
    units = {int(u["unit"]): u for u in obj["status"]["units"]}
    assert sorted(units) == [0, 1]
    for n, unit in units.items():
        members = [p for g in unit["groups"] for p in by_group[g]]
        assert len(members) == 10
        assert len({cliques[p["spec"]["nodeName"]] for p in members}) == 1, f"unit {n} split: {unit}"
        assert unit["path"] == "nvlink"
        for p in members:
            assert p["metadata"]["labels"][contract.LABEL_UNIT] == str(n)
            assert p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == f"deepseek-r1-unit-{n}-imex"
    assert obj["status"]["kvPath"] == "2 nvlink"
    for members in by_group.values():
        for p in members:
            (status,) = p["status"].get("resourceClaimStatuses") or [{}]
            rc = claims[status["resourceClaimName"]]
            (result,) = rc["status"]["allocation"]["devices"]["results"]
            assert result["driver"] == "compute-domain.nvidia.com"
            assert result["pool"] == p["spec"]["nodeName"], "the channel is the pod's own node's"
            assert rc["status"]["reservedFor"][0]["name"] == p["metadata"]["name"]
    volumes = {pv["spec"]["claimRef"]["name"]: pv for pv in get_json(f, "pv")["items"]}
    for p in worker_pods(f):
        (cache,) = [v for v in p["spec"]["volumes"] if v["name"] == "model-cache"]
        pv = volumes[cache["persistentVolumeClaim"]["claimName"]]
        term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert term["values"] == [p["spec"]["nodeName"]], "a node's model cache lives on that node"
    # Engine config carries the first-class fields.
    # (one ConfigMap per revision, named by its hash; exactly one while no rollout is under way)
    maps = engine_configmaps(f, NS, "deepseek-r1", "decode")
    assert len(maps) == 1, [m["metadata"]["name"] for m in maps]
    assert maps[0]["metadata"]["name"].startswith("deepseek-r1-decode-engine-")
    engine = yaml.safe_load(maps[0]["data"]["engine.yaml"])
    assert engine["tensor_parallel_size"] == 32
    assert engine["moe_expert_parallel_size"] == 32
    assert engine["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 3}
    assert engine["cache_transceiver_config"]["backend"] == "DEFAULT"
    # kubectl get shows it; the NVLinkDomain inventory counts the groups; Events tell the story.
    row = kubectl(f, "get", "mdep", "-n", NS).stdout.splitlines()[1].split()
    assert row[1:6] == ["disaggregated", "True", "2/2", "2/2", "80/80"]
    wait_for(
        "NVLinkDomains listing the 4 groups",
        lambda: sum(d["status"]["groupCount"] for d in get_json(f, "nvlinkdomains")["items"]) >= 4,
        timeout=30,
    )
    events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=deepseek-r1")["items"]
    reasons = {e["reason"] for e in events}
    assert {"GroupCreatedMissing", "AllGroupsReady"} <= reasons


def test_operator_exports_its_own_metrics(operator):
    import urllib.request

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{LIVENESS + 1}/metrics", timeout=5) as r:
            return str(r.read().decode())

    # (the NVLink domain inventory runs every 10 s: its gauges appear once it has)
    text = wait_for(
        "the domain inventory's gauges", lambda: "tokenfab_domain_free_gpus{" in scrape() and scrape()
    )
    assert 'tokenfab_groups_ready{deployment="deepseek-r1",namespace="ds",role="decode"} 2.0' in text
    assert 'tokenfab_reconciles_total{deployment="deepseek-r1",namespace="ds",result="ok"}' in text


def test_losing_a_node_recreates_its_decode_group_whole(operator):
    f = operator
    before = groups(worker_pods(f))
    victim_group = sorted(g for g in before if "-decode-" in g)[0]
    victim_node = sorted(p["spec"]["nodeName"] for p in before[victim_group])[3]
    node = get_json(f, "node", victim_node)
    kubectl(f, "delete", "node", victim_node)
    try:

        def recovered() -> bool:
            now = groups(worker_pods(f))
            decode = {g: m for g, m in now.items() if "-decode-" in g}
            # (its pods are force-deleted off the gone node at once, so the replacement may take its slot
            # and name again)
            return (
                not any(p["spec"].get("nodeName") == victim_node for m in now.values() for p in m)
                and len(decode) == 2
                and all(len(m) == 8 for m in decode.values())
                and is_ready(f)
            )

        wait_for("the decode group recreated whole and Ready again", recovered, timeout=120)
        cliques = node_cliques(f)
        for name, members in groups(worker_pods(f)).items():
            assert len({cliques[p["spec"]["nodeName"]] for p in members}) == 1, name
            assert victim_node not in {p["spec"]["nodeName"] for p in members}
        events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=deepseek-r1")[
            "items"
        ]
        assert any(e["reason"] == "GroupDeletedBroken" and victim_group in e["message"] for e in events)
        # The status names the fault, the node and where the group serves again.
        (record,) = [r for r in md(f)["status"]["faults"] if r["node"] == victim_node]
        assert (record["group"], record["kind"], record["reaction"]) == (victim_group, "Lost", "Replaced")
        wait_for(
            "the HardwareFault condition back to False",
            lambda: condition(md(f), "HardwareFault")["status"] == "False",
            timeout=30,
        )
        assert any(e["reason"] == "NodeLost" and victim_node in e["message"] for e in events)
    finally:
        restore_node(f, node)


def test_sigkill_during_a_rollout_converges_to_exactly_the_desired_groups(operator):
    f = operator
    wait_for("Ready before the rollout", lambda: is_ready(f), timeout=60)
    old_rev = {
        p["metadata"]["labels"][contract.LABEL_REVISION]
        for p in worker_pods(f)
        if p["metadata"]["labels"][contract.LABEL_ROLE] == "decode"
    }
    doc = deepseek()
    doc["spec"]["decode"]["maxBatchSize"] = 128
    apply_yaml(f, doc, "--server-side", "--field-manager=e2e")
    min_ready_decode = 2
    for _ in range(5):
        time.sleep(2)
        pid = f.extra_pids()["operator"]
        process.stop(pid, timeout=0)  # SIGTERM then SIGKILL at once: no graceful shutdown
        ready_decode = sum(
            1
            for m in groups(worker_pods(f)).values()
            if m[0]["metadata"]["labels"][contract.LABEL_ROLE] == "decode"
            and all(
                any(
                    cd["type"] == "Ready" and cd["status"] == "True"
                    for cd in p["status"].get("conditions", [])
                )
                for p in m
            )
        )
        min_ready_decode = min(min_ready_decode, ready_decode)
        start_operator(f, LIVENESS)
    wait_healthy(LIVENESS, "the operator back")

    def converged() -> bool:
        pods = worker_pods(f)
        by_role = Counter(m[0]["metadata"]["labels"][contract.LABEL_ROLE] for m in groups(pods).values())
        revs = {
            p["metadata"]["labels"][contract.LABEL_REVISION]
            for p in pods
            if p["metadata"]["labels"][contract.LABEL_ROLE] == "decode"
        }
        return by_role == Counter({"decode": 2, "prefill": 2}) and not (revs & old_rev) and is_ready(f)

    wait_for("exactly 2 decode groups at the new revision and 2 prefill groups", converged, timeout=180)
    pods = worker_pods(f)
    for name, members in groups(pods).items():
        assert len(members) == int(members[0]["metadata"]["annotations"][contract.ANN_GROUP_SIZE]), (
            f"partial group {name}"
        )
        assert not any(p["metadata"].get("deletionTimestamp") for p in members)
    assert len({p["metadata"]["name"] for p in pods}) == len(pods) == 2 * 8 + 2 * 2
    assert min_ready_decode >= 1, "serving dropped to zero decode groups during the rollout"
    assert md(f)["status"]["observedGeneration"] == md(f)["metadata"]["generation"]


def test_too_large_a_deployment_reports_capacity_and_creates_no_partial_group(operator):
    f = operator
    big = {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "huge", "namespace": "big"},
        "spec": {
            "model": {"name": "huge", "source": "pvc://models/huge"},
            "serving": {"mode": "aggregated"},
            # five 64-GPU groups: the factory's four 72-GPU racks hold four at most, whatever else runs
            "worker": {"parallelism": {"tensor": 64}, "replicas": 5},
        },
    }
    apply_yaml(f, big)
    try:

        def placed_false() -> dict | None:
            cond = condition(md(f, "huge", "big"), "Placed")
            return cond if cond and cond["status"] == "False" else None

        cond = wait_for("Placed=False on the huge deployment", placed_false, timeout=60)
        assert cond["reason"] == "InsufficientCapacity"
        assert "needs 64 GPUs on 16 node(s) in one NVLink domain" in cond["message"]
        assert "largest free block" in cond["message"]

        # A group's 16 pods are created in parallel, and a group may be placed as the module's earlier
        # deployments' pods finish leaving: in flight, a group can be seen short. Settled (the same groups
        # 3 s apart), every group is whole; one left partial fails here.
        seen: list[dict] = [{}]

        def settled_whole() -> list[dict] | None:
            by_group = {k: len(v) for k, v in groups(worker_pods(f, "big", "huge")).items()}
            before, seen[0] = seen[0], by_group
            steady = by_group == before and all(n == 16 for n in by_group.values())
            return [by_group] if steady else None

        (by_group,) = wait_for(
            "the groups settled, each whole (16 pods)", settled_whole, timeout=90, interval=3
        )
        assert len(by_group) < 5
        obj = md(f, "huge", "big")
        assert obj["status"]["roles"]["worker"]["desiredGroups"] == 5
        assert condition(obj, "Ready")["status"] == "False"
    finally:
        kubectl(f, "delete", "mdep", "huge", "-n", "big", "--wait=true")


def test_not_ready_says_why_pods_wait(operator):
    f = operator
    doc = {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "no-weights", "namespace": "big"},
        "spec": {
            "model": {"name": "small", "source": "pvc://missing-claim/small"},
            "serving": {"mode": "aggregated"},
            "worker": {"parallelism": {"tensor": 4}},
        },
    }
    apply_yaml(f, doc)
    try:

        def explained() -> str | None:
            cond = condition(md(f, "no-weights", "big"), "Ready")
            return cond["message"] if cond and "missing-claim" in cond["message"] else None

        message = wait_for("Ready=False quoting the scheduler", explained, timeout=90)
        assert 'persistentvolumeclaim "missing-claim" not found' in message
        assert condition(md(f, "no-weights", "big"), "Ready")["reason"] == "GroupsNotReady"
    finally:
        kubectl(f, "delete", "mdep", "no-weights", "-n", "big", "--wait=true")


def test_deleting_the_deployment_removes_every_child(operator):
    f = operator
    kubectl(f, "delete", "mdep", "deepseek-r1", "-n", NS, "--wait=true")
    sel = f"{contract.LABEL_DEPLOYMENT}=deepseek-r1"

    def gone() -> bool:
        left = get_json(f, "pods,configmaps,services,deployments", "-n", NS, "-l", sel)["items"]
        return not left

    wait_for("every child of deepseek-r1 garbage-collected", gone, timeout=120)


def test_kubectl_shows_domain_capacity(operator):
    f = operator
    out = kubectl(f, "get", "nvlinkdomains").stdout.splitlines()
    assert out[0].split()[:7] == ["NAME", "NODES", "READY", "GPUS", "FREE", "FREE-NODES", "GROUPS"]
    assert out[0].split()[7:9] == ["HEALTH", "CACHED"]
    assert len(out) == 1 + 4


def test_the_gb200_kv_transfer_network_settings_schedule(operator):
    """The documented GB200 settings for NIXL/UCX over the trays' RDMA NICs (README, "On a real cluster"):
    the NICs as an extended resource and IPC_LOCK, in a namespace that allows privileged pods. Every pod
    gets its node's four NICs, and the placement ledger counts them like GPUs. In a namespace that enforces
    the baseline level the API server refuses those pods, and the PodSecurity condition says why first."""
    f = operator
    ns = "rdma"
    kubectl(f, "create", "namespace", ns, check=False)
    kubectl(f, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline", "--overwrite")
    doc = yaml.safe_load((EXAMPLES / "llama-405b-multinode-tp.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"]["runtime"] = {"resources": {"limits": {"rdma/ib": 4}}, "addCapabilities": ["IPC_LOCK"]}
    doc["spec"]["model"]["source"] = "hf://meta-llama/Llama-3.1-405B-Instruct"  # (no PVC of weights here)
    apply_yaml(f, doc, "--server-side", "--field-manager=e2e")

    def pod_security(status: str) -> bool:
        cond = condition(md(f, "llama-405b", ns), "PodSecurity") or {}
        return cond.get("status") == status

    try:
        wait_for("PodSecurity=False in a baseline namespace", lambda: pod_security("False"), timeout=60)
        cond = condition(md(f, "llama-405b", ns), "PodSecurity") or {}
        assert cond.get("reason") == "CapabilitiesForbidden"
        assert "IPC_LOCK" in cond.get("message", "")
        assert not worker_pods(f, ns, "llama-405b"), "the API server admitted none of its pods"
        kubectl(f, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
        wait_for("llama-405b Ready with RDMA", lambda: is_ready(f, "llama-405b", ns), timeout=120)
        wait_for("PodSecurity=True once the namespace allows it", lambda: pod_security("True"), timeout=60)
        pods = worker_pods(f, ns, "llama-405b")
        assert len(pods) == 2 * 4
        for p in pods:
            ctr = p["spec"]["containers"][0]
            assert ctr["resources"]["limits"]["rdma/ib"] == "4"
            assert ctr["resources"]["requests"]["rdma/ib"] == "4"
            assert ctr["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert len({p["spec"]["nodeName"] for p in pods}) == 8, "one pod per tray: each holds its 4 NICs"
    finally:
        kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def _unit_too_big_for_a_rack(ns: str, network: str) -> dict:
    """The DeepSeek-R1 example with one unit of 20 trays (a 64-GPU decode group, a 16-GPU prefill group):
    no 18-tray rack holds it whole."""
    doc = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    spec = doc["spec"]
    spec["prefill"]["parallelism"] = {"tensor": 16, "expert": 16, "attentionDataParallel": True}
    spec["decode"]["parallelism"] = {"tensor": 64, "expert": 64, "attentionDataParallel": True}
    spec["decode"]["replicas"] = 1
    spec["topology"]["kvNetwork"] = network
    return doc


def test_a_unit_that_spans_racks_moves_its_kv_over_rdma_unless_the_spec_says_tcp(operator):
    """A unit no rack holds whole spans two: its pods ask for the operator's RDMA device (the chart's
    operator.rdmaResource; the factory's trays advertise NVIDIA Network Operator's shared device) and
    IPC_LOCK, and status names the path `rdma`. With kvNetwork tcp the same unit holds neither and its
    path is `tcp`, as asked. In a namespace enforcing baseline Pod Security, the RDMA unit's pods are
    refused and the PodSecurity condition says why and what to change."""
    f = operator
    cases = {"span-rdma": "rdma", "span-tcp": "tcp", "span-baseline": "rdma"}
    for ns in cases:
        kubectl(f, "create", "namespace", ns, check=False)
    kubectl(f, "label", "namespace", "span-baseline", "pod-security.kubernetes.io/enforce=baseline")
    try:
        for ns, network in cases.items():
            apply_yaml(f, _unit_too_big_for_a_rack(ns, network))
        cliques = node_cliques(f)
        for ns, path in (("span-rdma", "rdma"), ("span-tcp", "tcp")):
            wait_for(f"deepseek-r1 Ready in {ns}", lambda ns=ns: is_ready(f, ns=ns), timeout=120)
            obj = md(f, ns=ns)
            [unit] = obj["status"]["units"]
            assert (len(unit["domains"]), unit["path"]) == (2, path), unit
            assert obj["status"]["kvPath"] == f"1 {path}"
            fabric = condition(obj, "Fabric") or {}
            assert (fabric.get("status"), fabric.get("reason")) == ("False", "KVOverNetwork")
            pods = worker_pods(f, ns)
            assert len(pods) == 20
            assert len({cliques[p["spec"]["nodeName"]] for p in pods}) == 2
            for p in pods:
                ctr = p["spec"]["containers"][0]
                held = ctr["resources"]["limits"].get("rdma/rdma_shared_device_a")
                caps = ctr["securityContext"]["capabilities"].get("add", [])
                assert (held, caps) == (("1", ["IPC_LOCK"]) if path == "rdma" else (None, [])), p["metadata"]
        assert "over RDMA" in (condition(md(f, ns="span-rdma"), "Fabric") or {})["message"]
        assert "kvNetwork is tcp" in (condition(md(f, ns="span-tcp"), "Fabric") or {})["message"]

        def refused() -> dict | None:
            cond = condition(md(f, ns="span-baseline"), "PodSecurity") or {}
            return cond if cond.get("status") == "False" else None

        cond = wait_for("PodSecurity=False for the RDMA unit in a baseline namespace", refused, timeout=60)
        assert cond["reason"] == "CapabilitiesForbidden"
        assert "IPC_LOCK (RDMA for a prefill-decode unit that spans NVLink domains)" in cond["message"]
        assert "kvNetwork to tcp" in cond["message"]
        assert not worker_pods(f, "span-baseline"), "the API server admitted none of its pods"
    finally:
        for ns in cases:
            kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def test_a_group_waits_for_its_imex_channel_and_says_so(operator):
    """With NVIDIA's DRA driver not answering, a multi-node group's ComputeDomain is written but its pods
    are not (a pod naming a missing claim template only draws Warnings); the status says what it waits
    for, and the group comes whole once the driver answers."""
    f = operator
    ns = "imex-wait"
    kubectl(f, "create", "namespace", ns, check=False)
    state = f.read_state()
    assert state is not None
    process.stop(state.pids["drivers"], "tokenfab_factory.drivers")
    doc = yaml.safe_load((EXAMPLES / "llama-405b-multinode-tp.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"]["worker"]["replicas"] = 1
    doc["spec"]["model"]["source"] = "hf://meta-llama/Llama-3.1-405B-Instruct"  # (no PVC of weights here)
    try:
        apply_yaml(f, doc, "--server-side", "--field-manager=e2e")

        def says_it_waits() -> bool:
            cond = condition(md(f, "llama-405b", ns), "Placed") or {}
            return "waiting for the IMEX channel of ComputeDomain llama-405b-worker-0-imex" in cond.get(
                "message", ""
            )

        wait_for("Placed saying it waits for the IMEX channel", says_it_waits, timeout=60)
        assert [cd["metadata"]["name"] for cd in get_json(f, "computedomains", "-n", ns)["items"]] == [
            "llama-405b-worker-0-imex"
        ]
        assert not worker_pods(f, ns, "llama-405b"), "no pod before its claim template exists"
    finally:
        f.restart_component("drivers")
    try:
        wait_for(
            "llama-405b Ready once the driver answers", lambda: is_ready(f, "llama-405b", ns), timeout=120
        )
        # No pod named a missing template, and no gang was tried before every pod's claim existed (its
        # PodGroup is written last): no Warning at all.
        warnings = get_json(f, "events", "-n", ns, "--field-selector", "type=Warning")["items"]
        assert warnings == [], [(e["reason"], e["message"]) for e in warnings]
        assert [
            pg["metadata"]["name"] for pg in get_json(f, "podgroups.scheduling.k8s.io", "-n", ns)["items"]
        ] == ["llama-405b-worker-0"]
    finally:
        kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)
