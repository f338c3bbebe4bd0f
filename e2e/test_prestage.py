"""Pre-staged weights on the local AI factory (model.cache.prestageGroups): the operator makes a
weights-fetch pod on each node its next groups would take, in a namespace enforcing the restricted Pod
Security Standard; each completes (kwok plays the download), its node's model cache claim is marked with
the weights and the pod goes; a scale-up then lands on those nodes and starts warm."""

from __future__ import annotations

import yaml

from e2e.helpers import apply_yaml, get_json, kubectl, wait_for
from testing.cases import EXAMPLES
from tokenfab.planning import contract
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


def cache_claims(f: Factory, owner: str = NAME, ns: str = NS) -> list[dict]:
    """The model cache claims a deployment owns (shared claims name no deployment: their owners do)."""
    claims = get_json(f, "pvc", "-n", ns, "-l", f"{contract.COMPONENT}={contract.COMPONENT_MODEL_CACHE}")[
        "items"
    ]
    return [m for m in claims if owner in owners(m) and not m["metadata"].get("deletionTimestamp")]


def owners(claim: dict) -> list[str]:
    return sorted(r["name"] for r in claim["metadata"].get("ownerReferences") or [])


def holds(claim: dict) -> set[str]:
    ann = claim["metadata"].get("annotations") or {}
    return {v for k, v in ann.items() if k.startswith(contract.ANN_HOLDS_PREFIX)}


def claim_nodes(f: Factory) -> set[str]:
    return {m["metadata"]["annotations"][contract.ANN_NODE] for m in cache_claims(f)}


def marked_nodes(f: Factory, key: str) -> set[str]:
    return {m["metadata"]["annotations"][contract.ANN_NODE] for m in cache_claims(f) if key in holds(m)}


def pods(f: Factory, component: str, owner: str = NAME, ns: str = NS) -> list[dict]:
    sel = f"{contract.LABEL_DEPLOYMENT}={owner},{contract.COMPONENT}={component}"
    return list(get_json(f, "pods", "-n", ns, "-l", sel)["items"])


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
            seen_fetch.update(
                p["spec"].get("nodeName") or "" for p in pods(f, contract.COMPONENT_WEIGHTS_FETCH)
            )
            workers = {p["spec"].get("nodeName") for p in pods(f, "worker")}
            marked = marked_nodes(f, key) - workers
            return marked if len(marked) == 2 and not pods(f, contract.COMPONENT_WEIGHTS_FETCH) else None

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
            ready = [
                p
                for p in ps
                if any(
                    cd["type"] == "Ready" and cd["status"] == "True"
                    for cd in p["status"].get("conditions") or []
                )
            ]
            return ps if len(ready) == 3 else None

        new = [
            p
            for p in wait_for("3 worker groups Ready", scaled, timeout=120)
            if p["spec"]["nodeName"] in nodes
        ]
        assert len(new) == 2, "the two new groups went to the staged nodes"
        assert {p["metadata"]["annotations"][contract.ANN_START_PATH] for p in new} == {"warm"}
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
    kubectl(f, "label", "node", victim, f"{contract.LABEL_CACHE_CAPACITY}=10Gi")
    try:
        wait_for("the labelled node's claim evicted", lambda: victim not in claim_nodes(f), timeout=90)
        events = get_json(f, "events", "-n", NS, "--field-selector", "reason=ModelCacheEvicted")["items"]
        assert any(victim in e["message"] for e in events), events
        assert set(others) <= claim_nodes(f)  # (unlabelled nodes evict nothing)
        wait_for("the evicted node out of idleSince", lambda: victim not in (idle() or {}), timeout=30)
    finally:
        kubectl(f, "label", "node", victim, f"{contract.LABEL_CACHE_CAPACITY}-", check=False)


SHARE = "share"


def test_two_deployments_of_one_source_share_a_nodes_cache(operator: Factory) -> None:
    """A stages one node (its pre-staged headroom); B, of the same source, starts warm there from A's
    claim and co-owns it (one claim, two owner references, each deployment's fields its own); B moving to
    another claim size lets go of it (A keeps it); A deleted, its other claims go with it."""
    f = operator
    kubectl(f, "create", "namespace", SHARE, check=False)
    a, other = deployment(1, prestage=1), deployment(1, prestage=0)
    for doc, name in ((a, "r-a"), (other, "r-b")):
        doc["metadata"].update(name=name, namespace=SHARE)
    key = f"{a['spec']['model']['source']}@main"
    apply_yaml(f, a)
    try:

        def staged() -> dict | None:
            workers = {p["spec"].get("nodeName") for p in pods(f, "worker", "r-a", SHARE)}
            done = [
                m
                for m in cache_claims(f, "r-a", SHARE)
                if key in holds(m) and m["metadata"]["annotations"][contract.ANN_NODE] not in workers
            ]
            return done[0] if done and not pods(f, contract.COMPONENT_WEIGHTS_FETCH, "r-a", SHARE) else None

        claim = wait_for("A's headroom node staged", staged, timeout=120)
        node, name = claim["metadata"]["annotations"][contract.ANN_NODE], claim["metadata"]["name"]
        apply_yaml(f, other)

        def b_ready() -> dict | None:
            ps = pods(f, "worker", "r-b", SHARE)
            ok = [
                p
                for p in ps
                if any(
                    cd["type"] == "Ready" and cd["status"] == "True"
                    for cd in p["status"].get("conditions") or []
                )
            ]
            return ok[0] if ok else None

        pod = wait_for("B's group Ready", b_ready, timeout=120)
        assert pod["spec"]["nodeName"] == node, "B's group went to the node A staged"
        assert pod["metadata"]["annotations"][contract.ANN_START_PATH] == "warm"
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "model-cache"]
        assert vol["persistentVolumeClaim"]["claimName"] == name  # (A's claim: staged once on the node)
        shared = wait_for(
            "the claim owned by both",
            lambda: (m := get_json(f, "pvc", name, "-n", SHARE)) and owners(m) == ["r-a", "r-b"] and m,
        )
        fields = get_json(f, "pvc", name, "-n", SHARE, "--show-managed-fields")["metadata"]["managedFields"]
        managers = {e["manager"] for e in fields}
        assert {m for m in managers if m.startswith(contract.CACHE_FIELD_MANAGER_PREFIX)} == {
            contract.CACHE_FIELD_MANAGER_PREFIX + get_json(f, "mdep", n, "-n", SHARE)["metadata"]["uid"]
            for n in ("r-a", "r-b")
        }
        assert not any(r.get("controller") for r in shared["metadata"]["ownerReferences"])
        assert key in holds(shared)
        status = get_json(f, "mdep", "r-b", "-n", SHARE)["status"]["weightsCache"]
        assert node in status["warmNodes"]
        # B asks for another cache size: its claims are others now; it lets go of the shared one
        other["spec"]["model"]["cache"]["size"] = "21Gi"
        apply_yaml(f, other)
        wait_for(
            "B let go of A's claim",
            lambda: owners(get_json(f, "pvc", name, "-n", SHARE)) == ["r-a"],
            timeout=120,
        )
        a_claims = {m["metadata"]["name"] for m in cache_claims(f, "r-a", SHARE)}
        kubectl(f, "delete", "mdep", "r-a", "-n", SHARE, "--wait=true")

        def a_gone() -> bool:
            left = {m["metadata"]["name"] for m in get_json(f, "pvc", "-n", SHARE)["items"]}
            return not (a_claims & left)

        wait_for("A's claims deleted with A (it owned them alone)", a_gone, timeout=120)
        assert cache_claims(f, "r-b", SHARE), "B's own claims stay"
    finally:
        kubectl(f, "delete", "mdep", "r-a", "r-b", "-n", SHARE, "--wait=true", check=False)


def test_letting_go_of_a_claim_on_the_real_api_server(factory: Factory) -> None:
    """The adapter's side of sharing, against the API server itself: a deployment letting go of a claim
    no one else holds deletes it (the apply that would take its spec off is refused, or leaves no owner),
    and a delete on the condition of an older resourceVersion leaves the claim alone."""
    from kubernetes import config

    from tokenfab.act import release_claim
    from tokenfab.adapters.kube import Kube
    from tokenfab.planning import builders

    f = factory
    kubectl(f, "create", "namespace", SHARE, check=False)
    kube = Kube(config.new_client_from_config(config_file=str(f.kubeconfig)))
    owner = builders.Owner(name="solo", namespace=SHARE, uid="uid-solo")

    def claim(name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": SHARE, "annotations": {contract.ANN_NODE: "n1"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }

    try:
        kube.apply(claim("solo-last"), "tokenfab-cache-uid-solo")
        release_claim(kube, owner, "solo-last", "tokenfab-cache-uid-solo")
        gone = kubectl(f, "get", "pvc", "solo-last", "-n", SHARE, check=False)
        assert gone.returncode != 0 or "Terminating" in gone.stdout, gone.stdout
        made = kube.apply(claim("solo-kept"), "tokenfab-cache-uid-solo")
        uid, rv = made["metadata"]["uid"], made["metadata"]["resourceVersion"]
        kube.apply(
            {
                **claim("solo-kept"),
                "metadata": {**claim("solo-kept")["metadata"], "labels": {"changed": "yes"}},
            },
            "other",
        )
        kube.delete(
            "v1",
            "PersistentVolumeClaim",
            "solo-kept",
            SHARE,
            preconditions={"uid": uid, "resourceVersion": rv},
        )
        assert get_json(f, "pvc", "solo-kept", "-n", SHARE)["metadata"]["uid"] == uid  # (changed since: kept)
        now = get_json(f, "pvc", "solo-kept", "-n", SHARE)["metadata"]["resourceVersion"]
        kube.delete(
            "v1",
            "PersistentVolumeClaim",
            "solo-kept",
            SHARE,
            preconditions={"uid": uid, "resourceVersion": now},
        )
        gone = kubectl(f, "get", "pvc", "solo-kept", "-n", SHARE, check=False)
        assert gone.returncode != 0 or "Terminating" in gone.stdout, gone.stdout
    finally:
        kubectl(f, "delete", "pvc", "solo-last", "solo-kept", "-n", SHARE, "--ignore-not-found", check=False)
        kube.pool.shutdown(wait=False)
