"""Pre-staged weights on the local AI factory (model.cache.prestageGroups): the operator makes a
weights-fetch pod on each node its next groups would take, in a namespace enforcing the restricted Pod
Security Standard; each completes (kwok plays the download), its node's model cache claim is marked with
the weights and the pod goes; a scale-up then lands on those nodes and starts warm."""

from __future__ import annotations

import yaml

from e2e.helpers import apply_yaml, get_json, kubectl, wait_for
from tests.cases import EXAMPLES
from tokenfab.planning import contract as c
from tokenfab_factory.drivers import STORAGE_CLASS
from tokenfab_factory.factory import Factory

NS = "stage"
NAME = "llama-8b"


def deployment(replicas: int, prestage: int = 2) -> dict:
    doc = yaml.safe_load((EXAMPLES / "aggregated-small.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    spec = doc["spec"]
    spec["autoscaling"] = {"enabled": False}
    spec["worker"].update(replicas=replicas, parallelism={"tensor": 4})  # a group fills a 4-GPU tray
    spec["model"]["cache"] = {"storageClassName": STORAGE_CLASS, "size": "20Gi", "prestageGroups": prestage}
    spec.setdefault("serving", {})["drainSeconds"] = 0  # (a scale-down deletes at once)
    return doc


def claim_nodes(f: Factory) -> set[str]:
    claims = get_json(f, "pvc", "-n", NS, "-l", f"{c.LABEL_DEPLOYMENT}={NAME}")["items"]
    return {
        m["metadata"]["annotations"][c.ANN_NODE] for m in claims if not m["metadata"].get("deletionTimestamp")
    }


def marked_nodes(f: Factory, key: str) -> set[str]:
    claims = get_json(f, "pvc", "-n", NS, "-l", f"{c.LABEL_DEPLOYMENT}={NAME}")["items"]
    return {
        m["metadata"]["annotations"][c.ANN_NODE]
        for m in claims
        if (m["metadata"].get("annotations") or {}).get(c.ANN_WEIGHTS) == key
    }


def pods(f: Factory, component: str) -> list[dict]:
    sel = f"{c.LABEL_DEPLOYMENT}={NAME},{c.COMPONENT}={component}"
    return list(get_json(f, "pods", "-n", NS, "-l", sel)["items"])


def test_prestaged_nodes_take_the_scale_up_warm(operator: Factory) -> None:
    f = operator
    kubectl(f, "create", "namespace", NS, check=False)
    kubectl(f, "label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    doc = deployment(1)
    key = f"{doc['spec']['model']['source']}@main"
    apply_yaml(f, doc)
    try:
        seen_fetch: set[str] = set()

        def staged() -> set[str] | None:
            seen_fetch.update(p["spec"].get("nodeName") or "" for p in pods(f, c.COMPONENT_WEIGHTS_FETCH))
            workers = {p["spec"].get("nodeName") for p in pods(f, "worker")}
            marked = marked_nodes(f, key) - workers
            return marked if len(marked) == 2 and not pods(f, c.COMPONENT_WEIGHTS_FETCH) else None

        nodes = wait_for("two nodes staged by weights-fetch pods, and the pods gone", staged, timeout=120)
        assert seen_fetch - {""} <= nodes  # (every fetch pod seen ran on a node it staged)
        cache = wait_for(
            "status.weightsCache naming the staged nodes warm",
            lambda: (
                (w := (get_json(f, "mdep", NAME, "-n", NS).get("status") or {}).get("weightsCache"))
                and nodes <= set(w.get("warmNodes") or [])
                and w
            ),
            timeout=30,
        )
        assert cache["weights"] == key
        assert set(cache["prestaged"]) == nodes
        # kubectl get -o wide sums it up (the factory's fetch pods leave no termination message: no bytes)
        fetching = len(cache.get("fetching") or [])  # (status leaves out what is empty)
        assert cache["summary"] == f"{len(cache['warmNodes'])} warm, {fetching} fetching"
        header, row = kubectl(f, "get", "mdep", NAME, "-n", NS, "-o", "wide").stdout.splitlines()[:2]
        assert header.split()[-2:] == ["WEIGHTS", "AGE"]
        assert " warm, " in row
        assert " fetching " in row
        apply_yaml(f, deployment(3))

        def scaled() -> list[dict] | None:
            ps = pods(f, "worker")
            ready = [p for p in ps if any(cd["type"] == "Ready" and cd["status"] == "True"
                                          for cd in p["status"].get("conditions") or [])]  # fmt: skip
            return ps if len(ready) == 3 else None

        new = [
            p
            for p in wait_for("3 worker groups Ready", scaled, timeout=120)
            if p["spec"]["nodeName"] in nodes
        ]
        assert len(new) == 2, "the two new groups went to the staged nodes"
        assert {p["metadata"]["annotations"][c.ANN_START_PATH] for p in new} == {"warm"}
        evicts_the_idle_cache_of_a_full_node(f)
    finally:
        kubectl(f, "delete", "mdep", NAME, "-n", NS, "--wait=true", check=False)


def evicts_the_idle_cache_of_a_full_node(f: Factory) -> None:
    """Back to one group, pre-staging off: two nodes' caches are idle (kept; status.weightsCache.idleSince
    names them); labelling one of them with less model cache capacity than its claim asks for evicts
    that claim."""
    apply_yaml(f, deployment(1, prestage=0))

    def idle() -> dict[str, str] | None:
        cache = (get_json(f, "mdep", NAME, "-n", NS).get("status") or {}).get("weightsCache") or {}
        since = cache.get("idleSince") or {}
        return since if len(since) >= 2 else None

    victim, *others = sorted(wait_for("two idle model caches in status", idle, timeout=120))
    kubectl(f, "label", "node", victim, f"{c.LABEL_CACHE_CAPACITY}=10Gi")
    try:
        wait_for("the labelled node's claim evicted", lambda: victim not in claim_nodes(f), timeout=90)
        events = get_json(f, "events", "-n", NS, "--field-selector", "reason=ModelCacheEvicted")["items"]
        assert any(victim in e["message"] for e in events), events
        assert set(others) <= claim_nodes(f)  # (unlabelled nodes evict nothing)
        wait_for("the evicted node out of idleSince", lambda: victim not in (idle() or {}), timeout=30)
    finally:
        kubectl(f, "label", "node", victim, f"{c.LABEL_CACHE_CAPACITY}-", check=False)
