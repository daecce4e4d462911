"""The package's top level: every reference it exports is there, loaded on first use, and
the course's commands (grading, its Dask workers, the report) start without PyTorch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import attention_ref


@pytest.mark.parametrize("name", attention_ref.__all__)
def test_each_exported_name_is_the_object_its_module_defines(name):
    module = importlib.import_module(f"attention_ref.{attention_ref._MODULE_OF[name]}")
    assert getattr(attention_ref, name) is getattr(module, name)


def test_everything_exported_is_listed_once_and_star_import_gets_it():
    listed = [name for names in attention_ref._EXPORTS.values() for name in names]
    assert len(listed) == len(set(listed)), "a name exported from two modules"
    namespace: dict = {}
    exec("from attention_ref import *", namespace)
    assert set(attention_ref.__all__) <= set(namespace)
    assert set(attention_ref.__all__) <= set(dir(attention_ref))


def test_a_submodule_is_reached_as_an_attribute_and_a_missing_name_is_an_attribute_error():
    assert attention_ref.masking.causal_mask is attention_ref.causal_mask
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        attention_ref.no_such_thing  # noqa: B018


def test_the_course_commands_import_no_pytorch():
    """`make grade` and every process it starts but the kernels and the trusted checker
    (Dask's workers, nbgrader's) import attention_ref.course: PyTorch cost each a second of
    CPU, many times per class."""
    code = (
        "import sys\n"
        "import attention_ref.course.__main__, attention_ref.course.grading\n"
        "import attention_ref.course.cluster, attention_ref.course.report\n"
        "import attention_ref.course.exchange, attention_ref.course.similarity\n"
        "import attention_ref.trust.trusted, attention_ref.course.cell_limits\n"
        "import attention_ref.trust.sandbox, attention_ref.course.feedback\n"
        "import attention_ref.trust.inert\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False", out


def _import_graph() -> dict[str, set[str]]:
    """``{module: {module it imports, ...}}`` within attention_ref, read from the source:
    every import, at the top of a file or inside a function (one inside a function hides a
    cycle from Python, not from the reader)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "attention_ref"
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        is_pkg = parts[-1] == "__init__"
        mod = ".".join(parts[:-1] if is_pkg else parts)
        names[mod] = (path, is_pkg)
    graph: dict[str, set[str]] = {m: set() for m in names}
    for mod, (path, is_pkg) in names.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import sub` imports the submodule sub
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in names]
                targets = targets or [base]
            for t in targets:
                while t and t not in names:  # `import a.b.c` names a.b.c, a module
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):  # not its own package
                    graph[mod].add(t)
    return graph


def test_the_package_has_no_import_cycle_even_through_imports_in_functions():
    """The grading command calls the cluster, which grades each submission with
    course/autograde.py and imports neither; the report and the similar-answers list share
    course/anonymity.py. No import runs back up, at a file's top or inside a function."""
    graph = _import_graph()
    assert "attention_ref.course.autograde" in graph["attention_ref.course.cluster"]
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t) :] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


#: What decides or protects a grade (attention_ref/trust/__init__.py is its map).
TRUST_MODULES = (
    "trusted",
    "secret",
    "checker",
    "sandbox",
    "fused_removal",
    "no_exec",
    "agent",
    "remote",
    "computed",
    "wire",
    "cell",
    "inert",
)


def test_what_decides_a_grade_is_one_package_that_imports_no_grading_command():
    """The trusted checker, the wire, the kernel's side, the stand-ins, the plain-assert
    runner, the preprocessors of the source's tags and of the checker's record, the sandbox,
    the grading secret and the sanitiser of what submissions show are attention_ref.trust;
    outside it they use the checks they run, the watchers of efficient.py and the machine's
    load, never the grading command, its Dask engine or the report."""
    graph = _import_graph()
    trust = {m for m in graph if m.startswith("attention_ref.trust.")}
    assert trust == {f"attention_ref.trust.{m}" for m in TRUST_MODULES}
    outside = {t for m in trust for t in graph[m] if not t.startswith("attention_ref.trust")}
    assert outside <= {
        "attention_ref.checks",
        "attention_ref.checks._core",
        "attention_ref.checks.mistakes",
        "attention_ref.checks.toolkit",
        "attention_ref.efficient",
        "attention_ref.course.load",
    }, outside


@pytest.mark.later
@pytest.mark.parametrize("name", TRUST_MODULES)
def test_each_module_of_the_trust_package_imports_alone_in_a_fresh_process(name):
    """A process that starts with it (the checker's ``-m``, a kernel's prelude,
    nbgrader_config.py) finds no module half-initialised, whichever package comes first."""
    subprocess.run([sys.executable, "-c", f"import attention_ref.trust.{name}"], check=True)


@pytest.mark.parametrize(("package", "form"), [("course", "``{}``"), ("trust", ":mod:`.{}`")])
def test_each_package_map_names_every_module_of_its_package(package, form):
    """attention_ref.course's docstring lists its modules, attention_ref.trust's is the map
    of the trust boundary: a module added to either is named there."""
    from pathlib import Path

    doc = importlib.import_module(f"attention_ref.{package}").__doc__
    folder = Path(attention_ref.__file__).parent / package
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__"))
    assert modules
    assert [m for m in modules if form.format(m) not in doc] == []
