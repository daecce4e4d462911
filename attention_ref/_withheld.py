"""What a graded kernel holds in place of the answers.

While notebook NN is graded, its kernel imports a *grading edition* of the package
(:mod:`attention_ref.course.edition`): every reference implementation of a later
notebook's exercise, every reference function of notebook NN's own exercises, and the
checks' own models of the answers, are compiled with this module's stand-in as their body,
so the kernel holds no code that computes them (not even as bytecode). Earlier notebooks'
references stay: the notebook builds on them.

A stand-in of a function (``attention_ref.masked_cross_entropy``, say) runs the
learner's own function of that name, so the notebook's demonstrations and the package's
helpers that use it (a training loop, a generation loop) run on the learner's answer, as
the learner would expect; where the learner defined none, or their function is the one
calling the reference, it raises :class:`NotAvailableWhileGradedError`. A stand-in of a method
(``SelfAttention.forward``) always raises. This module holds no answer: it is in every
edition and in the full package, where nothing calls it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["NotAvailableWhileGradedError", "answer"]

_running = threading.local()  # the names whose stand-in is running the learner's function


class NotAvailableWhileGradedError(RuntimeError):
    """A reference implementation was called in a kernel that is being graded."""


def _message(module: str, qualname: str, graded: int, why: str) -> str:
    if module.startswith("attention_ref.checks"):
        return (
            f"{module}.{qualname} is not available while this notebook is graded: the "
            "checks run in the trusted checker, outside a graded kernel."
        )
    return (
        f"{module}.{qualname} is not available while this notebook is graded: it is the "
        f"reference answer of an exercise of notebook {graded:02d} or a later one, and a "
        f"graded kernel holds no answer of its notebook or a later one. {why}"
    )


def answer(module: str, qualname: str, graded: int) -> Any:
    """What a call of the withheld ``module.qualname`` runs: the learner's function of the
    same name (a top-level function of the notebook), or a function that raises."""
    own = None
    if "." not in qualname and not module.startswith("attention_ref.checks"):
        main = sys.modules.get("__main__")
        candidate = getattr(main, qualname, None) if main is not None else None
        if callable(candidate) and getattr(candidate, "__module__", None) == "__main__":
            own = candidate
    active: set[str] = getattr(_running, "names", None) or set()
    _running.names = active

    if own is None or qualname in active:
        why = (
            f"Your {qualname} calls it: write the computation yourself."
            if qualname in active
            else (
                f"Define your own {qualname} in the notebook and this call runs it."
                if "." not in qualname
                else "Use your own class in its place."
            )
        )

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise NotAvailableWhileGradedError(_message(module, qualname, graded, why))

        return unavailable

    def learners(*args: Any, **kwargs: Any) -> Any:
        active.add(qualname)
        try:
            return own(*args, **kwargs)
        finally:
            active.discard(qualname)

    return learners
