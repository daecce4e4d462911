"""The course on a real multi-user JupyterHub (instructor guide, "Running the course on
JupyterHub").

The test creates Unix accounts (an instructor, three students, a course group), the
exchange of the guide, and two environments (the instructor's with the full package, the
students' with the student edition), then starts JupyterHub on 127.0.0.1 with
LocalProcessSpawner, so that each user's server and kernels run as that user. Everything
then happens through the hub, as the user concerned: the REST API (per-user tokens), the
contents API and code run in the user's own kernel. The instructor releases
01_dot_product_attention; the students fetch it and answer (a full solution, one catalogued
mistake, a blank) and submit; each student also forges a newer submission under a
classmate's name; the instructor collects, grades with `make grade`'s code path and
releases feedback; each student fetches their own feedback. Every score is asserted, then
every student tries to read or overwrite what is not theirs, and every attempt must fail.

Needs root, nodejs and configurable-http-proxy (`.ci/run` installs them). Under CI (env CI
set) a missing requirement fails the test; elsewhere it skips with the reason. Accounts,
homes, exchange and processes are removed afterwards, also when a step fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import hub as hubkit
import pytest

import catalog
from course_tools import ROOT, answer_cells
from test_class_grading import alternatives_submission, points_by_exercise
from test_grading import solved_submission

pytestmark = pytest.mark.grading

AID = "01_dot_product_attention"
COURSE_CONFIG_EXTRA = """

# ---- JupyterHub (instructor guide, "Running the course on JupyterHub") ----
c.Exchange.root = {root!r}
# nbgrader's own collect only warns about a submission folder owned by another account;
# this one ignores it, so no student can replace a classmate's submission.
c.ExchangeFactory.collect = "attention_ref.course.exchange.OwnerCheckedCollect"
"""
TIMINGS: dict[str, float] = {}


def _requirements() -> None:
    why = hubkit.missing_requirements()
    if why:
        msg = "a real JupyterHub cannot run here: " + "; ".join(why)
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must run this test; .ci/run installs the tools)")
        pytest.skip(msg)


def _nbgrader_code(cwd: str, *args: str) -> str:
    """Kernel code: run nbgrader ARGS in ``cwd`` with the kernel's own interpreter."""
    return (
        "import json, os, subprocess, sys\n"
        f"p = subprocess.run([sys.executable, '-m', {args[0]!r}, *{list(args[1:])!r}], "
        f"cwd=os.path.expanduser({cwd!r}), capture_output=True, text=True)\n"
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout[-4000:], "
        "'err': p.stderr[-4000:]}))\n"
    )


def run_tool(h, acct, cwd: str, *args: str) -> dict:
    t0 = time.time()
    res = h.run_json(acct, _nbgrader_code(cwd, *args))
    step = " ".join(args[:2])
    TIMINGS[step] = TIMINGS.get(step, 0.0) + time.time() - t0
    assert res["rc"] == 0, f"{acct.name}: python -m {' '.join(args)}:\n{res['out']}{res['err']}"
    return res


@pytest.fixture(scope="module")
def hub():
    _requirements()
    start = time.time()
    base = hubkit.new_base()
    h = None
    try:
        h = hubkit.create_accounts(base)
        hubkit.make_exchange(h)
        hubkit.make_envs(h)
        config = hubkit.write_config(h)
        _instructor_course(h)
        TIMINGS["accounts, exchange, envs"] = time.time() - start
        hubkit.start_hub(h, config)
        for acct in h.accounts:
            h.start_server(acct)
        TIMINGS["setup"] = time.time() - start
        yield h
    finally:
        if h is not None:
            hubkit.stop_hub(h)
            hubkit.remove_accounts(h)
        shutil.rmtree(base, ignore_errors=True)
        TIMINGS["total"] = time.time() - start
        print(f"\nhub test timings (s): {json.dumps({k: round(v, 1) for k, v in TIMINGS.items()})}")


def _instructor_course(h) -> None:
    """The instructor's course folder, in their private home: the repository's
    nbgrader_config.py plus the exchange settings, and the assignment's source."""
    course = h.instructor.home / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions" / AID, course / "solutions" / AID)
    text = (ROOT / "nbgrader_config.py").read_text()
    (course / "nbgrader_config.py").write_text(
        text + COURSE_CONFIG_EXTRA.format(root=str(h.exchange))
    )
    for p in [course, *course.rglob("*")]:
        os.chown(p, h.instructor.uid, -1)


def _answers() -> dict[str, tuple[dict[str, str], float]]:
    """Per student role: answer-cell sources and the expected automatic score."""
    pts = points_by_exercise(AID)
    total = sum(pts.values())
    wrong = next(e for e in catalog.MISTAKES if e.exercise == "sdpa")
    full = {k: c.source for k, c in answer_cells(solved_submission(AID)).items()}
    mistake = {k: c.source for k, c in answer_cells(alternatives_submission(AID, wrong)).items()}
    return {
        "student1": (full, total),
        "student2": (mistake, total - pts["sdpa"]),
        "student3": ({}, 0.0),  # blank: the release as fetched
    }


@pytest.fixture(scope="module")
def course_run(hub):
    """The whole workflow through the hub; returns what the later tests assert."""
    h = hub
    t0 = time.time()
    inst = h.instructor
    answers = _answers()
    result: dict = {"answers": answers}

    run_tool(h, inst, "~/course", "attention_ref.course", "release", AID)
    run_tool(h, inst, "~/course", "nbgrader", "release_assignment", AID)

    ident = {}
    for s in h.students:
        ident[s.name] = h.run_json(
            s,
            "import json, os, attention_ref\n"
            "print(json.dumps([os.getuid(), os.getcwd(), attention_ref.__file__]))",
        )
        run_tool(h, s, "~", "nbgrader", "fetch_assignment", AID)
        path = f"{AID}/{AID}.ipynb"
        model = h.get_notebook(s, path)
        nb = model["content"]
        sources, _ = answers[s.role]
        for cell in nb["cells"]:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in sources:
                cell["source"] = sources[gid]
        h.put_notebook(s, path, nb)
        run_tool(h, s, "~", "nbgrader", "submit", AID)
    result["ident"] = ident

    # Each student forges a newer submission under the next student's name.
    forged = {}
    for i, s in enumerate(h.students):
        victim = h.students[(i + 1) % len(h.students)]
        inbound = h.exchange / hubkit.COURSE_ID / "inbound"
        forged[s.name] = h.run_json(
            s,
            "import datetime, json, os, shutil\n"
            "ts = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))"
            ".strftime('%Y-%m-%d %H:%M:%S.%f UTC')\n"
            f"d = os.path.join({str(inbound)!r}, {victim.name!r} + '+' + {AID!r} + '+' + ts"
            " + '+forged')\n"
            "os.mkdir(d)\n"
            f"shutil.copy(os.path.expanduser('~/{AID}/{AID}.ipynb'), d)\n"
            "open(os.path.join(d, 'timestamp.txt'), 'w').write(ts)\n"
            "print(json.dumps({'victim': "
            f"{victim.name!r}, 'written': os.path.isdir(d)}}))",
        )
    result["forged"] = forged

    collect = run_tool(h, inst, "~/course", "nbgrader", "collect", AID)
    result["collect_log"] = collect["out"] + collect["err"]
    grade = run_tool(h, inst, "~/course", "attention_ref.course", "grade", AID)
    result["grade_log"] = grade["out"] + grade["err"]
    run_tool(h, inst, "~/course", "nbgrader", "generate_feedback", AID)
    run_tool(h, inst, "~/course", "nbgrader", "release_feedback", AID)
    result["grades"] = h.run_json(
        inst,
        "import csv, json, os\n"
        "rows = list(csv.DictReader(open(os.path.expanduser('~/course/grades.csv'))))\n"
        "print(json.dumps({r['student_id']: float(r['score']) for r in rows "
        f"if r['assignment'] == {AID!r}}}))",
    )

    feedback = {}
    for s in h.students:
        run_tool(h, s, "~", "nbgrader", "fetch_feedback", AID)
        feedback[s.name] = h.run_json(
            s,
            "import glob, json, os\n"
            f"files = glob.glob(os.path.expanduser('~/{AID}/feedback/*/{AID}.html'))\n"
            "print(json.dumps({f: open(f).read() for f in files}))",
        )
    result["feedback"] = feedback
    TIMINGS["workflow"] = time.time() - t0
    return result


def _score(html: str) -> float:
    m = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", html)
    assert m, "no score in the feedback"
    return float(m.group(1))


# ------------------------------------------------------------------------ the workflow
def test_servers_and_kernels_run_as_their_users(hub, course_run):
    for acct in hub.accounts:
        pids = hub.server_pids(acct)
        assert pids, f"no single-user server process owned by {acct.name}"
    for s in hub.students:
        uid, cwd, module = course_run["ident"][s.name]
        assert uid == s.uid and cwd == str(s.home), (s.name, uid, cwd)
        # the students' kernels import the student edition, bytecode only
        assert module == str(
            next((hub.envs["student"] / "lib").glob("python3*/site-packages"))
            / "attention_ref"
            / "__init__.pyc"
        ), module


def test_every_score_through_the_hub(hub, course_run):
    expected = {s.name: course_run["answers"][s.role][1] for s in hub.students}
    assert course_run["grades"] == expected, course_run["grade_log"]
    for s in hub.students:
        files = course_run["feedback"][s.name]
        assert len(files) == 1, f"{s.name} fetched {len(files)} feedback files"
        html = next(iter(files.values()))
        assert _score(html) == expected[s.name], s.name
        assert s.name in html or "feedback" in html.lower()


def test_forged_submissions_are_written_but_never_collected(hub, course_run):
    """A student can drop a folder named after a classmate into the inbound drop box, but
    collect ignores it (not owned by that classmate): the classmate is graded on their own
    work (asserted by the scores above)."""
    for s in hub.students:
        assert course_run["forged"][s.name]["written"]
    log = course_run["collect_log"]
    for s in hub.students:
        victim = course_run["forged"][s.name]["victim"]
        assert re.search(rf"Ignoring {victim}\+{AID}\+.*\+forged.*owned by {s.name}", log), log


# ------------------------------------------------------------------------ privacy
# (name, kernel code run as the attacking student). In the code, VICTIM is the next
# student's name, VHOME their home, EX the exchange course folder, IHOME the instructor's
# home. Each snippet must raise to count as denied; returning anything means it worked.
ATTEMPTS = {
    "list the exchange's inbound (everyone's submissions)": "os.listdir(f'{EX}/inbound')",
    "read the classmate's submission in the exchange": (
        "hits = glob.glob(f'{EX}/inbound/{VICTIM}+*/*.ipynb')\n"
        "if not hits: raise FileNotFoundError('nothing matches ' + VICTIM + '+*')\n"
        "open(hits[0]).read()"
    ),
    "overwrite the classmate's submission in the exchange": (
        "hits = glob.glob(f'{EX}/inbound/{VICTIM}+*')\n"
        "if not hits: raise FileNotFoundError('nothing matches ' + VICTIM + '+*')\n"
        "open(hits[0] + '/' + AID + '.ipynb', 'w').write('{}')"
    ),
    "overwrite the classmate's working copy": "open(f'{VHOME}/{AID}/{AID}.ipynb', 'a')",
    "list the exchange's released feedback": "os.listdir(f'{EX}/feedback')",
    "read the classmate's fetched feedback": "os.listdir(f'{VHOME}/{AID}/feedback')",
    "read the instructor's solutions/": "open(f'{IHOME}/course/solutions/{AID}/{AID}.ipynb')",
    "list the instructor's autograded/": "os.listdir(f'{IHOME}/course/autograded')",
    "read the classmate's autograded notebook": (
        "open(f'{IHOME}/course/autograded/{VICTIM}/{AID}/{AID}.ipynb')"
    ),
    "read the instructor's gradebook": "open(f'{IHOME}/course/gradebook.db', 'rb').read()",
    "query the instructor's gradebook with sqlite3": (
        "import sqlite3\n"
        "sqlite3.connect(f'file:{IHOME}/course/gradebook.db?mode=ro', uri=True)"
        ".execute('select * from grade').fetchall()"
    ),
    "show the reference sdpa with inspect.getsource": (
        "import inspect, attention_ref\ninspect.getsource(attention_ref.sdpa)"
    ),
}


def _attempt_code(name: str, code: str, h, attacker_idx: int) -> str:
    victim = h.students[(attacker_idx + 1) % len(h.students)]
    body = "\n".join("    " + line for line in code.splitlines())
    return (
        "import glob, json, os\n"
        f"VICTIM, VHOME, AID = {victim.name!r}, {str(victim.home)!r}, {AID!r}\n"
        f"EX, IHOME = {str(h.exchange / hubkit.COURSE_ID)!r}, {str(h.instructor.home)!r}\n"
        "def attempt():\n"
        f"{body}\n"
        "try:\n"
        "    r = attempt()\n"
        "    res = 'ALLOWED: ' + repr(r)[:120]\n"
        "except Exception as e:\n"
        "    res = 'denied: ' + type(e).__name__ + ': ' + str(e)[:160]\n"
        "print(json.dumps(res))\n"
    )


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_no_student_reads_or_overwrites_what_is_not_theirs(hub, course_run, name):
    rows = []
    for i, s in enumerate(hub.students):
        victim = hub.students[(i + 1) % len(hub.students)].name
        res = hub.run_json(s, _attempt_code(name, ATTEMPTS[name], hub, i))
        rows.append((s.name, victim, res))
    table = "\n".join(f"  {a:>14} -> {v:<14} {r}" for a, v, r in rows)
    print(f"\n{name}:\n{table}")
    assert all(r.startswith("denied") for _, _, r in rows), f"{name}:\n{table}"
