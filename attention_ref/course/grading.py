"""``make grade``: autograde every submission, say what went wrong, export the grades.

nbgrader does the grading. This module adds what an instructor needs around it:

- every notebook runs in a sandbox of its own (:mod:`attention_ref.course.sandbox`);
  where none can start, grading refuses before it grades anything, unless
  ``ATTENTION_REF_SANDBOX=off``, and then the report says so on its first line;

- every assignment with submissions is graded (or those named);
- submitted files are data: a submission holding a link or a special file, or over the
  caps of :class:`~attention_ref.course.exchange.SubmissionLimits` (one that did not come
  through the course's collect), is not graded, with a report line saying why; the
  workers start without the hub's credentials;
- a submission whose kernel died (``os._exit``, a segfault, running out of memory) is
  zeroed whole by nbgrader and only mentioned in its log. Here it is named in the report
  with the cell that killed the kernel, and graded again from a copy in which that one
  cell is replaced by an error, so the cells before and after it still earn their marks.
  The student's submitted file is never modified;
- cells that hit their time limit, or a cap of the sandbox (memory, processes, bytes
  written), are listed (the limits: attention_ref/course/cell_limits.py);
- submissions are graded ``jobs`` at a time (default: one per core), each by nbgrader's own
  autograde code, as a job on a Dask cluster (:mod:`attention_ref.course.cluster`: a local
  one started by the command, or a running scheduler's): a job grades in a private copy of
  the course holding its assignment and its one submission, and the command alone writes
  the gradebook and ``autograded/``; the grades are those of a sequential run (the report
  lists the submissions in the same order, whatever the order they finished in);
- a failure of the grader's own (its checker or a kernel that did not start, a worker that
  died, a timeout of the grader's) is never a grade: every wait of grading stretches with
  the machine's load (:mod:`attention_ref.course.load`), the submission is graded again
  (:data:`GRADER_ATTEMPTS` runs in all, within its budget), and if it still cannot be graded
  it is reported as **not graded**, with the cause, and left blank in grades.csv (and in the
  report's Canvas and Moodle files): ``make grade`` grades it next time;
- the grades are exported to a CSV (``nbgrader export``).

Every student is put in the gradebook before grading starts. The command writes the
gradebook one submission at a time; a sqlite gradebook is still opened with a long busy
timeout, and a write that met a locked database (formgrader open on it, say) is tried again.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import load, repair, sandbox, secret, trusted
from .cell_limits import (
    KERNEL_RESTARTED,
    MESSAGE_CUT,
    OUTPUT_CUT,
    CellLimits,
    timeout_message,
)
from .exchange import HUB_CREDENTIALS, SubmissionLimits, submission_problem
from .plumbing import assignments, nbgrader, nbgrader_api, stop_reason, ungraded
from .students import accepted

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


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def enrol(api, students: list[str]) -> None:
    """Put every one of ``students`` in the gradebook, one after the other, before the
    workers start: a student's first submissions, graded side by side, would otherwise each
    add the student at the same moment, and all but one would fail (UNIQUE constraint
    failed: student.id)."""
    gb = api.gradebook
    try:
        for student in students:
            gb.update_or_create_student(student)
    finally:
        gb.close()


def _grade_all(
    root: Path, tasks: list[tuple[str, str]], force: bool, jobs: int
) -> dict[tuple[str, str], Outcome]:
    """Grade ``tasks`` [(assignment, student)] on a Dask cluster (a local one of ``jobs``
    workers, or the scheduler of ``ATTENTION_REF_SCHEDULER``: :mod:`.cluster`); print each
    as its grades are written."""
    from tqdm import tqdm

    from . import cluster

    done: dict[tuple[str, str], Outcome] = {}

    def finished(o: Outcome) -> None:
        if (o.assignment, o.student) in done:  # never written twice
            raise RuntimeError(f"{o.assignment} {o.student} was graded twice")
        done[(o.assignment, o.student)] = o
        tqdm.write(
            f"   [{len(done)}/{len(tasks)}] {o.assignment} {o.student}: {o.status} "
            f"({o.seconds:.1f} s)",
            file=sys.stdout,
        )
        sys.stdout.flush()

    # Workers copy students' files: no hub credential reaches them (nor their kernels).
    for name in [k for k in os.environ if HUB_CREDENTIALS.match(k)]:
        del os.environ[name]
    if not tasks:
        return done
    cluster.grade_on_cluster(root, tasks, force, jobs, cluster.ClusterConfig.from_env(), finished)
    return done


#: The columns of nbgrader's export left blank for a submission that was not graded.
SCORE_COLUMNS = ("raw_score", "late_submission_penalty", "score")


def export(root: Path, csv_path: str | os.PathLike) -> Path:
    """``nbgrader export`` to ``csv_path``, with the scores of every submission that has no
    graded copy (:func:`~.plumbing.ungraded`) left blank: nbgrader writes 0 for them, as
    for a blank notebook."""
    out = Path(csv_path)
    if not out.is_absolute():
        out = root / out
    nbgrader(root, "export", "--to", str(out))
    blank = ungraded(root)
    if blank:
        with open(out, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames or [], list(reader)
        for row in rows:
            if (row.get("student_id"), row.get("assignment")) in blank:
                row.update({c: "" for c in SCORE_COLUMNS if c in row})
        with open(out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    return out


def grade(
    root: Path,
    requested: list[str],
    csv_path: str | os.PathLike = "grades.csv",
    force: bool = False,
    jobs: int | None = None,
) -> int:
    """Autograde, report, export. Returns the exit status for ``make grade``.

    Submissions graded before are kept (so a second run only grades what is new) unless
    ``force``, which regrades everything (after changing a test, say). ``jobs``
    submissions are graded at a time (default: the number of cores).
    """
    subs = accepted(find_submissions(root))  # a student id that is not one is not graded
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
    jobs = jobs or default_jobs()
    from .cluster import ClusterConfig, ClusterRefusedError

    try:
        where = ClusterConfig.from_env()
        where.security()  # a tls:// scheduler's certificates, before anything is graded
    except ClusterRefusedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Each kernel gets its share of the cores (PyTorch would take them all, and two
    # workers would run four busy threads on two cores), unless the grader set it.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, default_jobs() // jobs)))
    if sandbox.enabled():
        reason = sandbox.unavailable_reason()
        if reason:
            print(f"error: grading refused: {reason}", file=sys.stderr)
            return 2
        try:
            # Built once here, for every worker's kernels.
            os.environ[sandbox.EDITION_ENV] = str(sandbox.student_edition())
            caps = sandbox.Caps.from_env()
        except (sandbox.SandboxUnavailableError, ValueError) as err:
            print(f"error: grading refused: {err}", file=sys.stderr)
            return 2
        print(f"sandbox: each notebook in its own; caps: {caps.describe()}", flush=True)
    else:
        print(sandbox.UNSANDBOXED_WARNING, flush=True)
    try:
        checked = trusted.enabled()
        budget = submission_seconds()
        if checked:
            # The seeds of the graded checks (course/secret.py): the checkers of this
            # command's workers, and the jobs sent to a cluster's, get it from here.
            os.environ[secret.SECRET_ENV] = secret.course_secret(root)
    except ValueError as err:
        print(f"error: grading refused: {err}", file=sys.stderr)
        return 2
    print(f"budget: {budget:g} s per submission, every run of it together", flush=True)
    if checked:
        print("verdicts: each graded test cell gets the points the trusted checker recorded")
    else:
        print(trusted.UNTRUSTED_WARNING, flush=True)
    api = nbgrader_api(root)
    limits = SubmissionLimits(parent=api)
    tasks = []
    refused: dict[tuple[str, str], Outcome] = {}
    for aid in todo:
        students = subs.get(aid, [])
        print(f"== {aid}: {len(students)} submission(s)", flush=True)
        result = api.generate_assignment(aid, force=True, create=True)  # the grade cells
        if not result["success"]:
            print(_result_text(result)[-4000:], file=sys.stderr)
            return 2
        if checked:
            source = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)
            mixed = trusted.mixed_test_cells(source)
            if mixed:
                print(
                    f"warning: {aid}: the test cell(s) {', '.join(mixed)} make check(...) "
                    "calls and assert lines: the asserts run in the student's kernel, so "
                    "they can cost points but a submission can make them pass; move them to "
                    "a test cell of their own, which the checker runs (guide, section 4)",
                    file=sys.stderr,
                )
        for student in students:
            # Submitted files are data: a link, a special file or a submission over the
            # caps (one not collected by the course's exchange) is not graded.
            why = submission_problem(root / "submitted" / student / aid, limits)
            if why:
                refused[(aid, student)] = Outcome(student, aid, "refused", [f"not graded: {why}"])
            tasks.append((aid, student))
    at_a_time = (
        f"{min(jobs, max(len(tasks), 1))} at a time"
        if where.address is None
        else f"on the cluster at {where.address}"
    )
    print(
        f"grading {len(tasks)} submission(s), {at_a_time}; time limits: {CellLimits().describe()}",
        flush=True,
    )
    graded = [t for t in tasks if t not in refused]
    enrol(api, sorted({student for _, student in graded}))
    try:
        done = _grade_all(root, graded, force, jobs)
    except ClusterRefusedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    done.update(refused)
    outcomes = [done[t] for t in tasks]
    for o in outcomes:
        if o.status == NOT_GRADED and o.log:
            print(
                f"nbgrader's log for {o.assignment} {o.student}:\n{o.log[-4000:]}", file=sys.stderr
            )
    out = export(root, csv_path)
    _print_report(outcomes, out)
    return 0 if all(o.status not in (NOT_GRADED, "refused") for o in outcomes) else 1


def _print_report(outcomes: list[Outcome], csv_path: Path) -> None:
    scores = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            scores[(row["student_id"], row["assignment"])] = (row["score"], row["max_score"])
    print("\nGrading report")
    if not sandbox.enabled():
        print(sandbox.UNSANDBOXED_WARNING)
    if not trusted.enabled():
        print(trusted.UNTRUSTED_WARNING)
    for o in outcomes:
        score, max_score = scores.get((o.student, o.assignment), ("?", "?"))
        score = score or "-"
        print(f"  {o.assignment:32s} {o.student:20s} {score:>6s} / {max_score:<6s} {o.status}")
        for note in o.notes:
            print(f"      - {note}")
    problems = [o for o in outcomes if o.status != "graded" or o.notes]
    missing = [o for o in outcomes if o.status in (NOT_GRADED, "refused")]
    print(
        f"{len(outcomes) - len(missing)} submission(s) graded, {len(missing)} not graded, "
        f"{len(problems)} with problems listed above; grades exported to {csv_path}"
    )
    if missing:
        print(
            "Not graded: their scores are left blank in the grades, never 0; mend the cause "
            f"named above, then {GRADE_NEXT_TIME} (and only those)."
        )
    print("Written answers need manual grading in formgrader (see docs/INSTRUCTOR_GUIDE.md).")


def summary_json(csv_path: Path) -> str:  # pragma: no cover - convenience for scripts
    with open(csv_path, newline="") as f:
        return json.dumps(list(csv.DictReader(f)), indent=1)
