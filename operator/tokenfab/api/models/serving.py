"""What a deployment serves and how requests reach it: the model and where its weights come from, the
serving mode, the Dynamo frontend and router, the prefill:decode ratio and the drain of removed groups."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from tokenfab.api.models.base import Quantity, SpecModel, cel_of, cel_rules, refuse_broken
from tokenfab.api.rules import (
    ENDPOINTS_NEED_ETCD,
    ETCD_NEEDS_ENDPOINTS,
    PRESTAGE_NEEDS_CLASS,
    SOURCE_RULE,
    STORAGE_CLASS_RULE,
)

RATIO_PATTERN = r"^[1-9][0-9]{0,2}:[1-9][0-9]{0,2}$"

Mode = Literal["aggregated", "disaggregated"]
RouterMode = Literal["kv", "round-robin", "random"]
RatioPolicy = Literal["fixed", "independent"]
Discovery = Literal["kubernetes", "etcd"]


class ModelCache(SpecModel):
    """Where hf:// and s3:// weights are kept on the GPU nodes: the worker launcher downloads them into this
    volume once, and every later pod that finds them there loads them from there."""

    model_config = ConfigDict(json_schema_extra=cel_rules([PRESTAGE_NEEDS_CLASS.x_kubernetes_validation()]))

    size: Quantity = Field(
        default="1Ti",
        description="Declared size of the cache: the PersistentVolumeClaim's request, or the emptyDir's "
        "sizeLimit (DeepSeek-R1 in FP8 is about 690 GB).",
    )
    storage_class_name: Annotated[str | None, AfterValidator(STORAGE_CLASS_RULE)] = Field(
        default=None,
        max_length=253,
        description="A node-local StorageClass (volumeBindingMode WaitForFirstConsumer: local NVMe through "
        "local-path-provisioner, TopoLVM, OpenEBS LocalPV...). tokenfab then makes one "
        "PersistentVolumeClaim per node the deployment's pods run on, named model-cache-<hash of the node, "
        "source, class and size> and shared by every deployment of the namespace that loads the same "
        "source with the same class and size (each one an owner), so the weights are downloaded once per "
        "node and kept across pods, restarts, rollouts and deployments (a new class or size is a new claim; "
        "the old one goes once no owner uses it); pvc:// weights are then copied into it from their claim. "
        "Unset: an emptyDir of `size` per pod, downloaded "
        "again by every new pod (pvc:// weights: loaded from their claim).",
        json_schema_extra=cel_of(STORAGE_CLASS_RULE),
    )
    prestage_groups: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Headroom to keep warm: the weights are downloaded ahead of need onto the nodes where "
        "each role's next prestageGroups groups would be placed (a weights-fetch pod per node, into that "
        "node's model cache claim), so a scale-up there loads them from local NVMe instead of the hub. "
        "Needs storageClassName. 0: a node's cache fills when a group first runs there.",
    )

    @model_validator(mode="after")
    def _prestage(self) -> ModelCache:
        refuse_broken(
            [(PRESTAGE_NEEDS_CLASS, not self.prestage_groups or self.storage_class_name is not None)]
        )
        return self


class ModelSource(SpecModel):
    """What model to serve and where its weights come from."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="Served model name: the `model` field clients send to the OpenAI-compatible API "
        "(e.g. deepseek-ai/DeepSeek-R1).",
    )
    source: Annotated[str, AfterValidator(SOURCE_RULE)] = Field(
        max_length=2048,
        description="Where the weights live: hf://<org>/<repo> (a model hub: the worker launcher downloads "
        "model.revision into its model cache before the engine starts), s3://<bucket>/<prefix> (the "
        "objects under the prefix, downloaded by the launcher with boto3 into the model cache: what changed "
        "since the last download; endpoint, region and credentials from runtime.env, e.g. "
        "AWS_ENDPOINT_URL and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from a Secret) or "
        "pvc://<claim>/<path> (a PersistentVolumeClaim in this namespace, and the weights' directory in it, "
        "mounted read-only; with cache.storageClassName copied from there into the node's model cache, what "
        "changed since the last copy, and loaded from local NVMe). No whitespace, and a non-empty path "
        "after the scheme.",
        json_schema_extra=cel_rules([SOURCE_RULE.x_kubernetes_validation()]),
    )
    revision: str | None = Field(
        default=None,
        max_length=256,
        description="Revision of hf:// weights: a hub commit, branch or tag, downloaded by the worker "
        "launcher and loaded by the engine (unset: the hub's main branch). For s3:// and pvc:// a label "
        "only (a new one rolls the groups; s3:// weights are what the prefix holds at each download: use a "
        "new prefix per version). Pin a commit in production so every group loads the same weights.",
    )
    cache: ModelCache = Field(
        default_factory=ModelCache,
        description="The model cache hf:// and s3:// weights are downloaded into (pvc:// weights are loaded "
        "where they are mounted, or copied into a per-node cache with storageClassName).",
    )


class Serving(SpecModel):
    """How requests reach the workers: mode, router and the prefill:decode ratio."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            [ETCD_NEEDS_ENDPOINTS.x_kubernetes_validation(), ENDPOINTS_NEED_ETCD.x_kubernetes_validation()]
        )
    )

    mode: Mode = Field(
        default="disaggregated",
        description="aggregated: one worker role does prefill and decode. disaggregated: separate prefill "
        "and decode roles exchange the KV cache (the fastest layout for reasoning models).",
    )
    router_mode: RouterMode = Field(
        default="kv",
        description="Dynamo frontend routing: kv (KV-cache-aware, sends a request where its prefix is "
        "cached), round-robin or random.",
    )
    frontend_replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Replicas of the Dynamo frontend (OpenAI-compatible HTTP API and router).",
    )
    prefill_decode_ratio: str | None = Field(
        default=None,
        pattern=RATIO_PATTERN,
        description='Prefill groups to decode groups, as "P:D" with positive integers (e.g. "1:3"). With '
        "ratioPolicy fixed, prefill groups = ceil(decode groups x P / D). Disaggregated mode only.",
    )
    ratio_policy: RatioPolicy = Field(
        default="fixed",
        description="fixed: prefill follows decode by prefillDecodeRatio (spec.prefill.replicas must be "
        "left out). independent: prefill has its own replicas and, with autoscaling, its own signal.",
    )
    drain_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="How long a group that is being removed (scale-down, rollout, a smaller spec) may take "
        "to finish its requests: it is first taken out of routing (its leader pod's readiness gate "
        "tokenfab.dev/routable turns False, so the router sends it nothing new), then deleted as soon as "
        "its engine reports no request in flight, or after drainSeconds (the requests still running are "
        "cut). Also the pods' terminationGracePeriodSeconds (plus 30 s) and Dynamo's graceful-shutdown "
        "bound, so a pod evicted by Kubernetes drains too. 600 s fits long reasoning outputs; 0 deletes "
        "at once.",
    )
    startup_seconds: int | None = Field(
        default=None,
        ge=60,
        le=86400,
        description="How long a worker may take to start once its weights are on its node (they are "
        "downloaded before, by the pod's weights init container, with no time limit): waiting for its "
        "group's other pods, loading the weights onto the GPUs, compiling kernels and capturing CUDA "
        "graphs. A worker whose health endpoint has not answered by then is stopped by its startup probe, "
        "and its group is replaced (the group's status says it ran past this budget). Unset: 1200 s, "
        "plus the launcher's wait for the other pods of a multi-node group (TOKENFAB_PEER_WAIT_SECONDS, "
        "1800 s): sized from a DeepSeek-class cold start (README, Startup budget). Applies to groups made "
        "from then on; no rollout.",
    )
    drain_mode: Literal["routing", "sigterm"] = Field(
        default="routing",
        description="How a group drains (with drainSeconds > 0). routing: out of routing first (its "
        "leader's readiness gate), deleted once its engine reports no request in flight (read from "
        "autoscaling.prometheusUrl; without one, as sigterm) or after drainSeconds. sigterm: deleted at "
        "once, each engine finishing its requests on SIGTERM (Dynamo's graceful shutdown) within "
        "drainSeconds, as a plain workload with a long termination grace period would.",
    )
    discovery: Discovery = Field(
        default="kubernetes",
        description="How Dynamo's frontend and workers find each other. kubernetes: each process writes a "
        "DynamoWorkerMetadata object (nvidia.com/v1alpha1, its CRD installed with tokenfab) and a worker is "
        "routed to only while its pod is ready in the EndpointSlice of the deployment's workers Service; "
        "tokenfab gives the pods a ServiceAccount <name>-dynamo with just those rights. etcd: an etcd "
        "cluster you run (serving.etcdEndpoints).",
    )
    etcd_endpoints: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=r"^\S+$",
        description="etcd client URLs for serving.discovery etcd, comma-separated (Dynamo's "
        "ETCD_ENDPOINTS), e.g. http://etcd.dynamo-system:2379.",
    )

    @model_validator(mode="after")
    def _etcd(self) -> Serving:
        refuse_broken(
            [
                (ETCD_NEEDS_ENDPOINTS, self.discovery != "etcd" or self.etcd_endpoints is not None),
                (ENDPOINTS_NEED_ETCD, self.etcd_endpoints is None or self.discovery == "etcd"),
            ]
        )
        return self
