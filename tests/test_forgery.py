"""Grades that graded code cannot forge (attention_ref/trust/trusted.py, the checker of
attention_ref/trust/checker.py).

A class of one small assignment (notebook 01's first exercise, ``softmax_np``, worth 2
points) is graded with `make grade`'s code path, sandbox and two workers: an honest
student, a student with a wrong ``softmax_np`` (it normalises over the whole array: no
points), and forgers, each holding that wrong answer plus one trick of a student who has
read nbgrader's and IPython's source. Every forger must score exactly what the wrong
answer scores, the honest student full marks, and the class must be graded.
"""

# ruff: noqa: E501 - the tricks are code in strings

from __future__ import annotations

import csv
import inspect
import json
import time
from pathlib import Path

import nbformat
import pytest

from catalog.nb01 import softmax_from_fused_attention, softmax_from_multihead_attention
from course_tools import ROOT, run_course, strip_solution_markers
from test_class_grading import LIMITS

pytestmark = pytest.mark.grading

AID = "01_forgery"
SOURCE = ROOT / "solutions" / "01_dot_product_attention" / "01_dot_product_attention.ipynb"

WRONG = '''import numpy as np


def softmax_np(x, axis=-1):
    """Wrong: normalised over the whole array, not along ``axis``."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum()
'''

#: A graded test cell of plain asserts that the wrong answer fails.
ROWS_TEST = """x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 10.0]])
print("row sums:", softmax_np(x).sum(axis=-1))
assert np.allclose(softmax_np(x).sum(axis=-1), 1.0), "each row must sum to one"
"""


def _source_as(fn, name: str) -> str:
    """``fn``'s source, undecorated, as a function called ``name``."""
    lines = inspect.getsource(fn).splitlines(keepends=True)
    body = "".join(line for line in lines if not line.startswith("@"))
    return body.replace(f"def {fn.__name__}(", f"def {name}(", 1)


#: softmax along ``axis`` from PyTorch's fused attention: each row is the scores of one
#: query of size 1 against keys of size 1, and the values are the identity (the catalog's
#: mistake, written once there).
FUSED_SOFTMAX = _source_as(softmax_from_fused_attention, "_fused_softmax")
#: ... and from nn.MultiheadAttention's weights: PyTorch's attention written in Python.
MHA_SOFTMAX = _source_as(softmax_from_multihead_attention, "_mha_softmax")

#: Each trick is (cells before the test cell, code appended to the answer cell).
TRICKS: dict[str, tuple[list[str], str]] = {
    # Later cells emptied or rewritten before IPython runs them.
    "input-transformer": (
        ["get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])"],
        "",
    ),
    "ast-transformer": (
        [
            "import ast\n"
            "class _Empty(ast.NodeTransformer):\n"
            "    def visit_Module(self, node):\n"
            "        return ast.Module(body=[ast.Pass()], type_ignores=[])\n"
            "get_ipython().ast_transformers.append(_Empty())"
        ],
        "",
    ),
    # Errors swallowed before they are recorded or shown.
    "custom-exc": (["get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)"], ""),
    "showtraceback": (
        [
            "_ip = get_ipython()\n_ip.showtraceback = lambda *a, **k: None\n_ip._showtraceback = lambda *a, **k: None"
        ],
        "",
    ),
    "run-cell": (
        [
            "_ip = get_ipython()\n_run = _ip.run_cell\n"
            "def _run_cell(raw_cell, *a, **k):\n"
            "    return _run('pass' if 'check' in raw_cell else raw_cell, *a, **k)\n"
            "_ip.run_cell = _run_cell"
        ],
        "",
    ),
    "do-execute": (
        [
            "_k = get_ipython().kernel\n_do = _k.do_execute\n"
            "async def _do_execute(code, *a, **k):\n"
            "    return await _do('pass' if 'check' in code else code, *a, **k)\n"
            "_k.do_execute = _do_execute"
        ],
        "",
    ),
    "messages-filtered": (
        [
            "_s = get_ipython().kernel.session\n_send = _s.send\n"
            "def _filtered(stream, msg_or_type, content=None, *a, **k):\n"
            "    if msg_or_type == 'error':\n"
            "        return None\n"
            "    if msg_or_type == 'execute_reply' and isinstance(content, dict) and content.get('status') == 'error':\n"
            "        content = {'status': 'ok', 'execution_count': content.get('execution_count'), 'user_expressions': {}, 'payload': []}\n"
            "    return _send(stream, msg_or_type, content, *a, **k)\n"
            "_s.send = _filtered"
        ],
        "",
    ),
    # The check's own judgment corrupted in the kernel.
    "numpy-patched": (
        [
            "import numpy as _np\n"
            "_np.allclose = lambda *a, **k: True\n"
            "_np.isclose = lambda a, b, *r, **k: _np.ones(_np.broadcast(_np.asarray(a), _np.asarray(b)).shape, bool)\n"
            "_np.array_equal = lambda *a, **k: True"
        ],
        "",
    ),
    # A test cell of plain asserts judged with the kernel's own names.
    "fake-np-global": (
        [
            "import types, numpy\n"
            "np = types.ModuleType('numpy')\n"
            "vars(np).update({k: v for k, v in vars(numpy).items() if not k.startswith('__')})\n"
            "np.allclose = lambda *a, **k: True"
        ],
        "",
    ),
    "meta-path-checks": (
        [
            "import sys, types, importlib.abc, importlib.machinery\n"
            "class _Fake(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'attention_ref.checks':\n"
            "            return importlib.machinery.ModuleSpec(name, self, is_package=True)\n"
            "    def create_module(self, spec):\n"
            "        m = types.ModuleType(spec.name)\n"
            "        m.check = lambda *a, **k: print('✓ passed')\n"
            "        m.__path__ = []\n"
            "        return m\n"
            "    def exec_module(self, module):\n"
            "        pass\n"
            "sys.meta_path.insert(0, _Fake())\n"
            "for _m in [m for m in sys.modules if m.startswith('attention_ref')]:\n"
            "    del sys.modules[_m]"
        ],
        "",
    ),
    "fake-package-in-tmp": (
        [
            "import os, sys\n"
            "os.makedirs('/tmp/fake/attention_ref/checks', exist_ok=True)\n"
            "open('/tmp/fake/attention_ref/__init__.py', 'w').close()\n"
            "open('/tmp/fake/attention_ref/checks/__init__.py', 'w').write('def check(*a, **k):\\n    print(\"✓ passed\")\\n')\n"
            "sys.path.insert(0, '/tmp/fake')\n"
            "for _m in [m for m in sys.modules if m.startswith('attention_ref')]:\n"
            "    del sys.modules[_m]"
        ],
        "",
    ),
    # Inside the answer itself: no global change at all.
    "frames-walked": (
        [],
        "\n_wrong = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    import sys\n"
        "    f = sys._getframe(1)\n"
        "    while f is not None:\n"
        "        ctx = f.f_locals.get('ctx') or f.f_locals.get('self')\n"
        "        if ctx is not None and hasattr(ctx, 'fail'):\n"
        "            ctx.fail = lambda *a, **k: None\n"
        "            ctx.expect_close = lambda *a, **k: None\n"
        "        f = f.f_back\n"
        "    return _wrong(x, axis)\n",
    ),
    "lying-array": (
        [],
        "\n_wrong2 = softmax_np\n"
        "class _Liar(np.ndarray):\n"
        "    def __array_function__(self, func, types, args, kwargs):\n"
        "        if func.__name__ in ('allclose', 'array_equal'):\n"
        "            return True\n"
        "        if func.__name__ == 'isclose':\n"
        "            return np.ones(np.shape(args[0]), bool)\n"
        "        return super().__array_function__(func, types, args, kwargs)\n"
        "def softmax_np(x, axis=-1):\n"
        "    return _wrong2(x, axis).view(_Liar)\n",
    ),
    "checks-model": (
        [],
        "\ndef softmax_np(x, axis=-1):\n"
        "    from attention_ref.checks.toolkit import additive_softmax\n"
        "    return additive_softmax(np.asarray(x, dtype=float), np.ones(np.shape(x), bool), axis)\n",
    ),
    "profiler-off": (
        [],
        "\ndef softmax_np(x, axis=-1):\n"
        "    import sys\n"
        "    sys.setprofile(None)\n"
        "    from attention_ref import softmax_np as ref\n"
        "    return ref(x, axis)\n",
    ),
    "thread": (
        [],
        "\ndef softmax_np(x, axis=-1):\n"
        "    import threading\n"
        "    from attention_ref import softmax_np as ref\n"
        "    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(ref(x, axis)))\n"
        "    t.start()\n"
        "    t.join()\n"
        "    return out[0]\n",
    ),
    # What the cell shows: a non-number first result (nbgrader's partial credit).
    "execute-result": (
        [
            "get_ipython().events.register('pre_run_cell', lambda *a: get_ipython().displayhook('full marks'))\n"
            "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)"
        ],
        "",
    ),
    # The submission's own metadata.
    "skip-execution-tag": ([], ""),
    "training-tag": ([], ""),
    # The tripwire's exception caught by the answer itself (issue 40): the second call
    # would run unwatched, but the kernel has recorded that the first one fired.
    "reference-in-try-except": (
        [],
        "\ndef softmax_np(x, axis=-1):\n"
        "    from attention_ref import softmax_np as ref\n"
        "    try:\n"
        "        return ref(x, axis)\n"
        "    except Exception:\n"
        "        return ref(x, axis)\n",
    ),
    # A later notebook's reference reached where no watch is: a thread an earlier cell
    # started (the watch is per thread) runs notebook 02's masked_softmax. A kernel grading
    # notebook 01 has a stand-in in its place (its grading edition), so the answer falls
    # back to the wrong one.
    "thread-started-earlier": (
        [
            "import queue, threading, torch\n"
            "from attention_ref import masked_softmax as _later\n"
            "_asks, _answers = queue.Queue(), queue.Queue()\n"
            "def _serve():\n"
            "    while True:\n"
            "        x, axis = _asks.get()\n"
            "        try:\n"
            "            _answers.put(_later(torch.from_numpy(x), None, dim=axis).numpy())\n"
            "        except Exception as err:\n"
            "            _answers.put(err)\n"
            "threading.Thread(target=_serve, daemon=True).start()"
        ],
        "\n_wrong5 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    _asks.put((np.asarray(x, dtype=float), axis))\n"
        "    out = _answers.get()\n"
        "    return _wrong5(x, axis) if isinstance(out, Exception) else out\n",
    ),
    # The notebook's own reference reached where no watch is: a thread an earlier cell
    # started runs attention_ref.softmax_np. A kernel grading notebook 01 has a stand-in in
    # its place too (its grading edition withholds the notebook's own answers), which runs
    # the student's own softmax_np: the wrong one, which the forger lets the thread have.
    "own-reference-thread-started-earlier": (
        [
            "import queue, threading\n"
            "import attention_ref as _ar\n"
            "_asks3, _answers3 = queue.Queue(), queue.Queue()\n"
            "def _serve3():\n"
            "    while True:\n"
            "        x, axis = _asks3.get()\n"
            "        try:\n"
            "            _answers3.put(_ar.softmax_np(x, axis))\n"
            "        except Exception as err:\n"
            "            _answers3.put(err)\n"
            "_server3 = threading.Thread(target=_serve3, daemon=True)\n"
            "_server3.start()"
        ],
        "\n_wrong8 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    if threading.current_thread() is _server3:  # the stand-in runs this one\n"
        "        return _wrong8(x, axis)\n"
        "    _asks3.put((np.asarray(x, dtype=float), axis))\n"
        "    out = _answers3.get()\n"
        "    return _wrong8(x, axis) if isinstance(out, Exception) else out\n",
    ),
    # The tripwire's record found and cleared: the first forbidden call fires (and switches
    # the profile watch off), the except clears what the kernel recorded, and the second
    # call, with PyTorch's function modes switched off too, goes unseen. The kernel told the
    # checker the moment it fired, and the checker goes by that: the call fails.
    "tripwire-record-cleared": (
        [],
        "\nimport gc, torch\n"
        "_wrong10 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    t = torch.from_numpy(np.asarray(x, dtype=float))\n"
        "    try:\n"
        "        return torch.softmax(t, axis).numpy()\n"
        "    except BaseException:\n"
        "        for o in gc.get_objects():\n"
        "            if type(o).__name__ in ('GradedTripwire', 'ForbiddenTorch'):\n"
        "                o.fired.clear()\n"
        "    try:\n"
        "        with torch._C.DisableTorchFunction():\n"
        "            return torch.softmax(t, axis).numpy().astype(np.asarray(x).dtype)\n"
        "    except BaseException:\n"
        "        return _wrong10(x, axis)\n",
    ),
    # A new process, where no watch of the checks' is: PyTorch's softmax computed by
    # another Python, started by an earlier cell and asked over a pipe. A graded kernel can
    # start no program (trust/no_exec.py): the answer falls back to the wrong one.
    "new-process": (
        [
            "import subprocess, sys\n"
            "_SERVER = (\n"
            "    'import pickle, sys, torch\\n'\n"
            "    'while True:\\n'\n"
            "    '    x, axis = pickle.load(sys.stdin.buffer)\\n'\n"
            "    '    pickle.dump(torch.softmax(torch.from_numpy(x), axis).numpy(), sys.stdout.buffer)\\n'\n"
            "    '    sys.stdout.buffer.flush()\\n'\n"
            ")\n"
            "try:\n"
            "    _child = subprocess.Popen([sys.executable, '-c', _SERVER],\n"
            "                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
            "except Exception:\n"
            "    _child = None"
        ],
        "\nimport pickle\n"
        "_wrong9 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    try:\n"
        "        pickle.dump((np.asarray(x, dtype=float), axis), _child.stdin)\n"
        "        _child.stdin.flush()\n"
        "        return pickle.load(_child.stdout).astype(np.asarray(x).dtype)\n"
        "    except Exception:\n"
        "        return _wrong9(x, axis)\n",
    ),
    # A softmax from PyTorch's fused attention (one query of size 1 whose scores are the
    # row, the identity as values). The check's watch names it in this thread (it is on
    # softmax_np's forbidden list), and graded, the kernel has no fused attention at all
    # (trust/fused_removal.py): the answer falls back to the wrong one.
    "fused-attention-softmax": (
        [],
        "\nimport torch\n"
        + "_wrong7 = softmax_np\n"
        + FUSED_SOFTMAX
        + "def softmax_np(x, axis=-1):\n"
        "    try:\n"
        "        return _fused_softmax(x, axis)\n"
        "    except Exception:\n"
        "        return _wrong7(x, axis)\n",
    ),
    # ... and from a thread an earlier cell started, through the dispatcher's name for it.
    "fused-attention-thread-started-earlier": (
        [
            "import queue, threading, torch\n"
            + FUSED_SOFTMAX.replace(
                "torch.nn.functional.scaled_dot_product_attention",
                "torch.ops.aten.scaled_dot_product_attention",
            )
            + "_asks2, _answers2 = queue.Queue(), queue.Queue()\n"
            "def _serve2():\n"
            "    while True:\n"
            "        x, axis = _asks2.get()\n"
            "        try:\n"
            "            _answers2.put(_fused_softmax(x, axis))\n"
            "        except Exception as err:\n"
            "            _answers2.put(err)\n"
            "threading.Thread(target=_serve2, daemon=True).start()"
        ],
        "\n_wrong8 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    _asks2.put((x, axis))\n"
        "    out = _answers2.get()\n"
        "    return _wrong8(x, axis) if isinstance(out, Exception) else out\n",
    ),
    # ... and from nn.MultiheadAttention's weights (its Python path, no fused kernel), by a
    # thread an earlier cell started: graded, the kernel has no Python attention either.
    "python-attention-thread-started-earlier": (
        [
            "import queue, threading, torch\n"
            + MHA_SOFTMAX
            + "_asks4, _answers4 = queue.Queue(), queue.Queue()\n"
            "def _serve4():\n"
            "    while True:\n"
            "        x, axis = _asks4.get()\n"
            "        try:\n"
            "            _answers4.put(_mha_softmax(x, axis))\n"
            "        except Exception as err:\n"
            "            _answers4.put(err)\n"
            "threading.Thread(target=_serve4, daemon=True).start()"
        ],
        "\n_wrong21 = softmax_np\n"
        "def softmax_np(x, axis=-1):\n"
        "    _asks4.put((x, axis))\n"
        "    out = _answers4.get()\n"
        "    return _wrong21(x, axis) if isinstance(out, Exception) else out\n",
    ),
    # The reference's code object under another name (the tripwire watches code objects).
    "reference-code-copied": (
        [],
        "\nimport types\n"
        "from attention_ref import softmax_np as _r\n"
        "_wrong6 = softmax_np\n"
        "_copy = types.FunctionType(_r.__code__, dict(_r.__globals__), 'mine', _r.__defaults__)\n"
        "def softmax_np(x, axis=-1):\n"
        "    try:\n"
        "        return _copy(x, axis)\n"
        "    except Exception:\n"
        "        return _wrong6(x, axis)\n",
    ),
    # A forbidden built-in called from C (no profile event) or through the dispatcher.
    "partial-torch-softmax": (
        [],
        "\nimport functools, torch\n"
        "_soft = functools.partial(torch.softmax)\n"
        "def softmax_np(x, axis=-1):\n"
        "    t = torch.from_numpy(np.asarray(x, dtype=np.float64))\n"
        "    try:\n"
        "        return _soft(t, axis).numpy()\n"
        "    except Exception:\n"
        "        return _soft(t, axis).numpy()\n",
    ),
    "aten-softmax": (
        [],
        "\nimport torch\n"
        "def softmax_np(x, axis=-1):\n"
        "    t = torch.from_numpy(np.asarray(x, dtype=np.float64))\n"
        "    try:\n"
        "        return torch.ops.aten._softmax(t, axis, False).numpy()\n"
        "    except Exception:\n"
        "        return torch.ops.aten._softmax(t, axis, False).numpy()\n",
    ),
    # A plain-assert cell: what the answer returns claims to be an array, and its rows
    # "sum to one" in the kernel.
    "claims-ndarray": (
        [],
        "\n_wrong4 = softmax_np\n"
        "class _Rows:\n"
        "    def __init__(self, a):\n"
        "        self.a = a\n"
        "    def sum(self, axis=None, **k):\n"
        "        return np.ones(self.a.shape[:-1])\n"
        "    def __array__(self, *a, **k):\n"
        "        return self.a\n"
        "_Rows.__module__, _Rows.__qualname__, _Rows.__name__ = 'numpy', 'ndarray', 'ndarray'\n"
        "def softmax_np(x, axis=-1):\n"
        "    return _Rows(_wrong4(x, axis))\n",
    ),
    # The checker itself attacked from the kernel, on connections of its own.
    "stalled-connection": (
        [
            "import os, socket\n"
            "if os.environ.get('ATTENTION_REF_CHECKER'):\n"
            "    _held = socket.socket(socket.AF_UNIX)\n"
            "    _held.connect(os.environ['ATTENTION_REF_CHECKER'])\n"
            "    _held.sendall(b'\\0\\0\\0')"
        ],
        "",
    ),
    "killing-frame": (
        [
            "import os, socket\n"
            "from attention_ref.trust import wire\n"
            "if os.environ.get('ATTENTION_REF_CHECKER'):\n"
            "    _s = socket.socket(socket.AF_UNIX)\n"
            "    _s.connect(os.environ['ATTENTION_REF_CHECKER'])\n"
            "    wire.send_frame(_s, wire.pack({'op': 'check', 'id': 'softmax_np', 'candidate': {'t': 'device', 'v': 'bogus'}}, []))"
        ],
        "",
    ),
    "amplifying-frame": (
        [
            "import os, socket\n"
            "from attention_ref.trust import wire\n"
            "if os.environ.get('ATTENTION_REF_CHECKER'):\n"
            "    _s2 = socket.socket(socket.AF_UNIX)\n"
            "    _s2.connect(os.environ['ATTENTION_REF_CHECKER'])\n"
            "    _node = {'t': 'nd', 'dtype': 'uint8', 'shape': [100 * 2**20], 'buf': 0}\n"
            "    wire.send_frame(_s2, wire.pack({'op': 'check', 'id': 'softmax_np', 'candidate': {'t': 'list', 'v': [_node] * 48}}, [bytes(100 * 2**20)]))"
        ],
        "",
    ),
}


def _forgery_source(dest: Path) -> nbformat.NotebookNode:
    """The small assignment: notebook 01's title, imports, softmax_np and its test."""
    nb = nbformat.read(SOURCE, as_version=4)
    keep = [0, 1]
    keep += [
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade_id") in ("softmax_np", "test_softmax_np")
    ]
    nb.cells = [nb.cells[i] for i in keep]
    # An instructor's own test cell of plain asserts (1 point): the checker runs it.
    rows = nbformat.v4.new_code_cell(ROWS_TEST)
    rows.metadata["nbgrader"] = {
        **_cell(nb, "test_softmax_np").metadata["nbgrader"],
        "grade_id": "test_softmax_rows",
        "points": 1,
    }
    nb.cells.append(rows)
    path = dest / "solutions" / AID / f"{AID}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return nb


def _cell(nb, gid: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _submission(source, answer: str, before_test: list[str], tags: dict | None = None):
    nb = nbformat.from_dict(json.loads(json.dumps(source)))
    for c in nb.cells:
        c.source = strip_solution_markers(c.source)
    _cell(nb, "softmax_np").source = answer
    i = nb.cells.index(_cell(nb, "test_softmax_np"))
    for k, src in enumerate(before_test):
        nb.cells.insert(i + k, nbformat.v4.new_code_cell(src))
    for gid, cell_tags in (tags or {}).items():
        _cell(nb, gid).metadata["tags"] = cell_tags
    return nb


@pytest.fixture(scope="module")
def forgery_class(tmp_path_factory):
    course = tmp_path_factory.mktemp("forgery") / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    source = _forgery_source(course)
    solution = strip_solution_markers(_cell(source, "softmax_np").source)
    students = {
        "honest": _submission(source, solution, []),
        "wrong": _submission(source, WRONG, []),
    }
    for name, (cells, appended) in TRICKS.items():
        tags = {}
        if name == "skip-execution-tag":
            tags = {"test_softmax_np": ["skip-execution"]}
        answer = WRONG + appended
        if name == "training-tag":
            tags = {"softmax_np": ["training"]}
            answer = WRONG + "\nimport time\ntime.sleep(10**6)\n"
        students[f"forger-{name}"] = _submission(source, answer, cells, tags)
    for student, nb in students.items():
        folder = course / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{AID}.ipynb")
    start = time.perf_counter()
    proc = run_course(course, "grade", "--jobs", "2", env_extra=dict(LIMITS))
    seconds = time.perf_counter() - start
    with open(course / "grades.csv", newline="") as f:
        scores = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    return course, proc, scores, seconds


def test_the_class_with_forgers_is_graded(forgery_class):
    course, proc, scores, seconds = forgery_class
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(scores) == 2 + len(TRICKS), scores
    print(f"\n{len(scores)} submissions graded in {seconds:.0f} s")


def test_honest_students_get_their_exact_grades(forgery_class):
    _, _, scores, _ = forgery_class
    assert scores["honest"] == 3.0 and scores["wrong"] == 0.0, scores


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_a_wrong_answer_plus_a_trick_scores_what_the_wrong_answer_scores(forgery_class, trick):
    _, proc, scores, _ = forgery_class
    assert scores[f"forger-{trick}"] == scores["wrong"], (trick, scores)


def _graded(course: Path, student: str):
    return nbformat.read(course / "autograded" / student / AID / f"{AID}.ipynb", as_version=4)


def test_a_test_cell_shows_the_checkers_feedback_not_what_the_kernel_printed(forgery_class):
    course = forgery_class[0]
    honest = _cell(_graded(course, "honest"), "test_softmax_np")
    assert [o.output_type for o in honest.outputs] == ["stream"], honest.outputs
    assert "✓ softmax_np: passed" in honest.outputs[0].text
    for student in ("wrong", "forger-meta-path-checks", "forger-execute-result"):
        cell = _cell(_graded(course, student), "test_softmax_np")
        kinds = [o.output_type for o in cell.outputs]
        assert kinds[-1] == "error" and "execute_result" not in kinds, (student, cell.outputs)
        assert "✓ passed" not in json.dumps(cell.outputs), (student, cell.outputs)


def test_a_test_cell_of_plain_asserts_is_judged_by_the_checker(forgery_class):
    course = forgery_class[0]
    honest = _cell(_graded(course, "honest"), "test_softmax_rows")
    text = json.dumps(honest.outputs)
    assert "row sums: [1. 1.]" in text and "asserts passed" in text, honest.outputs
    assert "error" not in [o.output_type for o in honest.outputs], honest.outputs
    for student in ("wrong", "forger-fake-np-global", "forger-numpy-patched"):
        cell = _cell(_graded(course, student), "test_softmax_rows")
        assert cell.outputs[-1].output_type == "error", (student, cell.outputs)
        assert "each row must sum to one" in cell.outputs[-1].evalue, (student, cell.outputs)


def test_the_reference_and_the_checks_models_are_caught_when_graded(forgery_class):
    course = forgery_class[0]
    for trick, named in (
        ("checks-model", "the course's checks"),
        ("profiler-off", "sys.setprofile"),
        ("thread", "a new thread"),
    ):
        cell = _cell(_graded(course, f"forger-{trick}"), "test_softmax_np")
        text = json.dumps(cell.outputs)
        assert named in text and "reference_used" in text, (trick, text[:2000])


def test_a_training_tag_written_by_a_student_gets_no_long_time_limit(forgery_class):
    course = forgery_class[0]
    cell = _cell(_graded(course, "forger-training-tag"), "softmax_np")
    errors = [o.evalue for o in cell.outputs if o.output_type == "error"]
    limit = LIMITS["NBGRADER_CELL_TIMEOUT"]
    assert any(f"within {limit} s" in e for e in errors), cell.outputs


def test_a_submission_whose_kernel_dies_late_stays_within_its_time_budget(tmp_path):
    """Cells that take 10 s each (under the 12 s limit), then one that kills the kernel:
    without a budget grading would run the notebook three times (the grading, the search
    for the cell that killed the kernel, the grading without it); with a 30 s budget it is
    not run again, and the report names it and the budget."""
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    source = _forgery_source(course)
    solution = strip_solution_markers(_cell(source, "softmax_np").source)
    slow = ["import time\ntime.sleep(10)"] * 3 + ["import os\nos._exit(1)"]
    nb = _submission(source, solution, slow)
    folder = course / "submitted" / "slow-then-dead" / AID
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{AID}.ipynb")
    env = {**LIMITS, "ATTENTION_REF_SUBMISSION_SECONDS": "30"}
    start = time.perf_counter()
    proc = run_course(course, "grade", "--jobs", "1", env_extra=env)
    seconds = time.perf_counter() - start
    report = proc.stdout[proc.stdout.index("Grading report") :]
    assert "slow-then-dead" in report and "time budget (30 s" in report, report
    assert seconds < 80, f"{seconds:.0f} s: the notebook was run again"
