"""Hardware faults on the local AI factory, injected as a real cluster signals them (tokenfab_factory.faults):
a whole rack lost at once, a node quarantined the way NVIDIA's NVSentinel does, a DRA device taint that
evicts, a ComputeDomain gone NotReady, a worker whose health endpoint stops answering on a healthy node.
The operator re-places lost groups whole at once (force-deleting their pods off the gone Nodes), replaces
a quarantined node's group before it leaves, keeps new groups off the degraded NVLink domain, and names
every fault in a condition, a status record and an Event. Times are printed, not asserted: the fault
benchmark (e2e/bench/fault_bench.py) measures them under load."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.helpers import apply_yaml, condition, get_json, kubectl, wait_for
from testing.cases import EXAMPLES
from tokenfab.planning import contract
from tokenfab_factory import faults
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL, RACK_LABEL

NS = "faults"
NAME = "deepseek-r1"


def md(f: Factory) -> dict[str, Any]:
    return get_json(f, "mdep", NAME, "-n", NS)


def seen_faults(f: Factory) -> set[tuple[str, str, str]]:
    """The fault records the deployment's status holds now (time, node, kind)."""
    return {(r["time"], r["node"], r["kind"]) for r in (md(f).get("status") or {}).get("faults") or []}


def the_new_record(f: Factory, before: set[tuple[str, str, str]], node: str) -> dict[str, Any]:
    """This test's fault record of the node (an earlier test may have left one for the same node and group
    slot: group names are reused). The status write that records it may land after the replacement serves
    (the pass that placed it writes the status last): waited for, up to 30 s."""

    def new() -> list[dict[str, Any]]:
        records = (md(f).get("status") or {}).get("faults") or []
        return [r for r in records if r["node"] == node and (r["time"], r["node"], r["kind"]) not in before]

    found = wait_for(f"a new fault record of {node}", new, timeout=30)
    assert len(found) == 1, (found, md(f)["status"]["faults"])
    return dict(found[0])


def groups(f: Factory) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    sel = f"{contract.LABEL_DEPLOYMENT}={NAME},{contract.COMPONENT}=worker"
    for p in get_json(f, "pods", "-n", NS, "-l", sel)["items"]:
        out.setdefault(p["metadata"]["labels"][contract.LABEL_GROUP], []).append(p)
    return out


def ready(p: dict[str, Any]) -> bool:
    conds = (p.get("status") or {}).get("conditions") or []
    return any(cd["type"] == "Ready" and cd["status"] == "True" for cd in conds) and not p["metadata"].get(
        "deletionTimestamp"
    )


def serving(gs: dict[str, list[dict[str, Any]]], role: str) -> set[str]:
    return {
        g
        for g, pods in gs.items()
        if pods[0]["metadata"]["labels"][contract.LABEL_ROLE] == role and all(ready(p) for p in pods)
    }


def nodes(f: Factory) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"]["labels"] for n in get_json(f, "nodes")["items"]}


def split_groups(gs: dict[str, list[dict[str, Any]]], labels: dict[str, dict[str, str]]) -> list[str]:
    """Groups whose bound pods sit in more than one NVLink domain (never allowed)."""

    def cliques(pods: list[dict[str, Any]]) -> set[str | None]:
        bound = [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
        return {labels.get(n, {}).get(CLIQUE_LABEL) for n in bound}

    return [g for g, pods in gs.items() if len(cliques(pods)) > 1]


def is_ready(f: Factory) -> bool:
    cond = condition(md(f), "Ready")
    return bool(cond and cond["status"] == "True")


def events(f: Factory) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        f, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}"
    )["items"]
    return items


@pytest.fixture(scope="module")
def deployed(operator: Factory) -> Iterator[Factory]:
    f = operator
    kubectl(f, "create", "namespace", NS, check=False)
    doc = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    apply_yaml(f, doc, "--server-side", "--field-manager=e2e")
    wait_for(f"{NS}/{NAME} Ready", lambda: is_ready(f), timeout=180)
    try:
        yield f
    finally:
        faults.heal(f)
        kubectl(f, "delete", "mdep", NAME, "-n", NS, "--wait=true", "--timeout=120s", check=False)


def decode_group(f: Factory) -> tuple[str, list[dict[str, Any]]]:
    gs = groups(f)
    name = sorted(g for g in serving(gs, "decode"))[0]
    return name, gs[name]


def watch_until(f: Factory, what: str, done: Any, timeout: float, seen: dict[str, Any]) -> float:
    """Poll until `done(groups)`; on every look, no group may be split across domains, and the least number
    of decode groups serving is kept in seen["min_decode"]. Returns the seconds it took."""
    labels = nodes(f)
    t0 = time.monotonic()
    while True:
        gs = groups(f)
        assert not split_groups(gs, labels), (
            f"a group split across NVLink domains: {split_groups(gs, labels)}"
        )
        seen["min_decode"] = min(seen.get("min_decode", 99), len(serving(gs, "decode")))
        if done(gs):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def replaced(
    f: Factory, pods: list[dict[str, Any]], what: str, timeout: float, seen: dict[str, Any]
) -> float:
    """Wait until none of `pods` is left and 2 decode groups serve again; returns the seconds it took."""
    before = {p["metadata"]["uid"] for p in pods}
    return watch_until(
        f,
        what,
        lambda gs: (
            not any(p["metadata"]["uid"] in before for ps in gs.values() for p in ps)
            and len(serving(gs, "decode")) == 2
        ),
        timeout,
        seen,
    )


def test_a_lost_rack_is_re_placed_whole_at_once_and_named(deployed: Factory) -> None:
    f = deployed
    victim, pods = decode_group(f)
    labels = nodes(f)
    rack_label = labels[pods[0]["spec"]["nodeName"]][RACK_LABEL]
    lost_clique = labels[pods[0]["spec"]["nodeName"]][CLIQUE_LABEL]
    lost = faults.nodes_of(f, rack=int(rack_label.split("-")[1]))
    assert len(lost) == 18
    faults.lose(f, lost)
    seen: dict[str, Any] = {}

    def back(gs: dict[str, list[dict[str, Any]]]) -> bool:
        on_lost = [p for ps in gs.values() for p in ps if p["spec"].get("nodeName") in lost]
        return not on_lost and len(serving(gs, "decode")) == 2 and len(serving(gs, "prefill")) == 2

    took = watch_until(f, "every group serving again off the lost rack", back, 120, seen)
    print(f"\nrack of 18 nodes lost: every group serving again {took:.1f} s after the Nodes' deletion")
    wait_for("Ready again", lambda: is_ready(f), timeout=30)
    status = md(f)["status"]
    records = [r for r in status["faults"] if r["node"] in lost]
    assert records, status["faults"]
    assert {r["kind"] for r in records} == {"Lost"}
    assert {r["reaction"] for r in records} == {"Replaced"}
    assert victim in {r["group"] for r in records}
    for r in records:
        assert r["domain"], r
        assert r["domain"] != lost_clique, r
    wait_for(
        "HardwareFault back to False",
        lambda: (condition(md(f), "HardwareFault") or {}).get("status") == "False",
        timeout=30,
    )
    assert condition(md(f), "HardwareFault")["reason"] == "Recovered"
    reasons = {e["reason"]: e for e in events(f)}
    assert "NodeLost" in reasons
    assert reasons["NodeLost"]["type"] == "Warning"
    assert any(n in reasons["NodeLost"]["message"] for n in lost)
    faults.heal(f, lost)
    wait_for("the rack's nodes back", lambda: set(lost) <= set(nodes(f)), timeout=30)


def test_a_quarantined_node_is_left_only_once_its_replacement_serves(deployed: Factory) -> None:
    f = deployed
    wait_for("Ready before the fault", lambda: is_ready(f), timeout=120)
    victim, pods = decode_group(f)
    node = sorted(p["spec"]["nodeName"] for p in pods)[0]
    clique = nodes(f)[node][CLIQUE_LABEL]
    before = seen_faults(f)
    faults.quarantine(f, node)
    seen: dict[str, Any] = {}
    try:

        def degraded() -> bool:
            doms = get_json(f, "nvlinkdomains")["items"]
            mine = [d for d in doms if d["status"]["domain"] == clique]
            return bool(mine) and mine[0]["status"].get("health") == "Degraded"

        took = watch_until(
            f,
            "the quarantined group gone, its replacement serving",
            lambda gs: victim not in gs and len(serving(gs, "decode")) == 2,
            180,
            seen,
        )
        least = seen["min_decode"]
        print(f"\nquarantine: the group moved in {took:.1f} s; decode groups serving: at least {least}")
        assert seen["min_decode"] >= 2, "the quarantined group left before its replacement served"
        assert not any(p["spec"].get("nodeName") == node for ps in groups(f).values() for p in ps)
        wait_for("the quarantined node's domain shown Degraded", degraded, timeout=30)
        table = kubectl(f, "get", "nvlinkdomains", "-o", "wide").stdout
        assert "Degraded" in table, table
        assert node in table, table
        record = the_new_record(f, before, node)
        assert (record["group"], record["kind"], record["reaction"]) == (victim, "Quarantined", "Evacuated")
        assert record["replacement"]
        assert record["domain"] != clique
        reasons = {e["reason"] for e in events(f)}
        assert {"NodeQuarantined", "GroupCreatedEvacuate"} <= reasons, reasons
        # NVSentinel's drainer comes after: nothing of the deployment is left on the node to evict (a
        # frontend pod there, if the scheduler put one there, is replaced on another node first).
        wait_for("nothing of the deployment left on the node", lambda: not on_node(f, node), timeout=90)
    finally:
        faults.heal(f, [node])
    wait_for("the domain Healthy once the node heals", lambda: not degraded(), timeout=30)


def on_node(f: Factory, node: str) -> list[str]:
    """The deployment's pods bound to the node that are not being deleted."""
    pods = get_json(f, "pods", "-n", NS, "--field-selector", f"spec.nodeName={node}")["items"]
    return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]


def frontend_pods(f: Factory) -> list[dict[str, Any]]:
    sel = f"{contract.LABEL_DEPLOYMENT}={NAME},{contract.COMPONENT}=frontend"
    items: list[dict[str, Any]] = get_json(f, "pods", "-n", NS, "-l", sel)["items"]
    return items


def the_frontend(f: Factory) -> tuple[str, str]:
    """Once the deployment is Ready with one ready frontend pod: that pod's node and name."""
    wait_for("Ready before the fault", lambda: is_ready(f), timeout=120)
    wait_for("one frontend pod, ready", lambda: [ready(p) for p in frontend_pods(f)] == [True], timeout=60)
    (pod,) = frontend_pods(f)
    return pod["spec"]["nodeName"], pod["metadata"]["name"]


def test_a_frontend_on_a_quarantined_node_is_replaced_elsewhere_before_it_goes(deployed: Factory) -> None:
    f = deployed
    node, name = the_frontend(f)
    faults.quarantine(f, node)
    least = 99
    try:
        t0 = time.monotonic()
        while True:
            pods = frontend_pods(f)
            serving = [p for p in pods if ready(p)]
            least = min(least, len(serving))
            if name not in {p["metadata"]["name"] for p in pods} and serving:
                break
            assert time.monotonic() - t0 < 120, f"frontend pod {name} still on {node}: {pods}"
            time.sleep(0.5)
        print(f"\nfrontend moved off the quarantined node in {time.monotonic() - t0:.1f} s")
        assert least >= 1, "the frontend had no ready pod while it moved"
        assert all(p["spec"]["nodeName"] != node for p in frontend_pods(f))
        # (the Event naming this pod: an earlier test's move may be listed after it, events come unsorted)
        moved = [e for e in events(f) if e["reason"] == "FrontendMoved" and name in e["message"]]
        assert moved, [(e["reason"], e["message"]) for e in events(f)]
        assert node in moved[-1]["message"], moved
        template = get_json(f, "deployment", f"{NAME}-frontend", "-n", NS)["spec"]["template"]["metadata"]
        assert template["annotations"][contract.ANN_REPLACES] == name
    finally:
        faults.heal(f, [node])


def test_a_frontend_on_a_lost_node_is_deleted_and_replaced_elsewhere(deployed: Factory) -> None:
    f = deployed
    node, name = the_frontend(f)
    faults.lose(f, [node])
    try:

        def replaced() -> bool:
            pods = frontend_pods(f)
            return name not in {p["metadata"]["name"] for p in pods} and any(ready(p) for p in pods)

        t0 = time.monotonic()
        wait_for("the lost node's frontend pod gone and another serving", replaced, timeout=120)
        print(f"\nfrontend on a lost node: replaced in {time.monotonic() - t0:.1f} s")
        # (an earlier test's lost node may have its own FrontendLost: the one naming this pod is wanted)
        lost = wait_for(
            "a FrontendLost Event naming the pod",
            lambda: [e for e in events(f) if e["reason"] == "FrontendLost" and name in e["message"]],
            timeout=30,
        )
        assert {e["type"] for e in lost} == {"Warning"}
    finally:
        faults.heal(f, [node])
    wait_for("the lost node back", lambda: node in nodes(f), timeout=30)


def test_a_noexecute_device_taint_loses_the_group_and_it_is_re_placed(deployed: Factory) -> None:
    f = deployed
    wait_for("Ready before the fault", lambda: is_ready(f), timeout=120)
    victim, pods = decode_group(f)
    node = sorted(p["spec"]["nodeName"] for p in pods)[0]
    before = seen_faults(f)
    faults.taint_device(f, node, effect="NoExecute")
    seen: dict[str, Any] = {}
    try:
        took = watch_until(
            f,
            "the tainted node's group re-placed and serving",
            lambda gs: (
                not any(p["spec"].get("nodeName") == node for ps in gs.values() for p in ps)
                and len(serving(gs, "decode")) == 2
            ),
            120,
            seen,
        )
        print(f"\nNoExecute device taint: serving again in {took:.1f} s")
        record = the_new_record(f, before, node)
        assert (record["group"], record["kind"], record["reaction"]) == (victim, "DeviceTainted", "Replaced")
        assert "channel-0" in record["message"]
        assert "DeviceTainted" in {e["reason"] for e in events(f)}
    finally:
        faults.heal(f, [node])


def test_a_compute_domain_gone_not_ready_loses_its_group_and_it_is_re_placed(deployed: Factory) -> None:
    f = deployed
    wait_for("Ready before the fault", lambda: is_ready(f), timeout=120)
    victim, pods = decode_group(f)
    # (its prefill-decode unit's ComputeDomain: every group of the unit holds a channel of it)
    domain = f"{NAME}-unit-{pods[0]['metadata']['labels'][contract.LABEL_UNIT]}-imex"
    broken = get_json(f, "computedomains", domain, "-n", NS)["metadata"]["uid"]
    faults.break_domain(f, NS, domain)
    try:
        took = replaced(f, pods, "the group re-placed with its IMEX domain", 120, {})
        print(f"\nComputeDomain NotReady: serving again in {took:.1f} s")
        records = [r for r in md(f)["status"]["faults"] if r["kind"] == "ComputeDomainNotReady"]
        assert records, md(f)["status"]["faults"]
        assert victim in {r["group"] for r in records}
        assert any(domain in r["message"] for r in records if r["group"] == victim)
        # the replacements claim a ComputeDomain that is not the broken one: a new unit's while the broken
        # one is still there, or their unit's made anew once it is gone
        gs = groups(f)
        for g in serving(gs, "decode"):
            unit = gs[g][0]["metadata"]["labels"][contract.LABEL_UNIT]
            cd = get_json(f, "computedomains", f"{NAME}-unit-{unit}-imex", "-n", NS)
            assert cd["metadata"]["uid"] != broken, f"{g} holds the broken ComputeDomain's channel"
        assert "ComputeDomainNotReady" in {e["reason"] for e in events(f)}
    finally:
        faults.heal(f)


def test_a_worker_that_stops_answering_on_a_healthy_node_loses_its_group(deployed: Factory) -> None:
    f = deployed
    wait_for("Ready before the fault", lambda: is_ready(f), timeout=120)
    victim, pods = decode_group(f)
    worker = sorted(pods, key=lambda p: p["metadata"]["name"])[-1]
    node = worker["spec"]["nodeName"]
    assert worker["spec"]["containers"][0]["startupProbe"]["httpGet"]["path"] == contract.HEALTH_PATH
    time.sleep(2)  # (a kubelet's readiness verdict comes after 3 failed probes 10 s apart, never within 1 s)
    print("\n" + faults.hang(f, NS, worker["metadata"]["name"]))
    took = replaced(f, pods, "the hung worker's group re-placed", 180, {})
    print(f"worker unhealthy: serving again in {took:.1f} s (30 s of readiness grace included)")
    records = [r for r in md(f)["status"]["faults"] if r["kind"] == "WorkerUnhealthy"]
    assert records, md(f)["status"]["faults"]
    r = records[-1]
    assert (r["group"], r["node"], r["reaction"]) == (victim, node, "Replaced")
    assert worker["metadata"]["name"] in r["message"]
    assert r["faultedDomain"] == worker["metadata"]["labels"][contract.LABEL_DOMAIN]
    assert r["replacement"]
    assert "WorkerUnhealthy" in {e["reason"] for e in events(f)}
    # Its node was healthy all along: nothing cordoned it, and it takes groups again.
    assert not get_json(f, "node", node)["spec"].get("unschedulable")
