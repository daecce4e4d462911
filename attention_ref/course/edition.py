"""The student edition of ``attention_ref``: the package without readable solutions.

    python -m attention_ref.course.edition build DIR     (or: make student-edition)

writes ``DIR/attention_ref/`` (bytecode only) and ``DIR/attention_ref-VERSION.dist-info/``,
a tree ready to sit in the site-packages of the environment where students work (see
"Running the course on JupyterHub" in docs/INSTRUCTOR_GUIDE.md). It behaves like the full
package (the checks give the same feedback, the notebooks' demonstrations run), but:

- no ``.py`` file is written: every module is a legacy-layout ``.pyc`` compiled by the
  Python that runs this command (students need the same minor version);
- every code object's ``co_filename`` points to a path that does not exist
  (``/nonexistent/site-packages/attention_ref/...``), so ``inspect.getsource``, IPython's
  ``??``, ``pdb``'s ``list`` and tracebacks have no source line to show;
- the few objects a notebook shows on purpose (``SHOWN``, e.g. ``Encoder.forward`` in
  notebook 06) keep their source, registered with ``linecache`` when their module is
  imported; the rest of that module's text is blanked out of the registered copy.

Bytecode is not encryption: ``dis`` disassembles it, and a determined student can rebuild
the algorithms from it. Instructors grade with the full package.

    python -m attention_ref.course.edition build-grading DIR

writes the student edition into ``DIR`` and, for each notebook NN with graded exercises,
a **grading edition** into ``DIR/graded/NN``: the same, except that the reference
implementation of every exercise of a later notebook (and each private helper only such
references use, such as notebook 14's kernels), and the checks' own models of the answers,
are compiled with a stand-in body from :mod:`attention_ref._withheld`, so a kernel grading
notebook NN holds no code that computes them. The sandbox gives each graded kernel the
edition of its notebook (:func:`attention_ref.trust.sandbox.edition_for`); the trusted
checker, which decides the grade, keeps the full package. Notebook NN's own exercises'
reference functions are withheld from its edition too: where a check runs an earlier
exercise's reference inside a later one (notebook 01's ``softmax_np`` inside ``sdpa_np``),
the checker computes it, called back from the kernel, and a demonstration calling one runs
the learner's own function of that name. Kept are the few later references a notebook
builds on (:data:`BUILT_ON`), the few of its own functions that :data:`KEPT_OWN` lists with
their reasons, and its own classes' methods (the reference modules that demonstrations and
checks build), but those :data:`WITHHELD_OWN_METHODS` lists.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
import types
from importlib._bootstrap_external import _code_to_timestamp_pyc  # noqa: PLC2701
from pathlib import Path

PACKAGE = "attention_ref"
# Where the edition's code objects say they come from: a path that cannot exist on a
# student's machine (students cannot create /nonexistent). "site-packages" in the name
# makes the checks treat these frames as an installed library, never as the learner's
# code, exactly as they treat the full package's own files.
FAKE_ROOT = "/nonexistent/site-packages"
# Objects whose source a notebook prints on purpose (module -> qualified names); none of
# them is the reference implementation of a graded exercise.
SHOWN: dict[str, tuple[str, ...]] = {
    f"{PACKAGE}.encoder": ("init_embedding", "Encoder.embed_tokens", "Encoder.forward"),
}
SHOWN_SUFFIX = " (parts shown in the notebooks)"
#: Where each notebook's grading edition lives inside a ``build-grading`` folder.
GRADED = "graded"
#: Withheld objects: module name -> {qualified name: the first notebook whose grading
#: edition keeps it}; notebook NN's edition withholds those with a number above NN.
Withheld = dict[str, dict[str, int]]
#: Later notebooks' references that an earlier notebook builds on (module, qualified name:
#: the first notebook using it): notebook 02 shows its masks in MultiHeadAttention (which
#: splits and merges heads), notebook 07 trains with masked_cross_entropy, notebook 11
#: generates with cached_self_attention.
BUILT_ON: dict[tuple[str, str], int] = {
    (f"{PACKAGE}.multihead", "MultiHeadAttention.forward"): 2,
    (f"{PACKAGE}.multihead", "split_heads"): 2,
    (f"{PACKAGE}.multihead", "merge_heads"): 2,
    (f"{PACKAGE}.training", "masked_cross_entropy"): 7,
    (f"{PACKAGE}.kv_cache", "cached_self_attention"): 11,
}
#: A notebook's own classes' methods that its edition withholds all the same (notebook,
#: module, qualified name): those of a class that nothing in the graded kernel runs
#: (neither the notebook's demonstrations, which use the learner's class, nor a check, which
#: builds no reference part into the learner's module). Every other method stays: see
#: :func:`own_references`.
WITHHELD_OWN_METHODS: frozenset[tuple[int, str, str]] = frozenset(
    {
        (3, f"{PACKAGE}.self_attention", "SelfAttention.forward"),
        # notebook 04's demonstrations run the learner's module with the reference's weights
        (4, f"{PACKAGE}.multihead", "MultiHeadAttention.forward"),
        # notebook 06's demonstrations, graded, run the learner's classes with the reference's
        # weights (weights.with_weights_of), and the encoder layer's check puts in a
        # feed-forward part built of PyTorch's modules alone
        (6, f"{PACKAGE}.encoder", "FeedForward.forward"),
        (6, f"{PACKAGE}.encoder", "EncoderLayer.forward"),
        # notebook 07's demonstrations, graded, run the learner's DecoderLayer and
        # Transformer with the reference's weights (weights.with_weights_of); the
        # Transformer's check puts in decoder layers that the checker computes
        # (trust.computed)
        (7, f"{PACKAGE}.decoder", "DecoderLayer.forward"),
        (7, f"{PACKAGE}.decoder", "Decoder.forward"),
        (7, f"{PACKAGE}.transformer", "Transformer.encode"),
        (7, f"{PACKAGE}.transformer", "Transformer.decode"),
        (7, f"{PACKAGE}.transformer", "Transformer.forward"),
        (7, f"{PACKAGE}.transformer", "TransformerCore.forward"),
        # notebook 11's conversion to grouped-query attention, graded, runs the learner's
        (11, f"{PACKAGE}.gpt", "GroupedQueryAttention.forward"),
        (11, f"{PACKAGE}.gpt", "GroupedQueryAttention.attend"),
        # notebook 11's GPT, graded, is built of the learner's blocks (gpt.with_blocks_of),
        # which have no cached step: it generates without the cache
        (11, f"{PACKAGE}.gpt", "GPTBlock.forward"),
        (11, f"{PACKAGE}.gpt", "GPTBlock.step"),
        # notebook 13's models, graded, are built of the learner's RMSNorm and SwiGLU
        # (modern.with_parts_of)
        (13, f"{PACKAGE}.modern", "RMSNorm.forward"),
        (13, f"{PACKAGE}.modern", "SwiGLU.forward"),
        # autograd Functions that only the learner's own run in the kernel
        (12, f"{PACKAGE}.flash", "FlashAttention.forward"),
        (12, f"{PACKAGE}.flash", "FlashAttention.backward"),
        (14, f"{PACKAGE}.triton_attention", "TritonFlashAttention.forward"),
        (14, f"{PACKAGE}.triton_attention", "TritonFlashAttention.backward"),
    }
)
#: A notebook's own exercises' functions that its edition keeps (notebook, module,
#: qualified name), each with the reason. Every other function that answers one of a
#: notebook's own exercises is withheld from its edition. (Methods stay, but
#: :data:`WITHHELD_OWN_METHODS`: see :func:`own_references`.)
KEPT_OWN: dict[tuple[int, str, str], str] = {}  # none since issue 40: see the guide


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _shown_lines(tree: ast.Module, lines: list[str], names: tuple[str, ...]) -> list[str]:
    """The module's lines with everything but the shown definitions blanked."""
    keep: set[int] = set()

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qual = f"{prefix}{child.name}"
                if qual in names:
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    keep.update(range(first, child.end_lineno + 1))
                visit(child, qual + ".")

    visit(tree, "")
    return [line if i in keep else "\n" for i, line in enumerate(lines, start=1)]


def _relocate(code: types.CodeType, hidden: str, shown: str, names: tuple[str, ...]):
    """Point every code object at ``hidden``, except the shown ones (and what they nest)."""

    def walk(c: types.CodeType, inside_shown: bool) -> types.CodeType:
        is_shown = inside_shown or c.co_qualname in names
        consts = tuple(
            walk(k, is_shown) if isinstance(k, types.CodeType) else k for k in c.co_consts
        )
        return c.replace(co_filename=shown if is_shown else hidden, co_consts=consts)

    return walk(code, False)


def _call_arguments(args: ast.arguments) -> str:
    """The text of a call passing a function's own parameters on, as it received them."""
    parts = [a.arg for a in [*args.posonlyargs, *args.args]]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return ", ".join(parts)


def _withhold(tree: ast.Module, module: str, withheld: set[str], graded: int) -> set[str]:
    """Give each withheld definition of ``tree`` the stand-in's body (its signature,
    decorators and docstring stay) for notebook ``graded``'s kernel; the qualified names
    replaced."""
    done: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and qual in withheld:
                    # The call passes on what the caller gave, as given (the learner's
                    # function of the same name may have fewer optional parameters); a
                    # Triton kernel keeps its signature, which triton.jit reads.
                    jit = any("jit" in ast.unparse(d) for d in child.decorator_list)
                    if not jit:
                        child.args = ast.parse("def f(*args, **kwargs): pass").body[0].args
                    call = (
                        f"return __import__({PACKAGE + '._withheld'!r}, fromlist=['answer'])"
                        f".answer({module!r}, {qual!r}, {graded})"
                        f"({_call_arguments(child.args)})"
                    )
                    body = ast.parse(call).body
                    first = child.body[0]
                    docstring = (
                        [first]
                        if isinstance(first, ast.Expr)
                        and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)
                        else []
                    )
                    for stmt in body:
                        ast.copy_location(stmt, first)
                    child.body = docstring + body
                    done.add(qual)
                else:
                    visit(child, qual + ".")

    visit(tree, "")
    return done


def compile_module(
    src: Path, rel: Path, withheld: set[str] | None = None, graded: int = 0
) -> bytes:
    """The .pyc bytes of one module of the student edition (of notebook ``graded``'s
    grading edition, with the qualified names ``withheld``)."""
    text = src.read_text(encoding="utf-8")
    module = _module_name(rel)
    hidden = f"{FAKE_ROOT}/{PACKAGE}/{rel.as_posix()}"
    names = SHOWN.get(module, ())
    shown = hidden + SHOWN_SUFFIX
    if names:
        lines = _shown_lines(ast.parse(text), text.splitlines(keepends=True), names)
        # Register the shown parts with linecache when the module is imported. An entry
        # with mtime None is never evicted by linecache.checkcache.
        text += (
            "\n\ndef _register_shown_source():\n"
            "    import linecache\n\n"
            f"    lines = {lines!r}\n"
            f"    linecache.cache[{shown!r}] = (sum(map(len, lines)), None, lines, {shown!r})\n"
            "\n\n_register_shown_source()\ndel _register_shown_source\n"
        )
    tree = ast.parse(text)
    if withheld:
        clash = set(withheld) & set(names)
        if clash:
            raise ValueError(f"{module}: {sorted(clash)} are shown, so cannot be withheld")
        missing = set(withheld) - _withhold(tree, module, set(withheld), graded)
        if missing:
            raise ValueError(f"{module} defines no {sorted(missing)} to withhold")
        ast.fix_missing_locations(tree)
    code = compile(tree, hidden, "exec", dont_inherit=True)
    if names:
        code = _relocate(code, hidden, shown, names)
    return bytes(_code_to_timestamp_pyc(code, 0, 0))


def _named_references():
    """``(notebook, module, qualified name)`` of every object an exercise's forbidden list
    names as the reference (or as the package's own), but those a notebook shows on
    purpose (``SHOWN``: not answers)."""
    from .. import checks  # noqa: F401 - each notebook's checks register on import
    from ..checks._core import REGISTRY

    for ex in REGISTRY.values():
        notebook = int(ex.run.__module__.rsplit(".nb", 1)[1])
        for obj, name in ex.forbidden():
            module = getattr(obj, "__module__", None) or ""
            if not module.startswith(f"{PACKAGE}.") or not name.startswith(
                ("the reference", f"{PACKAGE}'s")
            ):
                continue  # a PyTorch built-in, or a reference forbidden but not the answer
            if obj.__qualname__ not in SHOWN.get(module, ()):
                yield notebook, module, obj.__qualname__


def _add_private_helpers(source: Path, table: dict, merge) -> None:
    """In each module of ``table`` (module -> {qualified name: value}), give every private
    top-level function (``_name``) that only the table's entries use (a reference's kernel
    or inner loop) ``merge(its users' values)``, unless that is None."""
    for module, owners in table.items():
        units = _units(ast.parse(_module_path(source, module).read_text(encoding="utf-8")))
        private = [u for u in units if re.fullmatch(r"_[A-Za-z0-9]\w*", u) and "__" not in u]
        changed = True
        while changed:
            changed = False
            for helper in private:
                users = [u for u, seen in units.items() if helper in seen and u != helper]
                if helper in owners or not users or not all(u in owners for u in users):
                    continue
                value = merge([owners[u] for u in users])
                if value is not None:
                    owners[helper] = value
                    changed = True


def exercise_references() -> Withheld:
    """Each graded exercise's own reference implementation (what its check names as "the
    reference"), by the first notebook that grades it or builds on it (:data:`BUILT_ON`):
    module -> {qualified name: NN}. The objects a notebook prints on purpose (``SHOWN``)
    are not answers and stay."""
    table: Withheld = {}
    for notebook, module, qual in _named_references():
        first = min(notebook, BUILT_ON.get((module, qual), notebook))
        owners = table.setdefault(module, {})
        owners[qual] = min(owners.get(qual, first), first)
    return table


#: Own references: module -> {qualified name: the notebooks whose exercises it answers}.
Own = dict[str, dict[str, frozenset[int]]]


def own_references(source: Path | None = None) -> Own:
    """Each graded exercise's reference function (and each private helper that only such
    functions use) by the notebooks whose exercises name it as the reference: module ->
    {name: {NN, ...}}. Notebook NN's edition withholds these too, but :data:`KEPT_OWN`."""
    source = Path(source or Path(__file__).resolve().parents[1])
    table: Own = {}
    for notebook, module, qual in _named_references():
        # A method stays: the notebook's demonstrations and the checks build the reference's
        # modules (a reference part inside the learner's module, a reference model trained),
        # and a correct class of the learner's, whose parts may differ, cannot stand in for
        # its method (the catalog's correct alternatives broke demonstrations of notebooks
        # 03-07 and 11 that way), but where nothing in the graded kernel runs them
        # (WITHHELD_OWN_METHODS: the demonstrations run the learner's class, given the
        # reference's weights).
        key = (notebook, module, qual)
        if ("." not in qual or key in WITHHELD_OWN_METHODS) and key not in KEPT_OWN:
            owners = table.setdefault(module, {})
            owners[qual] = owners.get(qual, frozenset()) | {notebook}
    # a helper is withheld where every one of its users is
    _add_private_helpers(source, table, lambda nbs: frozenset.intersection(*nbs) or None)
    return table


def _module_path(source: Path, module: str) -> Path:
    rel = Path(*module.split(".")[1:]).with_suffix(".py")
    if not (source / rel).is_file():
        rel = rel.with_suffix("") / "__init__.py"
    return source / rel


def withheld_in(graded: int, table: Withheld, own: Own) -> Withheld:
    """What notebook ``graded``'s edition withholds: from ``table`` (:func:`grading_table`)
    what only a later notebook keeps, and from ``own`` (:func:`own_references`) the
    notebook's own exercises' references."""
    out: Withheld = {}
    for module in set(table) | set(own):
        late = {q: nb for q, nb in table.get(module, {}).items() if nb > graded}
        late |= {q: graded for q, nbs in own.get(module, {}).items() if graded in nbs}
        if late:
            out[module] = late
    return out


def _mentions(node: ast.AST, dotted: bool = False) -> set[str]:
    """Every name and attribute name in ``node``'s code; with ``dotted``, the names and
    ``a.b`` for each attribute ``b`` of a name ``a`` (what :func:`_resolver` resolves)."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and not dotted:
            found.add(n.attr)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            found.add(f"{n.value.id}.{n.attr}")
    return found


def _units(tree: ast.Module) -> dict[str, set[str]]:
    """Each function of a module (methods by qualified name; ``<module>`` for the rest of
    its code) -> the names its code mentions."""
    units: dict[str, set[str]] = {"<module>": set()}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                units[prefix + stmt.name] = _mentions(stmt)
            elif isinstance(stmt, ast.ClassDef):
                units["<module>"] |= set().union(set(), *map(_mentions, stmt.bases))
                visit(stmt.body, f"{prefix}{stmt.name}.")
            else:
                units["<module>"] |= _mentions(stmt)

    visit(tree.body, "")
    return units


def withheld_references(source: Path | None = None, table: Withheld | None = None) -> Withheld:
    """:func:`exercise_references` and, in each of their modules, every private top-level
    function (``_name``) that only their code uses (a reference's kernel or inner loop),
    kept from the first notebook that keeps one of its users."""
    source = Path(source or Path(__file__).resolve().parents[1])
    table = {m: dict(q) for m, q in (table or exercise_references()).items()}
    _add_private_helpers(source, table, min)  # kept from the first notebook keeping a user
    return table


#: The checks' modules whose functions a graded kernel never runs (the trusted checker
#: runs every check): their answer models (``_models.attention`` is a whole ``sdpa_np``),
#: input builders and mistake models are withheld from every grading edition. What the
#: kernel does run stays: the registrations, each exercise's forbidden list (functions
#: named ``*forbid*``), and the modules that serve the checker (agent, wire, ``_core``).
CHECKS_WITHHELD = re.compile(r"checks/(_models|toolkit|nb\d\d)\.py")
NEVER_KEPT = 100  # no grading edition keeps the checks' code


def checks_code(source: Path | None = None) -> Withheld:
    """Every top-level function of the checks' modules in :data:`CHECKS_WITHHELD`, but
    the forbidden lists: module -> {name: NEVER_KEPT}."""
    source = Path(source or Path(__file__).resolve().parents[1])
    trees = {
        _module_name(p.relative_to(source)): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted((source / "checks").glob("*.py"))
        if CHECKS_WITHHELD.fullmatch(p.relative_to(source).as_posix())
    }
    functions = {
        (module, stmt.name): stmt
        for module, tree in trees.items()
        for stmt in tree.body
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    resolve = {module: _resolver(module, tree, functions) for module, tree in trees.items()}
    kept: set[tuple[str, str]] = set()  # what runs as the modules are imported, ...
    for module, tree in trees.items():
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):  # its decorators run
                names = set().union(set(), *(_names_run(d, True) for d in stmt.decorator_list))
            elif isinstance(stmt, ast.ClassDef):
                names = set().union(set(), *map(_names_run, stmt.body))
            else:
                names = _names_run(stmt)
            kept |= resolve[module](names)
        for node in ast.walk(tree):  # ... each exercise's forbidden list, a lambda or not, ...
            if isinstance(node, ast.keyword) and node.arg == "forbidden":
                kept |= resolve[module](_mentions(node.value, dotted=True))
        kept |= {key for key in functions if key[0] == module and "forbid" in key[1]}
    while True:  # ... and whatever those call
        more = set().union(
            set(), *(resolve[m](_mentions(functions[m, n], dotted=True)) for m, n in kept)
        )
        if more <= kept:
            break
        kept |= more
    table: Withheld = {module: {} for module in trees}
    for module, name in sorted(set(functions) - kept):
        table[module][name] = NEVER_KEPT
    return table


def _resolver(module: str, tree: ast.Module, functions: dict):
    """``names -> {(module, function)}``: which of ``functions`` (the checks' modules'
    top-level functions) the names that ``module``'s code mentions refer to: its own
    functions by name, those it imports from another of the checks' modules, and
    ``alias.name`` where ``alias`` is such a module (``from . import _models as M``)."""
    package = module.rsplit(".", 1)[0]
    direct = {name: (module, name) for m, name in functions if m == module}
    aliases: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level == 1:
                base = f"{package}.{base}" if base else package
            for a in stmt.names:
                if (base, a.name) in functions:
                    direct[a.asname or a.name] = (base, a.name)
                else:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
    dotted = {
        f"{alias}.{name}": (m, name)
        for alias, m in aliases.items()
        for mm, name in functions
        if mm == m
    }

    def resolve(refs: set[str]) -> set[tuple[str, str]]:
        return {direct.get(r) or dotted[r] for r in refs if r in direct or r in dotted}

    return resolve


def _names_run(node: ast.AST, in_call: bool = False) -> set[str]:
    """What ``_mentions(..., dotted=True)`` finds that ``node`` may call as it runs: inside
    a call (the function called, and whatever it is given, which it may call in turn),
    outside the functions and lambdas ``node`` defines. A function only named (in a table
    of mistakes) is not run."""
    if isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    in_call = in_call or isinstance(node, ast.Call)
    if in_call and isinstance(node, ast.Name | ast.Attribute):
        return _mentions(node, dotted=True)
    return set().union(set(), *(_names_run(c, in_call) for c in ast.iter_child_nodes(node)))


def grading_table(source: Path | None = None) -> Withheld:
    """What the grading editions withhold: :func:`withheld_references` and
    :func:`checks_code` together."""
    return {**withheld_references(source), **checks_code(source)}


def build(
    dest: Path,
    source: Path | None = None,
    *,
    graded: int | None = None,
    withheld: Withheld | None = None,
    own: Own | None = None,
    quiet: bool = False,
    compiled: dict | None = None,
) -> Path:
    """Write the student edition into ``dest``; return the package folder. With
    ``graded=NN``: notebook NN's grading edition, where every reference in ``withheld``
    (default :func:`grading_table`) kept only from a later notebook on, and every one of
    notebook NN's own exercises in ``own`` (default :func:`own_references`), has a
    stand-in body."""
    source = Path(source or Path(__file__).resolve().parents[1])
    keep_out: Withheld = {}
    if graded is not None:
        table = withheld if withheld is not None else grading_table(source)
        own = own if own is not None else own_references(source)
        keep_out = withheld_in(graded, table, own)
    dest = Path(dest)
    out = dest / PACKAGE
    if out.exists():
        shutil.rmtree(out)
    for old in dest.glob(f"{PACKAGE}-*.dist-info"):
        shutil.rmtree(old)
    count = 0
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if "__pycache__" in rel.parts or path.is_dir():
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            withheld_here = frozenset(keep_out.get(_module_name(rel), ()))
            # A reference's stand-in names the notebook graded; the checks' do not.
            number = graded or 0 if ".checks" not in _module_name(rel) else 0
            key = (rel, withheld_here, number if withheld_here else None)
            if compiled is not None and key in compiled:
                code = compiled[key]  # the same module in another edition
            else:
                code = compile_module(path, rel, set(withheld_here), number)
                if compiled is not None:
                    compiled[key] = code
            target.with_suffix(".pyc").write_bytes(code)
            count += 1
        elif path.suffix != ".pyc":
            shutil.copy2(path, target)  # data files, if any
    for d in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    for f in (p for p in out.rglob("*") if p.is_file()):
        f.chmod(0o644)
    version = _version(source)
    info = dest / f"{PACKAGE}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        f"Name: attention-ref\nVersion: {version}\n"
        "Summary: Attention from Scratch, student edition (bytecode only, "
        f"CPython {sys.version_info.major}.{sys.version_info.minor})\n"
    )
    (info / "INSTALLER").write_text("attention_ref.course.edition\n")
    (info / "RECORD").write_text("")
    if quiet:
        return out
    print(
        f"student edition: {count} modules compiled to bytecode for CPython "
        f"{sys.version_info.major}.{sys.version_info.minor} in {out}"
    )
    return out


def _version(source: Path) -> str:
    for line in (source / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return ast.literal_eval(line.split("=", 1)[1].strip())
    return "0"


def build_grading(dest: Path, source: Path | None = None) -> Path:
    """The student edition in ``dest`` and each notebook's grading edition in
    ``dest/graded/NN``; returns ``dest``."""
    source = Path(source or Path(__file__).resolve().parents[1])
    dest = Path(dest)
    compiled: dict = {}  # most modules are the same in every edition: compiled once
    build(dest, source, compiled=compiled)
    table = grading_table(source)
    own = own_references(source)
    from .. import checks  # noqa: F401 - each notebook's checks register on import
    from ..checks._core import REGISTRY

    notebooks = sorted({int(ex.run.__module__.rsplit(".nb", 1)[1]) for ex in REGISTRY.values()})
    for nb in notebooks:
        build(
            dest / GRADED / f"{nb:02d}",
            source,
            graded=nb,
            withheld=table,
            own=own,
            quiet=True,
            compiled=compiled,
        )
    for d in [dest / GRADED, *(dest / GRADED).iterdir()]:
        d.chmod(0o755)
    count = sum(len(owners) for module, owners in table.items() if ".checks" not in module)
    print(
        f"grading editions: notebooks {notebooks[0]:02d}-{notebooks[-1]:02d} in "
        f"{dest / GRADED}; each withholds its own and the later notebooks' of {count} "
        "reference functions and the checks' code"
    )
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_ref.course.edition",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="write the student edition into DIR")
    p.add_argument("dir", type=Path)
    p = sub.add_parser(
        "build-grading", help="the student edition and each notebook's grading edition"
    )
    p.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.dir)
    else:
        build_grading(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
