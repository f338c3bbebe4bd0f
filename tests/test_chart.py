"""The Helm chart (charts/tokenfab): `helm lint` and `helm template` over every ci/ values file, the
rendered objects (restricted Pod Security, probes on kopf's health endpoint, leader-elected replicas with a
rolling update and a PodDisruptionBudget, least-privilege RBAC exactly as documented, the leader Lease's
Role in the release namespace only), bad values refused with a clear message, the CRDs identical to
crds/, the Grafana dashboard's queries (they parse and name real metrics) and the Argo CD health check
(run by Lua).

Needs Helm (TOKENFAB_BIN or ~/.cache/tokenfab/bin/current, built by e2e/lib/bootstrap.sh); the dashboard
and Argo CD tests also need `promtool` (Debian's prometheus) and `lua5.4`. Each is skipped, with the
reason, when its tool is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import tokenfab
from testing.cases import ROOT, spec_of
from testing.chart import (
    CHART,
    CI_VALUES,
    CLUSTER_RULES,
    LEADER_RULES,
    LEASE_NAMED_VERBS,
    NAMESPACED_RULES,
    POD_LOG_RULES,
    WATCH_NAMESPACES_RULES,
    helm,
    helm_binary,
    kubernetes_version,
    merged,
    rule_table,
    template,
    wildcards,
)
from tokenfab.adapters import telemetry
from tokenfab.adapters.metrics import KV_METRIC
from tokenfab.cli import app, render_crds
from tokenfab.leader import DURATION, LEASE_NAME, RETRY
from tokenfab.planning import builders, contract
from tokenfab.planning.status import CONDITION_TYPES

needs_helm = pytest.mark.skipif(
    helm_binary() is None,
    reason="helm not found in $TOKENFAB_BIN or ~/.cache/tokenfab/bin/current: run `bash e2e/up.sh` once",
)
DASHBOARD = CHART / "dashboards" / "tokenfab.json"
HEALTH_LUA = CHART / "argocd" / "modeldeployment-health.lua"
OPERATOR_SRC = ROOT / "operator" / "tokenfab"
RELEASE_NS = "tokenfab-system"  # tests.chart.template's default namespace
WORKER_LABELS = {contract.PROM_LABEL_DEPLOYMENT, contract.PROM_LABEL_ROLE, contract.PROM_LABEL_GROUP}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    ctrs = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(ctrs) == 1
    result: dict[str, Any] = ctrs[0]
    return result


def leader_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader")]
    return role


def env_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(docs)["env"]}


def ci_values(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "ci" / name).read_text()) or {}
    return data


# ------------------------------------------------------------------------------------------- lint


@needs_helm
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_helm_lint_strict(values: Path) -> None:
    out = helm("lint", str(CHART), "--strict", "--kube-version", kubernetes_version(), "-f", str(values))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


# --------------------------------------------------------------------------- what every file renders


@needs_helm
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_every_values_file_renders_restricted_leader_elected_replicas(values: Path) -> None:
    docs = template("-f", str(values))
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]
    # Two replicas elect a leader; an upgrade starts a Ready replacement before it stops a replica.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert "--leader-elect" in container(docs)["args"]
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is True
    for vol in pod["volumes"]:
        assert set(vol) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}, vol
    ctr = container(docs)
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctr["resources"]["requests"]["cpu"]
    assert ctr["resources"]["requests"]["memory"]
    assert ctr["resources"]["limits"]["memory"]

    # The probes ask kopf's health endpoint, on the port the operator is told to serve it on.
    assert ctr["command"] == ["python", "-m", "tokenfab.cli", "operator"]
    args = ctr["args"]
    liveness = args[args.index("--liveness") + 1]
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert ctr[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    if "--metrics-port" in args:
        assert int(args[args.index("--metrics-port") + 1]) == ports["metrics"]
        assert args[args.index("--metrics-addr") + 1] == "0.0.0.0"

    # The ServiceAccount the pod runs as is the one every binding names.
    sa = one(docs, "ServiceAccount")["metadata"]
    assert pod["serviceAccountName"] == sa["name"]
    for binding in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": "tokenfab-system"}
        ]
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        assert not wildcards(role), f"{role['kind']} {role['metadata']['name']}: {wildcards(role)}"


@needs_helm
def test_default_rbac_is_exactly_the_rules_the_operator_uses() -> None:
    docs = template()
    assert rule_table(one(docs, "ClusterRole")["rules"]) == merged(CLUSTER_RULES, NAMESPACED_RULES)
    assert [r["metadata"]["name"] for r in by_kind(docs, "Role")] == ["tokenfab-leader"]
    assert rule_table(leader_role(docs)["rules"]) == LEADER_RULES
    assert "--namespace" not in container(docs)["args"]


# -------------------------------------------------------------------------------- leader election


@needs_helm
@pytest.mark.parametrize("namespace", [RELEASE_NS, "ops"])
def test_the_leader_lease_is_granted_in_the_release_namespace_only(namespace: str) -> None:
    docs = template(namespace=namespace)
    role = leader_role(docs)
    assert role["metadata"]["namespace"] == namespace
    (binding,) = [
        other for other in by_kind(docs, "RoleBinding") if other["metadata"]["name"] == "tokenfab-leader"
    ]
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tokenfab", "namespace": namespace}]
    # The operator is told the same namespace, and names itself after its pod.
    env = env_of(docs)
    assert env["TOKENFAB_LEASE_NAMESPACE"]["value"] == namespace
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # get/update name the operator's Lease; create cannot name an object that does not exist yet.
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"], rule
        assert rule["resources"] == ["leases"], rule
        if set(rule["verbs"]) & LEASE_NAMED_VERBS:
            assert set(rule["verbs"]) <= LEASE_NAMED_VERBS, rule
            assert rule["resourceNames"] == [LEASE_NAME], rule
        else:
            assert rule["verbs"] == ["create"], rule
    # No cluster-wide Lease access (node heartbeats and other controllers' Leases are Leases too).
    for cluster_role in by_kind(docs, "ClusterRole"):
        assert ("coordination.k8s.io", "leases") not in rule_table(cluster_role["rules"])


@needs_helm
@pytest.mark.parametrize("namespace", [RELEASE_NS, "ops"])
def test_the_leader_lease_requests_have_the_api_servers_leader_election_priority(namespace: str) -> None:
    fs = one(template(namespace=namespace), "FlowSchema")
    assert fs["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    spec = fs["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert 200 < spec["matchingPrecedence"] < 1000  # after the API server's own, before service-accounts
    (rule,) = spec["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "tokenfab", "namespace": namespace}}
    ]
    (resources,) = rule["resourceRules"]
    assert (resources["apiGroups"], resources["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert resources["namespaces"] == [namespace]
    assert set(resources["verbs"]) == {"get", "create", "update"}


@needs_helm
def test_rbac_create_false_renders_no_rbac_object() -> None:
    docs = template("--set", "rbac.create=false")
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not by_kind(docs, kind), kind
    assert "--leader-elect" in container(docs)["args"]


@needs_helm
@pytest.mark.parametrize(
    ("sets", "budget"),
    [
        ([], True),
        (["replicaCount=3"], True),
        (["replicaCount=1"], False),
        (["replicaCount=0"], False),
        (["podDisruptionBudget.enabled=false"], False),
    ],
    ids=["default", "3 replicas", "1 replica", "paused", "disabled"],
)
def test_pod_disruption_budget_only_with_two_or_more_replicas(sets: list[str], budget: bool) -> None:
    docs = template(*[a for s in sets for a in ("--set", s)])
    assert "--leader-elect" in container(docs)["args"]
    if not budget:
        assert not by_kind(docs, "PodDisruptionBudget")
        return
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["namespace"] == RELEASE_NS
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    deploy = one(docs, "Deployment")["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["selector"]["matchLabels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= deploy["template"]["metadata"]["labels"].items()


@needs_helm
def test_the_operator_accepts_every_argument_and_reads_every_variable_the_chart_sets() -> None:
    """The chart's flags are the operator command's options, and each TOKENFAB_* variable is read."""
    help_text = CliRunner().invoke(app, ["operator", "--help"], terminal_width=200).output
    source = "\n".join(p.read_text() for p in OPERATOR_SRC.rglob("*.py"))
    for values in ([], ["-f", str(CHART / "ci" / "namespaced-values.yaml")], ["--set", "logLevel=debug"]):
        docs = template(*values)
        for arg in container(docs)["args"]:
            if arg.startswith("--"):
                assert arg in help_text, f"the operator has no option {arg}"
        for name in env_of(docs):
            if name.startswith("TOKENFAB_") or name == "POD_NAME":
                assert re.search(rf"[\"']{name}[\"']", source), f"the operator does not read {name}"


@needs_helm
def test_the_rdma_resource_value_reaches_the_operators_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """operator.rdmaResource (what a pod of a unit that spans NVLink domains asks for) is the variable the
    operator reads into its settings; the default is NVIDIA Network Operator's shared device's name."""
    from tokenfab.handlers import options_from_env

    efa = ["--set", "operator.rdmaResource=vpc.amazonaws.com/efa"]
    for sets, expected in (([], "rdma/rdma_shared_device_a"), (efa, "vpc.amazonaws.com/efa")):
        value = env_of(template(*sets))["TOKENFAB_RDMA_RESOURCE"]["value"]
        assert value == expected
        monkeypatch.setenv("TOKENFAB_RDMA_RESOURCE", value)
        assert options_from_env().settings.rdma_resource == expected


def test_values_document_the_failover_time() -> None:
    """values.yaml and the chart README say how long a lost leader takes to replace: the Lease duration
    plus one retry period of tokenfab.leader."""
    for path in (CHART / "values.yaml", CHART / "README.md"):
        text = path.read_text()
        assert f"{DURATION} s" in text, path
        assert f"{RETRY} s" in text, path


@needs_helm
def test_watch_namespaces_grants_writes_only_there() -> None:
    docs = template("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    namespaces = ci_values("namespaced-values.yaml")["watchNamespaces"]
    assert rule_table(one(docs, "ClusterRole")["rules"]) == merged(CLUSTER_RULES, WATCH_NAMESPACES_RULES)
    roles = [r for r in by_kind(docs, "Role") if r is not leader_role(docs)]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    for role in roles:
        assert rule_table(role["rules"]) == NAMESPACED_RULES
    assert rule_table(leader_role(docs)["rules"]) == LEADER_RULES
    assert leader_role(docs)["metadata"]["namespace"] == RELEASE_NS
    bindings = {
        other["metadata"]["namespace"]: other
        for other in by_kind(docs, "RoleBinding")
        if not other["metadata"]["name"].endswith("-leader")
    }
    assert sorted(bindings) == sorted(namespaces)
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role"
    args = container(docs)["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == namespaces
    assert one(docs, "Deployment")["metadata"]["name"] == "tokenfab-operator"


def _readme_rbac_rows() -> dict[tuple[str, str], set[str]]:
    """The RBAC tables of the chart's README as (group, resource) -> verbs."""
    section = (CHART / "README.md").read_text().split("## RBAC", 1)[1].split("\n## ", 1)[0]
    rows: dict[tuple[str, str], set[str]] = {}
    for line in section.splitlines():
        cells = [cond.strip().strip("`") for cond in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("API group", "") or set(cells[0]) <= {"-"}:
            continue
        group = "" if cells[0] == "core" else cells[0]
        rows.setdefault((group, cells[1]), set()).update(v.strip() for v in cells[2].split(","))
    return rows


def test_readme_documents_every_rbac_rule() -> None:
    assert _readme_rbac_rows() == merged(
        CLUSTER_RULES, NAMESPACED_RULES, WATCH_NAMESPACES_RULES, LEADER_RULES, POD_LOG_RULES
    )


@needs_helm
def test_reading_pod_logs_is_granted_only_when_asked_for() -> None:
    docs = template("--set", "rbac.readPodLogs=true")
    assert rule_table(one(docs, "ClusterRole")["rules"]) == merged(
        CLUSTER_RULES, NAMESPACED_RULES, POD_LOG_RULES
    )
    scoped = template("--set", "rbac.readPodLogs=true", "--set", "watchNamespaces={a,b}")
    for role in [r for r in by_kind(scoped, "Role") if r["metadata"]["name"] != "tokenfab-leader"]:
        assert ("", "pods/log") in rule_table(role["rules"]), role["metadata"]["name"]
    assert ("", "pods/log") not in rule_table(one(template(), "ClusterRole")["rules"])


# ----------------------------------------------------------------------------------- observability


@needs_helm
def test_service_monitor_scrapes_the_metrics_service() -> None:
    values = ci_values("servicemonitor-values.yaml")
    docs = template("-f", str(CHART / "ci" / "servicemonitor-values.yaml"))
    assert not by_kind(docs, "PodMonitor")
    mon, svc = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    assert values["serviceMonitor"]["labels"].items() <= mon["metadata"]["labels"].items()
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["tokenfab-system"]}
    (endpoint,) = mon["spec"]["endpoints"]
    assert endpoint["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["interval"] == values["serviceMonitor"]["interval"]
    assert (
        svc["spec"]["selector"].items()
        <= one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


@needs_helm
def test_pod_monitor_scrapes_the_pod_without_a_service() -> None:
    docs = template("-f", str(CHART / "ci" / "podmonitor-values.yaml"))
    assert not by_kind(docs, "ServiceMonitor")
    assert not by_kind(docs, "Service")
    mon = one(docs, "PodMonitor")
    assert mon["metadata"]["namespace"] == "monitoring"
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["tokenfab-system"]}
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert mon["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    args = container(docs)["args"]
    assert args[args.index("--metrics-port") + 1] == "9100"


@needs_helm
def test_the_workload_pod_monitor_scrapes_workers_and_frontends_as_the_documented_scrape_config() -> None:
    """Rendered only where the Prometheus Operator serves PodMonitor; the same ports and the same
    tokenfab_dev_* labels as prometheus/scrape-config.yaml (the factory's Prometheus runs that one), and
    it selects the pods the builders make."""
    assert not by_kind(template(), "PodMonitor"), "no PodMonitor kind: nothing rendered"
    docs = template("--api-versions", "monitoring.coreos.com/v1/PodMonitor")
    (mon,) = [d for d in by_kind(docs, "PodMonitor") if d["metadata"]["name"] == "tokenfab-workloads"]
    assert mon["spec"]["namespaceSelector"] == {"any": True}
    job = yaml.safe_load((CHART / "prometheus" / "scrape-config.yaml").read_text())[0]
    labelmaps = [r for r in job["relabel_configs"] if r.get("action") == "labelmap"]
    keep = next(r for r in job["relabel_configs"] if "container_port_name" in str(r.get("source_labels")))
    ports = {p["port"] for p in mon["spec"]["podMetricsEndpoints"]}
    assert keep["regex"] == "worker;metrics|frontend;http"
    assert ports == {"metrics", "http"}
    for endpoint in mon["spec"]["podMetricsEndpoints"]:
        assert [{"action": "labelmap", "regex": r["regex"]} for r in labelmaps] == endpoint["relabelings"]
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    own = builders.Owner("ds", "ml", "uid")
    worker = builders.group_pods(own, spec, builders.GroupAt("decode", 0, "d", "rev"))[0]
    frontend = builders.frontend_deployment(own, spec)["spec"]["template"]
    for pod, port in ((worker, "metrics"), (frontend, "http")):
        labels = pod["metadata"]["labels"]
        assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert (
            labels["app.kubernetes.io/component"] in mon["spec"]["selector"]["matchExpressions"][0]["values"]
        )
        assert port in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    scoped = template(
        "--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--set", "watchNamespaces={a,b}"
    )
    (mon,) = [d for d in by_kind(scoped, "PodMonitor") if d["metadata"]["name"] == "tokenfab-workloads"]
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}


@needs_helm
def test_dashboard_config_map_carries_the_dashboard_for_grafana() -> None:
    assert not [d for d in template() if d["kind"] == "ConfigMap"], "the dashboard is off by default"
    docs = template("-f", str(CHART / "ci" / "servicemonitor-values.yaml"))
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "AI factory"}
    assert json.loads(cm["data"]["tokenfab.json"]) == json.loads(DASHBOARD.read_text())


@needs_helm
def test_metrics_can_be_turned_off() -> None:
    docs = template("--set", "metrics.enabled=false")
    assert not by_kind(docs, "Service")
    assert "--metrics-port" not in container(docs)["args"]
    assert [p["name"] for p in container(docs)["ports"]] == ["health"]


# ---------------------------------------------------------------------------------- custom values


@needs_helm
def test_custom_values_reach_the_pod() -> None:
    values = ci_values("custom-resources-values.yaml")
    docs = template("-f", str(CHART / "ci" / "custom-resources-values.yaml"))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    ctr = container(docs)
    assert ctr["image"] == f"{values['image']['repository']}@{values['image']['digest']}"
    assert ctr["imagePullPolicy"] == "Always"
    assert ctr["resources"] == values["resources"]
    assert "--verbose" in ctr["args"]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["TZ"] == "UTC"
    assert env["TOKENFAB_RESYNC_SECONDS"] == "30"
    assert env["TOKENFAB_INVENTORY_SECONDS"] == "20"
    assert env["TOKENFAB_BURST_WATCH_SECONDS"] == "0"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"] == values["podAnnotations"]


@needs_helm
def test_default_image_is_the_app_version_and_replicas_zero_pauses() -> None:
    assert container(template())["image"] == "ghcr.io/tokenfab/operator:0.1.0"
    assert container(template("--set", "image.tag=0.1.1-rc1"))["image"].endswith(":0.1.1-rc1")
    assert one(template("--set", "replicaCount=0"), "Deployment")["spec"]["replicas"] == 0


def test_default_user_is_the_operator_images_user() -> None:
    dockerfile = ROOT / "runtime-images" / "operator" / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip(f"{dockerfile} not there")
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile.read_text(), re.M)
    assert users, f"{dockerfile} has no numeric USER"
    uid, gid = users[-1]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert values["runAsUser"] == int(uid)
    if gid:
        assert values["runAsGroup"] == int(gid)


def test_chart_version_follows_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == tokenfab.__version__
    assert chart["version"] == tokenfab.__version__


# ------------------------------------------------------------------------------------- bad values

BAD_VALUES = [
    (["replicaCount=6"], "at '/replicaCount': maximum: got 6, want 5"),
    (["replicaCount=-1"], "at '/replicaCount': minimum: got -1, want 0"),
    (["podDisruptionBudget.enabled=yes"], "at '/podDisruptionBudget/enabled': got string, want boolean"),
    (
        ["podDisruptionBudget.minAvailable=2"],
        "at '/podDisruptionBudget': additional properties 'minAvailable' not allowed",
    ),
    (["operator.gang=always"], "at '/operator/gang': value must be one of 'auto', 'podgroup', 'gates'"),
    (["operator.workers=0"], "at '/operator/workers': minimum: got 0, want 1"),
    (["metrics.port=abc"], "at '/metrics/port': got string, want integer"),
    (["health.port=70000"], "at '/health/port': maximum: got 70,000, want 65,535"),
    (["logLevel=trace"], "at '/logLevel': value must be one of 'info', 'debug'"),
    (["replicas=2"], "additional properties 'replicas' not allowed"),
    (["resources.limits.memory=lots"], "at '/resources/limits/memory'"),
    (["watchNamespaces={Bad_NS}"], "at '/watchNamespaces/0': 'Bad_NS' does not match pattern"),
    (["image.digest=sha256:xyz"], "at '/image/digest'"),
    (["image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
    (["serviceMonitor.interval=1 minute"], "at '/serviceMonitor/interval'"),
    (["podSecurityContext.runAsUser=0"], "at '/podSecurityContext/runAsUser': minimum: got 0, want 1"),
    (["command=null"], "at '': missing property 'command'"),
    (
        ["serviceMonitor.enabled=true", "podMonitor.enabled=true"],
        "Prometheus would scrape the operator twice; enable one of them",
    ),
    (["health.port=9090"], "metrics.port and health.port are both 9090"),
    (["serviceMonitor.enabled=true", "metrics.enabled=false"], "set metrics.enabled to true"),
    (
        ["serviceMonitor.enabled=true", "metrics.service.enabled=false"],
        "set metrics.service.enabled to true (or use podMonitor)",
    ),
]


@needs_helm
@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[",".join(sets) for sets, _ in BAD_VALUES])
def test_bad_values_are_refused_with_a_clear_message(sets: list[str], message: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    out = helm("template", "t", str(CHART), "--kube-version", kubernetes_version(), *args)
    assert out.returncode != 0, f"{sets} rendered"
    assert message in out.stderr, out.stderr


# ------------------------------------------------------------------------------------------- CRDs


def test_chart_crds_are_the_generated_crds() -> None:
    rendered = render_crds()
    chart_crds = CHART / "crds"
    assert sorted(p.name for p in chart_crds.iterdir()) == sorted(rendered)
    for name, text in rendered.items():
        assert (chart_crds / name).read_text() == text, f"{chart_crds / name} is stale: run `tokenfab crds`"
        assert (chart_crds / name).read_text() == (ROOT / "crds" / name).read_text()


def test_crds_command_writes_and_checks_both_copies(tmp_path: Path) -> None:
    runner = CliRunner()
    out, chart = tmp_path / "crds", tmp_path / "chart-crds"
    dirs = ["--out", str(out), "--chart-out", str(chart)]
    assert runner.invoke(app, ["crds", *dirs]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in chart.iterdir())
    assert runner.invoke(app, ["crds", "--check", *dirs]).exit_code == 0
    stale = chart / "tokenfab.dev_nvlinkdomains.yaml"
    stale.write_text(stale.read_text() + "# edited\n")
    result = runner.invoke(app, ["crds", "--check", *dirs])
    assert result.exit_code == 1
    assert str(stale) in result.output
    assert str(out / "tokenfab.dev_nvlinkdomains.yaml") not in result.output


# -------------------------------------------------------------------------------------- dashboard


def _dashboard_exprs() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels if p["type"] != "row"}


def _concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables filled in, as Prometheus would see it."""
    return expr.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$deployment", ".*")


def test_dashboard_has_the_panels_operators_need() -> None:
    exprs = _dashboard_exprs()
    joined = {title: " ".join(e) for title, e in exprs.items()}

    def panel_with(*needles: str) -> str:
        hits = [t for t, e in joined.items() if all(n in e for n in needles)]
        assert hits, f"no panel queries {needles}"
        return hits[0]

    panel_with("tokenfab_domain_gpus", "tokenfab_domain_free_gpus")  # GPUs per domain
    panel_with("tokenfab_groups_ready", "tokenfab_groups_desired")  # groups per role
    panel_with(KV_METRIC, "tokenfab_autoscaler_target")  # KV utilization vs target
    panel_with("tokenfab_autoscaling_decisions_total")  # decisions
    panel_with('result="error"')  # errors
    panel_with("tokenfab_reconcile_duration_seconds_bucket")  # durations
    panel_with("tokenfab_placement_failures_total")  # placement failures
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "deployment"} <= variables
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_names_only_real_metrics_and_labels() -> None:
    names: dict[str, Any] = telemetry.REGISTRY._names_to_collectors  # sample name -> collector
    for title, exprs in _dashboard_exprs().items():
        for expr in exprs:
            for metric in re.findall(r"\btokenfab_[a-z_]+\b", expr):
                if metric.startswith("tokenfab_dev_"):  # a worker pod's label, as Prometheus names it
                    assert metric in WORKER_LABELS, f"{title}: {metric} is not a worker pod label"
                    continue
                assert metric in names, f"{title}: {metric} is not an operator metric"
            for metric, selector in re.findall(r"\b(tokenfab_[a-z_]+)\{([^}]*)\}", expr):
                labels = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", selector))
                known = set(names[metric]._labelnames)
                assert labels <= known, f"{title}: {metric} has no label {labels - known}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) not installed")
def test_dashboard_queries_parse(tmp_path: Path) -> None:
    rules = [
        {"record": f"tokenfab:dashboard:{i}", "expr": _concrete(expr)}
        for i, expr in enumerate(e for exprs in _dashboard_exprs().values() for e in exprs)
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# -------------------------------------------------------------------------------- Argo CD health


def _lua(value: Any) -> str:
    """A Python value as a Lua literal (how Argo CD hands the object to the script)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {_lua(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(_lua(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nil"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _health(obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    driver = tmp_path / "driver.lua"
    driver.write_text(
        f"obj = {_lua(obj)}\n"
        f"local hs = dofile({json.dumps(str(HEALTH_LUA))})\n"
        'io.write(hs.status, "\\n", hs.message or "", "\\n")\n'
    )
    lua = shutil.which("lua5.4")
    assert lua
    out = subprocess.run([lua, str(driver)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    status, message = out.stdout.split("\n", 1)
    return status, message.strip()


def _cond(type_: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    assert type_ in CONDITION_TYPES
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message}


def _md(generation: int = 2, observed: int | None = 2, *conds: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "tokenfab.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "deepseek-r1", "namespace": "ds", "generation": generation},
    }
    if observed is not None or conds:
        obj["status"] = {"conditions": list(conds)}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


READY = _cond("Ready", True, "AllGroupsReady", "ready groups: decode 2/2, prefill 2/2")
STABLE = _cond("Progressing", False, "Stable", "nothing to do")
NOT_DEGRADED = _cond("Degraded", False, "AsExpected", "no failed groups")
PLACED = _cond("Placed", True, "AllGroupsPlaced", "every group sits whole inside one NVLink domain")
HEALTH_CASES = [
    ("no status yet", _md(1, None), "Progressing", "Waiting for the tokenfab operator to report status"),
    ("all ready", _md(2, 2, READY, STABLE, NOT_DEGRADED, PLACED), "Healthy", "AllGroupsReady: ready groups"),
    (
        "spec not observed yet",
        _md(3, 2, READY, STABLE, NOT_DEGRADED, PLACED),
        "Progressing",
        "observe generation 3",
    ),
    (
        "groups starting",
        _md(
            1,
            1,
            _cond("Ready", False, "GroupsNotReady", "ready groups: decode 1/2"),
            _cond("Progressing", True, "Scaling", "1 group(s) creating"),
            NOT_DEGRADED,
            PLACED,
        ),
        "Progressing",
        "GroupsNotReady: ready groups: decode 1/2",
    ),
    (
        "a group failed",
        _md(
            1,
            1,
            _cond("Ready", False, "GroupsNotReady", "ready groups: decode 1/2"),
            _cond("Progressing", True, "Recovering", "recreating 1 broken group(s)"),
            _cond("Degraded", True, "GroupFailed", "ds-decode-0: pod failed"),
            PLACED,
        ),
        "Degraded",
        "GroupFailed: ds-decode-0: pod failed",
    ),
    (
        "no ComputeDomain support",
        _md(
            1,
            1,
            _cond("Ready", False, "GroupsNotReady", "ready groups: worker 0/2"),
            STABLE,
            NOT_DEGRADED,
            _cond("Placed", False, "ComputeDomainUnavailable", "worker groups need an NVIDIA ComputeDomain"),
        ),
        "Degraded",
        "ComputeDomainUnavailable: worker groups need an NVIDIA ComputeDomain",
    ),
    (
        "rollout blocked while old groups serve",
        _md(4, 4, READY, STABLE, NOT_DEGRADED, _cond("Placed", False, "RolloutBlocked", "new revision")),
        "Degraded",
        "RolloutBlocked: new revision",
    ),
]


@pytest.mark.skipif(shutil.which("lua5.4") is None, reason="lua5.4 not installed (apt-get install lua5.4)")
@pytest.mark.parametrize(
    ("obj", "status", "message"), [case[1:] for case in HEALTH_CASES], ids=[case[0] for case in HEALTH_CASES]
)
def test_argocd_health_check(obj: dict[str, Any], status: str, message: str, tmp_path: Path) -> None:
    got_status, got_message = _health(obj, tmp_path)
    assert got_status == status
    assert message in got_message


def test_argocd_health_check_is_plain_lua_5_1() -> None:
    """Argo CD runs gopher-lua (Lua 5.1): nothing newer, and no library that its sandbox lacks."""
    code = "\n".join(line.split("--", 1)[0] for line in HEALTH_LUA.read_text().splitlines())
    for construct in ("goto", "//", "<const>", "<close>", "os.", "io.", "require"):
        assert construct not in code, construct
