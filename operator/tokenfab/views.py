"""The cluster view's facts as planning sees them (converters the observe phase uses): a deployment's
groups and the health of their nodes, the model caches on the nodes and the claims it would mount."""

from __future__ import annotations

from collections.abc import Iterable

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.fleet.facts import ChildFacts
from tokenfab.fleet.view import ClusterView, Key, PodFacts
from tokenfab.planning import builders, contract
from tokenfab.planning.capacity import Constraints, parse_quantity, untolerated
from tokenfab.planning.eviction import CacheEntry, NodeCaches
from tokenfab.planning.lifecycle import GroupView, NodeHealth, PodView


def pod_view(p: PodFacts) -> PodView:
    return PodView(
        name=p.name,
        rank=int(p.labels.get(contract.LABEL_RANK, "0")),
        phase=p.phase,
        ready=p.ready,
        node=p.node,
        deleting=p.deleting,
        ready_since=p.ready_since,
        waiting=p.waiting,
        gated=p.gated,
        claims_pending=p.claims_pending,
        pinned=p.pinned,
        exit_message=p.exit_message,
        unhealthy_since=p.unhealthy_since,
        containers_ready=p.containers_ready,
        routable=p.routable,
        marked_draining=contract.ANN_DRAINING in p.annotations,
    )


def group_views(pods: list[PodFacts], recorded: set[str]) -> dict[RoleName, list[GroupView]]:
    by_group: dict[str, list[PodFacts]] = {}
    for p in pods:
        if p.labels.get(contract.COMPONENT) == "worker" and contract.LABEL_GROUP in p.labels:
            by_group.setdefault(p.labels[contract.LABEL_GROUP], []).append(p)
    out: dict[RoleName, list[GroupView]] = {}
    for name, members in sorted(by_group.items()):
        first = members[0]
        labels, ann = first.labels, first.annotations
        role: RoleName = labels[contract.LABEL_ROLE]  # type: ignore[assignment]
        nodes: tuple[str, ...] = ()
        for m in members:
            if contract.ANN_GROUP_NODES in m.annotations:
                nodes = tuple(m.annotations[contract.ANN_GROUP_NODES].split(","))
                break
        released: float | None = None
        if not any(m.gated for m in members):
            times = [float(m.annotations.get(contract.ANN_RELEASED) or (m.created or 0.0)) for m in members]
            released = max(times) if times else None
        draining = [
            float(m.annotations[contract.ANN_DRAINING])
            for m in members
            if contract.ANN_DRAINING in m.annotations
        ]
        out.setdefault(role, []).append(
            GroupView(
                name=name,
                role=role,
                slot=int(labels.get(contract.LABEL_SLOT, "0")),
                revision=labels.get(contract.LABEL_REVISION, ""),
                domain=labels.get(contract.LABEL_DOMAIN, ""),
                size=int(ann.get(contract.ANN_GROUP_SIZE, len(members))),
                gpus=int(ann.get(contract.ANN_GROUP_GPUS, 0)),
                pods=tuple(pod_view(p) for p in members),
                recorded=name in recorded,
                nodes=nodes,
                released_at=released,
                draining_since=min(draining) if draining else None,
                created_at=min((m.created for m in members if m.created is not None), default=None),
                start_path=ann.get(contract.ANN_START_PATH, ""),
                unit=int(labels[contract.LABEL_UNIT])
                if labels.get(contract.LABEL_UNIT, "").isdigit()
                else None,
                rdma=labels.get(contract.LABEL_KV_NETWORK) == contract.KV_NETWORK_RDMA,
                drain_inflight=next(
                    (
                        m.annotations[contract.ANN_DRAIN_INFLIGHT]
                        for m in members
                        if contract.ANN_DRAIN_INFLIGHT in m.annotations
                    ),
                    "",
                ),
            )
        )
    return out


def node_health(view: ClusterView, pods: list[PodFacts], constraints: Constraints) -> dict[str, NodeHealth]:
    """Health of the nodes this deployment's pods are bound or pinned to (a node missing here is gone)."""
    out = {}
    for name in {n for p in pods for n in (p.node, p.pinned) if n}:
        node = view.node(name)
        if node is None:
            continue
        schedulable = not node.unschedulable and not untolerated(node, constraints.tolerations)
        out[name] = NodeHealth(node.ready, node.not_ready_since, schedulable, node.faults)
    return out


def node_caches(view: ClusterView, key: Key, nodes: Iterable[str]) -> NodeCaches:
    """What the other deployments keep on the nodes: the nodes they pre-stage and, on those of `nodes`
    (this deployment's model cache claims) labelled with a model cache capacity, their claims there."""
    capacity: dict[str, int] = {}
    for name in nodes:
        node = view.node(name)
        raw = node.labels.get(contract.LABEL_CACHE_CAPACITY) if node else None
        try:
            capacity.update({name: int(parse_quantity(raw))} if raw else {})
        except ValueError:
            continue  # (a label that is no quantity gives no capacity: nothing is evicted there)
    staged = view.staged_elsewhere(key)
    if not capacity:
        return NodeCaches(staged)
    others = tuple(
        CacheEntry(f"{p.namespace}/{p.name}", p.node, p.size, view.idle_since(owner).get(p.node))
        for p in view.all_children("PersistentVolumeClaim")
        if p.node in capacity
        for owner in {(p.namespace, o) for o in (*p.owners, *((p.deployment,) if p.deployment else ()))}
        if owner != key
    )
    # (a claim another deployment's pods mount, or are about to, before it owns the claim: pinned)
    mounted = tuple(
        CacheEntry(f"{p.namespace}/{p.cache_claim}", where, 0, None)
        for p in view.all_pods()
        if p.cache_claim and (p.namespace, p.deployment) != key
        for where in (p.usage_node,)
        if where is not None and where in capacity
    )
    return NodeCaches(staged, others + mounted, capacity)


def usable_claims(view: ClusterView, owner: builders.Owner, spec: ModelDeploymentSpec) -> list[ChildFacts]:
    """The model cache claims of the namespace the deployment's pods would mount (those of its source,
    storage class and size), whichever deployment made them."""
    if not builders.uses_model_cache_claims(spec):
        return []
    return [
        pvc
        for pvc in view.model_caches(owner.namespace)
        if pvc.name == builders.model_cache_claim_name(owner, spec, pvc.node)
    ]


def held(pvc: ChildFacts, key: str) -> str:
    """What a model cache claim holds, as a pass reads it: the spec's weights when it holds them, else
    another revision it holds ("" none)."""
    return key if key in pvc.holds else (pvc.holds[0] if pvc.holds else "")
