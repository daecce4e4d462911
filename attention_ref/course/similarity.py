"""Answers that are similar between submissions: a list for the instructor to look at.

``make report`` (and ``python -m attention_ref.course similarity``, which needs no
gradebook) compares, exercise by exercise, every pair of submissions under
``submitted/STUDENT/ASSIGNMENT/`` and lists the pairs of answer cells that share much more
than the class's other answers do, with the two cells side by side. It is a list to look
at, never a verdict: it changes no grade, and similar code has innocent causes too.

How two answers are compared:

- The answer cells are the cells the instructor's source marks as solutions (by
  ``grade_id``; what a submission's own metadata says is not trusted). Code cells are
  parsed with :mod:`ast` (a cell that does not parse is read with :mod:`tokenize`);
  comments, docstrings and formatting go; every name the learner chose (variables,
  arguments, helper functions) becomes ``_v``, while the names the notebook gives (its
  imports such as ``np`` and ``torch``, its functions, the builtins), attributes
  (``.transpose``), keywords and constants stay. Each statement becomes a run of tokens and
  its fingerprints are its runs of :data:`K` tokens (a shorter statement is one
  fingerprint), so renamed variables change nothing and reordered lines change nothing
  either. Written answers (markdown) are compared by runs of :data:`K_WORDS` words.
- Discounted: every fingerprint of what the student was given (the release notebook: the
  template stubs, every other cell, the code in its hints and prose), and every fingerprint
  that at least :data:`COMMON_SHARE` of the class's answers to that exercise (and at least
  :data:`MIN_COMMON` of them) share: the short correct line that many write.
  The instructor's solution is not discounted (two copies of a leaked solution are worth
  a look too), but each pair says how much of what it shares is also in the solution.
- A pair is listed when both answers keep at least :data:`MIN_FINGERPRINTS` fingerprints,
  they share at least that many, and either their similarity (shared over all, Jaccard) is
  at least :data:`THRESHOLD`, or the smaller answer is mostly contained in the other
  (shared over the smaller one's, at least :data:`CONTAINED`, with at least
  :data:`MIN_CONTAINED` fingerprints shared): a copy padded with lines of its own, or a
  copy of part of an answer, shares little of the whole but nearly all of the copy.

Submitted files are data: nothing in them is run or imported, links are not followed, a
notebook over :data:`MAX_NOTEBOOK_BYTES` or one that is not a notebook is skipped and
listed, and the page escapes everything a submission wrote. No student is named unless
``names`` is asked for: the pairs name "student 1", "student 2", ... (numbered on this
page only), and student ids are removed from the cells shown.
"""

from __future__ import annotations

import ast
import builtins
import copy
import csv
import html
import io
import json
import os
import re
import stat
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from .anonymity import anonymise

#: Tokens per fingerprint of code, and words per fingerprint of a written answer.
K = 5
K_WORDS = 5
#: A fingerprint shared by at least this share of the answers to an exercise, and by at
#: least MIN_COMMON of them, is what many write: it is discounted.
COMMON_SHARE = 0.2
MIN_COMMON = 4
#: Fingerprints an answer must keep (and a pair share) to be compared at all.
MIN_FINGERPRINTS = 5
#: The least similarity (Jaccard of the fingerprints kept) of a pair listed.
THRESHOLD = 0.5
#: ... or the least share of the smaller answer's fingerprints found in the other's, with
#: at least MIN_CONTAINED of them shared (more than a short answer keeps once what many
#: write alike is discounted). In tests/test_similarity.py's class, half an answer copied
#: and finished its own way is 0.74 contained; independent answers at most 0.38.
CONTAINED = 0.7
MIN_CONTAINED = 15
#: A submitted notebook longer than this is skipped (the default cap of a submission).
MAX_NOTEBOOK_BYTES = 20 * 2**20
#: The placeholder of every name the learner chose.
PLACEHOLDER = "_v"
CSV_FIELDS = (
    "assignment",
    "exercise",
    "student_a",
    "student_b",
    "similarity",
    "contained",
    "shared",
    "shared_also_in_solution",
    "lines_a",
    "lines_b",
    "answer_a",
    "answer_b",
)

Prints = dict[str, set[int]]  # fingerprint: the lines (from 1) of the cell it comes from


# ----------------------------------------------------------------------------- fingerprints
def _tokens(text: str) -> list[str]:
    """The tokens of ``text`` (Python's tokenizer, without comments and layout)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    try:
        return [
            t.string
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in skip and t.type != tokenize.ENDMARKER
        ]
    except (tokenize.TokenError, SyntaxError):
        return re.findall(r"\w+|[^\w\s]", re.sub(r"#[^\n]*", "", text))


def _add_runs(out: Prints, tokens: list[str], lines: set[int], k: int) -> None:
    """Add the runs of ``k`` tokens of one statement (or the statement, if shorter)."""
    if not tokens:
        return
    for i in range(max(1, len(tokens) - k + 1)):
        out.setdefault(" ".join(tokens[i : i + k]), set()).update(lines)


def _renamed(node: ast.AST, keep: frozenset[str]) -> ast.AST:
    """A copy of ``node`` in which every name not in ``keep`` is the placeholder."""

    def name(n: str | None) -> str | None:
        return n if n is None or n in keep else PLACEHOLDER

    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            n.id = name(n.id)
        elif isinstance(n, ast.arg):
            n.arg = name(n.arg)
        elif isinstance(
            n,
            ast.FunctionDef
            | ast.AsyncFunctionDef
            | ast.ClassDef
            | ast.ExceptHandler
            | ast.MatchAs
            | ast.MatchStar,
        ):
            n.name = name(n.name)
        elif isinstance(n, ast.Global | ast.Nonlocal):
            n.names = [name(x) for x in n.names]
        elif isinstance(n, ast.MatchMapping):
            n.rest = name(n.rest)
    return node


def _is_docstring(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _statements(nodes: list[ast.AST]):
    """``(header, lines)`` for every statement in ``nodes``, nested ones included: a
    compound statement's header is the statement without its bodies."""
    for node in nodes:
        if _is_docstring(node):
            continue
        bodies = {
            name: value
            for name, value in ast.iter_fields(node)
            if isinstance(value, list)
            and value
            and isinstance(value[0], ast.stmt | ast.excepthandler | ast.match_case)
        }
        if not bodies:
            yield node, set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            continue
        header = copy.copy(node)
        for name in bodies:
            setattr(header, name, [])
        yield header, {node.lineno}
        for value in bodies.values():
            yield from _statements(value)


def imported_names(tree: ast.AST) -> set[str]:
    """The names that the imports in ``tree`` bind."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                names.add(a.asname or a.name.split(".")[0])
    return names


def _without_magics(source: str) -> str:
    """``source`` with IPython's ``%magic`` and ``!shell`` lines blanked (lines keep their
    numbers)."""
    return "\n".join("" if re.match(r"\s*[%!]", ln) else ln for ln in source.split("\n"))


def code_prints(source: str, keep: frozenset[str] = frozenset()) -> Prints:
    """The fingerprints of a code cell, each with the lines it comes from."""
    source = _without_magics(source)
    out: Prints = {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _token_prints(source)
    keep = keep | imported_names(tree) | set(dir(builtins))
    for stmt, lines in _statements(tree.body):
        try:
            text = ast.unparse(_renamed(stmt, keep))
        except (ValueError, TypeError, AttributeError, RecursionError):
            continue
        _add_runs(out, _tokens(text), lines, K)
    return out


def _token_prints(source: str) -> Prints:
    """Fingerprints of code that does not parse: its logical lines, tokenized, every name
    that is not a keyword a placeholder."""
    import keyword  # noqa: PLC0415

    out: Prints = {}
    for number, line in enumerate(source.split("\n"), start=1):
        toks = [
            PLACEHOLDER if re.fullmatch(r"[A-Za-z_]\w*", t) and not keyword.iskeyword(t) else t
            for t in _tokens(line)
        ]
        _add_runs(out, toks, {number}, K)
    return out


def text_prints(text: str) -> Prints:
    """The fingerprints of a written answer: its runs of :data:`K_WORDS` words."""
    words: list[tuple[str, int]] = [
        (w, number)
        for number, line in enumerate(text.lower().split("\n"), start=1)
        for w in re.findall(r"[^\W_]+", line)
    ]
    out: Prints = {}
    for i in range(max(1, len(words) - K_WORDS + 1)):
        run = words[i : i + K_WORDS]
        if run:
            out.setdefault(" ".join(w for w, _ in run), set()).update(n for _, n in run)
    return out


def _code_in_markdown(text: str) -> list[str]:
    """The code a markdown cell shows: fenced blocks, ``<pre>``/``<code>`` and inline
    spans."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```.*?```", " ", text, flags=re.S)
    tagged = re.findall(r"<(pre|code)[^>]*>(.*?)</\1>", rest, flags=re.S | re.I)
    inline = re.findall(r"`([^`]+)`", rest)
    return [
        *fenced,
        *(html.unescape(t) for _, t in tagged),
        *(" ".join(s.split()) for s in inline),
    ]


# ----------------------------------------------------------------------------- the course
@dataclass
class Exercise:
    """One answer cell of an assignment: what the class was given for it (fingerprints of
    the release) and the fingerprints of the instructor's solution."""

    assignment: str
    notebook: str
    grade_id: str
    kind: str  # "code" or "markdown"
    given: set[str] = field(default_factory=set)
    solution: set[str] = field(default_factory=set)


def _answer_cells(nb: dict) -> dict[str, dict]:
    """The instructor's answer cells (nbgrader ``solution``) by grade_id."""
    return {
        c["metadata"]["nbgrader"]["grade_id"]: c
        for c in nb.get("cells", [])
        if c.get("metadata", {}).get("nbgrader", {}).get("solution")
        and c["metadata"]["nbgrader"].get("grade_id")
    }


def _source(cell: dict) -> str:
    """A cell's source as one string ("" where it is neither a string nor a list)."""
    src = cell.get("source", "")
    if isinstance(src, list):
        src = "".join(s for s in src if isinstance(s, str))
    return src if isinstance(src, str) else ""


def _cleared(source: str) -> str:
    """A solution cell as nbgrader releases it: what lies between the solution markers
    removed."""
    return re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", source, flags=re.S)


def _given_cells(root: Path, aid: str, source: dict, name: str) -> list[dict]:
    """The cells the student was given: the release notebook's (or, where there is none,
    the source's with the solutions cleared), and the source's markdown (its hints)."""
    release_path = root / "notebooks" / aid / name
    if release_path.is_file():
        cells = list(json.loads(release_path.read_text(encoding="utf-8")).get("cells", []))
    else:
        cells = [{**c, "source": _cleared(_source(c))} for c in source.get("cells", [])]
    return cells + [
        c
        for c in source.get("cells", [])
        if c.get("cell_type") == "markdown"
        and not c.get("metadata", {}).get("nbgrader", {}).get("solution")
    ]


def course_exercises(root: Path, aid: str) -> tuple[list[Exercise], frozenset[str]]:
    """The answer cells of assignment ``aid`` (from solutions/), each with what the
    release gives and the instructor's solution, and the names the notebooks give
    (imports, top-level functions and classes), which are kept as they are."""
    keep: set[str] = set()
    code: list[str] = []  # everything given, as code
    text: list[str] = []  # everything given, as prose
    solutions: list[tuple[Exercise, str]] = []
    for src_path in sorted((root / "solutions" / aid).glob("*.ipynb")):
        source = json.loads(src_path.read_text(encoding="utf-8"))
        for c in _given_cells(root, aid, source, src_path.name):
            body = _source(c)
            if c.get("cell_type") == "markdown":
                text.append(body)
                code.extend(_code_in_markdown(body))
                continue
            code.append(body)
            try:
                tree = ast.parse(_without_magics(body))
            except (SyntaxError, ValueError):
                continue
            keep |= imported_names(tree)
            keep |= {
                n.name
                for n in tree.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
        for gid, cell in _answer_cells(source).items():
            kind = "code" if cell.get("cell_type") == "code" else "markdown"
            solutions.append((Exercise(aid, src_path.name, gid, kind), _source(cell)))
    kept = frozenset(keep)
    given_code = {fp for body in code for fp in code_prints(body, kept)}
    given_text = {fp for body in text for fp in text_prints(body)}
    for ex, solution in solutions:
        if ex.kind == "code":
            ex.given, ex.solution = given_code, set(code_prints(solution, kept))
        else:
            ex.given, ex.solution = given_text, set(text_prints(solution))
    return [ex for ex, _ in solutions], kept


# ----------------------------------------------------------------------------- submissions
def read_notebook(path: Path) -> dict:
    """The submitted notebook at ``path`` as JSON, read without following a link and
    within :data:`MAX_NOTEBOOK_BYTES`; ``ValueError`` saying why it cannot be read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise ValueError(f"cannot be opened ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("not a notebook (not JSON)") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a notebook (no list of cells)")
    return nb


def _submitted_cells(nb: dict) -> dict[str, dict]:
    """The submission's cells by grade_id (the first of each; malformed cells ignored)."""
    out: dict[str, dict] = {}
    for c in nb["cells"]:
        meta = c.get("metadata") if isinstance(c, dict) else None
        nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
        gid = nbg.get("grade_id") if isinstance(nbg, dict) else None
        if isinstance(gid, str):
            out.setdefault(gid, c)
    return out


@dataclass
class Answer:
    """One student's answer cell: its source, its fingerprints (with their lines) and
    those kept once what the class was given and what many wrote are discounted."""

    student: str
    source: str
    prints: Prints
    kept: set[str] = field(default_factory=set)


@dataclass
class Pair:
    """Two answers to one exercise that are worth a look."""

    assignment: str
    exercise: str
    a: Answer
    b: Answer
    similarity: float
    shared: set[str]
    also_in_solution: float  # the share of ``shared`` that is in the instructor's solution
    #: the share of the smaller answer's fingerprints that the other holds
    contained: float = 0.0

    @property
    def rank(self) -> float:
        return max(self.similarity, self.contained)

    def lines(self, answer: Answer) -> list[int]:
        """The lines of ``answer`` that hold a shared fingerprint."""
        return sorted({n for fp in self.shared for n in answer.prints.get(fp, ())})


@dataclass
class Similarity:
    """What :func:`find_similar` found: the pairs, most similar first, the submissions
    skipped and why, and how many answers each assignment had."""

    pairs: list[Pair]
    skipped: list[tuple[str, str, str]]  # (student, assignment, why)
    compared: Counter  # assignment: answers compared
    students: list[str]
    #: words removed from the answers shown unless names: the students' ids, and their
    #: names and emails where the gradebook has them
    private: list[str] = field(default_factory=list)


def _safe_dir(path: Path) -> bool:
    """Whether ``path`` is a folder itself (not a link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def find_similar(root: Path, assignments: list[str], submitted: str = "submitted") -> Similarity:
    """The pairs of similar answers in ``submitted/`` for ``assignments``, most similar
    first."""
    base = root / submitted
    students = sorted(p.name for p in base.iterdir() if _safe_dir(p)) if _safe_dir(base) else []
    pairs: list[Pair] = []
    skipped: list[tuple[str, str, str]] = []
    compared: Counter = Counter()
    for aid in assignments:
        exercises, keep = course_exercises(root, aid)
        cells: dict[str, dict[str, dict]] = {}  # student: grade_id: cell
        for sid in students:
            folder = base / sid / aid
            if not _safe_dir(folder):
                if os.path.lexists(folder):
                    skipped.append((sid, aid, "a link or a file, not a folder (not followed)"))
                continue
            for nb_name in sorted({ex.notebook for ex in exercises}):
                path = folder / nb_name
                if not os.path.lexists(path):
                    continue
                try:
                    cells.setdefault(sid, {}).update(_submitted_cells(read_notebook(path)))
                except ValueError as err:
                    skipped.append((sid, aid, f"{nb_name}: {err}"))
        for ex in exercises:
            answers = []
            for sid, by_id in cells.items():
                cell = by_id.get(ex.grade_id)
                if cell is None:
                    continue
                src = _source(cell)
                prints = code_prints(src, keep) if ex.kind == "code" else text_prints(src)
                answers.append(Answer(sid, src, prints, set(prints) - ex.given))
            compared[aid] += len(answers)
            pairs += _similar_pairs(ex, answers)
    pairs.sort(key=lambda p: (-p.rank, p.assignment, p.exercise, p.a.student))
    return Similarity(pairs, skipped, compared, students)


def _similar_pairs(ex: Exercise, answers: list[Answer]) -> list[Pair]:
    """The pairs of ``answers`` to ``ex`` above the threshold, once the fingerprints that
    many of them share are discounted."""
    counts = Counter(fp for a in answers for fp in a.kept)
    floor = max(MIN_COMMON, COMMON_SHARE * len(answers))
    common = {fp for fp, n in counts.items() if n >= floor}
    for a in answers:
        a.kept -= common
    found = []
    for a, b in combinations([a for a in answers if len(a.kept) >= MIN_FINGERPRINTS], 2):
        shared = a.kept & b.kept
        score = len(shared) / len(a.kept | b.kept)
        contained = len(shared) / min(len(a.kept), len(b.kept))
        if len(shared) >= MIN_FINGERPRINTS and (
            score >= THRESHOLD or (contained >= CONTAINED and len(shared) >= MIN_CONTAINED)
        ):
            in_solution = len(shared & ex.solution) / len(shared)
            found.append(
                Pair(ex.assignment, ex.grade_id, a, b, score, shared, in_solution, contained)
            )
    return found


# ----------------------------------------------------------------------------- outputs
def _labels(result: Similarity, names: bool) -> dict[str, str]:
    """How the page names each student: the id with ``names``, otherwise "student N"
    numbered in order of first appearance on this page."""
    order = list(dict.fromkeys(s for p in result.pairs for s in (p.a.student, p.b.student)))
    return {s: s if names else f"student {i}" for i, s in enumerate(order, start=1)}


def _shown(source: str, result: Similarity, names: bool) -> list[str]:
    """The lines of a cell as the page shows them (without student ids unless names)."""
    lines = source.split("\n")
    if names:
        return lines
    who = [*result.students, *result.private]
    return [anonymise(ln, who) if ln.strip() else ln for ln in lines]


def _spreadsheet_safe(text: str) -> str:
    """A CSV field a spreadsheet will not read as a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_rows(result: Similarity, names: bool = False) -> list[dict]:
    """similarity.csv's rows, one per pair, most similar first (fields: CSV_FIELDS)."""
    label = _labels(result, names)
    rows = []
    for p in result.pairs:
        rows.append(
            {
                "assignment": p.assignment,
                "exercise": p.exercise,
                "student_a": label[p.a.student],
                "student_b": label[p.b.student],
                "similarity": f"{p.similarity:.2f}",
                "contained": f"{p.contained:.2f}",
                "shared": len(p.shared),
                "shared_also_in_solution": f"{p.also_in_solution:.2f}",
                "lines_a": " ".join(map(str, p.lines(p.a))),
                "lines_b": " ".join(map(str, p.lines(p.b))),
                "answer_a": _spreadsheet_safe("\n".join(_shown(p.a.source, result, names))),
                "answer_b": _spreadsheet_safe("\n".join(_shown(p.b.source, result, names))),
            }
        )
    return rows


STYLE = """
body { font-family: sans-serif; max-width: 80em; margin: 1em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
td.num { text-align: right; }
pre { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; font-size: 0.85em;
      margin: 0; }
mark { background: #ffe28a; }
.pair td { width: 50%; }
"""

NOTE = (
    "Each pair below is two answers to one exercise that share much more normalised code "
    "(or wording) than the class's other answers do, after discounting what the notebook "
    "gave everyone (the template, the hints) and what many students wrote. Similar answers "
    "have innocent causes too: working together where that is allowed, the same hint or "
    "tutorial, the one obvious way to write it. This is a list to look at, not a verdict: "
    "it changes no grade. Lines that hold shared code are highlighted."
)


def _marked(line: str) -> str:
    """A highlighted line, escaped (its indentation outside the highlight)."""
    code = line.lstrip()
    return f"{line[: len(line) - len(code)]}<mark>{html.escape(code)}</mark>"


def render_html(result: Similarity, names: bool = False) -> str:
    """The page: the note, a table of the pairs, and each pair's answers side by side;
    everything a submission wrote is escaped."""
    e = html.escape
    label = _labels(result, names)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<title>Similar answers, worth a look</title>",
        f"<style>{STYLE}</style></head><body><h1>Similar answers, worth a look</h1>",
        f"<p>{e(NOTE)}</p>",
        "<p>Answers compared: "
        + (", ".join(f"{e(a)}: {n}" for a, n in sorted(result.compared.items())) or "none")
        + f". Listed: pairs with similarity at least {THRESHOLD:g} (the share of their "
        f"fingerprints that they share), or of which the smaller answer is at least "
        f"{CONTAINED:.0%} contained in the other (a copy padded with lines of its own, or "
        "part of an answer copied).</p>",
    ]
    if result.skipped:
        parts.append("<p>Submissions that could not be read (skipped):</p><ul>")
        for sid, aid, why in result.skipped:
            who = f"{e(sid)}, " if names else ""
            parts.append(f"<li>{who}{e(aid)}: {e(why)}</li>")
        parts.append("</ul>")
    if not result.pairs:
        parts.append("<p>No pair of answers is similar enough to list.</p></body></html>")
        return "\n".join(parts)
    parts.append(
        "<table><tr><th>#</th><th>assignment</th><th>exercise</th><th>students</th>"
        "<th>similarity</th><th>contained</th><th>shared fingerprints</th>"
        "<th>of which in the instructor's solution</th></tr>"
    )
    for i, p in enumerate(result.pairs, start=1):
        parts.append(
            f"<tr><td class='num'><a href='#pair-{i}'>{i}</a></td><td>{e(p.assignment)}</td>"
            f"<td>{e(p.exercise)}</td>"
            f"<td>{e(label[p.a.student])} and {e(label[p.b.student])}</td>"
            f"<td class='num'>{p.similarity:.2f}</td><td class='num'>{p.contained:.2f}</td>"
            f"<td class='num'>{len(p.shared)}</td>"
            f"<td class='num'>{p.also_in_solution:.0%}</td></tr>"
        )
    parts.append("</table>")
    for i, p in enumerate(result.pairs, start=1):
        parts.append(
            f"<h2 id='pair-{i}'>{i}. {e(p.assignment)}, {e(p.exercise)}: "
            f"{e(label[p.a.student])} and {e(label[p.b.student])} "
            f"(similarity {p.similarity:.2f}, contained {p.contained:.2f})</h2>"
        )
        parts.append(
            f"<table class='pair'><tr><th>{e(label[p.a.student])}</th>"
            f"<th>{e(label[p.b.student])}</th></tr><tr>"
        )
        for answer in (p.a, p.b):
            marked = set(p.lines(answer))
            lines = [
                _marked(ln) if n in marked else e(ln)
                for n, ln in enumerate(_shown(answer.source, result, names), start=1)
            ]
            parts.append(f"<td><pre>{chr(10).join(lines)}</pre></td>")
        parts.append("</tr></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_similarity(
    root: Path,
    assignments: list[str],
    out: Path,
    names: bool = False,
    submitted: str = "submitted",
    private: list[str] | None = None,
) -> list[Path]:
    """Write ``out/similarity.html`` and ``out/similarity.csv``; returns their paths.
    ``private``: words (names, emails) removed from the answers shown unless ``names``,
    besides the student ids."""
    result = find_similar(root, assignments, submitted)
    result.private = list(private or [])
    out.mkdir(parents=True, exist_ok=True)
    page = out / "similarity.html"
    page.write_text(render_html(result, names), encoding="utf-8")
    table = out / "similarity.csv"
    with open(table, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(csv_rows(result, names))
    return [page, table]
