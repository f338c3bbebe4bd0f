"""The observe phase of a pass: everything it decides from, read once into one immutable snapshot
(tokenfab.planning.one_pass.Snapshot). Nothing here writes to the cluster.

What is read: the deployment as the cluster view has it, with the freshest status (this process's last
write if the watch has not shown it yet); spec.profile's plan (made off the reconcile path by the planner);
the deployment's pods, groups, children and nodes from the view (converted by tokenfab.views); what the
cluster serves (the ComputeDomain and PodGroup kinds); the autoscaler's due queries and the engines'
in-flight counts from Prometheus; the launcher's lines from pod logs; a pvc:// source's claim. The free
capacity is read later, inside the placement ledger's session (the snapshot's `room`), and a new group's
IMEX channel template only when the plan asks for it (`Domains.channel_ready`).

A pass may end here: the deployment is gone (None), its last writes are not in the view yet (`Ended`), or
no groups are to be planned (`Stopped`: a spec the models refuse, spec.profile not planned yet; the plan
phase makes their status). Observe builds no condition and no status: the plan does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tokenfab import pod_logs
from tokenfab.adapters import metrics
from tokenfab.adapters.kube import ApiError, Obj
from tokenfab.api.errors import SpecError, parse_model_deployment
from tokenfab.api.models import (
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RoleName,
)
from tokenfab.fleet.view import Key, PodFacts, parse_time
from tokenfab.planning import (
    autoscaler,
    builders,
    contract,
    launcher_log,
    model_source,
    pod_security,
    weights_cache,
    writes,
)
from tokenfab.planning.capacity import NodeFacts
from tokenfab.planning.fabric import renders_rdma
from tokenfab.planning.frontend import FrontendPod
from tokenfab.planning.groups import DrainPolicy
from tokenfab.planning.lifecycle import GroupView
from tokenfab.planning.model_source import SourceClaim
from tokenfab.planning.one_pass import SOURCE_LOOK_SECONDS, Snapshot, removing
from tokenfab.planning.profile import plan_profile
from tokenfab.planning.role_plan import FaultReaction
from tokenfab.planning.room import Room
from tokenfab.runtime import Context, Ended, Observed, Result, Stopped
from tokenfab.views import group_views, held, node_caches, node_health, usable_claims

SOURCE_READ_SECONDS = SOURCE_LOOK_SECONDS  # a pvc:// source's claim is read again this often
POD_SECURITY_READ_SECONDS = 15.0  # a namespace's Pod Security level, while the workers add capabilities
CHILD_KINDS = (
    "ConfigMap",
    "PodDisruptionBudget",
    "PersistentVolumeClaim",
    *(k for _, k in writes.DISCOVERY_KINDS),
)


# ------------------------------------------------------------------------------------------- the spec


def take(keys: set[Key], key: Key) -> bool:
    """Whether `key` was in `keys`, removed in one step (another thread may add it at any time)."""
    try:
        keys.remove(key)
    except KeyError:
        return False
    return True


def last_status(ctx: Context, key: Key, body: Obj, md: ModelDeployment) -> ModelDeploymentStatus | None:
    """The status this pass builds on: the watched object's, or the one this process wrote moments ago
    if the watch has not shown it yet."""
    mem = ctx.mem(key)
    if mem.status is not None:
        written, rv, when = mem.status
        if body["metadata"].get("resourceVersion") != rv and time.time() - when < ctx.settings.applied_grace:
            try:
                return ModelDeploymentStatus.model_validate(written)
            except ValueError:
                return md.status
    return md.status


def _parsed(ctx: Context, key: Key) -> tuple[Obj, ModelDeployment] | Ended | Stopped | None:
    """The deployment as the view has it, with its freshest status; None when it is gone (or going),
    Stopped when the models refuse its spec."""
    body = ctx.view.model_deployment(key)
    if body is None or body["metadata"].get("deletionTimestamp"):
        # (its reservations stay until its pods appear or they expire: see Controller.on_model_deployment)
        ctx.expectations.forget(key)
        ctx.memory.pop(key, None)
        ctx.urgent.discard(key)
        if body is not None and (patch := writes.legacy_patch(body["metadata"])) is not None:
            return Ended(body, Result(), legacy=patch, gone=True)
        return None
    ctx.mem(key)  # (this deployment's memory exists from its first pass on)
    try:
        md = parse_model_deployment(body)
    except SpecError as exc:
        try:  # a status written by another operator version must not stop the spec from being served
            md = parse_model_deployment({**body, "status": None})
        except SpecError:
            return Stopped(body, errors=tuple(exc.errors), legacy=writes.legacy_patch(body["metadata"]))
    # Decide from the freshest status: this process's last write if the watch has not shown it yet
    # (the autoscaler's windows, the failure counts, the plan and the placement record live there).
    return body, md.model_copy(update={"status": last_status(ctx, key, body, md)})


# ------------------------------------------------------------------------------------------- Prometheus


def _default_reader(url: str, query: str) -> metrics.Reading:
    return metrics.read(url, query)


def drain_policy(
    spec: ModelDeploymentSpec,
    groups: Mapping[RoleName, list[GroupView]],
    desired: Mapping[RoleName, int],
    read: Callable[[str, str], metrics.Reading],
    namespace: str,
    name: str,
) -> DrainPolicy:
    """How this pass's groups leave. With a Prometheus (spec.autoscaling.prometheusUrl) and drainSeconds,
    drains are observed: the engines' in-flight requests are read when a group drains or may start to
    (more groups than wanted, or a rollout); a failed read leaves every group's count unknown (a drain
    then waits for its deadline). Without one, or with serving.drainMode sigterm, groups go at once and
    drain on SIGTERM."""
    seconds = float(spec.serving.drain_seconds)
    url = spec.autoscaling.prometheus_url
    if seconds <= 0 or not url or spec.serving.drain_mode == "sigterm":
        return DrainPolicy(seconds, None)
    if not removing(spec, groups, desired):
        return DrainPolicy(seconds, {})
    reading = read(url, metrics.inflight_query(namespace, name))
    inflight = {g: s.value for g, s in (reading.samples or {}).items() if s.age_seconds <= 30}
    return DrainPolicy(seconds, inflight)


@dataclass(frozen=True)
class Readings:
    """What a pass read from Prometheus before it took the placement ledger."""

    asked: autoscaler.Queries = field(default_factory=autoscaler.Queries)
    values: Mapping[str, metrics.Reading] = field(default_factory=dict)
    drain: DrainPolicy | None = None


def read_prometheus(
    ctx: Context, key: Key, md: ModelDeployment, groups: Mapping[RoleName, list[GroupView]], now: float
) -> Readings:
    """The autoscaler's due queries (at once when the burst watch asked) and the engines' in-flight
    counts for drains. A burst watch's ask that comes too soon after the last evaluation is kept for the
    next pass."""
    spec = md.spec
    read = metrics.one_timeout_per_pass(ctx.reader or _default_reader)
    urgent = take(ctx.urgent, key)  # the burst watch saw a burst begin: evaluate without waiting the interval
    asked = autoscaler.queries(md, now, urgent)
    if asked.kept:
        ctx.urgent.add(key)
    values = {q: read(asked.url, q) for q in asked.texts()}
    drain = drain_policy(spec, groups, autoscaler.remembered_groups(md), read, key[0], key[1])
    return Readings(asked, values, drain)


# ------------------------------------------------------------------------------------------- the API


def compute_domain_block(ctx: Context, spec: ModelDeploymentSpec) -> dict[RoleName, str]:
    """Why a role can create no group here: its groups claim an IMEX channel and the cluster does not
    serve NVIDIA's ComputeDomain kind."""
    roles = [r for r, _ in spec.roles() if builders.uses_compute_domain(spec, r)]
    if not roles:
        return {}
    try:
        served = ctx.kube.has_kind(contract.COMPUTE_DOMAIN_API, "ComputeDomain")
    except ApiError:
        served = False
    if served:
        return {}
    return {
        role: f"{role} groups need an NVIDIA ComputeDomain ({contract.COMPUTE_DOMAIN_API}) but its CRD is "
        "not installed: install NVIDIA's DRA driver, or set spec.topology.computeDomain to false"
        for role in roles
    }


def gang_mode(ctx: Context, spec: ModelDeploymentSpec) -> builders.GangMode:
    """How multi-node groups bind all or nothing: the operator's setting, else the PodGroup gang API where
    the cluster serves it, else tokenfab's scheduling gates."""
    mode = ctx.settings.gang
    if mode in ("podgroup", "gates"):
        return mode  # type: ignore[return-value]
    if not any(builders.group_shape(spec, r).nodes > 1 for r, _ in spec.roles()):
        return "gates"  # one-pod groups need neither
    try:
        return "podgroup" if ctx.kube.has_kind(contract.POD_GROUP_API, "PodGroup") else "gates"
    except ApiError:
        return "gates"


def channel_reader(
    ctx: Context,
    owner: builders.Owner,
    seen: frozenset[str],
    watched: bool,
    groups: Mapping[RoleName, list[GroupView]],
) -> Callable[[str], bool]:
    """Whether a ComputeDomain's IMEX channel ResourceClaimTemplate exists (NVIDIA's DRA driver makes it,
    in the ComputeDomain's namespace, under the name the ComputeDomain gives). Read here, before the
    placement ledger is taken: for each domain in the view that no group's pods claim yet (one whose pods
    claim it has its template). Where the kind is not watched (it was installed after the operator
    started) no domain is seen: the template is read when the plan asks, once per pass. Where the templates
    are watched too (the operator started with the driver installed) nothing is read: the view holds them,
    and their watch wakes the deployment."""
    claimed = {builders.channel_domain(owner, g.name, g.unit) for gs in groups.values() for g in gs if g.pods}
    if watched:
        ready = {name: _template(ctx, owner.namespace, name) for name in sorted(seen - claimed)}
        return lambda name: name in claimed or ready.get(name, False)

    @functools.cache
    def read(name: str) -> bool:
        return name in claimed or _template(ctx, owner.namespace, name)

    return read


def _template(ctx: Context, namespace: str, name: str) -> bool:
    """From the view where it watches the templates (no read), else from the API server."""
    seen = ctx.view.channel_template(namespace, name)
    if seen is not None:
        return seen
    try:
        got = ctx.kube.get(contract.RESOURCE_CLAIM_TEMPLATE_API, "ResourceClaimTemplate", name, namespace)
    except ApiError:
        return False
    return got is not None


def source_claim(ctx: Context, key: Key, spec: ModelDeploymentSpec, now: float) -> SourceClaim | None:
    """The claim a pvc:// source names, read again at most every SOURCE_READ_SECONDS (None: no pvc://)."""
    name = model_source.claim_name(spec)
    if name is None:
        return None
    mem = ctx.mem(key)
    last = mem.source_claim
    if last is not None and last[0].name == name and now - last[1] < SOURCE_READ_SECONDS:
        return last[0]
    try:
        obj = ctx.kube.get("v1", "PersistentVolumeClaim", name, key[0])
        modes = tuple((obj or {}).get("spec", {}).get("accessModes") or ())
        got = SourceClaim(name, obj is not None, modes)
    except ApiError as exc:
        got = SourceClaim(name, False, error=str(exc)[:500])
    mem.source_claim = (got, now)
    return got


def pod_security_level(ctx: Context, key: Key, spec: ModelDeploymentSpec, now: float) -> str | None:
    """The Pod Security level the deployment's namespace enforces ("" none set), read again at most every
    POD_SECURITY_READ_SECONDS per namespace (one read serves all its deployments), and only while the
    workers add capabilities (runtime.addCapabilities, or IPC_LOCK for the prefill-decode units' RDMA:
    planning.fabric.renders_rdma); None when it is not needed or could not be read (no permission: the
    condition is left out)."""
    if not spec.runtime.add_capabilities and not renders_rdma(spec):
        return None
    seen = ctx.levels.get(key[0])
    if seen is not None and now - seen[1] < POD_SECURITY_READ_SECONDS:
        return seen[0]
    try:
        ns = ctx.kube.get("v1", "Namespace", key[0])
        labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
        level: str | None = str(labels.get(pod_security.ENFORCE_LABEL, "")) if ns is not None else None
    except ApiError:
        level = None
    ctx.levels[key[0]] = (level, now)
    return level


# ------------------------------------------------------------------------------------------- the view


def frontend_pods(pods: list[PodFacts]) -> tuple[FrontendPod, ...]:
    """The deployment's frontend pods that have not ended, and their nodes."""
    return tuple(
        FrontendPod(p.name, p.node or "", p.deleting)
        for p in pods
        if p.labels.get(contract.COMPONENT) == "frontend" and not p.terminal
    )


def fetch_pods(
    pods: list[PodFacts], progress: Mapping[str, launcher_log.Progress] | None = None
) -> tuple[weights_cache.FetchPod, ...]:
    """The deployment's weights-fetch pods (pre-staging), with the node each is pinned to and the download
    so far its log said (`progress`: pod -> bytes)."""
    return tuple(
        weights_cache.FetchPod(
            p.name,
            p.pinned or p.node or "",
            p.phase,
            p.annotations.get(contract.ANN_WEIGHTS, ""),
            p.waiting,
            p.deleting,
            p.exit_message,
            (progress or {}).get(p.name),
        )
        for p in pods
        if p.labels.get(contract.COMPONENT) == contract.COMPONENT_WEIGHTS_FETCH
    )


def fault_reaction(ctx: Context, md: ModelDeployment) -> FaultReaction:
    """The operator's way of answering faults, with when each open fault of the status was first seen."""
    mode = ctx.settings.fault_reaction
    if mode not in ("replace", "none", "gang-delete"):
        mode = "replace"
    seen = {
        r.group: t
        for r in (md.status.faults if md.status else [])
        if r.recovered is None and (t := parse_time(r.time))
    }
    return FaultReaction(mode, ctx.settings.gang_delete_seconds, seen)  # type: ignore[arg-type]


def children_seen(
    ctx: Context, key: Key, pods: list[PodFacts], spec: ModelDeploymentSpec | None = None
) -> writes.Seen:
    """The deployment's children, its pods' revisions and claims, and the namespace's model cache claims
    left with no owner: what decides the deletes of what is no longer wanted. (The discovery identity is
    not looked for while the spec uses it: it is never deleted then.)"""
    kinds = CHILD_KINDS
    if spec is not None and builders.uses_kubernetes_discovery(spec):
        kinds = tuple(k for k in kinds if k not in {k for _, k in writes.DISCOVERY_KINDS})
    children = tuple(
        writes.Child(kind, ch.name, ch.role, ch.revision, ch.node, ch.owners, ch.version)
        for kind in kinds
        for ch in ctx.view.children(kind, key)
    )
    orphans = tuple(
        writes.Child("PersistentVolumeClaim", p.name, node=p.node, version=p.version)
        for p in ctx.view.model_caches(key[0])
        if not p.owners and not p.deployment
    )
    return writes.Seen(
        children=children,
        revisions=frozenset(
            (p.labels.get(contract.LABEL_ROLE, ""), p.labels.get(contract.LABEL_REVISION, "")) for p in pods
        ),
        pod_claims=frozenset(p.cache_claim for p in pods),
        orphan_claims=orphans,
        mounted=functools.cache(lambda: ctx.view.mounted_elsewhere(key)),
    )


def identity_seen(ctx: Context, key: Key, spec: ModelDeploymentSpec) -> frozenset[tuple[str, str]] | None:
    """The deployment's discovery identity objects the view holds, (kind, name); None when the spec
    does not use kubernetes discovery (nothing to wait for)."""
    if not builders.uses_kubernetes_discovery(spec):
        return None
    return frozenset((k, ch.name) for _, k in writes.DISCOVERY_KINDS for ch in ctx.view.children(k, key))


def _no_room() -> tuple[list[NodeFacts], dict[str, dict[str, int]]]:
    raise RuntimeError("free capacity is read inside the placement ledger's session only")


# ------------------------------------------------------------------------------------------- the phase


def observe(ctx: Context, key: Key, now: float) -> Observed | Ended | Stopped | None:
    """The pass's snapshot (its room still to be read, inside the ledger's session); Stopped (a spec the
    models refuse, a profile not planned yet: the plan phase makes its status); Ended (writes the watch has
    not shown yet); or None when the deployment is gone."""
    parsed = _parsed(ctx, key)
    if not isinstance(parsed, tuple):
        return parsed
    body, md = parsed
    profile = plan_profile(md.spec, md.status.profile if md.status else None, ctx.planner, now)
    if profile.wait:  # no plan yet (or none possible): the plan says so, and leaves every child as it is
        legacy = writes.legacy_patch(body["metadata"])
        return Stopped(body, md, planned=profile.condition, profile=profile.status, legacy=legacy)
    md = md.model_copy(update={"spec": profile.spec})
    if not ctx.expectations.satisfied(key, ctx.view, now):
        return Ended(body, Result(requeue_after=1.0, waited=True))
    owner = builders.Owner(name=key[1], namespace=key[0], uid=body["metadata"]["uid"])
    constraints = builders.placement_constraints(md.spec)
    pods = ctx.view.pods(key)
    groups = group_views(pods, {p.group for p in (md.status.placement if md.status else [])})
    read = read_prometheus(ctx, key, md, groups, now)
    frontend = ctx.view.child("Deployment", key[0], builders.frontend_name(owner))
    claims = usable_claims(ctx.view, owner, md.spec)
    logs = pod_logs.read(ctx, key, md.spec, pods, now)
    compute_domains = ctx.view.children("ComputeDomain", key)
    unit_domains = [ch for ch in compute_domains if ch.unit.isdigit()]
    seen, watched = frozenset(ch.name for ch in compute_domains), ctx.view.synced.get("ComputeDomain", False)
    domains = writes.Domains(seen, watched, channel_reader(ctx, owner, seen, watched, groups))
    return Observed(
        body,
        Snapshot(
            owner=owner,
            md=md,
            groups=groups,
            health=node_health(ctx.view, pods, constraints),
            room=Room(_no_room, constraints),
            now=now,
            asked=read.asked,
            readings=read.values,
            drain=read.drain,
            blocked=compute_domain_block(ctx, md.spec),
            bind_timeout=ctx.settings.bind_timeout,
            frontend_available=frontend.available_replicas if frontend else 0,
            frontend=frontend_pods(pods),
            frontend_replaces=frontend.replaces if frontend else "",
            profile=profile.status,
            planned=profile.condition,
            source=source_claim(ctx, key, md.spec, now),
            pod_nodes=frozenset(n for p in pods if (n := p.pinned or p.node)),
            claims={pvc.node: held(pvc, builders.weights_key(md.spec)) for pvc in claims},
            fetch_pods=fetch_pods(pods, logs.progress),
            weights_sources=logs.weights,
            loading=logs.loading,
            caches=node_caches(ctx.view, key, [p.node for p in claims]),
            reaction=fault_reaction(ctx, md),
            unit_domains={ch.name: int(ch.unit) for ch in unit_domains},
            units_down=frozenset(int(ch.unit) for ch in unit_domains if ch.state == "NotReady"),
            gang=gang_mode(ctx, md.spec),
            domains=domains,
            children=children_seen(ctx, key, pods, md.spec),
            legacy=writes.legacy_patch(body["metadata"]),
            pod_security=pod_security_level(ctx, key, md.spec, now),
            rdma_resource=ctx.settings.rdma_resource,
            identity=identity_seen(ctx, key, md.spec),
        ),
    )
