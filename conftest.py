"""Loaded by pytest for every path of the repository (solutions/ included, which
tests/conftest.py does not reach when `pytest solutions` runs alone)."""

from __future__ import annotations

# `make test` runs each kind of per-notebook test on the notebooks of QUICK_NOTEBOOKS only;
# `make test-later` (which CI runs after make test) runs it on every other notebook.
# The kinds: a solution notebook executed (nbval), its student notebook executed, its
# solution graded (tests/test_grading.py). Each such test on another notebook is marked
# every_notebook, and `make test` deselects that mark.
QUICK_NOTEBOOKS = ("01_dot_product_attention",)
PER_NOTEBOOK_TESTS = (
    "test_student_notebook_fails_every_test_cell_and_errs_only_where_work_is_missing",
    "test_solution_earns_every_automatic_mark",
)


def notebook_of(item) -> str | None:
    """The assignment a per-notebook test runs, or None for any other test."""
    path = item.path
    if path.suffix == ".ipynb" and path.parent.parent.name == "solutions":
        return path.parent.name
    callspec = getattr(item, "callspec", None)
    if getattr(item, "originalname", None) in PER_NOTEBOOK_TESTS and callspec is not None:
        return callspec.params.get("aid")
    return None


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        aid = notebook_of(item)
        if aid is not None and aid not in QUICK_NOTEBOOKS:
            item.add_marker(pytest.mark.every_notebook)
