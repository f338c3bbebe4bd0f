"""Acting on a plan: the pass's writes through the one writer (server-side apply), in parallel where they
are independent, with every refusal kept (in the API server's words) for status and Events."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.errors import SpecError
from tokenfab.api.models import (
    API_VERSION,
    KIND,
    Condition,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RoleName,
)
from tokenfab.fleet.view import Key
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning.groups import Create, Delete, RolePlan
from tokenfab.planning.status import merge_conditions
from tokenfab.runtime import Context, Memory, Result

log = logging.getLogger(__name__)
# Old kopf bookkeeping on objects made by earlier tokenfab versions (removed when seen).
LEGACY_FINALIZER = c.FINALIZER
LEGACY_ANNOTATIONS = (f"{c.DOMAIN}/last-handled-configuration", f"{c.DOMAIN}/last-handled")


def gang_mode(ctx: Context, spec: ModelDeploymentSpec) -> b.GangMode:
    mode = ctx.settings.gang
    if mode in ("podgroup", "gates"):
        return mode  # type: ignore[return-value]
    if not any(b.group_shape(spec, r).nodes > 1 for r, _ in spec.roles()):
        return "gates"  # one-pod groups need neither
    try:
        return "podgroup" if ctx.kube.has_kind(c.POD_GROUP_API, "PodGroup") else "gates"
    except ApiError:
        return "gates"


def compute_domain_block(ctx: Context, spec: ModelDeploymentSpec) -> Callable[[RoleName], str]:
    if not any(b.uses_compute_domain(spec, r) for r, _ in spec.roles()):
        return lambda role: ""
    try:
        served = ctx.kube.has_kind(c.COMPUTE_DOMAIN_API, "ComputeDomain")
    except ApiError:
        served = False
    if served:
        return lambda role: ""

    def why(role: RoleName) -> str:
        if not b.uses_compute_domain(spec, role):
            return ""
        return (
            f"{role} groups need an NVIDIA ComputeDomain ({c.COMPUTE_DOMAIN_API}) but its CRD is not "
            "installed: install NVIDIA's DRA driver, or set spec.topology.computeDomain to false"
        )

    return why


def wait_all(futures: list[tuple[Future[Any], Any]], result: Result) -> list[Any]:
    """Wait for submitted writes; returns the tags of the ones that failed (errors go to the result)."""
    failed = []
    for fut, tag in futures:
        try:
            fut.result()
        except ApiError as exc:
            result.errors.append(exc)
            failed.append(tag)
    return failed


@dataclass
class Submitted:
    """The writes a pass handed to the writer, still in flight."""

    shared: list[tuple[Future[Any], Any]]
    deletes: list[tuple[Future[Any], Any]]
    creates: list[tuple[Future[Any], Any]]
    pending: list[tuple[RolePlan, Create, str, list[Obj]]]
    gang: b.GangMode
    # new groups whose ComputeDomain has no IMEX channel template yet: only the ComputeDomain was written
    channel_waits: list[tuple[RolePlan, str]] = field(default_factory=list)

    def futures(self) -> list[Future[Any]]:
        return [f for f, _ in (*self.shared, *self.deletes, *self.creates)]


def submit(
    ctx: Context, key: Key, owner: b.Owner, spec: ModelDeploymentSpec, plans: list[RolePlan], now: float
) -> Submitted:
    """Every apply and delete of the pass at once (the shared children that differ: the workers'
    headless Service, the frontend Deployment and Service, the engine ConfigMaps of the current revisions,
    a PodDisruptionBudget per role; groups to delete; every pod of every new group with its PodGroup),
    handed to the writer's threads. Nothing waits here but once in a deployment's life: its first groups
    wait for the ServiceAccount their pods name (a pod naming one that does not exist is refused)."""
    # In the order of the longest chains to Ready: the new groups' PodGroups and pods (the scheduler
    # binds none of a group before it has seen every one, then kubelets start them), after the workers'
    # headless Service that selects them (the endpoints controller, seeing pods and a new Service at
    # once, may race itself); then the frontend Deployment and Service (its controller, ReplicaSet and
    # pod follow, ready well before a gang) and the rest.
    shared = _apply_changed(ctx, key, owner, [b.workers_service(owner, spec)], now)
    # The pods' identity, in order: a RoleBinding is checked against its Role (RBAC escalation check: it
    # must exist first), and a pod naming a ServiceAccount that does not exist is refused, so the first
    # groups of a deployment wait for it (once in its life).
    sa, role, binding = b.discovery_rbac(owner, spec) or (None, None, None)
    identity = _apply_changed(ctx, key, owner, [m for m in (sa, role) if m is not None], now)
    if identity and (binding is not None or any(p.create for p in plans)):
        wait([f for f, _ in identity])
    shared += identity
    if binding is not None:
        shared += _apply_changed(ctx, key, owner, [binding], now)
    gang = gang_mode(ctx, spec) if any(p.create for p in plans) else "gates"
    creates, pending, channel_waits = _submit_creates(ctx, owner, spec, plans, gang)
    # The per-node model caches the pods mount, the new ones' included (a pod whose claim is not there yet
    # waits for it); one that could not be made is made again by a later pass.
    nodes = {n for p in ctx.view.pods(key) if (n := p.pinned or p.node)}
    nodes |= b.pinned_nodes(p for *_, new in pending for p in new)
    shared += _apply_changed(ctx, key, owner, b.model_cache_claims(owner, spec, nodes), now)
    rest = [b.frontend_deployment(owner, spec), b.frontend_service(owner)]
    rest += [b.engine_configmap(owner, spec, role) for role, _ in spec.roles()]
    rest += [
        b.pod_disruption_budget(owner, p.role, p.desired * p.shape.nodes) for p in plans if spec.role(p.role)
    ]
    shared += _apply_changed(ctx, key, owner, rest, now) + _delete_stale(ctx, key, owner, spec)
    deletes = _submit_deletes(ctx, key, spec, plans)
    return Submitted(shared, deletes, creates, pending, gang, channel_waits)


def complete(
    ctx: Context,
    key: Key,
    body: Obj,
    spec: ModelDeploymentSpec,
    plans: list[RolePlan],
    result: Result,
    now: float,
    sub: Submitted,
) -> None:
    """Once the API server has answered every submitted write: what each answer means (room given back
    for a group that could not be created whole, which is removed again; Events), then the second round
    trip: the scheduling gates of the groups that now exist whole, lifted together, and routing."""
    shared, deletes, creates, pending, gang = sub.shared, sub.deletes, sub.creates, sub.pending, sub.gang
    failed_shared = set(wait_all(shared, result))
    failed_deletes = {d.name for _, d in wait_all(deletes, result)}
    failed_groups = set(wait_all(creates, result))
    mem = ctx.mem(key)
    for _, tag in shared:
        if tag is not None and tag not in failed_shared:
            mem.applied[tag[0]] = (tag[1], now)
            result.applied.append(f"{tag[0][0]}/{tag[0][1]}")
    for _, (plan, d) in deletes:
        if d.name in failed_deletes:
            continue
        ctx.ledger.release(key, d.name)
        result.deleted.append(d.name)
        doomed = {p.name for p in ctx.view.pods(key) if p.labels.get(c.LABEL_GROUP) == d.name}
        ctx.expectations.expect(key, now, deleted=doomed)
        why = plan.broken_reasons.get(d.name)
        if d.reason in ("Drained", "DrainTimedOut"):
            _drain_event(ctx, key, body, d)
            continue
        ctx.kube.post_event(
            body,
            "Normal" if d.reason != "Broken" else "Warning",
            f"GroupDeleted{d.reason}",
            f"deleted group {d.name} ({d.reason.lower()}" + (f": {why})" if why else ")"),
        )
    refusals: dict[str, str] = {}  # a failed group's first refusal, in the API server's words
    for fut, tag in creates:  # (all answered by now)
        if tag in failed_groups and fut.exception() is not None:
            refusals.setdefault(tag, str(fut.exception())[:300])
    for plan, group in sub.channel_waits:
        # (its room is promised again by the next pass, a second from now, which writes the pods)
        ctx.ledger.release(key, group)
        plan.unbound.setdefault(
            group,
            f"waiting for the IMEX channel of ComputeDomain {b.compute_domain_name(group)} (its resource "
            "claim template, made by NVIDIA's DRA driver)",
        )
        result.channel_waits.append(group)
    for plan, cr, group, pods in pending:
        if group in failed_groups:
            # Not whole: take back what was made (its ComputeDomain too), and the room promised to it.
            ctx.ledger.release(key, group)
            plan.refused[group] = refusals.get(group, "refused")
            try:
                ctx.kube.delete_group(key[0], group, b.uses_compute_domain(spec, cr.role))
            except ApiError as exc:
                result.errors.append(exc)
            continue
        ctx.expectations.expect(key, now, created={p["metadata"]["name"] for p in pods})
        result.created.append(group)
        plan.unbound.setdefault(
            group,
            "created; its PodGroup follows once every pod's IMEX channel claim exists"
            if b.admits_late(spec, cr.role, gang)
            else "created; waiting for the scheduler to bind it",
        )
        if cr.reason != "Complete":
            ctx.kube.post_event(
                body,
                "Normal",
                f"GroupCreated{cr.reason}",
                f"created group {group}: {plan.shape.gpus} GPUs on {plan.shape.nodes} node(s) "
                f"in NVLink domain {cr.domain}" + (f" ({', '.join(cr.nodes)})" if cr.nodes else ""),
            )
        if b.gang_of(spec, cr.role, gang) == "gates":
            plan.release.append(group)  # released right away: every pod of it exists now
    release_groups(ctx, key, plans, result, now)
    meta = body["metadata"]
    owner = b.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    admit_gangs(ctx, key, owner, spec, plans, result)
    _routing(ctx, key, body, plans, result, now)


def _drain_event(ctx: Context, key: Key, body: Obj, d: Delete) -> None:
    pods = [p for p in ctx.view.pods(key) if p.labels.get(c.LABEL_GROUP) == d.name]
    started = next(
        (p.annotations.get(c.ANN_DRAIN_INFLIGHT) for p in pods if c.ANN_DRAIN_INFLIGHT in p.annotations), ""
    )
    took = f"{d.drained_for:.0f} s" if d.drained_for is not None else "no time"
    waited = f", waited for {started} request(s) in flight" if started else ""
    if d.reason == "Drained":
        message = f"drained group {d.name} in {took}{waited}; deleting it"
        ctx.kube.post_event(body, "Normal", "GroupDrained", message)
    else:
        cut = "an unknown number of" if d.inflight is None else f"{d.inflight:.0f}"
        ctx.kube.post_event(
            body,
            "Warning",
            "GroupDrainTimedOut",
            f"group {d.name} still had {cut} request(s) in flight after {took} (drainSeconds{waited}); "
            "deleting it cuts them",
        )


def _routing(ctx: Context, key: Key, body: Obj, plans: list[RolePlan], result: Result, now: float) -> None:
    """Groups into and out of routing: a group starts draining (its pods marked with when, its leader's
    routable condition False), a drain is cancelled (True again), and a new leader pod whose containers are
    ready is made routable (the readiness gate a kubelet does not set by itself)."""
    mem = ctx.mem(key)
    pods = ctx.view.pods(key)
    by_group: dict[str, list[Any]] = {}
    for p in pods:
        if c.LABEL_GROUP in p.labels:
            by_group.setdefault(p.labels[c.LABEL_GROUP], []).append(p)
    futures: list[tuple[Future[Any], Any]] = []

    def once(pod: str, what: str) -> bool:
        """Whether to write now: not when the same write went out moments ago (the watch lags)."""
        last = mem.pod_writes.get((pod, what))
        if last is not None and now - last < ctx.settings.applied_grace:
            return False
        mem.pod_writes[(pod, what)] = now
        return True

    def mark(group: str, draining: bool, inflight: float | None, reason: str) -> None:
        for p in by_group.get(group, []):
            ann: dict[str, Any] = (
                {
                    c.ANN_DRAINING: f"{now:.3f}",
                    c.ANN_DRAIN_INFLIGHT: "" if inflight is None else f"{inflight:.0f}",
                }
                if draining
                else {c.ANN_DRAINING: None, c.ANN_DRAIN_INFLIGHT: None}
            )
            if once(p.name, f"mark-{draining}"):
                futures.append(
                    (
                        ctx.kube.pool.submit(
                            ctx.kube.merge_patch,
                            "v1",
                            "Pod",
                            key[0],
                            p.name,
                            {"metadata": {"annotations": ann}},
                        ),
                        group,
                    )
                )
            if p.labels.get(c.LABEL_RANK) == "0" and once(p.name, f"routable-{not draining}"):
                routable(
                    p.name, not draining, reason, "taken out of routing to drain" if draining else "serving"
                )

    def routable(pod: str, value: bool, reason: str, message: str) -> None:
        set_it = ctx.kube.set_pod_condition
        futures.append(
            (ctx.kube.pool.submit(set_it, key[0], pod, c.ROUTABLE_CONDITION, value, reason, message), pod)
        )

    for plan in plans:
        for d in plan.drain:
            mark(d.name, True, d.inflight, "Draining")
            ctx.kube.post_event(
                body,
                "Normal",
                "GroupDraining",
                f"draining group {d.name} ({d.reason.lower()}): out of routing, "
                + (
                    f"{d.inflight:.0f} request(s) in flight"
                    if d.inflight is not None
                    else "in-flight requests unknown"
                )
                + f"; deleted once idle, or after {ctx_drain_seconds(body)} s",
            )
            result.draining.append(d.name)
        for group in plan.undrain:
            mark(group, False, None, "DrainCancelled")
            ctx.kube.post_event(
                body, "Normal", "GroupDrainCancelled", f"group {group} is needed again: back in routing"
            )
        draining = set(plan.draining) | {d.name for d in plan.drain}
        for group, state in plan.states.items():
            if group in draining or state in ("deleting", "broken"):
                continue
            for p in by_group.get(group, []):
                if (
                    p.labels.get(c.LABEL_RANK) == "0"
                    and p.containers_ready
                    and p.routable is not True
                    and not p.deleting
                    and c.ANN_DRAINING not in p.annotations
                    and once(p.name, "routable-True")
                ):
                    routable(p.name, True, "Serving", "its containers are ready")
    wait_all(futures, result)


def ctx_drain_seconds(body: Obj) -> int:
    return int(((body.get("spec") or {}).get("serving") or {}).get("drainSeconds", 600))


def _apply_changed(
    ctx: Context, key: Key, owner: b.Owner, wanted: list[Obj], now: float
) -> list[tuple[Future[Any], Any]]:
    """Apply each shared child only when its manifest differs from what the cluster (or this process's
    last write) holds."""
    mem = ctx.mem(key)
    futures: list[tuple[Future[Any], Any]] = []
    for manifest in wanted:
        m = b.with_applied_hash(manifest)
        h = m["metadata"]["annotations"][c.ANN_APPLIED_HASH]
        ident = (m["kind"], m["metadata"]["name"])
        seen = ctx.view.child(m["kind"], owner.namespace, m["metadata"]["name"])
        if seen is not None and seen.applied_hash == h:
            continue
        last = mem.applied.get(ident)
        if last is not None and last[0] == h and now - last[1] < ctx.settings.applied_grace:
            continue  # written moments ago; the watch has not shown it yet
        futures.append((ctx.kube.pool.submit(ctx.kube.apply, m), (ident, h)))
    return futures


def _delete_stale(
    ctx: Context, key: Key, owner: b.Owner, spec: ModelDeploymentSpec
) -> list[tuple[Future[Any], Any]]:
    """Engine ConfigMaps of revisions no group uses any more, the budgets of roles that are gone, model
    cache claims of another storage class or size (a claim still mounted goes when its last pod does), and
    the discovery identity once no pod of the deployment needs it (serving.discovery left kubernetes and
    every pod is of the current revisions)."""
    futures: list[tuple[Future[Any], Any]] = []
    in_use = {(p.labels.get(c.LABEL_ROLE), p.labels.get(c.LABEL_REVISION)) for p in ctx.view.pods(key)}
    current = {(role, b.role_revision(spec, role)) for role, _ in spec.roles()}
    legacy_done = {role for role, rev in current if all(r == rev for ro, r in in_use if ro == role)}
    for cm in ctx.view.children("ConfigMap", key):
        stale = cm.revision and (cm.role, cm.revision) not in in_use | current
        # (one ConfigMap per role, rewritten in place, before revisions had their own)
        legacy = not cm.revision and cm.name == f"{owner.name}-{cm.role}-engine" and cm.role in legacy_done
        if stale or legacy:
            futures.append(
                (ctx.kube.pool.submit(ctx.kube.delete, "v1", "ConfigMap", cm.name, owner.namespace), None)
            )
    roles = {r for r, _ in spec.roles()}
    for pdb in ctx.view.children("PodDisruptionBudget", key):
        if pdb.role and pdb.role not in roles:
            futures.append(
                (
                    ctx.kube.pool.submit(
                        ctx.kube.delete, "policy/v1", "PodDisruptionBudget", pdb.name, owner.namespace
                    ),
                    None,
                )
            )
    wanted = {m["metadata"]["name"] for m in b.model_cache_claims(owner, spec, [pvc.node for pvc in
              ctx.view.children("PersistentVolumeClaim", key)])}  # fmt: skip
    for pvc in ctx.view.children("PersistentVolumeClaim", key):
        if pvc.node and pvc.name not in wanted:
            futures.append((ctx.kube.pool.submit(ctx.kube.delete, "v1", "PersistentVolumeClaim", pvc.name,
                                                 owner.namespace), None))  # fmt: skip
    if not b.uses_kubernetes_discovery(spec) and in_use <= current:
        for api_version, kind in DISCOVERY_KINDS:
            for child in ctx.view.children(kind, key):
                futures.append((ctx.kube.pool.submit(ctx.kube.delete, api_version, kind, child.name,
                                                     owner.namespace), None))  # fmt: skip
    return futures


DISCOVERY_KINDS = (
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("v1", "ServiceAccount"),
)


def _submit_deletes(
    ctx: Context, key: Key, spec: ModelDeploymentSpec, plans: list[RolePlan]
) -> list[tuple[Future[Any], Any]]:
    futures: list[tuple[Future[Any], Any]] = []
    for plan in plans:
        for d in plan.delete:
            cd = spec.role(plan.role) is not None and b.uses_compute_domain(spec, plan.role)
            futures.append((ctx.kube.pool.submit(ctx.kube.delete_group, key[0], d.name, cd), (plan, d)))
    return futures


def _submit_creates(
    ctx: Context, owner: b.Owner, spec: ModelDeploymentSpec, plans: list[RolePlan], gang: b.GangMode
) -> tuple[
    list[tuple[Future[Any], Any]], list[tuple[RolePlan, Create, str, list[Obj]]], list[tuple[RolePlan, str]]
]:
    """Every object of every new group at once (a pod naming a PodGroup that does not exist yet waits for
    it). A group with a ComputeDomain is the exception: its pods are written once NVIDIA's DRA driver has
    made the domain's IMEX channel template (a pod naming a missing template gets a Warning from the
    claim controller, and its claim comes late); until then only the ComputeDomain is written."""
    pending: list[tuple[RolePlan, Create, str, list[Obj]]] = []
    futures: list[tuple[Future[Any], Any]] = []
    waits: list[tuple[RolePlan, str]] = []
    for plan in plans:
        for cr in plan.create:
            group = b.group_name(owner, cr.role, cr.slot)
            cd = b.compute_domain(owner, spec, cr.role, cr.slot)
            if cd is not None:
                futures.append((ctx.kube.pool.submit(ctx.kube.apply, cd), None))
                if not _channel_ready(ctx, owner.namespace, b.compute_domain_name(group)):
                    waits.append((plan, group))
                    continue
            pods = b.group_pods(
                owner, spec, cr.role, cr.slot, cr.domain, cr.revision, cr.nodes, cr.ranks, gang
            )
            objs: list[Obj] = []
            if b.gang_of(spec, cr.role, gang) == "podgroup" and not b.admits_late(spec, cr.role, gang):
                objs.append(b.pod_group(owner, spec, cr.role, cr.slot))
            pending.append((plan, cr, group, pods))
            for m in [*objs, *pods]:
                futures.append((ctx.kube.pool.submit(ctx.kube.apply, m), group))
    return futures, pending, waits


def _channel_ready(ctx: Context, namespace: str, template: str) -> bool:
    """Whether the IMEX channel's ResourceClaimTemplate of a ComputeDomain exists (NVIDIA's DRA driver
    makes it, in the ComputeDomain's namespace, under the name the ComputeDomain gives)."""
    try:
        return (
            ctx.kube.get(c.RESOURCE_CLAIM_TEMPLATE_API, "ResourceClaimTemplate", template, namespace)
            is not None
        )
    except ApiError:
        return False


def admit_gangs(
    ctx: Context,
    key: Key,
    owner: b.Owner,
    spec: ModelDeploymentSpec,
    plans: list[RolePlan],
    result: Result,
) -> None:
    """Write the PodGroup of each group that waits for it (`builders.admits_late`) once every pod of the
    group exists and has its resource claims; once per group in this process (a write of an unchanged
    PodGroup after a restart is harmless). A group with a bound pod has its PodGroup already."""
    mem = ctx.mem(key)
    if not any(b.uses_compute_domain(spec, p.role) for p in plans):
        mem.admitted.clear()
        return
    gang = gang_mode(ctx, spec)
    pods = ctx.view.pods(key)
    seen: set[str] = set()
    futures = []
    for plan in plans:
        if not b.admits_late(spec, plan.role, gang):
            continue
        by_group: dict[str, list[Any]] = {}
        for p in pods:
            if p.labels.get(c.LABEL_ROLE) == plan.role and c.LABEL_GROUP in p.labels:
                by_group.setdefault(p.labels[c.LABEL_GROUP], []).append(p)
        for group, members in by_group.items():
            seen.add(group)
            if group in mem.admitted or group in result.created:
                continue
            if any(p.node for p in members):
                mem.admitted.add(group)
                continue
            whole = {int(p.labels.get(c.LABEL_RANK, "-1")) for p in members} == set(range(plan.shape.nodes))
            if not whole or any(p.deleting or p.claims_pending for p in members):
                continue
            slot = int(members[0].labels[c.LABEL_SLOT])
            pg = b.pod_group(owner, spec, plan.role, slot)
            futures.append((ctx.kube.pool.submit(ctx.kube.apply, pg), group))
    failed = wait_all(futures, result)
    for _, group in futures:
        if group not in failed:
            mem.admitted.add(group)
    mem.admitted &= seen


def release_groups(ctx: Context, key: Key, plans: list[RolePlan], result: Result, now: float) -> None:
    """Lift the scheduling gate of every pod of each group to release, together."""
    futures = []
    for plan in plans:
        for group in dict.fromkeys(plan.release):
            gated = [p for p in ctx.view.pods(key) if p.labels.get(c.LABEL_GROUP) == group and p.gated]
            names = {p.name for p in gated}
            created_now = group in result.created
            if created_now:  # its pods are not in the view yet: release every rank written
                names = {f"{group}-{r}" for r in range(int(plan.shape.nodes))}
            for n in sorted(names):
                futures.append((ctx.kube.pool.submit(ctx.kube.release_pod, key[0], n, now), (group, n)))
    failed = wait_all(futures, result)
    done: dict[str, set[str]] = {}
    for _, tag in futures:
        if tag not in failed:
            done.setdefault(tag[0], set()).add(tag[1])
    for group, names in done.items():
        result.released.append(group)
        ctx.expectations.expect(key, now, released=names)


def post_errors(ctx: Context, body: Obj, mem: Memory, result: Result, now: float) -> None:
    """One Warning Event per distinct refusal (not one per retry); counted per reason."""
    for err in result.errors:
        text = str(err)
        telemetry.RECONCILE_ERRORS.labels(
            body["metadata"]["namespace"], body["metadata"]["name"], err.reason
        ).inc()
        last = mem.errors_posted.get(text)
        if last is not None and now - last < 600:
            continue
        mem.errors_posted[text] = now
        ctx.kube.post_event(body, "Warning", "ReconcileError", f"the API server refused: {text}")
    if len(mem.errors_posted) > 64:
        for text, _ in sorted(mem.errors_posted.items(), key=lambda kv: kv[1])[:-32]:
            mem.errors_posted.pop(text, None)


def last_status(ctx: Context, key: Key, body: Obj, md: ModelDeployment) -> ModelDeploymentStatus | None:
    """The status this pass builds on: the watched object's, or the one this process wrote moments ago
    if the watch has not shown it yet."""
    mem = ctx.mem(key)
    if mem.status is not None:
        written, rv, when = mem.status
        if body["metadata"].get("resourceVersion") != rv and now_minus(when) < ctx.settings.applied_grace:
            try:
                return ModelDeploymentStatus.model_validate(written)
            except ValueError:
                return md.status
    return md.status


def now_minus(t: float) -> float:
    return time.time() - t


def _comparable(status: Any) -> Any:
    """A status as written and compared: empty maps and lists are left out at every level. (Applying an
    empty map where this manager owned entries makes server-side apply send null, which the schema
    refuses; and the API server may default empty objects.)"""
    if isinstance(status, dict):
        out = {k: _comparable(v) for k, v in status.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(status, list):
        return [_comparable(v) for v in status]
    return status


# A deployment's status is written at most this often while nothing a user waits for changes (Ready
# flipping, an error, a new generation): a burst of pod events then costs one status write, not one each.
STATUS_MIN_INTERVAL = 1.0


def status_defer(
    ctx: Context,
    key: Key,
    previous: dict[str, Condition],
    status: ModelDeploymentStatus,
    result: Result,
    now: float,
) -> float:
    """Seconds to hold this status back (0: write it now)."""
    mem = ctx.mem(key)
    if mem.status is None or result.errors:
        return 0.0
    since = now_minus(mem.status[2])
    if since >= STATUS_MIN_INTERVAL:
        return 0.0
    ready = next((cd for cd in status.conditions if cd.type == "Ready"), None)
    before = previous.get("Ready")
    if ready is None or before is None or ready.status != before.status:
        return 0.0
    last = mem.status[0]
    if (last.get("observedGeneration") or 0) != (status.observed_generation or 0):
        return 0.0
    new = _comparable(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    for memory in ("failures", "autoscaling", "profile", "placement"):  # what later passes decide from
        if new.get(memory) != last.get(memory):
            return 0.0
    return STATUS_MIN_INTERVAL - since


def write_status(ctx: Context, key: Key, body: Obj, status: ModelDeploymentStatus, result: Result) -> None:
    new = _comparable(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    mem = ctx.mem(key)
    current = body.get("status")
    if (
        mem.status is not None
        and body["metadata"].get("resourceVersion") != mem.status[1]
        and now_minus(mem.status[2]) < ctx.settings.applied_grace
    ):
        current = mem.status[0]
    if _comparable(new) == _comparable(current):
        return
    try:
        written = ctx.kube.apply_status(key[0], key[1], new)
    except ApiError as exc:
        if exc.not_found:
            return
        result.errors.append(exc)
        return
    mem.status = (new, str((written or {}).get("metadata", {}).get("resourceVersion", "")), time.time())


def invalid(ctx: Context, body: Obj, exc: SpecError, now: float) -> Result:
    """A spec the API server accepted but the models refuse (an older CRD, or a rule the server cannot
    check): say so in a condition and an Event, and touch nothing that runs."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    message = "; ".join(exc.errors)[:1000]
    ready = Condition(type="Ready", status="False", reason="InvalidSpec", message=message)
    old = body.get("status") or {}
    try:
        base = ModelDeploymentStatus.model_validate(old)
    except ValueError:
        base = ModelDeploymentStatus()
    conds, changed = merge_conditions(
        base.conditions, [ready], int(body["metadata"].get("generation") or 0), now
    )
    status = base.model_copy(update={"conditions": conds})
    result = Result()
    write_status(ctx, key, body, status, result)
    if changed:
        ctx.kube.post_event(body, "Warning", "InvalidSpec", message)
    return result


def remove_legacy(ctx: Context, body: Obj) -> None:
    """Objects made by tokenfab versions that ran kopf's change handlers carry its finalizer and a copy of
    the spec in an annotation; neither is used any more (and the finalizer could block deletion)."""
    meta = body["metadata"]
    mem = ctx.mem((meta["namespace"], meta["name"]))
    if mem.legacy_checked == meta.get("uid"):
        return
    ann = meta.get("annotations") or {}
    legacy_ann = [k for k in ann if k in LEGACY_ANNOTATIONS or k.startswith(f"{c.DOMAIN}/reconcile-")]
    finalizers = meta.get("finalizers") or []
    if LEGACY_FINALIZER not in finalizers and not legacy_ann:
        mem.legacy_checked = str(meta.get("uid"))
        return
    patch: Obj = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if LEGACY_FINALIZER in finalizers:
        patch["metadata"]["finalizers"] = [f for f in finalizers if f != LEGACY_FINALIZER]
    if legacy_ann:
        patch["metadata"]["annotations"] = dict.fromkeys(legacy_ann)
    try:
        ctx.kube.merge_patch(API_VERSION, KIND, meta["namespace"], meta["name"], patch)
        mem.legacy_checked = str(meta.get("uid"))
    except ApiError as exc:
        log.warning(
            "could not remove old kopf bookkeeping from %s/%s: %s", meta["namespace"], meta["name"], exc
        )
