"""Every write of a pass, decided here and named in the plan (tokenfab.planning.one_pass.Plan.writes); the
act phase (tokenfab.act) only applies them and reads the API server's answers.

- the new groups' objects: each group's pods (and PodGroup), after its ComputeDomain where its pods claim
  an IMEX channel: that domain is written until it is seen, and its pods only once NVIDIA's DRA driver has
  made the channel's ResourceClaimTemplate (a pod naming a missing template gets a Warning from the claim
  controller, and its claim comes late); until then the group waits for its channel;
- the deletes of objects no longer wanted: engine ConfigMaps of revisions no pod uses, the budgets of roles
  that are gone, model cache claims of another source, storage class or size (deleted when no other
  deployment owns them, else let go of), claims of the namespace left with no owner, and the discovery
  identity once no pod of the deployment needs it; with the plan's own (weights-fetch pods, claims evicted,
  pods on nodes that are gone, unit ComputeDomains left without a group);
- the routing writes once the first round is answered: the gated pods of the groups to release, and the
  leaders to make routable.

Pure: the facts come from the snapshot (tokenfab.planning.one_pass.Snapshot); the one read a decision may
need while it is made (whether a channel template exists) is a reader the observe phase hands in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.planning import builders, contract
from tokenfab.planning.groups import Create, RolePlan
from tokenfab.planning.lifecycle import GroupView, PodView

Manifest = builders.Manifest

DISCOVERY_KINDS = (
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("v1", "ServiceAccount"),
)


@dataclass(frozen=True)
class Delete:
    """One object to delete (`force`: a pod deleted at once, grace 0; `unchanged`: only while its
    resourceVersion is this one)."""

    api_version: str
    kind: str
    name: str
    unchanged: str = ""
    force: bool = False


@dataclass(frozen=True)
class Release:
    """A shared model cache claim another deployment owns too, let go of (`mounted`: another deployment's
    pods mount it, so it is never deleted here)."""

    name: str
    mounted: bool


@dataclass(frozen=True)
class NewGroup:
    """A new group's objects, written together (its PodGroup first where it has one)."""

    plan: RolePlan
    create: Create
    name: str
    objects: tuple[Manifest, ...]

    @property
    def pods(self) -> tuple[Manifest, ...]:
        return tuple(m for m in self.objects if m["kind"] == "Pod")


@dataclass(frozen=True)
class GroupWait:
    """A new group parked: its ComputeDomain has no IMEX channel template yet (`domain`; nothing of it but
    the domain is written, and the next pass looks again), or its pods' discovery identity (the
    ServiceAccount they name, the Role their RoleBinding names) is not in the view yet (`domain` ""; a
    pod naming a ServiceAccount that does not exist is refused). The identity's watch wakes the deployment:
    no pass waits for the API server's answer while others queue behind it."""

    plan: RolePlan
    group: str
    domain: str = ""


@dataclass(frozen=True)
class Child:
    """A child object as the pass saw it: what the deletes are decided from."""

    kind: str
    name: str
    role: str = ""
    revision: str = ""
    node: str = ""  # a model cache claim's node
    owners: tuple[str, ...] = ()  # a model cache claim's owning deployments (by name)
    version: str = ""  # its resourceVersion


@dataclass(frozen=True)
class Seen:
    """What the deletes are decided from: the deployment's children (ConfigMaps, budgets, model cache
    claims, discovery identity), the (role, revision) of each of its pods, the claims its pods mount, the
    namespace's model cache claims that have no owner, and those other deployments' pods mount (`mounted`,
    read only when a claim is to go: a walk over the pods)."""

    children: tuple[Child, ...] = ()
    revisions: frozenset[tuple[str, str]] = frozenset()
    pod_claims: frozenset[str] = frozenset()
    orphan_claims: tuple[Child, ...] = ()
    mounted: Callable[[], frozenset[str]] = frozenset

    def of(self, kind: str) -> list[Child]:
        return [c for c in self.children if c.kind == kind]


@dataclass(frozen=True)
class Domains:
    """The ComputeDomains as the pass saw them: the names in the cluster view, whether the view watches the
    kind (else a domain is written in every pass until its template shows), and a reader of whether a
    domain's channel template exists."""

    seen: frozenset[str] = frozenset()
    watched: bool = False
    channel_ready: Callable[[str], bool] = lambda _name: True


@dataclass(frozen=True)
class Writes:
    """Every write of one pass, in the order they go out: the children by the act phase (tokenfab.act.submit),
    the deployment's own object (`legacy`; its status is made after the act phase) by the settle phase."""

    workers_service: Manifest
    identity: tuple[Manifest, ...]  # () or (ServiceAccount, Role, RoleBinding)
    domains: tuple[Manifest, ...]  # ComputeDomains of new groups, not seen yet
    groups: tuple[NewGroup, ...]  # the new groups' pods and PodGroups
    waits: tuple[GroupWait, ...]  # new groups parked: waiting for their channel, or for the identity
    rest: tuple[Manifest, ...]  # model caches, fetch pods, frontend, engine ConfigMaps, budgets
    deletes: tuple[Delete, ...]  # objects no longer wanted
    releases: tuple[Release, ...]  # shared model cache claims let go of
    gated: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # group to release -> its gated pods
    routable: tuple[str, ...] = ()  # leader pods whose containers are ready, to make routable
    legacy: Mapping[str, object] | None = None  # the merge patch that takes old kopf bookkeeping off

    def names(self, kind: str, force: bool = False) -> tuple[str, ...]:
        """The names of the objects of `kind` to delete (`force`: the pods deleted at once)."""
        return tuple(d.name for d in self.deletes if d.kind == kind and d.force == force)


# ------------------------------------------------------------------------------------------ legacy

# Old kopf bookkeeping on objects made by earlier tokenfab versions (removed when seen).
LEGACY_FINALIZER = contract.FINALIZER
LEGACY_ANNOTATIONS = (f"{contract.DOMAIN}/last-handled-configuration", f"{contract.DOMAIN}/last-handled")


def legacy_patch(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """Objects made by tokenfab versions that ran kopf's change handlers carry its finalizer and a copy of
    the spec in an annotation; neither is used any more (and the finalizer could block deletion): the
    merge patch that takes them off (None: there is nothing to take off)."""
    ann = meta.get("annotations") or {}
    old = [k for k in ann if k in LEGACY_ANNOTATIONS or k.startswith(f"{contract.DOMAIN}/reconcile-")]
    finalizers = meta.get("finalizers") or []
    if LEGACY_FINALIZER not in finalizers and not old:
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if LEGACY_FINALIZER in finalizers:
        patch["metadata"]["finalizers"] = [f for f in finalizers if f != LEGACY_FINALIZER]
    if old:
        patch["metadata"]["annotations"] = dict.fromkeys(old)
    return patch


# ------------------------------------------------------------------------------------------ identity

NEEDED_FIRST = ("ServiceAccount", "Role")  # before the pods that name it, and the binding that names it


def identity_writes(
    identity: tuple[Manifest, ...], seen: frozenset[tuple[str, str]] | None
) -> tuple[tuple[Manifest, ...], bool]:
    """The discovery identity's writes, and whether new groups may be written in this pass. Its
    ServiceAccount and Role go first; once the view shows both (`seen`: the (kind, name) of the
    deployment's identity objects in the view; None: not read, taken as in place), the RoleBinding (RBAC's
    escalation check reads the Role it names) and the new groups' pods (a pod naming a ServiceAccount that
    does not exist is refused) follow. Until then the new groups are parked, and the identity's watch
    wakes the deployment."""
    if seen is None:
        return identity, True
    first = [m for m in identity if m["kind"] in NEEDED_FIRST]
    ready = all((m["kind"], m["metadata"]["name"]) in seen for m in first)
    return (identity if ready else tuple(first)), ready


# ------------------------------------------------------------------------------------------ new groups


def new_groups(
    owner: builders.Owner,
    spec: ModelDeploymentSpec,
    roles: Iterable[RolePlan],
    gang: builders.GangMode,
    domains: Domains,
    rdma: str = "",
    identity_ready: bool = True,
) -> tuple[tuple[Manifest, ...], tuple[NewGroup, ...], tuple[GroupWait, ...]]:
    """The new groups' objects: (ComputeDomains to write, groups to write, groups parked: waiting for
    their channel, or for their pods' identity while `identity_ready` is False). A unit's ComputeDomain is
    written once for all its new groups, parked or not. `rdma`: the RDMA device resource the pods of a
    group whose unit spans NVLink domains ask for (Create.rdma)."""
    cds: dict[str, Manifest] = {}
    groups: list[NewGroup] = []
    waits: list[GroupWait] = []
    for plan in roles:
        for cr in plan.create:
            group = builders.group_name(owner, cr.role, cr.slot)
            cd = builders.compute_domain(owner, spec, cr.role, cr.slot, cr.unit)
            if cd is not None:
                name = cd["metadata"]["name"]
                seen = name in domains.seen
                if not seen:
                    cds.setdefault(name, cd)
                # (watched: the template, which the driver makes after the domain, is looked for once
                # the domain is seen; not watched: in every pass)
                if (not seen and domains.watched) or not domains.channel_ready(name):
                    waits.append(GroupWait(plan, group, name))
                    continue
            if not identity_ready:
                waits.append(GroupWait(plan, group))
                continue
            at = builders.GroupAt(
                cr.role,
                cr.slot,
                cr.domain,
                cr.revision,
                nodes=cr.nodes,
                ranks=cr.ranks,
                gang=gang,
                start_path=cr.path,
                unit=cr.unit,
                rdma=rdma if cr.rdma else "",
            )
            pods = builders.group_pods(owner, spec, at)
            pg = [builders.pod_group(owner, spec, cr.role, cr.slot)]
            objs = (*(pg if builders.gang_of(spec, cr.role, gang) == "podgroup" else []), *pods)
            groups.append(NewGroup(plan, cr, group, tuple(objs)))
    return tuple(cds.values()), tuple(groups), tuple(waits)


# ------------------------------------------------------------------------------------------ deletes


def stale(owner: builders.Owner, spec: ModelDeploymentSpec, seen: Seen) -> tuple[list[Delete], list[Release]]:
    """The children no longer wanted: engine ConfigMaps of revisions no group uses any more, the budgets of
    roles that are gone, model cache claims it would no longer mount, and the discovery identity once no
    pod of the deployment needs it (serving.discovery left kubernetes and every pod is of the current
    revisions)."""
    deletes: list[Delete] = []
    in_use = seen.revisions
    current = {(role, builders.role_revision(spec, role)) for role, _ in spec.roles()}
    legacy_done = {role for role, rev in current if all(r == rev for ro, r in in_use if ro == role)}
    for cm in seen.of("ConfigMap"):
        old = cm.revision and (cm.role, cm.revision) not in in_use | current
        # (one ConfigMap per role, rewritten in place, before revisions had their own)
        legacy = not cm.revision and cm.name == f"{owner.name}-{cm.role}-engine" and cm.role in legacy_done
        if old or legacy:
            deletes.append(Delete("v1", "ConfigMap", cm.name))
    roles = {r for r, _ in spec.roles()}
    deletes += [
        Delete("policy/v1", "PodDisruptionBudget", pdb.name)
        for pdb in seen.of("PodDisruptionBudget")
        if pdb.role and pdb.role not in roles
    ]
    claims, releases = _claims(owner, spec, seen)
    deletes += claims
    if not builders.uses_kubernetes_discovery(spec) and in_use <= current:
        deletes += [Delete(v, kind, c.name) for v, kind in DISCOVERY_KINDS for c in seen.of(kind)]
    return deletes, releases


def _claims(
    owner: builders.Owner, spec: ModelDeploymentSpec, seen: Seen
) -> tuple[list[Delete], list[Release]]:
    """The model cache claims the deployment owns but would no longer mount (another source, storage
    class or size, or one made before claims were shared): deleted when no other deployment owns them (a
    claim still mounted goes when its last pod does), else let go of. A claim another deployment's pods
    mount before it owns it is not deleted (it becomes an owner). A claim of the namespace left with no
    owner at all (a release whose delete failed) is deleted too, unless mounted, and only while it is
    unchanged (one taken up meanwhile is kept)."""
    deletes: list[Delete] = []
    releases: list[Release] = []
    claims = [c for c in seen.of("PersistentVolumeClaim") if c.node]
    wanted = {
        m["metadata"]["name"] for m in builders.model_cache_claims(owner, spec, [c.node for c in claims])
    }
    busy: frozenset[str] | None = None  # (read only when a claim is to go)
    for pvc in claims:
        if pvc.name in wanted:
            continue
        busy = seen.mounted() if busy is None else busy
        if set(pvc.owners) - {owner.name}:
            releases.append(Release(pvc.name, pvc.name in busy))
        elif pvc.name not in busy:
            deletes.append(Delete("v1", "PersistentVolumeClaim", pvc.name))
    orphans = [c for c in seen.orphan_claims if c.name not in wanted]
    if orphans:
        busy = (seen.mounted() if busy is None else busy) | seen.pod_claims
        deletes += [
            Delete("v1", "PersistentVolumeClaim", c.name, unchanged=c.version)
            for c in orphans
            if c.name not in busy
        ]
    return deletes, releases


# ------------------------------------------------------------------------------------------ routing


def gated_pods(
    roles: Iterable[RolePlan], groups: Mapping[RoleName, list[GroupView]]
) -> dict[str, tuple[str, ...]]:
    """The gated pods of each group the roles release (a group created in this pass adds its ranks once it
    exists whole: its pods are not in the snapshot)."""
    pods = {g.name: g.pods for gs in groups.values() for g in gs}
    return {
        group: tuple(sorted(p.name for p in pods.get(group, ()) if p.gated))
        for plan in roles
        for group in dict.fromkeys(plan.release)
    }


def routable_leaders(
    roles: Iterable[RolePlan], groups: Mapping[RoleName, list[GroupView]]
) -> tuple[str, ...]:
    """The leader pods to make routable (the readiness gate a kubelet does not set by itself): of groups
    neither draining nor going, whose containers are ready and that are not routable yet."""
    by_name = {g.name: g for gs in groups.values() for g in gs}
    out: list[str] = []
    for plan in roles:
        draining = set(plan.draining) | {d.name for d in plan.drain}
        for name, state in plan.states.items():
            g = by_name.get(name)
            if g is None or name in draining or state in ("deleting", "broken"):
                continue
            out += [p.name for p in g.pods if p.rank == 0 and _waits_for_routing(p)]
    return tuple(out)


def _waits_for_routing(p: PodView) -> bool:
    """A pod serving but not routable yet: its containers ready, not going, not marked draining."""
    return p.containers_ready and p.routable is not True and not p.deleting and not p.marked_draining
