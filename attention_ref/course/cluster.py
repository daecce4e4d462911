"""``make grade`` on dask.distributed: pure grading jobs, and one writer of the gradebook.

One code path for every cluster. By default the command starts a local cluster of its own
(``LocalCluster``: ``jobs`` worker processes of one thread each) and stops it at the end;
with a scheduler's address (``--scheduler`` or ``ATTENTION_REF_SCHEDULER``) the same jobs
go to a running cluster whose workers may be other machines.

**A job is pure.** Its input (:class:`Job`) is bytes: the assignment's source folder
(``solutions/<aid>/``), the course's ``nbgrader_config.py``, a gradebook holding only that
assignment (generated once per assignment by the command), one submission's files and the
grading settings of the command's environment (time limits, caps, budgets). A worker
builds a private course folder from it in a temporary folder, with a private sqlite
gradebook, and runs :func:`attention_ref.course.autograde.grade_submission` there: the
sandbox, the trusted checker, the salvage of a killed kernel and the budgets are those of
local grading. It returns a :class:`JobResult`: the
:class:`~attention_ref.course.autograde.Outcome` and each notebook as its kernel left it
(taken right after execution, before nbgrader scored it). A worker never sees the course
folder, another student's files, the real gradebook or its credentials (``NBGRADER_DB_URL``
and the hub's variables are removed while a job runs).

**The command writes everything.** For each result, in the order they arrive, the command
runs nbgrader's own autograde on the real submission with its ``Execute`` step replaced by
:class:`Replay`, which hands on the notebook the worker executed: nbgrader's sanitising,
``SaveAutoGrades``, late penalties and the course's ``Inert`` then write the real gradebook
(sqlite or PostgreSQL) and ``autograded/`` exactly as local grading does. A submission
whose kernel died is replayed as it was graded: a first run that fails, then the run from a
copy of its notebooks. Each submission is written once, by the command.

**Faults.** A worker that dies mid-job: the scheduler gives the job to another worker
(``distributed.scheduler.allowed-failures`` times, default 3); after that, or when the
scheduler goes away, the submission is reported as not graded, with the reason, and
``make grade`` grades it next time. A job that runs longer on its worker than the command
allows (``ATTENTION_REF_JOB_SECONDS``; by default the submission's budget plus 300 s) is
stopped, its worker restarted, and the submission reported the same way: the budget is the
kernels', this limit catches a job stuck outside them. Every submission ends graded or
named in the report.

**A remote scheduler runs code.** Whoever can reach a scheduler can run anything on its
workers and send anything back; so the command refuses an address that is not encrypted
(``tls://``, ``wss://``) unless ``--allow-plaintext-scheduler`` or
``ATTENTION_REF_ALLOW_PLAINTEXT_SCHEDULER=1`` says the network is trusted. TLS files:
``ATTENTION_REF_TLS_CA``, ``ATTENTION_REF_TLS_CERT``, ``ATTENTION_REF_TLS_KEY`` (else Dask's
own ``distributed.comm.tls`` configuration).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..trust import sandbox, trusted
from . import autograde, load, plumbing
from .exchange import HUB_CREDENTIALS
from .plumbing import ROOT_MARKER, new_nbgrader_api

SCHEDULER_ENV = "ATTENTION_REF_SCHEDULER"
#: The command's own time limit on one job, from the moment its worker starts it (seconds).
JOB_SECONDS_ENV = "ATTENTION_REF_JOB_SECONDS"
#: By default a job may run the submission's budget plus this, for its worker's own work
#: (building the private course, starting the sandbox, the trusted checker's imports).
JOB_GRACE_SECONDS = 300.0
PLAINTEXT_ENV = "ATTENTION_REF_ALLOW_PLAINTEXT_SCHEDULER"
TLS_ENV = {
    "tls_ca_file": "ATTENTION_REF_TLS_CA",
    "tls_client_cert": "ATTENTION_REF_TLS_CERT",
    "tls_client_key": "ATTENTION_REF_TLS_KEY",
}
ENCRYPTED = ("tls", "wss")
#: The command's settings a job grades with (time limits, caps, budgets, thread counts):
#: sent with each job, and the only such variables a job sees. Not sent: the scheduler's
#: and TLS settings, and the path of a student edition (each worker builds its own).
SETTINGS = re.compile(
    r"^(ATTENTION_REF_(?!SANDBOX_PACKAGE$|SCHEDULER$|ALLOW_PLAINTEXT_SCHEDULER$|TLS_)[A-Z0-9_]+"
    r"|NBGRADER_CELL_TIMEOUT|NBGRADER_TRAINING_TIMEOUT|NBGRADER_TIMEOUT_AFTER"
    r"|OMP_NUM_THREADS|MKL_NUM_THREADS|OPENBLAS_NUM_THREADS|PYTHONHASHSEED|MPLBACKEND)$"
)
#: What a job never sees, whatever its worker's environment holds.
SECRETS = re.compile(r"^(NBGRADER_DB_URL|PGPASSWORD|PGPASSFILE)$")
PLAINTEXT_REFUSED = (
    "grading refused: the scheduler {address} is not encrypted. Whoever can reach a Dask "
    "scheduler can run any code on its workers (the students' notebooks are graded there) "
    "and read what they send back, so make grade only talks to a remote scheduler over TLS "
    "(a tls:// address, with ATTENTION_REF_TLS_CA, ATTENTION_REF_TLS_CERT and "
    "ATTENTION_REF_TLS_KEY; docs/INSTRUCTOR_GUIDE.md, 'Grading on a cluster'). On a network "
    "only you can reach, say so: --allow-plaintext-scheduler or {env}=1."
)


class ClusterRefusedError(RuntimeError):
    """The cluster named cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class ClusterConfig:
    """Where the jobs go: ``address`` None is a local cluster the command starts."""

    address: str | None = None
    allow_plaintext: bool = False
    job_seconds: float = 0.0  # 0: the submission's budget + JOB_GRACE_SECONDS

    @property
    def job_limit(self) -> float:
        """Seconds a job may run on its worker before the command stops it and reports it."""
        if self.job_seconds > 0:
            return self.job_seconds

        return autograde.submission_seconds() + JOB_GRACE_SECONDS

    @classmethod
    def from_env(cls) -> ClusterConfig:
        """From ``ATTENTION_REF_SCHEDULER`` and ``ATTENTION_REF_ALLOW_PLAINTEXT_SCHEDULER``
        (the command line sets them); refuses a plaintext remote scheduler."""
        address = os.environ.get(SCHEDULER_ENV, "").strip() or None
        allow = os.environ.get(PLAINTEXT_ENV, "").strip().lower() in ("1", "yes", "true", "on")
        raw = os.environ.get(JOB_SECONDS_ENV, "").strip()
        try:
            job_seconds = float(raw) if raw else 0.0
        except ValueError:
            job_seconds = -1.0
        if raw and not 0 < job_seconds < float("inf"):
            raise ClusterRefusedError(
                f"grading refused: {JOB_SECONDS_ENV} must be a positive number of seconds "
                f"(the longest one submission's grading job may run on its worker); got {raw!r}"
            )
        config = cls(address, allow, job_seconds)
        config.check()
        return config

    @property
    def scheme(self) -> str:
        if self.address is None:
            return "local"
        return self.address.split("://", 1)[0].lower() if "://" in self.address else "tcp"

    def check(self) -> None:
        if self.address is not None and self.scheme not in ENCRYPTED and not self.allow_plaintext:
            raise ClusterRefusedError(
                PLAINTEXT_REFUSED.format(address=self.address, env=PLAINTEXT_ENV)
            )

    def security(self):
        """Dask's Security for a ``tls://`` scheduler (None for the others)."""
        if self.scheme not in ENCRYPTED:
            return None
        from distributed.security import Security

        files = {k: os.environ[v] for k, v in TLS_ENV.items() if os.environ.get(v)}
        if not files:
            configured = Security()  # Dask's configuration (distributed.comm.tls.*)
            if not configured.tls_ca_file:
                raise ClusterRefusedError(
                    f"grading refused: the scheduler {self.address} speaks TLS, and no "
                    f"certificates were given: set {', '.join(TLS_ENV.values())} (the CA, "
                    "this machine's certificate and its key; docs/INSTRUCTOR_GUIDE.md, "
                    "'Grading on a cluster') or Dask's distributed.comm.tls configuration"
                )
            return configured
        missing = [v for k, v in TLS_ENV.items() if k not in files]
        if missing:
            raise ClusterRefusedError(
                f"grading refused: TLS needs all of {', '.join(TLS_ENV.values())}; "
                f"missing: {', '.join(missing)}"
            )
        return Security(require_encryption=True, **files)


# ----------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Template:
    """What every job of one assignment needs: the files of ``solutions/<aid>/`` and of
    the course (its ``nbgrader_config.py``), and a gradebook holding only the assignment."""

    aid: str
    config: bytes
    source: dict[str, bytes]
    gradebook: bytes


@dataclass(frozen=True)
class Job:
    """One submission to grade: its files (relative path: bytes) and the settings."""

    template: Template
    student: str
    files: dict[str, bytes]
    #: never in a log: it carries the grading secret (trust/secret.py)
    settings: dict[str, str] = field(repr=False)


@dataclass
class JobResult:
    """What a job sends back: the outcome, and each notebook (by name, as JSON) as its
    kernel left it in the grading run that counts."""

    outcome: object  # autograde.Outcome
    executed: dict[str, str] = field(default_factory=dict)
    worker: str = ""
    seconds: float = 0.0  # the whole job on its worker (the grading is outcome.seconds)


def _regular_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (relative path: bytes), never through a link."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(folder))] = p.read_bytes()
    return out


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = (folder / rel).resolve()
        if folder.resolve() not in target.parents:
            raise ValueError(f"a job's file {rel!r} is outside its folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def sqlite_url(root: Path) -> str:
    return f"sqlite:///{root / 'gradebook.db'}"


def build_template(root: Path, aid: str) -> Template:
    """Generate ``aid`` into a gradebook of its own (a private copy of the course's config
    and of ``solutions/<aid>/``), once per assignment, for every job of it."""
    config = (root / ROOT_MARKER).read_bytes()
    source = _regular_files(root / "solutions" / aid)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="grading-template-") as tmp:
        course = Path(tmp) / "course"
        _write_files(course, {ROOT_MARKER: config})
        _write_files(course / "solutions" / aid, source)
        try:
            api = new_nbgrader_api(course, db_url=sqlite_url(course))
            result = api.generate_assignment(aid, force=True, create=True)
        finally:
            os.chdir(cwd)
        if not result["success"]:
            raise RuntimeError(
                f"could not generate {aid} for the workers:\n"
                + ((result.get("log") or "") + (result.get("error") or ""))[-4000:]
            )
        gradebook = (course / "gradebook.db").read_bytes()
    return Template(aid, config, source, gradebook)


def job_settings() -> dict[str, str]:
    """The command's grading settings, sent with every job."""
    return {k: v for k, v in os.environ.items() if SETTINGS.match(k)}


@functools.cache
def _preprocessors() -> tuple[type, type]:
    """(Snapshot, Replay): nbgrader preprocessors, built when first needed (nbgrader is
    imported only where grading happens)."""
    import nbformat
    from nbgrader.preprocessors import NbGraderPreprocessor

    class Snapshot(NbGraderPreprocessor):
        """On a worker, right after execution: keep each notebook as its kernel left it."""

        taken: dict[str, str] = {}

        def preprocess(self, nb, resources):
            Snapshot.taken[resources["nbgrader"]["notebook"]] = nbformat.writes(nb)
            return nb, resources

    class Replay(NbGraderPreprocessor):
        """On the command's side, in place of execution: the notebook a worker executed."""

        executed: dict[str, str] = {}
        reason = "its grading job returned no notebook"

        def preprocess(self, nb, resources):
            name = resources["nbgrader"]["notebook"]
            if name not in Replay.executed:
                raise RuntimeError(f"not executed: {Replay.reason}")
            return nbformat.reads(Replay.executed[name], as_version=4), resources

    return Snapshot, Replay


def _is_execute(p) -> bool:
    from nbgrader.preprocessors import Execute

    return isinstance(p, type) and issubclass(p, Execute)


def _after_execute(extra: type) -> Callable[[list], list]:
    def edit(pps: list) -> list:
        out = []
        for p in pps:
            out.append(p)
            if _is_execute(p):
                out.append(extra)
        return out

    return edit


def _instead_of_execute(replacement: type) -> Callable[[list], list]:
    return lambda pps: [replacement if _is_execute(p) else p for p in pps]


@contextlib.contextmanager
def _job_environment(settings: dict[str, str]) -> Iterator[None]:
    """While a job runs: the command's settings, and none of the worker's secrets."""
    saved, cwd = dict(os.environ), os.getcwd()
    for name in list(os.environ):
        if SETTINGS.match(name) or SECRETS.match(name) or HUB_CREDENTIALS.match(name):
            del os.environ[name]
    os.environ.update(settings)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        with contextlib.suppress(OSError):
            os.chdir(cwd)


def _scratch() -> str | None:
    """The worker's own folder (Dask removes what a dead worker left there), if any."""
    with contextlib.suppress(Exception):
        from distributed import get_worker

        return get_worker().local_directory
    return None


def run_job(job: Job) -> JobResult:
    """Grade one submission in a private course folder; runs on a worker. Never raises:
    whatever goes wrong is the outcome's."""

    aid = job.template.aid
    outcome = autograde.Outcome(job.student, aid)
    start = time.perf_counter()
    _announce_start()
    snapshot, _ = _preprocessors()
    snapshot.taken = {}
    with _job_folder() as tmp, _job_environment(job.settings):
        root = Path(tmp) / "course"
        try:
            _write_files(root, {ROOT_MARKER: job.template.config})
            _write_files(root / "solutions" / aid, job.template.source)
            (root / "gradebook.db").write_bytes(job.template.gradebook)
            _write_files(root / "submitted" / job.student / aid, job.files)
            if sandbox.enabled() and sandbox.EDITION_ENV not in os.environ:
                os.environ[sandbox.EDITION_ENV] = str(sandbox.student_edition())
            plumbing._APIS[str(root)] = new_nbgrader_api(
                root, db_url=sqlite_url(root), edit_autograde=_after_execute(snapshot)
            )
            outcome = autograde.grade_submission(str(root), aid, job.student, force=True)
        except Exception as err:  # never lose the class to one submission
            outcome.not_graded(
                f"the grading job raised {type(err).__name__}: {err}", grader_failed=True
            )
            outcome.seconds = time.perf_counter() - start
        finally:
            plumbing._APIS.pop(str(root), None)
    executed = dict(snapshot.taken) if outcome.status != autograde.NOT_GRADED else {}
    return JobResult(outcome, executed, _worker_name(), time.perf_counter() - start)


#: A grading job's folder (a private course holding one student's files), in its worker's
#: scratch folder.
JOB_PREFIX = "grading-job-"


@contextlib.contextmanager
def _job_folder() -> Iterator[str]:
    """A job's private folder, marked with its worker's process: a worker killed mid-job
    (its folder left behind, a student's notebook in it) has it removed by the next job
    that starts beside it (:func:`.sandbox.new_marked_dir`)."""

    tmp = sandbox.new_marked_dir(JOB_PREFIX, _scratch())
    try:
        yield str(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: The topic of the event a job logs when its worker starts it (the command's clock of it).
STARTED = "attention-ref-job-started"


def _announce_start() -> None:
    """Tell the scheduler that this worker has started the job (its key and address): the
    command's time limit counts from here, not from when the job was queued."""
    with contextlib.suppress(Exception):  # run outside a worker (tests): nothing to tell
        from distributed import get_worker

        worker = get_worker()
        worker.log_event(STARTED, {"key": worker.get_current_task(), "worker": worker.address})


def _worker_name() -> str:
    with contextlib.suppress(Exception):
        from distributed import get_worker

        return get_worker().address
    return ""


# ----------------------------------------------------------------------------- the head
def _replay_api(root: Path):
    """The command's own nbgrader API for writing results: autograde with ``Replay``."""
    _, replay = _preprocessors()
    key = ("replay", str(root))
    if key not in _REPLAY_APIS:
        cwd = os.getcwd()
        try:
            _REPLAY_APIS[key] = new_nbgrader_api(root, edit_autograde=_instead_of_execute(replay))
        finally:
            os.chdir(cwd)
    return _REPLAY_APIS[key]


_REPLAY_APIS: dict[tuple[str, str], object] = {}


def write_result(root: Path, result: JobResult, force: bool):
    """Write one job's result into the course: the gradebook and ``autograded/``, as local
    grading would have (nbgrader's autograde, its execution replaced by the worker's)."""
    from nbgrader.utils import temp_attrs

    o = result.outcome
    _, replay = _preprocessors()
    api = _replay_api(root)
    replay.reason = "; ".join(o.notes) or "its grading job returned no notebook"
    if o.status == "graded":
        replay.executed = dict(result.executed)
        written = autograde._autograde(api, o.assignment, o.student, force)
    else:  # failed, or crashed: a first run whose kernel died, as on the worker
        replay.executed = {}
        autograde._autograde(api, o.assignment, o.student, force)
        if o.status == autograde.NOT_GRADED:
            return o
        # ... then graded again from a copy of its notebooks, as autograde._salvage does
        replay.executed = dict(result.executed)
        src = root / "submitted" / o.student / o.assignment
        with tempfile.TemporaryDirectory(prefix="salvage-", dir=root) as tmp:
            dst = Path(tmp) / o.student / o.assignment
            dst.mkdir(parents=True)
            for nb_path in src.glob("*.ipynb"):
                if nb_path.is_file() and not nb_path.is_symlink():
                    shutil.copyfile(nb_path, dst / nb_path.name)
            with temp_attrs(api.coursedir, submitted_directory=tmp):
                written = autograde._autograde(api, o.assignment, o.student, force=True)
    replay.executed = {}
    if not written["success"]:
        cause, _ = autograde.failure_cause(autograde._result_text(written))
        o.not_graded(f"its grades could not be written: {cause}", grader_failed=True)
    return o


def _quiet() -> None:
    """A local worker's stderr (and its kernels') carries only noise: kernel start-up
    warnings, SQLAlchemy's about nbgrader's sessions; what matters, nbgrader's log, comes
    back in the Outcome. Cheap: the plugin that runs it holds up the cluster's start."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _stop_checker() -> None:
    """As a worker closes: stop its trusted checker (started once per process, for every job
    it grades), which also removes the checker's folder; a worker process ends without
    running atexit handlers, so that folder would be left behind."""

    while trusted._SHARED:
        trusted._SHARED.pop().stop()


@contextlib.contextmanager
def open_client(config: ClusterConfig, jobs: int) -> Iterator[object]:
    """A Dask client: on a local cluster of ``jobs`` one-thread workers that this starts
    and stops, or on the scheduler of ``config``. Dask's connection timeouts (30 s) are
    stretched by the machine's load (:mod:`.load`): on a busy machine a worker starts and
    answers as slowly as everything else, and is not given up for dead."""
    import dask

    seconds = f"{max(30, round(load.scaled(30)))}s"
    stretched = {
        "distributed.comm.timeouts.connect": seconds,
        "distributed.comm.timeouts.tcp": seconds,
    }
    with dask.config.set(stretched):
        yield from _open_client(config, jobs)


def _open_client(config: ClusterConfig, jobs: int) -> Iterator[object]:
    from distributed import Client, LocalCluster
    from distributed.diagnostics.plugin import WorkerPlugin

    if config.address is None:
        with (
            # The workers' scratch folder is the command's own: Dask's default,
            # /tmp/dask-scratch-space, belongs to whoever used Dask first on the machine.
            tempfile.TemporaryDirectory(prefix="grading-workers-") as scratch,
            LocalCluster(
                n_workers=jobs,
                threads_per_worker=1,
                processes=True,
                memory_limit=0,  # a kernel's memory is the sandbox's to cap
                # The scheduler's HTTP routes (health, metrics) always start; on a free
                # port of the loopback, not 8787 (taken by a second grading at once).
                dashboard_address="127.0.0.1:0",
                silence_logs=logging.ERROR,
                local_directory=scratch,
            ) as cluster,
            Client(cluster) as client,
        ):

            class Quiet(WorkerPlugin):
                def setup(self, worker):
                    _quiet()

                def teardown(self, worker):
                    _stop_checker()

            client.register_plugin(Quiet(), name="attention-ref-quiet")
            yield client
        return
    security = config.security()
    try:
        client = Client(config.address, security=security, timeout="30s")
    except Exception as err:  # unreachable, refused, a TLS handshake that failed
        raise ClusterRefusedError(
            f"grading refused: could not reach the scheduler {config.address}: {err}"
        ) from err
    with client:
        print(f"cluster: {config.address}; dashboard: {client.dashboard_link}", flush=True)
        try:
            client.wait_for_workers(1, timeout=120)
        except TimeoutError as err:
            raise ClusterRefusedError(
                f"grading refused: the scheduler {config.address} has had no worker for 2 minutes"
            ) from err

        class StopChecker(WorkerPlugin):
            def teardown(self, worker):
                _stop_checker()

        with contextlib.suppress(Exception):  # a scheduler that refuses plugins: no cleanup
            client.register_plugin(StopChecker(), name="attention-ref-stop-checker")
        yield client


def needs_grading(root: Path, aid: str, student: str, force: bool) -> bool:
    """Whether nbgrader's autograde would grade the submission (as its converter decides:
    forced, never graded, or submitted again since)."""

    if force:
        return True
    dest = root / "autograded" / student / aid
    if not dest.exists():
        return True
    coursedir = plumbing.nbgrader_api(root).coursedir
    new = coursedir.get_existing_timestamp(str(root / "submitted" / student / aid))
    old = coursedir.get_existing_timestamp(str(dest))
    return new is not None and old is not None and new > old


@dataclass
class EngineStats:
    """What the engine itself costs: once (the assignments' templates, starting or reaching
    the cluster) and per job (around the grading on its worker, writing its result)."""

    templates_s: float = 0.0
    cluster_s: float = 0.0
    jobs: int = 0
    grading_s: float = 0.0
    around_s: float = 0.0
    writing_s: float = 0.0

    def add(self, result: JobResult, writing_s: float) -> None:
        if result.seconds <= 0:  # lost by the cluster: no job ran to its end
            return
        self.jobs += 1
        self.grading_s += result.outcome.seconds
        self.around_s += max(0.0, result.seconds - result.outcome.seconds)
        self.writing_s += writing_s

    def line(self) -> str:
        n = max(self.jobs, 1)
        per_job = (self.around_s + self.writing_s) / n
        share = per_job / (self.grading_s / n) if self.grading_s else 0.0
        return (
            f"engine: templates {self.templates_s:.1f} s, cluster {self.cluster_s:.1f} s; "
            f"per job: grading {self.grading_s / n:.1f} s, around it on its worker "
            f"{self.around_s / n:.2f} s, writing its result {self.writing_s / n:.2f} s "
            f"(overhead {share:.1%})"
        )


def grade_on_cluster(
    root: Path,
    tasks: list[tuple[str, str]],
    force: bool,
    jobs: int,
    config: ClusterConfig,
    finished: Callable[[object], None],
) -> None:
    """Grade ``tasks`` [(assignment, student)] on the cluster; ``finished(outcome)`` for
    each, as its grades are written."""
    from tqdm import tqdm

    # On a terminal only (disable=None): a log gets the per-submission lines alone.
    bar = tqdm(total=len(tasks), desc="grading", unit="submission", file=sys.stderr, disable=None)
    try:

        def done(o) -> None:
            bar.update(1)
            finished(o)

        todo = []
        for aid, student in tasks:
            if needs_grading(root, aid, student, force):
                todo.append((aid, student))
            else:  # graded before: nbgrader would skip it; its notes as they stand
                o = autograde.Outcome(student, aid)
                autograde.note_graded(root / "autograded" / student / aid, o)
                done(o)
        if not todo:
            return
        stats = EngineStats()
        clock = time.perf_counter()
        with open_client(config, jobs) as client:
            stats.cluster_s = time.perf_counter() - clock
            clock = time.perf_counter()
            templates = {
                aid: build_template(root, aid) for aid in dict.fromkeys(a for a, _ in todo)
            }
            settings = job_settings()
            stats.templates_s = time.perf_counter() - clock
            futures = {}
            for aid, student in todo:
                job = Job(
                    templates[aid],
                    student,
                    _regular_files(root / "submitted" / student / aid),
                    settings,
                )
                # No student id in the key: the scheduler's dashboard and logs show keys.
                key = f"grade-{aid}-{uuid.uuid4().hex}"
                futures[client.submit(run_job, job, key=key, pure=False)] = (aid, student)
            for fut, result in _finished(client, futures, config.job_limit):
                aid, student = futures.pop(fut)
                result = result or _result_of(fut, aid, student)
                clock = time.perf_counter()
                with warnings.catch_warnings():  # SQLAlchemy's about nbgrader's sessions
                    warnings.simplefilter("ignore")
                    outcome = write_result(root, result, force)
                stats.add(result, time.perf_counter() - clock)
                done(outcome)
                fut.release()
        print(stats.line(), flush=True)
    finally:
        bar.close()


def _finished(client, futures: dict, limit: float, poll: float = 2.0) -> Iterator[tuple]:
    """Each future as it ends, with None; or, for a job that has run on its worker longer
    than ``limit`` seconds, the future (cancelled, its worker restarted) with a failed
    JobResult that says so. A job's clock starts when its worker starts it (a retried job
    starts again on its new worker), so a long queue costs nothing."""
    from distributed import wait

    key_of = {fut.key: fut for fut in futures}
    started: dict[object, tuple[float, str]] = {}
    pending = set(futures)
    while pending:
        try:
            wait(list(pending), timeout=poll, return_when="FIRST_COMPLETED")
        except TimeoutError:  # none ended in time
            pass
        except Exception:  # futures cancelled (the scheduler gone): each says why below
            if not any(f.done() for f in pending):
                time.sleep(poll)
        for fut in [f for f in pending if f.done()]:
            pending.discard(fut)
            yield fut, None
        with contextlib.suppress(Exception):  # no events: the futures' own end still comes
            for when, msg in client.get_events(STARTED):
                if isinstance(msg, dict) and msg.get("key") in key_of:
                    fut = key_of[msg["key"]]
                    if started.get(fut, (0.0, ""))[0] < when:
                        started[fut] = (when, str(msg.get("worker", "")))
        now = time.time()
        for fut in [f for f in pending if f in started and now - started[f][0] > limit]:
            pending.discard(fut)
            fut.cancel()
            worker = started[fut][1]
            with contextlib.suppress(Exception):  # a hung job keeps its worker busy
                client.restart_workers([worker], timeout=60, raise_for_error=False)
            aid, student = futures[fut]
            why = (
                f"not graded: its grading job ran over {limit:g} s on its worker "
                f"({JOB_SECONDS_ENV}; by default the submission's budget plus "
                f"{JOB_GRACE_SECONDS:g} s) and was stopped, its worker restarted; "
                "make grade grades it next time"
            )
            yield fut, JobResult(autograde.Outcome(student, aid, autograde.NOT_GRADED, [why]))


def _result_of(fut, aid: str, student: str) -> JobResult:
    """The future's result, or a failed outcome that says why there is none."""
    from distributed.scheduler import KilledWorker

    try:
        return fut.result()
    except KilledWorker:
        import dask

        tries = dask.config.get("distributed.scheduler.allowed-failures") + 1
        why = (
            f"not graded: the workers grading it died {tries} times (killed, out of "
            "memory, or their machine went away); make grade grades it next time"
        )
    except Exception as err:  # the scheduler went away, the job was lost or cancelled
        why = (
            f"not graded: the cluster lost its job ({type(err).__name__}: {err}); "
            "make grade grades it next time"
        )
    return JobResult(autograde.Outcome(student, aid, autograde.NOT_GRADED, [why]))
