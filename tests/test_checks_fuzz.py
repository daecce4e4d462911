"""A check never raises anything but its own feedback (CheckFailure), whatever it is given,
and unusual but legal ways of writing a correct module (lazy layers, parametrizations,
extra buffers) pass where the spec allows them.

The matrix: every exercise id x every wrong-type candidate, then every module exercise x
every legal variant of a correct catalog alternative.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from attention_ref.checks import REGISTRY, CheckFailure, check, exercise_ids
from attention_ref.checks.mistakes import MISTAKES as NAMED
from attention_ref.checks.mistakes import mistake_id

from catalog import ALTERNATIVES
from catalog.nb03 import _Base, _softmax_masked

SAFETY_NET = "the check could not finish"


# ----------------------------------------------------------------------------- wrong types
def _returning(value):
    """A function that accepts anything and returns ``value``."""

    def candidate(*args, **kwargs):
        return value() if callable(value) else value

    candidate.__name__ = "returns_something_odd"
    return candidate


def _module_returning(value):
    """A module class that accepts any arguments and whose forward returns ``value``."""

    class Odd(nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        def forward(self, *args, **kwargs):
            return value() if callable(value) else value

    return Odd


ODD_VALUES = {
    "None": None,
    "a list": lambda: [1.0, 2.0, 3.0],
    "a numpy array": lambda: np.zeros(3),
    "a float64 scalar": lambda: np.float64(1.0),
    "a Python float": 0.5,
    "a string": "attention",
    "a dict": lambda: {"out": torch.zeros(2)},
    "a tensor of the wrong shape": lambda: torch.zeros(2, 3, 4, 5),
    "a 0-d tensor": lambda: torch.tensor(1.0),
    "a NaN tensor": lambda: torch.full((3,), float("nan")),
    "a complex tensor": lambda: torch.zeros(3, dtype=torch.complex64),
    "an int tensor": lambda: torch.zeros(3, dtype=torch.long),
    "a tuple of Nones": (None, None),
    "a tuple of lists": lambda: ([1.0], [2.0]),
    "a generator": lambda: (i for i in range(3)),
}


class NotAModule:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return None


class NoSuperInit(nn.Module):
    def __init__(self, *args, **kwargs):
        self.w_q = nn.Linear(2, 2)  # AttributeError: super().__init__() was not called


class WrongInitArity(nn.Module):
    def __init__(self):
        super().__init__()


class WrongForwardArity(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self):
        return None


class FirstInput(nn.Module):
    """Returns its first input unchanged (the right type, often the right shape)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x, *args, **kwargs):
        return x


def _wrong_candidates(exercise_id: str) -> dict[str, object]:
    common = {
        "None": None,
        "an int": 3,
        "a string": "sdpa",
        "an nn.Module instance": nn.Linear(2, 2),
        "a lambda of no arguments": lambda: None,
        "a lambda of one argument": lambda x: x,
        "a lambda returning its first input": lambda *a, **k: a[0] if a else None,
    }
    if REGISTRY[exercise_id].kind == "module":
        return {
            **common,
            "a class that is not an nn.Module": NotAModule,
            "a module without super().__init__()": NoSuperInit,
            "a module taking no arguments": WrongInitArity,
            "a forward taking no arguments": WrongForwardArity,
            "a forward returning its input": FirstInput,
            **{f"a forward returning {k}": _module_returning(v) for k, v in ODD_VALUES.items()},
        }
    return {
        **common,
        "a class instead of a function": NotAModule,
        **{f"a function returning {k}": _returning(v) for k, v in ODD_VALUES.items()},
    }


WRONG = [
    pytest.param(ex, name, cand, id=f"{ex}-{name}")
    for ex in exercise_ids()
    for name, cand in _wrong_candidates(ex).items()
]


def _only_feedback(exercise_id: str, candidate, **kwargs) -> str | None:
    """Run the check; return the feedback (None if it passed). Anything but CheckFailure
    escaping the check fails the test."""
    try:
        check(exercise_id, candidate, **kwargs)
    except CheckFailure as err:
        return str(err)
    return None


@pytest.mark.parametrize(("exercise_id", "name", "candidate"), WRONG)
def test_a_wrong_candidate_gets_feedback_not_a_crash(exercise_id, name, candidate):
    msg = _only_feedback(exercise_id, candidate)
    assert msg is not None, f"{exercise_id} accepted {name}"
    assert msg.startswith(f"{exercise_id}: ")
    assert "Traceback" not in msg
    assert mistake_id(msg) in NAMED, f"the feedback names no mistake id:\n{msg}"
    if exercise_id in MUST_PASS:  # its own feedback, not the safety net's
        assert SAFETY_NET not in msg, msg


# ----------------------------------------------------------------------------- legal variants
def _linears(mod: nn.Module):
    return [
        (parent, child_name, child)
        for parent in mod.modules()
        for child_name, child in parent.named_children()
        if type(child) is nn.Linear
    ]


def lazy_variant(cls):
    """The same module with every nn.Linear replaced by an nn.LazyLinear of the same
    output size (the input size is found on the first call)."""

    class Lazy(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for parent, name, lin in _linears(self):
                lazy = nn.LazyLinear(lin.out_features, bias=lin.bias is not None)
                setattr(parent, name, lazy)

    Lazy.__name__ = f"Lazy{cls.__name__}"
    return Lazy


class _Identity(nn.Module):
    def forward(self, w):
        return w


class _IdentityWithInverse(_Identity):
    def right_inverse(self, w):
        return w


def parametrized_variant(cls, parametrization=_IdentityWithInverse):
    """The same module with a parametrization on every nn.Linear weight."""

    class Parametrized(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for _, _, lin in _linears(self):
                parametrize.register_parametrization(lin, "weight", parametrization())

    Parametrized.__name__ = f"Parametrized{cls.__name__}"
    return Parametrized


def buffer_variant(cls):
    """The same module with extra (unused) buffers, a float one and a bool one."""

    class WithBuffers(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("scale_unused", torch.tensor(1.0))
            self.register_buffer("mask_unused", torch.ones(4, 4, dtype=torch.bool).tril())

    WithBuffers.__name__ = f"Buffers{cls.__name__}"
    return WithBuffers


VARIANTS = {
    "lazy": lazy_variant,
    "parametrized": parametrized_variant,
    "parametrized without right_inverse": lambda c: parametrized_variant(c, _Identity),
    "extra buffers": buffer_variant,
}


def _module_alternative(exercise_id: str):
    """The first correct catalog alternative of a module exercise that is a class."""
    for e in ALTERNATIVES:
        if e.exercise == exercise_id and isinstance(e.impl, type):
            return e.impl
    return None


MODULE_IDS = [ex for ex in exercise_ids() if REGISTRY[ex].kind == "module"]
#: Module exercises whose checks must accept every legal variant (the others must at
#: least answer with feedback, never crash).
MUST_PASS = {"self_attention", "rms_norm", "swiglu", "rotary_attention"}

LEGAL = [
    pytest.param(ex, name, id=f"{ex}-{name}")
    for ex in MODULE_IDS
    if _module_alternative(ex) is not None
    for name in VARIANTS
]


# The variants that are not correct modules, so the check must refuse them, with the id it
# must name: the wrapper breaks these alternatives, not the check. Every other legal variant
# of every module exercise must pass.
REFUSED = {
    # FFSequential runs the Linears its nn.Sequential holds; the wrapper replaces only the
    # attributes linear1 and linear2 by LazyLinears, which forward then never calls.
    ("feed_forward", "lazy"): "lazy_not_initialised",
    # Their feed-forward (the reference FeedForward) checks its input against
    # linear1.in_features, which is 0 on a LazyLinear, and raises.
    ("gpt_block", "lazy"): "code_raised",
    ("transformer", "lazy"): "code_raised",
}


@pytest.mark.parametrize(("exercise_id", "variant"), LEGAL)
def test_a_legal_variant_of_a_correct_module_passes_the_check(exercise_id, variant):
    cls = VARIANTS[variant](_module_alternative(exercise_id))
    for kwargs in ({}, dict(seed=2024, thorough=True)):
        msg = _only_feedback(exercise_id, cls, **kwargs)
        refused = REFUSED.get((exercise_id, variant))
        if refused:
            assert msg is not None and mistake_id(msg) == refused, msg
        else:
            assert msg is None, f"{variant} {exercise_id} rejected:\n{msg}"


def test_every_refused_variant_is_a_legal_one():
    assert set(REFUSED) <= {tuple(p.values) for p in LEGAL}


class _Doubling(nn.Module):
    """A parametrization whose right_inverse does not invert it: w -> 2 w."""

    def forward(self, w):
        return 2 * w

    def right_inverse(self, w):
        return w


class _HangingInverse(_Identity):
    """register_parametrization calls right_inverse once; when the check sets the weight
    (the second call), it never returns."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def right_inverse(self, w):
        self.calls += 1
        while self.calls > 1:
            pass
        return w


@pytest.mark.parametrize("exercise_id", ["gpt_block", "grouped_query_attention", "transformer"])
def test_a_parametrization_that_changes_the_weight_is_named(exercise_id):
    cls = parametrized_variant(_module_alternative(exercise_id), _Doubling)
    msg = _only_feedback(exercise_id, cls)
    assert msg is not None and mistake_id(msg) == "parametrization_changes_weight", msg


def test_a_parametrization_that_never_returns_is_stopped_by_the_time_limit():
    cls = parametrized_variant(_module_alternative("gpt_block"), _HangingInverse)
    msg = _only_feedback("gpt_block", cls, time_limit=0.5)
    assert msg is not None and mistake_id(msg) == "infinite_loop", msg
    assert "parametrization did not return" in msg, msg


# ----------------------------------------------------------------------------- self_attention
class _SA(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.project(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w

    def project(self, x):
        return self.w_q(x), self.w_k(x), self.w_v(x)


class FusedQKVParameter(_SA):
    """One nn.Linear for q, k and v: the spec asks for three named layers."""

    def __init__(self, d_in, d_k, d_v):
        nn.Module.__init__(self)
        self.d_k = d_k
        self.qkv = nn.Linear(d_in, 2 * d_k + d_v, bias=False)

    def project(self, x):
        return self.qkv(x).split([self.d_k, self.d_k, self.qkv.out_features - 2 * self.d_k], -1)


class _Doubling(nn.Module):
    def forward(self, w):
        return 2 * w


class _Raising(nn.Module):
    def forward(self, w):
        raise ValueError("my parametrization is broken")


def _with_parametrization(layer: str, parametrization: type[nn.Module]):
    class Parametrized(_SA):
        def __init__(self, d_in, d_k, d_v):
            super().__init__(d_in, d_k, d_v)
            parametrize.register_parametrization(getattr(self, layer), "weight", parametrization())

    return Parametrized


#: A parametrization that changes the weight: the loaded weights do not read back.
ConstrainedWeights = _with_parametrization("w_q", _Doubling)
FailingParametrization = _with_parametrization("w_k", _Raising)


class LazyNeverCalled(_SA):
    """Lazy layers that forward never uses: they stay uninitialized."""

    def __init__(self, d_in, d_k, d_v):
        nn.Module.__init__(self)
        self.w_q = nn.LazyLinear(d_k, bias=False)
        self.w_k = nn.LazyLinear(d_k, bias=False)
        self.w_v = nn.LazyLinear(d_v, bias=False)

    def forward(self, x, mask=None):
        return x, x


@pytest.mark.parametrize(
    ("cls", "expect"),
    [
        (FusedQKVParameter, "no parameter named w_q"),
        (ConstrainedWeights, "reads back as something else"),
        (FailingParametrization, "my parametrization is broken"),
        (LazyNeverCalled, "self_attention: "),
    ],
    ids=["fused qkv", "constrained", "failing parametrization", "lazy never called"],
)
def test_self_attention_explains_modules_it_cannot_load(cls, expect):
    msg = _only_feedback("self_attention", cls)
    assert msg is not None
    assert expect in msg and SAFETY_NET not in msg, msg


def test_the_safety_net_names_the_exercise_and_what_the_check_was_doing(monkeypatch):
    """An error inside a check itself (simulated) comes back as feedback, not a crash."""
    from attention_ref.checks import _core

    ex = _core.REGISTRY["sdpa"]

    def broken(candidate, ctx):
        ctx.call(
            candidate, torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), case="q (1, 2)"
        )
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(ex, "run", broken)
    msg = _only_feedback("sdpa", lambda q, k, v, mask=None: (q, q))
    assert msg.startswith("sdpa: the check could not finish: while checking what your code ")
    assert "returned on q (1, 2), it failed with IndexError: tuple index out of range" in msg
