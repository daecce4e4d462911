"""What a student's feedback shows: hidden tests ran, and their points; never their code.

nbgrader's ``generate_feedback`` renders the graded notebook, in which every test cell
holds its hidden tests (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) as they
ran. :class:`HideHiddenTests`, first among nbgrader's feedback preprocessors (after only
the page's own, attention_ref/trust/inert.py; nbgrader_config.py), replaces each hidden
block by one line that says hidden tests ran there, replaces the traceback of a test
cell's error by the error itself (a traceback quotes the lines it passed through), and
removes every line of hidden-test code that a cell's output repeats word for word. The
cell's points are shown as before.

Hidden-test markers count only in the instructor's own cells: the test cells (graded, no
solution) whose grade id is one of the test cells of the assignment's source notebook
(solutions/, which nbgrader names in the resources), and only the hidden lines of the
source's test cells are cut from outputs. A student's cell
holding its own ``### BEGIN HIDDEN TESTS`` line is shown as written: taken for a hidden
block, it would let the student choose which lines of an output are cut, and cut an HTML
output into a live ``onerror``. The page is made inert again after this
(:class:`attention_ref.trust.inert.Inert`, next in ``GenerateFeedback.preprocessors``),
whatever this removed. Without a source notebook (a notebook converted on its own), the
test cells are those that nbgrader's metadata marks as graded and not a solution.

What a student still learns: that hidden tests ran in that cell, whether the cell passed,
its points, and the check's feedback message (which names the exercise's mistake and the
input shapes it failed on, never the test's code). A submission that records the code
it is run with (IPython's hooks see each cell before it runs) and prints it back encoded
is not caught by the line filter: grade the written answers of such a notebook by hand.

This module imports nothing from the course package (nbgrader_config.py loads it by path).
"""

from __future__ import annotations

import re
from pathlib import Path

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


def is_test_cell(cell) -> bool:
    """Whether nbgrader's metadata marks ``cell`` as a test cell (graded, no solution)."""
    nbg = cell.get("metadata", {}).get("nbgrader") or {}
    return cell.get("cell_type") == "code" and bool(nbg.get("grade")) and not nbg.get("solution")


def instructor_blocks(nb) -> dict[str, set[str]]:
    """``{grade_id: {hidden block, ...}}`` of the test cells of ``nb``."""
    blocks: dict[str, set[str]] = {}
    for cell in nb.cells:
        if is_test_cell(cell):
            gid = cell.metadata["nbgrader"].get("grade_id", "")
            blocks.setdefault(gid, set()).update(HIDDEN.findall(cell.source))
    return blocks


class HideHiddenTests(Preprocessor):
    """Remove the code of hidden tests, and whatever repeats it, from a notebook: the
    hidden blocks of the instructor's test cells only (see the module's docstring)."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default

    def preprocess(self, nb, resources):
        source = self._source(resources)
        blocks = instructor_blocks(source if source is not None else nb)
        secret: set[str] = set()
        for found in blocks.values():
            for block in found:
                secret |= hidden_lines(block)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            gid = (cell.metadata.get("nbgrader") or {}).get("grade_id", "")
            had_hidden = is_test_cell(cell) and gid in blocks and bool(HIDDEN.search(cell.source))
            if had_hidden:
                cell.source = hide(cell.source)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and had_hidden:
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
                _scrub(out, secret)
        return nb, resources

    def _source(self, resources):
        """The assignment's source notebook (the instructor's), or None where the
        resources name none or it is absent."""
        info = (resources or {}).get("nbgrader") or {}
        assignment, notebook = info.get("assignment"), info.get("notebook")
        if not assignment or not notebook:
            return None
        import nbformat  # noqa: PLC0415
        from nbgrader.coursedir import CourseDirectory  # noqa: PLC0415

        course = CourseDirectory(config=self.config)
        folder = course.format_path(course.source_directory, ".", assignment)
        path = Path(folder) / f"{notebook}.ipynb"
        return nbformat.read(path, as_version=4) if path.is_file() else None


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
