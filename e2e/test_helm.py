"""The Helm chart on the local AI factory: `helm install` into a namespace that enforces the restricted Pod
Security Standard, then the operator run as a process with the chart Deployment's own arguments and
environment and a token of the chart's ServiceAccount, so it has exactly the chart's RBAC and nothing
more. DeepSeek-R1 must become Ready, scale down, get ComputeDomains, keep the NVLinkDomain inventory and
be deleted with no permission error in the operator's log; `kubectl auth can-i` shows what the
ServiceAccount cannot do; `helm install` refuses bad values.

The factory cannot run images, so the chart's operator pod only exists (kwok marks it Running); the
session's admin operator is stopped for this module, so two operators never act at once, and started
again afterwards if it was running.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import E2E_PORT_BASE, LIVENESS, operator_healthy
from e2e.helpers import apply_yaml, condition, get_json, kubectl, start_operator, wait_for
from tests.cases import load_example
from tests.chart import CHART, wildcards
from tokenfab.planning import contract as c
from tokenfab_factory.factory import Factory

RELEASE = "tokenfab"
SYSTEM_NS = "tokenfab-system"
SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"  # the release's full name is the chart's name
NS = "helm-ds"  # DeepSeek-R1 under the chart's RBAC
CD_NS = "helm-cd"  # ComputeDomains
SCOPED_NS = "helm-scoped"  # watchNamespaces
PROC = "operator-helm"
HEALTH = E2E_PORT_BASE + 30  # the admin operator uses LIVENESS (base + 20) and LIVENESS + 1
DENIAL = re.compile(r"forbidden|not enough permissions|unauthorized", re.I)
COMPUTE_DOMAIN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "computedomains.resource.nvidia.com"},
    "spec": {
        "group": "resource.nvidia.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ComputeDomain",
            "plural": "computedomains",
            "singular": "computedomain",
            "listKind": "ComputeDomainList",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


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

    def __init__(self, f: Factory, tmp: Path) -> None:
        self.f = f
        self.kubeconfig = tmp / "tokenfab-sa.kubeconfig"
        # The kubernetes client caches API discovery in $TMPDIR per server URL, shared by every process
        # and run: a private TMPDIR keeps this module's stand-in ComputeDomain CRD out of other operators'
        # caches (the pod gets its own emptyDir /tmp).
        self.tmpdir = tmp / "operator-tmp"
        self.tmpdir.mkdir()
        self.log = f.log(PROC)
        self.offset = 0
        self.started = 0.0
        self.argv: list[str] = []

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
            "--liveness": f"http://127.0.0.1:{HEALTH}/healthz",
            "--metrics-port": str(HEALTH + 1),
            "--metrics-addr": "127.0.0.1",
        }
        for flag, value in local.items():
            if flag in args:
                args[args.index(flag) + 1] = value
        env = {e["name"]: e["value"] for e in ctr.get("env") or [] if "value" in e}
        command = list(ctr["command"])
        if command[0] == "python":  # the image's Python is this virtualenv's
            command[0] = sys.executable
        return [*command, *args], env

    def start(self) -> None:
        argv, env = self.chart_command()
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        self.started = time.time()
        self.argv = argv
        self.f.start_extra(
            PROC, argv, env={**env, "KUBECONFIG": str(self.kubeconfig), "TMPDIR": str(self.tmpdir)}
        )
        wait_for("the chart operator's health endpoint", self.healthy, timeout=90)

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.f.stop_extra(PROC)

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
    op = ChartOperator(f, tmp_path_factory.mktemp("helm"))
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
        op.stop()
        # Whatever a failed test left: kopf's finalizer would hold it until some operator serves it again.
        for ns in (NS, CD_NS, SCOPED_NS):
            names = kubectl(f, "get", "mdep", "-n", ns, "-o", "name", check=False).stdout.split()
            for name in names:
                unfinalize = '{"metadata":{"finalizers":null}}'
                kubectl(f, "patch", name, "-n", ns, "--type=merge", "-p", unfinalize, check=False)
                kubectl(f, "delete", name, "-n", ns, "--wait=false", check=False)
        helm(f, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout=60s", check=False)
        kubectl(f, "delete", "crd", COMPUTE_DOMAIN_CRD["metadata"]["name"], "--ignore-not-found", check=False)
        for ns in (NS, CD_NS, SCOPED_NS, SYSTEM_NS):
            kubectl(f, "delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        if admin_was_running:
            start_operator(f, LIVENESS)
            wait_for("the admin operator's health endpoint", operator_healthy, timeout=60)


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
    sel = f"{c.LABEL_DEPLOYMENT}={owner},{c.COMPONENT}=worker"
    return {p["metadata"]["labels"][c.LABEL_GROUP] for p in get_json(f, "pods", "-n", ns, "-l", sel)["items"]}


def compute_domains(f: Factory, ns: str) -> set[str]:
    return {d["metadata"]["labels"][c.LABEL_GROUP] for d in get_json(f, "computedomains", "-n", ns)["items"]}


# ------------------------------------------------------------------------------------ the install


def test_chart_objects_pass_restricted_pod_security(chart: ChartOperator) -> None:
    f = chart.f
    deploy = get_json(f, "deployment", RELEASE, "-n", SYSTEM_NS)
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    assert deploy["spec"]["replicas"] == 1
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
        "the chart's operator pod to be admitted",
        lambda: get_json(f, "pods", "-n", SYSTEM_NS, "-l", selector)["items"],
        timeout=60,
    )
    rs_conditions = [
        cond
        for rs in get_json(f, "replicasets", "-n", SYSTEM_NS, "-l", selector)["items"]
        for cond in (rs.get("status") or {}).get("conditions") or []
    ]
    assert not [cond for cond in rs_conditions if cond["type"] == "ReplicaFailure"], rs_conditions
    # The ClusterRole as installed has no wildcard anywhere.
    role = get_json(f, "clusterrole", RELEASE)
    assert role["rules"]
    assert not wildcards(role), wildcards(role)


def test_the_operator_runs_as_the_service_account_not_as_admin(chart: ChartOperator) -> None:
    f = chart.f
    base = [str(f.config.bin_dir / "kubectl"), f"--kubeconfig={chart.kubeconfig}"]
    who = subprocess.run([*base, "auth", "whoami", "-o", "json"], capture_output=True, text=True, check=True)
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == SA
    everything = subprocess.run([*base, "auth", "can-i", "*", "*"], capture_output=True, text=True)
    assert everything.stdout.strip() == "no"
    assert chart.argv[3:5] == ["operator", "--liveness"], chart.argv
    assert "--namespace" not in chart.argv, "the default install serves every namespace"


FORBIDDEN = [
    ("get", "secrets", "-A"),
    ("list", "secrets", f"-n={SYSTEM_NS}"),
    ("get", "configmaps", "-n=kube-system"),
    ("list", "configmaps", "-A"),
    ("delete", "nodes"),
    ("patch", "nodes"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io", f"-n={NS}"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "pods", f"-n={NS}", "--subresource=exec"),
    ("create", "pods", f"-n={NS}", "--subresource=attach"),
    ("create", "pods", f"-n={NS}", "--subresource=portforward"),
    ("get", "pods", f"-n={NS}", "--subresource=log"),
    ("delete", "pods", f"-n={NS}"),
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
]
ALLOWED = [
    ("create", "pods", f"-n={NS}"),
    ("deletecollection", "pods", f"-n={NS}"),
    ("list", "nodes"),
    ("patch", "modeldeployments.tokenfab.dev", f"-n={NS}", "--subresource=status"),
    ("patch", "nvlinkdomains.tokenfab.dev", "--subresource=status"),
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
        (["replicaCount=2"], "at '/replicaCount': maximum: got 2, want 1"),
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
    # kopf patched its annotation (patch modeldeployments); the operator posted Events (create events).
    assert f"{c.DOMAIN}/last-handled" in obj["metadata"]["annotations"]
    events = get_json(f, "events", "-n", NS, "--field-selector", "involvedObject.name=deepseek-r1")["items"]
    ours = [e for e in events if e["source"].get("component") == "tokenfab-operator"]
    assert "AllGroupsReady" in {e["reason"] for e in ours}
    # Services, the frontend Deployment and the engine ConfigMaps were applied.
    assert get_json(f, "configmap", "deepseek-r1-decode-engine", "-n", NS)
    assert len(get_json(f, "services", "-n", NS, "-l", f"{c.LABEL_DEPLOYMENT}=deepseek-r1")["items"]) == 2
    # The chart's metrics flags work.
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{HEALTH + 1}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert f'tokenfab_groups_ready{{deployment="deepseek-r1",namespace="{NS}",role="decode"}} 2.0' in metrics
    chart.assert_no_denials()


def test_nvlink_domain_inventory_under_the_chart_rbac(chart: ChartOperator) -> None:
    f = chart.f
    apply_yaml(
        f,
        {
            "apiVersion": "tokenfab.dev/v1alpha1",
            "kind": "NVLinkDomain",
            "metadata": {"name": "helm-e2e-stale", "labels": {c.MANAGED_BY: c.MANAGED_BY_VALUE}},
        },
    )

    def stale_gone() -> bool:
        return "helm-e2e-stale" not in {d["metadata"]["name"] for d in get_json(f, "nvlinkdomains")["items"]}

    wait_for("the stale NVLinkDomain deleted by the operator", stale_gone, timeout=30)

    def refreshed() -> bool:
        items = get_json(f, "nvlinkdomains")["items"]
        stamps = [
            datetime.fromisoformat(d["status"]["updated"].replace("Z", "+00:00")).timestamp()
            for d in items
            if d.get("status", {}).get("updated")
        ]
        return len(stamps) == 4 and min(stamps) >= chart.started - 1

    wait_for("every NVLinkDomain refreshed by the chart's operator", refreshed, timeout=30)
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
    """A stand-in for NVIDIA's ComputeDomain CRD: the operator creates one per multi-node group and
    deletes it with its group (the pods stay Pending: nothing here allocates IMEX channels)."""
    f = chart.f
    apply_yaml(f, COMPUTE_DOMAIN_CRD, "--server-side")
    kubectl(
        f, "wait", "--for=condition=Established", "crd/computedomains.resource.nvidia.com", "--timeout=60s"
    )
    apply_yaml(f, example("llama-405b-multinode-tp.yaml", CD_NS), "--server-side", "--field-manager=e2e")

    def one_per_group(n: int) -> bool:
        domains = compute_domains(f, CD_NS)
        return len(domains) == n and domains == worker_groups(f, CD_NS, "llama-405b")

    wait_for("a ComputeDomain per llama-405b worker group", lambda: one_per_group(2), timeout=90)
    patch = '{"spec":{"worker":{"replicas":1}}}'
    kubectl(f, "patch", "mdep", "llama-405b", "-n", CD_NS, "--type=merge", "-p", patch)
    wait_for("the surplus group's ComputeDomain deleted with it", lambda: one_per_group(1), timeout=90)
    chart.assert_no_denials()


def test_deleting_model_deployments_under_the_chart_rbac(chart: ChartOperator) -> None:
    f = chart.f
    for name, ns in (("deepseek-r1", NS), ("llama-405b", CD_NS)):
        out = kubectl(f, "delete", "mdep", name, "-n", ns, "--wait=true", "--timeout=60s", check=False)
        assert out.returncode == 0, out.stderr
    chart.assert_no_denials()


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
