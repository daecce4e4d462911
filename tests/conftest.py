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
