"""Build solution notebooks with correct nbgrader metadata (for course authors).

Learners never need this module. Authors can write a notebook in JupyterLab with the
nbgrader "Create Assignment" toolbar, or build it from Python with these helpers, which
produce the metadata the course's tests expect (schema 3, ``grade_id`` = the exercise id
for answer cells and ``test_<id>`` for test cells, explicit points, no outputs)::

    from attention_ref.course import authoring as A
    cells = [A.md("# Title"), A.answer("sdpa", code), A.tests("sdpa", points=3),
             A.training("result = train(model, loss_fn, batches, steps=500)")]
    A.write(A.notebook(cells), "solutions/01_x/01_x.ipynb")
"""

from __future__ import annotations

import hashlib
import os
import re

import nbformat

_ID = re.compile(r"^[a-zA-Z0-9_-]+$")

# The imports come after the visible self-check on purpose (E402): the checker is reloaded
# from disk after the learner's code has run.
HIDDEN_CHECK = """### BEGIN HIDDEN TESTS
# Graded run: a fresh copy of the checker is loaded from disk (whatever the notebook
# did to the one in memory) and run on other inputs.
import sys as _sys  # noqa: E402

for _m in [m for m in _sys.modules if m.split(".")[0] == "attention_ref"]:
    del _sys.modules[_m]
from attention_ref.checks import check as _fresh_check  # noqa: E402

_fresh_check("{id}", {name}, seed={seed}, thorough=True)
### END HIDDEN TESTS"""


def _meta(grade_id: str, *, grade: bool, solution: bool, locked: bool, points=None) -> dict:
    if not _ID.match(grade_id):
        raise ValueError(f"grade_id must match [a-zA-Z0-9_-]+; got {grade_id!r}")
    m = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def md(text: str, *, grade_id: str | None = None) -> nbformat.NotebookNode:
    """A markdown cell; with ``grade_id`` it is locked (read-only for the learner)."""
    meta = _meta(grade_id, grade=False, solution=False, locked=True) if grade_id else {}
    return nbformat.v4.new_markdown_cell(text.strip("\n"), metadata=meta)


def code(text: str) -> nbformat.NotebookNode:
    """An ordinary code cell (demonstrations, figures)."""
    return nbformat.v4.new_code_cell(text.strip("\n"))


def training(text: str) -> nbformat.NotebookNode:
    """A code cell that trains a model: tagged ``training``, so the grader gives it the
    long time limit (``NBGRADER_TRAINING_TIMEOUT``) instead of the short one of every
    other cell. Under autograde, :func:`attention_ref.training.train` runs only a few
    steps in it; claims about the trained model are written
    ``assert GRADING or accuracy >= ...``."""
    return nbformat.v4.new_code_cell(text.strip("\n"), metadata={"tags": ["training"]})


def answer(exercise_id: str, text: str) -> nbformat.NotebookNode:
    """An autograded answer cell; the solution sits between the SOLUTION markers."""
    if "### BEGIN SOLUTION" not in text:
        raise ValueError(f"answer cell {exercise_id!r} has no ### BEGIN SOLUTION marker")
    return nbformat.v4.new_code_cell(
        text.strip("\n"), metadata=_meta(exercise_id, grade=False, solution=True, locked=False)
    )


def tests(
    exercise_id: str,
    *,
    points: int,
    name: str | None = None,
    seed: int = 2024,
    extra_hidden: str = "",
) -> nbformat.NotebookNode:
    """A locked test cell worth ``points``: a visible self-check and hidden graded tests."""
    name = name or exercise_id
    visible = (
        f"# Self-check for {exercise_id} ({points} points). Run it after your answer cell.\n"
        "from attention_ref.checks import check\n\n"
        f'check("{exercise_id}", {name})\n'
    )
    hidden = HIDDEN_CHECK.format(id=exercise_id, name=name, seed=seed)
    if extra_hidden:
        hidden = hidden.replace(
            "### END HIDDEN TESTS", extra_hidden.strip("\n") + "\n### END HIDDEN TESTS"
        )
    return nbformat.v4.new_code_cell(
        visible + hidden,
        metadata=_meta(
            f"test_{exercise_id}", grade=True, solution=False, locked=True, points=points
        ),
    )


def written(grade_id: str, model_answer: str, mark_scheme: str, *, points: int):
    """A manually graded markdown answer cell; the model answer and mark scheme are
    replaced by "YOUR ANSWER HERE" in the student version."""
    text = f"{model_answer.strip()}\n\n**Mark scheme ({points} points)**\n\n{mark_scheme.strip()}"
    return nbformat.v4.new_markdown_cell(
        text, metadata=_meta(grade_id, grade=True, solution=True, locked=False, points=points)
    )


def notebook(cells: list) -> nbformat.NotebookNode:
    """A notebook with the course kernelspec and deterministic cell ids."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
            "name": "python3",
        },
        "language_info": {"name": "python"},
    }
    nb.cells = cells
    for i, cell in enumerate(cells):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        digest = hashlib.sha1(f"{i}:{gid}:{cell.source}".encode()).hexdigest()[:8]
        cell["id"] = gid or f"c{i:03d}-{digest}"
    return nb


def write(nb: nbformat.NotebookNode, path: str | os.PathLike) -> None:
    """Validate and write ``nb`` without outputs."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.validate(nb)
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    nbformat.write(nb, os.fspath(path))
