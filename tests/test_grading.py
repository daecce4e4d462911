"""The autograder, end to end through `make grade`'s code path, on every assignment: the
solutions earn every automatic mark and the blank student notebooks earn none."""

from __future__ import annotations

import csv

import nbformat
import pytest
from nbgrader.api import Gradebook

from course_tools import (
    answer_cells,
    assignment_ids,
    auto_points,
    make_course,
    release_path,
    run_course,
    solution_path,
    strip_solution_markers,
)

pytestmark = pytest.mark.grading


def solved_submission(aid: str):
    """The student notebook with every answer cell filled in as the solution does."""
    nb = nbformat.read(release_path(aid), as_version=4)
    solved = answer_cells(nbformat.read(solution_path(aid), as_version=4))
    for gid, cell in answer_cells(nb).items():
        cell.source = strip_solution_markers(solved[gid].source)
    return nb


def submit(course, student: str, aid: str, nb) -> None:
    folder = course / "submitted" / student / aid
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{aid}.ipynb")


def code_scores(course, aid: str) -> dict[str, tuple[float, float]]:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        out = {}
        for sub in gb.assignment_submissions(aid):
            nb = gb.find_submission_notebook(aid, aid, sub.student.id)
            out[sub.student.id] = (nb.code_score, nb.max_code_score)
        return out


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("course"))
    for aid in assignment_ids():
        submit(course, "solution", aid, solved_submission(aid))
        submit(course, "blank", aid, nbformat.read(release_path(aid), as_version=4))
    # The application notebooks train a model in one cell: allow it far more than the
    # 120 s default per cell, so a slow machine cannot turn a solution into a zero.
    proc = run_course(course, "grade", env_extra={"NBGRADER_CELL_TIMEOUT": "900"})
    return course, proc


def test_make_grade_succeeds_and_exports_a_row_per_submission(graded_course):
    course, proc = graded_course
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["assignment"], r["student_id"]) for r in rows) == sorted(
        (aid, s) for aid in assignment_ids() for s in ("blank", "solution")
    )


@pytest.mark.parametrize("aid", assignment_ids())
def test_solution_earns_every_automatic_mark_and_blank_earns_none(graded_course, aid):
    course, _ = graded_course
    scores = code_scores(course, aid)
    total = auto_points(nbformat.read(solution_path(aid), as_version=4))
    assert scores["solution"] == (total, total)
    assert scores["blank"] == (0.0, total)
