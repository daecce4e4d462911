"""A notebook as JupyterLab writes it, graded on its answers: what grading repairs first.

Students edit their notebooks in JupyterLab, and JupyterLab writes things that nbgrader
refuses whole (0 points for every answer): an image pasted into a written answer (a cell
``attachments`` entry shown as ``![](attachment:image.png)``), a copied test cell (its
``grade_id`` twice), a tag typed with a comma, a cell id that is not valid, a ``grade_id``
the assignment does not have, keys of the gradebook's (``comment``, ``score``) in a cell's
nbgrader metadata. :func:`repair` mends a submitted notebook against the instructor's
source notebook before nbgrader reads it, so that every answer earns what it earns:

- **the instructor's cells** (by ``grade_id``) are the instructor's: one that is missing is
  put back where the source has it, as it was released (a test cell with its code, an
  answer cell with its stub); one whose cell type or grading settings were changed gets
  the instructor's again, and a test cell whose code was edited gets the released code
  (nbgrader's ``OverwriteCells`` then adds its hidden tests, from the gradebook);
- an instructor's test cell moved above the answer it checks is moved back below it
  (graded top to bottom, it would run before the answer);
- **a copy** of an instructor's cell (its ``grade_id`` a second time) is an ordinary cell:
  its grading metadata is removed, so it is not graded twice. The instructor's cell is the
  occurrence that stands where the source puts it, among the other graded cells;
- a ``grade_id`` the assignment does not have, and nbgrader metadata on any other cell,
  are removed (only the instructor's cells are graded); keys of nbgrader metadata that
  only the instructor or the gradebook set (``comment``, ``score``...) are dropped;
- **tags** are tidied (a tag with commas split in several, blanks and repeats removed;
  :class:`~attention_ref.trust.trusted.SourceTags` then gives every cell the
  instructor's own);
- **cell ids** that are missing (nbformat 4.5), invalid or repeated get valid unique ones;
  an nbformat 4.4 notebook without ids stays one;
- **attachments**: each pasted image (PNG, JPEG or GIF, base64) is embedded in the
  cell's markdown as a ``data:`` image, which nbconvert, formgrader and the feedback show
  and the course's inert views keep (:mod:`attention_ref.trust.inert`); an attachment
  that is missing or not such an image becomes a link to nothing (its alternative text
  stays);
- anything else the notebook format does not allow in a cell (an unknown key, metadata of
  the wrong type, an invalid output) is removed, and a cell of an unknown type becomes a
  raw cell.

The repairs are listed in plain words (:func:`repair` returns them); the graded notebook
gets them as a last markdown cell (so the feedback and formgrader show them), and ``make
grade``'s report lists them (:func:`submission_repairs`). A notebook that cannot be read
at all (not JSON, not of nbformat 4 or 3, still invalid once repaired) raises
:class:`UnreadableNotebookError`, whose message is the real reason: it is reported as not
graded, never as 0.

:class:`Repair` runs it inside nbgrader, first among the autograde's sanitising
preprocessors (nbgrader_config.py), wherever a submission is autograded: ``make grade``'s
workers and its writing of the gradebook, ``nbgrader autograde``, formgrader's button.

This module imports nothing of the course's package and no PyTorch (nbgrader_config.py
imports it).
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

#: The keys nbgrader's metadata (schema 3) has; any other is dropped.
NBGRADER_KEYS = (
    "schema_version",
    "grade",
    "locked",
    "solution",
    "task",
    "grade_id",
    "points",
    "checksum",
    "cell_type",
)
#: Keys compared when telling whether an instructor cell's grading settings were changed.
SETTINGS = ("grade", "solution", "locked", "task", "points")
#: The keys a cell of each type may have (nbformat 4.5).
CELL_KEYS = {
    "code": {"id", "cell_type", "metadata", "source", "outputs", "execution_count"},
    "markdown": {"id", "cell_type", "metadata", "source", "attachments"},
    "raw": {"id", "cell_type", "metadata", "source", "attachments"},
}
CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")
#: A reference to a cell attachment in markdown: ``attachment:NAME``.
ATTACHMENT_REF = re.compile(r"attachment:([^\s()<>\"'\]]+)")
#: Images embedded as ``data:`` URLs (what the inert views keep).
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif")
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+\Z")
WHITESPACE = re.compile(r"\s")
#: Where an attachment that cannot be shown pointed to once repaired.
NOT_SHOWN = "#attachment-not-shown"
#: The last cell of a repaired notebook, which lists the repairs.
NOTE_MARK = "attention_ref_repairs"
NOTE_TITLE = (
    "**Grading note.** Before this notebook was graded, the grader repaired what nbgrader "
    "could not read as it was (your answers were graded as you wrote them):"
)


class UnreadableNotebookError(ValueError):
    """A submitted notebook that cannot be read at all; the message says why, in words an
    instructor can act on."""


# ----------------------------------------------------------------------------- helpers
def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def _gid(cell: Any) -> str:
    meta = cell.get("metadata", {}).get("nbgrader") if isinstance(cell, dict) else None
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return gid if isinstance(gid, str) else ""


def _at(cells: list, cell: Any) -> int:
    """The index of ``cell`` itself in ``cells`` (not of a cell equal to it)."""
    return next(i for i, c in enumerate(cells) if c is cell)


def _node(value: Any) -> Any:
    return nbformat.from_dict(copy.deepcopy(value))


def _release_source(cell: Any) -> str:
    """The text the student was given for an instructor's cell: its solution regions
    replaced by nbgrader's stubs and its hidden tests removed, as ``nbgrader
    generate_assignment`` does."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    c = _node(cell)
    ClearSolutions().preprocess_cell(c, {"language": "python"}, 0)
    ClearHiddenTests().preprocess_cell(c, {}, 0)
    return c.source


def _is_note(cell: Any) -> bool:
    return isinstance(cell, dict) and bool(cell.get("metadata", {}).get(NOTE_MARK))


def read_notebook(path: Path) -> Any:
    """The notebook at ``path`` as nbformat 4, not validated; raises
    :class:`UnreadableNotebookError` with the reason when it cannot be one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UnreadableNotebookError(f"{path.name} is not text (UTF-8): {err.reason}") from err
    return reads_notebook(text, path.name)


def reads_notebook(text: str, name: str = "the notebook") -> Any:
    """:func:`read_notebook` of a notebook's text."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise UnreadableNotebookError(
            f"{name} is not a notebook: it is not JSON ({err}); the file may have been "
            "saved from a text editor or cut short"
        ) from err
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        raise UnreadableNotebookError(
            f"{name} is not a notebook: it is JSON without a list of cells"
        )
    version = raw.get("nbformat")
    if version not in (3, 4):
        raise UnreadableNotebookError(
            f"{name} is a notebook of format {version!r}; the course grades nbformat 4 "
            "notebooks (as JupyterLab and Jupyter Notebook save them)"
        )
    if version == 3:
        try:
            return nbformat.convert(nbformat.from_dict(raw), 4)
        except Exception as err:  # nbformat's converter on a broken old notebook
            raise UnreadableNotebookError(
                f"{name} is an nbformat 3 notebook that could not be converted to nbformat 4 "
                f"({type(err).__name__}: {err})"
            ) from err
    return nbformat.from_dict(raw)


# ----------------------------------------------------------------------------- the repair
class _Repairer:
    """One repair of one notebook against its source (:func:`repair`)."""

    def __init__(self, nb: Any, source: Any) -> None:
        self.nb = nb
        self.source = source
        self.notes: list[str] = []
        self.number: dict[int, int] = {}  # id(cell): its number in the submitted notebook
        self.known = {_gid(c) for c in source.cells} - {""}

    def name(self, cell: Any) -> str:
        """``cell N`` (its number in the submitted notebook), with its grade id when it is
        the instructor's (never a text of the student's: the notes are shown in the
        feedback and the report)."""
        n = self.number.get(id(cell))
        gid = _gid(cell) if _gid(cell) in self.known else ""
        where = f"cell {n}" if n else "a cell"
        return where + (f" ({gid})" if gid else "")

    def run(self) -> tuple[Any, list[str]]:
        nb = self.nb
        if not isinstance(nb.get("metadata"), dict):
            nb["metadata"] = {}
        cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
        dropped = len(nb.get("cells", [])) - len(cells)
        for i, cell in enumerate(nb.get("cells", [])):
            if isinstance(cell, dict):
                self.number[id(cell)] = i + 1
        if dropped:
            self.notes.append(f"{dropped} entries of its list of cells were not cells: removed")
        cells = [c for c in cells if not _is_note(c)]  # an earlier grading's note
        for cell in cells:
            self.cell_shape(cell)
            self.tags(cell)
            self.attachments(cell)
        cells = self.grading_cells(cells)
        nb["cells"] = cells
        nb["nbformat"] = 4
        self.cell_ids()
        self.schema()
        return nb, self.notes

    # ------------------------------------------------------------------ cell shape
    def cell_shape(self, cell: Any) -> None:
        kind = cell.get("cell_type")
        if kind not in CELL_KEYS:
            self.notes.append(
                f"{self.name(cell)} was of a type the notebook format does not have: kept as "
                "a raw cell"
            )
            cell["cell_type"] = kind = "raw"
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"] = {}
        if not isinstance(cell.get("source"), str):
            cell["source"] = _text(cell.get("source"))
        if kind == "code":
            if not isinstance(cell.get("outputs"), list):
                cell["outputs"] = []
            count = cell.get("execution_count")
            if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
                cell["execution_count"] = None
        for key in set(cell) - CELL_KEYS[kind]:
            del cell[key]  # an attachment of a code cell, a key of another format

    def tags(self, cell: Any) -> None:
        meta = cell["metadata"]
        if "tags" not in meta:
            return
        given = meta["tags"]
        items = given if isinstance(given, list) else [given]
        tidy: list[str] = []
        for item in items:
            if not isinstance(item, str):
                continue
            for part in item.split(","):
                part = part.strip()
                if part and part not in tidy:
                    tidy.append(part)
        if tidy != given:
            self.notes.append(
                f"{self.name(cell)}: its tags were tidied (commas split them, blanks and "
                "repeats removed)"
            )
        if tidy:
            meta["tags"] = tidy
        else:
            del meta["tags"]

    def attachments(self, cell: Any) -> None:
        if cell["cell_type"] == "code":
            return
        given = cell.get("attachments")
        bundles = given if isinstance(given, dict) else {}
        refs = ATTACHMENT_REF.findall(cell["source"])
        if not refs:
            if "attachments" in cell:
                del cell["attachments"]  # nothing shows it
            return
        lost = []

        def embed(m: re.Match) -> str:
            name = m.group(1)  # as written in the markdown: JupyterLab escapes a space
            bundle = bundles.get(name, bundles.get(unquote(name)))
            if isinstance(bundle, dict):
                for mime in IMAGE_TYPES:
                    data = _text(bundle.get(mime))
                    if data and BASE64.match(data):
                        return f"data:{mime};base64,{WHITESPACE.sub('', data)}"
            lost.append(m.group(1))
            return NOT_SHOWN

        cell["source"] = ATTACHMENT_REF.sub(embed, cell["source"])
        cell.pop("attachments", None)
        if lost:
            self.notes.append(
                f"{self.name(cell)}: {len(lost)} attachment(s) it shows were missing or not "
                "a PNG, JPEG or GIF image: not shown (the rest of the cell is kept)"
            )

    # ------------------------------------------------------------------ graded cells
    def grading_cells(self, cells: list) -> list:
        source_cells = list(self.source.cells)
        src_index = {_gid(c): i for i, c in enumerate(source_cells) if _gid(c)}
        occurrences: dict[str, list[Any]] = {}
        for cell in cells:
            meta = cell["metadata"].get("nbgrader")
            if "nbgrader" not in cell["metadata"]:
                continue
            gid = _gid(cell)
            if gid in src_index:
                occurrences.setdefault(gid, []).append(cell)
                continue
            flags = isinstance(meta, dict) and any(
                meta.get(k) for k in ("grade", "solution", "locked", "task")
            )
            if gid:
                self.notes.append(
                    f"{self.name(cell)}: its grade id is not one of the assignment's: its "
                    "grading metadata was removed (only the instructor's cells are graded)"
                )  # the id itself is the student's text: not repeated
            elif flags or not isinstance(meta, dict):
                self.notes.append(
                    f"{self.name(cell)}: grading metadata on a cell that is not the "
                    "instructor's was removed (only the instructor's cells are graded)"
                )
            del cell["metadata"]["nbgrader"]
        anchors = self.anchors(cells, source_cells)
        kept: dict[str, Any] = {}
        for gid, found in occurrences.items():
            mine = self.choose(src_index[gid], found, cells, anchors)
            kept[gid] = mine
            anchors[id(mine)] = src_index[gid]
            for other in found:
                if other is not mine:
                    del other["metadata"]["nbgrader"]
                    self.notes.append(
                        f"{self.name(other)} was a copy of the instructor's cell {gid}: kept as "
                        f"an ordinary cell, not graded ({self.name(mine)} is graded)"
                    )
        for gid, cell in kept.items():
            self.restore(cell, source_cells[src_index[gid]])
        cells = self.put_back(cells, kept, source_cells, anchors)
        return self.tests_below_answers(cells, kept, source_cells)

    def tests_below_answers(self, cells: list, kept: dict[str, Any], source_cells: list) -> list:
        """``cells`` with each instructor's test cell that stands above an answer cell of
        its exercise (one the source has between the previous test cell and it) moved
        right below the last of them: run top to bottom, it checks the answer. Only the
        instructor's test cells move, never a cell of the student's."""
        out = list(cells)
        previous = -1
        for t, src in enumerate(source_cells):
            if not _is_test(src):
                continue
            answers = [
                kept[_gid(a)]
                for a in source_cells[previous + 1 : t]
                if _is_answer(a) and _gid(a) in kept
            ]
            previous = t
            test = kept.get(_gid(src))
            if test is None or not answers:
                continue
            last = max(answers, key=lambda c: _at(out, c))
            if _at(out, test) < _at(out, last):
                del out[_at(out, test)]
                out.insert(_at(out, last) + 1, test)
                self.notes.append(
                    f"{self.name(test)} stood above the answer it checks, {self.name(last)}: "
                    "moved right below it"
                )
        return out

    @staticmethod
    def anchors(cells: list, source_cells: list) -> dict[int, int]:
        """``{id(cell): index in the source}`` for each submission cell that is one of the
        source's without doubt: its grade id (found once), else its cell id (JupyterLab
        keeps the ids of the released cells), else its text (each found once, in both)."""

        def once(keys: list) -> set:
            seen: dict[Any, int] = {}
            for k in keys:
                seen[k] = seen.get(k, 0) + 1
            return {k for k, n in seen.items() if n == 1 and k is not None}

        def key(c: Any, kind: str) -> Any:
            if kind == "gid":
                return _gid(c) or None if "nbgrader" in c["metadata"] else None
            if kind == "id":
                cid = c.get("id")
                return cid if isinstance(cid, str) and cid and not _gid(c) else None
            return (c["cell_type"], c["source"]) if not _gid(c) else None

        out: dict[int, int] = {}
        for kind in ("gid", "id", "text"):
            mine = once([key(c, kind) for c in cells])
            theirs = once([key(c, kind) for c in source_cells])
            where = {key(c, kind): i for i, c in enumerate(source_cells)}
            for c in cells:
                k = key(c, kind)
                if id(c) not in out and k in mine and k in theirs:
                    out[id(c)] = where[k]
        return out

    def choose(self, me: int, found: list, cells: list, anchors: dict[int, int]) -> Any:
        """The occurrence of the source's cell ``me`` that is the instructor's cell: the one
        whose place among the submission's cells known to be the source's agrees best with
        the source's order; then the one with the released cell's id; then one whose text
        is the released text; then the last (as nbgrader's DeduplicateIds keeps)."""
        if len(found) == 1:
            return found[0]
        pos = {id(c): i for i, c in enumerate(cells)}
        others = {id(c) for c in found}
        known = [(s, pos[k]) for k, s in anchors.items() if k not in others and s != me]
        src_cell = self.source.cells[me]
        release = _release_source(src_cell)

        def score(item: tuple[int, Any]) -> tuple:
            i, cell = item
            p = pos[id(cell)]
            fit = sum(1 for s, q in known if (s < me) == (q < p))
            same_id = cell.get("id") == src_cell.get("id")
            same = cell["cell_type"] == src_cell.cell_type and cell["source"] == release
            return (fit, same_id, same, i)

        return max(enumerate(found), key=score)[1]

    def restore(self, cell: Any, src: Any) -> None:
        """The instructor's cell type and grading settings on the submission's cell."""
        gid = _gid(cell)
        changed = []
        if cell["cell_type"] != src.cell_type:
            changed.append("cell type")
            if src.cell_type == "code":
                cell["outputs"], cell["execution_count"] = [], None
                cell.pop("attachments", None)
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
            cell["cell_type"] = src.cell_type
        mine = cell["metadata"]["nbgrader"]
        theirs = src.metadata["nbgrader"]
        if not isinstance(mine, dict):
            mine = {}
        foreign = sorted(k for k in mine if k not in NBGRADER_KEYS)
        if foreign:
            shown = [k for k in foreign if re.fullmatch(r"[A-Za-z_]{1,20}", k)]
            what = ", ".join(shown) if len(shown) == len(foreign) else f"{len(foreign)} keys"
            self.notes.append(
                f"{self.name(cell)}: grading metadata that only the instructor or the "
                f"gradebook sets ({what}) was removed"
            )
        if any(mine.get(k, False) != theirs.get(k, False) for k in SETTINGS):
            changed.append("grading settings")
        # The student's copy of the instructor's settings, with the instructor's values;
        # the checksum nbgrader replaces from the gradebook.
        new = {k: copy.deepcopy(v) for k, v in mine.items() if k in NBGRADER_KEYS}
        for k in (*SETTINGS, "grade_id", "schema_version"):
            if k in theirs:
                new[k] = copy.deepcopy(theirs[k])
            else:
                new.pop(k, None)
        if "cell_type" in new:
            new["cell_type"] = src.cell_type
        if not isinstance(new.get("checksum", ""), str):
            del new["checksum"]
        cell["metadata"]["nbgrader"] = new
        if theirs.get("locked"):
            release = _release_source(src)
            if cell["source"] != release:  # nbgrader's OverwriteCells adds the hidden tests
                changed.append("code")
                cell["source"] = release
        if changed:
            self.notes.append(
                f"{self.name(cell)}: the instructor's cell {gid} had its "
                f"{' and '.join(changed)} changed: the instructor's were restored"
            )

    def put_back(
        self, cells: list, kept: dict[str, Any], source_cells: list, anchors: dict[int, int]
    ) -> list:
        """``cells`` with every instructor's cell that is missing put back right after the
        submission's cell that is the nearest source cell before it (:meth:`anchors`),
        else at the start."""
        out = list(cells)
        at_source = {s: c for c in out for s in [anchors.get(id(c))] if s is not None}
        for m, src in enumerate(source_cells):
            gid = _gid(src)
            if not gid or gid in kept:
                continue
            before = next((at_source[j] for j in range(m - 1, -1, -1) if j in at_source), None)
            cell = self.missing_cell(src)
            out.insert(_at(out, before) + 1 if before is not None else 0, cell)
            kept[gid] = at_source[m] = cell
            where = f"after {self.name(before)}" if before is not None else "at the start"
            self.notes.append(
                f"the instructor's cell {gid} was missing: put back {where}"
                + (" (with the stub the notebook was released with)" if _is_answer(src) else "")
            )
        return out

    @staticmethod
    def missing_cell(src: Any) -> Any:
        meta = {"nbgrader": {k: copy.deepcopy(v) for k, v in src.metadata["nbgrader"].items()}}
        if src.metadata.get("tags"):
            meta["tags"] = list(src.metadata["tags"])
        text = _release_source(src)  # a test cell's hidden tests: nbgrader's OverwriteCells
        if src.cell_type == "code":
            cell = nbformat.v4.new_code_cell(text, metadata=meta)
        else:
            cell = nbformat.v4.new_markdown_cell(text, metadata=meta)
        cell.pop("id", None)  # given one with the others (cell_ids)
        return cell

    # ------------------------------------------------------------------ ids, schema
    def cell_ids(self) -> None:
        nb = self.nb
        minor = nb.get("nbformat_minor")
        if not isinstance(minor, int) or minor < 0:
            minor = nb["nbformat_minor"] = 5
        if minor < 5 and not any("id" in c for c in nb["cells"]):
            return  # nbformat 4.4 as written: no ids
        nb["nbformat_minor"] = max(minor, 5)
        seen: set[str] = set()
        bad = []
        for c in nb["cells"]:
            cid = c.get("id")
            if isinstance(cid, str) and CELL_ID.match(cid) and cid not in seen:
                seen.add(cid)
            else:
                bad.append(c)
        for n, c in enumerate(bad):
            new = f"repaired-{n + 1}"
            while new in seen:
                new += "x"
            seen.add(new)
            c["id"] = new
        students = sum(1 for c in bad if id(c) in self.number)  # not the cells put back
        if students:
            self.notes.append(
                f"{students} cell id(s) were missing, not valid or repeated: replaced by new ones"
            )

    def schema(self) -> None:
        """Whatever nbformat's schema still refuses: the notebook's metadata from the source,
        then the cells' offending metadata and outputs removed."""
        from nbformat.validator import iter_validate

        nb = self.nb
        top = {k: v for k, v in nb.items() if k != "cells"}
        top["cells"] = []
        for err in iter_validate(top, relax_add_props=True):
            path = list(err.path)
            if len(path) >= 2 and path[0] == "metadata" and path[1] in nb["metadata"]:
                key = path[1]
                if key in self.source.metadata:
                    nb["metadata"][key] = copy.deepcopy(self.source.metadata[key])
                else:
                    del nb["metadata"][key]
        minor = nb["nbformat_minor"]
        for cell in nb["cells"]:
            for _ in range(20):  # each pass removes one offending entry
                errors = list(
                    iter_validate(
                        cell,
                        ref=f"{cell['cell_type']}_cell",
                        version=4,
                        version_minor=minor,
                        relax_add_props=True,
                    )
                )
                if not errors:
                    break
                path = list(errors[0].path)
                if path[:1] == ["metadata"] and len(path) >= 2:
                    del cell["metadata"][path[1]]
                    what = "metadata the notebook format does not allow"
                elif path[:1] == ["outputs"] and len(path) >= 2:
                    del cell["outputs"][path[1]]
                    what = "an output the notebook format does not allow"
                elif path[:1] == ["attachments"]:
                    del cell["attachments"]
                    what = "attachments the notebook format does not allow"
                else:
                    raise UnreadableNotebookError(
                        f"{self.name(cell)} is not a valid notebook cell: {errors[0].message}"
                    )
                self.notes.append(f"{self.name(cell)}: {what} was removed")


def _is_answer(cell: Any) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return bool(meta.get("solution"))


def _is_test(cell: Any) -> bool:
    """An instructor's test cell: graded, locked, not an answer."""
    meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
    return bool(meta.get("grade") and meta.get("locked") and not meta.get("solution"))


def repair(nb: Any, source_nb: Any) -> tuple[Any, list[str]]:
    """Repair the submitted notebook ``nb`` (nbformat 4, as read; not modified) against the
    instructor's ``source_nb``: returns ``(repaired copy, what was repaired)``, one
    plain-language line per repair (none for a notebook that needed nothing). Raises
    :class:`UnreadableNotebookError` when it still is not a notebook nbgrader can read."""
    fixed, notes = _Repairer(_node(nb), source_nb).run()
    fixed = nbformat.from_dict(fixed)
    problem = validation_problem(fixed)
    if problem:
        raise UnreadableNotebookError(f"the notebook is not valid even once repaired: {problem}")
    return fixed, notes


def validation_problem(nb: Any) -> str:
    """Why nbconvert's or nbgrader's validation refuses ``nb`` ("" if neither does)."""
    from nbgrader.nbgraderformat import MetadataValidator, ValidationError

    nb = copy.deepcopy(nb)  # nbformat's validate mends repeated ids in place, and warns
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nbformat.validate(nb, relax_add_props=True)
    except nbformat.ValidationError as err:
        return str(err).splitlines()[0]
    try:
        MetadataValidator().validate_nb(nb)
    except ValidationError as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return ""


def add_note(nb: Any, notes: list[str]) -> None:
    """Append the cell that lists ``notes`` to ``nb`` (nothing when there are none)."""
    if not notes:
        return
    lines = "\n".join(f"- {n}" for n in notes)
    cell = nbformat.v4.new_markdown_cell(f"{NOTE_TITLE}\n\n{lines}\n", metadata={NOTE_MARK: True})
    if nb.get("nbformat_minor", 0) < 5:
        cell.pop("id", None)
    else:
        taken = {c.get("id") for c in nb.cells}
        cell["id"] = "grading-note"
        while cell["id"] in taken:
            cell["id"] += "-1"
    nb.cells.append(cell)


def submission_repairs(folder: Path, source_folder: Path) -> list[str]:
    """What grading repairs in the notebooks of a submission ``folder`` (the ones the
    assignment's ``source_folder`` holds), one line each naming its notebook; raises
    :class:`UnreadableNotebookError` (naming the notebook) for one that cannot be read."""
    out = []
    for path in sorted(folder.glob("*.ipynb")):
        src = source_folder / path.name
        if not path.is_file() or path.is_symlink() or not src.is_file():
            continue  # nbgrader grades only the assignment's notebooks
        nb = read_notebook(path)  # its reason names the notebook
        try:
            _, notes = repair(nb, nbformat.read(src, as_version=4))
        except UnreadableNotebookError as err:
            raise UnreadableNotebookError(f"{path.name}: {err}") from err
        out += [f"{path.name} repaired: {n}" for n in notes]
    return out


def note_repairs(folder: Path, source_folder: Path, notes: list[str]) -> str:
    """For ``make grade``: add to ``notes`` what grading repairs in the submission
    ``folder``; return why a notebook of it cannot be read ("" when all can)."""
    try:
        notes += submission_repairs(folder, source_folder)
    except UnreadableNotebookError as err:
        return f"its notebook cannot be read: {err}"
    except Exception as err:  # a bug of the repair's: grade as nbgrader would
        notes.append(f"its notebook could not be checked for repairs ({type(err).__name__}: {err})")
    return ""


# ----------------------------------------------------------------------------- nbgrader
class Repair(Preprocessor):
    """:func:`repair` as nbgrader's first sanitising preprocessor: the submission as
    JupyterLab wrote it, mended against the assignment's source notebook, with the
    repairs listed in a last markdown cell."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default

    def preprocess(self, nb, resources):
        source = self._source(resources)
        if source is None:
            return nb, resources
        try:
            fixed, notes = repair(nb, source)
        except UnreadableNotebookError:
            raise
        except Exception:  # a bug of the repair's: grade the notebook as nbgrader would
            self.log.exception("the notebook could not be repaired; graded as it is")
            return nb, resources
        add_note(fixed, notes)
        return fixed, resources

    def _source(self, resources) -> Any:
        info = (resources or {}).get("nbgrader") or {}
        assignment, notebook = info.get("assignment"), info.get("notebook")
        if not assignment or not notebook:
            return None
        from nbgrader.coursedir import CourseDirectory

        course = CourseDirectory(config=self.config)
        path = Path(course.format_path(course.source_directory, ".", assignment)) / (
            f"{notebook}.ipynb"
        )
        return nbformat.read(path, as_version=4) if path.is_file() else None
