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
from .mistakes import named, pair
from .nb01 import BUILTIN_ATTENTION
from .toolkit import (
    TOL,
    as_float64,
    build_module,
    dtype_name,
    expect_masked_weights_zero,
    expect_tensor,
    load_linear_weights,
)

# ----------------------------------------------------------------------------- split_heads
SPLIT_VIEW = named("split_view_without_transpose")
SPLIT_INTERLEAVED = named("split_interleaved")


def _split_view(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.reshape(B, H, T, D // H)


def _split_interleaved(x: torch.Tensor, H: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.reshape(B, T, D // H, H).permute(0, 3, 1, 2)


def _check_rearrangement(
    ctx: Context,
    candidate,
    x: torch.Tensor,
    args: tuple,
    case: str,
    *,
    expected: torch.Tensor,
    shape_name: str,
    wrong_shapes: dict[tuple, tuple[str, str]],
    mistakes: list[Mistake],
    hint: str,
) -> None:
    """The shared body of the split_heads and merge_heads checks: call, then the type, the
    shape (naming a known wrong shape), dtype and device, then every value exactly."""
    got = ctx.call(candidate, x, *args, case=case)
    expect_tensor(ctx, got, "the result", case)
    shape, want = tuple(got.shape), tuple(expected.shape)
    if shape != want:
        likely, shape_hint = wrong_shapes.get(shape, ("", ""))
        ctx.fail(
            f"the result has shape {shape}, expected {shape_name} = {want}.",
            case=case,
            likely=likely,
            hint=shape_hint,
            mistake="wrong_shape",
        )
    ctx.expect_array(got, expected, what="the result", case=case)
    ctx.expect_close(
        got, expected, what="the result", case=case, rtol=0, atol=0, mistakes=mistakes, hint=hint
    )


@exercise(
    "split_heads",
    forbidden=lambda: [(ref.split_heads, "the reference attention_ref.split_heads")],
    summary="(B, T, D) -> (B, H, T, D/H)",
)
def check_split_heads(candidate, ctx: Context) -> None:
    rng = ctx.rng(41)
    cases = [
        ("x holds 0, 1, 2, ... (so you can read which feature went where)", 2, 3, 8, 2, "arange"),
        ("a batch of 3, T=5, D=12, 3 heads", 3, 5, 12, 3, "float64"),
        ("one head", 2, 4, 6, 1, "float64"),
        ("d_head = 1 (as many heads as features)", 2, 3, 4, 4, "float32"),
        ("one token, a batch of one", 1, 1, 6, 2, "float32"),
        ("T=7, D=16, 4 heads", 2, 7, 16, 4, "float32"),
    ]
    if ctx.thorough:
        cases += [
            ("a batch of 4, T=9, D=32, 8 heads", 4, 9, 32, 8, "float64"),
            ("T=2, D=10, 5 heads", 3, 2, 10, 5, "float32"),
        ]
    for label, B, T, D, H, kind in cases:
        if kind == "arange":
            x = torch.arange(B * T * D, dtype=torch.float32).reshape(B, T, D)
        else:
            x = torch.from_numpy(rng.normal(size=(B, T, D))).to(getattr(torch, kind))
        dh = D // H
        _check_rearrangement(
            ctx,
            candidate,
            x,
            (H,),
            f"{label}: x {tuple(x.shape)} {dtype_name(x.dtype)}, n_heads={H}",
            expected=ref.split_heads(x, H),
            shape_name="(B, H, T, D/H)",
            wrong_shapes={
                (B, T, H, dh): pair("split_heads_not_moved"),
                (B * H, T, dh): pair("split_heads_folded"),
                (B, H, dh, T): pair("split_heads_last_axes_swapped"),
            },
            mistakes=[
                Mistake(SPLIT_VIEW, SPLIT_VIEW.hint, model=lambda x=x, H=H: _split_view(x, H)),
                Mistake(
                    SPLIT_INTERLEAVED,
                    SPLIT_INTERLEAVED.hint,
                    model=lambda x=x, H=H: _split_interleaved(x, H),
                ),
            ],
            hint="head h must hold features h*D/H .. (h+1)*D/H - 1 of every token: "
            "result[b, h, t] == x[b, t, h*D//H:(h+1)*D//H].",
        )


# ----------------------------------------------------------------------------- merge_heads
MERGE_NO_TRANSPOSE = named("merge_without_transpose")
MERGE_WRONG_ORDER = named("merge_wrong_order")


@exercise(
    "merge_heads",
    forbidden=lambda: [(ref.merge_heads, "the reference attention_ref.merge_heads")],
    summary="(B, H, T, d_head) -> (B, T, H*d_head), the inverse of split_heads",
)
def check_merge_heads(candidate, ctx: Context) -> None:
    rng = ctx.rng(42)
    cases = [
        ("x holds 0, 1, 2, ... (so you can read which feature went where)", 2, 2, 3, 4, "arange"),
        ("a batch of 3, 3 heads, T=5, d_head=4", 3, 3, 5, 4, "float64"),
        ("one head", 2, 1, 4, 6, "float64"),
        ("d_head = 1", 2, 4, 3, 1, "float32"),
        ("one token, a batch of one", 1, 2, 1, 3, "float32"),
        ("round trip: merge_heads(split_heads(x)) must give x back", 2, 4, 5, 3, "split"),
    ]
    if ctx.thorough:
        cases += [
            ("8 heads, T=9, d_head=4", 4, 8, 9, 4, "float64"),
            ("round trip, float64", 3, 5, 2, 2, "split64"),
        ]
    for label, B, H, T, dh, kind in cases:
        if kind == "arange":
            x = torch.arange(B * H * T * dh, dtype=torch.float32).reshape(B, H, T, dh)
        elif kind.startswith("split"):
            dtype = torch.float64 if kind == "split64" else torch.float32
            x0 = torch.from_numpy(rng.normal(size=(B, T, H * dh))).to(dtype)
            x = ref.split_heads(x0, H)  # a transposed view, as in a real model
        else:
            x = torch.from_numpy(rng.normal(size=(B, H, T, dh))).to(getattr(torch, kind))
        flattened_wrong = pair("merge_heads_wrong_axes")
        _check_rearrangement(
            ctx,
            candidate,
            x,
            (),
            f"{label}: x {tuple(x.shape)} {dtype_name(x.dtype)}",
            expected=ref.merge_heads(x),
            shape_name="(B, T, H*d_head)",
            wrong_shapes={
                (B, T, H, dh): pair("merge_heads_not_flattened"),
                (B, H * T, dh): flattened_wrong,
                (B, H, T * dh): flattened_wrong,
            },
            mistakes=[
                Mistake(
                    MERGE_NO_TRANSPOSE,
                    MERGE_NO_TRANSPOSE.hint,
                    model=lambda x=x, s=(B, T, H * dh): x.reshape(s),
                ),
                Mistake(
                    MERGE_WRONG_ORDER,
                    MERGE_WRONG_ORDER.hint,
                    model=lambda x=x, s=(B, T, H * dh): x.permute(0, 2, 3, 1).reshape(s),
                ),
            ],
            hint="merge_heads must undo split_heads exactly: result[b, t, h*d_head:(h+1)*d_head]"
            " == x[b, h, t].",
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
    scale: float | None = None,
    axis: int = -1,
    mask_mode: str = "correct",
    swap_qk: bool = False,
    kv_from: str = "correct",
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention in float64 NumPy, with one knob per catalogued mistake.

    ``P`` holds ``w_q.weight (D, D)``, ``w_q.bias (D,)`` or None, and the same for w_k,
    w_v, w_o (nn.Linear layout: ``y = x W^T + b``).
    Every knob's default, "correct", is the right computation (the option vocabulary of
    every mistake model). split: "view" (no transpose), "interleave"; merge: "view",
    "interleave"; mask_mode: "no_head_axis" (3-D mask not unsqueezed), "repeat" (mask.repeat(H, 1,
    1).view(B, H, ...)), "inverted", "fill" (-1e9), "ignored"; kv_from: "query" (keys and
    values projected from the query), "key" (values projected from the key).
    """

    def lin(x, name):
        b = P[f"{name}.bias"]
        return x @ P[f"{name}.weight"].T + (0.0 if b is None else b)

    if kv_from == "query":
        key = value = query
    elif kv_from == "key":
        value = key
    Q, K, V = lin(query, "w_q"), lin(key, "w_k"), lin(value, "w_v")
    if swap_qk:
        Q, K = lin(key, "w_k"), lin(query, "w_q")

    def sp(x):
        B, T, D = x.shape
        dh = D // H
        if split == "view":
            return x.reshape(B, H, T, dh)
        if split == "interleave":
            return x.reshape(B, T, dh, H).transpose(0, 3, 1, 2)
        return x.reshape(B, T, H, dh).transpose(0, 2, 1, 3)

    q, k, v = sp(Q), sp(K), sp(V)
    B, _, n_q, dh = q.shape
    n_k = k.shape[2]
    s = q @ np.swapaxes(k, -1, -2) / (math.sqrt(dh) if scale is None else scale)
    m = None if mask is None else np.asarray(mask, dtype=bool)
    if m is not None and m.ndim == 3:
        if mask_mode == "no_head_axis":
            if m.shape[0] not in (1, H):
                raise ValueError("does not broadcast")
        elif mask_mode == "repeat":
            m = np.tile(np.broadcast_to(m, (B, n_q, n_k)), (H, 1, 1)).reshape(B, H, n_q, n_k)
        else:
            m = m[:, None]
    if m is not None:
        m = np.broadcast_to(m, s.shape)
    if m is None or mask_mode == "ignored":
        w = M.softmax(s, axis)
    elif mask_mode == "inverted":
        w = M.masked_softmax(s, ~m, axis)
    elif mask_mode == "fill":
        w = M.fill_softmax(s, m, -1e9, axis)
    else:
        w = M.masked_softmax(s, m, axis)
    o = w @ v  # (B, H, n_q, dh)
    if merge == "view":
        o = o.reshape(B, n_q, H * dh)
    elif merge == "interleave":
        o = o.transpose(0, 2, 3, 1).reshape(B, n_q, H * dh)
    else:
        o = o.transpose(0, 2, 1, 3).reshape(B, n_q, H * dh)
    if w_o:
        o = lin(o, "w_o")
    return o, w


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


def _mha_cases(ctx: Context) -> list[MHACase]:
    rng = ctx.rng(43)

    def r(*shape, scale=1.0):
        return scale * rng.normal(size=shape)

    def self_case(label, D, H, bias, B, T, mask=None, scale=1.0):
        x = r(B, T, D, scale=scale)
        return MHACase(label, D, H, bias, x, x, x, mask, self_attn=True)

    causal = np.tril(np.ones((6, 6), dtype=bool))
    pad = np.ones((3, 1, 5), dtype=bool)
    pad[1, :, 2:] = False
    pad[2] = False  # an empty sequence: every query of it has nothing to attend to
    per_batch = rng.random((2, 4, 5)) < 0.6
    per_batch[:, :, 0] = True
    per_batch[1, 2, :] = False  # a fully masked row
    per_head = rng.random((2, 2, 4, 4)) < 0.5
    per_head[..., 1] = True
    cases = [
        self_case("self-attention, 2 heads, the default bias", 8, 2, None, 2, 5),
        MHACase(
            "cross-attention: n_q=3, n_k=6, 3 heads, bias=False",
            12,
            3,
            False,
            r(2, 3, 12),
            r(2, 6, 12),
            r(2, 6, 12),
        ),
        self_case("one head", 6, 1, True, 1, 4),
        self_case("d_head = 1 (4 heads of one feature)", 4, 4, True, 2, 3),
        self_case("a causal mask (6, 6), 4 heads", 16, 4, True, 2, 6, causal),
        MHACase(
            "a padding mask (3, 1, 5): sequence lengths 5, 2 and 0",
            8,
            2,
            True,
            r(3, 4, 8),
            r(3, 5, 8),
            r(3, 5, 8),
            pad,
        ),
        MHACase(
            "a mask (2, 4, 5), one per batch element, with a fully masked row",
            8,
            2,
            True,
            r(2, 4, 8),
            r(2, 5, 8),
            r(2, 5, 8),
            per_batch,
        ),
        MHACase(
            "a padding mask (3, 1, 1, 5), as later notebooks pass it: lengths 5, 2 and 0",
            8,
            2,
            True,
            r(3, 4, 8),
            r(3, 5, 8),
            r(3, 5, 8),
            pad[:, None],
        ),
        self_case("a per-head mask (2, 2, 4, 4)", 6, 2, False, 2, 4, per_head),
        self_case("large inputs (scores in the tens)", 8, 2, True, 2, 5, scale=4.0),
    ]
    if ctx.thorough:
        m3 = rng.random((3, 7, 7)) < 0.5
        m3[:, :, 3] = True
        cases += [
            self_case("a batch of 3, T=9, d_model=32, 8 heads", 32, 8, True, 3, 9),
            self_case("a mask (3, 7, 7) with 4 heads (B != H)", 16, 4, False, 3, 7, m3),
            self_case(
                "a mask (3, 1, 7, 7), one per batch element with its head axis",
                16,
                4,
                True,
                3,
                7,
                m3[:, None],
            ),
            MHACase(
                "cross-attention, one query, 2 heads",
                10,
                2,
                True,
                r(2, 1, 10),
                r(2, 7, 10),
                r(2, 7, 10),
            ),
            self_case("one token", 8, 4, True, 2, 1),
        ]
    return cases


def _mha_params(ctx: Context, salt: int, D: int, bias: bool) -> dict[str, np.ndarray | None]:
    rng = ctx.rng(salt)
    P: dict[str, np.ndarray | None] = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        P[f"{name}.weight"] = rng.normal(size=(D, D)) / math.sqrt(D)
        P[f"{name}.bias"] = 0.5 * rng.normal(size=D) if bias else None
    return P


MASK_NO_HEAD_AXIS = named("mask_no_head_axis")


def _mha_mistakes(c: MHACase, args, P, which: int) -> list[Mistake]:
    q, k, v, mask = args
    H, D = c.n_heads, c.d_model
    n_q = q.shape[1]

    def m(mistake_id, **kw):
        return Mistake.of(mistake_id, model=lambda: mha_model(q, k, v, mask, P, H, **kw)[which])

    out = []
    if H > 1:
        out += [
            m("mha_split_view", split="view"),
            m("mha_split_view", split="view", merge="view"),
            m("mha_merge_without_transpose", merge="view"),
            m("mha_split_interleaved", split="interleave"),
            m("mha_merge_wrong_order", merge="interleave"),
            m(
                "scale_by_d_model",
                scale=math.sqrt(D),
            ),
        ]
    out += [
        m(
            "w_o_not_applied",
            w_o=False,
        ),
        m(
            "scale_missing_head",
            scale=1.0,
        ),
        m(
            "queries_keys_swapped_heads",
            swap_qk=True,
        ),
    ]
    if n_q > 1:
        out.append(
            m(
                "softmax_over_queries_heads",
                axis=-2,
            )
        )
    if not c.self_attn:
        out.append(
            m(
                "values_from_key",
                kv_from="key",
            )
        )
    if mask is not None:
        if mask.ndim == 3 and H > 1:
            out += [
                m("mask_no_head_axis", mask_mode="no_head_axis"),
                m(
                    "mask_repeat_wrong_order",
                    mask_mode="repeat",
                ),
            ]
        out += [
            m(
                "mask_inverted_heads",
                mask_mode="inverted",
            ),
            m(
                "mask_ignored_heads",
                mask_mode="ignored",
            ),
            m(
                "fully_masked_row_uniform_heads",
                mask_mode="fill",
            ),
        ]
    return out


def _mha_forbidden():
    return [
        (ref.MultiHeadAttention.forward, "the reference attention_ref.MultiHeadAttention"),
        *BUILTIN_ATTENTION,
    ]


def _prepare_mha(cls, ctx: Context, D: int, H: int, bias, P, dtype, case) -> nn.Module:
    kwargs = {} if bias is None else {"bias": bias}
    x = torch.zeros(1, 2, D, dtype=dtype)  # (B, T, D): one call sets up lazy layers
    mod = build_module(ctx, cls, (D, H), kwargs, case, sample=(x, x, x))
    mod.to(dtype)
    b = bias is not False
    spec = f"nn.Linear(d_model, d_model, bias=bias), here nn.Linear({D}, {D}, bias={b})"
    layers = {
        name: (
            torch.from_numpy(P[f"{name}.weight"]).to(dtype),
            None if P[f"{name}.bias"] is None else torch.from_numpy(P[f"{name}.bias"]).to(dtype),
            spec,
        )
        for name in ("w_q", "w_k", "w_v", "w_o")
    }
    dh = D // H
    shared = named("mha_shared_head_projection", D=D, dh=dh)
    load_linear_weights(
        ctx,
        mod,
        layers,
        case,
        raw_ok=False,
        likely={
            "missing w_o": named("mha_w_o_missing"),
            "shape w_q": shared,
            "shape w_k": shared,
            "shape w_v": shared,
        },
    )
    return mod


def _rounded(P, dtype) -> dict[str, np.ndarray | None]:
    """The float64 values of the parameters as the candidate holds them in ``dtype``."""
    return {
        k: None if v is None else torch.from_numpy(v).to(dtype).double().numpy()
        for k, v in P.items()
    }


@exercise(
    "multi_head_attention",
    kind="module",
    forbidden=_mha_forbidden,
    summary="multi-head attention with W_Q, W_K, W_V, W_O",
)
def check_multi_head_attention(cls, ctx: Context) -> None:
    for i, c in enumerate(_mha_cases(ctx)):
        P = _mha_params(ctx, 200 + i, c.d_model, c.bias is not False)
        for dtype in (torch.float64, torch.float32):
            _check_mha_case(cls, ctx, c, P, dtype)
    _check_key_permutation(cls, ctx)
    _check_indivisible(cls, ctx)


def _check_mha_case(cls, ctx: Context, c: MHACase, P, dtype) -> None:
    q = torch.from_numpy(c.query).to(dtype)
    k = q if c.self_attn else torch.from_numpy(c.key).to(dtype)
    v = q if c.self_attn else torch.from_numpy(c.value).to(dtype)
    mask = None if c.mask is None else torch.from_numpy(c.mask)
    bias = "" if c.bias is None else f", bias={c.bias}"
    inputs = (
        f"x {tuple(q.shape)}"
        if c.self_attn
        else f"query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
    )
    case = (
        f"{c.label}: MultiHeadAttention({c.d_model}, {c.n_heads}{bias}), {inputs} "
        f"{dtype_name(dtype)}" + ("" if mask is None else f", mask {tuple(mask.shape)}")
    )
    mod = _prepare_mha(cls, ctx, c.d_model, c.n_heads, c.bias, P, dtype, case)
    P64 = _rounded(P, dtype)
    args64 = (as_float64(q), as_float64(k), as_float64(v), c.mask)
    out64, w64 = mha_model(*args64, P64, c.n_heads)

    call_args = (q, k, v) if mask is None else (q, k, v, mask)
    try:
        got = ctx.call(mod, *call_args, case=case)
    except CheckFailure as err:
        text = str(err)
        if (
            c.mask is not None
            and c.mask.ndim == 3
            and "Likely mistake" not in text
            and re.search(r"size of tensor|broadcast|match", text)
        ):
            raise naming(err, MASK_NO_HEAD_AXIS) from None
        raise
    out, weights = ctx.expect_tuple(got, ("out", "weights"), case=case)
    B, n_q, n_k, H = q.shape[0], q.shape[1], k.shape[1], c.n_heads
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) != w64.shape:
        shape = tuple(weights.shape)
        likely, hint = "", ""
        if isinstance(out, torch.Tensor) and tuple(out.shape) == w64.shape:
            likely, hint = "returned (weights, out) instead of (out, weights).", ""
        elif shape == (B, n_q, n_k):
            likely = named("weights_averaged_over_heads")
            hint = likely.hint
        elif shape == (B * H, n_q, n_k):
            likely = named("batch_heads_folded")
            hint = likely.hint
        elif n_q != n_k and shape == (B, H, n_q, n_q):
            likely = named("keys_from_query")
            hint = likely.hint
        ctx.fail(
            f"weights has shape {shape}, expected (B, H, n_q, n_k) = {w64.shape}.",
            case=case,
            likely=likely,
            hint=hint,
            mistake="wrong_shape",
        )
    if isinstance(out, torch.Tensor) and tuple(out.shape) != out64.shape:
        shape = tuple(out.shape)
        likely = ""
        if shape == (B, H, n_q, c.d_model // H):
            likely = named("heads_not_merged")
        ctx.fail(
            f"out has shape {shape}, expected (B, n_q, d_model) = {out64.shape}.",
            case=case,
            likely=likely,
            mistake="wrong_shape",
        )
    ctx.expect_array(weights, q.new_zeros(w64.shape), what="weights", case=case)
    ctx.expect_array(out, q.new_zeros(out64.shape), what="out", case=case)
    tol = TOL[dtype]
    if c.mask is not None:
        expect_masked_weights_zero(
            ctx,
            weights,
            w64,
            c.mask if c.mask.ndim != 3 else c.mask[:, None],
            case=case,
            mistakes=_mha_mistakes(c, args64, P64, 1),
            otherwise=named("mask_not_applied_heads"),
            axes="batch, head, query, key",
        )
    ctx.expect_close(
        weights,
        w64,
        what="weights",
        case=case,
        mistakes=_mha_mistakes(c, args64, P64, 1),
        **tol,
    )
    ctx.expect_close(
        out,
        out64,
        what="out",
        case=case,
        mistakes=_mha_mistakes(c, args64, P64, 0),
        hint="the weights are right: out = W_O(merge_heads(weights @ v)).",
        **tol,
    )


def _check_key_permutation(cls, ctx: Context) -> None:
    """Keys and values are a set: shuffling them together must not change the output."""
    rng = ctx.rng(44)
    D, H, n_q, n_k = 8, 2, 3, 6
    P = _mha_params(ctx, 45, D, True)
    perm = rng.permutation(n_k)
    while np.all(perm == np.arange(n_k)):  # pragma: no cover - astronomically unlikely
        perm = rng.permutation(n_k)
    q = torch.from_numpy(rng.normal(size=(2, n_q, D)))
    k = torch.from_numpy(rng.normal(size=(2, n_k, D)))
    v = torch.from_numpy(rng.normal(size=(2, n_k, D)))
    case = (
        f"query {tuple(q.shape)}, key and value {tuple(k.shape)} float64, then the same keys "
        f"and values in the order {perm.tolist()}"
    )
    mod = _prepare_mha(cls, ctx, D, H, True, P, torch.float64, case)
    out, w = ctx.expect_tuple(ctx.call(mod, q, k, v, case=case), ("out", "weights"), case=case)
    p = torch.from_numpy(perm)
    out_p, w_p = ctx.expect_tuple(
        ctx.call(mod, q, k[:, p], v[:, p], case=case), ("out", "weights"), case=case
    )
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
