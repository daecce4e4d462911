"""The maintainer's documents name files and modules that exist: README.md, docs/*.md and
the files a maintainer reads beside them (nbgrader_config.py, the Makefile, .ci/run). Every
path under one of the repository's folders (``NN`` stands for a notebook's number,
``NN_name`` for its folder), every path of a subpackage of attention_ref in backquotes
(`trust/trusted.py`), and every dotted name under ``attention_ref`` (a module, or a name
that module defines)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "nbgrader_config.py",
    ROOT / "Makefile",
    ROOT / ".ci" / "run",
]
FOLDERS = ("attention_ref", "tests", "tools", "solutions", "notebooks", "docs", ".ci")
# A path under a folder of the repository, in backquotes or not (never the tail of a longer
# path or of a URL).
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(f) for f in FOLDERS)})/[\w./-]*[\w/])")
# A file of one of attention_ref's subpackages, named from the package (`trust/trusted.py`).
SUBPACKAGES = ("checks", "course", "trust", "apps", "data", "plots")
SUBPATH = re.compile(rf"`((?:{'|'.join(SUBPACKAGES)})/[\w./-]*\.py)`")
MODULE = re.compile(r"(?<![\w./-])(attention_ref(?:\.\w+)+)")
# Names the documents use as placeholders: "exercise `foo` is `attention_ref.foo`".
PLACEHOLDERS = {"attention_ref.foo", "attention_ref.my_id"}


def _exists(path: str) -> bool:
    """Whether ``path`` exists, a placeholder (NN, NN_name) standing for any notebook."""
    pattern = path.replace("NN_name", "[0-9][0-9]_*").replace("NN", "[0-9][0-9]")
    return any(ROOT.glob(pattern)) if pattern != path else (ROOT / path).exists()


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _resolves(dotted: str) -> bool:
    """Whether ``attention_ref.a.b`` is a module, or a name its longest module prefix
    defines (a function, a class, an assignment, or a name the package exports), read from
    the source without importing it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_file(parts[:i])
        if path is None:
            continue
        if i == len(parts):
            return True
        name = re.escape(parts[i])
        defined = rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|\"{name}\""
        return re.search(defined, path.read_text(), re.MULTILINE) is not None
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_document_names_exists(doc: Path) -> None:
    text = doc.read_text()
    named = sorted(set(PATH.findall(text)))
    assert named, f"{doc.name} names no file of the repository: is the pattern still right?"
    missing = [p for p in named if not _exists(p.rstrip("/."))]
    missing += [p for p in sorted(set(SUBPATH.findall(text))) if not _exists(f"attention_ref/{p}")]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_a_document_names_exists(doc: Path) -> None:
    named = sorted(set(MODULE.findall(doc.read_text())) - PLACEHOLDERS)
    missing = [m for m in named if not _resolves(m)]
    assert not missing, f"{doc.name} names modules or objects that do not exist: {missing}"


def test_the_checks_catch_a_moved_module() -> None:
    """What the two tests above would say of the layout before attention_ref/trust/."""
    assert not _resolves("attention_ref.checks.checker")
    assert not _resolves("attention_ref.course.trusted.SourceTags")
    assert _resolves("attention_ref.trust.trusted.SourceTags")
    assert not _exists("attention_ref/course/sandbox.py")
    assert SUBPATH.findall("(`course/trusted.py`'s list)") == ["course/trusted.py"]
    assert PATH.findall("see https://example.org/docs/x and (attention_ref/trust/x.py)") == [
        "attention_ref/trust/x.py"
    ]
