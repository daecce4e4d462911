"""Checks for notebook 02: ``padding_mask``, ``causal_mask``, ``masked_softmax``."""

from __future__ import annotations

import numpy as np
import torch

from .. import gpt
from .. import masking as ref
from . import _models as M
from ._core import Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    TOL,
    additive_softmax,
    causal_mask,
    dtype_name,
    expect_follows_device,
    expect_masked_weights_zero,
    expect_spec_defaults,
    extreme_score_rows,
    inverted_mask_mistake,
    padding_mask,
    random_mask,
    rows_not_summing_to_one,
)


def _forbid(name):
    return lambda: [(getattr(ref, name), f"the reference attention_ref.{name}")]


def _expect_bool_mask(ctx: Context, got, shape: tuple[int, ...], case: str) -> None:
    if not isinstance(got, torch.Tensor):
        ctx.fail(
            f"must return a torch.Tensor; got {type(got).__name__}.",
            case=case,
            mistake="wrong_type",
        )
    if got.dtype != torch.bool:
        ctx.fail(
            f"the mask must be boolean (True = may attend); got dtype {got.dtype}.",
            case=case,
            mistake=named("mask_not_boolean", comparison="a < b"),
        )
    if tuple(got.shape) != shape:
        likely = ""
        if tuple(got.shape) == shape[::-1] and len(shape) == 2 and shape[0] != shape[1]:
            likely = named("mask_transposed")
        ctx.fail(
            f"the mask has shape {tuple(got.shape)}, expected {shape}.",
            case=case,
            likely=likely,
            mistake="wrong_shape",
        )


# ----------------------------------------------------------------------------- padding_mask
@exercise("padding_mask", forbidden=_forbid("padding_mask"), summary="True at real tokens")
def check_padding_mask(candidate, ctx: Context) -> None:
    rng = ctx.rng(3)
    cases = [
        ([3, 1, 4], 5),
        ([2], 2),  # batch of one, no padding
        ([0, 2, 5], 5),  # an empty sequence
        (list(rng.integers(1, 9, size=6)), 9),
    ]
    if ctx.thorough:
        cases += [([1, 1, 1], 1), (list(rng.integers(0, 13, size=10)), 12)]
    for lengths, max_len in cases:
        lengths_t = torch.tensor(lengths, dtype=torch.long)
        case = f"lengths={lengths}, max_len={max_len}"
        got = ctx.call(candidate, lengths_t, max_len, case=case)
        _expect_bool_mask(ctx, got, (len(lengths), max_len), case)
        expected = ref.padding_mask(lengths_t, max_len)
        pos = torch.arange(max_len)
        L = lengths_t[:, None]
        mistakes = [
            Mistake.of("padding_mask_inverted", model=lambda: ~expected),
            Mistake.of("padding_mask_off_by_one_long", model=lambda: pos[None] <= L),
            Mistake.of("padding_mask_off_by_one_short", model=lambda: pos[None] < L - 1),
        ]
        ctx.expect_close(
            got, expected, what="the mask", case=case, mistakes=mistakes, rtol=0, atol=0
        )
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        (torch.empty(3, dtype=torch.long, device=meta), 5),
        ("the mask",),
        "wrong_device",
        "lengths (3,), max_len=5",
    )


# ----------------------------------------------------------------------------- causal_mask
@exercise(
    "causal_mask",
    forbidden=lambda: [
        *_forbid("causal_mask")(),
        (gpt.causal_mask_like, "notebook 11's causal_mask_like (attention_ref.gpt)"),
    ],
    summary="True where j <= i",
)
def check_causal_mask(candidate, ctx: Context) -> None:
    sizes = [5, 2, 8, 1] + ([3, 16] if ctx.thorough else [])
    for n in sizes:
        case = f"n={n}"
        got = ctx.call(candidate, n, case=case)
        _expect_bool_mask(ctx, got, (n, n), case)
        expected = ref.causal_mask(n)
        ones = torch.ones(n, n, dtype=torch.bool)
        mistakes = [
            Mistake.of("causal_mask_inverted", model=lambda ones=ones: ~ones.tril()),
            Mistake.of("causal_mask_triu", model=lambda ones=ones: ones.triu()),
            Mistake.of("causal_mask_no_diagonal", model=lambda ones=ones: ones.tril(-1)),
            Mistake.of("causal_mask_diagonal_1", model=lambda ones=ones: ones.tril(1)),
        ]
        ctx.expect_close(
            got, expected, what="the mask", case=case, mistakes=mistakes, rtol=0, atol=0
        )
        if n > 1 and bool(got[0, 1]):
            ctx.fail("future attention not masked at (0, 1): query 0 may see key 1.", case=case)


# ----------------------------------------------------------------------------- masked_softmax
def _uniform_fully_masked(mask, dim):
    def applies(got, expected):
        m = np.broadcast_to(mask, got.shape)
        dead = ~m.any(axis=dim, keepdims=True)
        if not dead.any():
            return False
        n = got.shape[dim]
        rows = np.broadcast_to(dead, got.shape)
        return bool(np.allclose(got[rows], 1.0 / n, atol=1e-6))

    return applies


def _nan_where_last_dim_guarded(got: torch.Tensor, mask: np.ndarray, dim: int) -> bool:
    """NaN exactly where a slice is fully masked along ``dim`` (not the last) but not along
    the last dimension: the mark of rows with no allowed position found with a hard-coded
    ``mask.any(-1)`` (the softmax's NaN kept wherever the last dimension has a True)."""
    last = got.ndim - 1
    if got.ndim < 2 or dim % got.ndim == last:
        return False
    m = np.broadcast_to(mask, tuple(got.shape))
    dead = ~m.any(axis=dim, keepdims=True)
    kept = m.any(axis=-1, keepdims=True)
    pattern = np.broadcast_to(dead, m.shape) & np.broadcast_to(kept, m.shape)
    return bool(pattern.any() and np.array_equal(torch.isnan(got).numpy(), pattern))


@exercise(
    "masked_softmax",
    forbidden=_forbid("masked_softmax"),
    summary="zero weight where masked, zeros for a fully masked row",
)
def check_masked_softmax(candidate, ctx: Context) -> None:
    rng = ctx.rng(4)
    g = ctx.torch_gen(4)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    m1 = torch.from_numpy(random_mask(rng, (4, 6), 0.6, attend=0))
    m_dead = m1.clone()
    m_dead[2] = False
    pad = torch.from_numpy(padding_mask([2, 5], 5))
    causal = torch.from_numpy(causal_mask(5))
    extreme = extreme_score_rows(rng, 6)
    extreme_mask = torch.ones(2, 6, dtype=torch.bool)
    extreme_mask[0, int(extreme[0].argmin())] = extreme_mask[1, 0] = False
    cases = [
        ("scores (4, 6), a random mask", randn(4, 6), m1, -1),
        ("scores (4, 6), row 2 fully masked", randn(4, 6), m_dead, -1),
        ("scores (2, 3, 5), padding mask (2, 1, 5)", randn(2, 3, 5), pad, -1),
        ("scores (5, 5), causal mask", randn(5, 5), causal, -1),
        ("scores (6, 4) normalised over dim=0, mask (6, 4)", randn(6, 4), m1.T.contiguous(), 0),
        ("scores (3, 4), all allowed", randn(3, 4), torch.ones(3, 4, dtype=torch.bool), -1),
        ("large scores (around 1000)", 1000 * randn(4, 6), m1, -1),
        (
            "scores (6, 4) normalised over dim=0, column 2 fully masked",
            *(randn(6, 4), m_dead.T.contiguous(), 0),
        ),
        (
            "scores (2, 6) at the edges of exp's range (row 0 spans more than 709.8, row 1 "
            "is all around -1000), one key masked in each",
            *(torch.from_numpy(extreme), extreme_mask, -1),
        ),
    ]
    if ctx.thorough:
        m3 = torch.from_numpy(random_mask(rng, (2, 3, 4, 7), 0.5, attend=None))
        cases += [
            ("scores (2, 3, 4, 7), random mask with dead rows", randn(2, 3, 4, 7), m3, -1),
            ("one position only", randn(3, 1), torch.tensor([[True], [False], [True]]), -1),
        ]
    for label, scores, mask, dim in cases:
        # float64 first: there an additive mask keeps the scores of a fully masked row (and
        # is named as such); in float32 a constant of -1e10 swamps them (uniform weights).
        for dtype in (torch.float64, torch.float32):
            s = scores.to(dtype)
            case = f"{label}; {dtype_name(dtype)}"
            got = ctx.call(candidate, s, mask, dim=dim, case=case)
            expected = ref.masked_softmax(s.double(), mask, dim=dim)
            s64, mnp = s.double().numpy(), mask.numpy()
            dead = ~np.broadcast_to(mnp, s64.shape).any(axis=dim)
            if isinstance(got, torch.Tensor) and dead.any() and torch.isnan(got).any():
                if _nan_where_last_dim_guarded(got, mnp, dim):
                    ctx.fail(
                        f"the positions fully masked along dim={dim} came out NaN, except "
                        "where a whole slice along the last dimension is masked.",
                        case=case,
                        mistake="dead_rows_found_along_last_dim",
                    )
                ctx.fail(
                    "a fully masked row came out NaN.", case=case, mistake="fully_masked_row_nan"
                )
            ctx.expect_array(got, s, what="the weights", case=case)
            mistakes = [
                inverted_mask_mistake(mnp, dim),
                Mistake.of("mask_after_softmax", model=lambda: M.softmax(s64, dim) * mnp),
                Mistake.of("mask_multiplied", model=lambda: M.softmax(s64 * mnp, dim)),
                Mistake.of(
                    "softmax_dim_ignored",
                    model=lambda: M.masked_softmax(s64, mnp, -1 if dim != -1 else 0),
                ),
                Mistake.of("fully_masked_row_uniform", applies=_uniform_fully_masked(mnp, dim)),
                Mistake.of("additive_mask_full_row", model=lambda: additive_softmax(s64, mnp, dim)),
            ]
            expect_masked_weights_zero(
                ctx,
                got,
                expected,
                mnp,
                case=case,
                mistakes=mistakes,
                otherwise=named("masked_softmax_mask_not_applied"),
            )
            ctx.expect_close(
                got,
                expected,
                what="the weights",
                case=case,
                mistakes=mistakes,
                fallback=rows_not_summing_to_one(mnp, dim),
                **TOL[dtype],
            )
    scores = randn(2, 4, 6)  # 3-D: dim=-1 is neither 0 nor 1
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (scores, m1),
        {"dim": -1},
        case="scores (2, 4, 6) float32, a random mask (4, 6), dim left out",
        signature="masked_softmax(scores, mask, dim=-1)",
    )
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        (torch.empty(4, 6, device=meta), torch.empty(4, 6, dtype=torch.bool, device=meta)),
        ("the weights",),
        "wrong_device",
        "scores (4, 6), mask (4, 6)",
    )
