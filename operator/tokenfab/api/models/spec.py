"""The desired state of a ModelDeployment, and the rules across its fields.

Each cross-field rule is a `Rule` on the spec (`tokenfab.api.cel`): a CEL expression the CRD installs on
the spec, so the API server refuses a bad spec at admission, and the same check in Python, which the spec's
model validator runs, both with one message that names the field and the fix. `SPEC_RULES` is their table,
in the order both evaluators report them.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from tokenfab.api.cel import Rule, cel_string, rules_error
from tokenfab.api.models.autoscaling import Autoscaling
from tokenfab.api.models.base import SpecModel, cel_rules
from tokenfab.api.models.roles import ROLES, Profile, Role, RoleName, SpeculativeDecoding
from tokenfab.api.models.runtime import Runtime
from tokenfab.api.models.serving import ModelSource, Serving
from tokenfab.api.models.topology import Scheduling, Topology

_DIS = "self.serving.mode == 'disaggregated'"
_AGG = "self.serving.mode == 'aggregated'"

# ------------------------------------------------------------------------------------- serving mode


def _disaggregated_rules() -> list[Rule[ModelDeploymentSpec]]:
    """serving.mode disaggregated: a prefill and a decode role, no worker role."""
    return [
        Rule(
            "disaggregated-needs-prefill",
            "prefill",
            f"!({_DIS}) || has(self.prefill)",
            "serving.mode disaggregated needs a prefill role: add spec.prefill, or set serving.mode to "
            "aggregated and describe one spec.worker role",
            lambda s: s.serving.mode != "disaggregated" or s.prefill is not None,
            "FieldValueRequired",
        ),
        Rule(
            "disaggregated-needs-decode",
            "decode",
            f"!({_DIS}) || has(self.decode)",
            "serving.mode disaggregated needs a decode role: add spec.decode, or set serving.mode to "
            "aggregated and describe one spec.worker role",
            lambda s: s.serving.mode != "disaggregated" or s.decode is not None,
            "FieldValueRequired",
        ),
        Rule(
            "disaggregated-forbids-worker",
            "worker",
            f"!({_DIS}) || !has(self.worker)",
            "spec.worker is for serving.mode aggregated only: describe a disaggregated deployment with "
            "spec.prefill and spec.decode, or set serving.mode to aggregated",
            lambda s: s.serving.mode != "disaggregated" or s.worker is None,
            "FieldValueForbidden",
        ),
    ]


def _aggregated_rules() -> list[Rule[ModelDeploymentSpec]]:
    """serving.mode aggregated: one worker role, and nothing of disaggregated serving."""
    return [
        Rule(
            "aggregated-needs-worker",
            "worker",
            f"!({_AGG}) || has(self.worker)",
            "serving.mode aggregated needs a worker role: add spec.worker, or set serving.mode to "
            "disaggregated with spec.prefill and spec.decode",
            lambda s: s.serving.mode != "aggregated" or s.worker is not None,
            "FieldValueRequired",
        ),
        Rule(
            "aggregated-forbids-prefill",
            "prefill",
            f"!({_AGG}) || !has(self.prefill)",
            "spec.prefill is not allowed with serving.mode aggregated: remove it, or set serving.mode to "
            "disaggregated",
            lambda s: s.serving.mode != "aggregated" or s.prefill is None,
            "FieldValueForbidden",
        ),
        Rule(
            "aggregated-forbids-decode",
            "decode",
            f"!({_AGG}) || !has(self.decode)",
            "spec.decode is not allowed with serving.mode aggregated: describe the single role as "
            "spec.worker, or set serving.mode to disaggregated",
            lambda s: s.serving.mode != "aggregated" or s.decode is None,
            "FieldValueForbidden",
        ),
        Rule(
            "aggregated-forbids-ratio",
            "serving.prefillDecodeRatio",
            f"!({_AGG}) || !has(self.serving.prefillDecodeRatio)",
            "serving.prefillDecodeRatio applies to serving.mode disaggregated only: remove it",
            lambda s: s.serving.mode != "aggregated" or s.serving.prefill_decode_ratio is None,
            "FieldValueForbidden",
        ),
    ]


def _ratio_rules() -> list[Rule[ModelDeploymentSpec]]:
    """serving.ratioPolicy fixed: prefill groups follow decode groups by serving.prefillDecodeRatio."""
    return [
        Rule(
            "fixed-ratio-needs-ratio",
            "serving.prefillDecodeRatio",
            f"!({_DIS}) || self.serving.ratioPolicy != 'fixed' || has(self.serving.prefillDecodeRatio) "
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
            f"!({_DIS}) || self.serving.ratioPolicy != 'fixed' || !has(self.prefill) "
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


# --------------------------------------------------------------------------------------- each role


def _gpus(role: Role) -> int:
    return role.parallelism.tensor * role.parallelism.pipeline


def _gpus_cel(name: RoleName) -> str:
    """CEL for the GPUs of one group of the role."""
    return f"(self.{name}.parallelism.tensor * self.{name}.parallelism.pipeline)"


def _group_fills_nodes(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r, gpus, node = f"self.{name}", _gpus_cel(name), "self.topology.gpusPerNode"

    def fits_nodes(s: ModelDeploymentSpec) -> bool:
        role = s.role(name)
        if role is None:
            return True
        g, n = _gpus(role), s.topology.gpus_per_node
        return g <= n or g % n == 0

    return Rule(
        f"{name}-group-fills-nodes",
        f"{name}.parallelism",
        f"!has({r}) || !has({r}.parallelism) || {gpus} <= {node} || {gpus} % {node} == 0",
        f"a {name} group's GPUs (parallelism.tensor x parallelism.pipeline) must be at most "
        "topology.gpusPerNode or a multiple of it, so a multi-node group fills whole nodes: change "
        "tensor or pipeline",
        fits_nodes,
    )


def _group_fits_domain(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r, gpus = f"self.{name}", _gpus_cel(name)

    def fits_domain(s: ModelDeploymentSpec) -> bool:
        role = s.role(name)
        return role is None or _gpus(role) <= s.topology.gpus_per_domain

    return Rule(
        f"{name}-group-fits-domain",
        f"{name}.parallelism",
        f"!has({r}) || !has({r}.parallelism) || {gpus} <= self.topology.gpusPerDomain",
        f"a {name} group's GPUs (parallelism.tensor x parallelism.pipeline) exceed "
        "topology.gpusPerDomain, and a group must sit inside one NVLink domain: lower tensor or "
        "pipeline",
        fits_domain,
    )


def _expert_divides_tensor(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r = f"self.{name}"

    def expert_divides(s: ModelDeploymentSpec) -> bool:
        role = s.role(name)
        return role is None or role.parallelism.tensor % role.parallelism.expert == 0

    return Rule(
        f"{name}-expert-divides-tensor",
        f"{name}.parallelism.expert",
        f"!has({r}) || !has({r}.parallelism) || {r}.parallelism.tensor % {r}.parallelism.expert == 0",
        f"{name} parallelism.expert must divide parallelism.tensor (TensorRT-LLM needs "
        "moe_expert_parallel_size x moe_tensor_parallel_size = tensor_parallel_size): choose a divisor "
        "of tensor",
        expert_divides,
    )


def _replicas_within_bounds(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r, bounds = f"self.{name}", f"self.autoscaling.{name}"

    def replicas_in_bounds(s: ModelDeploymentSpec) -> bool:
        # With autoscaling off the bounds do nothing, so replicas (0 parks the role) is not held to them.
        role, b = s.role(name), getattr(s.autoscaling, name)
        if not s.autoscaling.enabled or role is None or role.replicas is None or b is None:
            return True
        return bool(b.min_replicas <= role.replicas <= b.max_replicas)

    return Rule(
        f"{name}-replicas-within-bounds",
        f"{name}.replicas",
        f"!self.autoscaling.enabled || !has({r}) || !has({r}.replicas) || !has({bounds}) "
        f"|| ({r}.replicas >= {bounds}.minReplicas && {r}.replicas <= {bounds}.maxReplicas)",
        f"spec.{name}.replicas must lie within autoscaling.{name}.minReplicas and maxReplicas when "
        "autoscaling is enabled: change the replicas or the bounds",
        replicas_in_bounds,
    )


def _bounds_need_role(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r, bounds = f"self.{name}", f"self.autoscaling.{name}"

    def bounds_need_role(s: ModelDeploymentSpec) -> bool:
        return getattr(s.autoscaling, name) is None or s.role(name) is not None

    return Rule(
        f"{name}-bounds-need-role",
        f"autoscaling.{name}",
        f"!has({bounds}) || has({r})",
        f"autoscaling.{name} sets bounds for a role this deployment does not have: remove it, or add "
        f"spec.{name}",
        bounds_need_role,
        "FieldValueForbidden",
    )


def _autoscaling_needs_bounds(name: RoleName) -> Rule[ModelDeploymentSpec]:
    r, bounds = f"self.{name}", f"self.autoscaling.{name}"

    def enabled_needs_bounds(s: ModelDeploymentSpec) -> bool:
        if not s.autoscaling.enabled or s.role(name) is None or getattr(s.autoscaling, name) is not None:
            return True
        # Under the fixed ratio policy prefill follows decode and needs no bounds of its own.
        return name == "prefill" and s.serving.ratio_policy == "fixed"

    needs_bounds_cel = f"!self.autoscaling.enabled || !has({r}) || has({bounds})"
    if name == "prefill":
        needs_bounds_cel += " || self.serving.ratioPolicy == 'fixed'"

    return Rule(
        f"{name}-autoscaling-needs-bounds",
        f"autoscaling.{name}",
        needs_bounds_cel,
        f"autoscaling.enabled needs bounds for the {name} groups: set autoscaling.{name}.minReplicas "
        "and maxReplicas",
        enabled_needs_bounds,
        "FieldValueRequired",
    )


def _role_rules(name: RoleName) -> list[Rule[ModelDeploymentSpec]]:
    """The rules on one role: its groups' GPUs against nodes and domains, and its autoscaling bounds."""
    return [
        _group_fills_nodes(name),
        _group_fits_domain(name),
        _expert_divides_tensor(name),
        _replicas_within_bounds(name),
        _bounds_need_role(name),
        _autoscaling_needs_bounds(name),
    ]


# ------------------------------------------------------------------------------------ the whole spec


def _gpu_resource_rule() -> Rule[ModelDeploymentSpec]:
    """GPUs come from parallelism, never from runtime.resources."""
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


SPEC_RULES: tuple[Rule[ModelDeploymentSpec], ...] = (
    *_disaggregated_rules(),
    *_aggregated_rules(),
    *_ratio_rules(),
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


def violations(spec: ModelDeploymentSpec) -> list[Rule[ModelDeploymentSpec]]:
    """The rules this spec breaks, in table order."""
    return [rule for rule in SPEC_RULES if not rule.check(spec)]


class ModelDeploymentSpec(SpecModel):
    """Desired state of a ModelDeployment."""

    model_config = ConfigDict(json_schema_extra=cel_rules([r.x_kubernetes_validation() for r in SPEC_RULES]))
    model: ModelSource = Field(description="The model to serve.")
    runtime: Runtime = Field(default_factory=Runtime, description="Worker container settings.")
    serving: Serving = Field(default_factory=Serving, description="Serving mode, router and ratio.")
    prefill: Role | None = Field(default=None, description="Prefill role (disaggregated mode).")
    decode: Role | None = Field(default=None, description="Decode role (disaggregated mode).")
    worker: Role | None = Field(default=None, description="The single worker role (aggregated mode).")
    speculative_decoding: SpeculativeDecoding = Field(
        default_factory=SpeculativeDecoding, description="Multi-token prediction."
    )
    topology: Topology = Field(default_factory=Topology, description="NVLink domains and placement.")
    autoscaling: Autoscaling = Field(
        default_factory=Autoscaling, description="KV-cache-driven autoscaling of the roles."
    )
    profile: Profile | None = Field(
        default=None,
        description="SLA and traffic: the operator fills parallelism, prefillDecodeRatio and MTP depth that "
        "the spec leaves out from a plan made for them (NVIDIA aiconfigurator).",
    )
    scheduling: Scheduling | None = Field(
        default=None,
        description="Node selector, tolerations, priority class and scheduler of the worker pods. Placement "
        "counts only the nodes whose labels match nodeSelector and whose NoSchedule/NoExecute taints the "
        "tolerations tolerate.",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ModelDeploymentSpec:
        broken = violations(self)
        if broken:
            raise rules_error([rule.error_text(self) for rule in broken])
        return self

    def role(self, name: RoleName) -> Role | None:
        """The role's spec, or None when the deployment has no such role."""
        role: Role | None = getattr(self, name)
        return role

    def roles(self) -> list[tuple[RoleName, Role]]:
        """The roles present, in a stable order."""
        return [(n, r) for n in ROLES if (r := self.role(n)) is not None]

    def left_to_plan(self) -> list[str]:
        """What a plan fills in (with spec.profile): roles without parallelism, the ratio, MTP depth."""
        if self.profile is None:
            return []
        out = [f"{n}.parallelism" for n, r in self.roles() if "parallelism" not in r.model_fields_set]
        if self.serving.mode == "disaggregated" and self.serving.prefill_decode_ratio is None:
            out.append("serving.prefillDecodeRatio")
        if "speculative_decoding" not in self.model_fields_set:
            out.append("speculativeDecoding.mtpDepth")
        return out
