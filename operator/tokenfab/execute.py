"""Acting on a plan: the pass's writes through the one writer (server-side apply), in parallel where they
are independent, with every refusal kept (in the API server's words) for status and Events."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from tokenfab.adapters.kube import ApiError, Kube, Obj
from tokenfab.api.models import (
    KIND,
    ModelDeploymentSpec,
    RoleName,
)
from tokenfab.fleet.view import Key
from tokenfab.planning import builders, contract
from tokenfab.planning.groups import Create, RolePlan
from tokenfab.planning.one_pass import Plan
from tokenfab.routing import (
    admit_gangs,
    channel_ready,
    drain_event,
    gang_mode,
    release_groups,
    route,
    wait_all,
)
from tokenfab.runtime import Context, Result

log = logging.getLogger(__name__)


def compute_domain_block(ctx: Context, spec: ModelDeploymentSpec) -> Callable[[RoleName], str]:
    if not any(builders.uses_compute_domain(spec, r) for r, _ in spec.roles()):
        return lambda role: ""
    try:
        served = ctx.kube.has_kind(contract.COMPUTE_DOMAIN_API, "ComputeDomain")
    except ApiError:
        served = False
    if served:
        return lambda role: ""

    def why(role: RoleName) -> str:
        if not builders.uses_compute_domain(spec, role):
            return ""
        return (
            f"{role} groups need an NVIDIA ComputeDomain ({contract.COMPUTE_DOMAIN_API}) but its CRD is not "
            "installed: install NVIDIA's DRA driver, or set spec.topology.computeDomain to false"
        )

    return why


@dataclass
class Submitted:
    """The writes a pass handed to the writer, still in flight."""

    shared: list[tuple[Future[Any], Any]]
    deletes: list[tuple[Future[Any], Any]]
    creates: list[tuple[Future[Any], Any]]
    pending: list[tuple[RolePlan, Create, str, list[Obj]]]
    gang: builders.GangMode
    # new groups whose ComputeDomain has no IMEX channel template yet: only the ComputeDomain was written
    channel_waits: list[tuple[RolePlan, str, str]] = field(default_factory=list)  # (plan, group, domain)

    def futures(self) -> list[Future[Any]]:
        return [f for f, _ in (*self.shared, *self.deletes, *self.creates)]


def submit(ctx: Context, key: Key, owner: builders.Owner, plan: Plan, now: float) -> Submitted:
    """Every apply and delete of the plan at once (the shared children that differ, groups to delete,
    every pod of every new group with its PodGroup), handed to the writer's threads. Nothing waits here
    but once in a deployment's life: its first groups wait for the ServiceAccount their pods name (a pod
    naming one that does not exist is refused)."""
    # In the order of the longest chains to Ready: the new groups' PodGroups and pods (the scheduler
    # binds none of a group before it has seen every one, then kubelets start them), after the workers'
    # headless Service that selects them (the endpoints controller, seeing pods and a new Service at
    # once, may race itself); then the frontend Deployment and Service (its controller, ReplicaSet and
    # pod follow, ready well before a gang) and the rest.
    spec, roles, kids = plan.spec, plan.roles, plan.children
    shared = _apply_changed(ctx, key, owner, [kids.workers_service], now)
    # The pods' identity, in order: a RoleBinding is checked against its Role (RBAC escalation check: it
    # must exist first), and a pod naming a ServiceAccount that does not exist is refused, so the first
    # groups of a deployment wait for it (once in its life).
    *first, binding = kids.identity or (None,)
    identity = _apply_changed(ctx, key, owner, [m for m in first if m is not None], now)
    if identity and (binding is not None or any(p.create for p in roles)):
        wait([f for f, _ in identity])
    shared += identity
    if binding is not None:
        shared += _apply_changed(ctx, key, owner, [binding], now)
    gang = gang_mode(ctx, spec) if any(p.create for p in roles) else "gates"
    creates, pending, channel_waits = _submit_creates(ctx, owner, spec, roles, gang)
    # (the per-node model caches the pods mount come with the rest: a pod whose claim is not there yet
    # waits for it; one that could not be made is made again by a later pass)
    shared += _apply_changed(ctx, key, owner, list(kids.rest), now) + _delete_stale(ctx, key, owner, spec)
    deletes = _submit_deletes(ctx, key, spec, roles)
    shared += [
        (ctx.kube.pool.submit(ctx.kube.force_delete_pod, key[0], pod), None) for pod in plan.force_delete
    ]
    shared += [
        (ctx.kube.pool.submit(ctx.kube.delete, "v1", "Pod", pod, key[0]), None) for pod in plan.fetch_deletes
    ]
    shared += [  # (the ComputeDomains of units left without a group: planning.units)
        (
            ctx.kube.pool.submit(ctx.kube.delete, contract.COMPUTE_DOMAIN_API, "ComputeDomain", cd, key[0]),
            None,
        )
        for cd in plan.domain_deletes
    ]
    shared += [  # (model caches evicted to make room on their node: planning.eviction)
        (ctx.kube.pool.submit(ctx.kube.delete, "v1", "PersistentVolumeClaim", claim, key[0]), None)
        for claim in plan.claim_deletes
    ]
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
    _applied(ctx, key, sub, result, now)
    _deleted(ctx, key, body, sub, result, now)
    _channel_waits(ctx, key, sub, result)
    _created(ctx, key, body, spec, sub, result, now)
    release_groups(ctx, key, plans, result, now)
    meta = body["metadata"]
    owner = builders.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    admit_gangs(ctx, key, owner, spec, plans, result)
    route(ctx, key, body, plans, result, now)


def _applied(ctx: Context, key: Key, sub: Submitted, result: Result, now: float) -> None:
    """The shared children written: remembered until the watch shows them."""
    failed = set(wait_all(sub.shared, result))
    mem = ctx.mem(key)
    for _, tag in sub.shared:
        if tag is not None and tag not in failed:
            mem.applied[tag[0]] = (tag[1], now)
            result.applied.append(f"{tag[0][0]}/{tag[0][1]}")


def _deleted(ctx: Context, key: Key, body: Obj, sub: Submitted, result: Result, now: float) -> None:
    """The groups deleted: their room given back, their pods expected gone, an Event each."""
    failed = {d.name for _, d in wait_all(sub.deletes, result)}
    for _, (plan, d) in sub.deletes:
        if d.name in failed:
            continue
        ctx.ledger.release(key, d.name)
        result.deleted.append(d.name)
        doomed = {p.name for p in ctx.view.pods(key) if p.labels.get(contract.LABEL_GROUP) == d.name}
        ctx.expectations.expect(key, now, deleted=doomed)
        why = plan.broken_reasons.get(d.name)
        if d.reason in ("Drained", "DrainTimedOut"):
            drain_event(ctx, key, body, d)
            continue
        ctx.kube.post_event(
            body,
            "Normal" if d.reason != "Broken" else "Warning",
            f"GroupDeleted{d.reason}",
            f"deleted group {d.name} ({d.reason.lower()}" + (f": {why})" if why else ")"),
        )


def _replacing(plan: RolePlan, group: str) -> str:
    """What a new group replaces, and why (the fault in its signal's words)."""
    fault = plan.faults.get(group) if group else None
    if fault is None:
        return ""
    return f", replacing {group} ({fault.kind}: {fault.message})"


def _channel_waits(ctx: Context, key: Key, sub: Submitted, result: Result) -> None:
    for plan, group, domain in sub.channel_waits:
        # (its room is promised again by the next pass, a second from now, which writes the pods)
        ctx.ledger.release(key, group)
        plan.unbound.setdefault(
            group,
            f"waiting for the IMEX channel of ComputeDomain {domain} (its resource claim template, made by "
            "NVIDIA's DRA driver)",
        )
        result.channel_waits.append(group)


def _created(
    ctx: Context, key: Key, body: Obj, spec: ModelDeploymentSpec, sub: Submitted, result: Result, now: float
) -> None:
    """The new groups: one not created whole is taken back (its room too); one created whole is expected,
    announced, and released to the scheduler at once when its gang is its scheduling gates."""
    failed = set(wait_all(sub.creates, result))
    refusals: dict[str, str] = {}  # a failed group's first refusal, in the API server's words
    for fut, tag in sub.creates:  # (all answered by now)
        if tag in failed and fut.exception() is not None:
            refusals.setdefault(tag, str(fut.exception())[:300])
    for plan, cr, group, pods in sub.pending:
        if group in failed:
            # Not whole: take back what was made (its ComputeDomain too), and the room promised to it.
            ctx.ledger.release(key, group)
            plan.refused[group] = refusals.get(group, "refused")
            try:
                ctx.kube.delete_group(key[0], group, builders.uses_compute_domain(spec, cr.role))
            except ApiError as exc:
                result.errors.append(exc)
            continue
        ctx.expectations.expect(key, now, created={p["metadata"]["name"] for p in pods})
        result.created.append(group)
        plan.unbound.setdefault(
            group,
            "created; its PodGroup follows once every pod's IMEX channel claim exists"
            if builders.admits_late(spec, cr.role, sub.gang)
            else "created; waiting for the scheduler to bind it",
        )
        if cr.reason != "Complete":
            ctx.kube.post_event(
                body,
                "Normal",
                f"GroupCreated{cr.reason}",
                f"created group {group}: {plan.shape.gpus} GPUs on {plan.shape.nodes} node(s) "
                f"in NVLink domain {cr.domain}"
                + (f" ({', '.join(cr.nodes)})" if cr.nodes else "")
                + _replacing(plan, cr.replaces),
            )
        if builders.gang_of(spec, cr.role, sub.gang) == "gates":
            plan.release.append(group)  # released right away: every pod of it exists now


def _apply_changed(
    ctx: Context, key: Key, owner: builders.Owner, wanted: list[Obj], now: float
) -> list[tuple[Future[Any], Any]]:
    """Apply each shared child only when its manifest differs from what the cluster (or this process's
    last write) holds."""
    mem = ctx.mem(key)
    futures: list[tuple[Future[Any], Any]] = []
    for manifest in wanted:
        m = builders.with_applied_hash(manifest)
        h = m["metadata"]["annotations"][builders.applied_annotation(m)]
        ident = (m["kind"], m["metadata"]["name"])
        seen = ctx.view.child(m["kind"], owner.namespace, m["metadata"]["name"])
        if seen is not None and dict(seen.applied).get(builders.applied_annotation(m)) == h:
            continue
        last = mem.applied.get(ident)
        if last is not None and last[0] == h and now - last[1] < ctx.settings.applied_grace:
            continue  # written moments ago; the watch has not shown it yet
        futures.append((ctx.kube.pool.submit(ctx.kube.apply, m, builders.field_manager(m)), (ident, h)))
    return futures


def _delete_stale(
    ctx: Context, key: Key, owner: builders.Owner, spec: ModelDeploymentSpec
) -> list[tuple[Future[Any], Any]]:
    """Engine ConfigMaps of revisions no group uses any more, the budgets of roles that are gone, model
    cache claims of another storage class or size (a claim still mounted goes when its last pod does), and
    the discovery identity once no pod of the deployment needs it (serving.discovery left kubernetes and
    every pod is of the current revisions)."""
    futures: list[tuple[Future[Any], Any]] = []
    in_use = {
        (p.labels.get(contract.LABEL_ROLE), p.labels.get(contract.LABEL_REVISION)) for p in ctx.view.pods(key)
    }
    current = {(role, builders.role_revision(spec, role)) for role, _ in spec.roles()}
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
    futures += _release_claims(ctx, key, owner, spec)
    if not builders.uses_kubernetes_discovery(spec) and in_use <= current:
        for api_version, kind in DISCOVERY_KINDS:
            for child in ctx.view.children(kind, key):
                futures.append((ctx.kube.pool.submit(ctx.kube.delete, api_version, kind, child.name,
                                                     owner.namespace), None))  # fmt: skip
    return futures


def _release_claims(
    ctx: Context, key: Key, owner: builders.Owner, spec: ModelDeploymentSpec
) -> list[tuple[Future[Any], Any]]:
    """The model cache claims the deployment owns but would no longer mount (another source, storage
    class or size, or one made before claims were shared): deleted when no other deployment owns them (a
    claim still mounted goes when its last pod does), else let go of (`release_claim`). A claim another
    deployment's pods mount before it owns it is not deleted (it becomes an owner). A claim of the
    namespace left with no owner at all (a release whose delete failed) is deleted too, unless mounted."""
    futures: list[tuple[Future[Any], Any]] = []
    claims = [pvc for pvc in ctx.view.children("PersistentVolumeClaim", key) if pvc.node]
    wanted = {
        m["metadata"]["name"] for m in builders.model_cache_claims(owner, spec, [p.node for p in claims])
    }
    busy: frozenset[str] | None = None  # (read only when a claim is to be deleted: a walk over the pods)
    for pvc in claims:
        if pvc.name in wanted:
            continue
        busy = ctx.view.mounted_elsewhere(key) if busy is None else busy
        if set(pvc.owners) - {key[1]}:
            manager = builders.cache_field_manager(owner.uid)
            futures.append((ctx.kube.pool.submit(release_claim, ctx.kube, owner, pvc.name, manager,
                                                 pvc.name in busy), None))  # fmt: skip
        elif pvc.name not in busy:
            futures.append((ctx.kube.pool.submit(ctx.kube.delete, "v1", "PersistentVolumeClaim", pvc.name,
                                                 owner.namespace), None))  # fmt: skip
    orphans = [
        p
        for p in ctx.view.model_caches(owner.namespace)
        if not p.owners and not p.deployment and p.name not in wanted
    ]
    if orphans:
        mine = {p.cache_claim for p in ctx.view.pods(key)}
        busy = (ctx.view.mounted_elsewhere(key) if busy is None else busy) | mine
        for p in orphans:
            if p.name not in busy:
                unchanged = {"resourceVersion": p.version}  # (one taken up meanwhile is kept)
                futures.append((ctx.kube.pool.submit(ctx.kube.delete, "v1", "PersistentVolumeClaim", p.name,
                                                     owner.namespace, unchanged), None))  # fmt: skip
    return futures


def release_claim(kube: Kube, owner: builders.Owner, name: str, manager: str, mounted: bool = False) -> None:
    """Let go of a shared model cache claim: apply nothing under the deployment's field manager, so its
    owner reference and annotations go and the other owners' stay. A claim left with no owner (the
    others are gone, or let go meanwhile) is deleted, on the condition that it is still the object just
    written (a deployment that took it up meanwhile changed it), unless another deployment's pods mount
    it (`mounted`: that deployment becomes its owner). When the API server refuses to take the spec off
    (422: the spec was this deployment's alone), the claim is read again and deleted the same way if no
    other deployment owns it."""
    try:
        got: Obj | None = kube.apply(builders.released_claim(owner, name), manager)
    except ApiError as exc:
        if exc.status != 422:
            raise
        got = kube.get("v1", "PersistentVolumeClaim", name, owner.namespace)
    meta = (got or {}).get("metadata") or {}
    left = [
        r for r in meta.get("ownerReferences") or [] if r.get("kind") == KIND and r.get("uid") != owner.uid
    ]
    if got is None or left or mounted:
        return
    kube.delete(
        "v1",
        "PersistentVolumeClaim",
        name,
        owner.namespace,
        preconditions={"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
    )


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
            cd = spec.role(plan.role) is not None and builders.uses_compute_domain(spec, plan.role)
            futures.append((ctx.kube.pool.submit(ctx.kube.delete_group, key[0], d.name, cd), (plan, d)))
    return futures


def _submit_creates(
    ctx: Context,
    owner: builders.Owner,
    spec: ModelDeploymentSpec,
    plans: list[RolePlan],
    gang: builders.GangMode,
) -> tuple[
    list[tuple[Future[Any], Any]],
    list[tuple[RolePlan, Create, str, list[Obj]]],
    list[tuple[RolePlan, str, str]],
]:
    """Every object of every new group at once (a pod naming a PodGroup that does not exist yet waits for
    it). A group with a ComputeDomain is the exception: its pods are written once NVIDIA's DRA driver has
    made the domain's IMEX channel template (a pod naming a missing template gets a Warning from the
    claim controller, and its claim comes late); until then only the ComputeDomain is written: once where
    the kind is watched (the template is looked for from the pass that sees it: the driver makes it after
    the domain), else in every pass, with the template looked for too."""
    pending: list[tuple[RolePlan, Create, str, list[Obj]]] = []
    futures: list[tuple[Future[Any], Any]] = []
    waits: list[tuple[RolePlan, str, str]] = []
    written: set[str] = set()  # (a unit's ComputeDomain is written once for all its new groups)
    for plan in plans:
        for cr in plan.create:
            group = builders.group_name(owner, cr.role, cr.slot)
            cd = builders.compute_domain(owner, spec, cr.role, cr.slot, cr.unit)
            if cd is not None:
                # Written until seen (watched: the kind was served when the operator started); its
                # template, which the driver makes after it, is looked for once it is seen.
                name = cd["metadata"]["name"]
                seen = ctx.view.child("ComputeDomain", owner.namespace, name) is not None
                if not seen and name not in written:
                    written.add(name)
                    futures.append((ctx.kube.pool.submit(ctx.kube.apply, cd), None))
                unseen_yet = not seen and ctx.view.synced.get("ComputeDomain", False)
                if unseen_yet or not channel_ready(ctx, owner.namespace, name):
                    waits.append((plan, group, name))
                    continue
            pods = builders.group_pods(
                owner, spec, cr.role, cr.slot, cr.domain, cr.revision, cr.nodes, cr.ranks, gang, cr.path,
                cr.unit,
            )  # fmt: skip
            objs: list[Obj] = []
            if builders.gang_of(spec, cr.role, gang) == "podgroup" and not builders.admits_late(
                spec, cr.role, gang
            ):
                objs.append(builders.pod_group(owner, spec, cr.role, cr.slot))
            pending.append((plan, cr, group, pods))
            for m in [*objs, *pods]:
                futures.append((ctx.kube.pool.submit(ctx.kube.apply, m), group))
    return futures, pending, waits
