"""Classes graded the night of the deadline (``make test-busy``, alone on the machine, since
it keeps both cores busy on purpose; .ci/run runs it after ``make test-later``).

- **The class that failed.** Two students (a solution and a wrong answer) graded by
  ``make grade`` with two workers while busy processes at normal priority keep the load
  average at ten times the core count: each process, the grader's included, gets about a
  tenth of a core. Before the grader's waits stretched with the load, the honest student got
  0 here ("the trusted checker did not start").
- **A semester's class.** A generator makes 30 submissions of notebook 01 the way students
  produce them: notebooks saved by JupyterLab (nbformat 4.5 with cell ids, some 4.4
  without), pasted images, copied, moved and deleted cells, odd tags, invalid cell ids,
  foreign nbgrader metadata, outputs of many types (figures, HTML tables, widgets' JSON, long logs),
  headings and links of every kind in the written answer, files beside the notebook, odd
  but valid student ids, a late resubmission, blank, partial and wrong answers (the
  catalog's mistakes), each with the score it must get. It is graded while the load
  average is again ten times the core count, most of it from busy processes at the lowest
  priority (so that 30 submissions grade in minutes, not the better part of an hour) and
  two per core at normal priority (the grader gets about a third of the machine). Every
  student's score is exact and none is left ungraded; a second, forced grading of the class
  on a quiet machine gives the same grades.
"""

from __future__ import annotations

import base64
import copy
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import catalog
from course_tools import answer_cells, make_course, release_path, run_course
from test_class_grading import alternatives_submission, points_by_exercise, read_scores
from test_grading import solved_submission, submit

pytestmark = [pytest.mark.grading, pytest.mark.busy]

AID = "01_dot_product_attention"
STUDENTS = 30
#: The load average per core that grading starts at, and the busy processes per core that
#: keep it there (the one-minute average climbs towards their number; twice as many at
#: first, at the lowest priority, bring it there in under a minute).
LOAD_PER_CORE = 10.0
HOGS_PER_CORE = 11
#: Of those, at normal priority in the semester's class (the rest at the lowest).
FULL_HOGS_PER_CORE = 2
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
    )
).decode()
WRITTEN = """# why_sqrt_dk
## statusmessage

Without the scale the logits grow like $\\sqrt{d_k}$ and the softmax saturates.
See [my notes](http:notes.html), [the figure](http:figure.svg), [docs](https://pytorch.org),
<a id="save_grade" name="manual_grade">an anchor</a>, [mail](mailto:me@example.org) and
[this](javascript:alert(1)).
"""


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _with_outputs(nb):
    """A student's kernel left outputs of every kind in their answer cells."""
    outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="epoch 1\n" * 2000),
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
        nbformat.v4.new_output(
            "execute_result",
            data={"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "df"},
            execution_count=3,
        ),
        nbformat.v4.new_output(
            "display_data",
            data={
                "application/vnd.jupyter.widget-view+json": {
                    "model_id": "abc",
                    "version_major": 2,
                    "version_minor": 0,
                },
                "text/plain": "IntSlider(value=3)",
            },
        ),
    ]
    for cell in answer_cells(nb).values():
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
        cell.execution_count = 3
    return nb


def _written(nb, text: str = WRITTEN):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "why_sqrt_dk":
            cell.source = text
    return nb


def _index(nb, grade_id: str) -> int:
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    return ids.index(grade_id)


def _edited_in_jupyterlab(nb, variant: int):
    """What JupyterLab and a student do to a notebook that nbgrader alone refuses whole
    (attention_ref/course/repair.py mends it): an image pasted into the written answer, a
    copied test cell, an invalid cell id (variant 0); a comma in a tag, a test cell dragged
    above its answer, the gradebook's keys in a cell's metadata (1); a deleted test cell, an
    unknown grade id on a cell of the student's (2). None of it changes what the answers
    earn."""
    if variant == 0:
        written = nb.cells[_index(nb, "why_sqrt_dk")]
        written.source += "\n![image.png](attachment:image.png)\n"
        written["attachments"] = {"image.png": {"image/png": PNG}}
        copied = copy.deepcopy(nb.cells[_index(nb, "test_softmax_np")])
        copied["id"] = "0d6c1b7e-5a1f-4c2e-9f3b-2a1d4c5e6f70"
        nb.cells.insert(_index(nb, "sdpa_np") + 1, copied)
        nb.cells[2]["id"] = "my cell (2)"
    elif variant == 1:
        nb.cells[1].metadata["tags"] = ["notes, todo"]
        test = nb.cells.pop(_index(nb, "test_sdpa"))
        nb.cells.insert(_index(nb, "sdpa"), test)
        nb.cells[_index(nb, "test_sdpa_np")].metadata["nbgrader"].update(comment="ok", score=3)
    else:
        del nb.cells[_index(nb, "test_softmax_np")]
        nb.cells.append(nbformat.v4.new_code_cell("print('scratch')"))
        nb.cells[-1].metadata["nbgrader"] = {"grade": True, "grade_id": "mine", "points": 5}
    return nb


def _as_v44(nb):
    """Saved by an older JupyterLab: nbformat 4.4, no cell ids."""
    nb.nbformat_minor = 4
    for cell in nb.cells:
        cell.pop("id", None)
    return nb


def semester_class(course: Path) -> dict[str, float]:
    """Submit the class into ``course``; returns {student: expected automatic score}."""
    pts = points_by_exercise(AID)
    total = sum(pts.values())
    exercises = list(pts)
    mistakes = {e: [m for m in catalog.MISTAKES if m.exercise == e] for e in exercises}
    expected: dict[str, float] = {}
    ids = [
        "ana.lopez", "bo_chen", "c-3po", "dmitri.ivanov2", "EMMA", "f", "gr4ce.h",
        "hana-k", "ivan_", "j.o.e", "kai99", "lena.m", "mo-salah", "nia_w", "omar.f",
        "pia-x", "quinn", "raj.p", "sara_b", "tom-t", "uma.k", "vic_9", "wen.li", "xia",
        "yusuf.a", "zoe-z", "ab12", "ba.21", "cd_34", "de-45",
    ]  # fmt: skip
    for i, student in enumerate(ids[:STUDENTS]):
        kind = i % 6
        if kind == 0:  # a full solution, with outputs and a written answer, edited
            nb = _written(_with_outputs(solved_submission(AID)))
            nb, score = _edited_in_jupyterlab(nb, (i // 6) % 3), total
        elif kind == 1:  # the same, saved as nbformat 4.4
            nb, score = _as_v44(_written(solved_submission(AID))), total
        elif kind == 2:  # one catalogued mistake, in a different exercise each time
            exercise = exercises[(i // 6) % len(exercises)]
            wrong = mistakes[exercise][(i // 6) % len(mistakes[exercise])]
            nb, score = alternatives_submission(AID, wrong), total - pts[exercise]
        elif kind == 3:  # only the first exercise done
            nb = nbformat.read(release_path(AID), as_version=4)
            first = exercises[0]
            answer_cells(nb)[first].source = answer_cells(solved_submission(AID))[first].source
            nb, score = _written(nb, "I ran out of time."), pts[first]
        elif kind == 4:  # blank
            nb, score = nbformat.read(release_path(AID), as_version=4), 0.0
        else:  # correct alternatives everywhere, files beside the notebook, edited
            nb = _with_outputs(alternatives_submission(AID))
            nb, score = _edited_in_jupyterlab(nb, (i // 6 + 1) % 3), total
        submit(course, student, AID, nb)
        folder = course / "submitted" / student / AID
        if kind in (0, 5):
            (folder / "notes.html").write_text("<script>fetch('/api/contents')</script>")
            (folder / "figure.svg").write_text('<svg onload="alert(1)"></svg>')
            (folder / "data.npy").write_bytes(b"\x93NUMPY" + bytes(64))
        (folder / "timestamp.txt").write_text(f"2026-11-2{i % 7} 23:5{i % 10}:00.000000 UTC")
        expected[student] = score
    # A late resubmission: the student submitted again, a full solution this time.
    late = ids[4]
    nbformat.write(solved_submission(AID), course / "submitted" / late / AID / f"{AID}.ipynb")
    (course / "submitted" / late / AID / "timestamp.txt").write_text(
        "2026-11-28 23:59:59.000000 UTC"
    )
    expected[late] = total
    return expected


def _hog(nice: int) -> subprocess.Popen:
    loop = f"import os; os.nice({nice})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", loop])


class Busy:
    """Busy processes that keep the load average at ``LOAD_PER_CORE`` per core:
    ``full`` per core at normal priority, the others at the lowest."""

    def __init__(self, full_per_core: int):
        cores = _cores()
        self.target = LOAD_PER_CORE * cores
        self.hogs = [_hog(0) for _ in range(full_per_core * cores)]
        self.hogs += [_hog(19) for _ in range((HOGS_PER_CORE - full_per_core) * cores)]
        ramp = [_hog(19) for _ in range(HOGS_PER_CORE * cores)]
        try:
            deadline = time.monotonic() + 300
            while os.getloadavg()[0] < self.target and time.monotonic() < deadline:
                time.sleep(1)
        finally:
            self._stop(ramp)
        self.load_at_start = os.getloadavg()[0]

    @staticmethod
    def _stop(hogs: list[subprocess.Popen]) -> None:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.load_at_end = os.getloadavg()[0]
        self._stop(self.hogs)


def _grade(course: Path, *args: str) -> subprocess.CompletedProcess:
    # The load factor measured, not the quiet one the other tests fix (tests/conftest.py).
    env = {"ATTENTION_REF_LOAD_FACTOR": ""}
    return run_course(course, "grade", "--jobs", "2", *args, env_extra=env, timeout=3000)


def _statuses(proc) -> dict[str, str]:
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0] == AID and parts[3] == "/":
            out[parts[1]] = " ".join(parts[5:])
    return out


def _graded_beside(busy: Busy, course: Path, expected: dict[str, float]) -> dict:
    start = time.monotonic()
    with busy:
        proc = _grade(course)
    seconds = time.monotonic() - start
    print(
        f"\n{len(expected)} submission(s) graded in {seconds:.0f} s at a load average of "
        f"{busy.load_at_start:.1f} (start) and {busy.load_at_end:.1f} (end) on {_cores()} cores"
    )
    return {"course": course, "expected": expected, "proc": proc, "busy": busy}


@pytest.fixture(scope="module")
def failing_class(tmp_path_factory):
    """The two-student class that failed: every busy process at normal priority."""
    course = make_course(tmp_path_factory.mktemp("two") / "course", [AID])
    pts = points_by_exercise(AID)
    total = sum(pts.values())
    submit(course, "honest", AID, solved_submission(AID))
    first = next(iter(pts))
    wrong = next(m for m in catalog.MISTAKES if m.exercise == first)
    submit(course, "mistaken", AID, alternatives_submission(AID, wrong))
    expected = {"honest": total, "mistaken": total - pts[first]}
    return _graded_beside(Busy(full_per_core=HOGS_PER_CORE), course, expected)


@pytest.fixture(scope="module")
def semester(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("semester") / "course", [AID])
    expected = semester_class(course)
    return _graded_beside(Busy(full_per_core=FULL_HOGS_PER_CORE), course, expected)


def _assert_graded_exactly(graded: dict) -> None:
    course, expected, proc = graded["course"], graded["expected"], graded["proc"]
    # graded at ten times the cores' load (the one-minute average lags: at least 8 here)
    assert graded["busy"].load_at_start >= 0.8 * LOAD_PER_CORE * _cores(), graded["busy"]
    statuses = _statuses(proc)
    assert set(statuses) == set(expected), proc.stdout[-3000:] + proc.stderr[-3000:]
    ungraded = {s: st for s, st in statuses.items() if st != "graded"}
    assert not ungraded, (ungraded, proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    scores = {s: v for (s, a), v in read_scores(course).items() if a == AID}
    wrong = {s: (scores.get(s), v) for s, v in expected.items() if scores.get(s) != v}
    assert not wrong, f"student: (got, expected) {wrong}"


def test_the_class_that_failed_is_graded_exactly_at_ten_times_the_cores_load(failing_class):
    _assert_graded_exactly(failing_class)


def test_a_semester_s_class_is_graded_exactly_on_a_busy_machine(semester):
    _assert_graded_exactly(semester)


def test_grading_the_class_again_gives_the_same_grades(semester):
    course = semester["course"]
    with open(course / "grades.csv", newline="") as f:
        first = sorted(map(json.dumps, csv.DictReader(f)))
    again = _grade(course, "--force")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    with open(course / "grades.csv", newline="") as f:
        second = sorted(map(json.dumps, csv.DictReader(f)))
    assert first == second
