"""The maintainer's documents name files that exist: every path in backquotes under one of
the repository's folders, in README.md and docs/*.md (``NN`` stands for a notebook's number,
``NN_name`` for its folder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FOLDERS = ("attention_ref", "tests", "tools", "solutions", "notebooks", "docs", ".ci")
PATH = re.compile(rf"`((?:{'|'.join(re.escape(f) for f in FOLDERS)})/[\w./-]*)`")


def _exists(path: str) -> bool:
    """Whether ``path`` exists, a placeholder (NN, NN_name) standing for any notebook."""
    pattern = path.replace("NN_name", "[0-9][0-9]_*").replace("NN", "[0-9][0-9]")
    return any(ROOT.glob(pattern)) if pattern != path else (ROOT / path).exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_document_names_exists(doc: Path) -> None:
    named = sorted(set(PATH.findall(doc.read_text())))
    assert named, f"{doc.name} names no file of the repository: is the pattern still right?"
    missing = [p for p in named if not _exists(p.rstrip("/."))]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"
