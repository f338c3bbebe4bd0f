"""The observe phase reads what the view does not hold, and only that: a ComputeDomain's channel template
comes from the view where the templates are watched, from the API server where they are not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests import kube_objects
from tokenfab import observe
from tokenfab.fleet.view import TEMPLATE, ClusterView


class Kube:
    def __init__(self, exists: bool) -> None:
        self.exists = exists
        self.gets: list[str] = []

    def get(self, api: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.gets.append(f"{kind}/{name}")
        return {"metadata": {"name": name}} if self.exists else None


def test_a_watched_channel_template_is_read_from_the_view_not_the_api_server() -> None:
    view, kube = ClusterView(), Kube(exists=True)
    ctx: Any = SimpleNamespace(view=view, kube=kube)
    assert observe._template(ctx, "ml", "m-unit-0") is True  # not watched: asked
    assert kube.gets == ["ResourceClaimTemplate/m-unit-0"]
    view.replace(TEMPLATE, [], "ml")
    assert observe._template(ctx, "ml", "m-unit-0") is False  # watched: the view has none yet
    view.on_channel_template("ADDED", kube_objects.child(TEMPLATE, "m-unit-0", None))
    assert observe._template(ctx, "ml", "m-unit-0") is True
    assert kube.gets == ["ResourceClaimTemplate/m-unit-0"]  # nothing more was read
