"""Student ids: what the course accepts as one (at collect, at grade, in formgrader).

A student id names folders (``submitted/<id>/``), the gradebook's rows, the exchange's
inbound entries (``<id>+<assignment>+<timestamp>``) and formgrader's pages and URLs. One
made of markup (``s"><img src=x onerror=...>``) would run in formgrader where nbgrader
prints it unescaped; one with ``+`` would be misread in the exchange; ``..`` would be a
path. The course accepts only ids that match :data:`STUDENT_ID` (a Unix or JupyterHub
user name, or an e-mail address, passes) and refuses every other one with a message
naming the id and the pattern: ``nbgrader collect`` leaves its submission in the exchange
(attention_ref/course/exchange.py), ``make grade`` does not grade it
(attention_ref/course/grading.py), formgrader answers 404 for it
(attention_ref/course/formgrader.py).

Every other way to grade (``nbgrader autograde``, formgrader's button) refuses it too:
:class:`CheckStudentId` is the first of autograde's preprocessors (nbgrader_config.py).

This module imports nothing beyond the standard library and nbconvert.
"""

from __future__ import annotations

import re
import sys

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

#: Letters, digits, ``_ . @ -``; a letter, digit or ``_`` first; at most 64 characters.
STUDENT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
PATTERN_WORDS = (
    f"{STUDENT_ID.pattern} (letters, digits, '_', '.', '@', '-'; a letter, digit or '_' "
    "first; at most 64 characters)"
)


def is_valid(student: object) -> bool:
    """Whether ``student`` is a student id the course accepts."""
    return isinstance(student, str) and STUDENT_ID.fullmatch(student) is not None


def refusal(student: object) -> str | None:
    """Why ``student`` is refused as a student id (a message naming it and the pattern),
    or None if it is accepted."""
    if is_valid(student):
        return None
    return f"student id {student!r} is refused: a student id must match {PATTERN_WORDS}"


def accepted(submissions: dict[str, list[str]], out=None) -> dict[str, list[str]]:
    """``{assignment: [student, ...]}`` without the students whose id is refused, each
    refusal printed once to ``out`` (stderr) with the folder it leaves ungraded."""
    out = out or sys.stderr
    kept: dict[str, list[str]] = {}
    told: set[str] = set()
    for aid, names in submissions.items():
        for student in names:
            why = refusal(student)
            if why is None:
                kept.setdefault(aid, []).append(student)
            elif student not in told:
                told.add(student)
                print(f"error: submitted/{student!r}/ is not graded: {why}", file=out)
    return kept


class StudentIdError(ValueError):
    """A student id that is not one (:func:`refusal` says why)."""


class CheckStudentId(Preprocessor):
    """Refuse to autograde the notebook of a student whose id is refused (the first of
    ``Autograde.sanitize_preprocessors``): nbgrader reports the error and grades nothing."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default

    def preprocess(self, nb, resources):
        student = ((resources or {}).get("nbgrader") or {}).get("student")
        why = refusal(student) if student is not None else None
        if why:
            raise StudentIdError(why)
        return nb, resources
