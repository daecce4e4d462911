"""Checks for notebook 01: ``softmax_np``, ``sdpa_np``, ``sdpa``."""

from __future__ import annotations

import math
import sys

import numpy as np
import torch

from .. import attention as ref
from .. import efficient
from . import _models as M
from ._core import Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    TOL,
    AttnCase,
    as_float64,
    attention_mistakes,
    causal_mask,
    dtype_name,
    earlier_position_changed,
    expect_attention_values,
    expect_not_swapped,
    expect_spec_defaults,
    extreme_score_rows,
    inverted_mask_mistake,
    normal,
    padding_mask,
    random_mask,
    reference_functions,
    scores_case,
)


def _forbidden_attention():
    return [
        (ref.sdpa, "the reference attention_ref.sdpa"),
        (ref.sdpa_np, "the reference attention_ref.sdpa_np"),
        (efficient.naive_attention, "attention_ref's naive_attention"),  # notebook 12's
        *BUILTIN_ATTENTION,
    ]


def _forbidden_softmax():
    out = [
        (ref.softmax_np, "the reference attention_ref.softmax_np"),
        (torch.softmax, "torch.softmax"),
        (torch.nn.functional.softmax, "torch.nn.functional.softmax"),
        *BUILTIN_ATTENTION,  # a softmax is one query's weights: PyTorch's attention computes it
    ]
    special = sys.modules.get("scipy.special")
    if special is not None:
        out.append((special.softmax, "scipy.special.softmax"))
    return out


# ----------------------------------------------------------------------------- softmax_np
def _global_sum_softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum()


def _no_keepdims_softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis))
    return e / np.sum(e, axis=axis)


def _wrong_shift(x: np.ndarray, axis: int) -> bool:
    """True where only a shift by something other than the maximum overflows: every value's
    exp is finite in x's dtype, but a row spans more than that range (so x - min, or x -
    mean, overflows, and x - max cannot)."""
    limit = float(np.log(np.finfo(x.dtype).max))
    span = np.max(x, axis=axis) - np.min(x, axis=axis)
    return bool(np.abs(x).max() < limit and span.max() > limit)


#: id, what the mistaken softmax computes from (x, axis) in float64.
SOFTMAX_MISTAKES = [
    ("softmax_axis_ignored", lambda x, axis: M.softmax(x, -1)),
    ("softmax_wrong_axis", lambda x, axis: M.softmax(x, 0)),
    ("softmax_global_sum", _global_sum_softmax),
    ("keepdims_missing", _no_keepdims_softmax),
]


@exercise("softmax_np", forbidden=_forbidden_softmax, summary="stable softmax in NumPy")
def check_softmax_np(candidate, ctx: Context) -> None:
    rng = ctx.rng(1)
    wide, wide32 = extreme_score_rows(rng, 6), extreme_score_rows(rng, 5, np.float32)
    cases = [
        ("a vector of 5 logits, axis=-1", rng.normal(size=5), -1),
        ("a single logit (one element)", rng.normal(size=1), -1),
        ("a (4, 4) matrix, axis=-1", rng.normal(size=(4, 4)), -1),
        ("a (4, 4) matrix, axis=0", rng.normal(size=(4, 4)), 0),
        ("a (2, 3, 5) array, axis=1", rng.normal(size=(2, 3, 5)), 1),
        ("a (3, 6) float32 matrix, axis=-1", rng.normal(size=(3, 6)).astype(np.float32), -1),
        ("large logits around +1000 (overflow test)", 1000 + 5 * rng.normal(size=(2, 6)), -1),
        (
            "rows at very different scales (+1000 and -1000)",
            np.stack([1000 + rng.normal(size=4), -1000 + rng.normal(size=4)]),
            -1,
        ),
        ("a row spanning more than exp's range (+696, the rest below -210)", wide[:1], -1),
        ("a row of very negative logits (around -1000)", wide[1:], -1),
    ]
    if ctx.thorough:
        cases += [
            ("a float32 row spanning more than exp's range (+87, the rest < -26)", wide32[:1], -1),
            ("a (3, 4, 5, 2) array, axis=2", rng.normal(size=(3, 4, 5, 2)), 2),
            ("a (5, 3) matrix, axis=-2", 3 * rng.normal(size=(5, 3)), -2),
            ("large negative logits around -1000", -1000 + rng.normal(size=(3, 7)), -1),
        ]
    for label, x, axis in cases:
        case = f"{label}; x {x.shape} {x.dtype}"
        got = ctx.call(candidate, x, axis=axis, case=case)
        expected = ref.softmax_np(x.astype(np.float64), axis=axis)
        if isinstance(got, np.ndarray) and _wrong_shift(x, axis) and not np.all(np.isfinite(got)):
            ctx.fail(
                "the result contains NaN or inf on a row whose values span more than exp's "
                "range, although every value on its own is small enough for exp.",
                case=case,
                mistake="softmax_shift_not_max",
            )
        overflow = abs(x).max() > 500
        if overflow and isinstance(got, np.ndarray) and not np.all(np.isfinite(got)):
            ctx.fail(
                "the result contains NaN or inf for large logits.",
                case=case,
                mistake="softmax_unstable",
            )
        ctx.expect_array(got, expected, what="the result", case=case)
        if got.dtype != x.dtype:
            ctx.fail(
                f"the result has dtype {got.dtype}, expected {x.dtype} (the dtype of x).",
                case=case,
                mistake="wrong_dtype",
                hint="NumPy keeps float32 as float32 unless something upcasts it: avoid "
                "np.float64(...), astype(float) or dtype=float in your code.",
            )
        x64 = x.astype(np.float64)
        mistakes = [Mistake.of(i, model=lambda f=f: f(x64, axis)) for i, f in SOFTMAX_MISTAKES]
        tol = TOL[x.dtype.type]
        ctx.expect_close(got, expected, what="the result", case=case, mistakes=mistakes, **tol)
    x = rng.normal(size=(2, 3, 5))  # 3-D: axis=-1 is neither 0 nor 1
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (x,),
        {"axis": -1},
        case="a (2, 3, 5) array, axis left out",
        signature="softmax_np(x, axis=-1)",
    )


# ----------------------------------------------------------------------------- sdpa
def attention_cases(ctx: Context) -> list[AttnCase]:
    """The cases of sdpa_np and sdpa: the shapes and edge cases of COURSE_DESIGN §5."""
    rng = ctx.rng(2)
    # Every query of notebook 01 may attend to at least one key: what to do for a query
    # with none (zeros, not NaN) is notebook 02's exercise, masked_softmax.
    sparse = random_mask(rng, (3, 5), 0.6, attend=0, fully_masked=((1,),))
    sparse[1, 3] = True  # query 1 may attend to key 3 only
    cases = [
        ("one query and one key", (1, 4), (1, 4), (1, 3), None, 1.0),
        ("n_q=3 != n_k=5, d_k=4 != d_v=6", (3, 4), (5, 4), (5, 6), None, 1.0),
        ("a batch of 2, d_k=8, d_v=4", (2, 3, 8), (2, 5, 8), (2, 5, 4), None, 1.0),
        ("two batch dims (2, 2)", (2, 2, 3, 8), (2, 2, 4, 8), (2, 2, 4, 5), None, 1.0),
        ("a batch of one, d_k=16", (1, 6, 16), (1, 6, 16), (1, 6, 16), None, 1.0),
        ("a causal mask (4, 4)", (4, 8), (4, 8), (4, 3), causal_mask(4), 1.0),
        (
            "a padding mask (2, 1, 5) broadcast over queries",
            *((2, 3, 4), (2, 5, 4), (2, 5, 3), padding_mask([5, 3], 5), 1.0),
        ),
        (
            "a mask (3, 5) where query 1 may attend to one key only",
            *((3, 4), (5, 4), (5, 2), sparse, 1.0),
        ),
    ]
    extreme = scores_case(
        "scores at the edges of exp's range (query 0's scores span more than 709.8, query 1's "
        "are all around -1000)",
        extreme_score_rows(rng, 5),
        normal(rng, 5, 3),
    )
    drawn = [_draw(rng, *row) for row in cases] + [_draw_large(rng), extreme]
    if ctx.thorough:
        m = random_mask(rng, (2, 4, 6), 0.5, attend=2)
        cases = [
            ("a batch of 3, n_q=7, n_k=2, d_k=5, d_v=9", (3, 7, 5), (3, 2, 5), (3, 2, 9), None),
            ("a random mask (2, 4, 6)", (2, 4, 3), (2, 6, 3), (2, 6, 4), m),
            ("one key only", (2, 3, 4), (2, 1, 4), (2, 1, 6), None),
        ]
        drawn += [_draw(rng, *row) for row in cases]
    return drawn


def _draw(rng, label, q_shape, k_shape, v_shape, mask, scale=1.0) -> AttnCase:
    """q, k scaled by ``scale`` (large logits), v not."""
    q, k = normal(rng, *q_shape, scale=scale), normal(rng, *k_shape, scale=scale)
    return AttnCase(label, q, k, normal(rng, *v_shape), mask)


#: float64's exp overflows above log(max float64) = 709.78: every score of the large case
#: is above it (tests/test_checks.py proves it), so an unstable softmax fails visibly.
EXP_OVERFLOW = float(np.log(np.finfo(np.float64).max))


def _draw_large(rng) -> AttnCase:
    """Scores around 1000, each above EXP_OVERFLOW and tens apart: q (2, 64) and k (3, 64)
    share one large direction c (c . c / sqrt(64) = 1000), plus N(0, 4) noise."""
    d = 64
    c = np.full(d, math.sqrt(1000 * math.sqrt(d) / d))
    q, k = c + normal(rng, 2, d, scale=2.0), c + normal(rng, 3, d, scale=2.0)
    return AttnCase("large logits (scores around 1000)", q, k, normal(rng, 3, 4), None)


def _to(x: np.ndarray | None, torch_dtype=None):
    if x is None:
        return None
    if torch_dtype is None:
        return x.copy()
    return torch.from_numpy(x).to(torch_dtype if x.dtype != np.bool_ else torch.bool)


def check_attention(candidate, ctx: Context, *, torch_dtype=None) -> None:
    """Shared by sdpa_np (torch_dtype None) and sdpa (torch dtypes)."""
    for c in attention_cases(ctx):
        args = [_to(a, torch_dtype) for a in (c.q, c.k, c.v)]
        mask = _to(c.mask, torch_dtype)
        names = ("q", "k", "v", "mask") if torch_dtype is not None else ("Q", "K", "V", "mask")
        given = [(n, a) for n, a in zip(names, [*args, mask], strict=True) if a is not None]
        case = f"{c.label}: " + ", ".join(f"{n} {tuple(a.shape)}" for n, a in given)
        if torch_dtype is not None:
            case += f", {dtype_name(torch_dtype)}"
        call_args = args if mask is None else [*args, mask]
        got = ctx.call(candidate, *call_args, case=case)
        got = ctx.expect_tuple(got, ("out", "weights"), case=case)
        # Reference in float64 from exactly the values the candidate received.
        out64, w64 = M.attention(*(as_float64(a) for a in args), c.mask)
        like = (
            (args[0].new_zeros(out64.shape), args[0].new_zeros(w64.shape))
            if (torch_dtype is not None)
            else (out64.astype(c.q.dtype), w64.astype(c.q.dtype))
        )
        expect_not_swapped(ctx, got[0], got[1], out64.shape, w64.shape, case=case)
        # Only arrays have shapes: anything else gets expect_array's message below.
        shaped = all(isinstance(g, torch.Tensor | np.ndarray) for g in got)
        if shaped and c.mask is not None and _nan_rows_where_mask_is_full(got[1], c.mask):
            ctx.fail(
                "the weights contain NaN in the rows of queries that may attend to every key.",
                case=case,
                mistake="mask_inverted_nan_rows",
            )
        overflows = np.abs(c.q @ np.swapaxes(c.k, -1, -2)).max() / math.sqrt(c.q.shape[-1])
        if (
            torch_dtype is None
            and overflows > EXP_OVERFLOW
            and shaped
            and not np.all(np.isfinite(as_float64(got[1])))
        ):
            ctx.fail(
                "the weights contain NaN or inf for scores beyond 709.8 in size, where np.exp "
                "overflows in float64 (or, for a row of very negative scores, every exp "
                "underflows to 0).",
                case=case,
                mistake="softmax_unstable",
            )
        ctx.expect_array(got[1], like[1], what="weights", case=case)
        ctx.expect_array(got[0], like[0], what="out", case=case)
        if (
            w64.shape == out64.shape
            and np.allclose(as_float64(got[0]), w64, atol=1e-5)
            and not np.allclose(w64, out64, atol=1e-5)
        ):
            ctx.fail("out holds the attention weights.", case=case, mistake="outputs_swapped")
        expect_attention_values(
            ctx,
            *got,
            out64,
            w64,
            case=case,
            allowed=c.mask,
            mistakes=lambda which, c=c: [
                *attention_mistakes(c, which),
                *_float32_scale_mistake(c, which, torch_dtype),
            ],
            tol=_score_rounding_tol(c, torch_dtype, overflows),
            out_hint="the weights are right: out = weights @ v.",
            otherwise=named("mask_not_applied_before_softmax"),
            masked_mistakes=(inverted_mask_mistake(c.mask),) if c.mask is not None else (),
        )
    if torch_dtype is not None and ctx.thorough:
        _check_causal_leak(candidate, ctx, torch_dtype)


def _score_rounding_tol(c: AttnCase, torch_dtype, largest_score: float) -> dict:
    """The dtype's tolerance, widened where the scores are large: a float32 score of about
    1000, a sum of 64 rounded products, is off by a few times 1000 x 2^-24 whatever the
    implementation, and the weights carry that as a relative error (a correct einsum missed
    the plain tolerance by 13% on one seed of the large-logits case). Eight times the
    dtype's epsilon times the largest score, as rtol and (times the largest value) as atol;
    unchanged for scores of a few units (the widening stays under the plain rtol)."""
    tol = TOL[np.float64 if torch_dtype is None else torch_dtype]
    if torch_dtype is None:
        return tol
    spread = 8 * torch.finfo(torch_dtype).eps * largest_score
    if spread <= tol["rtol"]:
        return tol
    return dict(rtol=spread, atol=max(tol["atol"], spread * float(np.abs(c.v).max())))


def _float32_scale_mistake(c: AttnCase, which: int, torch_dtype) -> list[Mistake]:
    """On float64 tensors, the tutorials' ``/ torch.sqrt(torch.tensor(d_k,
    dtype=torch.float32))``: a scale rounded to float32 (exact for d_k = 4, 16, 64, ...,
    where the model is the right answer and names nothing); ``which`` 0 = out, 1 = weights."""
    if torch_dtype != torch.float64:
        return []
    q, k, v = (as_float64(a) for a in (c.q, c.k, c.v))
    scale = float(np.sqrt(np.float32(q.shape[-1])))

    def model():
        return M.attention(q, k, v, c.mask, scale=scale)[which]

    return [Mistake.of("scale_float32", model=model)]


def _nan_rows_where_mask_is_full(weights, mask: np.ndarray) -> bool:
    """NaN rows exactly where the mask allows every key: the mark of an inverted mask
    filled with -inf."""
    if not isinstance(weights, np.ndarray | torch.Tensor) or weights.ndim < 2:
        return False
    w = as_float64(weights)
    try:
        full = np.broadcast_to(mask.all(axis=-1), w.shape[:-1])
    except ValueError:
        return False
    nan_rows = np.isnan(w).any(axis=-1)
    return bool(nan_rows.any() and np.array_equal(nan_rows, full))


def _check_causal_leak(candidate, ctx: Context, dtype) -> None:
    """Changing a future key and value must not change an earlier output."""
    g = ctx.torch_gen(7)
    n, d = 6, 4
    q, k, v = (torch.randn(1, n, d, generator=g, dtype=dtype) for _ in range(3))
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    out1, _ = ctx.call(candidate, q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, -1] += 5.0
    v2[:, -1] += 5.0
    out2, _ = ctx.call(candidate, q, k2, v2, mask)
    i = earlier_position_changed(out1, out2, atol=1e-6)
    if i is not None:
        ctx.fail(
            f"future attention not masked: changing token {n - 1} changed the output of "
            f"earlier query {i}.",
            case="causal mask (6, 6)",
            mistake="mask_not_applied",
        )


@exercise("sdpa_np", forbidden=_forbidden_attention, summary="attention in NumPy")
def check_sdpa_np(candidate, ctx: Context) -> None:
    """Graded with the reference softmax_np in place of the learner's (exercise 1 earns its
    own points): a softmax the learner writes inside sdpa_np is graded here."""
    with reference_functions(candidate, softmax_np=ref.softmax_np):
        check_attention(candidate, ctx, torch_dtype=None)


@exercise("sdpa", forbidden=_forbidden_attention, summary="batched attention in PyTorch")
def check_sdpa(candidate, ctx: Context) -> None:
    check_attention(candidate, ctx, torch_dtype=torch.float64)
    check_attention(candidate, ctx, torch_dtype=torch.float32)
