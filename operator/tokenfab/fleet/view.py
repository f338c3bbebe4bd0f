"""The cluster view: what the operator knows of nodes, pods and its children, kept current by watches.

Informers (tokenfab.adapters.informer) call the `on_*` methods with each watch event; a reconcile pass
reads the view instead of listing the cluster, so a pass that finds nothing to do costs no API request.
Every object is reduced to the few facts tokenfab uses (frozen dataclasses of tokenfab.fleet.facts, whose
names are importable from here too), which keeps memory small at the scale of an AI factory (thousands of
nodes and pods).

Each `on_*` method returns a `Change`: the deployments the event concerns (to reconcile) and whether it
freed capacity (so deployments waiting for room are tried again). Pods and nodes are indexed so an event
wakes only the deployments it concerns.

What counts as used on a node: every non-terminal pod bound to it (tokenfab's and others'), and every
tokenfab pod pinned to it but not bound yet (placement already promised it that room).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tokenfab.fleet.facts import (
    ChildFacts,
    PodFacts,
    child_facts,
    device_taint_rule_facts,
    more_room,
    node_facts,
    node_times,
    parse_time,
    pod_facts,
    pod_requests,
    same_node,
    status_only,
)
from tokenfab.planning import contract
from tokenfab.planning.capacity import NodeFacts, add
from tokenfab.planning.faults import FLAP_WINDOW, FaultKeys, NodeFault, flapping

__all__ = [
    "Change",
    "ChildFacts",
    "ClusterView",
    "Key",
    "Obj",
    "PodFacts",
    "child_facts",
    "node_facts",
    "parse_time",
    "pod_facts",
]

Key = tuple[str, str]  # (namespace, name)
Obj = dict[str, Any]
_CLAIM = "PersistentVolumeClaim"
TEMPLATE = "ResourceClaimTemplate"  # an IMEX channel template NVIDIA's DRA driver makes for a ComputeDomain


@dataclass
class Change:
    keys: set[Key] = field(default_factory=set)
    freed: bool = False  # capacity may have grown: retry deployments waiting for room

    def __or__(self, other: Change) -> Change:
        return Change(self.keys | other.keys, self.freed or other.freed)


class ClusterView:
    """Thread-safe; every read returns immutable facts or fresh containers."""

    def __init__(self, namespaces: Iterable[str] | None = None, fault_keys: FaultKeys | None = None) -> None:
        # The namespaces whose tokenfab pods on_pod sees (None: all). tokenfab's pods elsewhere (served by
        # another operator scoped to other namespaces) are others' pods here, counted by on_foreign_pod.
        self.namespaces = frozenset(namespaces) if namespaces else None
        self.fault_keys = fault_keys or FaultKeys()  # what a GPU health system's quarantine looks like
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeFacts] = {}
        self._device_rules: dict[str, tuple[str, NodeFault]] = {}  # DeviceTaintRule -> (node, fault)
        self._domains_down: set[tuple[str, str, str]] = set()  # ComputeDomain children NotReady
        self._fault_onsets: dict[str, list[float]] = {}  # node -> when each of its recent faults began
        self.clock: Callable[[], float] = time.time
        self._pods: dict[Key, PodFacts] = {}  # tokenfab's pods
        self._by_deployment: dict[Key, set[str]] = {}  # (ns, deployment) -> pod names
        self._by_node: dict[str, set[Key]] = {}  # node -> deployments with pods there
        self._by_claim: dict[str, set[Key]] = {}  # ns/claim -> deployments with pods mounting it
        self._foreign: dict[Key, tuple[str, Mapping[str, int]]] = {}  # others' bound pods: node, requests
        self._used: dict[str, dict[str, int]] = {}
        self._children: dict[tuple[str, str, str], ChildFacts] = {}
        # the same, by (kind, namespace): what a pass reads of its own namespace, without a walk over all
        self._by_place: dict[tuple[str, str], dict[str, ChildFacts]] = {}
        self._mds: dict[Key, Obj] = {}
        self._staged: dict[Key, frozenset[str]] = {}  # deployment -> the nodes its headroom pre-stages
        self._idle: dict[Key, dict[str, float]] = {}  # deployment -> node -> since when its cache is idle
        self.synced: dict[str, bool] = {}

    # ------------------------------------------------------------------------------------ usage
    def _use(self, node: str | None, requests: Mapping[str, int], sign: int) -> None:
        if node is None:
            return
        now = add(self._used.get(node, {}), requests, sign)
        self._used[node] = {k: v for k, v in now.items() if v}

    # ------------------------------------------------------------------------------------ nodes
    def on_node(self, type_: str, obj: Obj) -> Change:
        facts = node_facts(obj, self.fault_keys)
        with self._lock:
            before = self._nodes.get(facts.name)
            if type_ == "DELETED":
                self._nodes.pop(facts.name, None)
                if before is not None and _healthy(before):
                    self._onset(facts.name)
                return Change(set(self._by_node.get(facts.name, ())), False)
            self._nodes[facts.name] = facts
            if before is not None and _healthy(before) and not _healthy(facts):
                self._onset(facts.name)
            if before is not None and same_node(before, facts):
                return Change()
            wake = set(self._by_node.get(facts.name, ()))
            if before is not None and _cache_capacity(before) != _cache_capacity(facts):
                wake |= self._cached_on(facts.name)  # (their model caches there may be evicted now)
            grew = before is None or more_room(before, facts)
            return Change(wake, grew)

    def _cached_on(self, node: str) -> set[Key]:
        """The deployments with a model cache claim on the node (under the lock; rare: a label changed)."""
        return {
            (ch.namespace, owner)
            for (kind, _, _), ch in self._children.items()
            if kind == "PersistentVolumeClaim" and ch.node == node
            for owner in _owners(ch)
        }

    def nodes(self) -> list[NodeFacts]:
        with self._lock:
            extra = self._extra_faults()
            return (
                [self._with(n, extra) for n in self._nodes.values()] if extra else list(self._nodes.values())
            )

    def node(self, name: str) -> NodeFacts | None:
        with self._lock:
            node = self._nodes.get(name)
            extra = self._extra_faults() if node is not None else {}
            return self._with(node, extra) if node is not None and extra else node

    def _onset(self, node: str) -> None:
        now = self.clock()
        recent = [t for t in self._fault_onsets.get(node, []) if now - t <= FLAP_WINDOW]
        self._fault_onsets[node] = [*recent, now]

    @staticmethod
    def _with(node: NodeFacts, extra: Mapping[str, tuple[NodeFault, ...]]) -> NodeFacts:
        more = extra.get(node.name, ())
        return replace(node, faults=node.faults + more) if more else node

    def _extra_faults(self) -> dict[str, tuple[NodeFault, ...]]:
        """Faults that are not on the Node object (under the lock): the DeviceTaintRules that taint a
        node's devices, and a ComputeDomain gone NotReady under a group that served (its IMEX channels
        are broken: every node of the group is faulted, and its NVLink domain degraded)."""
        if not self._device_rules and not self._domains_down and not self._fault_onsets:
            return {}
        out: dict[str, list[NodeFault]] = {}
        now = self.clock()
        for node, onsets in list(self._fault_onsets.items()):
            if not any(now - t <= FLAP_WINDOW for t in onsets):
                del self._fault_onsets[node]  # (forgotten)
                continue
            facts = self._nodes.get(node)
            flap = flapping(onsets, now) if facts is not None and _healthy(facts) else None
            if flap is not None:
                out.setdefault(node, []).append(flap)
        for node, fault in self._device_rules.values():
            out.setdefault(node, []).append(fault)
        for key in self._domains_down:
            ch = self._children[key]
            _, ns, name = key
            if not (ch.group or ch.unit) or not ch.deployment:
                continue
            label, value = (contract.LABEL_UNIT, ch.unit) if ch.unit else (contract.LABEL_GROUP, ch.group)
            pods = [p for p in self._pods_of((ns, ch.deployment)) if p.labels.get(label) == value]
            if not any(p.ready_since is not None or p.ready for p in pods):
                continue  # (a group still starting: its ComputeDomain is not Ready yet)
            fault = NodeFault("ComputeDomainNotReady", f"ComputeDomain {ns}/{name} is NotReady", sudden=True)
            for p in pods:
                if p.node:
                    out.setdefault(p.node, []).append(fault)
        return {n: tuple(fs) for n, fs in out.items()}

    def on_device_taint_rule(self, type_: str, obj: Obj) -> Change:
        """A DRA DeviceTaintRule: its node's deployments hear of it (and, once it goes, everyone waiting
        for room)."""
        name = obj["metadata"]["name"]
        found = None if type_ == "DELETED" else device_taint_rule_facts(obj)
        with self._lock:
            before = self._device_rules.pop(name, None)
            if found is not None:
                self._device_rules[name] = found
            if before == found:
                return Change()
            nodes = {x[0] for x in (before, found) if x is not None}
            return Change({k for n in nodes for k in self._by_node.get(n, ())}, before is not None)

    # ------------------------------------------------------------------------------------- pods
    def on_pod(self, type_: str, obj: Obj) -> Change:
        """A tokenfab pod (label selector managed-by=tokenfab)."""
        facts = pod_facts(obj)
        key = (facts.namespace, facts.name)
        with self._lock:
            before = self._pods.get(key)
            if before is not None:
                self._use(before.usage_node, before.requests, -1)
                self._unindex(before)
            owner = facts.deployment
            wake = {(facts.namespace, owner)} if owner else set()
            if type_ == "DELETED":
                self._pods.pop(key, None)
                return Change(wake, before is not None and before.usage_node is not None)
            self._pods[key] = facts
            self._use(facts.usage_node, facts.requests, +1)
            self._index(facts)
            freed = before is not None and before.usage_node is not None and facts.usage_node is None
            if before == facts:
                wake = set()  # nothing a pass reads has changed (e.g. a kubelet's status detail)
            return Change(wake, freed)

    def _index(self, p: PodFacts) -> None:
        if p.deployment is None:
            return
        dkey = (p.namespace, p.deployment)
        self._by_deployment.setdefault(dkey, set()).add(p.name)
        for index, k in self._indexed(p):
            index.setdefault(k, set()).add(dkey)

    def _unindex(self, p: PodFacts) -> None:
        if p.deployment is None:
            return
        dkey = (p.namespace, p.deployment)
        names = self._by_deployment.get(dkey)
        if names is not None:
            names.discard(p.name)
            if not names:
                del self._by_deployment[dkey]
        # A deployment stays under a node or claim until none of its pods is left there.
        still = {k for q in self._pods_of(dkey) if q.name != p.name for _, k in self._indexed(q)}
        for index, k in self._indexed(p):
            if k not in still and (held := index.get(k)) is not None:
                held.discard(dkey)
                if not held:
                    del index[k]

    def _indexed(self, p: PodFacts) -> list[tuple[dict[str, set[Key]], str]]:
        """The indices a pod is in and its key in each: the nodes it is bound or pinned to, and the model
        cache claim it mounts ("namespace/claim": no node name holds a slash)."""
        found = [(self._by_node, n) for n in (p.node, p.pinned) if n]
        return [*found, (self._by_claim, f"{p.namespace}/{p.cache_claim}")] if p.cache_claim else found

    def _pods_of(self, dkey: Key) -> list[PodFacts]:
        return [
            self._pods[(dkey[0], n)] for n in self._by_deployment.get(dkey, ()) if (dkey[0], n) in self._pods
        ]

    def on_foreign_pod(self, type_: str, obj: Obj) -> Change:
        """A bound, non-terminal pod of anyone (field selector); tokenfab's own in the namespaces this view
        serves are counted by on_pod."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        if (meta.get("labels") or {}).get(contract.MANAGED_BY) == contract.MANAGED_BY_VALUE and (
            self.namespaces is None or key[0] in self.namespaces
        ):
            return Change()
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        with self._lock:
            before = self._foreign.pop(key, None)
            if before is not None:
                self._use(before[0], before[1], -1)
            node = spec.get("nodeName")
            if type_ == "DELETED" or not node or status.get("phase") in ("Succeeded", "Failed"):
                return Change(set(), before is not None)
            requests = pod_requests(spec)
            self._foreign[key] = (node, requests)
            self._use(node, requests, +1)
            return Change(set(), before is not None and before[0] != node)

    def pods(self, key: Key) -> list[PodFacts]:
        with self._lock:
            return self._pods_of(key)

    def pod(self, namespace: str, name: str) -> PodFacts | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def all_pods(self) -> list[PodFacts]:
        with self._lock:
            return list(self._pods.values())

    def mounted_elsewhere(self, key: Key) -> frozenset[str]:
        """The model cache claims the namespace's live pods of other deployments mount: one may mount a
        claim its deployment does not own yet (it becomes an owner in the pass that makes the pods)."""
        with self._lock:
            return frozenset(
                p.cache_claim
                for p in self._pods.values()
                if p.cache_claim and p.namespace == key[0] and p.deployment != key[1] and not p.terminal
            )

    def used(self) -> dict[str, dict[str, int]]:
        """Resources held per node by observed pods (bound, or pinned and not bound yet)."""
        with self._lock:
            return {n: dict(v) for n, v in self._used.items()}

    def used_and_present(
        self, keys: Iterable[tuple[str, str]]
    ) -> tuple[dict[str, dict[str, int]], set[tuple[str, str]]]:
        """`used()` and which of the pods `keys` the view holds, read at one moment: a pod that arrives
        between two separate reads would be in neither (not yet in the usage, already not reserved)."""
        with self._lock:
            return self.used(), {k for k in keys if k in self._pods}

    # --------------------------------------------------------------------------------- children
    def on_child(self, kind: str, type_: str, obj: Obj) -> Change:
        facts = child_facts(kind, obj)
        key = (kind, facts.namespace, facts.name)
        with self._lock:
            place = self._by_place.setdefault((kind, facts.namespace), {})
            if type_ == "DELETED":
                before = self._children.pop(key, None)
                place.pop(facts.name, None)
                self._domains_down.discard(key)
            else:
                before = self._children.get(key)
                self._children[key] = facts
                place[facts.name] = facts
                if facts.state == "NotReady":
                    self._domains_down.add(key)
                else:
                    self._domains_down.discard(key)
                if before == facts:
                    return Change()  # nothing a pass reads has changed (e.g. a PDB's status)
            freed = before is not None and before.state == "NotReady" and facts.state != "NotReady"
            claim = f"{facts.namespace}/{facts.name}" if kind == _CLAIM else ""
            users = set(self._by_claim.get(claim, ()))  # (a claim's users: its pods' deployments; a copy)
        owners = {*_owners(facts), *(_owners(before) if before is not None else ())}
        return Change({(facts.namespace, o) for o in owners} | users, freed)

    def on_channel_template(self, type_: str, obj: Obj) -> Change:
        """An IMEX channel ResourceClaimTemplate NVIDIA's DRA driver made (or deleted) for a ComputeDomain:
        it bears the domain's name, so the deployment that owns that domain is woken (its new groups
        parked for the channel go on)."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or ""
        with self._lock:
            existed = (TEMPLATE, ns, meta["name"]) in self._children
            change = self.on_child(TEMPLATE, type_, obj)
            domain = self._children.get(("ComputeDomain", ns, meta["name"]))
        if existed != (type_ == "DELETED") or domain is None or not domain.deployment:
            return change  # (only whether it exists is read)
        return change | Change({(domain.namespace, domain.deployment)})

    def channel_template(self, namespace: str, name: str) -> bool | None:
        """Whether the channel template of ComputeDomain `name` exists; None while templates are not
        watched (the caller reads the API server)."""
        with self._lock:
            if not self.synced.get(TEMPLATE, False):
                return None
            return (TEMPLATE, namespace, name) in self._children

    def child(self, kind: str, namespace: str, name: str) -> ChildFacts | None:
        with self._lock:
            return self._children.get((kind, namespace, name))

    def all_children(self, kind: str) -> list[ChildFacts]:
        """Every deployment's children of one kind."""
        with self._lock:
            return [ch for (k, _, _), ch in self._children.items() if k == kind]

    def children(self, kind: str, key: Key) -> list[ChildFacts]:
        """A deployment's children of one kind (labelled with it, or, for a model cache claim shared by
        several, owned by it)."""
        with self._lock:
            return [
                ch
                for ch in self._by_place.get((kind, key[0]), {}).values()
                if ch.deployment == key[1] or key[1] in ch.owners
            ]

    def model_caches(self, namespace: str) -> list[ChildFacts]:
        """The namespace's model cache claims (any deployment's: they are shared by source)."""
        with self._lock:
            return [
                ch for ch in self._by_place.get(("PersistentVolumeClaim", namespace), {}).values() if ch.node
            ]

    # ------------------------------------------------------------------------ ModelDeployments
    def on_model_deployment(self, type_: str, body: Obj) -> Change:
        meta = body["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        with self._lock:
            if type_ == "DELETED":
                self._mds.pop(key, None)
                self._staged.pop(key, None)
                self._idle.pop(key, None)
                return Change({key})
            before = self._mds.get(key)
            self._mds[key] = body
            cache = (body.get("status") or {}).get("weightsCache") or {}
            staged, idle = cache.get("prestaged") or (), node_times(cache.get("idleSince"))
            self._staged.pop(key, None)
            self._idle.pop(key, None)
            if staged:
                self._staged[key] = frozenset(staged)
            if idle:
                self._idle[key] = idle
        if before is not None and status_only(before, body):
            return Change()  # the operator's own status write coming back (a pass decides from it anyway)
        return Change({key})

    def model_deployment(self, key: Key) -> Obj | None:
        with self._lock:
            return self._mds.get(key)

    def staged_elsewhere(self, key: Key) -> frozenset[str]:
        """The nodes the other deployments pre-stage (their status.weightsCache.prestaged)."""
        with self._lock:
            return frozenset().union(*(nodes for k, nodes in self._staged.items() if k != key))

    def idle_since(self, key: Key) -> dict[str, float]:
        """Since when each of a deployment's model caches is idle (its status.weightsCache.idleSince)."""
        with self._lock:
            return dict(self._idle.get(key) or {})

    def deployments(self) -> set[Key]:
        with self._lock:
            return set(self._mds)

    # ------------------------------------------------------------------------------------ relist
    def replace(self, kind: str, objs: Iterable[Obj], namespace: str | None = None) -> Change:
        """A fresh list of one watched kind (in one namespace, or all): objects it no longer holds were
        deleted while unwatched."""
        objs = list(objs)
        change = Change()
        names = {((o["metadata"].get("namespace") or ""), o["metadata"]["name"]) for o in objs}
        with self._lock:
            if namespace is not None:  # a stream of one namespace speaks for that namespace only
                # (read under the lock: another namespace's watch may add a pod meanwhile)
                names |= {k for k in self._keys_of(kind) if k[0] != namespace}
            if kind == "Node":
                gone = [{"metadata": {"name": n}} for n in self._nodes if ("", n) not in names]
                handler: Any = self.on_node
            elif kind == "Pod":
                gone = [{"metadata": {"namespace": k[0], "name": k[1]}} for k in self._pods if k not in names]
                handler = self.on_pod
            elif kind == "DeviceTaintRule":
                gone = [{"metadata": {"name": n}} for n in self._device_rules if ("", n) not in names]
                handler = self.on_device_taint_rule
            elif kind == "ForeignPod":
                gone = [
                    {"metadata": {"namespace": k[0], "name": k[1]}} for k in self._foreign if k not in names
                ]
                handler = self.on_foreign_pod
            elif kind == TEMPLATE:
                gone = [
                    {"metadata": {"namespace": ns, "name": n}}
                    for (k, ns, n) in self._children
                    if k == kind and (ns, n) not in names
                ]
                handler = self.on_channel_template
            else:
                gone = [
                    {"metadata": {"namespace": ns, "name": n}}
                    for (k, ns, n) in self._children
                    if k == kind and (ns, n) not in names
                ]

                def handler(t: str, o: Obj) -> Change:
                    return self.on_child(kind, t, o)

            for obj in gone:
                change = change | self._deleted(kind, handler, obj)
            for obj in objs:
                change = change | handler("MODIFIED", obj)
            self.synced[kind] = True
        return change

    def _deleted(self, kind: str, handler: Any, stub: Obj) -> Change:
        key = (stub["metadata"].get("namespace") or "", stub["metadata"]["name"])
        if kind == "Pod" and key in self._pods:
            p = self._pods[key]
            return self.on_pod("DELETED", _pod_stub(p))
        if kind == "Node":
            node = self._nodes.get(key[1])
            if node is not None:
                return self.on_node("DELETED", {"metadata": {"name": node.name}})
        ch = self._children.get((kind, *key))
        if ch is not None and ch.deployment:  # its owner must hear of it (and apply it again)
            stub = {"metadata": {**stub["metadata"], "labels": {contract.LABEL_DEPLOYMENT: ch.deployment}}}
        result: Change = handler("DELETED", stub)
        return result

    def _keys_of(self, kind: str) -> set[Key]:
        with self._lock:
            if kind == "Node":
                return {("", n) for n in self._nodes}
            if kind == "Pod":
                return set(self._pods)
            if kind == "DeviceTaintRule":
                return {("", n) for n in self._device_rules}
            if kind == "ForeignPod":
                return set(self._foreign)
            return {(ns, n) for (k, ns, n) in self._children if k == kind}

    def node_holders(self, node: str) -> set[Key]:
        with self._lock:
            return set(self._by_node.get(node, ()))


def _owners(ch: ChildFacts) -> set[str]:
    """The deployments a child's change concerns: its own, or every owner of a shared model cache claim."""
    return {*ch.owners, *((ch.deployment,) if ch.deployment else ())}


def _healthy(node: NodeFacts) -> bool:
    """Ready, with no fault but a maintenance cordon (or the flapping it would add itself)."""
    return node.ready and all(f.kind in ("Cordoned", "Flapping") for f in node.faults)


def _pod_stub(p: PodFacts) -> Obj:
    return {"metadata": {"namespace": p.namespace, "name": p.name, "labels": dict(p.labels)}}


def _cache_capacity(node: NodeFacts) -> str | None:
    return node.labels.get(contract.LABEL_CACHE_CAPACITY)
