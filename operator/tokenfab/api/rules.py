"""Cross-field validation rules of a ModelDeployment spec, written once for two evaluators.

Each rule carries a CEL expression (installed in the CRD as `x-kubernetes-validations`, so the API server
refuses bad specs at admission), the equivalent Python check (run by the pydantic models, so the operator
and the CLI refuse the same specs) and one message that names the field and the fix. The unit tests run
every CEL expression through a CEL interpreter and compare it with the Python check; the end-to-end tests
compare the API server's answers with the models'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from tokenfab.api.models import ModelDeploymentSpec, Role, RoleName

Reason = Literal["FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden"]
REASON_TEXT: dict[Reason, str] = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueForbidden": "Forbidden",
}


@dataclass(frozen=True)
class Rule:
    """One rule on the spec. `path` is relative to spec; `cel` sees the spec as `self`."""

    name: str
    path: str
    cel: str
    message: str
    check: Callable[[ModelDeploymentSpec], bool]
    reason: Reason = "FieldValueInvalid"

    @property
    def field(self) -> str:
        return f"spec.{self.path}"

    def error_text(self) -> str:
        """The words both the API server and the models use for a violation."""
        return f"{self.field}: {REASON_TEXT[self.reason]}: {self.message}"

    def x_kubernetes_validation(self) -> dict[str, str]:
        return {
            "rule": self.cel,
            "message": self.message,
            "fieldPath": "." + self.path,
            "reason": self.reason,
        }


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
        role, b = has_role(s), getattr(s.autoscaling, name)
        if role is None or role.replicas is None or b is None:
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
            f"!has({r}) || !has({r}.replicas) || !has({bounds}) "
            f"|| ({r}.replicas >= {bounds}.minReplicas && {r}.replicas <= {bounds}.maxReplicas)",
            f"spec.{name}.replicas must lie within autoscaling.{name}.minReplicas and maxReplicas: change "
            "the replicas or the bounds",
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
)


def violations(spec: ModelDeploymentSpec) -> list[Rule]:
    """The rules this spec breaks, in table order."""
    return [rule for rule in SPEC_RULES if not rule.check(spec)]


def check_spec(spec: ModelDeploymentSpec) -> None:
    """Raise a pydantic error listing every broken rule, in the API server's words."""
    broken = violations(spec)
    if broken:
        texts = [rule.error_text() for rule in broken]
        raise PydanticCustomError(
            "tokenfab_rules", "{summary}", {"summary": "; ".join(texts), "texts": texts}
        )


# Object-level rules: they sit on one object's schema, so the path is wherever that object appears.


@dataclass(frozen=True)
class ObjectRule:
    """A rule on one object schema; `cel` sees that object as `self`."""

    cel: str
    message: str

    def x_kubernetes_validation(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.message}


BOUNDS_RULE = ObjectRule(
    "self.minReplicas <= self.maxReplicas",
    "minReplicas must not exceed maxReplicas: raise maxReplicas or lower minReplicas",
)


def reserved_key_rule(key: str, field: str) -> ObjectRule:
    return ObjectRule(
        f"!has(self.{key})",
        f"{key} is set by tokenfab from {field}: remove it from extraEngineArgs and set {field}",
    )
