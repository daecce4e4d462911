"""``make report``: what the class got wrong, from the gradebook and the graded notebooks.

For every assignment and exercise it counts the submissions that passed, failed, hit the
per-cell time limit or a cap of the sandbox, or did not attempt the exercise (its answer
cell still the stub); the named mistakes, counted by the stable id each check prints on
the last line of its feedback (``[mistake: <id>]``; an id that is not in the mistakes
table, attention_ref/checks/mistakes.py, is not counted), most common first, each with
one anonymised example of that feedback (escaped: the page shows it as text); and the
distribution of scores. It writes one self-contained HTML page (figures embedded as PNG)
and a CSV of the same counts. Neither names a student unless ``names`` is asked for
(instructors show the page in class).

It also writes the grades in the import formats of Canvas and Moodle gradebooks
(:func:`write_canvas`, :func:`write_moodle`): one row per student, one column per
assignment.
"""

from __future__ import annotations

import base64
import csv
import functools
import html
import importlib.util
import io
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .anonymity import anonymise
from .plumbing import nbgrader_api, ungraded
from .plumbing import stop_reason as stopped_by
from .similarity import write_similarity

#: An exercise's outcome in one submission, in the order the report lists them.
OUTCOMES = ("passed", "failed", "time limit", "resource cap", "not attempted")
STUB = "raise NotImplementedError"
UNNAMED = "(no mistake named)"
#: The id a check names when a call of the learner's code ran past the check's own time
#: limit: that exercise hit a time limit, as one stopped by the per-cell limit did.
TIME_LIMIT_MISTAKE = "infinite_loop"


@dataclass
class Exercise:
    name: str
    outcomes: Counter = field(default_factory=Counter)
    mistakes: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    by_student: dict[str, str] = field(default_factory=dict)  # for --names only


@dataclass
class Assignment:
    name: str
    max_score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)  # student: score (submitted)
    not_submitted: int = 0
    exercises: dict[str, Exercise] = field(default_factory=dict)
    #: every student's id, names and email (removed from what the report shows)
    people: list[str] = field(default_factory=list)
    #: submissions in which some cell (an exercise's or not) hit a limit: "time", a cap
    stopped: Counter = field(default_factory=Counter)


def feedback_of(cell) -> str:
    """The feedback in a test cell's error output: the message of the check's failure
    (an AssertionError), the one that names a mistake if several do."""
    texts = [
        o.get("evalue", "") for o in cell.get("outputs", []) if o.get("output_type") == "error"
    ]
    return next((t for t in texts if _mistake_id(t)), texts[-1] if texts else "")


@functools.cache
def _mistakes_module():
    """attention_ref/checks/mistakes.py, loaded by its path: it imports nothing, while
    the checks package imports PyTorch and every exercise's checks."""
    path = Path(__file__).resolve().parents[1] / "checks" / "mistakes.py"
    spec = importlib.util.spec_from_file_location("_attention_ref_mistakes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mistake_id(feedback: str) -> str:
    """The stable id the feedback names (its ``[mistake: <id>]`` line), or "" when it names
    none or an id that is not in the mistakes table (graded code can print any text: a
    forged id is not counted)."""
    mistakes = _mistakes_module()
    mid = mistakes.mistake_id(feedback)
    return mid if mid in mistakes.MISTAKES else ""


def _cells_by_id(nb) -> dict[str, object]:
    return {
        c.metadata["nbgrader"]["grade_id"]: c
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade_id")
    }


def _require_gradebook(db_url: str) -> None:
    """Refuse a sqlite gradebook that does not exist (opening it would create an empty
    one): nothing was graded here yet."""
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///") :].split("?")[0])
        if not path.is_file():
            raise SystemExit(
                f"error: no gradebook at {path}: grade first (`make grade`), or set "
                "NBGRADER_DB_URL to the course's gradebook"
            )


def collect(root: Path, requested: list[str] | None = None) -> list[Assignment]:
    """Read the gradebook and every graded notebook of ``requested`` (default: all)."""
    from nbgrader.api import Gradebook, MissingEntry  # noqa: PLC0415

    api = nbgrader_api(root)
    _require_gradebook(api.coursedir.db_url)
    report = []
    with Gradebook(api.coursedir.db_url) as gb:
        students = {s.id: [s.id, s.first_name, s.last_name, s.email] for s in gb.students}
        for a in sorted(gb.assignments, key=lambda a: a.name):
            if requested and a.name not in requested:
                continue
            rep = Assignment(a.name, float(a.max_score or 0))
            rep.people = [w for who in students.values() for w in who if w]
            for name in _exercise_order(root, api.coursedir.source_directory, a.name):
                rep.exercises[name] = Exercise(name)
            for sid in sorted(students):
                try:
                    sub = gb.find_submission(a.name, sid)
                except MissingEntry:
                    rep.not_submitted += 1
                    continue
                rep.scores[sid] = float(sub.score or 0)
                grades = {
                    g.name: (float(g.score or 0), float(g.max_score or 0))
                    for nb in sub.notebooks
                    for g in nb.grades
                }
                graded = Path(
                    api.coursedir.format_path(api.coursedir.autograded_directory, sid, a.name)
                )
                for nb_path in sorted(graded.glob("*.ipynb")):
                    _read_notebook(rep, sid, nb_path, grades, students[sid])
            report.append(rep)
    return report


def _submitted_directory(root: Path) -> str:
    """The course's submitted/ folder, as nbgrader's configuration names it."""
    return nbgrader_api(root).coursedir.submitted_directory


def _exercise_order(root: Path, source_dir: str, aid: str) -> list[str]:
    """The exercises of ``aid`` (its test cells ``test_<exercise>``) in notebook order."""
    order = []
    for nb_path in sorted((root / source_dir / aid).glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        order += [g[len("test_") :] for g in _cells_by_id(nb) if g.startswith("test_")]
    return order


def _read_notebook(rep: Assignment, sid: str, nb_path: Path, grades: dict, who: list[str]):
    nb = nbformat.read(nb_path, as_version=4)
    cells = _cells_by_id(nb)
    stops = {stopped_by(c) for c in nb.cells} - {None}
    for what in stops:
        rep.stopped["time limit" if what == "time" else what] += 1
    for gid, (score, max_score) in grades.items():
        if not gid.startswith("test_"):
            continue
        name = gid[len("test_") :]
        ex = rep.exercises.setdefault(name, Exercise(name))
        answer, test = cells.get(name), cells.get(gid)
        stop = next(filter(None, (stopped_by(c) for c in (answer, test) if c is not None)), None)
        feedback = feedback_of(test) if test is not None else ""
        mid = _mistake_id(feedback)
        if answer is not None and STUB in answer.source:
            outcome = "not attempted"
        elif max_score and score >= max_score:
            outcome = "passed"
        elif stop == "time" or mid == TIME_LIMIT_MISTAKE:
            outcome = "time limit"
        elif stop:
            outcome = "resource cap"
        else:
            outcome = "failed"
            mid = mid or UNNAMED
        if outcome not in ("passed", "not attempted") and mid:
            ex.mistakes[mid] += 1
            if mid not in ex.examples and feedback:
                ex.examples[mid] = anonymise(feedback, who)
        ex.outcomes[outcome] += 1
        ex.by_student[sid] = outcome


# ----------------------------------------------------------------------------- outputs
CSV_FIELDS = ("assignment", "exercise", "kind", "name", "count")


def count_rows(report: list[Assignment], names: bool = False) -> list[dict]:
    """The CSV's rows: outcomes and mistakes per exercise, scores per assignment."""
    rows = []
    for a in report:
        rows.append(_row(a.name, "", "submissions", "submitted", len(a.scores)))
        rows.append(_row(a.name, "", "submissions", "not submitted", a.not_submitted))
        for what, n in sorted(a.stopped.items()):
            rows.append(_row(a.name, "", "submissions stopped", what, n))
        for score, n in sorted(Counter(a.scores.values()).items()):
            rows.append(_row(a.name, "", "score", f"{score:g}", n))
        for ex in a.exercises.values():
            for o in OUTCOMES:
                rows.append(_row(a.name, ex.name, "outcome", o, ex.outcomes[o]))
            for mid, n in _ranked(ex.mistakes):
                rows.append(_row(a.name, ex.name, "mistake", mid, n))
        if names:
            for sid, score in a.scores.items():
                rows.append(_row(a.name, "", "student score", sid, f"{score:g}"))
            for ex in a.exercises.values():
                for sid, o in ex.by_student.items():
                    rows.append(_row(a.name, ex.name, f"student {o}", sid, 1))
    return rows


def _row(*values) -> dict:
    return dict(zip(CSV_FIELDS, values, strict=True))


def _ranked(c: Counter) -> list[tuple[str, int]]:
    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))


def _pyplot():
    """matplotlib's pyplot on the file-only backend (imported when a figure is drawn)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _png(fig) -> str:
    """The figure as base64 PNG for the page; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _mistake_chart(ex: Exercise, top: int = 8) -> str:
    plt = _pyplot()
    ranked = _ranked(ex.mistakes)[:top][::-1]
    fig, ax = plt.subplots(figsize=(6, 0.32 * len(ranked) + 0.9))
    ax.barh([m for m, _ in ranked], [n for _, n in ranked], height=0.6, color="#c0504d")
    ax.set_xlabel("students")
    ax.set_title(f"{ex.name}: most common mistakes")
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _png(fig)


def _score_histogram(a: Assignment) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.6))
    top = math.ceil(max(a.max_score, max(a.scores.values(), default=0.0), 1.0))
    step = max(1, math.ceil(top / 20))
    edges = [x - 0.5 * step for x in range(0, top + 2 * step, step)]
    ax.hist(list(a.scores.values()), bins=edges, color="#4f81bd", edgecolor="white")
    ax.set_xlabel(f"score (out of {a.max_score:g})")
    ax.set_ylabel("submissions")
    ax.set_title(f"{a.name}: scores of {len(a.scores)} submission(s)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    return _png(fig)


STYLE = """
body { font-family: sans-serif; max-width: 60em; margin: 1em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: right; }
th:first-child, td:first-child, .text { text-align: left; }
pre { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; font-size: 0.85em; }
img { max-width: 100%; }
"""


def _stopped_words(what: str) -> str:
    if what == "time limit":
        return "hit the per-cell time limit"
    return f"hit the sandbox's cap on {what}"


def _message(mistake_id: str) -> str:
    """What the mistake ``mistake_id`` is, as the checks word it ("" for a tag)."""
    m = _mistakes_module().MISTAKES.get(mistake_id)
    return re.sub(r"\{\w+\}", "...", str(m)) if m is not None else ""


def render_html(
    report: list[Assignment], names: bool = False, similarity_page: str | None = None
) -> str:
    """The class report's page; ``similarity_page``, if given, is linked at its end."""
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>",
        f"<style>{STYLE}</style></head><body><h1>Class report</h1>",
    ]
    for a in report:
        parts.append(f"<h2>{e(a.name)}</h2>")
        parts.append(
            f"<p>{len(a.scores)} submission(s), {a.not_submitted} student(s) did not submit. "
            + "".join(
                f"{n} {e(_stopped_words(w))} in some cell. " for w, n in sorted(a.stopped.items())
            )
            + "</p>"
        )
        if a.scores:
            parts.append(
                f"<img alt='scores of {e(a.name)}' src='data:image/png;base64,"
                f"{_score_histogram(a)}'>"
            )
        head = "".join(f"<th>{e(o)}</th>" for o in OUTCOMES)
        parts.append(f"<table><tr><th>exercise</th>{head}</tr>")
        for ex in a.exercises.values():
            cells = "".join(f"<td>{ex.outcomes[o]}</td>" for o in OUTCOMES)
            parts.append(f"<tr><td>{e(ex.name)}</td>{cells}</tr>")
        parts.append("</table>")
        for ex in a.exercises.values():
            if not ex.mistakes:
                continue
            parts.append(f"<h3>{e(ex.name)}: mistakes</h3>")
            parts.append(
                f"<img alt='mistakes in {e(ex.name)}' src='data:image/png;base64,"
                f"{_mistake_chart(ex)}'>"
            )
            parts.append("<table><tr><th>mistake id</th><th>students</th>")
            parts.append("<th class='text'>the mistake</th></tr>")
            for mid, n in _ranked(ex.mistakes):
                what = e(_message(mid))
                parts.append(f"<tr><td>{e(mid)}</td><td>{n}</td><td class='text'>{what}</td></tr>")
            parts.append("</table>")
            for mid, _ in _ranked(ex.mistakes):
                if mid in ex.examples:
                    parts.append(
                        f"<details><summary>feedback for {e(mid)}</summary>"
                        f"<pre>{e(ex.examples[mid])}</pre></details>"
                    )
        if names:
            parts.append("<h3>Students</h3><table><tr><th>student</th><th>score</th>")
            parts.append("".join(f"<th>{e(x)}</th>" for x in a.exercises) + "</tr>")
            for sid, score in a.scores.items():
                row = "".join(
                    f"<td>{e(ex.by_student.get(sid, ''))}</td>" for ex in a.exercises.values()
                )
                parts.append(f"<tr><td>{e(sid)}</td><td>{score:g}</td>{row}</tr>")
            parts.append("</table>")
    if similarity_page:
        parts.append(
            "<h2>Similar answers</h2><p>Pairs of answers similar enough to be worth a look, "
            f"for the instructor only: <a href='{e(similarity_page)}'>"
            f"{e(similarity_page)}</a>. A list to look at, not a verdict; it changes no "
            "grade.</p>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- LMS exports
#: Canvas's gradebook import: the student columns it reads (it matches a row by ID, SIS
#: User ID or SIS Login ID, and wants Section), then one column per assignment.
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
#: Moodle's CSV grade import: the user fields one may "map from" (Username, ID number or
#: Email address to username, useridnumber or useremail), then one column per item.
MOODLE_COLUMNS = ("First name", "Last name", "Username", "ID number", "Email address")


def _grade_table(root: Path):
    """``(assignments, [(student, {assignment: score})])`` from the gradebook; a student
    who did not submit an assignment scores 0 in it, as nbgrader's own export says; a
    submission that was not graded (the grader failed: :func:`.plumbing.ungraded`) has no
    score (None), never 0."""
    from nbgrader.api import Gradebook, MissingEntry  # noqa: PLC0415

    api = nbgrader_api(root)
    _require_gradebook(api.coursedir.db_url)
    blank = ungraded(root)
    with Gradebook(api.coursedir.db_url) as gb:
        aids = sorted(a.name for a in gb.assignments)
        rows = []
        for s in sorted(gb.students, key=lambda s: s.id):
            scores: dict[str, float | None] = {}
            for aid in aids:
                if (s.id, aid) in blank:
                    scores[aid] = None
                    continue
                try:
                    scores[aid] = float(gb.find_submission(aid, s.id).score or 0)
                except MissingEntry:
                    scores[aid] = 0.0
            rows.append(({"id": s.id, "first": s.first_name, "last": s.last_name,
                          "email": s.email}, scores))  # fmt: skip
    return aids, rows


def _score(score: float | None) -> str:
    """A grade file's cell: the score, or blank for a submission not graded."""
    return "" if score is None else f"{score:g}"


def write_canvas(root: Path, out: Path) -> Path:
    aids, rows = _grade_table(root)
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*CANVAS_COLUMNS, *aids])
        for s, scores in rows:
            name = ", ".join(x for x in (s["last"], s["first"]) if x) or s["id"]
            w.writerow([name, "", s["id"], s["id"], "", *(_score(scores[a]) for a in aids)])
    return out


def write_moodle(root: Path, out: Path) -> Path:
    aids, rows = _grade_table(root)
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([*MOODLE_COLUMNS, *aids])
        for s, scores in rows:
            w.writerow(
                [s["first"] or "", s["last"] or "", s["id"], s["id"], s["email"] or "",
                 *(_score(scores[a]) for a in aids)]
            )  # fmt: skip
    return out


#: The report's folders, one per audience (``make report`` writes all three).
#: ``class``: counts and outcomes, no student named: safe on a projector or in an email.
CLASS_FOLDER = "class"
#: ``instructor``: what names or singles out students (the similar answers; the report
#: itself when asked for names): for the instructor's eyes only.
INSTRUCTOR_FOLDER = "instructor"
#: ``lms``: the grade files for Canvas and Moodle (names, ids, e-mails, scores): to import.
LMS_FOLDER = "lms"
README_TEXT = """\
What each folder of this report is for (written by `make report`):

class/       report.html and report.csv: per exercise, how many passed, failed, hit a limit
             or did not attempt it, the named mistakes and the scores. No student is named:
             safe to show the class.
instructor/  similarity.html and .csv: answers similar enough between submissions to be
             worth a look (a list to look at, not a verdict). With --names, the report
             that names each student is written here too, never in class/.
             For the instructor's eyes only.
lms/         canvas_grades.csv and moodle_grades.csv: the grades to import into Canvas or
             Moodle (names, ids, e-mails; a submission not graded is left blank, never 0).
             Import them; do not share them.
"""


def report(
    root: Path,
    requested: list[str] | None = None,
    out_dir: str | os.PathLike = "report",
    names: bool = False,
    lms: bool = True,
) -> Path:
    """Write the class report to ``out_dir``, one folder per audience: ``class/``
    (report.html and report.csv, no student named), ``instructor/`` (the similar answers;
    the report itself instead of ``class/`` when ``names``), ``lms/`` (the Canvas and
    Moodle grade files), and a README.txt that says which is which; returns ``out_dir``."""
    out = Path(out_dir)
    if not out.is_absolute():
        out = root / out
    data = collect(root, requested)
    unknown = sorted(set(requested or []) - {a.name for a in data})
    if unknown:
        raise SystemExit(
            f"error: no grades for assignment(s) {', '.join(unknown)} in the gradebook"
        )
    instructor = out / INSTRUCTOR_FOLDER
    instructor.mkdir(parents=True, exist_ok=True)
    similar = write_similarity(
        root,
        [a.name for a in data],
        instructor,
        names,
        _submitted_directory(root),
        private=sorted({w for a in data for w in a.people}),
    )
    # A report that names students is the instructor's; the class's names nobody and does
    # not point to the list of similar answers.
    audience = instructor if names else out / CLASS_FOLDER
    audience.mkdir(parents=True, exist_ok=True)
    (audience / "report.html").write_text(
        render_html(data, names, similarity_page=similar[0].name if names else None),
        encoding="utf-8",
    )
    with open(audience / "report.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(count_rows(data, names))
    written = [audience / "report.html", audience / "report.csv", *similar]
    if lms:
        (out / LMS_FOLDER).mkdir(exist_ok=True)
        written.append(write_canvas(root, out / LMS_FOLDER / "canvas_grades.csv"))
        written.append(write_moodle(root, out / LMS_FOLDER / "moodle_grades.csv"))
    (out / "README.txt").write_text(README_TEXT, encoding="utf-8")
    for p in written:
        print(f"wrote {p}")
    return out
