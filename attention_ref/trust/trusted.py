"""Grading that graded code cannot forge: the instructor's cells, the checker's verdicts.

Two rules, applied while a submission is autograded (``make grade``, ``nbgrader
autograde``, formgrader's button: every run goes through nbgrader_config.py):

1. **The source notebook is the truth about cells.** :class:`SourceTags` (a sanitising
   preprocessor, after nbgrader restores the graded cells' source) gives every cell of the
   submission the tags of the instructor's cell it is: the cell with the same ``grade_id``,
   or, for a cell without one, the instructor's cell with the same source text. Any other
   cell has no tags. So a ``training`` tag (the long time limit) or ``skip-execution`` (a
   test cell never run) written into a submission changes nothing.

2. **Points come from the checker's record.** :class:`CheckerProcess` is the trusted
   checker (:mod:`attention_ref.trust.checker`), a process of the grader's that the
   kernel reaches through one Unix socket. Before each graded test cell runs, the grader
   tells the checker which cell it is and what its (instructor's) source checks; the
   kernel's ``check(...)`` calls are judged there; after the cell, the checker's record of
   it comes back. :func:`apply_record` then replaces the cell's outputs with the checker's
   feedback, and adds an error output when the record is not a pass, so that nbgrader's
   own scoring (an error: no points) gives exactly the record's points: a cell that never
   called the checker (emptied, skipped, its kernel dead) earns nothing, and nothing the
   kernel printed in a test cell is kept.

This module imports no PyTorch (the checker is a separate process), and of the course
package only :mod:`attention_ref.course.load`, whose waits stretch with the machine's load:
on a busy machine the checker starts, pings and keeps records as slowly as everything else
does.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode

from ..course import load

#: Where the checker's socket appears inside the sandbox.
SANDBOX_SOCKET = "/opt/checker.sock"
#: The kernel's environment variable naming the socket (attention_ref.trust.agent).
SOCKET_ENV = "ATTENTION_REF_CHECKER"
#: Seconds the grader waits for the checker's record of a cell once the cell has ended, on
#: a quiet machine (every wait here is stretched by :func:`.load.load_factor`).
RECORD_WAIT = 120.0
#: How long a checker may take to answer a ping before a notebook is graded with it: an idle
#: one answers in milliseconds.
PING_WAIT = 10.0
#: Seconds a new checker may take to say it is ready on a quiet machine (it imports PyTorch
#: and the checks, about 1.5 s of CPU, and uses the meta device once, about 2 s more); one
#: still using CPU is waited for longer, up to START_HARD_WAIT, since on a busy machine it
#: only gets a share of a core.
START_WAIT = 60.0
START_HARD_WAIT = 900.0
#: Environment variables the checker keeps (it needs no credential of any kind).
CHECKER_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "ATTENTION_REF_TIME_LIMIT",
    "ATTENTION_REF_LOAD_FACTOR",
    "ATTENTION_REF_GRADING_SECRET",  # the graded seeds (trust/secret.py)
    "LD_LIBRARY_PATH",
)
ENAME = "NotGraded"
#: ``off``: grade as nbgrader does, from what the kernel printed (for measuring what the
#: checker costs; never for marks that count).
SWITCH = "ATTENTION_REF_TRUSTED_CHECKER"
UNTRUSTED_WARNING = (
    f"WARNING: GRADES FROM THE KERNEL'S OWN OUTPUT ({SWITCH}=off): a submission can forge "
    "its test cells' results."
)


def enabled() -> bool:
    """Whether graded test cells get their points from the trusted checker (the default)."""
    raw = os.environ.get(SWITCH, "on").strip().lower()
    if raw not in ("on", "off", ""):
        raise ValueError(f"{SWITCH} must be 'on' (the default) or 'off'; got {raw!r}")
    return raw != "off"


def grade_id(cell: Any) -> str:
    return (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id", "") or ""


def is_graded_test(cell: Any) -> bool:
    """A code cell worth points that the learner does not write (nbgrader's test cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return (
        cell.get("cell_type") == "code"
        and bool(meta.get("grade"))
        and not meta.get("solution")
        and bool(grade_id(cell))
    )


# ----------------------------------------------------------------------------- checks
CHECK_NAMES = {"check", "_fresh_check"}


@dataclass(frozen=True)
class Expected:
    """One check that a source test cell makes: the exercise and how it is run."""

    exercise: str
    seed: int = 0
    thorough: bool = False
    time_limit: float | None = None


def expected_checks(source: str) -> list[Expected]:
    """The checks a test cell's source makes, in order: every call ``check("id", ...)`` or
    ``_fresh_check("id", ...)`` whose exercise id, seed, thoroughness and time limit are
    literals. A cell whose source cannot be parsed makes none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name not in CHECK_NAMES or not node.args:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        kw = {}
        for k in node.keywords:
            if k.arg in ("seed", "thorough", "time_limit") and isinstance(k.value, ast.Constant):
                kw[k.arg] = k.value.value
        found.append((node.lineno, node.col_offset, Expected(first.value, **kw)))
    return [e for *_, e in sorted(found, key=lambda t: (t[0], t[1]))]


def unchecked_test_cells(nb: Any) -> list[str]:
    """The graded test cells of a source notebook that make no check (plain ``assert``
    lines): the checker runs their source itself (:mod:`attention_ref.trust.cell`)."""
    return [grade_id(c) for c in nb.cells if is_graded_test(c) and not expected_checks(c.source)]


def mixed_test_cells(nb: Any) -> list[str]:
    """The graded test cells of a source notebook that make checks and also ``assert``
    something themselves: those asserts run in the kernel, so they can cost the cell its
    points but never earn them (make grade warns)."""
    out = []
    for c in nb.cells:
        if is_graded_test(c) and expected_checks(c.source):
            with contextlib.suppress(SyntaxError):
                if any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(c.source))):
                    out.append(grade_id(c))
    return out


#: What the graded kernel runs in place of a test cell that makes no check.
#: The checks are imported first: each prelude and this cell import the whole checks
#: package, as they did when the kernel's side lived in it (before new programs are refused,
#: under the kernel's start-up limit, not in a learner's cell).
_CHECKS_FIRST = "__import__('attention_ref.checks'); "
SERVE_CELL = _CHECKS_FIRST + "__import__('attention_ref.trust.agent').trust.agent.serve_test_cell()"

#: The exercises whose checks hand the learner's code tensors on PyTorch's meta device (the
#: device property in docs/MAINTAINING.md). The meta device's first use imports about 900
#: modules (2 s of CPU, 6 to 8 s on a busy machine): a graded kernel of a notebook that checks
#: one of these pays it before its first cell (:data:`WARM_META`), under the kernel's start-up
#: limit, not in a test cell's time. tests/test_checks.py keeps this list true.
META_DEVICE_EXERCISES = frozenset(
    {
        "padding_mask",  # 02
        "masked_softmax",
        "rope",  # 05
        "masked_cross_entropy",  # 08
        "best_span",  # 09
        "span_loss",
        "pool_sentences",  # 10
        "select_sentences",
        "sample_next_token",  # 11
        "online_softmax_attention",  # 12
        "cached_self_attention",
        "rotary_attention",  # 13
        "sliding_window_mask",  # 15
        "rolling_append",
        "absorbed_scores",
        "route",
        "deepseek_route",
        "load_balancing_loss",
    }
)
#: What a fresh graded kernel runs, silently, before a notebook that needs it.
WARM_META = "__import__('attention_ref.checks._core').checks._core.warm_meta()"


def needs_meta_device(exercises: Any) -> bool:
    """Whether a notebook that checks ``exercises`` hands its kernel meta tensors."""
    return any(e in META_DEVICE_EXERCISES for e in exercises)


#: The exercises whose notebooks are graded without PyTorch's fused attention
#: (trust/fused_removal.py): each forbids it, or has no attention in it. A notebook is
#: graded without it when every exercise it checks is here. Left out, though they forbid it
#: too: notebook 12's (a correct ``cached_self_attention`` may call it) and notebook 13's
#: (its ``transformers`` models attend with it). tests/test_fused_removal.py keeps this
#: list true.
FUSED_ATTENTION_REMOVED_EXERCISES = frozenset(
    {
        "softmax_np",  # 01
        "sdpa_np",
        "sdpa",
        "self_attention",  # 03
        "split_heads",  # 04
        "merge_heads",
        "multi_head_attention",
        "feed_forward",  # 06
        "encoder_layer",
        "decoder_layer",  # 07
        "transformer",
        "gpt_block",  # 11
        "sample_next_token",
        "grouped_query_attention",
        "triton_softmax",  # 14
        "triton_attention",
        "triton_causal_split",
        "triton_flash_attention",
        "triton_attention_backward",
    }
)
#: What a fresh graded kernel runs, silently, before such a notebook's first cell.
REMOVE_FUSED_ATTENTION = (
    _CHECKS_FIRST
    + "__import__('attention_ref.trust.fused_removal').trust.fused_removal.remove_fused_attention()"
)


#: The exercises whose notebooks' graded kernels may start programs where the kernel sees a
#: GPU: notebook 14's (there, Triton compiles its kernels with ``ptxas``, a program; on a
#: CPU its interpreter starts none). Every other graded kernel starts none
#: (trust/no_exec.py): a new process would have PyTorch's fused attention whole, and no
#: watch of the checks' in it.
PROGRAMS_ALLOWED_EXERCISES = frozenset(
    {
        "triton_softmax",
        "triton_attention",
        "triton_causal_split",
        "triton_flash_attention",
        "triton_attention_backward",
    }
)
#: What such a kernel runs, silently, after the rest of its prelude.
FORBID_NEW_PROGRAMS = (
    _CHECKS_FIRST + "__import__('attention_ref.trust.no_exec').trust.no_exec.forbid_new_programs()"
)


def forbids_new_programs(exercises: Any, gpu: bool = False) -> bool:
    """Whether a notebook that checks ``exercises`` (the course's) is graded by a kernel
    that can start no program: all of them do without (``gpu``: the kernel sees a CUDA
    device, where :data:`PROGRAMS_ALLOWED_EXERCISES` compile kernels with a program)."""
    exercises = list(exercises)
    if not exercises:
        return False  # an instructor's own assignment
    return not (gpu and any(e in PROGRAMS_ALLOWED_EXERCISES for e in exercises))


def kernel_sees_a_gpu(sandboxed: bool) -> bool:
    """Whether a graded kernel can reach a CUDA device: never in the sandbox (its ``/dev``
    has none, so Triton runs its interpreter there), otherwise where this machine has one."""
    if sandboxed:
        return False
    import torch

    return torch.cuda.is_available()


def removes_fused_attention(exercises: Any) -> bool:
    """Whether a notebook that checks ``exercises`` is graded without PyTorch's fused
    attention (every one of them in :data:`FUSED_ATTENTION_REMOVED_EXERCISES`)."""
    exercises = list(exercises)
    return bool(exercises) and all(e in FUSED_ATTENTION_REMOVED_EXERCISES for e in exercises)


def import_lines(sources: list[str]) -> str:
    """The top-level ``import`` statements of the given cells, in order, as source
    (``from x import *`` and relative imports left out)."""
    lines = []
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import) or (
                isinstance(node, ast.ImportFrom)
                and not node.level
                and all(a.name != "*" for a in node.names)
            ):
                lines.append(ast.unparse(node))
    return "\n".join(lines)


class ImportLines(str):
    """The instructor's import lines, and the exercises the notebook checks (their
    forbidden functions are forbidden to the learner's calls from a cell of plain asserts)."""

    exercises: tuple[str, ...] = ()


def instructor_imports(source_nb: Any) -> str:
    """The imports of the instructor's cells of a source notebook (every code cell that is
    not an answer cell): the names a test cell of plain asserts gets from the checker."""
    cells = [
        c.source
        for c in source_nb.cells
        if c.get("cell_type") == "code"
        and not (c.get("metadata", {}).get("nbgrader", {}) or {}).get("solution")
    ]
    lines = ImportLines(import_lines(cells))
    checked = [
        e.exercise for c in source_nb.cells if is_graded_test(c) for e in expected_checks(c.source)
    ]
    lines.exercises = tuple(dict.fromkeys(checked))
    return lines


def source_notebook(root: str, resources: Any) -> Any:
    """The instructor's version of the notebook being graded (``None`` when unknown)."""
    import nbformat

    info = resources.get("nbgrader", {}) if resources else {}
    aid, name = info.get("assignment"), info.get("notebook")
    if not (root and aid and name):
        return None
    path = Path(root) / aid / f"{name}.ipynb"
    if not path.is_file():
        return None
    return nbformat.read(path, as_version=4)


# ----------------------------------------------------------------------------- cells
class SourceTags(Preprocessor):
    """Give each cell of a submission the tags of the instructor's cell it is (by
    ``grade_id``, else by identical source), and none otherwise."""

    enabled = Bool(True).tag(config=True)
    source_root = Unicode("", help="the course's source directory (solutions/)").tag(config=True)

    def preprocess(self, nb, resources):
        source = self._source(resources)
        if source is None:
            return nb, resources
        by_id = {grade_id(c): c for c in source.cells if grade_id(c)}
        by_text = {}
        for c in source.cells:
            if not grade_id(c):
                by_text.setdefault((c.cell_type, c.source), c)
        for cell in nb.cells:
            gid = grade_id(cell)
            mine = by_id.get(gid) if gid else by_text.get((cell.cell_type, cell.source))
            tags = list(mine.metadata.get("tags", [])) if mine is not None else []
            if tags:
                cell.metadata["tags"] = tags
            else:
                cell.metadata.pop("tags", None)
        return nb, resources

    def _source(self, resources):
        return source_notebook(self.source_root, resources)


# ----------------------------------------------------------------------------- the checker
class CheckerStartError(RuntimeError):
    """The grader's own checker could not be started: a failure of grading, never a grade
    (the submission is graded again, or reported as not graded)."""


def _load_text() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {load.cores()} core(s)"
    except OSError:  # pragma: no cover
        return "unknown"


class CheckerProcess:
    """The trusted checker of one notebook's grading: a child process of the grader's,
    listening on a Unix socket in a folder of the grader's."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ar-checker-"))
        self.socket = self.dir / "checker.sock"
        env = {k: os.environ[k] for k in CHECKER_ENV if k in os.environ}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attention_ref.trust.checker", str(self.socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=self.dir,
        )
        _cap_memory(self.proc.pid)
        self._pending = b""  # what the checker wrote that _read has not taken yet
        answers: list[dict] = []

        def ready(wait: float) -> bool:
            answer = self._read(wait)
            if answer is not None:
                answers.append(answer)
            return answer is not None

        started = time.monotonic()
        load.wait_while_busy(
            ready,
            self.proc.pid,
            START_WAIT,
            hard_seconds=START_HARD_WAIT,
            alive=lambda: self.proc.poll() is None,
        )
        if not answers or not answers[0].get("ready"):
            code = self.proc.poll()
            self.stop(busy=True)
            why = (
                f"it exited with status {code}"
                if code is not None
                else f"it did not say it was ready within {time.monotonic() - started:.0f} s"
            )
            raise CheckerStartError(
                f"the trusted checker did not start ({why}; load average "
                f"{_load_text()}): the grader's failure, not the submission's"
            )
        self.records: dict[str, dict] = {}

    def _read(self, wait: float) -> dict | None:
        """The checker's next answer (a JSON line) within ``wait`` seconds, or None. Read
        from the pipe itself, with the lines not yet taken kept here: a buffered readline
        would hide a second line that came with the first from the next select (a late
        record followed by the one awaited, say), and the answer would seem never to come."""
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + wait
        try:
            while True:
                while b"\n" in self._pending:
                    line, self._pending = self._pending.split(b"\n", 1)
                    try:
                        answer = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(answer, dict):
                        return answer
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._pending += chunk
        finally:
            sel.close()

    def _order(self, order: dict) -> bool:
        try:
            self.proc.stdin.write(json.dumps(order) + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def begin(self, cell_id: str, source: str, imports: str | None = None) -> None:
        """A graded test cell starts: the checker attributes the kernel's checks to it.
        ``imports`` (the instructor's import lines) for a cell that makes no check: the
        checker runs ``source`` itself."""
        order = {"cell": cell_id, "source": source}
        if imports is not None:
            order.update(asserts=True, imports=imports)
            order["forbid"] = list(getattr(imports, "exercises", ()))
        self._order(order)

    def end(self, cell_id: str) -> dict:
        """The cell has ended: the checker's record of it (a failed one if the checker
        does not answer)."""
        record = None
        if self._order({"end": True}):
            deadline = time.monotonic() + load.scaled(RECORD_WAIT)
            while record is None or record.get("cell") != cell_id:  # skip a late one
                left = deadline - time.monotonic()
                record = self._read(left) if left > 0 else None
                if record is None:
                    break
        if not isinstance(record, dict) or record.get("cell") != cell_id:
            record = {
                "cell": cell_id,
                "passed": False,
                "results": [],
                "note": "the trusted checker kept no record of this cell",
            }
        self.records[cell_id] = record
        return record

    def responsive(self, wait: float | None = None) -> bool:
        """Whether the checker runs and answers an order within ``wait`` seconds (default
        PING_WAIT): not busy with a request the last notebook's kernel left half sent, say.
        A late record of that notebook's is skipped."""
        if self.proc.poll() is not None or not self._order({"ping": True}):
            return False
        deadline = time.monotonic() + (load.scaled(PING_WAIT) if wait is None else wait)
        while (left := deadline - time.monotonic()) > 0:
            answer = self._read(left)
            if answer is None:
                return False
            if answer.get("pong"):
                return True
        return False

    def stop(self, busy: bool = False) -> None:
        """Stop the checker: asked to quit, or terminated at once when ``busy`` (it does not
        read its orders)."""
        try:
            if busy:
                self.proc.terminate()
            else:
                self._order({"quit": True})
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


#: The checker's address space: what the checks need (reference models in float64 on
#: small inputs) with room to spare; a kernel that sends the largest frames it may cannot
#: make it take the grader's memory.
CHECKER_MEMORY = 4 * 2**30


def _cap_memory(pid: int) -> None:
    import resource

    if hasattr(resource, "prlimit"):  # Linux, where grading is sandboxed
        with contextlib.suppress(OSError, ValueError):
            resource.prlimit(pid, resource.RLIMIT_AS, (CHECKER_MEMORY, CHECKER_MEMORY))


_SHARED: list[CheckerProcess] = []


def shared_checker() -> CheckerProcess:
    """This grading process's checker, started once and reused for every notebook it
    grades (one at a time): starting one costs seconds (PyTorch, the checks and the meta
    device's first use: 3.5 s of CPU), a notebook is graded in seconds. A checker that
    died, or that does not answer at once (still serving a request a hostile kernel left
    unfinished), is replaced, so that no notebook is graded by a checker another student's
    kernel holds up."""
    if _SHARED and _SHARED[0].responsive():
        return _SHARED[0]
    if _SHARED:
        _SHARED.pop().stop(busy=True)
    else:
        import atexit

        atexit.register(lambda: _SHARED and _SHARED.pop().stop())
    _SHARED.append(CheckerProcess())
    return _SHARED[0]


def record_text(record: dict) -> tuple[str, str]:
    """What the cell shows: ``(feedback of the checks that passed, the failure or "")``."""
    shown, failure = [], ""
    for r in record.get("results", []):
        if r.get("passed"):
            shown.append(str(r.get("message", "")))
        elif not failure:
            failure = str(r.get("message", ""))
    if not record.get("passed") and not failure:
        expected = record.get("expected") or []
        done = len(record.get("results", []))
        if record.get("note"):
            failure = f"Not graded: {record['note']}."
        elif record.get("asserts"):
            failure = (
                "Not graded: this test cell never reached the grader's checker (the cell was "
                "interrupted, its code did not run, or the kernel stopped)."
            )
        elif not expected:
            failure = "Not graded: this test cell makes no check."
        else:
            missing = expected[done] if done < len(expected) else expected[-1]
            failure = (
                f"Not graded: the check of {missing!r} that this cell makes never reached the "
                "grader's checker (the cell was interrupted, its code did not run, or the "
                "kernel stopped)."
            )
    return "\n".join(shown), failure


TIMEOUT_ENAME = "CellTimeoutError"


def kernel_error(cell: Any) -> str:
    """The first error the kernel reported in the cell's outputs, as one line ("" if none)."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"[:2000]
    return ""


def apply_record(cell: Any, record: dict, timed_out: str = "", failed_here: str = "") -> None:
    """Make the cell's outputs the checker's: its feedback as text, and an error output
    when the record is not a pass (nbgrader then gives the cell no points). ``timed_out``
    is the grader's own message when it interrupted the cell at its time limit: that error
    is shown (and counted by the reports) instead of the interrupted check's.
    ``failed_here``: an error the cell raised in the kernel after its checks passed (one of
    its own assert lines): the cell then earns nothing."""
    import nbformat

    shown, failure = record_text(record)
    if record.get("passed") and failed_here:
        record = {**record, "passed": False}
        failure = f"The test cell's own lines failed in the kernel: {failed_here}"
    outputs = []
    if shown:
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=shown + "\n"))
    if timed_out and not record.get("passed"):
        outputs.append(
            nbformat.v4.new_output(
                "error", ename=TIMEOUT_ENAME, evalue=timed_out, traceback=[timed_out]
            )
        )
    elif not record.get("passed"):
        outputs.append(
            nbformat.v4.new_output(
                "error",
                ename=ENAME if failure.startswith("Not graded") else "CheckFailure",
                evalue=failure,
                traceback=[failure],
            )
        )
    cell["outputs"] = outputs
    cell["execution_count"] = cell.get("execution_count")
