"""Mutation testing of the checks (tools/mutants.py, `make mutants`): the operators make the
changes they name, and every mutant of notebooks 01-13's solutions is caught by its
exercise's self-check or listed, with a reason, as equivalent (0 gaps; 08-13 in make
test-later). A new survivor fails this test."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attention_ref.checks._core import REGISTRY

from course_tools import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import mutants  # noqa: E402

NOTEBOOKS = ["01", "02", "03", "04", "05", "06", "07"]

TOY = """def f(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
"""


def test_each_operator_makes_the_one_change_it_names():
    found = {m.what: m.source for m in mutants.mutants(TOY, defaults=True)}
    assert "Sub->Add" in found and "x + x.max(" in found["Sub->Add"]
    assert "Div->Mult" in found and "e * e.sum(" in found["Div->Mult"]
    assert ".max->.min" in found and "x.min(axis=axis" in found[".max->.min"]
    assert "keepdims=True->False" in found
    assert "sign dropped" in found and "axis=1" in found["sign dropped"]
    assert "np.exp(x, ...) -> x" in found
    assert any(w.startswith("statement deleted: e = np.exp") for w in found)
    # One change each: every mutant differs from the solution, and from every other.
    assert len(set(found.values())) == len(found)
    assert all(src != TOY for src in found.values())
    # Default arguments only when asked.
    assert "sign dropped" not in {m.what for m in mutants.mutants(TOY)}


ROUTER = '''def route(z, router="mixtral", *, norm=True, mask=None):
    """The docstring's strings are not choices."""
    if router == "gpt_oss" or (router == "qwen3" and not norm):
        return z
    return z + 1
'''


def test_a_default_flag_is_flipped_and_a_default_string_becomes_each_other_choice():
    found = {m.what: m.source for m in mutants.mutants(ROUTER, defaults=True)}
    assert "norm=False" in found["True->False"]
    assert "router='gpt_oss'" in found["'mixtral'->'gpt_oss'"]
    assert "router='qwen3'" in found["'mixtral'->'qwen3'"]
    strings = {w for w in found if w.startswith("'mixtral'->")}
    assert strings == {"'mixtral'->'gpt_oss'", "'mixtral'->'qwen3'"}  # not the docstring's
    assert not any(w.startswith("None->") for w in found)  # a default None is left alone
    plain = {m.what for m in mutants.mutants(ROUTER)}
    assert "True->False" not in plain and "'mixtral'->'qwen3'" not in plain


def _run_mutants(notebooks: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "mutants.py"), "--quiet", "--notebooks", *notebooks],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("mutants notebook=")]
    every = [e for e, ex in REGISTRY.items() if ex.run.__module__[-2:] in notebooks]
    assert sorted(line.split("exercise=")[1].split()[0] for line in lines) == sorted(every)
    assert all(" gaps=0 " in line for line in lines), proc.stdout
    killed = sum(int(line.split("killed=")[1].split()[0]) for line in lines)
    total = sum(int(line.split("mutants=")[1].split()[0]) for line in lines)
    assert killed >= 0.95 * total, proc.stdout
    # every listed equivalent of a function was compared with the solution on the check's
    # inputs (tools/mutants.py's replay) and found the same
    assert "differs from the solution" not in proc.stdout
    assert proc.stdout.rstrip().endswith("mutants: 0 gap(s)")


def test_every_mutant_of_notebooks_01_to_07_is_caught_or_equivalent():
    _run_mutants(NOTEBOOKS)


@pytest.mark.later
def test_every_mutant_of_notebooks_08_to_13_is_caught_or_equivalent():
    """flash_attention included (its answer cell defines the autograd class its test checks)."""
    _run_mutants(["08", "09", "10", "11", "12", "13"])
