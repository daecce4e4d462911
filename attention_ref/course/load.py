"""How busy the grading machine is, and waits that stretch with it.

A class is graded the night of the deadline on a machine shared with other work: at a
load average of ten times the core count, a kernel starts, a checker imports PyTorch and a
cell runs about ten times slower than on a quiet machine. A wait written for a quiet
machine then fails the grader, and an honest student would get nothing. So every wait of
grading's own (a process starting, an answer to come, a cell's time limit) is the quiet
machine's figure times :func:`load_factor`, measured when the wait starts; and a process
that keeps using CPU is waited for as long as it makes progress (:func:`wait_while_busy`),
up to a hard limit.

Only the standard library: nbgrader_config.py imports this through the course's tools.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: ``ATTENTION_REF_LOAD_FACTOR``: a fixed factor (tests; a grader who knows its machine),
#: instead of the one measured from the load average.
FACTOR_ENV = "ATTENTION_REF_LOAD_FACTOR"
#: The most a wait is stretched: past this, the machine is too busy to grade on at all.
MAX_FACTOR = 20.0


def cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def load_factor() -> float:
    """About how many times slower than on a quiet machine a process runs here now: the
    one-minute load average per core, at least 1, at most :data:`MAX_FACTOR`. Grading runs
    one job per core, so a quiet machine's grading already has a load of about one per
    core, the load its limits are written for; at twice that, every process gets half a
    core and needs twice as long. At a load average of 20 on two cores: 10."""
    raw = os.environ.get(FACTOR_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError as err:
            raise ValueError(f"{FACTOR_ENV} must be a number (1 or more); got {raw!r}") from err
        return min(MAX_FACTOR, max(1.0, value))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - no load average here
        return 1.0
    return min(MAX_FACTOR, max(1.0, load / cores()))


def runqueue_wait() -> float | None:
    """Seconds this thread has spent ready to run but waiting for a CPU (Linux's
    ``/proc/thread-self/schedstat``), or None where that cannot be read. Unlike the load
    average, which trails the load by a minute, it says exactly how long the thread was held
    back: the difference across a call is the part of the call's wall time that other
    processes took."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def scaled(seconds: float) -> float:
    """``seconds`` on a quiet machine, stretched by the load now."""
    return seconds * load_factor()


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) process ``pid`` has used, or None where it cannot be
    read (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def wait_while_busy(
    ready: Callable[[float], bool],
    pid: int,
    quiet_seconds: float,
    idle_seconds: float = 30.0,
    hard_seconds: float = 900.0,
    alive: Callable[[], bool] = lambda: True,
) -> bool:
    """Wait for ``ready(timeout)`` (True when what is awaited came) as long as process
    ``pid`` is alive and either within ``quiet_seconds`` times the load factor, or still
    using CPU (its CPU time advanced in the last ``idle_seconds``): a process that works
    slowly on a busy machine is waited for; one that is stuck (no CPU for ``idle_seconds``)
    or gone (``alive()`` false) is not. Never longer than ``hard_seconds``. Returns whether
    it came."""
    start = time.monotonic()
    patience = scaled(quiet_seconds)
    last_cpu = cpu_seconds(pid)
    last_progress = start
    while True:
        now = time.monotonic()
        if now - start > hard_seconds:
            return False
        if ready(min(1.0, max(0.05, hard_seconds - (now - start)))):
            return True
        if not alive():
            return False
        now = time.monotonic()
        cpu = cpu_seconds(pid)
        if cpu is None:  # gone (or unreadable): only the load-scaled wait is left
            if now - start > patience:
                return False
            continue
        if last_cpu is None or cpu > last_cpu:
            last_cpu, last_progress = cpu, now
        if now - start > patience and now - last_progress > idle_seconds:
            return False
