"""The only writer to the Kubernetes API: server-side apply with field manager "tokenfab", deletes by label,
the ModelDeployment status subresource, Events, and the raw lists and watches the informers use.

Every request has a timeout (a hung API server never pins a worker), is counted per verb and resource
(`tokenfab_api_requests_total`, and per pass for the benchmarks), and fails with an `ApiError` carrying
the API server's own reason and message, so the reconciler can show the user what the server said.
Paths and error translation are tokenfab.adapters.kube_rest's; `ApiError` and `resource_path` are
importable from here too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tokenfab.adapters import telemetry
from tokenfab.adapters.kube_rest import RESOURCES as RESOURCES  # re-exported: callers import them from here
from tokenfab.adapters.kube_rest import ApiError as ApiError
from tokenfab.adapters.kube_rest import api_prefix, error_of, resource_of
from tokenfab.adapters.kube_rest import resource_path as resource_path
from tokenfab.api.models import API_VERSION, KIND
from tokenfab.planning import contract

log = logging.getLogger(__name__)
Obj = dict[str, Any]
KIND_RECHECK_SECONDS = 15.0
TIMEOUT = (5.0, 20.0)  # connect, read: every request but watches
LOG_READERS = 4
LOG_TIMEOUT = (2.0, 5.0)  # a pod's log: the API server asks the node's kubelet; a pass does not wait long
WATCH_SECONDS = 240  # server-side timeout of one watch request (then it is resumed)


@dataclass
class Counter:
    """Requests made by one thread during a pass (reads and writes)."""

    reads: int = 0
    writes: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)


_local = threading.local()


class Kube:
    """API access for one operator process (one ApiClient, built by the caller); thread-safe."""

    def __init__(self, api_client: Any, timeout: tuple[float, float] = TIMEOUT, workers: int = 16) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], tuple[bool, float]] = {}
        self._rediscovering: set[tuple[str, str]] = set()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenfab-write")
        # pods' logs (tokenfab.pod_logs): read apart from the writers, never waited for by a pass
        self.log_pool = ThreadPoolExecutor(max_workers=LOG_READERS, thread_name_prefix="tokenfab-logs")
        self._workers = workers

    def start_writers(self) -> None:
        """Start every writer thread now. The pool starts its threads on demand, and a submit that
        starts one waits until the new thread runs: on a busy machine ~10 ms each, which the first pass
        that writes a whole deployment paid 14 times before its last pods went out."""
        everyone = threading.Barrier(self._workers)

        def wait() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                everyone.wait(10)

        for _ in range(self._workers):
            self.pool.submit(wait)  # a busy pool starts a thread for each

    # ------------------------------------------------------------------------------ the transport
    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: tuple[float, float] | None = None,
        what: str = "",
        stream: bool = False,
        raw: bool = False,
    ) -> Any:
        headers = {"Accept": "*/*" if raw else "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        verb = method if not stream else "WATCH"
        resource = resource_of(path)
        counter: Counter | None = getattr(_local, "counter", None)
        if counter is not None:
            if method in ("GET",):
                counter.reads += 1
            else:
                counter.writes += 1
            counter.by_verb[verb] = counter.by_verb.get(verb, 0) + 1
        code = "0"
        try:
            m, url, hdrs, payload, _ = self.api_client.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api_client.call_api(m, url, hdrs, payload, _request_timeout=timeout or self.timeout)
            code = str(resp.status)
            if stream and 200 <= resp.status < 300:
                return resp.response
            data = resp.read()
            if not 200 <= resp.status < 300:
                raise error_of(resp.status, data, method, what or path)
            if raw:
                return bytes(data or b"").decode("utf-8", "replace")
            return json.loads(data) if data else None
        except ApiException as exc:  # raised by the transport itself (e.g. SSL, or status 0)
            raise ApiError(
                exc.status or 0, exc.reason or "ApiException", str(exc.reason), method, what
            ) from exc
        except ApiError:
            raise
        except Exception as exc:  # timeouts, refused connections: no answer from the API server
            code = "error"
            raise ApiError(
                0, type(exc).__name__, f"no answer from the API server: {exc}", method, what
            ) from exc
        finally:
            telemetry.API_REQUESTS.labels(verb, resource, code).inc()

    # ------------------------------------------------------------------------------------ reads
    def has_kind(self, api_version: str, kind: str) -> bool:
        """True if the API server serves this kind (e.g. a CRD another project installs). Asked once,
        then rediscovered in the background when the answer is older than KIND_RECHECK_SECONDS (so a CRD
        installed or removed later is noticed): only the very first call waits for the API server, and a
        pass creating groups never waits for discovery (see warm_kinds)."""
        key, now = (api_version, kind), time.monotonic()
        with self._lock:
            known = self._kinds.get(key)
            stale = known is not None and now - known[1] >= KIND_RECHECK_SECONDS
            refresh = stale and key not in self._rediscovering
            if refresh:
                self._rediscovering.add(key)
        if known is None:
            return self._discover(api_version, kind)
        if refresh:
            try:
                self.pool.submit(self._rediscover, api_version, kind)
            except RuntimeError:  # stopping
                with self._lock:
                    self._rediscovering.discard(key)
        return known[0]

    def warm_kinds(self, kinds: list[tuple[str, str]]) -> None:
        """Discover these kinds now, in the background (at start: the first pass then finds them known)."""
        for api_version, kind in kinds:
            self.pool.submit(self._rediscover, api_version, kind)

    def _rediscover(self, api_version: str, kind: str) -> None:
        try:
            self._discover(api_version, kind)
        except ApiError as exc:
            log.warning("discovery of %s %s: %s", api_version, kind, exc)
        finally:
            with self._lock:
                self._rediscovering.discard((api_version, kind))

    def _discover(self, api_version: str, kind: str) -> bool:
        now = time.monotonic()
        try:
            found = self.request("GET", api_prefix(api_version), what=f"discovery {api_version}")
            served = any(r.get("kind") == kind for r in (found or {}).get("resources") or [])
        except ApiError as exc:
            if exc.status not in (403, 404, 503):
                raise
            served = False
        with self._lock:
            self._kinds[(api_version, kind)] = (served, now)
        return served

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            result: Obj = self.request(
                "GET", resource_path(api_version, kind, namespace, name), what=f"{kind} {name}"
            )
            return result
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def pod_log(
        self,
        namespace: str,
        name: str,
        container: str,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:
        """A container's log: its last `tail_lines` lines, or its first `limit_bytes` bytes."""
        query = [("container", container)]
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        if limit_bytes is not None:
            query.append(("limitBytes", str(limit_bytes)))
        text: str = self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{name}/log",
            query,
            timeout=LOG_TIMEOUT,
            what=f"log of pod {name}",
            raw=True,
        )
        return text

    def list_page(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 500,
    ) -> tuple[list[Obj], str]:
        """Every object (paged), and the list's resourceVersion to watch from."""
        items: list[Obj] = []
        cont = ""
        while True:
            query = [("limit", str(limit))]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            page = self.request(
                "GET", resource_path(api_version, kind, namespace), query, what=f"list {kind}"
            )
            for obj in page.get("items") or []:
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                items.append(obj)
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items, str((page.get("metadata") or {}).get("resourceVersion") or "")

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, selector: str = ""
    ) -> list[Obj]:
        return self.list_page(api_version, kind, namespace, selector)[0]

    def watch(
        self,
        api_version: str,
        kind: str,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        on_open: Any = None,
    ) -> Iterator[Obj]:
        """Watch events ({type, object}) from `resource_version`, until the server ends the request."""
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        resp = self.request(
            "GET",
            resource_path(api_version, kind, namespace),
            query,
            timeout=(self.timeout[0], WATCH_SECONDS + 30),
            what=f"watch {kind}",
            stream=True,
        )
        if on_open is not None:
            on_open(resp)
        try:
            for line in iter_resp_lines(resp):
                if line:
                    yield json.loads(line)
        finally:
            resp.release_conn()

    def nodes(self) -> list[Obj]:
        return self.list_objects("v1", "Node")

    def gpu_pods(self) -> list[Obj]:
        """Every non-terminal pod in the cluster (for free-GPU accounting by one-shot tools)."""
        return self.list_page("v1", "Pod", field_selector="status.phase!=Succeeded,status.phase!=Failed")[0]

    # ----------------------------------------------------------------------------------- writes
    def apply(self, manifest: Obj, manager: str = contract.FIELD_MANAGER) -> Obj:
        """Server-side apply; tokenfab owns every field it sets (a model cache claim's owners each under a
        field manager of their own)."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        result: Obj = self.request(
            "PATCH",
            path,
            [("fieldManager", manager), ("force", "true")],
            body=manifest,
            content_type="application/apply-patch+yaml",
            what=f"{manifest['kind']} {meta.get('namespace', '')}/{meta['name']}".replace(" /", " "),
        )
        return result

    def apply_status(self, namespace: str, name: str, status: Obj) -> Obj:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        result: Obj = self.request(
            "PATCH",
            resource_path(API_VERSION, KIND, namespace, name, "status"),
            [("fieldManager", contract.FIELD_MANAGER), ("force", "true")],
            body=body,
            content_type="application/apply-patch+yaml",
            what=f"{KIND} {namespace}/{name} status",
        )
        return result

    def apply_cluster_status(
        self, api_version: str, kind: str, name: str, status: Obj, labels: dict[str, str]
    ) -> None:
        """Create-or-update a cluster-scoped status-only object (e.g. an NVLinkDomain)."""
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}}
        self.apply(body)
        self.request(
            "PATCH",
            resource_path(api_version, kind, None, name, "status"),
            [("fieldManager", contract.FIELD_MANAGER), ("force", "true")],
            body={**body, "status": status},
            content_type="application/apply-patch+yaml",
            what=f"{kind} {name} status",
        )

    def merge_patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        result: Obj = self.request(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            [("fieldManager", contract.FIELD_MANAGER)],
            body=patch,
            content_type="application/merge-patch+json",
            what=f"{kind} {namespace or ''}/{name}".replace(" /", " "),
        )
        return result

    def release_pod(self, namespace: str, name: str, now: float) -> None:
        """Lift tokenfab's scheduling gate (the scheduler may bind the pod from now on)."""
        self.merge_patch(
            "v1",
            "Pod",
            namespace,
            name,
            {
                "metadata": {"annotations": {contract.ANN_RELEASED: f"{now:.3f}"}},
                "spec": {"schedulingGates": None},
            },
        )

    def set_pod_condition(
        self, namespace: str, name: str, type_: str, status: bool, reason: str, message: str
    ) -> None:
        """Set one condition on a pod's status (a readiness gate's), by strategic merge on its type."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {
            "type": type_,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message[:500],
            "lastTransitionTime": now,
        }
        self.request(
            "PATCH",
            resource_path("v1", "Pod", namespace, name, "status"),
            [("fieldManager", contract.FIELD_MANAGER)],
            body={"status": {"conditions": [cond]}},
            content_type="application/strategic-merge-patch+json",
            what=f"Pod {namespace}/{name} status",
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        preconditions: Obj | None = None,
    ) -> None:
        """Delete an object (gone already: fine); with `preconditions` (uid, resourceVersion) only if it is
        still that object as it was (else the API server answers 409 Conflict, which is fine too: someone
        changed it, and the next pass decides again)."""
        body = (
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
            if preconditions
            else None
        )
        try:
            self.request(
                "DELETE",
                resource_path(api_version, kind, namespace, name),
                body=body,
                content_type="application/json" if body else None,
                what=f"{kind} {name}",
            )
        except ApiError as exc:
            if not exc.not_found and not (preconditions and exc.status == 409):
                raise

    def force_delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod at once (grace period 0): for a pod bound to a node that no longer exists, which
        no kubelet will ever confirm gone (the pod garbage collector would, some 40 s later)."""
        try:
            self.request(
                "DELETE",
                resource_path("v1", "Pod", namespace, name),
                [("gracePeriodSeconds", "0")],
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                content_type="application/json",
                what=f"pod {namespace}/{name} (force: its node is gone)",
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    def delete_group(self, namespace: str, group: str, compute_domain: bool = False) -> None:
        """Delete every pod of a group at once, and its PodGroup and ComputeDomain if it has them."""
        self.request(
            "DELETE",
            resource_path("v1", "Pod", namespace),
            [("labelSelector", f"{contract.LABEL_GROUP}={group}")],
            what=f"pods of group {namespace}/{group}",
        )
        if self.has_kind(contract.POD_GROUP_API, "PodGroup"):
            self.delete(contract.POD_GROUP_API, "PodGroup", group, namespace)
        if compute_domain and self.has_kind(contract.COMPUTE_DOMAIN_API, "ComputeDomain"):
            for cd in self.list_objects(
                contract.COMPUTE_DOMAIN_API, "ComputeDomain", namespace, f"{contract.LABEL_GROUP}={group}"
            ):
                self.delete(contract.COMPUTE_DOMAIN_API, "ComputeDomain", cd["metadata"]["name"], namespace)

    def post_event(self, owner: Obj, type_: str, reason: str, message: str) -> None:
        """`event`, posted in the background (a pass does not wait for its Events)."""
        self.pool.submit(self.event, owner, type_, reason, message)

    def event(self, owner: Obj, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the ModelDeployment; failures are logged, never raised."""
        meta = owner["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "tokenfab-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "tokenfab.dev/operator",
            "reportingInstance": "tokenfab-operator",
        }
        try:
            self.request("POST", resource_path("v1", "Event", meta["namespace"]), body=body, what="Event")
        except ApiError as exc:
            log.warning("could not post event %s: %s", reason, exc)


def count_requests() -> Counter:
    """Start counting this thread's requests (for one pass); returns the counter."""
    counter = Counter()
    _local.counter = counter
    return counter


def stop_counting() -> None:
    _local.counter = None
