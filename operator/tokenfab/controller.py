"""The fleet controller of one operator process: informers feed the cluster view, events wake the
deployments they concern, and a few worker threads reconcile one deployment at a time each.

    informers (nodes, tokenfab's pods, others' bound pods, children) --> ClusterView --> WorkQueue
    kopf (ModelDeployment events) -----------------------------------------^               |
                                                         workers: Pass.begin <---------------+
                                   observe, plan (the Ledger gives capacity), hand the writes to the writer
                                   finishers: Pass.finish once the writes are answered (act, settle)

Workers wait until every informer has listed once (a pass never plans from an empty view) and run only
while this replica leads (see tokenfab.leader). A failed pass is retried with per-deployment exponential
backoff; a pass that asks for a later look (a timer) is queued for then; every deployment is looked at
again every `resync` seconds in any case.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokenfab import inventory
from tokenfab.adapters import metrics, telemetry
from tokenfab.adapters.informer import Informer, Source
from tokenfab.adapters.kube import ApiError, Kube, Obj
from tokenfab.fleet.expectations import Expectations
from tokenfab.fleet.ledger import Ledger
from tokenfab.fleet.view import TEMPLATE, Change, ClusterView, Key
from tokenfab.fleet.workqueue import WorkQueue
from tokenfab.planning import contract
from tokenfab.planning.autoscaler import burst_watch
from tokenfab.reconcile import Pass
from tokenfab.runtime import Context, Result, Settings

log = logging.getLogger("tokenfab")
passes_log = logging.getLogger("tokenfab.passes")  # one line per pass (operator --log-passes)
FleetReader = Callable[[str, str], tuple[dict[tuple[str, str], float] | None, str]]
MANAGED = f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}"
SLOW_PASS_SECONDS = 1.0
STUCK_SECONDS = 600.0  # a pass this long means a hang (every request has a timeout): fail liveness


@dataclass
class Options:
    namespaces: list[str] = field(default_factory=list)  # empty: every namespace
    workers: int = 4
    resync_seconds: float = 60.0
    inventory_seconds: float = 10.0
    burst_watch_seconds: float = 2.0  # the burst watch's period (about a scrape); 0: off
    settings: Settings = field(default_factory=Settings)


class Controller:
    def __init__(
        self,
        kube: Kube,
        options: Options | None = None,
        planner: Any = None,
        reader: Any = None,
        clock: Callable[[], float] = time.time,
        fleet_reader: FleetReader = metrics.read_by_deployment,
    ) -> None:
        self.kube = kube
        self.fleet_reader = fleet_reader
        self.options = options or Options()
        self.view = ClusterView(self.options.namespaces or None, self.options.settings.fault_keys)
        self.ledger = Ledger(self.view)
        self.ctx = Context(
            kube=kube,
            view=self.view,
            ledger=self.ledger,
            expectations=Expectations(),
            settings=self.options.settings,
            reader=reader,
            planner=planner,
        )
        self.queue: WorkQueue[Key] = WorkQueue()
        self.clock = clock
        self.leading = threading.Event()
        self.waiting_for_capacity: set[Key] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.informers = self._informers()
        self.passes = 0
        self.busy: dict[str, float] = {}  # worker (or finisher) -> when its current pass started
        # Passes whose writes the API server has answered are completed here (see process).
        self._finisher = ThreadPoolExecutor(self.options.workers, thread_name_prefix="tokenfab-finish")

    # --------------------------------------------------------------------------------- sources
    def _informers(self) -> list[Informer]:
        namespaces: list[str | None] = list(self.options.namespaces) or [None]
        sources: list[tuple[Source, Callable[[str, Obj], Change]]] = [
            (Source("Node", "v1", "Node"), self.view.on_node),
            (
                Source(
                    "ForeignPod",
                    "v1",
                    "Pod",
                    # Serving every namespace, tokenfab's own pods come by the Pod watch only (each of
                    # their updates would otherwise arrive twice); serving some, those of the others
                    # count here as anyone's.
                    label_selector=""
                    if self.options.namespaces
                    else f"{contract.MANAGED_BY}!={contract.MANAGED_BY_VALUE}",
                    field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                ),
                self.view.on_foreign_pod,
            ),
        ]
        for ns in namespaces:
            suffix = f"@{ns}" if ns else ""
            sources.append((Source(f"Pod{suffix}", "v1", "Pod", ns, MANAGED), self.view.on_pod))
            for api_version, kind in (
                ("v1", "ConfigMap"),
                ("v1", "Service"),
                ("apps/v1", "Deployment"),
                ("policy/v1", "PodDisruptionBudget"),
                ("v1", "ServiceAccount"),
                ("v1", "PersistentVolumeClaim"),
                ("rbac.authorization.k8s.io/v1", "Role"),
                ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            ):
                sources.append(
                    (
                        Source(f"{kind}{suffix}", api_version, kind, ns, MANAGED),
                        _child_handler(self.view, kind),
                    )
                )
        out = []
        for source, handler in sources:
            out.append(
                Informer(
                    self.kube,
                    source,
                    on_event=self._event_handler(handler),
                    on_list=self._list_handler(source),
                )
            )
        return out

    def _event_handler(self, handler: Callable[[str, Obj], Change]) -> Callable[[str, Obj], None]:
        def on_event(type_: str, obj: Obj) -> None:
            self.wake(handler(type_, obj))

        return on_event

    def _list_handler(self, source: Source) -> Callable[[list[Obj]], None]:
        kind = source.name.split("@")[0]

        def on_list(items: list[Obj]) -> None:
            self.wake(self.view.replace(kind, items, source.namespace))

        return on_list

    # ----------------------------------------------------------------------------------- events
    def on_model_deployment(self, type_: str, body: Obj) -> None:
        """A ModelDeployment event (from kopf's watch)."""
        change = self.view.on_model_deployment(type_, body)
        if type_ == "DELETED":
            # Its reservations stay: creates of its last pass may still be in flight, and their pods
            # would land on room handed to another deployment. They end as any do: the pods appear
            # (and hold the room until garbage collection removes them), or the reservations expire.
            for key in change.keys:
                with self._lock:
                    self.waiting_for_capacity.discard(key)
            change = Change(change.keys, True)  # its groups' room will be freed
        self.wake(change)

    def wake(self, change: Change) -> None:
        for key in change.keys:
            self.queue.add(key)
        if change.freed:
            with self._lock:
                waiting = list(self.waiting_for_capacity)
            for key in waiting:
                self.queue.add(key)

    # ------------------------------------------------------------------------------------ run
    def start(self, leading: bool = True) -> None:
        # The writer's threads run, and which optional kinds the cluster serves is known, before the
        # first pass needs them.
        self.kube.start_writers()
        self.kube.warm_kinds(
            [(contract.POD_GROUP_API, "PodGroup"), (contract.COMPUTE_DOMAIN_API, "ComputeDomain")]
        )
        if self.kube.has_kind(contract.DEVICE_TAINT_RULE_API, "DeviceTaintRule"):  # (Kubernetes 1.37: GA)
            source = Source("DeviceTaintRule", contract.DEVICE_TAINT_RULE_API, "DeviceTaintRule")
            self.informers.append(
                Informer(
                    self.kube,
                    source,
                    on_event=self._event_handler(self.view.on_device_taint_rule),
                    on_list=self._list_handler(source),
                )
            )
        if self.kube.has_kind(contract.COMPUTE_DOMAIN_API, "ComputeDomain"):  # (NVIDIA's DRA driver)
            self.informers.extend(self.driver_informers())
        for inf in self.informers:
            inf.start()
        if leading:
            self.leading.set()
        for i in range(self.options.workers):
            self._spawn(f"reconcile-{i}", self._worker)
        self._spawn("resync", self._resync)
        self._spawn("inventory", self._inventory)
        if self.options.burst_watch_seconds > 0:
            self._spawn("burst-watch", self._burst_watch)

    def driver_informers(self) -> list[Informer]:
        """The kinds of NVIDIA's DRA driver, where it is installed: the ComputeDomains tokenfab made, and
        the channel templates the driver makes for them. A group parked for its channel is woken by the
        template's watch, and no pass reads a template from the API server."""
        out = []
        scopes: list[str | None] = list(self.options.namespaces) or [None]
        for ns in scopes:
            suffix = f"@{ns}" if ns else ""
            domains = Source(
                f"ComputeDomain{suffix}", contract.COMPUTE_DOMAIN_API, "ComputeDomain", ns, MANAGED
            )
            templates = Source(
                f"{TEMPLATE}{suffix}",
                contract.RESOURCE_CLAIM_TEMPLATE_API,
                TEMPLATE,
                ns,
                f"{contract.COMPUTE_DOMAIN_TARGET_LABEL}={contract.COMPUTE_DOMAIN_TARGET_WORKLOAD}",
            )
            for source, handler in (
                (domains, _child_handler(self.view, "ComputeDomain")),
                (templates, self.view.on_channel_template),
            ):
                out.append(
                    Informer(
                        self.kube,
                        source,
                        on_event=self._event_handler(handler),
                        on_list=self._list_handler(source),
                    )
                )
        return out

    def lead(self) -> None:
        """This replica now holds the leader Lease: look at every deployment."""
        self.leading.set()
        for key in self.view.deployments():
            self.queue.add(key)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, drain_seconds: float = 0.0) -> None:
        """Stop passes and watches. With `drain_seconds` (a graceful stop, before the Lease is handed
        back) wait that long at most for the passes in flight and for the writes already handed to the
        writer; writes not started yet are dropped (the next leader rebuilds from the cluster and
        completes or replaces a group left unfinished). Nothing is written once another replica may
        lead."""
        self._stop.set()
        self.queue.shutdown()
        deadline = time.monotonic() + drain_seconds
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._finisher.shutdown(wait=False, cancel_futures=True)
        pool = getattr(self.kube, "pool", None)
        if pool is not None and drain_seconds > 0:
            drained = threading.Thread(
                target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True}, daemon=True
            )
            drained.start()
            drained.join(max(0.0, deadline - time.monotonic()))
            if drained.is_alive():
                log.warning("stopping with writes still in flight after %.0f s", drain_seconds)
        for inf in self.informers:
            inf.stop()

    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers)

    def wait_synced(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for inf in self.informers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not inf.synced.wait(left):
                return False
        return True

    def _ready_to_work(self) -> bool:
        while not self._stop.is_set():
            if self.leading.wait(1.0) and self.wait_synced(1.0):
                return True
        return False

    def _worker(self) -> None:
        me = threading.current_thread().name
        while self._ready_to_work():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            self.busy[me] = time.monotonic()
            handed_on = False
            try:
                if self.leading.is_set():
                    handed_on = self.process(key)
                else:
                    self.queue.add_after(key, 1.0)
            finally:
                self.busy.pop(me, None)
                if not handed_on:  # (else the key is done once its writes are answered: see process)
                    self.queue.done(key)
                telemetry.QUEUE_DEPTH.set(len(self.queue))

    def health(self) -> dict[str, Any]:
        """For the liveness probe: raises when the watches have not listed yet or a worker is stuck."""
        if not self.synced():
            waiting = [inf.source.name for inf in self.informers if not inf.synced.is_set()]
            raise RuntimeError(f"watches not listed yet: {', '.join(waiting)}")
        now = time.monotonic()
        stuck = {name: round(now - t) for name, t in list(self.busy.items()) if now - t > STUCK_SECONDS}
        if stuck:
            raise RuntimeError(f"reconcile workers stuck for more than {STUCK_SECONDS:.0f} s: {stuck}")
        return {"leading": self.leading.is_set(), "queue": len(self.queue), "passes": self.passes}

    def process(self, key: Key) -> bool:
        """One pass for one deployment. A pass that handed writes to the writer returns at once (True):
        a finisher thread completes it once the API server has answered them all (what the answers mean,
        the status) and only then is the key done, so two passes of one deployment never overlap, while
        this worker goes on with other deployments instead of waiting for the API server."""
        t0 = time.monotonic()
        now = self.clock()
        try:
            pass_ = Pass(self.ctx, key, now)
            pass_.begin()
        except Exception as exc:
            self._failed(key, exc, now)
            telemetry.RECONCILE_SECONDS.labels(*key).observe(time.monotonic() - t0)
            self.passes += 1
            return False
        telemetry.RECONCILE_SECONDS.labels(*key).observe(time.monotonic() - t0)
        self.passes += 1
        pending = pass_.pending
        if not pending:
            self._complete(key, pass_, now, t0)
            return False
        submitted = time.monotonic()
        self.busy[f"writes:{key[0]}/{key[1]}"] = submitted  # (a hang here fails liveness too)
        left = [len(pending)]
        lock = threading.Lock()

        def answered(_: Any) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                try:
                    self._finisher.submit(self._finish, key, pass_, now, t0, submitted)
                except RuntimeError:  # stopping
                    self.busy.pop(f"writes:{key[0]}/{key[1]}", None)
                    self.queue.done(key)

        for fut in pending:
            fut.add_done_callback(answered)
        return True

    def _finish(self, key: Key, pass_: Pass, now: float, t0: float, submitted: float) -> None:
        name = f"finish:{key[0]}/{key[1]}"
        self.busy.pop(f"writes:{key[0]}/{key[1]}", None)
        self.busy[name] = time.monotonic()
        try:
            self._complete(key, pass_, now, t0)
        finally:
            telemetry.WRITES_SECONDS.observe(time.monotonic() - submitted)
            self.busy.pop(name, None)
            self.queue.done(key)

    def _complete(self, key: Key, pass_: Pass, now: float, t0: float) -> None:
        """The rest of a pass (its status), and what to do next with its key (`t0`: when it began)."""
        try:
            result = pass_.finish()
        except Exception as exc:
            self._failed(key, exc, now)
            return
        telemetry.RECONCILES.labels(key[0], key[1], "ok" if result else "gone").inc()
        with self._lock:
            if result is not None and result.waiting_for_capacity:
                self.waiting_for_capacity.add(key)
            else:
                self.waiting_for_capacity.discard(key)
        if result is None:
            self.queue.forget(key)
            return
        record(key, result)
        took = time.monotonic() - t0
        if passes_log.isEnabledFor(logging.DEBUG):
            passes_log.debug("%s/%s: %s", *key, pass_line(result, took))
        if took > SLOW_PASS_SECONDS:
            log.info("%s/%s: slow pass (%.2f s): %s", *key, took, result.timings)
        if result.errors:
            delay = self.queue.add_rate_limited(key)
            log.warning(
                "%s/%s: the API server refused %d write(s), retrying in %.1f s: %s",
                *key,
                len(result.errors),
                delay,
                result.errors[0],
            )
        else:
            self.queue.forget(key)
            if result.requeue_after is not None:
                self.queue.add_after(key, result.requeue_after)
        if result.created or result.deleted or result.conditions_changed:
            log.info(
                "%s/%s: created %s deleted %s conditions %s",
                *key,
                result.created,
                result.deleted,
                result.conditions_changed,
            )

    def _failed(self, key: Key, exc: Exception, now: float) -> None:
        telemetry.RECONCILES.labels(key[0], key[1], "error").inc()
        telemetry.RECONCILE_ERRORS.labels(key[0], key[1], type(exc).__name__).inc()
        delay = self.queue.add_rate_limited(key)
        log.error("reconcile of %s/%s failed; retrying in %.1f s", *key, delay, exc_info=exc)
        self._surface(key, exc, now)

    def _surface(self, key: Key, exc: Exception, now: float) -> None:
        """An unexpected failure is shown on the object too (one Event per distinct message)."""
        body = self.view.model_deployment(key)
        if body is None:
            return
        mem = self.ctx.mem(key)
        text = f"{type(exc).__name__}: {exc}"[:900]
        if now - mem.errors_posted.get(text, 0.0) < 600:
            return
        mem.errors_posted[text] = now
        self.kube.event(body, "Warning", "ReconcileError", f"the operator failed to reconcile: {text}")

    def _resync(self) -> None:
        while not self._stop.wait(self.options.resync_seconds):
            if self.leading.is_set():
                for key in self.view.deployments():
                    self.queue.add(key)
            self.ledger.expire(self.clock())
            telemetry.LEDGER_RESERVED_PODS.set(len(self.ledger.reservations()))

    def _burst_watch(self) -> None:
        while not self._stop.wait(self.options.burst_watch_seconds):
            self.burst_look()

    def burst_look(self) -> list[Key]:
        """One look of the burst watch, by the leader only, once its view is whole."""
        if not self.leading.is_set() or not self.synced():
            return []
        try:
            return self.watch_bursts(self.clock())
        except Exception:  # a missed look is not a missed burst: the evaluation interval still runs
            log.exception("burst watch failed")
            return []

    def watch_bursts(self, now: float) -> list[Key]:
        """One look of the burst watch: the requests in flight at every autoscaled deployment's frontend,
        one query per Prometheus for the whole fleet (not one per deployment); each deployment whose count
        steps up (tokenfab.planning.autoscaler.burst_watch) is evaluated now instead of at its next
        interval. A failed read wakes nobody: the evaluations go on at their interval. Returns the
        deployments woken."""
        by_url: dict[str, list[tuple[Key, Obj]]] = {}
        for key in self.view.deployments():
            body = self.view.model_deployment(key)
            spec = (body or {}).get("spec")
            a = spec.get("autoscaling") if isinstance(spec, dict) else None
            if body is None or not isinstance(a, dict) or not a.get("enabled"):
                continue
            url = a.get("prometheusUrl")
            if isinstance(url, str) and url:
                by_url.setdefault(url, []).append((key, body))
        woken: list[Key] = []
        for url, items in by_url.items():
            values, why = self.fleet_reader(url, metrics.fleet_inflight_query())
            if values is None:
                log.debug("burst watch: %s: %s", url, why)
                continue
            for key, body in items:
                value = values.get(key)
                if value is not None and burst_watch(body, value, now):
                    self.ctx.urgent.add(key)
                    self.queue.add(key)
                    woken.append(key)
        if woken:
            log.info("burst watch: evaluating %s now", ", ".join(f"{ns}/{n}" for ns, n in woken))
        return woken

    def _inventory(self) -> None:
        written: dict[str, Any] = {}
        while not self._stop.wait(self.options.inventory_seconds):
            if not self.leading.is_set() or not self.synced():
                continue
            try:
                inventory.sync_domains(self.kube, self.view, self.ledger, written, self.clock())
            except ApiError as exc:
                log.warning("NVLinkDomain inventory: %s", exc)
            except Exception:
                log.exception("NVLinkDomain inventory failed")


def _child_handler(view: ClusterView, kind: str) -> Callable[[str, Obj], Change]:
    def handler(type_: str, obj: Obj) -> Change:
        return view.on_child(kind, type_, obj)

    return handler


def pass_line(result: Result, took: float) -> str:
    """One pass in a line: what it wrote, what it parked, when it looks again, its phases' seconds."""
    parts = [f"took {took:.3f} s"]
    for name in ("created", "deleted", "released", "draining", "channel_waits", "identity_waits"):
        got = getattr(result, name)
        if got:
            parts.append(f"{name} {','.join(got)}")
    if result.applied:
        parts.append(f"applied {len(result.applied)}")
    if result.conditions_changed:
        parts.append(f"conditions {','.join(result.conditions_changed)}")
    if result.decisions:
        parts.append(f"decided {','.join(result.decisions)}")
    unbound = [(g, why) for plan in result.plans for g, why in plan.unbound.items()]
    if unbound:
        parts.append(f"{len(unbound)} group(s) not serving, first {unbound[0][0]}: {unbound[0][1][:120]}")
    if result.errors:
        parts.append(f"refused {len(result.errors)}: {str(result.errors[0])[:120]}")
    if result.waited:
        parts.append("waited for the watch")
    if result.waiting_for_capacity:
        parts.append("waiting for capacity")
    if result.requeue_after is not None:
        parts.append(f"again in {result.requeue_after:.1f} s")
    if result.timings:
        parts.append("phases " + " ".join(f"{k}={v:.3f}" for k, v in result.timings.items()))
    return "; ".join(parts)


def record(key: Key, result: Result) -> None:
    """Export one pass's outcome as the operator's own metrics."""
    if result.channel_waits:
        telemetry.PARKED_GROUPS.labels("channel").inc(len(result.channel_waits))
    if result.identity_waits:
        telemetry.PARKED_GROUPS.labels("identity").inc(len(result.identity_waits))
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
