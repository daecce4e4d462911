"""The notebooks as source code: student versions are generated from the solutions,
carry no outputs or solutions, and execute failing only where the learner has work to do.

The solution notebooks themselves are executed by nbval (`--nbval-lax`, configured in
pyproject.toml), where any error, including a failing test cell, fails the run.
"""

from __future__ import annotations

import json

import nbformat
import pytest

from course_tools import (
    assignment_ids,
    auto_points,
    execute,
    make_course,
    release_path,
    run_course,
    solution_path,
    test_cells,
)

AIDS = assignment_ids()
NOT_DONE = ("NotImplementedError",)


def test_there_is_a_student_notebook_for_every_solution_and_no_other():
    from course_tools import RELEASE

    released = sorted(p.name for p in RELEASE.iterdir() if p.is_dir())
    assert released == AIDS


def test_student_notebooks_equal_what_release_generates(tmp_path):
    course = make_course(tmp_path / "course")
    proc = run_course(course, "release")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for aid in AIDS:
        fresh = json.loads((course / "notebooks" / aid / f"{aid}.ipynb").read_text())
        committed = json.loads(release_path(aid).read_text())
        assert fresh == committed, (
            f"notebooks/{aid} differs from what `make release` generates from solutions/; "
            "edit solutions/ and run `make release`, never edit notebooks/ by hand"
        )


@pytest.mark.parametrize("aid", AIDS)
def test_notebooks_are_stored_without_outputs(aid):
    for path in (solution_path(aid), release_path(aid)):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path


@pytest.mark.parametrize("aid", AIDS)
def test_student_notebook_hides_solutions_and_hidden_tests(aid):
    text = release_path(aid).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "Mark scheme"):
        assert marker not in text, f"{marker!r} leaked into notebooks/{aid}"


@pytest.mark.parametrize("aid", AIDS)
def test_student_notebook_fails_every_test_cell_and_errs_only_where_work_is_missing(
    aid, monkeypatch
):
    # Run as the autograder runs it (training cells take a token few steps; claims about
    # trained models are skipped): nbval already trains every model fully in the solutions.
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    nb = nbformat.read(release_path(aid), as_version=4)
    execute(
        nb,
        timeout=300,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(release_path(aid).parent)}},
    )
    tests = {id(c) for c in test_cells(nb)}
    assert tests, f"{aid} has no graded test cells"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        where = f"{aid} cell {i + 1}:\n{cell.source[:300]}"
        if id(cell) in tests:
            assert errors, f"a test cell passes on the blank student notebook: {where}"
            assert errors[0].ename in (*NOT_DONE, "CheckFailure"), (
                f"test cell failed with {errors[0].ename}: {errors[0].evalue}\n{where}"
            )
            if errors[0].ename == "CheckFailure":
                assert "not implemented yet" in errors[0].evalue, where
        else:
            for e in errors:
                assert e.ename in NOT_DONE, (
                    f"a cell fails with {e.ename}: {e.evalue} in the student notebook; only "
                    f"NotImplementedError is expected there.\n{where}"
                )


@pytest.mark.parametrize("aid", AIDS)
def test_solution_notebook_follows_the_course_anatomy(aid):
    nb = nbformat.read(solution_path(aid), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), f"duplicate grade ids in {aid}"
    for c in nb.cells:
        meta = c.metadata.get("nbgrader")
        if not meta:
            continue
        assert meta["schema_version"] == 3
        if meta.get("grade"):
            assert meta.get("points", 0) > 0, f"{meta['grade_id']} has no points"
        if meta.get("grade") and not meta.get("solution"):
            assert meta["grade_id"].startswith("test_")
            assert "BEGIN HIDDEN TESTS" in c.source, f"{meta['grade_id']} has no hidden tests"
            assert f'check("{meta["grade_id"][5:]}"' in c.source
    written = [
        c
        for c in nb.cells
        if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution")
    ]
    assert written, f"{aid} has no written question"
    assert all("Mark scheme" in c.source for c in written)
    assert auto_points(nb) > 0
    first = nb.cells[0].source
    for words in ("Learning objectives", "Prerequisites", "Estimated time"):
        assert words.lower() in "\n".join(c.source for c in nb.cells[:3]).lower(), (
            f"{aid} lacks '{words}' at the top"
        )
    assert first.startswith("# ")


def _collected(marks: str) -> dict[str, set[str]]:
    """``{kind: {assignment}}`` of the per-notebook tests that ``-m marks`` selects."""
    import re
    import subprocess
    import sys

    paths = ["solutions", "tests/test_notebooks.py", "tests/test_grading.py"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", marks, *paths],
        capture_output=True,
        text=True,
        cwd=solution_path(AIDS[0]).parents[2],
    ).stdout
    kinds: dict[str, set[str]] = {"nbval": set(), "student": set(), "graded": set()}
    for line in out.splitlines():
        if m := re.match(r"solutions/([^/]+)/\S+\.ipynb::Cell", line):
            kinds["nbval"].add(m.group(1))
        elif m := re.search(r"test_student_notebook_fails\w+\[(\w+)\]", line):
            kinds["student"].add(m.group(1))
        elif m := re.search(r"test_solution_earns_every_automatic_mark\[(\w+)\]", line):
            kinds["graded"].add(m.group(1))
    return kinds


@pytest.mark.later  # two collections of every notebook
def test_make_test_runs_every_per_notebook_kind_and_test_later_runs_the_rest():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "root_conftest", solution_path(AIDS[0]).parents[2] / "conftest.py"
    )
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    QUICK_NOTEBOOKS = root_conftest.QUICK_NOTEBOOKS  # noqa: N806

    quick = _collected("not every_notebook")  # what make test selects
    rest = _collected("every_notebook")  # what make test-later selects
    for kind in quick:
        assert quick[kind] == set(QUICK_NOTEBOOKS), kind
        assert rest[kind] == set(AIDS) - set(QUICK_NOTEBOOKS), kind
