"""The act phase's second round, once the first round's writes are answered (tokenfab.act): the groups
the plan releases get their scheduling gates lifted together (with the ranks of the groups just created
whole), a group that starts draining is marked (its pods annotated with when and how many requests were
in flight, its leader's routable condition False), a cancelled drain is undone, and the leaders the plan
names are made routable (the readiness gate a kubelet does not set by itself). Every write is named by the
plan (RolePlan.release / drain / undrain, Writes.gated / routable); a write that went out moments ago is
not sent again while the watch has not shown it."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from tokenfab.adapters.kube import Obj
from tokenfab.fleet.view import Key
from tokenfab.planning import contract
from tokenfab.planning.one_pass import Plan, Snapshot
from tokenfab.runtime import Context, Result


class _Router:
    """One pass's routing writes for one deployment, each written once within the applied grace."""

    def __init__(self, ctx: Context, key: Key, snap: Snapshot) -> None:
        self.ctx, self.key, self.now = ctx, key, snap.now
        self.mem = ctx.mem(key)
        self.pods = {g.name: g.pods for gs in snap.groups.values() for g in gs}
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
        for p in self.pods.get(group, ()):
            if self.once(p.name, f"mark-{draining}"):
                patch = {"metadata": {"annotations": ann}}
                fut = kube.pool.submit(kube.merge_patch, "v1", "Pod", self.key[0], p.name, patch)
                self.futures.append((fut, group))
            if p.rank == 0 and self.once(p.name, f"routable-{not draining}"):
                why = "taken out of routing to drain" if draining else "serving"
                self.routable(p.name, not draining, reason, why)

    def routable(self, pod: str, value: bool, reason: str, message: str) -> None:
        kube = self.ctx.kube
        fut = kube.pool.submit(
            kube.set_pod_condition, self.key[0], pod, contract.ROUTABLE_CONDITION, value, reason, message
        )
        self.futures.append((fut, pod))


Tagged = list[tuple[Future[Any], Any]]


def route(ctx: Context, key: Key, body: Obj, snap: Snapshot, plan: Plan, result: Result) -> Tagged:
    """Groups into and out of routing: a group starts draining (its pods marked with when, its leader's
    routable condition False), a drain is cancelled (True again), and the leaders the plan names are made
    routable. Returns the writes in flight."""
    router = _Router(ctx, key, snap)
    seconds = snap.spec.serving.drain_seconds
    for rp in plan.roles:
        for d in rp.drain:
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
                f"idle, or after {seconds} s",
            )
            result.draining.append(d.name)
        for group in rp.undrain:
            router.mark(group, False, None, "DrainCancelled")
            ctx.kube.post_event(
                body, "Normal", "GroupDrainCancelled", f"group {group} is needed again: back in routing"
            )
    for pod in plan.writes.routable:
        if router.once(pod, "routable-True"):
            router.routable(pod, True, "Serving", "its containers are ready")
    return router.futures


def release_groups(ctx: Context, key: Key, plan: Plan, result: Result, now: float) -> Tagged:
    """Lift the scheduling gate of every pod of each group to release, together: the gated pods the plan
    names, and every rank of a group created whole in this pass (its pods are not in the view yet).
    Returns the writes in flight, each tagged (group, pod)."""
    futures: Tagged = []
    for rp in plan.roles:
        for group in dict.fromkeys(rp.release):
            names = set(plan.writes.gated.get(group, ()))
            if group in result.created:
                names = {f"{group}-{r}" for r in range(int(rp.shape.nodes))}
            for n in sorted(names):
                futures.append((ctx.kube.pool.submit(ctx.kube.release_pod, key[0], n, now), (group, n)))
    return futures


def second_round(
    ctx: Context, key: Key, body: Obj, snap: Snapshot, plan: Plan, result: Result
) -> tuple[Tagged, Tagged]:
    """The act phase's second round, handed to the writer at once: (the gates lifted, each tagged
    (group, pod); the routing writes)."""
    return release_groups(ctx, key, plan, result, snap.now), route(ctx, key, body, snap, plan, result)
