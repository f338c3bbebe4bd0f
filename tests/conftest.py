"""Session-wide settings for the unit tests (the end-to-end tests' conftest sets the same)."""

from __future__ import annotations

import os
import tempfile

# aiconfigurator plans (about a minute each) are kept for the session and shared with every `tokenfab
# plan` and operator process the tests start (tokenfab.adapters.aic reads TOKENFAB_PLAN_CACHE).
os.environ.setdefault(
    "TOKENFAB_PLAN_CACHE", os.path.join(tempfile.gettempdir(), f"tokenfab-plan-cache-{os.getpid()}")
)  # made on first use
