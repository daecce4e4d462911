"""`make versions` (tools/versions.py) tests what pyproject.toml claims: its floors are the
lower bounds written there, its newest end the ranges themselves, and what it leaves out
of the suite exists. No network: the environments themselves are made by `make versions`."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("versions", ROOT / "tools" / "versions.py")
versions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(versions)

PYPROJECT = (ROOT / "pyproject.toml").read_text()


def declared() -> list[str]:
    project = tomllib.loads(PYPROJECT)["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def test_oldest_pins_every_declared_requirement_to_its_lower_bound():
    pins = [Requirement(p) for p in versions.requirements_for("oldest", PYPROJECT)]
    reqs = [Requirement(r) for r in declared()]
    assert [p.name for p in pins] == [r.name for r in reqs]
    for pin, req in zip(pins, reqs, strict=True):
        (spec,) = pin.specifier
        assert spec.operator == "==", pin
        assert pin.extras == req.extras, pin
        lower = [s.version for s in req.specifier if s.operator == ">="]
        assert lower == [spec.version], (pin, req)
        # The floor is inside the range it was read from.
        assert Version(spec.version) in req.specifier, (pin, req)


def test_newest_installs_the_ranges_as_written():
    assert versions.requirements_for("newest", PYPROJECT) == [
        str(Requirement(r)) for r in declared()
    ]


def test_torch_floor_is_the_one_the_fully_masked_row_needs():
    pins = versions.requirements_for("oldest", PYPROJECT)
    assert "torch==2.5" in pins


@pytest.mark.parametrize(
    ("req", "pin"),
    [
        ("numpy>=1.26,<3", "numpy==1.26"),
        ("psycopg[binary]>=3.2,<4", "psycopg[binary]==3.2"),
        ("nbgrader~=0.9.5", "nbgrader==0.9.5"),
        ('tomli>=2; python_version < "3.11"', 'tomli==2; python_version < "3.11"'),
    ],
)
def test_floor(req, pin):
    assert versions.floor(Requirement(req)) == pin


@pytest.mark.parametrize("req", ["numpy", "numpy<3", "numpy>1.26", "numpy==1.*"])
def test_a_requirement_without_an_installable_floor_is_refused_by_name(req):
    with pytest.raises(ValueError, match="numpy"):
        versions.floor(Requirement(req))


def test_the_tests_left_out_exist_and_include_the_makefile_grading_lane():
    makefile = (ROOT / "Makefile").read_text()
    skipped = versions.skipped_tests(makefile)
    for path in skipped:
        assert (ROOT / path).is_file(), f"tools/versions.py leaves out {path}, which is gone"
    assert "tests/test_grading.py" in skipped and "tests/test_environment.py" in skipped
    assert "tests/test_notebooks.py" not in skipped and "tests/test_versions.py" not in skipped


def test_the_marks_of_the_other_lane_are_read_from_its_recipe():
    makefile = 'test-other-lane: $(STAMP)\n\t$(BIN)/python -m pytest -m "not slow" --ignore=x\n'
    assert versions.other_lane_marks(makefile) == ["-m", "not slow"]
    assert versions.other_lane_marks("test-other-lane: $(STAMP)\n\tpytest --ignore=x\n") == []


def test_each_end_runs_on_the_python_that_requires_python_names_at_that_end():
    oldest, newest = versions.python_range(PYPROJECT)
    spec = Requirement(f"python{tomllib.loads(PYPROJECT)['project']['requires-python']}")
    assert f"{oldest[0]}.{oldest[1]}" in spec.specifier
    assert f"{newest[0]}.{newest[1]}" in spec.specifier
    assert f"{newest[0]}.{newest[1] + 1}" not in spec.specifier
    assert versions.python_range('[project]\nrequires-python = ">=3.11,<3.14"\n') == (
        (3, 11),
        (3, 13),
    )


def test_a_requires_python_without_a_ceiling_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="must name a floor and a ceiling"):
        versions.python_range('[project]\nrequires-python = ">=3.11"\n')


def test_an_absent_python_fails_its_end_with_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"Python 3\.99 .*none was found.*pyenv install 3\.99"):
        versions.find_python("newest", (3, 99))
    monkeypatch.setenv("PYTHON_NEWEST", sys.executable)
    with pytest.raises(RuntimeError, match=r"\$PYTHON_NEWEST"):
        versions.find_python("newest", (3, 99))


def test_the_python_found_is_the_version_asked_for(monkeypatch):
    here = sys.version_info[:2]
    monkeypatch.setenv("PYTHON_OLDEST", sys.executable)
    assert versions.find_python("oldest", here) == sys.executable


def test_every_notebook_runs_in_each_environment_though_make_test_leaves_most_out():
    makefile = (
        "test-other-lane: $(STAMP)\n"
        '\t$(BIN)/python -m pytest -m "not all_alternatives and not every_notebook and not later"'
        " --ignore=x\n"
    )
    assert versions.other_lane_marks(makefile) == ["-m", "not all_alternatives and not later"]
    real = versions.other_lane_marks((ROOT / "Makefile").read_text())
    assert real and "every_notebook" not in real[1]


def _fake_installs(tmp_path, monkeypatch) -> list[list[str]]:
    """tools/versions.py in ``tmp_path``, with a .venv-newest whose commands are recorded,
    not run: the list they are appended to."""
    monkeypatch.setattr(versions, "ROOT", tmp_path)
    monkeypatch.setattr(versions, "LOGS", tmp_path / "build" / "versions")
    monkeypatch.setattr(versions, "_python_version", lambda exe: (3, 13))
    calls: list[list[str]] = []
    monkeypatch.setattr(versions, "run", lambda cmd, log, **kw: calls.append(cmd))
    py = tmp_path / ".venv-newest" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.touch()
    return calls


def test_installed_reuses_an_environment_only_when_it_holds_what_its_end_asks_for(
    tmp_path, monkeypatch
):
    """.ci/run installs the environments beside make test-later (--install-only), then tests
    in them (--installed) without installing again; another set of requirements installs."""
    import io

    calls = _fake_installs(tmp_path, monkeypatch)
    py = tmp_path / ".venv-newest" / "bin" / "python"
    log = io.StringIO()
    assert versions.install("newest", ["torch>=2.5"], log, "python3.13") == py
    pip = [c for c in calls if "install" in c]
    assert any("--upgrade" in c for c in pip)  # the newest end upgrades
    calls.clear()
    versions.install("newest", ["torch>=2.5"], log, "python3.13", installed=True)
    assert calls == []  # reused
    versions.install("newest", ["torch>=2.5"], log, "python3.13")
    assert calls  # without --installed the newest end is upgraded on every run
    calls.clear()
    versions.install("newest", ["torch>=2.6"], log, "python3.13", installed=True)
    assert calls  # it holds other requirements: installed again


def test_installed_waits_for_the_install_under_way_in_another_process_then_reuses_it(
    tmp_path, monkeypatch
):
    """.ci/run's last stage may reach an end's tests while `--install-only` (in the
    background) still installs it: the tests wait for that install, then reuse it, rather
    than install into the same environment at the same time."""
    import io
    import subprocess
    import threading
    import time

    calls = _fake_installs(tmp_path, monkeypatch)
    stamp = tmp_path / ".venv-newest" / ".versions-installed"
    versions.install("newest", ["torch>=2.5"], io.StringIO(), "python3.13")
    done = stamp.read_text()
    stamp.unlink()  # the background install has not finished yet
    calls.clear()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys\n"
            "f = open(sys.argv[1], 'w')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()",
            str(versions.LOGS / ".newest.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        log = io.StringIO()
        tests = threading.Thread(
            target=versions.install, args=("newest", ["torch>=2.5"], log, "python3.13", True)
        )
        tests.start()
        time.sleep(0.5)
        assert tests.is_alive() and calls == []  # waiting, not installing
        assert "waiting for the install of .venv-newest" in log.getvalue()
        stamp.write_text(done)  # the background install ends
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    tests.join(timeout=10)
    assert not tests.is_alive()
    assert calls == []  # reused
    assert "waited" in log.getvalue() and "already holds them" in log.getvalue()


def test_each_test_left_out_by_name_exists():
    """A renamed test must not silently come back into make versions (or a typo leave out
    nothing)."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for name in versions.UNIT_TESTS_DESELECT:
        assert f"def {name}" in sources, name
