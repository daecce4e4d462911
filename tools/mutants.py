"""Mutation testing of the checks: does each exercise's check catch small bugs in its
solution?

    python tools/mutants.py [--notebooks 01 02] [--exercises sdpa ...] [--graded]

For each exercise of the chosen solution notebooks (default: 01-07), the answer
cell's code (solution markers removed) is mutated one change at a time: an arithmetic or
comparison operator swapped, ``max``/``min`` exchanged, a number changed, a sign dropped,
``keepdim(s)=True`` turned off, a call replaced by its first argument (a scale, a
``transpose``, a ``detach``...), a statement deleted and a default argument changed: a
number, a flag flipped, a string replaced by each other string the function's body names
(``--no-defaults``: not the defaults; a default None is left as it is). Each mutant is run
through the exercise's self-check (``check(id, f)``; ``--graded``: the thorough check of the hidden
tests too). A mutant the check rejects is *killed*; one it accepts *survives*: either it
is equivalent to the solution (it computes the same thing on every input the spec
allows: list it in tools/mutants_equivalent.txt with a line of reason) or it is a gap in
the check (a case or a property to add). A listed function mutant is checked too: every
input the check gave it (recorded) is given to it and to the solution, from the same random
state, and the two must return the same and leave the inputs they may change alike (a
difference, or no input that could be copied, makes it a gap again). The
notebook's cells before each answer run once, in this process, to give the answer cell the
names it uses.

Prints one line per exercise (mutants, killed, equivalent, survived) and each survivor, as
``exercise:line:change`` (the second and later same change on one line: ``change #2``...);
exits 1 when a survivor is not listed as equivalent (or differs from the solution).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import inspect
import io
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tools" / "mutants_equivalent.txt"
SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Pow: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.And: ast.Or,
    ast.Or: ast.And,
}
NAMES = {
    "max": "min",
    "min": "max",
    "amax": "amin",
    "amin": "amax",
    "argmax": "argmin",
    "argmin": "argmax",
    "maximum": "minimum",
    "minimum": "maximum",
}


@dataclass
class Mutant:
    line: int
    what: str
    source: str
    #: for a surviving function mutant: where it differs from the solution on the inputs the
    #: check generated ("" where it never does), and how many of those inputs were compared
    #: (some cannot be copied: a cache object the function appends to), see _replayed
    difference: str = ""
    compared: str = ""

    def key(self, exercise: str) -> str:
        return f"{exercise}:{self.line}:{self.what}"


class _Mutator(ast.NodeTransformer):
    """Walks a module in a fixed order; with ``target=k`` applies only the k-th change."""

    def __init__(self, target: int | None = None, defaults: bool = False) -> None:
        self.target = target
        self.defaults = defaults
        self.in_defaults = False
        self.choices: list[str] = []  # the strings a function's body names (its choices)
        self.count = 0
        self.done: tuple[int, str] | None = None

    def _site(self, node: ast.AST, what: str) -> bool:
        hit = self.count == self.target
        if hit:
            self.done = (getattr(node, "lineno", 0), what)
        self.count += 1
        return hit

    def visit_BinOp(self, node: ast.BinOp):
        self.generic_visit(node)
        new = SWAPS.get(type(node.op))
        if new and self._site(node, f"{type(node.op).__name__}->{new.__name__}"):
            node.op = new()
        return node

    visit_BoolOp = visit_BinOp  # noqa: N815 - and <-> or, as + <-> -

    def visit_Compare(self, node: ast.Compare):
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            new = SWAPS.get(type(op))
            if new and self._site(node, f"{type(op).__name__}->{new.__name__}"):
                node.ops[i] = new()
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.USub) and self._site(node, "sign dropped"):
            return node.operand
        return node

    def visit_Constant(self, node: ast.Constant):
        v = node.value
        if self.in_defaults and isinstance(v, bool | str):  # a flag, a choice of the spec's
            # a flag flipped; a choice replaced by each other choice the function names
            others = [not v] if isinstance(v, bool) else [w for w in self.choices if w != v]
            for new in others:
                if self._site(node, f"{v!r}->{new!r}"):
                    return ast.copy_location(ast.Constant(new), node)
            return node
        if isinstance(v, bool) or not isinstance(v, int | float):
            return node
        for new in ([v + 1, 0] if v else [1]) if isinstance(v, int) else ([v * 2, 0.0]):
            if self._site(node, f"{v!r}->{new!r}"):
                return ast.copy_location(ast.Constant(new), node)
        return node

    def visit_Name(self, node: ast.Name):
        if node.id in NAMES and self._site(node, f"{node.id}->{NAMES[node.id]}"):
            return ast.copy_location(ast.Name(NAMES[node.id], node.ctx), node)
        return node

    def visit_Attribute(self, node: ast.Attribute):
        self.generic_visit(node)
        if node.attr in NAMES and self._site(node, f".{node.attr}->.{NAMES[node.attr]}"):
            node.attr = NAMES[node.attr]
        return node

    def visit_keyword(self, node: ast.keyword):
        self.generic_visit(node)
        if (
            node.arg in ("keepdim", "keepdims")
            and isinstance(node.value, ast.Constant)
            and node.value.value is True
            and self._site(node.value, f"{node.arg}=True->False")
        ):
            node.value = ast.Constant(False)
        return node

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        # f(x, ...) -> x, and x.method(...) -> x: a scale, a norm, a transpose, a detach
        # or a dropout left out.
        name = ast.unparse(node.func)
        bare_method = isinstance(node.func, ast.Attribute) and not (node.args or node.keywords)
        if bare_method and self._site(node, f"{name}() removed"):
            return node.func.value
        first = node.args[0] if node.args else None
        if (
            not bare_method
            and first is not None
            and not isinstance(first, ast.Starred)
            and self._site(node, f"{name}(x, ...) -> x")
        ):
            return first
        return node

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for stmt in body:
            deletable = isinstance(stmt, ast.Assign | ast.AugAssign | ast.Expr) and not (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            )
            if deletable and self._site(stmt, f"statement deleted: {ast.unparse(stmt)[:60]}"):
                continue
            out.append(self.visit(stmt))
        return out or [ast.Pass()]

    def visit_FunctionDef(self, node: ast.FunctionDef):
        if self.defaults:  # a spec's default arguments: a default axis, a model's sizes, a flag
            self.in_defaults = True
            self.choices = sorted(
                {
                    c.value
                    for stmt in node.body
                    for c in ast.walk(stmt)
                    if isinstance(c, ast.Constant)
                    and isinstance(c.value, str)
                    and not (stmt is node.body[0] and isinstance(stmt, ast.Expr))
                }
            )
            try:
                node.args = self.visit(node.args)
            finally:
                self.in_defaults = False
        node.body = self._body(node.body)
        return node

    def visit_If(self, node: ast.If):
        node.test = self.visit(node.test)
        node.body = self._body(node.body)
        node.orelse = self._body(node.orelse) if node.orelse else []
        return node

    def visit_For(self, node: ast.For):
        node.iter = self.visit(node.iter)
        node.body = self._body(node.body)
        return node


def mutants(source: str, defaults: bool = False) -> list[Mutant]:
    """Every single-change mutant of ``source`` (code that defines the exercise); with
    ``defaults``, of its functions' default arguments too."""
    tree = ast.parse(source)
    counter = _Mutator(defaults=defaults)
    counter.visit(copy.deepcopy(tree))
    out = []
    seen: dict[tuple[int, str], int] = {}  # the same change on one line: numbered from #2
    for k in range(counter.count):
        m = _Mutator(k, defaults)
        new = m.visit(copy.deepcopy(tree))
        ast.fix_missing_locations(new)
        text = ast.unparse(new)
        if m.done and text != ast.unparse(tree):
            line, what = m.done
            seen[line, what] = n = seen.get((line, what), 0) + 1
            out.append(Mutant(line, what if n == 1 else f"{what} #{n}", text))
    return out


def _strip(source: str) -> str:
    lines = [
        line
        for line in source.splitlines()
        if not re.match(r"\s*### (BEGIN|END) SOLUTION", line) and not line.lstrip().startswith("%")
    ]
    return "\n".join(lines)


def _cells(notebook: Path) -> list[tuple[str, str | None, bool]]:
    """(code, the exercise id of an answer cell or None, is a test cell), in order."""
    nb = json.loads(notebook.read_text())
    out = []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        meta = c.get("metadata", {}).get("nbgrader", {})
        tags = c.get("metadata", {}).get("tags", [])
        if "training" in tags:
            continue
        source = "".join(c["source"])
        out.append(
            (
                _strip(source),
                meta.get("grade_id") if meta.get("solution") else None,
                bool(meta.get("grade")) and not meta.get("solution"),
            )
        )
    return out


def _defined(code: str, exercise: str, kind: str, test: str = "") -> str:
    """The name the answer cell defines for the exercise: what its test cell ``test`` checks
    (``check("flash_attention", FlashAttention)``), else the function of that name or (a
    module exercise) the last class the cell defines."""
    checked = re.search(rf"""check\(\s*["']{re.escape(exercise)}["']\s*,\s*(\w+)""", test)
    if checked:
        return checked.group(1)
    if kind == "function":
        return exercise
    classes = [n.name for n in ast.parse(code).body if isinstance(n, ast.ClassDef)]
    return classes[-1]


def run_notebook(
    notebook: Path, wanted: set[str] | None, graded: bool, quiet: bool, defaults: bool = False
):
    """Mutate each function exercise of ``notebook``; yields (exercise, mutants,
    survivors)."""
    namespace: dict = {"__name__": "__main__"}
    silence = contextlib.ExitStack()  # what the notebook's cells and the checks print
    silence.enter_context(contextlib.redirect_stdout(io.StringIO()))
    silence.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    with silence:
        yield from _mutate_cells(notebook, namespace, wanted, graded, quiet, defaults)


def _copied(value):
    """A deep copy of a call's arguments; a torch.Generator is cloned with its state."""
    import torch

    if isinstance(value, torch.Generator):
        twin = torch.Generator(device=value.device)
        twin.set_state(value.get_state())
        return twin
    if isinstance(value, tuple | list):
        return type(value)(_copied(v) for v in value)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _same(got, want, depth: int = 0, inputs: bool = False) -> bool:
    """Whether the mutant's ``got`` is the solution's ``want``: tensors and arrays of the same
    shape, dtype, device and ``requires_grad`` with equal values (float64 to 1e-9, other
    floats to 1e-5: another order of the same sums), sequences and dicts item by item,
    modules and the objects a check hands over to be changed (``__by_reference__``: a cache
    the call appends to) by their attributes, the rest by ``==``. ``inputs``: the arguments
    after the two calls, where any other object (a step function that counts its calls, a
    generator) is the check's own and not compared."""
    import numpy as np
    import torch

    if depth > 8:  # a structure this deep (or a cycle) is not followed further
        return True
    if isinstance(want, torch.Tensor):
        if not (
            isinstance(got, torch.Tensor)
            and got.shape == want.shape
            and got.dtype == want.dtype
            and got.device == want.device
            and got.requires_grad == want.requires_grad  # a .detach() added or dropped
        ):
            return False
        if want.device.type == "meta" or torch.equal(got, want):  # meta: no values
            return True
        tol = (1e-9, 1e-12) if want.dtype == torch.float64 else (1e-5, 1e-7)
        return want.is_floating_point() and torch.allclose(got, want, *tol, equal_nan=True)
    if isinstance(want, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.shape == want.shape
            and got.dtype == want.dtype
            and bool(np.allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True))
        )
    if isinstance(want, tuple | list):
        return (
            type(got) is type(want)
            and len(got) == len(want)
            and all(_same(g, w, depth + 1, inputs) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and list(got) == list(want)
            and all(_same(got[k], want[k], depth + 1, inputs) for k in want)
        )
    if isinstance(want, float) and isinstance(got, float):
        return bool(np.isclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True))
    if isinstance(want, torch.nn.Module) or getattr(type(want), "__by_reference__", False):
        return type(got) is type(want) and _same(vars(got), vars(want), depth + 1, inputs)
    if inputs and not isinstance(want, int | float | str | bool | type(None)):
        return True
    try:
        return type(got) is type(want) and bool(got == want)
    except Exception:  # noqa: BLE001 - what cannot be compared is not the same
        return False


def _replayed(exercise: str, mutant, solution, graded: bool) -> tuple[str, str]:
    """Run the check again on a recording of the mutant, then the mutant and the solution on
    every input the check passed it (the cases the spec allows, as the check generates them),
    each from the same random state. Returns the first input where they differ ("": none)
    and "compared/calls"."""
    import functools

    import torch

    from attention_ref.checks import check

    calls = []

    @functools.wraps(mutant)
    def recording(*args, **kwargs):
        try:
            calls.append(_copied((args, kwargs)))
        except Exception:  # noqa: BLE001 - an input that cannot be copied is not compared
            calls.append(None)
        return mutant(*args, **kwargs)

    try:
        check(exercise, recording, time_limit=2)
        if graded:
            check(exercise, recording, seed=2024, thorough=True, time_limit=4)
    except AssertionError as err:
        return f"the check fails it when it is recorded ({str(err).splitlines()[0][:100]})", ""
    copied = [c for c in calls if c is not None]
    if calls and not copied:
        return f"none of the check's {len(calls)} calls could be copied to compare", ""
    compared = f"{len(copied)}/{len(calls)}"
    before = torch.get_rng_state()
    try:
        for args, kwargs in copied:
            outs, inputs = [], []
            for fn in (mutant, solution):
                torch.manual_seed(0)
                a, kw = _copied((args, kwargs))
                try:
                    outs.append(fn(*a, **kw))
                except Exception as err:  # noqa: BLE001 - the difference is what it raised
                    outs.append(f"raised {type(err).__name__}")
                inputs.append((a, kw))  # after the call: what it appended to or changed
            if not _same(*outs) or not _same(*inputs, inputs=True):
                shapes = [tuple(x.shape) for x in args if isinstance(x, torch.Tensor)]
                what = "returns" if not _same(*outs) else "leaves its inputs"
                return f"{what} otherwise than the solution on a call with tensors {shapes}", ""
    finally:
        torch.set_rng_state(before)
    return "", compared


def _mutate_cells(notebook: Path, namespace: dict, wanted, graded, quiet, defaults):
    from attention_ref.checks import check
    from attention_ref.checks._core import REGISTRY

    cells = _cells(notebook)
    for i, (code, exercise, is_test) in enumerate(cells):
        if is_test:
            continue
        if exercise and exercise in REGISTRY and (wanted is None or exercise in wanted):
            exec(compile(code, f"<{exercise}>", "exec"), namespace)  # noqa: S102
            test = next((c for c, _, t in cells[i + 1 :] if t), "")
            name = _defined(code, exercise, REGISTRY[exercise].kind, test)
            if name not in namespace:  # defined by a later cell (notebook 12's flash)
                print(f"  {exercise}: its answer cell defines no {name}", file=sys.stderr)
                continue
            try:
                check(exercise, namespace[name])  # the solution itself must pass
            except AssertionError as err:  # notebook 14's kernels need a source file
                first = str(err).splitlines()[0][:120]
                print(f"  {exercise}: the solution fails here ({first})", file=sys.stderr)
                continue
            found = mutants(code, defaults)
            survivors = []
            for m in found:
                trial = dict(namespace)
                try:
                    exec(compile(m.source, f"<{exercise} mutant>", "exec"), trial)  # noqa: S102
                    candidate = trial[name]
                    check(exercise, candidate, time_limit=2)
                    if graded:
                        check(exercise, candidate, seed=2024, thorough=True, time_limit=4)
                except AssertionError:
                    continue
                except Exception:  # noqa: BLE001 - a mutant that cannot even be defined
                    continue
                if inspect.isfunction(candidate):  # (flash_attention's is a class)
                    m.difference, m.compared = _replayed(
                        exercise, candidate, namespace[name], graded
                    )
                survivors.append(m)
            yield exercise, found, survivors
            continue
        try:
            exec(compile(code, "<cell>", "exec"), namespace)  # noqa: S102
        except Exception as err:  # noqa: BLE001 - a demonstration this tool does not need
            if not quiet:
                print(
                    f"  (a cell of {notebook.name} failed here: {type(err).__name__})",
                    file=sys.stderr,
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--notebooks",
        nargs="+",
        default=["01", "02", "03", "04", "05", "06", "07"],
        help="NN ... (default: 01-07; 01-13 are at 0 gaps)",
    )
    parser.add_argument("--exercises", nargs="+", default=None)
    parser.add_argument("--graded", action="store_true", help="also the hidden tests' check")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--no-defaults",
        dest="defaults",
        action="store_false",
        help="leave the functions' numeric default arguments unmutated (mutated by default: "
        "the checks call each exercise with its optional arguments left out once)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.path.insert(0, str(ROOT))
    equivalent = {}
    if EQUIVALENT.is_file():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, reason = line.partition("  # ")
                equivalent[key.strip()] = reason.strip()
    gaps = 0
    real = sys.stdout  # the cells' output is silenced while they run
    for nn in args.notebooks:
        (notebook,) = sorted((ROOT / "solutions").glob(f"{nn}_*/{nn}_*.ipynb"))
        wanted = set(args.exercises) if args.exercises else None
        t0 = time.perf_counter()
        runs = run_notebook(notebook, wanted, args.graded, args.quiet, args.defaults)
        for exercise, found, survivors in runs:
            same = [m for m in survivors if m.key(exercise) in equivalent and not m.difference]
            open_ = [m for m in survivors if m not in same]
            gaps += len(open_)
            print(
                f"mutants notebook={nn} exercise={exercise} mutants={len(found)} "
                f"killed={len(found) - len(survivors)} equivalent={len(same)} "
                f"gaps={len(open_)} seconds={time.perf_counter() - t0:.1f}",
                file=real,
                flush=True,
            )
            for m in same:
                if m.compared:
                    print(
                        f"  equivalent: {m.key(exercise)} (the same as the solution on "
                        f"{m.compared} of the check's calls)",
                        file=real,
                        flush=True,
                    )
            for m in open_:
                listed = " (listed as equivalent, but it " if m.key(exercise) in equivalent else ""
                note = f"{listed}{m.difference})" if listed else ""
                print(f"  survived: {m.key(exercise)}{note}", file=real, flush=True)
            t0 = time.perf_counter()
    print(f"mutants: {gaps} gap(s)")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
