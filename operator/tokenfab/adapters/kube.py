"""The only writer to the Kubernetes API: server-side apply with field manager "tokenfab", deletes by
label, the ModelDeployment status subresource, and Events. Reads return plain dicts."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from tokenfab.api.models import API_VERSION, KIND
from tokenfab.planning import contract as c

log = logging.getLogger(__name__)
Obj = dict[str, Any]
KIND_RECHECK_SECONDS = 15.0


class Kube:
    """API access for one operator process (one ApiClient, built by the caller)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        # A discovery cache of this process's own: the client's default file in $TMPDIR is shared by every
        # process talking to the same server and goes stale when a CRD comes or goes.
        cache = Path(tempfile.mkdtemp(prefix="tokenfab-discovery-")) / "discovery.json"
        self.dyn = DynamicClient(api_client, cache_file=str(cache))
        self._lock = threading.RLock()  # reconciles run in threads; discovery is not thread-safe
        self._kinds: dict[tuple[str, str], tuple[bool, float]] = {}

    def _resource(self, api_version: str, kind: str) -> Any:
        with self._lock:
            return self.dyn.resources.get(api_version=api_version, kind=kind)

    # ------------------------------------------------------------------------------------ reads
    def has_kind(self, api_version: str, kind: str) -> bool:
        """True if the API server serves this kind (e.g. a CRD another project installs); rediscovered
        at most every KIND_RECHECK_SECONDS, so a CRD installed or removed later is noticed."""
        key, now = (api_version, kind), time.monotonic()
        with self._lock:
            known = self._kinds.get(key)
            if known is not None and now - known[1] < KIND_RECHECK_SECONDS:
                return known[0]
            if known is not None:
                self.dyn.resources.invalidate_cache()
            try:
                self.dyn.resources.get(api_version=api_version, kind=kind)
                served = True
            except ResourceNotFoundError:
                served = False
            self._kinds[key] = (served, now)
            return served

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            obj = self._resource(api_version, kind).get(name=name, namespace=namespace)
        except NotFoundError:
            return None
        result: Obj = obj.to_dict()
        return result

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None = None, selector: str = ""
    ) -> list[Obj]:
        res = self._resource(api_version, kind)
        items = (
            res.get(namespace=namespace, label_selector=selector)
            if namespace
            else res.get(label_selector=selector)
        )
        return [i.to_dict() for i in items.items]

    def model_deployment(self, namespace: str, name: str) -> Obj | None:
        return self.get(API_VERSION, KIND, name, namespace)

    def children(self, namespace: str, owner: str, kind: str, api_version: str = "v1") -> list[Obj]:
        selector = f"{c.MANAGED_BY}={c.MANAGED_BY_VALUE},{c.LABEL_DEPLOYMENT}={owner}"
        return self.list_objects(api_version, kind, namespace, selector)

    def nodes(self) -> list[Obj]:
        return self.list_objects("v1", "Node")

    def gpu_pods(self) -> list[Obj]:
        """Every non-terminal pod in the cluster (for free-GPU accounting)."""
        pods = self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False
        )
        import json

        items: list[Obj] = json.loads(pods.data)["items"]
        return items

    # ----------------------------------------------------------------------------------- writes
    def apply(self, manifest: Obj) -> None:
        """Server-side apply; tokenfab owns every field it sets."""
        res = self._resource(manifest["apiVersion"], manifest["kind"])
        meta = manifest["metadata"]
        res.server_side_apply(
            body=manifest,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=c.FIELD_MANAGER,
            force_conflicts=True,
        )

    def apply_status(self, namespace: str, name: str, status: Obj) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        res = self._resource(API_VERSION, KIND)
        res.status.server_side_apply(
            body=body, name=name, namespace=namespace, field_manager=c.FIELD_MANAGER, force_conflicts=True
        )

    def apply_cluster_status(
        self, api_version: str, kind: str, name: str, status: Obj, labels: dict[str, str]
    ) -> None:
        """Create-or-update a cluster-scoped status-only object (e.g. an NVLinkDomain)."""
        body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}}
        res = self._resource(api_version, kind)
        res.server_side_apply(body=body, name=name, field_manager=c.FIELD_MANAGER, force_conflicts=True)
        res.status.server_side_apply(
            body={**body, "status": status}, name=name, field_manager=c.FIELD_MANAGER, force_conflicts=True
        )

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(name=name, namespace=namespace)

    def delete_group(self, namespace: str, group: str) -> None:
        """Delete every pod of a group (and its ComputeDomain, if any) at once."""
        self.core.delete_collection_namespaced_pod(namespace, label_selector=f"{c.LABEL_GROUP}={group}")
        if not self.has_kind(c.COMPUTE_DOMAIN_API, "ComputeDomain"):
            return  # NVIDIA's DRA driver is not installed: there is nothing to delete
        try:
            found = self._resource(c.COMPUTE_DOMAIN_API, "ComputeDomain").get(
                namespace=namespace, label_selector=f"{c.LABEL_GROUP}={group}"
            )
        except (NotFoundError, ResourceNotFoundError):  # the CRD went away since discovery
            return
        for cd in found.items:
            self.delete(c.COMPUTE_DOMAIN_API, "ComputeDomain", cd.metadata.name, namespace)

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
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as exc:
            log.warning("could not post event %s: %s", reason, exc.reason)
