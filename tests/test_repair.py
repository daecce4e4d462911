"""A notebook as JupyterLab writes it is graded on its answers (attention_ref/course/repair.py).

Unit tests: each repair on the released notebook of 01_dot_product_attention, edited as a
student's JupyterLab edits it, against the instructor's source; each repaired notebook
passes the validation that refused it (nbformat's, as nbconvert runs it after every
preprocessor, and nbgrader's metadata check), and a control shows that the unrepaired one
did not. End to end: a class of two graded by `make grade`'s code path, one submission
carrying every one of these problems at once (it earns exactly its answers' points, its
feedback and the report list the repairs) and one that is not a notebook (not graded, with
the reason, and left blank in grades.csv).
"""

from __future__ import annotations

import copy
import csv
import json
import re
import subprocess
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.nbgraderformat import MetadataValidator, ValidationError

from attention_ref.course import repair as rp
from attention_ref.course.plumbing import nbgrader
from attention_ref.trust.inert import make_inert

from course_tools import (
    ROOT,
    make_course,
    release_path,
    run_course,
    solution_path,
    strip_solution_markers,
)

AID = "01_dot_product_attention"
#: A 1x1 PNG, base64 (what JupyterLab stores for a pasted image).
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def source():
    return nbformat.read(solution_path(AID), as_version=4)


@pytest.fixture
def released():
    return nbformat.read(release_path(AID), as_version=4)


def gid(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if gid(c) == grade_id)


def graded_ids(nb) -> list[str]:
    return [gid(c) for c in nb.cells if gid(c)]


def problem(nb) -> str:
    return rp.validation_problem(nb)


def test_a_released_notebook_needs_no_repair_in_either_nbformat(source, released):
    fixed, notes = rp.repair(released, source)
    assert notes == []
    assert [(c.cell_type, c.source, c.metadata, c.get("id")) for c in fixed.cells] == [
        (c.cell_type, c.source, c.metadata, c.get("id")) for c in released.cells
    ]
    old = copy.deepcopy(released)  # nbformat 4.4, as an older Jupyter writes it: no ids
    old.nbformat_minor = 4
    for c in old.cells:
        del c["id"]
    fixed, notes = rp.repair(old, source)
    assert notes == [] and fixed.nbformat_minor == 4
    assert not any("id" in c for c in fixed.cells)
    assert problem(fixed) == ""


def test_a_pasted_image_is_embedded_and_renders_inert(source, released):
    from nbconvert import HTMLExporter

    cell = released.cells[index(released, "why_sqrt_dk")]
    # "my%20plot.png": a file's name, escaped by JupyterLab
    cell.source = (
        "The variance grows with d_k, see:\n\n![image.png](attachment:image.png)\n"
        "and ![a plot](attachment:my%20plot.png)\n"
    )
    cell["attachments"] = {"image.png": {"image/png": PNG}, "my plot.png": {"image/gif": PNG}}
    trusted = frozenset(c.source for c in source.cells if c.cell_type == "markdown")
    # The control: as JupyterLab wrote it, the grading views' inert markdown fails on it.
    with pytest.raises(Exception, match="missing attachment"):
        make_inert(copy.deepcopy(released), trusted)
    fixed, notes = rp.repair(released, source)
    assert notes == []  # nothing was wrong: the image is kept
    answer = fixed.cells[index(fixed, "why_sqrt_dk")]
    assert f"![image.png](data:image/png;base64,{PNG})" in answer.source
    assert f"![a plot](data:image/gif;base64,{PNG})" in answer.source
    assert "attachments" not in answer
    make_inert(fixed, trusted)
    html, _ = HTMLExporter().from_notebook_node(fixed)
    assert f'src="data:image/png;base64,{PNG}"' in html


def test_a_missing_or_foreign_attachment_is_not_shown_and_said(source, released):
    cell = released.cells[index(released, "why_sqrt_dk")]
    cell.source = "![a](attachment:gone.png) and ![b](attachment:script.svg) text kept"
    cell["attachments"] = {"script.svg": {"image/svg+xml": "<svg onload='alert(1)'/>"}}
    fixed, notes = rp.repair(released, source)
    answer = fixed.cells[index(fixed, "why_sqrt_dk")]
    assert answer.source == f"![a]({rp.NOT_SHOWN}) and ![b]({rp.NOT_SHOWN}) text kept"
    assert "attachment:" not in answer.source and "svg" not in json.dumps(answer)
    assert notes == [
        "cell 25 (why_sqrt_dk): 2 attachment(s) it shows were missing or not a PNG, JPEG "
        "or GIF image: not shown (the rest of the cell is kept)"
    ]


def test_a_copied_test_cell_is_ignored_and_the_instructors_is_graded(source, released):
    original = index(released, "test_softmax_np")
    copy_below = copy.deepcopy(released.cells[original])
    copy_below["id"] = "0b7a2c1e-6d0f-4b9e-9f3a-5a1d2c3b4e5f"  # JupyterLab's id for a paste
    copy_above = copy.deepcopy(copy_below)
    copy_above["id"] = "9f3a5a1d-2c3b-4e5f-0b7a-2c1e6d0f4b9e"
    released.cells.insert(original + 4, copy_below)  # further down, among other cells
    released.cells.insert(original - 1, copy_above)  # above the answer, to run it early
    assert "Duplicate grade id" in problem(released)  # the control: nbgrader refuses it
    fixed, notes = rp.repair(released, source)
    assert problem(fixed) == ""
    assert graded_ids(fixed) == graded_ids(source)  # each graded once
    kept = fixed.cells[index(fixed, "test_softmax_np")]
    assert kept.id == "test_softmax_np"  # the released cell, in its place
    assert fixed.cells[index(fixed, "test_softmax_np") - 1].metadata["nbgrader"]["grade_id"] == (
        "softmax_np"
    )
    copies = [c for c in fixed.cells if c.get("id") in (copy_below.id, copy_above.id)]
    assert len(copies) == 2 and all("nbgrader" not in c.metadata for c in copies)
    assert copies[0].source == copy_above.source  # kept, as an ordinary cell
    assert notes == [
        "cell 8 was a copy of the instructor's cell test_softmax_np: kept as an ordinary "
        "cell, not graded (cell 10 (test_softmax_np) is graded)",
        "cell 14 was a copy of the instructor's cell test_softmax_np: kept as an ordinary "
        "cell, not graded (cell 10 (test_softmax_np) is graded)",
    ]


def test_tags_with_commas_blanks_and_repeats_are_tidied(source, released):
    released.cells[3].metadata["tags"] = ["training, slow", "slow", " ", 7]
    assert "does not match" in problem(released)  # the control: nbformat refuses a comma
    fixed, notes = rp.repair(released, source)
    assert fixed.cells[3].metadata["tags"] == ["training", "slow"]
    assert problem(fixed) == ""
    assert notes == ["cell 4: its tags were tidied (commas split them, blanks and repeats removed)"]


def test_invalid_missing_and_repeated_cell_ids_are_replaced(source, released):
    before = [c.id for c in released.cells]
    released.cells[2]["id"] = "not valid!"
    released.cells[5]["id"] = released.cells[4]["id"]
    del released.cells[6]["id"]
    assert problem(released)  # the control
    fixed, notes = rp.repair(released, source)
    ids = [c.id for c in fixed.cells]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)
    assert [i for k, i in enumerate(ids) if k not in (2, 5, 6)] == [
        i for k, i in enumerate(before) if k not in (2, 5, 6)
    ]
    assert problem(fixed) == ""
    assert notes == ["3 cell id(s) were missing, not valid or repeated: replaced by new ones"]


def test_an_unknown_grade_id_and_grading_metadata_on_a_students_cell_are_removed(source, released):
    released.cells[10].metadata["nbgrader"] = {
        "grade": True,
        "grade_id": "bonus<img src=x onerror=alert(1)>",  # never repeated in the notes
        "points": 50,
        "locked": False,
        "solution": False,
        "schema_version": 3,
    }
    released.cells[12].metadata["nbgrader"] = {"grade": True, "points": 5}  # no grade id
    fixed, notes = rp.repair(released, source)
    assert "nbgrader" not in fixed.cells[10].metadata
    assert "nbgrader" not in fixed.cells[12].metadata
    assert graded_ids(fixed) == graded_ids(source)
    assert notes == [
        "cell 11: its grade id is not one of the assignment's: its grading metadata was "
        "removed (only the instructor's cells are graded)",
        "cell 13: grading metadata on a cell that is not the instructor's was removed (only "
        "the instructor's cells are graded)",
    ]


def test_comment_and_score_in_nbgrader_metadata_are_dropped(source, released):
    meta = released.cells[index(released, "test_sdpa_np")].metadata["nbgrader"]
    meta.update(comment="great", score=3)
    with pytest.raises(ValidationError):  # the control: nbgrader's check refuses them
        MetadataValidator().validate_nb(released)
    fixed, notes = rp.repair(released, source)
    assert set(fixed.cells[index(fixed, "test_sdpa_np")].metadata["nbgrader"]) <= set(
        rp.NBGRADER_KEYS
    )
    assert problem(fixed) == ""
    assert notes == [
        "cell 16 (test_sdpa_np): grading metadata that only the instructor or the gradebook "
        "sets (comment, score) was removed"
    ]


def test_an_altered_instructor_cell_gets_the_instructors_back(source, released):
    i = index(released, "test_sdpa")
    rel = copy.deepcopy(released)
    cell = released.cells[i]
    cell.cell_type = "markdown"
    del cell["outputs"], cell["execution_count"]
    cell.source = "check skipped"
    cell.metadata["nbgrader"]["points"] = 20
    fixed, notes = rp.repair(released, source)
    mine = fixed.cells[i]
    theirs = source.cells[index(source, "test_sdpa")]
    released_text = rel.cells[i].source  # its hidden tests: nbgrader's OverwriteCells adds them
    assert (mine.cell_type, mine.source, mine.outputs) == ("code", released_text, [])
    assert mine.metadata["nbgrader"]["points"] == theirs.metadata["nbgrader"]["points"]
    assert notes == [
        "cell 19 (test_sdpa): the instructor's cell test_sdpa had its cell type and grading "
        "settings and code changed: the instructor's were restored"
    ]


def test_deleted_instructor_cells_are_put_back_in_place(source, released):
    rel = copy.deepcopy(released)
    del released.cells[index(released, "test_sdpa_np")]
    del released.cells[index(released, "sdpa")]
    fixed, notes = rp.repair(released, source)
    assert graded_ids(fixed) == graded_ids(source)
    # as released: the test cell's code (nbgrader adds its hidden tests), the answer's stub
    assert [c.source for c in fixed.cells] == [c.source for c in rel.cells]
    assert notes == [
        "the instructor's cell test_sdpa_np was missing: put back after cell 15 (sdpa_np)",
        "the instructor's cell sdpa was missing: put back after cell 16 (with the stub the "
        "notebook was released with)",
    ]
    assert problem(fixed) == ""


def test_a_test_cell_moved_above_its_answer_is_moved_back_below_it(source, released):
    test = released.cells.pop(index(released, "test_sdpa"))
    released.cells.insert(index(released, "sdpa"), test)  # dragged above its answer
    released.cells.append(released.cells.pop(index(released, "test_softmax_np")))  # to the end
    fixed, notes = rp.repair(released, source)
    assert index(fixed, "test_sdpa") == index(fixed, "sdpa") + 1
    assert index(fixed, "test_softmax_np") == len(fixed.cells) - 1  # below its answer: stays
    assert notes == [
        "cell 17 (test_sdpa) stood above the answer it checks, cell 18 (sdpa): moved right below it"
    ]


def test_nbformat_44_with_problems_stays_44(source, released):
    released.nbformat_minor = 4
    for c in released.cells:
        del c["id"]
    released.cells[3].metadata["tags"] = ["a,b"]
    released.cells.append(copy.deepcopy(released.cells[index(released, "test_sdpa")]))
    fixed, notes = rp.repair(released, source)
    assert fixed.nbformat_minor == 4 and not any("id" in c for c in fixed.cells)
    assert problem(fixed) == "" and len(notes) == 2


def test_a_notebook_that_cannot_be_read_says_why(tmp_path, source, released):
    cases = {
        "truncated": ('{"cells": [', "is not a notebook: it is not JSON"),
        "a list": ("[1, 2]", "JSON without a list of cells"),
        "format 5": (
            json.dumps({"nbformat": 5, "nbformat_minor": 0, "cells": [], "metadata": {}}),
            "a notebook of format 5; the course grades nbformat 4",
        ),
    }
    for name, (text, reason) in cases.items():
        path = tmp_path / f"{name}.ipynb"
        path.write_text(text)
        with pytest.raises(rp.UnreadableNotebookError, match=reason):
            rp.read_notebook(path)
    # an nbformat 3 notebook is read (converted), as nbformat reads it
    old = rp.reads_notebook(nbformat.writes(released, version=3))
    _, notes = rp.repair(old, source)
    assert graded_ids(old) == graded_ids(source) and notes == []
    # submission_repairs names the notebook; make grade's hook turns it into a reason
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / f"{AID}.ipynb").write_text('{"cells": [')
    notes: list[str] = []
    why = rp.note_repairs(folder, solution_path(AID).parent, notes)
    assert why.startswith(f"its notebook cannot be read: {AID}.ipynb is not a notebook")


def test_a_repaired_notebook_is_repaired_the_same_way_and_once(source, released):
    released.cells[3].metadata["tags"] = ["a,b"]
    released.cells[4]["id"] = "bad id"
    one, notes = rp.repair(released, source)
    two, again = rp.repair(released, source)
    assert nbformat.writes(one) == nbformat.writes(two) and notes == again
    rp.add_note(one, notes)
    assert one.cells[-1].metadata[rp.NOTE_MARK] and problem(one) == ""
    assert all(n in one.cells[-1].source for n in notes)
    three, none = rp.repair(one, source)  # a graded notebook submitted again
    assert none == [] and not any(rp.NOTE_MARK in c.metadata for c in three.cells)


# ----------------------------------------------------------------------------- in nbgrader
def jupyterlab_edits(nb, minor: int):
    """Some of JupyterLab's edits on ``nb``, saved as nbformat 4.``minor``."""
    nb.cells[3].metadata["tags"] = ["draft, mine"]
    nb.cells.append(copy.deepcopy(nb.cells[index(nb, "test_sdpa")]))
    nb.cells[index(nb, "test_sdpa_np")].metadata["nbgrader"]["score"] = 3
    if minor == 4:
        nb.nbformat_minor = 4
        for c in nb.cells:
            del c["id"]
    else:
        nb.cells[5]["id"] = "not valid!"
    return nb


@pytest.mark.parametrize("minor", [4, 5])
def test_nbconvert_takes_the_repaired_notebook_in_either_nbformat(released, minor):
    """Repair as nbgrader runs it, in nbconvert's exporter, which validates the notebook
    after each preprocessor (the first included): the control, a preprocessor that changes
    nothing, fails on the notebook as JupyterLab wrote it; Repair's output passes."""
    from nbconvert.exporters import NotebookExporter
    from nbconvert.preprocessors import Preprocessor
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(solution_path(AID).parents[2])
    config.CourseDirectory.source_directory = "solutions"
    resources = {"nbgrader": {"assignment": AID, "notebook": AID}}
    nb = jupyterlab_edits(released, minor)
    control = NotebookExporter(config=config)
    control._preprocessors = []  # as nbgrader's converters do

    class Nothing(Preprocessor):
        def preprocess(self, nb, resources):
            return nb, resources

    control.register_preprocessor(Nothing(), enabled=True)
    with pytest.raises(nbformat.ValidationError):
        control.from_notebook_node(copy.deepcopy(nb), copy.deepcopy(resources))
    exporter = NotebookExporter(config=config)
    exporter._preprocessors = []
    exporter.register_preprocessor(rp.Repair(config=config), enabled=True)
    out, _ = exporter.from_notebook_node(nb, resources)
    graded = nbformat.reads(out, as_version=4)
    assert graded.nbformat_minor == minor and problem(graded) == ""
    assert (minor == 5) == all("id" in c for c in graded.cells)
    assert graded.cells[-1].metadata[rp.NOTE_MARK]
    assert "copy of the instructor's cell test_sdpa" in graded.cells[-1].source


def test_the_course_repairs_first():
    """nbconvert validates after the first preprocessor too: Repair must come before any."""
    code = (
        "from traitlets.config.loader import PyFileConfigLoader\n"
        f"c = PyFileConfigLoader('nbgrader_config.py', path={str(ROOT)!r}).load_config()\n"
        "print([p.__name__ for p in c.Autograde.sanitize_preprocessors])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.splitlines()[-1].startswith("['Repair', "), out


# ----------------------------------------------------------------------------- end to end
def jupyterlab_submission(source, released):
    """The released notebook, solved (but for sdpa_np, which misses the 1/sqrt(d_k)
    scale: test_sdpa_np fails), then edited as in JupyterLab: a pasted image in the
    written answer, a copied test cell, a deleted test cell, a test cell dragged above its
    answer, a comma in a tag, an invalid cell id, an unknown grade id, comment and score
    in a test cell's nbgrader metadata."""
    nb = copy.deepcopy(released)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code":
            c.source = strip_solution_markers(source.cells[index(source, gid(c))].source)
    wrong = nb.cells[index(nb, "sdpa_np")]
    wrong.source = wrong.source.replace(" / np.sqrt(d_k)", "")
    assert "sqrt" not in wrong.source
    written = nb.cells[index(nb, "why_sqrt_dk")]
    written.source = "Scores grow like sqrt(d_k):\n\n![image.png](attachment:image.png)\n"
    written["attachments"] = {"image.png": {"image/png": PNG}}
    copied = copy.deepcopy(nb.cells[index(nb, "test_softmax_np")])
    copied["id"] = "5e1f0c2a-77aa-4bde-9b1c-0f3e2d4c5b6a"
    nb.cells.insert(index(nb, "test_softmax_np") + 3, copied)
    del nb.cells[index(nb, "test_sdpa_np")]  # deleted: put back (it fails the answer)
    test = nb.cells.pop(index(nb, "test_sdpa"))
    nb.cells.insert(index(nb, "sdpa"), test)  # above its answer: it earns 2 once below it
    nb.cells[3].metadata["tags"] = ["my notes, draft"]
    nb.cells[5]["id"] = "cell 5 (mine)"
    nb.cells[6].metadata["nbgrader"] = {"grade": True, "grade_id": "extra", "points": 9}
    nb.cells[index(nb, "test_sdpa")].metadata["nbgrader"].update(comment="A+", score=2)
    return nb


@pytest.mark.grading
def test_a_jupyterlab_notebook_is_graded_on_its_answers(tmp_path, source):
    released = nbformat.read(release_path(AID), as_version=4)
    course = make_course(tmp_path / "course", [AID])
    lab = course / "submitted" / "lab" / AID
    lab.mkdir(parents=True)
    nbformat.write(jupyterlab_submission(source, released), lab / f"{AID}.ipynb")
    broken = course / "submitted" / "broken" / AID
    broken.mkdir(parents=True)
    (broken / f"{AID}.ipynb").write_text('{"cells": [{"cell_type": "code", "source": "x = ')
    defaults = ("NBGRADER_CELL_TIMEOUT", "NBGRADER_TRAINING_TIMEOUT", "NBGRADER_TIMEOUT_AFTER")
    proc = run_course(course, "grade", "--jobs", "2", env_extra=dict.fromkeys(defaults, ""))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # one submission not graded
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_submission_notebook(AID, AID, "lab")
        # softmax_np 2 (its copied test cell not graded) + sdpa_np 0 (wrong; its deleted
        # test cell put back) + sdpa 2 (its test cell back below it) of 7
        assert (nb.code_score, nb.max_code_score) == (4.0, 7.0), out
        assert {g.name for g in nb.grades} == {
            gid(c) for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")
        }
    with open(course / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(rows["lab"]["score"]) == 4.0 and rows["broken"]["score"] == "", rows
    report = proc.stdout[proc.stdout.index("Grading report") :]
    lab_lines = report[report.index(" lab ") : report.index("submission(s) graded")]
    for said in (
        "copy of the instructor's cell test_softmax_np",
        "the instructor's cell test_sdpa_np was missing: put back",
        "(test_sdpa) stood above the answer it checks",
        "cell 4: its tags were tidied",
        "cell id(s) were missing, not valid or repeated",
        "cell 7: its grade id is not one of the assignment's",
        "(test_sdpa): grading metadata that only the instructor or the gradebook sets "
        "(comment, score) was removed",
    ):
        assert said in lab_lines, report
    assert "attachment" not in lab_lines and "kernel" not in lab_lines, report
    broken_lines = report[report.index(" broken ") : report.index(" lab ")]
    assert "not graded: its notebook cannot be read" in broken_lines, report
    assert "is not a notebook: it is not JSON" in broken_lines, report
    assert "no single cell was found" not in report, report
    # the graded notebook and its feedback: the image shown, the repairs listed
    graded = nbformat.read(course / "autograded" / "lab" / AID / f"{AID}.ipynb", as_version=4)
    assert graded.cells[-1].metadata.get(rp.NOTE_MARK), graded.cells[-1]
    assert "put back" in graded.cells[-1].source
    assert f"data:image/png;base64,{PNG}" in graded.cells[index(graded, "why_sqrt_dk")].source
    nbgrader(course, "generate_feedback", AID, "--student", "lab")
    html = (course / "feedback" / "lab" / AID / f"{AID}.html").read_text()
    assert "Grading note" in html and "put back after cell 16 (sdpa_np)" in html
    assert f'src="data:image/png;base64,{PNG}"' in html
