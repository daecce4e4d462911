"""Every correct alternative of the mistake catalog runs through the whole notebook in
place of the solution, not only through its check: a correct answer must never make a
later cell fail (issue 21: a correct online attention broke notebook 12's cell 16).

The notebook runs as the autograder runs it (training cells take a token few steps), so
the cells that check a trained model are skipped, and every cell that depends on the
learner's code alone still runs; the cheap notebooks run once more as the learner runs
them (LEARNER_RUN), where assertions skipped while grading hold too. Each run puts one
alternative into every answer cell that has one, so a notebook needs as many runs as its
longest list of alternatives.

They run in `make test-alternatives` (marked `all_alternatives`): the runs (65 on 2026-11-28)
take several minutes, which `make test` (within 10 minutes, install included) cannot spare.
Two lanes side by side (ALTERNATIVES_LANE=1/2 and 2/2), since each notebook runs on one
core. `.ci/run` runs them after `make test-later`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from catalog import ALTERNATIVES
from course_tools import assignment_ids, execute, solution_path

TESTS = Path(__file__).parent
#: Also run as the learner runs them (no autograde: full sizes, and the `GRADING or ...`
#: assertions about the learner's own code are checked), by `make test-alternatives`:
#: notebooks cheap enough to run in full once per alternative.
LEARNER_RUN = ["12_efficient_attention", "13_modern_llm", "15_open_models"]
AIDS = assignment_ids()
_DEFINES = re.compile(r"^(?:def|class) (\w+)", re.MULTILINE)


def _answer_cells(nb) -> dict[str, tuple[int, str]]:
    """exercise id -> (cell index, the name its answer cell defines)."""
    found = {}
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution") and not meta.get("grade"):
            names = _DEFINES.findall(cell.source)
            if names:
                found[meta["grade_id"]] = (i, names[-1])
    return found


def _runs(aid: str) -> list[dict[str, str]]:
    """One dict per run: exercise id -> the catalog alternative to put in its cell."""
    nb = nbformat.read(solution_path(aid), as_version=4)
    per_exercise = {
        ex: [e for e in ALTERNATIVES if e.exercise == ex and not e.check_only]
        for ex in _answer_cells(nb)
    }
    n = max((len(v) for v in per_exercise.values()), default=0)
    return [
        {ex: alts[r % len(alts)] for ex, alts in per_exercise.items() if alts} for r in range(n)
    ]


CASES = [
    pytest.param(
        aid,
        r,
        "autograde",
        id=f"{aid}-{r}",
        marks=pytest.mark.all_alternatives,
    )
    for aid in AIDS
    for r in range(len(_runs(aid)))
] + [
    pytest.param(aid, r, "learner", id=f"{aid}-{r}-learner", marks=pytest.mark.all_alternatives)
    for aid in LEARNER_RUN
    for r in range(len(_runs(aid)))
]


def lane(cases: list, spec: str | None) -> list:
    """The cases of lane ``spec`` ("K/N": every N-th case from the K-th, K from 1), all of
    them for None: `make test-alternatives` runs two lanes side by side, one per core (each
    notebook runs with one PyTorch thread)."""
    if not spec:
        return cases
    m = re.fullmatch(r"(\d+)/(\d+)", spec.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"ALTERNATIVES_LANE must be K/N with 1 <= K <= N (e.g. 1/2); got {spec!r}")
    k, n = int(m.group(1)), int(m.group(2))
    return cases[k - 1 :: n]


CASES = lane(CASES, os.environ.get("ALTERNATIVES_LANE"))


def test_lanes_split_the_cases_exactly():
    every = list(range(7))
    assert lane(every, None) == every
    halves = lane(every, "1/2") + lane(every, "2/2")
    assert sorted(halves) == every and lane(every, "1/2") == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="K/N"):
        lane(every, "3/2")


def test_the_notebooks_run_as_learners_run_them_exist():
    """A renamed notebook must not silently lose its learner runs."""
    assert set(LEARNER_RUN) <= set(AIDS), sorted(set(LEARNER_RUN) - set(AIDS))


@pytest.mark.notebooks
@pytest.mark.parametrize(("aid", "run", "mode"), CASES)
def test_every_cell_passes_with_the_catalogued_alternatives(aid, run, mode, monkeypatch):
    if mode == "autograde":
        monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    else:
        monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    nb = nbformat.read(solution_path(aid), as_version=4)
    cells = _answer_cells(nb)
    chosen = _runs(aid)[run]
    for exercise, entry in chosen.items():
        i, name = cells[exercise]
        module = entry.impl.__module__.split(".")[-1]
        nb.cells[i].source = (
            f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
            f"from catalog.{module} import {entry.name} as {name}"
        )
    execute(
        nb,
        timeout=300,
        allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(solution_path(aid).parent)}},
    )
    used = ", ".join(f"{ex}: {e.name}" for ex, e in chosen.items())
    for i, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, (
            f"{aid} cell {i} fails with {errors[0].ename}: {errors[0].evalue} when the answer "
            f"cells hold the catalog's alternatives ({used})\n{cell.source[:300]}"
        )
