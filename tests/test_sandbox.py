"""Grading that no submission can subvert: every graded notebook runs in a sandbox
(attention_ref/trust/sandbox.py).

The attackers of tests/hostile.py are graded with the class of tests/test_class_grading.py
(`make grade`'s code path, two workers, honest students beside them). Each holds a correct
solution plus cells that act only while graded and print what they managed: read the
instructor's source notebook, a classmate's submission, the grader's secrets, the
reference sources; send data to a listener on 127.0.0.1; write the course root, the
installed package, the gradebook; start processes that outlive grading; exhaust memory,
processes and disk. The tests read each attack's outcome from the graded notebook and
assert that it failed, that the attackers gained nothing (the honest students' exact
grades are asserted by tests/test_class_grading.py), that the report names the caps that
stopped a cell, and that the feedback shows the hidden tests' points, never their code.
The same attacks are then made under ``nbgrader autograde`` run directly in the course
root. Where no sandbox can start, grading refuses, unless switched off, and then the
report says so first.
"""

# ruff: noqa: E501 - the attacks are code in strings, one attempt a line

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest

from course_tools import (
    ROOT,
    auto_points,
    make_course,
    run_course,
    solution_path,
    test_cells,
)
from hostile import (
    AID,
    ATTACKERS,
    SECRET,
    TOKEN,
    Listener,
    attack_lines,
    listener,
    outliving_processes,
    outputs,
    read_attacks,
    with_cells,
    write_attacks,
)
from test_class_grading import LIMITS, sqlite_graded_class
from test_grading import solved_submission, submit

pytestmark = pytest.mark.grading


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    """The class of tests/test_class_grading.py, graded once per session with the
    attackers of tests/hostile.py among its students: (course, the grading process, the
    listener, the processes left running after grading)."""
    course, _, proc, _ = sqlite_graded_class(tmp_path_factory)
    time.sleep(1)
    survivors = outliving_processes()
    yield course, proc, listener(), survivors
    for pid in survivors:  # never leave them behind, whatever the test found
        with contextlib.suppress(OSError):
            os.kill(int(pid), 9)


@pytest.mark.later
def test_the_attackers_are_graded_with_the_class_and_gain_nothing(hostile_class):
    course, proc, *_ = hostile_class
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sandbox: each notebook in its own" in proc.stdout
    total = auto_points(nbformat.read(solution_path(AID), as_version=4))
    with open(course / "grades.csv") as f:
        scores = {
            r["student_id"]: float(r["score"]) for r in csv.DictReader(f) if r["assignment"] == AID
        }
    # Every attacker holds a full solution: the attacks neither cost nor gain a point
    # (the honest students' exact grades: tests/test_class_grading.py).
    assert {s: scores[s] for s in ATTACKERS} == dict.fromkeys(ATTACKERS, total), scores


READS = [
    "read the source notebook",
    "read a classmate",
    "list the submissions",
    "read the environment",
    "read the grader's environ",
    "read the reference source",
    "read the package on disk",
    "read a home folder",
]


@pytest.mark.parametrize("attack", READS)
@pytest.mark.later
def test_a_submission_reads_nothing_that_is_not_its_own(hostile_class, attack):
    course = hostile_class[0]
    lines = attack_lines(course, "hostile-read")
    assert lines.get(attack, "").startswith("held"), (attack, lines)
    printed = outputs(course, "hostile-read")
    assert "BEGIN SOLUTION" not in printed and SECRET not in printed and TOKEN not in printed


WRITES = [
    "network",
    "write the course root",
    "write the installed package",
    "write the package it imports",
    "rewrite the gradebook",
]


@pytest.mark.parametrize("attack", WRITES)
@pytest.mark.later
def test_a_submission_writes_and_sends_nothing_outside_its_sandbox(hostile_class, attack):
    course, _, listener, _ = hostile_class
    lines = attack_lines(course, "hostile-write")
    assert lines.get(attack, "").startswith("held"), (attack, lines)
    assert listener.received == []
    assert not (course / "pwned.txt").exists()
    import attention_ref.checks

    assert not (Path(attention_ref.checks.__file__).parent / "pwned.py").exists()


@pytest.mark.later
def test_nothing_a_submission_starts_outlives_its_notebook(hostile_class):
    course, _, _, survivors = hostile_class
    lines = attack_lines(course, "hostile-outlive")
    # A program cannot be started at all (trust/no_exec.py); a forked daemon can...
    assert lines["outlive the notebook"].startswith("BREACH 'started a forked daemon"), lines
    assert survivors == [], f"processes outlived grading: {survivors}"  # ...and is gone


@pytest.mark.parametrize(
    ("attack", "error", "cap"),
    [
        ("memory", "MemoryError: Unable to allocate 6.00 GiB", "memory"),
        ("processes", "BlockingIOError: [Errno 11] Resource temporarily unavailable", "processes"),
        ("disk", "OSError: [Errno 28] No space left on device", "bytes written"),
    ],
)
@pytest.mark.later
def test_each_resource_cap_stops_its_attack_with_an_error_the_report_names(
    hostile_class, attack, error, cap
):
    course, proc, *_ = hostile_class
    nb = nbformat.read(course / "autograded" / "hostile-caps" / AID / f"{AID}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if f"ATTACK {attack}" in c.source)
    errors = [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].startswith(error), errors
    printed = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
    assert f"ATTACK {attack}" not in "".join(printed)  # it never got that far
    report = proc.stdout[proc.stdout.index("Grading report") :].splitlines()
    i = next(i for i, line in enumerate(report) if "hostile-caps" in line)
    notes = [line for line in report[i + 1 :] if line.startswith("      - ")]
    index = nb.cells.index(cell) + 1
    assert any(f"cell {index} hit the sandbox's cap on {cap}" in n for n in notes), notes


@pytest.mark.later
def test_feedback_shows_hidden_tests_ran_and_their_points_never_their_code(hostile_class):
    course = hostile_class[0]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_feedback", AID, "--student", "full"],
        cwd=course,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (course / "feedback" / "full" / AID / f"{AID}.html").read_text()
    source = nbformat.read(solution_path(AID), as_version=4)
    hidden = [c.source for c in test_cells(source) if "BEGIN HIDDEN TESTS" in c.source]
    assert hidden, "the notebook has no hidden tests: the test proves nothing"
    assert "_fresh_check" not in html and "BEGIN HIDDEN TESTS" not in html
    assert html.count("hidden tests ran here") == len(hidden)
    # Each test cell shows its points (the honest student earned them all).
    points = sorted(float(c.metadata["nbgrader"]["points"]) for c in test_cells(source))
    shown = sorted(
        float(a) for a, b in re.findall(r"\(Score: ([\d.]+) / ([\d.]+)\)", html) if a == b
    )
    assert shown == points, (shown, points)


@pytest.mark.later
def test_nbgrader_autograde_run_directly_is_sandboxed_too(hostile_class, tmp_path):
    """The configuration does it (nbgrader_config.py), so formgrader's autograde button,
    which calls the same nbgrader API as `make grade`, is sandboxed as well."""
    course = tmp_path / "course"  # a copy: the class stays as graded for other tests
    shutil.copytree(hostile_class[0], course)
    student = "direct"
    listener = Listener()
    attacks = read_attacks(course, student), write_attacks(course, listener.port)
    submit(course, student, AID, with_cells(*attacks))
    env = dict(os.environ, PGPASSWORD=SECRET, JUPYTERHUB_API_TOKEN=TOKEN, **LIMITS)
    env.pop("NBGRADER_DB_URL", None)
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "autograde", AID, "--student", student],
        cwd=course,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listener.close()
    lines = attack_lines(course, student)
    assert set(READS + WRITES) <= set(lines), lines
    assert all(lines[a].startswith("held") for a in READS + WRITES), lines
    assert listener.received == [] and not (course / "pwned.txt").exists()


def fake_bwrap(folder: Path) -> Path:
    """A PATH folder whose bwrap fails as it does where user namespaces are disabled."""
    folder.mkdir()
    exe = folder / "bwrap"
    exe.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    exe.chmod(0o755)
    return folder


def test_grading_refuses_where_no_sandbox_starts(tmp_path):
    course = make_course(tmp_path / "course", ["02_masking"])
    submit(course, "honest", "02_masking", solved_submission("02_masking"))
    path = f"{fake_bwrap(tmp_path / 'bin')}:{Path(sys.executable).parent}:/usr/bin:/bin"
    refused = run_course(course, "grade", env_extra={"PATH": path})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "grading refused" in refused.stderr and "user namespaces" in refused.stderr
    assert "ATTENTION_REF_SANDBOX=off" in refused.stderr
    assert not (course / "autograded").exists()


@pytest.mark.later  # a whole notebook graded once more, without the sandbox
def test_grading_where_no_sandbox_starts_goes_on_when_switched_off_and_says_so(tmp_path):
    course = make_course(tmp_path / "course", ["02_masking"])
    submit(course, "honest", "02_masking", solved_submission("02_masking"))
    path = f"{fake_bwrap(tmp_path / 'bin')}:{Path(sys.executable).parent}:/usr/bin:/bin"
    opted_out = run_course(
        course, "grade", env_extra={"PATH": path, "ATTENTION_REF_SANDBOX": "off"}
    )
    assert opted_out.returncode == 0, opted_out.stdout + opted_out.stderr
    assert opted_out.stdout.splitlines()[0].startswith("WARNING: UNSANDBOXED GRADING")
    report = opted_out.stdout[opted_out.stdout.index("Grading report") :].splitlines()
    assert report[1].startswith("WARNING: UNSANDBOXED GRADING"), report[:3]


def test_bad_cap_settings_are_refused_with_a_message(tmp_path):
    course = make_course(tmp_path / "course", ["02_masking"])
    submit(course, "honest", "02_masking", solved_submission("02_masking"))
    proc = run_course(course, "grade", env_extra={"ATTENTION_REF_SANDBOX_MEMORY": "lots"})
    assert proc.returncode == 2
    assert "ATTENTION_REF_SANDBOX_MEMORY must be a size such as 3G" in proc.stderr
    assert not (course / "autograded").exists()


def test_the_kernel_environment_keeps_only_what_grading_needs():
    sys.path.insert(0, str(ROOT / "attention_ref" / "course"))
    from attention_ref.trust.sandbox import kernel_env

    env = kernel_env(
        {
            "PGPASSWORD": SECRET,
            "NBGRADER_DB_URL": "postgresql://u:p@h/db",
            "JUPYTERHUB_API_TOKEN": TOKEN,
            "AWS_SECRET_ACCESS_KEY": "k",
            "NBGRADER_EXECUTION": "autograde",
            "ATTENTION_REF_GRADING_STEPS": "2",
            "ATTENTION_REF_SANDBOX_MEMORY": "3G",
        }
    )
    assert env["NBGRADER_EXECUTION"] == "autograde"
    assert env["ATTENTION_REF_GRADING_STEPS"] == "2"
    assert not {"PGPASSWORD", "NBGRADER_DB_URL", "JUPYTERHUB_API_TOKEN"} & set(env)
    assert not {"AWS_SECRET_ACCESS_KEY", "ATTENTION_REF_SANDBOX_MEMORY"} & set(env)
    assert json.dumps(env).count(SECRET) == 0


def test_the_sandbox_binds_the_environment_and_never_a_course_or_a_checkout(tmp_path, monkeypatch):
    """What a .pth file or the grader's own import path may add: another environment's
    site-packages is bound (the hub's layout); the working folder, a course folder, a
    checkout of the package, anything inside them, or a folder holding them is not."""
    from attention_ref.trust import sandbox

    course = make_course(tmp_path / "course", ["02_masking"])
    (course / "lib").mkdir()
    other_env = tmp_path / "shared-env" / "lib" / "site-packages"  # another virtual env's
    other_env.mkdir(parents=True)
    (tmp_path / "shared-env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    scripts = tmp_path / "my-scripts"  # a folder of modules, as a script's folder is
    scripts.mkdir()
    checkout = Path(sandbox._package_source()).parent
    monkeypatch.chdir(course)
    monkeypatch.setattr(
        sys,
        "path",
        [str(p) for p in (course, course / "lib", tmp_path, checkout, ROOT / "tests", other_env)]
        + [str(scripts), tempfile.gettempdir(), "/"]
        + sys.path,
    )
    bound = sandbox._environment_paths()
    assert other_env in bound
    private = [course, course / "lib", ROOT / "tests", checkout / "attention_ref", scripts]
    private += [checkout / "solutions"]
    for folder in private:  # nothing bound is it, is inside it, or holds it
        assert not any(b == folder or folder in b.parents for b in bound), (folder, bound)
    for holder in (tmp_path, checkout, course, Path(tempfile.gettempdir())):
        assert holder not in bound and not any(b in holder.parents for b in bound), bound


class UnixListener:
    """A Unix socket of the host that counts who connects to it."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        os.chmod(path, 0o777)
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.count += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_the_grader_never_follows_a_socket_file_the_kernel_replaced(tmp_path):
    """A sandboxed kernel whose socket files are swapped for links to a socket of the host
    (as a kernel can do to its own): the grader's connections still reach the kernel it
    started, never the host's socket."""
    import asyncio

    from attention_ref.trust import sandbox

    if sandbox.unavailable_reason():
        pytest.fail(sandbox.unavailable_reason())
    host = UnixListener(tmp_path / "host.sock")

    async def scenario() -> str:
        km = sandbox.kernel_manager_class()(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        try:
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            run = Path(f"/proc/{km._sandbox_pid()}/root{sandbox.RUN}")
            ports = [km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port]
            for port in ports:
                name = run / f"k-{port}"
                name.rename(run / f"moved-{port}")
                name.symlink_to(tmp_path / "host.sock")
            kc.stop_channels()
            fresh = km.client()  # connects anew, as a reconnecting grader does
            fresh.start_channels()
            await fresh.wait_for_ready(timeout=30)
            reply = await fresh.execute_interactive("print(6 * 7)", timeout=30)
            fresh.stop_channels()
            return reply["content"]["status"]
        finally:
            await km.shutdown_kernel(now=True)

    try:
        assert asyncio.run(scenario()) == "ok"
        assert host.count == 0, f"{host.count} connections reached the host's socket"
    finally:
        host.close()


def test_a_kernel_folder_whose_grader_was_killed_is_removed_by_the_next_grader(tmp_path):
    """A grading process killed mid-notebook (a worker of a cluster, say) cannot remove its
    kernel's folder, which holds a copy of the student's notebook: the next kernel started
    on the machine removes it, and never a folder whose grader still runs."""
    from attention_ref.trust import sandbox

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folders = {}
    for name, owner in [
        ("killed", f"{gone.pid} {sandbox._started(os.getpid())}"),
        ("reused-pid", f"{os.getpid()} 1"),  # the pid of a later process
        ("running", f"{os.getpid()} {sandbox._started(os.getpid())}"),
        ("unmarked", None),
        # where /proc gives no start time: the pid alone
        ("no-start-time-killed", f"{gone.pid} None"),
        ("no-start-time-running", f"{os.getpid()} None"),
    ]:
        d = tmp_path / f"{sandbox.RUN_PREFIX}{name}"
        (d / "notebooks").mkdir(parents=True)
        (d / "notebooks" / "01.ipynb").write_text("{}")
        if owner:
            (d / sandbox.OWNER_FILE).write_text(owner)
        folders[name] = d
    (tmp_path / f"{sandbox.RUN_PREFIX}link").symlink_to(folders["killed"])
    removed = sandbox.sweep_orphans(tmp_path)
    assert sorted(d.name for d in removed) == [
        f"{sandbox.RUN_PREFIX}killed",
        f"{sandbox.RUN_PREFIX}no-start-time-killed",
        f"{sandbox.RUN_PREFIX}reused-pid",
    ]
    assert folders["running"].is_dir() and folders["unmarked"].is_dir()
    assert folders["no-start-time-running"].is_dir()
    # An unmarked folder (being made, or from before the mark) goes once it is old.
    assert sandbox.sweep_orphans(tmp_path, unmarked_after=0) == [folders["unmarked"]]
    assert folders["running"].is_dir()
    # A kernel's folder is marked with its grader as it is made, so it is kept while it runs.
    mine = sandbox._new_run_dir()
    try:
        assert mine.name.startswith(sandbox.RUN_PREFIX)
        assert mine not in sandbox.sweep_orphans(mine.parent)
        assert mine.is_dir()
    finally:
        shutil.rmtree(mine)
