"""The autograder, end to end through `make grade`'s code path, on every assignment (make
test: the quick notebooks of conftest.py; make test-later: the others): the
solutions earn every automatic mark under the default time limits (training cells run a
token version of themselves under autograde), graded by two workers.

That a blank student notebook fails every graded test cell is proven for every assignment
by tests/test_notebooks.py (which executes them), and that failing test cells score 0 in
the gradebook by the blank student of tests/test_class_grading.py, so no blank notebook is
graded here."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

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


def graded_aids(session) -> list[str]:
    """The assignments whose test_solution_earns_every_automatic_mark this run selected
    (make test: the quick notebooks; make test-later: the others), or every one."""
    chosen = {
        item.callspec.params["aid"]
        for item in session.items
        if getattr(item, "originalname", None) == "test_solution_earns_every_automatic_mark"
    }
    return [aid for aid in assignment_ids() if aid in chosen] or assignment_ids()


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory, request):
    course = make_course(tmp_path_factory.mktemp("course"))
    aids = graded_aids(request.session)
    for aid in aids:
        submit(course, "solution", aid, solved_submission(aid))
    # The default limits (attention_ref/cell_limits.py): the solutions must fit them, as a
    # grader applies them, stretched by the load measured on the machine (conftest.py pins
    # the factor to 1 for the tests that count limits; this one grades as make grade does,
    # beside the other lane of make test).
    defaults = (
        "NBGRADER_CELL_TIMEOUT",
        "NBGRADER_TRAINING_TIMEOUT",
        "NBGRADER_TIMEOUT_AFTER",
        "ATTENTION_REF_LOAD_FACTOR",
    )
    proc = run_course(course, "grade", "--jobs", "2", env_extra=dict.fromkeys(defaults, ""))
    return course, proc, aids


def test_make_grade_succeeds_and_exports_a_row_per_submission(graded_course):
    course, proc, aids = graded_course
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["assignment"], r["student_id"]) for r in rows) == sorted(
        (aid, "solution") for aid in aids
    )
    # A correct submission meets no time limit, no cap, no dead kernel: no problem at all.
    n = len(aids)
    assert f"{n} submission(s) graded, 0 not graded, 0 with problems listed above" in proc.stdout
    # Nothing alarming on the instructor's console: no engine error (a warm-up sent to the
    # workers in a form Dask refuses logged two), no port taken by another grading.
    assert " ERROR " not in proc.stderr and "already in use" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("aid", assignment_ids())
def test_solution_earns_every_automatic_mark(graded_course, aid):
    course, _, _ = graded_course
    scores = code_scores(course, aid)
    total = auto_points(nbformat.read(solution_path(aid), as_version=4))
    assert scores["solution"] == (total, total)
    # And no cell failed, graded or not: the kernel's grading edition (no later notebook's
    # answers) still has everything the notebook's demonstrations use.
    graded = nbformat.read(course / "autograded" / "solution" / aid / f"{aid}.ipynb", 4)
    errors = [
        (i, o.ename, o.evalue[:200])
        for i, cell in enumerate(graded.cells)
        for o in cell.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors, errors


ENROL_PROBE = """
import json, sys
from pathlib import Path

from nbgrader.api import Gradebook

from attention_ref.course import grading

root = Path(sys.argv[1])


def probe(root, tasks, force, jobs):  # in place of the workers: who is in the gradebook?
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        seen = sorted(s.id for s in gb.students)
    (root / "seen.json").write_text(json.dumps({"students": seen, "tasks": len(tasks)}))
    return {t: grading.Outcome(t[1], t[0]) for t in tasks}


grading._grade_all = probe
sys.exit(grading.grade(root, []))
"""


def test_every_student_is_in_the_gradebook_before_the_workers_start(tmp_path):
    """Two workers grading a student's first two submissions would each add the student to
    the gradebook at once, and one failed (UNIQUE constraint failed: student.id): `make
    grade` adds every student first, one by one."""
    aids = ["01_dot_product_attention", "02_masking"]
    course = make_course(tmp_path / "course", aids)
    for student in ("ada", "grace"):
        for aid in aids:
            submit(course, student, aid, solved_submission(aid))
    env = {**os.environ, "ATTENTION_REF_SANDBOX": "off"}  # no kernel runs here
    env.pop("NBGRADER_DB_URL", None)
    proc = subprocess.run(
        [sys.executable, "-c", ENROL_PROBE, str(course)],
        cwd=course,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads((course / "seen.json").read_text())
    assert seen == {"students": ["ada", "grace"], "tasks": 4}


# ----------------------------------------------------------------------------- time limits
def test_cell_limits_fit_the_cell_and_shrink_after_a_timeout():
    from attention_ref.course.cell_limits import CellLimits

    limits = CellLimits(cell=30, training=300, after=10)
    plain = nbformat.v4.new_code_cell("x = 1")
    training = nbformat.v4.new_code_cell("train()", metadata={"tags": ["training"]})
    assert (limits(plain), limits(training)) == (30, 300)
    limits.timed_out(30)
    assert (limits(plain), limits(training)) == (10, 10)
    assert CellLimits(cell=5, training=300, after=10)(plain) == 5  # never longer than its own


def test_cell_limits_read_the_environment(monkeypatch):
    from attention_ref.course.cell_limits import CellLimits

    monkeypatch.setenv("NBGRADER_CELL_TIMEOUT", "45")
    monkeypatch.setenv("NBGRADER_TRAINING_TIMEOUT", "")  # blank: the default
    monkeypatch.delenv("NBGRADER_TIMEOUT_AFTER", raising=False)
    limits = CellLimits()
    assert (limits.cell, limits.training, limits.after) == (45, 300, 10)
    monkeypatch.setenv("NBGRADER_CELL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="NBGRADER_CELL_TIMEOUT"):
        CellLimits()


def test_the_course_config_grades_with_the_course_limits():
    """nbgrader_config.py swaps nbgrader's Execute for the course's, importing the course's
    tools into nbgrader but neither PyTorch nor the references."""
    from course_tools import ROOT

    code = (
        "import sys\n"
        "from traitlets.config.loader import PyFileConfigLoader\n"
        f"c = PyFileConfigLoader('nbgrader_config.py', path={str(ROOT)!r}).load_config()\n"
        "print([p.__name__ for p in c.Autograde.autograde_preprocessors])\n"
        "print('torch' in sys.modules, 'attention_ref.attention' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "CourseExecute" in out and "'Execute'" not in out, out
    assert out.splitlines()[-1] == "False False", out


def test_a_loop_costs_one_cell_limit_then_a_reduced_one(monkeypatch):
    """The course's Execute preprocessor on a notebook whose first two cells loop forever:
    the first gets the ordinary limit, the second the reduced one, the kernel recovers
    between them, and the last cell runs normally."""
    import time

    from attention_ref.course.cell_limits import execute_preprocessor

    monkeypatch.setenv("NBGRADER_CELL_TIMEOUT", "4")
    monkeypatch.setenv("NBGRADER_TIMEOUT_AFTER", "2")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    loop = "while True:\n    pass"
    nb.cells = [nbformat.v4.new_code_cell(src) for src in ("x = 1", loop, loop, "print(x + 1)")]
    start = time.perf_counter()
    execute_preprocessor()(kernel_name="python3").preprocess(nb, {"metadata": {"path": "."}})
    seconds = time.perf_counter() - start
    errors = [" ".join(o.evalue for o in c.outputs if o.output_type == "error") for c in nb.cells]
    assert "within 4 s" in errors[1] and "within 2 s" in errors[2], errors
    assert not errors[0] and not errors[3], errors
    assert nb.cells[3].outputs[0]["text"] == "2\n"
    assert seconds < 60, seconds


#: A learner's cell that prints whether its kernel has used the meta device already.
META_WARM_SEEN = (
    "import sys\n"
    "core = sys.modules.get('attention_ref.checks._core')\n"
    "print('meta warm:', bool(core and core._META_WARM))"
)


@pytest.mark.parametrize(("exercise", "warmed"), [("masked_softmax", True), ("causal_mask", False)])
def test_a_graded_kernel_pays_the_meta_devices_first_use_before_its_first_cell(exercise, warmed):
    """A notebook whose checks hand the learner's code meta tensors (masked_softmax's do,
    causal_mask's do not): its fresh kernel imports the meta device's kernels (seconds on a
    busy machine) before the first cell, outside every cell's time limit; the others' do not
    pay for it."""
    from attention_ref.course.cell_limits import execute_preprocessor
    from attention_ref.trust import trusted

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    test = nbformat.v4.new_code_cell(
        f"from attention_ref.checks import check\ncheck({exercise!r}, lambda *a: None)"
    )
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": f"test_{exercise}",
        "points": 1,
        "schema_version": 3,
    }
    nb.cells = [nbformat.v4.new_code_cell(META_WARM_SEEN), test]
    execute = execute_preprocessor(trusted=trusted)(kernel_name="python3")
    execute.preprocess(nb, {"metadata": {"path": "."}})
    assert nb.cells[0].outputs[0]["text"] == f"meta warm: {warmed}\n", nb.cells[0].outputs
    assert not nb.cells[1].metadata.get("nbgrader", {}).get("passed")  # a stub: no points


def test_a_notebook_keeps_one_budget_of_output_bytes(monkeypatch):
    """Five 1 MB outputs under a 2 MB budget: the graded notebook keeps 2 MB at most, says
    that later outputs were dropped, and its later cells still run."""
    from attention_ref.course.cell_limits import execute_preprocessor

    monkeypatch.setenv("ATTENTION_REF_OUTPUT_BYTES", str(2 * 2**20))
    nb = nbformat.v4.new_notebook()
    big = "import time\nfor i in range(5):\n    print('x' * 2**20, flush=True)\n    time.sleep(0.3)"
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (big, "print('after')")]
    execute_preprocessor()(kernel_name="python3").preprocess(nb, {"metadata": {"path": "."}})
    kept = len(json.dumps(nb))
    assert kept <= 2 * 2**20 + 4096, kept
    assert "later outputs were not kept" in json.dumps(nb.cells[0].outputs)
    assert kept >= 2**20  # what fits is kept
    assert nb.cells[1].outputs[0]["text"] == "after\n"  # later cells run; what fits is kept


#: A grading process that executes one notebook whose first cell prints ``SIZE`` bytes in
#: one message; it prints its own peak memory and what the notebook kept.
ONE_MESSAGE = """
import json, resource, sys
import nbformat
from attention_ref.course.cell_limits import execute_preprocessor
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(s) for s in (
    "print('x' * %d, flush=True)" % int(sys.argv[1]), "raise ValueError('after the cut')")]
execute_preprocessor()(kernel_name="python3").preprocess(nb, {"metadata": {"path": "."}})
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"peak_mb": peak, "cells": [c.outputs for c in nb.cells]}))
"""


def _one_message(size: int) -> dict:
    env = {**os.environ, "ATTENTION_REF_OUTPUT_BYTES": str(2 * 2**20)}
    proc = subprocess.run(
        [sys.executable, "-c", ONE_MESSAGE, str(size)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.later  # 300 MB printed and refused: 15 s of a quiet core
def test_one_huge_message_never_enters_the_graders_memory():
    """A kernel that prints 300 MB in one message (unbounded, the grading process peaked at
    1.16 GB for it): the socket refuses it, the grader's peak memory stays that of a small
    message, the notebook says why its outputs stop, and the errors of later cells are
    still recorded (they come with the cell's reply)."""
    small, huge = _one_message(1000), _one_message(300_000_000)
    assert huge["peak_mb"] - small["peak_mb"] < 100, (small["peak_mb"], huge["peak_mb"])
    first, second = huge["cells"]
    assert "the kernel sent a message over 3 MB" in json.dumps(first), first
    assert any(o.get("ename") == "ValueError" for o in second), second
    assert "message over" not in json.dumps(small["cells"]), small["cells"]


def flaky_kernel(share, marker):
    """A JUPYTER_PATH whose python3 kernel dies at once the first time it is started (as
    a kernel does that cannot bind its port) and starts normally after that."""
    spec = share / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "launch.py").write_text(
        "import os, runpy, sys\n"
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    os._exit(1)\n"
        "sys.argv[0] = 'ipykernel_launcher'\n"
        "runpy.run_module('ipykernel_launcher', run_name='__main__')\n"
    )
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, str(spec / "launch.py"), "-f", "{connection_file}"],
                "display_name": "Python 3 (dies once)",
                "language": "python",
            }
        )
    )
    return share


@pytest.mark.later
def test_a_kernel_that_dies_before_any_cell_is_replaced_and_the_grade_is_whole(tmp_path):
    aid = "02_masking"
    course = make_course(tmp_path / "course", [aid])
    submit(course, "solution", aid, solved_submission(aid))
    marker = tmp_path / "died-once"
    share = flaky_kernel(tmp_path / "share", marker)
    # Unsandboxed: the sandbox sees no kernelspec file outside the Python environment, and
    # its kernels talk over Unix sockets (no port to race for); the retry is its own.
    env = {"JUPYTER_PATH": str(share), "ATTENTION_REF_SANDBOX": "off"}
    proc = run_course(course, "grade", "--jobs", "1", env_extra=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert marker.exists(), "the first kernel never started: the test proves nothing"
    total = auto_points(nbformat.read(solution_path(aid), as_version=4))
    assert code_scores(course, aid)["solution"] == (total, total)
    report = proc.stdout[proc.stdout.index("Grading report") :]
    assert "solution" in report and "graded" in report and "crashed" not in report
    assert "a kernel died before running any cell" in report, report


def test_the_tests_own_kernels_are_replaced_too(tmp_path, monkeypatch):
    """nbval's kernel start (patched in tests/conftest.py) and the tests' notebook runner."""
    import nbval.kernel

    from course_tools import execute

    for runner in ("nbval", "nbclient"):
        marker = tmp_path / f"died-once-{runner}"
        monkeypatch.setenv("JUPYTER_PATH", str(flaky_kernel(tmp_path / runner, marker)))
        if runner == "nbval":
            km, kc = nbval.kernel.start_new_kernel(kernel_name="python3")
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        else:
            nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
            execute(nb, kernel_name="python3", timeout=60)
            assert nb.cells[0].outputs[0]["text"] == "42\n"
        assert marker.exists(), f"{runner}: the first kernel never started"
