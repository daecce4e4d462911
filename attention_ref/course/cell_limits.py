"""Per-cell time limits for grading (``nbgrader autograde`` and ``make grade``).

A cell tagged ``training`` (``cell.metadata["tags"]``) gets a long limit, every other
cell a short one; once a cell of a notebook has timed out, every later cell of that
notebook gets at most a reduced limit, so a function that loops forever and is called by
many cells costs one short limit plus a few seconds per later cell, not the full limit
each time. The limits come from the environment at the start of each notebook:

- ``NBGRADER_CELL_TIMEOUT`` (default 30 s): an ordinary cell;
- ``NBGRADER_TRAINING_TIMEOUT`` (default 300 s): a cell tagged ``training``;
- ``NBGRADER_TIMEOUT_AFTER`` (default 10 s): any cell after a cell of the same notebook
  timed out (a cell's own limit still applies when it is shorter).

Each limit is the quiet machine's figure times the machine's load factor when the cell
starts (:func:`attention_ref.course.load.load_factor`: the load average per core, 1 unless
the load average is over the cores): on a busy machine an honest cell runs slower, and it is
the grader's machine, not the student's code, that is slow.

This module imports of the course package only :mod:`.load` (nbgrader_config.py imports
it, and no PyTorch may come with it into nbgrader's processes).
"""

from __future__ import annotations

import os
from typing import Any

from . import load

TRAINING_TAG = "training"
DEFAULTS = {
    "NBGRADER_CELL_TIMEOUT": 30,
    "NBGRADER_TRAINING_TIMEOUT": 300,
    "NBGRADER_TIMEOUT_AFTER": 10,
}


def _env_seconds(name: str) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(float(raw)) if raw.strip() else DEFAULTS[name]
    except ValueError as err:
        raise ValueError(f"{name} must be a number of seconds; got {raw!r}") from err
    return max(1, value)


def is_training(cell: Any) -> bool:
    tags = cell.get("metadata", {}).get("tags", []) or []
    return TRAINING_TAG in tags


class CellLimits:
    """The time limit of each cell of ONE notebook; call :meth:`timed_out` when a cell
    timed out. ``limits(cell)`` is nbclient's ``timeout_func``."""

    def __init__(
        self,
        cell: int | None = None,
        training: int | None = None,
        after: int | None = None,
    ):
        self.cell = cell if cell is not None else _env_seconds("NBGRADER_CELL_TIMEOUT")
        self.training = (
            training if training is not None else _env_seconds("NBGRADER_TRAINING_TIMEOUT")
        )
        self.after = after if after is not None else _env_seconds("NBGRADER_TIMEOUT_AFTER")
        self.timeouts = 0
        self.seconds_lost = 0

    def own_limit(self, cell: Any) -> int:
        return self.training if is_training(cell) else self.cell

    def __call__(self, cell: Any) -> int:
        limit = self.own_limit(cell)
        limit = min(limit, self.after) if self.timeouts else limit
        return round(limit * load.load_factor())

    def timed_out(self, seconds: float) -> None:
        self.timeouts += 1
        self.seconds_lost += int(seconds)

    def describe(self) -> str:
        return (
            f"{self.cell} s per cell, {self.training} s per cell tagged '{TRAINING_TAG}', "
            f"{self.after} s after a cell timed out (each times the load factor when the "
            f"cell starts: {load.load_factor():g} now)"
        )


#: How often grading starts a kernel for one notebook before it gives up. A kernel can die
#: before it runs anything for reasons that are not the submission's: two kernels started
#: at the same moment by parallel workers can be handed the same free TCP port, and the
#: second one cannot bind it. No cell has run then, so starting another is safe.
KERNEL_START_ATTEMPTS = 3
#: Seconds a kernel may take to answer after its start on a quiet machine (nbclient's
#: default), times the load factor.
KERNEL_STARTUP_SECONDS = 60
#: The words grading logs (and the report quotes) when it replaced a kernel.
KERNEL_RESTARTED = "kernel restarted"


def kernel_failed_to_start(err: BaseException) -> bool:
    """Whether ``err`` (raised while a notebook's kernel was being set up) says the kernel
    died or never answered before it ran any code."""
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "Kernel died before replying to kernel_info" in text or "Kernel didn't respond" in text
    )


#: Bytes of outputs one graded notebook keeps (``ATTENTION_REF_OUTPUT_BYTES``): the course's
#: notebooks print under 2 MB (their figures included); what comes after the budget is
#: dropped, so a submission cannot grow its graded notebook, or the grader's memory, without
#: bound.
DEFAULT_OUTPUT_BYTES = 16 * 2**20
OUTPUT_CUT = (
    "[grading: this notebook's outputs reached {budget}, the most a graded notebook keeps; "
    "later outputs were not kept]\n"
)


#: What a message of the kernel's may add to the output budget (its header and metadata).
MESSAGE_MARGIN = 2**20
MESSAGE_CUT = (
    "[grading: the kernel sent a message over {limit} (more than a graded notebook keeps); "
    "the grader stopped reading it: later outputs of this notebook were not kept]\n"
)

_CONTEXTS: dict[int, Any] = {}


def bounded_context(limit: int) -> Any:
    """A ZeroMQ context whose sockets refuse any message over ``limit`` bytes: the peer that
    sends one is disconnected before the message is held in memory (``ZMQ_MAXMSGSIZE``).
    One per process and limit, shared by the kernel clients of the notebooks it grades."""
    import zmq
    import zmq.asyncio

    ctx = _CONTEXTS.get(limit)
    if ctx is None:
        ctx = _CONTEXTS[limit] = zmq.asyncio.Context()
        ctx.setsockopt(zmq.MAXMSGSIZE, limit)
    return ctx


def output_budget() -> int:
    raw = os.environ.get("ATTENTION_REF_OUTPUT_BYTES", "").strip()
    try:
        value = int(float(raw)) if raw else DEFAULT_OUTPUT_BYTES
    except ValueError as err:
        raise ValueError(
            f"ATTENTION_REF_OUTPUT_BYTES must be a number of bytes; got {raw!r}"
        ) from err
    return max(2**16, value)


def _megabytes(n: int) -> str:
    return f"{n / 2**20:g} MB"


def _message_bytes(content: Any) -> int:
    """About the bytes an output message adds to a notebook (its text and data)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(_message_bytes(v) for v in content.values())
    if isinstance(content, list | tuple):
        return sum(_message_bytes(v) for v in content)
    return 8


def timeout_message(limit: int, cell: Any) -> str:
    kind = f"a cell tagged '{TRAINING_TAG}'" if is_training(cell) else "a cell"
    return (
        f"this cell did not finish within {limit} s, the grading time limit of {kind}, and "
        "was interrupted (an infinite loop, or code far slower than needed?)"
    )


def execute_preprocessor(kernel_manager_class=None, trusted=None):
    """nbgrader's ``Execute`` preprocessor with the course's per-cell limits, whose
    kernels ``kernel_manager_class`` starts (the sandbox's; None: Jupyter's default), and,
    given ``trusted`` (the module :mod:`attention_ref.trust.trusted`), whose graded test
    cells get the points of the trusted checker's record.
    Imported lazily: this module must load without nbgrader for :class:`CellLimits`."""
    from nbgrader.preprocessors import Execute
    from traitlets import Bool, Unicode

    class CourseExecute(Execute):
        """Execute with :class:`CellLimits`: a fresh budget for each notebook; a kernel
        that dies before its first cell is replaced (:func:`kernel_failed_to_start`)."""

        checker = None
        warm_meta = False  # the fresh kernel warms the meta device (trusted.WARM_META)
        remove_fused = False  # ... and loses PyTorch's fused attention (REMOVE_FUSED_ATTENTION)
        no_exec = False  # ... and starts no program (FORBID_NEW_PROGRAMS)
        monitors: list = []
        # With the kernel's messages bounded, IOPub can go silent (a peer over the bound
        # is dropped): its cells then end when their reply comes, and the note says why.
        raise_on_iopub_timeout = Bool(False).tag(config=True)
        source_root = Unicode(
            "", help="the course's source directory (solutions/): the instructor's imports"
        ).tag(config=True)

        def __init__(self, *args, **kwargs):
            if kernel_manager_class is not None:
                kwargs.setdefault("kernel_manager_class", kernel_manager_class)
            super().__init__(*args, **kwargs)

        def preprocess(self, nb, resources=None, km=None):
            if trusted is None:
                return self._preprocess(nb, resources, km)
            import secrets

            self.checker = trusted.shared_checker()
            source_nb = trusted.source_notebook(self.source_root, resources)
            self.instructor_imports = (
                trusted.instructor_imports(source_nb) if source_nb is not None else ""
            )
            checked = getattr(self.instructor_imports, "exercises", None) or [
                e.exercise
                for c in nb.cells
                if trusted.is_graded_test(c)
                for e in trusted.expected_checks(c.source)
            ]
            self.warm_meta = trusted.needs_meta_device(checked)
            self.remove_fused = trusted.removes_fused_attention(checked)
            # (the sandbox's kernel manager is the one given a checker's socket to bind in)
            sandboxed = hasattr(kernel_manager_class, "checker_socket")
            self.no_exec = trusted.forbids_new_programs(
                checked, gpu=trusted.kernel_sees_a_gpu(sandboxed)
            )
            # Records are keyed by this run's secret and the cell: a late record of another
            # run can never be taken for this one's (the kernel never sees the key).
            self.run_key = secrets.token_hex(8)
            try:
                return self._preprocess(nb, resources, km)
            finally:
                self.checker = None

        def start_new_kernel(self, **kwargs):
            # nbclient binds start_new_kernel to its own async one: go through ours.
            from jupyter_core.utils import run_sync

            return run_sync(self.async_start_new_kernel)(**kwargs)

        async def async_start_new_kernel(self, **kwargs):
            if self.checker is not None:
                if hasattr(self.km, "checker_socket"):  # the sandbox binds it in
                    self.km.checker_socket = str(self.checker.socket)
                else:
                    env = dict(kwargs.get("env") or os.environ)
                    env[trusted.SOCKET_ENV] = str(self.checker.socket)
                    kwargs["env"] = env
            return await super().async_start_new_kernel(**kwargs)

        async def async_start_new_kernel_client(self):
            # Every message the kernel sends is bounded: one over what the notebook may
            # keep is refused by the socket, never read into the grader's memory.
            import zmq

            km, make = self.km, self.km.client
            context = bounded_context(self.output_budget + MESSAGE_MARGIN)
            km.client = lambda **kw: make(context=context, **kw)
            try:
                kc = await super().async_start_new_kernel_client()
            finally:  # (nbclient drops self.km when the kernel died at its start)
                del km.client
            self._close_monitors()
            self.monitors = [
                ch.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                for ch in (kc.iopub_channel, kc.shell_channel)
            ]
            if self.checker is not None:
                if self.remove_fused:
                    await self._prelude(kc, trusted.REMOVE_FUSED_ATTENTION, "fused attention")
                if self.warm_meta:
                    await self._prelude(kc, trusted.WARM_META, "meta device")
                if self.no_exec:  # last: nothing before the learner's cells starts one
                    await self._prelude(kc, trusted.FORBID_NEW_PROGRAMS, "no new programs")
            return kc

        async def _prelude(self, kc, code: str, what: str):
            """What the fresh kernel runs, silently, before any cell of the learner's,
            under the kernel's start-up limit: PyTorch's fused attention removed
            (trusted.FUSED_ATTENTION_REMOVED_EXERCISES), the meta device's first use paid
            (trusted.META_DEVICE_EXERCISES), new programs refused
            (trusted.forbids_new_programs). A kernel that does not manage it is graded all
            the same: the fused attention stays watched by each check's tripwire, each
            check warms the meta device again, outside the call's limit, inside the cell's,
            and a program the kernel starts is no answer's source the checker trusts."""
            try:
                reply = await kc.execute_interactive(
                    code,
                    silent=True,
                    store_history=False,
                    allow_stdin=False,
                    timeout=self.startup_timeout,
                    output_hook=lambda msg: None,
                )
                status = reply.get("content", {}).get("status")
            except Exception as err:  # a timeout, a kernel gone: its first cell will say
                status = f"{type(err).__name__}: {err}"
            if status != "ok":
                self.log.warning("the kernel's prelude (%s) did not run: %s", what, status)

        def start_new_kernel_client(self):
            # nbclient binds start_new_kernel_client to its own async one: go through ours.
            from jupyter_core.utils import run_sync

            return run_sync(self.async_start_new_kernel_client)()

        def _close_monitors(self):
            import contextlib

            for m in self.monitors:
                with contextlib.suppress(Exception):
                    m.close(linger=0)
            self.monitors = []

        async def _message_dropped(self) -> bool:
            """Whether the kernel was disconnected for a message over the bound."""
            dropped = False
            for m in self.monitors:
                while await m.poll(0):
                    await m.recv_multipart()
                    dropped = True
            return dropped

        def _preprocess(self, nb, resources=None, km=None):
            self.output_budget = output_budget()
            self.__dict__.setdefault("_iopub_wait", self.iopub_timeout)
            self.iopub_timeout = self._iopub_wait
            try:
                return self._run(nb, resources, km)
            finally:
                self._close_monitors()

        def _run(self, nb, resources=None, km=None):
            for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
                self.output_bytes, self.output_cut, self.message_cut = 0, False, False
                # A kernel starts as slowly as everything else on a busy machine.
                self.startup_timeout = round(load.scaled(KERNEL_STARTUP_SECONDS))
                self.limits = CellLimits()
                self.timeout_func = self.limits
                self.cells_started = 0
                try:
                    return super().preprocess(nb, resources, km)
                except Exception as err:
                    if (
                        self.cells_started
                        or km is not None
                        or attempt == KERNEL_START_ATTEMPTS
                        or not kernel_failed_to_start(err)
                    ):
                        raise
                    self.log.warning(
                        "%s: the kernel died before running any cell (%s); starting "
                        "another, attempt %d of %d",
                        KERNEL_RESTARTED,
                        err,
                        attempt + 1,
                        KERNEL_START_ATTEMPTS,
                    )
            raise AssertionError("unreachable")  # pragma: no cover

        def output(self, outs, msg, display_id, cell_index):
            # One budget of bytes for the outputs a graded notebook keeps.
            size = _message_bytes(msg.get("content", {}))
            if self.output_bytes + size > self.output_budget:
                if not self.output_cut:
                    self.output_cut = True
                    from nbformat.v4 import new_output

                    note = OUTPUT_CUT.format(budget=_megabytes(self.output_budget))
                    outs.append(new_output("stream", name="stderr", text=note))
                return None
            self.output_bytes += size
            return super().output(outs, msg, display_id, cell_index)

        def _update_display_id(self, display_id, msg):
            if self.output_bytes + _message_bytes(msg.get("content", {})) > self.output_budget:
                return None  # an update that would grow the notebook past its budget
            return super()._update_display_id(display_id, msg)

        def execute_cell(self, cell, cell_index, *args, **kwargs):
            # nbclient binds execute_cell to its own async_execute_cell: go through ours.
            from jupyter_core.utils import run_sync

            return run_sync(self.async_execute_cell)(cell, cell_index, *args, **kwargs)

        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            out = await self._execute_cell(cell, cell_index, *args, **kwargs)
            if not self.message_cut and await self._message_dropped():
                from jupyter_core.utils import ensure_async
                from nbformat.v4 import new_output

                if await ensure_async(self.km.is_alive()):  # not a kernel that died
                    self.message_cut = True
                    self.iopub_timeout = 1  # IOPub is gone: wait for it no longer
                    limit = _megabytes(self.output_budget + MESSAGE_MARGIN)
                    note = MESSAGE_CUT.format(limit=limit)
                    cell.setdefault("outputs", []).append(
                        new_output("stream", name="stderr", text=note)
                    )
            return out

        async def _execute_cell(self, cell, cell_index, *args, **kwargs):
            self.cells_started += 1
            if self.checker is None or not trusted.is_graded_test(cell):
                return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
            key = f"{self.run_key}/{trusted.grade_id(cell)}"
            source = cell.source
            asserts = not trusted.expected_checks(source)
            # A cell of plain asserts runs in the checker: the kernel only serves it.
            self.checker.begin(key, source, self.instructor_imports if asserts else None)
            self.timed_out = ""
            if asserts:
                cell.source = trusted.SERVE_CELL
            try:
                return await super().async_execute_cell(cell, cell_index, *args, **kwargs)
            finally:
                cell.source = source
                # In a cell that makes checks, the kernel's own error (an assert of the
                # cell's failed there) costs the points; nothing the kernel does earns them.
                failed_here = "" if asserts else trusted.kernel_error(cell)
                trusted.apply_record(
                    cell, self.checker.end(key), timed_out=self.timed_out, failed_here=failed_here
                )

        async def _async_handle_timeout(self, timeout, cell=None):
            self.limits.timed_out(timeout)
            self.timed_out = timeout_message(timeout, cell or {})  # the grader's own word
            self.error_on_timeout = {
                "ename": "CellTimeoutError",
                "evalue": timeout_message(timeout, cell or {}),
                "traceback": [
                    "\x1b[0;31mCellTimeoutError\x1b[0m: " + timeout_message(timeout, cell or {})
                ],
            }
            return await super()._async_handle_timeout(timeout, cell)

    CourseExecute.__name__ = CourseExecute.__qualname__ = "CourseExecute"
    return CourseExecute
