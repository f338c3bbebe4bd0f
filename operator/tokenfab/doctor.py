"""`tokenfab doctor`: a preflight of a cluster for tokenfab, each check with pass, warn or fail and the fix.

What a ModelDeployment needs besides the operator itself:
- tokenfab's CRDs (ModelDeployment, NVLinkDomain) and Dynamo's DynamoWorkerMetadata (kubernetes discovery:
  every worker and frontend writes one);
- NVIDIA's DRA driver for multi-node groups (topology.computeDomain, the default): the ComputeDomain CRD,
  its DeviceClass compute-domain-default-channel.nvidia.com and IMEX channels published as ResourceSlices;
- GPU nodes labelled by GPU feature discovery with their NVLink domain (nvidia.com/gpu.clique) and
  offering nvidia.com/gpu;
- a Prometheus that answers and scrapes tokenfab's workers (the series the autoscaler reads);
- the operator's RBAC: every verb it uses, for the identity it runs as (yours, or a ServiceAccount).

Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 2 the API server could not be asked.
The checks read only (plus access reviews, which change nothing).
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tokenfab.adapters.kube import ApiError, Kube
from tokenfab.api.crd import DYNAMO_GROUP, DYNAMO_METADATA_PLURAL
from tokenfab.api.models import DOMAIN_PLURAL, GROUP, PLURAL
from tokenfab.planning import contract

Outcome = Literal["pass", "warn", "fail"]
EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 2
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
IMEX_DRIVER = "compute-domain.nvidia.com"
MIN_MINOR = 34  # resource.k8s.io/v1 (DRA GA): the IMEX claims of multi-node groups

# (API group, resource) -> (verbs, namespaced): every verb the operator uses, as charts/tokenfab/templates/
# rbac.yaml grants it (tests/test_doctor.py keeps the two equal; the leader Lease's Role is the release's).
OPERATOR_RULES: dict[tuple[str, str], tuple[frozenset[str], bool]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): (frozenset({"list", "watch"}), False),
    ("", "nodes"): (frozenset({"list", "watch"}), False),
    ("resource.k8s.io", "devicetaintrules"): (frozenset({"list", "watch"}), False),
    ("", "pods"): (frozenset({"list", "watch", "create", "patch", "delete", "deletecollection"}), True),
    (GROUP, DOMAIN_PLURAL): (frozenset({"list", "create", "patch", "delete"}), False),
    (GROUP, f"{DOMAIN_PLURAL}/status"): (frozenset({"patch"}), False),
    ("", "namespaces"): (frozenset({"get"}), False),
    (GROUP, PLURAL): (frozenset({"list", "watch", "patch"}), True),
    (GROUP, f"{PLURAL}/status"): (frozenset({"patch"}), True),
    ("", "services"): (frozenset({"list", "watch", "create", "patch"}), True),
    ("", "configmaps"): (frozenset({"list", "watch", "create", "patch", "delete"}), True),
    ("apps", "deployments"): (frozenset({"list", "watch", "create", "patch"}), True),
    ("", "events"): (frozenset({"create"}), True),
    ("", "pods/status"): (frozenset({"patch"}), True),
    ("policy", "poddisruptionbudgets"): (frozenset({"list", "watch", "create", "patch", "delete"}), True),
    ("scheduling.k8s.io", "podgroups"): (frozenset({"create", "patch", "delete"}), True),
    ("resource.nvidia.com", "computedomains"): (
        frozenset({"list", "watch", "create", "patch", "delete"}),
        True,
    ),
    ("resource.k8s.io", "resourceclaimtemplates"): (frozenset({"get", "list", "watch"}), True),
    ("", "persistentvolumeclaims"): (frozenset({"get", "list", "watch", "create", "patch", "delete"}), True),
    ("", "serviceaccounts"): (frozenset({"list", "watch", "create", "patch", "delete"}), True),
    ("rbac.authorization.k8s.io", "roles"): (frozenset({"list", "watch", "create", "patch", "delete"}), True),
    ("rbac.authorization.k8s.io", "rolebindings"): (
        frozenset({"list", "watch", "create", "patch", "delete"}),
        True,
    ),
    # granted on to the pods' Role (RBAC lets the operator grant only what it holds)
    ("discovery.k8s.io", "endpointslices"): (frozenset({"get", "list", "watch"}), True),
    (DYNAMO_GROUP, DYNAMO_METADATA_PLURAL): (frozenset({"get", "list", "watch", "create", "patch"}), True),
}


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str
    fix: str = ""


class UnreachableError(Exception):
    """The API server did not answer: nothing could be checked."""


def _get(kube: Kube, path: str) -> Any:
    try:
        return kube.request("GET", path, what=path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        if exc.status == 0:
            raise UnreachableError(str(exc)) from exc
        raise


def check_version(kube: Kube) -> Check:
    info = _get(kube, "/version") or {}
    minor = int("".join(ch for ch in str(info.get("minor", "0")) if ch.isdigit()) or 0)
    version = info.get("gitVersion", "?")
    if minor >= MIN_MINOR:
        return Check("kubernetes", "pass", f"API server {version}")
    return Check(
        "kubernetes",
        "fail",
        f"API server {version}: IMEX claims need resource.k8s.io/v1 (Kubernetes 1.{MIN_MINOR}+)",
        f"upgrade to Kubernetes 1.{MIN_MINOR} or later, or set topology.computeDomain false",
    )


def _crd(kube: Kube, name: str) -> bool:
    crd = _get(kube, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conds = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Established" and x.get("status") == "True" for x in conds)


def check_crds(kube: Kube) -> list[Check]:
    ours = [f"{PLURAL}.{GROUP}", f"{DOMAIN_PLURAL}.{GROUP}"]
    missing = [n for n in ours if not _crd(kube, n)]
    out = [
        Check("tokenfab-crds", "pass", f"{', '.join(ours)} established")
        if not missing
        else Check(
            "tokenfab-crds",
            "fail",
            f"not installed: {', '.join(missing)}",
            "kubectl apply --server-side -f crds/ (or install the Helm chart)",
        )
    ]
    dwm = f"{DYNAMO_METADATA_PLURAL}.{DYNAMO_GROUP}"
    out.append(
        Check("dynamo-crd", "pass", f"{dwm} established (Dynamo's kubernetes discovery)")
        if _crd(kube, dwm)
        else Check(
            "dynamo-crd",
            "fail",
            f"{dwm} is not installed: workers and frontends with serving.discovery kubernetes (the default) "
            "cannot register and exit",
            f"kubectl apply --server-side -f crds/{DYNAMO_GROUP}_{DYNAMO_METADATA_PLURAL}.yaml (the chart "
            "installs it too), or use serving.discovery etcd",
        )
    )
    return out


def check_dra(kube: Kube) -> Check:
    fix = (
        "install NVIDIA's DRA driver for GPUs (ComputeDomain support), or set topology.computeDomain false "
        "(multi-node groups then run without IMEX: no multi-node NVLink)"
    )
    if not _crd(kube, "computedomains.resource.nvidia.com"):
        return Check(
            "dra-driver", "fail", "the ComputeDomain CRD (resource.nvidia.com) is not installed", fix
        )
    if _get(kube, f"/apis/resource.k8s.io/v1/deviceclasses/{CHANNEL_CLASS}") is None:
        return Check("dra-driver", "fail", f"DeviceClass {CHANNEL_CLASS} is missing", fix)
    slices = (_get(kube, "/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
    nodes = {s["spec"].get("nodeName") for s in slices if (s.get("spec") or {}).get("driver") == IMEX_DRIVER}
    if not nodes:
        return Check("dra-driver", "fail", f"no node publishes IMEX channels ({IMEX_DRIVER})", fix)
    return Check(
        "dra-driver", "pass", f"ComputeDomain CRD, {CHANNEL_CLASS}, IMEX channels on {len(nodes)} nodes"
    )


def check_nodes(kube: Kube, domain_label: str, gpu_resource: str) -> Check:
    items = (_get(kube, "/api/v1/nodes") or {}).get("items") or []
    gpu = [n for n in items if int((n.get("status", {}).get("allocatable") or {}).get(gpu_resource, 0) or 0)]
    labelled = [n for n in gpu if domain_label in (n["metadata"].get("labels") or {})]
    domains = {n["metadata"]["labels"][domain_label] for n in labelled}
    if not gpu:
        return Check(
            "gpu-nodes",
            "fail",
            f"no node offers {gpu_resource}",
            "install NVIDIA's GPU Operator (device plugin and GPU feature discovery)",
        )
    if len(labelled) < len(gpu):
        return Check(
            "gpu-nodes",
            "fail" if not labelled else "warn",
            f"{len(gpu) - len(labelled)} of {len(gpu)} GPU nodes lack {domain_label}: groups are placed only "
            "on labelled nodes",
            f"turn on GPU feature discovery's NVLink clique labels ({domain_label}), or set "
            "topology.domainLabel to the label your nodes carry",
        )
    return Check(
        "gpu-nodes", "pass", f"{len(gpu)} GPU nodes in {len(domains)} NVLink domains ({domain_label})"
    )


def _prometheus(url: str, query: str) -> list[dict[str, Any]]:
    full = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(full, timeout=5) as r:
        return list(json.load(r)["data"]["result"])


def check_prometheus(url: str | None, autoscaled: int) -> Check:
    if not url:
        return Check(
            "prometheus",
            "warn",
            "not checked (no --prometheus-url): the autoscaler needs one that scrapes the workers",
            "pass --prometheus-url, the URL your ModelDeployments name in spec.autoscaling.prometheusUrl",
        )
    try:
        rows = _prometheus(url, f'count(up{{{contract.PROM_LABEL_DEPLOYMENT}!=""}} == 1)')
    except Exception as exc:
        return Check("prometheus", "fail", f"{url} does not answer: {exc}", "check the URL and that it runs")
    scraped = int(float(rows[0]["value"][1])) if rows else 0
    if scraped:
        return Check("prometheus", "pass", f"{url} scrapes {scraped} tokenfab targets")
    return Check(
        "prometheus",
        "fail" if autoscaled else "warn",
        f"{url} answers but scrapes no tokenfab worker or frontend (no series with "
        f"{contract.PROM_LABEL_DEPLOYMENT})"
        + (f"; {autoscaled} autoscaled ModelDeployments read it" if autoscaled else ""),
        "enable the chart's workloadMonitor (Prometheus Operator) or add "
        "charts/tokenfab/prometheus/scrape-config.yaml to your Prometheus",
    )


def access_review(
    kube: Kube, who: str | None, group: str, resource: str, verb: str, namespace: str | None
) -> bool:
    sub = resource.split("/", 1)
    attrs: dict[str, Any] = {"group": group, "resource": sub[0], "verb": verb}
    if len(sub) == 2:
        attrs["subresource"] = sub[1]
    if namespace is not None:
        attrs["namespace"] = namespace
    spec: dict[str, Any] = {"resourceAttributes": attrs}
    if who is None:
        kind = "SelfSubjectAccessReview"
    else:
        namespace, name = who.split("/", 1)
        spec["user"] = f"system:serviceaccount:{namespace}:{name}"
        spec["groups"] = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        kind = "SubjectAccessReview"
    plural = kind.lower() + "s"
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}
    out = kube.request("POST", f"/apis/authorization.k8s.io/v1/{plural}", body=body, what=kind)
    return bool((out or {}).get("status", {}).get("allowed"))


def check_rbac(kube: Kube, who: str | None, namespace: str) -> Check:
    identity = f"ServiceAccount {who}" if who else "your identity"
    asked = [
        (group, resource, verb, namespace if namespaced else None)
        for (group, resource), (verbs, namespaced) in OPERATOR_RULES.items()
        for verb in sorted(verbs)
    ]
    denied = [
        f"{verb} {resource}" + (f".{group}" if group else "")
        for group, resource, verb, ns in asked
        if not access_review(kube, who, group, resource, verb, ns)
    ]
    if denied:
        return Check(
            "rbac",
            "fail",
            f"{identity} may not: {', '.join(denied)}",
            "install the Helm chart (its ClusterRole grants exactly these), or grant them",
        )
    return Check(
        "rbac", "pass", f"{identity} may do all {len(asked)} things the operator does (namespace {namespace})"
    )


def _guarded(name: str, step: Callable[[], list[Check]]) -> list[Check]:
    """A check the API server refuses to answer fails with its words (an UnreachableError stops all)."""
    try:
        return step()
    except ApiError as exc:
        return [Check(name, "fail", f"the API server refused: {exc}", "run doctor with rights to read it")]


def _autoscaled(kube: Kube) -> int:
    items = (_get(kube, f"/apis/{GROUP}/v1alpha1/{PLURAL}") or {}).get("items") or []
    return sum(1 for md in items if ((md.get("spec") or {}).get("autoscaling") or {}).get("enabled"))


def run(
    kube: Kube,
    *,
    prometheus_url: str | None,
    service_account: str | None,
    namespace: str = "default",
    domain_label: str = "nvidia.com/gpu.clique",
    gpu_resource: str = "nvidia.com/gpu",
) -> list[Check]:
    """Every check, in order; raises UnreachableError when the API server does not answer."""
    checks = _guarded("kubernetes", lambda: [check_version(kube)])
    checks += _guarded("tokenfab-crds", lambda: check_crds(kube))
    checks += _guarded("dra-driver", lambda: [check_dra(kube)])
    checks += _guarded("gpu-nodes", lambda: [check_nodes(kube, domain_label, gpu_resource)])
    checks += _guarded("rbac", lambda: [check_rbac(kube, service_account, namespace)])
    autoscaled = 0
    if any(x.name == "tokenfab-crds" and x.outcome == "pass" for x in checks):
        with contextlib.suppress(ApiError):  # (then judged as if none were autoscaled)
            autoscaled = _autoscaled(kube)
    checks.append(check_prometheus(prometheus_url, autoscaled))
    return checks


def exit_code(checks: list[Check]) -> int:
    return EXIT_FAILED if any(x.outcome == "fail" for x in checks) else EXIT_OK


def report(checks: list[Check], as_json: bool) -> str:
    if as_json:
        return json.dumps({"checks": [asdict(x) for x in checks], "exitCode": exit_code(checks)}, indent=1)
    mark = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for x in checks:
        lines.append(f"{mark[x.outcome]:4}  {x.name:14} {x.detail}")
        if x.fix and x.outcome != "pass":
            lines.append(f"{'':20} fix: {x.fix}")
    return "\n".join(lines)
