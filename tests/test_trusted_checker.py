"""The trusted checker (attention_ref/trust/checker.py, remote.py, agent.py, wire.py):
a graded check runs in the checker's process and calls the learner's code in the kernel
across a data-only wire, and gives the self-check's verdict, mistake id and message.

The whole catalog through the checker is compared with the self-check by hand
(``tools/record_verdicts.py --remote`` against an in-process recording, docs/MAINTAINING.md:
about 6 minutes, too long for make test); here a sample that covers every kind of crossing
(functions, modules with reference parts swapped in, callbacks to the check's objects,
objects used by reference, autograd, the recorders of notebook 12), the wire itself, and
test cells of plain asserts run in the checker.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import pickle
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from attention_ref.trust import agent, wire
from attention_ref.trust.checker import CellRecord, judge
from attention_ref.trust.trusted import Expected, expected_checks

from course_tools import ROOT

#: Exercises whose checks cross the boundary in every way the checks do.
SAMPLE = [
    "sdpa",  # a function, tensors by value
    "multi_head_attention",  # a module: weights loaded, reference functions swapped in
    "beam_search",  # the learner calls the check's language model back
    "cached_self_attention",  # the check's cache used by reference
    "online_softmax",  # the op recorder keeps the arguments
    "flash_attention",  # an autograd Function: backward, memory, recorders
    "masked_cross_entropy",  # loss.backward() reaches the check's leaf
]


def _record(tmp_path, name: str, *extra: str) -> str:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "record_verdicts.py"), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return str(out)


# In make test-later (75 s on a loaded machine; its two-exercise run, 23 s of a quiet core,
# was make test's until 2026-11-28): make test grades through the checker end to end (a
# solution, a class on a cluster, PostgreSQL).
@pytest.mark.later
def test_a_graded_check_gives_the_self_checks_verdicts_on_a_sample_of_the_catalog(tmp_path):
    sample = SAMPLE
    only = ["--only", ",".join(sample)]
    local = _record(tmp_path, "local", *only)
    remote = _record(tmp_path, "remote", *only, "--remote")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "record_verdicts.py"), "--diff", local, remote],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "0 changed verdicts" in proc.stdout and "0 mistakes named by another id" in proc.stdout
    assert " 0 changed messages" in proc.stdout, proc.stdout[-4000:]
    with open(remote) as f:
        verdicts = json.load(f)
    assert {k.split("|")[0] for k in verdicts} == set(sample)
    assert {v["verdict"] for v in verdicts.values()} == {"pass", "fail"}


# ----------------------------------------------------------------------------- the wire
def _roundtrip(value):
    enc = wire.Encoder(lambda obj: {"t": "handle", "id": 7, "type": type(obj).__name__})
    payload = wire.pack(enc(value), enc.buffers)
    tree, buffers = wire.unpack(payload)
    return wire.Decoder(buffers, lambda node: ("handle", node["id"], node["type"]))(tree)


def test_values_cross_by_value_exactly():
    x = torch.randn(3, 4, dtype=torch.float64)
    got = _roundtrip((x, x.float(), x.to(torch.bfloat16), np.arange(6.0).reshape(2, 3)))
    assert torch.equal(got[0], x) and got[0].dtype == torch.float64
    assert torch.equal(got[1], x.float()) and torch.equal(got[2], x.to(torch.bfloat16))
    assert isinstance(got[3], np.ndarray) and np.array_equal(got[3], np.arange(6.0).reshape(2, 3))
    special = _roundtrip([float("nan"), float("inf"), -0.0, 2**80, True, None, "s", {"k": 1}])
    assert math.isnan(special[0]) and special[1] == math.inf
    assert math.copysign(1, special[2]) == -1 and special[3] == 2**80
    assert special[4:] == [True, None, "s", {"k": 1}]
    assert type(_roundtrip(np.float32(1.5))) is np.float32


def test_other_objects_cross_as_handles_never_as_themselves():
    class Mine:
        pass

    class Sub(np.ndarray):
        pass

    assert _roundtrip(Mine()) == ("handle", 7, "Mine")
    sub = np.arange(3.0).view(Sub)
    got = _roundtrip(sub)
    assert type(got) is np.ndarray  # a subclass crosses as the plain array it holds
    assert _roundtrip(np.array([object()], dtype=object))[0] == "handle"


@pytest.mark.parametrize(
    "tree, buffers, why",
    [
        ({"t": "nd", "dtype": "object", "shape": [1], "buf": 0}, [b"x" * 8], "dtype"),
        ({"t": "nd", "dtype": "float64", "shape": [3], "buf": 0}, [b"x" * 8], "bytes"),
        ({"t": "pickle", "v": "gASV"}, [], "unknown kind"),
        ({"t": "v", "v": [1, 2]}, [], "malformed"),
        ({"t": "dtype", "v": "Tensor"}, [], "dtype"),
    ],
)
def test_a_malformed_answer_is_refused_not_obeyed(tree, buffers, why):
    payload = wire.pack(tree, buffers)
    tree2, bufs = wire.unpack(payload)
    with pytest.raises(wire.WireError, match=why):
        wire.Decoder(bufs, lambda node: node)(tree2)


def test_a_pickle_sent_as_an_answer_is_never_unpickled():
    class Boom:
        def __reduce__(self):
            return (print, ("BREACH",))

    with pytest.raises(wire.WireError):
        wire.unpack(pickle.dumps(Boom()))


def test_an_oversized_frame_is_refused():
    a, b = socket.socketpair()
    with a, b:
        a.sendall((wire.MAX_FRAME + 1).to_bytes(8, "big"))
        with pytest.raises(wire.WireError, match="over the limit"):
            wire.recv_frame(b)


def test_a_kernel_naming_a_new_class_in_every_handle_does_not_fill_the_checkers_memory():
    # One stand-in class is made per class the kernel describes, and kept for reuse; a
    # kernel that invents a name for every handle (a million handles in one frame) makes the
    # cache start over rather than grow, and a description's names are cut to a real
    # class's length.
    from attention_ref.trust import remote

    remote._CLASSES.clear()
    mro = ["x" * 10_000] * 1_000 + ["builtins:object"]
    for i in range(3 * remote.CLASSES_KEPT):
        node = {"type": f"R{i}", "mro": mro, "callable": False, "is_type": False}
        remote._proxy_class(node)
        assert len(remote._CLASSES) <= remote.CLASSES_KEPT
    kept = next(iter(remote._CLASSES))
    assert len(kept[1]) == 64 and all(len(name) <= 300 for name in kept[1])
    # A class described twice is one stand-in class.
    node = {"type": "Same", "mro": ["builtins:object"], "callable": False, "is_type": False}
    assert remote._proxy_class(node) is remote._proxy_class(dict(node))


# ----------------------------------------------------------------------------- records
def test_the_checks_a_test_cell_makes_are_read_from_its_source():
    source = (
        "from attention_ref.checks import check\n"
        'check("sdpa", sdpa)\n'
        "name = 'sdpa'\ncheck(name, sdpa)  # not a literal: not a check the source makes\n"
        '_fresh_check("sdpa", sdpa, seed=2024, thorough=True)\n'
    )
    assert expected_checks(source) == [Expected("sdpa"), Expected("sdpa", 2024, True)]
    assert expected_checks("this is not python (") == []


def test_a_cell_passes_only_when_every_check_its_source_makes_passed_in_order():
    record = CellRecord("test_sdpa", [Expected("sdpa"), Expected("sdpa", 2024, True)])
    assert not record.passed
    record.results.append({"passed": True})
    assert not record.passed  # the thorough check never came
    record.results.append({"passed": True})
    assert record.passed
    record.results[0]["passed"] = False
    assert not record.passed
    assert not CellRecord("empty", []).passed


def _kernel(sock, exercise, candidate, out):
    """A kernel asking the checker to check ``candidate`` for ``exercise`` (None: to run
    its test cell), serving it until the verdict, which goes to ``out``."""
    with sock:
        a = agent.Agent(sock)
        enc = wire.Encoder(a.handle)
        if exercise is None:  # a test cell of plain asserts, run by the checker
            frame = wire.pack({"op": "cell"}, [])
        else:
            frame = wire.pack(
                {"op": "check", "id": exercise, "candidate": enc(candidate)}, enc.buffers
            )
        wire.send_frame(sock, frame)
        while True:
            msg = a.receive()
            if msg.get("op") == "verdict":
                out.append(msg)
                return
            a.answer(msg)


def test_a_check_the_cell_does_not_make_is_refused_and_nothing_runs():
    from attention_ref import sdpa

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    verdict, seen = _judged("sdpa", spy, "softmax_np")
    assert not verdict["passed"] and "check_not_in_source" in verdict["message"]
    assert seen and not seen[0]["passed"] and calls == []


def test_the_kernel_cannot_choose_how_it_is_checked():
    """The seed and thoroughness are the source's: a kernel that asks for the self-check's
    easy run is checked thoroughly all the same."""

    from catalog import ALTERNATIVES

    my_sdpa = next(e.impl for e in ALTERNATIVES if e.exercise == "sdpa")
    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_kernel, args=(kernel, "sdpa", my_sdpa, seen))
    t.start()
    with checker:
        verdict = judge(checker, Expected("sdpa", 2024, True))
    t.join(30)
    assert verdict["passed"], verdict
    # the thorough run makes more cases than the visible one (check("sdpa") makes 18)
    assert verdict["cases"] > 18, verdict


def _judged(exercise, candidate, expected: str, join: float = 30) -> tuple[dict, list]:
    """(the checker's verdict on ``expected``, what the kernel got) for a kernel (a thread
    of this process) that asks to check ``candidate`` for ``exercise``."""
    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_kernel, args=(kernel, exercise, candidate, seen))
    t.start()
    with checker:
        verdict = judge(checker, Expected(expected))
    t.join(join)
    return verdict, seen


def _forger_of_softmax_np():
    """A softmax_np that calls a forbidden function, catches the tripwire's exception,
    clears the kernel's record of it, then answers right."""
    import gc

    from catalog import ALTERNATIVES

    right = next(e.impl for e in ALTERNATIVES if e.exercise == "softmax_np")

    def softmax_np(x, axis=-1):
        try:
            torch.softmax(torch.zeros(2), 0)  # forbidden for softmax_np: the tripwire fires
        except BaseException:  # noqa: BLE001 - the forger's own
            for o in gc.get_objects():
                if type(o).__name__ in ("GradedTripwire", "ForbiddenTorch"):
                    o.fired.clear()
        return right(x, axis)

    return softmax_np


@pytest.mark.parametrize("reported", [True, False])
def test_a_fired_tripwire_fails_the_call_whatever_the_kernel_clears(monkeypatch, reported):
    # The kernel tells the checker the moment its tripwire fires, and the checker goes by
    # that; without the report (the kernel's record alone), the forger would pass.
    if not reported:
        monkeypatch.setattr(agent.Agent, "_report", lambda self, seq, desc: None)
    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_kernel, args=(kernel, "softmax_np", _forger_of_softmax_np(), seen))
    t.start()
    with checker:
        verdict = judge(checker, Expected("softmax_np"))
    t.join(30)
    if reported:
        assert not verdict["passed"] and "reference_used" in verdict["message"], verdict
        assert "torch.softmax" in verdict["message"], verdict
    else:
        assert verdict["passed"], verdict


# ----------------------------------------------------------------------------- plain asserts
def _cell_kernel(sock, namespace: dict, out: list, ask: str = "cell"):
    """A kernel whose globals are ``namespace``, asking the checker to run its test cell
    (``ask="check"``: asking for a check instead)."""
    import types

    main = types.ModuleType("__main__")
    vars(main).update(namespace)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main  # the kernel's globals, for _global
    try:
        if ask == "check":
            return _kernel(sock, "softmax_np", namespace["softmax_np"], out)
        return _kernel(sock, None, None, out)
    finally:
        sys.modules["__main__"] = saved


def _run_cell(source: str, namespace: dict, imports: str = "import numpy as np", ask="cell"):
    from attention_ref.trust.checker import AssertCell

    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_cell_kernel, args=(kernel, namespace, seen, ask))
    t.start()
    with checker:
        verdict = judge(checker, AssertCell(source, imports))
    t.join(30)
    assert seen and seen[0]["passed"] == verdict["passed"], (seen, verdict)
    return verdict


ROWS = (
    "x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 10.0]])\n"
    "print('rows:', softmax_np(x).sum(axis=-1).round(3))\n"
    "assert np.allclose(softmax_np(x).sum(axis=-1), 1.0), 'each row must sum to one'\n"
)


def _softmax_np(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _wrong_softmax_np(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum()


def test_a_cell_of_plain_asserts_runs_in_the_checker_on_the_kernels_functions():
    verdict = _run_cell(ROWS, {"softmax_np": _softmax_np})
    assert verdict["passed"], verdict
    assert "rows: [1. 1.]" in verdict["message"], verdict  # what the cell printed is shown
    verdict = _run_cell(ROWS, {"softmax_np": _wrong_softmax_np})
    assert not verdict["passed"]
    assert "line 3: assert np.allclose" in verdict["message"], verdict
    assert "each row must sum to one" in verdict["message"], verdict


def test_a_cell_of_plain_asserts_uses_the_checkers_modules_not_the_kernels():
    """A kernel whose ``np`` is a module of its own making (``allclose`` always true) is
    judged with the checker's numpy, whether or not the instructor's cells import it."""
    import types

    fake = types.ModuleType("numpy")
    fake.allclose = lambda *a, **k: True
    fake.array = np.array
    for imports in ("import numpy as np", ""):
        verdict = _run_cell(ROWS, {"softmax_np": _wrong_softmax_np, "np": fake}, imports)
        assert not verdict["passed"] and "each row must sum to one" in verdict["message"]
    # built-in names are the checker's too
    verdict = _run_cell("assert len([1, 2]) == 2", {"len": lambda x: 99}, "")
    assert verdict["passed"], verdict


def test_what_the_learners_code_returns_crosses_as_data_or_a_stand_in_never_itself():
    class Always:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    verdict = _run_cell("assert answer() == 3", {"answer": lambda: Always()}, "")
    assert not verdict["passed"], verdict
    verdict = _run_cell("assert answer() == 3", {"answer": lambda: 3}, "")
    assert verdict["passed"], verdict


def test_a_cell_of_plain_asserts_names_a_name_the_kernel_lacks_and_the_learners_error():
    verdict = _run_cell("assert softmax_np is not None", {}, "")
    assert not verdict["passed"] and "NameError" in verdict["message"], verdict

    def broken(x, axis=-1):
        raise ValueError("shapes do not match")

    verdict = _run_cell(ROWS, {"softmax_np": broken})
    message = verdict["message"]
    assert not verdict["passed"] and "line 2:" in message, verdict
    assert "your code raised ValueError: shapes do not match" in message, verdict


def test_the_kernel_cannot_turn_a_cell_of_asserts_into_a_check_or_back():
    verdict = _run_cell(ROWS, {"softmax_np": _softmax_np}, ask="check")
    assert not verdict["passed"] and "check_not_in_source" in verdict["message"], verdict
    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_cell_kernel, args=(kernel, {}, seen))
    t.start()
    with checker:
        verdict = judge(checker, Expected("softmax_np"))
    t.join(30)
    assert not verdict["passed"] and "check_not_in_source" in verdict["message"], verdict


def test_a_record_of_a_cell_of_asserts_passes_only_with_its_one_passing_run():
    from attention_ref.trust.checker import AssertCell

    record = CellRecord("test_rows", [], asserts=AssertCell("assert True"))
    assert not record.passed and record.next_expected() == AssertCell("assert True")
    record.results.append({"passed": True})
    assert record.passed and record.next_expected() is None


def test_the_instructors_imports_come_from_the_cells_that_are_not_answers():
    import nbformat

    from attention_ref.trust.trusted import instructor_imports

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import numpy as np\nfrom math import sqrt\nx = 1"),
        nbformat.v4.new_code_cell("import evil as np", metadata={"nbgrader": {"solution": True}}),
        nbformat.v4.new_code_cell("def f():\n    import os\nfrom os import *\nfrom . import x"),
    ]
    assert instructor_imports(nb) == "import numpy as np\nfrom math import sqrt"


def test_an_error_of_the_kernels_own_in_a_cell_that_makes_checks_costs_its_points():
    """A cell that makes checks and asserts something itself: the asserts run in the
    kernel; their failure fails the cell even when every check passed."""
    import nbformat

    from attention_ref.trust.trusted import apply_record, kernel_error

    cell = nbformat.v4.new_code_cell("check('sdpa', sdpa)\nassert sdpa.__doc__")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="✓ sdpa: passed (18 cases)\n"),
        nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[]),
    ]
    record = {"cell": "x", "passed": True, "results": [{"passed": True, "message": "✓ sdpa"}]}
    apply_record(cell, record, failed_here=kernel_error(cell))
    assert cell.outputs[-1].output_type == "error", cell.outputs
    assert "own lines failed in the kernel: AssertionError" in cell.outputs[-1].evalue
    clean = nbformat.v4.new_code_cell("check('sdpa', sdpa)")
    apply_record(clean, record, failed_here=kernel_error(clean))
    assert [o.output_type for o in clean.outputs] == ["stream"], clean.outputs


@pytest.mark.parametrize("how", ["terminated", "its grader gone"])
def test_the_checker_removes_its_folder_however_it_is_stopped(how):
    """A grading worker ends without atexit handlers, and a worker's process group is
    terminated as a whole: the checker's socket folder goes with the checker either way."""
    import signal
    import time

    from attention_ref.trust.trusted import CheckerProcess

    checker = CheckerProcess()
    assert (checker.dir / "checker.sock").exists()
    if how == "terminated":
        checker.proc.send_signal(signal.SIGTERM)
    else:
        checker.proc.stdin.close()  # as when the grading process dies
    checker.proc.wait(timeout=30)
    deadline = time.monotonic() + 5
    while checker.dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not checker.dir.exists(), sorted(p.name for p in checker.dir.iterdir())


def test_a_grading_process_keeps_its_checker_while_it_answers_and_replaces_one_held_up(
    monkeypatch,
):
    """One checker serves every notebook a grading process grades (starting one costs 1.5 s
    of CPU), but only while it answers at once. A kernel that connected and sent nothing
    no longer holds it (each connection is read as its bytes come); a checker that does not
    answer (here: stopped) is replaced, and the next notebook never gets it."""
    import signal
    import time

    from attention_ref.trust import trusted

    monkeypatch.setattr(trusted, "PING_WAIT", 2.0)
    monkeypatch.setattr(trusted, "_SHARED", [])
    first = trusted.shared_checker()
    try:
        first.begin("cell-1", "check('sdpa', sdpa)")
        record = first.end("cell-1")  # sent right after the start: read all the same
        assert record["passed"] is False and "note" not in record, record  # the checker's own
        assert trusted.shared_checker() is first  # idle, with a late record skipped
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.connect(str(first.socket))  # a request begun, never sent
        time.sleep(1.0)  # the checker has taken the connection
        assert trusted.shared_checker() is first  # it did not wait on it
        first.proc.send_signal(signal.SIGSTOP)  # a checker that does not answer
        second = trusted.shared_checker()
        assert second is not first and second.proc.pid != first.proc.pid
        assert first.proc.wait(timeout=15) is not None  # the held-up one was stopped
        assert second.responsive() and trusted.shared_checker() is second
        held.close()
    finally:
        while trusted._SHARED:
            trusted._SHARED.pop().stop()
        with contextlib.suppress(OSError):
            first.proc.send_signal(signal.SIGCONT)
        first.stop(busy=True)


# ----------------------------------------------------------------------------- no kernel stalls it
def _frame(tree, buffers=()) -> bytes:
    payload = wire.pack(tree, list(buffers))
    return len(payload).to_bytes(8, "big") + payload


#: What a hostile kernel sends the checker on a connection of its own.
ATTACKS = {
    # three bytes of a frame's length, and the connection held open
    "stalled": lambda: b"\0\0\0",
    # a frame whose candidate PyTorch cannot build (torch.device raised, uncaught)
    "killing": lambda: _frame(
        {"op": "check", "id": "softmax_np", "candidate": {"t": "device", "v": "bogus"}}
    ),
    # a frame of 100 MB whose one buffer is used 48 times: 4.8 GB if built
    "amplifying": lambda: _frame(
        {
            "op": "check",
            "id": "softmax_np",
            "candidate": {
                "t": "list",
                "v": [{"t": "nd", "dtype": "uint8", "shape": [100 * 2**20], "buf": 0}] * 48,
            },
        },
        [bytes(100 * 2**20)],
    ),
    "garbage": lambda: b"\x00\x00\x00\x00\x00\x00\x00\x05{not json",
}


def _serve_cell(path, namespace) -> list:
    """A kernel connecting to the checker at ``path`` for its test cell of plain asserts."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    seen: list = []
    _cell_kernel(sock, namespace, seen)
    return seen


def test_no_connection_stalls_crashes_or_swells_the_checker():
    """Each attack comes in a cell of its own, on a connection of its own that stays open;
    that cell fails, and the checker serves the next cell at once, as it does the rest."""
    import time

    from attention_ref.trust.trusted import CheckerProcess

    checker = CheckerProcess()
    held = []
    try:
        for name, attack in ATTACKS.items():
            checker.begin(f"attack-{name}", "assert True", "")
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(checker.socket))
            conn.sendall(attack())
            held.append(conn)
            time.sleep(0.5)  # the checker has the bytes before the cell ends
            record = checker.end(f"attack-{name}")
            assert record["passed"] is False, (name, record)
            start = time.monotonic()
            checker.begin(f"next-{name}", "assert total == 3", "")
            seen = _serve_cell(checker.socket, {"total": 3})
            record = checker.end(f"next-{name}")
            took = time.monotonic() - start
            assert record["passed"], json.dumps([name, record, seen])
            assert seen and seen[0]["passed"], (name, seen)
            assert took < 10, f"{name}: the next cell took {took:.1f} s"
        assert checker.proc.poll() is None and checker.responsive(2.0)
    finally:
        for conn in held:
            conn.close()
        checker.stop()


def test_a_connection_that_never_sends_its_request_fails_its_cell_not_the_next():
    """A connection left half sent in one cell is closed after FIRST_FRAME_WAIT: the cell
    it came in fails; the cells that run meanwhile and after are served."""
    import time

    from attention_ref.trust import checker as checker_mod

    out = io.StringIO()
    state = checker_mod._State(out)
    state.apply(b'{"cell": "a", "source": "assert True", "asserts": true}')
    a, b = socket.socketpair()
    with a, b:
        w = checker_mod._Waiting(a, state.record, time.monotonic())
        checker_mod._failed_connection(w, "a connection sent no whole request")
        state.apply(b'{"end": true}')
    record = json.loads(out.getvalue().splitlines()[-1])
    assert record["passed"] is False and "no whole request" in json.dumps(record), record


def test_every_error_in_handling_a_request_is_that_requests_failure():
    """Whatever the request makes the checker's own code raise, judge returns a failure
    and tells the kernel; it never raises."""
    from attention_ref.trust.checker import AssertCell

    for tree in (
        {"op": "check", "id": "softmax_np", "candidate": {"t": "device", "v": "bogus"}},
        {"op": "check", "id": "softmax_np", "candidate": {"t": "size", "v": [-1]}},
        {"op": "check", "id": "softmax_np", "candidate": {"t": "bigint", "v": "9" * 10**5}},
        {
            "op": "check",
            "id": "softmax_np",
            "candidate": {"t": "tensor", "dtype": "float32", "shape": [-2], "device": "meta"},
        },
        {"op": "cell", "id": ["not", "a", "string"]},
    ):
        checker, kernel = socket.socketpair()
        with checker, kernel:
            kernel.sendall(_frame(tree))
            verdict = judge(
                checker,
                AssertCell("assert True") if tree["op"] == "cell" else Expected("softmax_np"),
            )
            if tree["op"] == "check":
                assert verdict["passed"] is False, (tree, verdict)
                answer = wire.recv_frame(kernel)
                assert b"verdict" in answer


def test_decoding_bounds_the_bytes_it_builds_however_often_a_buffer_is_used():
    node = {"t": "nd", "dtype": "uint8", "shape": [2**20], "buf": 0}
    buffers = [memoryview(bytes(2**20))]
    once = wire.Decoder(buffers, lambda n: n)({"t": "list", "v": [node] * 4})
    assert len(once) == 4 and all(a.nbytes == 2**20 for a in once)
    many = {"t": "list", "v": [node] * (wire.MAX_DECODED // 2**20 + 1)}
    with pytest.raises(wire.WireError, match="counts once for each time"):
        wire.Decoder(buffers, lambda n: n)(many)


def test_a_frame_is_read_as_it_comes_and_refused_when_it_announces_too_much():
    reader = wire.FrameReader()
    frame = _frame({"op": "cell"})
    for i in range(len(frame) - 1):
        assert reader.feed(frame[i : i + 1]) is None
    assert wire.unpack(reader.feed(frame[-1:]))[0] == {"op": "cell"}
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.FrameReader().feed((wire.MAX_FRAME + 1).to_bytes(8, "big"))


def test_a_check_whose_kernel_stops_answering_ends_when_the_grader_says_the_cell_ended():
    """The kernel asked for a check, then never answered the checker's call of its
    function (a thread of the learner's holds the connection while the cell ends): the
    grader's next order ends the wait, and the check fails, at once."""
    import time

    checker, kernel = socket.socketpair()
    order_r, order_w = socket.socketpair()
    with checker, kernel, order_r, order_w:
        enc = wire.Encoder(
            lambda obj: {
                "t": "handle",
                "id": 1,
                "type": "function",
                "mro": [],
                "callable": True,
                "is_type": False,
            }
        )
        kernel.sendall(_frame({"op": "check", "id": "softmax_np", "candidate": enc(len)}))
        threading.Timer(1.0, lambda: order_w.sendall(b'{"end": true}\n')).start()
        start = time.monotonic()
        verdict = judge(checker, Expected("softmax_np"), abort=order_r.fileno())
        took = time.monotonic() - start
    assert verdict["passed"] is False and took < 10, (took, verdict)
    assert "ended before the check finished" in verdict["message"], verdict


# ----------------------------------------------------------------------------- no impersonation
class _ClaimsTensor:
    """A kernel object whose class says it is torch.Tensor, with an ``allclose`` of its own."""

    ran: list = []

    def allclose(self, *args, **kwargs):
        _ClaimsTensor.ran.append(1)
        return True


_ClaimsTensor.__module__ = "torch"
_ClaimsTensor.__qualname__ = "Tensor"


class _StuckTensor(torch.Tensor):
    """A tensor subclass that will not cross as the plain tensor it holds."""

    def as_subclass(self, cls):
        raise RuntimeError("no")

    def allclose(self, *args, **kwargs):
        _ClaimsTensor.ran.append(1)
        return True


@pytest.mark.parametrize(
    "source",
    [
        "assert w.allclose(torch.ones(3))",
        "assert torch.allclose(w, torch.ones(3))",
        "assert isinstance(w, torch.Tensor) and torch.equal(w, torch.ones(3))",
        "assert np.allclose(w, np.ones(3))",
    ],
)
@pytest.mark.parametrize("kind", ["claims", "stuck"])
def test_a_kernel_object_never_passes_for_a_tensor_in_a_cell_of_asserts(source, kind):
    """Only a tensor that crossed as data is a tensor in the checker: an object whose class
    claims torch.Tensor (or a subclass that will not let go) fails the cell, runs none of
    its methods, and leaves PyTorch's C++ type checks alone (the checker stays up)."""
    _ClaimsTensor.ran.clear()
    w = _ClaimsTensor() if kind == "claims" else torch.ones(3).as_subclass(_StuckTensor)
    verdict = _run_cell(source, {"w": w}, "import numpy as np\nimport torch")
    assert not verdict["passed"], verdict
    assert _ClaimsTensor.ran == [], "the kernel's method ran"
    # an honest tensor still passes
    verdict = _run_cell(source, {"w": torch.ones(3)}, "import numpy as np\nimport torch")
    assert verdict["passed"], verdict


class _Changing(dict):
    """Globals whose ``ratio`` is 1e9 at one read and -1e9 at the next."""

    def __getitem__(self, name):
        if name == "ratio":
            self.reads = getattr(self, "reads", 0) + 1
            return 1e9 if self.reads % 2 else -1e9
        return super().__getitem__(name)


class _Main:
    def __init__(self, namespace):
        self.namespace = namespace

    @property
    def __dict__(self):
        return self.namespace


def test_a_name_is_read_from_the_kernel_once_per_cell():
    """``assert 0.9 < ratio and ratio < 1.1`` sees one value of ``ratio``."""
    namespace = _Changing()
    checker, kernel = socket.socketpair()
    seen: list = []
    saved = sys.modules["__main__"]
    from attention_ref.trust.checker import AssertCell

    def serve():
        sys.modules["__main__"] = _Main(namespace)
        try:
            _kernel(kernel, None, None, seen)
        finally:
            sys.modules["__main__"] = saved

    t = threading.Thread(target=serve)
    t.start()
    with checker:
        verdict = judge(checker, AssertCell("assert 0.9 < ratio and ratio < 1.1\nx = ratio", ""))
    t.join(30)
    assert not verdict["passed"], verdict
    assert namespace.reads == 1, namespace.reads


def _borrows(q, k, v):
    import torch.nn.functional as F

    try:
        return F.scaled_dot_product_attention(
            torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v)
        )
    except Exception:  # noqa: BLE001 - the trick: the tripwire's exception swallowed
        return F.scaled_dot_product_attention(
            torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v)
        )


def _borrows_softmax(x, axis=-1):
    from attention_ref import softmax_np

    return softmax_np(x, axis)


def test_the_learners_calls_from_a_cell_of_asserts_get_the_notebooks_forbidden_list():
    from attention_ref import sdpa
    from attention_ref.trust.checker import AssertCell

    source = (
        "q = torch.randn(2, 3, 4)\n"
        "assert torch.allclose(attend(q, q, q), sdpa(q, q, q)[0], atol=1e-5)"
    )
    imports = "import torch\nfrom attention_ref import sdpa"
    for fn, forbid, named in (
        (_borrows, (), "scaled_dot_product_attention"),
        (_borrows_softmax, ("softmax_np",), "attention_ref.softmax_np"),
    ):
        checker, kernel = socket.socketpair()
        seen: list = []
        cell = (
            source
            if fn is _borrows
            else "x = np.ones((2, 3))\nassert np.allclose(attend(x), 1 / 3)"
        )
        t = threading.Thread(target=_cell_kernel, args=(kernel, {"attend": fn}, seen))
        t.start()
        with checker:
            verdict = judge(checker, AssertCell(cell, imports + "\nimport numpy as np", forbid))
        t.join(30)
        assert not verdict["passed"], verdict
        assert named in verdict["message"] and "reference_used" in verdict["message"], verdict

    # the same cell with the learner's own code passes
    def own(q, k, v):
        w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return w @ v

    checker, kernel = socket.socketpair()
    seen = []
    t = threading.Thread(target=_cell_kernel, args=(kernel, {"attend": own}, seen))
    t.start()
    with checker:
        verdict = judge(checker, AssertCell(source, imports, ("sdpa",)))
    t.join(30)
    assert verdict["passed"], verdict
    assert sdpa is not None


# ----------------------------------------------------------------------------- the tripwire
def _swallowed(q, k, v, mask=None):
    """The reference called inside try/except: the tripwire's exception is caught, and
    the second call ran unwatched."""
    import attention_ref

    try:
        return attention_ref.sdpa(q, k, v, mask)
    except Exception:  # noqa: BLE001 - the trick
        return attention_ref.sdpa(q, k, v, mask)


def _fused(call):
    def sdpa(q, k, v, mask=None):
        """PyTorch's fused attention for the output, the weights by hand."""
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        try:
            out = call(q, k, v, attn_mask=mask)
        except Exception:  # noqa: BLE001 - and the tripwire's exception swallowed
            out = weights @ v
        return out.nan_to_num(0.0), weights

    return sdpa


BORROWERS = {
    "try/except": _swallowed,
    "functools.partial": _fused(
        __import__("functools").partial(torch.nn.functional.scaled_dot_product_attention)
    ),
    "torch.ops.aten": _fused(torch.ops.aten.scaled_dot_product_attention),
    "torch.ops.aten overload": _fused(torch.ops.aten.scaled_dot_product_attention.default),
    "torch._C._nn": _fused(torch._C._nn.scaled_dot_product_attention),
}


@pytest.mark.parametrize("how", sorted(BORROWERS))
def test_a_forbidden_call_is_caught_however_it_is_made_and_whatever_the_learner_catches(how):
    """Graded: the kernel records that the tripwire fired, and the call fails with
    reference_used whatever the learner's code returned; PyTorch's fused attention is
    stopped in every spelling (a call from C, as partial makes it, fires no profile
    event)."""
    verdict, _ = _judged("sdpa", BORROWERS[how], "sdpa", join=60)
    assert not verdict["passed"] and "reference_used" in verdict["message"], (how, verdict)


def test_the_self_check_catches_the_reference_inside_try_except():
    from attention_ref.checks import CheckFailure, run_check

    with pytest.raises(CheckFailure, match="reference_used"):
        run_check("sdpa", _swallowed)


def _torch_softmax(call):
    def softmax_np(x, axis=-1):
        """PyTorch's softmax, in a spelling no profile hook sees, its exception swallowed."""
        t = torch.from_numpy(np.asarray(x, dtype=np.float64))
        try:
            return call(t, axis).numpy()
        except Exception:  # noqa: BLE001 - the trick
            return call(t, axis).numpy()

    return softmax_np


SOFTMAX_BORROWERS = {
    "functools.partial": _torch_softmax(__import__("functools").partial(torch.softmax)),
    "torch.ops.aten._softmax": _torch_softmax(lambda t, a: torch.ops.aten._softmax(t, a, False)),
    "torch.ops.aten.softmax.int": _torch_softmax(torch.ops.aten.softmax.int),
}


@pytest.mark.parametrize("how", sorted(SOFTMAX_BORROWERS))
def test_a_forbidden_softmax_is_caught_in_every_spelling(how):
    checker, kernel = socket.socketpair()
    seen: list = []
    t = threading.Thread(target=_kernel, args=(kernel, "softmax_np", SOFTMAX_BORROWERS[how], seen))
    t.start()
    with checker:
        verdict = judge(checker, Expected("softmax_np"))
    t.join(60)
    assert not verdict["passed"] and "reference_used" in verdict["message"], (how, verdict)


def test_a_stand_in_claims_only_classes_written_in_python():
    """A lazy parameter's stand-in is lazy (``is_lazy``) but no tensor; a learner's module
    is an ``nn.Module``; anything claiming a tensor, an array or a built-in type is inert."""
    from torch.nn.parameter import UninitializedParameter, is_lazy

    from attention_ref.trust import remote
    from attention_ref.trust.agent import describe

    def stand_in(obj):
        return remote._proxy_class({"t": "handle", "id": 1, **describe(obj)})(None, 1, {})

    lazy = stand_in(UninitializedParameter())
    assert is_lazy(lazy) and not isinstance(lazy, torch.Tensor)
    module = stand_in(torch.nn.Linear(2, 2))
    assert isinstance(module, torch.nn.Module) and not isinstance(module, torch.Tensor)
    for claim in (_ClaimsTensor(), 3.5j):
        assert not isinstance(stand_in(claim), torch.Tensor | np.ndarray | complex)
    inert = stand_in(_ClaimsTensor())
    with pytest.raises(TypeError, match="not a plain tensor or array"):
        inert.allclose(torch.ones(1))


# ----------------------------------------------------------------------------- parts computed here
def test_a_reference_part_the_checker_computes_holds_its_parts_and_computes_with_them():
    from attention_ref.checks import nb07
    from attention_ref.decoder import DecoderLayer
    from attention_ref.trust.computed import ComputedInChecker

    part = nb07._decoder_layer_in_checker(8, 2, 16, 0.0, True)  # as a graded kernel gets it
    assert isinstance(part, ComputedInChecker) and part.norm_first and part.d_model == 8
    ref = DecoderLayer(8, 2, 16, norm_first=True)
    ref.load_state_dict(part.state_dict())  # the same parameters, by name
    part, ref = part.double().eval(), ref.double().eval()
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    memory = torch.randn(2, 4, 8, generator=gen, dtype=torch.float64)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    got, expected = part(y, memory, causal, memory_mask=None), ref(y, memory, causal)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    with torch.no_grad():  # it computes with the weights it holds at the call
        part.norm1.weight.mul_(2)
    assert not torch.equal(part(y, memory)[0], ref(y, memory)[0])
    # the sizes come from a kernel: none that would fill the checker's memory
    big = torch.zeros(1, 2049, 8, dtype=torch.float64)  # 2 heads x 2049 x 4098 weights
    with pytest.raises(ValueError, match="larger than a check's decoder layer computes"):
        part(big, memory=big)
    rows = torch.zeros(140_000, 1, 8, dtype=torch.float64)  # few weights, 280,000 rows of 16
    with pytest.raises(ValueError, match="larger than a check's decoder layer computes"):
        part(rows, memory=rows)
    with pytest.raises(ValueError, match="float64 weights, one dtype; got torch.float16"):
        part.half()(y.half(), memory.half())
    with pytest.raises(ValueError, match="d_model must be an int from 1 to"):
        nb07._decoder_layer_in_checker(10**6, 2, 16)
    with pytest.raises(TypeError):
        nb07._decoder_layer_in_checker(8, 2)


def test_a_refusal_of_a_part_the_checker_computes_reaches_the_learner_as_the_self_check_names_it():
    """A learner's Transformer that passes a float mask to the course's decoder layers: the
    layer, computed in the checker, refuses it; the graded verdict names that error, its
    type and message, as the self-check does (it once said only "raised Exception: ")."""
    import nbformat

    from attention_ref.checks import CheckFailure, run_check

    from course_tools import SOLUTIONS, answer_cells, strip_solution_markers

    nb = nbformat.read(
        SOLUTIONS / "07_decoder_and_transformer" / "07_decoder_and_transformer.ipynb", 4
    )
    answers = answer_cells(nb)
    source = "\n".join(
        [nb.cells[1].source]
        + [strip_solution_markers(answers[k].source) for k in ("decoder_layer", "transformer")]
    )
    mask = "& (tgt_in != self.pad_id)[:, None, None, :]"
    assert mask in source
    source = source.replace(mask, mask + "\n        self_mask = self_mask.float()")
    namespace: dict = {"__name__": "learner"}
    exec(compile(source, "<answer>", "exec"), namespace)  # noqa: S102 - the course's own
    float_mask = namespace["Transformer"]
    with pytest.raises(CheckFailure) as self_check:
        run_check("transformer", float_mask)
    named = "TypeError: self_mask must be a boolean tensor"
    assert named in str(self_check.value)
    verdict, _ = _judged("transformer", float_mask, "transformer", join=60)
    assert not verdict["passed"] and named in verdict["message"], verdict
    assert "code_raised" in verdict["message"], verdict
