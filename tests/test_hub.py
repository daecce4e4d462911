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

Submitted files are data (issue 19): a fourth, hostile student (with a hub server) and
three course members acting on the drop box from their Unix accounts submit what a
student who wants a better grade would: links to the solution, the gradebook, grades.csv,
the course config, /proc/self/environ, a classmate's submission and secret; a shadowing
`attention_ref` package; a FIFO, a mode-000 file, a folder named x.html, a fan-out of
links; inbound names that stopped nbgrader's collect for everyone; a notebook that is a
link to the solution; a size bomb and a count bomb. Two submissions placed in submitted/
by hand (as from an LMS) bypass collect: a blank notebook beside a shadowing package,
and a notebook that is a link. The tests assert what became of each: the report line that
names the student and why, nothing leaked, nothing aborted, and every honest student
graded and given their own feedback, which is all the exchange publishes.

make test starts the hub and checks that each user's server and kernel run as that user
(a student's on the student edition); the workflow above is marked later (make test-later,
which CI runs after make test).

Needs root, nodejs and configurable-http-proxy (`.ci/run` installs them). Under CI (env CI
set) a missing requirement fails the test; elsewhere it skips with the reason. Accounts,
homes, exchange and processes are removed afterwards, also when a step fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

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
# this one ignores it, so no student can replace a classmate's submission; it copies only
# notebooks and the secret, regular files only, never through a link, within the caps.
c.ExchangeFactory.collect = "attention_ref.course.exchange.SafeCollect"
# Feedback only for the gradebook's notebooks, named from the instructor's copy of the secret.
c.ExchangeFactory.release_feedback = "attention_ref.course.exchange.SafeReleaseFeedback"
# `nbgrader list --inbound` opens only real submission folders of regular files.
c.ExchangeFactory.list = "attention_ref.course.exchange.SafeList"
# The caps on one submission (these are the defaults):
c.SubmissionLimits.max_bytes = 20 * 2**20
c.SubmissionLimits.max_files = 20
"""
HOSTILE = "student4"  # the fourth student, with a hub server: a hostile submission
INTRUDERS = ("linker", "bigfile", "manyfiles")  # course members without a hub server
LMS_SECRET = "5eed" * 32  # the secret of the submission placed by hand beside a package
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
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout[-30000:], "
        "'err': p.stderr[-30000:]}))\n"
    )


def run_tool(h, acct, cwd: str, *args: str, rc: int = 0) -> dict:
    t0 = time.time()
    res = h.run_json(acct, _nbgrader_code(cwd, *args))
    step = " ".join(args[:2])
    TIMINGS[step] = TIMINGS.get(step, 0.0) + time.time() - t0
    assert res["rc"] == rc, f"{acct.name}: python -m {' '.join(args)}:\n{res['out']}{res['err']}"
    return res


@pytest.fixture(scope="module")
def hub():
    _requirements()
    start = time.time()
    base = hubkit.new_base()
    h = None
    try:
        h = hubkit.create_accounts(base, n_students=4, intruders=INTRUDERS)
        hubkit.make_exchange(h)
        hubkit.make_envs(h)
        config = hubkit.write_config(h)
        _instructor_course(h)
        TIMINGS["accounts, exchange, envs"] = time.time() - start
        hubkit.start_hub(h, config)
        h.start_servers(h.accounts)
        TIMINGS["setup"] = time.time() - start
        yield h
    finally:
        if h is not None:
            hubkit.stop_hub(h)
            hubkit.remove_accounts(h)
        shutil.rmtree(base, ignore_errors=True)
        TIMINGS["total"] = time.time() - start
        # A tool's step sums its runs, also those of students working side by side.
        timings = json.dumps({k: round(v, 1) for k, v in TIMINGS.items()})
        print(f"\nhub test timings (s): {timings}")


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
        HOSTILE: ({}, 0.0),  # blank, beside a shadowing package and every link below
    }


def each_student(h, step) -> dict:
    """``step(student)`` for every student at once (threads): {student's name: result}."""
    with ThreadPoolExecutor(len(h.students)) as pool:
        futures = {s.name: pool.submit(step, s) for s in h.students}
        return {name: f.result() for name, f in futures.items()}


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

    def answer_and_submit(s):
        ident = _identity(h, s)
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
        return ident

    # The students work side by side, each in their own server, as a class does.
    result["ident"] = each_student(h, answer_and_submit)

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
    hostile = next(s for s in h.students if s.role == HOSTILE)
    result["hostile"] = h.run_json(hostile, _hostile_code(h))
    for acct in h.intruders:
        h.run_as(acct, _intruder_code(h, acct.role))
    result["tool_env"] = h.run_json(
        inst, "import json, os\nprint(json.dumps(os.environ.get('JUPYTERHUB_API_TOKEN')))"
    )

    listed = run_tool(h, inst, "~/course", "nbgrader", "list", "--inbound")
    result["list_log"] = listed["out"] + listed["err"]
    collect = run_tool(h, inst, "~/course", "nbgrader", "collect", AID)
    result["collect_log"] = collect["out"] + collect["err"]
    h.run_json(inst, LMS_CODE)
    # rc 1: the submission placed by hand with a link is not graded (the report says why)
    grade = run_tool(h, inst, "~/course", "attention_ref.course", "grade", AID, rc=1)
    result["grade_log"] = grade["out"] + grade["err"]
    run_tool(h, inst, "~/course", "nbgrader", "generate_feedback", AID)
    release = run_tool(h, inst, "~/course", "nbgrader", "release_feedback", AID)
    result["release_log"] = release["out"] + release["err"]
    result["grades"] = h.run_json(
        inst,
        "import csv, json, os\n"
        "rows = list(csv.DictReader(open(os.path.expanduser('~/course/grades.csv'))))\n"
        "print(json.dumps({r['student_id']: float(r['score']) for r in rows "
        f"if r['assignment'] == {AID!r}}}))",
    )

    def fetch_feedback(s):
        run_tool(h, s, "~", "nbgrader", "fetch_feedback", AID)
        return h.run_json(
            s,
            "import glob, json, os\n"
            f"files = glob.glob(os.path.expanduser('~/{AID}/feedback/*/{AID}.html'))\n"
            "print(json.dumps({f: open(f).read() for f in files}))",
        )

    result["feedback"] = each_student(h, fetch_feedback)
    result["evidence"] = _evidence(h)
    TIMINGS["workflow"] = time.time() - t0
    return result


# ------------------------------------------------------------------------ hostile submissions
def _names(h) -> dict:
    victim = h.students[0]
    return {
        "AID": AID,
        "EX": str(h.exchange / hubkit.COURSE_ID),
        "COURSE": str(h.instructor.home / "course"),
        "VICTIM": victim.name,
        "VHOME": str(victim.home),
    }


PRELUDE = """
import datetime, json, os, pwd, secrets, shutil
globals().update({names})
INBOUND, ME = EX + "/inbound", pwd.getpwuid(os.getuid()).pw_name

def ts(hours):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=hours)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f UTC")

def folder(hours, tag):
    d = f"{{INBOUND}}/{{ME}}+{{AID}}+{{ts(hours)}}+{{tag}}"
    os.mkdir(d)
    return d
"""

# The hostile student's newest submission: a blank notebook (their own) beside every link,
# special file and package below, and inbound names that stopped nbgrader's collect.
HOSTILE_CODE = r"""
d = folder(1, "evil")
shutil.copy(os.path.expanduser(f"~/{AID}/{AID}.ipynb"), d)
open(f"{d}/timestamp.txt", "w").write("not a time")
solution = f"{COURSE}/solutions/{AID}/{AID}.ipynb"
links = {
    "solution.ipynb": solution,
    "solution.html": solution,
    "gradebook.html": f"{COURSE}/gradebook.db",
    "grades.html": f"{COURSE}/grades.csv",
    "config.html": f"{COURSE}/nbgrader_config.py",
    "environ.html": "/proc/self/environ",
    "classmate.html": f"{COURSE}/submitted/{VICTIM}/{AID}/{AID}.ipynb",
    "classmate-graded.html": f"{COURSE}/autograded/{VICTIM}/{AID}/{AID}.ipynb",
    "zero.html": "/dev/zero",
    "submission_secret.txt": f"{COURSE}/submitted/{VICTIM}/{AID}/submission_secret.txt",
}
for name, target in links.items():
    os.symlink(target, f"{d}/{name}")
os.mkdir(f"{d}/fan")
for i in range(200):  # a fan-out of links: 200 copies of the solution, were they followed
    os.symlink(solution, f"{d}/fan/{i}.ipynb")
os.mkfifo(f"{d}/pipe.ipynb")
open(f"{d}/locked.ipynb", "w").write("{}")
os.chmod(f"{d}/locked.ipynb", 0)
os.mkdir(f"{d}/x.html")
open(f"{d}/x.html/inner.html", "w").write("x")
os.mkdir(f"{d}/attention_ref")
open(f"{d}/attention_ref/__init__.py", "w").write("")
open(f"{d}/attention_ref/checks.py", "w").write("def check(*a, **k):\n    return None\n")
open(f"{d}/attention_ref/plots.py", "w").write(
    "def plot_attention(*a, **k):\n    pass\n\n\ndef plot_score_scaling(*a, **k):\n    pass\n"
)
os.mkdir(f"{INBOUND}/{ME}+{AID}+not-a-time+x")
os.symlink(f"{COURSE}/nowhere", f"{INBOUND}/{ME}+{AID}+{ts(2)}+dangling")
os.symlink(VHOME, f"{INBOUND}/{VICTIM}+{AID}+{ts(3)}+home")
open(f"{INBOUND}/{ME}+{AID}+{ts(4)}+file", "w").write("{}")
print(json.dumps(sorted(os.listdir(d))))
"""

INTRUDER_CODE = {
    # the graded notebook is a link to the instructor's solution
    "linker": """
d = folder(0, "link")
os.symlink(f"{COURSE}/solutions/{AID}/{AID}.ipynb", f"{d}/{AID}.ipynb")
open(f"{d}/submission_secret.txt", "w").write(secrets.token_hex(64))
""",
    # one byte over the default cap (a sparse file: no disk used)
    "bigfile": """
d = folder(0, "big")
with open(f"{d}/{AID}.ipynb", "wb") as f:
    f.truncate(20 * 2**20 + 1)
""",
    # one file over the default cap
    "manyfiles": """
d = folder(0, "many")
for i in range(21):
    open(f"{d}/n{i:02}.ipynb", "w").write("{}")
""",
}

# Placed in submitted/ by the instructor (as from an LMS), never through collect.
LMS_CODE = r"""
import json, os, shutil
sub = os.path.expanduser("~/course/submitted")
blank = os.path.expanduser(f"~/course/notebooks/{AID}/{AID}.ipynb")
d = f"{sub}/lms-shadow/{AID}"
os.makedirs(f"{d}/attention_ref")
shutil.copy(blank, d)
open(f"{d}/submission_secret.txt", "w").write(LMS_SECRET)
open(f"{d}/attention_ref/__init__.py", "w").write("")
open(f"{d}/attention_ref/checks.py", "w").write("def check(*a, **k):\n    return None\n")
open(f"{d}/attention_ref/plots.py", "w").write(
    "def plot_attention(*a, **k):\n    pass\n\n\ndef plot_score_scaling(*a, **k):\n    pass\n"
)
open(f"{d}/attention_ref.py", "w").write("def check(*a, **k):\n    return None\n")
os.makedirs(f"{d}/x.html")
open(f"{d}/x.html/inner.html", "w").write("x")
open(f"{d}/notes.html", "w").write("<p>my own feedback: 7 / 7</p>")
d = f"{sub}/lms-linked/{AID}"
os.makedirs(d)
os.symlink(os.path.expanduser(f"~/course/solutions/{AID}/{AID}.ipynb"), f"{d}/{AID}.ipynb")
print(json.dumps(True))
""".replace("AID", repr(AID)).replace("LMS_SECRET", repr(LMS_SECRET))


def _hostile_code(h) -> str:
    return PRELUDE.format(names=_names(h)) + HOSTILE_CODE


def _intruder_code(h, role: str) -> str:
    return PRELUDE.format(names=_names(h)) + INTRUDER_CODE[role] + "print(json.dumps(d))\n"


def _evidence(h) -> dict:
    """What the test process (root) sees after the workflow: links in submitted/, the
    exchange's published feedback, each student's own secret (from their nbgrader cache)
    and the instructor's feedback files."""
    course = h.instructor.home / "course"
    odd = [
        str(p)
        for p in (course / "submitted").rglob("*")
        if "lms-linked" not in p.parts and (p.is_symlink() or not (p.is_dir() or p.is_file()))
    ]
    published = {
        p.name: p.read_bytes() for p in (h.exchange / hubkit.COURSE_ID / "feedback").iterdir()
    }
    secrets_ = {}
    for s in h.students:
        cache = s.home / ".local/share/jupyter/nbgrader_cache" / hubkit.COURSE_ID
        found = sorted(cache.glob(f"*+{AID}+*/submission_secret.txt"))
        secrets_[s.name] = [p.read_text() for p in found]
    secrets_["lms-shadow"] = [LMS_SECRET]
    instructor_feedback = {
        p.parts[-3]: p.read_bytes() for p in (course / "feedback").glob(f"*/{AID}/{AID}.html")
    }
    submitted = {
        str(p.relative_to(course)): p.read_bytes()
        for p in (course / "submitted").rglob("*")
        if p.is_file() and not p.is_symlink() and "lms-linked" not in p.parts
    }
    return {
        "odd": odd,
        "published": published,
        "secrets": secrets_,
        "instructor_feedback": instructor_feedback,
        "submitted": submitted,
    }


def _score(html: str) -> float:
    m = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", html)
    assert m, "no score in the feedback"
    return float(m.group(1))


# ------------------------------------------------------------------------ the workflow
def _identity(h, acct) -> list:
    """[uid, cwd, attention_ref's file] as ``acct``'s own kernel sees them."""
    return h.run_json(
        acct,
        "import json, os, attention_ref\n"
        "print(json.dumps([os.getuid(), os.getcwd(), attention_ref.__file__]))",
    )


def _assert_runs_as_its_users(hub, idents: dict) -> None:
    for acct in hub.accounts:
        pids = hub.server_pids(acct)
        assert pids, f"no single-user server process owned by {acct.name}"
    for s in hub.students:
        uid, cwd, module = idents[s.name]
        assert uid == s.uid and cwd == str(s.home), (s.name, uid, cwd)
        # the students' kernels import the student edition, bytecode only
        assert module == str(
            next((hub.envs["student"] / "lib").glob("python3*/site-packages"))
            / "attention_ref"
            / "__init__.pyc"
        ), module


def test_each_users_server_and_kernel_run_as_that_user(hub):
    """make test's run of the hub (the course's whole workflow through it, below, is make
    test-later's): the hub started with real accounts, each user's server and kernel."""
    _assert_runs_as_its_users(hub, each_student(hub, lambda s: _identity(hub, s)))
    uid, _, module = _identity(hub, hub.instructor)
    assert uid == hub.instructor.uid and module.endswith("attention_ref/__init__.py"), module


def test_code_run_through_the_hub_outlives_its_websocket_closing(hub, monkeypatch):
    """A kernel's websocket closed before the reply (as one has on a loaded machine): the
    client reconnects to the same session, gets what the server kept meanwhile, and the code
    ran once. Here the first websocket is closed 2 s into a 6 s run."""
    acct = hub.students[0]
    session = uuid.uuid4().hex
    mark = acct.home / f"ran-{session}"  # a file in the student's home counts the runs
    code = (
        "import json, time\n"
        f"open({str(mark)!r}, 'a').write('x')\n"
        "time.sleep(6)\n"
        f"print(json.dumps(len(open({str(mark)!r}).read())))"
    )
    connect, closed = hub._connect, []

    async def closing_the_first(*args):
        conn = await connect(*args)
        if not closed:
            closed.append(time.time())
            asyncio.get_running_loop().call_later(2, conn.close)
        return conn

    monkeypatch.setattr(hub, "_connect", closing_the_first)
    t0 = time.time()
    assert hub.run_json(acct, code, 120, session) == 1, "the code ran again after the reconnect"
    assert time.time() - t0 > 6 and closed, "the websocket was not closed during the run"
    log = hub.log.read_text(errors="replace")
    kid = hub.kernel(acct)  # the kernel that ran it
    assert f"Restoring connection for {kid}:{session}" in log, "no reconnect to the session"
    mark.unlink()


def test_a_kernel_that_answers_nothing_is_replaced_and_the_code_runs_once(hub, monkeypatch):
    """Two websockets closed with nothing in reply (a kernel that never answered, as one did
    on a loaded machine): the kernel is shut down and a new one runs the code. Here the
    first two websockets drop the request and close after 1 s."""
    acct = hub.students[1]
    old = hub.kernel(acct)
    connect, dropped = hub._connect, []

    async def dropping_the_first_two(*args):
        conn = await connect(*args)
        if len(dropped) < 2:
            dropped.append(conn)
            conn.write_message = lambda *a, **k: None  # the request never reaches the kernel
            asyncio.get_running_loop().call_later(1, conn.close)
        return conn

    monkeypatch.setattr(hub, "_connect", dropping_the_first_two)
    assert hub.run_json(acct, "import json\nprint(json.dumps(6 * 7))", 120) == 42
    assert len(dropped) == 2 and hub.kernel(acct) != old, "the silent kernel was kept"


@pytest.mark.later
def test_servers_and_kernels_run_as_their_users(hub, course_run):
    _assert_runs_as_its_users(hub, course_run["ident"])


def _honest(hub) -> list:
    return [s for s in hub.students if s.role != HOSTILE]


@pytest.mark.later
def test_every_score_through_the_hub(hub, course_run):
    """The honest students keep their marks; the hostile student's blank notebook and the
    blank one placed by hand beside a shadowing package score 0 (neither package was
    imported); the submissions that were links or over a cap are not graded at all."""
    expected = {s.name: course_run["answers"][s.role][1] for s in hub.students}
    expected["lms-shadow"] = 0.0
    assert course_run["grades"] == expected, course_run["grade_log"]
    ev = course_run["evidence"]
    for s in _honest(hub):
        files = course_run["feedback"][s.name]
        assert len(files) == 1, f"{s.name} fetched {len(files)} feedback files"
        html = next(iter(files.values()))
        assert _score(html) == expected[s.name], s.name
        # their own: the very file the instructor generated for them
        assert html.encode() == ev["instructor_feedback"][s.name], s.name


@pytest.mark.later
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


# ------------------------------------------------------------------------ hostile files
def _line(log: str, student: str, pattern: str) -> None:
    assert re.search(rf"{re.escape(student)}: .*{pattern}", log, re.M), (
        f"{student}: {pattern}\n{log}"
    )


@pytest.mark.later
def test_collect_leaves_every_link_and_special_file_behind_and_says_why(hub, course_run):
    log = course_run["collect_log"]
    mallory = next(s for s in hub.students if s.role == HOSTILE).name
    links = [
        "solution.ipynb",
        "solution.html",
        "gradebook.html",
        "grades.html",
        "config.html",
        "environ.html",
        "classmate.html",
        "classmate-graded.html",
        "zero.html",
        "submission_secret.txt",
    ]
    for name in links:
        _line(log, mallory, rf"left behind .*'{re.escape(name)}': a symbolic link")
    _line(log, mallory, r"'pipe.ipynb': a FIFO")
    _line(log, mallory, r"'locked.ipynb': cannot be read \(Permission denied\)")
    for name in ("x.html", "fan", "attention_ref"):
        _line(log, mallory, rf"'{re.escape(name)}': a folder")
    _line(log, mallory, rf"collected {AID}.ipynb \(\d+ bytes\); no valid submission secret")
    # inbound names that stopped nbgrader's collect for the whole class
    _line(log, mallory, r"not-a-time\+x': its timestamp does not parse")
    _line(log, mallory, r"\+dangling': a symbolic link .*not a folder")
    _line(log, mallory, r"\+file': a regular file, not a folder")
    victim = hub.students[0].name
    assert re.search(rf"Ignoring {victim}\+{AID}\+.*\+home: .* owned by {mallory}", log), log
    by_role = {a.role: a.name for a in hub.intruders}
    _line(log, by_role["linker"], rf"'{AID}.ipynb': a symbolic link")
    _line(log, by_role["linker"], r"NOT collected .*: no notebook in it")
    _line(log, by_role["bigfile"], r"NOT collected .*: more than 20 MiB")
    _line(log, by_role["manyfiles"], r"NOT collected .*: more than 20 files")
    for s in _honest(hub):
        _line(log, s.name, rf"collected {AID}.ipynb \(\d+ bytes\)$")
    ev = course_run["evidence"]
    assert ev["odd"] == [], ev["odd"]  # submitted/ holds folders and regular files only
    collected = {k.split("/")[1] for k in ev["submitted"]}
    assert collected == {*(s.name for s in hub.students), "lms-shadow"}, collected
    assert sorted(k for k in ev["submitted"] if f"/{mallory}/" in f"/{k}") == [
        f"submitted/{mallory}/{AID}/{AID}.ipynb",
        f"submitted/{mallory}/{AID}/timestamp.txt",
    ]


@pytest.mark.later
def test_the_instructors_inbound_list_skips_what_it_must_not_open(hub, course_run):
    """nbgrader's own list would block on the hostile FIFO notebook, or stop at its
    mode-000 one, before listing anyone."""
    log = course_run["list_log"]
    mallory = next(s for s in hub.students if s.role == HOSTILE).name
    _line(log, mallory, r"\+evil' not listed: 'locked.ipynb' cannot be read")
    for s in _honest(hub):
        assert re.search(rf"{hubkit.COURSE_ID} {s.name} {AID} ", log), log


@pytest.mark.later
def test_make_grade_refuses_a_linked_submission_and_imports_no_submitted_package(hub, course_run):
    log = course_run["grade_log"]
    assert re.search(
        rf"lms-linked .*refused\n\s+- not graded: '{AID}.ipynb' is a symbolic link", log
    ), log
    assert re.search(r"lms-shadow\s+0(\.0)? /", log), log


@pytest.mark.later
def test_nothing_instructor_only_reaches_submitted_or_published_files(hub, course_run):
    ev = course_run["evidence"]
    token = course_run["tool_env"]
    assert token, "the instructor's tools run with JUPYTERHUB_API_TOKEN (the attack's target)"
    markers = [b"BEGIN SOLUTION", b"BEGIN HIDDEN TESTS", b"SQLite format 3", b"ExchangeFactory"]
    markers.append(token.encode())
    places = {**ev["submitted"], **{f"published/{k}": v for k, v in ev["published"].items()}}
    for s in hub.students:
        for path, text in course_run["feedback"][s.name].items():
            places[path] = text.encode()
    for where, data in places.items():
        for m in markers:
            assert m not in data, f"{m!r} in {where}"


@pytest.mark.later
def test_feedback_goes_to_its_own_student_and_nothing_else_is_published(hub, course_run):
    """The exchange's feedback folder holds exactly one file per released submission,
    named from that submission's own secret (read here from the student's own cache) and
    identical to what generate_feedback wrote for them: no x.html, no notes.html, nothing
    under the hostile student's name (their secret was a link to a classmate's)."""
    ev = course_run["evidence"]

    def name(secret: str) -> str:
        return hashlib.md5((secret + AID).encode()).hexdigest() + ".html"

    expected = {}
    for student in [*(s.name for s in _honest(hub)), "lms-shadow"]:
        (secret,) = ev["secrets"][student]
        expected[name(secret)] = ev["instructor_feedback"][student]
    assert set(ev["published"]) == set(expected), course_run["release_log"]
    for fname, data in expected.items():
        assert ev["published"][fname] == data, fname
    mallory = next(s for s in hub.students if s.role == HOSTILE).name
    assert course_run["feedback"][mallory] == {}
    log = course_run["release_log"]
    _line(log, mallory, "feedback NOT released: no submission secret")
    for student in [*(s.name for s in _honest(hub)), "lms-shadow"]:
        _line(log, student, f"released {AID}.html")


@pytest.mark.later
def test_the_process_that_reads_submitted_files_holds_no_credential(course_run):
    """collect runs with the instructor's environment (here: their kernel's, holding
    JUPYTERHUB_API_TOKEN); the process that reads the students' files holds only the
    variables of COPIER_ENV."""
    from attention_ref.course.exchange import COPIER_ENV

    m = re.search(r"environment holds only: (.*)", course_run["collect_log"])
    assert m, course_run["collect_log"]
    seen = set(m.group(1).split(", "))
    assert seen <= set(COPIER_ENV) and "PATH" in seen, seen


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
@pytest.mark.later
def test_no_student_reads_or_overwrites_what_is_not_theirs(hub, course_run, name):
    rows = []
    for i, s in enumerate(hub.students):
        victim = hub.students[(i + 1) % len(hub.students)].name
        res = hub.run_json(s, _attempt_code(name, ATTEMPTS[name], hub, i))
        rows.append((s.name, victim, res))
    table = "\n".join(f"  {a:>14} -> {v:<14} {r}" for a, v, r in rows)
    print(f"\n{name}:\n{table}")
    assert all(r.startswith("denied") for _, _, r in rows), f"{name}:\n{table}"
