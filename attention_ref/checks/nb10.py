"""Checks for notebook 10 (extractive summarization): ``pool_sentences`` and
``select_sentences``.

``pool_sentences`` is compared with a float64 model on random token vectors whose
sentence ids include header tokens (-1), padding (-1) and empty sentence slots.
``select_sentences`` gets random scores in which the padding slots have the *highest*
scores, and documents with fewer real sentences than ``k``, so forgetting the mask shows.
"""

from __future__ import annotations

import numpy as np
import torch

from ..apps import summarization as ref
from ._core import CheckFailure, Context, Mistake, exercise, naming
from .mistakes import named
from .toolkit import dtype_name, expect_follows_device


# ----------------------------------------------------------------------------- pool_sentences
def _sentence_ids(rng: np.random.Generator, B: int, T: int, S: int, empty_slot: bool):
    """``(B, T)`` long: a header (-1), consecutive sentences 0..n-1, padding (-1)."""
    out = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        pos = int(rng.integers(0, 3))  # header length
        n = int(rng.integers(1, S + 1))
        if empty_slot and b == 0:
            n = max(1, S - 1)  # the last slot stays empty
        for s in range(n):
            length = int(rng.integers(1, 4))
            if pos >= T:
                break
            out[b, pos : pos + length] = s
            pos += length
    return out


def _pool_model(h, ids, S, *, mode="correct"):
    """Each sentence's mean vector ``(B, S, D)`` as (possibly mistaken) pooling computes it:
    mode "correct" (the mean over the sentence's tokens), "sum", "all_tokens" (divided by
    T), "real_tokens" (by the number of non-padding tokens), "clamp" (ids clamped at 0),
    "shifted" (sentence s pooled into slot s + 1)."""
    h = h.double()
    B, T, D = h.shape
    if mode == "shifted":
        ids = torch.where(ids >= 0, ids + 1, ids)
    out = torch.zeros(B, S, D, dtype=torch.float64)
    for s in range(S):
        sel = ids == s if mode != "clamp" else ids.clamp(min=0) == s
        sel = sel.double()[..., None]  # (B, T, 1)
        real = (ids >= 0).sum(1, keepdim=True).clamp(min=1).double()
        divisor = dict(sum=1.0, all_tokens=T, real_tokens=real).get(mode, sel.sum(1).clamp(min=1))
        out[:, s] = (h * sel).sum(1) / divisor
    return out


# (B, T, D, n_sentences, an empty sentence slot); float32 and float64 alternate.
POOL_CASES = [(2, 12, 4, 3, True), (1, 5, 2, 2, False), (3, 20, 8, 5, True), (2, 9, 6, 1, False)]
POOL_MORE_CASES = [(8, 60, 16, 9, True), (4, 30, 32, 7, True)]
POOL_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-9, atol=1e-10)}
POOL_MISTAKES = [
    ("pool_summed", "sum"),
    ("pool_divided_by_length", "all_tokens"),
    ("pool_divided_by_length", "real_tokens"),
    ("pool_header_in_sentence_0", "clamp"),
    ("pool_off_by_one", "shifted"),
]


@exercise(
    "pool_sentences",
    forbidden=lambda: [(ref.pool_sentences, "the reference attention_ref.pool_sentences")],
    summary="mean of each sentence's token vectors, -1 tokens ignored",
)
def check_pool_sentences(candidate, ctx: Context) -> None:
    """Each sentence's mean vector against the float64 model's, mistakes named by its modes."""
    rng, g = ctx.rng(101), ctx.torch_gen(101)
    for i, (B, T, D, S, empty) in enumerate(POOL_CASES + (POOL_MORE_CASES if ctx.thorough else [])):
        dtype = torch.float64 if i % 2 else torch.float32
        h = torch.randn(B, T, D, generator=g, dtype=dtype) + 1.0
        ids = _sentence_ids(rng, B, T, S, empty)
        case = f"h {(B, T, D)} {dtype_name(dtype)}, sentence_ids {(B, T)}, n_sentences={S}"
        got = ctx.call(candidate, h, ids, S, case=case)
        expected = ref.pool_sentences(h.double(), ids, S).to(dtype)
        what = "the pooled sentences"
        ctx.expect_array(got, expected, what=what, case=case)
        mistakes = [
            Mistake.of(i, model=lambda m=m: _pool_model(h, ids, S, mode=m))
            for i, m in POOL_MISTAKES
        ]
        ctx.expect_close(got, expected, what=what, case=case, mistakes=mistakes, **POOL_TOL[dtype])
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        (torch.empty(2, 7, 4, device=meta), torch.empty(2, 7, dtype=torch.long, device=meta), 3),
        ("the pooled sentences",),
        "wrong_device",
        "h (2, 7, 4), sentence_ids (2, 7), n_sentences=3",
    )


# ----------------------------------------------------------------------------- select_sentences
#: (B, S, k, k an int or a (B,) "tensor" below S, or a "tensor over" S in its first row);
#: float32 and float64 alternate. k may exceed S: such a document gets every real sentence.
SELECT_CASES = [(4, 7, 2, "int"), (1, 5, 1, "int"), (5, 9, 3, "tensor"), (3, 6, 4, "int"),
                (2, 4, 6, "int"), (3, 5, 0, "tensor over")]  # fmt: skip
SELECT_MORE_CASES = [(16, 12, 3, "tensor"), (6, 4, 5, "int"), (5, 6, 0, "tensor over")]


def _select_cases(ctx: Context):
    """``(case, scores, mask, k)``: padding scores high, one full document and one with
    fewer real sentences than k; then all scores negative."""
    rng, g = ctx.rng(102), ctx.torch_gen(102)
    for i, (B, S, k, kind) in enumerate(SELECT_CASES + (SELECT_MORE_CASES if ctx.thorough else [])):
        dtype = torch.float64 if i % 2 else torch.float32
        n_real = torch.from_numpy(rng.integers(1, S + 1, size=B))
        n_real[0] = S  # one full document
        if B > 1:
            n_real[-1] = max(1, min(S, k) - 1)  # fewer real sentences than k
        mask = torch.arange(S)[None, :] < n_real[:, None]
        scores = torch.randn(B, S, generator=g, dtype=torch.float64)
        scores = torch.where(mask, scores, scores.abs() + 5.0).to(dtype)  # padding scores high
        if kind == "tensor over":
            kk = torch.from_numpy(rng.integers(1, S + 3, size=B)).long()
            kk[0] = S + 2
        elif kind == "tensor":
            kk = torch.from_numpy(rng.integers(1, S, size=B)).long()
        else:
            kk = k
        label = f"k a (B,) tensor {kk.tolist()}" if kind != "int" else f"k={k}"
        if int(torch.as_tensor(kk).max()) > S:
            label += f" (more than the S={S} slots)"
        label = f"scores {(B, S)} {dtype_name(dtype)}, real sentences {n_real.tolist()}, {label}"
        yield label, scores, mask, kk
    # Positive scores that are all below zero / a threshold rule must still pick k.
    scores = -torch.rand(3, 6, generator=g) - 0.1
    yield "scores (3, 6) all negative, k=2", scores, torch.ones(3, 6, dtype=torch.bool), 2


def _select_model(scores, mask, k, *, mode="correct"):
    """The selection ``(B, S)`` as (possibly mistaken) code makes it: the k best real
    sentences, or modes "no_mask", "mask_after" (the k best slots, padding among them, then
    AND the mask), "lowest", "threshold" (score > 0), "threshold_no_mask"."""
    if mode.startswith("threshold"):
        return scores > 0 if mode == "threshold_no_mask" else (scores > 0) & mask
    B, S = scores.shape
    kk = k if isinstance(k, torch.Tensor) else torch.full((B,), k)
    largest, use_mask = mode != "lowest", mode not in ("no_mask", "mask_after")
    x = scores.double()
    if use_mask:
        x = x.masked_fill(~mask, float("-inf") if largest else float("inf"))
    order = x.argsort(1, descending=largest)
    out = torch.zeros(B, S, dtype=torch.bool)
    for b in range(B):
        out[b, order[b, : int(kk[b])]] = True
    return out & mask if use_mask or mode == "mask_after" else out


SELECT_MISTAKES = [
    ("select_padding", "no_mask"),
    ("select_mask_after_topk", "mask_after"),
    ("select_lowest", "lowest"),
    ("select_threshold", "threshold"),
    ("select_threshold", "threshold_no_mask"),
]


@exercise(
    "select_sentences",
    forbidden=lambda: [(ref.select_sentences, "the reference attention_ref.select_sentences")],
    summary="True at the k best real sentences of each document",
)
def check_select_sentences(candidate, ctx: Context) -> None:
    """A boolean (B, S) selection (indices named as such), equal to the k best real
    sentences, mistakes named by the model's modes."""
    for case, scores, mask, k in _select_cases(ctx):
        try:
            got = ctx.call(candidate, scores, mask, k, case=case)
        except CheckFailure as err:
            said = str(err).split("\n")[0]  # the error itself, not the quoted line
            over = int(torch.as_tensor(k).max()) > scores.shape[1]
            if not over or "Likely mistake" in str(err) or "out of range" not in said:
                raise  # the cause is elsewhere (or already named)
            raise naming(err, named("select_k_above_slots")) from None
        expected = ref.select_sentences(scores, mask, k)
        if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
            likely = ""
            if not got.is_floating_point() and got.dim() == 2 and got.shape[1] != scores.shape[1]:
                likely = named("select_returns_indices")
            ctx.fail(
                f"the selection must be a boolean tensor of shape {tuple(scores.shape)} (True = "
                f"in the summary); got dtype {got.dtype} and shape {tuple(got.shape)}.",
                case=case,
                likely=likely,
                hint="build a bool mask, e.g. torch.zeros_like(mask).scatter(1, idx, True), "
                "or compare each sentence's rank with k.",
                mistake="wrong_type",
            )
        ctx.expect_array(got, expected, what="the selection", case=case)
        mistakes = [
            Mistake.of(i, model=lambda o=o: _select_model(scores, mask, k, mode=o))
            for i, o in SELECT_MISTAKES
        ]
        ctx.expect_close(
            got, expected, what="the selection", case=case, mistakes=mistakes, rtol=0, atol=0
        )
    meta = torch.device("meta")
    for k in (2, torch.empty(2, dtype=torch.long, device=meta)):
        expect_follows_device(
            ctx,
            candidate,
            (torch.empty(2, 5, device=meta), torch.empty(2, 5, dtype=torch.bool, device=meta), k),
            ("the selection",),
            "wrong_device",
            f"scores (2, 5), mask (2, 5), k {'= 2' if isinstance(k, int) else '(2,)'}",
        )
