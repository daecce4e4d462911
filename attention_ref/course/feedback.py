"""What a student's feedback shows: hidden tests ran, and their points; never their code.

nbgrader's ``generate_feedback`` renders the graded notebook, in which every test cell
holds its hidden tests (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) as they
ran. :class:`HideHiddenTests`, first among nbgrader's feedback preprocessors (after only
the page's own, attention_ref/course/inert.py; nbgrader_config.py), replaces each hidden
block by one line that says hidden tests ran there, replaces the traceback of a test
cell's error by the error itself (a traceback quotes the lines it passed through), and
removes every line of hidden-test code that a cell's output repeats word for word. The
cell's points are shown as before.

What a student still learns: that hidden tests ran in that cell, whether the cell passed,
its points, and the check's feedback message (which names the exercise's mistake and the
input shapes it failed on, never the test's code). A submission that records the code
it is run with (IPython's hooks see each cell before it runs) and prints it back encoded
is not caught by the line filter: grade the written answers of such a notebook by hand.

This module imports nothing from the course package (nbgrader_config.py loads it by path).
"""

from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n.*?### END HIDDEN TESTS\n?", re.S)
PLACEHOLDER = "# [hidden tests ran here: their code is not shown; see the points above]\n"


def hidden_lines(source: str) -> set[str]:
    """The substantial lines of code inside the hidden blocks of ``source``."""
    lines = set()
    for block in HIDDEN.findall(source):
        for line in block.splitlines():
            line = line.strip()
            if len(line) >= 8 and not line.startswith("###"):
                lines.add(line)
    return lines


def hide(source: str) -> str:
    """``source`` with each hidden block replaced by :data:`PLACEHOLDER`."""
    return HIDDEN.sub(PLACEHOLDER, source)


class HideHiddenTests(Preprocessor):
    """Remove the code of hidden tests, and whatever repeats it, from a notebook."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default

    def preprocess(self, nb, resources):
        secret: set[str] = set()
        for cell in nb.cells:
            if cell.cell_type == "code":
                secret |= hidden_lines(cell.source)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            had_hidden = bool(HIDDEN.search(cell.source))
            cell.source = hide(cell.source)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and had_hidden:
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
                _scrub(out, secret)
        return nb, resources


def _scrub(out, secret: set[str]) -> None:
    def clean(text: str) -> str:
        kept = [ln for ln in text.splitlines(True) if not any(s in ln for s in secret)]
        return "".join(kept)

    if not secret:
        return
    if "text" in out:
        out["text"] = clean(out["text"] if isinstance(out["text"], str) else "".join(out["text"]))
    for key, value in list(out.get("data", {}).items()):
        if key.startswith("text/") and isinstance(value, str | list):
            out["data"][key] = clean(value if isinstance(value, str) else "".join(value))
    if "traceback" in out:
        out["traceback"] = [clean(t) for t in out["traceback"]]
