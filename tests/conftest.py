import os
import sys

# Make tests/ importable (the catalogs) and keep matplotlib off any display.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("MPLBACKEND", "Agg")
# `make test` runs two pytest processes side by side on a 2-core machine; PyTorch's default
# of one intra-op thread per core would put four busy threads on two cores, and threads
# that wait for each other at every small operation slow down many times over. One
# thread per process (the kernels the tests start inherit it) keeps both cores busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _start_with_retries(start):
    """``start`` (nbval's kernel start) again when the kernel died before it ran anything:
    two processes starting kernels at once can be handed the same free TCP port (the
    grader does the same: attention_ref/cell_limits.py). Any other error is raised."""
    from attention_ref.course.cell_limits import KERNEL_START_ATTEMPTS, kernel_failed_to_start

    def start_kernel(*args, **kwargs):
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            try:
                return start(*args, **kwargs)
            except RuntimeError as err:
                if attempt == KERNEL_START_ATTEMPTS or not kernel_failed_to_start(err):
                    raise

    return start_kernel


try:
    import nbval.kernel
except ImportError:  # pragma: no cover - nbval comes with the [dev] extra
    pass
else:
    nbval.kernel.start_new_kernel = _start_with_retries(nbval.kernel.start_new_kernel)


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
