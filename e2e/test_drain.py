"""Drains on a live fleet (real Dynamo engines and frontend for the operator's pods, long streams):

- a group removed from a serving deployment first leaves routing: its engine's own request counter stops
  growing, its streams finish, and it is deleted once idle, with an Event saying how long that took;
- a drain that outlasts drainSeconds ends with the deletion and an Event saying how many requests it cut;
- a rollout that changes a disaggregated deployment's engine config brings up a new generation in its
  own Dynamo namespace and drains the old one: no request fails, and the requests each generation's
  prefill engines took equal those its decode engines took (no KV cache crossed generations).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.fleet import client, fleet
from e2e.helpers import apply_yaml, get_json, wait_for
from tokenfab.planning import contract
from tokenfab_factory.factory import Factory

pytestmark = pytest.mark.slow
NS = "live-drain"
SPEEDUP = 0.3
OSL = 900  # about 25-30 s a stream at the runner's speedup 0.3


@pytest.fixture(scope="module")
def live(operator: Factory) -> Iterator[tuple[Factory, fleet.Tools]]:
    tools = fleet.tools()
    fleet.ensure_namespace(operator, NS)
    fleet.start_runner(operator, tools, blocks_per_gpu=512, speedup_ratio=SPEEDUP, namespaces=(NS,))
    yield operator, tools
    operator.stop_extra(fleet.RUNNER)


def deployment(f: Factory, name: str, decode: int, drain: int) -> dict[str, Any]:
    doc = fleet.manifest(f, NS, name, autoscaling=False, decode_replicas=decode)
    doc["spec"]["serving"]["drainSeconds"] = drain
    doc["spec"]["autoscaling"]["prometheusUrl"] = f.prometheus_url  # in-flight counts come from here
    return doc


def up(f: Factory, doc: dict[str, Any]) -> str:
    apply_yaml(f, doc)
    name, want = doc["metadata"]["name"], doc["spec"]["decode"]["replicas"]
    wait_for(
        f"{name}: {want} decode groups Ready",
        lambda: (fleet.role_status(f, NS, name).get("decode") or {}).get("readyGroups") == want,
        timeout=180,
    )
    url = fleet.serving(f, NS, name)
    wait_for("the engines scraped", lambda: fleet.targets_up(f, NS, name, "decode") >= want, timeout=90)
    return url


def groups_of(f: Factory, name: str, role: str) -> list[str]:
    pods = get_json(
        f, "pods", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}={name},{contract.LABEL_ROLE}={role}"
    )["items"]
    return sorted(
        {
            p["metadata"]["labels"][contract.LABEL_GROUP]
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
        }
    )


def events(f: Factory, name: str) -> list[dict[str, Any]]:
    return list(get_json(f, "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")["items"])


def test_a_draining_group_takes_no_new_requests_and_goes_once_idle(live):
    f, _ = live
    doc = deployment(f, "drainy", decode=2, drain=600)
    url = up(f, doc)
    load = client.Streams(url, fleet.MODEL_NAME, OSL, rate=0.6).start()
    time.sleep(20)  # both decode groups take streams
    before = fleet.requests_by_group(f, NS, "drainy", "decode")
    doc["spec"]["decode"]["replicas"] = 1
    apply_yaml(f, doc)

    def draining() -> str | None:
        pods = get_json(
            f, "pods", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}=drainy,{contract.LABEL_ROLE}=decode"
        )["items"]
        marked = [p for p in pods if contract.ANN_DRAINING in (p["metadata"].get("annotations") or {})]
        return marked[0]["metadata"]["labels"][contract.LABEL_GROUP] if marked else None

    group = wait_for("a decode group draining", draining, timeout=60)
    t_drain = time.monotonic()
    assert group in before, f"the draining group served before: {before}"
    assert before[group] > 0, f"the draining group served before: {before}"
    row = get_json(f, "mdep", "drainy", "-n", NS)["status"]
    assert row["drainingGroups"] == 1
    time.sleep(8)  # the frontend has dropped it; what it counts from here on must not grow
    counted = fleet.requests_by_group(f, NS, "drainy", "decode")[group]
    time.sleep(15)
    still = fleet.requests_by_group(f, NS, "drainy", "decode").get(group)
    assert still is None or still == counted, f"a draining group took new requests: {counted} -> {still}"
    wait_for("the drained group deleted", lambda: group not in groups_of(f, "drainy", "decode"), timeout=240)
    took = time.monotonic() - t_drain
    load.stop_issuing()
    load.wait(timeout=180)
    drained = [e for e in events(f, "drainy") if e["reason"] == "GroupDrained"]
    assert drained, "no GroupDrained Event"
    assert group in drained[0]["message"]
    assert " in " in drained[0]["message"]
    failed = load.failed()
    print(json.dumps({"requests": len(load.issued), "failed": len(failed), "drain_s": round(took, 1)}))
    assert len(load.issued) >= 20
    assert not failed, [s.error for s in failed]
    fleet.delete_deployment(f, NS, "drainy")


def test_a_drain_past_its_deadline_is_cut_and_says_how_many(live):
    f, _ = live
    doc = deployment(f, "hasty", decode=2, drain=12)
    url = up(f, doc)
    load = client.Streams(url, fleet.MODEL_NAME, OSL * 3, rate=0.5).start()  # streams of ~80 s
    time.sleep(15)
    load.stop_issuing()
    doc["spec"]["decode"]["replicas"] = 1
    apply_yaml(f, doc)

    def timed_out() -> dict[str, Any] | None:
        return next((e for e in events(f, "hasty") if e["reason"] == "GroupDrainTimedOut"), None)

    event = wait_for("GroupDrainTimedOut", timed_out, timeout=120)
    print(event["message"])
    assert "request(s) in flight after" in event["message"]
    assert event["type"] == "Warning"
    assert "unknown number" not in event["message"], "the in-flight count should be known from Prometheus"
    # (the streams left on the other group last minutes more and nothing is asserted of them: the
    # deployment goes first, which ends them, then their threads are waited for)
    fleet.delete_deployment(f, NS, "hasty")
    load.wait(timeout=120)


def test_a_rollout_brings_up_a_new_generation_and_never_mixes_them(live):
    f, _ = live
    doc = deployment(f, "roller", decode=2, drain=600)
    url = up(f, doc)
    old_rev = {
        p["metadata"]["labels"][contract.LABEL_REVISION]
        for p in get_json(f, "pods", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}=roller")["items"]
        if contract.LABEL_REVISION in p["metadata"]["labels"]
    }
    assert len(old_rev) == 1, "prefill and decode share one revision (a generation)"
    load = client.Streams(url, fleet.MODEL_NAME, OSL, rate=0.6).start()
    time.sleep(15)
    doc["spec"]["decode"]["maxBatchSize"] = 48  # an engine config change
    apply_yaml(f, doc)

    def rolled() -> bool:
        pods = get_json(
            f, "pods", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}=roller,{contract.COMPONENT}=worker"
        )["items"]
        revs = {p["metadata"]["labels"][contract.LABEL_REVISION] for p in pods}
        ready = (fleet.role_status(f, NS, "roller").get("decode") or {}).get("readyGroups") == 2
        return bool(revs) and not revs & old_rev and ready

    wait_for("the new generation serving alone", rolled, timeout=420, interval=2)
    time.sleep(10)
    load.stop_issuing()
    load.wait(timeout=200)
    failed = load.failed()
    print(json.dumps({"requests": len(load.issued), "failed": len(failed)}))
    assert len(load.issued) >= 20
    assert not failed, [s.error for s in failed]

    # Per generation (Dynamo namespace), what the prefill engines took equals what the decode engines took.
    state = fleet.runner_state(f)
    served: dict[tuple[str, str], float] = {}
    for h in state["history"]:
        labels = h.get("labels") or {}
        final = h.get("at_sigterm") or {}
        if (
            h.get("kind") != "mocker"
            or labels.get("namespace") != NS
            or "dynamo_component_requests_total" not in final
        ):
            continue
        key = (h.get("generation") or "", labels.get(contract.PROM_LABEL_ROLE, ""))
        served[key] = served.get(key, 0.0) + final["dynamo_component_requests_total"]
    print(json.dumps({f"{g}/{r}": v for (g, r), v in served.items()}))
    old = {r: v for (g, r), v in served.items() if g in {x[:8] for x in old_rev}}
    assert old.get("prefill", 0) > 0, "the old generation served before it drained"
    assert abs(old.get("prefill", 0) - old.get("decode", 0)) <= 1, f"requests crossed generations: {served}"
    # Dynamo's kubernetes discovery only: every fleet connection stayed on loopback (the EndpointSlices carry
    # the pods' simulated IPs)
    assert state["foreign_connections"] == [], state["foreign_connections"]
    fleet.delete_deployment(f, NS, "roller")
