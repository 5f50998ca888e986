"""The docs describe code that exists and stand on their own: docs/architecture.md names every top-level module
of gateway/ and backends/ and no module that is not there, the README stays a front door (at most 300 lines),
and every relative link in the README and docs/ reaches a file (and a heading, when it names one)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("gateway", "backends")
README_MAX_LINES = 300
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MODULE_PATH = re.compile(r"(?<![\w./])(?:gateway|backends)/[\w/]*(?:\.py\b|/)|(?<![\w./])(?:gateway|backends)/\w+")
BARE_MODULE = re.compile(r"(?<![\w/])[A-Za-z_]\w*\.py\b")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"<(?:img|a)\b[^>]*\b(?:src|href)=\"([^\"]+)\"")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


# ---- docs/architecture.md against the tree ----------------------------------------------------------------


def top_level_modules(root: Path) -> set[str]:
    """Every module and package directly under gateway/ and backends/, as `gateway/x.py` or `gateway/pkg/`."""
    found: set[str] = set()
    for package in PACKAGES:
        for entry in (root / package).iterdir():
            if entry.is_file() and entry.suffix == ".py" and entry.name != "__init__.py":
                found.add(f"{package}/{entry.name}")
            elif entry.is_dir() and (entry / "__init__.py").exists():
                found.add(f"{package}/{entry.name}/")
    return found


def named_module_paths(doc: str) -> set[str]:
    """The gateway/... and backends/... paths a doc names (`gateway/service.py`, `backends/llamacpp/`)."""
    return {m.rstrip("/") + ("/" if m.endswith("/") else "") for m in MODULE_PATH.findall(doc)}


def architecture_problems(doc: str, root: Path) -> list[str]:
    """What is wrong between the doc and the tree at `root`, each a line naming the module and what to do."""
    sources = [p.relative_to(root).as_posix() for p in root.rglob("*.py") if ".venv" not in p.parts]
    named = named_module_paths(doc)
    problems = [
        f"names {path}, which does not exist: fix or drop it"
        for path in sorted(named)
        if not (root / path).exists() and not (root / (path.rstrip("/") + ".py")).exists()
    ]
    bare = set(BARE_MODULE.findall(doc)) - {Path(p).name for p in named}
    problems += [
        f"names {name}, which is no module in the tree: fix or drop it"
        for name in sorted(bare)
        if not any(s == name or s.endswith("/" + name) for s in sources)
    ]
    mentioned = {p for p in named if (root / p.rstrip("/")).exists()}
    problems += [
        f"does not name {module}: add it to the Shape tree with what it holds"
        for module in sorted(top_level_modules(root))
        if module not in mentioned and module.rstrip("/") not in mentioned
    ]
    return problems


def test_architecture_md_names_every_top_level_module_and_only_modules_that_exist() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    problems = architecture_problems(doc, REPO)
    assert problems == [], "docs/architecture.md:\n  " + "\n  ".join(problems)


def test_architecture_check_reports_a_missing_and_a_stale_module(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "gateway" / "service.py").write_text("")
    (tmp_path / "gateway" / "lifecycle.py").write_text("")
    (tmp_path / "backends" / "llamacpp").mkdir()
    (tmp_path / "backends" / "llamacpp" / "__init__.py").write_text("")
    doc = "gateway/service.py calls backends/llamacpp/ and gateway/lifecycle/supervisor.py; see worker.py"
    assert architecture_problems(doc, tmp_path) == [
        "names gateway/lifecycle/supervisor.py, which does not exist: fix or drop it",
        "names worker.py, which is no module in the tree: fix or drop it",
        "does not name gateway/lifecycle.py: add it to the Shape tree with what it holds",
    ]


# ---- the README is a front door ---------------------------------------------------------------------------


def test_readme_is_at_most_300_lines() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail into a page of docs/"


def test_readme_starts_with_make_run_and_make_test() -> None:
    """.ci/run and a new reader both rely on these two being the first set-up commands."""
    readme = (REPO / "README.md").read_text()
    first_block = FENCE.search(readme)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(0).splitlines()[1:-1]]
    assert commands == ["make run", "make test"]


def test_ci_runs_make_test_and_make_test_slow_which_split_the_suite_by_the_slow_mark() -> None:
    """`make test` leaves the `slow` suites to `make test-slow` and CI runs both: no test but the GPU ones is
    left out of CI (docs/testing.md)."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci and "make test-slow" in ci
    makefile = (REPO / "Makefile").read_text()
    marks = dict(re.findall(r'^(test|test-slow):.*\n\t.*?-m "([^"]+)"', makefile, re.MULTILINE))
    assert marks == {"test": "not gpu and not slow", "test-slow": "slow and not gpu"}


# ---- links --------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): inline markup dropped, lower case, punctuation removed,
    each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = "".join(
        c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN" or unicodedata.category(c) == "Mn"
    )
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a Markdown text; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(doc: Path, root: Path = REPO) -> list[str]:
    """Each relative link of `doc` (outside code) whose file, or whose heading in a Markdown file, is missing."""
    text = doc.read_text()
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    problems: list[str] = []
    for target in [*LINK.findall(prose), *HTML_REF.findall(prose)]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            problems.append(f"{target}: no heading #{anchor} in {path.relative_to(root)}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_a_file_and_its_heading(doc: Path) -> None:
    problems = link_problems(doc)
    assert problems == [], f"{doc.relative_to(REPO)} links to:\n  " + "\n  ".join(problems)


def test_link_check_reports_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# The `b` page (B)\n\n## Same\n\n## Same\n")
    a = tmp_path / "a.md"
    a.write_text(
        "[ok](b.md#the-b-page-b) [dup](b.md#same-1) [gone](c.md) [bad](b.md#nope) [web](https://x.org/y)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert link_problems(a, tmp_path) == ["c.md: no such file", "b.md#nope: no heading #nope in b.md"]


def test_every_doc_is_listed_in_the_docs_index() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert sorted(pages - listed) == [], "docs/index.md does not list these pages"


def test_every_doc_the_code_cites_exists() -> None:
    """Background facts the code cites (`docs/hardware.md`, ...) live in the repository, not only in a comment."""
    cited = {
        (path.relative_to(REPO).as_posix(), doc)
        for folder in ("gateway", "backends", "bench", "configs", "tests")
        for path in (REPO / folder).rglob("*")
        if path.is_file() and path.suffix in {".py", ".yaml", ".js", ".sh", ".html"} and ".venv" not in path.parts
        for doc in re.findall(r"\bdocs/[\w-]+\.md\b", path.read_text(errors="replace"))
    }
    cited |= {("Makefile", doc) for doc in re.findall(r"\bdocs/[\w-]+\.md\b", (REPO / "Makefile").read_text())}
    missing = sorted(f"{source} cites {doc}" for source, doc in cited if not (REPO / doc).exists())
    assert missing == [], "\n".join(missing)
