"""Self-checks and autograded checks for every exercise of the course.

Use it in a notebook after writing an exercise::

    from attention_ref.checks import check
    check("sdpa", sdpa)          # returns quietly with a ✓ line, or raises with feedback

``check`` compares your code with the reference on seeded random inputs of several
shapes (edge cases included) and checks the properties the exercise must have. On failure
it raises ``AssertionError`` saying what failed, on which input, and the likely mistake.

Each call of your code runs under a time limit (5 s by default; twice that in the graded,
thorough run), so code that never returns is reported as feedback instead of spinning
forever; the kernel stays usable. Change it with ``check(..., time_limit=seconds)`` or the
environment variable ``ATTENTION_REF_TIME_LIMIT`` (``0``: no limit). The limit needs
signals, so it applies on the main thread of Linux and macOS (where Jupyter runs cells);
elsewhere the check runs without one.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ..trust import agent as _agent
from ._core import DEFAULT_TIME_LIMIT, REGISTRY, TIME_LIMIT_ENV, CheckFailure, run_check

# Each notebook's checks live in nbNN.py and register themselves on import.
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("nb"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["check", "exercise_ids", "CheckFailure", "DEFAULT_TIME_LIMIT", "TIME_LIMIT_ENV"]


def check(
    exercise_id: str,
    candidate: Any,
    *,
    seed: int = 0,
    thorough: bool = False,
    time_limit: float | None = None,
) -> None:
    """Check ``candidate`` (your function, or your ``nn.Module`` class) for ``exercise_id``.

    Args:
        exercise_id: the id shown in the notebook, e.g. ``"sdpa"``.
        candidate: your function (for a module exercise: the class itself).
        seed: which random inputs to use; the hidden tests use other seeds.
        thorough: more and larger cases (used by the graders' hidden tests).
        time_limit: seconds one call of your code may take (default
            ``$ATTENTION_REF_TIME_LIMIT`` or 5; doubled when ``thorough``; 0: no limit).

    Raises:
        AssertionError: with feedback naming what failed and the likely mistake.
        ValueError: if ``exercise_id`` is unknown.
    """
    if _agent.graded():
        # Graded: the trusted checker decides (seed, thoroughness and limits are the
        # instructor's); this kernel only serves it and shows its feedback.
        verdict = _agent.check_through_checker(exercise_id, candidate)
        if verdict.get("error") == "ValueError":
            raise ValueError(verdict["message"])
        if not verdict.get("passed"):
            raise CheckFailure(verdict.get("message", ""))
        print(verdict.get("message", ""))
        return
    n = run_check(exercise_id, candidate, seed=seed, thorough=thorough, time_limit=time_limit)
    print(f"✓ {exercise_id}: passed ({n} cases)")


def exercise_ids() -> list[str]:
    """All exercise ids that have a check, in course order."""
    return list(REGISTRY)
