"""Shared test data: the examples and the invalid-spec table (used by unit and end-to-end tests)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tokenfab.api.models import SPEC_RULES

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


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
    """The cases of tests/data/invalid-specs.yaml. A case merge-patches `patch` into the example's spec and
    `metadata` into its metadata; `expect` is the line, or else `rule` names a spec rule whose (static) text
    is the line. A case may give both, for a rule whose message quotes the spec."""
    rules = {r.name: r for r in SPEC_RULES}
    out = []
    for raw in yaml.safe_load((ROOT / "tests" / "data" / "invalid-specs.yaml").read_text()):
        doc = load_example(raw["base"])
        doc["metadata"]["name"] = case_name(raw["id"])
        doc["metadata"] = merge_patch(doc["metadata"], raw.get("metadata") or {})
        doc["spec"] = merge_patch(doc["spec"], raw.get("patch") or {})
        rule = raw.get("rule")
        expect = raw.get("expect") or rules[rule].error_text()
        out.append(InvalidCase(raw["id"], doc, expect, rule))
    return out
