"""The mistake catalog and the correct-alternatives catalog.

Each ``nbNN.py`` module here registers, for the exercises of notebook NN:

- realistic buggy implementations with ``@mistake(exercise_id, id="mistake_id")``: the
  check must reject each one with feedback that names exactly that mistake (its last line
  is ``[mistake: mistake_id]``; the ids, their messages and hints are in
  ``attention_ref/checks/mistakes.py``), so no other mistake can be named in its place;
- correct implementations written differently with ``@alternative(exercise_id)``: the
  check must accept each one, on the visible and on the hidden (thorough) inputs.

``tests/test_catalog.py`` runs them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    exercise: str
    name: str
    impl: Callable
    mistake_id: str = ""  # for mistakes: the id the feedback must name, exactly
    # for alternatives: why it is right for its check but not a whole notebook's answer
    # (e.g. built on an earlier part that is wrong on purpose); empty for most
    check_only: str = ""

    @property
    def id(self) -> str:
        return f"{self.exercise}-{self.name}"


MISTAKES: list[Entry] = []
ALTERNATIVES: list[Entry] = []


def mistake(exercise: str, id: str):  # noqa: A002 - reads as the mistake's id
    def register(fn):
        MISTAKES.append(Entry(exercise, fn.__name__, fn, id))
        return fn

    return register


def alternative(exercise: str, check_only: str = ""):
    """A correct answer: its check must pass it, and (unless ``check_only`` says why not)
    so must every later cell of its notebook (tests/test_alternatives_in_notebooks.py)."""

    def register(fn):
        ALTERNATIVES.append(Entry(exercise, fn.__name__, fn, check_only=check_only))
        return fn

    return register


#: Catalogs that need a module some environments cannot import: notebook 14's kernels
#: need Triton (Linux only), 3.7 or newer in its interpreter (make versions' oldest
#: environment has the 3.1 that torch 2.5 pins, and says so). In the locked environment
#: tests/test_environment.py proves Triton is there, and notebook 14 runs in make test.
NEEDS = {"nb14": "attention_ref.triton_attention"}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def load_all() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in NEEDS and not _importable(NEEDS[info.name]):
            continue
        importlib.import_module(f"{__name__}.{info.name}")


load_all()
