"""The Pod Security level a deployment's namespace enforces, against what its workers ask for, pure: the
PodSecurity condition.

Kubernetes' Pod Security admission refuses a pod that adds a capability its level does not allow
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, "Capabilities"): `restricted`
allows only NET_BIND_SERVICE, `baseline` the default container set below, `privileged` any. Every
capability tokenfab lets a spec add (runtime.addCapabilities: IPC_LOCK for RDMA memory registration,
SYS_RESOURCE, SYS_NICE, SYS_PTRACE, NET_RAW, NET_ADMIN) is outside both sets, so the workers' namespace must
enforce `privileged` (a namespace without the label gets the cluster's default, usually privileged).
OpenShift's security context constraints are not read: their refusal comes back from the API server in
its own words (Placed=False/CreateRefused).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfab.api.models import Condition, ModelDeploymentSpec
from tokenfab.planning import contract

CONDITION = "PodSecurity"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ALLOWED: dict[str, frozenset[str] | None] = {
    "restricted": frozenset({"NET_BIND_SERVICE"}),
    "baseline": frozenset(
        {
            "AUDIT_WRITE",
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "FSETID",
            "KILL",
            "MKNOD",
            "NET_BIND_SERVICE",
            "SETFCAP",
            "SETGID",
            "SETPCAP",
            "SETUID",
            "SYS_CHROOT",
        }
    ),
    "privileged": None,  # (anything)
}


def forbidden(level: str, capabilities: Sequence[str]) -> list[str]:
    """The capabilities a namespace enforcing `level` refuses (an unknown level refuses none: it is
    not Pod Security's)."""
    allowed = ALLOWED.get(level)
    if allowed is None:
        return []
    return [c for c in capabilities if c not in allowed]


def condition(
    spec: ModelDeploymentSpec, namespace: str, level: str | None, rdma: bool = False
) -> Condition | None:
    """PodSecurity: False (CapabilitiesForbidden) when the namespace's enforced level refuses a
    capability the workers add, True when it allows them; None when the workers add none or the level
    could not be read (`level` None). `rdma`: a prefill-decode unit spans NVLink domains, so its pods add
    IPC_LOCK for RDMA (builders.group_pods)."""
    caps: list[str] = list(spec.runtime.add_capabilities)
    unit_caps = [contract.CAP_IPC_LOCK] if rdma and contract.CAP_IPC_LOCK not in caps else []
    if not (caps or unit_caps) or level is None:
        return None
    refused = forbidden(level, [*caps, *unit_caps])
    if refused:
        asked = [c for c in refused if c in caps]
        why = [f"{', '.join(asked)} (runtime.addCapabilities)"] if asked else []
        why += [f"{contract.CAP_IPC_LOCK} (RDMA for a prefill-decode unit that spans NVLink domains)"] * bool(
            set(refused) - set(asked)
        )
        fixes = [f"drop {', '.join(asked)} from runtime.addCapabilities"] if asked else []
        fixes += ["set spec.topology.kvNetwork to tcp (slower)"] * bool(set(refused) - set(asked))
        return Condition(
            type=CONDITION,
            status="False",
            reason="CapabilitiesForbidden",
            message=f"namespace {namespace} enforces Pod Security level {level!r} ({ENFORCE_LABEL}), "
            f"which refuses the workers' added capabilities {'; '.join(why)}: their pods would not be "
            f"admitted. Label the namespace {ENFORCE_LABEL}=privileged, or {' and '.join(fixes)} "
            "(without IPC_LOCK, KV caches that cross NVLink domains move over TCP).",
        )
    caps += unit_caps
    said = (
        f"enforces Pod Security level {level!r}"
        if level
        else f"sets no Pod Security level ({ENFORCE_LABEL}: the cluster's default applies)"
    )
    return Condition(
        type=CONDITION,
        status="True",
        reason="CapabilitiesAllowed",
        message=f"namespace {namespace} {said}: the workers' added capabilities ({', '.join(caps)}) are "
        "not refused by it",
    )
