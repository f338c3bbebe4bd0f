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


def condition(spec: ModelDeploymentSpec, namespace: str, level: str | None) -> Condition | None:
    """PodSecurity: False (CapabilitiesForbidden) when the namespace's enforced level refuses a
    capability the workers add, True when it allows them; None when the workers add none or the level
    could not be read (`level` None)."""
    caps = list(spec.runtime.add_capabilities)
    if not caps or level is None:
        return None
    refused = forbidden(level, caps)
    if refused:
        return Condition(
            type=CONDITION,
            status="False",
            reason="CapabilitiesForbidden",
            message=f"namespace {namespace} enforces Pod Security level {level!r} ({ENFORCE_LABEL}), "
            f"which refuses the workers' added capabilities {', '.join(refused)} "
            "(runtime.addCapabilities): their pods would not be admitted. Label the namespace "
            f"{ENFORCE_LABEL}=privileged, or drop them from runtime.addCapabilities (without IPC_LOCK, KV "
            "caches that cross NVLink domains move over TCP).",
        )
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
