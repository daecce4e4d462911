"""Prove the version ranges in pyproject.toml at both ends (`make versions`).

    python tools/versions.py [oldest] [newest] [--serial] [--install-only | --installed]

For each end of the ranges it makes its own virtual environment (.venv-oldest, .venv-newest),
installs there the package and every requirement of pyproject.toml (the dependencies and
the [dev] extra, read from the file, never listed here), and runs the unit tests and every
solution notebook (nbval) with that environment's Python.

- oldest: each direct requirement at its floor, the version its lower bound names
  (`torch>=2.5,<3` installs torch 2.5.0); what they need in turn resolves as pip resolves it.
  This is uv's `--resolution lowest-direct`, written out so that it needs nothing but pip.
- newest: the newest versions the ranges allow (upgraded on every run).

Each end runs on its own Python, the ends of `requires-python`: the oldest dependencies on
the oldest Python it allows (`>=3.11,<3.14`: 3.11), the newest on the newest (3.13). The
interpreter is `$PYTHON_OLDEST` / `$PYTHON_NEWEST` when set, else `python3.X` on the PATH,
else the newest `3.X.*` that pyenv holds. One that is absent fails that end with a message
saying how to install it (never a skip).

The tests are those `make test-other-lane` runs, read from the Makefile: all but its
GRADING_LANE (nbgrader, the sandbox, PostgreSQL and Chromium, which prove the grading
machinery rather than the libraries' numerics, and take as long again), with its `-m`
selection; and of those, not the ones in UNIT_TESTS_SKIP: the JupyterHub test (it needs
configurable-http-proxy from npm) and tests/test_environment.py (it asserts the locked
versions, which these two environments by design are not). The solution notebooks, the
checks, the mistake catalogs and `make release` all run; the student notebooks are not
executed (UNIT_TESTS_DESELECT): each is its solution less the answers, so its use of the
libraries runs in the solution, and what a student run proves (every test cell fails, errors
only where work is missing) is the release's, which make test-later proves.

`--install-only` makes the environments and stops (.ci/run starts it, at low priority,
beside `make test-later`: a download is mostly waiting); `--installed` then runs the tests in
them without installing again, as long as each holds what its end asks for (else it
installs). Packages keep pip's compiled bytecode: without it (`--no-compile`) a machine with
PYTHONDONTWRITEBYTECODE set, as CI's is, compiled PyTorch again in every process (the newest
environment's tests took 729 s instead of about 580).

Both environments run side by side, one PyTorch thread each; a summary names the versions
installed, the pass/fail counts and the seconds each step took. Logs and JUnit files go
to build/versions/. Exit status 1 when either environment fails.

PyTorch from PyPI on Linux comes with its CUDA libraries (some GB); `import torch` fails
without them even on CPU, so they are installed too (pip's cache keeps them for next time).
Extra pip arguments come from $PIP_ARGS, as in the Makefile.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "versions"
ENDS = ("oldest", "newest")
# Beyond the Makefile's GRADING_LANE (read from the Makefile), and why:
UNIT_TESTS_SKIP = {
    "tests/test_hub.py": "a real JupyterHub; needs configurable-http-proxy from npm",
    "tests/test_environment.py": "asserts the locked versions, which these envs are not",
    # in make test's grading lane until 2026-11-28 (moved to balance the lanes), so never run
    # here: its kernels import the checkout's attention_ref in the oldest environment
    "tests/test_student_edition.py": "the grading machinery's student edition, as the lane",
    # new on 2026-11-29, in make test's other lane: AST and bytecode of the course's own
    # sources, the same in every environment (about 35 s of each one's tests)
    "tests/test_grading_edition.py": "the grading machinery's grading editions",
    # in make test's grading lane until 2026-11-28 (moved to balance the lanes), so never run
    # here: JupyterLab driven in Chromium proves the browser, not the libraries' numerics
    "tests/test_browser.py": "JupyterLab in Chromium, as the grading lane's tests",
}
# Tests (by name, pytest's -k) not run here either, and why:
UNIT_TESTS_DESELECT = {
    "test_student_notebook_fails_every_test_cell": "a solution less its answers: the solution "
    "runs here; the release is make test-later's (about 100 s of each environment's tests)",
}
# Printed first in the summary; every other direct requirement follows.
KEY_PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "nbgrader", "jupyterlab")


@contextmanager
def file_lock(name: str, log, what: str) -> Iterator[None]:
    """Hold build/versions/.NAME.lock (an exclusive flock) for the block: one install of an
    end at a time, across processes (`--install-only` in the background while `--installed`
    waits for it) as across this process's threads. Writes to ``log`` when it waits."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f".{name}.lock", "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.write(f"waiting for {what}\n")
            log.flush()
            t0 = time.monotonic()
            fcntl.flock(held, fcntl.LOCK_EX)
            log.write(f"waited {time.monotonic() - t0:.0f} s\n")
        yield


def declared_requirements(pyproject: str) -> list[Requirement]:
    """The package's dependencies and its [dev] extra, as written in pyproject.toml."""
    project = tomllib.loads(pyproject)["project"]
    dev = project.get("optional-dependencies", {}).get("dev", [])
    return [Requirement(r) for r in [*project["dependencies"], *dev]]


def floor(req: Requirement) -> str:
    """``req`` pinned to the version its lower bound names: `torch>=2.5,<3` -> `torch==2.5`
    (PEP 440 pads: 2.5 is 2.5.0). Extras and markers are kept."""
    bounds = [s.version for s in req.specifier if s.operator in (">=", "~=", "==", "===")]
    if any(s.operator == ">" for s in req.specifier):
        raise ValueError(f"{req}: a '>' bound names no installable floor; write '>=' instead")
    if len(bounds) != 1 or "*" in bounds[0]:
        raise ValueError(
            f"{req}: needs exactly one lower bound ('>=X') to test its oldest version; "
            f"found {[str(s) for s in req.specifier] or 'none'}"
        )
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    marker = f"; {req.marker}" if req.marker else ""
    return f"{req.name}{extras}=={bounds[0]}{marker}"


def requirements_for(end: str, pyproject: str) -> list[str]:
    reqs = declared_requirements(pyproject)
    return [floor(r) for r in reqs] if end == "oldest" else [str(r) for r in reqs]


def grading_lane(makefile: str) -> list[str]:
    """The test files of the Makefile's `GRADING_LANE = ...` (backslash continuations)."""
    m = re.search(r"^GRADING_LANE\s*:?=((?:.*\\\n)*.*)$", makefile, re.M)
    if not m:
        raise ValueError("Makefile: no GRADING_LANE = ... line found")
    return m.group(1).replace("\\\n", " ").split()


def hostile_lane(makefile: str) -> list[str]:
    """The test files of the Makefile's `HOSTILE_LANE = ...` (classes graded, as the
    grading lane's are)."""
    m = re.search(r"^HOSTILE_LANE\s*:?=((?:.*\\\n)*.*)$", makefile, re.M)
    return m.group(1).replace("\\\n", " ").split() if m else []


def skipped_tests(makefile: str) -> list[str]:
    return [*grading_lane(makefile), *hostile_lane(makefile), *UNIT_TESTS_SKIP]


def other_lane_marks(makefile: str) -> list[str]:
    """The `-m "..."` that the Makefile's test-other-lane selects its tests by, if any, but
    for `not every_notebook`: here every notebook runs (make test leaves most of them to
    make test-later)."""
    m = re.search(r"^test-other-lane:.*\n\t(.*)$", makefile, re.M)
    marks = re.search(r'-m\s+"([^"]+)"', m.group(1)) if m else None
    if not marks:
        return []
    kept = [t.strip() for t in marks.group(1).split(" and ") if t.strip() != "not every_notebook"]
    # the tests marked later stay out: longer runs of what runs here already
    return ["-m", " and ".join(kept)] if kept else []


def python_range(pyproject: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The oldest and the newest Python minor version that `requires-python` allows:
    `>=3.11,<3.14` -> ((3, 11), (3, 13)). Both bounds are needed: the newest Python claimed
    is the one tested."""
    spec = tomllib.loads(pyproject)["project"].get("requires-python", "")
    low = re.search(r">=\s*3\.(\d+)", spec)
    high = re.search(r"<\s*3\.(\d+)", spec)
    if not low or not high:
        raise ValueError(
            f"pyproject.toml: requires-python = {spec!r} must name a floor and a ceiling "
            "('>=3.11,<3.14'): make versions tests the oldest and the newest Python it claims"
        )
    return (3, int(low.group(1))), (3, int(high.group(1)) - 1)


def _python_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return None
    if out.returncode:
        return None  # e.g. a pyenv shim for a version that is not active
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python(end: str, want: tuple[int, int]) -> str:
    """The interpreter of Python ``want`` for ``end`` (see the module's docstring)."""
    name = f"python{want[0]}.{want[1]}"
    override = os.environ.get(f"PYTHON_{end.upper()}")
    candidates = [override] if override else []
    if not override:
        on_path = shutil.which(name)
        candidates += [on_path] if on_path else []
        root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
        pattern = re.compile(rf"{want[0]}\.{want[1]}\.(\d+)$")
        found = sorted(
            (int(m.group(1)), d)
            for d in (Path(root) / "versions").glob(f"{want[0]}.{want[1]}.*")
            if (m := pattern.match(d.name))
        )
        candidates += [str(d / "bin" / name) for _, d in reversed(found)]
    for exe in candidates:
        if _python_version(exe) == want:
            return exe
    where = (
        f"${'PYTHON_' + end.upper()} ({override})"
        if override
        else f"{name} on the PATH or in pyenv"
    )
    raise RuntimeError(
        f"the {end} end runs on Python {want[0]}.{want[1]} (requires-python's "
        f"{'floor' if end == 'oldest' else 'ceiling'}), and none was found: looked for {where}. "
        f"Install it (`pyenv install {want[0]}.{want[1]}`, `uv python install "
        f"{want[0]}.{want[1]}` or the system's {name}) or set PYTHON_{end.upper()} to one"
    )


def run(cmd: list[str], log, **kwargs) -> None:
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, **kwargs)
    if proc.returncode:
        raise RuntimeError(f"`{shlex.join(cmd)}` exited with {proc.returncode}")


def install(end: str, reqs: list[str], log, python: str, installed: bool = False) -> Path:
    """Make .venv-END with ``python`` and install ``reqs`` and the package (editable) there.
    The floors are installed once; the newest versions on every run, but for ``installed``
    (an install of these requirements just made it: ``--install-only``). An install of the
    same end under way in another process (`--install-only` in the background) is waited for,
    then reused when it holds what this end asks for."""
    with file_lock(end, log, f"the install of .venv-{end} under way in another process"):
        return _install(end, reqs, log, python, installed)


def _install(end: str, reqs: list[str], log, python: str, installed: bool) -> Path:
    venv = ROOT / f".venv-{end}"
    py = venv / "bin" / "python"
    stamp = venv / ".versions-installed"
    want = _python_version(python)
    key = hashlib.sha256("\n".join([str(want), *reqs]).encode()).hexdigest()
    if (end == "oldest" or installed) and stamp.exists() and stamp.read_text() == key:
        log.write(f"{venv.name}: already holds {'these floors' if end == 'oldest' else 'them'}\n")
        return py
    if py.exists() and _python_version(str(py)) != want:
        log.write(f"{venv.name}: made with another Python; made again with {python}\n")
        shutil.rmtree(venv)
    if not py.exists():
        run([python, "-m", "venv", str(venv)], log)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar=off"]
    pip += shlex.split(os.environ.get("PIP_ARGS", ""))
    upgrade = ["--upgrade", "--upgrade-strategy", "eager"] if end == "newest" else []
    run([*pip, *upgrade, *reqs], log)
    # every end's editable install writes attention_ref.egg-info in the source tree
    with file_lock("egg-info", log, "another end's editable install"):
        run([*pip, "--no-deps", "-e", "."], log)
    run([str(py), "-m", "pip", "check"], log)
    stamp.write_text(key)
    return py


def versions(py: Path, names: list[str]) -> dict[str, str]:
    code = (
        "import json, sys, importlib.metadata as m\n"
        "print(json.dumps({'python': sys.version.split()[0],"
        " **{n: m.version(n) for n in sys.argv[1:]}}))"
    )
    out = subprocess.run([str(py), "-c", code, *names], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{py}: cannot read the installed versions:\n{out.stderr}")
    return json.loads(out.stdout)


def kernels_floor(pyproject: str) -> str:
    """The lowest Triton the [kernels] extra allows (notebook 14's interpreter)."""
    project = tomllib.loads(pyproject)["project"]
    for r in project.get("optional-dependencies", {}).get("kernels", []):
        req = Requirement(r)
        if req.name == "triton":
            return next(s.version for s in req.specifier if s.operator == ">=")
    return ""


def triton_note(py: Path, pyproject: str) -> str:
    """Why notebook 14's tests are not run in this environment ("" when they are): its
    Triton (the one its PyTorch pins) is older than the [kernels] floor, or absent."""
    from packaging.version import Version

    floor_ = kernels_floor(pyproject)
    code = "import importlib.metadata as m; print(m.version('triton'))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    have = out.stdout.strip() if out.returncode == 0 else ""
    if floor_ and (not have or Version(have) < Version(floor_)):
        torch = versions(py, ["torch"]).get("torch", "?")
        return (
            f"notebook 14 not run: triton {have or 'absent'} (what torch {torch} pins) is "
            f"older than {floor_}, the floor of the [kernels] extra"
        )
    return ""


def check_kernel(py: Path) -> None:
    """nbval's `python3` kernel must be this environment's Python, not .venv's."""
    out = subprocess.run(
        [str(py), "-m", "jupyter", "kernelspec", "list", "--json"],
        capture_output=True,
        text=True,
        env=env_for(py),
    )
    spec = json.loads(out.stdout)["kernelspecs"]["python3"]
    exe = spec["spec"]["argv"][0]
    # jupyter_client starts a bare "python" with the Python that asks for the kernel.
    ours = exe in ("python", "python3") or Path(exe).parent.resolve() == py.parent.resolve()
    if not ours or not Path(spec["resource_dir"]).resolve().is_relative_to(py.parents[1]):
        raise RuntimeError(f"the python3 kernel ({spec['resource_dir']}) runs {exe}, not {py}")


def env_for(py: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{py.parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONHASHSEED"] = "0"
    return env


def junit_counts(path: Path) -> dict[str, int]:
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return n


def prove(
    end: str, pyproject: str, makefile: str, install_only: bool = False, installed: bool = False
) -> dict:
    """Install one end of the ranges and run the tests there (``install_only``: only
    install; ``installed``: the install of ``--install-only`` is reused); the result for the
    summary."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log_name = f"{end}-install" if install_only else end
    result: dict = {"end": end, "log": LOGS / f"{log_name}.log", "ok": False}
    reqs = requirements_for(end, pyproject)
    with open(result["log"], "w") as log:
        try:
            oldest, newest = python_range(pyproject)
            python = find_python(end, oldest if end == "oldest" else newest)
            t0 = time.monotonic()
            py = install(end, reqs, log, python, installed=installed)
            result["install_s"] = time.monotonic() - t0
            names = [Requirement(r).name for r in reqs]
            result["versions"] = versions(py, names)
            if install_only:
                result.update(ok=True, installed_only=True)
                return result
            check_kernel(py)
            junit = LOGS / f"{end}.xml"
            t0 = time.monotonic()
            cmd = [str(py), "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}"]
            cmd += other_lane_marks(makefile)
            cmd += [f"--ignore={p}" for p in skipped_tests(makefile)]
            result["note"] = triton_note(py, pyproject)
            deselect = list(UNIT_TESTS_DESELECT)
            if result["note"]:  # every test of notebook 14 names it or its exercises
                deselect.append("triton")
            cmd += ["-k", " and ".join(f"not {test}" for test in deselect)]
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env_for(py)
            ).returncode
            result["test_s"] = time.monotonic() - t0
            result["counts"] = junit_counts(junit) if junit.exists() else None
            result["ok"] = rc == 0
            if rc:
                result["error"] = f"pytest exited with {rc}"
        except (RuntimeError, OSError, ValueError) as err:
            result["error"] = str(err)
    return result


def report(r: dict) -> str:
    verdict = "PASSED" if r["ok"] else "FAILED"
    if r.get("installed_only"):
        verdict = "installed (no tests run: --install-only)"
    lines = [f"== {r['end']}: {verdict}"]
    if "versions" in r:
        v = dict(r["versions"])
        key = [f"python {v.pop('python')}"]
        key += [f"{n} {v.pop(n)}" for n in KEY_PACKAGES if n in v]
        lines.append("   " + ", ".join(key))
        lines.append("   also: " + ", ".join(f"{n} {x}" for n, x in v.items()))
    if "install_s" in r:
        lines.append(f"   install: {r['install_s']:.0f} s")
    if r.get("note"):
        lines.append(f"   {r['note']}")
    if r.get("counts"):
        c = r["counts"]
        lines.append(
            f"   tests: {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
            f"{c['skipped']} skipped in {r['test_s']:.0f} s"
        )
    if not r["ok"]:
        lines.append(f"   error: {r.get('error')}; full log: {r['log'].relative_to(ROOT)}")
    return "\n".join(lines)


def failure_tail(r: dict, n: int = 60) -> str:
    text = r["log"].read_text(errors="replace") if r["log"].exists() else ""
    i = text.rfind("short test summary info")
    tail = text[text.rfind("\n", 0, i) + 1 :] if i >= 0 else "\n".join(text.splitlines()[-n:])
    return f"---- {r['end']} ({r['log'].relative_to(ROOT)}), last part:\n{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ends", nargs="*", metavar="oldest|newest", help="default: both")
    ap.add_argument("--serial", action="store_true", help="one environment at a time")
    phase = ap.add_mutually_exclusive_group()
    phase.add_argument(
        "--install-only", action="store_true", help="make the environments, no tests"
    )
    phase.add_argument(
        "--installed", action="store_true", help="test in the environments --install-only made"
    )
    args = ap.parse_args(argv)
    ends = args.ends or list(ENDS)
    if unknown := set(ends) - set(ENDS):
        ap.error(f"unknown end(s) {sorted(unknown)}; choose from {list(ENDS)}")
    pyproject = (ROOT / "pyproject.toml").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for end in ends:  # a bad range fails here, before any download
        requirements_for(end, pyproject)
    try:
        oldest, newest = python_range(pyproject)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"versions: Python {oldest[0]}.{oldest[1]} for the oldest end, "
        f"{newest[0]}.{newest[1]} for the newest (requires-python)"
    )
    print(f"versions: {' and '.join(ends)} from pyproject.toml; logs in build/versions/")
    print(f"versions: not run here: {', '.join(skipped_tests(makefile))}", flush=True)
    print(f"versions: nor the tests named {', '.join(UNIT_TESTS_DESELECT)}", flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(1 if args.serial else len(ends)) as pool:
        results = list(
            pool.map(
                lambda e: prove(e, pyproject, makefile, args.install_only, args.installed), ends
            )
        )
    for r in results:
        if not r["ok"]:
            print(failure_tail(r))
    for r in results:
        print(report(r))
    print(f"versions: {time.monotonic() - t0:.0f} s in all")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
