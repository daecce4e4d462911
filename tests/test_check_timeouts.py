"""Each call of the learner's code in a check runs under a time limit: code that never
returns becomes feedback, and the interpreter (a Jupyter kernel) stays usable."""

from __future__ import annotations

import math
import signal
import threading
import time

import pytest
import torch
from torch import nn

from attention_ref.checks import CheckFailure, check

from catalog.nb01 import sdpa_einsum_where
from catalog.nb03 import SelfAttentionWithSdpa

LIMIT = 0.5  # seconds: short, so the tests are quick


def looping_sdpa(q, k, v, mask=None):
    while True:
        pass


class LoopingForward(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_in, d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x, mask=None):
        n = 0
        while n >= 0:  # the learner forgot that n only grows
            n += 1


class LoopingInit(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        i = 0
        while i < d_in:  # forgot i += 1
            pass


def swallowing_sdpa(q, k, v, mask=None):
    """Catches the first interruption (a bare `except:`) and loops on. (Code that swallows
    every interruption in a loop cannot be stopped from inside the process; the grader's
    per-cell limit is the backstop for that.)"""
    try:
        while True:
            pass
    except BaseException:  # noqa: BLE001, S110 - the point of the test
        pass
    while True:
        pass


def _timed_check(exercise_id, candidate, **kwargs) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(CheckFailure) as err:
        check(exercise_id, candidate, time_limit=LIMIT, **kwargs)
    return str(err.value), time.monotonic() - start


def test_a_looping_function_is_stopped_with_feedback():
    msg, took = _timed_check("sdpa", looping_sdpa)
    assert (
        "your looping_sdpa did not return within 0.5 s (an infinite loop, or code far slower "
        "than needed?)" in msg
    )
    assert "Input: " in msg and "q (" in msg  # says on which input
    assert "Traceback" not in msg
    assert took < 5


def test_a_looping_module_forward_is_stopped_with_feedback():
    msg, took = _timed_check("self_attention", LoopingForward)
    assert "your LoopingForward.forward did not return within 0.5 s" in msg
    assert took < 5


def test_a_looping_module_init_is_stopped_with_feedback():
    msg, took = _timed_check("self_attention", LoopingInit)
    assert "your LoopingInit(...) did not return within 0.5 s" in msg
    assert took < 5


def test_code_that_swallows_the_interruption_is_still_stopped():
    msg, took = _timed_check("sdpa", swallowing_sdpa)
    assert "did not return within 0.5 s" in msg
    assert took < 10


def test_the_graded_run_allows_twice_the_time():
    msg, _ = _timed_check("sdpa", looping_sdpa, seed=2024, thorough=True)
    assert "did not return within 1 s" in msg


def test_the_kernel_is_usable_after_a_timed_out_check(capsys):
    handler = signal.getsignal(signal.SIGALRM)
    _timed_check("sdpa", looping_sdpa)
    # Nothing is left armed or replaced ...
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler
    assert torch.is_grad_enabled()
    # ... and the same interpreter runs other checks, including slow-ish code, fine.
    check("sdpa", sdpa_einsum_where, time_limit=LIMIT)
    check("self_attention", SelfAttentionWithSdpa, time_limit=LIMIT)
    time.sleep(LIMIT * 1.5)  # no stray alarm fires later
    assert "✓ self_attention: passed" in capsys.readouterr().out


def test_a_timer_that_was_running_before_the_check_is_restored():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        check("sdpa", sdpa_einsum_where, time_limit=LIMIT)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20.0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired


def test_the_limit_is_configurable_by_environment(monkeypatch):
    monkeypatch.setenv("ATTENTION_REF_TIME_LIMIT", "0.3")
    with pytest.raises(CheckFailure, match="did not return within 0.3 s"):
        check("sdpa", looping_sdpa)


def test_off_the_main_thread_there_is_no_limit_and_no_crash():
    """Signals work only on the main thread: elsewhere a check runs without a limit."""
    results = []

    def slow_but_correct(q, k, v, mask=None):
        time.sleep(0.02)
        return sdpa_einsum_where(q, k, v, mask)

    def run():
        try:
            check("sdpa", slow_but_correct, time_limit=0.01)
            results.append("passed")
        except BaseException as err:  # noqa: BLE001 - reported below
            results.append(repr(err))

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    assert results == ["passed"]


def test_slow_but_correct_code_is_not_cut_off():
    """A correct candidate that takes a while per call (well within the limit) passes."""

    def sdpa_slowly(q, k, v, mask=None):
        time.sleep(0.01)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        w = torch.softmax(s, -1).nan_to_num(0.0)
        return w @ v, w

    check("sdpa", sdpa_slowly, time_limit=LIMIT)


@pytest.mark.notebooks
def test_in_a_jupyter_kernel_a_looping_cell_is_stopped_and_the_kernel_goes_on():
    """The way a learner meets it: the check cell fails with feedback, later cells run."""
    import nbformat

    from course_tools import execute

    cells = [
        "from attention_ref.checks import check\n"
        "def sdpa(q, k, v, mask=None):\n"
        "    while True:\n"
        "        pass\n"
        "check('sdpa', sdpa, time_limit=1)",
        "def softmax_np(x, axis=-1):\n"
        "    import numpy as np\n"
        "    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
        "    return e / e.sum(axis=axis, keepdims=True)\n"
        "check('softmax_np', softmax_np, time_limit=1)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    execute(nb, timeout=120, allow_errors=True, kernel_name="python3")
    first, second = nb.cells
    assert first.outputs[0].ename == "CheckFailure"
    assert "did not return within 1 s" in first.outputs[0].evalue
    assert any("✓ softmax_np: passed" in o.get("text", "") for o in second.outputs)


def test_a_slow_backward_under_the_watchers_gets_more_time():
    """A correct flash_attention whose backward pass is slow only while the memory and
    operation watchers intercept every operation (as real code with many small operations
    is): the watched calls get TRACED_LIMIT_SCALE times the limit, and it passes; the same
    delay unwatched is stopped, and the feedback does not claim a loop."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from attention_ref.efficient import OpRecorder, PeakMemory

    from catalog.nb12 import FlashKeyBlocksOuter

    delay = 1.5 * FLASH_LIMIT

    class SlowWhenWatched(FlashKeyBlocksOuter):
        @staticmethod
        def backward(ctx, do):
            # slow under the check's own watchers only (not under any dispatch mode)
            if isinstance(_get_current_dispatch_mode(), OpRecorder | PeakMemory):
                _spin(delay)
            return FlashKeyBlocksOuter.backward(ctx, do)

    check("flash_attention", SlowWhenWatched, time_limit=FLASH_LIMIT)

    class SlowAlways(FlashKeyBlocksOuter):
        @staticmethod
        def backward(ctx, do):
            _spin(delay)
            return FlashKeyBlocksOuter.backward(ctx, do)

    with pytest.raises(CheckFailure) as err:
        check("flash_attention", SlowAlways, time_limit=FLASH_LIMIT)
    assert "did not return within" in str(err.value)
    assert "or code far slower than needed?" in str(err.value)


FLASH_LIMIT = 1.0  # seconds: the unwatched calls of a correct answer take well under it


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` of CPU time (the limit counts the CPU the code had)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


_FIRST_BACKWARD = """
import sys, torch
from attention_ref.checks._core import warm_autograd
warm_autograd()
before = set(sys.modules)
x = torch.randn(3, requires_grad=True)
torch.autograd.grad(x * x, [x], torch.ones(3))  # with the output's gradient, as checks do
x.exp().backward(torch.ones(3))
print(sorted(set(sys.modules) - before))
"""


def test_the_first_backward_pass_imports_nothing_after_the_warm_up():
    """torch.autograd.grad, given the output's gradient, imports sympy on its first call in
    a process (seconds on a busy machine); the checks import it before they time the
    learner's backward pass, so the learner's first backward is not charged for it (a CI
    run stopped a correct one)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _FIRST_BACKWARD], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
