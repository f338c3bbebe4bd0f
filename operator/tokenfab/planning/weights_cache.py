"""A deployment's per-node model caches, pure: which nodes would start a new group warm.

With `model.cache.storageClassName`, hf:// weights are kept on each node the deployment ran on, in a
node-local PersistentVolumeClaim that outlives its pods (tokenfab.planning.builders.volumes). The claim is
named by node, source, storage class and size, not by deployment: every deployment of the namespace that
loads the same source there mounts the same claim, so the weights are staged once per node, and a claim
another deployment filled starts this one warm too. Once a worker of the current revision served from a
node's cache, the claim is marked as holding those weights (`contract.ANN_HOLDS_PREFIX`: source@revision):
they load from local NVMe there, with no download. A node's warmth (tokenfab.planning.topology.Warmth)
is then:
- 0 warm: its claim is marked as holding the weights the spec asks for;
- 1 fetching: it has a claim, not (yet) marked with them: a download began there, or it holds another
  revision (the hub's client fetches only the files that changed);
- 2 cold: no claim: the weights come from their source.
New groups go to the warmest nodes they fit whole on (topology.choose_domain / best_fit_nodes); the
ledger and the whole-group rule come first.

Pre-staging (model.cache.prestageGroups): the nodes each role's next groups would take are kept warm
ahead of need (`prestage_nodes`); each such node whose claim does not hold the weights gets a
weights-fetch pod (`fetches_wanted`; tokenfab.planning.builders.fetch), and once that pod completed the
claim is marked like one a worker served from (`claim_marks`). The fetch pod then goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tokenfab.api.models import (
    FetchProgress,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RoleName,
    StagedWeights,
    WeightsCacheStatus,
)
from tokenfab.planning import builders, launcher_log, units
from tokenfab.planning.capacity import parse_quantity
from tokenfab.planning.eviction import CacheEntry, NodeCaches, evictions, idle_times
from tokenfab.planning.launcher_log import Progress
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.status import parse_rfc3339 as parse
from tokenfab.planning.status import rfc3339
from tokenfab.planning.topology import COLD, ELSEWHERE, Domain, GroupShape, best_fit_nodes, choose_domain

weights_key = builders.weights_key


def warmth(claims: Mapping[str, str], key: str, elsewhere: Iterable[str] = ()) -> dict[str, int]:
    """Node -> warmth, from the deployment's model cache claims (node -> the weights they are marked
    with, "" when none yet); `elsewhere`: nodes other deployments pre-stage (ELSEWHERE where this one has
    no claim)."""
    return {
        **dict.fromkeys(elsewhere, ELSEWHERE),
        **{n: 0 if held == key else 1 for n, held in claims.items()},
    }


def marks(claims: Mapping[str, str], served: Iterable[str], key: str) -> dict[str, str]:
    """What each claim is to be marked with: `key` where a worker of the current revision served (its
    cache holds those weights now), else what it was marked with."""
    return {**claims, **dict.fromkeys(served, key)}


def node_warmth(
    spec: ModelDeploymentSpec, claims: Mapping[str, str], elsewhere: Iterable[str] = ()
) -> dict[str, int]:
    """The nodes' model cache warmth for this spec's weights; `elsewhere`: the nodes other deployments
    pre-stage, left last by this one too when it has no per-node caches of its own."""
    if not builders.uses_model_cache_claims(spec):
        return dict.fromkeys(elsewhere, ELSEWHERE)
    return warmth(claims, weights_key(spec), elsewhere)


def served_nodes(spec: ModelDeploymentSpec, groups: Mapping[RoleName, list[GroupView]]) -> frozenset[str]:
    """The nodes where a worker of its role's current revision (so of the spec's weights) is Ready: their
    model caches hold those weights."""
    return frozenset(
        p.node
        for role, gs in groups.items()
        if spec.role(role) is not None
        for g in gs
        if g.revision == builders.role_revision(spec, role)
        for p in g.pods
        if p.ready and p.node is not None
    )


def claim_marks(
    spec: ModelDeploymentSpec,
    claims: Mapping[str, str],
    groups: Mapping[RoleName, list[GroupView]],
    fetched: Iterable[str] = (),
) -> dict[str, str]:
    """What each of the deployment's model cache claims is to be marked with (see `marks`): the nodes
    where a worker of the current revision served, and those where a weights-fetch pod of the spec's
    weights completed (`fetched`), hold them."""
    return marks(claims, served_nodes(spec, groups) | set(fetched), weights_key(spec))


def prestage_nodes(
    spec: ModelDeploymentSpec,
    domains_of: Callable[[RoleName], Mapping[str, Domain]],
    warmth: Mapping[str, int],
    headroom: Mapping[RoleName, int] | None = None,
) -> frozenset[str]:
    """The headroom to keep warm (model.cache.prestageGroups): the nodes each role's next groups would be
    placed on, past the groups this pass plans (`domains_of`: a role's free domains with them taken off;
    `headroom`: how many next groups per role, as the autoscaler says), chosen as placement chooses
    (warmest first, then the policy; whole groups only), so a scale-up lands where the weights are. With
    prefill-decode units, the next decode groups come with their unit's prefill groups, in one domain
    where the whole unit fits, as placement puts a new unit (planning.units.Units.choose); what does not
    fit so is staged role by role. None without per-node caches."""
    if not spec.model.cache.prestage_groups or not builders.uses_model_cache_claims(spec):
        return frozenset()
    views = {role: dict(domains_of(role)) for role, _ in spec.roles()}
    shapes = {role: builders.group_shape(spec, role) for role in views}
    want = dict(headroom or {})
    out: set[str] = set()
    r = units.rule(spec)
    if r is not None and all(role in views for role in units.UNIT_ROLES):
        while want.get("decode", 0) > 0:
            members: list[RoleName] = ["decode"] * min(r.decode, want["decode"])
            members += ["prefill"] * max(0, min(r.prefill, want.get("prefill", 0)))
            whole = {
                name: d
                for name, d in views["decode"].items()
                if _unit_nodes(views, shapes, name, members, warmth) is not None
            }
            name = choose_domain(whole, shapes["decode"], spec.topology.placement, warmth=warmth or None)
            if name is None:
                break
            for role, nodes in _unit_nodes(views, shapes, name, members, warmth) or []:
                out.update(nodes)
                _take_all(views, name, nodes, shapes[role].pod_gpus)
                want[role] = want.get(role, 0) - 1
    for role in views:
        shape, domains = shapes[role], views[role]
        for _ in range(max(0, want.get(role, 0))):
            name = choose_domain(domains, shape, spec.topology.placement, warmth=warmth or None)
            chosen = (
                None
                if name is None
                else best_fit_nodes(domains[name].free, shape.nodes, shape.pod_gpus, warmth)
            )
            if name is None or chosen is None:
                break
            out.update(chosen)
            _take_all(views, name, chosen, shape.pod_gpus)
    return frozenset(out)


def _unit_nodes(
    views: Mapping[RoleName, Mapping[str, Domain]],
    shapes: Mapping[RoleName, GroupShape],
    name: str,
    members: list[RoleName],
    warmth: Mapping[str, int],
) -> list[tuple[RoleName, list[str]]] | None:
    """Each member group's nodes in domain `name`, taken one after another (each role seeing the domain
    as its own constraints do, less what the others took); None when the unit fits there not whole."""
    trial = {role: dict(v) for role, v in views.items()}
    got: list[tuple[RoleName, list[str]]] = []
    for role in members:
        domain = trial[role].get(name)
        shape = shapes[role]
        nodes = best_fit_nodes(domain.free, shape.nodes, shape.pod_gpus, warmth) if domain else None
        if nodes is None:
            return None
        got.append((role, nodes))
        _take_all(trial, name, nodes, shape.pod_gpus)
    return got


def _take_all(views: dict[RoleName, dict[str, Domain]], name: str, nodes: list[str], pod_gpus: int) -> None:
    """One pod of `pod_gpus` off each of `nodes` in every role's view of domain `name` (a node another
    role cannot use is not in its view; one with less room than that left has none left)."""
    for view in views.values():
        d = view.get(name)
        if d is None:
            continue
        free = {n: (max(0, g - pod_gpus) if n in nodes else g) for n, g in d.free.items()}
        view[name] = Domain(d.name, d.total_gpus, free, d.nodes, d.ready_nodes, d.degraded)


@dataclass(frozen=True)
class FetchPod:
    """A weights-fetch pod of the deployment, as observed."""

    name: str
    node: str
    phase: str
    weights: str  # what it stages (source@revision)
    waiting: str = ""  # why it is not running (a container's waiting reason, e.g. CrashLoopBackOff)
    deleting: bool = False  # being deleted: its name is not free yet
    result: str = ""  # how its container ended (exit code, reason, the launcher's termination message)
    progress: Progress | None = None  # its download so far (its log's last progress line), while it runs


@dataclass(frozen=True)
class Staging:
    """This pass's pre-staging: the nodes to keep warm, every claim's mark, the nodes whose fetch pod is
    to be made, and the fetch pods to delete (their weights are staged, no longer wanted, or stale); and
    the model caches: since when each idle one is idle, and the nodes whose claim is evicted
    (tokenfab.planning.eviction)."""

    nodes: frozenset[str]
    marks: dict[str, str]
    create: tuple[str, ...]
    delete: tuple[str, ...]
    idle: dict[str, float] = field(default_factory=dict)
    evict: tuple[str, ...] = ()


def staging(
    spec: ModelDeploymentSpec,
    owner: builders.Owner,
    observed: tuple[Mapping[str, str], Mapping[RoleName, list[GroupView]], Iterable[FetchPod]],
    domains_of: Callable[[RoleName], Mapping[str, Domain]],
    headroom: Mapping[RoleName, int] | None = None,
    occupied: Iterable[str] = (),
    caches: tuple[NodeCaches, Mapping[str, float], float] = (NodeCaches(), {}, 0.0),
) -> Staging:
    """Pre-staging for one pass (see the module's docstring); `observed`: the claims' marks, the groups and
    the fetch pods; `occupied`: the nodes the deployment's pods are on or this pass places groups on;
    `caches`: what other deployments keep on the nodes (the nodes they pre-stage are avoided by this
    one's headroom while it can), since when this one's idle caches are idle, and now.

    A fetch pod is current when it stages the spec's weights into the claim its name is made for (a new
    storage class or size is a new claim, so a new pod). A completed current pod marks its claim, and is
    deleted once that mark is seen (so its node is never wanted again meanwhile). A pod that failed or is
    not current is deleted, and so is one still running on a node neither in the headroom nor occupied
    (a group landing there keeps it: its download goes on). A node whose fetch pod is still being
    deleted gets no new one until it is gone."""
    claims, groups, pods = observed[0], observed[1], list(observed[2])
    key = weights_key(spec)

    def current(f: FetchPod) -> bool:
        return f.weights == key and f.name == builders.weights_fetch_pod_name(owner, spec, f.node)

    live = [f for f in pods if not f.deleting]
    fetched = [f.node for f in live if f.phase == "Succeeded" and current(f)]
    marked = claim_marks(spec, claims, groups, fetched)
    others, before, now = caches
    # (the nodes another deployment pre-stages come last for this one's headroom even where it could use
    # the claim there, shared by source: two headrooms on one node would be one, and fetched twice)
    staged_warmth = {
        **node_warmth(spec, claims, others.staged_elsewhere),
        **dict.fromkeys(others.staged_elsewhere, ELSEWHERE),
    }
    nodes = prestage_nodes(spec, domains_of, staged_warmth, headroom)
    wanted = fetches_wanted(spec, nodes, marked)
    keep = wanted | set(occupied)
    gone = [
        f.name
        for f in live
        if not current(f)
        or f.phase == "Failed"
        or (f.phase == "Succeeded" and claims.get(f.node) == key)
        or (f.phase != "Succeeded" and f.node not in keep)
    ]
    downloading = {f.node for f in live if f.phase not in ("Succeeded", "Failed") and f.name not in gone}
    idle = idle_times(claims, keep | nodes | downloading, before, now)
    evict = evicted(spec, owner, claims, idle, others)
    marked = {n: held for n, held in marked.items() if n not in evict}
    create = tuple(sorted(wanted - {f.node for f in pods}))
    return Staging(nodes, marked, create, tuple(sorted(gone)), idle, evict)


def evicted(
    spec: ModelDeploymentSpec,
    owner: builders.Owner,
    claims: Iterable[str],
    idle: Mapping[str, float],
    others: NodeCaches,
) -> tuple[str, ...]:
    """The nodes whose model cache claim of this deployment goes to make room (tokenfab.planning.eviction)."""
    if not others.capacity or not builders.uses_model_cache_claims(spec):
        return ()
    size = int(parse_quantity(spec.model.cache.size))
    ident = {f"{owner.namespace}/{builders.model_cache_claim_name(owner, spec, n)}": n for n in claims}
    mine = [CacheEntry(claim, n, size, idle.get(n)) for claim, n in ident.items()]
    gone = evictions([*mine, *others.others], others.capacity)
    return tuple(sorted(ident[claim] for claim in gone if claim in ident))


def staged_result(f: FetchPod) -> StagedWeights | None:
    """What a completed fetch pod reported: the launcher's termination message, a JSON object (source,
    bytes, files, seconds) after the exit code and reason; None when it said nothing readable."""
    _, brace, rest = f.result.partition("{")
    try:
        said = launcher_log.outcome(json.loads(brace + rest)) if brace else None
    except ValueError:
        return None
    if said is None:
        return None
    return StagedWeights(
        node=f.node, source=said.source, bytes=said.bytes, files=said.files, seconds=said.seconds
    )


def report(
    spec: ModelDeploymentSpec,
    staged: Staging,
    fetch_pods: Iterable[FetchPod],
    status: ModelDeploymentStatus | None = None,
    loading: Iterable[tuple[str, Progress]] = (),
) -> WeightsCacheStatus | None:
    """status.weightsCache: which nodes hold the weights, which are pre-staged, which are downloading (a
    fetch pod, or a worker's launcher: `loading`, node and bytes so far), what each completed fetch pod
    reported (kept from the last `status` while its node holds these weights), and since when the idle
    caches are idle."""
    if not builders.uses_model_cache_claims(spec):
        return None
    previous = status.weights_cache if status else None
    key = weights_key(spec)
    pods = list(fetch_pods)
    running = [f for f in pods if f.phase not in ("Succeeded", "Failed") and not f.deleting]
    warm = sorted(n for n, held in staged.marks.items() if held == key)
    results = {} if previous is None or previous.weights != key else {r.node: r for r in previous.staged}
    for f in pods:
        if f.phase == "Succeeded" and f.weights == key and (r := staged_result(f)) is not None:
            results[f.node] = r
    kept = [results[n] for n in warm if n in results]
    loads = [(f.node, f.progress) for f in running if f.weights == key and f.progress is not None]
    loads += [(node, x) for node, x in loading if node]
    fetching = sorted({f.node for f in running if f.weights == key} | {node for node, _ in loads})
    per_node = dict(sorted(loads, key=_bytes))  # (one cache per node: its largest report)
    downloads = [FetchProgress(node=n, bytes=x.bytes, seconds=x.seconds) for n, x in sorted(per_node.items())]
    gb, so_far = sum(r.bytes for r in kept) / 1e9, sum(d.bytes for d in downloads) / 1e9
    return WeightsCacheStatus(
        weights=key,
        warm_nodes=warm,
        prestaged=sorted(staged.nodes),
        fetching=fetching,
        downloads=downloads,
        waiting="; ".join(f"{f.name}: {f.waiting}" for f in running if f.waiting)[:1000],
        staged=kept,
        summary=f"{len(warm)} warm, {len(fetching)} fetching"
        + (f" ({so_far:.1f} GB so far)" if downloads else "")
        + (f", {gb:.1f} GB staged" if kept else ""),
        idle_since={n: rfc3339(t) for n, t in staged.idle.items() if n not in staged.evict},
    )


def _bytes(load: tuple[str, Progress]) -> int:
    return load[1].bytes


def idle_before(status: ModelDeploymentStatus | None) -> dict[str, float]:
    """Since when each idle model cache was idle, as the last status said."""
    cache = status.weights_cache if status else None
    return {n: t for n, ts in (cache.idle_since if cache else {}).items() if (t := parse(ts)) is not None}


def events(staged: Staging) -> list[tuple[str, str, str]]:
    """An Event per pass that evicts model caches (type, reason, message)."""
    if not staged.evict:
        return []
    nodes = ", ".join(staged.evict[:5]) + (
        f" and {len(staged.evict) - 5} more" if len(staged.evict) > 5 else ""
    )
    return [
        (
            "Normal",
            "ModelCacheEvicted",
            f"model cache claim deleted on {nodes}: the least recently used "
            "there, to keep the node's caches within its tokenfab.dev/model-cache-capacity",
        )
    ]


def fetches_wanted(
    spec: ModelDeploymentSpec, prestage: Iterable[str], marked: Mapping[str, str]
) -> frozenset[str]:
    """The pre-staged nodes whose model cache does not hold the spec's weights yet (`marked`: node -> the
    weights its claim is marked with, this pass's marks included): each gets a weights-fetch pod."""
    key = weights_key(spec)
    return frozenset(n for n in prestage if marked.get(n) != key)


__all__ = [
    "COLD",
    "FetchPod",
    "Staging",
    "claim_marks",
    "fetches_wanted",
    "marks",
    "node_warmth",
    "prestage_nodes",
    "report",
    "served_nodes",
    "staged_result",
    "staging",
    "warmth",
    "weights_key",
]
