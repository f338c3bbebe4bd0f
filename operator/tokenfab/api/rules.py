"""Validation rules of a ModelDeployment, written once for two evaluators.

Each rule carries a CEL expression (installed in the CRD as `x-kubernetes-validations`, so the API server
refuses bad specs at admission), the equivalent Python check (run by the pydantic models, so the operator
and the CLI refuse the same specs) and one message that names the field and the fix. The unit tests run
every CEL expression through a CEL interpreter and compare it with the Python check; the end-to-end tests
compare the API server's answers with the models'.

Kinds: `Rule` (cross-field, on the spec), `ObjectRule` (on one object, optionally reported on one of its
fields), `ValueRule` (on one scalar field; the API server quotes the value) and `KeysRule` (on every key
of a map). Regular expressions are written so that RE2 (the API server's CEL) and Python's re read them
alike.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from tokenfab.api.models import ModelDeploymentSpec, Role, RoleName

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


@dataclass(frozen=True)
class Rule:
    """One rule on the spec. `path` is relative to spec; `cel` sees the spec as `self`."""

    name: str
    path: str
    cel: str
    message: str
    check: Callable[[ModelDeploymentSpec], bool]
    reason: Reason = "FieldValueInvalid"
    # A message that quotes the spec: CEL for the API server (`messageExpression`), Python for the models.
    # `message` stays the fallback the API server prints when the expression cannot be evaluated.
    message_expression: str | None = None
    detail: Callable[[ModelDeploymentSpec], str] | None = None

    @property
    def field(self) -> str:
        return f"spec.{self.path}"

    def text(self, spec: ModelDeploymentSpec | None = None) -> str:
        """The message for this spec (the static message when there is no spec or no expression)."""
        if spec is not None and self.detail is not None:
            return self.detail(spec)
        return self.message

    def error_text(self, spec: ModelDeploymentSpec | None = None) -> str:
        """The words both the API server and the models use for a violation."""
        return f"{self.field}: {REASON_TEXT[self.reason]}: {self.text(spec)}"

    def x_kubernetes_validation(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.message_expression is not None:
            out["messageExpression"] = self.message_expression
        out["fieldPath"] = "." + self.path
        out["reason"] = self.reason
        return out


def _mode_rules() -> list[Rule]:
    dis = "self.serving.mode == 'disaggregated'"
    agg = "self.serving.mode == 'aggregated'"
    return [
        Rule(
            "disaggregated-needs-prefill",
            "prefill",
            f"!({dis}) || has(self.prefill)",
            "serving.mode disaggregated needs a prefill role: add spec.prefill, or set serving.mode to "
            "aggregated and describe one spec.worker role",
            lambda s: s.serving.mode != "disaggregated" or s.prefill is not None,
            "FieldValueRequired",
        ),
        Rule(
            "disaggregated-needs-decode",
            "decode",
            f"!({dis}) || has(self.decode)",
            "serving.mode disaggregated needs a decode role: add spec.decode, or set serving.mode to "
            "aggregated and describe one spec.worker role",
            lambda s: s.serving.mode != "disaggregated" or s.decode is not None,
            "FieldValueRequired",
        ),
        Rule(
            "disaggregated-forbids-worker",
            "worker",
            f"!({dis}) || !has(self.worker)",
            "spec.worker is for serving.mode aggregated only: describe a disaggregated deployment with "
            "spec.prefill and spec.decode, or set serving.mode to aggregated",
            lambda s: s.serving.mode != "disaggregated" or s.worker is None,
            "FieldValueForbidden",
        ),
        Rule(
            "aggregated-needs-worker",
            "worker",
            f"!({agg}) || has(self.worker)",
            "serving.mode aggregated needs a worker role: add spec.worker, or set serving.mode to "
            "disaggregated with spec.prefill and spec.decode",
            lambda s: s.serving.mode != "aggregated" or s.worker is not None,
            "FieldValueRequired",
        ),
        Rule(
            "aggregated-forbids-prefill",
            "prefill",
            f"!({agg}) || !has(self.prefill)",
            "spec.prefill is not allowed with serving.mode aggregated: remove it, or set serving.mode to "
            "disaggregated",
            lambda s: s.serving.mode != "aggregated" or s.prefill is None,
            "FieldValueForbidden",
        ),
        Rule(
            "aggregated-forbids-decode",
            "decode",
            f"!({agg}) || !has(self.decode)",
            "spec.decode is not allowed with serving.mode aggregated: describe the single role as "
            "spec.worker, or set serving.mode to disaggregated",
            lambda s: s.serving.mode != "aggregated" or s.decode is None,
            "FieldValueForbidden",
        ),
        Rule(
            "aggregated-forbids-ratio",
            "serving.prefillDecodeRatio",
            f"!({agg}) || !has(self.serving.prefillDecodeRatio)",
            "serving.prefillDecodeRatio applies to serving.mode disaggregated only: remove it",
            lambda s: s.serving.mode != "aggregated" or s.serving.prefill_decode_ratio is None,
            "FieldValueForbidden",
        ),
        Rule(
            "fixed-ratio-needs-ratio",
            "serving.prefillDecodeRatio",
            f"!({dis}) || self.serving.ratioPolicy != 'fixed' || has(self.serving.prefillDecodeRatio) "
            "|| has(self.profile)",
            'serving.ratioPolicy fixed needs serving.prefillDecodeRatio: set it (e.g. "1:3"), or set '
            "serving.ratioPolicy to independent and give spec.prefill.replicas, or add spec.profile to have "
            "it planned",
            lambda s: (
                s.serving.mode != "disaggregated"
                or s.serving.ratio_policy != "fixed"
                or s.serving.prefill_decode_ratio is not None
                or s.profile is not None
            ),
            "FieldValueRequired",
        ),
        Rule(
            "fixed-ratio-forbids-prefill-replicas",
            "prefill.replicas",
            f"!({dis}) || self.serving.ratioPolicy != 'fixed' || !has(self.prefill) "
            "|| !has(self.prefill.replicas)",
            "spec.prefill.replicas is derived from serving.prefillDecodeRatio when serving.ratioPolicy is "
            "fixed: remove it, or set serving.ratioPolicy to independent",
            lambda s: (
                s.serving.mode != "disaggregated"
                or s.serving.ratio_policy != "fixed"
                or s.prefill is None
                or s.prefill.replicas is None
            ),
            "FieldValueForbidden",
        ),
    ]


def _gpus(role: Role) -> int:
    return role.parallelism.tensor * role.parallelism.pipeline


def _role_rules(name: RoleName) -> list[Rule]:
    r = f"self.{name}"
    gpus = f"({r}.parallelism.tensor * {r}.parallelism.pipeline)"
    node = "self.topology.gpusPerNode"
    bounds = f"self.autoscaling.{name}"

    def has_role(s: ModelDeploymentSpec) -> Role | None:
        return s.role(name)

    def fits_nodes(s: ModelDeploymentSpec) -> bool:
        role = has_role(s)
        if role is None:
            return True
        g, n = _gpus(role), s.topology.gpus_per_node
        return g <= n or g % n == 0

    def fits_domain(s: ModelDeploymentSpec) -> bool:
        role = has_role(s)
        return role is None or _gpus(role) <= s.topology.gpus_per_domain

    def expert_divides(s: ModelDeploymentSpec) -> bool:
        role = has_role(s)
        return role is None or role.parallelism.tensor % role.parallelism.expert == 0

    def replicas_in_bounds(s: ModelDeploymentSpec) -> bool:
        # With autoscaling off the bounds do nothing, so replicas (0 parks the role) is not held to them.
        role, b = has_role(s), getattr(s.autoscaling, name)
        if not s.autoscaling.enabled or role is None or role.replicas is None or b is None:
            return True
        return bool(b.min_replicas <= role.replicas <= b.max_replicas)

    def bounds_need_role(s: ModelDeploymentSpec) -> bool:
        return getattr(s.autoscaling, name) is None or has_role(s) is not None

    def enabled_needs_bounds(s: ModelDeploymentSpec) -> bool:
        if not s.autoscaling.enabled or has_role(s) is None or getattr(s.autoscaling, name) is not None:
            return True
        # Under the fixed ratio policy prefill follows decode and needs no bounds of its own.
        return name == "prefill" and s.serving.ratio_policy == "fixed"

    needs_bounds_cel = f"!self.autoscaling.enabled || !has({r}) || has({bounds})"
    if name == "prefill":
        needs_bounds_cel += " || self.serving.ratioPolicy == 'fixed'"

    return [
        Rule(
            f"{name}-group-fills-nodes",
            f"{name}.parallelism",
            f"!has({r}) || !has({r}.parallelism) || {gpus} <= {node} || {gpus} % {node} == 0",
            f"a {name} group's GPUs (parallelism.tensor x parallelism.pipeline) must be at most "
            "topology.gpusPerNode or a multiple of it, so a multi-node group fills whole nodes: change "
            "tensor or pipeline",
            fits_nodes,
        ),
        Rule(
            f"{name}-group-fits-domain",
            f"{name}.parallelism",
            f"!has({r}) || !has({r}.parallelism) || {gpus} <= self.topology.gpusPerDomain",
            f"a {name} group's GPUs (parallelism.tensor x parallelism.pipeline) exceed "
            "topology.gpusPerDomain, and a group must sit inside one NVLink domain: lower tensor or "
            "pipeline",
            fits_domain,
        ),
        Rule(
            f"{name}-expert-divides-tensor",
            f"{name}.parallelism.expert",
            f"!has({r}) || !has({r}.parallelism) || {r}.parallelism.tensor % {r}.parallelism.expert == 0",
            f"{name} parallelism.expert must divide parallelism.tensor (TensorRT-LLM needs "
            "moe_expert_parallel_size x moe_tensor_parallel_size = tensor_parallel_size): choose a divisor "
            "of tensor",
            expert_divides,
        ),
        Rule(
            f"{name}-replicas-within-bounds",
            f"{name}.replicas",
            f"!self.autoscaling.enabled || !has({r}) || !has({r}.replicas) || !has({bounds}) "
            f"|| ({r}.replicas >= {bounds}.minReplicas && {r}.replicas <= {bounds}.maxReplicas)",
            f"spec.{name}.replicas must lie within autoscaling.{name}.minReplicas and maxReplicas when "
            "autoscaling is enabled: change the replicas or the bounds",
            replicas_in_bounds,
        ),
        Rule(
            f"{name}-bounds-need-role",
            f"autoscaling.{name}",
            f"!has({bounds}) || has({r})",
            f"autoscaling.{name} sets bounds for a role this deployment does not have: remove it, or add "
            f"spec.{name}",
            bounds_need_role,
            "FieldValueForbidden",
        ),
        Rule(
            f"{name}-autoscaling-needs-bounds",
            f"autoscaling.{name}",
            needs_bounds_cel,
            f"autoscaling.enabled needs bounds for the {name} groups: set autoscaling.{name}.minReplicas "
            "and maxReplicas",
            enabled_needs_bounds,
            "FieldValueRequired",
        ),
    ]


def _gpu_resource_rule() -> Rule:
    res = "self.runtime.resources"
    gpu = "self.topology.gpuResource"
    cel = (
        f"!has(self.runtime) || !has({res}) "
        f"|| ((!has({res}.requests) || !({gpu} in {res}.requests)) "
        f"&& (!has({res}.limits) || !({gpu} in {res}.limits)))"
    )
    tail = (
        "from runtime.resources.requests and runtime.resources.limits (tokenfab requests each worker pod's "
        "GPUs itself: tensor x pipeline GPUs over the group's nodes)"
    )

    def check(s: ModelDeploymentSpec) -> bool:
        gpu_name, r = s.topology.gpu_resource, s.runtime.resources
        return gpu_name not in r.requests and gpu_name not in r.limits

    return Rule(
        "gpus-not-in-resources",
        "runtime.resources",
        cel,
        f"GPUs follow from parallelism: remove topology.gpuResource {tail}",
        check,
        message_expression=f"'GPUs follow from parallelism: remove ' + {gpu} + {cel_string(' ' + tail)}",
        detail=lambda s: f"GPUs follow from parallelism: remove {s.topology.gpu_resource} {tail}",
    )


SPEC_RULES: tuple[Rule, ...] = (
    *_mode_rules(),
    *_role_rules("prefill"),
    *_role_rules("decode"),
    *_role_rules("worker"),
    Rule(
        "autoscaling-needs-prometheus",
        "autoscaling.prometheusUrl",
        "!self.autoscaling.enabled || has(self.autoscaling.prometheusUrl)",
        "autoscaling.enabled needs autoscaling.prometheusUrl: point it at the Prometheus that scrapes the "
        "workers, or set autoscaling.enabled to false",
        lambda s: not s.autoscaling.enabled or s.autoscaling.prometheus_url is not None,
        "FieldValueRequired",
    ),
    Rule(
        "frontend-replicas-within-bounds",
        "serving.frontendReplicas",
        "!self.autoscaling.enabled || !has(self.autoscaling.frontend) || !has(self.serving) "
        "|| !has(self.serving.frontendReplicas) "
        "|| (self.serving.frontendReplicas >= self.autoscaling.frontend.minReplicas "
        "&& self.serving.frontendReplicas <= self.autoscaling.frontend.maxReplicas)",
        "spec.serving.frontendReplicas (1 when not set) must lie within autoscaling.frontend.minReplicas "
        "and maxReplicas when autoscaling is enabled: set frontendReplicas within the bounds, or change the "
        "bounds",
        lambda s: (
            not s.autoscaling.enabled
            or s.autoscaling.frontend is None
            or s.autoscaling.frontend.min_replicas
            <= s.serving.frontend_replicas
            <= s.autoscaling.frontend.max_replicas
        ),
    ),
    Rule(
        "profile-needs-budget-or-rate",
        "profile",
        "!has(self.profile) || has(self.profile.gpuBudget) != has(self.profile.requestRate)",
        "spec.profile needs exactly one of gpuBudget (plan the best configuration for that many GPUs) or "
        "requestRate (plan the fewest GPUs for that load): set one of them",
        lambda s: s.profile is None or (s.profile.gpu_budget is None) != (s.profile.request_rate is None),
        "FieldValueRequired",
    ),
    Rule(
        "domain-holds-whole-nodes",
        "topology.gpusPerDomain",
        "self.topology.gpusPerDomain % self.topology.gpusPerNode == 0",
        "topology.gpusPerDomain must be a multiple of topology.gpusPerNode (an NVL72 rack: 72 = 18 x 4)",
        lambda s: s.topology.gpus_per_domain % s.topology.gpus_per_node == 0,
    ),
    _gpu_resource_rule(),
)


def violations(spec: ModelDeploymentSpec) -> list[Rule]:
    """The rules this spec breaks, in table order."""
    return [rule for rule in SPEC_RULES if not rule.check(spec)]


def check_spec(spec: ModelDeploymentSpec) -> None:
    """Raise a pydantic error listing every broken rule, in the API server's words."""
    broken = violations(spec)
    if broken:
        texts = [rule.error_text(spec) for rule in broken]
        raise PydanticCustomError(
            "tokenfab_rules", "{summary}", {"summary": "; ".join(texts), "texts": texts}
        )


# Object-level rules: they sit on one object's schema, so the path is wherever that object appears.


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


ETCD_NEEDS_ENDPOINTS = ObjectRule(
    "!has(self.discovery) || self.discovery != 'etcd' || has(self.etcdEndpoints)",
    "serving.discovery etcd needs serving.etcdEndpoints (e.g. http://etcd.dynamo-system:2379): set it, or "
    "use serving.discovery kubernetes (no etcd needed)",
    "etcdEndpoints",
    "FieldValueRequired",
)
ENDPOINTS_NEED_ETCD = ObjectRule(
    "!has(self.etcdEndpoints) || (has(self.discovery) && self.discovery == 'etcd')",
    "serving.etcdEndpoints applies to serving.discovery etcd only: remove it, or set serving.discovery to "
    "etcd",
    "etcdEndpoints",
    "FieldValueForbidden",
)

BOUNDS_RULE = ObjectRule(
    "self.minReplicas <= self.maxReplicas",
    "minReplicas must not exceed maxReplicas: raise maxReplicas or lower minReplicas",
)


def reserved_key_rule(key: str, field: str, message: str | None = None) -> ObjectRule:
    return ObjectRule(
        f"!has(self.{key})",
        message or f"{key} is set by tokenfab from {field}: remove it from extraEngineArgs and set {field}",
    )


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


# ----------------------------------------------------------------------------- rules on single fields


def _regex_rule(
    pattern: str, message: str, max_len: int | None = None, allow_empty: bool = False
) -> ValueRule:
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


NAME_MAX = 40
NAME_RULE = _regex_rule(
    DNS1035_PATTERN,
    f"metadata.name must be a DNS-1035 label of at most {NAME_MAX} characters (tokenfab derives pod, Service "
    f"and label names from it): use at most {NAME_MAX} lowercase letters, digits and '-', starting with a "
    "letter and ending with a letter or digit",
    max_len=NAME_MAX,
)

# The headless Service of a deployment's worker pods is <name>-workers: a deployment named <x>-workers
# would give its frontend Service the name of deployment <x>'s workers Service (both applied by tokenfab).
WORKERS_SUFFIX = "-workers"
NAME_SUFFIX_RULE = ValueRule(
    f"!self.endsWith({cel_string(WORKERS_SUFFIX)})",
    f"metadata.name must not end with '{WORKERS_SUFFIX}': tokenfab names the Service of a deployment's "
    f"worker pods <name>{WORKERS_SUFFIX}, so this name would take the Service of the deployment named "
    f"without the suffix: choose a name without the '{WORKERS_SUFFIX}' ending",
    lambda v: isinstance(v, str) and not v.endswith(WORKERS_SUFFIX),
)

# What the API server itself says of a name that is no DNS subdomain (before tokenfab's rule).
_SUBDOMAIN_TEXT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def name_errors(name: str) -> list[str]:
    """The API server's lines for a ModelDeployment's metadata.name: its own DNS-subdomain check on every
    object's name, then tokenfab's NAME_RULE."""
    quoted = go_quote(name)
    if NAME_RULE.check(name):
        if not NAME_SUFFIX_RULE.check(name):
            return [f"metadata.name: Invalid value: {quoted}: {NAME_SUFFIX_RULE.message}"]
        return []
    out = []
    if len(name) > 253:
        out.append(f"metadata.name: Invalid value: {quoted}: must be no more than 253 characters")
    if not matches(DNS_SUBDOMAIN_PATTERN)(name):
        out.append(f"metadata.name: Invalid value: {quoted}: {_SUBDOMAIN_TEXT}")
    out.append(f"metadata.name: Invalid value: {quoted}: {NAME_RULE.message}")
    return out


# The variables tokenfab sets on every worker (tokenfab.planning.contract.ENV_*; a unit test keeps the two
# lists equal). A user variable of the same name comes later in the container's env and would win: a rank,
# group or Dynamo namespace of the user's breaks discovery and the groups' wiring.
RESERVED_ENV = (
    "TOKENFAB_ROLE",
    "TOKENFAB_GROUP",
    "TOKENFAB_RANK",
    "TOKENFAB_WORLD_SIZE",
    "TOKENFAB_GPUS_PER_POD",
    "TOKENFAB_LEADER_ADDRESS",
    "TOKENFAB_WORKERS_SERVICE",
    "TOKENFAB_NAMESPACE",
    "TOKENFAB_ENGINE_CONFIG",
    "TOKENFAB_MODEL_NAME",
    "TOKENFAB_MODEL_SOURCE",
    "TOKENFAB_MODEL_REVISION",
    "TOKENFAB_MODEL_PATH",
    "TOKENFAB_MODEL_CACHE",
    "TOKENFAB_DISAGGREGATION_MODE",
    "TOKENFAB_MPI_SSH_DIR",
    "DYN_NAMESPACE",
    "DYN_SYSTEM_PORT",
    "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS",
    "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_UID",
)
ENV_RESERVED_RULE = ValueRule(
    "!(self in [" + ", ".join(cel_string(n) for n in RESERVED_ENV) + "])",
    "runtime.env may not set a variable tokenfab sets on every worker (" + ", ".join(RESERVED_ENV) + "): "
    "they come from the spec (model, parallelism, serving.drainSeconds, serving.discovery) and the group's "
    "place; remove it",
    lambda v: v not in RESERVED_ENV,
)

IMAGE_RULE = _regex_rule(
    r"^\S+$",
    "runtime.image must be an image reference with no whitespace (e.g. ghcr.io/org/worker:1.2 or "
    "registry.example.com/worker@sha256:<digest>): remove the spaces or line breaks",
)

SOURCE_RULE = _regex_rule(
    SOURCE_PATTERN,
    "model.source must be hf://<org>/<repo>, s3://<bucket>/<prefix> or pvc://<claim>/<path> (claim: the "
    "name of a PersistentVolumeClaim in this namespace, a DNS subdomain), with a non-empty path after the "
    "scheme and no whitespace anywhere",
)

S3_SOURCE_RULE = ValueRule(
    "!self.startsWith('s3://')",
    "model.source s3:// is not fetched by tokenfab yet: copy the weights into a PersistentVolumeClaim and "
    "use pvc://<claim>/<path>, or use hf://<org>/<repo> with model.revision",
    lambda v: not str(v).startswith("s3://"),
)

STORAGE_CLASS_RULE = _regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "model.cache.storageClassName must be the name of a StorageClass (a DNS subdomain: lowercase letters, "
    "digits, '-' and '.')",
)

QUERY_PLACEHOLDERS = ("namespace", "deployment", "role")
# What str.format reads with only those names: text without braces, doubled braces, bare placeholders.
QUERY_PATTERN = r"^([^{}]|\{\{|\}\}|\{(" + "|".join(QUERY_PLACEHOLDERS) + r")\})*$"


def query_formats(query: str) -> bool:
    """Whether str.format fills `query` from {namespace}, {deployment} and {role} alone, each written bare
    (no conversion, format spec, index or attribute): the twin of QUERY_PATTERN, read by string.Formatter."""
    rebuilt = []
    try:
        for literal, name, spec, conversion in string.Formatter().parse(query):
            rebuilt.append(literal.replace("{", "{{").replace("}", "}}"))
            if name is None:
                continue
            if name not in QUERY_PLACEHOLDERS or spec or conversion is not None:
                return False
            rebuilt.append("{" + name + "}")
    except ValueError:  # a single '{' or '}', an unterminated field
        return False
    # `{role:}` parses like `{role}`: only a query that reads back unchanged is written the plain way.
    return "".join(rebuilt) == query


QUERY_RULE = ValueRule(
    f"self.matches({cel_string(QUERY_PATTERN)})",
    "autoscaling.query may use only the placeholders {namespace}, {deployment} and {role}, and every other "
    "brace must be doubled ({{ and }}) as Python's str.format reads it, e.g. "
    'max by (tokenfab_dev_group) (kv_cache_usage{{namespace="{namespace}", role="{role}"}})',
    lambda v: isinstance(v, str) and query_formats(v),
)

MIN_REPLICAS_RULE = ValueRule(
    "self >= 1",
    "minReplicas must be at least 1: scale-to-zero is not supported; set minReplicas to 1, or park the role "
    "by setting autoscaling.enabled to false and the role's replicas to 0",
    lambda v: isinstance(v, int) and v >= 1,
)

PRIORITY_CLASS_RULE = _regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "scheduling.priorityClassName must name a PriorityClass: a DNS subdomain (lowercase letters, digits, '-' "
    "and '.', starting and ending with a letter or digit)",
)
SCHEDULER_NAME_RULE = _regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "scheduling.schedulerName must name a scheduler: a DNS subdomain (lowercase letters, digits, '-' and "
    "'.', starting and ending with a letter or digit)",
)
TOLERATION_KEY_RULE = _regex_rule(
    LABEL_KEY_PATTERN,
    f"a toleration key must be a taint key, {LABEL_KEY_FORM}; or leave key out, with operator Exists, to "
    "tolerate every taint",
    allow_empty=True,
)


# ------------------------------------------------------------------------------- rules on free-form maps


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
    match = matches(LABEL_KEY_PATTERN)
    return KeysRule(
        f"self.all(k, k.size() <= {LABEL_KEY_MAX} && k.matches({cel_string(LABEL_KEY_PATTERN)}))",
        message,
        lambda k: len(k) <= LABEL_KEY_MAX and match(k),
    )


NODE_SELECTOR_KEYS_RULE = label_keys_rule(
    f"scheduling.nodeSelector keys must be node label keys, {LABEL_KEY_FORM}"
)


def resource_keys_rule(field: str) -> KeysRule:
    return label_keys_rule(
        f"runtime.resources.{field} keys must be resource names such as cpu, memory or ephemeral-storage "
        f"({LABEL_KEY_FORM})"
    )


# ------------------------------------------------------------------------------ rules on small objects

ENV_VALUE_OR_VALUE_FROM = ObjectRule(
    "!has(self.valueFrom) || !has(self.value) || self.value == ''",
    "an environment variable takes value or valueFrom, not both: remove one of them",
    field="valueFrom",
    reason="FieldValueForbidden",
)
ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
ENV_ONE_SOURCE = ObjectRule(
    "[" + ", ".join(f"has(self.{s})" for s in ENV_SOURCES) + "].exists_one(x, x)",
    "valueFrom must set exactly one of " + ", ".join(ENV_SOURCES[:-1]) + f" or {ENV_SOURCES[-1]}",
)
TOLERATION_EXISTS_FORBIDS_VALUE = ObjectRule(
    "self.operator != 'Exists' || !has(self.value) || self.value == ''",
    "a toleration with operator Exists matches every value of its key: remove value, or set operator to "
    "Equal",
    field="value",
    reason="FieldValueForbidden",
)
TOLERATION_EMPTY_KEY_NEEDS_EXISTS = ObjectRule(
    "(has(self.key) && self.key != '') || self.operator == 'Exists'",
    "a toleration without a key tolerates every taint and needs operator Exists: set key, or set operator "
    "to Exists",
    field="operator",
)
TOLERATION_SECONDS_NEED_NO_EXECUTE = ObjectRule(
    "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    "tolerationSeconds (how long a pod stays bound to a node once the taint appears) applies to effect "
    "NoExecute only: remove it, or set effect to NoExecute",
    field="tolerationSeconds",
    reason="FieldValueForbidden",
)
TOLERATION_RULES = (
    TOLERATION_EMPTY_KEY_NEEDS_EXISTS,
    TOLERATION_EXISTS_FORBIDS_VALUE,
    TOLERATION_SECONDS_NEED_NO_EXECUTE,
)
