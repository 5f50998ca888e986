"""The house rules the codebase keeps as it grows: small modules, functions a reader can hold in their head.

A function in gateway/ or backends/ longer than 60 lines needs its reason in a comment starting with
`# long:` before its first statement (a flat table of declarations, say); no module passes 500 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
SOURCES = sorted(p for root in ("gateway", "backends") for p in (REPO / root).rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            first_body = node.body[1] if len(node.body) > 1 else node.body[0]  # past a docstring
            head = lines[node.lineno - 1 : first_body.lineno]
            if length > MAX_FUNCTION_LINES and not any("# long:" in line for line in head):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_functions_stay_short_or_say_why(path: Path) -> None:
    assert _long_functions(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_modules_stay_under_500_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES
