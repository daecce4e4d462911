"""``make grade``: autograde every submission, say what went wrong, export the grades.

nbgrader does the grading. This module adds what an instructor needs around it:

- every assignment with submissions is graded (or those named);
- a submission whose kernel died (``os._exit``, a segfault, running out of memory) is
  zeroed whole by nbgrader and only mentioned in its log. Here it is named in the report
  with the cell that killed the kernel, and graded again from a copy in which that one
  cell is replaced by an error, so the cells before and after it still earn their marks.
  The student's submitted file is never modified;
- cells that hit the per-cell time limit are listed;
- the grades are exported to a CSV (``nbgrader export``).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .course import assignments, nbgrader

CRASHED_CELL = (
    'raise RuntimeError("Grading: this cell stopped the Python kernel ({why}). It was not '
    'run, so that the rest of the notebook could be graded.")'
)


@dataclass
class Outcome:
    student: str
    assignment: str
    status: str = "graded"  # graded | crashed (partial credit) | failed
    notes: list[str] = field(default_factory=list)


def find_submissions(root: Path) -> dict[str, list[str]]:
    """``{assignment: [student, ...]}`` from ``submitted/<student>/<assignment>/``."""
    found: dict[str, list[str]] = {}
    sub = root / "submitted"
    if not sub.is_dir():
        return found
    for student in sorted(p for p in sub.iterdir() if p.is_dir()):
        for a in sorted(p for p in student.iterdir() if p.is_dir()):
            if any(a.glob("*.ipynb")):
                found.setdefault(a.name, []).append(student.name)
    return found


def _timed_out_cells(nb_path: Path) -> list[str]:
    nb = nbformat.read(nb_path, as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error" and "Timeout" in o.get("ename", ""):
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                out.append(f"cell {i + 1}" + (f" ({gid})" if gid else ""))
    return out


def find_killer_cell(nb_path: Path, timeout: int) -> tuple[int | None, str]:
    """Run the notebook cell by cell; return (index, reason) of the cell whose execution
    killed the kernel, or (None, "") if none did."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(nb_path.parent)}},
    )
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, i)
            except DeadKernelError:
                return i, "the kernel died: os._exit, a crash or out of memory"
            except CellTimeoutError:
                continue
    return None, ""


def _salvage(root: Path, aid: str, student: str, timeout: int, outcome: Outcome) -> None:
    """Grade a copy of a crashed submission with the killing cell neutralised."""
    src_dir = root / "submitted" / student / aid
    with tempfile.TemporaryDirectory(prefix="salvage-") as tmp:
        dst_dir = Path(tmp) / student / aid
        shutil.copytree(src_dir, dst_dir)
        replaced = []
        for nb_path in sorted(dst_dir.glob("*.ipynb")):
            idx, why = find_killer_cell(nb_path, timeout)
            if idx is None:
                continue
            nb = nbformat.read(nb_path, as_version=4)
            cell = nb.cells[idx]
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            cell.source = CRASHED_CELL.format(why=why)
            nbformat.write(nb, nb_path)
            replaced.append(f"{nb_path.name} cell {idx + 1}" + (f" ({gid})" if gid else ""))
            outcome.notes.append(f"kernel died in {replaced[-1]}: {why}")
        if not replaced:
            outcome.status = "failed"
            outcome.notes.append(
                "nbgrader could not grade it, and no single cell was found "
                "to kill the kernel: see the nbgrader log above"
            )
            return
        proc = nbgrader(
            root,
            "autograde",
            aid,
            "--force",
            "--student",
            student,
            f"--CourseDirectory.submitted_directory={tmp}",
            check=False,
        )
        if (root / "autograded" / student / aid).is_dir():
            outcome.status = "crashed (partial credit)"
            outcome.notes.append("graded without that cell: the other cells kept their marks")
        else:
            outcome.status = "failed"
            outcome.notes.append("grading failed again: " + proc.stderr.strip()[-500:])


def export(root: Path, csv_path: str | os.PathLike) -> Path:
    out = Path(csv_path)
    if not out.is_absolute():
        out = root / out
    nbgrader(root, "export", "--to", str(out))
    return out


def grade(
    root: Path,
    requested: list[str],
    csv_path: str | os.PathLike = "grades.csv",
    force: bool = False,
) -> int:
    """Autograde, report, export. Returns the exit status for ``make grade``.

    Submissions graded before are kept (so a second run only grades what is new) unless
    ``force``, which regrades everything (after changing a test, say).
    """
    subs = find_submissions(root)
    known = assignments(root)
    unknown = [a for a in requested if a not in known]
    if unknown:
        print(
            f"error: unknown assignment(s) {', '.join(unknown)}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    todo = requested or [a for a in sorted(subs) if a in known]
    stray = sorted(set(subs) - set(known))
    if stray:
        print(
            f"warning: submitted/ holds work for unknown assignment(s) {', '.join(stray)}; "
            "they are not graded",
            file=sys.stderr,
        )
    if not todo:
        print(
            "nothing to grade: put submissions in submitted/<student>/<assignment>/"
            "<assignment>.ipynb (nbgrader collect does this)",
            file=sys.stderr,
        )
        return 1
    timeout = int(os.environ.get("NBGRADER_CELL_TIMEOUT", "300"))
    outcomes: list[Outcome] = []
    for aid in todo:
        students = subs.get(aid, [])
        print(f"== {aid}: {len(students)} submission(s)", flush=True)
        nbgrader(root, "generate_assignment", aid, "--force")  # records the grade cells
        if not students:
            continue
        proc = nbgrader(root, "autograde", aid, *(["--force"] if force else []), check=False)
        for student in students:
            outcome = Outcome(student, aid)
            graded = root / "autograded" / student / aid
            if graded.is_dir():
                for nb_path in sorted(graded.glob("*.ipynb")):
                    cells = _timed_out_cells(nb_path)
                    if cells:
                        outcome.notes.append(
                            f"{nb_path.name}: {', '.join(cells)} hit the "
                            f"{timeout} s per-cell time limit"
                        )
            else:
                _salvage(root, aid, student, timeout, outcome)
            outcomes.append(outcome)
        if proc.returncode != 0 and all(
            o.status == "graded" for o in outcomes if o.assignment == aid
        ):
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
    out = export(root, csv_path)
    _print_report(outcomes, out)
    return 0 if all(o.status != "failed" for o in outcomes) else 1


def _print_report(outcomes: list[Outcome], csv_path: Path) -> None:
    scores = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            scores[(row["student_id"], row["assignment"])] = (row["score"], row["max_score"])
    print("\nGrading report")
    for o in outcomes:
        score, max_score = scores.get((o.student, o.assignment), ("?", "?"))
        print(f"  {o.assignment:32s} {o.student:20s} {score:>6s} / {max_score:<6s} {o.status}")
        for note in o.notes:
            print(f"      - {note}")
    problems = [o for o in outcomes if o.status != "graded" or o.notes]
    print(
        f"{len(outcomes)} submission(s) graded, {len(problems)} with problems listed above; "
        f"grades exported to {csv_path}"
    )
    print("Written answers need manual grading in formgrader (see docs/INSTRUCTOR_GUIDE.md).")


def summary_json(csv_path: Path) -> str:  # pragma: no cover - convenience for scripts
    with open(csv_path, newline="") as f:
        return json.dumps(list(csv.DictReader(f)), indent=1)
