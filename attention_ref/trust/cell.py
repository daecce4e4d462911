"""A graded test cell of plain ``assert`` lines, run by the trusted checker.

A test cell that makes no ``check(...)`` (an instructor's own asserts) is not run in the
graded kernel: the kernel runs a stub that serves the checker
(:func:`attention_ref.trust.agent.serve_test_cell`), and the checker executes the
instructor's source here (:func:`run_test_cell`). Its names resolve as follows:

- the names the instructor's own cells import (``import numpy as np``, ``from
  attention_ref.attention import softmax``; never the learner's cells) are the checker's
  own modules and objects, so that ``np.allclose`` is the real one;
- Python's built-in names are the checker's;
- every other name is the learner's, read from the kernel's globals (:class:`KernelNamespace`):
  a tensor or array by value, a number or string as itself, a function or an object as a
  stand-in whose calls run in the kernel under the per-call limit and the tripwire
  (:mod:`attention_ref.trust.remote`). A module in the kernel's globals that the
  instructor's cells did not import is one of the checker's own modules of that name, if
  the checker has loaded it, else a ``NameError``.

The cell passes when the source runs to its end; what it printed is its feedback.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import sys
import traceback
from typing import Any

from ..checks.mistakes import tag
from .remote import ACTIVE, KernelError, KernelGone, Link, describe, is_remote

#: The file name the test cell's code runs under (its lines are found by it in tracebacks).
CELL_FILE = "<graded test cell>"
#: The most characters of what the cell printed that its feedback keeps.
PRINTED_CAP = 20_000


class KernelNamespace(dict):
    """The globals the test cell runs with: the instructor's imports, and, for any other
    name that is not a built-in, the kernel's global of that name, read when it is used."""

    def __init__(self, link: Link) -> None:
        super().__init__(__builtins__=builtins, __name__="__main__")
        self.link = link
        self.absent: set[str] = set()

    def __missing__(self, name: str) -> Any:
        if name in self.absent or name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)  # Python then looks in builtins, or raises NameError
        try:
            value = self.link.request("global", None, name=name)
        except KernelError as err:
            if err.info.get("type") == "KeyError":
                self.absent.add(name)
                raise KeyError(name) from None
            raise
        if is_remote(value) and describe(value).get("type") == "module":
            module = sys.modules.get(str(describe(value).get("module", "")))
            if module is None:
                raise NameError(
                    f"{name!r} is a module of the notebook's that the checker has not loaded; "
                    "import it in a cell of the instructor's (not an answer cell)"
                )
            value = module
        # Read once per cell: ``assert 0.9 < ratio and ratio < 1.1`` sees one value of
        # ``ratio``, however the kernel's global changes between two reads.
        self[name] = value
        return value


def _imports(namespace: dict, imports: str) -> None:
    for line in imports.splitlines():
        with contextlib.suppress(Exception):  # a module the checker lacks: name stays unbound
            exec(compile(line, "<instructor's imports>", "exec"), namespace)  # noqa: S102


def _failure(err: BaseException, source: str) -> str:
    """One line that names the failing line of the cell and what failed."""
    lines = source.splitlines()
    where = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename == CELL_FILE and frame.lineno and 0 < frame.lineno <= len(lines):
            where = f"line {frame.lineno}: {lines[frame.lineno - 1].strip()}"
    if isinstance(err, KernelGone):
        what = f"the kernel stopped answering ({err})"
    elif isinstance(err, AssertionError) and not isinstance(err, KernelError):
        what = f"AssertionError: {err}" if str(err) else "AssertionError"
    elif isinstance(err, KernelError):
        what = f"your code raised {err.info.get('type', 'an error')}: {err.info.get('message', '')}"
        if err.info.get("kind") == "timeout":
            what = f"your code took longer than the {err.info.get('limit')} s one call may take"
        elif err.info.get("kind") == "reference":
            what = (
                f"your code calls {err.info.get('name', '?')} instead of implementing the "
                "exercise" + tag("reference_used")
            )
    else:
        what = f"{type(err).__name__}: {err}"
    return f"test cell failed at {where}: {what}" if where else f"test cell failed: {what}"


def run_test_cell(
    link: Link, source: str, imports: str, limit: float | None, forbid: tuple[str, ...] = ()
) -> dict:
    """Execute the instructor's ``source`` here against the kernel at ``link``; the verdict
    ``{"exercise": "", "passed", "message", "cases": 0}``. ``limit``: seconds each call
    of the learner's code may take; ``forbid``: the exercises the notebook checks, whose
    forbidden functions the learner's calls may not reach (PyTorch's fused attention
    never)."""
    namespace = KernelNamespace(link)
    _imports(namespace, imports)
    link.limit, link.exercise, link.learner_limit = limit, "", (limit,)
    link.forbid = tuple(forbid)
    printed = io.StringIO()
    ACTIVE[:] = [link]
    try:
        code = compile(source, CELL_FILE, "exec")
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            exec(code, namespace)  # noqa: S102 - the instructor's source, in the checker
        passed, message = True, "✓ the test cell's asserts passed"
    except Exception as err:  # noqa: BLE001 - any error is the cell's failure
        passed, message = False, _failure(err, source)
    finally:
        ACTIVE.clear()
    shown = printed.getvalue()[:PRINTED_CAP]
    if shown:
        message = shown.rstrip("\n") + "\n" + message
    return {"exercise": "", "passed": passed, "message": message, "cases": 0}
