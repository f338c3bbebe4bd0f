"""Shared test data: the examples and the invalid-spec table (used by unit and end-to-end tests)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tokenfab.api.rules import SPEC_RULES

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


def invalid_cases() -> list[InvalidCase]:
    rules = {r.name: r for r in SPEC_RULES}
    out = []
    for raw in yaml.safe_load((ROOT / "tests" / "data" / "invalid-specs.yaml").read_text()):
        doc = load_example(raw["base"])
        doc["metadata"]["name"] = "invalid-" + raw["id"]
        doc["spec"] = merge_patch(doc["spec"], raw["patch"])
        rule = raw.get("rule")
        expect = rules[rule].error_text() if rule else raw["expect"]
        out.append(InvalidCase(raw["id"], doc, expect, rule))
    return out
