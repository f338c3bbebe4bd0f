"""What every model of the tokenfab resources shares: the API group and version, the base classes of spec
and status objects, the Kubernetes quantity type and the helpers that attach a rule's CEL to a schema."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, PydanticKnownError

from tokenfab.api.cel import QUANTITY_PATTERN, KeysRule, ObjectRule, ValueRule, matches, object_rules_error

GROUP = "tokenfab.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORIES = ("tokenfab",)


def cel_rules(rules: list[dict[str, str]]) -> dict[str, Any]:
    """Schema extra that installs CEL rules on an object."""
    return {"x-kubernetes-validations": rules}


def cel_of(rule: ValueRule | KeysRule) -> dict[str, Any]:
    """Schema extra that installs a field's CEL rule; `AfterValidator(rule)` is its Python twin."""
    return cel_rules([rule.x_kubernetes_validation()])


def refuse_broken(checks: list[tuple[ObjectRule, bool]]) -> None:
    """Raise the object rules that do not hold (rule, holds), in the API server's words and order."""
    broken = [rule for rule, holds in checks if not holds]
    if broken:
        raise object_rules_error(broken)


def _quantity(value: Any) -> int | str:
    """A Kubernetes quantity as the CRD schema checks it: an integer >= 0 or a quantity string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError(
            "tokenfab_type", "must be of type integer,string", {"expected": "integer,string"}
        )
    if isinstance(value, int) and value < 0:
        raise PydanticKnownError("greater_than_equal", {"ge": 0})
    if isinstance(value, str) and not matches(QUANTITY_PATTERN)(value):
        raise PydanticKnownError("string_pattern_mismatch", {"pattern": QUANTITY_PATTERN})
    return value


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]


class SpecModel(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


class StatusModel(SpecModel):
    """Base for what the operator writes to status: read leniently, so an operator keeps working when the
    stored status has fields a newer version wrote (they are dropped on read). The schema is the same."""

    model_config = ConfigDict(extra="ignore")
