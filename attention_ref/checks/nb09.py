"""Checks for notebook 09 (extractive question answering): ``best_span`` and ``span_loss``.

Inputs are seeded random logits over a packed ``question <sep> context <pad>`` row; the
mask marks the context. To make the usual mistakes visible, the positions outside the
context get *large* logits (a decoder or a loss that forgets the mask is caught at once)
and the logits are drawn so that the best start often lies after the best end.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..apps import qa as ref
from ._core import Context, Mistake, exercise
from .toolkit import (
    MODEL_TOL,
    TOL,
    dtype_name,
    expect_follows_device,
    expect_gradient,
    expect_tensor,
)

NEG = float("-inf")


def _context_masks(rng: np.random.Generator, B: int, T: int) -> torch.Tensor:
    """``(B, T)`` bool: each row a contiguous context after a question, then padding."""
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        q = int(rng.integers(0, max(1, T // 3)))
        n = int(rng.integers(1, T - q + 1))
        mask[b, q : q + n] = True
    return mask


def _logits(g: torch.Generator, mask: torch.Tensor, dtype, scale: float = 3.0) -> torch.Tensor:
    """Random logits, large outside the mask (where a correct solution never looks)."""
    x = torch.randn(mask.shape, generator=g, dtype=torch.float64) * scale
    x = torch.where(mask, x, x.abs() + 4 * scale)
    return x.to(dtype)


def _span_scores(s, e):
    return s.double()[:, :, None] + e.double()[:, None, :]  # (B, T, T)


def _argmax_pairs(scores: torch.Tensor, ok: torch.Tensor):
    T = scores.shape[-1]
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat // T, flat % T


def _ok(mask, max_len=None, *, triangle=True, strict=False, use_mask=True):
    """``(B, T, T)`` bool: the (start, end) pairs a (possibly mistaken) decoder allows."""
    T = mask.shape[1]
    i = torch.arange(T)
    ok = (i[:, None] < i[None, :] if strict else i[:, None] <= i[None, :]) | (not triangle)
    if max_len is not None:
        ok = ok & (i[None, :] - i[:, None] < max_len)
    ok = ok[None].expand(mask.shape[0], T, T)
    if use_mask:
        ok = ok & mask[:, :, None] & mask[:, None, :]
    return ok


# ----------------------------------------------------------------------------- best_span
#: label, the mask ((B, T): contexts after a question; "one token": a batch of one with a
#: one-token context; "scattered": a random (3, 10) mask), max_len.
SPAN_CASES = [
    ("B=4, T=12, contexts after a question", (4, 12), None),
    ("batch of one, a one-token context", "one token", None),
    ("B=5, T=16, max_len=3", (5, 16), 3),
    ("B=3, T=10, a scattered mask", "scattered", None),
    ("B=3, T=9, max_len=1 (one-token answers only)", (3, 9), 1),
]
SPAN_THOROUGH_CASES = [("B=8, T=40", (8, 40), None), ("B=6, T=25, max_len=4", (6, 25), 4)]


def _best_span_cases(ctx: Context):
    """``(label, start_logits, end_logits, mask, max_len)``: the table's cases, float32 and
    float64 in turn, the best end before the best start in most rows; then logits exactly
    -inf outside the context (what SpanScorer gives)."""
    rng, g = ctx.rng(91), ctx.torch_gen(91)
    cases = SPAN_CASES + (SPAN_THOROUGH_CASES if ctx.thorough else [])
    for i, (label, kind, max_len) in enumerate(cases):
        if kind == "one token":
            mask = torch.zeros(1, 6, dtype=torch.bool)
            mask[0, 3] = True
        elif kind == "scattered":
            mask = torch.from_numpy(rng.random((3, 10)) < 0.5)
            mask[:, 0] = True
        else:
            mask = _context_masks(rng, *kind)
        dtype = torch.float64 if i % 2 else torch.float32
        ramp = torch.linspace(2.0, -2.0, mask.shape[1], dtype=torch.float64).to(dtype)
        s, e = _logits(g, mask, dtype) - ramp, _logits(g, mask, dtype) + ramp
        yield f"{label}, {dtype_name(dtype)}", s, e, mask, max_len
    mask = _context_masks(rng, 4, 11)
    s = torch.randn(4, 11, generator=g).masked_fill(~mask, NEG)
    e = torch.randn(4, 11, generator=g).masked_fill(~mask, NEG)
    yield "B=4, T=11, logits -inf outside the context", s, e, mask, None


def _span_model(s, e, mask, max_len, *, mode="correct"):
    """``(start, end)`` stacked, as (possibly mistaken) code picks them: modes "independent"
    (best start and best end apart), "no_mask", "no_mask_unordered", "strict" (no one-token
    span), "no_max_len", "max_len_plus_one", "swapped" (the flat index read end first)."""
    if mode == "independent":
        return torch.stack([x.double().masked_fill(~mask, NEG).argmax(1) for x in (s, e)])
    if mode in ("no_max_len", "max_len_plus_one"):
        max_len = None if max_len is None or mode == "no_max_len" else max_len + 1
    kw = dict(use_mask=not mode.startswith("no_mask"), triangle=mode != "no_mask_unordered")
    ss, ee = _argmax_pairs(_span_scores(s, e), _ok(mask, max_len, strict=mode == "strict", **kw))
    return torch.stack([ee, ss] if mode == "swapped" else [ss, ee])


SPAN_MISTAKES = [
    ("span_end_before_start", "independent"),
    ("span_mask_ignored", "no_mask"),
    ("span_mask_ignored_unordered", "no_mask_unordered"),
    ("span_no_single_token", "strict"),
    ("span_max_len_ignored", "no_max_len"),
    ("span_max_len_off_by_one", "max_len_plus_one"),
    ("span_start_end_swapped", "swapped"),
]


def _outside(gs, ge, mask, _) -> torch.Tensor:
    T = mask.shape[1]
    return (gs < 0) | (gs >= T) | (ge < 0) | (ge >= T)


def _not_in_mask(gs, ge, mask, _) -> torch.Tensor:
    rows = torch.arange(len(gs))
    return ~(mask[rows, gs] & mask[rows, ge])


#: The properties of the spans (starts gs, ends ge), in order: the rows that break one
#: (``bad_rows(gs, ge, mask, max_len)``), and what the feedback says of the first.
SPAN_PROPERTIES = [
    (_outside, "a position is outside 0 .. T-1."),
    (lambda gs, ge, *_: ge < gs, "row {b}: the end ({e}) comes before the start ({s})."),
    (
        _not_in_mask,
        "row {b}: the span ({s}, {e}) uses a position where the mask is False (outside the "
        "context).",
    ),
    (
        lambda gs, ge, _, max_len: ge - gs + 1 > (math.inf if max_len is None else max_len),
        "row {b}: the span ({s}, {e}) has {n} tokens, more than max_len={max_len}.",
    ),
]


@exercise(
    "best_span",
    forbidden=lambda: [(ref.best_span, "the reference attention_ref.best_span")],
    summary="highest-scoring span with start <= end inside the context",
)
def check_best_span(candidate, ctx: Context) -> None:
    """Two long tensors of shape (B,), then the properties (inside 0 .. T-1, start <= end,
    inside the mask, at most max_len tokens), each failure naming the mistake model that
    reproduces the span; then the best score among the valid spans."""
    for label, s, e, mask, max_len in _best_span_cases(ctx):
        case = f"{label}: start_logits, end_logits {tuple(s.shape)}, mask {tuple(mask.shape)}"
        got = ctx.call(candidate, s, e, mask, max_len, case=case)
        got = ctx.expect_tuple(got, ("start", "end"), case=case)
        B = s.shape[0]
        for name, t in zip(("start", "end"), got, strict=True):
            expect_tensor(ctx, t, name, case)
            if t.is_floating_point() or t.dtype == torch.bool:
                ctx.fail(
                    f"{name} must hold integer positions (torch.long); got {t.dtype}.",
                    case=case,
                    hint="argmax already returns a long tensor.",
                    mistake="wrong_type",
                )
            expect_tensor(ctx, t, name, case, like=s[:, 0])
            if t.device != s.device:
                ctx.fail(f"{name} is on {t.device}, expected {s.device}.", case=case)
        gs, ge = (t.long().cpu() for t in got)
        es, ee = ref.best_span(s, e, mask, max_len)
        mistakes = [
            Mistake.of(name, model=lambda mode=mode: _span_model(s, e, mask, max_len, mode=mode))
            for name, mode in SPAN_MISTAKES
        ]
        # Properties first, with the likely mistake named when a model reproduces it.
        likely, hint = ctx.diagnose(torch.stack([gs, ge]), torch.stack([es, ee]), mistakes, (), {})
        for bad_rows, message in SPAN_PROPERTIES:
            bad = bad_rows(gs, ge, mask, max_len)
            if bool(bad.any()):
                b = int(torch.nonzero(bad)[0])
                n = int(ge[b] - gs[b] + 1)
                what = message.format(b=b, s=int(gs[b]), e=int(ge[b]), n=n, max_len=max_len)
                ctx.fail(what, case=case, likely=likely, hint=hint)
        # Valid: is it the best? Compare scores (ties would allow either span).
        sc, rows = _span_scores(s, e), torch.arange(B)
        got_score, best = sc[rows, gs, ge], sc[rows, es, ee]
        if not torch.allclose(got_score, best, rtol=1e-9, atol=1e-9):
            b = int(torch.nonzero(~torch.isclose(got_score, best, rtol=1e-9, atol=1e-9))[0])
            ctx.fail(
                f"row {b}: the span ({int(gs[b])}, {int(ge[b])}) scores "
                f"{float(got_score[b]):.4g}, but the valid span ({int(es[b])}, {int(ee[b])}) "
                f"scores {float(best[b]):.4g}.",
                case=case,
                likely=likely,
                hint=hint
                or "the score of a span is start_logits[s] + end_logits[e]; take the "
                "maximum over all valid pairs, not over starts and ends separately.",
            )
    meta = torch.device("meta")
    logits = torch.empty(2, 9, device=meta)
    expect_follows_device(
        ctx,
        candidate,
        (logits, logits, torch.empty(2, 9, dtype=torch.bool, device=meta), 4),
        ("start", "end"),
        "wrong_device",
        "start_logits, end_logits (2, 9), mask (2, 9), max_len=4",
    )


# ----------------------------------------------------------------------------- span_loss
def _span_loss_cases(ctx: Context):
    """``(label, start_logits, end_logits, start, end, mask)``, float32 and float64 in turn;
    the answers drawn inside the context."""
    rng, g = ctx.rng(92), ctx.torch_gen(92)
    shapes = [(4, 12), (1, 5), (6, 20), (3, 9)] + ([(16, 40), (2, 3)] if ctx.thorough else [])
    for i, (B, T) in enumerate(shapes):
        dtype = torch.float64 if i % 2 else torch.float32
        mask = _context_masks(rng, B, T)
        s = _logits(g, mask, dtype, scale=2.0)
        e = _logits(g, mask, dtype, scale=2.0)
        start = torch.zeros(B, dtype=torch.long)
        end = torch.zeros(B, dtype=torch.long)
        for b in range(B):
            pos = torch.nonzero(mask[b]).flatten()
            start[b], end[b] = sorted(int(pos[j]) for j in rng.integers(0, len(pos), size=2))
        yield f"B={B}, T={T}, {dtype_name(dtype)}", s, e, start, end, mask


def _ce(logits, target, mask=None, *, reduce="mean", log=True):
    x = logits.double()
    if mask is not None:
        x = x.masked_fill(~mask, NEG)
    p = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    picked = p[torch.arange(len(target)), target]
    return -(picked.mean() if reduce == "mean" else picked.sum())


def _loss_model(s, e, start, end, mask, *, mode="correct"):
    """(CE_start + CE_end) / 2 as (possibly mistaken) code computes it (see LOSS_MISTAKES)."""
    m = None if mode == "no_mask" else mask
    start, end = (end, start) if mode == "swapped" else (start, end)
    kw = dict(reduce="sum" if mode == "batch_sum" else "mean", log=mode != "probabilities")
    total = _ce(s, start, m, **kw) + _ce(e, end, m, **kw)
    return total if mode == "ends_summed" else total / 2


def _one_end(s, e, start, end, mask):
    ends = (_ce(s, start, mask).item(), _ce(e, end, mask).item())
    return lambda g_, e_: any(np.isclose(g_, v / d, rtol=1e-3) for d in (2, 1) for v in ends)


LOSS_MISTAKES = [
    ("span_loss_mask_not_applied", "no_mask"),
    ("span_loss_summed_ends", "ends_summed"),
    ("span_loss_summed_batch", "batch_sum"),
    ("span_loss_one_end", "one_end"),
    ("span_loss_probabilities", "probabilities"),
    ("span_loss_start_end_swapped", "swapped"),
]


@exercise(
    "span_loss",
    forbidden=lambda: [(ref.span_loss, "the reference attention_ref.span_loss")],
    summary="(CE_start + CE_end) / 2 over the context positions only",
)
def check_span_loss(candidate, ctx: Context) -> None:
    for label, s, e, start, end, mask in _span_loss_cases(ctx):
        args = (s, e, start, end, mask)
        case = f"{label}: logits {tuple(s.shape)}, start/end {tuple(start.shape)}"
        got = ctx.call(candidate, *args, case=case)
        expected = ref.span_loss(s.double(), e.double(), start, end, mask).to(s.dtype)
        if isinstance(got, float | int):
            ctx.fail(
                f"the loss must be a scalar torch.Tensor (so it can be back-propagated); got a "
                f"Python {type(got).__name__}.",
                case=case,
                hint="don't call .item() or float() on the loss.",
                mistake="wrong_type",
            )
        if isinstance(got, torch.Tensor) and got.dim() == 1 and got.numel() == s.shape[0]:
            ctx.fail(
                f"the loss has shape {tuple(got.shape)}: one value per example, but it must be "
                "a scalar, the mean over the batch.",
                case=case,
                mistake="span_loss_not_averaged",
            )
        ctx.expect_array(got, expected, what="the loss", case=case)
        mistakes = [
            Mistake.of(name, applies=_one_end(*args))
            if mode == "one_end"
            else Mistake.of(name, model=lambda mode=mode: _loss_model(*args, mode=mode))
            for name, mode in LOSS_MISTAKES
        ]
        tol = MODEL_TOL[s.dtype]
        ctx.expect_close(got, expected, what="the loss", case=case, mistakes=mistakes, **tol)
        # Property: logits outside the mask must not matter.
        s2 = torch.where(mask, s, s + 7.0)
        got2 = ctx.call(candidate, s2, e, start, end, mask, case=case)
        if isinstance(got2, torch.Tensor) and not torch.allclose(
            got2.detach().double(), got.detach().double(), **tol
        ):
            ctx.fail(
                "changing the logits outside the mask (question, padding) changes the loss.",
                case=case,
                likely=mistakes[0].name,
                hint=mistakes[0].hint,
            )
    _expect_span_loss_gradient(candidate, ctx, label, s, e, start, end, mask)
    meta = torch.device("meta")
    logits = torch.empty(2, 9, device=meta)
    answer = torch.empty(2, dtype=torch.long, device=meta)
    expect_follows_device(
        ctx,
        candidate,
        (logits, logits, answer, answer, torch.empty(2, 9, dtype=torch.bool, device=meta)),
        ("the loss",),
        "wrong_device",
        "start_logits, end_logits (2, 9), start, end (2,), mask (2, 9)",
    )


def _expect_span_loss_gradient(candidate, ctx: Context, label: str, *args) -> None:
    """The loss trains the model: autograd reaches both logits (the last case's, in
    float64), with the reference loss's gradient (softmax minus one-hot over the context,
    halved and averaged over the batch; 0 outside the mask)."""
    s64, e64, start, end, mask = (a.double() if a.is_floating_point() else a for a in args)
    case = f"{label}: logits {tuple(s64.shape)} float64 requiring grad"
    s, e = (t.detach().clone().requires_grad_() for t in (s64, e64))
    # Called through a lambda: ctx.call copies its arguments, which would cut them off
    # from the leaves whose gradients are checked.
    got = ctx.call(lambda: candidate(s, e, start.clone(), end.clone(), mask.clone()),
                   case=case, call_name="span_loss")  # fmt: skip
    leaves = [t.detach().clone().requires_grad_() for t in (s64, e64)]
    want = torch.autograd.grad(ref.span_loss(*leaves, start, end, mask), leaves)
    expect_gradient(
        ctx,
        got,
        {"start_logits": s, "end_logits": e},
        want,
        case=case,
        call_name="span_loss",
        mistake="span_loss_not_differentiable",
        disconnected="the loss is not connected to the logits for autograd (it has no "
        "grad_fn): was it detached, or rebuilt from NumPy or Python numbers (torch.tensor(...))?",
        tol=TOL[torch.float64],
        what="the gradient of the loss with respect to {name}",
    )
