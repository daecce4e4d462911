"""`make grade` on Dask (attention_ref/course/cluster.py; instructor guide, "Grading on a
cluster").

A small class (assignment 01: a solution and a wrong answer) is graded three
ways and every grade, comment and report line is compared:

- **today's logic**: each submission graded in the course folder by
  ``autograde.grade_submission``, nbgrader writing the real gradebook itself (no Dask);
- **the local cluster** `make grade` starts by default (two workers);
- **a real remote cluster**: a ``dask scheduler`` and two ``dask worker`` processes on
  127.0.0.1 started here, each worker in an empty folder of its own (its ``cwd`` and
  ``--local-directory``), none with the course folder; one worker is killed in the middle
  of a submission, and every submission is still graded, once.

A remote scheduler without TLS is refused with a message that says why. Later in CI (marked
``later``): a scheduler killed in the middle of the class, and a job over the command's own
time limit; in both, every submission ends graded or named in the report with its reason.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from nbgrader.api import Gradebook

from course_tools import answer_cells, make_course, run_course
from test_grading import solved_submission, submit

pytestmark = pytest.mark.grading

AID = "01_dot_product_attention"
STUDENTS = ("ada", "bob")  # a solution; one wrong answer (softmax over the whole array)
LIMITS = {"NBGRADER_CELL_TIMEOUT": "20", "NBGRADER_TIMEOUT_AFTER": "6"}
BIN = Path(sys.executable).parent
WRONG_SOFTMAX = (
    "import numpy as np\n\n\ndef softmax_np(x, axis=-1):\n"
    "    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
    "    return e / e.sum()  # over the whole array: rows do not sum to 1\n"
)

# Today's logic: every submission graded by grade_submission in the course folder itself,
# one after the other, nbgrader writing the real gradebook (what each worker process of the
# pool did before Dask), with the rest of `make grade` (report, export) unchanged.
TODAY = """
import sys
from pathlib import Path

from attention_ref.course import autograde, grading


def in_place(root, tasks, force, jobs):
    done = {}
    for aid, student in tasks:
        o = autograde.grade_submission(str(root), aid, student, force)
        done[(aid, student)] = o
        print(f"   [{len(done)}/{len(tasks)}] {aid} {student}: {o.status}", flush=True)
    return done


grading._grade_all = in_place
sys.exit(grading.grade(Path(sys.argv[1]), []))
"""


def submit_class(course: Path) -> None:
    submit(course, "ada", AID, solved_submission(AID))
    wrong = solved_submission(AID)
    answer_cells(wrong)["softmax_np"].source = WRONG_SOFTMAX
    submit(course, "bob", AID, wrong)


def report_lines(stdout: str) -> list[str]:
    """The report's lines per submission (score, status, notes), without the CSV's path."""
    report = stdout[stdout.index("Grading report") :].splitlines()[1:]
    return [line for line in report if line.startswith("  ")]


def gradebook_rows(course: Path) -> dict:
    """Every row autograding writes, per submission: the grades, comments, penalty."""
    rows = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for sub in gb.assignment_submissions(AID):
            for nb in sub.notebooks:
                rows[(sub.student.id, nb.name)] = {
                    "timestamp": str(sub.timestamp),
                    "late_penalty": nb.late_submission_penalty,
                    "grades": sorted(
                        (g.name, g.auto_score, g.manual_score, g.needs_manual_grade)
                        for g in nb.grades
                    ),
                    "comments": sorted((c.name, c.auto_comment) for c in nb.comments),
                    "score": nb.score,
                }
    return rows


def graded_notebook(course: Path, student: str) -> list:
    """The autograded notebook's cells, without what differs run to run: timings, and how
    the kernel's printed text was cut into messages (consecutive stream outputs joined)."""
    nb = json.loads((course / "autograded" / student / AID / f"{AID}.ipynb").read_text())
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        joined = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
                if (
                    joined
                    and joined[-1].get("output_type") == "stream"
                    and (joined[-1]["name"] == out["name"])
                ):
                    joined[-1]["text"] += text
                    continue
                out = {**out, "text": text}
            joined.append(out)
        if "outputs" in cell:
            cell["outputs"] = joined
    return nb["cells"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    course = make_course(tmp_path_factory.mktemp("class") / "course", [AID])
    submit_class(course)
    return course


def copy_of(pristine: Path, dest: Path) -> Path:
    shutil.copytree(pristine, dest)
    return dest


def run_script(script: str, course: Path, *args: str) -> subprocess.CompletedProcess:
    """``script`` run by this Python in ``course`` (its argv: the course, then ``args``)
    with the class's limits and the sqlite gradebook; it must succeed."""
    env = {**os.environ, **LIMITS, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NBGRADER_DB_URL", None)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(course), *args],
        cwd=course,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def today(pristine, tmp_path_factory):
    course = copy_of(pristine, tmp_path_factory.mktemp("today") / "course")
    return course, run_script(TODAY, course)


def assert_same_grading(course: Path, proc, today) -> None:
    base, base_proc = today
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report_lines(proc.stdout) == report_lines(base_proc.stdout)
    assert gradebook_rows(course) == gradebook_rows(base)
    for student in STUDENTS:
        assert graded_notebook(course, student) == graded_notebook(base, student), student
    assert (course / "grades.csv").read_text() == (base / "grades.csv").read_text()


def test_today_grades_the_class_as_expected(today):
    """The baseline is itself right: a solution scores more than the wrong answer."""
    course, _ = today
    scores = {k[0]: v["score"] for k, v in gradebook_rows(course).items()}
    assert scores["ada"] > scores["bob"] > 0, scores


ONE_WORKERS_JOBS = """
import json, sys
from pathlib import Path

from attention_ref.course import cluster
from attention_ref.trust import trusted

root, aid = Path(sys.argv[1]), sys.argv[2]
template = cluster.build_template(root, aid)
seen = []
for student in sys.argv[3:]:
    files = cluster._regular_files(root / "submitted" / student / aid)
    result = cluster.run_job(cluster.Job(template, student, files, cluster.job_settings()))
    seen.append({
        "student": student,
        "status": result.outcome.status,
        "notebook": result.executed.get(aid, ""),
        "checker": trusted._SHARED[0].proc.pid if trusted._SHARED else None,
    })
print(json.dumps(seen))
"""


def test_a_worker_grades_all_its_jobs_with_one_trusted_checker(pristine, tmp_path):
    """Each job loads the course's configuration again; the worker's trusted checker (3.5 s
    of CPU to start) stays the same process for every job, and grades each as a new one
    would: the solution's notebook comes out the same before and after the wrong answer."""
    course = copy_of(pristine, tmp_path / "course")
    proc = run_script(ONE_WORKERS_JOBS, course, AID, "ada", "bob", "ada")
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s["status"] for s in seen] == ["graded"] * 3, seen
    assert len({s["checker"] for s in seen}) == 1 and seen[0]["checker"], seen
    first, wrong, again = (json.loads(s["notebook"]) for s in seen)
    assert "✓ softmax_np: passed" in json.dumps(first, ensure_ascii=False)
    assert "✓ softmax_np: passed" not in json.dumps(wrong, ensure_ascii=False)
    assert _outputs(again) == _outputs(first)


def _outputs(nb: dict) -> list:
    """Each cell's outputs, with consecutive prints to one stream joined: the kernel may send
    two prints in one message or in two, as it happens to flush (CI saw both)."""
    cells = []
    for cell in nb["cells"]:
        outs: list = []
        for o in cell.get("outputs") or []:
            last = outs[-1] if outs else None
            if (
                o.get("output_type") == "stream"
                and isinstance(last, tuple)
                and last[1] == o["name"]
            ):
                outs[-1] = ("stream", o["name"], last[2] + "".join(o["text"]))
            elif o.get("output_type") == "stream":
                outs.append(("stream", o["name"], "".join(o["text"])))
            else:
                outs.append(o)
        cells.append(outs)
    return cells


@pytest.mark.later  # the same code path as the remote cluster's test, below
def test_the_local_cluster_grades_exactly_as_today(pristine, today, tmp_path):
    course = copy_of(pristine, tmp_path / "course")
    proc = run_course(course, "grade", "--jobs", "2", env_extra=LIMITS, timeout=600)
    assert "2 at a time" in proc.stdout
    assert_same_grading(course, proc, today)


# ----------------------------------------------------------------------------- remote
class Cluster:
    """A `dask scheduler` and two `dask worker` processes on 127.0.0.1, each worker in an
    empty folder of its own."""

    def __init__(self, tmp: Path) -> None:
        self.procs: list[subprocess.Popen] = []
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        env.pop("NBGRADER_DB_URL", None)
        info = tmp / "scheduler.json"
        self._start([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", info], tmp, env)  # fmt: skip
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.address = json.loads(info.read_text())["address"]
        self.workers = []
        for name in ("w1", "w2"):
            folder = tmp / name
            folder.mkdir()
            self.workers.append(
                self._start(
                    [
                        BIN / "dask",
                        "worker",
                        self.address,
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--memory-limit",
                        "0",
                        "--no-dashboard",
                        "--name",
                        name,
                        "--local-directory",
                        folder,
                    ],
                    folder,
                    env,
                )  # fmt: skip
            )

    def _start(self, argv, cwd: Path, env) -> subprocess.Popen:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(cwd / f"{Path(str(argv[1])).name}.log", "ab"),  # noqa: SIM115
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def grading_worker(self, timeout: float = 300):
        """The first worker process (under its nanny) seen grading: a sandboxed kernel
        (bwrap) among its descendants; None if none is seen within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for nanny in self.workers:
                with_children = psutil.Process(nanny.pid).children()
                for worker in with_children:
                    try:
                        if any(p.name() == "bwrap" for p in worker.children(recursive=True)):
                            return worker
                    except psutil.NoSuchProcess:
                        continue
            time.sleep(0.2)
        return None

    def kill_a_worker_mid_job(self, timeout: float = 300) -> str | None:
        """SIGKILL the first worker process (its nanny restarts it) seen grading. Returns
        what was killed."""
        worker = self.grading_worker(timeout)
        if worker is None:
            return None
        time.sleep(1.0)  # well inside the submission's grading
        worker.send_signal(signal.SIGKILL)
        return f"worker process {worker.pid}"

    def kill_the_scheduler_mid_job(self, timeout: float = 300) -> str | None:
        """SIGKILL the scheduler once a worker is seen grading. Returns what was killed."""
        if self.grading_worker(timeout) is None:
            return None
        time.sleep(1.0)
        scheduler = self.procs[0]
        os.killpg(scheduler.pid, signal.SIGKILL)
        return f"scheduler process {scheduler.pid}"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def grade_remotely_while(cluster, course: Path, fault) -> tuple:
    """`make grade` on ``cluster`` while ``fault()`` (a Cluster method) runs beside it:
    (the grading process, what the fault killed or None)."""
    killed: list[str | None] = []
    killer = threading.Thread(target=lambda: killed.append(fault()))
    killer.start()
    proc = run_course(
        course,
        "grade",
        "--scheduler",
        cluster.address,
        "--allow-plaintext-scheduler",
        env_extra=LIMITS,
        timeout=600,
    )
    killer.join()
    return proc, killed[0] if killed else None


def test_a_remote_cluster_grades_exactly_as_today_though_a_worker_dies(
    pristine, today, tmp_path, cluster
):
    course = copy_of(pristine, tmp_path / "course")
    proc, killed = grade_remotely_while(cluster, course, cluster.kill_a_worker_mid_job)
    assert killed, "no worker was seen grading, so none was killed"
    assert f"on the cluster at {cluster.address}" in proc.stdout
    assert "dashboard:" in proc.stdout
    assert_same_grading(course, proc, today)
    # Graded once each: one line per submission, one submission and one set of grades each.
    lines = re.findall(rf"\] {AID} (\S+): (\S+)", proc.stdout)
    assert sorted(lines) == [(s, "graded") for s in STUDENTS]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        subs = gb.assignment_submissions(AID)
        assert sorted(s.student.id for s in subs) == list(STUDENTS)
        n_grades = len(gb.find_notebook(AID, AID).grade_cells)
        assert all(len(nb.grades) == n_grades for s in subs for nb in s.notebooks)
    # The workers' folders held no course: only their own scratch space.
    for name in ("w1", "w2"):
        assert not list((tmp_path / name).rglob("nbgrader_config.py"))
        assert not list((tmp_path / name).rglob("gradebook.db"))


@pytest.mark.parametrize("how", ["flag", pytest.param("env", marks=pytest.mark.later)])
def test_a_remote_scheduler_without_tls_is_refused(pristine, tmp_path, how):
    course = copy_of(pristine, tmp_path / "course")
    address = "tcp://192.0.2.1:8786"  # never contacted: refused first
    if how == "flag":
        proc = run_course(course, "grade", "--scheduler", address, timeout=120)
    else:
        proc = run_course(course, "grade", env_extra={"ATTENTION_REF_SCHEDULER": address})
    assert proc.returncode == 2
    assert f"the scheduler {address} is not encrypted" in proc.stderr
    assert "can run any code on its workers" in proc.stderr
    assert "--allow-plaintext-scheduler" in proc.stderr
    assert not (course / "gradebook.db").exists() and not (course / "autograded").exists()


def test_a_tls_scheduler_is_reached_with_the_courses_certificates(pristine, tmp_path):
    """Over tls:// the command uses ATTENTION_REF_TLS_* (a CA of the course's own); without
    them it refuses before grading anything, and says what to set."""
    from certipy import Certipy
    from distributed import Client

    from attention_ref.course.cluster import TLS_ENV, ClusterConfig

    store = Certipy(store_dir=str(tmp_path / "certs"))
    store.create_ca("grading-ca")
    pair = store.create_signed_pair("grading", "grading-ca")
    files = {
        "tls_ca_file": pair["files"]["ca"],
        "tls_client_cert": pair["files"]["cert"],
        "tls_client_key": pair["files"]["key"],
    }
    info = tmp_path / "scheduler.json"
    tls = [f"--tls-ca-file={files['tls_ca_file']}", f"--tls-cert={files['tls_client_cert']}",
           f"--tls-key={files['tls_client_key']}"]  # fmt: skip
    scheduler = subprocess.Popen(
        [
            BIN / "dask",
            "scheduler",
            "--protocol",
            "tls",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            info,
            *tls,
        ],  # fmt: skip
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        assert address.startswith("tls://")
        course = copy_of(pristine, tmp_path / "course")
        proc = run_course(course, "grade", "--scheduler", address, timeout=120)
        assert proc.returncode == 2
        assert "speaks TLS, and no certificates were given" in proc.stderr
        assert "ATTENTION_REF_TLS_CA" in proc.stderr
        env = {TLS_ENV[k]: str(v) for k, v in files.items()}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            config = ClusterConfig(address)
            config.check()  # encrypted: no flag needed
            with Client(address, security=config.security(), timeout="20s") as client:
                assert client.scheduler_info()["address"] == address
    finally:
        os.killpg(scheduler.pid, signal.SIGTERM)
        scheduler.wait(timeout=20)


class _Lost:
    """A future whose result cannot come: ``result()`` raises ``err``."""

    def __init__(self, err: BaseException) -> None:
        self.err = err

    def result(self):
        raise self.err


def test_a_job_the_cluster_lost_is_reported_with_its_reason():
    """A scheduler gone (its futures cancelled) or a job whose workers all died: the
    submission is named as not graded, with the reason, never dropped."""
    from distributed.client import FutureCancelledError
    from distributed.scheduler import KilledWorker

    from attention_ref.course.cluster import _result_of

    gone = _result_of(_Lost(FutureCancelledError("k", "scheduler-connection-lost")), AID, "ada")
    assert (gone.outcome.student, gone.outcome.assignment) == ("ada", AID)
    assert gone.outcome.status == "not graded" and not gone.executed
    assert "not graded: the cluster lost its job" in gone.outcome.notes[0]
    assert "scheduler-connection-lost" in gone.outcome.notes[0]
    killed = _result_of(_Lost(KilledWorker("k", "tcp://w", [])), AID, "bob")
    assert killed.outcome.status == "not graded"
    assert "the workers grading it died 4 times" in killed.outcome.notes[0]


def assert_each_graded_or_reported(course: Path, proc, reason: str) -> list[str]:
    """Every student has one report line: graded, or not graded with ``reason``; those
    not graded have nothing written (make grade grades them next time). Returns them."""
    lines = dict(re.findall(rf"\] {AID} (\S+): (.+?) \(\d", proc.stdout))
    assert sorted(lines) == sorted(STUDENTS), proc.stdout + proc.stderr
    missed = [s for s, status in lines.items() if status != "graded"]
    assert missed, "every submission was graded: the fault came too late"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(course / "grades.csv", newline="") as f:
        scores = {r["student_id"]: r for r in csv.DictReader(f)}
    for student in missed:
        assert lines[student] == "not graded", lines
        assert reason in proc.stdout, proc.stdout
        assert not (course / "autograded" / student / AID).exists(), student
        # Not graded is no grade: blank in grades.csv, never the 0 of a blank notebook.
        assert scores[student]["score"] == "" and scores[student]["raw_score"] == "", scores
    # nbgrader's autograde of a submission whose execution failed (as in local grading):
    # the submission is in the gradebook, with no automatic points.
    rows = gradebook_rows(course)
    for student in missed:
        grades = rows[(student, AID)]["grades"]
        assert all(auto in (None, 0) for _, auto, _, _ in grades), (student, grades)
    return missed


@pytest.mark.later
def test_a_scheduler_killed_mid_class_leaves_every_submission_graded_or_reported(
    pristine, tmp_path, cluster
):
    course = copy_of(pristine, tmp_path / "course")
    proc, killed = grade_remotely_while(cluster, course, cluster.kill_the_scheduler_mid_job)
    assert killed, "no worker was seen grading, so the scheduler was not killed"
    assert_each_graded_or_reported(course, proc, "not graded: the cluster lost its job")


@pytest.mark.later
def test_a_job_over_the_commands_time_limit_is_stopped_its_worker_restarted_and_reported(
    pristine, tmp_path
):
    """ATTENTION_REF_JOB_SECONDS=3: every job runs longer than that (a kernel starts, the
    notebook runs), so each is stopped and reported, on the local cluster, and the command
    still ends."""
    course = copy_of(pristine, tmp_path / "course")
    start = time.monotonic()
    proc = run_course(
        course,
        "grade",
        "--jobs",
        "2",
        env_extra={**LIMITS, "ATTENTION_REF_JOB_SECONDS": "3"},
        timeout=600,
    )
    seconds = time.monotonic() - start
    missed = assert_each_graded_or_reported(course, proc, "its grading job ran over 3 s")
    assert sorted(missed) == sorted(STUDENTS)
    assert "its worker restarted" in proc.stdout
    assert seconds < 120, f"the command took {seconds:.0f} s to stop two 3 s jobs"


@pytest.mark.parametrize("value", ["soon", "-5", "0", "inf", "nan"])
def test_a_bad_job_time_limit_is_refused_with_what_was_expected(monkeypatch, value):
    from attention_ref.course.cluster import ClusterConfig, ClusterRefusedError

    monkeypatch.setenv("ATTENTION_REF_JOB_SECONDS", value)
    with pytest.raises(ClusterRefusedError) as refused:
        ClusterConfig.from_env()
    assert "ATTENTION_REF_JOB_SECONDS must be a positive number of seconds" in str(refused.value)
    assert repr(value) in str(refused.value)


def test_make_grade_refuses_a_bad_job_time_limit_before_grading(pristine, tmp_path):
    course = copy_of(pristine, tmp_path / "course")
    proc = run_course(course, "grade", env_extra={"ATTENTION_REF_JOB_SECONDS": "soon"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ATTENTION_REF_JOB_SECONDS must be a positive number of seconds" in proc.stderr
    assert not (course / "autograded").exists()


def test_a_job_time_limit_defaults_to_the_budget_and_a_grace(monkeypatch):
    from attention_ref.course.cluster import JOB_GRACE_SECONDS, ClusterConfig

    monkeypatch.delenv("ATTENTION_REF_JOB_SECONDS", raising=False)
    monkeypatch.setenv("ATTENTION_REF_SUBMISSION_SECONDS", "120")
    assert ClusterConfig.from_env().job_limit == 120 + JOB_GRACE_SECONDS
    monkeypatch.setenv("ATTENTION_REF_JOB_SECONDS", "45.5")
    assert ClusterConfig.from_env().job_limit == 45.5
