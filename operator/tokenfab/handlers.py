"""Thin kopf glue: every trigger (create, update, resume, a resync timer, child pod and node events)
asks for a reconcile of one ModelDeployment; a small coalescing queue runs at most one pass per
deployment at a time and folds bursts of events into one extra pass."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from tokenfab.adapters import aic, telemetry
from tokenfab.adapters.kube import Kube
from tokenfab.api.models import GROUP, PLURAL, VERSION
from tokenfab.inventory import sync_domains
from tokenfab.planning import contract as c
from tokenfab.reconcile import Result, reconcile

log = logging.getLogger("tokenfab")
RESYNC_SECONDS = float(os.environ.get("TOKENFAB_RESYNC_SECONDS", "15"))
INVENTORY_SECONDS = float(os.environ.get("TOKENFAB_INVENTORY_SECONDS", "10"))
Key = tuple[str, str]


class Coalescer:
    """At most one reconcile per key at a time; triggers during a pass cause exactly one more pass."""

    def __init__(self, run: Callable[[Key], Any]) -> None:
        self._run = run
        self._running: set[Key] = set()
        self._again: set[Key] = set()
        self.known: set[Key] = set()

    def trigger(self, key: Key) -> None:
        self.known.add(key)
        if key in self._running:
            self._again.add(key)
            return
        self._running.add(key)
        asyncio.get_running_loop().create_task(self._loop(key))

    async def _loop(self, key: Key) -> None:
        try:
            while True:
                self._again.discard(key)
                try:
                    await asyncio.to_thread(self._run, key)
                except Exception:  # logged; the resync timer retries
                    log.exception("reconcile of %s/%s failed", *key)
                if key not in self._again:
                    return
        finally:
            self._running.discard(key)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = c.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.DOMAIN, key="last-handled"
    )
    settings.posting.enabled = False  # tokenfab posts its own Events, on condition changes only
    settings.watching.server_timeout = 300
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    kube = Kube(client.ApiClient())
    memo["kube"] = kube
    planner = aic.BackgroundPlanner()  # spec.profile plans, in a process of their own
    memo["planner"] = planner

    def run(key: Key) -> None:
        t0 = time.monotonic()
        try:
            result = reconcile(kube, key[0], key[1], time.time(), planner=planner.poll)
        except Exception:
            telemetry.RECONCILES.labels(key[0], key[1], "error").inc()
            raise
        finally:
            telemetry.RECONCILE_SECONDS.labels(*key).observe(time.monotonic() - t0)
        telemetry.RECONCILES.labels(key[0], key[1], "ok" if result else "gone").inc()
        if result is not None:
            record(key, result)
        if result is None:
            memo["queue"].known.discard(key)
        elif result.created or result.deleted or result.conditions_changed:
            log.info(
                "%s/%s: created %s deleted %s conditions %s",
                *key,
                result.created,
                result.deleted,
                result.conditions_changed,
            )

    memo["queue"] = Coalescer(run)
    memo["inventory"] = asyncio.get_running_loop().create_task(_inventory_loop(kube))


def record(key: Key, result: Result) -> None:
    """Export one pass's outcome as the operator's own metrics."""
    for plan in result.plans:
        labels = (key[0], key[1], plan.role)
        telemetry.GROUPS_DESIRED.labels(*labels).set(plan.desired)
        telemetry.GROUPS_READY.labels(*labels).set(plan.ready)
        telemetry.GROUP_GPUS.labels(*labels).set(plan.shape.gpus)
        if plan.unplaced:
            telemetry.PLACEMENT_FAILURES.labels(*labels).inc(plan.unplaced)
        broken = sum(1 for d in plan.delete if d.reason == "Broken")
        if broken:
            telemetry.GROUPS_RECREATED.labels(*labels).inc(broken)


async def _inventory_loop(kube: Kube) -> None:
    while True:
        try:
            await asyncio.to_thread(sync_domains, kube)
        except Exception:
            log.exception("NVLinkDomain inventory failed")
        await asyncio.sleep(INVENTORY_SECONDS)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("inventory")
    if task is not None:
        task.cancel()
    planner = memo.get("planner")
    if planner is not None:
        planner.shutdown()


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile-resume")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-create")
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", id="reconcile-update")
@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, id="resync")
async def on_model_deployment(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo["queue"].trigger((namespace or "default", name))


@kopf.on.event("v1", "pods", labels={c.MANAGED_BY: c.MANAGED_BY_VALUE}, id="child-pods")
async def on_child_pod(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    owner = labels.get(c.LABEL_DEPLOYMENT)
    if owner and namespace and "queue" in memo:
        memo["queue"].trigger((namespace, owner))


@kopf.on.event("v1", "nodes", id="nodes")
async def on_node(type: str, name: str, status: kopf.Status, memo: Any, **_: Any) -> None:
    """A node that goes away or changes readiness may break groups: look at every deployment."""
    if "queue" not in memo:
        return
    seen: dict[str, bool] = memo.setdefault("node_ready", {})
    ready = any(
        cd.get("type") == "Ready" and cd.get("status") == "True" for cd in status.get("conditions") or []
    )
    before = seen.get(name)
    if type == "DELETED":
        seen.pop(name, None)
    else:
        seen[name] = ready
    if type == "DELETED" or (before is not None and before != ready):
        for key in list(memo["queue"].known):
            memo["queue"].trigger(key)
