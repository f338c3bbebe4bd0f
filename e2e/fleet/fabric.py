"""The simulated fabric of the factory's NVL72 racks, as NCCL meets it at communicator init (hardware,
simulated; the pods' own settings are what is checked).

On a GB200 tray, NCCL's multi-node NVLink (NCCL_MNNVL_ENABLE=1) imports the other ranks' memory through
fabric handles, which the IMEX daemons of one IMEX domain exchange; a container sees its IMEX channel
(/dev/nvidia-caps-imex-channels/channelN) only when NVIDIA's DRA driver prepared its ComputeDomain claim.
So a rank that asks for MNNVL fails at init:
- when its pod holds no IMEX channel (no allocated claim of the ComputeDomain driver);
- when the group's pods hold channels of different ComputeDomains (two IMEX domains cannot import each
  other's handles);
- when the group's nodes are not in one NVLink domain (nvidia.com/gpu.clique): no NVLink joins them.

NCCL_MNNVL_ENABLE=1 means "fail if MNNVL cannot be enabled" (2, NCCL's default, detects and falls
back): NCCL warns "MNNVL is not supported on this system" and init returns ncclSystemError, "unhandled
system error" (NVIDIA/nccl src/init.cc; Dynamo's docs/backends/trtllm/trtllm-kv-cache-transfer.md shows
the same words when a GB200 worker has no ComputeDomain). The message here says it is the factory's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from e2e.fleet.pods import resolve_env
from tokenfab.planning import contract

Obj = dict[str, Any]
IMEX_DRIVER = "compute-domain.nvidia.com"  # NVIDIA's DRA driver for ComputeDomains
CLIQUE_LABEL = "nvidia.com/gpu.clique"


def claim_names(pod: Obj) -> list[str]:
    """The ResourceClaims made for the pod (status.resourceClaimStatuses), by the claim controller."""
    return [
        str(s["resourceClaimName"])
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    ]


def imex_domain(pod: Obj, claims: Mapping[str, Obj]) -> str | None:
    """The ComputeDomain (its uid) whose IMEX channel the pod holds: one of its claims allocated a device
    of the ComputeDomain driver, and carries the domain's id in its opaque config; None when it holds
    none (`claims`: the namespace's claims by name, as read)."""
    for name in claim_names(pod):
        claim = claims.get(name) or {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if not any(r.get("driver") == IMEX_DRIVER for r in results or []):
            continue
        for cfg in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            opaque = cfg.get("opaque") or {}
            if opaque.get("driver") == IMEX_DRIVER:
                return str((opaque.get("parameters") or {}).get("domainID") or name)
        return name
    return None


def asks_mnnvl(pod: Obj) -> bool:
    return resolve_env(pod).get("NCCL_MNNVL_ENABLE") == "1"


def nccl_refusal(group: Sequence[Obj], claims: Mapping[str, Obj], cliques: Mapping[str, str]) -> str | None:
    """Why NCCL's communicator init fails for this group's engine, or None when it comes up. `group`: the
    group's pods (rank 0 first), `claims`: their namespace's ResourceClaims by name, `cliques`: node ->
    its NVLink domain."""
    if not group or not asks_mnnvl(group[0]):
        return None
    where = (
        "MNNVL is not supported on this system; ncclCommInitRank: unhandled system error (the factory's "
        "simulated NCCL, NCCL_MNNVL_ENABLE=1)"
    )
    held = {str(p["metadata"]["name"]): imex_domain(p, claims) for p in group}
    missing = sorted(name for name, domain in held.items() if domain is None)
    if missing:
        return f"{where}: pod {', '.join(missing)} holds no IMEX channel (no ComputeDomain claim allocated)"
    if len(set(held.values())) > 1:
        return f"{where}: the group's pods hold IMEX channels of {len(set(held.values()))} ComputeDomains"
    nodes = {str(p["spec"].get("nodeName") or "") for p in group}
    domains = {cliques.get(n, "") for n in nodes}
    if len(domains) > 1 or "" in domains:
        return f"{where}: the group's nodes {', '.join(sorted(nodes))} are not in one NVLink domain"
    return None


# The KV hand-over's cost per path, modeled (GB/s one way, per GPU; sources in docs/fabric-model.md): a
# GB200 GPU's NVLink 5 (1.8 TB/s both ways), its ConnectX-7 NIC (400 Gb/s), and kernel TCP over the
# network (an assumption: a 100 Gb/s line rate, no RDMA).
PATH_GBPS = {"nvlink": 900.0, "rdma": 50.0, "tcp": 12.5}
# DeepSeek-R1's KV cache per token with the example's fp8 cache: 61 layers x (512 + 64) MLA values x 1 byte
# (its config.json: num_hidden_layers, kv_lora_rank, qk_rope_head_dim).
KV_BYTES_PER_TOKEN = 61 * (512 + 64)


# The device plugins' RDMA resources the factory's trays advertise (tokenfab_factory.racks): a container
# allocated one sees the tray's ConnectX devices (/dev/infiniband).
RDMA_PREFIXES = ("rdma/",)
RDMA_NAMES = ("vpc.amazonaws.com/efa",)


def holds_rdma(pod: Obj) -> bool:
    """Whether UCX in the pod can move memory over RDMA: its container was allocated an RDMA device
    (a limit on an RDMA resource, which the scheduler bound to a node that has it) and may lock the memory
    it registers (IPC_LOCK: without it ibv_reg_mr fails past the default locked-memory limit)."""
    ctr = (pod["spec"].get("containers") or [{}])[0]
    limits = (ctr.get("resources") or {}).get("limits") or {}
    device = any(
        (k.startswith(RDMA_PREFIXES) or k in RDMA_NAMES) and str(v) not in ("0", "")
        for k, v in limits.items()
    )
    caps = ((ctr.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
    return device and "IPC_LOCK" in caps


def unit_path(pod: Obj, pods: Sequence[Obj], claims: Mapping[str, Obj], cliques: Mapping[str, str]) -> str:
    """The KV path of the pod's prefill-decode unit as the simulated fabric has it (its hardware, not
    what the operator reports): nvlink when the unit's pods all sit on one node, or in one NVLink domain
    each holding an IMEX channel of one ComputeDomain; else rdma when every pod of the unit holds an RDMA
    device and IPC_LOCK (`holds_rdma`), else tcp."""
    meta = pod["metadata"]
    unit = (meta.get("labels") or {}).get(contract.LABEL_UNIT)
    deployment = (meta.get("labels") or {}).get(contract.LABEL_DEPLOYMENT)
    if unit is None:
        return "tcp"
    members = [
        p
        for p in pods
        if p["metadata"]["namespace"] == meta["namespace"]
        and (p["metadata"].get("labels") or {}).get(contract.LABEL_UNIT) == unit
        and (p["metadata"].get("labels") or {}).get(contract.LABEL_DEPLOYMENT) == deployment
        and not p["metadata"].get("deletionTimestamp")
    ]
    nodes = {str(p["spec"].get("nodeName") or "") for p in members}
    if len(nodes) == 1 and "" not in nodes:
        return "nvlink"
    domains = {imex_domain(p, claims) for p in members}
    if len({cliques.get(n, "") for n in nodes}) == 1 and len(domains) == 1 and None not in domains:
        return "nvlink"
    return "rdma" if members and all(holds_rdma(p) for p in members) else "tcp"


def group_of(pod: Obj, pods: Sequence[Obj]) -> list[Obj]:
    """The pods of `pod`'s group in rank order (the pod alone when it names no group)."""
    meta = pod["metadata"]
    name = (meta.get("labels") or {}).get(contract.LABEL_GROUP)
    if not name:
        return [pod]
    same = [
        p
        for p in pods
        if p["metadata"]["namespace"] == meta["namespace"]
        and (p["metadata"].get("labels") or {}).get(contract.LABEL_GROUP) == name
        and not p["metadata"].get("deletionTimestamp")
    ]
    return sorted(same, key=lambda p: int(resolve_env(p).get(contract.ENV_RANK, "0") or 0))
