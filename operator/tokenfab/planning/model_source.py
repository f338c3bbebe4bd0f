"""A pvc:// model source's claim, pure: the workers (and the weights-fetch pods that copy it into the
per-node caches) mount it read-only on every node their pods run on. A claim that is not there leaves them
Pending; one that only one node may attach (ReadWriteOnce, ReadWriteOncePod) stops every pod on a second
node at its volume's attach (Multi-Attach). Both are said in the ModelSource condition, before the pods."""

from __future__ import annotations

from dataclasses import dataclass

from tokenfab.api.models import Condition, ModelDeploymentSpec

CONDITION = "ModelSource"
SHARED = ("ReadOnlyMany", "ReadWriteMany")  # the access modes that let every node attach the volume


@dataclass(frozen=True)
class SourceClaim:
    """The claim a pvc:// source names, as read."""

    name: str
    found: bool
    modes: tuple[str, ...] = ()  # its spec.accessModes
    error: str = ""  # the API server's words when it could not be read


def claim_name(spec: ModelDeploymentSpec) -> str | None:
    """The claim of a pvc://<claim>/<path> source (None for other sources)."""
    scheme, _, rest = spec.model.source.partition("://")
    return rest.split("/", 1)[0] if scheme == "pvc" else None


def condition(namespace: str, claim: SourceClaim | None) -> Condition | None:
    """ModelSource: True when every node may mount the claim; False when it is missing or attaches to one
    node only; Unknown when it could not be read. None for a source that is no claim."""
    if claim is None:
        return None
    where = f"PersistentVolumeClaim {namespace}/{claim.name} (spec.model.source)"
    if claim.error:
        said = f"{where}: {claim.error}"[:900]
        return Condition(type=CONDITION, status="Unknown", reason="ClaimUnreadable", message=said)
    if not claim.found:
        return Condition(
            type=CONDITION,
            status="False",
            reason="ClaimNotFound",
            message=f"{where} does not exist: the workers wait for it. Create it (ReadOnlyMany), or name an "
            "existing claim in spec.model.source",
        )
    modes = ", ".join(claim.modes) or "none"
    if not set(claim.modes) & set(SHARED):
        return Condition(
            type=CONDITION,
            status="False",
            reason="ClaimNotShared",
            message=f"{where} has access modes {modes}: the workers mount it on every node they run on, and "
            "a volume attached to one node is refused on a second (Multi-Attach). Give the claim "
            "ReadOnlyMany (its data on a volume every node can attach)",
        )
    said = f"{where}: {modes}, mounted on every node"
    return Condition(type=CONDITION, status="True", reason="ClaimShared", message=said)
