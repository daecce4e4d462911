"""``make grade``: autograde every submission, say what went wrong, export the grades.

nbgrader does the grading. This module adds what an instructor needs around it:

- every notebook runs in a sandbox of its own (:mod:`attention_ref.trust.sandbox`);
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
import sys
from pathlib import Path

import nbformat

from ..trust import sandbox, secret, trusted
from . import cluster
from .autograde import GRADE_NEXT_TIME, NOT_GRADED, Outcome, _result_text, submission_seconds
from .cell_limits import CellLimits
from .exchange import HUB_CREDENTIALS, SubmissionLimits, submission_problem
from .plumbing import assignments, nbgrader, nbgrader_api, ungraded
from .students import accepted


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

    try:
        where = cluster.ClusterConfig.from_env()
        where.security()  # a tls:// scheduler's certificates, before anything is graded
    except cluster.ClusterRefusedError as err:
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
            # The seeds of the graded checks (trust/secret.py): the checkers of this
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
    except cluster.ClusterRefusedError as err:
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
