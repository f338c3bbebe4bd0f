#!/usr/bin/env bash
# The whole test suite: installs what it needs (see e2e/lib/bootstrap.sh), then runs the linters
# (ruff, mypy --strict, import-linter), the CRD freshness check, and pytest over the unit tests (tests/)
# and the end-to-end tests (e2e/, on a local AI factory the tests start and stop themselves).
# Extra arguments go to pytest, e.g. `e2e/test.sh -m "not e2e"` for the unit tests only.
# Modules run side by side in TOKENFAB_TEST_LANES lanes (default 3; pytest-xdist: a module whole on one
# lane, live fleets at most two at once, each lane with its own factory and ports: e2e/profile.py,
# tokenfab_factory/lanes.py); `-n 0` runs them one after another.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/bootstrap.sh
source "$here/lib/bootstrap.sh"
cd "$TOKENFAB_ROOT"

say "ruff"; ruff check operator tests testing e2e; ruff format --check operator tests testing e2e
say "mypy --strict"; mypy -p tokenfab -p tokenfab_factory -p e2e.fleet  # (packages: the fleet runner is imported as e2e.fleet)
say "import-linter"; lint-imports
say "CRDs are current"; tokenfab crds --check
say "pytest"
# The suite writes outside the checkout (temporary and cache directories): what `git status` shows is
# the same after it as before, or the run fails.
before="$(git status --porcelain 2>/dev/null || true)"
set +e
python -m pytest -n "${TOKENFAB_TEST_LANES:-3}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then say "pytest collected no tests"; fi
after="$(git status --porcelain 2>/dev/null || true)"
if [ "$before" != "$after" ]; then
  say "the test suite changed the checkout (git status before and after):"
  diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") || true
  if [ "$rc" -eq 0 ]; then rc=1; fi
fi
exit "$rc"
