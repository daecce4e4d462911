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

from .. import multihead as ref_mha
from .. import self_attention as ref
from . import _models as M
from ._core import ERROR_PATTERNS, Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    TOL,
    AttnCase,
    as_float64,
    attention_mistakes,
    build_module,
    causal_mask,
    dtype_name,
    earlier_position_changed,
    expect_attention_values,
    expect_not_swapped,
    inverted_mask_mistake,
    load_linear_weights,
    normal,
    padding_mask,
    random_mask,
)

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
    """The shapes and edge cases of COURSE_DESIGN §5, as SelfAttention(d_in, d_k, d_v)
    and x (..., T, d_in)."""
    rng = ctx.rng(31)
    dead = random_mask(rng, (4, 4), 0.6, attend=0, fully_masked=((2,),))
    rows = [
        ("one token, a batch of one", (4, 3, 2), (1, 1, 4), None, 1.0),
        ("a batch of 2, T=5, d_in=6, d_k=4, d_v=3", (6, 4, 3), (2, 5, 6), None, 1.0),
        ("no batch dimension: x (T=4, d_in=5)", (5, 3, 4), (4, 5), None, 1.0),
        ("two batch dims (2, 3), T=4", (6, 4, 5), (2, 3, 4, 6), None, 1.0),
        ("d_in = d_k = d_v = 8", (8, 8, 8), (2, 4, 8), None, 1.0),
        ("a causal mask (5, 5)", (6, 4, 3), (2, 5, 6), causal_mask(5), 1.0),
        (
            "a padding mask (2, 1, 5): sequence 1 has 3 real tokens",
            *((4, 4, 6), (2, 5, 4), padding_mask([5, 3], 5), 1.0),
        ),
        ("a mask (4, 4) with a fully masked row (query 2)", (5, 3, 2), (1, 4, 5), dead, 1.0),
        ("large inputs (scores in the hundreds)", (6, 4, 3), (2, 5, 6), None, 5.0),
    ]
    cases = [SACase(label, *dims, normal(rng, *x, scale=s), m) for label, dims, x, m, s in rows]
    if ctx.thorough:
        m = random_mask(rng, (3, 7, 7), 0.5, attend=0)
        rows = [
            ("a batch of 3, T=7, d_in=16, d_k=8, d_v=12", (16, 8, 12), (3, 7, 16), None),
            ("a random mask (3, 7, 7)", (5, 6, 4), (3, 7, 5), m),
            ("d_k = 1", (3, 1, 2), (2, 6, 3), None),
            ("two tokens, d_in=2", (2, 3, 3), (4, 2, 2), None),
        ]
        cases += [SACase(label, *dims, normal(rng, *x), m) for label, dims, x, m in rows]
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
        m("queries_keys_swapped", lambda: M.attention(K, Q, V, mask)),
        m("keys_from_w_q", lambda: M.attention(Q, Q, V, mask)),
        m("queries_from_w_k", lambda: M.attention(K, K, V, mask)),
    ]
    if c.d_in != c.d_k:
        out.append(m("scale_by_d_in", lambda: M.attention(Q, K, V, mask, scale=math.sqrt(c.d_in))))
    if c.d_in == c.d_k == c.d_v:
        out += [
            m("linear_weight_transposed", lambda: M.attention(x @ Wq.T, x @ Wk.T, x @ Wv.T, mask)),
            m("weights_times_x", lambda: M.attention(Q, K, x, mask)),
        ]
    if c.d_k == c.d_v:
        out.append(m("values_from_w_k", lambda: M.attention(Q, K, K, mask)))
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
    likely = {"extra w_o": named("sa_extra_w_o")}
    load_linear_weights(ctx, mod, layers, case, raw_ok=True, likely=likely)
    return mod


def _check_case(cls, ctx: Context, c: SACase, W, dtype) -> None:
    x = torch.from_numpy(c.x).to(dtype)
    mask = None if c.mask is None else torch.from_numpy(c.mask)
    case = (
        f"{c.label}: SelfAttention(d_in={c.d_in}, d_k={c.d_k}, d_v={c.d_v}), "
        f"x {tuple(x.shape)} {dtype_name(dtype)}"
        + ("" if mask is None else f", mask {tuple(mask.shape)}")
    )
    mod = _prepare(cls, ctx, c.d_in, c.d_k, c.d_v, W, dtype, case)
    # The reference, in float64, from exactly the weights and inputs the candidate has.
    W64 = {k: torch.from_numpy(v.T).to(dtype).double().numpy().T for k, v in W.items()}
    x64 = as_float64(x)
    Q, K, V = x64 @ W64["w_q"], x64 @ W64["w_k"], x64 @ W64["w_v"]
    out64, w64 = M.attention(Q, K, V, c.mask)

    args = (x,) if mask is None else (x, mask)
    got = ctx.expect_tuple(ctx.call(mod, *args, case=case), ("out", "weights"), case=case)
    out, weights = got
    expect_not_swapped(ctx, out, weights, out64.shape, w64.shape, case=case, types=torch.Tensor)
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
                mistake="wrong_shape",
            )
    ctx.expect_array(weights, x.new_zeros(w64.shape), what="weights", case=case)
    ctx.expect_array(out, x.new_zeros(out64.shape), what="out", case=case)
    expect_attention_values(
        ctx,
        out,
        weights,
        out64,
        w64,
        case=case,
        allowed=c.mask,
        mistakes=lambda which: _sa_mistakes(c, x64, W64, which),
        tol=TOL[dtype],
        out_hint="the weights are right: out = weights @ v with v = self.w_v(x).",
        otherwise=named("mask_not_applied_before_softmax"),
        masked_mistakes=(inverted_mask_mistake(c.mask),) if c.mask is not None else (),
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
            f"permutation equivariance: x {tuple(x.shape)} {dtype_name(dtype)} and the same tokens "
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
            g, e = as_float64(got), as_float64(want)
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
    i = earlier_position_changed(out1, out2, atol=1e-9)
    if i is not None:
        ctx.fail(
            f"future attention not masked: changing token {T - 1} changed the output of the "
            f"earlier token {i}.",
            case=case,
            mistake="mask_not_applied",
        )
