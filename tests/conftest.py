import os
import sys

import pytest

# Make tests/ importable (the catalogs) and keep matplotlib off any display.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("MPLBACKEND", "Agg")
# `make test` runs two pytest workers on a 2-core machine; PyTorch's default of one
# intra-op thread per core would then run four busy threads on two cores, and threads
# that wait for each other at every small operation slow down many times over. One
# thread per process (kernels started by the tests inherit it) keeps the cores busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Tests that grade the same class (sqlite, then PostgreSQL) share one worker, so the
# sqlite grading is done once; every other file is one unit of work, so that the cells of
# a notebook (nbval) run in order in one kernel.
SHARED_GROUPS = {"test_class_grading.py": "class", "test_postgres.py": "class"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = SHARED_GROUPS.get(item.path.name, str(item.path))
        item.add_marker(pytest.mark.xdist_group(group))
