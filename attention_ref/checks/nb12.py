"""Checks for notebook 12: ``online_softmax``, ``online_softmax_attention``, the cached
attention step ``cached_self_attention`` and ``flash_attention`` (FlashAttention's forward
and backward passes as a ``torch.autograd.Function``).

Besides comparing values with a float64 reference, the checks watch the learner's code run
(:class:`~attention_ref.efficient.OpRecorder`, a ``TorchDispatchMode``) to verify what the
exercise is about: ``online_softmax`` never reduces the whole vector at once,
``online_softmax_attention`` never builds a tensor as large as the ``n_q x n_k`` score
matrix and, with ``causal=True``, skips the key blocks entirely in the future (it does
about half the work). Mistakes are named by running float64 models of buggy versions
(no rescale of the running sum, of the accumulator, no running maximum, the last partial
block dropped, the causal block skip off by one, ...) and seeing which reproduces the
learner's numbers.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math

import numpy as np
import torch

from .. import efficient as ref
from .. import flash as flash_ref
from .. import kv_cache as kv_ref
from ..attention import sdpa, sdpa_np
from ..efficient import OpRecorder, PeakMemory
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from ..trust.remote import autograd_grad, watching
from ._core import CheckFailure, Context, Mistake, exercise, naming, warm_autograd
from .mistakes import mistake_id, named
from .toolkit import (
    BUILTIN_ATTENTION,
    DEVICE_MISMATCH,
    TOL,
    dtype_name,
    expect_follows_device,
    expect_gradient,
    expect_spec_defaults,
    expect_tensor,
    extreme_score_rows,
)

_SOFTMAXES = [
    (torch.softmax, "torch.softmax"),
    (torch.nn.functional.softmax, "torch.nn.functional.softmax"),
    (torch.log_softmax, "torch.log_softmax"),
    (torch.logsumexp, "torch.logsumexp"),
]
_REDUCTIONS = ("max", "amax", "sum", "logsumexp", "_softmax", "_log_softmax", "mean", "cumsum")
F32, F64 = torch.float32, torch.float64


def _name_nonfinite(ctx: Context, got, expected, mistakes, case: str, what: str) -> None:
    """If ``got`` has NaN/inf, name the mistake whose model has them at the same places."""
    if isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all()):
        likely, hint = ctx.diagnose(got, expected, mistakes, (), {})
        if likely:
            ctx.fail(f"{what} contains NaN or inf.", case=case, likely=likely, hint=hint)


def _ops(rec: OpRecorder):
    """``(name, first argument)`` of every recorded op (``aten.max.dim`` is ``max``)."""
    for op in rec.ops:
        base = op.name.split(".")[1] if op.name.startswith("aten.") else op.name
        yield base, op.args[0] if op.args else None


def _numel(a) -> int:
    return a.numel() if isinstance(a, torch.Tensor) else -1


# ----------------------------------------------------------------------------- online_softmax
def _softmax_model(
    x: np.ndarray,
    bs: int,
    *,
    rescale: bool = True,
    running: bool = True,
    drop_last: bool = False,
    m0: float = -np.inf,
    subtract: bool = True,
) -> np.ndarray:
    """What a (possibly buggy) block-by-block softmax computes, in float64."""
    n = x.size
    stop = n - n % bs if drop_last and n % bs else n
    m, l = m0, 0.0  # noqa: E741
    with np.errstate(all="ignore"):
        for s in range(0, stop, bs):
            b = x[s : s + bs]
            if not subtract:
                l += np.exp(b).sum()  # noqa: E741
                continue
            m_new = max(m, b.max()) if running else b.max()
            keep = np.exp(m - m_new) if rescale and running else 1.0
            l = l * keep + np.exp(b - m_new).sum()  # noqa: E741
            m = m_new
        return np.exp(x) / l if not subtract else np.exp(x - m) / l


#: id, the options of _softmax_model (the one model) that make the mistake.
SOFTMAX_MISTAKES = [
    ("online_sum_not_rescaled", dict(rescale=False)),
    ("online_last_block_dropped", dict(drop_last=True)),
    ("online_max_starts_at_0", dict(m0=0.0)),
    ("online_no_max", dict(subtract=False)),
    ("online_block_max_only", dict(running=False)),
]
SOFTMAX_TOL = {F32: dict(rtol=1e-4, atol=1e-6), F64: TOL[F64]}


def _two_pass(rec: OpRecorder, x: torch.Tensor, bs: int) -> bool:
    """On entries that increase block after block, a one-pass softmax exponentiates its
    first block against that block's own maximum (the running maximum so far), so its
    largest exponent is 0. A two-pass one knows the whole vector's maximum first: its first
    block's largest exponent is max(x[:bs]) - max(x), well below 0."""
    n = x.numel()
    exps = [
        float(a.detach().max())
        for base, a in _ops(rec)
        if base == "exp" and isinstance(a, torch.Tensor) and 1 < a.numel() < n
    ]
    global_ref = float(x[:bs].max() - x.max())
    return len(exps) >= 2 and global_ref < -0.5 and abs(exps[0] - global_ref) < 1e-3


@exercise(
    "online_softmax",
    forbidden=lambda: [
        (ref.online_softmax, "the reference attention_ref.online_softmax"),
        *_SOFTMAXES,
    ],
    summary="softmax of a vector, one block at a time, with a running max and sum",
)
def check_online_softmax(candidate, ctx: Context) -> None:
    """Values in float32 and float64 against softmax (mistakes named by the models), then
    one pass (no exponent against the whole vector's maximum) reading block_size entries
    at a time (no reduction of the whole vector)."""
    rng = ctx.rng(111)
    up = np.linspace(-3, 6, 23) + 0.1 * rng.normal(size=23)  # the max grows in every block
    cases = [  # label, x, block_size (drawn in this order)
        ("10 entries, block_size=3 (the last block is shorter)", rng.normal(size=10), 3),
        ("12 entries, block_size=4", rng.normal(size=12), 4),
        ("23 increasing entries, block_size=5", up, 5),
        ("decreasing entries, block_size=4", np.sort(rng.normal(size=14))[::-1].copy(), 4),
        ("one entry, block_size=1", rng.normal(size=1), 1),
        ("7 entries, block_size=10 (one block)", rng.normal(size=7), 10),
        ("large entries (around 1000), block_size=4", 1000 + 50 * rng.normal(size=13), 4),
        ("entries far below 0 (around -1000), block_size=3", extreme_score_rows(rng, 8)[1], 3),
        (
            "entries spanning more than exp's range (+696, the rest below -210), block_size=3",
            *(extreme_score_rows(rng, 10)[0], 3),
        ),
        ("a big entry in the last block, block_size=4", np.r_[rng.normal(size=9), 40.0], 4),
    ]
    if ctx.thorough:
        cases += [
            ("50 entries, block_size=8", 3 * rng.normal(size=50), 8),
            ("33 increasing entries, block_size=2", np.linspace(-5, 5, 33), 2),
            ("block_size=1, 9 entries", rng.normal(size=9), 1),
        ]
    for (label, x_np, bs), dtype in itertools.product(cases, (F32, F64)):
        x = torch.from_numpy(np.asarray(x_np, dtype=np.float64)).to(dtype)
        case = f"{label}; x {tuple(x.shape)} {dtype_name(dtype)}, block_size={bs}"
        with watching(OpRecorder(keep_args=True)) as rec:
            got = ctx.call(candidate, x, bs, case=case)
        expected = torch.softmax(x.double(), 0)
        expect_tensor(ctx, got, "the result", case, like=x)
        x64 = x.double().numpy()
        mistakes = [
            Mistake.of(i, model=lambda kw=kw: _softmax_model(x64, bs, **kw))
            for i, kw in SOFTMAX_MISTAKES
        ]
        _name_nonfinite(ctx, got, expected, mistakes, case, "the result")
        ctx.expect_array(got, x, what="the result", case=case)
        ctx.expect_close(
            got, expected, what="the result", case=case, mistakes=mistakes, **SOFTMAX_TOL[dtype]
        )
        if "increasing" in label and _two_pass(rec, x, bs):
            ctx.fail(
                "your first block is exponentiated against the maximum of the whole "
                "vector, which a single pass cannot know yet.",
                case=case,
                mistake="online_two_passes",
            )
        n = x.numel()
        whole = [b for b, a in _ops(rec) if b in _REDUCTIONS and _numel(a) == n]
        if n > bs and whole:
            ctx.fail(
                f"the whole vector is reduced at once ({whole[0]} over all {n} entries); the "
                f"exercise reads it block_size={bs} entries at a time.",
                case=case,
                mistake="online_global_max_first",
            )


# ----------------------------------------------------------------------------- online attention
def _attn_model(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bs: int,
    causal: bool,
    *,
    rescale_l: bool = True,
    rescale_acc: bool = True,
    running: bool = True,
    drop_last: bool = False,
    skip_diagonal: bool = False,
    strict: bool = False,
    scale: bool = True,
) -> torch.Tensor:
    """A (possibly buggy) blocked online attention in float64; queries in blocks of ``bs``
    when causal, all at once otherwise. ``n_q == n_k`` when causal."""
    q, k, v = q.double(), k.double(), v.double()
    n_q, n_k = q.shape[-2], k.shape[-2]
    if scale:
        q = q / math.sqrt(q.shape[-1])
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = torch.zeros(*batch, n_q, v.shape[-1], dtype=torch.float64)
    qbs = bs if causal else n_q
    stop_k = n_k - n_k % bs if drop_last and n_k % bs else n_k
    for i0 in range(0, n_q, qbs):
        i1 = min(i0 + qbs, n_q)
        m = torch.full((*batch, i1 - i0, 1), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(*batch, i1 - i0, v.shape[-1], dtype=torch.float64)
        j_end = min(stop_k, i0 if skip_diagonal else i1) if causal else stop_k
        for j0 in range(0, j_end, bs):
            j1 = min(j0 + bs, n_k)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            if causal:
                rows = torch.arange(i0, i1)[:, None]
                cols = torch.arange(j0, j1)[None, :]
                allowed = cols < rows if strict else cols <= rows
                s = s.masked_fill(~allowed, -math.inf)
            blk = s.amax(-1, keepdim=True)
            m_new = torch.maximum(m, blk) if running else blk
            m_new = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_new) if running else torch.ones_like(m)
            p = torch.exp(s - m_new)
            l = (l * alpha if rescale_l else l) + p.sum(-1, keepdim=True)  # noqa: E741
            acc = (acc * alpha if rescale_acc else acc) + p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / torch.where(l > 0, l, torch.ones_like(l))  # 0 if none seen
    return out


#: id, the options of _attn_model (the one model of the forward pass) that make the mistake.
ATTN_MISTAKES = [
    ("flash_running_sum_l", dict(rescale_l=False)),
    ("flash_accumulator_rescaled_when", dict(rescale_acc=False)),
    ("flash_running_maximum", dict(running=False)),
    ("flash_last_partial_block", dict(drop_last=True)),
    ("flash_causal_block_skip", dict(skip_diagonal=True)),
    ("flash_causal_mask_strict", dict(strict=True)),
    ("flash_scores_scaled_1", dict(scale=False)),
]


def _forward_mistakes(q, k, v, bs: int, causal: bool) -> list[Mistake]:
    """The forward pass's mistake models on this input (and, when causal, causal ignored)."""
    mistakes = [
        Mistake.of(i, model=lambda kw=kw: _attn_model(q, k, v, bs, causal, **kw))
        for i, kw in ATTN_MISTAKES
    ]
    if causal:
        mistakes.append(
            Mistake.of("flash_causal_ignored", model=lambda: _attn_model(q, k, v, bs, False))
        )
    return mistakes


#: The cases of online_softmax_attention and flash_attention: label, q shape, k shape, d_v
#: (or v's whole shape), block_size, causal, dtype. Both end with the large-logit cases of
#: _attention_cases.
_BROADCAST = "broadcast batch: q (2, 1, 12, 8), k (1, 3, 12, 8)"
ONLINE_CASES = [
    ("batch (2, 3), n=40, block_size=16", (2, 3, 40, 8), (2, 3, 40, 8), 8, 16, False, F64),
    ("the same, causal", (2, 3, 40, 8), (2, 3, 40, 8), 8, 16, True, F64),
    ("n_q=5, n_k=23, d_k=8, d_v=6, block_size=8", (1, 5, 8), (1, 23, 8), 6, 8, False, F64),
    ("no batch dimension, n=30, block_size=7, causal", (30, 4), (30, 4), 4, 7, True, F64),
    ("block_size=64 > n=10", (2, 10, 4), (2, 10, 4), 4, 64, False, F32),
    ("block_size=1, n=9, causal", (1, 9, 4), (1, 9, 4), 3, 1, True, F64),
    ("one query, one key", (1, 1, 1, 4), (1, 1, 1, 4), 4, 4, False, F32),
    ("float32, n=50, block_size=12", (2, 2, 50, 16), (2, 2, 50, 16), 16, 12, False, F32),
    ("float32, n=50, block_size=12, causal", (2, 50, 16), (2, 50, 16), 16, 12, True, F32),
    (_BROADCAST, (2, 1, 12, 8), (1, 3, 12, 8), 8, 5, False, F64),
    (
        "broadcast batch, k and v each their own: q (1, 1, 12, 8), k (2, 1, 12, 8), "
        "v (1, 3, 12, 6)",
        *((1, 1, 12, 8), (2, 1, 12, 8), (1, 3, 12, 6), 5, False, F64),
    ),
]
ONLINE_THOROUGH_CASES = [
    ("n=100, block_size=32, causal", (2, 100, 8), (2, 100, 8), 8, 32, True, F64),
    ("n_q=70, n_k=45, block_size=16", (3, 70, 8), (3, 45, 8), 5, 16, False, F64),
    ("block_size=3, n=11", (1, 2, 11, 4), (1, 2, 11, 4), 4, 3, False, F32),
]
FLASH_CASES = [
    ("batch (2, 3), n=48, block_size=16", (2, 3, 48, 8), (2, 3, 48, 8), 8, 16, False, F64),
    ("the same, causal", (2, 3, 48, 8), (2, 3, 48, 8), 8, 16, True, F64),
    ("n_q=5, n_k=23, d_k=8, d_v=6, block_size=8", (1, 5, 8), (1, 23, 8), 6, 8, False, F64),
    ("n_q=21, n_k=6, block_size=4", (2, 21, 4), (2, 6, 4), 5, 4, False, F64),
    ("no batch dimension, n=30, block_size=7, causal", (30, 4), (30, 4), 4, 7, True, F64),
    ("block_size=64 > n=10", (2, 10, 4), (2, 10, 4), 4, 64, False, F64),
    ("block_size=1, n=9, causal", (1, 9, 4), (1, 9, 4), 3, 1, True, F64),
    ("one token", (1, 1, 1, 4), (1, 1, 1, 4), 4, 4, False, F64),
    ("one token, causal", (1, 1, 4), (1, 1, 4), 2, 4, True, F64),
    ("float32, n=50, block_size=12, causal", (2, 50, 16), (2, 50, 16), 16, 12, True, F32),
]
FLASH_THOROUGH_CASES = [
    ("n=100, block_size=32, causal", (2, 100, 8), (2, 100, 8), 8, 32, True, F64),
    ("n_q=70, n_k=45, block_size=16", (3, 70, 8), (3, 45, 8), 5, 16, False, F64),
    ("block_size=3, n=11, d_v=7, causal", (1, 2, 11, 4), (1, 2, 11, 4), 7, 3, True, F64),
    ("float32, n=40, block_size=8", (4, 40, 8), (4, 40, 8), 8, 8, False, F32),
]
#: Large logits (scores up to about 150): the running maximum keeps exp() in range.
LARGE_TOL = dict(rtol=1e-3, atol=1e-4)
#: The tolerances of flash_attention's cases: float32 sums many products per gradient.
GRAD_TOL = {F64: TOL[F64], F32: LARGE_TOL}


def _attention_cases(ctx: Context, g: torch.Generator, cases, thorough_cases, tols):
    """``(q, k, v, block_size, causal, label, tol)`` of each case, drawn from ``g`` in the
    order of the table, then the two large-logit cases (float32, not causal and causal)."""
    for label, sq, sk, d_v, bs, causal, dtype in cases + (thorough_cases if ctx.thorough else []):
        yield *_attn_inputs(g, sq, sk, d_v, dtype), bs, causal, label, tols[dtype]
    for causal in (False, True):
        q, k, v = _attn_inputs(g, (2, 24, 8), (2, 24, 8), 8, F32, scale=5.0)
        label = "large scores (up to about 150), float32" + (", causal" if causal else "")
        yield q, k, v, 8, causal, label, LARGE_TOL


def _attn_inputs(g, shape_q, shape_k, d_v, dtype, scale=1.0):
    q = scale * torch.randn(*shape_q, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*shape_k, generator=g, dtype=torch.float64)
    shape_v = d_v if isinstance(d_v, tuple) else (*shape_k[:-1], d_v)
    v = torch.randn(*shape_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _describe(label: str, q, k, v, bs: int, causal: bool) -> str:
    return (
        f"{label}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
        f"{dtype_name(q.dtype)}, block_size={bs}, causal={causal}"
    )


def _expected_attention(q, k, v, causal: bool) -> torch.Tensor:
    mask = None
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    return sdpa(q.double(), k.double(), v.double(), mask)[0]


def _expect_output(ctx, got, expected, q, k, v, bs, causal, case, tol, nonfinite: bool) -> None:
    """The output: a tensor of the expected shape (first), dtype, finite (a NaN or inf that
    a forward mistake's model also has is named by it when ``nonfinite``), close to
    ``expected``, a wrong value named by the first forward mistake that explains it."""
    like = expected.detach().to(q.dtype)
    expect_tensor(ctx, got, "the output", case, like=like)
    mistakes = _forward_mistakes(q, k, v, bs, causal)
    if nonfinite:
        _name_nonfinite(ctx, got, expected, mistakes, case, "the output")
    ctx.expect_array(got, like, what="the output", case=case)
    ctx.expect_close(got, expected, what="the output", case=case, mistakes=mistakes, **tol)


#: The watched cases: n = 256, block_size = 64, 16 tiles, 10 of them when causal.
WATCH_N, WATCH_BS = 256, 64
_TAIL = "one sequence's score matrix has n_q * n_k = {n2}."
_ONLINE_TAIL = (
    "the full score matrix of one sequence has n_q * n_k = {n2}. Online attention must never "
    "hold a tensor that large."
)
#: who, the mistake of a tensor of n_q * n_k elements, the message's end, the mistake of no
#: skipping: the passes watched of online_softmax_attention, and of flash_attention.
ONLINE_WATCHED = [
    ("code", "flash_full_score_matrix", _ONLINE_TAIL, "flash_future_blocks_not_skipped"),
]
FLASH_WATCHED = [
    ("forward pass", "flash_bwd_full_matrix", _TAIL, "flash_future_blocks_not_skipped"),
    ("backward pass", "flash_bwd_full_matrix", _TAIL, "flash_bwd_future_tiles"),
]


def _watch(ctx: Context, g: torch.Generator, d: int, run, passes) -> None:
    """``run(q, k, v, causal, case)`` on q, k, v (2, WATCH_N, d) float32, not causal then
    causal: it checks the values and returns an OpRecorder per pass of ``passes``. No pass
    builds a tensor of n_q * n_k elements, and each does at most 72% of its causal=False
    work with causal=True (the future key blocks skipped: about 60%)."""
    n, bs = WATCH_N, WATCH_BS
    q, k, v = _attn_inputs(g, (2, n, d), (2, n, d), d, F32)
    work = {}
    for causal in (False, True):
        case = (
            f"q, k, v (2, {n}, {d}) float32, block_size={bs}, causal={causal} (watching every "
            "tensor your code creates)"
        )
        recs = run(q, k, v, causal, case)
        for rec, (who, mistake, tail, _) in zip(recs, passes, strict=True):
            numel, shape, op = rec.largest()
            if numel >= n * n:
                ctx.fail(
                    f"your {who} builds a tensor of shape {shape} ({numel} elements, made by "
                    f"{op}); " + tail.format(n2=n * n),
                    case=case,
                    mistake=mistake,
                )
        work[causal] = [rec.work() for rec in recs]
    for i, (who, _, _, mistake) in enumerate(passes):
        ratio = work[True][i] / max(work[False][i], 1)
        if ratio > 0.72:
            ctx.fail(
                f"with causal=True your {who} does {ratio:.0%} of the work it does with "
                f"causal=False; skipping the key blocks entirely in the future should bring "
                f"it to about 60% here (n={n}, block_size={bs}: 10 of 16 tiles).",
                case=f"q, k, v (2, {n}, {d}) float32, block_size={bs}",
                mistake=mistake,
            )


def _full_attention() -> list[tuple]:
    """What online_softmax_attention and flash_attention must not call: the full score
    matrix's attention and softmax. torch.logsumexp is allowed: a running log-sum-exp per
    query, one tile at a time, is the same algorithm (the memory check rejects a logsumexp
    of whole rows)."""
    return [
        (ref.naive_attention, "attention_ref.naive_attention (the full score matrix)"),
        (sdpa, "attention_ref.sdpa (the full score matrix)"),
        (sdpa_np, "attention_ref.sdpa_np"),
        *BUILTIN_ATTENTION,
        *[(fn, name) for fn, name in _SOFTMAXES if fn is not torch.logsumexp],
    ]


@exercise(
    "online_softmax_attention",
    forbidden=lambda: [
        (ref.online_softmax_attention, "the reference attention_ref.online_softmax_attention"),
        *_full_attention(),
    ],
    summary="sdpa's output over key blocks with a running max and sum",
)
def check_online_softmax_attention(candidate, ctx: Context) -> None:
    """The output of every case against sdpa's (mistakes named by _attn_model), then no
    ``n_q x n_k`` tensor and the future key blocks skipped."""
    g = ctx.torch_gen(112)
    for q, k, v, bs, causal, label, tol in _attention_cases(
        ctx, g, ONLINE_CASES, ONLINE_THOROUGH_CASES, TOL
    ):
        case = _describe(label, q, k, v, bs, causal)
        got = ctx.call(candidate, q, k, v, block_size=bs, causal=causal, case=case)
        expected = _expected_attention(q, k, v, causal)
        _expect_output(ctx, got, expected, q, k, v, bs, causal, case, tol, nonfinite=True)

    def run(q, k, v, causal: bool, case: str) -> list[OpRecorder]:
        with watching(OpRecorder()) as rec:
            got = ctx.call(candidate, q, k, v, block_size=WATCH_BS, causal=causal, case=case)
        expected = _expected_attention(q, k, v, causal)
        expect_tensor(ctx, got, "the output", case, like=expected)
        ctx.expect_close(got, expected, what="the output", case=case, **TOL[F32])
        return [rec]

    _watch(ctx, g, 16, run, ONLINE_WATCHED)
    _check_online_autograd(ctx, candidate)
    q, k, v = _attn_inputs(g, (1, 80, 8), (1, 80, 8), 8, F64)
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (q, k, v),
        {"block_size": 64, "causal": False},
        case="q, k, v (1, 80, 8) float64, block_size and causal left out",
        signature="online_softmax_attention(q, k, v, block_size=64, causal=False)",
    )
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        tuple(torch.empty(2, 20, 8, device=meta) for _ in range(3)),
        ("the output",),
        "wrong_device",
        "q, k, v (2, 20, 8), block_size=8, causal=True",
        block_size=8,
        causal=True,
    )


def _check_online_autograd(ctx: Context, candidate) -> None:
    """Section 5 of the notebook runs autograd's backward pass through the learner's
    function: its output must be connected to q, k and v and the backward pass must give
    attention's gradients. An in-place update of a tensor that autograd saved (``l.mul_``,
    ``s.exp_()``) passes every case above and breaks that backward pass."""
    g = ctx.torch_gen(115)
    for causal in (False, True):
        q, k, v = _attn_inputs(g, (2, 10, 4), (2, 10, 4), 4, F64)
        case = (
            f"q, k, v (2, 10, 4) float64 requiring gradients, block_size=4, causal={causal}; "
            "then autograd's backward pass through your function, as section 5 runs it"
        )
        leaves = _leaves(q, k, v)
        out = ctx.call(
            lambda leaves=leaves, causal=causal: candidate(*leaves, block_size=4, causal=causal),
            case=case,
            call_name="online_softmax_attention",
        )
        expected, ref_leaves = _reference(q, k, v, causal)
        expect_tensor(ctx, out, "the output", case, like=expected)
        do = torch.randn(expected.shape, generator=g, dtype=F64)
        expect_gradient(
            ctx,
            out,
            dict(zip("qkv", leaves, strict=True)),
            torch.autograd.grad(expected, ref_leaves, do),
            grad_output=do,
            case=case,
            call_name="online_softmax_attention",
            mistake="online_no_autograd",
            disconnected="the output is not connected to q, k and v for autograd (it has no "
            "grad_fn).",
            tol=TOL[F64],
            what="the gradient of {name} (d{name}) that autograd computes through your code",
            errors={"inplace operation": "online_inplace_autograd"},
        )


# ----------------------------------------------------------------------------- KV cache
class _WatchedCache:
    """A :class:`KVCache` that counts what is appended to it. Under grading the learner's
    code uses this one, in the checker, by reference."""

    __by_reference__ = True

    def __init__(self, max_len: int) -> None:
        self._cache = kv_ref.KVCache(max_len)
        self.appended = 0  # positions appended during the current call
        self.calls = 0

    def __len__(self) -> int:
        return len(self._cache)

    def append(self, k, v):
        self.calls += 1
        if isinstance(k, torch.Tensor) and k.dim() == 4:
            self.appended += k.shape[2]
        return self._cache.append(k, v)

    def __getattr__(self, name):  # k, v, length, max_len of the real cache
        if name == "_cache":  # not set yet: a copy (copy.deepcopy) is being made
            raise AttributeError(name)
        return getattr(self._cache, name)


@torch.no_grad()
def _kv_model(mha, x, s: int, e: int, mode: str = "correct") -> torch.Tensor:
    """Output for the new positions ``s..e-1`` of ``x`` with the past ``0..s-1`` cached;
    ``mode``: "correct" or the id of the mistake made."""
    H = mha.n_heads
    q = split_heads(mha.w_q(x[:, s:e]), H)  # (B, H, t, d)
    k = split_heads(mha.w_k(x[:, :e]), H)  # (B, H, e, d)
    v = split_heads(mha.w_v(x[:, :e]), H)
    rows = torch.arange(s, e)[:, None]
    cols = torch.arange(e)[None, :]
    allowed = {
        "correct": cols <= rows,
        "kv_no_mask": torch.ones(e - s, e, dtype=torch.bool),
        "kv_unshifted": cols <= rows - s,
        "kv_only_new": (cols <= rows) & (cols >= s),
        "kv_no_w_o": cols <= rows,
    }[mode]
    out = merge_heads(sdpa(q, k, v, allowed)[0])
    return out if mode == "kv_no_w_o" else mha.w_o(out)


#: The mistakes modelled by _kv_model (each its own mode).
KV_MISTAKES = ["kv_no_mask", "kv_unshifted", "kv_only_new", "kv_no_w_o"]
#: label, the number of tokens of each call, dtype.
KV_SCHEDULES = [
    ("one token at a time", [1, 1, 1, 1, 1, 1, 1], F64),
    ("a prompt of 3, then 1, 2 and 1 tokens", [3, 1, 2, 1], F64),
    ("all 7 tokens at once (empty cache)", [7], F32),
]
KV_THOROUGH_SCHEDULES = [
    ("2, 2, 2 and 1 tokens", [2, 2, 2, 1], F64),
    ("1 token, then 6", [1, 6], F32),
]


@exercise(
    "cached_self_attention",
    forbidden=lambda: [
        (kv_ref.cached_self_attention, "the reference attention_ref.cached_self_attention"),
        (MultiHeadAttention.forward, "MultiHeadAttention.forward (recomputing everything)"),
    ],
    summary="causal self-attention of the new positions over a key-value cache",
)
def check_cached_self_attention(candidate, ctx: Context) -> None:
    """Each call of a schedule: the new positions appended to the cache once, and their
    output that of causal attention over everything so far (mistakes named by _kv_model)."""
    g = ctx.torch_gen(113)
    for label, chunks, dtype in KV_SCHEDULES + (KV_THOROUGH_SCHEDULES if ctx.thorough else []):
        torch.manual_seed(ctx.seed * 7 + len(chunks))
        mha = MultiHeadAttention(12, 3).to(dtype)
        mha64 = copy.deepcopy(mha).double()
        T = sum(chunks)
        x = torch.randn(2, T, 12, generator=g, dtype=torch.float64).to(dtype)
        x64 = x.double()
        cache = _WatchedCache(T)
        for s, t in zip(np.cumsum([0, *chunks[:-1]]).tolist(), chunks, strict=True):
            e = s + t
            case = (
                f"{label}: MultiHeadAttention(d_model=12, n_heads=3) {dtype_name(dtype)}, batch 2; "
                f"{s} positions cached, x_new (2, {t}, 12) = positions {s}..{e - 1}"
            )
            cache.appended = 0
            with torch.no_grad():
                got = ctx.call(candidate, mha, x[:, s:e], cache, case=case)
            if cache.appended == 0:
                ctx.fail(
                    "the cache was not appended: after your call it still holds "
                    f"{len(cache)} positions, expected {e}.",
                    case=case,
                    mistake="cache_not_appended",
                )
            if cache.appended != t:
                ctx.fail(
                    f"{cache.appended} positions were appended to the cache for {t} new "
                    f"token(s) (cache.append was called {cache.calls} time(s) so far).",
                    case=case,
                    mistake="kv_appended_twice"
                    if cache.appended == 2 * t
                    else "kv_appended_wrong_count",
                )
            expected = _kv_model(mha64, x64, s, e)
            mistakes = [
                Mistake.of(i, model=lambda i=i, s=s, e=e: _kv_model(mha64, x64, s, e, i))
                for i in KV_MISTAKES
            ]
            ctx.expect_array(got, expected.to(dtype), what="the output", case=case)
            ctx.expect_close(
                got, expected, what="the output", case=case, mistakes=mistakes, **TOL[dtype]
            )
    _check_kv_device(ctx, candidate)


def _check_kv_device(ctx: Context, candidate) -> None:
    """Notebook cell 34 runs the learner's step on the GPU when there is one: whatever it
    builds (the mask above all) must be on ``x_new.device``. PyTorch's meta device (shapes,
    no data) stands in for a second device, so this runs on a machine without a GPU: a
    tensor built on the CPU and mixed with a meta tensor raises, as on a GPU."""
    meta = torch.device("meta")
    mha = MultiHeadAttention(12, 3).to(meta)
    cache = _WatchedCache(6)
    for s, t in ((0, 3), (3, 2), (5, 1)):
        case = (
            f"MultiHeadAttention(d_model=12, n_heads=3), the cache and x_new (2, {t}, 12) on "
            f"PyTorch's meta device (tensors without data, standing in for a GPU); {s} "
            "positions cached"
        )
        x = torch.empty(2, t, 12, device=meta)
        try:
            with torch.no_grad():
                got = ctx.call(candidate, mha, x, cache, case=case)
        except CheckFailure as err:
            if any(words in str(err).lower() for words in DEVICE_MISMATCH):
                raise naming(err, named("kv_mask_wrong_device")) from None
            raise
        expect_tensor(ctx, got, "the output", case, like=x)
        if got.device != meta:
            ctx.fail(
                f"the output is on {got.device}, expected x_new's device ({meta}).",
                case=case,
                mistake="kv_mask_wrong_device",
            )


# ----------------------------------------------------------------------------- FlashAttention
def _flash_grads_model(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    bs: int,
    causal: bool,
    *,
    delta: str = "out",
    weights: str = "lse",
    scale_power: int = 0,
    transposes: bool = True,
    mask: bool = True,
    skip: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of a (possibly buggy) tiled FlashAttention backward pass in float64,
    queries and keys in blocks of ``bs`` (``n_q == n_k`` when causal).

    ``delta``: "out" (D = rowsum(dO * O)), "none" (no D) or "tile" (rowsum(P * dP) of each
    tile); ``weights``: P = exp(S - x) with x = "lse" (right), "max", "raw" (x = 0) or
    "log_l"; ``scale_power``: dq and dk times (1/sqrt(d_k)) ** scale_power (-1: not scaled,
    1: scaled twice); ``transposes=False`` writes P dO, dS^T K and dS Q (raises unless the
    tiles are square); ``mask``/``skip``: the causal mask and the skipping of future tiles
    in the backward pass."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    n_q, n_k, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d_k)
    s_all = q @ k.transpose(-2, -1) * scale  # (..., n_q, n_k): the checker may hold it
    if causal:
        allowed_all = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
        s_all = s_all.masked_fill(~allowed_all, -math.inf)
    m_all = s_all.amax(-1, keepdim=True)  # (..., n_q, 1)
    l_all = torch.exp(s_all - m_all).sum(-1, keepdim=True)
    out = torch.softmax(s_all, -1) @ v  # (..., n_q, d_v)
    log_l = torch.log(l_all)
    row = dict(lse=m_all + log_l, max=m_all, raw=torch.zeros_like(m_all), log_l=log_l)[weights]
    d_all = (do * out).sum(-1, keepdim=True)  # (..., n_q, 1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, n_q, bs):
        i1 = min(i0 + bs, n_q)
        q_i, do_i = q[..., i0:i1, :], do[..., i0:i1, :]
        j_end = min(n_k, i1) if causal and skip else n_k
        for j0 in range(0, j_end, bs):
            j1 = min(j0 + bs, n_k)
            k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]
            s = q_i @ k_j.transpose(-2, -1) * scale  # (..., bq, bk)
            if causal and mask:
                allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                s = s.masked_fill(~allowed, -math.inf)
            p = torch.exp(s - row[..., i0:i1, :])
            dp = do_i @ v_j.transpose(-2, -1)
            d = d_all[..., i0:i1, :]
            d_i = {"out": d, "none": torch.zeros_like(d), "tile": (p * dp).sum(-1, keepdim=True)}
            ds = p * (dp - d_i[delta])
            if transposes:
                dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_i
                dq[..., i0:i1, :] += ds @ k_j * scale
                dk[..., j0:j1, :] += ds.transpose(-2, -1) @ q_i * scale
            else:
                dv[..., j0:j1, :] += p @ do_i
                dq[..., i0:i1, :] += ds.transpose(-2, -1) @ k_j * scale
                dk[..., j0:j1, :] += ds @ q_i * scale
    times = scale**scale_power
    return dq * times, dk * times, dv


#: id, the options of _flash_grads_model (the one model of the backward pass).
FLASH_BWD_MISTAKES = [
    ("flash_bwd_no_delta", dict(delta="none")),
    ("flash_bwd_delta_per_tile", dict(delta="tile")),
    ("flash_bwd_unnormalised_weights", dict(weights="max")),
    ("flash_bwd_unnormalised_weights", dict(weights="raw")),
    ("flash_bwd_unnormalised_weights", dict(weights="log_l")),
    ("flash_bwd_scale", dict(scale_power=-1)),  # not scaled
    ("flash_bwd_scale", dict(scale_power=1)),  # scaled twice
    ("flash_bwd_transposes", dict(transposes=False)),
    ("flash_bwd_causal_mask", dict(mask=False)),
    ("flash_bwd_causal_mask", dict(mask=False, skip=False)),
]
#: What a backward pass that uses the second call's state gives for the first call.
_SECOND_CALL_SYMPTOMS = {
    *("wrong_values", "wrong_shape", "wrong_type", "wrong_dtype", "nan_or_inf"),
    *("flash_bwd_gradient_order", "flash_bwd_gradient_count", "flash_bwd_no_gradient"),
}


def _function_class(ctx: Context, candidate) -> type:
    """The learner's ``torch.autograd.Function`` subclass (given itself or its ``apply``)."""
    owner = getattr(candidate, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        return owner  # FlashAttention.apply was passed: the class is meant
    if not (isinstance(candidate, type) and issubclass(candidate, torch.autograd.Function)):
        got = candidate.__name__ if isinstance(candidate, type) else type(candidate).__name__
        ctx.fail(
            f"pass your class itself, a subclass of torch.autograd.Function; got {got}.",
            mistake="not_an_autograd_function",
        )
    return candidate


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


#: The time limit of a call made under the watchers (OpRecorder, PeakMemory), as a multiple of
#: the usual one: every operation is intercepted there, and a correct backward pass written
#: with many small operations takes several times as long as it does unwatched.
TRACED_LIMIT_SCALE = 6.0


def _flash_forward(
    ctx: Context,
    cls: type,
    leaves,
    extra: tuple,
    case: str,
    limit_scale: float = 1.0,
):
    """The learner's forward pass ``cls.apply(q, k, v, *extra)`` on ``leaves`` (q, k, v
    requiring gradients; ``extra``: here ``(block_size, causal)``, notebook 14's
    ``(causal,)``); its output, checked to be one tensor that autograd can differentiate."""
    before = [t.detach().clone() for t in leaves]
    out = ctx.call(
        lambda: cls.apply(*leaves, *extra),
        case=case,
        call_name=f"{cls.__name__}.forward",
        limit_scale=limit_scale,
    )
    for name, t, b in zip("qkv", leaves, before, strict=True):
        if not torch.equal(t.detach(), b):
            ctx.fail(
                f"your forward modified its input {name} in place.",
                case=case,
                mistake="input_modified",
                hint="use out-of-place operations (q = q * scale, not q *= scale): the "
                "caller's tensors, and the ones saved for backward, must stay unchanged.",
            )
    if isinstance(out, tuple | list):
        ctx.fail(
            f"{cls.__name__}.apply returned a {type(out).__name__} of {len(out)}; forward must "
            "return only the output (save the log-sum-exp with ctx.save_for_backward).",
            case=case,
            mistake="wrong_type",
        )
    return out


def _flash_backward(ctx: Context, cls: type, out, leaves, do, case: str, limit_scale: float = 1.0):
    """The learner's backward pass: ``(dq, dk, dv)`` for the gradient ``do`` of ``out``."""
    if out.grad_fn is None:
        ctx.fail(
            "the output of your forward is not connected to q, k and v for autograd (it has "
            "no grad_fn): was it detached, or computed outside forward?",
            case=case,
            mistake="wrong_values",
        )
    warm_autograd()
    try:
        grads = ctx.call(
            lambda: autograd_grad(out, leaves, do, allow_unused=True),
            case=case,
            call_name=f"{cls.__name__}.backward",
            limit_scale=limit_scale,
        )
    except CheckFailure as err:
        if "incorrect number of gradients" in str(err):
            raise naming(err, named("flash_bwd_gradient_count")) from None
        if "returned an invalid gradient at index" in str(err):
            raise naming(err, named("flash_bwd_gradient_order")) from None
        raise
    for name, grad in zip("qkv", grads, strict=True):
        if grad is None:
            ctx.fail(f"no gradient reached {name}.", case=case, mistake="flash_bwd_no_gradient")
    return grads


def _reference(q, k, v, causal: bool, do=None):
    """The right answer in float64, autograd through the whole softmax: ``(out, leaves)``,
    or, given the output's gradient ``do``, ``(out, (dq, dk, dv))``."""
    leaves = _leaves(q.double(), k.double(), v.double())
    out = _expected_attention(*leaves, causal)
    return out, leaves if do is None else torch.autograd.grad(out, leaves, do.double())


def _flash_case(ctx: Context, cls: type, q, k, v, bs: int, causal: bool, label: str, tol) -> None:
    """One case: the output as online_softmax_attention's, then dv (it needs neither D nor
    the scale), dq and dk against autograd's, a wrong one named by _flash_grads_model's
    mistakes or as another input's gradient in its place."""
    case = _describe(label, q, k, v, bs, causal)
    leaves = _leaves(q, k, v)
    out = _flash_forward(ctx, cls, leaves, (bs, causal), case)
    expected, ref_leaves = _reference(q, k, v, causal)
    _expect_output(ctx, out, expected, q, k, v, bs, causal, case, tol, nonfinite=False)
    g = torch.Generator().manual_seed(ctx.seed * 31 + q.numel())
    do64 = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    grads = _flash_backward(ctx, cls, out, leaves, do64.to(q.dtype), case)
    want = torch.autograd.grad(expected, ref_leaves, do64)
    rounding = _rounding(q, k, v, causal, do64, want)
    model = functools.cache(
        lambda i: _flash_grads_model(q, k, v, do64, bs, causal, **FLASH_BWD_MISTAKES[i][1])
    )
    for index, name in ((2, "v"), (0, "q"), (1, "k")):
        what = f"the gradient of {name} (d{name})"
        ctx.expect_array(grads[index], want[index].to(q.dtype), what=what, case=case)
        mistakes = [
            Mistake.of(mid, model=lambda i=i, index=index: model(i)[index])
            for i, (mid, _) in enumerate(FLASH_BWD_MISTAKES)
        ] + [  # another input's gradient in this place (same shapes here)
            Mistake.of("flash_bwd_gradient_order", model=lambda other=other: want[other])
            for other in range(3)
            if other != index
        ]
        grad_tol = dict(tol, atol=max(tol["atol"], 4 * rounding[index]))
        ctx.expect_close(
            grads[index], want[index], what=what, case=case, mistakes=mistakes, **grad_tol
        )


def _rounding(q, k, v, causal: bool, do64, want) -> tuple[float, ...]:
    """The error the inputs' dtype makes in each gradient whatever the method, with scores
    as large as these: every score is rounded by about its size times the dtype's epsilon,
    and a gradient carries that relative to its largest entry (with float32 scores up to
    about 150, a correct kernel that recomputes the weights from the running log-sum-exp
    missed the plain tolerance by up to half again, on 2 seeds of 14). Twice the scores'
    largest size times epsilon, times each gradient's largest entry; 0 for float64. A
    gradient may be off by 4 times it."""
    if q.dtype == torch.float64:
        return (0.0, 0.0, 0.0)
    largest = float((q.double() @ k.double().transpose(-2, -1)).abs().max()) / math.sqrt(
        q.shape[-1]
    )
    spread = 2 * torch.finfo(q.dtype).eps * largest
    return tuple(spread * float(w.abs().max()) for w in want)


@exercise(
    "flash_attention",
    forbidden=lambda: [
        (flash_ref.FlashAttention.forward, "the reference attention_ref.FlashAttention"),
        (flash_ref.FlashAttention.backward, "the reference attention_ref.FlashAttention"),
        (flash_ref.flash_attention, "the reference attention_ref.flash_attention"),
        (ref.online_softmax_attention, "the reference attention_ref.online_softmax_attention"),
        *_full_attention(),
    ],
    summary="FlashAttention as a torch.autograd.Function: tiled forward, recomputing backward",
)
def check_flash_attention(candidate, ctx: Context) -> None:
    """Every case's output and gradients, then memory and skipping in both passes, then two
    forward calls before the first backward pass."""
    cls = _function_class(ctx, candidate)
    g = ctx.torch_gen(114)
    for q, k, v, bs, causal, label, tol in _attention_cases(
        ctx, g, FLASH_CASES, FLASH_THOROUGH_CASES, GRAD_TOL
    ):
        _flash_case(ctx, cls, q, k, v, bs, causal, label, tol)
    _check_flash_memory_and_skipping(ctx, cls, g)
    _check_flash_two_calls(ctx, cls, g)


def _check_flash_two_calls(ctx: Context, cls: type, g) -> None:
    """Two calls of forward before the backward pass of the first, as a model with two
    attention layers makes: what backward needs must live on ctx, not on the class or in a
    global (every case above called forward and backward in turn)."""
    case = (
        "two calls, q, k, v (2, 20, 4) float64 with block_size=8, then (2, 12, 4) with "
        "block_size=4, causal=True, then the backward pass of the first (as two attention "
        "layers of a model)"
    )
    calls = []
    for n, bs, causal in ((20, 8, False), (12, 4, True)):
        q, k, v = _attn_inputs(g, (2, n, 4), (2, n, 4), 4, F64)
        leaves = _leaves(q, k, v)
        out = _flash_forward(ctx, cls, leaves, (bs, causal), case)
        expect_tensor(ctx, out, "the output", case, like=q)
        calls.append((q, k, v, leaves, out))
    q, k, v, leaves, out = calls[0]
    do = torch.randn(out.shape, generator=g, dtype=F64)
    want = _reference(q, k, v, False, do)[1]
    try:
        grads = _flash_backward(ctx, cls, out, leaves, do, case)
        for name, got, exp in zip("qkv", grads, want, strict=True):
            what = f"the gradient of {name}"
            ctx.expect_array(got, exp, what=what, case=case)
            if not torch.allclose(got, exp, **TOL[F64]):
                ctx.fail(f"{what} is wrong.", case=case, mistake="wrong_values")
    except CheckFailure as err:
        # Every case before called forward and backward in turn and was right: what goes
        # wrong now comes from the second call.
        found = mistake_id(str(err))
        if found == "code_raised":
            raise naming(err, named("flash_bwd_state_outside_ctx")) from None
        if found not in _SECOND_CALL_SYMPTOMS:
            raise
        what = str(err).split("\n", 1)[0].split(": ", 1)[-1]
        ctx.fail(
            f"{what} It was right when forward and backward were called in turn: here forward "
            "was called a second time before the first call's backward pass.",
            case=case,
            mistake="flash_bwd_state_outside_ctx",
        )


def _forward_keeping(ctx: Context, cls: type, leaves, bs: int, causal: bool, case: str):
    """The learner's forward pass (checked to return a tensor of q's shape) and the bytes
    it created that are still held besides the output, for the backward pass."""
    with watching(PeakMemory()) as mem:
        out = _flash_forward(ctx, cls, leaves, (bs, causal), case, TRACED_LIMIT_SCALE)
        expect_tensor(ctx, out, "the output", case, like=leaves[0])
        return out, mem.current - out.untyped_storage().nbytes()


def _check_flash_memory_and_skipping(ctx: Context, cls: type, g) -> None:
    """Nothing of n_q x n_k kept by the forward pass for the backward pass, no such tensor
    in either pass, future tiles skipped by the backward pass as by the forward, and the
    memory kept by forward and the backward pass's peak growing about linearly with n (n =
    256, then 512)."""
    n, bs, d = WATCH_N, WATCH_BS, 8
    full = 2 * n * n * 4  # bytes of the float32 score matrices of the batch
    peak_backward, kept_by = {}, {}

    def run(q, k, v, causal: bool, case: str) -> list[OpRecorder]:
        leaves = _leaves(q, k, v)
        with watching(OpRecorder()) as rec_f:
            out, kept = _forward_keeping(ctx, cls, leaves, bs, causal, case)
        do = torch.randn(out.shape, generator=g, dtype=F32)
        with watching(OpRecorder()) as rec_b, watching(PeakMemory()) as mem_b:
            grads = _flash_backward(ctx, cls, out, leaves, do, case, TRACED_LIMIT_SCALE)
        peak_backward[causal], kept_by[causal] = mem_b.peak, kept
        expected, want = _reference(q, k, v, causal, do)
        ctx.expect_close(out, expected, what="the output", case=case, **LARGE_TOL)
        for name, got, exp in zip("qkv", grads, want, strict=True):
            ctx.expect_array(got, exp.float(), what=f"the gradient of {name}", case=case)
            ctx.expect_close(got, exp, what=f"the gradient of {name}", case=case, **LARGE_TOL)
        if kept >= full / 2:
            ctx.fail(
                f"after your forward pass returned, {kept / 2**20:.1f} MiB created by it are "
                f"still held for the backward pass besides the output; the 2 score "
                f"matrices of {n} x {n} floats take {full / 2**20:.1f} MiB. Keep only what is "
                "linear in n.",
                case=case,
                mistake="flash_bwd_saves_weights",
            )
        return [rec_f, rec_b]

    _watch(ctx, g, d, run, FLASH_WATCHED)
    # No tensor of n_q x n_k elements is not enough: the backward pass must not hold that
    # many numbers at once in pieces either (autograd's graph through recomputed tiles, a
    # list of tiles). Its peak grows about linearly (x1.1 to x2 when n doubles for correct
    # answers, float64 copies and all queries at once included: linear plus a constant never
    # more than doubles); in pieces, about x4; every tile's (bk, d) contributions kept in
    # lists, n^2 d / block_size numbers, x3. At most x2.5, as notebook 12 asserts at 2048.
    # The same for what forward keeps: something of every tile (a partial output per tile,
    # n^2 d / block_size numbers) stays under the limit above at n = 256 but grows x4.
    n2 = 2 * n
    q, k, v = _attn_inputs(g, (2, n2, d), (2, n2, d), d, F32)
    case = f"q, k, v (2, {n2}, {d}) float32, block_size={bs}, causal=False"

    def expect_linear(what: str, before: float, after: float, why: str, mistake: str) -> None:
        if after / max(before, 1) > 2.5:
            ctx.fail(
                f"{what} grows {after / max(before, 1):.1f} times when n doubles "
                f"({before / 2**10:.0f} KiB at n={n}, {after / 2**10:.0f} KiB at n={n2}, "
                f"block_size={bs}): it keeps something of every tile{why}. It should grow "
                "about linearly (at most 2.5 times).",
                case=case,
                mistake=mistake,
            )

    leaves = _leaves(q, k, v)
    out, kept = _forward_keeping(ctx, cls, leaves, bs, False, case)
    what = "what your forward pass keeps for the backward pass"
    expect_linear(what, kept_by[False], kept, "", "flash_bwd_saves_weights")
    do = torch.randn(out.shape, generator=g, dtype=F32)
    with watching(PeakMemory()) as mem_b:
        _flash_backward(ctx, cls, out, leaves, do, case, TRACED_LIMIT_SCALE)
    why = " at once, a number of values that grows with n^2"
    what = "the peak memory of your backward pass"
    expect_linear(what, peak_backward[False], mem_b.peak, why, "flash_bwd_quadratic_memory")
