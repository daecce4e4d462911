"""The trusted checker: where a graded check runs and its verdict is decided.

Under grading every notebook's kernel runs in a sandbox and is never trusted. Its
``check(exercise_id, candidate)`` does not judge: it connects to the checker (a process of
the grader's, outside the sandbox) and serves it (:mod:`attention_ref.trust.agent`). The
checker runs the check's code on a stand-in for the learner's function or class
(:mod:`attention_ref.trust.remote`), decides, sends the kernel its feedback to show, and
keeps the verdict in its own record.

:func:`judge` runs one check on one connection. :class:`CellRecord` is what the checker
records for one graded test cell: the checks the instructor's source cell makes, in
order (``check("sdpa", sdpa)`` then ``_fresh_check("sdpa", sdpa, seed=2024,
thorough=True)``); the seed and thoroughness of each are the source's, whatever the kernel
asks; the cell passes only when each of them was asked for, in that order, and passed.

Run as ``python -m attention_ref.trust.checker SOCKET``, it is the grader's checker
process: it listens on the Unix socket ``SOCKET`` (the only thing of the checker's a
kernel can reach) and takes orders from the grader on its standard input, one JSON line
each, answering on its standard output (:func:`main`). It never waits on a kernel: each
connection's request is read as its bytes come (:class:`attention_ref.trust.wire.FrameReader`),
with a deadline and a size limit; a check waits for the kernel's answers with time limits
and ends when the grader's next order comes; whatever a request makes its code raise is
that request's failure.
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
import time
from dataclasses import dataclass, field
from typing import Any

from ..checks._core import REGISTRY, CheckFailure, resolve_time_limit, run_check, warm_meta
from ..checks.mistakes import tag
from . import wire
from .cell import run_test_cell
from .remote import Link
from .secret import SECRET_ENV, graded_seed
from .trusted import Expected, expected_checks  # noqa: F401 - re-exported


@dataclass(frozen=True)
class AssertCell:
    """A graded test cell that makes no check: its (instructor's) source runs here, with
    the instructor's imports (:mod:`attention_ref.trust.cell`)."""

    source: str
    imports: str = ""
    #: The exercises the notebook checks: the learner's calls from the cell get their
    #: forbidden lists (and PyTorch's fused attention is always forbidden there).
    forbid: tuple[str, ...] = ()


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


def _refused(asked: str, message: str) -> dict:
    return {"exercise": asked, "passed": False, "cases": 0, "message": message}


#: The grading secret this checker was started with (empty: the source's seeds).
_SECRET: list[str] = []


def seed_for(expect: Expected, secret: str) -> int:
    """The seed a check the source makes runs with: a thorough (graded) check's comes from
    the course's ``secret`` (trust/secret.py), so that no kernel can rebuild its inputs
    from the notebook; the self-check's, and any check without a secret, is the source's."""
    if expect.thorough and secret:
        return graded_seed(secret, expect.exercise, expect.seed)
    return expect.seed


def judge(
    sock: socket.socket,
    expect: Expected | AssertCell | None,
    frame: bytes | None = None,
    abort: int | None = None,
) -> dict:
    """Run one check that the kernel at ``sock`` asks for, as ``expect`` says (None: the
    source makes no further check here, so none is run and the request fails; an
    :class:`AssertCell`: the kernel must ask for the cell, whose source runs here); send
    the kernel its feedback and return the verdict ``{"exercise", "passed", "message",
    "cases"}``. ``frame``: the request, when the caller has read it (else it is read here,
    within :data:`FIRST_FRAME_WAIT` seconds); ``abort``: a file descriptor whose being
    readable ends the check (the grader's next order: the cell is over).

    Whatever the kernel sends or does, this returns a verdict: any error in handling the
    request is the request's failure, never the checker's."""
    try:
        return _judge(sock, expect, frame, abort)
    except Exception as err:  # noqa: BLE001 - a request's failure, never the checker's
        verdict = _refused("", f"not graded: the checker could not handle the request ({err})")
        verdict["message"] = verdict["message"][:2000]
        with contextlib.suppress(Exception):
            _send_verdict(sock, verdict)
        return verdict


def _judge(sock, expect, frame, abort) -> dict:
    link = Link(sock, abort=abort)
    try:
        if frame is None:
            frame = wire.recv_frame(sock, deadline=time.monotonic() + FIRST_FRAME_WAIT)
        tree, buffers = wire.unpack(frame)
        if not isinstance(tree, dict) or tree.get("op") not in ("check", "cell"):
            raise wire.WireError("the kernel's first message is not a check request")
        asked = str(tree.get("id", ""))[:200] if tree["op"] == "check" else ""
        candidate = link.decode(tree.get("candidate"), buffers) if asked else None
    except (wire.WireError, OSError, ValueError, KeyError, TypeError) as err:
        verdict = _refused("", f"unreadable request: {err}"[:2000])
        with contextlib.suppress(Exception):
            _send_verdict(sock, verdict)
        return verdict
    verdict: dict[str, Any] = {"exercise": asked, "cases": 0}
    if isinstance(expect, AssertCell) and tree["op"] == "cell":
        verdict = run_test_cell(
            link, expect.source, expect.imports, resolve_time_limit(), expect.forbid
        )
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
                seed=seed_for(expect, _SECRET[0] if _SECRET else ""),
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
      check: the kernel asks for the cell and the checker runs ``SRC`` itself
      (``"forbid": [EXERCISE, ...]``: the exercises the notebook checks, whose forbidden
      functions the learner's calls from the cell may not use);
    - ``{"end": true}``: the cell has finished; the answer is its record;
    - ``{"ping": true}``: the answer is ``{"pong": true}`` (the grader's test that this
      checker is free before it serves another notebook);
    - ``{"quit": true}``.

    Answers on stdout, one JSON object a line: ``{"ready": true}`` once listening, and a
    record after each ``end``. Check requests that come outside a cell are refused.
    """
    path = argv[0]
    # The course's grading secret (trust/secret.py), taken out of the environment: the
    # seeds of the thorough checks come from it, not from the source.
    _SECRET[:] = [os.environ.pop(SECRET_ENV, "").strip()]
    # Stopped with its process group (a worker shut down): end through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return _serve(path)
    finally:  # the socket and its folder go with the checker, however it ends
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(os.path.dirname(path))


#: Seconds a kernel's connection may take to send its whole request (a few bytes to a
#: few megabytes, sent at once): one that has not is closed, and its cell fails.
FIRST_FRAME_WAIT = 30.0
#: Connections waiting for their request at once; beyond it the oldest is closed.
MAX_WAITING = 16


@dataclass
class _Waiting:
    """A kernel's connection whose request has not fully come: read without waiting on it."""

    conn: socket.socket
    record: CellRecord | None  # the cell running when it connected
    deadline: float
    reader: wire.FrameReader = field(default_factory=wire.FrameReader)


def _failed_connection(waiting: _Waiting, why: str) -> None:
    """Close a connection that stalled or sent garbage; the cell it came in fails."""
    with contextlib.suppress(OSError):
        waiting.conn.close()
    if waiting.record is not None:
        waiting.record.results.append(_refused("", f"not graded: {why}"))


def _serve(path: str) -> int:
    import selectors

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)  # the kernel runs under another user id when grading as root
    server.listen(16)
    server.setblocking(False)
    # The meta device's first use (seconds of imports), paid before the checker says it is
    # ready (the grader waits for that as long as the checker uses CPU): never inside a cell's
    # time, and never while a ping waits for an answer.
    warm_meta()
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, "kernel")
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ, "grader")
    state = _State(out)
    # The grader's orders, read from the pipe itself: a buffered readline would keep a
    # second order that came with the first (a cell's end right after its start) out of
    # sight of the next select, and the grader would wait for an answer never sent. Orders
    # are applied before any connection is accepted or served: a cell's start is always
    # read before the request its kernel makes in it. No connection is ever waited on:
    # each one's request is read as its bytes come, and one whose request has not come
    # within FIRST_FRAME_WAIT seconds is closed. A request is then judged on its own
    # connection, with time limits, and the grader's next order ends it.
    waiting: dict[int, _Waiting] = {}
    ready: list[tuple[_Waiting, bytes]] = []
    while True:
        timeout = None
        if ready:
            timeout = 0.0
        elif waiting:
            timeout = max(0.0, min(w.deadline for w in waiting.values()) - time.monotonic())
        sel.select(timeout)
        if state.read_orders(stdin):
            return 0
        # New connections, then whatever bytes the waiting ones have, without blocking.
        for _ in range(MAX_WAITING):
            try:
                conn, _ = server.accept()
            except OSError:  # none waiting (BlockingIOError), or one gone already
                break
            # An order written before the kernel connected is in the pipe by now: the
            # connection belongs to the cell it starts.
            if state.read_orders(stdin):
                conn.close()
                return 0
            conn.setblocking(False)
            if len(waiting) >= MAX_WAITING:
                oldest = min(waiting.values(), key=lambda w: w.deadline)
                sel.unregister(oldest.conn)
                del waiting[oldest.conn.fileno()]
                _failed_connection(oldest, "too many connections to the checker at once")
            w = _Waiting(conn, state.record, time.monotonic() + FIRST_FRAME_WAIT)
            waiting[conn.fileno()] = w
            sel.register(conn, selectors.EVENT_READ, "conn")
        for fd, w in list(waiting.items()):
            try:
                data = w.conn.recv(max(1, min(w.reader.wanted, 1 << 20)))
                if not data:
                    raise wire.WireError("the connection closed before its request came")
                frame = w.reader.feed(data)
            except (BlockingIOError, InterruptedError):
                continue
            except (OSError, wire.WireError) as err:
                sel.unregister(w.conn)
                del waiting[fd]
                _failed_connection(w, f"a connection to the checker broke off ({err})")
                continue
            if frame is not None:
                sel.unregister(w.conn)
                del waiting[fd]
                ready.append((w, frame))
        now = time.monotonic()
        for fd, w in list(waiting.items()):
            if w.deadline <= now:
                sel.unregister(w.conn)
                del waiting[fd]
                _failed_connection(
                    w, f"a connection sent no whole request within {FIRST_FRAME_WAIT:g} s"
                )
        if ready and not _grader_waiting(stdin):
            w, frame = ready.pop(0)
            state.judge(w, frame, stdin)


def _grader_waiting(fd: int) -> bool:
    """Whether the grader has written an order not read yet."""
    import select

    return bool(select.select([fd], [], [], 0)[0])


class _State:
    """The checker's record of the running cell, and the grader's orders applied to it."""

    def __init__(self, out) -> None:
        self.out = out
        self.record: CellRecord | None = None
        self.pending = b""  # the start of an order whose end has not come

    def read_orders(self, fd: int) -> bool:
        """Read and apply the grader's orders waiting on ``fd``, without waiting for any;
        True when the checker is to end (``quit``, or the grader gone)."""
        while _grader_waiting(fd):
            chunk = os.read(fd, 65536)
            if not chunk:
                return True
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                if line.strip() and self.apply(line):
                    return True
        return False

    def apply(self, line: bytes) -> bool:
        """Apply one order; True for ``quit``."""
        try:
            order = json.loads(line)
        except ValueError:
            return False
        if not isinstance(order, dict):
            return False
        if order.get("quit"):
            return True
        if order.get("ping"):
            self._say({"pong": True})
        elif "cell" in order:
            source = str(order.get("source", ""))
            self.record = CellRecord(str(order["cell"]), expected_checks(source))
            if order.get("asserts"):  # the grader's word: the source makes no check
                forbid = tuple(str(e) for e in order.get("forbid", []) or [])
                self.record.asserts = AssertCell(source, str(order.get("imports", "")), forbid)
        elif order.get("end"):
            summary = self.record.summary() if self.record is not None else {"passed": False}
            self.record = None
            self._say(summary)
        return False

    def _say(self, answer: dict) -> None:
        self.out.write(json.dumps(answer) + "\n")
        self.out.flush()

    def judge(self, w: _Waiting, frame: bytes, abort: int) -> None:
        """Judge one request on its own connection; its verdict goes to the record of the
        cell it came in, if that cell still runs (else it is refused, and nothing runs)."""
        record = w.record if w.record is not None and w.record is self.record else None
        with w.conn:
            w.conn.setblocking(True)
            verdict = judge(
                w.conn, record.next_expected() if record is not None else None, frame, abort
            )
        if record is not None:
            record.results.append(verdict)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
