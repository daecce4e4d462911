"""Checks for notebook 14: ``triton_softmax`` (a row softmax kernel), ``triton_attention``
(FlashAttention's forward pass as a Triton kernel: output and log-sum-exp),
``triton_causal_split`` (its causal loop split in two: full tiles unmasked, the diagonal's
masked) and ``triton_flash_attention`` (the autograd function pairing it with notebook 12's
backward).

The learner's kernels run where their inputs are: on a machine without a CUDA device, in
Triton's interpreter on CPU tensors (the notebook sets ``TRITON_INTERPRET=1``); on a GPU,
compiled, with the same cases. Values are compared with float64 models of the right
computation and of realistic mistakes (the accumulator or the sum not rescaled, the maximum
not carried, the tail of the keys not masked, strides assumed contiguous, the causal mask's
off-by-ones at the tile borders, the log-sum-exp in base 2, ...). Known differences of the
backends are tolerances, never the learner's fault: on a GPU, ``tl.dot`` on float32 inputs
uses TF32 by default (about 1e-3 relative error), so float32 is held to 1e-2 there. Each
check calls one small case twice, on other values of the same shape, dtype and strides: each
answer must be its own input's (a result kept by shape is named) and the first must not change
when the second call comes (one buffer returned by every call).

Watching in the interpreter: :class:`~attention_ref.efficient.KernelLoads` checks every
address a load or store touches against the memory of the tensor its tile starts in (an
access outside it, a load or a store without the mask of its rows or columns, is left out
and named: unwatched it reads other memory or crashes the process), and names two programs
storing the same element (the interpreter runs programs in order and hides that race). It
counts the elements loaded and the multiply-adds of every ``tl.dot``: a causal call must load
at most 80% of what the same call without causality loads, and do at most 80% of its
products (67% and 62.5% when the future tiles are skipped), and the programs whose queries
see no key (causal, n_q > n_k) must load no tile of k or v. It records the dtypes of every
``tl.dot``'s operands: with float16 inputs, a product of float32 tiles (inputs upcast before
``tl.dot``, ``p`` not rounded to ``v``'s dtype) is correct in value but a TF32 product at
half the speed on a GPU, and is named. A compiled kernel cannot be watched: on a GPU those
tests are left out, and float32 is held to TF32's 1e-2, so graded marks assume the
interpreter (the instructor guide says so).

Time limits: a call of the learner's kernel may take LIMIT_FACTOR times what the reference
kernel takes per tile step, measured on the check's first case when the check starts, times
the case's tile steps (never less than the usual per-call limit): the interpreter's speed
varies with the machine and its load, and a kernel that skips no tile must be named for
that, not cut off as an infinite loop.

Triton is imported only when a check runs (it installs on Linux only).
"""

from __future__ import annotations

import functools
import math
import os
import re
import time

import numpy as np
import torch

from ..efficient import KernelLoads, OpRecorder, PeakMemory
from ..trust.remote import watching
from ._core import CheckFailure, Context, Mistake, exercise, naming
from .mistakes import mistake_id, named, tag
from .nb12 import (
    _SOFTMAXES,
    FLASH_BWD_MISTAKES,
    TRACED_LIMIT_SCALE,
    _flash_backward,
    _flash_forward,
    _full_attention,
    _function_class,
    _leaves,
)
from .toolkit import (
    BUILTIN_ATTENTION,
    dtype_name,
    expect_spec_defaults,
    expect_tensor,
    reference_functions,
)

F16, F32, F64 = torch.float16, torch.float32, torch.float64


def _ref():
    from .. import triton_attention

    return triton_attention


def _tuned() -> list[tuple]:
    """The reference forward kernel under triton.autotune (notebook 14's GPU section): it
    computes what triton_attention and triton_causal_split ask for."""
    from .. import triton_tuning

    return [
        (triton_tuning.triton_attention_tuned, "the reference attention_ref.triton_attention"),
        (triton_tuning.tuned_attention_kernel, "the reference attention_ref.triton_attention"),
    ]


def _notebook_12s() -> list[tuple]:
    """Notebook 12's FlashAttention, which notebook 14's kernels rewrite: its forward pass
    (whole, or its loop) and its backward pass (an autograd function, or a tiled loop that
    autograd can differentiate)."""
    from .. import efficient, flash

    return [
        (efficient.online_softmax_attention, "notebook 12's online_softmax_attention"),
        (efficient._online_attention, "notebook 12's online_softmax_attention (its loop)"),
        (flash.flash_attention, "notebook 12's flash_attention"),
        (flash.FlashAttention.forward, "notebook 12's FlashAttention"),
        (flash.FlashAttention.backward, "notebook 12's FlashAttention"),
        (flash._flash_backward, "notebook 12's FlashAttention (its backward pass)"),
    ]


def _device() -> torch.device:
    """Where the learner's kernels run: the GPU when there is one and the interpreter is
    off, else the CPU (through the interpreter)."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return torch.device("cuda")
    return torch.device("cpu")


def _tol(dtype: torch.dtype, device: torch.device) -> dict:
    """float32: exact float32 in the interpreter, TF32 allowed on a GPU; float16: its
    rounding of the output and of the weights before the second product."""
    if dtype == F16:
        return dict(rtol=5e-3, atol=5e-3)
    if device.type == "cuda":
        return dict(rtol=1e-2, atol=1e-2)
    return dict(rtol=1e-4, atol=2e-5)


def _as_contiguous_strides(x: torch.Tensor) -> torch.Tensor:
    """What a kernel that ignores ``x``'s strides reads: its memory in contiguous order."""
    strides, s = [], 1
    for n in reversed(x.shape):
        strides.append(s)
        s *= max(n, 1)
    return torch.as_strided(x, x.shape, tuple(reversed(strides)))


def _expect_in_bounds(ctx, rec: KernelLoads, case: str, race: str | None = None) -> None:
    """In the interpreter: every element the kernel loaded or stored lies in the tensor its
    tile starts in, and no two programs stored the same element (the watcher left any other
    access out, so that the interpreter did not crash on it). ``race``: the id of programs
    adding to the same elements by a load and a store (a read-modify-write)."""
    for text in rec.out_of_bounds[:1]:
        if race and "read-modify-write" in text:
            ctx.fail(
                f"{text[:1].upper() + text[1:]}: your kernel's programs add to the same "
                "elements without tl.atomic_add.",
                case=case,
                mistake=race,
            )
        store = "store" in text
        ctx.fail(
            f"your kernel {'writes' if store else 'reads'} memory outside the elements it was "
            "given (Triton's interpreter was watching its addresses).",
            case=case,
            mistake=named(
                "triton_store_out_of_bounds" if store else "triton_load_out_of_bounds",
                detail=text[:1].upper() + text[1:],
            ),
        )


#: The label of a case's second call, on other values of the first's shape, dtype and strides
#: (a result cached by shape, or one buffer returned by every call, shows there).
AGAIN = "again, on other values of the same shape, dtype and strides"


def _copies(results) -> tuple:
    """What a call returned, copied as it came back (to see a later call change it)."""
    return tuple(t.detach().cpu().clone() for t in results)


def _cached(earlier: torch.Tensor) -> Mistake:
    """The earlier call's result, given back for other inputs of its shape."""
    return Mistake.of("result_cached_by_shape", model=lambda: earlier.detach().double().cpu())


def _expect_kept(ctx, results, copies, case: str) -> None:
    """The results of the earlier call (``results``) are as they came back (``copies``) after
    the later call: a function that returns one buffer each call overwrites changes them."""
    for got, copy in zip(results, copies, strict=True):
        if not torch.allclose(got.detach().cpu(), copy, rtol=0, atol=0, equal_nan=True):
            ctx.fail(
                "what your function returned for the earlier inputs changed when it was called "
                "again on other inputs of that shape.",
                case=case,
                mistake="result_buffer_reused",
            )


#: A call of the learner's kernel may take this many times what the reference takes for the
#: same number of tile steps (measured unwatched, on the same machine, in CPU time): the
#: tripwire makes the interpreter about 3.5 times slower, a kernel that skips no tile does
#: up to twice the work, and a learner's kernel may spend more operations per tile.
LIMIT_FACTOR = 25.0


def _steps(shape, bm: int, bn: int) -> int:
    """Tile steps of a kernel that skips nothing: programs times (the query block and every
    key tile); the interpreter's time is about proportional to them."""
    B, H, n_q, n_k, _ = shape
    return -(-n_q // bm) * B * H * (1 + -(-n_k // bn))


def _reference_pace(shape, causal, dtype, layout, bm, bn, dev) -> float:
    """CPU seconds per tile step of the reference kernel on the first case (its first call
    included: a generous estimate on the machine and under the load the check runs on)."""
    q, k, v = _attention_inputs(torch.Generator().manual_seed(0), shape, dtype, layout, 1.0, dev)
    start = time.process_time()
    _ref().triton_attention(q, k, v, causal, bm, bn)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.process_time() - start) / _steps(shape, bm, bn)


def _limit_scale(ctx, pace: float, shape, bm: int, bn: int, floor: float = 1.0) -> float:
    """The time limit of one call, as a multiple of the per-call limit: at least ``floor``,
    and at least LIMIT_FACTOR times the reference's time for the case's tile steps."""
    if not ctx.time_limit:
        return floor
    return max(floor, LIMIT_FACTOR * pace * _steps(shape, bm, bn) / ctx.time_limit)


# ----------------------------------------------------------------------------- triton_softmax
def _softmax_model(x: torch.Tensor, *, tail: str = "masked", subtract_max: bool = True):
    """A (possibly buggy) row softmax in float64: ``tail="zeros"`` loads the block's tail
    (past the row) as 0 and sums it; ``subtract_max=False`` exponentiates x itself."""
    x = x.double()
    n = x.shape[-1]
    block = 1 << max(n - 1, 0).bit_length()
    if tail == "zeros" and block > n:
        x = torch.cat([x, x.new_zeros(x.shape[0], block - n)], dim=-1)
    with np.errstate(all="ignore"):
        # without the maximum, exp overflows where the kernel computes: in float32
        e = torch.exp(x - x.amax(-1, keepdim=True)) if subtract_max else torch.exp(x.float())
        e = e.double()
        return (e / e.sum(-1, keepdim=True))[:, :n]


#: label, rows, columns, dtype, transposed layout (column stride != 1), scale of the values
SOFTMAX_CASES = [
    ("37 columns (a block of 64: 27 masked)", 4, 37, F32, False, 1.0),
    ("64 columns (the block exactly)", 3, 64, F32, False, 1.0),
    ("one column", 2, 1, F32, False, 1.0),
    ("100 columns, float16", 5, 100, F16, False, 1.0),
    ("a transposed view (strides (1, 6))", 6, 20, F32, True, 1.0),
    ("large entries (up to about 900)", 3, 50, F32, False, 300.0),
]
SOFTMAX_THOROUGH = [
    ("300 columns", 9, 300, F32, False, 1.0),
    ("3 columns, transposed", 4, 3, F32, True, 1.0),
]
SOFTMAX_MISTAKES = [
    ("triton_tail_loaded_as_zero", dict(tail="zeros")),
    ("triton_softmax_no_max", dict(subtract_max=False)),
]


def _name_overflow(ctx, got, x, case: str) -> None:
    """NaN or inf exactly where exp without the maximum overflows: that mistake."""
    bad = ~torch.isfinite(got.detach().double().cpu())
    if bool(bad.any()):
        model = ~torch.isfinite(_softmax_model(x.cpu(), subtract_max=False))
        if torch.equal(bad, model):
            ctx.fail("the result contains NaN or inf.", case=case, mistake="triton_softmax_no_max")


@exercise(
    "triton_softmax",
    forbidden=lambda: [
        (_ref().triton_softmax, "the reference attention_ref.triton_softmax"),
        *_SOFTMAXES,
        *BUILTIN_ATTENTION,  # a softmax is one query's weights: PyTorch's attention computes it
    ],
    summary="a Triton kernel: softmax of each row, any width, any strides",
)
def check_triton_softmax(candidate, ctx: Context) -> None:
    """Values against float64 softmax for widths that are and are not powers of two, a
    transposed input and large entries; a wrong value named by a model of the mistake."""
    g = ctx.torch_gen(141)
    dev = _device()
    cases = SOFTMAX_CASES + (SOFTMAX_THOROUGH if ctx.thorough else [])
    for index, (label, rows, cols, dtype, transposed, scale) in enumerate(cases):
        x = _softmax_input(g, rows, cols, dtype, transposed, scale, dev)
        got, _ = _softmax_case(ctx, candidate, x, label, transposed, dev)
        if not index:
            first = (x, got, _copies([got]))  # x kept: no later input takes its memory
    # the first case's shape, dtype and strides again, on other values
    label, rows, cols, dtype, transposed, scale = cases[0]
    x = _softmax_input(g, rows, cols, dtype, transposed, scale, dev)
    _, case = _softmax_case(
        ctx, candidate, x, f"{label}, {AGAIN}", transposed, dev, extra=[_cached(first[1])]
    )
    _expect_kept(ctx, [first[1]], first[2], case)


def _softmax_input(g, rows, cols, dtype, transposed, scale, dev) -> torch.Tensor:
    x = scale * torch.randn(cols, rows, generator=g, dtype=F64)
    x = x.to(dtype).to(dev)
    return x.t() if transposed else x.t().contiguous()


def _softmax_case(ctx, candidate, x, label, transposed, dev, extra=()):
    """One call of the learner's softmax, watched, against float64 (``extra``: more models of
    mistakes, first): ``(the result, the case's description)``."""
    dtype = x.dtype
    case = f"{label}: x {tuple(x.shape)} {dtype_name(dtype)}, strides {x.stride()}"
    with watching(KernelLoads()) as rec:
        got = ctx.call(candidate, x, case=case)
    _expect_in_bounds(ctx, rec, case)
    expected = torch.softmax(x.double(), -1)
    if isinstance(got, torch.Tensor) and got.shape == x.shape:
        _name_overflow(ctx, got, x, case)
    ctx.expect_array(got, x.new_empty(x.shape), what="the result", case=case)
    mistakes = list(extra) + [
        Mistake.of(i, model=lambda kw=kw: _softmax_model(x, **kw)) for i, kw in SOFTMAX_MISTAKES
    ]
    if transposed:
        mistakes.append(
            Mistake.of(
                "triton_strides_contiguous",
                model=lambda: _softmax_model(_as_contiguous_strides(x)),
            )
        )
        mistakes.append(
            Mistake.of(
                "triton_unit_column_stride",
                model=lambda: _softmax_model(torch.as_strided(x, x.shape, (x.stride(0), 1))),
            )
        )
    ctx.expect_close(
        got.double(), expected, what="the result", case=case, mistakes=mistakes,
        **_tol(dtype, dev),
    )  # fmt: skip
    return got, case


# ----------------------------------------------------------------------------- triton_attention
def _attention_model(
    q,
    k,
    v,
    causal: bool,
    bm: int,
    bn: int,
    *,
    rescale_acc: bool = True,
    rescale_l: bool = True,
    carry_max: bool = True,
    tail: str = "masked",
    mask: str = "right",
    stop_before_block: bool = False,
    scale: bool = True,
    base2: bool = False,
    end_shift: int = 0,
    fill: float = -math.inf,
    weights: str = "running",
    scale_twice: bool = False,
    log2_scores: bool = False,
):
    """``(out, lse)`` of a (possibly buggy) tiled attention kernel in float64: one program
    per ``bm`` queries, ``bn`` keys per tile; when causal, the tiles up to the last query's
    diagonal (``stop_before_block``: up to the first query's, the diagonal tile left out).
    ``tail="zeros"``: keys past n_k loaded as 0 and not masked; ``mask``: "right" (j <= i +
    n_k - n_q), "strict" (j < i + ...), "none" (tiles skipped, the diagonal tile unmasked),
    "top_left" (j <= i); ``base2``: exp2 of the scores without the factor log2(e);
    ``end_shift``: the causal loop's end moved by that many keys; ``fill``: the value masked
    scores get (finite: the tail of the keys is loaded as 0 and masked with it);
    ``weights="tile"``: p against the tile's maximum (alpha against the running one);
    ``scale_twice``: 1/d in place of 1/sqrt(d); ``log2_scores``: exp of the scores times
    log2(e)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    if scale:
        q = q / (d if scale_twice else math.sqrt(d))
    if base2:
        q = q * math.log(2.0)
    if log2_scores:
        q = q / math.log(2.0)
    offset = n_k - n_q
    pad = (-n_k) % bn
    padded = tail == "zeros" or math.isfinite(fill)
    if padded and pad:
        k = torch.cat([k, k.new_zeros(B, H, pad, d)], 2)
        v = torch.cat([v, v.new_zeros(B, H, pad, d)], 2)
    n_keys = k.shape[2] if padded else n_k
    out = q.new_zeros(B, H, n_q, d)
    lse = q.new_full((B, H, n_q), -math.inf)
    for i0 in range(0, n_q, bm):
        i1 = min(i0 + bm, n_q)
        rows = torch.arange(i0, i1)[:, None]
        m = q.new_full((B, H, i1 - i0), -math.inf)
        l = q.new_zeros(B, H, i1 - i0)  # noqa: E741
        acc = q.new_zeros(B, H, i1 - i0, d)
        last = (i0 + offset if stop_before_block else i0 + bm + offset) + end_shift
        hi = min(max(last, 0), n_k) if causal else n_keys
        for j0 in range(0, hi, bn):
            j1 = min(j0 + bn, n_keys)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1)
            cols = torch.arange(j0, j1)[None, :]
            if tail != "zeros" and padded:
                s = s.masked_fill(cols >= n_k, fill)
            if causal and mask != "none":
                allowed = {
                    "right": cols <= rows + offset,
                    "strict": cols < rows + offset,
                    "top_left": cols <= rows,
                }[mask]
                s = s.masked_fill(~allowed, fill)
            blk = s.amax(-1)
            m_new = torch.maximum(m, blk) if carry_max else blk
            m_use = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_use) if carry_max else torch.ones_like(m)
            if weights == "tile":
                p = torch.exp(s - torch.where(torch.isfinite(blk), blk, 0.0)[..., None])
            else:
                p = torch.exp(s - m_use[..., None])
            l = (l * alpha if rescale_l else l) + p.sum(-1)  # noqa: E741
            acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v[:, :, j0:j1]
            m = m_new
        seen = l > 0
        out[:, :, i0:i1] = acc / torch.where(seen, l, torch.ones_like(l))[..., None]
        m_fin = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        lse[:, :, i0:i1] = torch.where(
            seen, m_fin + torch.log(torch.where(seen, l, 1.0)), -math.inf
        )
    return out, lse


#: id, the options of _attention_model that make the mistake (the output's mistakes).
ATTENTION_MISTAKES = [
    ("flash_accumulator_rescaled_when", dict(rescale_acc=False)),
    ("flash_running_sum_l", dict(rescale_l=False)),
    ("triton_max_not_carried", dict(carry_max=False)),
    ("triton_tail_loaded_as_zero", dict(tail="zeros")),
    ("triton_causal_tile_bound", dict(stop_before_block=True)),
    ("triton_diagonal_tile_unmasked", dict(mask="none")),
    ("flash_causal_mask_strict", dict(mask="strict")),
    ("triton_causal_offset", dict(mask="top_left")),
    ("flash_scores_scaled_1", dict(scale=False)),
    ("triton_exp2_without_log2e", dict(base2=True)),
    ("triton_causal_end_short", dict(end_shift=-1)),
    ("triton_finite_mask", dict(fill=-1.0e6)),
    ("triton_weights_tile_max", dict(weights="tile")),
    ("triton_scale_twice", dict(scale_twice=True)),
    ("triton_exp_of_log2_scores", dict(log2_scores=True)),
]
#: options that make a mistake only when causal
_CAUSAL_ONLY = {"mask", "stop_before_block", "end_shift"}

#: The case that the check of triton_attention calls again, on other values (the cheapest).
ATTENTION_AGAIN = ("one token", (1, 1, 1, 1, 16), False, F32, "", 16, 16, 1.0)
#: label, (B, H, n_q, n_k, d), causal, dtype, layout, block_m, block_n, scale of q and k.
#: Layout "bnhd": q, k, v are transposed views of (B, n, H, d) tensors (strides not those
#: of a contiguous (B, H, n, d) tensor); "kt": k is a transposed view of (B, H, d, n_k).
ATTENTION_CASES = [
    ("2 heads, n=40 (tiles of 16: a tail of 8)", (1, 2, 40, 40, 16), False, F32, "", 16, 16, 1.0),
    ("the same, causal", (1, 2, 40, 40, 16), True, F32, "", 16, 16, 1.0),
    (
        "n_q=20, n_k=45, d=32, k a transposed view of (B, H, d, n_k), v contiguous",
        (1, 2, 20, 45, 32),
        False,
        F32,
        "kt",
        16,
        16,
        1.0,
    ),
    (
        "n_q=20, n_k=45, causal (query i sees keys j <= i + 25)",
        (1, 2, 20, 45, 16),
        True,
        F32,
        "",
        16,
        16,
        1.0,
    ),
    (
        "n_q=45, n_k=20, causal (the first 25 queries see no key)",
        (1, 1, 45, 20, 16),
        True,
        F32,
        "",
        16,
        16,
        1.0,
    ),
    ATTENTION_AGAIN,
    ("one token, causal", (1, 1, 1, 1, 16), True, F32, "", 16, 16, 1.0),
    (
        # two batches: a kernel that offsets (batch, head) by bh * stride_h reads wrong here
        "2 x 2 heads, n=17, q, k, v transposed views of (B, n, H, d), causal",
        (2, 2, 17, 17, 16),
        True,
        F32,
        "bnhd",
        16,
        16,
        1.0,
    ),
    (
        # 17 = a tile + 1: the loop's end must be exactly one past the last key a block sees
        "block_m=32, block_n=16, n_q=50, n_k=67, causal (query i sees keys j <= i + 17)",
        (1, 1, 50, 67, 16),
        True,
        F32,
        "",
        32,
        16,
        1.0,
    ),
    (
        "block_m=16, block_n=32, n=50, causal, large scores (up to about 100)",
        (1, 1, 50, 50, 16),
        True,
        F32,
        "",
        16,
        32,
        5.0,
    ),
    ("float16, n=48, causal", (1, 2, 48, 48, 32), True, F16, "", 16, 16, 1.0),
]
ATTENTION_THOROUGH = [
    ("2 x 2 heads, n=72, blocks of 32, causal, transposed views of (B, n, H, d)",
     (2, 2, 72, 72, 16), True, F32, "bnhd", 32, 32, 1.0),
    ("n_q=33, n_k=66, block_n=32, causal", (1, 2, 33, 66, 16), True, F32, "", 16, 32, 1.0),
    ("k a transposed view of (B, H, d, n_k)", (1, 2, 24, 24, 16), False, F32, "kt", 16, 16, 1.0),
    ("float16, large scores", (1, 1, 40, 40, 16), False, F16, "", 16, 16, 4.0),
    ("n_q=40, n_k=30, causal: 10 see no key", (1, 1, 40, 30, 16), True, F32, "", 16, 16, 1.0),
]  # fmt: skip


def _tf32_exact(t: torch.Tensor) -> torch.Tensor:
    """float32 values that TF32 holds exactly (the low 13 of the 23 mantissa bits cleared):
    on a GPU ``tl.dot`` rounds its float32 inputs to TF32, which must not cost accuracy on
    the inputs themselves (a correct kernel's error then stays TF32's rounding of the
    weights, and the mistakes' models stay distinguishable)."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


def _attention_inputs(g, shape, dtype, layout: str, scale: float, dev):
    B, H, n_q, n_k, d = shape

    def draw(n, s=1.0):
        return s * torch.randn(B, H, n, d, generator=g, dtype=F64)

    q, k, v = draw(n_q, scale), draw(n_k, scale), draw(n_k)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if dtype == F32 and dev.type == "cuda":
        q, k, v = (_tf32_exact(t) for t in (q, k, v))
    q, k, v = (t.to(dev) for t in (q, k, v))
    if layout == "bnhd":  # the layout a linear layer gives before the heads are split
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    elif layout == "kt":
        k = k.transpose(2, 3).contiguous().transpose(2, 3)
    return q, k, v


def _exact(q, k, v, causal: bool):
    """float64 attention and log-sum-exp from the inputs as given."""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return w @ v, lse


def _heads_one_axis(t: torch.Tensor) -> torch.Tensor | None:
    """What a kernel that offsets each (batch, head) by ``bh * stride_h`` reads (the batch
    and the heads taken as one axis of B * H heads, as Triton's early tutorial 06 did): the
    same memory with a batch stride of H * stride_h. None where that equals ``t``'s own
    strides (a contiguous tensor, one batch) or reads past its storage."""
    B, H, n, d = t.shape
    strides = (H * t.stride(1), *t.stride()[1:])
    if B == 1 or strides == t.stride():
        return None
    last = sum((size - 1) * st for size, st in zip(t.shape, strides, strict=True))
    if t.storage_offset() + last >= t.untyped_storage().nbytes() // t.element_size():
        return None
    return torch.as_strided(t, t.shape, strides)


def _describe(label, q, k, causal, bm, bn) -> str:
    """The case as the learner reads it; ``causal=None``: a kernel without that argument
    (triton_causal_split's)."""
    flag = "" if causal is None else f"causal={causal}, "
    return (
        f"{label}: q {tuple(q.shape)}, k and v {tuple(k.shape)} {dtype_name(q.dtype)}, "
        f"{flag}block_m={bm}, block_n={bn}"
    )


def _expect_lse(ctx, lse, q, k, v, causal, case, tol) -> None:
    """lse: float32 (B, H, n_q); -inf exactly where a query sees no key; elsewhere the
    natural log-sum-exp, a wrong one named by its model."""
    B, H, n_q, _ = q.shape
    want_out, want = _exact(q, k, v, causal)
    like = torch.empty(B, H, n_q, dtype=F32, device=q.device)
    expect_tensor(ctx, lse, "the log-sum-exp lse", case, like=like)
    if lse.dtype != F32:
        ctx.fail(f"lse has dtype {lse.dtype}, expected float32.", case=case, mistake="wrong_dtype")
    got = lse.detach().double().cpu()
    none = ~torch.isfinite(want)
    if bool(none.any()) and not bool((got[none] == -math.inf).all()):
        ctx.fail(
            f"a query that sees no key (n_q > n_k, causal) must get lse = -inf; got "
            f"{float(got[none][got[none] != -math.inf][0]):.4g}.",
            case=case,
            mistake="triton_lse_wrong",
        )
    seen = ~none
    ctx.expect_array(got[seen], want[seen], what="lse (where a query sees keys)", case=case)
    mistakes = [
        Mistake.of("triton_lse_base2", model=lambda: want[seen] / math.log(2.0)),
        Mistake.of("triton_lse_wrong", model=lambda: _lse_parts(q, k, v, causal)[0][seen]),
        Mistake.of("triton_lse_wrong", model=lambda: _lse_parts(q, k, v, causal)[1][seen]),
    ]
    ctx.expect_close(got[seen], want[seen], what="lse", case=case, mistakes=mistakes, **tol)


def _lse_parts(q, k, v, causal):
    """(the maximum score alone, log of the sum against the maximum alone) per query."""
    q, k = q.double().cpu(), k.double().cpu()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q), -math.inf)
    m = s.amax(-1)
    return m, torch.log(torch.exp(s - m[..., None]).sum(-1))


def _attention_case(
    ctx, candidate, q, k, v, causal, bm, bn, label, limit_scale=1.0, *, split=False, extra=()
) -> tuple[KernelLoads, tuple, str]:
    """One call of the learner's kernel, watched: its output and lse against float64, a wrong
    value named by a model of the mistake (``extra``: more models); the watcher (what the
    kernel loaded), the results ``(out, lse)`` and the case's description. ``split``: the
    kernel is triton_causal_split's, called without ``causal``."""
    case = _describe(label, q, k, None if split else causal, bm, bn)
    dev = q.device
    args = (q, k, v, bm, bn) if split else (q, k, v, causal, bm, bn)
    with watching(KernelLoads()) as rec:
        got = ctx.call(candidate, *args, case=case, limit_scale=limit_scale)
    _expect_in_bounds(ctx, rec, case)
    out, lse = ctx.expect_tuple(got, ("out", "lse"), case=case)
    want, _ = _exact(q, k, v, causal)
    tol = _tol(q.dtype, dev)
    ctx.expect_array(out, q.new_empty(want.shape), what="the output", case=case)
    qc, kc, vc = (t.cpu() for t in (q, k, v))
    model = functools.cache(
        lambda i: _attention_model(qc, kc, vc, causal, bm, bn, **ATTENTION_MISTAKES[i][1])
    )
    mistakes = [
        Mistake.of(mid, model=lambda i=i: model(i)[0])
        for i, (mid, kw) in enumerate(ATTENTION_MISTAKES)
        if causal or not (_CAUSAL_ONLY & set(kw))
    ]
    if (
        q.stride() != _as_contiguous_strides(q).stride()
        or k.stride() != _as_contiguous_strides(k).stride()
    ):
        mistakes.append(
            Mistake.of(
                "triton_strides_contiguous",
                model=lambda: _exact(*(_as_contiguous_strides(t) for t in (q, k, v)), causal)[0],
            )
        )
    if k.stride() != v.stride():
        mistakes.append(
            Mistake.of(
                "triton_v_strides_of_k",
                model=lambda: _exact(qc, kc, vc.as_strided(vc.shape, kc.stride()), causal)[0],
            )
        )
    flat = [_heads_one_axis(t) for t in (q, k, v)]
    if any(t is not None for t in flat):
        flat = [t if f is None else f for t, f in zip((q, k, v), flat, strict=True)]
        mistakes.append(
            Mistake.of("triton_batch_head_one_axis", model=lambda: _exact(*flat, causal)[0])
        )
    if causal:
        mistakes.append(Mistake.of("flash_causal_ignored", model=lambda: _exact(q, k, v, False)[0]))
    mistakes = list(extra) + mistakes  # the exercise's own models first
    ctx.expect_close(
        out.detach().double().cpu(), want, what="the output", case=case, mistakes=mistakes, **tol
    )
    _expect_lse(ctx, lse, q, k, v, causal, case, tol)
    upcast = sorted({pair for pair in rec.dtype_pairs if "fp32" in pair})
    if q.dtype == F16 and upcast:
        ctx.fail(
            f"your kernel's tl.dot multiplied {' x '.join(upcast[0])} tiles although q, k and v "
            "are float16. On a GPU a float32 tl.dot rounds its inputs to TF32 and runs at half "
            "the speed of float16's tensor cores (an H100: about 495 against 990 TFLOP/s), for "
            "no accuracy: every float16 number is exact in TF32. Keep the tiles of q, k and v "
            "in their dtype and round only p, to v.dtype, before the second product.",
            case=case,
            mistake="triton_dot_upcast",
        )
    return rec, (out, lse), case


def _attention_again(ctx, candidate, g, dev, pace, row, first=None, *, split=False) -> None:
    """The case ``row`` (a row of ATTENTION_CASES) called twice, on other values of the same
    shape, dtype and strides: each answer must be its own input's, and the first must not
    change when the second call comes (``first``: the first call's inputs and results, where
    the row ran already)."""
    label, shape, causal, dtype, layout, bm, bn, scale = row
    limit = _limit_scale(ctx, pace, shape, bm, bn)
    if first is None:
        inputs = _attention_inputs(g, shape, dtype, layout, scale, dev)
        _, results, _ = _attention_case(ctx, candidate, *inputs, causal, bm, bn, label, limit,
                                        split=split)  # fmt: skip
        first = (inputs, results, _copies(results))
    inputs, results, copies = first  # the first inputs kept: no later input takes their memory
    q, k, v = _attention_inputs(g, shape, dtype, layout, scale, dev)
    _, _, case = _attention_case(ctx, candidate, q, k, v, causal, bm, bn, f"{label}, {AGAIN}",
                                 limit, split=split, extra=[_cached(results[0])])  # fmt: skip
    _expect_kept(ctx, results, copies, case)


def _check_blind_blocks(ctx, candidate, g, dev, pace) -> None:
    """In the interpreter: causal, n_q = 48 and n_k = 16 in blocks of 16, the queries of the
    first two blocks see no key (query i sees keys j <= i - 32), so their programs load no
    tile of k or v. What they load is what the whole call loads less what the call of the
    last 16 queries alone loads (the same keys and the same mask: query i - 32 of that call
    sees what query i sees here), and may be their queries at most."""
    n_q, n_k, d, bs = 48, 16, 16, 16
    q, k, v = _attention_inputs(g, (1, 1, n_q, n_k, d), F32, "", 1.0, dev)
    last = q[:, :, n_q - n_k :].clone()
    loads = []
    for label, qs in (
        ("n_q=48, n_k=16, causal: the first 32 queries see no key", q),
        ("the last 16 of those queries alone (n_q = n_k = 16), causal", last),
    ):
        limit = _limit_scale(ctx, pace, (1, 1, qs.shape[2], n_k, d), bs, bs)
        rec, _, _ = _attention_case(ctx, candidate, qs, k, v, True, bs, bs, label, limit)
        loads.append(rec.loaded if rec.available else None)
    if None in loads:
        return
    blind, queries = loads[0] - loads[1], (n_q - n_k) * d
    if blind > queries:
        ctx.fail(
            f"with causal=True, n_q={n_q} and n_k={n_k}, the queries of the first "
            f"{(n_q - n_k) // bs} blocks of {bs} see no key (query i sees keys j <= i - "
            f"{n_q - n_k}), yet your kernel loads {blind} elements for them, {queries} of which "
            "are their queries: a program whose queries see no key loads no tile of k or v "
            "(its loop's end, (start_m + 1) * BLOCK_M + n_k - n_q, is 0 or less: the loop "
            "runs no step).",
            case=f"q (1, 1, {n_q}, {d}), k and v (1, 1, {n_k}, {d}) float32, causal=True, "
            f"block_m=block_n={bs}",
            mistake="triton_future_tiles_loaded",
        )


def _check_skipping_and_memory(ctx, candidate, g, dev, pace: float) -> None:
    """In the interpreter: a causal call loads at most 80% of what the same call without
    causality loads (n = 256, tiles of 64: 10 of 16 tiles, 67% of the elements with the
    queries), and its tl.dot products do at most 80% of the multiply-adds (62.5%: a loop
    that visits every tile with its loads masked off does them all).
    Anywhere: the code creates no tensor as large as a quarter of the n_q x n_k scores
    besides twice what is linear in n (out, lse and copies of q, k, v: the checker's copies
    of the inputs, the interpreter's copy of each argument, a launcher's contiguous copies).
    n = 256 with d = 16 makes the scores (256 KiB) four times what is linear (65 KiB), so an
    n_q x n_k buffer crosses the threshold (194 KiB) by itself and a correct launcher stays
    far below it, whether or not the inputs' copies are counted (in the graded kernel the
    inputs arrive as fresh tensors: they are not); tiles of 64 keep the interpreter's work
    at 4 x 4 tiles (it runs under the tripwire, which makes the interpreter about 3.5 times
    slower)."""
    n, d, bs = 256, 16, 64
    q, k, v = _attention_inputs(g, (1, 1, n, n, d), F32, "", 1.0, dev)
    linear = 4 * q.numel() * 4 + n * 4  # q, k, v, out in float32 and lse
    scores = n * n * 4
    loads, work = {}, {}
    scale = _limit_scale(ctx, pace, (1, 1, n, n, d), bs, bs, floor=TRACED_LIMIT_SCALE)
    for causal in (False, True):
        case = _describe(f"n={n}, watching what your kernel loads", q, k, causal, bs, bs)
        with watching(KernelLoads()) as rec, watching(PeakMemory()) as mem:
            got = ctx.call(candidate, q, k, v, causal, bs, bs, case=case, limit_scale=scale)
        _expect_in_bounds(ctx, rec, case)
        out, lse = ctx.expect_tuple(got, ("out", "lse"), case=case)
        want, _ = _exact(q, k, v, causal)
        ctx.expect_array(out, q.new_empty(want.shape), what="the output", case=case)
        ctx.expect_close(
            out.detach().double().cpu(), want, what="the output", case=case, **_tol(F32, dev)
        )
        if mem.peak >= 2 * linear + scores // 4:
            ctx.fail(
                f"your code creates {mem.peak / 2**10:.0f} KiB of tensors; the {n} x {n} "
                f"float32 scores take {scores / 2**10:.0f} KiB, q, k, v, out and lse "
                f"{linear / 2**10:.0f} KiB. The kernel keeps one tile of scores at a time, in "
                "registers: no n_q x n_k buffer.",
                case=case,
                mistake="triton_score_matrix_allocated",
            )
        loads[causal] = rec.loaded if rec.available else None
        work[causal] = rec.work if rec.available else None
    if loads[False] and loads[True] is not None and loads[True] > 0.8 * loads[False]:
        tiles = n // bs
        seen = tiles * (tiles + 1) // 2  # key tiles on or before the diagonal
        # Each program loads its block of queries, then a tile of k and one of v per step.
        share = (tiles + 2 * seen) / (tiles + 2 * tiles * tiles)
        ctx.fail(
            f"with causal=True your kernel loads {loads[True] / loads[False]:.0%} of the "
            "elements it loads with causal=False; skipping the tiles entirely in the future "
            f"of a block of queries brings it to {share:.0%} here (n={n}, tiles of {bs}: "
            f"{seen} of {tiles * tiles} tiles are on or before the diagonal).",
            case=f"q, k, v (1, 1, {n}, {d}) float32, block_m=block_n={bs}",
            mistake="triton_future_tiles_loaded",
        )
    if work[False] and work[True] is not None and work[True] > 0.8 * work[False]:
        tiles = n // bs
        seen = tiles * (tiles + 1) // 2
        ctx.fail(
            f"with causal=True your kernel's tl.dot products do {work[True] / work[False]:.0%} "
            "of the multiply-adds they do with causal=False (its loads skip the future, its "
            f"loop does not); ending the loop at the diagonal brings it to {seen / tiles**2:.1%}"
            f" here (n={n}, tiles of {bs}: {seen} of {tiles * tiles} tiles).",
            case=f"q, k, v (1, 1, {n}, {d}) float32, block_m=block_n={bs}",
            mistake="triton_future_tiles_computed",
        )


@exercise(
    "triton_attention",
    forbidden=lambda: [
        (_ref().triton_attention, "the reference attention_ref.triton_attention"),
        *_tuned(),
        *_full_attention(),
        *_notebook_12s(),
    ],
    summary="FlashAttention's forward pass as a Triton kernel: output and log-sum-exp",
)
def check_triton_attention(candidate, ctx: Context) -> None:
    """Output and lse of every case against float64 attention (tails, n_q != n_k both ways,
    one token, transposed inputs, other block shapes, float16, large scores), a wrong value
    named by a model of the mistake; then the skipped tiles and memory, and the blocks whose
    queries see no key (they load no tile).

    The graded (thorough) run checks other shapes, block sizes and layouts on other inputs,
    not the self-check's cases again: its test cell runs the self-check first, and the
    interpreter runs every program of a kernel in Python, so running the self-check's
    cases again would double a cell that must fit its grading time limit."""
    g = ctx.torch_gen(142)
    dev = _device()
    cases = ATTENTION_THOROUGH if ctx.thorough else ATTENTION_CASES
    pace = _reference_pace(*ATTENTION_CASES[0][1:7], dev)
    first = None
    for row in cases:
        label, shape, causal, dtype, layout, bm, bn, scale = row
        q, k, v = _attention_inputs(g, shape, dtype, layout, scale, dev)
        limit = _limit_scale(ctx, pace, shape, bm, bn)
        _, results, _ = _attention_case(ctx, candidate, q, k, v, causal, bm, bn, label, limit)
        if row == ATTENTION_AGAIN:
            first = ((q, k, v), results, _copies(results))
    _attention_again(ctx, candidate, g, dev, pace, ATTENTION_AGAIN, first)
    _check_skipping_and_memory(ctx, candidate, g, dev, pace)
    _check_blind_blocks(ctx, candidate, g, dev, pace)
    shape = (1, 1, 20, 20, 16)
    q, k, v = _attention_inputs(g, shape, F32, "", 1.0, dev)
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (q, k, v),
        {"causal": False, "block_m": 16, "block_n": 16},
        case="q, k, v (1, 1, 20, 16) float32; causal, block_m and block_n left out",
        signature="triton_attention(q, k, v, causal=False, block_m=16, block_n=16)",
        limit_scale=_limit_scale(ctx, pace, shape, 16, 16),
    )


# ----------------------------------------------------------------------------- triton_causal_split
def _split_bounds(n_q, n_k, bm, bn, p, *, split_shift=0, lo_offset=True, hi_offset=True):
    """``(lo, hi)`` of program ``p``'s two stages: the unmasked tiles ``0 .. lo`` (whole tiles
    of keys every query of the block sees), the masked ones ``lo .. hi`` (up to the last
    query's diagonal). The options make the mistakes: the split ``split_shift`` tiles late,
    a bound without ``n_k - n_q``."""
    offset = n_k - n_q
    first_sees = min(max(p * bm + (offset if lo_offset else 0) + 1, 0), n_k)
    lo = max(first_sees // bn * bn + split_shift * bn, 0)
    hi = min(max((p + 1) * bm + (offset if hi_offset else 0), 0), n_k)
    return lo, hi


def _split_tiles(n_q, n_k, bm, bn) -> tuple[int, int]:
    """``(visited, masked)``: the key tiles the programs of one (batch, head) visit, and the
    ones among them that cross the diagonal or the end of the keys (the masked stage)."""
    visited = masked = 0
    for p in range(-(-n_q // bm)):
        lo, hi = _split_bounds(n_q, n_k, bm, bn, p)
        visited += -(-hi // bn)
        masked += -(-(hi - lo) // bn) if hi > lo else 0
    return visited, masked


def _split_model(q, k, v, bm, bn, **bounds):
    """The output of a two-stage kernel in float64 whose bounds are
    :func:`_split_bounds`'s with ``bounds``: the unmasked stage takes its tiles whole (keys
    past n_k loaded as 0: a score 0 and a value 0), the masked stage the keys each query
    sees; a key visited twice counts twice, as an online softmax would count it."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    offset = n_k - n_q
    n_pad = (-(-n_k // bn) + 2) * bn
    k = torch.cat([k, k.new_zeros(B, H, n_pad - n_k, d)], 2)
    v = torch.cat([v, v.new_zeros(B, H, n_pad - n_k, d)], 2)
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    counts = torch.zeros(n_q, n_pad, dtype=F64)
    cols = torch.arange(n_pad)[None, :]
    for p in range(-(-n_q // bm)):
        i0, i1 = p * bm, min((p + 1) * bm, n_q)
        lo, hi = _split_bounds(n_q, n_k, bm, bn, p, **bounds)
        rows = torch.arange(i0, i1)[:, None]
        for j0 in range(0, min(lo, n_pad - bn), bn):
            counts[i0:i1, j0 : j0 + bn] += 1
        for j0 in range(lo, hi, bn):
            inside = (cols >= j0) & (cols < j0 + bn) & (cols < n_k) & (cols <= rows + offset)
            counts[i0:i1] += inside.double()
    s = torch.where(counts > 0, s, -math.inf)
    m = s.amax(-1, keepdim=True)
    w = counts * torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))
    total = w.sum(-1, keepdim=True)
    return (w @ v) / torch.where(total > 0, total, 1.0)


#: id, the options of _split_model that make the mistake (its output is wrong)
SPLIT_MISTAKES = [
    ("triton_split_diagonal_unmasked", dict(split_shift=1)),
    ("triton_split_without_offset", dict(lo_offset=False, hi_offset=False)),
    ("triton_split_without_offset", dict(hi_offset=False)),
    ("triton_split_without_offset", dict(lo_offset=False)),
]

#: The case that the check of triton_causal_split calls again, on other values (the cheapest).
SPLIT_AGAIN = ("one token", (1, 1, 1, 1, 32), F32, "", 16, 16)
#: label, (B, H, n_q, n_k, d), dtype, layout, block_m, block_n (d != block_n everywhere: the
#: watcher counts the score tiles by their number of elements, block_m * block_n, in any
#: shape, and a tl.where on the output's block_m * d must not count). The first case has
#: programs with three tiles or more, where masking one full tile too many and masking every
#: tile differ; "kt" (k a transposed view: its d stride is not 1, and v's strides are not k's)
#: names a kernel that assumes either.
SPLIT_CASES = [
    ("n=128, tiles of 32: 10 tiles visited, 4 on the diagonal", (1, 1, 128, 128, 16), F32, "",
     32, 32),
    # j <= i + 15: each block's first query sees exactly its whole tiles (split at 16p + 16)
    ("n_q=20, n_k=35 (query i sees keys j <= i + 15), k a transposed view of (B, H, d, n_k)",
     (1, 2, 20, 35, 32), F32, "kt", 16, 16),
    # j <= i - 18: query 32 sees keys up to 14, one short of a whole tile
    ("n_q=38, n_k=20 (the first 18 queries see no key)", (1, 1, 38, 20, 32), F32, "", 16, 16),
    ("block_m=32, block_n=16, n_q=50, n_k=67 (j <= i + 17)", (1, 1, 50, 67, 32), F32, "", 32, 16),
    ("block_m=16, block_n=32, n_q=40, n_k=100 (j <= i + 60: the split falls inside a tile)",
     (1, 1, 40, 100, 16), F32, "", 16, 32),
    ("float16, 2 batches, n=48", (2, 1, 48, 48, 32), F16, "", 16, 16),
    SPLIT_AGAIN,
]  # fmt: skip
SPLIT_THOROUGH = [
    ("2 x 2 heads, n=72, blocks of 32, transposed views of (B, n, H, d)", (2, 2, 72, 72, 16),
     F32, "bnhd", 32, 32),
    ("n_q=33, n_k=66, block_n=32, k a transposed view of (B, H, d, n_k)", (1, 2, 33, 66, 16),
     F32, "kt", 16, 32),
    # the last block holds one query, whose keys end exactly at a tile's end: its split is at
    # n_k, no masked tile
    ("n_q=17, n_k=32 (the last block: one query)", (1, 1, 17, 32, 32), F32, "", 16, 16),
    ("n_q=40, n_k=23 (17 queries see no key)", (1, 1, 40, 23, 32), F32, "", 16, 16),
    ("float16, n_q=31, n_k=79", (1, 1, 31, 79, 32), F16, "", 16, 16),
]  # fmt: skip


def _expect_split_work(ctx, rec: KernelLoads, q, k, bm, bn, case: str) -> None:
    """In the interpreter: the tl.dot products visit no tile past the last query's
    diagonal, and a tl.where runs on the scores of the tiles that cross the diagonal or the
    end of the keys only."""
    if not rec.available:
        return
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    visited, masked = _split_tiles(n_q, n_k, bm, bn)
    work = B * H * visited * 2 * bm * bn * d  # q k^T and p v, per tile visited
    if rec.work > work:
        ctx.fail(
            f"your kernel's tl.dot products do {rec.work} multiply-adds where the tiles up to "
            f"each block's diagonal take {work} ({visited} tiles of keys per head): the masked "
            "stage goes on past the diagonal, into tiles every query of the block must not see.",
            case=case,
            mistake="triton_future_tiles_loaded",
        )
    got = rec.masked_tiles.get(bm * bn, 0)
    if got > B * H * masked:
        every = got >= B * H * visited
        ctx.fail(
            f"a tl.where ran on the scores of {got} of your kernel's tiles; "
            f"{B * H * masked} of the {B * H * visited} tiles it visits cross the diagonal or "
            "the end of the keys, and only those need a mask"
            + (" (your kernel masks every tile)." if every else "."),
            case=case,
            mistake="triton_split_missing" if every else "triton_split_full_tile_masked",
        )


@exercise(
    "triton_causal_split",
    forbidden=lambda: [
        (_ref().triton_causal_split, "the reference attention_ref.triton_causal_split"),
        (_ref().triton_attention, "the reference attention_ref.triton_attention"),
        *_tuned(),
        *_full_attention(),
        *_notebook_12s(),
    ],
    summary="causal FlashAttention in Triton, its loop split: unmasked full tiles, masked "
    "diagonal ones",
)
def check_triton_causal_split(candidate, ctx: Context) -> None:
    """Output and lse of every case against float64 causal attention (n_q != n_k both ways,
    offsets that are not a multiple of the tile, tails, one token, float16), a wrong value
    named by a model of the mistake (the split a tile late, a bound without n_k - n_q, and
    exercise 2's); in the interpreter, the work: no tile past the diagonal multiplied, and a
    tl.where on the score tiles that cross the diagonal or the end of the keys only.

    The graded (thorough) run checks other shapes and layouts, not the self-check's cases
    again (its test cell runs the self-check first)."""
    g = ctx.torch_gen(144)
    dev = _device()
    pace = _reference_pace(*ATTENTION_CASES[0][1:7], dev)
    first = None
    for row in SPLIT_THOROUGH if ctx.thorough else SPLIT_CASES:
        label, shape, dtype, layout, bm, bn = row
        q, k, v = _attention_inputs(g, shape, dtype, layout, 1.0, dev)
        qc, kc, vc = (t.cpu() for t in (q, k, v))
        extra = [
            Mistake.of(mid, model=lambda kw=kw: _split_model(qc, kc, vc, bm, bn, **kw))
            for mid, kw in SPLIT_MISTAKES
        ]
        limit = _limit_scale(ctx, pace, shape, bm, bn)
        rec, results, case = _attention_case(
            ctx, candidate, q, k, v, True, bm, bn, label, limit, split=True, extra=extra
        )
        _expect_split_work(ctx, rec, q, k, bm, bn, case)
        if row == SPLIT_AGAIN:
            first = ((q, k, v), results, _copies(results))
    label, shape, dtype, layout, bm, bn = SPLIT_AGAIN
    again = (label, shape, True, dtype, layout, bm, bn, 1.0)
    _attention_again(ctx, candidate, g, dev, pace, again, first, split=True)
    shape = (1, 1, 20, 20, 32)
    q, k, v = _attention_inputs(g, shape, F32, "", 1.0, dev)
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (q, k, v),
        {"block_m": 16, "block_n": 16},
        case="q, k, v (1, 1, 20, 32) float32; block_m and block_n left out",
        signature="triton_causal_split(q, k, v, block_m=16, block_n=16)",
        limit_scale=_limit_scale(ctx, pace, shape, 16, 16),
    )


# ----------------------------------------------------------------------------- autograd function
#: The case that the check of triton_flash_attention calls again, on other values.
FUNCTION_AGAIN = ("one token, causal", (1, 1, 1, 1, 16), True, F32)
#: label, (B, H, n_q, n_k, d), causal, dtype (causal with n_q > n_k: the first queries see no
#: key, their lse is -inf, and their gradients must be 0, not NaN)
FUNCTION_CASES = [
    ("2 heads, n=40", (1, 2, 40, 40, 16), False, F32),
    ("the same, causal", (1, 2, 40, 40, 16), True, F32),
    ("n_q=20, n_k=37", (1, 2, 20, 37, 16), False, F32),
    ("n_q=20, n_k=45, causal", (1, 1, 20, 45, 16), True, F32),
    ("n_q=45, n_k=20, causal: 25 queries see no key", (1, 1, 45, 20, 16), True, F32),
    FUNCTION_AGAIN,
    ("float16, n_q=24, n_k=40, causal", (1, 1, 24, 40, 16), True, F16),
]
FUNCTION_THOROUGH = [
    ("2 x 1 heads, n=70, causal, d=32", (2, 1, 70, 70, 32), True, F32),
    ("n_q=30, n_k=18, causal: 12 queries see no key", (2, 1, 30, 18, 16), True, F32),
    ("float16, n_q=36, n_k=20", (1, 1, 36, 20, 16), False, F16),
]
GRAD_TOL = {"cpu": dict(rtol=1e-3, atol=1e-4), "cuda": dict(rtol=2e-2, atol=2e-2)}
#: float16: the kernel's output and the gradients rounded to float16 (and out's rounding
#: carried into D); a backward pass computed in float16 throughout stays within it too.
GRAD_TOL_F16 = dict(rtol=1e-2, atol=1e-2)
#: An exception of a backward pass that multiplies float16 tensors by float32 ones (the
#: kernel's lse is float32): torch's matmul and friends refuse the pair.
_MIXED_DTYPES = re.compile(r"same dtype|expected .*(Float|Half).* found", re.I)


def _grads_model(
    q, k, v, do, bs: int, causal: bool, *, delta: str = "out", weights: str = "lse",
    scale_power: int = 0, transposes: bool = True, mask: bool = True, skip: bool = True,
    shift_mask: bool = True, shift_end: bool = True,
):  # fmt: skip
    """``(dq, dk, dv)`` of a (possibly buggy) tiled backward pass in float64, queries and
    keys in blocks of ``bs``: notebook 12's model (its options, see
    :func:`attention_ref.checks.nb12._flash_grads_model`) with the kernel's alignment, query
    ``i`` seeing keys ``j <= i + n_k - n_q``; ``shift_mask=False`` keeps notebook 12's mask
    ``j <= i``, ``shift_end=False`` its loop end ``min(n_k, i1)``. A query that sees no key
    has weights 0 (its lse, -inf, taken as +inf)."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    n_q, n_k, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    offset = n_k - n_q
    scale = 1.0 / math.sqrt(d_k)
    s_all = q @ k.transpose(-2, -1) * scale  # the checker may hold the n_q x n_k scores
    if causal:
        s_all = s_all.masked_fill(
            ~torch.ones(n_q, n_k, dtype=torch.bool).tril(offset), -math.inf
        )  # fmt: skip
    m_all = s_all.amax(-1, keepdim=True)
    m_all = torch.where(torch.isfinite(m_all), m_all, math.inf)  # sees no key: weights 0
    l_all = torch.exp(s_all - m_all).sum(-1, keepdim=True)
    lse = torch.logsumexp(s_all, -1, keepdim=True)
    out = torch.exp(s_all - torch.where(torch.isfinite(lse), lse, math.inf)) @ v
    log_l = torch.log(l_all)
    lse = torch.where(torch.isfinite(lse), lse, math.inf)
    row = dict(lse=lse, max=m_all, raw=torch.zeros_like(m_all), log_l=log_l)[weights]
    d_all = (do * out).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, n_q, bs):
        i1 = min(i0 + bs, n_q)
        q_i, do_i = q[..., i0:i1, :], do[..., i0:i1, :]
        j_end = min(n_k, i1 + (offset if shift_end else 0)) if causal and skip else n_k
        for j0 in range(0, max(j_end, 0), bs):
            j1 = min(j0 + bs, n_k)
            k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
            s = q_i @ k_j.transpose(-2, -1) * scale
            if causal and mask:
                rows = torch.arange(i0, i1)[:, None] + (offset if shift_mask else 0)
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > rows, -math.inf)
            p = torch.nan_to_num(torch.exp(s - row[..., i0:i1, :]), nan=0.0)
            dp = do_i @ v_j.transpose(-2, -1)
            d = d_all[..., i0:i1, :]
            d_i = {"out": d, "none": torch.zeros_like(d), "tile": (p * dp).sum(-1, keepdim=True)}
            ds = p * (dp - d_i[delta])
            if transposes:
                dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_i
                dq[..., i0:i1, :] += ds @ k_j * scale
                dk[..., j0:j1, :] += ds.transpose(-2, -1) @ q_i * scale
            elif p.shape[-1] == p.shape[-2]:
                dv[..., j0:j1, :] += p @ do_i
                dq[..., i0:i1, :] += ds.transpose(-2, -1) @ k_j * scale
                dk[..., j0:j1, :] += ds @ q_i * scale
            else:
                raise ValueError("transposes=False needs square tiles")
    times = scale**scale_power
    return dq * times, dk * times, dv


#: the backward pass's mistakes: notebook 12's, and its causal mask or loop end left as they
#: were for n_q = n_k (the loop's end alone matters at the learner's block size: several)
BWD_MISTAKES = FLASH_BWD_MISTAKES + [
    ("triton_bwd_causal_offset", dict(shift_mask=False, shift_end=False)),
    *[("triton_bwd_causal_offset", dict(shift_end=False, bs=bs)) for bs in (16, 32, 64, 128)],
]


def _function_case(ctx, cls, q, k, v, causal, label, limit_scale=1.0, earlier=None):
    """The output and the gradients of one case against float64 autograd: ``(out, dq, dk,
    dv)`` and the case's description. ``earlier``: what an earlier call of that shape
    returned, a result cached by shape if it comes back."""
    case = (
        f"{label}: q {tuple(q.shape)}, k, v {tuple(k.shape)} {dtype_name(q.dtype)}, causal={causal}"
    )
    leaves = _leaves(q, k, v)
    out = _flash_forward(ctx, cls, leaves, (causal,), case, limit_scale)
    want_out, _ = _exact(q, k, v, causal)
    tol = GRAD_TOL[q.device.type]
    if q.dtype == F16:
        tol = {name: max(value, GRAD_TOL_F16[name]) for name, value in tol.items()}
    ctx.expect_array(out, q.new_empty(want_out.shape), what="the output", case=case)
    cached = [_cached(earlier[0])] if earlier else []
    ctx.expect_close(out.detach().double().cpu(), want_out, what="the output", case=case,
                     mistakes=cached, **tol)  # fmt: skip
    g = torch.Generator().manual_seed(ctx.seed * 31 + q.numel() + (earlier is not None))
    do64 = torch.randn(want_out.shape, generator=g, dtype=F64)
    if q.dtype == F16:
        do64 = do64.to(F16).double()  # the gradient the learner is given, exactly
    try:
        grads = _flash_backward(
            ctx, cls, out, leaves, do64.to(q.dtype).to(q.device), case, limit_scale
        )
    except CheckFailure as err:
        text = str(err)
        first = text.split("\n", 1)[0]  # "your code raised <the exception>" (no case in it)
        raised = mistake_id(text) in ("code_raised", "dtypes_mixed") and "raised" in first
        if q.dtype == F16 and raised and _MIXED_DTYPES.search(first):
            # the exception's generic "Likely mistake" (dtypes_mixed) gives way to this one
            text = text.split("\n  Likely mistake:", 1)[0].split(tag("code_raised"), 1)[0]
            raise naming(CheckFailure(text), named("triton_bwd_float16_mixed")) from None
        raise
    ref_leaves = _leaves(q.double().cpu(), k.double().cpu(), v.double().cpu())
    want = torch.autograd.grad(_exact(*ref_leaves, causal)[0], ref_leaves, do64)
    qc, kc, vc = (t.cpu() for t in (q, k, v))

    def _model(i):
        opts = dict(BWD_MISTAKES[i][1])
        return _grads_model(qc, kc, vc, do64, opts.pop("bs", 16), causal, **opts)

    model = functools.cache(_model)
    shifted = causal and q.shape[2] != k.shape[2]
    for index, name in ((2, "v"), (0, "q"), (1, "k")):
        what = f"the gradient of {name} (d{name})"
        ctx.expect_array(grads[index], leaves[index].detach(), what=what, case=case)
        mistakes = [
            Mistake.of(mid, model=lambda i=i, index=index: model(i)[index])
            for i, (mid, opts) in enumerate(BWD_MISTAKES)
            if (causal or "mask" not in opts) and (shifted or mid != "triton_bwd_causal_offset")
        ] + [
            Mistake.of("flash_bwd_gradient_order", model=lambda other=other: want[other])
            for other in range(3)
            if other != index and want[other].shape == want[index].shape
        ]
        if earlier:
            mistakes.insert(0, _cached(earlier[1 + index]))
        ctx.expect_close(
            grads[index].detach().double().cpu(), want[index], what=what, case=case,
            mistakes=mistakes, **tol,
        )  # fmt: skip
    return (out, *grads), case


@exercise(
    "triton_flash_attention",
    forbidden=lambda: [
        (_ref().TritonFlashAttention.forward, "the reference attention_ref.TritonFlashAttention"),
        (_ref().TritonFlashAttention.backward, "the reference attention_ref.TritonFlashAttention"),
        (_ref().triton_flash_attention, "the reference attention_ref.triton_flash_attention"),
        *_full_attention(),
        *_notebook_12s(),
    ],
    summary="the autograd function: the Triton forward pass and notebook 12's backward pass",
)
def check_triton_flash_attention(candidate, ctx: Context) -> None:
    """Output and gradients of every case against float64 autograd; forward runs with the
    reference kernel under the name triton_attention (that exercise is graded on its own),
    so what is checked here is the pairing and the backward pass."""
    cls = _function_class(ctx, candidate)
    g = ctx.torch_gen(143)
    dev = _device()
    pace = _reference_pace(FUNCTION_CASES[0][1], FUNCTION_CASES[0][2], F32, "", 16, 16, dev)
    with reference_functions(candidate, triton_attention=_ref().triton_attention):
        # The graded (thorough) run: other cases only, as for triton_attention.
        first = None
        for row in FUNCTION_THOROUGH if ctx.thorough else FUNCTION_CASES:
            label, shape, causal, dtype = row
            q, k, v = _attention_inputs(g, shape, dtype, "", 1.0, dev)
            # the forward pass runs the reference kernel (tiles of 16 by default)
            limit = _limit_scale(ctx, pace, shape, 16, 16)
            results, _ = _function_case(ctx, cls, q, k, v, causal, label, limit)
            if row == FUNCTION_AGAIN:
                first = ((q, k, v), results, _copies(results))
        # that case again, on other values: each answer its own input's, the first unchanged
        label, shape, causal, dtype = FUNCTION_AGAIN
        limit = _limit_scale(ctx, pace, shape, 16, 16)
        if first is None:
            q, k, v = _attention_inputs(g, shape, dtype, "", 1.0, dev)
            results, _ = _function_case(ctx, cls, q, k, v, causal, label, limit)
            first = ((q, k, v), results, _copies(results))
        q, k, v = _attention_inputs(g, shape, dtype, "", 1.0, dev)
        _, case = _function_case(ctx, cls, q, k, v, causal, f"{label}, {AGAIN}", limit,
                                 earlier=first[1])  # fmt: skip
        _expect_kept(ctx, first[1], first[2], case)


# ----------------------------------------------------------------------------- backward kernels
def _bwd_visited(n_q, n_k, bm, bn, offset) -> torch.Tensor:
    """(n_q, n_k) bool: the (query, key) pairs whose tiles a causal backward kernel visits
    when its loop bounds use ``offset`` (the right one: n_k - n_q): key tile ``j0`` with query
    tile ``i0`` when ``j0 < i0 + bm + offset``."""
    i0 = torch.arange(n_q)[:, None] // bm * bm
    j0 = torch.arange(n_k)[None, :] // bn * bn
    return j0 < i0 + bm + offset


def _bwd_tile_pairs(n_q, n_k, bm, bn, causal: bool) -> int:
    """The (query tile, key tile) pairs of one (batch, head) the right kernels visit."""
    tiles_q, tiles_k = -(-n_q // bm), -(-n_k // bn)
    if not causal:
        return tiles_q * tiles_k
    return sum(
        min(-(-max(min((t + 1) * bm + n_k - n_q, n_k), 0) // bn), tiles_k) for t in range(tiles_q)
    )


def _bwd_model(
    q, k, v, out, lse, do, causal: bool, bm: int, bn: int, *, mask: str = "right",
    weights: str = "lse", delta: str = "out", scale_power: int = 0, scores_scale: int = 1,
    dv_from: str = "p", dq_end: str = "block_m", do_strides: str = "own",
):  # fmt: skip
    """``(dq, dk, dv)`` of a (possibly buggy) FlashAttention-2 backward pass in float64, from
    the out and lse the learner is given. ``mask``: "right" (j <= i + n_k - n_q), "none" (no
    mask, no tile skipped), "tiles" (no mask, the tiles skipped), "top_left" (j <= i, the
    loop bounds without n_k - n_q too), "right_bounds" (the mask right, the loop bounds
    without n_k - n_q); ``weights``: "lse", "max" (exp(S - rowmax)), "raw" (exp(S));
    ``delta``: "out", "none", "v" (rowsum(dO * V) of the first n_q values); ``scale_power``:
    dq and dk times scale to that power more; ``scores_scale``: the power of the scale in
    the recomputed scores (0: left out, 2: twice); ``dv_from="ds"``: dV = dS^T dO;
    ``dq_end="block_n"``: the dQ kernel's causal loop ends at (start_m + 1) * BLOCK_N + n_k -
    n_q (the tiles of keys past it left out of dQ only); ``do_strides``: grad_out read with
    out's strides ("out": in every kernel, "out_in_delta": in D's pre-pass only); ``mask=
    "strict"``: j < i + n_k - n_q."""
    do_delta = do
    if do_strides != "own":
        misread = torch.as_strided(do, do.shape, out.stride(), do.storage_offset())
        do_delta, do = (misread, do) if do_strides == "out_in_delta" else (misread, misread)
    q, k, v, out, do, do_delta = (t.detach().double().cpu() for t in (q, k, v, out, do, do_delta))
    lse = lse.detach().double().cpu()
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    offset = n_k - n_q
    s = q @ k.transpose(-2, -1) * scale**scores_scale
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        right = allowed.tril(offset)
        allowed = {
            "right": right,
            "none": allowed,
            "tiles": _bwd_visited(n_q, n_k, bm, bn, offset),
            "top_left": allowed.tril(0),
            "strict": allowed.tril(offset - 1),
            "right_bounds": right & _bwd_visited(n_q, n_k, bm, bn, 0),
        }[mask]
    none = ~torch.isfinite(lse)[..., None]
    if weights == "lse":
        row = lse[..., None]
    elif weights == "max":
        row = s.masked_fill(~allowed, -math.inf).amax(-1, keepdim=True)
    else:
        row = torch.zeros_like(lse)[..., None]
    row = torch.where(none | ~torch.isfinite(row), math.inf, row)
    p = torch.exp(s - row).masked_fill(~allowed, 0.0)
    dp = do @ v.transpose(-2, -1)
    d_i = {
        "out": lambda: (do_delta * out).sum(-1, keepdim=True),
        "none": lambda: torch.zeros_like(lse)[..., None],
        "v": lambda: (do * v[..., :n_q, :]).sum(-1, keepdim=True),
    }[delta]()
    ds = p * (dp - d_i)
    times = scale ** (1 + scale_power)
    dq = ds @ k * times
    if causal and dq_end == "block_n":
        tile_q = torch.arange(n_q)[:, None] // bm
        j0 = torch.arange(n_k)[None, :] // bn * bn
        dq = (ds * (j0 < (tile_q + 1) * bn + offset)) @ k * times
    dk = ds.transpose(-2, -1) @ q * times
    dv = (p if dv_from == "p" else ds).transpose(-2, -1) @ do
    return dq, dk, dv


#: id, the options of _bwd_model that make the mistake; the condition on the case
#: (n_q, n_k, causal) under which the mistake can be made at all
BWD_KERNEL_MISTAKES = [
    ("triton_bwd_no_delta", dict(delta="none"), None),
    ("triton_bwd_delta_of_v", dict(delta="v"), lambda n_q, n_k, causal: n_q <= n_k),
    ("triton_bwd_weights_not_lse", dict(weights="max"), None),
    ("triton_bwd_weights_not_lse", dict(weights="raw"), None),
    ("triton_bwd_scale", dict(scale_power=-1), None),
    ("triton_bwd_scale", dict(scale_power=1), None),
    ("triton_bwd_scores_scale", dict(scores_scale=0), None),
    ("triton_bwd_scores_scale", dict(scores_scale=2), None),
    ("triton_bwd_dv_from_ds", dict(dv_from="ds"), None),
    ("triton_bwd_causal_mask", dict(mask="none"), lambda n_q, n_k, causal: causal),
    ("triton_bwd_causal_mask", dict(mask="tiles"), lambda n_q, n_k, causal: causal),
    # before the offset's: it changes dQ alone (dV, checked first, was right)
    ("triton_bwd_dq_end_block_n", dict(dq_end="block_n"), lambda n_q, n_k, causal: causal),
    ("triton_bwd_causal_offset", dict(mask="top_left"), lambda n_q, n_k, c: c and n_q != n_k),
    ("triton_bwd_causal_offset", dict(mask="right_bounds"), lambda n_q, n_k, c: c and n_q != n_k),
    ("triton_bwd_causal_mask_strict", dict(mask="strict"), lambda n_q, n_k, causal: causal),
    # where grad_out's strides are not out's (the check leaves these out elsewhere)
    ("triton_bwd_do_strides_of_out", dict(do_strides="out"), None),
    ("triton_bwd_do_strides_of_out", dict(do_strides="out_in_delta"), None),
]

#: grad_out's larger rows in a case of layout "s" (its other rows: 100): with values about 8,
#: D = rowsum(dO * O) is about 100,000 there, past float16's 65,504, and about 13,000 in the
#: others; dQ, dK and dV stay within float16.
LOSS_SCALE = 800.0
#: The case that the check of triton_attention_backward calls again, on other values.
BWD_AGAIN = ("one token, causal", (1, 1, 1, 1, 16), True, F32, "", 16, 16)
#: label, (B, H, n_q, n_k, d), causal, dtype, layout, block_m, block_n. Layout: the letters of
#: the tensors given as views of another memory order: q, v: of (B, n, H, d); k: of
#: (B, H, d, n_k); g (grad_out): of (B, H, d, n_q); and "s": grad_out as large as a loss scale
#: makes it (see LOSS_SCALE). out is contiguous (the forward made it).
BWD_CASES = [
    ("2 batches, n=24 (tiles of 16: a tail of 8)", (2, 1, 24, 24, 16), False, F32, "", 16, 16),
    ("n_q=20, n_k=45, causal (query i sees keys j <= i + 25), k, v and grad_out transposed "
     "views", (1, 1, 20, 45, 16), True, F32, "kvg", 16, 16),
    ("n_q=37, n_k=20, causal (the first 17 queries see no key)", (1, 1, 37, 20, 16), True,
     F32, "", 16, 16),
    ("n_q=30, n_k=21, block_n=32, q a transposed view", (1, 1, 30, 21, 16), False, F32, "q",
     16, 32),
    ("block_m=32, block_n=16, n_q=33, n_k=37, causal (j <= i + 4)", (1, 1, 33, 37, 16), True,
     F32, "", 32, 16),
    ("float16, 2 heads, n=20, causal, grad_out a transposed view", (1, 2, 20, 20, 16), True,
     F16, "g", 16, 16),
    BWD_AGAIN,
    ("float16, n=16, grad_out's rows about 100 and 800 in turn (a loss scale's size), v about "
     "8: D = rowsum(dO * O) past float16's 65,504 in every other row", (1, 1, 16, 16, 16),
     False, F16, "s", 16, 16),
]  # fmt: skip
BWD_THOROUGH = [
    ("2 x 2 heads, n=20, blocks of 32, causal, every input a transposed view",
     (2, 2, 20, 20, 16), True, F32, "qkvg", 32, 32),
    ("n_q=17, n_k=50, block_n=32, causal (the last block: one query), k and grad_out "
     "transposed views", (1, 1, 17, 50, 16), True, F32, "kg", 16, 32),
    ("n_q=40, n_k=23, causal (17 queries see no key), d=32", (1, 1, 40, 23, 32), True, F32, "",
     16, 16),
    ("block_m=32, block_n=16, n=40, causal (a block of queries spans two tiles of keys)",
     (1, 1, 40, 40, 16), True, F32, "", 32, 16),
    ("float16, n_q=36, n_k=20, v a transposed view", (1, 1, 36, 20, 16), False, F16, "v", 16,
     16),
    ("float16, n_q=16, n_k=32, causal, grad_out's rows about 100 and 800 in turn (a loss "
     "scale's size), v about 8: D = rowsum(dO * O) past float16's 65,504 in every other row",
     (1, 1, 16, 32, 16), True, F16, "s", 16, 16),
]  # fmt: skip
#: the case the reference backward is timed on when a check starts (its pace per tile step)
BWD_PACE_CASE = ((1, 1, 20, 20, 16), False, F32, "", 16, 16)


def _bwd_inputs(g, shape, causal, dtype, layout: str, dev):
    """q, k, v in their layouts, out and lse (exact, out in the inputs' dtype, lse float32,
    -inf where a query sees no key) and grad_out (layout "s": as large as a loss scale makes
    it, and v's values about 8, so that D = rowsum(dO * O) of every other query is past
    float16's 65,504)."""
    B, H, n_q, n_k, d = shape
    q, k, v = _attention_inputs(g, shape, dtype, "", 1.0, dev)
    do = torch.randn(B, H, n_q, d, generator=g, dtype=F64).to(dtype)
    if dtype == F32 and dev.type == "cuda":
        do = _tf32_exact(do)
    do = do.to(dev)
    if "q" in layout:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if "v" in layout:
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    if "k" in layout:
        k = k.transpose(2, 3).contiguous().transpose(2, 3)
    if "s" in layout:  # values about 8, grad_out's rows about 100 and 800 in turn
        v = (v.double() + 8.0).to(dtype)
        rows = torch.tensor([100.0, LOSS_SCALE]).repeat(n_q)[:n_q, None]
        do = (rows * (1.0 + do.double().cpu() / 4)).to(dtype).to(dev)
    if "g" in layout:
        do = do.transpose(2, 3).contiguous().transpose(2, 3)
    out64, lse64 = _exact(q, k, v, causal)
    return q, k, v, out64.to(dtype).to(dev), lse64.float().to(dev), do


def _bwd_pace(dev) -> float:
    """CPU seconds per tile step of the reference backward kernels on the first case."""
    shape, causal, dtype, layout, bm, bn = BWD_PACE_CASE
    args = _bwd_inputs(torch.Generator().manual_seed(0), shape, causal, dtype, layout, dev)
    start = time.process_time()
    _ref().triton_attention_backward(*args, causal, bm, bn)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.process_time() - start) / _steps(shape, bm, bn)


def _expect_bwd_work(ctx, rec: KernelLoads, shape, causal, bm, bn, case: str) -> None:
    """In the interpreter: the tl.dot products do at least the five products of every
    (query, key) pair the mask allows (S, dP, dV, dK, dQ: else the gradients came from
    PyTorch), and, causal, at most 7 per pair of the tiles that hold a pair the mask allows
    (4 in the dK/dV kernel, 3 in the dQ kernel, whose tiles of keys may be BLOCK_N or
    BLOCK_M wide; one kernel with atomics does 5): a tile entirely in the future of its
    queries, or past the end of the keys, costs more."""
    if not rec.available:
        return
    B, H, n_q, n_k, d = shape
    pairs = n_q * n_k
    if causal:
        pairs = int(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).sum())
    least = 5 * B * H * pairs * d
    if rec.work < least:
        ctx.fail(
            f"your function's tl.dot products did {rec.work} multiply-adds; the five products "
            f"of each of the {B * H * pairs} (query, key) pairs (S, dP, dV, dK, dQ) take at "
            f"least {least}.",
            case=case,
            mistake="triton_bwd_not_in_kernel",
        )
    if not causal:
        return
    tiles = _bwd_tile_pairs(n_q, n_k, bm, bn, True)
    # the dQ kernel may walk its keys in tiles of BLOCK_M (a tile as square as its queries')
    dq_pairs = max(tiles * bm * bn, _bwd_tile_pairs(n_q, n_k, bm, bm, True) * bm * bm)
    most = B * H * (4 * tiles * bm * bn + 3 * dq_pairs) * d
    if rec.work > most:
        either = f", the dQ kernel's 3 with tiles of {bn} or {bm} keys" if bm != bn else ""
        ctx.fail(
            f"your kernels' tl.dot products did {rec.work} multiply-adds, where the "
            f"{B * H * tiles} pairs of (query tile, key tile) that hold a key some query sees "
            f"take at most {most} (7 products of {bm} x {bn} x {d} each{either}): the loops "
            "visit tiles entirely in the future of their queries (or past the end of the "
            "keys).",
            case=case,
            mistake="triton_bwd_future_tiles",
        )


def _expect_no_torch_products(ctx, ops: OpRecorder, case: str) -> None:
    """No PyTorch product of matrices (both sides wider than one row or column) on the
    learner's path: the gradients' products belong in tl.dot (a row sum such as D by
    torch.einsum is a product of vectors and is allowed). The interpreter runs tl.dot in
    NumPy, so no product of a kernel shows up here."""
    for op in ops.ops:
        if not op.flops or not op.shapes:
            continue
        shape = op.shapes[0]
        if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
            name = op.name.split(".")[1] if op.name.count(".") else op.name
            ctx.fail(
                f"your function multiplied matrices with PyTorch ({name}, a result of shape "
                f"{tuple(shape)}): the gradients' products must be tl.dot in your kernels.",
                case=case,
                mistake="triton_bwd_not_in_kernel",
            )


def _name_nan_no_key(ctx, grads, lse, case: str) -> None:
    """dq NaN or inf in rows of queries that see no key (lse = -inf), and only there: the
    weights exp(s - lse) computed before the mask (inf, then inf * 0 = NaN, or NaN from
    -inf - -inf). Elsewhere a NaN is left to the values' comparison."""
    dq = grads[0]
    if not isinstance(dq, torch.Tensor) or dq.shape != lse.shape + dq.shape[-1:]:
        return
    bad = ~torch.isfinite(dq.detach().double().cpu()).all(-1)
    none = ~torch.isfinite(lse.detach().cpu())
    if bool(bad.any()) and not bool((bad & ~none).any()):
        ctx.fail(
            f"dq holds NaN or inf in {int(bad.sum())} row(s), the rows of queries that see no "
            "key (their lse is -inf).",
            case=case,
            mistake="triton_bwd_nan_no_key",
        )


def _bwd_case(ctx, candidate, shape, causal, dtype, layout, bm, bn, label, g, dev, pace,
              earlier=None):  # fmt: skip
    """One call of the learner's backward, watched, against float64 autograd: ``(its inputs,
    (dq, dk, dv), the case's description)``. ``earlier``: the gradients an earlier call of that
    shape returned, a result cached by shape if they come back."""
    q, k, v, out, lse, do = _bwd_inputs(g, shape, causal, dtype, layout, dev)
    case = (
        f"{label}: q {tuple(q.shape)}, k and v {tuple(k.shape)} {dtype_name(dtype)}, "
        f"causal={causal}, block_m={bm}, block_n={bn}"
    )
    limit = _limit_scale(ctx, pace, shape, bm, bn)
    with watching(KernelLoads()) as rec, watching(OpRecorder()) as ops:
        got = ctx.call(candidate, q, k, v, out, lse, do, causal, bm, bn, case=case,
                       limit_scale=limit)  # fmt: skip
    _expect_in_bounds(ctx, rec, case, race="triton_bwd_dq_race")
    _expect_no_torch_products(ctx, ops, case)
    grads = ctx.expect_tuple(got, ("dq", "dk", "dv"), case=case)
    _name_nan_no_key(ctx, grads, lse, case)
    leaves = _leaves(q.double().cpu(), k.double().cpu(), v.double().cpu())
    want = torch.autograd.grad(_exact(*leaves, causal)[0], leaves, do.double().cpu())
    tol = dict(GRAD_TOL[dev.type])
    if dtype == F16:
        tol = {name: max(value, GRAD_TOL_F16[name]) for name, value in tol.items()}
    if "s" in layout:  # the gradients are about LOSS_SCALE times larger, their rounding too
        tol["atol"] *= LOSS_SCALE
    n_q, n_k = shape[2], shape[3]
    args = [t.cpu() for t in (q, k, v, out, lse, do)]
    model = functools.cache(
        lambda i: _bwd_model(*args, causal, bm, bn, **BWD_KERNEL_MISTAKES[i][1])
    )
    for index, name in ((2, "v"), (0, "q"), (1, "k")):
        what = f"the gradient of {name} (d{name})"
        try:
            ctx.expect_array(grads[index], (q, k, v)[index].new_empty(want[index].shape),
                             what=what, case=case)  # fmt: skip
        except CheckFailure as failure:  # NaN: the backward's own causes, not a softmax's
            if tag("nan_or_inf") not in str(failure):
                raise
            values = grads[index].detach().double().cpu()
            if index != 2:  # dV = P^T dO has no D
                _name_delta_float16(ctx, index, values, out, do, n_k, causal, what, case)
            first = tuple(int(i) for i in torch.nonzero(~torch.isfinite(values))[0])
            ctx.fail(f"{what} contains NaN or inf (first at index {first}).", case=case,
                     mistake="triton_bwd_nan")  # fmt: skip
        mistakes = [_cached(earlier[index])] if earlier else []
        mistakes += [
            Mistake.of(mid, model=lambda i=i, index=index: model(i)[index])
            for i, (mid, opts, when) in enumerate(BWD_KERNEL_MISTAKES)
            if (when is None or when(n_q, n_k, causal))
            and ("do_strides" not in opts or do.stride() != out.stride())
        ]
        if index:  # dk in dv's place, or dv in dk's
            mistakes.append(
                Mistake.of("triton_bwd_dk_dv_swapped", model=lambda i=index: want[3 - i])
            )
        ctx.expect_close(
            grads[index].detach().double().cpu(), want[index], what=what, case=case,
            mistakes=mistakes, **tol,
        )  # fmt: skip
    _expect_bwd_work(ctx, rec, shape, causal, bm, bn, case)
    upcast = sorted({pair for pair in rec.dtype_pairs if "fp32" in pair})
    if dtype == F16 and upcast:
        ctx.fail(
            f"your kernels' tl.dot multiplied {' x '.join(upcast[0])} tiles although q, k, v and "
            "grad_out are float16.",
            case=case,
            mistake="triton_bwd_dot_upcast",
        )
    return (q, k, v, out, lse, do), grads, case


def _name_delta_float16(ctx, index, values, out, do, n_k, causal, what, case) -> None:
    """dq (``index`` 0) or dk (1) NaN or inf in exactly the rows that D = rowsum(dO * O) made
    inf in float16 (dq: the queries whose D is past float16's range and that see a key; dk:
    the keys such a query sees): D computed or kept in float16."""
    d = (do.detach().double().cpu() * out.detach().double().cpu()).sum(-1)  # (B, H, n_q)
    over = d.abs() >= 65520.0  # rounds to inf in float16 (its largest value: 65,504)
    if not bool(over.any()):
        return
    sees = torch.ones(out.shape[2], n_k, dtype=torch.bool)  # the keys each query sees
    if causal:
        sees = sees.tril(n_k - out.shape[2])
    expected = (over[..., :, None] & sees).any(-2) if index else over & sees.any(-1)
    if torch.equal(~torch.isfinite(values).all(-1), expected):
        ctx.fail(
            f"{what} holds NaN or inf in exactly the {int(expected.sum())} rows that D = "
            f"rowsum(dO * O) makes inf in float16: D is {float(d.abs().max()):,.0f} at most "
            "here, past float16's largest value, 65,504.",
            case=case,
            mistake="triton_bwd_delta_float16",
        )


@exercise(
    "triton_attention_backward",
    forbidden=lambda: [
        (_ref().triton_attention_backward, "the reference attention_ref.triton_attention_backward"),
        (_ref().TritonFlashAttention.backward, "the reference attention_ref.TritonFlashAttention"),
        (_ref().triton_attention, "the reference attention_ref.triton_attention"),
        *_full_attention(),
        *_notebook_12s(),
    ],
    summary="FlashAttention-2's backward pass as Triton kernels: D, dK and dV, dQ",
)
def check_triton_attention_backward(candidate, ctx: Context) -> None:
    """dq, dk, dv of every case against float64 autograd through plain attention (causal
    and not, n_q != n_k both ways, tails, a query that sees no key, transposed views of q,
    k, v and grad_out, other block sizes, float16), a wrong value named by a model of the
    mistake; in the interpreter, the addresses (a read-modify-write of several programs
    named as a race) and the work: the products of every pair computed by tl.dot, no
    PyTorch product of matrices on the learner's path, and no tile in the future of its
    queries. A float16 case has grad_out as large as a loss scale makes it (D = rowsum(dO *
    O) past float16's range: D must be float32), and the one-token case is called again on
    other values (a result kept from an earlier call of that shape is named).

    The graded (thorough) run checks other cases, not the self-check's again (nor the
    defaults; the one-token case alone, twice): the interpreter runs every program in
    Python."""
    g = ctx.torch_gen(145)
    dev = _device()
    pace = _bwd_pace(dev)
    first = None
    for row in BWD_THOROUGH if ctx.thorough else BWD_CASES:
        label, shape, causal, dtype, layout, bm, bn = row
        inputs, grads, _ = _bwd_case(
            ctx, candidate, shape, causal, dtype, layout, bm, bn, label, g, dev, pace
        )
        if row == BWD_AGAIN:
            first = (inputs, grads, _copies(grads))
    # that case again, on other values: each answer its own input's, the first unchanged
    label, shape, causal, dtype, layout, bm, bn = BWD_AGAIN
    if first is None:
        inputs, grads, _ = _bwd_case(
            ctx, candidate, shape, causal, dtype, layout, bm, bn, label, g, dev, pace
        )
        first = (inputs, grads, _copies(grads))
    _, _, case = _bwd_case(ctx, candidate, shape, causal, dtype, layout, bm, bn,
                           f"{label}, {AGAIN}", g, dev, pace, earlier=first[1])  # fmt: skip
    _expect_kept(ctx, first[1], first[2], case)
    if ctx.thorough:  # the self-check, which the graded cell runs first, checked the defaults
        return
    shape = (1, 1, 3, 5, 16)  # small: causal or not differ, the blocks cannot
    args = _bwd_inputs(g, shape, False, F32, "", dev)
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: args,
        {"causal": False, "block_m": 16, "block_n": 16},
        case="q, out, grad_out (1, 1, 3, 16), k, v (1, 1, 5, 16) float32, lse (1, 1, 3); "
        "causal, block_m and block_n left out",
        signature="triton_attention_backward(q, k, v, out, lse, grad_out, causal=False, "
        "block_m=16, block_n=16)",
        limit_scale=_limit_scale(ctx, pace, shape, 16, 16),
    )
