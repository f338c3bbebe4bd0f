"""What the NVLink fabric gives a deployment's multi-node groups, pure: the Fabric condition.

A group that spans trays moves its tensors over multi-node NVLink (NCCL's MNNVL) only when its pods hold
an IMEX channel, which NVIDIA's DRA driver hands out through a ComputeDomain claim
(topology.computeDomain). Without one NCCL falls back to the network between trays, and tokenfab does not
ask it for MNNVL (`builders.nccl_env`): the group runs, slower, and this condition says so where a user
looks instead of leaving it to be found in a profile.
"""

from __future__ import annotations

from tokenfab.api.models import Condition, ModelDeploymentSpec
from tokenfab.planning.builders.placement import uses_compute_domain
from tokenfab.planning.builders.roles import group_shape

CONDITION = "Fabric"


def condition(spec: ModelDeploymentSpec) -> Condition | None:
    """Fabric: True when every multi-node role's groups claim an IMEX channel; False (NoIMEXChannel) when
    one spans trays without it. None when no group spans trays (nothing to say)."""
    spanning = [(role, group_shape(spec, role).nodes) for role, _ in spec.roles()]
    spanning = [(role, nodes) for role, nodes in spanning if nodes > 1]
    if not spanning:
        return None
    without = [(role, nodes) for role, nodes in spanning if not uses_compute_domain(spec, role)]
    if without:
        roles = ", ".join(f"{role} ({nodes} nodes)" for role, nodes in without)
        return Condition(
            type=CONDITION,
            status="False",
            reason="NoIMEXChannel",
            message=f"the {roles} groups span trays without an IMEX channel (spec.topology.computeDomain "
            "is false): NCCL runs between their trays over the network, not multi-node NVLink. Set "
            "spec.topology.computeDomain to true, with NVIDIA's DRA driver installed, for NVLink.",
        )
    roles = ", ".join(f"{role} ({nodes} nodes)" for role, nodes in spanning)
    return Condition(
        type=CONDITION,
        status="True",
        reason="IMEXChannel",
        message=f"the {roles} groups each claim the IMEX channel of their own ComputeDomain: NCCL uses "
        "multi-node NVLink between their trays",
    )
