"""Checks for notebook 03: the module exercise ``self_attention``.

The candidate is the learner's class ``SelfAttention(d_in, d_k, d_v)``. The check builds
it, copies the reference's weights into it by parameter name (``w_q``, ``w_k``, ``w_v``:
``nn.Linear`` without bias; a raw ``nn.Parameter`` of shape ``(d_in, d_out)`` used as
``x @ w_q`` is accepted too), and compares its forward with the reference computed in
float64 from the same weights and inputs. It also checks that self-attention without a
mask is permutation-equivariant and, in the graded run, that a causal mask stops the
future from leaking into the past.

Lazy layers (``nn.LazyLinear``) get their shapes from one call on a small input before the
weights are loaded; parametrized weights (``torch.nn.utils.parametrize``) are set through
their ``right_inverse`` (or their original tensor) and must read back as loaded. Calling
``attention_ref.sdpa`` / ``masked_softmax`` inside the module is allowed (the spec says so:
the exercise is the projections); the reference modules and PyTorch's attention are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize

from .. import multihead as ref_mha
from .. import self_attention as ref
from . import _models as M
from ._core import ERROR_PATTERNS, Context, Mistake, exercise
from .mistakes import named
from .nb01 import BUILTIN_ATTENTION, TOL, AttnCase, attention_mistakes, inverted_mask_mistake

# A learner's shape error on a line that multiplies by an nn.Linear's raw weight.
_LINEAR_WEIGHT_PATTERN = (
    r"@\s*[\w.]*\.weight\b(?!\s*\.(T|mT|t\(\)))",
    r"cannot be multiplied|mismatch|shape|size",
    named("linear_weight_transposed"),
)
if _LINEAR_WEIGHT_PATTERN not in ERROR_PATTERNS:
    ERROR_PATTERNS.append(_LINEAR_WEIGHT_PATTERN)


def _forbidden():
    return [
        (ref.SelfAttention.forward, "the reference attention_ref.SelfAttention"),
        (ref_mha.MultiHeadAttention.forward, "the reference attention_ref.MultiHeadAttention"),
        *BUILTIN_ATTENTION,
    ]


def _np(x) -> np.ndarray:
    return x.detach().cpu().double().numpy()


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------- weights
def build_module(
    ctx: Context,
    cls,
    args: tuple,
    kwargs: dict,
    case: str,
    *,
    sample: tuple | None = None,
) -> nn.Module:
    """Instantiate the learner's class (guarded) and make sure it is an nn.Module.

    With ``sample`` (inputs for one forward call), a module with lazy layers
    (``nn.LazyLinear``) is run once on them so its parameters get their shapes before
    weights are loaded; the check converts the module to the sample's dtype first.
    """
    mod = ctx.call(cls, *args, case=case, call_name=f"{_name(cls)}(...)", **kwargs)
    if not isinstance(mod, nn.Module):
        ctx.fail(
            f"{_name(cls)}(...) did not build an nn.Module; got {type(mod).__name__}.",
            case=case,
            hint="subclass torch.nn.Module and call super().__init__() first in __init__.",
        )
    if sample is not None:
        materialize_lazy(ctx, mod, sample, case)
    return mod


def _name(cls) -> str:
    return getattr(cls, "__name__", type(cls).__name__)


def _lazy(mod: nn.Module) -> list[str]:
    return [n for n, p in mod.named_parameters() if is_lazy(p)]


def materialize_lazy(ctx: Context, mod: nn.Module, sample: tuple, case: str) -> None:
    """Give lazy parameters (``nn.LazyLinear``) their shapes by one forward call on
    ``sample`` (guarded like any call of the learner's code). Nothing happens for a module
    without lazy parameters."""
    if not _lazy(mod):
        return
    dtypes = {a.dtype for a in sample if isinstance(a, torch.Tensor) and a.is_floating_point()}
    if len(dtypes) == 1:
        mod.to(dtypes.pop())
    n = ctx.cases_run  # a set-up call, not a case
    with torch.no_grad():
        ctx.call(mod, *sample, case=case + " (a first call that sets up your lazy layers)")
    ctx.cases_run = n


def _weight_slot(mod: nn.Module, name: str) -> nn.Module | None:
    """The submodule ``name`` (dotted paths allowed) if it holds a ``weight`` tensor."""
    try:
        sub = mod.get_submodule(name)
    except (AttributeError, TypeError):
        return None
    try:
        w = sub.weight
    except Exception:  # noqa: BLE001 - no weight, or a parametrization that fails
        return sub if parametrize.is_parametrized(sub, "weight") else None
    return sub if isinstance(w, torch.Tensor) else None


def load_linear_weights(
    ctx: Context,
    mod: nn.Module,
    layers: dict[str, tuple[torch.Tensor, torch.Tensor | None, str]],
    case: str,
    *,
    raw_ok: bool,
    likely: dict[str, str] | None = None,
) -> None:
    """Copy weights into the learner's module by parameter name.

    ``layers`` maps an attribute name (``"w_q"``) to ``(weight (out, in), bias or None,
    spec)`` where ``spec`` is how the learner must declare it (``"nn.Linear(d_in=6,
    d_k=4, bias=False)"``). With ``raw_ok`` a bias-free layer may instead be a raw
    ``nn.Parameter`` of shape ``(in, out)`` used as ``x @ w``. ``likely`` maps a
    situation (``"missing w_o"``, ``"extra w_o"``, ``"shape w_q"``) to the likely mistake.

    A layer's weight may be parametrized (``torch.nn.utils.parametrize``): the weight is
    set through the parametrization (its ``right_inverse``, or its original tensor when
    the parametrization has none) and must then read back as loaded. Lazy parameters must
    have been materialized first (:func:`materialize_lazy`); if not, that is feedback.
    """
    likely = likely or {}
    params = dict(mod.named_parameters())
    lazy = _lazy(mod)
    if lazy:
        ctx.fail(
            f"your module's parameters {', '.join(lazy)} are lazy (nn.LazyLinear or "
            "similar) and still have no shape, so the check cannot load known weights.",
            case=case,
            hint="declare the layers with their sizes, e.g. " + next(iter(layers.values()))[2],
        )
    used: set[str] = set()
    for name, (weight, bias, spec) in layers.items():
        out_f, in_f = weight.shape
        sub = _weight_slot(mod, name)
        parametrized = sub is not None and parametrize.is_parametrized(sub, "weight")
        if f"{name}.weight" in params or parametrized:
            if parametrized:
                ctx.cases_run -= 1  # reading the weight is set-up, not a case
                p = ctx.call(
                    getattr, sub, "weight", case=case, call_name=f"{name}'s parametrization"
                )
            else:
                p = params[f"{name}.weight"]
            if tuple(p.shape) != (out_f, in_f):
                why = likely.get(f"shape {name}", "")
                if tuple(p.shape) == (in_f, out_f) and in_f != out_f:
                    why = named("linear_in_out_swapped")
                ctx.fail(
                    f"{name}.weight has shape {tuple(p.shape)}, expected ({out_f}, {in_f}): "
                    f"declare self.{name} = {spec}.",
                    case=case,
                    likely=why,
                )
            if parametrized:
                used |= _load_parametrized(ctx, sub, name, weight, case)
            else:
                _copy(p, weight)
                used.add(f"{name}.weight")
            has_bias = f"{name}.bias" in params
            if bias is None and has_bias:
                ctx.fail(
                    f"{name} has a bias, but this exercise asks for none: declare "
                    f"self.{name} = {spec}.",
                    case=case,
                    mistake="bias_by_default",
                )
            if bias is not None and not has_bias:
                ctx.fail(
                    f"{name} has no bias, but this module was built with bias=True: "
                    f"declare self.{name} = {spec}.",
                    case=case,
                    mistake="bias_argument_ignored",
                )
            if bias is not None:
                b = params[f"{name}.bias"]
                if tuple(b.shape) != tuple(bias.shape):
                    ctx.fail(
                        f"{name}.bias has shape {tuple(b.shape)}, expected "
                        f"{tuple(bias.shape)}: declare self.{name} = {spec}.",
                        case=case,
                    )
                _copy(b, bias)
                used.add(f"{name}.bias")
        elif raw_ok and bias is None and name in params:
            p = params[name]
            if tuple(p.shape) != (in_f, out_f):
                ctx.fail(
                    f"the parameter {name} has shape {tuple(p.shape)}; a raw weight matrix "
                    f"must have shape ({in_f}, {out_f}) and be used as x @ {name}.",
                    case=case,
                    hint=f"or declare self.{name} = {spec}.",
                )
            _copy(p, weight.T)
            used.add(name)
        elif name in params:  # a raw nn.Parameter where this case needs a layer
            why = (
                f"{name} is a raw parameter, which cannot hold the bias this module was "
                "built with (bias=True)"
                if bias is not None
                else f"{name} is a raw parameter where this exercise asks for a layer"
            )
            ctx.fail(f"{why}: declare self.{name} = {spec}.", case=case, mistake="raw_parameter")
        else:
            missing = ", ".join(layers)
            has = ", ".join(params) or "none"
            ctx.fail(
                f"your module has no parameter named {name} (its parameters: {has}): the "
                f"check copies known weights into {missing} by name, so declare "
                f"self.{name} = {spec}.",
                case=case,
                mistake="parameter_names",
                likely=likely.get(f"missing {name}", ""),
            )
    extra = sorted(set(params) - used)
    if extra:
        why = [
            likely[f"extra {n.split('.')[0]}"]
            for n in extra
            if f"extra {n.split('.')[0]}" in likely
        ]
        ctx.fail(
            f"your module has parameters the exercise does not ask for: {', '.join(extra)}.",
            case=case,
            likely=why[0] if why else "",
            hint=f"this module has exactly the parameters of {', '.join(layers)} as specified; "
            "anything else is left at a random value and changes the output.",
        )


def _load_parametrized(ctx: Context, sub: nn.Module, name: str, weight, case: str) -> set[str]:
    """Set a parametrized ``sub.weight`` to ``weight``; return the parameter names used."""
    plist = sub.parametrizations["weight"]
    value = weight.to(dtype=plist.original.dtype, device=plist.original.device)

    def assign():
        with torch.no_grad():
            try:
                sub.weight = value  # through the parametrization's right_inverse
            except RuntimeError as err:
                if "right_inverse" not in str(err) or not hasattr(plist, "original"):
                    raise
                plist.original.copy_(value)  # no right_inverse: load the original itself
        return sub.weight

    n = ctx.cases_run  # set-up calls, not cases
    loaded = ctx.call(assign, case=case, call_name=f"{name}'s parametrization")
    ctx.cases_run = n
    if (
        not isinstance(loaded, torch.Tensor)
        or loaded.shape != value.shape
        or not torch.allclose(loaded.detach(), value, rtol=1e-5, atol=1e-6)
    ):
        ctx.fail(
            f"{name}.weight is parametrized, and after loading the check's weight into it, "
            f"{name}.weight reads back as something else.",
            case=case,
            mistake="parametrization_changes_weight",
            hint=f"remove the parametrization from {name}, or give it a right_inverse that "
            "inverts it exactly.",
        )
    prefix = f"{name}.parametrizations.weight."
    return {prefix + n for n, _ in plist.named_parameters()}


def _copy(p: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        p.copy_(value.to(dtype=p.dtype, device=p.device))


# ----------------------------------------------------------------------------- cases
@dataclass
class SACase:
    label: str
    d_in: int
    d_k: int
    d_v: int
    x: np.ndarray
    mask: np.ndarray | None = None


def _cases(ctx: Context) -> list[SACase]:
    rng = ctx.rng(31)

    def r(*shape, scale=1.0):
        return scale * rng.normal(size=shape)

    causal = np.tril(np.ones((5, 5), dtype=bool))
    pad = np.ones((2, 1, 5), dtype=bool)
    pad[1, :, 3:] = False
    dead = rng.random((4, 4)) < 0.6
    dead[:, 0] = True
    dead[2, :] = False
    cases = [
        SACase("one token, a batch of one", 4, 3, 2, r(1, 1, 4)),
        SACase("a batch of 2, T=5, d_in=6, d_k=4, d_v=3", 6, 4, 3, r(2, 5, 6)),
        SACase("no batch dimension: x (T=4, d_in=5)", 5, 3, 4, r(4, 5)),
        SACase("two batch dims (2, 3), T=4", 6, 4, 5, r(2, 3, 4, 6)),
        SACase("d_in = d_k = d_v = 8", 8, 8, 8, r(2, 4, 8)),
        SACase("a causal mask (5, 5)", 6, 4, 3, r(2, 5, 6), causal),
        SACase("a padding mask (2, 1, 5): sequence 1 has 3 real tokens", 4, 4, 6, r(2, 5, 4), pad),
        SACase("a mask (4, 4) with a fully masked row (query 2)", 5, 3, 2, r(1, 4, 5), dead),
        SACase("large inputs (scores in the hundreds)", 6, 4, 3, r(2, 5, 6, scale=5.0)),
    ]
    if ctx.thorough:
        m = rng.random((3, 7, 7)) < 0.5
        m[:, :, 0] = True
        cases += [
            SACase("a batch of 3, T=7, d_in=16, d_k=8, d_v=12", 16, 8, 12, r(3, 7, 16)),
            SACase("a random mask (3, 7, 7)", 5, 6, 4, r(3, 7, 5), m),
            SACase("d_k = 1", 3, 1, 2, r(2, 6, 3)),
            SACase("two tokens, d_in=2", 2, 3, 3, r(4, 2, 2)),
        ]
    return cases


def _weights(ctx: Context, salt: int, d_in: int, d_k: int, d_v: int) -> dict[str, np.ndarray]:
    """Reference projections in the ``x @ W`` layout, ``W (d_in, d_out)``, float64."""
    rng = ctx.rng(salt)
    return {
        "w_q": rng.normal(size=(d_in, d_k)) / math.sqrt(d_in),
        "w_k": rng.normal(size=(d_in, d_k)) / math.sqrt(d_in),
        "w_v": rng.normal(size=(d_in, d_v)) / math.sqrt(d_in),
    }


def _sa_mistakes(c: SACase, x, W, which: int) -> list[Mistake]:
    """Mistakes of self-attention: those of attention on the projected Q, K, V (nb01),
    plus the ones about the projections themselves."""
    Wq, Wk, Wv = W["w_q"], W["w_k"], W["w_v"]
    Q, K, V = x @ Wq, x @ Wk, x @ Wv
    mask = c.mask
    T = x.shape[-2]

    def m(mistake_id, fn):
        return Mistake.of(mistake_id, model=lambda: fn()[which])

    out = [
        m(
            "queries_keys_swapped",
            lambda: M.attention(K, Q, V, mask),
        ),
        m(
            "keys_from_w_q",
            lambda: M.attention(Q, Q, V, mask),
        ),
        m(
            "queries_from_w_k",
            lambda: M.attention(K, K, V, mask),
        ),
    ]
    if c.d_in != c.d_k:
        out.append(
            m(
                "scale_by_d_in",
                lambda: M.attention(Q, K, V, mask, scale=math.sqrt(c.d_in)),
            )
        )
    if c.d_in == c.d_k == c.d_v:
        out += [
            m(
                "linear_weight_transposed",
                lambda: M.attention(x @ Wq.T, x @ Wk.T, x @ Wv.T, mask),
            ),
            m(
                "weights_times_x",
                lambda: M.attention(Q, K, x, mask),
            ),
        ]
    if c.d_k == c.d_v:
        out.append(
            m(
                "values_from_w_k",
                lambda: M.attention(Q, K, K, mask),
            )
        )
    if mask is None and T > 1:
        out.append(
            m(
                "causal_mask_by_default",
                lambda: M.attention(Q, K, V, np.tril(np.ones((T, T), dtype=bool))),
            )
        )
    out += attention_mistakes(AttnCase(c.label, Q, K, V, mask), which)
    return out


# ----------------------------------------------------------------------------- the check
@exercise(
    "self_attention",
    kind="module",
    forbidden=_forbidden,
    summary="self-attention with learned W_Q, W_K, W_V",
)
def check_self_attention(cls, ctx: Context) -> None:
    for i, c in enumerate(_cases(ctx)):
        W = _weights(ctx, 100 + i, c.d_in, c.d_k, c.d_v)
        for dtype in (torch.float64, torch.float32):
            _check_case(cls, ctx, c, W, dtype)
    _check_permutation_equivariance(cls, ctx)
    if ctx.thorough:
        _check_causal_leak(cls, ctx)


def _spec(d_in: int, d_out: int, out_name: str) -> str:
    return f"nn.Linear(d_in, {out_name}, bias=False), here nn.Linear({d_in}, {d_out}, bias=False)"


def _prepare(cls, ctx: Context, d_in, d_k, d_v, W, dtype, case) -> nn.Module:
    sample = (torch.zeros(1, 2, d_in, dtype=dtype),)
    mod = build_module(ctx, cls, (d_in, d_k, d_v), {}, case, sample=sample)
    mod.to(dtype)
    layers = {
        "w_q": (torch.from_numpy(W["w_q"].T).to(dtype), None, _spec(d_in, d_k, "d_k")),
        "w_k": (torch.from_numpy(W["w_k"].T).to(dtype), None, _spec(d_in, d_k, "d_k")),
        "w_v": (torch.from_numpy(W["w_v"].T).to(dtype), None, _spec(d_in, d_v, "d_v")),
    }
    load_linear_weights(
        ctx,
        mod,
        layers,
        case,
        raw_ok=True,
        likely={
            "extra w_o": named("sa_extra_w_o"),
        },
    )
    return mod


def _check_case(cls, ctx: Context, c: SACase, W, dtype) -> None:
    x = torch.from_numpy(c.x).to(dtype)
    mask = None if c.mask is None else torch.from_numpy(c.mask)
    case = (
        f"{c.label}: SelfAttention(d_in={c.d_in}, d_k={c.d_k}, d_v={c.d_v}), "
        f"x {tuple(x.shape)} {_dt(dtype)}" + ("" if mask is None else f", mask {tuple(mask.shape)}")
    )
    mod = _prepare(cls, ctx, c.d_in, c.d_k, c.d_v, W, dtype, case)
    # The reference, in float64, from exactly the weights and inputs the candidate has.
    W64 = {k: torch.from_numpy(v.T).to(dtype).double().numpy().T for k, v in W.items()}
    x64 = _np(x)
    Q, K, V = x64 @ W64["w_q"], x64 @ W64["w_k"], x64 @ W64["w_v"]
    out64, w64 = M.attention(Q, K, V, c.mask)

    args = (x,) if mask is None else (x, mask)
    got = ctx.expect_tuple(ctx.call(mod, *args, case=case), ("out", "weights"), case=case)
    out, weights = got
    if (
        isinstance(out, torch.Tensor)
        and isinstance(weights, torch.Tensor)
        and tuple(out.shape) == w64.shape
        and tuple(weights.shape) == out64.shape
        and w64.shape != out64.shape
    ):
        ctx.fail(
            "the outputs come back in the wrong order.", case=case, mistake="outputs_swapped_order"
        )
    if (
        isinstance(out, torch.Tensor)
        and tuple(out.shape) != out64.shape
        and out.dim() >= 1
        and out.shape[-1] != c.d_v
    ):
        # A feature count of d_in or d_k names where the "values" came from.
        causes = {"d_in": named("weights_times_x"), "d_k": named("sa_values_from_w_k")}
        found = [n for n, size in (("d_in", c.d_in), ("d_k", c.d_k)) if out.shape[-1] == size]
        if found:
            ctx.fail(
                f"out has shape {tuple(out.shape)}, expected {out64.shape}: it has "
                f"{' = '.join(found)} features instead of d_v={c.d_v}.",
                case=case,
                likely=causes[found[0]]
                if len(found) == 1
                else "; or ".join(causes[n][:-1] for n in found) + ".",
                hint="out = weights @ v with v = self.w_v(x).",
            )
    like_w = x.new_zeros(w64.shape)
    like_out = x.new_zeros(out64.shape)
    ctx.expect_array(weights, like_w, what="weights", case=case)
    ctx.expect_array(out, like_out, what="out", case=case)
    tol = TOL[dtype]
    if c.mask is not None:
        w = _np(weights)
        masked = ~np.broadcast_to(c.mask, w.shape)
        if np.any(w[masked] != 0):
            idx = tuple(int(i) for i in np.argwhere(masked & (w != 0))[0])
            mistakes = [inverted_mask_mistake(c.mask), *_sa_mistakes(c, x64, W64, 1)]
            likely, hint = ctx.diagnose(weights, w64, mistakes, (), {})
            ctx.fail(
                f"a masked position has nonzero weight {w[idx]:.3g} at index {idx} "
                "(masked weights must be exactly 0).",
                case=case,
                likely=likely or "the mask is not applied before the softmax.",
                hint=hint or "fill masked scores with -inf before the softmax.",
            )
    ctx.expect_close(
        weights, w64, what="weights", case=case, mistakes=_sa_mistakes(c, x64, W64, 1), **tol
    )
    ctx.expect_close(
        out,
        out64,
        what="out",
        case=case,
        mistakes=_sa_mistakes(c, x64, W64, 0),
        hint="the weights are right: out = weights @ v with v = self.w_v(x).",
        **tol,
    )


def _check_permutation_equivariance(cls, ctx: Context) -> None:
    """Without a mask, permuting the tokens permutes the outputs the same way."""
    rng = ctx.rng(32)
    d_in, d_k, d_v, T = 6, 4, 5, 7
    W = _weights(ctx, 33, d_in, d_k, d_v)
    perm = rng.permutation(T)
    while np.all(perm == np.arange(T)):  # pragma: no cover - astronomically unlikely
        perm = rng.permutation(T)
    for dtype in (torch.float64, torch.float32):
        x = torch.from_numpy(rng.normal(size=(2, T, d_in))).to(dtype)
        case = (
            f"permutation equivariance: x {tuple(x.shape)} {_dt(dtype)} and the same tokens "
            f"in the order {perm.tolist()}"
        )
        mod = _prepare(cls, ctx, d_in, d_k, d_v, W, dtype, case)
        out, w = ctx.expect_tuple(ctx.call(mod, x, case=case), ("out", "weights"), case=case)
        out_p, w_p = ctx.expect_tuple(
            ctx.call(mod, x[:, perm], case=case), ("out", "weights"), case=case
        )
        tol = TOL[dtype]
        p = torch.from_numpy(perm)
        for what, got, want in (
            ("out of the permuted input", out_p, out[:, p]),
            ("weights of the permuted input", w_p, w[:, p][:, :, p]),
        ):
            g, e = _np(got), _np(want)
            if g.shape != e.shape or not np.allclose(g, e, **tol):
                ctx.fail(
                    f"self-attention without a mask must be permutation-equivariant, but the "
                    f"{what} is not the original one permuted the same way "
                    "(out[perm] for the outputs, weights[perm][:, perm] for the weights).",
                    case=case,
                    mistake="position_dependent",
                )


def _check_causal_leak(cls, ctx: Context) -> None:
    """With a causal mask, changing the last token must not change earlier outputs."""
    d_in, d_k, d_v, T = 5, 4, 3, 6
    W = _weights(ctx, 34, d_in, d_k, d_v)
    rng = ctx.rng(35)
    x = torch.from_numpy(rng.normal(size=(1, T, d_in)))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    case = f"causal mask ({T}, {T}); the last token of x {tuple(x.shape)} changed"
    mod = _prepare(cls, ctx, d_in, d_k, d_v, W, torch.float64, case)
    out1, _ = ctx.expect_tuple(ctx.call(mod, x, mask, case=case), ("out", "weights"), case=case)
    x2 = x.clone()
    x2[:, -1] += 3.0
    out2, _ = ctx.expect_tuple(ctx.call(mod, x2, mask, case=case), ("out", "weights"), case=case)
    changed = (out1[0, :-1] - out2[0, :-1]).abs().amax(-1) > 1e-9
    if changed.any():
        i = int(changed.nonzero()[0])
        ctx.fail(
            f"future attention not masked: changing token {T - 1} changed the output of the "
            f"earlier token {i}.",
            case=case,
            mistake="mask_not_applied",
        )
