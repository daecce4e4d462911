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
"""

from __future__ import annotations

import argparse
import ast
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


def compile_module(src: Path, rel: Path) -> bytes:
    """The .pyc bytes of one module of the student edition."""
    text = src.read_text(encoding="utf-8")
    module = _module_name(rel)
    hidden = f"{FAKE_ROOT}/{PACKAGE}/{rel.as_posix()}"
    names = SHOWN.get(module, ())
    if names:
        tree = ast.parse(text)
        lines = _shown_lines(tree, text.splitlines(keepends=True), names)
        shown = hidden + SHOWN_SUFFIX
        # Register the shown parts with linecache when the module is imported. An entry
        # with mtime None is never evicted by linecache.checkcache.
        footer = (
            "\n\ndef _register_shown_source():\n"
            "    import linecache\n\n"
            f"    lines = {lines!r}\n"
            f"    linecache.cache[{shown!r}] = (sum(map(len, lines)), None, lines, {shown!r})\n"
            "\n\n_register_shown_source()\ndel _register_shown_source\n"
        )
        code = compile(text + footer, hidden, "exec", dont_inherit=True)
        code = _relocate(code, hidden, shown, names)
    else:
        code = compile(text, hidden, "exec", dont_inherit=True)
    return bytes(_code_to_timestamp_pyc(code, 0, 0))


def build(dest: Path, source: Path | None = None) -> Path:
    """Write the student edition into ``dest``; return the package folder."""
    source = Path(source or Path(__file__).resolve().parents[1])
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
            target.with_suffix(".pyc").write_bytes(compile_module(path, rel))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_ref.course.edition",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="write the student edition into DIR")
    p.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    build(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
