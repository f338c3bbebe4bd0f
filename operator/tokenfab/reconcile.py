"""One reconcile pass of a ModelDeployment, in four phases, in this order:

- observe (tokenfab.observe): one immutable snapshot (tokenfab.planning.one_pass.Snapshot) from the cluster
  view, the deployment's freshest status, the readings taken from Prometheus and the answer of
  spec.profile's planner;
- plan (tokenfab.planning.one_pass.plan): pure, inside the placement ledger's session, which gives it the
  free capacity and records the room each new group is promised before the session ends; the plan names
  every write (tokenfab.planning.writes);
- act (tokenfab.act): the writer writes the plan; once the API server has answered, what the answers mean,
  then the second round that follows from them (tokenfab.routing);
- settle (tokenfab.settle): the status (`one_pass.settle` makes it) and the Events.

Every trigger (the deployment changed, one of its pods or children changed, a node it uses changed,
capacity freed up, a timer) runs the same pass, which compares desired with observed state, so a restart at
any point converges. Everything that matters is in the cluster: the pods carry their group, revision,
domain and assigned node; the resource's status carries placement and the autoscaler's memory. `Memory`
only remembers what this process wrote and the watch has not shown yet, so nothing is written twice;
losing it costs at most one repeated write.

A pass that finds everything in place makes no request at all: it reads the view, and a shared child is
applied only when its manifest's hash differs from the one recorded on the object.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from tokenfab import act, observe, settle
from tokenfab.fleet.view import Key
from tokenfab.planning import one_pass, status
from tokenfab.planning.room import Room
from tokenfab.runtime import Context, Ended, Observed, Result, Stopped


class Stopwatch:
    """Seconds spent in each phase of a pass (logged when a pass is slow)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._t, 4)
        self._t = now


class Pass:
    """One pass of one deployment: `begin` observes, plans and hands the writes to the writer; `finish`,
    once they are answered (`pending`), reads the answers and settles. A pass with nothing in flight may
    finish at once. `finish` returns the pass's Result, or None when the deployment is gone."""

    def __init__(self, ctx: Context, key: Key, now: float) -> None:
        self.ctx, self.key, self.now = ctx, key, now
        self.clock = Stopwatch()
        self.result = Result()
        self.seen: Observed | Ended | None = None
        self.plan: one_pass.Plan | None = None
        self.submitted: act.Submitted | None = None

    @property
    def pending(self) -> list[Future[Any]]:
        """The writes in flight."""
        return self.submitted.futures() if self.submitted is not None else []

    def begin(self) -> None:
        """Observe, plan, and hand the plan's writes to the writer."""
        ctx, key = self.ctx, self.key
        seen = observe.observe(ctx, key, self.now)
        self.clock.lap("observe")
        if isinstance(seen, Stopped):  # no groups to plan: the plan is the status that says why
            stop = status.stopped(seen.body, seen.md, seen.errors, seen.planned, seen.profile, self.now)
            self.result.requeue_after = stop.requeue_after
            self.result.conditions_changed = [f"{cd.type}={cd.status}/{cd.reason}" for cd in stop.changed]
            self.seen = Ended(seen.body, self.result, stop.status, stop.events, seen.legacy)
            return
        self.seen = seen
        if not isinstance(seen, Observed):
            return
        snap = seen.snapshot
        # Plan: every decision that takes capacity is made and reserved inside one ledger session.
        with ctx.ledger.session() as session:
            self.clock.lap("ledger-wait")
            room = Room(lambda: (session.nodes(), dict(session.used())), snap.room.constraints)
            snap = replace(snap, room=room)
            self.plan = one_pass.plan(snap)
            for r in self.plan.reservations:
                session.reserve(key, r.group, r.pods, self.now)
        self.seen = replace(seen, snapshot=snap)
        self.result.plans = self.plan.roles
        self.clock.lap("plan")
        self.submitted = act.submit(ctx, key, snap, self.plan)
        self.clock.lap("act")

    def finish(self) -> Result | None:
        """The rest of the pass once its writes are answered: act on the answers, then settle."""
        seen = self.seen
        if seen is None:
            return None
        result = seen.result if isinstance(seen, Ended) else self.result
        if isinstance(seen, Observed) and self.plan is not None and self.submitted is not None:
            act.complete(self.ctx, self.key, seen, self.plan, result, self.submitted)
        self.clock.lap("writes")
        if isinstance(seen, Ended) and seen.gone:
            return None
        settle.settle(self.ctx, self.key, seen, self.plan, result)
        self.clock.lap("status")
        result.timings = self.clock.laps
        return result


def reconcile(ctx: Context, key: Key, now: float) -> Result | None:
    """One whole pass, its writes seen through before it returns (None: the deployment is gone)."""
    p = Pass(ctx, key, now)
    p.begin()
    return p.finish()
