"""The operator's shape, checked: no function in operator/ over 60 lines, no source file over 500 lines, a
docstring opening every module, and every package's docstring saying what lives there and what may import
it. (The layers themselves are import-linter's contracts in pyproject.toml, run by the test command.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "operator" / "tokenfab").rglob("*.py"))
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_sources_are_found():
    assert len(SOURCES) > 40


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_no_source_file_is_over_the_limit(path: Path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{_name(path)} has {lines} lines (at most {MAX_FILE_LINES})"


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_no_function_is_over_the_limit(path: Path):
    tree = ast.parse(path.read_text())
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_every_module_opens_with_a_docstring(path: Path):
    assert ast.get_docstring(ast.parse(path.read_text())), f"{_name(path)} has no module docstring"


PACKAGES = [p for p in SOURCES if p.name == "__init__.py"]


@pytest.mark.parametrize("path", PACKAGES, ids=_name)
def test_every_package_says_what_lives_there_and_who_may_import_it(path: Path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert len(doc) > 80, f"{_name(path)}: say what lives in the package"
    assert "import" in doc, f"{_name(path)}: say what may import the package (or what it may import)"
