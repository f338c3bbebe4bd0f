"""A whole ModelDeployment object: its names in the API, its metadata (whose name must suit the children
named after it), the spec and the status."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenfab.api.cel import rules_error
from tokenfab.api.models.spec import ModelDeploymentSpec
from tokenfab.api.models.status import ModelDeploymentStatus
from tokenfab.api.rules import name_errors

KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("mdep",)


class ObjectMeta(BaseModel):
    """The part of metadata tokenfab reads."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ModelDeploymentMeta(ObjectMeta):
    """Metadata of a ModelDeployment: its name must suit the children named after it."""

    @field_validator("name")
    @classmethod
    def _name_names_children(cls, name: str | None) -> str | None:
        # The API server checks every object's name (a DNS subdomain), then the CRD's NAME_RULE.
        texts = [] if name is None else name_errors(name)
        if texts:
            raise rules_error(texts)
        return name


class ModelDeployment(BaseModel):
    """A whole ModelDeployment object as read from YAML or the API server."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["tokenfab.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ModelDeployment"]
    metadata: ModelDeploymentMeta = Field(default_factory=ModelDeploymentMeta)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None
