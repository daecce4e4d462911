"""A whole class, autograded (instructor guide section 4).

A throwaway course is built from the real solutions/ and nbgrader_config.py, and a class
submits assignments 01 and 02: a full solution, a blank notebook, a partial one, the
catalogued mistakes, and hostile submissions (a loop at the top level of a cell, a function
that loops only under grading, a dead kernel, ..., and the attacks on the grader of
tests/hostile.py, whose failure tests/test_sandbox.py asserts). `make grade`'s code path grades them
with two workers; every student's exact score is asserted, a second run changes nothing,
a sequential forced regrade gives the same grades, no looping submission costs more than
60 s of time limits, and the report names the submission whose kernel died.

Mistake submissions: packed submission k has the k-th catalogued mistake of every exercise
that has one, and a catalogued correct alternative (self-contained code) in every other
answer cell; its expected score loses exactly the points of the exercises it got wrong.
The class holds the first two packed submissions and the last one, which has a mistake in
the exercise with the most mistakes only, so a mistake is also seen to cost nothing outside
its own exercise. That every catalogued mistake fails the visible and the hidden checks is
proven in-process by tests/test_catalog.py; here, that grading turns a failed check into
exactly the points of its exercise.
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
import hostile
from course_tools import answer_cells, make_course, release_path, run_course, test_cells
from test_grading import solved_submission, submit

# The whole class is graded in make test-later (CI); make test grades smaller classes
# (tests/test_grading.py, tests/test_postgres.py, tests/test_cluster.py).
pytestmark = [pytest.mark.grading, pytest.mark.later]

AIDS = ["01_dot_product_attention", "02_masking"]
HOSTILE_AID = AIDS[0]  # the assignment the notebook-independent hostile submissions use
# Short limits keep the hostile submissions cheap; the cells of a solution still fit (the
# slowest cell of 01 and 02, importing PyTorch, takes about 4 s on a loaded 2-core machine).
# A check's own limit on each call (2 s, 4 s in the graded run; a loaded machine stretches
# it to at most 4 times that, waiting for the code to get its CPU share) stops a looping
# answer before the cell's limit, however loaded the machine: the report then names the
# loop (infinite_loop) rather than only the cell's time limit.
LIMITS = {
    "NBGRADER_CELL_TIMEOUT": "12",
    "NBGRADER_TIMEOUT_AFTER": "6",
    "ATTENTION_REF_TIME_LIMIT": "2",
}
JOBS = "2"
# What one looping submission may cost in time limits (COURSE_DESIGN.md section 7).
LOOP_BUDGET_S = 60
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


def alternatives_submission(aid: str, *wrong: catalog.Entry):
    """Every answer cell a catalogued correct alternative, except the exercises of
    ``wrong`` (catalogued mistakes), which get those."""
    nb = nbformat.read(release_path(aid), as_version=4)
    mistakes = {e.exercise: e for e in wrong}
    for gid, cell in answer_cells(nb).items():
        alt = next(e for e in catalog.ALTERNATIVES if e.exercise == gid)
        cell.source = as_answer(mistakes.get(gid, alt))
    return nb


def packed_mistakes(exercises: list[str]) -> list[list[catalog.Entry]]:
    """Submission k gets the k-th mistake of each exercise that has one."""
    by_exercise = {e: [m for m in catalog.MISTAKES if m.exercise == e] for e in exercises}
    n = max(len(ms) for ms in by_exercise.values())
    return [[ms[k] for ms in by_exercise.values() if k < len(ms)] for k in range(n)]


# A correct function that loops forever only while nbgrader autogrades (it checks the
# variable nbgrader sets in the kernel): the self-check passes, the grade must not.
GRADING_LOOP = """
import os as _os

_solved_{name} = {name}


def {name}(*args, **kwargs):
    while _os.environ.get("NBGRADER_EXECUTION") == "autograde":
        pass
    return _solved_{name}(*args, **kwargs)
"""


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
        first, last = exercises[0], exercises[-1]

        def add(student, nb, score, aid=aid):
            submit(course, student, aid, nb)
            expected[(student, aid)] = score

        add("full", solved_submission(aid), total)
        add("blank", nbformat.read(release_path(aid), as_version=4), 0.0)
        partial = nbformat.read(release_path(aid), as_version=4)
        solved = answer_cells(solved_submission(aid))
        answer_cells(partial)[first].source = solved[first].source
        add("partial", partial, pts[first])
        packed = packed_mistakes(exercises)
        for k in sorted({0, 1, len(packed) - 1}):
            lost = sum(pts[e.exercise] for e in packed[k])
            add(f"mistakes-{k + 1}", alternatives_submission(aid, *packed[k]), total - lost)
        # The last exercise: no other exercise calls it (sdpa_np calls softmax_np).
        looping = solved_submission(aid)
        answer_cells(looping)[last].source += "\n" + GRADING_LOOP.format(name=last)
        add("hostile-grading-loop", looping, total - pts[last])

        calls_ref = solved_submission(aid)
        answer_cells(calls_ref)[last].source = f"from attention_ref import {last}"
        add("hostile-calls-reference", calls_ref, total - pts[last])
        if aid != HOSTILE_AID:
            continue
        # The attacks on the grader itself (tests/test_sandbox.py asserts they fail).
        for student, nb in hostile.attackers(course).items():
            add(student, nb, total)
        # What these do to the grader does not depend on the notebook: one assignment.
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
        # About 3.6 MB in lines of about 900 bytes: what is tested is the size of the
        # output, not the time limit (300,000 short prints ran past the 12 s limit on a
        # busy CI machine, and were counted as a submission stopped by a time limit).
        add(
            "hostile-spam",
            insert_after_first_test(
                solved_submission(aid), "for i in range(4_000):\n    print(f'spam {i} ' * 100)"
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
    return course, expected


def read_scores(course: Path, csv_name: str = "grades.csv") -> dict[tuple[str, str], float]:
    with open(course / csv_name, newline="") as f:
        return {  # a blank score (not graded) is None: never equal to an expected score
            (r["student_id"], r["assignment"]): float(r["score"]) if r["score"] else None
            for r in csv.DictReader(f)
        }


# Grading the class is the most expensive thing in the suite, so it happens once per
# session: the class is submitted once; the sqlite gradebook grades a copy of all of it,
# and PostgreSQL (tests/test_postgres.py) a copy of a few of its students on one
# assignment, enough to prove the two gradebooks agree.
_SESSION: dict = {}
#: Regraded one at a time to prove that two workers grade exactly as one does: a normal
#: class (a solution, a mistake, a blank) and a dead kernel. The two looping students are
#: left out: what a loop costs does not depend on the number of workers, and each would add
#: its time limits to this serial run.
SEQUENTIAL = (
    "full",
    "blank",
    "mistakes-1",
    "hostile-exit",
)


def submitted_class(tmp_path_factory) -> tuple[Path, dict]:
    """The class, submitted once per session: (pristine course folder, expected scores).
    Graders work on copies (grade_class), so this folder is never graded in."""
    if "class" not in _SESSION:
        _SESSION["class"] = class_roster(tmp_path_factory.mktemp("class"))
    return _SESSION["class"]


def keep_only(course: Path, students: tuple[str, ...], aids: tuple[str, ...] | None = None):
    """Delete every submission in ``course`` but those of ``students`` (to ``aids``)."""
    for folder in (course / "submitted").iterdir():
        if folder.name not in students:
            shutil.rmtree(folder)
        elif aids is not None:
            for sub in folder.iterdir():
                if sub.name not in aids:
                    shutil.rmtree(sub)


def grade_class(
    tmp_path_factory,
    gradebook: str = "sqlite",
    db_url: str | None = None,
    students: tuple[str, ...] | None = None,
    aids: tuple[str, ...] | None = None,
):
    """Grade a copy of the submitted class (or of ``students`` only, on ``aids`` only)
    with `make grade`'s code path and two workers, once per session per ``gradebook``;
    ``db_url`` (NBGRADER_DB_URL) picks the gradebook, None = sqlite.
    Returns (course copy, expected scores, the grading process)."""
    if gradebook not in _SESSION:
        pristine, expected = submitted_class(tmp_path_factory)
        course = tmp_path_factory.mktemp(f"graded-{gradebook}") / "course"
        shutil.copytree(pristine, course)
        if students is not None:
            keep_only(course, students, aids)
            expected = {
                k: v
                for k, v in expected.items()
                if k[0] in students and (aids is None or k[1] in aids)
            }
        env = {**LIMITS, **hostile.GRADER_ENV}  # the caps, and secrets to steal
        if db_url is not None:
            env["NBGRADER_DB_URL"] = db_url
        proc = run_course(course, "grade", "--jobs", JOBS, env_extra=env)
        _SESSION[gradebook] = (course, expected, proc)
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
    second = run_course(course, "grade", "--jobs", JOBS, env_extra=LIMITS)
    return course, expected, first, scores, second


def test_grading_the_class_succeeds(graded_class):
    _, _, first, _, _ = graded_class
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{JOBS} at a time" in first.stdout


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
    report = out[out.index("Grading report") :]
    crash_lines = [line for line in report.splitlines() if "hostile-exit" in line]
    assert crash_lines and all("crashed (partial credit)" in line for line in crash_lines)
    assert "kernel died" in report
    assert re.search(r"hostile-loop.*\n.*per-cell time limit", report)


def interrupted_cells(course: Path, student: str, aid: str) -> list[int]:
    """The time limits (s) of the cells grading interrupted in a submission."""
    nb = nbformat.read(course / "autograded" / student / aid / f"{aid}.ipynb", as_version=4)
    limits = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") == "CellTimeoutError":
                limits.append(int(re.search(r"within (\d+) s", out["evalue"]).group(1)))
    return limits


@pytest.mark.parametrize("student", ["hostile-loop", "hostile-grading-loop"])
def test_a_looping_submission_costs_at_most_a_minute_of_time_limits(graded_class, student):
    course, expected = graded_class[0], graded_class[1]
    for aid in [aid for aid in AIDS if (student, aid) in expected]:
        limits = interrupted_cells(course, student, aid)
        assert sum(limits) <= LOOP_BUDGET_S, (student, aid, limits)
        # A top-level loop is interrupted once, at the ordinary cell limit; the cells after
        # it (which do not loop) still ran: the expected score says they earned their marks.
        if student == "hostile-loop":
            assert limits == [int(LIMITS["NBGRADER_CELL_TIMEOUT"])], limits


def test_a_cell_printing_megabytes_is_cut_down_in_the_graded_copy(graded_class):
    course = graded_class[0]
    graded = course / "autograded" / "hostile-spam" / HOSTILE_AID / f"{HOSTILE_AID}.ipynb"
    assert graded.stat().st_size < 2_000_000


def test_grading_again_changes_nothing(graded_class):
    course, _, _, scores, second = graded_class
    assert second.returncode == 0, second.stdout + second.stderr
    assert read_scores(course) == scores


def test_a_sequential_forced_regrade_gives_the_same_scores(graded_class, tmp_path):
    """FORCE=1 and JOBS=1 on a copy of the graded class in which only the SEQUENTIAL
    students (a solution, a blank, a mistake, the dead kernel) still have
    submissions: graded again one at a time, they get exactly the grades the two workers
    gave them, and every other grade stays."""
    course, _, _, scores, _ = graded_class
    again = tmp_path / "course"
    shutil.copytree(course, again)
    keep_only(again, SEQUENTIAL)
    proc = run_course(
        again,
        "grade",
        "--force",
        "--jobs",
        "1",
        HOSTILE_AID,
        "--csv",
        "again.csv",
        env_extra=LIMITS,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 at a time" in proc.stdout
    regraded = re.findall(rf"\] {HOSTILE_AID} (\S+):", proc.stdout)
    assert sorted(regraded) == sorted(SEQUENTIAL)
    assert read_scores(again, "again.csv") == scores
