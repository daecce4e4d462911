"""Course commands behind ``make release`` and ``make grade``.

    python -m attention_ref.course release [ASSIGNMENT ...]
        regenerate notebooks/NN_name/ (student versions) from solutions/ with nbgrader.
    python -m attention_ref.course grade [--jobs N] [--force] [ASSIGNMENT ...]
        autograde every submission under submitted/ into the gradebook, N at a time
        (default: the number of cores), report any submission whose kernel crashed or
        that hit a time limit, and export grades.csv.

Run them from the course root (the folder with nbgrader_config.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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
        from nbgrader.apps.api import NbGraderAPI
        from nbgrader.apps.baseapp import NbGrader

        os.chdir(root)
        # nbgrader runs `alembic` and starts kernels: both must come from this environment.
        bindir = os.path.dirname(sys.executable)
        if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        app = NbGrader()
        app.initialize([])
        url = app.coursedir.db_url
        if url.startswith("sqlite") and "?" not in url:
            # Wait up to 2 minutes for another worker's write instead of failing at once.
            app.coursedir.db_url = url + "?timeout=120"
        _APIS[key] = NbGraderAPI(coursedir=app.coursedir, parent=app)
    return _APIS[key]


def _pick(root: Path, requested: list[str]) -> list[str]:
    known = assignments(root)
    unknown = [a for a in requested if a not in known]
    if unknown:
        raise SystemExit(
            f"error: unknown assignment(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return requested or known


def release(root: Path, requested: list[str]) -> list[str]:
    """Regenerate the student notebooks of ``requested`` (all by default): nbgrader's
    ``generate_assignment --force`` for each, through its Python API in this one process
    (one start-up and one gradebook connection for all of them)."""
    aids = _pick(root, requested)
    api = nbgrader_api(root)
    done = []
    for aid in aids:
        result = api.generate_assignment(aid, force=True)
        if not result["success"]:
            raise SystemExit(
                f"error: `nbgrader generate_assignment {aid} --force` failed:\n"
                f"{result.get('log') or ''}{result.get('error') or ''}"
            )
        print(f"released {aid} -> notebooks/{aid}/")
        done.append(aid)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_ref.course",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_rel = sub.add_parser("release", help="regenerate notebooks/ from solutions/")
    p_rel.add_argument("assignments", nargs="*")
    p_grade = sub.add_parser("grade", help="autograde submitted/ and export grades.csv")
    p_grade.add_argument("assignments", nargs="*")
    p_grade.add_argument("--csv", default="grades.csv", help="where to export the grades")
    p_grade.add_argument(
        "--force", action="store_true", help="regrade submissions that were graded before"
    )
    p_grade.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="submissions graded at a time (default: the number of cores)",
    )
    args = parser.parse_args(argv)
    root = course_root()
    if args.command == "release":
        release(root, args.assignments)
        return 0
    from .grading import grade  # noqa: PLC0415 - only needed for grading

    return grade(root, args.assignments, csv_path=args.csv, force=args.force, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
