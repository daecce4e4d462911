"""Grading on a busy machine: waits that stretch with the load, a grader's failure graded
again, and a submission that still cannot be graded reported as not graded and left blank,
never 0 (attention_ref/course/load.py, grading.py).

The quick tests here prove each piece; the class graded beside busy processes is in
tests/test_busy_class.py (``make test-busy``: it needs the machine to itself)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from attention_ref.course import autograde, cell_limits, grading, load
from attention_ref.trust import sandbox, trusted


# ----------------------------------------------------------------------------- the factor
@pytest.mark.parametrize(
    ("loadavg", "factor"), [(0.5, 1.0), (2.0, 1.0), (3.0, 1.5), (4.0, 2.0), (20.0, 10.0)]
)
def test_the_load_factor_is_the_load_per_core(monkeypatch, loadavg, factor):
    monkeypatch.delenv(load.FACTOR_ENV, raising=False)
    monkeypatch.setattr(load.os, "getloadavg", lambda: (loadavg, loadavg, loadavg))
    monkeypatch.setattr(load, "cores", lambda: 2)
    assert load.load_factor() == factor
    assert load.scaled(10) == 10 * factor


def test_the_load_factor_can_be_fixed_and_is_bounded(monkeypatch):
    monkeypatch.setenv(load.FACTOR_ENV, "3")
    assert load.load_factor() == 3
    monkeypatch.setenv(load.FACTOR_ENV, "1000")
    assert load.load_factor() == load.MAX_FACTOR
    monkeypatch.setenv(load.FACTOR_ENV, "soon")
    with pytest.raises(ValueError, match="ATTENTION_REF_LOAD_FACTOR"):
        load.load_factor()


def test_cell_limits_stretch_with_the_load(monkeypatch):
    plain = nbformat.v4.new_code_cell("x = 1")
    limits = cell_limits.CellLimits(cell=30, training=300, after=10)
    monkeypatch.setenv(load.FACTOR_ENV, "1")
    assert limits(plain) == 30
    monkeypatch.setenv(load.FACTOR_ENV, "4")
    assert limits(plain) == 120
    limits.timed_out(120)
    assert limits(plain) == 40  # the reduced limit after a timeout, stretched too


def test_a_checks_call_waiting_for_its_cpu_share_waits_longer_on_a_busy_machine(monkeypatch):
    """A call is stopped once it used its limit's share of CPU (a loop, whatever the load),
    or ran LOADED_FACTOR times its limit on the clock: that cap stretches with the load, so a
    correct call that only gets a tenth of a core is not taken for a loop."""
    from attention_ref.checks._core import _Deadline, _TimeUp

    def sleeps_for(seconds: float) -> float:  # uses no CPU: only the wall cap stops it
        start = time.monotonic()
        try:
            with _Deadline(0.2):
                time.sleep(seconds)
        except _TimeUp:
            pass
        return time.monotonic() - start

    monkeypatch.setenv(load.FACTOR_ENV, "1")
    assert sleeps_for(3.0) < 1.5  # stopped at 4 x 0.2 s
    monkeypatch.setenv(load.FACTOR_ENV, "5")
    assert sleeps_for(1.5) >= 1.4  # the cap is now 4 s: it ran to its end
    start = time.monotonic()
    with pytest.raises(_TimeUp), _Deadline(0.2):
        while True:  # a loop: stopped once it used 0.8 x 0.2 s of CPU, whatever the load
            pass
    assert time.monotonic() - start < 2.0


_STARVED_CALL = r"""
import os, subprocess, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, shared with the spinners
os.environ["ATTENTION_REF_LOAD_FACTOR"] = "1"  # the load average has not seen the load yet
from attention_ref.checks._core import _Deadline, _TimeUp
from attention_ref.course.load import runqueue_wait
# busy for at most a minute each, even if this process dies before it kills them
spin = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(9)]
try:
    time.sleep(0.5)
    start, waited = time.monotonic(), runqueue_wait()
    try:
        with _Deadline(0.5):  # stopped at 0.4 s of CPU, or 4 x 0.5 s on the clock
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass
        verdict = "finished"
    except _TimeUp:
        verdict = "stopped"
    print(verdict, time.monotonic() - start, runqueue_wait() - waited)
finally:
    for p in spinners:
        p.kill()
"""


def test_a_call_held_back_by_other_processes_is_not_charged_for_their_time():
    """A correct call that needs 0.3 s of CPU under a 0.5 s limit, sharing one core with
    nine busy processes while the load average still says the machine is quiet: it is on
    the clock past the 2 s wall cap, but most of that was spent waiting for the core, which
    is not the call's time, so it finishes."""
    run = subprocess.run(
        [sys.executable, "-c", _STARVED_CALL], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    verdict, wall, waited = run.stdout.split()
    assert float(wall) > 2.0  # past the cap on the clock: the old rule would have stopped it
    assert float(waited) > 1.0  # ... because other processes held it back
    assert verdict == "finished"


# ----------------------------------------------------------------------------- waiting
def _wait_on(argv: list[str], **kw) -> tuple[bool, float]:
    proc = subprocess.Popen(argv)
    try:
        start = time.monotonic()
        came = load.wait_while_busy(
            lambda wait: time.sleep(min(wait, 0.2)) or False,
            proc.pid,
            alive=lambda: proc.poll() is None,
            **kw,
        )
        return came, time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()


def test_a_process_still_using_cpu_is_waited_for_and_a_stuck_one_is_not(monkeypatch):
    monkeypatch.setenv(load.FACTOR_ENV, "1")
    busy = [sys.executable, "-c", "while True: pass"]
    stuck = [sys.executable, "-c", "import time; time.sleep(100)"]
    came, busy_s = _wait_on(busy, quiet_seconds=0.5, idle_seconds=1.5, hard_seconds=4)
    assert not came and busy_s >= 3.5, busy_s  # waited to the hard limit: it kept working
    came, stuck_s = _wait_on(stuck, quiet_seconds=0.5, idle_seconds=1.5, hard_seconds=20)
    assert not came and stuck_s < 8, stuck_s  # no CPU used for idle_seconds: given up
    came, gone_s = _wait_on(
        [sys.executable, "-c", "pass"], quiet_seconds=30, idle_seconds=30, hard_seconds=60
    )
    assert not came and gone_s < 10, gone_s  # it ended: nothing more to wait for


def test_a_checker_that_cannot_start_is_the_grader_s_failure(monkeypatch, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(trusted.sys, "executable", str(fake))
    with pytest.raises(trusted.CheckerStartError, match=r"exited with status 3.*grader's failure"):
        trusted.CheckerProcess()


# ----------------------------------------------------------------------------- retrying
def _fails_then(*statuses: str):
    runs = []

    def once(root, aid, student, force, deadline):
        o = autograde.Outcome(student, aid)
        if statuses[len(runs)] == "grader":
            o.not_graded("the grader failed (the trusted checker did not start)", True)
        elif statuses[len(runs)] == "notebook":
            o.not_graded("its notebook could not be read as an nbgrader notebook (x)")
        runs.append(force)
        return o

    return once, runs


def test_the_grader_s_failure_is_graded_again(monkeypatch):
    once, runs = _fails_then("grader", "graded")
    monkeypatch.setattr(autograde, "_grade_once", once)
    o = autograde.grade_submission("/nowhere", "01_x", "ada", force=False)
    assert o.status == "graded" and runs == [False, True]  # the second run is forced
    assert "graded in 2 runs: the grader failed before" in o.notes[0], o.notes


def test_a_submission_the_grader_keeps_failing_is_not_graded_never_zero(monkeypatch):
    once, runs = _fails_then("grader", "grader", "grader", "graded")
    monkeypatch.setattr(autograde, "_grade_once", once)
    o = autograde.grade_submission("/nowhere", "01_x", "ada", force=False)
    assert len(runs) == autograde.GRADER_ATTEMPTS and o.status == autograde.NOT_GRADED
    assert o.notes[-1].startswith("not graded: the grader failed"), o.notes
    assert autograde.GRADE_NEXT_TIME in o.notes[-1]


def test_a_notebook_that_cannot_be_read_is_not_graded_again(monkeypatch):
    once, runs = _fails_then("notebook", "graded")
    monkeypatch.setattr(autograde, "_grade_once", once)
    o = autograde.grade_submission("/nowhere", "01_x", "ada", force=False)
    assert len(runs) == 1 and o.status == autograde.NOT_GRADED, (runs, o)


@pytest.mark.parametrize(
    ("log", "words", "graders"),
    [
        ("[AutogradeApp | ERROR] RuntimeError: the trusted checker did not start (it...)",
         "the grader failed", True),
        ("RuntimeError: Kernel didn't respond in 60 seconds", "the grader failed", True),
        ("nbformat.ValidationError: missing attachment: image.png",
         "could not be read as an nbgrader notebook", False),
        ("[ERROR] Something else went wrong\nmore", "nbgrader could not grade it", True),
    ],
)  # fmt: skip
def test_a_failure_s_cause_is_read_from_nbgrader_s_log(log, words, graders):
    cause, grader_failed = autograde.failure_cause(log)
    assert words in cause and grader_failed is graders, cause
    assert "no single cell was found" not in cause


# ----------------------------------------------------------------------------- grades
def _submit(root: Path, student: str, aid: str, graded: bool) -> None:
    folder = root / "submitted" / student / aid
    folder.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), folder / f"{aid}.ipynb")
    if graded:
        (root / "autograded" / student / aid).mkdir(parents=True)


def test_grades_csv_leaves_a_submission_not_graded_blank(monkeypatch, tmp_path):
    _submit(tmp_path, "ada", "01_x", graded=True)
    _submit(tmp_path, "bob", "01_x", graded=False)  # its grading failed

    def fake_export(root, *args):  # what nbgrader writes: 0 for both ungraded and blank
        out = Path(args[-1])
        fields = ["assignment", "student_id", "raw_score", "late_submission_penalty", "score",
                  "max_score"]  # fmt: skip
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for sid, score in (("ada", "7.0"), ("bob", "0.0"), ("cy", "0.0")):
                values = ["01_x", sid, score, "0.0", score, "9.0"]
                w.writerow(dict(zip(fields, values, strict=True)))

    monkeypatch.setattr(grading, "nbgrader", fake_export)
    out = grading.export(tmp_path, "grades.csv")
    with open(out, newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert rows["ada"]["score"] == "7.0"
    assert rows["bob"]["score"] == "" and rows["bob"]["raw_score"] == ""  # not a 0
    assert rows["bob"]["max_score"] == "9.0"
    assert rows["cy"]["score"] == "0.0"  # submitted nothing: nbgrader's 0 stands


# ----------------------------------------------------------------------------- leftovers
def test_a_dead_worker_s_job_folder_is_swept_by_the_next_job(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / "grading-job-left"
    (left / "course" / "submitted" / "ada").mkdir(parents=True)
    (left / "course" / "submitted" / "ada" / "answer.ipynb").write_text("{}")
    (left / sandbox.OWNER_FILE).write_text(f"{dead.pid} 1")  # its process has ended
    mine = sandbox.new_marked_dir("grading-job-", tmp_path)
    assert not left.exists(), "a dead worker's copy of a student's files was left"
    assert mine.is_dir() and (mine / sandbox.OWNER_FILE).read_text().split()[0] == str(os.getpid())
    again = sandbox.new_marked_dir("grading-job-", tmp_path)
    assert mine.exists() and again.exists()  # a live owner's folder is kept
