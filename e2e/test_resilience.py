"""Nothing hangs and nothing loops hot, and two replicas act as one.

- Two operator processes with --leader-elect on one factory: the DeepSeek-R1 example ends with exactly its
  groups; SIGKILL the leader, change the spec, and the other replica rolls it out within the Lease time.
- A worker group whose pod keeps failing is recreated with growing delays and says CrashLooping with the
  pod's last exit message.
- An API call that never answers (a validating webhook that accepts the connection and never replies)
  costs its deployment a bounded wait and an error in its status; other deployments go on meanwhile.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.conftest import E2E_PORT_BASE, LIVENESS
from e2e.helpers import apply_yaml, condition, get_json, kubectl, namespace_maker, operator_replaced, wait_for
from testing.cases import EXAMPLES
from tokenfab.planning import contract
from tokenfab_factory import process
from tokenfab_factory.factory import Factory


def md(name: str, ns: str, tensor: int = 1, replicas: int = 1) -> dict:
    return {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"name": name, "source": f"hf://tokenfab-test/{name}"},
            "serving": {"mode": "aggregated"},
            "worker": {"parallelism": {"tensor": tensor}, "replicas": replicas},
        },
    }


def ready(f: Factory, name: str, ns: str) -> bool:
    cond = condition(get_json(f, "mdep", name, "-n", ns), "Ready")
    return bool(cond and cond["status"] == "True")


def delete_namespace(f: Factory, ns: str) -> None:
    kubectl(f, "delete", "namespace", ns, "--wait=true", "--timeout=180s", check=False)


@pytest.fixture
def namespace(operator: Factory) -> Iterator[Any]:
    yield from namespace_maker(operator, delete_namespace)


# ------------------------------------------------------------------------------------- two replicas


def start_replica(f: Factory, name: str, port: int) -> int:
    argv = [*f.operator_argv(port), "--leader-elect"]
    env = {
        "TOKENFAB_RESYNC_SECONDS": "5",
        "TOKENFAB_INVENTORY_SECONDS": "3",
        "TOKENFAB_LEASE_NAMESPACE": "default",
        "POD_NAME": name,
    }
    return f.start_extra(name, argv, env=env)


def lease_holder(f: Factory) -> str:
    out = kubectl(f, "get", "lease", "tokenfab-operator", "-n", "default", "-o", "json", check=False)
    if out.returncode != 0:
        return ""
    return str(json.loads(out.stdout)["spec"].get("holderIdentity") or "")


def test_two_replicas_one_leader_and_a_failover_within_the_lease(operator: Factory, namespace: Any) -> None:
    f = operator
    # the session's standalone operator makes way for two replicas
    with operator_replaced(f, LIVENESS):
        ns = namespace("ha")
        ports = {"replica-a": E2E_PORT_BASE + 40, "replica-b": E2E_PORT_BASE + 42}
        try:
            for name, port in ports.items():
                start_replica(f, name, port)
            holder = wait_for("a leader", lambda: lease_holder(f), timeout=60)
            leader = holder.split("_")[0]
            assert leader in ports
            doc = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
            doc["metadata"]["namespace"] = ns
            apply_yaml(f, doc, "--server-side", "--field-manager=e2e")
            wait_for("deepseek-r1 Ready under two replicas", lambda: ready(f, "deepseek-r1", ns), timeout=120)
            time.sleep(6)  # a few resyncs of both replicas: still exactly the example's groups

            def by_role() -> Counter[str]:
                pods = get_json(f, "pods", "-n", ns, "-l", f"{contract.COMPONENT}=worker")["items"]
                groups = {
                    p["metadata"]["labels"][contract.LABEL_GROUP]: p["metadata"]["labels"][
                        contract.LABEL_ROLE
                    ]
                    for p in pods
                }
                return Counter(groups.values())

            assert by_role() == Counter({"decode": 2, "prefill": 2})
            events = get_json(f, "events", "-n", ns, "--field-selector", "involvedObject.name=deepseek-r1")[
                "items"
            ]
            created = [e for e in events if e["reason"].startswith("GroupCreated")]
            assert len(created) == 4, [e["message"] for e in created]  # nobody created a group twice

            # SIGKILL the leader, then change the spec: the other replica takes the Lease and rolls it out.
            old_rev = {
                p["metadata"]["labels"][contract.LABEL_REVISION]
                for p in get_json(f, "pods", "-n", ns, "-l", f"{contract.LABEL_ROLE}=decode")["items"]
            }
            t0 = time.monotonic()
            process.stop(f.extra_pids()[leader], timeout=0)
            doc["spec"]["decode"]["maxBatchSize"] = 128
            apply_yaml(f, doc, "--server-side", "--field-manager=e2e")
            other = next(n for n in ports if n != leader)
            wait_for(
                "the other replica holds the Lease",
                lambda: lease_holder(f).startswith(other + "_"),
                timeout=40,
            )
            took_over = time.monotonic() - t0

            def rolled() -> bool:
                revs = {
                    p["metadata"]["labels"][contract.LABEL_REVISION]
                    for p in get_json(f, "pods", "-n", ns, "-l", f"{contract.LABEL_ROLE}=decode")["items"]
                }
                return (
                    bool(revs)
                    and not revs & old_rev
                    and by_role() == Counter({"decode": 2, "prefill": 2})
                    and ready(f, "deepseek-r1", ns)
                )

            wait_for("the rollout done by the other replica", rolled, timeout=180)
            print(json.dumps({"lease_taken_over_after_s": round(took_over, 1)}))
            assert took_over < 25, f"the Lease moved after {took_over:.0f} s (duration 15 s, retry 2 s)"
        finally:
            for name in ports:
                f.stop_extra(name)
            kubectl(f, "delete", "lease", "tokenfab-operator", "-n", "default", check=False)


# ------------------------------------------------------------------------------------- crash looping


def fail_pod(f: Factory, ns: str, name: str, message: str) -> None:
    status = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "worker",
                    "image": "worker",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
                }
            ],
        }
    }
    kubectl(
        f, "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


def test_a_crash_looping_group_is_recreated_with_growing_delays(operator: Factory, namespace: Any) -> None:
    f = operator
    ns = namespace("crashloop")
    apply_yaml(f, md("crashy", ns))
    seen: list[tuple[str, float]] = []  # (pod uid, when it appeared)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and len(seen) < 5:
        selector = f"tokenfab.dev/deployment=crashy,{contract.COMPONENT}=worker"
        pods = get_json(f, "pods", "-n", ns, "-l", selector)["items"]
        for p in pods:
            uid = p["metadata"]["uid"]
            if uid in {u for u, _ in seen} or p["metadata"].get("deletionTimestamp"):
                continue
            if p["status"].get("phase") == "Running":
                seen.append((uid, time.monotonic()))
                fail_pod(f, ns, p["metadata"]["name"], f"engine died #{len(seen)}")
        time.sleep(0.5)
    assert len(seen) == 5, f"only {len(seen)} incarnations within 150 s"
    gaps = [round(b - a, 1) for (_, a), (_, b) in itertools.pairwise(seen)]
    print(json.dumps({"gaps_s": gaps}))
    assert gaps[0] < 8, gaps  # the first failure is replaced at once
    assert gaps[1] >= 8, gaps  # 10 s after the second
    assert gaps[2] >= 1.6 * gaps[1] - 3, gaps  # then 20 s
    assert gaps[3] >= 1.6 * gaps[2] - 3, gaps  # then 40 s

    def crash_looping() -> dict | None:
        obj = get_json(f, "mdep", "crashy", "-n", ns)
        cond = condition(obj, "Degraded")
        return obj if cond and cond["reason"] == "CrashLooping" else None

    obj = wait_for("Degraded=True/CrashLooping", crash_looping, timeout=60)
    message = condition(obj, "Degraded")["message"]
    assert "engine died #" in message, message
    assert "next attempt in" in message or "retrying now" in message
    assert obj["status"]["failures"]["worker"]["failures"] >= 3
    row = kubectl(f, "get", "mdep", "crashy", "-n", ns, "-o", "wide").stdout
    assert "CrashLooping" in row


# ----------------------------------------------------------------------------------- a call that hangs


class SilentServer:
    """A TCP server on loopback that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._stop.set()
        for conn in self.conns:
            conn.close()
        self.sock.close()


def test_a_call_that_never_answers_does_not_stop_other_deployments(operator: Factory, namespace: Any) -> None:
    f = operator
    hung, fine = namespace("hung"), namespace("unhung")
    kubectl(f, "label", "namespace", hung, "tokenfab-test/hang=true")
    server = SilentServer()
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "tokenfab-test-hang"},
        "webhooks": [
            {
                "name": "hang.tokenfab.test",
                "clientConfig": {"url": f"https://127.0.0.1:{server.port}/validate"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"tokenfab-test/hang": "true"}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 30,
            }
        ],
    }
    apply_yaml(f, webhook)
    try:
        time.sleep(2)
        apply_yaml(f, [md("stuck", hung), md("quick", fine)])
        t0 = time.monotonic()
        wait_for("the other namespace's deployment Ready", lambda: ready(f, "quick", fine), timeout=60)
        quick = time.monotonic() - t0
        assert quick < 20, f"the deployment next to a hung call took {quick:.0f} s"

        def errored() -> dict | None:
            cond = condition(get_json(f, "mdep", "stuck", "-n", hung), "Degraded")
            return cond if cond and cond["reason"] == "ReconcileError" else None

        cond = wait_for("the hung deployment's error in its status", errored, timeout=90)
        print(json.dumps({"quick_ready_s": round(quick, 1), "message": cond["message"][:200]}))
        assert "no answer from the API server" in cond["message"] or "timeout" in cond["message"].lower()
        # Another deployment arriving while the call still hangs is served at once too.
        apply_yaml(f, md("later", fine))
        t1 = time.monotonic()
        wait_for("a later deployment Ready", lambda: ready(f, "later", fine), timeout=60)
        assert time.monotonic() - t1 < 20
    finally:
        kubectl(f, "delete", "validatingwebhookconfiguration", "tokenfab-test-hang", check=False)
        server.close()
    wait_for(
        "the hung deployment Ready once the webhook is gone", lambda: ready(f, "stuck", hung), timeout=420
    )
