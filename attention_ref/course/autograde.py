"""Grading one submission: nbgrader's autograde, run again when the grader itself failed,
and a submission whose kernel died graded again without the cell that killed it; the
:class:`Outcome` says how it went (graded, crashed with partial credit, not graded and why).

Both ways of grading a class call :func:`grade_submission`: the Dask jobs of
:mod:`attention_ref.course.cluster`, and through them ``make grade``
(:mod:`attention_ref.course.grading`, which writes the gradebook and the report). This
module imports neither.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..trust import sandbox
from . import load, repair
from .cell_limits import (
    KERNEL_RESTARTED,
    MESSAGE_CUT,
    OUTPUT_CUT,
    CellLimits,
    timeout_message,
)
from .plumbing import nbgrader_api, stop_reason

OUTPUT_CUT_SIGN = OUTPUT_CUT.split("{")[0]
MESSAGE_CUT_SIGN = MESSAGE_CUT.split("{")[0]
CRASHED_CELL = (
    'raise RuntimeError("Grading: this cell stopped the Python kernel ({why}). It was not '
    'run, so that the rest of the notebook could be graded.")'
)


#: The status of a submission that could not be graded (the grader failed, its budget ran
#: out, or its notebook could not be read): no score, never 0.
NOT_GRADED = "not graded"
#: How often grading runs a submission when the grader itself failed (not the student's
#: code), within the submission's budget.
GRADER_ATTEMPTS = 3
GRADE_NEXT_TIME = "make grade grades it next time"


@dataclass
class Outcome:
    student: str
    assignment: str
    status: str = "graded"  # graded | crashed (partial credit) | not graded | refused
    notes: list[str] = field(default_factory=list)
    log: str = ""  # nbgrader's log when it could not grade the submission
    seconds: float = 0.0
    #: The grader failed (not the submission): worth grading again.
    grader_failed: bool = False

    def not_graded(self, cause: str, grader_failed: bool = False) -> None:
        """No grade: ``cause`` says why, in words an instructor can act on."""
        self.status = NOT_GRADED
        self.grader_failed = grader_failed
        self.notes.append(f"not graded: {cause}; {GRADE_NEXT_TIME}")


#: Signs in nbgrader's log that the notebook itself could not be read as an nbgrader
#: notebook (grading it again would fail the same way).
NOTEBOOK_PROBLEMS = (
    "ValidationError",
    "Notebook JSON is invalid",
    "NotJSONError",
    "missing attachment",
    "Duplicate grade id",
    "duplicate grade id",
    "is not a valid",
    "could not be read",
    "Bad Request",
)
#: Signs that the grader's own machinery failed (worth grading again).
GRADER_PROBLEMS = (
    "trusted checker did not start",
    "Kernel didn't respond",
    "Kernel died before replying",
    "TimeoutError",
    "database is locked",
    "Address already in use",
)


def failure_cause(log: str) -> tuple[str, bool]:
    """``(cause, grader's)``: why nbgrader could not grade a submission, read from its log,
    and whether it is the grader's failure (not the notebook's)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for sign in NOTEBOOK_PROBLEMS:
        for ln in lines:
            if sign in ln:
                cause = f"its notebook could not be read as an nbgrader notebook ({ln[-300:]})"
                return cause, False
    for sign in GRADER_PROBLEMS:
        for ln in lines:
            if sign in ln:
                return f"the grader failed ({ln[-300:]})", True
    errors = [ln for ln in lines if "Error" in ln or "ERROR" in ln]
    last = (errors or lines or ["no log"])[-1]
    return f"nbgrader could not grade it ({last[-300:]})", True


def _cell_name(i: int, cell) -> str:
    gid = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {i + 1}" + (f" ({gid})" if gid else "")


def _stopped_cells(nb_path: Path) -> dict[str, list[str]]:
    """``{"time": [cell, ...], "memory": [...], ...}``: the cells a time limit or a cap
    of the sandbox stopped, by what stopped them."""
    nb = nbformat.read(nb_path, as_version=4)
    out: dict[str, list[str]] = {}
    for i, cell in enumerate(nb.cells):
        why = stop_reason(cell)
        if why:
            out.setdefault(why, []).append(_cell_name(i, cell))
    return out


#: Seconds one submission may take to grade, every run of it together (the first, the search
#: for a cell that killed its kernel, the grading without that cell):
#: ``ATTENTION_REF_SUBMISSION_SECONDS``. The course's slowest notebook grades in about 90 s.
DEFAULT_SUBMISSION_SECONDS = 400


def submission_seconds() -> float:
    raw = os.environ.get("ATTENTION_REF_SUBMISSION_SECONDS", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_SUBMISSION_SECONDS
    except ValueError as err:
        raise ValueError(
            f"ATTENTION_REF_SUBMISSION_SECONDS must be a number of seconds; got {raw!r}"
        ) from err
    return max(30.0, value)


def find_killer_cell(
    nb_path: Path, limits: CellLimits | None = None, deadline: float | None = None
) -> tuple[int | None, str]:
    """Run the notebook cell by cell as autograde does (``NBGRADER_EXECUTION=autograde``,
    the same per-cell limits); return (index, reason) of the cell whose execution killed
    the kernel, or (None, "") if none did."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from nbgrader.utils import setenv

    limits = limits or CellLimits()
    nb = nbformat.read(nb_path, as_version=4)

    class Client(NotebookClient):
        async def _async_handle_timeout(self, timeout, cell=None):
            limits.timed_out(timeout)
            self.error_on_timeout = {
                "ename": "CellTimeoutError",
                "evalue": timeout_message(timeout, cell or {}),
                "traceback": [],
            }
            return await super()._async_handle_timeout(timeout, cell)

    client = Client(
        nb,
        **_kernel_manager(),
        timeout_func=limits,
        interrupt_on_timeout=True,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(nb_path.parent)}},
    )
    with setenv(NBGRADER_EXECUTION="autograde"), client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if deadline is not None and time.monotonic() > deadline:
                return None, "over budget"
            try:
                client.execute_cell(cell, i)
            except DeadKernelError:
                return i, "the kernel died: os._exit, a crash or out of memory"
    return None, ""


def _kernel_manager() -> dict:
    """The kernel manager of grading's own runs (the sandbox's, unless switched off)."""
    return {"kernel_manager_class": sandbox.kernel_manager_class()} if sandbox.enabled() else {}


def _salvage(
    root: Path, aid: str, student: str, outcome: Outcome, deadline: float | None = None
) -> None:
    """Grade a copy of a crashed submission with the killing cell neutralised."""
    from nbgrader.utils import temp_attrs

    src_dir = root / "submitted" / student / aid
    # Inside the course folder (on a worker, the job's private one, swept if the worker
    # dies), never beside other graders' files in the machine's temporary folder.
    with tempfile.TemporaryDirectory(prefix="salvage-", dir=root) as tmp:
        dst_dir = Path(tmp) / student / aid
        dst_dir.mkdir(parents=True)
        for nb_path in src_dir.glob("*.ipynb"):  # the notebooks, never through a link
            if nb_path.is_file() and not nb_path.is_symlink():
                shutil.copyfile(nb_path, dst_dir / nb_path.name)
        replaced = []
        for nb_path in sorted(dst_dir.glob("*.ipynb")):
            idx, why = find_killer_cell(nb_path, deadline=deadline)
            if why == "over budget":
                outcome.not_graded(OVER_BUDGET.format(seconds=_budget_text()))
                return
            if idx is None:
                continue
            nb = nbformat.read(nb_path, as_version=4)
            cell = nb.cells[idx]
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            cell.source = CRASHED_CELL.format(why=why)
            nbformat.write(nb, nb_path)
            replaced.append(f"{nb_path.name} cell {idx + 1}" + (f" ({gid})" if gid else ""))
            outcome.notes.append(f"kernel died in {replaced[-1]}: {why}")
        if not replaced:  # no cell of the student's killed a kernel: say what did fail
            cause, grader_failed = failure_cause(outcome.log)
            outcome.not_graded(cause, grader_failed=grader_failed)
            return
        api = nbgrader_api(root)
        with temp_attrs(api.coursedir, submitted_directory=tmp):
            result = _autograde(api, aid, student, force=True)
        if (root / "autograded" / student / aid).is_dir():
            outcome.status = "crashed (partial credit)"
            outcome.notes.append("graded without that cell: the other cells kept their marks")
        else:
            cause, _ = failure_cause(_result_text(result))
            outcome.not_graded(f"grading without that cell failed too: {cause}", True)


# ----------------------------------------------------------------------------- workers
LOCKED_RETRIES = 4


def _result_text(result: dict) -> str:
    return (result.get("log") or "") + (result.get("error") or "")


def _autograde(api, aid: str, student: str, force: bool) -> dict:
    """``nbgrader autograde AID --student STUDENT``, again (forced) while the gradebook
    reports a locked database."""
    for attempt in range(LOCKED_RETRIES + 1):
        result = api.autograde(aid, student, force=force or attempt > 0, create=True)
        if result["success"] or "database is locked" not in _result_text(result):
            break
        time.sleep(1 + attempt)
    return result


OVER_BUDGET = (
    "it used its time budget ({seconds} for every run of it together, "
    "ATTENTION_REF_SUBMISSION_SECONDS) before the cell that killed its kernel was found"
)


def _budget_text() -> str:
    factor = load.load_factor()
    base = f"{submission_seconds():g} s"
    return base if factor == 1 else f"{base} times the load factor {factor:g}"


def note_graded(graded: Path, outcome: Outcome) -> None:
    """Add to ``outcome`` what its graded notebooks (in ``graded``) show went wrong: outputs
    over the budget, cells stopped by a time limit or a cap of the sandbox."""
    for nb_path in sorted(graded.glob("*.ipynb")):
        text = nb_path.read_text(errors="replace")
        if OUTPUT_CUT_SIGN in text:
            outcome.notes.append(
                f"{nb_path.name}: its outputs reached the budget of a graded notebook "
                "(ATTENTION_REF_OUTPUT_BYTES); later outputs were not kept"
            )
        if MESSAGE_CUT_SIGN in text:
            outcome.notes.append(
                f"{nb_path.name}: its kernel sent a message over what a graded notebook "
                "keeps (ATTENTION_REF_OUTPUT_BYTES); the grader stopped reading its "
                "outputs"
            )
        for what, cells in _stopped_cells(nb_path).items():
            limit = (
                f"the per-cell time limit ({CellLimits().describe()})"
                if what == "time"
                else f"the sandbox's cap on {what} ({sandbox.Caps.from_env().describe()})"
            )
            outcome.notes.append(f"{nb_path.name}: {', '.join(cells)} hit {limit}")


def grade_submission(root: str, aid: str, student: str, force: bool) -> Outcome:
    """Autograde one submission (salvaging it if its kernel died, within its time budget),
    again when the grader itself failed (:data:`GRADER_ATTEMPTS` runs in all, within the
    budget); runs in a worker. Never raises."""
    start = time.perf_counter()
    # The budget stretches with the machine's load, as every wait of grading does.
    deadline = time.monotonic() + load.scaled(submission_seconds())
    earlier: list[str] = []
    for attempt in range(1, GRADER_ATTEMPTS + 1):
        outcome = _grade_once(Path(root), aid, student, force or attempt > 1, deadline)
        if not outcome.grader_failed:
            break
        earlier.append(f"run {attempt}: " + "; ".join(outcome.notes))
        if attempt == GRADER_ATTEMPTS or time.monotonic() > deadline:
            break
    if len(earlier) > (1 if outcome.grader_failed else 0):
        gone = earlier[:-1] if outcome.grader_failed else earlier
        outcome.notes.insert(
            0, f"graded in {len(gone) + 1} runs: the grader failed before ({' | '.join(gone)})"
        )
    outcome.seconds = time.perf_counter() - start
    return outcome


def _grade_once(root_path: Path, aid: str, student: str, force: bool, deadline: float) -> Outcome:
    """One run of :func:`grade_submission`."""
    outcome = Outcome(student, aid)
    try:
        # >>> repair.py: nbgrader_config.py's Repair mends a notebook as JupyterLab writes it
        # before nbgrader reads it; listed here. One that cannot be read is not graded.
        why = repair.note_repairs(
            root_path / "submitted" / student / aid, root_path / "solutions" / aid, outcome.notes
        )
        if why:
            outcome.not_graded(why)
            return outcome
        # <<< repair.py
        result = _autograde(nbgrader_api(root_path), aid, student, force)
        if KERNEL_RESTARTED in _result_text(result):
            outcome.notes.append(
                "a kernel died before running any cell (not the submission's doing: "
                "e.g. a port taken by a kernel started at the same moment) and was replaced"
            )
        graded = root_path / "autograded" / student / aid
        if graded.is_dir():
            note_graded(graded, outcome)
        else:
            outcome.log = _result_text(result)
            cause, grader_failed = failure_cause(outcome.log)
            if grader_failed and "trusted checker did not start" in cause:
                outcome.not_graded(cause, grader_failed=True)  # no cell of the student's ran
            elif time.monotonic() > deadline:
                outcome.not_graded(OVER_BUDGET.format(seconds=_budget_text()))
            else:
                _salvage(root_path, aid, student, outcome, deadline)
    except Exception as err:  # never lose the class to one submission
        outcome.not_graded(f"the grader failed ({type(err).__name__}: {err})", grader_failed=True)
    return outcome
