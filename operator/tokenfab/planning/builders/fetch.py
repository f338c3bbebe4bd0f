"""A weights-fetch pod: stages a deployment's hf:// weights in one node's model cache claim ahead of need
(model.cache.prestageGroups; tokenfab.planning.weights_cache decides the nodes). It runs the worker image's
launcher with `--fetch-only` (tokenfab.launcher.fetch), needs no GPU and no API access, and completes once
the weights are complete in the cache."""

from __future__ import annotations

from typing import Any

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.planning import contract
from tokenfab.planning.builders.common import Manifest, Owner, child_meta
from tokenfab.planning.builders.placement import worker_tolerations
from tokenfab.planning.builders.security import POD_SECURITY, container_security
from tokenfab.planning.builders.volumes import fetches_weights, model_cache_claim_name, model_volume

# What a download and its manifest's hashing need: a core and some buffers, no GPU.
FETCH_REQUESTS = {"cpu": "1", "memory": "1Gi"}
FETCH_LIMITS = {"memory": "4Gi"}
FETCH_GRACE_SECONDS = 5  # the launcher stops a download on SIGTERM at once; the hub client resumes it later


def weights_fetch_pod_name(owner: Owner, spec: ModelDeploymentSpec, node: str) -> str:
    """One per deployment, node and model cache claim (a new class or size is a new claim, so a new pod;
    the deployments sharing a claim each have their own)."""
    return f"{owner.name}-fetch-{model_cache_claim_name(owner, spec, node).removeprefix('model-cache-')}"


def fetch_env(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    """What `python3 -m tokenfab.launcher --fetch-only` reads (tokenfab.launcher.fetch.fetch_of_env): the
    source, its revision and the model cache, and runtime.env, which carries what the hub needs (HF_TOKEN
    from a Secret, HF_ENDPOINT for a mirror, a ModelExpress server)."""
    return [
        {"name": contract.ENV_MODEL_SOURCE, "value": spec.model.source},
        {"name": contract.ENV_MODEL_REVISION, "value": spec.model.revision or ""},
        {"name": contract.ENV_MODEL_CACHE, "value": contract.MODEL_CACHE_DIR},
        *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env],
    ]


def fetch_container(spec: ModelDeploymentSpec, name: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The launcher with `--fetch-only`: a weights-fetch pod's container, and a worker pod's weights init
    container (`weights_init_container`). It needs no GPU and no API access."""
    return {
        "name": name,
        "image": spec.runtime.image,
        "command": [contract.PYTHON, "-m", contract.LAUNCHER_MODULE, "--fetch-only"],
        "env": fetch_env(spec),
        "resources": {"requests": dict(FETCH_REQUESTS), "limits": dict(FETCH_LIMITS)},
        "securityContext": container_security(),
        # the launcher's figures on success (status.weightsCache.staged), its log's tail on a failure
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }


def weights_init_container(spec: ModelDeploymentSpec, mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A worker pod's init containers: where the launcher downloads the weights (builders.fetches_weights),
    one that does it before the worker starts, with the worker's own mounts (its model cache, /tmp, the
    caches), so the worker's startup probe counts only its start (probes.startup_budget) and a download
    has no time limit. The worker's launcher then finds them in the cache, verified by their manifest. A
    pod whose node's cache already holds them passes through in the time its manifest takes to check."""
    if not fetches_weights(spec):
        return []
    return [fetch_container(spec, contract.WEIGHTS_INIT_CONTAINER, mounts)]


def weights_fetch_pod(owner: Owner, spec: ModelDeploymentSpec, node: str, weights: str) -> Manifest:
    """The pod that downloads `weights` (source@revision) into `node`'s model cache claim and exits."""
    meta = child_meta(owner, weights_fetch_pod_name(owner, spec, node), contract.COMPONENT_WEIGHTS_FETCH)
    meta["annotations"] = {contract.ANN_NODE: node, contract.ANN_WEIGHTS: weights}
    source_volumes, source_mounts = model_volume(spec)
    container = fetch_container(
        spec,
        "fetch",
        [
            *source_mounts,  # (pvc:// weights: their claim, copied from)
            {"name": "model-cache", "mountPath": contract.MODEL_CACHE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": contract.CACHE_DIR},
        ],
    )
    node_term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY,
        "restartPolicy": "OnFailure",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [node_term]}
            }
        },
        "tolerations": worker_tolerations(spec),
        "containers": [container],
        "volumes": [
            *source_volumes,
            {
                "name": "model-cache",
                "persistentVolumeClaim": {"claimName": model_cache_claim_name(owner, spec, node)},
            },
            {"name": "tmp", "emptyDir": {}},
            {"name": "cache", "emptyDir": {}},
        ],
        # (no priority class or scheduler name of the workers': it needs no GPU and must not preempt)
        "terminationGracePeriodSeconds": FETCH_GRACE_SECONDS,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
