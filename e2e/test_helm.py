"""The Helm chart on the local AI factory: `helm install` (2 replicas and a PodDisruptionBudget) into a
namespace that enforces the restricted Pod Security Standard, then the operator run as a process with the
chart Deployment's own arguments (`--leader-elect`) and environment and a token of the chart's
ServiceAccount, so it has exactly the chart's RBAC and nothing more. It must take the leader Lease in the
release namespace (and hand it back when stopped, and a standby take it over when the leader is killed);
DeepSeek-R1 must become Ready, scale down, get PodGroups and ComputeDomains, keep the NVLinkDomain
inventory, with no permission error in the operator's log; ModelDeployments left with an old finalizer
lose it, and are deleted with their children while no operator runs; `kubectl auth can-i` shows what the
ServiceAccount cannot do; `helm install` refuses bad values.

The factory cannot run images, so the chart's operator pods only exist (kwok marks them Running) and
never compete for the Lease; the session's admin operator is stopped for this module, so two operators
never act at once, and started again afterwards if it was running. Every process is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import E2E_PORT_BASE, LIVENESS
from e2e.helpers import (
    apply_yaml,
    condition,
    engine_configmaps,
    get_json,
    kubectl,
    operator_up,
    wait_for,
    wait_healthy,
)
from testing.cases import load_example
from testing.chart import CHART, wildcards
from tokenfab.leader import DURATION, LEASE_NAME, RETRY
from tokenfab.planning import contract
from tokenfab_factory import process
from tokenfab_factory.factory import Factory

RELEASE = "tokenfab"
SYSTEM_NS = "tokenfab-system"
SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"  # the release's full name is the chart's name
NS = "helm-ds"  # DeepSeek-R1 under the chart's RBAC
CD_NS = "helm-cd"  # ComputeDomains
SCOPED_NS = "helm-scoped"  # watchNamespaces
PROC = "operator-helm"
STANDBY = "operator-helm-standby"
HEALTH = E2E_PORT_BASE + 30  # the admin operator uses LIVENESS (base + 20) and LIVENESS + 1
STANDBY_HEALTH = E2E_PORT_BASE + 32  # and its metrics on + 33
POD_NAME = "tokenfab-local"  # what the pod's downward API would give the process: its Lease identity
LEGACY_FINALIZER = f"{contract.DOMAIN}/finalizer"  # what kopf's change handlers of earlier versions put on
LEGACY_ANNOTATION = f"{contract.DOMAIN}/last-handled-configuration"
DENIAL = re.compile(r"forbidden|not enough permissions|unauthorized", re.I)


def helm(f: Factory, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(f.config.bin_dir / "helm"), f"--kubeconfig={f.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=180,
    )


class ChartOperator:
    """The operator as a local process with the installed chart's command, arguments, environment and
    identity (a token of its ServiceAccount)."""

    def __init__(
        self, f: Factory, tmp: Path, name: str = PROC, health: int = HEALTH, pod: str = POD_NAME
    ) -> None:
        self.f = f
        self.name = name
        self.health = health
        self.pod = pod
        self.kubeconfig = tmp / "tokenfab-sa.kubeconfig"
        # The kubernetes client caches API discovery in $TMPDIR per server URL, shared by every process
        # and run: a private TMPDIR keeps this module's stand-in ComputeDomain CRD out of other operators'
        # caches (the pod gets its own emptyDir /tmp).
        self.tmpdir = tmp / f"{name}-tmp"
        self.tmpdir.mkdir()
        self.log = f.log(name)
        self.offset = 0
        self.started = 0.0
        self.argv: list[str] = []
        self.env: dict[str, str] = {}

    def write_kubeconfig(self) -> None:
        """A kubeconfig whose only credential is a token of the chart's ServiceAccount."""
        token = kubectl(self.f, "create", "token", RELEASE, "-n", SYSTEM_NS, "--duration=2h").stdout.strip()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "factory",
                    "cluster": {
                        "server": self.f.apiserver_url,
                        "certificate-authority": str(self.f.pki.ca_crt),
                    },
                }
            ],
            "users": [{"name": "tokenfab-sa", "user": {"token": token}}],
            "contexts": [{"name": "tokenfab-sa", "context": {"cluster": "factory", "user": "tokenfab-sa"}}],
            "current-context": "tokenfab-sa",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def chart_command(self) -> tuple[list[str], dict[str, str]]:
        """The installed Deployment's command, args and env, with the endpoints moved to loopback ports."""
        deploy = get_json(self.f, "deployment", RELEASE, "-n", SYSTEM_NS)
        (ctr,) = deploy["spec"]["template"]["spec"]["containers"]
        args = list(ctr["args"])
        local = {
            "--liveness": f"http://127.0.0.1:{self.health}/healthz",
            "--metrics-port": str(self.health + 1),
            "--metrics-addr": "127.0.0.1",
        }
        for flag, value in local.items():
            if flag in args:
                args[args.index(flag) + 1] = value
        env = {e["name"]: e["value"] for e in ctr.get("env") or [] if "value" in e}
        # The downward API's pod name (valueFrom) is the one variable a process cannot take as written.
        fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in ctr["env"] if "valueFrom" in e}
        assert fields == {"POD_NAME": "metadata.name"}, fields
        env["POD_NAME"] = self.pod
        command = list(ctr["command"])
        if command[0] == "python":  # the image's Python is this virtualenv's
            command[0] = sys.executable
        return [*command, *args], env

    def start(self) -> None:
        argv, env = self.chart_command()
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        self.started = time.time()
        self.argv = argv
        self.env = env
        self.f.start_extra(
            self.name, argv, env={**env, "KUBECONFIG": str(self.kubeconfig), "TMPDIR": str(self.tmpdir)}
        )
        wait_healthy(self.health, f"the health endpoint of {self.name}", timeout=90)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.health + 1}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        """SIGTERM (then SIGKILL after 15 s), by PID."""
        self.f.stop_extra(self.name)

    def kill(self) -> None:
        """SIGKILL, by PID: the leader gets no chance to hand its Lease back."""
        pid = self.f.extra_pids()[self.name]
        assert process.alive(pid, "tokenfab.cli"), f"{self.name} (pid {pid}) does not run"
        os.kill(pid, signal.SIGKILL)
        wait_for(f"{self.name} (pid {pid}) to die", lambda: not process.alive(pid), timeout=10)
        self.f.stop_extra(self.name)  # forgets the pid (nothing is left to stop)

    def leads(self) -> bool:
        return lease_holder(self.f).startswith(f"{self.pod}_")

    def output(self) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")

    def assert_no_denials(self) -> None:
        """Any RBAC refusal the operator met (kopf logs them, the adapters raise them) fails the test."""
        denied = [line for line in self.output().splitlines() if DENIAL.search(line)]
        assert not denied, "the operator was refused by RBAC:\n" + "\n".join(denied[:20])


@pytest.fixture(scope="module")
def chart(factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartOperator]:
    f = factory
    admin_was_running = f.stop_extra("operator")
    tmp = tmp_path_factory.mktemp("helm")
    op = ChartOperator(f, tmp)
    try:
        apply_yaml(
            f,
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": SYSTEM_NS,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest",
                        "pod-security.kubernetes.io/warn": "restricted",
                    },
                },
            },
        )
        for ns in (NS, CD_NS, SCOPED_NS):
            kubectl(f, "create", "namespace", ns, check=False)
        out = helm(
            f,
            "install",
            RELEASE,
            str(CHART),
            "-n",
            SYSTEM_NS,
            "--set",
            "operator.resyncSeconds=5",
            "--set",
            "operator.inventorySeconds=3",
        )
        assert "PodSecurity" not in out.stderr, out.stderr
        op.write_kubeconfig()
        op.start()
        yield op
    finally:
        f.stop_extra(STANDBY)  # if a failover test failed half-way
        op.stop()
        # Whatever a failed test left; the legacy finalizer would hold it until an operator removes it.
        for ns in (NS, CD_NS, SCOPED_NS):
            names = kubectl(f, "get", "mdep", "-n", ns, "-o", "name", check=False).stdout.split()
            for name in names:
                unfinalize = '{"metadata":{"finalizers":null}}'
                kubectl(f, "patch", name, "-n", ns, "--type=merge", "-p", unfinalize, check=False)
                kubectl(f, "delete", name, "-n", ns, "--wait=false", check=False)
        helm(f, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout=60s", check=False)
        for ns in (NS, CD_NS, SCOPED_NS, SYSTEM_NS):
            kubectl(f, "delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        if admin_was_running:
            operator_up(f, LIVENESS, what="the admin operator's health endpoint")


def lease_holder(f: Factory) -> str:
    """The leader Lease's holder ('' when it has none, or there is no Lease)."""
    out = kubectl(f, "get", "lease", LEASE_NAME, "-n", SYSTEM_NS, "-o", "json", check=False)
    if out.returncode != 0:
        return ""
    return str((json.loads(out.stdout).get("spec") or {}).get("holderIdentity") or "")


def children(f: Factory, ns: str, owner: str) -> list[str]:
    """Every object the operator made for a ModelDeployment (by its label), the frontend's too."""
    kinds = "pods,services,configmaps,deployments.apps,replicasets.apps"
    if kubectl(f, "get", "podgroups.scheduling.k8s.io", "-n", ns, check=False).returncode == 0:
        kinds += ",podgroups.scheduling.k8s.io"
    if kubectl(f, "get", "computedomains.resource.nvidia.com", "-n", ns, check=False).returncode == 0:
        kinds += ",computedomains.resource.nvidia.com"
    out = kubectl(f, "get", kinds, "-n", ns, "-l", f"{contract.LABEL_DEPLOYMENT}={owner}", "-o", "name")
    return out.stdout.split()


def can_i(f: Factory, verb: str, resource: str, *args: str) -> bool:
    out = kubectl(f, "auth", "can-i", verb, resource, f"--as={SA}", *args, check=False)
    answer = out.stdout.strip()
    assert answer.startswith(("yes", "no")), out.stdout + out.stderr
    return answer.startswith("yes")


def md(f: Factory, name: str, ns: str) -> dict[str, Any]:
    result: dict[str, Any] = get_json(f, "mdep", name, "-n", ns)
    return result


def ready(f: Factory, name: str, ns: str) -> bool:
    cond = condition(md(f, name, ns), "Ready")
    return bool(cond and cond["status"] == "True")


def example(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    doc = load_example(name)
    doc["metadata"]["namespace"] = ns
    doc["spec"].update(spec)
    return doc


def worker_groups(f: Factory, ns: str, owner: str) -> set[str]:
    sel = f"{contract.LABEL_DEPLOYMENT}={owner},{contract.COMPONENT}=worker"
    return {
        p["metadata"]["labels"][contract.LABEL_GROUP]
        for p in get_json(f, "pods", "-n", ns, "-l", sel)["items"]
    }


def compute_domains(f: Factory, ns: str) -> set[str]:
    return {
        d["metadata"]["labels"][contract.LABEL_GROUP]
        for d in get_json(f, "computedomains", "-n", ns)["items"]
    }


# ------------------------------------------------------------------------------------ the install


def test_chart_objects_pass_restricted_pod_security(chart: ChartOperator) -> None:
    f = chart.f
    deploy = get_json(f, "deployment", RELEASE, "-n", SYSTEM_NS)
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert deploy["spec"]["replicas"] == 2
    # The namespace enforces `restricted`, and the API server really does enforce it here ...
    refused = kubectl(
        f,
        "run",
        "privileged",
        "--image=busybox",
        "--privileged",
        "-n",
        SYSTEM_NS,
        "--dry-run=server",
        check=False,
    )
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr, refused.stderr
    # ... and the chart's pod was admitted (kwok runs it: the factory cannot run images).
    selector = "app.kubernetes.io/name=tokenfab,app.kubernetes.io/component=operator"
    wait_for(
        "the chart's two operator pods to be admitted",
        lambda: len(get_json(f, "pods", "-n", SYSTEM_NS, "-l", selector)["items"]) == 2,
        timeout=60,
    )
    rs_conditions = [
        cond
        for rs in get_json(f, "replicasets", "-n", SYSTEM_NS, "-l", selector)["items"]
        for cond in (rs.get("status") or {}).get("conditions") or []
    ]
    assert not [cond for cond in rs_conditions if cond["type"] == "ReplicaFailure"], rs_conditions
    # The ClusterRole and the leader Lease's Role as installed have no wildcard anywhere.
    role = get_json(f, "clusterrole", RELEASE)
    assert role["rules"]
    assert not wildcards(role), wildcards(role)
    leader = get_json(f, "role", f"{RELEASE}-leader", "-n", SYSTEM_NS)
    assert {r for rule in leader["rules"] for r in rule["resources"]} == {"leases"}
    assert not wildcards(leader), wildcards(leader)


def test_the_pod_disruption_budget_keeps_one_of_two_replicas(chart: ChartOperator) -> None:
    f = chart.f
    pdb = get_json(f, "pdb", RELEASE, "-n", SYSTEM_NS)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pod_labels = get_json(f, "deployment", RELEASE, "-n", SYSTEM_NS)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    def expected_pods() -> int:
        status = get_json(f, "pdb", RELEASE, "-n", SYSTEM_NS).get("status") or {}
        return int(status.get("expectedPods") or 0)

    # The disruption controller counts the chart's two pods under it.
    wait_for("the PodDisruptionBudget to cover both replicas", lambda: expected_pods() == 2, timeout=60)


def test_the_operator_runs_as_the_service_account_not_as_admin(chart: ChartOperator) -> None:
    f = chart.f
    base = [str(f.config.bin_dir / "kubectl"), f"--kubeconfig={chart.kubeconfig}"]
    who = subprocess.run([*base, "auth", "whoami", "-o", "json"], capture_output=True, text=True, check=True)
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == SA
    everything = subprocess.run([*base, "auth", "can-i", "*", "*"], capture_output=True, text=True)
    assert everything.stdout.strip() == "no"
    assert chart.argv[3:5] == ["operator", "--liveness"], chart.argv
    assert "--leader-elect" in chart.argv
    assert chart.env["TOKENFAB_LEASE_NAMESPACE"] == SYSTEM_NS
    assert "--namespace" not in chart.argv, "the default install serves every namespace"


def test_the_operator_takes_the_leader_lease_in_the_release_namespace(chart: ChartOperator) -> None:
    f = chart.f
    wait_for("the chart operator to take the leader Lease", chart.leads, timeout=30)
    lease = get_json(f, "lease", LEASE_NAME, "-n", SYSTEM_NS)
    assert lease["spec"]["leaseDurationSeconds"] == DURATION
    assert "tokenfab_leader 1.0" in chart.metrics()
    chart.assert_no_denials()


LEASES = "leases.coordination.k8s.io"
FORBIDDEN = [
    ("get", "secrets", "-A"),
    ("list", "secrets", f"-n={SYSTEM_NS}"),
    ("get", "configmaps", "-n=kube-system"),
    ("delete", "nodes"),
    ("patch", "nodes"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io", f"-n={NS}"),
    ("bind", "roles.rbac.authorization.k8s.io", f"-n={NS}"),
    ("update", "roles.rbac.authorization.k8s.io", f"-n={NS}"),
    ("update", "rolebindings.rbac.authorization.k8s.io", f"-n={NS}"),
    ("get", "serviceaccounts", f"-n={NS}"),
    ("delete", "dynamoworkermetadatas.nvidia.com", f"-n={NS}"),
    ("create", "pods", f"-n={NS}", "--subresource=exec"),
    ("create", "pods", f"-n={NS}", "--subresource=attach"),
    ("create", "pods", f"-n={NS}", "--subresource=portforward"),
    ("get", "pods", f"-n={NS}", "--subresource=log"),
    ("create", "serviceaccounts", f"-n={SYSTEM_NS}", "--subresource=token"),
    ("impersonate", "users"),
    ("impersonate", "serviceaccounts", f"-n={SYSTEM_NS}"),
    ("create", "namespaces"),
    ("delete", "namespaces"),
    ("update", "modeldeployments.tokenfab.dev", f"-n={NS}"),
    ("delete", "modeldeployments.tokenfab.dev", f"-n={NS}"),
    ("create", "modeldeployments.tokenfab.dev", f"-n={NS}"),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "daemonsets.apps", f"-n={NS}"),
    ("delete", "deployments.apps", f"-n={NS}"),
    ("delete", "services", f"-n={NS}"),
    # Leases: the operator's own, in the release namespace, and nothing else (node heartbeats, other
    # controllers' leader Leases).
    ("update", LEASES, "-n=kube-node-lease"),
    ("create", LEASES, "-n=kube-system"),
    ("get", f"{LEASES}/{LEASE_NAME}", "-n=kube-system"),
    ("update", f"{LEASES}/{LEASE_NAME}", f"-n={NS}"),
    ("update", f"{LEASES}/kube-scheduler", f"-n={SYSTEM_NS}"),
    ("list", LEASES, f"-n={SYSTEM_NS}"),
    ("delete", f"{LEASES}/{LEASE_NAME}", f"-n={SYSTEM_NS}"),
]
ALLOWED = [
    ("create", "pods", f"-n={NS}"),
    ("deletecollection", "pods", f"-n={NS}"),
    ("delete", "pods", f"-n={NS}"),  # (a pod left on a Node that no longer exists, with grace period 0)
    ("list", "nodes"),
    ("watch", "devicetaintrules.resource.k8s.io"),
    ("patch", "modeldeployments.tokenfab.dev", f"-n={NS}", "--subresource=status"),
    ("patch", "nvlinkdomains.tokenfab.dev", "--subresource=status"),
    ("create", "podgroups.scheduling.k8s.io", f"-n={NS}"),
    ("delete", "podgroups.scheduling.k8s.io", f"-n={NS}"),
    # The children's informers (by label: RBAC cannot narrow a list to a label).
    ("watch", "services", "-A"),
    ("list", "configmaps", "-A"),
    ("watch", "deployments.apps", "-A"),
    ("get", f"{LEASES}/{LEASE_NAME}", f"-n={SYSTEM_NS}"),
    ("update", f"{LEASES}/{LEASE_NAME}", f"-n={SYSTEM_NS}"),
    ("create", LEASES, f"-n={SYSTEM_NS}"),
]


@pytest.mark.parametrize("check", FORBIDDEN, ids=[" ".join(x) for x in FORBIDDEN])
def test_the_service_account_cannot(chart: ChartOperator, check: tuple[str, ...]) -> None:
    assert not can_i(chart.f, *check)


@pytest.mark.parametrize("check", ALLOWED, ids=[" ".join(x) for x in ALLOWED])
def test_the_service_account_can(chart: ChartOperator, check: tuple[str, ...]) -> None:
    assert can_i(chart.f, *check)


def test_bad_values_are_refused_by_helm_install(chart: ChartOperator) -> None:
    f = chart.f
    cases = [
        (["replicaCount=6"], "at '/replicaCount': maximum: got 6, want 5"),
        (["podDisruptionBudget.enabled=yes"], "at '/podDisruptionBudget/enabled': got string, want boolean"),
        (["logLevel=trace"], "at '/logLevel': value must be one of 'info', 'debug'"),
        (["metrics.port=abc"], "at '/metrics/port': got string, want integer"),
        (["serviceMonitor.enabled=true", "podMonitor.enabled=true"], "enable one of them"),
    ]
    for sets, message in cases:
        args = [a for s in sets for a in ("--set", s)]
        out = helm(f, "install", "bad", str(CHART), "-n", SYSTEM_NS, *args, check=False)
        assert out.returncode != 0, sets
        assert out.stderr.startswith("Error: INSTALLATION FAILED: "), out.stderr
        assert message in out.stderr, out.stderr
    assert helm(f, "status", "bad", "-n", SYSTEM_NS, check=False).returncode != 0
    assert kubectl(f, "get", "deployment", "bad-tokenfab", "-n", SYSTEM_NS, check=False).returncode != 0


# ------------------------------------------------------------------- the operator under the chart's RBAC


def test_deepseek_becomes_ready_under_the_chart_rbac(chart: ChartOperator) -> None:
    f = chart.f
    apply_yaml(f, example("deepseek-r1-disaggregated.yaml", NS), "--server-side", "--field-manager=e2e")
    wait_for("deepseek-r1 Ready under the chart's RBAC", lambda: ready(f, "deepseek-r1", NS), timeout=180)
    obj = md(f, "deepseek-r1", NS)
    assert obj["status"]["gpus"] == "80/80"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    # No finalizer and no kopf bookkeeping on the object; the operator posted Events (create events).
    assert not obj["metadata"].get("finalizers"), obj["metadata"]
    annotations = obj["metadata"].get("annotations") or {}
    assert not [a for a in annotations if a.startswith(f"{contract.DOMAIN}/last-handled")], annotations
    events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=deepseek-r1")["items"]
    ours = [e for e in events if e["source"].get("component") == "tokenfab-operator"]
    assert "AllGroupsReady" in {e["reason"] for e in ours}
    # Services, the frontend Deployment and the engine ConfigMaps were applied.
    assert len(engine_configmaps(f, NS, "deepseek-r1", "decode")) == 1
    assert (
        len(get_json(f, "services", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}=deepseek-r1")["items"]) == 2
    )
    # The chart's metrics flags work.
    metrics = chart.metrics()
    assert f'tokenfab_groups_ready{{deployment="deepseek-r1",namespace="{NS}",role="decode"}} 2.0' in metrics
    chart.assert_no_denials()


def test_nvlink_domain_inventory_under_the_chart_rbac(chart: ChartOperator) -> None:
    """The chart operator writes the inventory (applied objects and their status) and, as a new leader
    lists the NVLinkDomains, deletes the ones whose domain is gone."""
    f = chart.f

    def written() -> bool:
        items = get_json(f, "nvlinkdomains")["items"]
        stamps = [
            datetime.fromisoformat(d["status"]["updated"].replace("Z", "+00:00")).timestamp()
            for d in items
            if d.get("status", {}).get("updated")
        ]
        placed = {(g["namespace"], g["group"]) for d in items for g in d["status"].get("groups") or []}
        ours = {(NS, g) for g in worker_groups(f, NS, "deepseek-r1")}
        return len(stamps) == 4 and max(stamps) >= chart.started - 1 and ours <= placed

    wait_for("the NVLinkDomains written by the chart's operator", written, timeout=30)
    # An object of a domain that no longer exists (e.g. written by an earlier operator): a leader lists the
    # inventory when it starts leading, and deletes it.
    apply_yaml(
        f,
        {
            "apiVersion": "tokenfab.dev/v1alpha1",
            "kind": "NVLinkDomain",
            "metadata": {
                "name": "helm-e2e-stale",
                "labels": {contract.MANAGED_BY: contract.MANAGED_BY_VALUE},
            },
        },
    )
    chart.stop()
    chart.start()

    def stale_gone() -> bool:
        return "helm-e2e-stale" not in {d["metadata"]["name"] for d in get_json(f, "nvlinkdomains")["items"]}

    wait_for("the stale NVLinkDomain deleted by the operator", stale_gone, timeout=30)
    assert len(get_json(f, "nvlinkdomains")["items"]) == 4
    chart.assert_no_denials()


def test_scaling_down_deletes_whole_groups_under_the_chart_rbac(chart: ChartOperator) -> None:
    f = chart.f
    before = worker_groups(f, NS, "deepseek-r1")
    assert len(before) == 4
    kubectl(
        f,
        "patch",
        "mdep",
        "deepseek-r1",
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec":{"decode":{"replicas":1}}}',
    )

    def scaled() -> bool:
        obj = md(f, "deepseek-r1", NS)
        status = obj.get("status") or {}
        return (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and status.get("gpus") == "40/40"
            and len(worker_groups(f, NS, "deepseek-r1")) == 2
            and ready(f, "deepseek-r1", NS)
        )

    wait_for("deepseek-r1 scaled to 1 decode + 1 prefill group", scaled, timeout=120)
    assert worker_groups(f, NS, "deepseek-r1") < before
    chart.assert_no_denials()


def test_compute_domains_under_the_chart_rbac(chart: ChartOperator) -> None:
    """The factory's simulated NVIDIA DRA driver serves ComputeDomains: the operator creates one per
    multi-node group (the default), its pods' IMEX claims are allocated by the scheduler, and it is deleted
    with its group."""
    f = chart.f
    doc = example("llama-405b-multinode-tp.yaml", CD_NS)
    doc["spec"]["model"]["source"] = "hf://meta-llama/Llama-3.1-405B-Instruct"  # (no PVC of weights here)
    apply_yaml(f, doc, "--server-side", "--field-manager=e2e")

    def one_per_group(n: int) -> bool:
        domains = compute_domains(f, CD_NS)
        return len(domains) == n and domains == worker_groups(f, CD_NS, "llama-405b")

    wait_for("a ComputeDomain per llama-405b worker group", lambda: one_per_group(2), timeout=90)
    wait_for("llama-405b Ready with its IMEX channels", lambda: ready(f, "llama-405b", CD_NS), timeout=120)
    claims = get_json(f, "resourceclaims", "-n", CD_NS)["items"]
    allocated = [rc for rc in claims if (rc.get("status") or {}).get("allocation")]
    assert len(allocated) == 2 * 4, "one allocated IMEX channel per pod of the two 16-GPU groups"
    patch = '{"spec":{"worker":{"replicas":1}}}'
    kubectl(f, "patch", "mdep", "llama-405b", "-n", CD_NS, "--type=merge", "-p", patch)
    wait_for("the surplus group's ComputeDomain deleted with it", lambda: one_per_group(1), timeout=90)
    chart.assert_no_denials()


def test_an_old_finalizer_is_removed_under_the_chart_rbac(chart: ChartOperator) -> None:
    """A ModelDeployment as an earlier tokenfab (kopf change handlers) left it: the operator takes its
    finalizer and kopf's annotation off (patch modeldeployments), and serves it."""
    f = chart.f
    old = example("aggregated-small.yaml", NS, autoscaling={"enabled": False})
    old["metadata"].update(
        name="legacy", finalizers=[LEGACY_FINALIZER], annotations={LEGACY_ANNOTATION: "{}"}
    )
    apply_yaml(f, old, "--server-side", "--field-manager=e2e-old-tokenfab")

    def cleaned() -> bool:
        meta = md(f, "legacy", NS)["metadata"]
        return LEGACY_FINALIZER not in (meta.get("finalizers") or []) and LEGACY_ANNOTATION not in (
            meta.get("annotations") or {}
        )

    wait_for("the old finalizer and annotation removed", cleaned, timeout=60)
    wait_for("the old ModelDeployment Ready", lambda: ready(f, "legacy", NS), timeout=120)
    chart.assert_no_denials()


def test_deleting_model_deployments_needs_no_operator(chart: ChartOperator) -> None:
    """The leader stopped gracefully hands the Lease back; with no operator at all, ModelDeployments are
    deleted at once (no finalizer) and their children follow by owner references."""
    f = chart.f
    owned = {
        (name, ns): children(f, ns, name)
        for name, ns in (("deepseek-r1", NS), ("legacy", NS), ("llama-405b", CD_NS))
    }
    for key, objs in owned.items():
        assert objs, f"{key} has no children to delete"
    chart.stop()
    assert lease_holder(f) == "", "a gracefully stopped leader hands its Lease back"
    try:
        for name, ns in owned:
            out = kubectl(f, "delete", "mdep", name, "-n", ns, "--wait=true", "--timeout=30s", check=False)
            assert out.returncode == 0, out.stderr
        for name, ns in owned:

            def gone(name: str = name, ns: str = ns) -> bool:
                return not children(f, ns, name)

            wait_for(f"the children of {ns}/{name} deleted by the garbage collector", gone, timeout=120)
    finally:
        chart.start()
    # The Lease was handed back: the new process takes it at once, not after the Lease duration.
    wait_for("the restarted operator to lead", chart.leads, timeout=DURATION - RETRY)
    chart.assert_no_denials()


def test_a_killed_leader_is_replaced_within_the_lease_duration(chart: ChartOperator) -> None:
    """Two operator processes under the chart's ServiceAccount: SIGKILL the leader, and the standby takes
    the Lease once it has gone unrenewed for the Lease duration (plus one retry period)."""
    f = chart.f
    wait_for("the chart operator to lead", chart.leads, timeout=30)
    standby = ChartOperator(f, chart.tmpdir.parent, STANDBY, STANDBY_HEALTH, f"{POD_NAME}-standby")
    standby.kubeconfig = chart.kubeconfig
    try:
        standby.start()
        time.sleep(2 * RETRY)  # it has tried, and follows
        assert chart.leads()
        assert "tokenfab_leader 0.0" in standby.metrics()
        chart.kill()
        killed = time.monotonic()
        wait_for("the standby to take the Lease", standby.leads, timeout=DURATION + 3 * RETRY + 5)
        # The standby last saw a renewal at most one retry after the kill, and takes the Lease at its
        # first try once DURATION has passed since: at most DURATION + 2 x RETRY (and some slack for load).
        took = time.monotonic() - killed
        assert took <= DURATION + 2 * RETRY + 3, f"took {took:.1f} s"
        assert "tokenfab_leader 1.0" in standby.metrics()
        standby.assert_no_denials()
    finally:
        standby.stop()
        chart.start()
    wait_for("the chart operator to lead again", chart.leads, timeout=DURATION - RETRY)


# ------------------------------------------------------------------------------ watchNamespaces


def test_watch_namespaces_serves_only_those_namespaces(chart: ChartOperator) -> None:
    f = chart.f
    helm(
        f,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--reuse-values",
        "--set",
        f"watchNamespaces={{{SCOPED_NS}}}",
    )
    assert can_i(f, "create", "pods", f"-n={SCOPED_NS}")
    assert not can_i(f, "create", "pods", f"-n={NS}")
    assert not can_i(f, "patch", "modeldeployments.tokenfab.dev", f"-n={NS}")
    assert can_i(f, "list", "pods", "-A"), "placement still sees every GPU in use"
    chart.stop()
    chart.start()
    assert chart.argv[-2:] == ["--namespace", SCOPED_NS]
    small = example("aggregated-small.yaml", SCOPED_NS, autoscaling={"enabled": False})
    apply_yaml(f, small, "--server-side", "--field-manager=e2e")
    wait_for("llama-8b Ready in the watched namespace", lambda: ready(f, "llama-8b", SCOPED_NS), timeout=120)
    kubectl(f, "delete", "mdep", "llama-8b", "-n", SCOPED_NS, "--wait=true", "--timeout=60s")
    chart.assert_no_denials()
