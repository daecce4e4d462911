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
# Grading's waits and time limits stretch with the machine's load (attention_ref/course/
# load.py). The tests count limits and read messages that name them, so they run with the
# factor of a quiet machine, as they run seeded; tests/test_busy_grading.py grades a class
# with the factor measured, beside busy processes.
os.environ.setdefault("ATTENTION_REF_LOAD_FACTOR", "1")


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
