"""nbgrader's exchange, hardened for a shared JupyterHub (instructor guide, "Running the
course on JupyterHub").

A student controls every name and every file of what they submit, and nbgrader's own
exchange trusts them: its ``collect`` copies a submission with ``shutil.copytree``, as the
instructor, following every symbolic link in it (a link to the instructor's solutions,
gradebook or ``/proc/self/environ`` comes back as a file); it aborts the whole class on one
malformed name or unreadable file; and its ``release_feedback`` publishes every ``*.html``
it finds, under a name computed from a secret the student wrote; its ``list --inbound``
reads every submission's secret or notebooks, through links and FIFOs. The classes here
replace those three steps. In the instructor's nbgrader_config.py::

    c.ExchangeFactory.collect = "attention_ref.course.exchange.SafeCollect"
    c.ExchangeFactory.release_feedback = "attention_ref.course.exchange.SafeReleaseFeedback"
    c.ExchangeFactory.list = "attention_ref.course.exchange.SafeList"

:class:`SafeCollect`

- takes, per student, the newest inbound entry that is a real folder owned by the
  student it names; an entry owned by someone else (a forgery), a link, a file or a name
  that does not parse is ignored with a report line, and never stops the others;
- copies from it only the notebooks (``*.ipynb``) and ``submission_secret.txt``, only
  regular files, opened without following links, and writes ``timestamp.txt`` itself from
  the folder's name. Links, folders, FIFOs, sockets, devices, unreadable files and every
  other name are left behind with a report line naming them and why;
- refuses a submission over the caps (:class:`SubmissionLimits`: bytes really read, files
  copied, entries in the folder) with a report line, keeping what was collected before;
- does the reading in a separate process whose environment holds no credentials (no hub
  token, no database URL): :data:`COPIER_ENV`.

:class:`SafeReleaseFeedback` publishes, for each submission in the gradebook, the feedback
of each notebook of the assignment (``feedback/STUDENT/ASSIGNMENT/NOTEBOOK.html``, written
by ``generate_feedback``, a regular file), named from the secret in the instructor's copy
of the submission (``submitted/STUDENT/ASSIGNMENT/submission_secret.txt``, collected as
above). Nothing else in ``feedback/`` is ever published; a student whose secret is missing,
malformed or shared with another submission gets a report line and no feedback.

:class:`SafeList` lists (and ``--remove`` removes) only the inbound entries collect would
take whose notebooks and secret are readable regular files within the byte cap.

:func:`submission_problem` is the check ``make grade`` makes before it grades a submission
that did not come through the exchange (links, special files, the caps).

Run as a script (``__copier__``), this file is the copying process of :class:`SafeCollect`.
It imports nothing from the course package (so that process never imports PyTorch).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

SECRET_FILE = "submission_secret.txt"
TIMESTAMP_FILE = "timestamp.txt"
#: What nbgrader's submit writes (64 random bytes in hex); anything else is not a secret.
SECRET = re.compile(r"[0-9a-f]{32,256}")
#: Entries of one submission folder looked at, at most (beyond: the submission is refused).
MAX_ENTRIES = 1000
#: The only variables the copying process keeps: it reads students' files, and no secret
#: of the instructor's (``JUPYTERHUB_API_TOKEN``, ``NBGRADER_DB_URL``...) is among these.
COPIER_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "TZ")
#: Variables that carry a JupyterHub credential (dropped by ``make grade`` before it starts
#: its workers, which copy students' files).
HUB_CREDENTIALS = re.compile(r"^(JUPYTERHUB_|JPY_)")
CHUNK = 1 << 20
SHOWN = 20  # entries a report line names, at most


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    """What a file of this mode is, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link (links are never followed)"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"unknown id {uid}"


def _show(name: str) -> str:
    return ascii(name)


# ----------------------------------------------------------------------------- reading
def read_regular(path: str | os.PathLike, limit: int, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (relative to ``dir_fd`` if given), opened
    without following a link and without blocking (a FIFO is never waited on);
    ``ValueError`` if it is not a regular file or is longer than ``limit``; ``OSError`` if
    it cannot be opened."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{_kind(st.st_mode)}, not a regular file")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(CHUNK, limit + 1 - len(data)))
            if not chunk:
                return bytes(data)
            data += chunk
        raise ValueError(f"more than {_fmt_size(limit)}")
    finally:
        os.close(fd)


def read_secret(path: str | os.PathLike, dir_fd: int | None = None) -> str:
    """The submission secret in ``path`` (a regular file holding hex digits only)."""
    raw = read_regular(path, 1024, dir_fd=dir_fd)
    text = raw.decode("ascii", "replace")
    if not SECRET.fullmatch(text):
        raise ValueError("not a submission secret (hex digits written by nbgrader submit)")
    return text


# ----------------------------------------------------------------------------- copying
def copy_submission(
    src: str,
    dest: str,
    *,
    owner: int | None,
    max_bytes: int,
    max_files: int,
    ignore: list[str] | tuple[str, ...] = (),
) -> dict:
    """Copy the notebooks and the secret of the submission folder ``src`` into the empty
    folder ``dest``: regular files only, never through a link, within the caps.

    Returns ``{"copied": [name, ...], "dropped": [[name, why], ...], "refused": why or
    None, "bytes": n}``; a refused submission may have left part of its files in ``dest``.
    """
    out: dict = {"copied": [], "dropped": [], "refused": None, "bytes": 0}
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        sfd = os.open(src, flags)
    except OSError as err:
        out["refused"] = f"its folder cannot be opened ({err.strerror})"
        return out
    dfd = os.open(dest, flags)
    try:
        st = os.fstat(sfd)
        if owner is not None and st.st_uid != owner:
            out["refused"] = f"its folder is now owned by {_user(st.st_uid)}"
            return out
        names = []
        try:
            with os.scandir(sfd) as entries:
                for entry in entries:
                    if len(names) >= MAX_ENTRIES:
                        out["refused"] = f"more than {MAX_ENTRIES} entries in its folder"
                        return out
                    names.append(entry.name)
        except OSError as err:
            out["refused"] = f"its folder cannot be listed ({err.strerror})"
            return out
        for name in sorted(names):
            if name == TIMESTAMP_FILE or any(fnmatch.fnmatch(name, g) for g in ignore):
                continue  # the collector writes the timestamp; ignored names are noise
            why = _copy_one(sfd, dfd, name, out, max_bytes, max_files)
            if out["refused"]:
                return out
            if why:
                out["dropped"].append([name, why])
    finally:
        os.close(sfd)
        os.close(dfd)
    return out


def _copy_one(sfd: int, dfd: int, name: str, out: dict, max_bytes: int, max_files: int):
    """Copy one entry; returns why it was left behind (None: copied). Sets
    ``out["refused"]`` when a cap is passed."""
    try:
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
    except OSError as err:
        return f"cannot be examined ({err.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return _kind(st.st_mode)  # never opened: no link followed, no FIFO or device read
    if not (name.endswith(".ipynb") or name == SECRET_FILE):
        return "not a notebook (only the notebooks and the submission secret are collected)"
    if len(out["copied"]) >= max_files:
        out["refused"] = f"more than {max_files} files (the cap SubmissionLimits.max_files)"
        return None
    if name == SECRET_FILE:
        try:
            data = read_secret(name, dir_fd=sfd).encode()
        except OSError as err:
            return f"cannot be read ({err.strerror})"
        except ValueError as err:
            return f"{err}: its feedback cannot be released"
    else:
        left = max_bytes - out["bytes"]
        try:
            data = read_regular(name, left, dir_fd=sfd)
        except OSError as err:
            return f"cannot be read ({err.strerror})"
        except ValueError as err:
            if str(err).startswith("more than"):
                out["refused"] = (
                    f"more than {_fmt_size(max_bytes)} (the cap SubmissionLimits.max_bytes)"
                )
                return None
            return str(err)
    if out["bytes"] + len(data) > max_bytes:
        out["refused"] = f"more than {_fmt_size(max_bytes)} (the cap SubmissionLimits.max_bytes)"
        return None
    wflags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, wflags, 0o644, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    out["bytes"] += len(data)
    out["copied"].append(name)
    return None


def copier_env(parent: dict[str, str]) -> dict[str, str]:
    """The environment of the copying process: :data:`COPIER_ENV` from ``parent``."""
    return {k: parent[k] for k in COPIER_ENV if k in parent}


def run_copier(jobs: list[dict], timeout: float | None = None) -> tuple[list[dict], list[str]]:
    """Run :func:`copy_submission` for each job (its keyword arguments plus ``src`` and
    ``dest``) in a separate process with :func:`copier_env`; returns the results in order
    and the names of the variables that process saw."""
    if not jobs:
        return [], []
    boot = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__copier__')"
    limit = timeout or 120 + 10 * len(jobs)
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", boot, str(Path(__file__).resolve())],
            input=json.dumps(jobs),
            capture_output=True,
            text=True,
            env=copier_env(dict(os.environ)),
            cwd="/",
            timeout=limit,
        )
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        why = f"the copying process ran past {limit} s"
        reply = {"results": [{"refused": why} for _ in jobs], "env": []}
    except (IndexError, ValueError):
        why = f"the copying process failed ({proc.returncode}): {proc.stderr.strip()[-500:]}"
        reply = {"results": [{"refused": why} for _ in jobs], "env": []}
    return reply["results"], reply["env"]


def _copier_main() -> None:
    jobs = json.loads(sys.stdin.read())
    results = []
    for job in jobs:
        try:
            results.append(copy_submission(**job))
        except Exception as err:  # one submission's failure is its own
            results.append({"refused": f"could not be copied: {type(err).__name__}: {err}"})
    print(json.dumps({"results": results, "env": sorted(os.environ)}))


# Everything above needs the standard library only: the copying process (this file run as
# ``__copier__``) stops here, without importing nbgrader, its server extensions or PyTorch.
if __name__ == "__copier__":
    _copier_main()
    raise SystemExit(0)

from nbgrader.api import Gradebook, MissingEntry  # noqa: E402
from nbgrader.exchange.default.collect import ExchangeCollect  # noqa: E402
from nbgrader.exchange.default.list import ExchangeList  # noqa: E402
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback  # noqa: E402
from nbgrader.utils import notebook_hash, parse_utc  # noqa: E402
from traitlets import Integer  # noqa: E402
from traitlets.config import LoggingConfigurable  # noqa: E402

try:
    from . import students  # noqa: E402
except ImportError:  # loaded by its file path (a hub's nbgrader without the package): beside it
    import importlib.util  # noqa: E402

    _spec = importlib.util.spec_from_file_location(
        "_attention_ref_students", Path(__file__).with_name("students.py")
    )
    students = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(students)


class SubmissionLimits(LoggingConfigurable):
    """The caps on one submission (``c.SubmissionLimits.max_bytes = ...`` in
    nbgrader_config.py): collect refuses a submission over them, and ``make grade``
    refuses to grade one placed in ``submitted/`` by other means."""

    max_bytes = Integer(
        20 * 2**20, help="Bytes of one submission's files, counted as they are read."
    ).tag(config=True)
    max_files = Integer(20, help="Files in one submission (notebooks and the secret).").tag(
        config=True
    )

    def describe(self) -> str:
        return f"{_fmt_size(self.max_bytes)} and {self.max_files} files per submission"


def read_timestamp(folder: str | os.PathLike):
    """The timestamp in ``folder/timestamp.txt`` (naive UTC), or None where there is none
    that parses; never follows a link."""
    try:
        return parse_utc(read_regular(Path(folder) / TIMESTAMP_FILE, 256).decode().strip())
    except (OSError, ValueError, OverflowError, UnicodeDecodeError):
        return None


# ----------------------------------------------------------------------------- checking
def submission_problem(folder: Path, limits: SubmissionLimits) -> str | None:
    """Why the submission folder ``submitted/STUDENT/ASSIGNMENT`` must not be graded (a
    link or a special file anywhere in it, or over the caps), or None."""
    for path in (folder.parent, folder):
        if path.is_symlink():
            return f"{path} is a symbolic link (links are never followed)"
    files = size = 0

    def fail(err: OSError):
        raise err

    try:
        for dirpath, dirnames, filenames in os.walk(folder, onerror=fail):
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, folder)
                mode = os.lstat(path).st_mode
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    return f"{_show(rel)} is {_kind(mode)}"
                files += 1
                size += os.lstat(path).st_size
                if files > limits.max_files:
                    return f"more than {limits.max_files} files (SubmissionLimits.max_files)"
                if size > limits.max_bytes:
                    return f"more than {_fmt_size(limits.max_bytes)} (SubmissionLimits.max_bytes)"
    except OSError as err:
        return f"cannot be read: {err.strerror}: {err.filename}"
    return None


# ----------------------------------------------------------------------------- inbound
def inbound_entry(path: str, aid: str | None = None) -> tuple[dict | None, str, str | None]:
    """``(record, owner, None)`` for an inbound entry that is a submission of ``aid`` (any
    assignment if None): a real folder, owned by the student its name starts with, named
    ``STUDENT+ASSIGNMENT+TIMESTAMP[+RANDOM]``; else ``(None, owner, why not)``."""
    name = os.path.basename(path)
    try:
        st = os.lstat(path)
    except OSError as err:
        return None, "(unknown)", f"vanished ({err.strerror})"
    owner = _user(st.st_uid)
    claimed = name.split("+", 1)[0]
    if owner != claimed:
        return None, owner, f"named after {claimed}"
    if students.refusal(owner):  # a pattern (attention_ref/course/students.py)
        return None, owner, students.refusal(owner)
    if not stat.S_ISDIR(st.st_mode):
        return None, owner, f"{_kind(st.st_mode)}, not a folder"
    parts = name.split("+")
    if len(parts) not in (3, 4) or (aid is not None and parts[1] != aid):
        return None, owner, "a malformed name"
    try:
        timestamp = parse_utc(parts[2])
    except (ValueError, OverflowError, TypeError) as err:
        return None, owner, f"its timestamp does not parse ({err})"
    rec = {"username": owner, "filename": name, "timestamp": timestamp, "uid": st.st_uid}
    return rec, owner, None


# ----------------------------------------------------------------------------- collect
class Report:
    """Lines of a collect or release report, each naming a student."""

    def __init__(self, log, title: str):
        self.log, self.title, self.lines = log, title, []

    def add(self, student: str, what: str, problem: bool = True) -> None:
        self.lines.append((student, what, problem))

    def emit(self) -> None:
        """Log the report: a problem as a warning, anything else as information."""
        self.log.info("%s%s", self.title, "" if self.lines else " nothing to report")
        for student, what, problem in self.lines:
            (self.log.warning if problem else self.log.info)("%s: %s", student, what)


class SafeCollect(ExchangeCollect):
    """``nbgrader collect`` that never follows a student's link, never lets one student's
    submission stop the others, and collects only notebooks (see the module's doc)."""

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        aid = self.coursedir.assignment_id
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        self.limits = SubmissionLimits(parent=self)
        self.report = Report(self.log, f"Collect report for {aid}:")
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(aid).duedate
            except MissingEntry:
                self.duedate = None
        student_id = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student_id}+{aid}+*")
        self.forged = []
        by_user: dict[str, list[dict]] = {}
        for path in sorted(glob.glob(pattern)):
            rec = self._record(path, aid)
            if rec is not None:
                by_user.setdefault(rec["username"], []).append(rec)
        self.src_records = []
        for recs in by_user.values():
            recs = self._sort_by_timestamp(recs)
            if self.duedate is not None and self.before_duedate:
                recs = [r for r in recs if r["timestamp"] <= self.duedate] or recs
            self.src_records.append(recs[0])

    def _record(self, path: str, aid: str) -> dict | None:
        """The record of one inbound entry, or None (with a report line) if it is not a
        submission: forged, not a folder, a name that does not parse."""
        rec, owner, why = inbound_entry(path, aid)
        if why and why.startswith("named after"):
            name, claimed = os.path.basename(path), why.split()[-1]
            self.forged.append((name, owner))
            self.log.warning(
                "Ignoring %s: it claims to be from %s but is owned by %s", name, claimed, owner
            )
        if why:
            self.report.add(owner, f"ignored inbound entry {_show(os.path.basename(path))}: {why}")
        return rec

    def copy_files(self):
        aid = self.coursedir.assignment_id
        if not self.src_records:
            self.log.warning(
                "No submissions of '%s' for course '%s' to collect", aid, self.coursedir.course_id
            )
        jobs, staged = [], []
        for rec in sorted(self.src_records, key=lambda r: r["username"]):
            student = rec["username"]
            try:
                job = self._plan(rec)
            except Exception as err:  # one student's failure is their own
                self.report.add(student, f"NOT collected: {type(err).__name__}: {err}")
                continue
            if job is not None:
                jobs.append(job)
                staged.append(rec)
        results, env = run_copier(jobs)
        if jobs:
            self.log.info(
                "Submissions were read by a separate process whose environment holds only: %s",
                ", ".join(env) or "(nothing)",
            )
        for job, rec, res in zip(jobs, staged, results, strict=True):
            try:
                self._install(job, rec, res)
            except Exception as err:
                self.report.add(rec["username"], f"NOT collected: {type(err).__name__}: {err}")
            finally:
                shutil.rmtree(job["dest"], ignore_errors=True)
                with contextlib.suppress(OSError):  # the student's folder, if left empty
                    os.rmdir(os.path.dirname(job["dest"]))
        self.report.emit()

    def _plan(self, rec: dict) -> dict | None:
        """The copy job for one chosen submission, or None if nothing is to be copied."""
        student = rec["username"]
        aid = self.coursedir.assignment_id
        dest = self.coursedir.format_path(self.coursedir.submitted_directory, student, aid)
        if os.path.lexists(dest):
            existing = read_timestamp(dest)
            newer = existing is None or rec["timestamp"] > existing
            moved = existing != rec["timestamp"]
            if not ((self.update and newer) or (self.before_duedate and moved)):
                what = (
                    "no newer submission to collect"
                    if self.update
                    else "submission already collected, use --update to update"
                )
                self.report.add(student, what, problem=False)
                return None
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{aid}.collecting-", dir=os.path.dirname(dest))
        return {
            "src": os.path.join(self.inbound_path, rec["filename"]),
            "dest": staging,
            "owner": rec["uid"],
            "max_bytes": self.limits.max_bytes,
            "max_files": self.limits.max_files,
            "ignore": list(self.coursedir.ignore),
        }

    def _install(self, job: dict, rec: dict, res: dict) -> None:
        student = rec["username"]
        dropped = res.get("dropped", [])
        if dropped:
            listed = "; ".join(f"{_show(n)}: {w}" for n, w in dropped[:SHOWN])
            more = f"; and {len(dropped) - SHOWN} more" if len(dropped) > SHOWN else ""
            self.report.add(student, f"left behind {len(dropped)} entries: {listed}{more}")
        if res.get("refused"):
            self.report.add(student, f"NOT collected ({rec['filename']}): {res['refused']}")
            return
        notebooks = [n for n in res["copied"] if n.endswith(".ipynb")]
        if not notebooks:
            self.report.add(student, f"NOT collected ({rec['filename']}): no notebook in it")
            return
        staging = job["dest"]
        stamp = rec["timestamp"].strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        with open(os.path.join(staging, TIMESTAMP_FILE), "x") as f:
            f.write(stamp)
        os.chmod(staging, 0o755)
        dest = self.coursedir.format_path(
            self.coursedir.submitted_directory, student, self.coursedir.assignment_id
        )
        if os.path.islink(dest) or os.path.isfile(dest):
            os.remove(dest)
        elif os.path.isdir(dest):
            shutil.rmtree(dest)
        os.rename(staging, dest)
        secret = "" if SECRET_FILE in res["copied"] else "; no valid submission secret"
        self.report.add(
            student,
            f"collected {', '.join(notebooks)} ({res['bytes']} bytes){secret}",
            problem=bool(secret),
        )


#: The name this class had before it did more than check owners.
OwnerCheckedCollect = SafeCollect


# ----------------------------------------------------------------------------- feedback
class SafeReleaseFeedback(ExchangeReleaseFeedback):
    """``nbgrader release_feedback`` that publishes only the feedback of the gradebook's
    notebooks, named from the instructor's copy of each submission's secret."""

    def copy_files(self):
        aid = self.coursedir.assignment_id
        report = Report(self.log, f"Feedback release report for {aid}:")
        exclude = set(filter(None, self.coursedir.student_id_exclude.split(",")))
        pattern = self.coursedir.student_id or "*"
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                assignment = gb.find_assignment(aid)
            except MissingEntry:
                self.fail(f"No assignment {aid} in the gradebook: grade it first")
            notebooks = sorted(nb.name for nb in assignment.notebooks)
            subs = sorted((s.student_id, s.timestamp) for s in assignment.submissions)
        plans: dict[str, list[tuple[str, str]]] = {}
        for student, graded in subs:
            if student in exclude or not fnmatch.fnmatchcase(student, pattern):
                continue
            try:
                plans[student] = self._plan(student, graded, notebooks, report)
            except ValueError as err:
                report.add(student, f"feedback NOT released: {err}")
            except Exception as err:  # one student's failure is their own
                report.add(student, f"feedback NOT released: {type(err).__name__}: {err}")
        names = Counter(name for plan in plans.values() for _, name in plan)
        for student, plan in plans.items():
            if any(names[name] > 1 for _, name in plan):
                report.add(
                    student,
                    "feedback NOT released: its submission secret is another submission's too",
                )
                continue
            for html, name in plan:
                try:
                    self._publish(html, name)
                    nb = os.path.basename(html)
                    report.add(student, f"released {nb}", problem=False)
                except Exception as err:
                    report.add(student, f"feedback NOT released: {type(err).__name__}: {err}")
        report.emit()

    def _plan(self, student: str, graded, notebooks: list[str], report: Report):
        aid = self.coursedir.assignment_id
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student, aid)
        try:
            secret = read_secret(os.path.join(submitted, SECRET_FILE))
        except FileNotFoundError:
            raise ValueError("no submission secret was collected with it") from None
        except OSError as err:
            raise ValueError(f"its submission secret cannot be read ({err.strerror})") from None
        collected = read_timestamp(submitted)
        if graded is not None and collected is not None and collected != graded:
            raise ValueError(
                "collected again since it was graded: grade it and generate its feedback again"
            )
        feedback = self.coursedir.format_path(self.coursedir.feedback_directory, student, aid)
        plan = []
        for nb in notebooks:
            html = os.path.join(feedback, f"{nb}.html")
            try:
                st = os.lstat(html)
            except FileNotFoundError:
                report.add(student, f"no feedback for {nb}: run generate_feedback first")
                continue
            if not stat.S_ISREG(st.st_mode):
                report.add(student, f"feedback for {nb} NOT released: {_kind(st.st_mode)}")
                continue
            plan.append((html, notebook_hash(secret=secret, notebook_id=nb) + ".html"))
        return plan

    def _publish(self, html: str, name: str) -> None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        src = os.open(html, flags)
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):
                raise ValueError("not a regular file")
            fd, tmp = tempfile.mkstemp(prefix=".releasing-", suffix=".html", dir=self.dest_path)
            try:
                with os.fdopen(fd, "wb") as out, os.fdopen(os.dup(src), "rb") as inp:
                    shutil.copyfileobj(inp, out)
                    os.fchmod(out.fileno(), 0o644)
                os.replace(tmp, os.path.join(self.dest_path, name))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        finally:
            os.close(src)
        self.log.info("Feedback released to: %s", os.path.join(self.dest_path, name))


# ----------------------------------------------------------------------------- list
class SafeList(ExchangeList):
    """``nbgrader list``, whose ``--inbound`` view (the instructor's: it reads each
    submission's secret, or hashes its notebooks) lists only real submission folders whose
    notebooks and secret are regular files within the caps; every other entry is named in
    a warning with the reason, and never opened. ``--remove`` removes only those listed."""

    def init_dest(self):
        super().init_dest()
        if not self.inbound:
            return
        limits = SubmissionLimits(parent=self)
        kept = []
        for path in self.assignments:
            _, owner, why = inbound_entry(path)
            if why is None:
                why = _unsafe_to_list(path, limits)
            if why:
                name = _show(os.path.basename(path))
                self.log.warning("%s: inbound entry %s not listed: %s", owner, name, why)
            else:
                kept.append(path)
        self.assignments = kept


def _unsafe_to_list(folder: str, limits: SubmissionLimits) -> str | None:
    """Why nbgrader's list must not read the submission folder ``folder``, or None."""
    try:
        with os.scandir(folder) as it:
            entries = [e for _, e in zip(range(MAX_ENTRIES + 1), it, strict=False)]
    except OSError as err:
        return f"its folder cannot be listed ({err.strerror})"
    if len(entries) > MAX_ENTRIES:
        return f"more than {MAX_ENTRIES} entries in its folder"
    for e in sorted(entries, key=lambda e: e.name):
        if e.name.endswith(".ipynb") or e.name == SECRET_FILE:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return f"{_show(e.name)} is {_kind(st.st_mode)}"
            if st.st_size > limits.max_bytes:
                return f"{_show(e.name)} is over {_fmt_size(limits.max_bytes)}"
            if not os.access(e.path, os.R_OK, follow_symlinks=False):
                return f"{_show(e.name)} cannot be read"
    return None
