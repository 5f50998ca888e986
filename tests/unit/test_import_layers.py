"""The gateway's folders are floors, and an import never runs back up one (docs/architecture.md, "Layers").

Read from the source (AST, every `import` and `from ... import`, lazy ones inside functions included): a
module of floor N may import modules of floors 0..N only. `backends/` never imports `gateway/` (the workers
run without it). An exception would be named below with its reason (none is left); a new upward import fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "config_errors", "config_gpus", "config_images", "config_replicas", "ui"),  # leaves: config parts, pages
    ("protocol",),  # wire types, EngineTarget, reasoning controls: what a request is
    ("config",),  # the YAML as typed models
    ("placement",),  # inventory + inspection -> plans
    ("admission",),  # per-deployment slots and queue
    ("lifecycle",),  # workers, the deployment registry, residency
    ("ops",),  # metrics, logs, auth, status report
    ("serving",),  # the request path
    ("translate",),  # Responses and Messages over the chat path
    ("cluster",),  # several hosts
    ("reload",),
    ("routes",),
    ("openapi",),
    ("app",),
    ("cli",),
    ("__main__",),
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}

EXCEPTIONS: dict[tuple[str, str], str] = {}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _floor_of(path: Path) -> str:
    return path.relative_to(REPO / "gateway").with_suffix("").parts[0]


def test_every_gateway_module_is_on_a_floor() -> None:
    names = {_floor_of(p) for p in (REPO / "gateway").rglob("*.py")} - {"__init__"}
    assert names <= set(FLOOR), f"place these in FLOORS: {sorted(names - set(FLOOR))}"


def test_no_import_runs_back_up_a_floor() -> None:
    upward = []
    for path in sorted((REPO / "gateway").rglob("*.py")):
        src = _floor_of(path)
        if src == "__init__":
            continue
        rel = str(path.relative_to(REPO))
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] != "gateway" or len(parts) < 2 or parts[1] == src:
                continue
            if FLOOR[parts[1]] > FLOOR[src] and (rel, module) not in EXCEPTIONS:
                upward.append(f"{rel}:{line} imports {module} ({src} is below {parts[1]})")
    assert not upward, "\n".join(upward)


def test_the_exceptions_still_exist() -> None:
    """A mended exception is taken off the list, so the list says what is left."""
    for rel, module in EXCEPTIONS:
        assert module in {m for _, m in _imports(REPO / rel)}, f"{rel} no longer imports {module}: drop it"


def test_backends_never_import_the_gateway() -> None:
    offending = [f"{p.relative_to(REPO)}:{line} {m}" for p in sorted((REPO / "backends").rglob("*.py"))
                 for line, m in _imports(p) if m == "gateway" or m.startswith("gateway.")]  # fmt: skip
    assert not offending, offending
