"""Submitted files are data (attention_ref/course/exchange.py), without a hub.

The course's collect, feedback release and ``make grade``'s check on hostile submission
folders built here: links of every kind (to the instructor's files, to /dev/zero,
dangling, a folder), FIFOs, sockets, devices, folders named like files, a shadowing
package, secrets that are links or not secrets, size and count bombs, malformed and forged
inbound names. Each must be left behind or refused with a line naming the student and the
reason, and every other submission must be collected or released as usual, whatever the
directory order. The same attacks through a real JupyterHub: tests/test_hub.py.

Collecting from several Unix accounts needs root (the test gives inbound folders to
system accounts); under CI a missing requirement fails the test, elsewhere it skips.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import pwd
import re
import secrets
import socket
import stat
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from attention_ref.course import exchange, grading
from attention_ref.course.exchange import (
    COPIER_ENV,
    MAX_ENTRIES,
    SafeCollect,
    SafeReleaseFeedback,
    SubmissionLimits,
    copy_submission,
    run_copier,
    submission_problem,
)

AID = "01_dot_product_attention"
COURSE = "attention-from-scratch"
LEAK = "INSTRUCTOR-ONLY-3e9a"  # in every file a link points at; must never be copied
NB = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n'


@pytest.fixture(autouse=True)
def _venv_on_path(monkeypatch):
    """nbgrader's gradebook runs ``alembic`` by name: this environment's."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def need_root() -> None:
    if os.geteuid() != 0:
        msg = "needs root: inbound folders owned by several accounts"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI runs as root)")
        pytest.skip(msg)


def hex_secret() -> str:
    return secrets.token_hex(64)


def stamp(minutes: int = 0) -> str:
    t = datetime(2026, 1, 5, 12, 0, 0) + timedelta(minutes=minutes)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def instructor_files(base: Path) -> dict[str, Path]:
    """What a hostile submission links to: files only the instructor should see."""
    d = base / "instructor"
    d.mkdir()
    files = {}
    for name in ("solution.ipynb", "gradebook.db", "grades.csv", "secret.txt"):
        files[name] = d / name
        files[name].write_text(f"{LEAK} {name}\n")
    files["folder"] = d
    return files


def hostile_folder(folder: Path, targets: dict[str, Path], secret_link: Path | None) -> None:
    """Every shape that is not a notebook or a valid secret, plus one honest notebook."""
    folder.mkdir(parents=True)
    (folder / f"{AID}.ipynb").write_text(NB)
    (folder / "timestamp.txt").write_text("not a time at all")
    (folder / "solution.ipynb").symlink_to(targets["solution.ipynb"])
    (folder / "gradebook.html").symlink_to(targets["gradebook.db"])
    (folder / "grades.html").symlink_to(targets["grades.csv"])
    (folder / "environ.html").symlink_to("/proc/self/environ")
    (folder / "zero.ipynb").symlink_to("/dev/zero")
    (folder / "dangling.ipynb").symlink_to(folder / "nothing-here")
    (folder / "linked-folder").symlink_to(targets["folder"])
    if secret_link is not None:
        (folder / "submission_secret.txt").symlink_to(secret_link)
    os.mkfifo(folder / "fifo.ipynb")
    short = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path has at most 107 bytes
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(short / "s"))
    os.rename(short / "s", folder / "socket.ipynb")
    short.rmdir()
    if os.geteuid() == 0:
        os.mknod(folder / "device.ipynb", 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    (folder / "x.html").mkdir()
    (folder / "x.html" / "inner.txt").write_text("x")
    (folder / "fan").mkdir()
    for i in range(50):
        (folder / "fan" / f"l{i}.ipynb").symlink_to(targets["solution.ipynb"])
    pkg = folder / "attention_ref"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def check(*a, **k):\n    return None\n")
    (folder / "attention_ref.py").write_text("check = None\n")
    (folder / "notes.html").write_text("<p>my own feedback: 7/7</p>")
    (folder / ".ipynb_checkpoints").mkdir()


# ------------------------------------------------------------------------ the copier
def test_the_copier_takes_only_regular_notebooks_and_the_secret(tmp_path):
    targets = instructor_files(tmp_path)
    src = tmp_path / "src"
    hostile_folder(src, targets, secret_link=targets["secret.txt"])
    dest = tmp_path / "dest"
    dest.mkdir()
    job = {"src": str(src), "dest": str(dest), "owner": os.geteuid()}
    (res,), env = run_copier([{**job, "max_bytes": 2**20, "max_files": 20, "ignore": []}], 60)
    assert res["refused"] is None, res
    assert sorted(os.listdir(dest)) == [f"{AID}.ipynb"], res
    assert (dest / f"{AID}.ipynb").read_text() == NB
    dropped = dict(res["dropped"])
    links = [
        "solution.ipynb",
        "gradebook.html",
        "grades.html",
        "environ.html",
        "zero.ipynb",
        "dangling.ipynb",
        "linked-folder",
        "submission_secret.txt",
    ]
    for name in links:
        assert dropped[name].startswith("a symbolic link"), (name, dropped)
    assert dropped["fifo.ipynb"] == "a FIFO"
    assert dropped["socket.ipynb"] == "a socket"
    if os.geteuid() == 0:
        assert dropped["device.ipynb"] == "a device"
    for name in ("x.html", "fan", "attention_ref", ".ipynb_checkpoints"):
        assert dropped[name] == "a folder", name
    for name in ("attention_ref.py", "notes.html"):
        assert dropped[name].startswith("not a notebook"), name
    assert "timestamp.txt" not in dropped  # written by the collector from the folder name
    assert res["bytes"] == len(NB)
    assert set(env) <= set(COPIER_ENV), env


def test_the_copier_process_sees_no_credentials(tmp_path, monkeypatch):
    for name in ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "NBGRADER_DB_URL", "PGPASSWORD"):
        monkeypatch.setenv(name, "credential-value")
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    job = {"src": str(src), "dest": str(dest), "owner": None, "max_bytes": 10, "max_files": 1}
    (res,), env = run_copier([job], 60)
    assert res["refused"] is None and env, (res, env)
    assert set(env) <= set(COPIER_ENV), env
    assert "PATH" in env


def test_a_secret_must_be_a_regular_file_of_hex_digits(tmp_path):
    for content, kept in ((hex_secret(), True), ("../../etc/passwd", False), ("ab" * 600, False)):
        src, dest = tmp_path / f"src{len(content)}", tmp_path / f"dest{len(content)}"
        src.mkdir()
        dest.mkdir()
        (src / f"{AID}.ipynb").write_text(NB)
        (src / "submission_secret.txt").write_text(content)
        res = copy_submission(str(src), str(dest), owner=None, max_bytes=2**20, max_files=5)
        assert res["refused"] is None
        assert ("submission_secret.txt" in res["copied"]) == kept, res
        if kept:
            assert (dest / "submission_secret.txt").read_text() == content
        else:
            assert (
                "its feedback cannot be released" in dict(res["dropped"])["submission_secret.txt"]
            )


@pytest.mark.parametrize("shape", ["bytes", "files", "entries", "owner"])
def test_a_submission_over_a_cap_is_refused(tmp_path, shape):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    limits = {"max_bytes": 1000, "max_files": 3}
    owner = os.geteuid()
    if shape == "bytes":
        (src / "a.ipynb").write_text("x" * 600)
        with open(src / "b.ipynb", "wb") as f:  # sparse: counted as it is read
            f.truncate(401)
        expected = "more than 1000 bytes (the cap SubmissionLimits.max_bytes)"
    elif shape == "files":
        for i in range(4):
            (src / f"n{i}.ipynb").write_text("{}")
        expected = "more than 3 files (the cap SubmissionLimits.max_files)"
    elif shape == "entries":
        for i in range(MAX_ENTRIES + 1):
            (src / f"junk{i}").touch()
        expected = f"more than {MAX_ENTRIES} entries in its folder"
    else:
        (src / "a.ipynb").write_text("{}")
        owner += 1
        expected = "its folder is now owned by"
    res = copy_submission(str(src), str(dest), owner=owner, **limits)
    assert res["refused"] and res["refused"].startswith(expected), res
    # within the caps, the same submission minus one file is taken
    if shape in ("bytes", "files"):
        victim = sorted(src.iterdir())[-1]
        victim.unlink()
        for p in dest.iterdir():
            p.unlink()
        assert copy_submission(str(src), str(dest), owner=owner, **limits)["refused"] is None


def test_a_submission_folder_that_is_a_link_is_not_opened(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / f"{AID}.ipynb").write_text(NB)
    (tmp_path / "link").symlink_to(real)
    dest = tmp_path / "dest"
    dest.mkdir()
    res = copy_submission(str(tmp_path / "link"), str(dest), owner=None, max_bytes=99, max_files=9)
    assert res["refused"].startswith("its folder cannot be opened"), res
    assert not os.listdir(dest)


# ------------------------------------------------------------------------ make grade's check
def test_make_grade_refuses_links_special_files_and_oversized_submissions(tmp_path):
    targets = instructor_files(tmp_path)
    limits = SubmissionLimits(max_bytes=1000, max_files=3)
    sub = tmp_path / "submitted"

    def folder(student: str) -> Path:
        f = sub / student / AID
        f.mkdir(parents=True)
        (f / f"{AID}.ipynb").write_text(NB)
        return f

    assert submission_problem(folder("honest"), limits) is None
    (folder("linked") / "grades.html").symlink_to(targets["grades.csv"])
    (folder("deep") / "x.html").mkdir()
    (sub / "deep" / AID / "x.html" / "leak").symlink_to(targets["gradebook.db"])
    os.mkfifo(folder("fifo") / "pipe")
    (folder("big") / "big.ipynb").write_text("x" * 1000)
    many = folder("many")
    for i in range(3):
        (many / f"n{i}.ipynb").write_text("{}")
    (sub / "alias").symlink_to(sub / "honest")
    real = tmp_path / "elsewhere" / AID
    real.mkdir(parents=True)
    (sub / "away").mkdir()
    (sub / "away" / AID).symlink_to(real)
    found = {s: submission_problem(sub / s / AID, limits) for s in sorted(os.listdir(sub))}
    assert found == {
        "alias": f"{sub / 'alias'} is a symbolic link (links are never followed)",
        "away": f"{sub / 'away' / AID} is a symbolic link (links are never followed)",
        "big": "more than 1000 bytes (SubmissionLimits.max_bytes)",
        "deep": "'x.html/leak' is a symbolic link (links are never followed)",
        "fifo": "'pipe' is a FIFO",
        "honest": None,
        "linked": "'grades.html' is a symbolic link (links are never followed)",
        "many": "more than 3 files (SubmissionLimits.max_files)",
    }


def test_grading_workers_get_no_hub_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token")
    monkeypatch.setenv("JPY_API_TOKEN", "hub-token")
    monkeypatch.setenv("NBGRADER_DB_URL", "sqlite:///gradebook.db")
    assert grading._grade_all(tmp_path, [], False, 1) == {}
    assert "JUPYTERHUB_API_TOKEN" not in os.environ and "JPY_API_TOKEN" not in os.environ
    assert os.environ["NBGRADER_DB_URL"]  # the workers write the gradebook


# ------------------------------------------------------------------------ collect
class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _config(course: Path, exchange_root: Path):
    from traitlets.config import Config

    c = Config()
    c.CourseDirectory.root = str(course)
    c.CourseDirectory.course_id = COURSE
    c.CourseDirectory.assignment_id = AID
    c.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
    c.Exchange.root = str(exchange_root)
    return c


def _exchange_obj(cls, course: Path, exchange_root: Path, **extra):
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    c = _config(course, exchange_root)
    for k, v in extra.items():
        setattr(c[cls.__name__], k, v)
    log = logging.getLogger(f"test-exchange-{secrets.token_hex(3)}")
    log.setLevel(logging.INFO)
    handler = Lines()
    log.addHandler(handler)
    obj = cls(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c)
    obj.log = log
    return obj, handler


def _own(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)


def _inbound_class(base: Path) -> tuple[Path, dict[str, str]]:
    """An exchange whose inbound holds honest and hostile entries, owned by system
    accounts standing for students. Returns the inbound folder and each honest student's
    secret."""
    need_root()
    targets = instructor_files(base)
    inbound = base / "exchange" / COURSE / "inbound"
    inbound.mkdir(parents=True)
    honest = {"daemon": hex_secret(), "bin": hex_secret()}
    for i, (student, secret) in enumerate(honest.items()):
        d = inbound / f"{student}+{AID}+{stamp(i)}+ok"
        d.mkdir()
        (d / f"{AID}.ipynb").write_text(NB.replace("[]", f'[], "who": "{student}"'))
        (d / "submission_secret.txt").write_text(secret)
        (d / "timestamp.txt").write_text(stamp(i))
        _own(d, student)
    # the hostile student ("nobody"): every shape in their newest real folder...
    hostile = inbound / f"nobody+{AID}+{stamp(10)}+hostile"
    hostile_folder(hostile, targets, secret_link=inbound / f"daemon+{AID}+{stamp(0)}+ok")
    _own(hostile, "nobody")
    # ...and names that stopped nbgrader's collect for everyone
    weird = {
        f"nobody+{AID}+not-a-time+x": "dir",
        f"nobody+{AID}+{stamp(20)}+a+b+c": "dir",
        f"nobody+{AID}+{stamp(30)}+dangling": "dangling",
        f"nobody+{AID}+{stamp(40)}+home": "link-home",
        f"daemon+{AID}+{stamp(50)}+newer": "link-victim",
        f"nobody+{AID}+{stamp(60)}+file": "file",
    }
    for name, shape in weird.items():
        p = inbound / name
        if shape == "dir":
            p.mkdir()
            (p / f"{AID}.ipynb").write_text(NB)
        elif shape == "dangling":
            p.symlink_to(base / "no-such-folder")
        elif shape == "link-home":
            p.symlink_to(inbound / f"bin+{AID}+{stamp(1)}+ok")
        elif shape == "link-victim":  # made by nobody, named after daemon
            p.symlink_to(inbound / f"daemon+{AID}+{stamp(0)}+ok")
        else:
            p.write_text(NB)
        _own(p, "nobody")
    # one more student whose submission is too big, one with too many notebooks (system
    # accounts found on Debian, Ubuntu and Fedora alike)
    big = inbound / f"lp+{AID}+{stamp(2)}+big"
    big.mkdir()
    with open(big / f"{AID}.ipynb", "wb") as f:
        f.truncate(exchange.SubmissionLimits().max_bytes + 1)
    _own(big, "lp")
    many = inbound / f"sync+{AID}+{stamp(3)}+many"
    many.mkdir()
    for i in range(exchange.SubmissionLimits().max_files + 1):
        (many / f"n{i:02}.ipynb").write_text(NB)
    _own(many, "sync")
    return inbound, honest


def _collect(base: Path, inbound: Path, reverse: bool, monkeypatch) -> tuple[Path, str]:
    course = base / ("course-rev" if reverse else "course")
    course.mkdir()
    real_glob = glob.glob
    monkeypatch.setattr(
        exchange.glob,
        "glob",
        lambda pattern: sorted(real_glob(pattern), reverse=reverse),
    )
    collect, lines = _exchange_obj(SafeCollect, course, inbound.parent.parent)
    collect.start()
    monkeypatch.setattr(exchange.glob, "glob", real_glob)
    return course, "\n".join(lines.lines)


def _tree(course: Path) -> dict[str, str]:
    out = {}
    for p in sorted((course / "submitted").rglob("*")):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), p
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(course))] = p.read_text(errors="replace")
    return out


def test_collect_takes_every_honest_submission_and_reports_each_hostile_one(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token")
    inbound, honest = _inbound_class(tmp_path)
    course, log = _collect(tmp_path, inbound, False, monkeypatch)
    tree = _tree(course)
    for student, secret in honest.items():
        sub = f"submitted/{student}/{AID}"
        assert f'"who": "{student}"' in tree[f"{sub}/{AID}.ipynb"], log
        assert tree[f"{sub}/submission_secret.txt"] == secret
        assert tree[f"{sub}/timestamp.txt"] == stamp(list(honest).index(student))
    # the hostile student: their notebook and nothing else; the secret link left behind
    assert sorted(k for k in tree if k.startswith("submitted/nobody/")) == [
        f"submitted/nobody/{AID}/{AID}.ipynb",
        f"submitted/nobody/{AID}/timestamp.txt",
    ], log
    assert tree[f"submitted/nobody/{AID}/timestamp.txt"] == stamp(10)
    assert not any(LEAK in text for text in tree.values()), log
    assert all(not (course / "submitted" / s).exists() for s in ("lp", "sync"))
    expect = [
        r"nobody: ignored inbound entry '.*not-a-time\+x': its timestamp does not parse",
        r"nobody: ignored inbound entry '.*\+a\+b\+c': a malformed name",
        r"nobody: ignored inbound entry '.*\+dangling': a symbolic link",
        r"nobody: ignored inbound entry '.*\+home': a symbolic link",
        r"nobody: ignored inbound entry '.*\+file': a regular file, not a folder",
        r"Ignoring daemon\+.*\+newer: it claims to be from daemon but is owned by nobody",
        r"nobody: left behind \d+ entries: .*'environ.html': a symbolic link",
        r"'submission_secret.txt': a symbolic link",
        r"'fifo.ipynb': a FIFO",
        rf"nobody: collected {AID}.ipynb \(\d+ bytes\); no valid submission secret",
        r"lp: NOT collected .*: more than 20 MiB \(the cap SubmissionLimits.max_bytes\)",
        r"sync: NOT collected .*: more than 20 files \(the cap SubmissionLimits.max_files\)",
        r"daemon: collected",
        r"bin: collected",
    ]
    for pattern in expect:
        assert re.search(pattern, log), f"{pattern!r} not in the log:\n{log}"
    # the copying process: no credential, although the collecting one holds some
    seen = re.search(r"separate process whose environment holds only: (.*)", log).group(1)
    assert set(seen.split(", ")) <= set(COPIER_ENV) and "PATH" in seen, seen
    # the same, entries met in the reverse order
    course2, log2 = _collect(tmp_path, inbound, True, monkeypatch)
    tree2 = {k: v for k, v in _tree(course2).items()}
    assert tree2 == tree
    report = log.split("Collect report for")[1]
    assert sorted(report.splitlines()) == sorted(log2.split("Collect report for")[1].splitlines())


# ------------------------------------------------------------------------ release_feedback
def _graded_course(base: Path) -> tuple[Path, Path, dict[str, str]]:
    """A course whose gradebook has a submission per student, with feedback generated,
    and the hostile shapes in feedback/ and submitted/. Returns the course, the
    exchange's feedback folder and each student's secret."""
    from nbgrader.api import Gradebook

    course = base / "course"
    course.mkdir()
    outbound = base / "exchange" / COURSE / "feedback"
    outbound.parent.mkdir(parents=True)
    (base / "exchange").chmod(0o1777)  # as the guide has it: nbgrader checks
    targets = instructor_files(base)
    students = ["honest", "cluttered", "linksecret", "twin1", "twin2", "nosecret"]
    students += ["linkedhtml", "regathered", "nofeedback"]
    secrets_ = {s: hex_secret() for s in students}
    secrets_["twin2"] = secrets_["twin1"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE) as gb:
        gb.add_assignment(AID)
        gb.add_notebook(AID, AID)
        for s in students:
            gb.add_student(s)
            gb.add_submission(AID, s, timestamp=datetime(2026, 1, 5, 12))
    for s in students:
        sub = course / "submitted" / s / AID
        sub.mkdir(parents=True)
        (sub / f"{AID}.ipynb").write_text(NB)
        (sub / "timestamp.txt").write_text(stamp(0 if s != "regathered" else 5))
        if s == "linksecret":
            (sub / "submission_secret.txt").symlink_to(
                course / "submitted" / "honest" / AID / "submission_secret.txt"
            )
        elif s != "nosecret":
            (sub / "submission_secret.txt").write_text(secrets_[s])
        fb = course / "feedback" / s / AID
        fb.mkdir(parents=True)
        if s == "linkedhtml":
            (fb / f"{AID}.html").symlink_to(targets["gradebook.db"])
        elif s != "nofeedback":
            (fb / f"{AID}.html").write_text(f"<html>feedback for {s}</html>")
        # what nbgrader's generate_feedback copies along, all under the student's control
        (fb / "submission_secret.txt").write_text(secrets_["honest"])
        (fb / "timestamp.txt").write_text("garbage")
    clutter = course / "feedback" / "cluttered" / AID
    (clutter / "x.html").mkdir()
    (clutter / "x.html" / "inner.html").write_text("x")
    (clutter / "notes.html").write_text(f"{LEAK} submitted by the student")
    (clutter / "grades.html").write_text(f"{LEAK} copied from a link by nbgrader")
    # a stray feedback folder of someone not in the gradebook
    stray = course / "feedback" / "stranger" / AID
    stray.mkdir(parents=True)
    (stray / f"{AID}.html").write_text(LEAK)
    (stray / "submission_secret.txt").write_text(hex_secret())
    return course, outbound, secrets_


# nbgrader's add_submission itself warns so (SQLAlchemy 2); nothing of this test's doing
@pytest.mark.filterwarnings("ignore:Object of type <Submitted")
def test_feedback_goes_to_its_own_student_from_the_instructors_files_only(tmp_path):
    course, outbound, keys = _graded_course(tmp_path)
    release, lines = _exchange_obj(SafeReleaseFeedback, course, tmp_path / "exchange")
    release.start()
    log = "\n".join(lines.lines)

    def name(student: str) -> str:
        return hashlib.md5((keys[student] + AID).encode()).hexdigest() + ".html"

    released = {"honest", "cluttered"}
    assert sorted(os.listdir(outbound)) == sorted(name(s) for s in released), log
    for s in released:
        assert (outbound / name(s)).read_text() == f"<html>feedback for {s}</html>"
        assert stat.S_IMODE(os.stat(outbound / name(s)).st_mode) == 0o644
    expect = {
        "linksecret": "feedback NOT released: its submission secret cannot be read",
        "twin1": "feedback NOT released: its submission secret is another submission's too",
        "twin2": "feedback NOT released: its submission secret is another submission's too",
        "nosecret": "feedback NOT released: no submission secret",
        "linkedhtml": f"feedback for {AID} NOT released: a symbolic link",
        "regathered": "feedback NOT released: collected again since it was graded",
        "nofeedback": f"no feedback for {AID}: run generate_feedback first",
        "honest": f"released {AID}.html",
        "cluttered": f"released {AID}.html",
    }
    for student, what in expect.items():
        assert f"{student}: {what}" in log, f"{student}: {what!r} not in:\n{log}"
    assert "stranger" not in log


# ------------------------------------------------------------------------ list --inbound
LIST_CODE = """
import importlib.util, json, logging, sys
spec = importlib.util.spec_from_file_location("course_exchange", sys.argv[1])
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config
c = Config()
c.CourseDirectory.course_id = sys.argv[3]
c.Exchange.root = sys.argv[2]
c.ExchangeList.inbound = True
lines = []
class Lines(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
log = logging.getLogger("list")
log.addHandler(Lines())
log.setLevel(logging.INFO)
lister = ex.SafeList(
    coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c
)
lister.log = log
found = lister.start()
listed = [(s["student_id"], s["timestamp"]) for a in found for s in a["submissions"]]
print(json.dumps({"listed": listed, "log": lines}))
"""


def test_the_instructors_inbound_list_opens_no_hostile_entry(tmp_path):
    """nbgrader's ``list --inbound`` hashes each submitted notebook when there is no
    secret: through a link to /dev/zero it would read forever. The course's list skips
    every entry collect would ignore and every folder whose notebooks or secret are not
    regular files, with a warning that names the student."""
    import json
    import resource
    import subprocess

    _inbound_class(tmp_path)
    (tmp_path / "exchange").chmod(0o1777)  # nbgrader checks the root as the guide has it
    proc = subprocess.run(
        [sys.executable, "-c", LIST_CODE, exchange.__file__, str(tmp_path / "exchange"), COURSE],
        capture_output=True,
        text=True,
        timeout=120,
        # were an entry followed to /dev/zero, a MemoryError, not a machine out of memory
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    listed = sorted(tuple(x) for x in out["listed"])
    assert listed == sorted([("daemon", stamp(0)), ("bin", stamp(1)), ("sync", stamp(3))]), out
    log = "\n".join(out["log"])
    for pattern in (
        r"nobody: inbound entry '.*\+hostile' not listed: 'dangling.ipynb' is a symbolic link",
        r"nobody: inbound entry '.*not-a-time\+x' not listed: its timestamp does not parse",
        r"nobody: inbound entry 'daemon\+.*\+newer' not listed: named after daemon",
        r"nobody: inbound entry '.*\+file' not listed: a regular file, not a folder",
        r"lp: inbound entry '.*\+big' not listed: '01_dot_product_attention.ipynb' is over 20",
    ):
        assert re.search(pattern, log), f"{pattern!r} not in:\n{log}"
