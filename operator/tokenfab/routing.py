"""Groups into and out of routing, and onto the scheduler: once a pass's writes are answered, a group that
starts draining is marked (its pods annotated with when and how many requests were in flight, its leader's
routable condition False), a cancelled drain is undone, a new leader pod whose containers are ready is made
routable (the readiness gate a kubelet does not set by itself), the scheduling gates of groups that exist
whole are lifted together, and the late PodGroups of groups whose IMEX claims exist are written."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.fleet.view import Key
from tokenfab.planning import builders, contract
from tokenfab.planning.groups import Delete, RolePlan
from tokenfab.runtime import Context, Result

log = logging.getLogger(__name__)


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


def drain_event(ctx: Context, key: Key, body: Obj, d: Delete) -> None:
    pods = [p for p in ctx.view.pods(key) if p.labels.get(contract.LABEL_GROUP) == d.name]
    started = next(
        (
            p.annotations.get(contract.ANN_DRAIN_INFLIGHT)
            for p in pods
            if contract.ANN_DRAIN_INFLIGHT in p.annotations
        ),
        "",
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


class _Router:
    """One pass's routing writes for one deployment, each written once within the applied grace."""

    def __init__(self, ctx: Context, key: Key, now: float) -> None:
        self.ctx, self.key, self.now = ctx, key, now
        self.mem = ctx.mem(key)
        self.by_group: dict[str, list[Any]] = {}
        for p in ctx.view.pods(key):
            if contract.LABEL_GROUP in p.labels:
                self.by_group.setdefault(p.labels[contract.LABEL_GROUP], []).append(p)
        self.futures: list[tuple[Future[Any], Any]] = []

    def once(self, pod: str, what: str) -> bool:
        """Whether to write now: not when the same write went out moments ago (the watch lags)."""
        last = self.mem.pod_writes.get((pod, what))
        if last is not None and self.now - last < self.ctx.settings.applied_grace:
            return False
        self.mem.pod_writes[(pod, what)] = self.now
        return True

    def mark(self, group: str, draining: bool, inflight: float | None, reason: str) -> None:
        """A group's pods marked draining (with when, and the requests in flight then) or not."""
        kube = self.ctx.kube
        ann: dict[str, Any] = (
            {
                contract.ANN_DRAINING: f"{self.now:.3f}",
                contract.ANN_DRAIN_INFLIGHT: "" if inflight is None else f"{inflight:.0f}",
            }
            if draining
            else {contract.ANN_DRAINING: None, contract.ANN_DRAIN_INFLIGHT: None}
        )
        for p in self.by_group.get(group, []):
            if self.once(p.name, f"mark-{draining}"):
                patch = {"metadata": {"annotations": ann}}
                fut = kube.pool.submit(kube.merge_patch, "v1", "Pod", self.key[0], p.name, patch)
                self.futures.append((fut, group))
            if p.labels.get(contract.LABEL_RANK) == "0" and self.once(p.name, f"routable-{not draining}"):
                why = "taken out of routing to drain" if draining else "serving"
                self.routable(p.name, not draining, reason, why)

    def routable(self, pod: str, value: bool, reason: str, message: str) -> None:
        kube = self.ctx.kube
        fut = kube.pool.submit(
            kube.set_pod_condition, self.key[0], pod, contract.ROUTABLE_CONDITION, value, reason, message
        )
        self.futures.append((fut, pod))

    def serving(self, plan: RolePlan) -> None:
        """Leaders whose containers are ready, of groups neither draining nor going, made routable."""
        draining = set(plan.draining) | {d.name for d in plan.drain}
        for group, state in plan.states.items():
            if group in draining or state in ("deleting", "broken"):
                continue
            for p in self.by_group.get(group, []):
                if (
                    p.labels.get(contract.LABEL_RANK) == "0"
                    and p.containers_ready
                    and p.routable is not True
                    and not p.deleting
                    and contract.ANN_DRAINING not in p.annotations
                    and self.once(p.name, "routable-True")
                ):
                    self.routable(p.name, True, "Serving", "its containers are ready")


def route(ctx: Context, key: Key, body: Obj, plans: list[RolePlan], result: Result, now: float) -> None:
    """Groups into and out of routing: a group starts draining (its pods marked with when, its leader's
    routable condition False), a drain is cancelled (True again), and a new leader pod whose containers are
    ready is made routable (the readiness gate a kubelet does not set by itself)."""
    router = _Router(ctx, key, now)
    for plan in plans:
        for d in plan.drain:
            router.mark(d.name, True, d.inflight, "Draining")
            inflight = (
                f"{d.inflight:.0f} request(s) in flight"
                if d.inflight is not None
                else "in-flight requests unknown"
            )
            ctx.kube.post_event(
                body,
                "Normal",
                "GroupDraining",
                f"draining group {d.name} ({d.reason.lower()}): out of routing, {inflight}; deleted once "
                f"idle, or after {ctx_drain_seconds(body)} s",
            )
            result.draining.append(d.name)
        for group in plan.undrain:
            router.mark(group, False, None, "DrainCancelled")
            ctx.kube.post_event(
                body, "Normal", "GroupDrainCancelled", f"group {group} is needed again: back in routing"
            )
        router.serving(plan)
    wait_all(router.futures, result)


def ctx_drain_seconds(body: Obj) -> int:
    return int(((body.get("spec") or {}).get("serving") or {}).get("drainSeconds", 600))


def channel_ready(ctx: Context, namespace: str, template: str) -> bool:
    """Whether the IMEX channel's ResourceClaimTemplate of a ComputeDomain exists (NVIDIA's DRA driver
    makes it, in the ComputeDomain's namespace, under the name the ComputeDomain gives)."""
    try:
        return (
            ctx.kube.get(contract.RESOURCE_CLAIM_TEMPLATE_API, "ResourceClaimTemplate", template, namespace)
            is not None
        )
    except ApiError:
        return False


def admit_gangs(
    ctx: Context,
    key: Key,
    owner: builders.Owner,
    spec: ModelDeploymentSpec,
    plans: list[RolePlan],
    result: Result,
) -> None:
    """Write the PodGroup of each group that waits for it (`builders.admits_late`) once every pod of the
    group exists and has its resource claims; once per group in this process (a write of an unchanged
    PodGroup after a restart is harmless). A group with a bound pod has its PodGroup already."""
    mem = ctx.mem(key)
    if not any(builders.uses_compute_domain(spec, p.role) for p in plans):
        mem.admitted.clear()
        return
    gang = gang_mode(ctx, spec)
    pods = ctx.view.pods(key)
    seen: set[str] = set()
    futures = []
    for plan in plans:
        if not builders.admits_late(spec, plan.role, gang):
            continue
        by_group: dict[str, list[Any]] = {}
        for p in pods:
            if p.labels.get(contract.LABEL_ROLE) == plan.role and contract.LABEL_GROUP in p.labels:
                by_group.setdefault(p.labels[contract.LABEL_GROUP], []).append(p)
        for group, members in by_group.items():
            seen.add(group)
            if group in mem.admitted or group in result.created:
                continue
            if any(p.node for p in members):
                mem.admitted.add(group)
                continue
            whole = {int(p.labels.get(contract.LABEL_RANK, "-1")) for p in members} == set(
                range(plan.shape.nodes)
            )
            if not whole or any(p.deleting or p.claims_pending for p in members):
                continue
            slot = int(members[0].labels[contract.LABEL_SLOT])
            pg = builders.pod_group(owner, spec, plan.role, slot)
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
            gated = [p for p in ctx.view.pods(key) if p.labels.get(contract.LABEL_GROUP) == group and p.gated]
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


def gang_mode(ctx: Context, spec: ModelDeploymentSpec) -> builders.GangMode:
    mode = ctx.settings.gang
    if mode in ("podgroup", "gates"):
        return mode  # type: ignore[return-value]
    if not any(builders.group_shape(spec, r).nodes > 1 for r, _ in spec.roles()):
        return "gates"  # one-pod groups need neither
    try:
        return "podgroup" if ctx.kube.has_kind(contract.POD_GROUP_API, "PodGroup") else "gates"
    except ApiError:
        return "gates"
