"""Shared by the chart's unit tests and its end-to-end test: where the chart and Helm are, rendering, and
the RBAC rules the operator needs (each one justified in charts/tokenfab/README.md)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testing.cases import ROOT

CHART = ROOT / "charts" / "tokenfab"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


def kubernetes_version() -> str:
    """The factory's Kubernetes version (e2e/toolchain/versions.env), for `helm template --kube-version`."""
    text = (ROOT / "e2e" / "toolchain" / "versions.env").read_text()
    match = re.search(r"^KUBERNETES_VERSION=v?(\S+)$", text, re.M)
    assert match, "KUBERNETES_VERSION missing from e2e/toolchain/versions.env"
    return match.group(1)


def helm_binary() -> Path | None:
    """Helm from TOKENFAB_BIN (set by e2e/lib/bootstrap.sh) or the factory's cache, if it is there."""
    candidates = []
    if os.environ.get("TOKENFAB_BIN"):
        candidates.append(Path(os.environ["TOKENFAB_BIN"]) / "helm")
    candidates.append(Path.home() / ".cache" / "tokenfab" / "bin" / "current" / "helm")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def helm(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    assert binary is not None, "helm not found"
    return subprocess.run([str(binary), *args], capture_output=True, text=True, check=check, timeout=120)


def template(
    *args: str, release: str = "tokenfab", namespace: str = "tokenfab-system"
) -> list[dict[str, Any]]:
    """`helm template` of the chart with extra arguments (-f, --set): the rendered objects."""
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        kubernetes_version(),
        *args,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# (API group, resource) -> verbs. Cluster-wide rules are always in the ClusterRole; the namespaced ones
# are in the ClusterRole when the operator serves every namespace, else in a Role per namespace; the
# leader Lease's are in a Role of the release namespace.
CLUSTER_RULES: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("resource.k8s.io", "devicetaintrules"): {"list", "watch"},
    ("", "pods"): {"list", "watch"},
    ("tokenfab.dev", "nvlinkdomains"): {"list", "create", "patch", "delete"},
    ("tokenfab.dev", "nvlinkdomains/status"): {"patch"},
    ("", "namespaces"): {"get"},
}
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    ("tokenfab.dev", "modeldeployments"): {"list", "watch", "patch"},
    ("tokenfab.dev", "modeldeployments/status"): {"patch"},
    ("", "pods"): {"create", "patch", "delete", "deletecollection"},
    ("", "services"): {"list", "watch", "create", "patch"},
    ("", "configmaps"): {"list", "watch", "create", "patch", "delete"},
    ("apps", "deployments"): {"list", "watch", "create", "patch"},
    ("", "events"): {"create"},
    ("", "pods/status"): {"patch"},
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},
    ("scheduling.k8s.io", "podgroups"): {"create", "patch", "delete"},
    ("resource.nvidia.com", "computedomains"): {"list", "watch", "create", "patch", "delete"},
    ("resource.k8s.io", "resourceclaimtemplates"): {"get", "list", "watch"},
    ("", "serviceaccounts"): {"list", "watch", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get", "list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"list", "watch", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"list", "watch", "create", "patch", "delete"},
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
    ("nvidia.com", "dynamoworkermetadatas"): {"get", "list", "watch", "create", "patch"},
}
WATCH_NAMESPACES_RULES: dict[tuple[str, str], set[str]] = {("", "namespaces"): {"list", "watch"}}
# Granted only when asked for (rbac.readPodLogs=true): the launcher's lines in the pods' logs.
POD_LOG_RULES: dict[tuple[str, str], set[str]] = {("", "pods/log"): {"get"}}
LEADER_RULES: dict[tuple[str, str], set[str]] = {
    ("coordination.k8s.io", "leases"): {"get", "update", "create"}
}
# The verbs on the Lease that only its own name needs (`create` cannot name the object it creates).
LEASE_NAMED_VERBS = {"get", "update"}


def merged(*tables: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for table in tables:
        for key, verbs in table.items():
            out.setdefault(key, set()).update(verbs)
    return out


def rule_table(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """RBAC rules as (group, resource) -> verbs."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                out.setdefault((group, resource), set()).update(rule.get("verbs") or [])
    return out


def wildcards(obj: Any) -> list[str]:
    """Paths of every "*" in an RBAC object's rules (none is allowed)."""
    found = []
    for i, rule in enumerate(obj.get("rules") or []):
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            found += [f"rules[{i}].{key}" for value in rule.get(key) or [] if "*" in value]
    return found
