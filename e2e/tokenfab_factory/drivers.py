"""Simulated node drivers of the factory's GPU nodes: what a real GB200 cluster's drivers do for tokenfab's
pods at the API level, so the real kube-scheduler and kube-controller-manager allocate and bind for real.

NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu, ComputeDomain API resource.nvidia.com/v1beta1), minus the
IMEX daemons a real node would run:
- installs the ComputeDomain CRD (v1beta1: spec.numNodes, deprecated, default 0; spec.channel with the name
  of the ResourceClaimTemplate to make and allocationMode Single|All; the spec immutable; status.status
  Ready|NotReady) and the DeviceClasses compute-domain-default-channel.nvidia.com and
  compute-domain-daemon.nvidia.com (selecting devices of driver compute-domain.nvidia.com by type and id);
- publishes, per GPU node (one with the clique label), one ResourceSlice of driver
  compute-domain.nvidia.com, pool = the node, with the devices channel-0 (type channel, id 0) and daemon-0:
  one IMEX channel per node, as on a real node, so at most one pod per node holds a workload channel;
- answers each ComputeDomain: a finalizer, then in its namespace the ResourceClaimTemplate it names (one
  request `channel` of the default-channel class, the domain's uid in an opaque config), and status Ready
  (numNodes 0: nothing to wait for); on deletion the template goes, then the finalizer.

A node-local volume provisioner (as local-path-provisioner or TopoLVM on the trays' NVMe): the StorageClass
`local-nvme` (WaitForFirstConsumer); for each claim of it the scheduler has picked a node for (annotation
volume.kubernetes.io/selected-node), a `local` PersistentVolume of the claimed size on that node, bound to
the claim. Nothing is written to disk: the pods are simulated.

Run by the factory as a component (`tokenfab factory up`), stopped by PID with it; /healthz on its port
answers 200 once the CRD, the DeviceClasses and the StorageClass are installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("tokenfab-dra")

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
PLURAL = "computedomains"
DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
BROKEN = "tokenfab.dev/injected-fault"  # a ComputeDomain the fault injector broke
FINALIZER = "resource.nvidia.com/computeDomain"
LABEL_DOMAIN = "resource.nvidia.com/computeDomain"
LABEL_TARGET = "resource.nvidia.com/computeDomainTarget"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
RESOURCE_API = "resource.k8s.io/v1"
STORAGE_CLASS = "local-nvme"
PROVISIONER = "tokenfab.dev/local-nvme"
SELECTED_NODE = "volume.kubernetes.io/selected-node"


def compute_domain_crd() -> dict[str, Any]:
    """The ComputeDomain CRD, v1beta1 (the only version NVIDIA's driver serves)."""
    spec = {
        "type": "object",
        "required": ["channel"],
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
        ],
        "properties": {
            "numNodes": {"type": "integer", "minimum": 0, "default": 0},
            "channel": {
                "type": "object",
                "required": ["resourceClaimTemplate"],
                "properties": {
                    "resourceClaimTemplate": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}},
                    },
                    "allocationMode": {"type": "string", "enum": ["All", "Single"], "default": "Single"},
                },
            },
        },
    }
    status = {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady"},
            "nodes": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
                "plural": PLURAL,
                "singular": "computedomain",
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec, "status": status},
                        }
                    },
                }
            ],
        },
    }


def device_class(name: str, device_type: str) -> dict[str, Any]:
    attrs = f"device.attributes['{DRIVER}']"
    expression = f"device.driver == '{DRIVER}' && {attrs}.type == '{device_type}'"
    if device_type == "channel":
        expression += f" && {attrs}.id == 0"
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(node: dict[str, Any]) -> dict[str, Any]:
    """The IMEX devices of one node: one workload channel, one daemon slot (as the real plugin publishes)."""
    name = node["metadata"]["name"]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{DRIVER}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"{kind}-0", "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
                for kind in ("channel", "daemon")
            ],
        },
    }


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }


def local_volume(pvc: dict[str, Any], node: str) -> dict[str, Any]:
    """A node-local PersistentVolume for a claim, on the node the scheduler picked for its first pod."""
    meta = pvc["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"local-nvme-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"]},
            "accessModes": pvc["spec"]["accessModes"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "local": {"path": f"/var/lib/local-nvme/{meta['namespace']}/{meta['name']}"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }


def claim_template(cd: dict[str, Any]) -> dict[str, Any]:
    """The workload ResourceClaimTemplate a ComputeDomain names, in its namespace."""
    meta, spec = cd["metadata"], cd["spec"]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": spec["channel"]["resourceClaimTemplate"]["name"],
            "namespace": meta["namespace"],
            "labels": {LABEL_DOMAIN: meta["uid"], LABEL_TARGET: "Workload"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": f"{GROUP}/{VERSION}",
                                    "kind": "ComputeDomainChannelConfig",
                                    "domainID": meta["uid"],
                                    "allocationMode": spec["channel"].get("allocationMode", "Single"),
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


class Driver:
    def __init__(self, api: Any) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.ext = client.ApiextensionsV1Api(api)
        self.installed = threading.Event()
        self.stop = threading.Event()
        # What this driver has published already, by object uid: a slice depends only on its node's name
        # and uid, a claim template on its ComputeDomain's, so a node's heartbeats and a domain's own
        # finalizer and status patches publish nothing again (a real node's kubelet plugin publishes its
        # slice once too). Without this, every node event of a 2,304-node factory re-applied its slice,
        # and each 60 s watch restart (all nodes again, one at a time) never reached the last racks.
        self.sliced: dict[str, str] = {}  # node name -> uid whose slice is published
        self.templated: set[str] = set()  # ComputeDomain uids whose claim template is made

    # ---------------------------------------------------------------- raw REST (resource.k8s.io/v1)
    def _call(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/apply-patch+yaml"  # (JSON is YAML)
            body = json.dumps(body)
        m, url, hdrs, payload, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, hdrs, payload, _request_timeout=(5, 30))
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:300])
        return json.loads(data) if data else None

    def apply(self, path: str, obj: dict[str, Any]) -> None:
        """Server-side apply (creates or updates) as field manager tokenfab-dra."""
        query = [("fieldManager", "tokenfab-dra"), ("force", "true")]
        self._call("PATCH", f"{path}/{obj['metadata']['name']}", obj, query)

    def install(self) -> None:
        with contextlib.suppress(ApiException):
            self.ext.create_custom_resource_definition(compute_domain_crd())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crd = self.ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
            if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
                break
            time.sleep(0.2)
        for name, kind in ((CHANNEL_CLASS, "channel"), (DAEMON_CLASS, "daemon")):
            self.apply("/apis/resource.k8s.io/v1/deviceclasses", device_class(name, kind))
        self.apply("/apis/storage.k8s.io/v1/storageclasses", storage_class())
        self.installed.set()

    # --------------------------------------------------------------------------------- watches
    def _watch(
        self, name: str, lister: Callable[..., Any], handle: Callable[[str, Any], None], **kw: Any
    ) -> None:
        w = watch.Watch()
        version: str | None = None  # resumed from where the last watch ended (no re-list every minute)
        while not self.stop.is_set():
            try:
                more = {"resource_version": version} if version else {}
                for ev in w.stream(lister, timeout_seconds=60, **kw, **more):
                    handle(ev["type"], ev["object"])
                    if self.stop.is_set():
                        return
                version = w.resource_version
            except Exception as exc:
                version = None  # (410 Gone, or the API server away: list again)
                log.warning("%s watch: %s; again in 1 s", name, exc)
                time.sleep(1)

    def on_node(self, type_: str, node: Any) -> None:
        obj = self.api.sanitize_for_serialization(node)
        meta = obj["metadata"]
        if type_ == "DELETED":
            self.sliced.pop(meta["name"], None)  # (its slice goes with it: it is owned by the node)
            return
        if CLIQUE_LABEL not in (meta.get("labels") or {}) or self.sliced.get(meta["name"]) == meta["uid"]:
            return
        try:
            self.apply("/apis/resource.k8s.io/v1/resourceslices", resource_slice(obj))
            self.sliced[meta["name"]] = meta["uid"]
        except ApiException as exc:
            log.warning("slice of %s: %s", meta["name"], exc.reason)

    def on_compute_domain(self, type_: str, cd: dict[str, Any]) -> None:
        """Make the domain's claim template and say Ready (NotReady while it carries BROKEN)."""
        meta = cd["metadata"]
        if type_ == "DELETED":
            self.templated.discard(meta["uid"])
            return
        ns, name = meta["namespace"], meta["name"]
        rct = claim_template(cd)
        try:
            if meta.get("deletionTimestamp"):
                with contextlib.suppress(ApiException):
                    self._call(
                        "DELETE",
                        f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/"
                        f"{rct['metadata']['name']}",
                    )
                left = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
                self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": left or None}}
                )
                return
            if FINALIZER not in (meta.get("finalizers") or []):
                fin = [*(meta.get("finalizers") or []), FINALIZER]
                self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": fin}}
                )
            if meta["uid"] not in self.templated:
                self.apply(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", rct)
                self.templated.add(meta["uid"])
            # (`tokenfab factory fault break-domain` marks a domain broken: its IMEX daemons failed)
            want = "NotReady" if (meta.get("annotations") or {}).get(BROKEN) else "Ready"
            if (cd.get("status") or {}).get("status") != want:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ns, PLURAL, name, {"status": {"status": want, "nodes": []}}
                )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("ComputeDomain %s/%s: %s %s", ns, name, exc.status, exc.reason)

    def on_claim(self, type_: str, pvc: Any) -> None:
        obj = self.api.sanitize_for_serialization(pvc)
        meta, spec = obj["metadata"], obj.get("spec") or {}
        node = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if (
            type_ == "DELETED"
            or spec.get("storageClassName") != STORAGE_CLASS
            or not node
            or spec.get("volumeName")
        ):
            return
        try:
            self.core.create_persistent_volume(local_volume(obj, node))
            log.info("local volume for %s/%s on %s", meta["namespace"], meta["name"], node)
        except ApiException as exc:
            if exc.status != 409:  # (made already: the controller binds it)
                log.warning("volume of %s/%s: %s %s", meta["namespace"], meta["name"], exc.status, exc.reason)

    def run(self) -> None:
        self.install()
        threads = [
            threading.Thread(
                target=self._watch,
                args=("nodes", self.core.list_node, self.on_node),
                kwargs={"label_selector": CLIQUE_LABEL},
                daemon=True,
            ),
            threading.Thread(
                target=self._watch,
                args=("claims", self.core.list_persistent_volume_claim_for_all_namespaces, self.on_claim),
                daemon=True,
            ),
            threading.Thread(
                target=self._watch,
                args=("computedomains", self.custom.list_cluster_custom_object, self.on_compute_domain),
                kwargs={"group": GROUP, "version": VERSION, "plural": PLURAL},
                daemon=True,
            ),
        ]
        for t in threads:
            t.start()
        self.stop.wait()


@contextlib.contextmanager
def serve_health(port: int, ready: threading.Event) -> Iterator[None]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = ready.is_set()
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"installing")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--port", type=int, required=True, help="/healthz on 127.0.0.1:<port>")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    driver = Driver(config.new_client_from_config(a.kubeconfig))
    signal.signal(signal.SIGTERM, lambda *_: driver.stop.set())
    with serve_health(a.port, driver.installed):
        driver.run()


if __name__ == "__main__":
    main()
