"""Rules written once for two evaluators: the kinds of rule, and the text and patterns both read alike.

Each rule carries a CEL expression (installed in the CRD as `x-kubernetes-validations`, so the API server
refuses bad specs at admission), the equivalent Python check (run by the pydantic models, so the operator
and the CLI refuse the same specs) and one message that names the field and the fix. The unit tests run
every CEL expression through a CEL interpreter and compare it with the Python check; the end-to-end tests
compare the API server's answers with the models'.

Kinds: `Rule` (cross-field, on the spec: generic in the spec's model, which reads it), `ObjectRule` (on one
object, optionally reported on one of its fields), `ValueRule` (on one scalar field; the API server quotes
the value) and `KeysRule` (on every key of a map). Regular expressions are written so that RE2 (the API
server's CEL) and Python's re read them alike.

This module knows no model: `tokenfab.api.rules` holds the rules on fields and small objects, and the
spec's cross-field rules sit beside the spec in `tokenfab.api.models.spec`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic_core import PydanticCustomError

Reason = Literal["FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden"]
REASON_TEXT: dict[Reason, str] = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueForbidden": "Forbidden",
}


# ------------------------------------------------------------------------- patterns shared by CEL and Python


def cel_string(text: str) -> str:
    """A CEL single-quoted string literal of `text`, in ASCII (other characters as \\u escapes)."""
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "'" + "".join(out) + "'"


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """`text` quoted as Go's %q (strconv.Quote) does, which is how the API server quotes a bad value:
    printable characters as they are, others escaped (\\n, \\x01, \\u00a0)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == " " or (code > 0x20 and code != 0x7F and unicodedata.category(ch)[0] in "LMNPS"):
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def matches(pattern: str) -> Callable[[Any], bool]:
    """Python's twin of CEL `self.matches(pattern)` for an anchored pattern both engines read alike."""
    compiled = re.compile(pattern)
    return lambda v: isinstance(v, str) and compiled.fullmatch(v) is not None


# Patterns shared by CEL (RE2) and Python (re): only constructs both read the same way (no \s, \d, \w, which
# differ on non-ASCII text; non-ASCII characters are written literally).
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
DNS_SUBDOMAIN_PATTERN = rf"^{DNS_SUBDOMAIN}$"
DNS1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^({DNS_SUBDOMAIN}/)?{LABEL_NAME}$"
LABEL_KEY_MAX = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_FORM = (
    "[prefix/]name, where name is at most 63 letters, digits, '-', '_' or '.' starting and ending with a "
    "letter or digit, and the optional prefix is a DNS subdomain"
)
# Kubernetes' resource.Quantity pattern, without the leading '-': a request or limit is never negative.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Whitespace as Python's str.isspace() knows it and the other ASCII control characters: regex escapes for
# ASCII, literal characters beyond it (RE2 and Python write non-ASCII escapes differently).
_SPACE = "\\x00-\\x20\\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_NOT_SPACE = f"[^{_SPACE}]"
_FIRST = f"[^/{_SPACE}]"  # the first character of a path: neither whitespace nor '/'
SOURCE_PATTERN = (
    f"^(hf://{_FIRST}{_NOT_SPACE}*|s3://{_FIRST}{_NOT_SPACE}*|pvc://{DNS_SUBDOMAIN}/{_NOT_SPACE}+)$"
)


# ------------------------------------------------------------------------------------ rules on the spec

SpecT = TypeVar("SpecT")


@dataclass(frozen=True)
class Rule(Generic[SpecT]):
    """One rule on the spec. `path` is relative to spec; `cel` sees the spec as `self`, `check` the spec's
    model (`SpecT`)."""

    name: str
    path: str
    cel: str
    message: str
    check: Callable[[SpecT], bool]
    reason: Reason = "FieldValueInvalid"
    # A message that quotes the spec: CEL for the API server (`messageExpression`), Python for the models.
    # `message` stays the fallback the API server prints when the expression cannot be evaluated.
    message_expression: str | None = None
    detail: Callable[[SpecT], str] | None = None

    @property
    def field(self) -> str:
        return f"spec.{self.path}"

    def text(self, spec: SpecT | None = None) -> str:
        """The message for this spec (the static message when there is no spec or no expression)."""
        if spec is not None and self.detail is not None:
            return self.detail(spec)
        return self.message

    def error_text(self, spec: SpecT | None = None) -> str:
        """The words both the API server and the models use for a violation."""
        return f"{self.field}: {REASON_TEXT[self.reason]}: {self.text(spec)}"

    def x_kubernetes_validation(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.message_expression is not None:
            out["messageExpression"] = self.message_expression
        out["fieldPath"] = "." + self.path
        out["reason"] = self.reason
        return out


def rules_error(texts: list[str]) -> PydanticCustomError:
    """A pydantic error for broken rules already worded in full (`<field>: <kind>: <detail>`)."""
    return PydanticCustomError("tokenfab_rules", "{summary}", {"summary": "; ".join(texts), "texts": texts})


# --------------------------------------------------------------------------------- rules on one object


@dataclass(frozen=True)
class ObjectRule:
    """A rule on one object schema; `cel` sees that object as `self`.

    `field` (relative to the object, e.g. "value") makes the API server report the violation on that field
    instead of on the object, with `reason`."""

    cel: str
    message: str
    field: str | None = None
    reason: Reason = "FieldValueInvalid"

    def x_kubernetes_validation(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.field is not None:
            out["fieldPath"] = "." + self.field
            out["reason"] = self.reason
        return out

    def violation(self) -> dict[str, str]:
        """What `object_rules_error` needs to word a violation of this rule."""
        return {"field": self.field or "", "reason": self.reason, "message": self.message}


def object_rules_error(broken: list[ObjectRule]) -> PydanticCustomError:
    """A pydantic error for the broken rules of one object, worded by tokenfab.api.errors."""
    return PydanticCustomError(
        "tokenfab_object_rules",
        "{summary}",
        {"summary": "; ".join(r.message for r in broken), "violations": [r.violation() for r in broken]},
    )


# --------------------------------------------------------------------------- rules on values and keys


@dataclass(frozen=True)
class ValueRule:
    """A rule on one scalar field; `cel` sees the value as `self`. The API server quotes the value, so the
    models do too: `<field>: Invalid value: <value>: <message>`."""

    cel: str
    message: str
    check: Callable[[Any], bool]

    def x_kubernetes_validation(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.message}

    def __call__(self, value: Any) -> Any:
        """Pydantic after-validator: the value, or a refusal in the API server's words."""
        if value is not None and not self.check(value):
            raise PydanticCustomError("tokenfab_value", "{message}", {"message": self.message})
        return value


def regex_rule(
    pattern: str, message: str, max_len: int | None = None, allow_empty: bool = False
) -> ValueRule:
    """A rule that a string matches `pattern` (and is at most `max_len` long; or empty, if allowed)."""
    cel = f"self.matches({cel_string(pattern)})"
    if max_len is not None:
        cel = f"self.size() <= {max_len} && {cel}"
    if allow_empty:
        cel = f"self == '' || ({cel})"
    match = matches(pattern)

    def check(v: Any) -> bool:
        if allow_empty and v == "":
            return True
        return isinstance(v, str) and (max_len is None or len(v) <= max_len) and match(v)

    return ValueRule(cel, message, check)


@dataclass(frozen=True)
class KeysRule:
    """A rule on every key of a map; `cel` sees the map as `self`, `check` one key."""

    cel: str
    message: str
    check: Callable[[str], bool]

    def x_kubernetes_validation(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.message}

    def __call__(self, value: dict[str, Any]) -> dict[str, Any]:
        if not all(self.check(k) for k in value):
            raise PydanticCustomError("tokenfab_rule", "{message}", {"message": self.message})
        return value


def label_keys_rule(message: str) -> KeysRule:
    """A rule that every key of a map is a Kubernetes label key, saying `message` otherwise."""
    match = matches(LABEL_KEY_PATTERN)
    return KeysRule(
        f"self.all(k, k.size() <= {LABEL_KEY_MAX} && k.matches({cel_string(LABEL_KEY_PATTERN)}))",
        message,
        lambda k: len(k) <= LABEL_KEY_MAX and match(k),
    )
