"""The documentation against the tree it describes: README.md and docs/*.md name only paths, modules
and anchors that exist, the README stays a front page whose first lines are the two commands for a
fresh machine, and CI (.ci/run) runs exactly the README's test command."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.project

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "benchmarks" / "README.md"]
README_MAX_LINES = 200
INSTALL_COMMAND = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/tflaunch --local 2"

# A path into the repository: one of its top-level folders, then anything a path may hold. It must
# not continue a longer word or path (a URL, /tmp/x/docs/...).
PATH = re.compile(r"(?<![\w./~$-])((?:launcher|trainer|tests|benchmarks|scripts|clusters|docs|\.ci)/[\w./-]*)")
MODULE = re.compile(r"(?<![\w./-])(launcher(?:\.[A-Za-z_]\w*)+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def prose_and_code(text: str) -> tuple[list[str], list[str]]:
    """(lines outside fenced code blocks, lines inside them)."""
    prose, code, inside = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def paths_named(text: str) -> set[str]:
    return {match.rstrip(".,;:") for match in PATH.findall(text)}


def module_exists(dotted: str) -> bool:
    """Whether ``launcher.a.b`` is a module, or ``launcher.a.b.Name`` a name defined in module a.b."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not source.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        # Defined at the top level of that module (a class, a function, a constant, an import).
        defined = re.compile(rf"^(?:class|def)\s+{rest[0]}\b|^{rest[0]}\s*[:=]|^from .* import .*\b{rest[0]}\b", re.M)
        return bool(defined.search(source.read_text()))
    return False


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = prose_and_code(page.read_text())
    found: set[str] = set()
    for line in prose:
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            base = slug(heading.group(1))
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_path_a_page_names_exists(page):
    missing = sorted(p for p in paths_named(page.read_text()) if not (ROOT / p).exists())
    assert not missing, f"{name(page)} names paths that do not exist: {', '.join(missing)}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_launcher_module_a_page_names_exists(page):
    missing = sorted(m for m in set(MODULE.findall(page.read_text())) if not module_exists(m))
    assert not missing, f"{name(page)} names modules or names that do not exist: {', '.join(missing)}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves_with_its_anchor(page):
    prose, _ = prose_and_code(page.read_text())
    broken = []
    for target in LINK.findall("\n".join(prose)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{name(page)}: broken links: {'; '.join(broken)}"


def test_the_architecture_tree_names_only_modules_that_exist():
    _, code = prose_and_code((ROOT / "docs" / "architecture.md").read_text())
    package, missing = None, []
    launcher_package = None  # the package a nested one (four spaces in) is under
    for line in code:
        top = re.match(r"^(\w+)/\s*(.*)$", line)
        sub = re.match(r"^  (\w+)/\s+(.*)$", line)
        nested = re.match(r"^    (\w+)/\s+(.*)$", line)
        if top:
            package = ROOT / top.group(1)
            listed = top.group(2) if top.group(1) == "launcher" else ""
        elif sub:
            package = launcher_package = ROOT / "launcher" / sub.group(1)
            listed = sub.group(2)
        elif nested and launcher_package is not None:
            package = launcher_package / nested.group(1)
            listed = nested.group(2)
        else:
            listed = line  # a continuation line, or the top package's own modules
        for module in re.findall(r"\b([\w]+\.py)\b", listed):
            if package is not None and not (package / module).is_file():
                missing.append(str((package / module).relative_to(ROOT)))
    assert not missing, f"docs/architecture.md's tree names modules that do not exist: {', '.join(missing)}"


def test_pages_hold_no_benchmark_tables():
    # Benchmark figures live in benchmarks/README.md alone; the other pages link to it.
    offenders = [name(page) for page in [README, *DOCS]
                 if re.search(r"^\|[^\n]*\bbaseline\b[^\n]*\|\s*$", page.read_text(), re.M | re.I)]
    assert not offenders, f"benchmark tables outside benchmarks/README.md: {', '.join(offenders)}"


def test_readme_is_a_front_page_of_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"


def readme_head() -> list[tuple[str, str]]:
    """The README's blocks (kind, text) up to its first section heading."""
    blocks: list[tuple[str, str]] = []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            break
        if not line.strip():
            i += 1
        elif FENCE.match(line):
            end = next(j for j in range(i + 1, len(lines)) if FENCE.match(lines[j]))
            blocks.append((f"code:{line.strip()[3:]}", "\n".join(lines[i + 1:end])))
            i = end + 1
        else:
            start = i
            while i < len(lines) and lines[i].strip() and not FENCE.match(lines[i]):
                i += 1
            blocks.append(("text", " ".join(lines[start:i])))
    return blocks


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?:])\s+(?=[A-Z])", text.strip()) if s]


def readme_commands() -> tuple[str, str]:
    head = readme_head()
    return head[3][1], head[5][1]


def test_readme_starts_with_title_sentence_and_the_two_commands():
    head = readme_head()
    kinds = [kind for kind, _ in head]
    assert kinds == ["text", "text", "text", "code:sh", "text", "code:sh"], (
        f"README.md before its first section must be: the title, one or two sentences, then a sentence "
        f"and a sh block twice; it is {kinds}")
    title, intro = head[0][1], head[1][1]
    assert title == "# tflaunch", f"README.md's first line is {title!r}; expected '# tflaunch'"
    assert 1 <= len(sentences(intro)) <= 2, f"README.md's introduction has {len(sentences(intro))} sentences"
    for _, text in (head[2], head[4]):
        assert len(sentences(text)) == 1 and text.rstrip().endswith(":"), (
            f"each command is introduced by one sentence ending in ':'; got {text!r}")
    install, test = readme_commands()
    assert install == INSTALL_COMMAND
    assert "\n" not in test and test.endswith(".venv/bin/python tests/suite.py")
    apt = shlex.split(test.split("&&")[1])
    assert apt[:3] == ["apt-get", "install", "-y"] and "strace" in apt, f"apt-get line: {apt}"


def test_ci_runs_exactly_the_readmes_test_command():
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run is not executable"
    _, test = readme_commands()
    run = [line.strip() for line in ci.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    # Only shell settings and the change to the repository root may stand beside the command.
    others = [line for line in run if line != test]
    assert test in run, f".ci/run does not run the README's test command:\n{test}"
    assert all(line == "set -euo pipefail" or line.startswith("cd ") for line in others), (
        f".ci/run runs more than the README's test command: {others}")


def test_the_testing_page_shows_the_readmes_test_command():
    _, test = readme_commands()
    page = (ROOT / "docs" / "testing.md").read_text()
    blocks = [block.strip() for block in page.split("```sh")[1:2]]
    assert blocks and blocks[0].split("```")[0].strip() == test, "docs/testing.md's first command is not the README's"
