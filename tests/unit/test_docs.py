"""The docs describe code that exists: every module docs/architecture.md names is in the tree, and every
doc the README or docs/ link to is there."""

from __future__ import annotations

import re

from tests.conftest import REPO

SOURCES = [p.relative_to(REPO).as_posix() for p in REPO.rglob("*.py") if ".venv" not in p.parts]


def test_every_module_architecture_md_names_exists() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"[A-Za-z_][\w/]*\.py\b", doc))
    missing = sorted(n for n in named if not any(s == n or s.endswith("/" + n) for s in SOURCES))
    assert missing == []


def test_links_between_docs_resolve() -> None:
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]*)?\)", doc.read_text()):
            base = REPO if doc.name == "README.md" else doc.parent
            assert (base / target).exists(), f"{doc.name} links to {target}"
