"""Similar answers between submissions (instructor guide, "Similar answers").

A class of assignment 01 is written straight into ``submitted/`` (no grading: similarity
reads the submitted notebooks): two students share an ``sdpa_np`` with renamed variables,
reordered lines and their own comments; four write ``sdpa_np`` each their own way; eight
write the same short ``softmax_np``, the obvious one from the hint; and some submissions
are malformed. The pair must be listed first and alone, the page must show what a
submission wrote as text, and no student is named unless asked.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from test_browser import browser  # noqa: F401 - the headless Chromium fixture

from attention_ref.course import similarity

from course_tools import ROOT, release_path, run_course

AID = "01_dot_product_attention"
ARTIFACTS = ROOT / "test-artifacts" / "report"
SCRIPT = "<script>window.__pwned = 1</script>"

#: One student's sdpa_np, written their own way (a loop over nothing, einsum, a helper).
SHARED_SDPA_NP = f'''def sdpa_np(Q, K, V, mask=None):
    """Scaled dot-product attention in NumPy; returns (out, weights)."""
    # my own version, Annie Quixote (annie7@uni.example) {SCRIPT}
    scale = 1.0 / np.sqrt(K.shape[-1])
    logits = np.einsum("...qd,...kd->...qk", Q, K) * scale
    fill = np.full_like(logits, -1e30)
    if mask is not None:
        logits = np.where(np.asarray(mask, dtype=bool), logits, fill)
    top = logits.max(axis=-1, keepdims=True)
    expd = np.exp(logits - top) * (logits > -1e29)
    probs = expd / expd.sum(axis=-1, keepdims=True)
    result = np.einsum("...qk,...kd->...qd", probs, V)
    return result, probs
'''

#: The same code by a second student: every variable renamed, independent lines swapped,
#: its own comments and docstring.
COPIED_SDPA_NP = '''def sdpa_np(Q, K, V, mask=None):
    """attention"""
    s = np.einsum("...qd,...kd->...qk", Q, K) * (1.0 / np.sqrt(K.shape[-1]))
    neg = np.full_like(s, -1e30)  # very negative
    if mask is not None:
        s = np.where(np.asarray(mask, dtype=bool), s, neg)
    m = s.max(axis=-1, keepdims=True)
    ex = np.exp(s - m) * (s > -1e29)
    w = ex / ex.sum(axis=-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", w, V), w
'''

#: Correct sdpa_np written independently, each differently.
INDEPENDENT_SDPA_NP = [
    """def sdpa_np(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(d_k)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax_np(scores, axis=-1)
    return weights @ V, weights
""",
    """def sdpa_np(Q, K, V, mask=None):
    scores = np.matmul(Q, K.swapaxes(-1, -2))
    scores = scores / math.sqrt(Q.shape[-1])
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    scores[...] = np.where(mask, scores, -np.inf)
    w = softmax_np(scores)
    out = np.matmul(w, V)
    return out, w
""",
    """def sdpa_np(Q, K, V, mask=None):
    n_k = K.shape[-2]
    kt = np.moveaxis(K, -1, -2)
    raw = (Q @ kt) * Q.shape[-1] ** -0.5
    if mask is not None:
        raw = raw + np.where(np.broadcast_to(mask, raw.shape), 0.0, -np.inf)
    att = np.exp(raw - np.max(raw, axis=-1, keepdims=True))
    att = att / np.sum(att, axis=-1, keepdims=True)
    assert att.shape[-1] == n_k
    return att @ V, att
""",
    '''def sdpa_np(Q, K, V, mask=None):
    """Attention, one batch element at a time."""
    Qf = Q.reshape(-1, *Q.shape[-2:])
    Kf = np.broadcast_to(K, Q.shape[:-2] + K.shape[-2:]).reshape(Qf.shape[0], *K.shape[-2:])
    Vf = np.broadcast_to(V, Q.shape[:-2] + V.shape[-2:]).reshape(Qf.shape[0], *V.shape[-2:])
    outs, ws = [], []
    for q, k, v in zip(Qf, Kf, Vf):
        sc = q.dot(k.T) / np.sqrt(q.shape[-1])
        ws.append(sc)
    ws = np.stack(ws).reshape(Q.shape[:-1] + (K.shape[-2],))
    if mask is not None:
        ws = np.where(mask, ws, -np.inf)
    ws = softmax_np(ws)
    return ws @ V, ws
''',
]

#: The short correct softmax_np the hint leads to, as eight students write it (their own
#: names, the same code).
COMMON_SOFTMAX = """def softmax_np(x, axis=-1):
    {e} = np.exp(x - x.max(axis=axis, keepdims=True))
    return {e} / {e}.sum(axis=axis, keepdims=True)
"""

#: Who wrote what: student id -> {exercise: source}; every other answer is the stub.
CLASS = {
    "annie7": {"sdpa_np": SHARED_SDPA_NP, "softmax_np": COMMON_SOFTMAX.format(e="e")},
    "bobby8": {"sdpa_np": COPIED_SDPA_NP, "softmax_np": COMMON_SOFTMAX.format(e="ex")},
    **{
        f"indie{i}": {
            "sdpa_np": code,
            "softmax_np": COMMON_SOFTMAX.format(e=["z", "t", "p", "q"][i]),
        }
        for i, code in enumerate(INDEPENDENT_SDPA_NP)
    },
    "carla9": {"softmax_np": COMMON_SOFTMAX.format(e="exps")},
    "dorian4": {"softmax_np": COMMON_SOFTMAX.format(e="num")},
}


def submission(answers: dict[str, str]) -> nbformat.NotebookNode:
    """The release notebook with ``answers`` in its answer cells."""
    nb = nbformat.read(release_path(AID), as_version=4)
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}
    for exercise, source in answers.items():
        cells[exercise].source = source
    return nb


#: Answer cells no parser likes: a number, 5000 open brackets, a NUL, a list of odds.
ODD_ANSWERS = {
    "sdpa_np": 123,
    "softmax_np": "(" * 5000,
    "sdpa": "x\0y = 1",
    "why_sqrt_dk": ["a", 2, None],
}


def odd_cell(grade_id: str, source: object) -> dict:
    return {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": grade_id}}, "source": source}


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A course folder with assignment 01's source and release, and CLASS submitted, plus
    malformed submissions: not JSON, JSON without cells, cells that are not cells, answer
    cells that do not parse, a link
    to another student's notebook and one to another student's folder."""
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for folder in ("solutions", "notebooks"):
        shutil.copytree(ROOT / folder / AID, course / folder / AID)
    for student, answers in CLASS.items():
        folder = course / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(submission(answers), folder / f"{AID}.ipynb")
    broken = {
        "not-json": "{ this is not a notebook",
        "no-cells": json.dumps({"metadata": {}, "nbformat": 4}),
        "bad-cells": json.dumps({"cells": ["a string", {"metadata": {"nbgrader": 3}}, 7]}),
        "odd-cells": json.dumps({"cells": [odd_cell(g, src) for g, src in ODD_ANSWERS.items()]}),
    }
    for student, text in broken.items():
        folder = course / "submitted" / student / AID
        folder.mkdir(parents=True)
        (folder / f"{AID}.ipynb").write_text(text)
    linked = course / "submitted" / "linker" / AID
    linked.mkdir(parents=True)
    os.symlink(course / "submitted" / "annie7" / AID / f"{AID}.ipynb", linked / f"{AID}.ipynb")
    (course / "submitted" / "folder-linker").mkdir()
    os.symlink(course / "submitted" / "bobby8" / AID, course / "submitted" / "folder-linker" / AID)
    return course


def listed(result: similarity.Similarity) -> list[tuple[str, frozenset[str]]]:
    return [(p.exercise, frozenset((p.a.student, p.b.student))) for p in result.pairs]


def test_the_pair_with_renamed_variables_and_reordered_lines_is_listed_first(course):
    result = similarity.find_similar(course, [AID])
    assert listed(result)[0] == ("sdpa_np", frozenset({"annie7", "bobby8"})), listed(result)
    top = result.pairs[0]
    assert top.similarity >= 0.8, top.similarity
    # the evidence: every line of the copied code but the signature and docstring (the
    # template's) and `if mask is not None:` (most of the class writes it)
    assert top.lines(top.b) == [3, 4, 6, 7, 8, 9, 10], top.lines(top.b)


def test_the_short_line_many_write_and_independent_solutions_are_not_listed(course, monkeypatch):
    result = similarity.find_similar(course, [AID])
    # the only pair is the copied one: not the eight identical softmax_np, not the
    # independent sdpa_np (the first is the instructor's own solution)
    assert listed(result) == [("sdpa_np", frozenset({"annie7", "bobby8"}))], listed(result)
    # 3 code answers and a written one each, and the 4 odd answers
    assert result.compared[AID] == 4 * len(CLASS) + len(ODD_ANSWERS)
    # what keeps the eight softmax_np off the list is the class's share, not their size
    monkeypatch.setattr(similarity, "MIN_COMMON", 10**6)
    undiscounted = similarity.find_similar(course, [AID])
    assert sum(ex == "softmax_np" for ex, _ in listed(undiscounted)) == 8 * 7 // 2


def test_the_template_and_the_hints_code_are_discounted():
    """An answer made of the stub and the hint's code keeps only the runs of tokens that
    join the hint's expressions to the names they are assigned to."""
    exercises, keep = similarity.course_exercises(ROOT, AID)
    ex = next(e for e in exercises if e.grade_id == "sdpa_np")
    answer = '''def sdpa_np(Q, K, V, mask=None):
    """Scaled dot-product attention in NumPy; returns (out, weights)."""
    kt = np.swapaxes(K, -1, -2)
    scores = np.where(mask, scores, -np.inf)
    raise NotImplementedError()
'''
    kept = set(similarity.code_prints(answer, keep)) - ex.given
    assert kept == {
        "_v = np . swapaxes",
        "= np . swapaxes (",
        "_v = np . where",
        "= np . where (",
    }, kept


def test_malformed_and_linked_submissions_are_skipped_and_listed(course):
    result = similarity.find_similar(course, [AID])
    why = {student: reason for student, _, reason in result.skipped}
    # read, not skipped: "bad-cells" (cells that are no cells: no answer in it) and
    # "odd-cells" (answers that do not parse: compared as tokens)
    assert set(why) == {"not-json", "no-cells", "linker", "folder-linker"}, why
    assert "not JSON" in why["not-json"] and "no list of cells" in why["no-cells"]
    assert "cannot be opened" in why["linker"]  # the link is not followed
    assert "not followed" in why["folder-linker"]


def test_the_command_writes_the_page_and_csv_without_names(course):
    proc = run_course(course, "similarity", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (course / "report" / "instructor" / "similarity.html").read_text()
    with open(
        course / "report" / "instructor" / "similarity.csv", newline="", encoding="utf-8"
    ) as f:
        rows = list(csv.DictReader(f))
    assert [(r["exercise"], r["student_a"], r["student_b"]) for r in rows] == [
        ("sdpa_np", "student 1", "student 2")
    ]
    assert rows[0]["answer_a"].startswith("def sdpa_np")
    assert float(rows[0]["similarity"]) >= 0.8
    for student in CLASS:
        assert student not in page and all(student not in str(r) for r in rows), student
    assert "not a verdict" in page and "changes no grade" in page
    assert "plagiari" not in page.lower()

    named = run_course(course, "similarity", "--names", "--out", "named", timeout=300)
    assert named.returncode == 0, named.stdout + named.stderr
    with open(
        course / "named" / "instructor" / "similarity.csv", newline="", encoding="utf-8"
    ) as f:
        rows = list(csv.DictReader(f))
    assert {rows[0]["student_a"], rows[0]["student_b"]} == {"annie7", "bobby8"}


def test_the_page_shows_a_script_in_a_submission_as_text(course, tmp_path, browser):  # noqa: F811
    result = similarity.find_similar(course, [AID])
    page_path = tmp_path / "similarity.html"
    page_path.write_text(similarity.render_html(result), encoding="utf-8")
    assert "<script>window" not in page_path.read_text()
    page = browser.new_page()
    page.goto(page_path.as_uri())
    assert page.evaluate("() => window.__pwned") is None
    assert page.get_by_text(SCRIPT).first.is_visible()  # the comment, shown as text
    # the lines holding shared code are highlighted: 8 of one answer, 7 of the other
    assert page.locator("mark").count() == 8 + 7
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "similarity.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    page.close()


def test_make_report_writes_the_similar_answers_and_links_them(course, monkeypatch):
    """`make report`'s code path, on a gradebook that knows the assignment and the class
    (nothing graded: the similar answers come from submitted/)."""
    from nbgrader.api import Gradebook

    # nbgrader creates the gradebook with `alembic`, from this environment
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_assignment(AID)
        for student in CLASS:
            gb.add_student(student)
        gb.update_or_create_student("annie7", first_name="Annie", last_name="Quixote")
    proc = run_course(course, "report", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The list is the instructor's: the class's report does not point to it.
    assert "similarity" not in (course / "report" / "class" / "report.html").read_text()
    listing = course / "report" / "instructor" / "similarity.csv"
    with open(listing, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["exercise"], r["student_a"], r["student_b"]) for r in rows] == [
        ("sdpa_np", "student 1", "student 2")
    ]
    assert f"wrote {course / 'report' / 'instructor' / 'similarity.html'}" in proc.stdout
    page = (course / "report" / "instructor" / "similarity.html").read_text()
    for private in ("annie7", "Annie", "Quixote", "uni.example"):  # the gradebook's names
        assert private not in page and private not in rows[0]["answer_a"], private


WRITTEN = (
    "Without the scale the dot products grow like the square root of d_k, so for wide "
    "heads the softmax saturates and nearly all weight lands on one key. The gradient "
    "then flows back through that key only, and the other keys stop learning."
)
#: The same answer with its sentences swapped and a few words changed.
WRITTEN_COPY = (
    "The gradient then flows back through that key alone, and the other keys stop "
    "learning. Without the scale the dot products grow like the square root of d_k, so for "
    "wide heads the softmax saturates and nearly all weight lands on a single key."
)
WRITTEN_OWN = (
    "Dividing by d_k makes the scores shrink as the heads get wider, until the softmax is "
    "almost uniform and attention averages every value; the model must then grow its "
    "weights a lot to focus, which takes many steps."
)


def test_a_written_answer_shared_with_its_sentences_swapped_is_listed(course):
    for student, text in (("erin5", WRITTEN), ("frank6", WRITTEN_COPY), ("gina3", WRITTEN_OWN)):
        folder = course / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(submission({"why_sqrt_dk": text}), folder / f"{AID}.ipynb")
    result = similarity.find_similar(course, [AID])
    assert ("why_sqrt_dk", frozenset({"erin5", "frank6"})) in listed(result), listed(result)
    assert [ex for ex, _ in listed(result)].count("why_sqrt_dk") == 1, listed(result)


#: A copy of annie7's sdpa_np padded with lines of its own (checks and a log), and a copy
#: of its first half, finished differently: each shares little of the pair's whole.
PADDED_SDPA_NP = SHARED_SDPA_NP.replace(
    "    return result, probs\n",
    """    assert result.shape[-1] == V.shape[-1], "value width"
    assert probs.shape[-2] == Q.shape[-2], "one row per query"
    checks = {"finite": bool(np.isfinite(result).all()), "rows": probs.sum(-1).round(6)}
    history = [checks, Q.shape, K.shape, V.shape]
    log_lines = ["shape %s" % (item,) for item in history]
    summary = "; ".join(log_lines).upper().replace("SHAPE", "dims")
    unused = np.linalg.norm(result.reshape(-1)) / max(1, result.size) + len(summary)
    spare = np.sort(probs.reshape(-1))[::-1][: int(unused) % 3 + 1].tolist()
    trail = {"spare": spare, "summary": summary[:40], "norm": float(unused)}
    return result, probs
""",
)
HALF_SDPA_NP = """def sdpa_np(Q, K, V, mask=None):
    scale = 1.0 / np.sqrt(K.shape[-1])
    logits = np.einsum("...qd,...kd->...qk", Q, K) * scale
    fill = np.full_like(logits, -1e30)
    if mask is not None:
        logits = np.where(np.asarray(mask, dtype=bool), logits, fill)
    return softmax_np(logits) @ V, softmax_np(logits)
"""


@pytest.mark.parametrize("copier", ["padder", "halfer"])
def test_a_copy_padded_with_its_own_lines_or_copied_in_part_is_listed(course, copier):
    """One copier at a time: with annie7 and bobby8 that makes three sharing those lines (a
    fourth would make them what many write, discounted)."""
    code = {"padder": PADDED_SDPA_NP, "halfer": HALF_SDPA_NP}[copier]
    folder = course / "submitted" / copier / AID
    folder.mkdir(parents=True)
    nbformat.write(submission({"sdpa_np": code}), folder / f"{AID}.ipynb")
    result = similarity.find_similar(course, [AID])
    pairs = {frozenset((p.a.student, p.b.student)): p for p in result.pairs}
    pair = pairs.get(frozenset(("annie7", copier)))
    assert pair is not None, listed(result)
    # the overlap of the whole alone would not list it; containment does
    assert pair.similarity < similarity.THRESHOLD, pair.similarity
    assert pair.contained >= similarity.CONTAINED, pair.contained
    # the first pair is still there, and independent answers and the short common
    # softmax stay unlisted
    assert frozenset(("annie7", "bobby8")) in pairs, listed(result)
    indies = {f"indie{i}" for i in range(4)}
    assert not [p for p in result.pairs if {p.a.student, p.b.student} & indies]
    assert all(p.exercise == "sdpa_np" for p in result.pairs), listed(result)
