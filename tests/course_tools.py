"""Shared helpers for the notebook and grading tests: a throwaway course built from the
real solutions/ and nbgrader_config.py, and ways to read notebooks and gradebooks."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
RELEASE = ROOT / "notebooks"


def assignment_ids() -> list[str]:
    return sorted(
        d.name for d in SOLUTIONS.iterdir() if d.is_dir() and (d / f"{d.name}.ipynb").exists()
    )


def solution_path(aid: str) -> Path:
    return SOLUTIONS / aid / f"{aid}.ipynb"


def release_path(aid: str) -> Path:
    return RELEASE / aid / f"{aid}.ipynb"


def grade_cells(nb) -> list:
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def test_cells(nb) -> list:
    """Autograded test cells (grade, not solution)."""
    return [
        c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
        and not c.metadata["nbgrader"].get("solution")
    ]


test_cells.__test__ = False  # a helper, not a test, wherever it is imported


def auto_points(nb) -> float:
    return float(sum(c.metadata["nbgrader"].get("points", 0) for c in test_cells(nb)))


def answer_cells(nb) -> dict[str, nbformat.NotebookNode]:
    return {
        c.metadata["nbgrader"]["grade_id"]: c
        for c in nb.cells
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
    }


def strip_solution_markers(source: str) -> str:
    """The code a student who solved the exercise would have in the cell."""
    return "\n".join(
        line for line in source.splitlines() if not re.match(r"\s*### (BEGIN|END) SOLUTION", line)
    )


def make_course(dest: Path, aids: list[str] | None = None) -> Path:
    """Copy the real course (config, solutions) into ``dest`` for grading experiments."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", dest / "nbgrader_config.py")
    for aid in aids or assignment_ids():
        shutil.copytree(SOLUTIONS / aid, dest / "solutions" / aid)
    return dest


def run_course(course: Path, *args: str, timeout: int = 3000, env_extra: dict | None = None):
    import os

    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("NBGRADER_DB_URL", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "attention_ref.course", *args],
        cwd=course,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def execute(nb, **client_options):
    """Execute ``nb`` in place with nbclient (``client_options`` as for NotebookClient);
    a kernel that dies before running any cell (a port taken by a kernel started at the
    same moment) is replaced, as the grader does."""
    import atexit

    from nbclient import NotebookClient

    from attention_ref.course.cell_limits import KERNEL_START_ATTEMPTS, kernel_failed_to_start

    for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
        client = NotebookClient(nb, **client_options)
        started = []
        client.on_cell_start = lambda **kwargs: started.append(True)
        try:
            return client.execute()
        except RuntimeError as err:
            if started or attempt == KERNEL_START_ATTEMPTS or not kernel_failed_to_start(err):
                raise
            atexit.unregister(client._cleanup_kernel)  # that kernel is cleaned up already
