"""The operator's shape, checked: sizes as a report with a wall far above it, a docstring opening every
module, and every package's docstring saying what lives there and what may import it. (The layers
themselves are import-linter's contracts in pyproject.toml, run by the test command.)

Files are cut by concept, not by count (docs/architecture.md; LWS and Grove keep 800-970-line controllers
whole): a file over REPORT_FILE_LINES or a function over REPORT_FUNCTION_LINES is listed in the report
(`pytest -s tests/test_shape.py`, and the suite's output), and only one past the wall fails."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = sorted((ROOT / "operator" / "tokenfab").rglob("*.py"))
# The end-to-end code under the same rules: the factory, the live fleet, the benchmarks and helpers (their
# tests, conftest and results aside).
E2E = sorted(
    p
    for p in (ROOT / "e2e").rglob("*.py")
    if not p.name.startswith("test_") and p.name != "conftest.py" and "results" not in p.parts
)
SOURCES = OPERATOR + E2E
REPORT_FUNCTION_LINES = 60
REPORT_FILE_LINES = 500
MAX_FUNCTION_LINES = 120
MAX_FILE_LINES = 1000


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function in the file."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
    ]


def test_the_sources_are_found():
    assert len(OPERATOR) > 40
    assert len(E2E) > 30


def test_the_size_report(record_property: Callable[[str, object], None]) -> None:
    """Files and functions past the report's sizes, largest first (a report: read it, cut by concept)."""
    files = sorted(((len(p.read_text().splitlines()), _name(p)) for p in SOURCES), reverse=True)
    big = [f"{name}: {n} lines" for n, name in files if n > REPORT_FILE_LINES]
    funcs = sorted(
        ((n, f"{_name(p)}:{line} {fn}") for p in SOURCES for fn, line, n in _functions(p)), reverse=True
    )
    long = [f"{where}: {n} lines" for n, where in funcs if n > REPORT_FUNCTION_LINES]
    head = f"shape report: {len(big)} files over {REPORT_FILE_LINES} lines"
    head += f", {len(long)} functions over {REPORT_FUNCTION_LINES}"
    record_property("shown", "\n".join([head, *(f"  {line}" for line in big + long)]))
    assert files[0][0] <= MAX_FILE_LINES, (
        f"{files[0][1]} has {files[0][0]} lines (the wall: {MAX_FILE_LINES})"
    )
    assert funcs[0][0] <= MAX_FUNCTION_LINES, (
        f"{funcs[0][1]}: {funcs[0][0]} lines (the wall: {MAX_FUNCTION_LINES})"
    )


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_every_module_opens_with_a_docstring(path: Path):
    assert ast.get_docstring(ast.parse(path.read_text())), f"{_name(path)} has no module docstring"


PACKAGES = [p for p in OPERATOR if p.name == "__init__.py"]


@pytest.mark.parametrize("path", PACKAGES, ids=_name)
def test_every_package_says_what_lives_there_and_who_may_import_it(path: Path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert len(doc) > 80, f"{_name(path)}: say what lives in the package"
    assert "import" in doc, f"{_name(path)}: say what may import the package (or what it may import)"


# Test modules named after a concept rather than one source module (each says which in its docstring).
CONCEPTS = {
    "tests/test_chart.py": "the Helm chart",
    "tests/test_checkov.py": "checkov over everything tokenfab puts in a cluster",
    "tests/test_dockerfiles.py": "the runtime images",
    "tests/test_shape.py": "the operator's shape",
    "tests/test_upstream_contract.py": "the contract with the pinned upstream packages",
    "tests/launcher/test_launcher.py": "the launcher package's plan and process parts",
    "tests/planning/test_builders.py": "the builders package",
    "tests/planning/test_drain.py": "drains and rollouts in the group planner",
    "tests/planning/test_prestage.py": "pre-staging weights",
    "tests/planning/test_retired.py": "roles that left the spec",
    "tests/planning/test_shared_cache.py": "model caches shared across deployments",
    "tests/planning/autoscaler/test_leading.py": "the leading policy",
}
TESTS = sorted(p for p in (ROOT / "tests").rglob("test_*.py"))


@pytest.mark.parametrize("path", TESTS, ids=_name)
def test_every_test_module_sits_beside_what_it_tests(path: Path):
    """tests/ mirrors operator/tokenfab: tests/<package>/test_<module>.py tests that module (or a concept
    listed in CONCEPTS)."""
    name = _name(path)
    source = ROOT / "operator" / "tokenfab" / path.relative_to(ROOT / "tests").parent / path.name[5:]
    assert source.exists() or name in CONCEPTS, f"{name}: no module {_name(source)}; name it after one"


def test_the_concepts_listed_exist():
    assert all((ROOT / name).exists() for name in CONCEPTS)
