"""End-to-end fixtures: one local AI factory for the whole session, started and stopped by PID.

The suite uses its own run directory and ports (one lane of ports per pytest-xdist worker: see
tokenfab_factory.lanes), so a factory a user has up on the default ports is never touched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import profile
from e2e.helpers import install_crds, operator_up
from tokenfab_factory import lanes
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

ROOT = Path(__file__).resolve().parent.parent
# aiconfigurator plans are kept for the session, for `tokenfab plan` runs and the operator (spec.profile).
os.environ.setdefault(
    "TOKENFAB_PLAN_CACHE", os.path.join(tempfile.gettempdir(), f"tokenfab-plan-cache-{os.getpid()}")
)  # made on first use
E2E_PORT_BASE = lanes.port_base()
LIVENESS = E2E_PORT_BASE + 20


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # (the unit tests of e2e's own code, beside it, are marked `unit`: no factory)
        if Path(str(item.fspath)).is_relative_to(ROOT / "e2e") and not item.get_closest_marker("unit"):
            item.add_marker(pytest.mark.e2e)
    # Lanes take whole groups (a module, or a chain of live-fleet modules: pytest_xdist_make_scheduler) in
    # this order: the longest first, so that no lane is left with a long one at the end (e2e/profile.py).
    items.sort(key=lambda item: profile.rank(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The lanes' scheduler: xdist's by scope, with profile.group as the scope. (xdist_group markers do
    not group under pytest 9, whose node ids are no longer the attribute xdist's loadgroup rewrites.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return profile.group(nodeid)

    return ByGroup(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    profile.prioritize(item.nodeid)


pytest_runtest_logreport = profile.record
pytest_terminal_summary = profile.summary


@pytest.fixture(scope="session")
def factory(request: pytest.FixtureRequest) -> Iterator[Factory]:
    """The session's factory; its run directory (logs, the runner's state) is kept when a test failed,
    and removed when none did."""
    run_dir = Path(tempfile.mkdtemp(prefix="tokenfab-e2e-"))
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=E2E_PORT_BASE), say=print)
    f.up()
    try:
        install_crds(f)
        yield f
    finally:
        failed = request.session.testsfailed > 0
        f.down(purge=not failed)
        if failed:
            print(f"\nthe e2e factory's logs: {run_dir}")


@pytest.fixture(scope="session")
def operator(factory: Factory) -> Iterator[Factory]:
    """The tokenfab operator as a real process against the session's factory (stopped by PID)."""
    operator_up(factory, LIVENESS)
    yield factory
    factory.stop_extra("operator")
