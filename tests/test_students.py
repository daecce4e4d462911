"""Student ids: a pattern, checked at collect and at grade (attention_ref/course/students.py).

Formgrader's pages that show ids are tested in Chromium in tests/test_inert_views.py.
"""

from __future__ import annotations

import io
import os

import pytest

from attention_ref.course import exchange, students

import injections

AID = "01_dot_product_attention"

ACCEPTED = ["s0042", "jane.doe", "jdoe@uni.example.edu", "o-brien_2", "_svc", "A" * 64]
REFUSED = [
    injections.BAD_STUDENT,
    's"><b>x',
    "..",
    ".hidden",
    "-rf",
    "a+b",  # the exchange's separator
    "a/b",
    "a b",
    "é",
    "",
    "A" * 65,
    "x\n",
]


@pytest.mark.parametrize("student", ACCEPTED)
def test_ordinary_ids_are_accepted(student):
    assert students.is_valid(student) and students.refusal(student) is None


@pytest.mark.parametrize("student", REFUSED)
def test_other_ids_are_refused_with_a_message_naming_the_id_and_the_pattern(student):
    why = students.refusal(student)
    assert not students.is_valid(student) and why
    assert repr(student) in why and students.STUDENT_ID.pattern in why


def test_make_grade_leaves_a_refused_id_ungraded_and_says_why():
    found = {AID: ["s0042", injections.BAD_STUDENT], "02_masking": [injections.BAD_STUDENT]}
    out = io.StringIO()
    assert students.accepted(found, out) == {AID: ["s0042"]}
    said = out.getvalue().splitlines()
    assert len(said) == 1 and "is not graded" in said[0] and "is refused" in said[0], said


def test_collect_leaves_an_entry_of_a_refused_id_in_the_exchange(tmp_path, monkeypatch):
    """An inbound entry owned by a user whose name is not a student id (a hub that
    allows any name) is not collected: the report names the id and the pattern."""
    name = 'a"><img src=x onerror=x()>'
    entry = tmp_path / f"{name}+{AID}+2026-01-05 12:00:00.000000 UTC"
    entry.mkdir()
    monkeypatch.setattr(exchange, "_user", lambda uid: name if uid == os.getuid() else "?")
    rec, owner, why = exchange.inbound_entry(str(entry), AID)
    assert rec is None and owner == name
    assert why == students.refusal(name)
    monkeypatch.setattr(exchange, "_user", lambda uid: "s0042")  # the control
    ok = tmp_path / f"s0042+{AID}+2026-01-05 12:00:00.000000 UTC"
    ok.mkdir()
    rec, owner, why = exchange.inbound_entry(str(ok), AID)
    assert why is None and rec["username"] == "s0042"


def test_autograde_refuses_the_notebook_of_a_refused_id():
    """``nbgrader autograde`` and formgrader's button: a sanitize preprocessor of the
    course's configuration, before anything reads the notebook's cells but the repair of
    its format, refuses a student id that is not one."""
    import nbformat
    from traitlets.config.loader import PyFileConfigLoader

    from course_tools import ROOT

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    names = [p.__name__ for p in config.Autograde.sanitize_preprocessors]
    assert names.index("CheckStudentId") <= 1 and names[0] in ("CheckStudentId", "Repair")
    first = students.CheckStudentId
    nb = nbformat.v4.new_notebook()
    with pytest.raises(students.StudentIdError, match="is refused"):
        first().preprocess(nb, {"nbgrader": {"student": injections.BAD_STUDENT}})
    assert first().preprocess(nb, {"nbgrader": {"student": "s0042"}})[0] is nb
