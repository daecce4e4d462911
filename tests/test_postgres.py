"""The gradebook on a real PostgreSQL server (instructor guide section 8).

A throwaway PostgreSQL server is started from the system's binaries (Debian's
``postgresql`` package: /usr/lib/postgresql/*/bin, or initdb/pg_ctl on PATH), in a
temporary folder, listening on 127.0.0.1 at a free port and on a unix socket in that
folder only. As root it runs as the unprivileged ``postgres`` user (or ``nobody``). One
student of every kind of gradebook write, from the class of tests/test_class_grading.py
(the same submissions, on assignment 01), is graded with `make grade`'s code path, two
workers writing concurrently, and one setting, ``NBGRADER_DB_URL=postgresql+psycopg://...``;
the exported grades must equal the sqlite gradebook's exactly. (Every other student of that
class differs from one of these only in its code, which the sqlite gradebook grades; the
gradebook stores what nbgrader computed either way.)

make test grades two of them (PG_QUICK: every write of a graded notebook, and the second
autograde that salvages a dead kernel's submission) and reads them back through the report;
make test-later grades the other kinds (PG_LATER) into a second database of the same server
and compares all of them with sqlite.

Without PostgreSQL or psycopg the tests are skipped with the reason, except under CI
(the environment variable CI is set, as .ci/run does), where they fail.
"""

from __future__ import annotations

import csv
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_report import expected_counts, read_counts

from course_tools import run_course
from test_class_grading import HOSTILE_AID, grade_class, sqlite_graded_class

pytestmark = pytest.mark.grading

DATABASE = "attention_gradebook"
SUPERUSER = "grader"


def unavailable(reason: str):
    """Skip, or fail under CI: a CI machine must run every test."""
    if os.environ.get("CI"):
        pytest.fail(
            f"PostgreSQL gradebook test cannot run: {reason} "
            "(CI is set, so this fails instead of skipping)",
            pytrace=False,
        )
    pytest.skip(f"PostgreSQL gradebook test skipped: {reason}")


def postgres_bin() -> Path | None:
    """The folder with initdb and pg_ctl: POSTGRES_BIN if set, else Debian's newest
    version (/usr/lib/postgresql/*/bin), else PATH."""
    if os.environ.get("POSTGRES_BIN"):  # an explicit choice: that folder or nothing
        folder = Path(os.environ["POSTGRES_BIN"])
        return folder if (folder / "pg_ctl").is_file() and (folder / "initdb").is_file() else None
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: [int(s) if s.isdigit() else 0 for s in Path(p).parts[-3].split(".")],
    )
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as when we are root (PostgreSQL refuses to
    run as root); None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    unavailable("running as root, and no unprivileged user (postgres, nobody) to run PostgreSQL")


def as_server_user(cmd: list[str]) -> list[str]:
    user = server_user()
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user.pw_name, "--", *cmd]
    return ["su", user.pw_name, "-s", "/bin/sh", "-c", shlex.join(cmd)]


class Server:
    """A PostgreSQL server in a temporary folder; ``url`` is its SQLAlchemy URL."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        # Not under pytest's tmp_path: its parents are private to root, and the server
        # may run as another user. The folder is the server user's alone.
        self.root = Path(tempfile.mkdtemp(prefix="attention-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        user = server_user()
        if user is not None:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.root.chmod(0o700)
        self.url = f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"
        self.started = False

    def run(self, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        cmd = as_server_user([str(self.bindir / args[0]), *args[1:]])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}\n{log}"
            )
        return proc

    def start(self) -> None:
        self.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=off"
        )
        self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self.started = True
        import psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def create_database(self, name: str) -> str:
        """A further database on this server (one course's gradebook); its URL."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def query(self, sql: str, dbname: str = DATABASE) -> list[tuple]:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname
        ) as conn:
            return conn.execute(sql).fetchall()

    def stop(self) -> None:
        try:
            if self.started:
                self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres():
    bindir = postgres_bin()
    if bindir is None:
        where = (
            f"POSTGRES_BIN={os.environ['POSTGRES_BIN']} holds no initdb and pg_ctl"
            if os.environ.get("POSTGRES_BIN")
            else "no /usr/lib/postgresql/*/bin/pg_ctl, no initdb and pg_ctl on PATH"
        )
        unavailable(
            f"PostgreSQL is not installed ({where}); install it with "
            "`apt-get install -y postgresql` (.ci/run does) or set POSTGRES_BIN"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed; run `make test` to install requirements.lock")
    server = Server(bindir)
    try:
        t0 = time.perf_counter()
        server.start()
        print(f"PostgreSQL at {server.url} ({bindir}), started in {time.perf_counter() - t0:.1f} s")
        yield server
    finally:
        server.stop()


#: Graded into PostgreSQL on one assignment: one student of every kind of write to the
#: gradebook. make test: full marks (every write of a graded notebook) and a dead kernel's
#: salvage (a second autograde of the same submission) ...
PG_QUICK = ("full", "hostile-exit")
#: ... make test-later: none, part of them, a failed check, a cell restored from the source.
PG_LATER = ("blank", "partial", "mistakes-1", "hostile-deleted-test")
PG_STUDENTS = PG_QUICK + PG_LATER
LATER_DATABASE = "attention_gradebook_later"


@pytest.fixture(scope="module")
def graded_on_postgres(postgres, tmp_path_factory):
    course, expected, proc = grade_class(
        tmp_path_factory,
        "postgresql",
        db_url=postgres.url,
        students=PG_QUICK,
        aids=(HOSTILE_AID,),
    )
    return course, expected, proc


@pytest.fixture(scope="module")
def graded_on_postgres_later(postgres, tmp_path_factory):
    """The other kinds of write, a course of their own in a second database."""
    course, expected, proc = grade_class(
        tmp_path_factory,
        "postgresql-later",
        db_url=postgres.create_database(LATER_DATABASE),
        students=PG_LATER,
        aids=(HOSTILE_AID,),
    )
    return course, expected, proc


def export_rows(course: Path) -> list[dict]:
    with open(course / "grades.csv", newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: (r["assignment"], r["student_id"]))


def test_grading_the_class_on_postgresql_succeeds(graded_on_postgres):
    course, _, proc = graded_on_postgres
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (course / "grades.csv").is_file()


def test_the_gradebook_is_in_postgresql_not_sqlite(graded_on_postgres, postgres):
    course, expected, _ = graded_on_postgres
    assert not (course / "gradebook.db").exists(), "grading wrote a sqlite gradebook"
    rows = postgres.query(
        "SELECT student.id, assignment.name FROM submitted_assignment "
        "JOIN student ON student.id = submitted_assignment.student_id "
        "JOIN assignment ON assignment.id = submitted_assignment.assignment_id"
    )
    assert set(rows) == set(expected)


@pytest.mark.later
def test_postgresql_exports_exactly_the_grades_of_sqlite(
    graded_on_postgres, graded_on_postgres_later, postgres, tmp_path_factory
):
    pg_rows, expected = [], set()
    for course, wanted, proc in (graded_on_postgres, graded_on_postgres_later):
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not (course / "gradebook.db").exists(), "grading wrote a sqlite gradebook"
        pg_rows += [r for r in export_rows(course) if r["assignment"] == HOSTILE_AID]
        expected |= set(wanted)
    later = postgres.query("SELECT id FROM student", dbname=LATER_DATABASE)
    assert sorted(s for (s,) in later) == sorted(PG_LATER)
    sqlite_course, _, sqlite_proc, _ = sqlite_graded_class(tmp_path_factory)
    assert sqlite_proc.returncode == 0, sqlite_proc.stdout + sqlite_proc.stderr
    sqlite_rows = [
        r
        for r in export_rows(sqlite_course)
        if r["student_id"] in PG_STUDENTS and r["assignment"] == HOSTILE_AID
    ]
    pg_rows.sort(key=lambda r: r["student_id"])
    sqlite_rows.sort(key=lambda r: r["student_id"])
    assert {(r["student_id"], r["assignment"]) for r in pg_rows} == expected
    assert len(pg_rows) == len(PG_STUDENTS)
    assert pg_rows == sqlite_rows


def test_the_class_report_reads_a_postgresql_gradebook(graded_on_postgres, postgres):
    """`make report` on the PostgreSQL gradebook: exactly the counts of what these
    students submitted (as tests/test_report.py computes them), and their grades in the
    Canvas file equal nbgrader's export."""
    course, expected, _ = graded_on_postgres
    proc = run_course(course, "report", env_extra={"NBGRADER_DB_URL": postgres.url})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (course / "gradebook.db").exists(), "the report opened a sqlite gradebook"
    assert read_counts(course / "report" / "class" / "report.csv") == expected_counts(expected)
    grades = {(r["student_id"], r["assignment"]): r["score"] for r in export_rows(course)}
    with open(course / "report" / "lms" / "canvas_grades.csv", newline="") as f:
        canvas = {
            (r["SIS Login ID"], HOSTILE_AID): f"{float(r[HOSTILE_AID]):g}"
            for r in csv.DictReader(f)
        }
    assert canvas == {k: f"{float(v):g}" for k, v in grades.items()}
    assert set(canvas) == set(expected)
