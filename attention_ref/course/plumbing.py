"""nbgrader's plumbing, shared by every course command: the course root, its
assignments, nbgrader itself (its command line and its Python API), and how to read what
stopped a graded cell (a time limit, a cap of the sandbox).

Nothing here imports another module of :mod:`attention_ref.course`, so every command
(release, grading, the report) builds on this module and none on another command.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT_MARKER = "nbgrader_config.py"


def course_root(start: str | os.PathLike | None = None) -> Path:
    """The course root: the nearest folder, from ``start`` up, holding nbgrader_config.py."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / ROOT_MARKER).is_file():
            return p
    raise SystemExit(
        f"error: no {ROOT_MARKER} found in {here} or its parents; run this from the course "
        "folder (the clone of the repository)."
    )


def assignments(root: Path) -> list[str]:
    """Assignment ids: the folders of solutions/ that hold a notebook of the same name."""
    src = root / "solutions"
    return (
        sorted(d.name for d in src.iterdir() if d.is_dir() and (d / f"{d.name}.ipynb").is_file())
        if src.is_dir()
        else []
    )


def nbgrader(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``nbgrader ARGS`` in the course root with this interpreter; output is captured."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    env = dict(os.environ)
    # nbgrader runs `alembic` and starts kernels: both must come from this environment.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise SystemExit(
            f"error: `nbgrader {' '.join(args)}` failed (exit {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return proc


_APIS: dict[str, object] = {}


def nbgrader_api(root: Path):
    """nbgrader's Python API for the course at ``root``, configured as the command line
    would be (nbgrader_config.py of the course and of the user), one per process."""
    key = str(root)
    if key not in _APIS:
        _APIS[key] = new_nbgrader_api(root)
    return _APIS[key]


@functools.cache
def gradebook_schema_version() -> str:
    """The revision a new gradebook is stamped with: the head of nbgrader's own alembic
    migrations, read from its package (what ``alembic heads`` prints first)."""
    import nbgrader
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory(os.path.join(os.path.dirname(nbgrader.__file__), "alembic")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"nbgrader's migrations have {len(heads)} heads, expected one: {heads}")
    return heads[0]


def read_gradebook_version_in_process() -> None:
    """Make nbgrader read that revision in this process when it creates a gradebook.

    nbgrader asks a new ``alembic`` process (``alembic heads``), 2.2 s of the 2.4 s it takes
    to generate an assignment into a new gradebook; ``make grade`` does that once per
    assignment per run, and tests do it for every course they build. Idempotent."""
    import nbgrader.api

    nbgrader.api.get_alembic_version = gradebook_schema_version


def new_nbgrader_api(
    root: Path,
    *,
    db_url: str | None = None,
    edit_autograde: Callable[[list], list] | None = None,
):
    """A new nbgrader API for the course at ``root`` (not cached): ``db_url`` replaces the
    configured gradebook; ``edit_autograde`` maps the configured list of autograde
    preprocessors to the list this API grades with (a cluster's worker and head do:
    :mod:`attention_ref.course.cluster`)."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.apps.baseapp import NbGrader
    from nbgrader.converters import Autograde

    read_gradebook_version_in_process()
    os.chdir(root)
    # nbgrader runs `alembic` and starts kernels: both must come from this environment.
    bindir = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    app = NbGrader()
    app.initialize([])
    if edit_autograde is not None:
        configured = app.config.Autograde.get("autograde_preprocessors")
        if configured is None:
            configured = Autograde.class_traits()["autograde_preprocessors"].default()
        app.config.Autograde.autograde_preprocessors = edit_autograde(list(configured))
    if db_url is not None:
        app.coursedir.db_url = db_url
    url = app.coursedir.db_url
    if url.startswith("sqlite") and "?" not in url:
        # Wait up to 2 minutes for another worker's write instead of failing at once.
        app.coursedir.db_url = url + "?timeout=120"
    return NbGraderAPI(coursedir=app.coursedir, parent=app)


#: What an error output says when a cap of the sandbox stopped the cell: (the cap, the
#: words that show it in ``ename: evalue``).
CAP_SIGNS = {
    "memory": re.compile(
        r"^MemoryError|can't allocate memory|Cannot allocate memory|Unable to allocate|"
        r"std::bad_alloc"
    ),
    "processes and threads": re.compile(
        r"Resource temporarily unavailable|can't start new thread|can't create new thread"
    ),
    "bytes written": re.compile(r"No space left on device|File too large"),
}


def stop_reason(cell) -> str | None:
    """What stopped a graded cell, read from its error output: "time" (its time limit),
    a cap of the sandbox (a key of :data:`CAP_SIGNS`), or None. ``make grade``'s report
    and the class report both read cells with it."""
    for o in cell.get("outputs", []):
        if o.get("output_type") != "error":
            continue
        if "Timeout" in o.get("ename", ""):
            return "time"
        text = f"{o.get('ename', '')}: {o.get('evalue', '')}"
        hit = [cap for cap, sign in CAP_SIGNS.items() if sign.search(text)]
        if hit:
            return hit[0]
    return None


def ungraded(root: Path) -> set[tuple[str, str]]:
    """``{(student, assignment)}``: the submissions under ``submitted/`` that have no graded
    copy under ``autograded/`` (never graded, or their grading failed). Their scores are
    left blank in every grade file, never written as 0: ``make grade`` grades them next
    time."""
    out = set()
    sub = root / "submitted"
    if not sub.is_dir():
        return out
    for student in sub.iterdir():
        if not student.is_dir() or student.is_symlink():
            continue
        for a in student.iterdir():
            submitted = a.is_dir() and not a.is_symlink() and any(a.glob("*.ipynb"))
            if submitted and not (root / "autograded" / student.name / a.name).is_dir():
                out.add((student.name, a.name))
    return out
