"""Pydantic models of the tokenfab custom resources: the single source of the CRD schema.

Every field carries a description (it becomes `kubectl explain` text) and defaults live here. A rule on one
field or object comes from `tokenfab.api.rules` and is attached twice: its CEL to the schema, for the API
server, and its Python check to the model, so the models refuse what the API server refuses in the same
words. Nothing here does I/O.

Modules, each a concern of the spec, then status:
- `base`: the API group and version, the base classes, the Kubernetes quantity type.
- `serving`: the model and its weights, the serving mode, frontend, router, ratio and drain.
- `runtime`: the worker container (image, env, resources, capabilities, extraEngineArgs).
- `roles`: the roles' parallelism and groups, multi-token prediction, the profile a plan is made for.
- `autoscaling`: the autoscaler's settings and the bounds of the roles and the frontend.
- `topology`: NVLink domains, placement and the worker pods' scheduling.
- `spec`: ModelDeploymentSpec and the rules across its fields (SPEC_RULES).
- `status`: what the operator writes to a ModelDeployment's status.
- `deployment`: the whole ModelDeployment object and its metadata.
- `domain`: the NVLinkDomain resource.

They import each other in that order only (a later one may import an earlier one), and import nothing of
tokenfab beyond `tokenfab.api.cel` and `tokenfab.api.rules`. Every public name is re-exported here:
import from `tokenfab.api.models`.
"""

from tokenfab.api.models.autoscaling import (
    Autoscaling,
    FrontendScaling,
    RoleBounds,
)
from tokenfab.api.models.base import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    VERSION,
    Quantity,
)
from tokenfab.api.models.deployment import (
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    ModelDeployment,
    ModelDeploymentMeta,
    ObjectMeta,
)
from tokenfab.api.models.domain import (
    DOMAIN_KIND,
    DOMAIN_PLURAL,
    DOMAIN_SHORT_NAMES,
    DOMAIN_SINGULAR,
    CachedWeights,
    DomainGroup,
    NVLinkDomainStatus,
)
from tokenfab.api.models.roles import (
    MTP_MAX_DEPTH,
    ROLES,
    Parallelism,
    PlanSystem,
    Profile,
    Role,
    RoleName,
    SpeculativeDecoding,
)
from tokenfab.api.models.runtime import (
    ENGINE_ARGS_MAX_BYTES,
    ENGINE_ARGS_MAX_KEYS,
    RESERVED_ENGINE_KEYS,
    RESERVED_KEY_RULES,
    RESOURCES_MAX_ENTRIES,
    Capability,
    Engine,
    EngineArgs,
    EnvVar,
    EnvVarSource,
    KeySelector,
    ObjectFieldSelector,
    ResourceFieldSelector,
    Resources,
    Runtime,
    engine_args_bytes,
)
from tokenfab.api.models.serving import (
    RATIO_PATTERN,
    Discovery,
    Mode,
    ModelCache,
    ModelSource,
    RatioPolicy,
    RouterMode,
    Serving,
)
from tokenfab.api.models.spec import (
    SPEC_RULES,
    ModelDeploymentSpec,
    violations,
)
from tokenfab.api.models.status import (
    AutoscalingStatus,
    Condition,
    FaultRecord,
    FetchProgress,
    GroupPlacement,
    KvPath,
    ModelDeploymentStatus,
    PlannedRole,
    PlanPrediction,
    ProfileStatus,
    RoleFailures,
    RoleStatus,
    ScalingDecision,
    StagedWeights,
    UnitStatus,
    WeightsCacheStatus,
)
from tokenfab.api.models.topology import (
    NODE_SELECTOR_MAX_ENTRIES,
    TOLERATIONS_MAX,
    KvNetwork,
    PlacementPolicy,
    Scheduling,
    Toleration,
    Topology,
)

__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "DOMAIN_KIND",
    "DOMAIN_PLURAL",
    "DOMAIN_SHORT_NAMES",
    "DOMAIN_SINGULAR",
    "ENGINE_ARGS_MAX_BYTES",
    "ENGINE_ARGS_MAX_KEYS",
    "GROUP",
    "KIND",
    "MTP_MAX_DEPTH",
    "NODE_SELECTOR_MAX_ENTRIES",
    "PLURAL",
    "RATIO_PATTERN",
    "RESERVED_ENGINE_KEYS",
    "RESERVED_KEY_RULES",
    "RESOURCES_MAX_ENTRIES",
    "ROLES",
    "SHORT_NAMES",
    "SINGULAR",
    "SPEC_RULES",
    "TOLERATIONS_MAX",
    "VERSION",
    "Autoscaling",
    "AutoscalingStatus",
    "CachedWeights",
    "Capability",
    "Condition",
    "Discovery",
    "DomainGroup",
    "Engine",
    "EngineArgs",
    "EnvVar",
    "EnvVarSource",
    "FaultRecord",
    "FetchProgress",
    "FrontendScaling",
    "GroupPlacement",
    "KeySelector",
    "KvNetwork",
    "KvPath",
    "Mode",
    "ModelCache",
    "ModelDeployment",
    "ModelDeploymentMeta",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "ModelSource",
    "NVLinkDomainStatus",
    "ObjectFieldSelector",
    "ObjectMeta",
    "Parallelism",
    "PlacementPolicy",
    "PlanPrediction",
    "PlanSystem",
    "PlannedRole",
    "Profile",
    "ProfileStatus",
    "Quantity",
    "RatioPolicy",
    "ResourceFieldSelector",
    "Resources",
    "Role",
    "RoleBounds",
    "RoleFailures",
    "RoleName",
    "RoleStatus",
    "RouterMode",
    "Runtime",
    "ScalingDecision",
    "Scheduling",
    "Serving",
    "SpeculativeDecoding",
    "StagedWeights",
    "Toleration",
    "Topology",
    "UnitStatus",
    "WeightsCacheStatus",
    "engine_args_bytes",
    "violations",
]
