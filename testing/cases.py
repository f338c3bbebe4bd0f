"""Shared test data: the examples, the invalid-spec table, and an example's spec and children as the
builders' tests and the factory's pod tests make them (used by unit and end-to-end tests)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import SPEC_RULES, ModelDeploymentSpec
from tokenfab.planning import builders

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
UID = "00000000-0000-0000-0000-000000000001"  # the owner's (fixed: golden files stay stable)
DOMAIN = "clique-a"  # the NVLink domain groups are placed in


def example_paths() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def load_example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass(frozen=True)
class InvalidCase:
    id: str
    manifest: dict[str, Any]
    expect: str
    rule: str | None


def case_name(case_id: str) -> str:
    """A valid ModelDeployment name for a case (a DNS-1035 label of at most 40 characters)."""
    return ("invalid-" + case_id)[:40].rstrip("-")


def invalid_cases() -> list[InvalidCase]:
    """The cases of testing/invalid-specs.yaml. A case merge-patches `patch` into the example's spec and
    `metadata` into its metadata; `expect` is the line, or else `rule` names a spec rule whose (static) text
    is the line. A case may give both, for a rule whose message quotes the spec."""
    rules = {r.name: r for r in SPEC_RULES}
    out = []
    for raw in yaml.safe_load((ROOT / "testing" / "invalid-specs.yaml").read_text()):
        doc = load_example(raw["base"])
        doc["metadata"]["name"] = case_name(raw["id"])
        doc["metadata"] = merge_patch(doc["metadata"], raw.get("metadata") or {})
        doc["spec"] = merge_patch(doc["spec"], raw.get("patch") or {})
        rule = raw.get("rule")
        expect = raw.get("expect") or rules[rule].error_text()
        out.append(InvalidCase(raw["id"], doc, expect, rule))
    return out


def owner(name: str) -> builders.Owner:
    return builders.Owner(name=name, namespace="ml", uid=UID)


def spec_of(example: str, patch: dict[str, Any] | None = None) -> ModelDeploymentSpec:
    """An example's spec, with an optional JSON merge patch on spec (validated like any manifest)."""
    doc = load_example(example)
    if patch:
        doc["spec"] = merge_patch(doc["spec"], patch)
    return parse_model_deployment(doc, example).spec


def env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment as a kubelet resolves it (downward API fields from the pod's metadata;
    a pod not yet created has no uid: a stand-in)."""
    meta = pod["metadata"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", f"uid-of-{meta['name']}"),
    }
    out = {}
    for e in pod["spec"]["containers"][0]["env"]:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        out[e["name"]] = fields[ref["fieldPath"]] if ref else e.get("value")
    return out


# Every example, and DeepSeek-R1 without a ComputeDomain and with etcd discovery: (example, spec patch).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{p.stem: (p.name, {}) for p in example_paths()},
    "deepseek-r1-disaggregated-no-compute-domain": (
        "deepseek-r1-disaggregated.yaml",
        {"topology": {"computeDomain": False}},
    ),
    "deepseek-r1-disaggregated-etcd": (
        "deepseek-r1-disaggregated.yaml",
        {"serving": {"discovery": "etcd", "etcdEndpoints": "http://etcd.dynamo-system:2379"}},
    ),
}


def rendered() -> list[tuple[str, str, dict[str, Any], ModelDeploymentSpec]]:
    """(variant, role or "frontend", pod spec, its spec) for every example and variant."""
    out: list[tuple[str, str, dict[str, Any], ModelDeploymentSpec]] = []
    for variant, (example, patch) in VARIANTS.items():
        spec = spec_of(example, patch)
        own = owner(f"x{abs(hash(variant)) % 1000}")
        for role, _ in spec.roles():
            pod = builders.group_pods(
                own, spec, builders.GroupAt(role, 0, "d", builders.role_revision(spec, role))
            )[0]
            out.append((variant, role, pod, spec))
        template = builders.frontend_deployment(own, spec)["spec"]["template"]
        frontend = {
            "metadata": {**template["metadata"], "name": "fe", "namespace": own.namespace},
            "spec": template["spec"],
        }
        out.append((variant, "frontend", frontend, spec))
    return out
