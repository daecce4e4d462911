"""The JupyterHub workflow of the instructor guide (section 7) on a throwaway exchange:
release, fetch, submit, collect, grade, feedback."""

from __future__ import annotations

import csv
import getpass
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_tools import assignment_ids, make_course, run_course

pytestmark = pytest.mark.grading


def nbgrader(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc


def test_release_fetch_submit_collect_grade_and_feedback(tmp_path):
    aid = assignment_ids()[0]
    course = make_course(tmp_path / "course", [aid])
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)
    student_home = tmp_path / "student"
    student_home.mkdir()
    ex = [f"--Exchange.root={exchange}", "--CourseDirectory.course_id=attention-from-scratch"]

    assert run_course(course, "release", aid).returncode == 0
    nbgrader(course, "release_assignment", aid, "--force", *ex)
    nbgrader(student_home, "fetch_assignment", aid, *ex)
    fetched = student_home / aid / f"{aid}.ipynb"
    assert fetched.exists()
    nbformat.read(fetched, as_version=4)  # a valid notebook the student can open
    nbgrader(student_home, "submit", aid, *ex)
    nbgrader(course, "collect", aid, *ex)
    student = getpass.getuser()
    assert (course / "submitted" / student / aid / f"{aid}.ipynb").exists()

    proc = run_course(course, "grade", aid)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "grades.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["student_id"] == student]
    assert len(rows) == 1 and float(rows[0]["score"]) == 0.0  # an untouched notebook

    nbgrader(course, "generate_feedback", aid)
    assert (course / "feedback" / student / aid / f"{aid}.html").exists()
