"""The act phase of a pass: the plan's writes (tokenfab.planning.writes.Writes, every one named there)
through the one writer (server-side apply), in parallel where they are independent; once the API server
has answered them all, what each answer means (room given back for a group that could not be created whole,
which is removed again; what the watch should show next; Events), then the second round that follows from
the answers (tokenfab.routing): the scheduling gates of the groups that now exist whole, and routing.

Nothing is decided here that the plan did not name. The writer keeps its own bookkeeping only: a shared
child whose manifest the cluster (or this process's write of moments ago) already holds is not written
again, and every refusal is kept, in the API server's words, for status and Events.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from tokenfab.adapters.kube import ApiError, Kube, Obj
from tokenfab.api.models import KIND
from tokenfab.fleet.view import Key
from tokenfab.planning import builders
from tokenfab.planning.groups import Delete as GroupDelete
from tokenfab.planning.groups import RolePlan
from tokenfab.planning.one_pass import Plan, Snapshot
from tokenfab.planning.writes import Delete, NewGroup, Release
from tokenfab.routing import second_round
from tokenfab.runtime import Context, Observed, Result

log = logging.getLogger(__name__)

Tagged = list[tuple[Future[Any], Any]]


@dataclass
class Submitted:
    """The writes a pass handed to the writer, still in flight."""

    shared: Tagged  # shared children (tag: (kind, name), hash), deletes and releases (tag None)
    deletes: Tagged  # groups deleted (tag: (role plan, delete))
    creates: Tagged  # new groups' objects (tag: group) and their ComputeDomains (tag None)

    def futures(self) -> list[Future[Any]]:
        return [f for f, _ in (*self.shared, *self.deletes, *self.creates)]


def submit(ctx: Context, key: Key, snap: Snapshot, plan: Plan) -> Submitted:
    """Every write of the plan at once, handed to the writer's threads; nothing waits here."""
    # In the order of the longest chains to Ready: the new groups' PodGroups and pods (the scheduler
    # binds none of a group before it has seen every one, then kubelets start them), after the workers'
    # headless Service that selects them (the endpoints controller, seeing pods and a new Service at
    # once, may race itself); then the frontend Deployment and Service (its controller, ReplicaSet and
    # pod follow, ready well before a gang) and the rest.
    w, owner, now = plan.writes, snap.owner, snap.now
    shared = _apply_changed(ctx, key, owner, [w.workers_service], now)
    # The pods' identity: the plan names the RoleBinding and the new groups only once the view shows the
    # ServiceAccount and Role (writes.identity_writes); until then the groups are parked, never waited for.
    shared += _apply_changed(ctx, key, owner, list(w.identity), now)
    pool, kube = ctx.kube.pool, ctx.kube
    creates: Tagged = [(pool.submit(kube.apply, cd), None) for cd in w.domains]
    creates += [(pool.submit(kube.apply, m), g.name) for g in w.groups for m in g.objects]
    # (the per-node model caches the pods mount come with the rest: a pod whose claim is not there yet
    # waits for it; one that could not be made is made again by a later pass)
    shared += _apply_changed(ctx, key, owner, list(w.rest), now)
    shared += [(pool.submit(_delete, kube, key[0], d), None) for d in w.deletes]
    shared += [(pool.submit(_release, kube, owner, r), None) for r in w.releases]
    deletes: Tagged = [
        (pool.submit(kube.delete_group, key[0], d.name, _has_domain(plan, rp)), (rp, d))
        for rp in plan.roles
        for d in rp.delete
    ]
    return Submitted(shared, deletes, creates)


def _has_domain(plan: Plan, rp: RolePlan) -> bool:
    return plan.spec.role(rp.role) is not None and builders.uses_compute_domain(plan.spec, rp.role)


def _delete(kube: Kube, namespace: str, d: Delete) -> None:
    if d.force:
        kube.force_delete_pod(namespace, d.name)
    elif d.unchanged:
        kube.delete(d.api_version, d.kind, d.name, namespace, {"resourceVersion": d.unchanged})
    else:
        kube.delete(d.api_version, d.kind, d.name, namespace)


def _release(kube: Kube, owner: builders.Owner, r: Release) -> None:
    release_claim(kube, owner, r.name, builders.cache_field_manager(owner.uid), r.mounted)


def complete(
    ctx: Context,
    key: Key,
    seen: Observed,
    plan: Plan,
    result: Result,
    sub: Submitted,
) -> None:
    """Once the API server has answered every submitted write: what each answer means, then the second
    round trip: the scheduling gates of the groups that now exist whole, lifted together, and routing."""
    body, snap = seen.body, seen.snapshot
    _applied(ctx, key, sub, result, snap.now)
    _deleted(ctx, key, body, snap, sub, result)
    _channel_waits(ctx, key, plan, result)
    _created(ctx, key, body, snap, plan, sub, result)
    released, routed = second_round(ctx, key, body, snap, plan, result)
    _released(ctx, key, released, result, snap.now)
    wait_all(routed, result)


def wait_all(futures: Tagged, result: Result) -> list[Any]:
    """Wait for submitted writes; returns the tags of the ones that failed (errors go to the result)."""
    failed = []
    for fut, tag in futures:
        try:
            fut.result()
        except ApiError as exc:
            result.errors.append(exc)
            failed.append(tag)
    return failed


def _released(ctx: Context, key: Key, futures: Tagged, result: Result, now: float) -> None:
    """The groups whose gates were lifted: expected so (their pods' gates gone) until the watch shows it."""
    failed = wait_all(futures, result)
    done: dict[str, set[str]] = {}
    for _, tag in futures:
        if tag not in failed:
            done.setdefault(tag[0], set()).add(tag[1])
    for group, names in done.items():
        result.released.append(group)
        ctx.expectations.expect(key, now, released=names)


def _applied(ctx: Context, key: Key, sub: Submitted, result: Result, now: float) -> None:
    """The shared children written: remembered until the watch shows them."""
    failed = set(wait_all(sub.shared, result))
    mem = ctx.mem(key)
    for _, tag in sub.shared:
        if tag is not None and tag not in failed:
            mem.applied[tag[0]] = (tag[1], now)
            result.applied.append(f"{tag[0][0]}/{tag[0][1]}")


def _deleted(ctx: Context, key: Key, body: Obj, snap: Snapshot, sub: Submitted, result: Result) -> None:
    """The groups deleted: their room given back, their pods expected gone, an Event each."""
    failed = {d.name for _, d in wait_all(sub.deletes, result)}
    views = {g.name: g for gs in snap.groups.values() for g in gs}
    for _, (plan, d) in sub.deletes:
        if d.name in failed:
            continue
        ctx.ledger.release(key, d.name)
        result.deleted.append(d.name)
        group = views.get(d.name)
        doomed = {p.name for p in group.pods} if group is not None else set()
        ctx.expectations.expect(key, snap.now, deleted=doomed)
        why = plan.broken_reasons.get(d.name)
        if d.reason in ("Drained", "DrainTimedOut"):
            _drain_event(ctx, body, d, group.drain_inflight if group is not None else "")
            continue
        ctx.kube.post_event(
            body,
            "Normal" if d.reason != "Broken" else "Warning",
            f"GroupDeleted{d.reason}",
            f"deleted group {d.name} ({d.reason.lower()}" + (f": {why})" if why else ")"),
        )


def _drain_event(ctx: Context, body: Obj, d: GroupDelete, started: str) -> None:
    """A drained group's Event: drained (with how long it took), or cut at its deadline."""
    took = f"{d.drained_for:.0f} s" if d.drained_for is not None else "no time"
    waited = f", waited for {started} request(s) in flight" if started else ""
    if d.reason == "Drained":
        ctx.kube.post_event(
            body, "Normal", "GroupDrained", f"drained group {d.name} in {took}{waited}; deleting it"
        )
        return
    cut = "an unknown number of" if d.inflight is None else f"{d.inflight:.0f}"
    ctx.kube.post_event(
        body,
        "Warning",
        "GroupDrainTimedOut",
        f"group {d.name} still had {cut} request(s) in flight after {took} (drainSeconds{waited}); "
        "deleting it cuts them",
    )


def _channel_waits(ctx: Context, key: Key, plan: Plan, result: Result) -> None:
    """The parked groups: their room given back (the pass that writes their pods promises it again), and
    what each waits for."""
    for wt in plan.writes.waits:
        ctx.ledger.release(key, wt.group)
        if not wt.domain:
            wt.plan.unbound.setdefault(
                wt.group, "waiting for its pods' ServiceAccount and Role (kubernetes discovery) to be made"
            )
            result.identity_waits.append(wt.group)
            continue
        wt.plan.unbound.setdefault(
            wt.group,
            f"waiting for the IMEX channel of ComputeDomain {wt.domain} (its resource claim template, "
            "made by NVIDIA's DRA driver)",
        )
        result.channel_waits.append(wt.group)


def _replacing(plan: RolePlan, group: str) -> str:
    """What a new group replaces, and why (the fault in its signal's words)."""
    fault = plan.faults.get(group) if group else None
    if fault is None:
        return ""
    return f", replacing {group} ({fault.kind}: {fault.message})"


def _created(
    ctx: Context, key: Key, body: Obj, snap: Snapshot, plan: Plan, sub: Submitted, result: Result
) -> None:
    """The new groups: one not created whole is taken back (its room too); one created whole is expected,
    announced, and released to the scheduler at once when its gang is its scheduling gates."""
    failed = set(wait_all(sub.creates, result))
    refusals: dict[str, str] = {}  # a failed group's first refusal, in the API server's words
    for fut, tag in sub.creates:  # (all answered by now)
        if tag in failed and fut.exception() is not None:
            refusals.setdefault(tag, str(fut.exception())[:300])
    for g in plan.writes.groups:
        if g.name in failed:
            # Not whole: take back what was made (its ComputeDomain too), and the room promised to it.
            ctx.ledger.release(key, g.name)
            g.plan.refused[g.name] = refusals.get(g.name, "refused")
            try:
                ctx.kube.delete_group(key[0], g.name, builders.uses_compute_domain(plan.spec, g.create.role))
            except ApiError as exc:
                result.errors.append(exc)
            continue
        _announce(ctx, key, body, snap, g, result)


def _announce(ctx: Context, key: Key, body: Obj, snap: Snapshot, g: NewGroup, result: Result) -> None:
    """A group created whole: its pods expected, its Event, and its release when its gang is gates."""
    cr, rp = g.create, g.plan
    ctx.expectations.expect(key, snap.now, created={p["metadata"]["name"] for p in g.pods})
    result.created.append(g.name)
    rp.unbound.setdefault(g.name, "created; waiting for the scheduler to bind it")
    if cr.reason != "Complete":
        ctx.kube.post_event(
            body,
            "Normal",
            f"GroupCreated{cr.reason}",
            f"created group {g.name}: {rp.shape.gpus} GPUs on {rp.shape.nodes} node(s) "
            f"in NVLink domain {cr.domain}"
            + (f" ({', '.join(cr.nodes)})" if cr.nodes else "")
            + _replacing(rp, cr.replaces),
        )
    if builders.gang_of(snap.spec, cr.role, snap.gang) == "gates":
        rp.release.append(g.name)  # released right away: every pod of it exists now


def _apply_changed(ctx: Context, key: Key, owner: builders.Owner, wanted: list[Obj], now: float) -> Tagged:
    """Apply each shared child only when its manifest differs from what the cluster (or this process's
    last write) holds."""
    mem = ctx.mem(key)
    futures: Tagged = []
    for manifest in wanted:
        ident = (manifest["kind"], manifest["metadata"]["name"])
        before = mem.hashed.get(ident)
        if before is not None and before[0] == manifest:
            m = before[1]
        else:
            m = builders.with_applied_hash(manifest)
            mem.hashed[ident] = (manifest, m)
        h = m["metadata"]["annotations"][builders.applied_annotation(m)]
        seen = ctx.view.child(m["kind"], owner.namespace, m["metadata"]["name"])
        if seen is not None and dict(seen.applied).get(builders.applied_annotation(m)) == h:
            continue
        last = mem.applied.get(ident)
        if last is not None and last[0] == h and now - last[1] < ctx.settings.applied_grace:
            continue  # written moments ago; the watch has not shown it yet
        futures.append((ctx.kube.pool.submit(ctx.kube.apply, m, builders.field_manager(m)), (ident, h)))
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
