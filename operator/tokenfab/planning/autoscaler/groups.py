"""How many groups each role runs: the spec's counts, or the autoscaler's decisions as status keeps them,
with prefill following decode by the fixed prefill:decode ratio (the one place the ratio is applied), and
how many next groups a role may still get (the headroom pre-staging keeps warm)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from tokenfab.api.models import ModelDeployment, ModelDeploymentSpec, RoleName


def remembered_groups(md: ModelDeployment) -> dict[RoleName, int]:
    """Groups per role: the spec's, or the autoscaler's last decision (kept in status) when it is on."""
    spec = md.spec
    wanted = spec_groups(spec)
    scaler = md.status.autoscaling if md.status else None
    if spec.autoscaling.enabled and scaler is not None:
        wanted.update({role: n for role, n in scaler.desired.items() if role in wanted})
    return with_ratio(spec, wanted)


def ratio_prefill(decode_groups: int, ratio: str) -> int:
    """Prefill groups that follow `decode_groups` by a "P:D" ratio: ceil(decode x P / D)."""
    p, d = (int(x) for x in ratio.split(":"))
    return math.ceil(decode_groups * p / d)


def spec_groups(spec: ModelDeploymentSpec) -> dict[RoleName, int]:
    """Groups per role that the spec asks for (before the autoscaler, which may override them)."""
    out: dict[RoleName, int] = {}
    for name, role in spec.roles():
        out[name] = 1 if role.replicas is None else role.replicas
    return with_ratio(spec, out)


def with_ratio(spec: ModelDeploymentSpec, groups: Mapping[RoleName, int]) -> dict[RoleName, int]:
    """Groups per role with prefill following decode by the fixed ratio: the one place a count of groups
    gets the ratio (the spec's counts, the autoscaler's decisions and the remembered ones all come
    through it)."""
    out = dict(groups)
    if "prefill" in out and "decode" in out:
        out["prefill"] = follow_ratio(spec, out["decode"], out["prefill"])
    return out


def follow_ratio(spec: ModelDeploymentSpec, decode_groups: int, prefill_groups: int) -> int:
    """With the fixed ratio policy prefill follows decode (clamped to prefill bounds, if any)."""
    ratio = spec.serving.prefill_decode_ratio
    if spec.serving.ratio_policy != "fixed" or ratio is None:
        return prefill_groups
    n = ratio_prefill(decode_groups, ratio)
    bounds = spec.autoscaling.prefill
    if bounds is not None and spec.autoscaling.enabled:
        n = max(bounds.min_replicas, min(bounds.max_replicas, n))
    return n


def headroom(spec: ModelDeploymentSpec, role: RoleName, desired: Mapping[RoleName, int]) -> int:
    """How many of a role's next groups to stage: prestageGroups, no more than the autoscaler may still
    add (its maxReplicas for the role, when it scales it); prefill following decode by a fixed ratio,
    no more than decode's staged groups would bring."""
    count, have = spec.model.cache.prestage_groups, desired.get(role, 0)
    ratio = spec.serving.prefill_decode_ratio
    if role == "prefill" and spec.serving.ratio_policy == "fixed" and ratio and "decode" in desired:
        more = follow_ratio(spec, desired["decode"] + headroom(spec, "decode", desired), have)
        return max(0, min(count, more - have))
    bounds = getattr(spec.autoscaling, role, None) if spec.autoscaling.enabled else None
    return count if bounds is None else max(0, min(count, bounds.max_replicas - have))


def headrooms(spec: ModelDeploymentSpec, desired: Mapping[RoleName, int]) -> dict[RoleName, int]:
    """`headroom` of every role of the spec, for `desired` groups."""
    return {role: headroom(spec, role, desired) for role, _ in spec.roles()}
