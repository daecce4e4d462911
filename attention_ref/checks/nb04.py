"""Checks for notebook 04: ``split_heads``, ``merge_heads`` and the module exercise
``multi_head_attention``.

The multi-head check builds the learner's ``MultiHeadAttention(d_model, n_heads,
bias=...)``, copies known weights into ``w_q, w_k, w_v, w_o`` (each ``nn.Linear(d_model,
d_model, bias=bias)``) and compares its forward with a float64 model of the same
computation. Mistakes are named by running buggy variants of that model (``view``
without ``transpose``, merging in the wrong order, no ``W_O``, the mask not given a head
axis, ...) and seeing which one reproduces the learner's numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .. import multihead as ref
from . import _models as M
from ._core import CheckFailure, Context, Mistake, exercise, naming
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    TOL,
    as_float64,
    build_module,
    causal_mask,
    dtype_name,
    expect_attention_values,
    expect_tensor,
    load_linear_weights,
    normal,
    padding_mask,
    random_mask,
    reference_functions,
)


def _input(rng: np.random.Generator, kind: str, shape: tuple) -> torch.Tensor:
    """x of ``shape``: 0, 1, 2, ... in float32 (``"arange"``: which feature went where), or
    seeded normal values in the dtype ``kind``."""
    if kind == "arange":
        return torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    return torch.from_numpy(normal(rng, *shape)).to(getattr(torch, kind))


def _expect_exact(
    ctx: Context,
    got,
    expected,
    case: str,
    shape_name: str,
    wrong_shapes: dict,
    mistakes: list[Mistake],
    hint: str,
) -> None:
    """A rearrangement's result is ``expected`` exactly: a tensor of its shape (``shape_name``
    says which; a shape in ``wrong_shapes`` names that mistake id), dtype and device, every
    value equal; a wrong value is named by the first of ``mistakes`` that explains it."""
    expect_tensor(ctx, got, "the result", case)
    shape, want = tuple(got.shape), tuple(expected.shape)
    if shape != want:
        likely = named(wrong_shapes[shape]) if shape in wrong_shapes else ""
        ctx.fail(
            f"the result has shape {shape}, expected {shape_name} = {want}.",
            case=case,
            likely=likely,
            hint=getattr(likely, "hint", ""),
            mistake="wrong_shape",
        )
    ctx.expect_array(got, expected, what="the result", case=case)
    ctx.expect_close(
        got, expected, what="the result", case=case, rtol=0, atol=0, mistakes=mistakes, hint=hint
    )


# ----------------------------------------------------------------------------- split_heads
#: label, B, T, D, H, and x: "arange" (0, 1, 2, ...: which feature went where) or a dtype.
SPLIT_CASES = [
    ("x holds 0, 1, 2, ... (so you can read which feature went where)", 2, 3, 8, 2, "arange"),
    ("a batch of 3, T=5, D=12, 3 heads", 3, 5, 12, 3, "float64"),
    ("one head", 2, 4, 6, 1, "float64"),
    ("d_head = 1 (as many heads as features)", 2, 3, 4, 4, "float32"),
    ("one token, a batch of one", 1, 1, 6, 2, "float32"),
    ("T=7, D=16, 4 heads", 2, 7, 16, 4, "float32"),
]
SPLIT_THOROUGH_CASES = [
    ("a batch of 4, T=9, D=32, 8 heads", 4, 9, 32, 8, "float64"),
    ("T=2, D=10, 5 heads", 3, 2, 10, 5, "float32"),
]
#: id, the mode of _split (the one model) that makes the mistake.
SPLIT_MISTAKES = [("split_view_without_transpose", "view"), ("split_interleaved", "interleave")]


@exercise(
    "split_heads",
    forbidden=lambda: [(ref.split_heads, "the reference attention_ref.split_heads")],
    summary="(B, T, D) -> (B, H, T, D/H)",
)
def check_split_heads(candidate, ctx: Context) -> None:
    rng = ctx.rng(41)
    for label, B, T, D, H, kind in SPLIT_CASES + (SPLIT_THOROUGH_CASES if ctx.thorough else []):
        x = _input(rng, kind, (B, T, D))
        case = f"{label}: x {tuple(x.shape)} {dtype_name(x.dtype)}, n_heads={H}"
        got = ctx.call(candidate, x, H, case=case)
        dh = D // H
        wrong_shapes = {
            (B, T, H, dh): "split_heads_not_moved",
            (B * H, T, dh): "split_heads_folded",
            (B, H, dh, T): "split_heads_last_axes_swapped",
        }
        mistakes = [
            Mistake.of(i, model=lambda m=m: _split(as_float64(x), H, m)) for i, m in SPLIT_MISTAKES
        ]
        hint = (
            "head h must hold features h*D/H .. (h+1)*D/H - 1 of every token: "
            "result[b, h, t] == x[b, t, h*D//H:(h+1)*D//H]."
        )
        _expect_exact(
            ctx, got, ref.split_heads(x, H), case, "(B, H, T, D/H)", wrong_shapes, mistakes, hint
        )


# ----------------------------------------------------------------------------- merge_heads
#: label, B, H, T, d_head, and x: "arange", a dtype, or "split:" a dtype (a transposed view
#: as split_heads returns it in a real model).
MERGE_CASES = [
    ("x holds 0, 1, 2, ... (so you can read which feature went where)", 2, 2, 3, 4, "arange"),
    ("a batch of 3, 3 heads, T=5, d_head=4", 3, 3, 5, 4, "float64"),
    ("one head", 2, 1, 4, 6, "float64"),
    ("d_head = 1", 2, 4, 3, 1, "float32"),
    ("one token, a batch of one", 1, 2, 1, 3, "float32"),
    ("round trip: merge_heads(split_heads(x)) must give x back", 2, 4, 5, 3, "split:float32"),
]
MERGE_THOROUGH_CASES = [
    ("8 heads, T=9, d_head=4", 4, 8, 9, 4, "float64"),
    ("round trip, float64", 3, 5, 2, 2, "split:float64"),
]


@exercise(
    "merge_heads",
    forbidden=lambda: [(ref.merge_heads, "the reference attention_ref.merge_heads")],
    summary="(B, H, T, d_head) -> (B, T, H*d_head), the inverse of split_heads",
)
def check_merge_heads(candidate, ctx: Context) -> None:
    rng = ctx.rng(42)
    for label, B, H, T, dh, kind in MERGE_CASES + (MERGE_THOROUGH_CASES if ctx.thorough else []):
        if kind.startswith("split:"):
            x = ref.split_heads(_input(rng, kind[6:], (B, T, H * dh)), H)
        else:
            x = _input(rng, kind, (B, H, T, dh))
        case = f"{label}: x {tuple(x.shape)} {dtype_name(x.dtype)}"
        got = ctx.call(candidate, x, case=case)
        wrong_shapes = {
            (B, T, H, dh): "merge_heads_not_flattened",
            (B, H * T, dh): "merge_heads_wrong_axes",
            (B, H, T * dh): "merge_heads_wrong_axes",
        }
        mistakes = [
            Mistake.of("merge_without_transpose", model=lambda: x.reshape(B, T, H * dh)),
            Mistake.of(
                "merge_wrong_order", model=lambda: x.permute(0, 2, 3, 1).reshape(B, T, H * dh)
            ),
        ]
        hint = (
            "merge_heads must undo split_heads exactly: result[b, t, h*d_head:(h+1)*d_head]"
            " == x[b, h, t]."
        )
        _expect_exact(
            ctx, got, ref.merge_heads(x), case, "(B, T, H*d_head)", wrong_shapes, mistakes, hint
        )


# ----------------------------------------------------------------------------- multi_head_attention
def mha_model(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    mask: np.ndarray | None,
    P: dict[str, np.ndarray | None],
    H: int,
    *,
    split: str = "correct",
    merge: str = "correct",
    w_o: bool = True,
    scale: str = "correct",
    axis: int = -1,
    mask_mode: str = "correct",
    swap_qk: bool = False,
    kv_from: str = "correct",
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention ``(out (B, n_q, D), weights (B, H, n_q, n_k))`` in float64, one
    knob per catalogued mistake (each knob's right value is its default).

    ``P`` holds ``w_q.weight (D, D)``, ``w_q.bias (D,)`` or None, and the same for w_k,
    w_v, w_o (nn.Linear layout). split, merge: "view" (no transpose), "interleave";
    scale: "d_model" (sqrt(d_model) for sqrt(d_head)), "none"; mask_mode: "no_head_axis"
    (a 3-D mask not unsqueezed), "repeat" (mask.repeat(H, 1, 1).view(B, H, ...)), or one of
    :func:`_models.attention_weights`; kv_from: "query" (keys and values projected from the
    query), "key" (values projected from the key).
    """
    if kv_from == "query":
        key = value = query
    elif kv_from == "key":
        value = key
    Q, K, V = M.linear(query, P, "w_q"), M.linear(key, P, "w_k"), M.linear(value, P, "w_v")
    if swap_qk:
        Q, K = K, Q
    q, k, v = (_split(x, H, split) for x in (Q, K, V))
    B, _, n_q, dh = q.shape
    D = H * dh
    s = M.scores(q, k, {"correct": None, "d_model": math.sqrt(D), "none": 1.0}[scale])
    m = _mask_with_head_axis(mask, mask_mode, H, (B, n_q, k.shape[2]))
    w = M.attention_weights(s, m, axis, "correct" if mask_mode in HEAD_AXIS_MODES else mask_mode)
    o = w @ v  # (B, H, n_q, dh)
    if merge == "view":
        o = o.reshape(B, n_q, D)
    elif merge == "interleave":
        o = o.transpose(0, 2, 3, 1).reshape(B, n_q, D)
    else:
        o = o.transpose(0, 2, 1, 3).reshape(B, n_q, D)
    return (M.linear(o, P, "w_o") if w_o else o), w


HEAD_AXIS_MODES = ("no_head_axis", "repeat")


def _split(x: np.ndarray, H: int, split: str) -> np.ndarray:
    """(B, T, D) -> (B, H, T, D/H), as ``split`` says ("correct", "view", "interleave")."""
    B, T, D = x.shape
    if split == "view":
        return x.reshape(B, H, T, D // H)
    if split == "interleave":
        return x.reshape(B, T, D // H, H).transpose(0, 3, 1, 2)
    return x.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)


def _mask_with_head_axis(mask, mask_mode: str, H: int, bqk: tuple[int, int, int]):
    """The mask as the code under ``mask_mode`` broadcasts it to (B, H, n_q, n_k): a 3-D
    mask (B, n_q, n_k) gets its head axis (or, mistaken, none, or a repeat in the wrong
    order); a 2-D or 4-D mask broadcasts as it is."""
    if mask is None:
        return None
    m = np.asarray(mask, dtype=bool)
    B, n_q, n_k = bqk
    if m.ndim == 3:
        if mask_mode == "no_head_axis":
            if m.shape[0] not in (1, H):
                raise ValueError("does not broadcast")
        elif mask_mode == "repeat":
            m = np.tile(np.broadcast_to(m, (B, n_q, n_k)), (H, 1, 1)).reshape(B, H, n_q, n_k)
        else:
            m = m[:, None]
    return np.broadcast_to(m, (B, H, n_q, n_k))


#: The mistake models: (id, the model's options, on which cases the mistake shows), tried
#: in this order (the first model that reproduces what came back names the mistake).
def _heads(c: MHACase) -> bool:
    return c.n_heads > 1


MHA_MISTAKES = [
    ("mha_split_view", dict(split="view"), _heads),
    ("mha_split_view", dict(split="view", merge="view"), _heads),
    ("mha_merge_without_transpose", dict(merge="view"), _heads),
    ("mha_split_interleaved", dict(split="interleave"), _heads),
    ("mha_merge_wrong_order", dict(merge="interleave"), _heads),
    ("scale_by_d_model", dict(scale="d_model"), _heads),
    ("w_o_not_applied", dict(w_o=False), lambda c: True),
    ("scale_missing_head", dict(scale="none"), lambda c: True),
    ("queries_keys_swapped_heads", dict(swap_qk=True), lambda c: True),
    ("softmax_over_queries_heads", dict(axis=-2), lambda c: c.query.shape[1] > 1),
    ("values_from_key", dict(kv_from="key"), lambda c: not c.self_attn),
    ("mask_no_head_axis", dict(mask_mode="no_head_axis"), lambda c: c.mask_3d and _heads(c)),
    ("mask_repeat_wrong_order", dict(mask_mode="repeat"), lambda c: c.mask_3d and _heads(c)),
    ("mask_inverted_heads", dict(mask_mode="inverted"), lambda c: c.mask is not None),
    ("mask_ignored_heads", dict(mask_mode="ignored"), lambda c: c.mask is not None),
    ("fully_masked_row_uniform_heads", dict(mask_mode="fill"), lambda c: c.mask is not None),
]


@dataclass
class MHACase:
    label: str
    d_model: int
    n_heads: int
    bias: bool | None  # None: rely on the default (True)
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None = None
    self_attn: bool = False

    @property
    def mask_3d(self) -> bool:
        return self.mask is not None and self.mask.ndim == 3


#: label, d_model, n_heads, bias (None: the default), (B, n_q, n_k) with n_k None for
#: self-attention, the mask (named in _mha_masks), the inputs' scale.
MHA_CASES = [
    ("self-attention, 2 heads, the default bias", 8, 2, None, (2, 5, None), None, 1.0),
    ("cross-attention: n_q=3, n_k=6, 3 heads, bias=False", 12, 3, False, (2, 3, 6), None, 1.0),
    ("one head", 6, 1, True, (1, 4, None), None, 1.0),
    ("d_head = 1 (4 heads of one feature)", 4, 4, True, (2, 3, None), None, 1.0),
    ("a causal mask (6, 6), 4 heads", 16, 4, True, (2, 6, None), "causal", 1.0),
    ("a padding mask (3, 1, 5): sequence lengths 5, 2 and 0", 8, 2, True, (3, 4, 5), "pad", 1.0),
    (
        "a mask (2, 4, 5), one per batch element, with a fully masked row",
        *(8, 2, True, (2, 4, 5), "per_batch", 1.0),
    ),
    (
        "a padding mask (3, 1, 1, 5), as later notebooks pass it: lengths 5, 2 and 0",
        *(8, 2, True, (3, 4, 5), "pad_4d", 1.0),
    ),
    ("a per-head mask (2, 2, 4, 4)", 6, 2, False, (2, 4, None), "per_head", 1.0),
    ("large inputs (scores in the tens)", 8, 2, True, (2, 5, None), None, 4.0),
]
MHA_THOROUGH_CASES = [
    ("a batch of 3, T=9, d_model=32, 8 heads", 32, 8, True, (3, 9, None), None, 1.0),
    ("a mask (3, 7, 7) with 4 heads (B != H)", 16, 4, False, (3, 7, None), "random", 1.0),
    (
        "a mask (3, 1, 7, 7), one per batch element with its head axis",
        *(16, 4, True, (3, 7, None), "random_4d", 1.0),
    ),
    ("cross-attention, one query, 2 heads", 10, 2, True, (2, 1, 7), None, 1.0),
    ("one token", 8, 4, True, (2, 1, None), None, 1.0),
]
#: Visible cases drawn after the others (so those draw the same values as before): the
#: sixth mask shape of the spec, (B, 1, n_q, n_k).
MHA_LATE_CASES = [
    (
        "a mask (2, 1, 5, 5), one per batch element with its head axis: causal, lengths 5 and 3",
        *(8, 2, True, (2, 5, None), "causal_pad_4d", 1.0),
    ),
]


def _mha_cases(ctx: Context) -> list[MHACase]:
    """The rows of the case tables with their masks and inputs (``x (B, n_q, D)`` for
    self-attention, else query, key and value), drawn in order."""
    rng = ctx.rng(43)
    masks = {
        "causal": causal_mask(6),
        "pad": padding_mask([5, 2, 0], 5),
        "per_batch": random_mask(rng, (2, 4, 5), 0.6, attend=0, fully_masked=((1, 2),)),
        "per_head": random_mask(rng, (2, 2, 4, 4), 0.5, attend=1),
    }
    masks["pad_4d"] = masks["pad"][:, None]

    def draw(label, D, H, bias, shape, mask, scale) -> MHACase:
        B, n_q, n_k = shape
        if n_k is None:
            x = normal(rng, B, n_q, D, scale=scale)
            return MHACase(label, D, H, bias, x, x, x, masks.get(mask), self_attn=True)
        q, k, v = (normal(rng, B, n, D, scale=scale) for n in (n_q, n_k, n_k))
        return MHACase(label, D, H, bias, q, k, v, masks.get(mask))

    cases = [draw(*row) for row in MHA_CASES]
    if ctx.thorough:
        masks["random"] = random_mask(rng, (3, 7, 7), 0.5, attend=3)
        masks["random_4d"] = masks["random"][:, None]
        cases += [draw(*row) for row in MHA_THOROUGH_CASES]
    masks["causal_pad_4d"] = causal_mask(5)[None, None] & padding_mask([5, 3], 5)[:, None]
    return cases + [draw(*row) for row in MHA_LATE_CASES]


def _mha_mistakes(c: MHACase, args: tuple, P, which: int) -> list[Mistake]:
    """The mistake models that apply to case ``c``; ``which`` 0 = out, 1 = weights."""
    return [
        Mistake.of(mistake_id, model=lambda kw=kw: mha_model(*args, P, c.n_heads, **kw)[which])
        for mistake_id, kw, shows in MHA_MISTAKES
        if shows(c)
    ]


def _mha_params(ctx: Context, salt: int, D: int, bias: bool) -> dict[str, np.ndarray | None]:
    rng = ctx.rng(salt)
    P: dict[str, np.ndarray | None] = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        P[f"{name}.weight"] = rng.normal(size=(D, D)) / math.sqrt(D)
        P[f"{name}.bias"] = 0.5 * rng.normal(size=D) if bias else None
    return P


def _in_dtype(P, dtype) -> dict[str, torch.Tensor | None]:
    return {k: None if v is None else torch.from_numpy(v).to(dtype) for k, v in P.items()}


def _prepare_mha(cls, ctx: Context, D: int, H: int, bias, P, dtype, case) -> nn.Module:
    """The learner's MultiHeadAttention(D, H[, bias]) in ``dtype`` with the weights ``P``."""
    x = torch.zeros(1, 2, D, dtype=dtype)  # (B, T, D): one call sets up lazy layers
    mod = build_module(
        ctx, cls, (D, H), {} if bias is None else {"bias": bias}, case, sample=(x, x, x)
    )
    mod.to(dtype)
    spec = "nn.Linear(d_model, d_model, bias=bias), here "
    spec += f"nn.Linear({D}, {D}, bias={bias is not False})"
    Pt = _in_dtype(P, dtype)
    layers = {n: (Pt[f"{n}.weight"], Pt[f"{n}.bias"], spec) for n in ("w_q", "w_k", "w_v", "w_o")}
    shared = named("mha_shared_head_projection", D=D, dh=D // H)
    likely = {"missing w_o": named("mha_w_o_missing")} | {
        f"shape {n}": shared for n in ("w_q", "w_k", "w_v")
    }
    load_linear_weights(ctx, mod, layers, case, raw_ok=False, likely=likely)
    return mod


@exercise(
    "multi_head_attention",
    kind="module",
    forbidden=lambda: [
        (ref.MultiHeadAttention.forward, "the reference attention_ref.MultiHeadAttention"),
        *BUILTIN_ATTENTION,
    ],
    summary="multi-head attention with W_Q, W_K, W_V, W_O",
)
def check_multi_head_attention(cls, ctx: Context) -> None:
    """Graded with the reference split_heads and merge_heads in place of the learner's
    (exercises 1 and 2, which earn their own points): see :func:`_check_mha`."""
    with reference_functions(cls, split_heads=ref.split_heads, merge_heads=ref.merge_heads):
        _check_mha(cls, ctx)


def _check_mha(cls, ctx: Context) -> None:
    """Each case in both dtypes: the shapes, then the property (masked weights are 0), then
    the weights and the output against the model, naming the mistake model that explains a
    difference; then the keys as a set, and d_model not divisible by n_heads."""
    for i, c in enumerate(_mha_cases(ctx)):
        P = _mha_params(ctx, 200 + i, c.d_model, c.bias is not False)
        for dtype in (torch.float64, torch.float32):
            q = torch.from_numpy(c.query).to(dtype)
            k = q if c.self_attn else torch.from_numpy(c.key).to(dtype)
            v = q if c.self_attn else torch.from_numpy(c.value).to(dtype)
            inputs = (
                f"x {tuple(q.shape)}"
                if c.self_attn
                else f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
            )
            case = (
                f"{c.label}: MultiHeadAttention({c.d_model}, {c.n_heads}"
                f"{'' if c.bias is None else f', bias={c.bias}'}), {inputs} {dtype_name(dtype)}"
                + ("" if c.mask is None else f", mask {tuple(c.mask.shape)}")
            )
            mod = _prepare_mha(cls, ctx, c.d_model, c.n_heads, c.bias, P, dtype, case)
            P64 = {n: None if t is None else as_float64(t) for n, t in _in_dtype(P, dtype).items()}
            args64 = (as_float64(q), as_float64(k), as_float64(v), c.mask)
            out64, w64 = mha_model(*args64, P64, c.n_heads)
            args = (q, k, v) if c.mask is None else (q, k, v, torch.from_numpy(c.mask))
            out, weights = _call_mha(ctx, mod, c, args, case)
            _expect_mha_shapes(ctx, c, out, weights, out64.shape, w64.shape, case)
            ctx.expect_array(weights, q.new_zeros(w64.shape), what="weights", case=case)
            ctx.expect_array(out, q.new_zeros(out64.shape), what="out", case=case)
            expect_attention_values(
                ctx,
                out,
                weights,
                out64,
                w64,
                case=case,
                allowed=None if c.mask is None else c.mask[:, None] if c.mask_3d else c.mask,
                mistakes=lambda which, c=c, a=args64, P=P64: _mha_mistakes(c, a, P, which),
                tol=TOL[dtype],
                out_hint="the weights are right: out = W_O(merge_heads(weights @ v)).",
                otherwise=named("mask_not_applied_heads"),
                axes="batch, head, query, key",
            )
    _check_key_permutation(cls, ctx)
    _check_indivisible(cls, ctx)


def _call_mha(ctx: Context, mod, c: MHACase, args: tuple, case: str) -> tuple:
    """``(out, weights)`` of the learner's forward; a broadcasting error with a 3-D mask
    names the mask that was given no head axis."""
    try:
        got = ctx.call(mod, *args, case=case)
    except CheckFailure as err:
        text = str(err)
        if (
            c.mask_3d
            and "Likely mistake" not in text
            and re.search(r"size of tensor|broadcast|match", text)
        ):
            raise naming(err, named("mask_no_head_axis")) from None
        raise
    return ctx.expect_tuple(got, ("out", "weights"), case=case)


def _expect_mha_shapes(ctx: Context, c: MHACase, out, weights, out_shape, w_shape, case):
    """The shapes of out (B, n_q, d_model) and weights (B, H, n_q, n_k); a wrong shape that
    a mistake explains (weights averaged over the heads, heads not merged, ...) names it."""
    B, n_q, n_k, H = c.query.shape[0], c.query.shape[1], c.key.shape[1], c.n_heads
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) != w_shape:
        shape = tuple(weights.shape)
        explained_by = {
            (B, n_q, n_k): "weights_averaged_over_heads",
            (B * H, n_q, n_k): "batch_heads_folded",
        }
        if n_q != n_k:
            explained_by[(B, H, n_q, n_q)] = "keys_from_query"
        likely = named(explained_by[shape]) if shape in explained_by else ""
        if isinstance(out, torch.Tensor) and tuple(out.shape) == w_shape:
            likely = "returned (weights, out) instead of (out, weights)."
        ctx.fail(
            f"weights has shape {shape}, expected (B, H, n_q, n_k) = {w_shape}.",
            case=case,
            likely=likely,
            hint=getattr(likely, "hint", ""),
            mistake="wrong_shape",
        )
    if isinstance(out, torch.Tensor) and tuple(out.shape) != out_shape:
        unmerged = tuple(out.shape) == (B, H, n_q, c.d_model // H)
        ctx.fail(
            f"out has shape {tuple(out.shape)}, expected (B, n_q, d_model) = {out_shape}.",
            case=case,
            likely=named("heads_not_merged") if unmerged else "",
            mistake="wrong_shape",
        )


def _check_key_permutation(cls, ctx: Context) -> None:
    """Keys and values are a set: shuffling them together must not change the output."""
    rng = ctx.rng(44)
    D, H, n_q, n_k = 8, 2, 3, 6
    P = _mha_params(ctx, 45, D, True)
    perm = rng.permutation(n_k)
    while np.all(perm == np.arange(n_k)):  # pragma: no cover - astronomically unlikely
        perm = rng.permutation(n_k)
    q, k, v = (torch.from_numpy(rng.normal(size=(2, n, D))) for n in (n_q, n_k, n_k))
    case = (
        f"query {tuple(q.shape)}, key and value {tuple(k.shape)} float64, then the same keys "
        f"and values in the order {perm.tolist()}"
    )
    mod = _prepare_mha(cls, ctx, D, H, True, P, torch.float64, case)

    def run(k, v) -> tuple:
        return ctx.expect_tuple(ctx.call(mod, q, k, v, case=case), ("out", "weights"), case=case)

    (out, w), (out_p, w_p) = run(k, v), run(k[:, perm], v[:, perm])
    ok = tuple(out_p.shape) == tuple(out.shape) and np.allclose(
        as_float64(out_p), as_float64(out), **TOL[torch.float64]
    )
    ok = ok and np.allclose(as_float64(w_p), as_float64(w)[..., perm], **TOL[torch.float64])
    if not ok:
        ctx.fail(
            "shuffling the keys and values together changed the output (or the weights did "
            "not follow their keys): attention must treat the keys as a set.",
            case=case,
            mistake="tokens_mixed_in_heads",
        )


def _check_indivisible(cls, ctx: Context) -> None:
    """MultiHeadAttention(10, 3) must refuse with a ValueError that says why."""
    for D, H in ((10, 3), (6, 4)):
        case = f"MultiHeadAttention({D}, {H}): {D} is not divisible by {H}"
        try:
            cls(D, H)
        except ValueError as err:
            text = str(err)
            if str(D) not in text or str(H) not in text:
                ctx.fail(
                    f"the ValueError should say what is wrong, naming d_model={D} and "
                    f"n_heads={H}; its message was {text!r}.",
                    case=case,
                    hint='e.g. raise ValueError(f"d_model={d_model} is not divisible by '
                    'n_heads={n_heads}").',
                )
            continue
        except NotImplementedError:
            ctx.fail(
                "not implemented yet: the class still raises NotImplementedError.",
                hint="replace `raise NotImplementedError()` with your code.",
            )
        except CheckFailure:
            raise
        except Exception as err:
            ctx.fail(
                f"must raise ValueError, but raised {type(err).__name__}: {err}.",
                case=case,
                mistake="assert_instead_of_value_error" if isinstance(err, AssertionError) else "",
                hint=named("assert_instead_of_value_error").hint,
            )
        ctx.fail(
            f"MultiHeadAttention({D}, {H}) must raise ValueError ({D} features cannot be split "
            f"evenly into {H} heads), but it built a module.",
            case=case,
            mistake=named(
                "no_value_error",
                condition="d_model % n_heads",
                message="d_model={d_model} is not divisible by n_heads={n_heads}",
            ),
        )
