"""The machinery every exercise check uses.

A check calls the learner's code on seeded random inputs, compares with the reference and
checks properties. When something is wrong it raises :class:`CheckFailure` (an
``AssertionError``) whose message says what failed, on which input, expected vs got, the
likely mistake by name and a hint. The learner's own exceptions come back as feedback that
quotes their line, not as a traceback into the checker.

Writing a check for a new exercise (see ``nb01.py`` for examples)::

    @exercise("my_id", forbidden=[reference_fn])
    def check_my_id(candidate, ctx: Context) -> None:
        for case in ...:
            got = ctx.call(candidate, *case.args)          # learner's code, guarded
            ctx.expect_close(got, expected, what="out", case=case.label,
                             mistakes=[Mistake(...), ...], inputs=case.args)
"""

from __future__ import annotations

import linecache
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..course.load import load_factor, runqueue_wait
from ..triton_env import use_interpreter_without_gpu
from ..trust import remote as _remote
from .mistakes import MISTAKES, Named, named, tag

# Triton's interpreter is chosen before anything (the meta device, say) imports Triton.
use_interpreter_without_gpu()

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckFailure(AssertionError):  # noqa: N818 - public name, reads as the event
    """Raised by a check with feedback for the learner; ``str(err)`` is the whole message."""


def naming(failure: CheckFailure, mistake: Named) -> CheckFailure:
    """``failure`` (feedback that names no mistake yet) with ``mistake`` as its likely
    mistake, for a check that recognises the cause of a learner's exception afterwards."""
    text = str(failure).rsplit(tag("code_raised"), 1)[0]
    return CheckFailure(
        f"{text}\n  Likely mistake: {mistake}\n  Hint: {mistake.hint}{tag(mistake.id)}"
    )


class ReferenceUsed(Exception):  # noqa: N818 - an event, not an error of the learner's code
    """Raised inside the learner's call when it reaches a forbidden built-in or reference."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Mistake:
    """A named, realistic mistake: ``model`` computes what the buggy code would return.

    ``model`` takes the same arguments as the exercise and returns what the mistaken
    implementation returns for the value being compared (e.g. the weights). ``applies``
    is used instead when the mistake is recognised by a predicate on (got, expected).
    """

    name: str
    hint: str
    model: Callable[..., Any] | None = None
    applies: Callable[[Any, Any], bool] | None = None

    @classmethod
    def of(
        cls,
        mistake_id: str,
        model: Callable[..., Any] | None = None,
        applies: Callable[[Any, Any], bool] | None = None,
        **params: Any,
    ) -> Mistake:
        """The mistake ``mistake_id`` of the table (``mistakes.py``) with its model."""
        m = named(mistake_id, **params)
        return cls(m, m.hint, model=model, applies=applies)

    @property
    def id(self) -> str:
        return getattr(self.name, "id", "")


@dataclass
class Exercise:
    id: str
    kind: str  # "function" or "module"
    run: Callable[[Any, Context], None]
    forbidden: Callable[[], list[tuple[Any, str]]] = field(default=lambda: [])
    summary: str = ""


REGISTRY: dict[str, Exercise] = {}


def exercise(
    exercise_id: str,
    *,
    kind: str = "function",
    forbidden: Callable[[], list[tuple[Any, str]]] | None = None,
    summary: str = "",
) -> Callable[[Callable[[Any, Context], None]], Callable[[Any, Context], None]]:
    """Register ``fn(candidate, ctx)`` as the check of ``exercise_id``.

    ``forbidden`` returns ``(callable, description)`` pairs the learner's code must not
    call in place of writing the exercise (the reference itself, PyTorch's built-in
    attention, ...).
    """

    def register(fn: Callable[[Any, Context], None]) -> Callable[[Any, Context], None]:
        if exercise_id in REGISTRY:
            raise RuntimeError(f"exercise id {exercise_id!r} is registered twice")
        REGISTRY[exercise_id] = Exercise(
            exercise_id, kind, fn, forbidden or (lambda: []), summary or (fn.__doc__ or "")
        )
        return fn

    return register


# ----------------------------------------------------------------------------- reporting
def fmt_shape(x: Any) -> str:
    if isinstance(x, torch.Tensor | np.ndarray):
        return str(tuple(x.shape))
    return type(x).__name__


def _callable_name(fn: Any) -> str:
    """How feedback names the learner's callable: ``sdpa``, ``SelfAttention(...)`` for a
    class being built, ``SelfAttention.forward`` for a module being called."""
    try:
        if _remote.is_remote(fn) and _remote.describe(fn).get("is_type"):
            return f"{_remote.describe(fn).get('name', 'code')}(...)"
        if isinstance(fn, type):
            return f"{fn.__name__}(...)"
        if isinstance(fn, torch.nn.Module):
            return f"{type(fn).__name__}.forward"
        owner = getattr(fn, "__self__", None)
        name = getattr(fn, "__name__", "")
        if owner is not None and not isinstance(owner, type(sys)) and name:
            return f"{type(owner).__name__}.{name}"
        if name and name != "<lambda>":
            return name
    except Exception:  # noqa: BLE001 - a name is only cosmetic
        pass
    return "code"


def describe_inputs(names: Sequence[str], values: Sequence[Any]) -> str:
    parts = []
    for n, v in zip(names, values, strict=False):
        if isinstance(v, torch.Tensor):
            parts.append(f"{n} {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
        elif isinstance(v, np.ndarray):
            parts.append(f"{n} {v.shape} {v.dtype}")
        else:
            parts.append(f"{n}={v!r}")
    return ", ".join(parts)


def _student_frame(tb) -> traceback.FrameSummary | None:
    """The deepest frame of the traceback that is the learner's code (not the checker,
    not an installed library)."""
    best = None
    for fs in traceback.extract_tb(tb):
        fname = os.path.abspath(fs.filename) if not fs.filename.startswith("<") else fs.filename
        if fname.startswith(_PACKAGE_DIR) and "/tests/" not in fname:
            continue
        if "site-packages" in fname or fname.startswith(sys.prefix) or "/lib/python" in fname:
            continue
        best = fs
    return best


def _student_line(tb) -> tuple[str, str]:
    """``(where, source line)`` of the learner's frame in the traceback, or empty strings.
    Given the exception itself, its explicit causes too (``raise ... from``): the deepest
    learner's frame of the chain (Triton's interpreter raises ``InterpreterError`` at the
    launch, from the error at the learner's line inside the kernel)."""
    if isinstance(tb, BaseException):
        fs, err, seen = None, tb, set()
        while err is not None and id(err) not in seen:
            seen.add(id(err))
            fs = _student_frame(err.__traceback__) or fs
            err = err.__cause__
    else:
        fs = _student_frame(tb)
    if fs is None:
        return "", ""
    line = fs.line or linecache.getline(fs.filename, fs.lineno).strip()
    where = f"line {fs.lineno}" + (f" of {fs.name}()" if fs.name not in ("<module>",) else "")
    return where, line


# Mistakes recognised from the line that raised and the error message:
# (pattern in the line, pattern in the error, the named mistake).
ERROR_PATTERNS = [
    (r"\b[A-Za-z_]\w*\.T\b", r"mismatch|shape|size|dimension|match", named("batched_dot_t")),
    (r"\.view\(", r"view size is not compatible|contiguous", named("view_non_contiguous")),
    (
        r"",
        r"expected .*(Float|Double).* but found .*(Double|Float)|same dtype",
        named("dtypes_mixed"),
    ),
]


def explain_error(err: BaseException | str, line: str) -> tuple[str, str]:
    """The likely mistake behind an error (``err``, or its ``"Type: message"`` text) raised
    at the learner's ``line``."""
    import re

    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    for line_pat, err_pat, likely in ERROR_PATTERNS:
        if re.search(line_pat, line or "") and re.search(err_pat, text, re.IGNORECASE):
            return likely, likely.hint
    return "", ""


# ----------------------------------------------------------------------------- tripwire
class _Tripwire:
    """Watches the learner's call with ``sys.setprofile`` and stops it when it reaches a
    forbidden function, however it was imported or aliased."""

    def __init__(self, forbidden: list[tuple[Any, str]]) -> None:
        self.codes: dict[Any, str] = {}
        #: forbidden C functions, keyed by the function itself (the profile hook's ``arg``;
        #: a builtin's hash and equality are its object's and C function's identities)
        self.builtins: dict[Any, str] = {}
        for fn, desc in forbidden:
            code = getattr(fn, "__code__", None)
            if code is None and hasattr(fn, "__func__"):
                code = getattr(fn.__func__, "__code__", None)
            if code is not None:
                self.codes[code] = desc
            elif getattr(type(fn), "__hash__", None) is not None:
                # (an unhashable object is no C function: no profile event could name it)
                self.builtins[fn] = desc
        self._old = None
        #: What the learner's call reached that it may not: kept, so that a ``try/except``
        #: of the learner's around the forbidden call does not undo it.
        self.fired: list[str] = []
        self._profile = self._make_profile()

    def _make_profile(self):
        # A flat function with one dict lookup per event: it runs on every call the
        # learner's code makes (Triton's interpreter makes about 800,000 for one small
        # attention kernel), so each test here costs the check seconds.
        codes, builtins_, fired = self.codes.get, self.builtins.get, self.fired

        def profile(frame, event, arg):
            if event == "c_call":
                desc = builtins_(arg)
            elif event == "call":
                desc = codes(frame.f_code)
            else:
                return
            if desc is not None:
                sys.setprofile(None)
                fired.append(desc)
                raise ReferenceUsed(desc)

        return profile

    def __enter__(self):
        self._old = sys.getprofile()
        if self.codes or self.builtins:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._old)
        return False


# ----------------------------------------------------------------------------- time limits
#: Seconds one call of the learner's code may take on a check's inputs. The inputs are
#: small (at most a few thousand numbers): the reference takes milliseconds and the
#: slowest correct alternative in the catalog (pure-Python loops) under a second on a
#: loaded 2-core machine, so a call that runs past the limit is looping, not slow.
DEFAULT_TIME_LIMIT = 5.0
#: The graded (thorough) run uses larger inputs and runs beside other grading workers.
THOROUGH_TIME_FACTOR = 2.0
#: A whole check may take this many per-call limits (a backstop for code a check runs
#: outside ``ctx.call``).
CHECK_TIME_FACTOR = 12.0
#: A call is stopped when it has run the limit on the clock AND used this share of it in
#: CPU time: on a machine crowded by other processes (a class graded in parallel) a slow
#: but correct call is not cut off because it did not get the CPU ...
CPU_SHARE = 0.8
#: ... up to this many times the limit on the clock (code that sleeps or waits), times the
#: machine's load factor (:func:`attention_ref.course.load.load_factor`: at a load average
#: of ten times the cores a call gets a tenth of a core, and needs ten times as long). The
#: clock leaves out the time the call spent waiting for a CPU
#: (:func:`~attention_ref.course.load.runqueue_wait`), which the load average, a minute
#: behind, does not see when the load has just risen.
LOADED_FACTOR = 4.0
#: On a crowded core the same work takes more CPU time (caches shared with other processes,
#: PyTorch's threads spinning while they wait for each other): notebook 12's flash_attention
#: check used 3.2 s of CPU on a quiet two-core machine and 9.1 s beside twelve busy
#: processes. So a whole check's CPU share (not one call's: a call's limit is many times
#: what a correct call needs, and a loop should be stopped as soon as on a quiet machine)
#: grows with how crowded the check found its core (the clock over the clock less the time
#: it waited for a CPU), up to this many times.
CPU_STRETCH_MAX = 3.0
#: Environment variable that overrides the per-call limit (seconds; 0 turns limits off).
TIME_LIMIT_ENV = "ATTENTION_REF_TIME_LIMIT"


def resolve_time_limit(time_limit: float | None = None) -> float | None:
    """The per-call limit in seconds: ``time_limit`` if given, else ``$ATTENTION_REF_TIME_LIMIT``,
    else :data:`DEFAULT_TIME_LIMIT`. ``0`` (or less) means no limit (``None``)."""
    if time_limit is None:
        raw = os.environ.get(TIME_LIMIT_ENV, "").strip()
        try:
            time_limit = float(raw) if raw else DEFAULT_TIME_LIMIT
        except ValueError:
            time_limit = DEFAULT_TIME_LIMIT
    return float(time_limit) if time_limit and time_limit > 0 else None


class _TimeUp(BaseException):  # noqa: N818 - an event; BaseException so `except Exception` in
    # the learner's code cannot swallow it.
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__(deadline.seconds)
        self.deadline = deadline


def _signals_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class _Deadline:
    """``with _Deadline(seconds):`` raises :class:`_TimeUp` in the body when it runs past
    ``seconds`` (SIGALRM through ``setitimer``, so only on the main thread of a POSIX
    process, which is where Jupyter runs cells). Elsewhere, or with ``seconds=None``, it does
    nothing: no limit rather than a crash. Deadlines nest; a timer that was already running
    (someone else's) is paused and restored with its remaining time."""

    _active: list[_Deadline] = []
    _saved: tuple[Any, tuple[float, float], float] | None = None

    def __init__(self, seconds: float | None, stretch: bool = False) -> None:
        self.seconds = seconds
        self.stretch = stretch  # the CPU share grows on a crowded core (CPU_STRETCH_MAX)
        self.at = self.t0 = self.cpu0 = self.wait0 = 0.0
        self.armed = False
        self.grace = 240  # quarter-seconds an import in progress may delay the interruption

    def __enter__(self) -> _Deadline:
        if not self.seconds or not _signals_usable():
            return self
        now = time.monotonic()
        if not _Deadline._active:
            try:
                handler = signal.signal(signal.SIGALRM, _Deadline._on_alarm)
            except (ValueError, OSError):  # pragma: no cover - not the main thread after all
                return self
            _Deadline._saved = (handler, signal.setitimer(signal.ITIMER_REAL, 0), now)
        self.at = now + self.seconds
        self.t0, self.cpu0 = now, time.process_time()
        self.wait0 = runqueue_wait() or 0.0
        _Deadline._active.append(self)
        self.armed = True
        _Deadline._arm()
        return self

    def __exit__(self, *exc: Any) -> bool:
        if not self.armed:
            return False
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.armed = False
        _Deadline._active.remove(self)
        if _Deadline._active:
            _Deadline._arm()
        elif _Deadline._saved is not None:
            handler, (delay, interval), since = _Deadline._saved
            _Deadline._saved = None
            signal.signal(signal.SIGALRM, handler)
            if delay > 0:
                left = delay - (time.monotonic() - since)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), interval)
        return False

    @staticmethod
    def _arm() -> None:
        first = min(d.at for d in _Deadline._active)
        signal.setitimer(signal.ITIMER_REAL, max(first - time.monotonic(), 1e-4))

    @staticmethod
    def _on_alarm(signum, frame) -> None:
        if not _Deadline._active:
            return
        due = min(_Deadline._active, key=lambda d: d.at)
        if due.at > time.monotonic() + 1e-3:  # early wake-up: wait for the real deadline
            _Deadline._arm()
            return
        cpu = time.process_time() - due.cpu0
        # the wall time since the start, less what other processes took from it
        wall = time.monotonic() - due.t0
        ran = max(wall - ((runqueue_wait() or due.wait0) - due.wait0), 1e-3)
        crowded = min(CPU_STRETCH_MAX, max(1.0, wall / ran)) if due.stretch else 1.0
        share = CPU_SHARE * crowded * due.seconds
        cap = LOADED_FACTOR * load_factor() * due.seconds
        if cpu < share and ran < cap:
            # The machine is busy (other processes had the CPU): the code has not yet had
            # its time. Wait until it has used its share of the CPU, up to the wall cap.
            wait = min(share - cpu, cap - ran)
            signal.setitimer(signal.ITIMER_REAL, max(wait, 0.05))
            return
        if _importing(frame) and due.grace > 0:
            # Never interrupt an import (the first call of some torch code imports sympy,
            # for one): a half-imported module would break the kernel for later cells.
            due.grace -= 1
            signal.setitimer(signal.ITIMER_REAL, 0.25)
            return
        # Fire again every second in case the learner's code swallows the first one
        # (a bare `except:`); leaving the `with` block disarms it.
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        raise _TimeUp(due)


def _importing(frame) -> bool:
    """Whether ``frame`` or a caller is inside Python's import machinery."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_AUTOGRAD_WARM: list[bool] = []


def warm_autograd() -> None:
    """Run one tiny backward pass, once per process, so that what ``torch.autograd.grad``
    (and ``Tensor.backward``) imports on its first call is imported now: torch.fx's symbolic
    shapes and sympy with it (about a second of CPU on a quiet machine and several on a busy
    one), and what else the installed PyTorch loads there (PyTorch 2.5 also loads its nested
    tensors). Called before a backward pass of the learner's code is timed, so that the
    learner's first backward is not charged for it (nor does a watcher see it)."""
    if _AUTOGRAD_WARM:
        return
    from torch.utils._python_dispatch import _disable_current_modes

    # outside any watcher of the check's (a recorder of operations, of memory)
    with _disable_current_modes(), torch.enable_grad():
        x = torch.zeros(1, requires_grad=True)
        torch.autograd.grad(x * 2.0, [x], torch.ones(1))
        (x * 2.0).backward(torch.ones(1))
    _AUTOGRAD_WARM.append(True)


_META_WARM: list[bool] = []


def warm_meta() -> None:
    """PyTorch's first operation on the meta device imports its Python meta kernels (about
    900 modules: 6 to 8 s on a loaded 2-core machine, more than a call's limit). Done once
    per process, before a call of the learner's code on meta tensors is timed (in the
    checker's process for the self-check, in the graded kernel by its agent), so that the
    learner's first meta call is not charged for it."""
    if _META_WARM:
        return
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # outside any watcher of the check's
        x = torch.empty(1, 2, device="meta")
        torch.cat([x, x], dim=-1)
    _META_WARM.append(True)


def on_meta(*values: Any) -> bool:
    """Whether one of ``values`` (or of a tuple, list or dict among them, one level down) is
    a tensor on the meta device: a call given it pays for :func:`warm_meta` first."""
    for v in values:
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, tuple | list) else (v,)
        for x in inner:
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                return True
    return False


def _seconds(x: float) -> str:
    return f"{x:g} s"


# ----------------------------------------------------------------------------- context
def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if a.device.type == "meta":  # shapes without values: nothing to compare
            return tuple(a.shape) == tuple(b.shape)
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b, equal_nan=True))
    return True


class Context:
    """Passed to each check: calls the learner's code safely and reports failures."""

    def __init__(
        self, exercise: Exercise, seed: int, thorough: bool, time_limit: float | None = None
    ) -> None:
        self.exercise = exercise
        self.seed = seed
        self.thorough = thorough
        self.cases_run = 0
        self._forbidden = exercise.forbidden()
        #: seconds one call of the learner's code may take (None: no limit)
        self.time_limit = time_limit
        #: what the check is doing, for the feedback if the check itself cannot finish
        self.doing = "starting the check"
        #: the first failure explained only by precision (``precision_loss``,
        #: ``epsilon_in_denominator``): held back while the check goes on, so that a
        #: structural mistake found on a later input is named first; raised at the end, or
        #: in place of any later failure but one that a mistake model of expect_close explains
        #: (a property that fails by float32 rounding is not a structural mistake)
        self.deferred: str = ""
        self._explained = False

    # -- randomness
    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt])

    def torch_gen(self, salt: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 100_003 + salt)

    # -- failure
    def fail(
        self,
        what: str,
        *,
        case: str = "",
        likely: str = "",
        hint: str = "",
        mistake: str | Named = "",
    ) -> None:
        """Raise the feedback. ``mistake`` names the likely mistake by its id (its message
        and hint come from ``mistakes.py``), or is the named mistake itself, its
        placeholders filled (``named(id, condition=...)``); ``likely`` may also be a named
        mistake, or, for a mistake without an id, plain text."""
        if isinstance(mistake, Named) or mistake:
            m = mistake if isinstance(mistake, Named) else MISTAKES[mistake]
            likely = likely or m
            hint = hint or m.hint
            mistake = m.id
        msg = f"{self.exercise.id}: {what}"
        if case:
            msg += f"\n  Input: {case}"
        if likely:
            msg += f"\n  Likely mistake: {likely}"
        if hint:
            msg += f"\n  Hint: {hint}"
        named_id = getattr(likely, "id", "") or mistake
        if named_id:
            msg += tag(named_id)
        explained, self._explained = self._explained, False
        if self.deferred and not explained:
            raise CheckFailure(self.deferred)
        raise CheckFailure(msg)

    # -- calling the learner
    def call(
        self,
        fn: Callable,
        *args: Any,
        case: str = "",
        limit_scale: float = 1.0,
        call_name: str = "",
        **kwargs: Any,
    ) -> Any:
        """Call the learner's ``fn`` on copies of the inputs, under the tripwire and the time
        limit (``self.time_limit`` seconds times ``limit_scale``, for a call on larger inputs).

        Exceptions raised by the learner's code become a CheckFailure that quotes their
        line; a forbidden call becomes a CheckFailure that says what was called; a call that
        does not return in time, one that says so; an input modified in place is reported.
        ``call_name`` names ``fn`` in that feedback (default: from ``fn`` itself).
        """
        self.cases_run += 1
        name = call_name or _callable_name(fn)
        on = f" on {case}" if case else ""
        self.doing = f"calling your {name}{on}"
        copies = [_clone(a) for a in args]
        kw_copies = {k: _clone(v) for k, v in kwargs.items()}
        limit = None if self.time_limit is None else self.time_limit * limit_scale
        if _remote.is_remote(fn):
            return self._call_remote(fn, copies, kw_copies, case, name, on, limit)
        if on_meta(*copies, kw_copies):
            warm_meta()  # not the learner's time
        deadline = _Deadline(limit)
        tripwire = _Tripwire(self._forbidden)
        try:
            with deadline, tripwire, _remote.learner_code(limit):
                result = fn(*copies, **kw_copies)
            if tripwire.fired:  # the learner's code caught the tripwire's exception
                raise ReferenceUsed(tripwire.fired[0])
        except _remote.KernelError as err:  # the learner's code, in a graded kernel
            self._kernel_failed(err.info, name, case, limit)
        except _TimeUp as up:
            if up.deadline is not deadline:
                raise
            self.fail(
                f"your {name} did not return within {_seconds(limit)} (an infinite loop, or "
                "code far slower than needed?)",
                case=case,
                mistake=named("infinite_loop", limit=_seconds(limit), env=TIME_LIMIT_ENV),
            )
        except ReferenceUsed as used:
            self.fail(
                f"your code calls {used.name} instead of implementing the exercise.",
                mistake="reference_used",
                case=case,
            )
        except NotImplementedError:
            self.fail(
                "not implemented yet: the function still raises NotImplementedError.",
                mistake="not_implemented",
            )
        except CheckFailure:
            raise
        except _remote.KernelGone as gone:
            self._gone(gone)
        except Exception as err:  # the learner's bug, reported as feedback
            if tripwire.fired:  # ... after a forbidden call it caught: that call is the news
                self.fail(
                    f"your code calls {tripwire.fired[0]} instead of implementing the exercise.",
                    mistake="reference_used",
                    case=case,
                )
            where, line = _student_line(err)
            self._raised(
                {"type": type(err).__name__, "message": str(err), "where": where, "line": line},
                case,
            )
        for i, (orig, cp) in enumerate(zip(args, copies, strict=True)):
            if not _same(orig, cp):
                self._modified(i, case)
        self.doing = f"checking what your {name} returned{on}"
        return result

    def _raised(self, info: dict, case: str) -> None:
        """Feedback for an exception of the learner's code (``info``: its type, message,
        and the learner's line that raised it)."""
        kind, msg = info.get("type", "Exception"), info.get("message", "")
        where, line = info.get("where", ""), info.get("line", "")
        at = f"\n  Your code raised it at {where}:\n      {line}" if where else ""
        likely, hint = explain_error(f"{kind}: {msg}", line)
        self.fail(
            f"your code raised {kind}: {msg}{at}",
            mistake="code_raised",
            case=case,
            likely=likely,
            hint=hint,
        )

    def _kernel_failed(self, info: dict, name: str, case: str, limit: float | None) -> None:
        """The feedback for the learner's code that failed in a graded kernel: the same
        as for the same failure in the learner's own process."""
        kind = info.get("kind")
        if kind == "timeout":
            self.fail(
                f"your {name} did not return within {_seconds(limit)} (an infinite loop, or "
                "code far slower than needed?)",
                case=case,
                mistake=named("infinite_loop", limit=_seconds(limit), env=TIME_LIMIT_ENV),
            )
        if kind == "reference":
            self.fail(
                f"your code calls {info.get('name', '?')} instead of implementing the exercise.",
                mistake="reference_used",
                case=case,
            )
        if kind == "not_implemented" or info.get("type") == "NotImplementedError":
            self.fail(
                "not implemented yet: the function still raises NotImplementedError.",
                mistake="not_implemented",
            )
        self._raised(info, case)

    def _modified(self, i: int, case: str) -> None:
        self.fail(
            f"your code modified its input argument #{i + 1} in place.",
            mistake="input_modified",
            case=case,
        )

    def _gone(self, gone: BaseException) -> None:
        self.fail(f"{gone}.", mistake="kernel_stopped_answering")

    def _call_remote(self, fn, copies, kw_copies, case, name, on, limit) -> Any:
        """``call`` for a learner's object in a graded kernel: the kernel runs it under the
        same limit and tripwire and answers with data; the verdict is the checker's."""
        try:
            result, modified = _remote.call_learner(fn, copies, kw_copies, limit)
        except _remote.KernelGone as gone:
            self._gone(gone)
        except _remote.KernelError as err:
            self._kernel_failed(err.info, name, case, limit)
        if modified is not None:
            self._modified(modified, case)
        self.doing = f"checking what your {name} returned{on}"
        return result

    # -- checking what came back
    def expect_tuple(self, got: Any, names: Sequence[str], *, case: str = "") -> tuple:
        n = len(names)
        if not isinstance(got, tuple | list) or len(got) != n:
            kind = (
                f"a {type(got).__name__} of length {len(got)}"
                if isinstance(got, tuple | list)
                else f"a single {type(got).__name__}"
            )
            self.fail(
                f"must return a tuple ({', '.join(names)}); got {kind}.",
                mistake="not_a_tuple",
                case=case,
                hint=f"end with `return {', '.join(names)}`.",
            )
        return tuple(got)

    def expect_array(
        self,
        got: Any,
        like: Any,
        *,
        what: str,
        case: str = "",
        swapped: Any = None,
        swapped_msg: str = "",
        check_dtype: bool = True,
    ) -> None:
        """Type, shape, dtype, device and finiteness of ``got`` against ``like``."""
        want_torch = isinstance(like, torch.Tensor)
        kind = "torch.Tensor" if want_torch else "numpy.ndarray"
        if want_torch and not isinstance(got, torch.Tensor):
            self.fail(
                f"{what} must be a torch.Tensor; got {type(got).__name__}.",
                case=case,
                mistake="wrong_type",
            )
        if not want_torch and not isinstance(got, np.ndarray):
            hint = (
                "convert with .numpy() or use NumPy operations"
                if isinstance(got, torch.Tensor)
                else ""
            )
            self.fail(
                f"{what} must be a {kind}; got {type(got).__name__}.",
                case=case,
                hint=hint,
                mistake="wrong_type",
            )
        if tuple(got.shape) != tuple(like.shape):
            if swapped is not None and tuple(got.shape) == tuple(swapped.shape):
                self.fail(
                    f"{what} has shape {tuple(got.shape)}, expected {tuple(like.shape)}.",
                    case=case,
                    likely=swapped_msg,
                    mistake="wrong_shape",
                )
            self.fail(
                f"{what} has shape {tuple(got.shape)}, expected {tuple(like.shape)}.",
                case=case,
                mistake="wrong_shape",
            )
        if want_torch:
            if got.dtype != like.dtype and check_dtype:
                self.fail(
                    f"{what} has dtype {got.dtype}, expected {like.dtype} (the dtype of the "
                    "inputs).",
                    case=case,
                    mistake="wrong_dtype",
                )
            if got.device != like.device:
                self.fail(
                    f"{what} is on {got.device}, expected {like.device} (the inputs' device).",
                    case=case,
                    mistake="wrong_device",
                )
        if got.dtype == torch.bool or (isinstance(got, np.ndarray) and got.dtype == np.bool_):
            return
        values = got.detach().cpu().double().numpy() if want_torch else np.asarray(got)
        if np.issubdtype(values.dtype, np.number) and not np.all(np.isfinite(values)):
            bad = np.argwhere(~np.isfinite(values))[0]
            self.fail(
                f"{what} contains NaN or inf (first at index {tuple(int(i) for i in bad)}).",
                case=case,
                mistake="nan_or_inf",
            )

    def expect_close(
        self,
        got: Any,
        expected: Any,
        *,
        what: str,
        case: str = "",
        rtol: float,
        atol: float,
        mistakes: Iterable[Mistake] = (),
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        fallback: Callable[[np.ndarray, np.ndarray], str] | None = None,
        hint: str = "",
    ) -> None:
        """Compare values; on a mismatch, name the mistake whose model reproduces ``got``."""
        g = _as_np(got)
        e = _as_np(expected)
        if g.dtype == np.bool_ or e.dtype == np.bool_:
            ok = np.array_equal(g, e)
            err = np.argwhere(g != e)
        else:
            ok = np.allclose(g, e, rtol=rtol, atol=atol)
            err = np.argwhere(~np.isclose(g, e, rtol=rtol, atol=atol))
        if ok:
            return
        idx = tuple(int(i) for i in err[0])
        if g.dtype == np.bool_:
            detail = f"first difference at index {idx}: expected {e[idx]}, got {g[idx]}"
        else:
            diff = float(np.max(np.abs(g - e)))
            want, have = _distinct(float(e[idx]), float(g[idx]))
            detail = (
                f"first difference at index {idx}: expected {want}, got {have} "
                f"(max abs difference {diff:.3g}; tolerance rtol={rtol:g}, atol={atol:g})"
            )
        likely, mhint = self.diagnose(got, expected, mistakes, model_args, model_kwargs or {})
        # Precision comes after structure: a failure that only precision explains is held
        # back, and named only if no later input shows a structural mistake.
        deferred = not likely and _precision_lost(got, g, e, rtol, atol)
        if deferred:
            likely, mhint = EPSILON_SHRINK if _uniformly_shrunk(g, e) else PRECISION_LOSS
        else:
            self._explained = bool(likely)
            if not likely and fallback is not None:
                likely = fallback(g, e)
        try:
            self.fail(
                f"{what} is wrong; {detail}.",
                case=case,
                likely=likely,
                hint=mhint or hint,
                mistake="wrong_values",
            )
        except CheckFailure as failure:
            if not deferred:
                raise
            self.deferred = self.deferred or str(failure)

    def diagnose(
        self,
        got: Any,
        expected: Any,
        mistakes: Iterable[Mistake],
        model_args: tuple,
        model_kwargs: dict,
    ) -> tuple[str, str]:
        """The mistake that explains ``got``: its model's output matches ``got`` and differs
        from ``expected`` on this input (a mistake that makes no difference here, e.g. a
        missing causal mask with one query, cannot be what went wrong). Of several models that
        match, the first in the table wins unless a later one reproduces ``got`` clearly more
        closely (within half the first's distance): a structural mistake is not named after a
        near neighbour that only happens to come first (an epsilon outside the root is not "a
        wrong default epsilon")."""
        g = _as_np(got)
        e = _as_np(expected)
        found: list[tuple[float, Mistake]] = []
        for m in mistakes:
            try:
                if m.applies is not None:
                    if found:
                        break
                    if m.applies(g, e):
                        return m.name, m.hint
                    continue
                if m.model is None:
                    continue
                pred = _as_np(m.model(*model_args, **model_kwargs))
            except Exception:
                continue
            if pred.shape != g.shape:
                continue
            if pred.dtype == np.bool_ or g.dtype == np.bool_:
                if np.array_equal(pred, g) and not (
                    pred.shape == e.shape and np.array_equal(pred, e)
                ):
                    if not found:
                        return m.name, m.hint
                    found.append((0.0, m))
            elif np.allclose(pred, g, rtol=1e-3, atol=1e-4, equal_nan=True) and (
                # ... and closer to what came back than to the correct answer.
                pred.shape != e.shape or _dist(g, pred) < 0.5 * _dist(pred, e)
            ):
                found.append((_dist(g, pred), m))
                if found[0][0] == 0.0:
                    break
        if not found:
            return "", ""
        best = min(d for d, _ in found)
        first = found[0]
        m = first[1] if first[0] <= 2 * best else min(found, key=lambda f: f[0])[1]
        return m.name, m.hint


PRECISION_LOSS = (named("precision_loss"), named("precision_loss").hint)
EPSILON_SHRINK = (named("epsilon_in_denominator"), named("epsilon_in_denominator").hint)

#: What float32 arithmetic achieves on the checks' inputs (the course's float32 tolerance).
_FLOAT32_TOL = dict(rtol=1e-4, atol=1e-5)


def _is_float64(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.float64
    return isinstance(x, np.ndarray | np.floating) and np.asarray(x).dtype == np.float64


def _precision_lost(got: Any, g: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> bool:
    """``got`` is float64, fails a float64 tolerance, but is within float32 rounding."""
    tighter = rtol < _FLOAT32_TOL["rtol"] or atol < _FLOAT32_TOL["atol"]
    return (
        tighter
        and _is_float64(got)
        and g.shape == e.shape
        and bool(np.allclose(g, e, equal_nan=True, **_FLOAT32_TOL))
    )


def _uniformly_shrunk(g: np.ndarray, e: np.ndarray) -> bool:
    """Every value that differs is smaller in magnitude than the exact one, and at least 4
    differ: a systematic shrink, such as an epsilon added to a denominator, not the rounding
    of float32, whose errors have either sign."""
    if g.shape != e.shape:
        return False
    with np.errstate(invalid="ignore"):
        differ = np.isfinite(g) & np.isfinite(e) & (g != e) & (e != 0)
        shrink = np.abs(g[differ]) < np.abs(e[differ])
    return shrink.size >= 4 and bool(shrink.all())


def _dist(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference, with equal infinities and NaN-vs-NaN counted as 0."""
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    d = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, d)
    d = np.where(np.isnan(d), np.inf, d)
    return float(np.max(d)) if d.size else 0.0


def _distinct(expected: float, got: float) -> tuple[str, str]:
    """Both numbers with the fewest significant digits (at least 6) that tell them apart."""
    for digits in (6, 8, 10, 12, 14, 17):
        a, b = f"{expected:.{digits}g}", f"{got:.{digits}g}"
        if a != b:
            break
    return a, b


def _as_np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.numpy() if x.dtype == torch.bool else x.double().numpy()
    arr = np.asarray(x)
    return arr if arr.dtype == np.bool_ else arr.astype(np.float64)


# ----------------------------------------------------------------------------- entry point
def run_check(
    exercise_id: str,
    candidate: Any,
    *,
    seed: int = 0,
    thorough: bool = False,
    time_limit: float | None = None,
) -> int:
    """Run the check of ``exercise_id`` on ``candidate``; return the number of cases run.

    Raises :class:`CheckFailure` and nothing else for any candidate: an unexpected error
    inside the check (something about the candidate the check did not foresee) becomes
    feedback that names the exercise and what the check was doing. ``time_limit`` is the
    per-call limit in seconds (see :func:`resolve_time_limit`); the graded (thorough) run
    allows :data:`THOROUGH_TIME_FACTOR` times more.
    """
    if not isinstance(exercise_id, str) or exercise_id not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown exercise id {exercise_id!r}; known ids: {known}")
    ex = REGISTRY[exercise_id]
    if _remote.is_remote(candidate):
        is_class = _remote.is_remote_class(candidate, torch.nn.Module)
        is_callable = bool(_remote.describe(candidate).get("callable"))
    else:
        is_class = isinstance(candidate, type) and issubclass(candidate, torch.nn.Module)
        is_callable = callable(candidate)
    if ex.kind == "module":
        if not is_class:
            raise CheckFailure(
                f"{exercise_id}: pass your class itself (a subclass of torch.nn.Module), not "
                f"an instance or anything else; got {type(candidate).__name__}."
                + tag("not_a_module_class")
            )
    elif not is_callable:
        raise CheckFailure(
            f"{exercise_id}: pass your function itself; got {type(candidate).__name__}."
            + tag("not_a_function")
        )
    limit = resolve_time_limit(time_limit)
    if limit is not None and thorough:
        limit *= THOROUGH_TIME_FACTOR
    ctx = Context(ex, seed, thorough, limit)
    _remote.prepare(candidate, exercise_id, limit)
    whole = _Deadline(None if limit is None else limit * CHECK_TIME_FACTOR, stretch=True)
    failure = None
    try:
        with whole:
            ex.run(candidate, ctx)
    except CheckFailure:
        raise
    except _TimeUp as up:
        if up.deadline is not whole:  # pragma: no cover - an outer caller's deadline
            raise
        failure = (
            f"{exercise_id}: the check did not finish within {_seconds(whole.seconds)} "
            f"(it was {ctx.doing}): does your code loop forever?" + tag("check_timed_out")
        )
    except _remote.KernelGone as gone:
        failure = f"{exercise_id}: {gone}." + tag("kernel_stopped_answering")
    except Exception as err:  # noqa: BLE001 - the safety net: never crash on a candidate
        what = (
            f"{err.info.get('type', 'Exception')}: {err.info.get('message', '')}"
            if isinstance(err, _remote.KernelError)
            else f"{type(err).__name__}: {err}"
        )
        failure = (
            f"{exercise_id}: the check could not finish: while {ctx.doing}, it failed with "
            f"{what}\n"
            "  Likely mistake: something about your code (what it returns, or how your "
            "module is built) is of a kind this check did not expect.\n"
            "  Hint: follow the exercise's spec for the return types and the module's "
            "parameters; if your code does, tell your instructor: it is a bug in the check."
            + tag("check_could_not_finish")
        )
    if ctx.deferred and (failure is None or failure.endswith(tag("check_could_not_finish"))):
        raise CheckFailure(ctx.deferred) from None  # held back: nothing structural was found
    if failure is not None:
        raise CheckFailure(failure) from None
    return ctx.cases_run
