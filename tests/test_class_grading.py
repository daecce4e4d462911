"""A whole class, autograded (instructor guide section 4).

A throwaway course is built from the real solutions/ and nbgrader_config.py, and a class
submits assignments 01 and 02: a full solution, a blank notebook, a partial one, one
submission per catalogued mistake, and hostile submissions. `make grade`'s code path
grades them; every student's exact score is asserted, a second run changes nothing, and
the report names the submission whose kernel died.

Mistake submissions fill every other answer cell with a catalogued correct alternative
(self-contained code), so a mistake costs exactly the points of its own exercise.
"""

from __future__ import annotations

import csv
import inspect
import re
import shutil
from pathlib import Path

import nbformat
import pytest

import catalog
from course_tools import answer_cells, make_course, release_path, run_course, test_cells
from test_grading import solved_submission, submit

pytestmark = pytest.mark.grading

AIDS = ["01_dot_product_attention", "02_masking"]
CELL_TIMEOUT = "20"
PRELUDE = "import math\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\n"


def points_by_exercise(aid: str) -> dict[str, float]:
    nb = nbformat.read(release_path(aid), as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"][5:]: float(c.metadata["nbgrader"]["points"])
        for c in test_cells(nb)
    }


def as_answer(entry: catalog.Entry) -> str:
    """Catalog code as a student's answer cell: imports, module helpers, the function
    renamed to the exercise's name."""
    module = inspect.getmodule(entry.impl)
    helpers = [
        inspect.getsource(obj)
        for name, obj in vars(module).items()
        if name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == module.__name__
    ]
    src = inspect.getsource(entry.impl)
    src = re.sub(r"^@.*\n", "", src, flags=re.MULTILINE)
    src = re.sub(rf"def {entry.name}\(", f"def {entry.exercise}(", src, count=1)
    return PRELUDE + "\n".join(helpers) + "\n" + src


def alternatives_submission(aid: str, wrong: catalog.Entry | None = None):
    nb = nbformat.read(release_path(aid), as_version=4)
    for gid, cell in answer_cells(nb).items():
        alt = next(e for e in catalog.ALTERNATIVES if e.exercise == gid)
        cell.source = as_answer(wrong if wrong is not None and wrong.exercise == gid else alt)
    return nb


def insert_after_first_test(nb, source: str):
    i = next(i for i, c in enumerate(nb.cells) if c in test_cells(nb))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


def class_roster(tmp: Path):
    """Submit the class; return {(student, aid): expected automatic score}."""
    course = make_course(tmp / "course", AIDS)
    expected = {}
    for aid in AIDS:
        pts = points_by_exercise(aid)
        total = sum(pts.values())
        exercises = list(pts)
        first = exercises[0]

        def add(student, nb, score, aid=aid):
            submit(course, student, aid, nb)
            expected[(student, aid)] = score

        add("full", solved_submission(aid), total)
        add("blank", nbformat.read(release_path(aid), as_version=4), 0.0)
        partial = nbformat.read(release_path(aid), as_version=4)
        solved = answer_cells(solved_submission(aid))
        answer_cells(partial)[first].source = solved[first].source
        add("partial", partial, pts[first])
        for entry in [e for e in catalog.MISTAKES if e.exercise in pts]:
            add(
                f"mistake-{entry.name}",
                alternatives_submission(aid, entry),
                total - pts[entry.exercise],
            )

        wrong = next(e for e in catalog.MISTAKES if e.exercise == first)
        add(
            "hostile-loop",
            insert_after_first_test(solved_submission(aid), "while True:\n    pass"),
            total,
        )
        add(
            "hostile-exit",
            insert_after_first_test(solved_submission(aid), "import os\nos._exit(1)"),
            total,
        )
        add(
            "hostile-sysexit",
            insert_after_first_test(solved_submission(aid), "import sys\nsys.exit(3)"),
            total,
        )
        add(
            "hostile-spam",
            insert_after_first_test(
                solved_submission(aid), "for i in range(300_000):\n    print('spam', i)"
            ),
            total,
        )
        edited = alternatives_submission(aid, wrong)
        next(c for c in test_cells(edited)).source = "pass  # my test now"
        add("hostile-edited-test", edited, total - pts[first])
        deleted = alternatives_submission(aid, wrong)
        deleted.cells.remove(next(c for c in test_cells(deleted)))
        add("hostile-deleted-test", deleted, total - pts[first])
        patched = alternatives_submission(aid, wrong)
        i = patched.cells.index(next(c for c in test_cells(patched)))
        patched.cells.insert(
            i,
            nbformat.v4.new_code_cell(
                "import attention_ref.checks\n"
                "attention_ref.checks.check = lambda *args, **kwargs: None"
            ),
        )
        add("hostile-patched-checker", patched, total - pts[first])
        calls_ref = solved_submission(aid)
        last = exercises[-1]
        answer_cells(calls_ref)[last].source = f"from attention_ref import {last}"
        add("hostile-calls-reference", calls_ref, total - pts[last])
    return course, expected


def read_scores(course: Path) -> dict[tuple[str, str], float]:
    with open(course / "grades.csv", newline="") as f:
        return {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}


# Grading the class is the most expensive thing in the suite, so it happens once per
# session: the class is submitted once, and each gradebook (sqlite here, PostgreSQL in
# tests/test_postgres.py) grades its own copy of the SAME submissions.
_SESSION: dict = {}


def submitted_class(tmp_path_factory) -> tuple[Path, dict]:
    """The class, submitted once per session: (pristine course folder, expected scores).
    Graders work on copies (grade_class), so this folder is never graded in."""
    if "class" not in _SESSION:
        _SESSION["class"] = class_roster(tmp_path_factory.mktemp("class"))
    return _SESSION["class"]


def grade_class(tmp_path_factory, gradebook: str = "sqlite", db_url: str | None = None):
    """Grade a copy of the submitted class with `make grade`'s code path, once per session
    per ``gradebook``; ``db_url`` (NBGRADER_DB_URL) picks the gradebook, None = sqlite.
    Returns (course copy, expected scores, the grading process)."""
    if gradebook not in _SESSION:
        pristine, expected = submitted_class(tmp_path_factory)
        course = tmp_path_factory.mktemp(f"graded-{gradebook}") / "course"
        shutil.copytree(pristine, course)
        env = {"NBGRADER_CELL_TIMEOUT": CELL_TIMEOUT}
        if db_url is not None:
            env["NBGRADER_DB_URL"] = db_url
        _SESSION[gradebook] = (course, expected, run_course(course, "grade", env_extra=env))
    return _SESSION[gradebook]


def sqlite_graded_class(tmp_path_factory):
    """The class graded into the default sqlite gradebook: (course, expected, first run,
    the scores it exported). Shared by this module and tests/test_postgres.py."""
    course, expected, first = grade_class(tmp_path_factory, "sqlite")
    if "sqlite-scores" not in _SESSION:
        _SESSION["sqlite-scores"] = read_scores(course)
    return course, expected, first, _SESSION["sqlite-scores"]


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    course, expected, first, scores = sqlite_graded_class(tmp_path_factory)
    second = run_course(course, "grade", env_extra={"NBGRADER_CELL_TIMEOUT": CELL_TIMEOUT})
    return course, expected, first, scores, second


def test_grading_the_class_succeeds(graded_class):
    _, _, first, _, _ = graded_class
    assert first.returncode == 0, first.stdout + first.stderr


def test_every_student_gets_exactly_the_expected_score(graded_class):
    _, expected, _, scores, _ = graded_class
    wrong = {k: (scores.get(k), v) for k, v in expected.items() if scores.get(k) != v}
    assert not wrong, f"(student, assignment): (got, expected) {wrong}"
    # The export lists every student for every assignment; one never submitted scores 0.
    unsubmitted = {k: s for k, s in scores.items() if k not in expected}
    assert all(s == 0.0 for s in unsubmitted.values()), unsubmitted
    students = {student for student, _ in expected}
    assert set(scores) == {(s, aid) for s in students for aid in AIDS}


def test_the_report_names_the_crashed_submission_and_why(graded_class):
    _, _, first, _, _ = graded_class
    out = first.stdout
    crash_lines = [line for line in out.splitlines() if "hostile-exit" in line]
    assert crash_lines and all("crashed (partial credit)" in line for line in crash_lines)
    assert "kernel died" in out
    assert re.search(r"hostile-loop.*\n.*per-cell time limit", out)


def test_a_cell_printing_megabytes_is_cut_down_in_the_graded_copy(graded_class):
    course = graded_class[0]
    for aid in AIDS:
        graded = course / "autograded" / "hostile-spam" / aid / f"{aid}.ipynb"
        assert graded.stat().st_size < 2_000_000


def test_grading_again_changes_nothing(graded_class):
    course, _, _, scores, second = graded_class
    assert second.returncode == 0, second.stdout + second.stderr
    assert read_scores(course) == scores


def test_regrading_with_force_gives_the_same_scores(graded_class, tmp_path):
    course, _, _, scores, _ = graded_class
    proc = run_course(
        course,
        "grade",
        "--force",
        "02_masking",
        "--csv",
        str(tmp_path / "again.csv"),
        env_extra={"NBGRADER_CELL_TIMEOUT": CELL_TIMEOUT},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "again.csv", newline="") as f:
        again = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}
    assert again == scores
