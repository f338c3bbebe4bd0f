"""Validation errors in the API server's words.

The models refuse what the API server refuses; this module words pydantic's errors the way the API
server words the same schema and CEL failures (`<field>: <kind>: <detail>`), so a user sees one message
whether `tokenfab validate`, the operator or `kubectl apply` caught the mistake.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError

from tokenfab.api.cel import REASON_TEXT, go_quote
from tokenfab.api.models import ModelDeployment


class SpecError(ValueError):
    """A manifest that the API would refuse; `errors` holds one line per problem."""

    def __init__(self, errors: list[str], source: str = "") -> None:
        self.errors = errors
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(errors))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return go_quote(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (int, float)):
        return str(v)
    return '"object"'


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if v is None:
        return "null"
    return "object"


_TYPE_NAMES = {
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "string": "string",
    "dict": "object",
    "list": "array",
    "model": "object",
}


def k8s_error_text(err: Any) -> list[str]:
    """One pydantic error dict -> the API server's line(s) for it."""
    typ: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    loc = tuple(err["loc"])
    # Errors raised by validators of a union member or a model carry the validator name in loc.
    loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
    path = _path(loc)
    value = err.get("input")
    inb = f"{path} in body"
    if typ == "tokenfab_rules":
        return list(ctx["texts"])
    if typ in ("tokenfab_rule", "tokenfab_reserved_key"):
        return [f"{path}: Invalid value: {err['msg']}"]
    if typ == "tokenfab_value":  # a CEL rule on a scalar field: the API server quotes the value
        return [f"{path}: Invalid value: {_value(value)}: {err['msg']}"]
    if typ == "tokenfab_object_rules":  # CEL rules on an object, each reported on a field of it, or on it
        out = []
        for v in ctx["violations"]:
            where = f"{path}.{v['field']}" if v["field"] else path
            out.append(f"{where}: {REASON_TEXT[v['reason']]}: {v['message']}")
        return out
    if typ == "tokenfab_type":
        got = json.dumps(_json_type(value))
        return [f"{path}: Invalid value: {got}: {inb} must be of type {ctx['expected']}: {got}"]
    if typ == "missing":
        return [f"{path}: Required value"]
    if typ == "extra_forbidden":
        return [f'unknown field "{path}"']
    if typ == "literal_error":
        expected = ctx.get("expected", "")
        opts = ", ".join(o.strip().replace("'", '"') for o in expected.replace(" or ", ", ").split(","))
        return [f"{path}: Unsupported value: {_value(value)}: supported values: {opts}"]
    if typ in ("less_than_equal", "greater_than_equal", "greater_than", "less_than"):
        words = {
            "less_than_equal": "less than or equal to",
            "greater_than_equal": "greater than or equal to",
            "greater_than": "greater than",
            "less_than": "less than",
        }[typ]
        limit = _value(next(iter(ctx.values())))
        return [f"{path}: Invalid value: {_value(value)}: {inb} should be {words} {limit}"]
    if typ == "string_pattern_mismatch":
        return [f"{path}: Invalid value: {_value(value)}: {inb} should match '{ctx['pattern']}'"]
    if typ == "string_too_short":
        return [
            f"{path}: Invalid value: {_value(value)}: {inb} should be at least {ctx['min_length']} chars long"
        ]
    if typ == "string_too_long":
        return [f"{path}: Too long: may not be more than {ctx['max_length']} bytes"]
    if typ == "too_long":
        actual = ctx.get("actual_length")
        if actual is None and isinstance(value, (dict, list)):
            actual = len(value)
        return [f"{path}: Too many: {actual}: must have at most {ctx['max_length']} items"]
    base = typ.split("_")[0]
    if base in _TYPE_NAMES:
        got = json.dumps(_json_type(value))
        return [f"{path}: Invalid value: {got}: {inb} must be of type {_TYPE_NAMES[base]}: {got}"]
    return [f"{path}: {err['msg']}"]


def k8s_errors(exc: ValidationError) -> list[str]:
    """Every error of a pydantic ValidationError, in the API server's words."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        lines.extend(k8s_error_text(err))
    return lines


def parse_model_deployment(obj: dict[str, Any], source: str = "") -> ModelDeployment:
    """Validate one decoded object; raise SpecError with the API server's words."""
    try:
        return ModelDeployment.model_validate(obj)
    except ValidationError as exc:
        raise SpecError(k8s_errors(exc), source) from None


def load_manifests(text: str, source: str = "") -> list[ModelDeployment]:
    """Every ModelDeployment in a (multi-document) YAML text; other kinds are skipped."""
    out: list[ModelDeployment] = []
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == "ModelDeployment":
            out.append(parse_model_deployment(doc, source))
    return out
