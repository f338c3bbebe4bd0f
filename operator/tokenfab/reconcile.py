"""One idempotent reconcile pass of a ModelDeployment: observe -> plan -> apply -> status.

Creation, updates, operator restarts, a resync timer and child events all call `reconcile`; it compares
desired with observed state every time, so a restart at any point converges. Everything it remembers
lives in the cluster (children's labels, the resource's status).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tokenfab.adapters import metrics, telemetry
from tokenfab.adapters.kube import Kube, Obj
from tokenfab.api.errors import SpecError, parse_model_deployment
from tokenfab.api.models import (
    ROLES,
    Autoscaling,
    Condition,
    GroupPlacement,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    ProfileStatus,
    RoleName,
)
from tokenfab.autoscale import Reader, autoscale
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning import sla
from tokenfab.planning.autoscaling import Decision
from tokenfab.planning.groups import GroupView, NodeHealth, PodView, RolePlan, plan_role
from tokenfab.planning.status import Observed, build_status, merge_conditions, rfc3339
from tokenfab.planning.topology import Domain, GpuUse, NodeInfo, build_domains

log = logging.getLogger(__name__)

# Decode (or the aggregated worker) is planned first: it is the larger role and prefill follows it.
PLAN_ORDER: tuple[RoleName, ...] = ("decode", "worker", "prefill")


@dataclass
class Result:
    """What one pass did (for logs, tests and the operator's metrics)."""

    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    conditions_changed: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    plans: list[RolePlan] = field(default_factory=list)


# ------------------------------------------------------------------------------------ observation


def _time(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _ready_condition(node: Obj) -> dict[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return dict(cond)
    return None


def node_views(
    nodes: Iterable[Obj], domain_label: str, gpu_resource: str
) -> tuple[list[NodeInfo], dict[str, NodeHealth]]:
    infos, health = [], {}
    for n in nodes:
        meta, spec, status = n["metadata"], n.get("spec") or {}, n.get("status") or {}
        cond = _ready_condition(n)
        ready = bool(cond and cond.get("status") == "True")
        tainted = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in spec.get("taints") or [])
        gpus = int(str((status.get("allocatable") or {}).get(gpu_resource, "0")))
        infos.append(
            NodeInfo(
                name=meta["name"],
                domain=(meta.get("labels") or {}).get(domain_label),
                allocatable_gpus=gpus,
                ready=ready,
                schedulable=not spec.get("unschedulable") and not tainted,
            )
        )
        since = None if ready or cond is None else _time(cond.get("lastTransitionTime"))
        health[meta["name"]] = NodeHealth(ready=ready, not_ready_since=since)
    return infos, health


def pod_gpus(pod: Obj, gpu_resource: str) -> int:
    total = 0
    for ctr in pod.get("spec", {}).get("containers") or []:
        res = ctr.get("resources") or {}
        value = (res.get("limits") or {}).get(gpu_resource) or (res.get("requests") or {}).get(gpu_resource)
        total += int(str(value or 0))
    return total


def gpu_uses(pods: Iterable[Obj], gpu_resource: str) -> list[GpuUse]:
    uses = []
    for p in pods:
        gpus = pod_gpus(p, gpu_resource)
        if gpus:
            labels = p["metadata"].get("labels") or {}
            uses.append(GpuUse(gpus=gpus, node=p["spec"].get("nodeName"), domain=labels.get(c.LABEL_DOMAIN)))
    return uses


def _waiting(status: Obj) -> str:
    """Why a pod is not running yet: the scheduler's message, or a container's waiting reason."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled")
    for ctr in status.get("containerStatuses") or []:
        waiting = (ctr.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".rstrip(": ")
    return ""


def _pod_view(p: Obj) -> PodView:
    meta, status = p["metadata"], p.get("status") or {}
    ready_cond: dict[str, Any] = next(
        (cd for cd in status.get("conditions") or [] if cd.get("type") == "Ready"), {}
    )
    ready = ready_cond.get("status") == "True"
    return PodView(
        waiting=_waiting(status),
        ready_since=_time(ready_cond.get("lastTransitionTime")) if ready else None,
        name=meta["name"],
        rank=int(meta["labels"][c.LABEL_RANK]),
        phase=status.get("phase") or "Pending",
        ready=ready,
        node=p["spec"].get("nodeName"),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def group_views(pods: Iterable[Obj], recorded: set[str]) -> dict[RoleName, list[GroupView]]:
    by_group: dict[str, list[Obj]] = {}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        if labels.get(c.COMPONENT) == "worker" and c.LABEL_GROUP in labels:
            by_group.setdefault(labels[c.LABEL_GROUP], []).append(p)
    out: dict[RoleName, list[GroupView]] = {}
    for name, members in sorted(by_group.items()):
        first = members[0]["metadata"]
        labels, ann = first["labels"], first.get("annotations") or {}
        role: RoleName = labels[c.LABEL_ROLE]
        out.setdefault(role, []).append(
            GroupView(
                name=name,
                role=role,
                slot=int(labels[c.LABEL_SLOT]),
                revision=labels[c.LABEL_REVISION],
                domain=labels[c.LABEL_DOMAIN],
                size=int(ann.get(c.ANN_GROUP_SIZE, len(members))),
                gpus=int(ann.get(c.ANN_GROUP_GPUS, 0)),
                pods=tuple(_pod_view(p) for p in members),
                recorded=name in recorded,
            )
        )
    return out


def desired_groups(md: ModelDeployment) -> dict[RoleName, int]:
    """Groups per role: the spec's, or the autoscaler's decision (kept in status) when it is on."""
    spec = md.spec
    wanted = b.spec_groups(spec)
    scaler = md.status.autoscaling if md.status else None
    if spec.autoscaling.enabled and scaler is not None:
        for role, n in scaler.desired.items():
            if role in wanted:
                wanted[role] = n
        if "prefill" in wanted and "decode" in wanted and "prefill" not in scaler.desired:
            wanted["prefill"] = b.follow_ratio(spec, wanted["decode"], wanted["prefill"])
    return wanted


# ---------------------------------------------------------------------------------- spec.profile

# Polls a plan for (profile hash, request): the outcome once ready, None while it is being made.
Planner = Callable[[str, sla.PlanRequest], sla.PlanOutcome | None]


# Outcomes worth asking again for: the planner may be installed, or work, later.
RETRY_SECONDS = {sla.PLANNER_UNAVAILABLE: 60.0, sla.PLANNER_FAILED: 300.0}


@dataclass(frozen=True)
class Planning:
    """The spec with the plan merged in (in memory), status.profile, and the Planned condition; `wait`
    when no groups can be planned yet (no plan, or none possible)."""

    spec: ModelDeploymentSpec
    status: ProfileStatus | None
    condition: Condition | None
    wait: bool


def plan_profile(
    spec: ModelDeploymentSpec, old: ProfileStatus | None, planner: Planner | None, now: float
) -> Planning:
    """Fill what the spec leaves out from the plan for its profile (made once per profile hash, off the
    reconcile path by `planner`)."""
    if not spec.left_to_plan():
        return Planning(spec, None, None, wait=False)
    key = sla.profile_hash(spec)
    status = old if old is not None and old.profile_hash == key else None
    # The planner, not the profile, failed: ask again after a while.
    retry = RETRY_SECONDS.get(status.reason) if status is not None else None
    if status is not None and retry is not None and now - (_time(status.time) or 0.0) >= retry:
        status = None
    if status is None:
        if planner is None:
            outcome: sla.PlanOutcome | None = sla.PlanOutcome(
                ok=False, reason=sla.PLANNER_UNAVAILABLE, message="this operator runs without a planner"
            )
        else:
            outcome = planner(key, sla.request_for(spec))
        if outcome is None:
            msg = f"planning {', '.join(spec.left_to_plan())} for spec.profile with aiconfigurator"
            cond = Condition(type="Planned", status="Unknown", reason="Planning", message=msg)
            return Planning(spec, old, cond, wait=True)
        status = sla.plan_status(outcome, spec, rfc3339(now))
    if not status.ok:
        cond = Condition(type="Planned", status="False", reason=status.reason, message=status.message)
        return Planning(spec, status, cond, wait=True)
    try:
        merged = sla.apply_plan(spec, status)
    except ValueError as exc:
        cond = Condition(type="Planned", status="False", reason="PlanInvalid", message=str(exc))
        return Planning(spec, status, cond, wait=True)
    cond = Condition(type="Planned", status="True", reason=sla.PLANNED, message=status.message)
    return Planning(merged, status, cond, wait=False)


def _waiting_status(
    old: ModelDeploymentStatus | None, planning: Planning, generation: int, now: float
) -> tuple[ModelDeploymentStatus, list[Condition]]:
    assert planning.condition is not None
    planned = planning.condition
    reason = "Planning" if planned.status == "Unknown" else planned.reason
    ready = Condition(type="Ready", status="False", reason=reason, message=planned.message)
    base = old or ModelDeploymentStatus()
    conds, changed = merge_conditions(base.conditions, [ready, planned], generation, now)
    status = base.model_copy(
        update={"conditions": conds, "profile": planning.status, "observed_generation": generation}
    )
    return status, changed


# ------------------------------------------------------------------------------------------- pass


def _default_reader(url: str, query: str) -> metrics.Reading:
    return metrics.read(url, query)


def telemetry_hook(namespace: str, name: str, role: str, metric: str, d: Decision, a: Autoscaling) -> None:
    target = a.target_kv_cache_utilization if metric == "kv_cache_utilization" else a.target_queue_depth
    telemetry.AUTOSCALER_TARGET.labels(namespace, name, role, metric).set(target)
    if d.signal is not None:
        telemetry.AUTOSCALER_SIGNAL.labels(namespace, name, role, metric).set(d.signal)
    telemetry.SCALING_DECISIONS.labels(namespace, name, role, d.direction).inc()


def plan_all(
    spec: ModelDeploymentSpec,
    desired: dict[RoleName, int],
    groups: dict[RoleName, list[GroupView]],
    domains: dict[str, Domain],
    health: dict[str, NodeHealth],
    now: float,
) -> tuple[list[RolePlan], dict[str, Domain]]:
    """Plan every role present in the spec or in the cluster (a removed role plans 0 groups)."""
    plans = []
    for role in PLAN_ORDER:
        if role not in desired and role not in groups:
            continue
        in_spec = spec.role(role) is not None
        shape = b.group_shape(spec, role) if in_spec else _observed_shape(groups[role], spec)
        revision = b.role_revision(spec, role) if in_spec else ""
        plan, domains = plan_role(
            role,
            desired.get(role, 0),
            revision,
            shape,
            groups.get(role, []),
            domains,
            spec.topology.placement,
            health,
            now,
            float(spec.topology.node_failure_toleration_seconds),
        )
        plans.append(plan)
    return plans, domains


def _observed_shape(groups: list[GroupView], spec: ModelDeploymentSpec) -> Any:
    from tokenfab.planning.topology import GroupShape

    return GroupShape(gpus=max(g.gpus for g in groups) or 1, gpus_per_node=spec.topology.gpus_per_node)


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    now: float,
    reader: Reader = _default_reader,
    planner: Planner | None = None,
) -> Result | None:
    """One pass. Returns None when the ModelDeployment is gone."""
    body = kube.model_deployment(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    try:
        md = parse_model_deployment(body)
    except SpecError as exc:  # admission should have refused it; say so instead of crashing
        kube.event(body, "Warning", "InvalidSpec", str(exc))
        return None
    planning = plan_profile(md.spec, md.status.profile if md.status else None, planner, now)
    if planning.wait:  # no plan yet (or none possible): say so, and leave every child as it is
        waiting, changed_conds = _waiting_status(md.status, planning, md.metadata.generation or 0, now)
        new_body = waiting.model_dump(by_alias=True, exclude_none=True, mode="json")
        if new_body != body.get("status"):
            kube.apply_status(namespace, name, new_body)
        for cond in changed_conds:
            kind = "Warning" if cond.status == "False" and cond.reason != "Planning" else "Normal"
            kube.event(body, kind, cond.reason, f"{cond.type}={cond.status}: {cond.message}")
        return Result(conditions_changed=[f"{cd.type}={cd.status}/{cd.reason}" for cd in changed_conds])
    md = md.model_copy(update={"spec": planning.spec})
    spec = md.spec
    owner = b.Owner(name=name, namespace=namespace, uid=body["metadata"]["uid"])
    topo = spec.topology

    # observe
    pods = kube.children(namespace, name, "Pod")
    nodes, health = node_views(kube.nodes(), topo.domain_label, topo.gpu_resource)
    domains = build_domains(nodes, gpu_uses(kube.gpu_pods(), topo.gpu_resource))
    recorded = {p.group for p in (md.status.placement if md.status else [])}
    groups = group_views(pods, recorded)
    frontend = kube.get("apps/v1", "Deployment", b.frontend_name(owner), namespace)

    # autoscale (its decision lives in status and drives the plan), then plan
    desired = desired_groups(md)
    outcome = None
    if spec.autoscaling.enabled:
        outcome = autoscale(md, groups, health, domains, now, reader)
        desired.update(outcome.desired)
        if "prefill" in desired and "decode" in desired and spec.serving.ratio_policy == "fixed":
            desired["prefill"] = b.follow_ratio(spec, desired["decode"], desired["prefill"])
    plans, _ = plan_all(spec, desired, groups, domains, health, now)

    if any(b.uses_compute_domain(spec, p.role) and p.create for p in plans if spec.role(p.role)) and not (
        kube.has_kind(c.COMPUTE_DOMAIN_API, "ComputeDomain")
    ):
        for p in plans:
            if spec.role(p.role) is not None and b.uses_compute_domain(spec, p.role) and p.create:
                p.create = []
                p.blocked = (
                    f"{p.role} groups need an NVIDIA ComputeDomain ({c.COMPUTE_DOMAIN_API}) but its CRD is "
                    "not installed: install NVIDIA's DRA driver, or set spec.topology.computeDomain to false"
                )

    # apply: shared children first, then deletions (free capacity), then new groups whole
    result = Result(plans=plans)
    kube.apply(b.workers_service(owner))
    kube.apply(b.frontend_deployment(owner, spec))
    kube.apply(b.frontend_service(owner))
    for role in ROLES:
        if spec.role(role) is not None:
            kube.apply(b.engine_configmap(owner, spec, role))
        else:
            kube.delete("v1", "ConfigMap", b.engine_configmap_name(owner, role), namespace)
    for plan in plans:
        for d in plan.delete:
            kube.delete_group(namespace, d.name)
            result.deleted.append(d.name)
            kube.event(
                body,
                "Normal" if d.reason != "Broken" else "Warning",
                f"GroupDeleted{d.reason}",
                f"deleted group {d.name} ({d.reason.lower()}"
                + (f": {plan.broken_reasons[d.name]})" if d.name in plan.broken_reasons else ")"),
            )
        for cr in plan.create:
            cd = b.compute_domain(owner, spec, cr.role, cr.slot)
            if cd is not None:
                kube.apply(cd)
            for pod in b.group_pods(owner, spec, cr.role, cr.slot, cr.domain, cr.revision):
                kube.apply(pod)
            group = b.group_name(owner, cr.role, cr.slot)
            result.created.append(group)
            if cr.reason != "Complete":
                kube.event(
                    body,
                    "Normal",
                    f"GroupCreated{cr.reason}",
                    f"created group {group}: {plan.shape.gpus} GPUs on {plan.shape.nodes} node(s) "
                    f"in NVLink domain {cr.domain}",
                )

    # status
    placement = _placement(plans, groups, owner)
    available = int(((frontend or {}).get("status") or {}).get("availableReplicas") or 0)
    obs = Observed(md.metadata.generation or 0, available, spec.serving.frontend_replicas, b.endpoint(owner))
    status, changed = build_status(
        plans,
        placement,
        obs,
        md.status,
        now,
        autoscaling=outcome.status if outcome else None,
        extra=[*(outcome.conditions if outcome else ()), *filter(None, [planning.condition])],
    )
    status.profile = planning.status
    if planning.condition is None:
        status.conditions = [cd for cd in status.conditions if cd.type != "Planned"]
    for role, metric, dec in outcome.decisions if outcome else []:
        telemetry_hook(namespace, name, role, metric, dec, spec.autoscaling)
        if dec.direction != "hold":
            kube.event(
                body,
                "Normal",
                "ScaledUp" if dec.direction == "up" else "ScaledDown",
                f"{role} {dec.current} -> {dec.desired} groups: {metric} {dec.message} ({dec.reason})",
            )
        result.decisions.append(f"{role}:{dec.direction}:{dec.reason}")
    new_status = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    if new_status != body.get("status"):
        kube.apply_status(namespace, name, new_status)
    for cond in changed:
        kind = (
            "Warning"
            if (cond.type in ("Degraded",) and cond.status == "True")
            or (cond.type in ("Ready", "Placed") and cond.status == "False")
            else "Normal"
        )
        kube.event(body, kind, cond.reason, f"{cond.type}={cond.status}: {cond.message}")
        result.conditions_changed.append(f"{cond.type}={cond.status}/{cond.reason}")
    return result


def _placement(
    plans: list[RolePlan], groups: dict[RoleName, list[GroupView]], owner: b.Owner
) -> list[GroupPlacement]:
    out = []
    for plan in plans:
        gone = {d.name for d in plan.delete}
        for g in groups.get(plan.role, []):
            if g.name not in gone and plan.states.get(g.name) != "terminating":
                out.append(GroupPlacement(group=g.name, role=g.role, domain=g.domain, gpus=g.gpus))
        for cr in plan.create:
            name = b.group_name(owner, cr.role, cr.slot)
            if not any(p.group == name for p in out):
                out.append(GroupPlacement(group=name, role=cr.role, domain=cr.domain, gpus=plan.shape.gpus))
    return out
