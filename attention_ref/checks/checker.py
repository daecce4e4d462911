"""The trusted checker: where a graded check runs and its verdict is decided.

Under grading every notebook's kernel runs in a sandbox and is never trusted. Its
``check(exercise_id, candidate)`` does not judge: it connects to the checker (a process of
the grader's, outside the sandbox) and serves it (:mod:`attention_ref.checks.agent`). The
checker runs the check's code on a stand-in for the learner's function or class
(:mod:`attention_ref.checks.remote`), decides, sends the kernel its feedback to show, and
keeps the verdict in its own record.

:func:`judge` runs one check on one connection. :class:`CellRecord` is what the checker
records for one graded test cell: the checks the instructor's source cell makes, in
order (``check("sdpa", sdpa)`` then ``_fresh_check("sdpa", sdpa, seed=2024,
thorough=True)``); the seed and thoroughness of each are the source's, whatever the kernel
asks; the cell passes only when each of them was asked for, in that order, and passed.

Run as ``python -m attention_ref.checks.checker SOCKET``, it is the grader's checker
process: it listens on the Unix socket ``SOCKET`` (the only thing of the checker's a
kernel can reach) and takes orders from the grader on its standard input, one JSON line
each, answering on its standard output (:func:`main`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from ..course.trusted import Expected, expected_checks  # noqa: F401 - re-exported
from . import wire
from ._core import REGISTRY, CheckFailure, resolve_time_limit, run_check
from .cell import run_test_cell
from .mistakes import tag
from .remote import Link


@dataclass(frozen=True)
class AssertCell:
    """A graded test cell that makes no check: its (instructor's) source runs here, with
    the instructor's imports (:mod:`attention_ref.checks.cell`)."""

    source: str
    imports: str = ""


@dataclass
class CellRecord:
    """The checker's record of one graded test cell."""

    cell: str
    expected: list[Expected]
    results: list[dict] = field(default_factory=list)
    #: A cell that makes no check (plain asserts): the checker runs its source itself.
    asserts: AssertCell | None = None

    def next_expected(self) -> Expected | AssertCell | None:
        n = len(self.results)
        if self.asserts is not None:
            return self.asserts if n == 0 else None
        return self.expected[n] if n < len(self.expected) else None

    @property
    def passed(self) -> bool:
        if self.asserts is not None:
            return len(self.results) == 1 and bool(self.results[0]["passed"])
        return (
            bool(self.expected)
            and len(self.results) == len(self.expected)
            and all(r["passed"] for r in self.results)
        )

    def summary(self) -> dict:
        return {
            "cell": self.cell,
            "passed": self.passed,
            "expected": [e.exercise for e in self.expected],
            "asserts": self.asserts is not None,
            "results": self.results,
        }


def _send_verdict(sock: socket.socket, verdict: dict) -> None:
    buf = io.BytesIO()
    pickle.dump({"op": "verdict", **verdict}, buf, protocol=pickle.HIGHEST_PROTOCOL)
    wire.send_frame(sock, buf.getvalue())


def judge(sock: socket.socket, expect: Expected | AssertCell | None) -> dict:
    """Run one check that the kernel at ``sock`` asks for, as ``expect`` says (None: the
    source makes no further check here, so none is run and the request fails; an
    :class:`AssertCell`: the kernel must ask for the cell, whose source runs here); send
    the kernel its feedback and return the verdict ``{"exercise", "passed", "message",
    "cases"}``."""
    link = Link(sock)
    try:
        tree, buffers = wire.unpack(wire.recv_frame(sock))
        if not isinstance(tree, dict) or tree.get("op") not in ("check", "cell"):
            raise wire.WireError("the kernel's first message is not a check request")
        asked = str(tree.get("id", "")) if tree["op"] == "check" else ""
        candidate = link.decode(tree.get("candidate"), buffers) if asked else None
    except (wire.WireError, OSError, ValueError, KeyError, TypeError) as err:
        return {"exercise": "", "passed": False, "message": f"unreadable request: {err}"}
    verdict: dict[str, Any] = {"exercise": asked, "cases": 0}
    if isinstance(expect, AssertCell) and tree["op"] == "cell":
        verdict = run_test_cell(link, expect.source, expect.imports, resolve_time_limit())
    elif isinstance(expect, AssertCell) or tree["op"] == "cell":
        where = "this cell makes no check" if expect is not None else "no test cell runs now"
        if expect is not None and not isinstance(expect, AssertCell):
            where = f"this cell checks {expect.exercise!r} here"
        verdict.update(
            passed=False,
            message=f"not graded: the kernel asked for {asked or 'a test cell'!r}, but {where}."
            + tag("check_not_in_source"),
        )
    elif expect is None or asked != expect.exercise:
        where = (
            "this cell makes no further check"
            if expect is None
            else f"this cell checks {expect.exercise!r} here"
        )
        verdict.update(
            passed=False,
            message=f"{asked}: not graded: the check asked for {asked!r}, but {where}."
            + tag("check_not_in_source"),
        )
    elif asked not in REGISTRY:
        verdict.update(passed=False, error="ValueError", message=f"unknown exercise id {asked!r}")
    else:
        try:
            n = run_check(
                asked,
                candidate,
                seed=expect.seed,
                thorough=expect.thorough,
                time_limit=expect.time_limit,
            )
            verdict.update(passed=True, cases=n, message=f"✓ {asked}: passed ({n} cases)")
        except CheckFailure as failure:
            verdict.update(passed=False, message=str(failure))
    with contextlib.suppress(OSError):  # a kernel gone: the record holds the verdict
        _send_verdict(sock, verdict)
    return verdict


# ----------------------------------------------------------------------------- the process
def main(argv: list[str]) -> int:
    """The checker process. Orders on stdin, one JSON object a line:

    - ``{"cell": ID, "source": SRC}``: a graded test cell starts; its record begins.
      The checker then serves the kernel's check requests (each attributed to this cell)
      until the next order. With ``"asserts": true, "imports": LINES`` the cell makes no
      check: the kernel asks for the cell and the checker runs ``SRC`` itself;
    - ``{"end": true}``: the cell has finished; the answer is its record;
    - ``{"ping": true}``: the answer is ``{"pong": true}`` (the grader's test that this
      checker is free before it serves another notebook);
    - ``{"quit": true}``.

    Answers on stdout, one JSON object a line: ``{"ready": true}`` once listening, and a
    record after each ``end``. Check requests that come outside a cell are refused.
    """
    path = argv[0]
    # Stopped with its process group (a worker shut down): end through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return _serve(path)
    finally:  # the socket and its folder go with the checker, however it ends
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(os.path.dirname(path))


def _serve(path: str) -> int:
    import selectors

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)  # the kernel runs under another user id when grading as root
    server.listen(4)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, "kernel")
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ, "grader")
    record: CellRecord | None = None
    # The grader's orders, read from the pipe itself: a buffered readline would keep a
    # second order that came with the first (a cell's end right after its start) out of
    # sight of the next select, and the grader would wait for an answer never sent. Orders
    # come before the kernel's requests: a cell's start is always read before the request
    # its kernel makes in it.
    pending = b""
    orders: list[bytes] = []
    while True:
        if not orders:
            ready = {key.data for key, _ in sel.select()}
            if "grader" in ready:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return 0
                *lines, pending = (pending + chunk).split(b"\n")
                orders.extend(line for line in lines if line.strip())
            if not orders:
                if "kernel" in ready:
                    conn, _ = server.accept()
                    with conn:
                        if record is None:
                            judge(conn, None)  # refused: no graded cell is running
                        else:
                            record.results.append(judge(conn, record.next_expected()))
                continue
        order = json.loads(orders.pop(0))
        if order.get("quit"):
            return 0
        if order.get("ping"):
            out.write(json.dumps({"pong": True}) + "\n")
            out.flush()
        elif "cell" in order:
            source = str(order.get("source", ""))
            record = CellRecord(str(order["cell"]), expected_checks(source))
            if order.get("asserts"):  # the grader's word: the source makes no check
                record.asserts = AssertCell(source, str(order.get("imports", "")))
        elif order.get("end"):
            summary = record.summary() if record is not None else {"passed": False}
            record = None
            out.write(json.dumps(summary) + "\n")
            out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
