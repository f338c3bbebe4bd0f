"""Autoscaling of a deployment: the autoscaler's signals and pacing, and the bounds of each role's groups and
of the frontend's replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tokenfab.api.models.base import SpecModel, cel_of, cel_rules
from tokenfab.api.rules import BOUNDS_RULE, MIN_REPLICAS_RULE, QUERY_RULE


class RoleBounds(SpecModel):
    """Autoscaling bounds for one role, in groups."""

    model_config = ConfigDict(json_schema_extra=cel_rules([BOUNDS_RULE.x_kubernetes_validation()]))

    min_replicas: Annotated[int, AfterValidator(MIN_REPLICAS_RULE)] = Field(
        default=1,
        le=4096,
        description="Fewest groups, at least 1: scale-to-zero is not supported. To park a role, set "
        "autoscaling.enabled to false and the role's replicas to 0.",
        json_schema_extra=cel_of(MIN_REPLICAS_RULE),
    )
    max_replicas: int = Field(default=1, ge=0, le=4096, description="Most groups.")

    @model_validator(mode="after")
    def _min_le_max(self) -> RoleBounds:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("tokenfab_rule", BOUNDS_RULE.message)
        return self


class FrontendScaling(SpecModel):
    """Bounds and per-replica capacity for sizing the Dynamo frontend from its own ingress."""

    model_config = ConfigDict(json_schema_extra=cel_rules([BOUNDS_RULE.x_kubernetes_validation()]))

    min_replicas: int = Field(default=1, ge=1, le=64, description="Fewest frontend replicas.")
    max_replicas: int = Field(default=1, ge=1, le=64, description="Most frontend replicas.")
    requests_per_second_per_replica: float = Field(
        default=30.0,
        gt=0,
        le=100000,
        description="Requests/s one frontend replica should take (a replica tops out near 40/s at 60k-token "
        "inputs): replicas = forecast requests/s / this, rounded up.",
    )
    input_tokens_per_second_per_replica: float = Field(
        default=1_000_000.0,
        gt=0,
        le=1e9,
        description="Input tokens/s one frontend replica should tokenize and route: replicas also cover "
        "forecast input tokens/s / this.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> FrontendScaling:
        if self.min_replicas > self.max_replicas:
            raise PydanticCustomError("tokenfab_rule", BOUNDS_RULE.message)
        return self


class Autoscaling(SpecModel):
    """Scale prefill and decode groups (and the frontend) with the load: led by the forecast arrival rate
    and forming queues, with KV-cache utilization near a target as the guard."""

    enabled: bool = Field(default=False, description="Turn the built-in autoscaler on.")
    policy: Literal["leading", "kv"] = Field(
        default="leading",
        description="leading: size from the demand ahead (the frontend's arrival rate, forecast "
        "forecastSeconds ahead, divided by what one group serves) and from queues forming in the groups, "
        "with the KV-cache target as the guard. kv: KV-cache utilization alone (reacts only once the cache "
        "fills).",
    )
    forecast_seconds: int | None = Field(
        default=None,
        ge=0,
        le=1800,
        description="How far ahead the arrival rate is forecast: about the time a new group needs to serve "
        "(scheduling, weight loading, registration). Left out, it is learned from how long this "
        "deployment's groups took from creation to Ready.",
    )
    rate_window_seconds: int = Field(
        default=30,
        ge=5,
        le=600,
        description="Window of the arrival-rate query (PromQL rate over the frontend's request counter): "
        "at least twice the Prometheus scrape interval; shorter reacts sooner.",
    )
    prometheus_url: str | None = Field(
        default=None,
        pattern=r"^https?://.+$",
        description="Prometheus base URL that scrapes the workers (e.g. http://prometheus.monitoring:9090).",
    )
    target_kv_cache_utilization: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Target average KV-cache utilization of ready groups, in (0, 1].",
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="No change while utilization / target is within 1 +- tolerance.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Scale up to the lowest recommendation seen over this window (0: at once).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Scale down only to the highest recommendation seen over this window.",
    )
    max_step_up: int = Field(
        default=2, ge=1, le=64, description="Most groups added per role in one decision."
    )
    max_step_down: int = Field(
        default=1, ge=1, le=64, description="Most groups removed per role in one decision."
    )
    warmup_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="A group Ready for less than this is left out of the utilization average (and blocks "
        "scale-down): the router has not yet spread load to it. Weight loading happens before Ready, so "
        "this is short.",
    )
    interval_seconds: int = Field(default=15, ge=5, le=600, description="Seconds between evaluations.")
    prefill: RoleBounds | None = Field(
        default=None,
        description="Bounds for prefill groups. With ratioPolicy fixed they clamp the ratio's result.",
    )
    decode: RoleBounds | None = Field(default=None, description="Bounds for decode groups.")
    worker: RoleBounds | None = Field(default=None, description="Bounds for aggregated worker groups.")
    frontend: FrontendScaling | None = Field(
        default=None,
        description="Size the frontend Deployment from its request and input-token ingress within these "
        "bounds (left out: serving.frontendReplicas, fixed).",
    )
    target_queue_depth: float = Field(
        default=4,
        gt=0,
        le=10000,
        description="With ratioPolicy independent: target waiting requests per prefill group.",
    )
    query: Annotated[str | None, AfterValidator(QUERY_RULE)] = Field(
        default=None,
        max_length=4096,
        description="PromQL override for the utilization signal, returning one sample in [0, 1] per group "
        "(keyed by its tokenfab_dev_group label). It is filled in by Python's str.format: the placeholders "
        "{namespace}, {deployment} and {role} (written bare, nothing else inside the braces) become the "
        "deployment's values, and every literal brace, such as those of PromQL label matchers, must be "
        'doubled: max by (tokenfab_dev_group) (kv_cache_usage{{namespace="{namespace}", role="{role}"}}).',
        json_schema_extra=cel_of(QUERY_RULE),
    )
