"""The student edition (`make student-edition`, attention_ref/course/edition.py): no readable
reference source, the same check feedback, and the autograder's gate still holds when the
kernels import it."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from course_tools import (
    ROOT,
    auto_points,
    execute,
    make_course,
    release_path,
    run_course,
    solution_path,
)
from test_grading import solved_submission, submit

# The graded exercises' reference implementations, by the name attention_ref exports.
REFERENCES = [
    "softmax_np",
    "sdpa_np",
    "sdpa",
    "padding_mask",
    "causal_mask",
    "masked_softmax",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "SelfAttention",
    "sinusoidal_encoding",
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "GPTBlock",
    "GroupedQueryAttention",
    "sample_next_token",
    "online_softmax_attention",
    "cached_self_attention",
    "FlashAttention",
    "flash_attention",
    "RMSNorm",
    "SwiGLU",
    "RotaryAttention",
    "sliding_window_mask",
    "rolling_append",
    "absorbed_scores",
    "route",
    "load_balancing_loss",
]
# Lines of the reference sdpa that must never show up in what a student can see.
SDPA_LINES = ["def sdpa(", "softmax", "math.sqrt", "@"]


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("edition")
    proc = subprocess.run(
        [sys.executable, "-m", "attention_ref.course.edition", "build", str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dest


def run_with(edition: Path, code: str, stdin: str | None = None) -> str:
    """Run ``code`` in a fresh interpreter that imports the student edition."""
    env = dict(os.environ, PYTHONPATH=str(edition))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=edition,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_installed_tree_holds_no_source(edition):
    pkg = edition / "attention_ref"
    assert (pkg / "__init__.pyc").is_file()
    assert not list(pkg.rglob("*.py")), "source files in the student edition"
    assert not list(pkg.rglob("__pycache__"))
    out = run_with(edition, "import attention_ref; print(attention_ref.__file__)")
    assert out.strip() == str(pkg / "__init__.pyc")
    # nothing on disk quotes the reference's code as text
    for f in pkg.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for text in (b"def sdpa(", b"def masked_softmax(", b"class EncoderLayer("):
                assert text not in data, (f, text)


def test_inspect_getsource_raises_for_every_reference(edition):
    code = (
        "import inspect, json, attention_ref as ar\n"
        f"names = {REFERENCES!r}\n"
        "res = {}\n"
        "for n in names:\n"
        "    obj = getattr(ar, n)\n"
        "    targets = [obj] + ([obj.forward] if isinstance(obj, type) else [])\n"
        "    for t in targets:\n"
        "        try:\n"
        "            inspect.getsource(t); res[repr(t)] = 'SHOWN'\n"
        "        except (OSError, TypeError) as e:\n"
        "            res[repr(t)] = type(e).__name__\n"
        "print(json.dumps(res))\n"
    )
    res = json.loads(run_with(edition, code))
    shown = [k for k, v in res.items() if v == "SHOWN"]
    assert not shown, f"source shown for {shown}"
    assert len(res) >= len(REFERENCES)


def test_ipython_double_question_mark_shows_no_source(edition):
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "import attention_ref\n"
        "sh = InteractiveShell.instance()\n"
        "sh.user_ns['ar'] = attention_ref\n"
        "for name in ['ar.sdpa', 'ar.EncoderLayer', 'ar.masked_softmax']:\n"
        "    print(sh.object_inspect_text(name, detail_level=1))\n"
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", run_with(edition, code))
    assert "Docstring" in out  # the inspector did run
    assert "Source:" not in out and "def sdpa(" not in out and "class EncoderLayer" not in out
    # the same inspection with the full package shows the source
    full = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert "def sdpa(" in re.sub(r"\x1b\[[0-9;]*m", "", full.stdout), full.stderr


def test_pdb_list_shows_nothing(edition):
    code = (
        "import pdb, torch, attention_ref\n"
        "q = torch.randn(2, 3, 4)\n"
        "pdb.Pdb().runcall(attention_ref.sdpa, q, q, q)\n"
        "print('DONE')\n"
    )
    out = run_with(edition, code, stdin="list\nlonglist\ncontinue\n")
    assert "DONE" in out
    for line in ("def sdpa(", "math.sqrt", "softmax("):
        assert line not in out, out


def test_shown_demonstration_source_is_kept(edition):
    """Notebook 06 prints Encoder.embed_tokens and Encoder.forward on purpose."""
    out = run_with(
        edition,
        "import inspect, attention_ref as ar\n"
        "print(inspect.getsource(ar.Encoder.forward))\n"
        "try:\n    inspect.getsource(ar.EncoderLayer.forward)\n"
        "except OSError:\n    print('HIDDEN')\n",
    )
    assert "def forward(" in out and "HIDDEN" in out


def test_every_source_a_notebook_prints_is_kept(edition):
    """Whatever a solution notebook prints with inspect.getsource(ar.X) must still print
    under the student edition (attention_ref.course.edition.SHOWN), or the notebook would fail."""
    names = set()
    for nb in (ROOT / "solutions").glob("*/*.ipynb"):
        names |= set(re.findall(r"getsource\((?:ar|attention_ref)\.([\w.]+)\)", nb.read_text()))
    assert names, "expected notebook 06 to print some reference source"
    code = (
        "import inspect, json, operator, attention_ref as ar\n"
        f"names = {sorted(names)!r}\n"
        "get = lambda n: inspect.getsource(operator.attrgetter(n)(ar))\n"
        "print(json.dumps({n: len(get(n)) for n in names}))\n"
    )
    assert all(json.loads(run_with(edition, code)).values())


FEEDBACK = """
import json, catalog
from attention_ref.checks import check
names = {names!r}
out = {{}}
for e in catalog.MISTAKES:
    if e.exercise in names:
        try:
            check(e.exercise, e.impl)
            out[e.id] = 'PASSED'
        except AssertionError as err:
            out[e.id] = str(err)
print(json.dumps(out))
"""


def test_checks_give_the_same_feedback(edition):
    names = ["softmax_np", "sdpa", "causal_mask", "masked_softmax", "split_heads"]
    code = FEEDBACK.format(names=names)
    tests_dir = str(ROOT / "tests")
    env_full = dict(os.environ, PYTHONPATH=tests_dir)
    full = subprocess.run(
        [sys.executable, "-c", code], env=env_full, capture_output=True, text=True, cwd=ROOT
    )
    assert full.returncode == 0, full.stderr
    env_ed = dict(os.environ, PYTHONPATH=os.pathsep.join([str(edition), tests_dir]))
    ed = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace(
                "import json",
                "import json, attention_ref\n"
                "assert attention_ref.__file__.endswith('.pyc')\n"
                "import json",
            ),
        ],
        env=env_ed,
        capture_output=True,
        text=True,
        cwd=edition,
    )
    assert ed.returncode == 0, ed.stderr
    a, b = json.loads(full.stdout), json.loads(ed.stdout)
    assert a and a == b


def test_feedback_quotes_the_learners_line(edition):
    code = (
        "from attention_ref.checks import check\n"
        "src = 'def sdpa(q, k, v, mask=None):\\n    return undefined_name_here(q), None\\n'\n"
        "ns = {}\n"
        "exec(compile(src, '/tmp/learner_cell.py', 'exec'), ns)\n"
        "import linecache\n"
        "linecache.cache['/tmp/learner_cell.py'] = (len(src), None, src.splitlines(True),"
        " '/tmp/learner_cell.py')\n"
        "try:\n    check('sdpa', ns['sdpa'])\n"
        "except AssertionError as e:\n    print(e)\n"
    )
    out = run_with(edition, code)
    assert "undefined_name_here" in out, out
    assert "/nonexistent/" not in out, out


# A notebook of function exercises and one of module exercises.
GATE = ["01_dot_product_attention", "06_encoder"]


def student_kernel(edition: Path, dest: Path) -> Path:
    """A jupyter data folder whose ``python3`` kernel imports the student edition (the
    graders themselves keep the full package, as an instructor's do)."""
    spec = dest / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (student edition)",
                "language": "python",
                "env": {"PYTHONPATH": str(edition)},
            }
        )
    )
    return dest


@pytest.mark.later
def test_gate_holds_with_kernels_importing_the_student_edition(edition, tmp_path, monkeypatch):
    """Every solution of GATE earns every automatic mark and a blank none, graded by `make
    grade`'s code path with kernels that import the student edition."""
    jupyter_path = student_kernel(edition, tmp_path / "share")
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    probe = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import attention_ref\nprint(attention_ref.__file__)")]
    )
    execute(probe, kernel_name="python3", timeout=120)
    assert probe.cells[0].outputs[0]["text"].strip() == str(
        edition / "attention_ref" / "__init__.pyc"
    )

    course = make_course(tmp_path / "course", GATE)
    for aid in GATE:
        submit(course, "solution", aid, solved_submission(aid))
    # A blank notebook scores 0 whatever package it imports (its answers raise); one shows it.
    submit(course, "blank", GATE[0], nbformat.read(release_path(GATE[0]), as_version=4))
    env = {"JUPYTER_PATH": str(jupyter_path), "NBGRADER_CELL_TIMEOUT": "600"}
    proc = run_course(course, "grade", *GATE, env_extra=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "grades.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 2 * len(GATE)  # every student x assignment
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for aid in GATE:
            total = auto_points(nbformat.read(solution_path(aid), as_version=4))
            graded = [("solution", total)] + ([("blank", 0.0)] if aid == GATE[0] else [])
            for student, want in graded:
                nb = gb.find_submission_notebook(aid, aid, student)
                assert (nb.code_score, nb.max_code_score) == (want, total), (aid, student)
