"""Attention as a GPU kernel in Triton: notebook 14.

- :func:`triton_softmax`: softmax along the rows of a 2-D tensor, one program per row, any
  width (the row is loaded into a power-of-two block, the tail masked) and any strides;
- :func:`triton_attention`: FlashAttention's forward pass as one Triton kernel. One program
  per block of ``block_m`` queries of one (batch, head); it walks the keys in tiles of
  ``block_n`` with a running maximum and sum in float32, writes the output and each query's
  log-sum-exp ``lse`` (natural logarithm). Causal attention visits only the tiles on or
  before the diagonal; only the tiles that cross it or the end of the keys are masked (the
  loop is split in two);
- :func:`triton_causal_split`: the causal forward pass as notebook 14's third exercise asks
  for it (``triton_attention(..., causal=True)``: its kernel splits the loop);
- :func:`triton_attention_backward`: FlashAttention-2's backward pass (its Algorithm 2) as
  three kernels: ``D = rowsum(dO * O)``; dK and dV, one program per tile of keys looping over
  the tiles of queries; dQ, one program per tile of queries looping over the tiles of keys.
  Each program owns the tile it writes (no atomics); the weights are recomputed from ``lse``;
- :class:`TritonFlashAttention` / :func:`triton_flash_attention`: the autograd function that
  pairs the kernel's forward pass with the backward kernels.

Device follows the inputs: CUDA tensors run the compiled kernel; on a machine without a
CUDA device, importing this module selects Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported), which runs the same kernel on CPU tensors with NumPy.
Triton installs on Linux only (``pip install triton``; WSL on Windows).
"""

from __future__ import annotations

import math

import torch

from .triton_env import use_interpreter_without_gpu

INTERPRETED = use_interpreter_without_gpu()

import triton  # noqa: E402 - the interpreter is chosen above, before triton is imported
import triton.language as tl  # noqa: E402

#: The first Triton whose interpreter runs these kernels (3.1-3.6 fail on a loop bound
#: computed from ``tl.program_id``; 3.1 also on masked loads).
INTERPRETER_FLOOR = (3, 7)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:2] if p.isdigit())


if INTERPRETED and _version(triton.__version__) < INTERPRETER_FLOOR:
    raise ImportError(
        f"Triton {triton.__version__}'s CPU interpreter cannot run notebook 14's kernels; "
        f"it needs triton>={'.'.join(map(str, INTERPRETER_FLOOR))} "
        "(make venv installs it; with pip: pip install -e '.[kernels]' in the course folder; "
        "PyTorch's own Linux wheels may pin an older one: then use a GPU, or PyTorch 2.13+)"
    )

LOG2E = 1.4426950408889634  # 1 / ln 2: exp(x) = exp2(x * LOG2E)


# ----------------------------------------------------------------------------- row softmax
@triton.jit
def _softmax_kernel(X, Y, n_cols, sx_row, sx_col, sy_row, sy_col, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)  # BLOCK >= n_cols, a power of two
    inside = cols < n_cols  # the tail of the block lies past the row
    x = tl.load(X + row * sx_row + cols * sx_col, mask=inside, other=-float("inf"))
    x = x.to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))  # exp(-inf) = 0 in the tail
    y = e / tl.sum(e, axis=0)
    tl.store(Y + row * sy_row + cols * sy_col, y.to(Y.dtype.element_ty), mask=inside)


def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of each row of ``x (rows, n_cols)`` (float16 or float32, any strides), in a
    new tensor of ``x``'s shape and dtype; computed in float32, one program per row."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor (rows, n_cols); got {getattr(x, 'shape', x)}")
    if x.dtype not in (torch.float16, torch.float32, torch.bfloat16):
        raise TypeError(f"x must be float16, bfloat16 or float32; got {x.dtype}")
    rows, n_cols = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows and n_cols:
        block = triton.next_power_of_2(n_cols)
        _softmax_kernel[(rows,)](x, y, n_cols, *x.stride(), *y.stride(), BLOCK=block)
    return y


# ----------------------------------------------------------------------------- attention
@triton.jit
def _attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    K,
    V,
    sk_n,
    sk_d,
    sv_n,
    sv_d,
    offs_m,
    offs_d,
    lo,
    hi,
    n_k,
    offset,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Keys ``lo .. hi`` tile by tile into the running (acc, l_i, m_i), in log2 units.
    ``MASKED``: the tiles may cross the diagonal or the end of the keys."""
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        if MASKED:
            inside = offs_n < n_k
            kt = tl.load(K + offs_n[None, :] * sk_n + offs_d[:, None] * sk_d,
                         mask=inside[None, :], other=0.0)  # fmt: skip
            v = tl.load(V + offs_n[:, None] * sv_n + offs_d[None, :] * sv_d,
                        mask=inside[:, None], other=0.0)  # fmt: skip
        else:
            kt = tl.load(K + offs_n[None, :] * sk_n + offs_d[:, None] * sk_d)
            v = tl.load(V + offs_n[:, None] * sv_n + offs_d[None, :] * sv_d)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2
        if MASKED:
            allowed = inside[None, :]
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + offset)
            s = tl.where(allowed, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row that has seen nothing
        alpha = tl.exp2(m_i - m_use)  # rescales what was summed against the old maximum
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attention_kernel(
    Q, K, V, Out, Lse,
    sq_b, sq_h, sq_m, sq_d,
    sk_b, sk_h, sk_n, sk_d,
    sv_b, sv_h, sv_n, sv_d,
    so_b, so_h, so_m, so_d,
    sl_b, sl_h, sl_m,
    n_heads, n_q, n_k, qk_scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    Q += b * sq_b + h * sq_h
    K += b * sk_b + h * sk_h
    V += b * sv_b + h * sv_h
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * sq_m + offs_d[None, :] * sq_d,
                mask=offs_m[:, None] < n_q, other=0.0)  # fmt: skip
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    offset = n_k - n_q  # query i sees keys j <= i + offset when causal
    if CAUSAL:
        # Keys every query of the block sees: j <= block * BLOCK_M + offset. Whole tiles of
        # them need no mask; the tiles after, up to the last query's diagonal, do; the rest
        # (the future of every query here) are never loaded.
        first_sees = tl.minimum(tl.maximum(block * BLOCK_M + offset + 1, 0), n_k)
        full_end = (first_sees // BLOCK_N) * BLOCK_N
        hi = tl.minimum(tl.maximum((block + 1) * BLOCK_M + offset, 0), n_k)
    else:
        full_end = (n_k // BLOCK_N) * BLOCK_N
        hi = n_k
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, sk_n, sk_d, sv_n, sv_d, offs_m,
                                  offs_d, 0, full_end, n_k, offset, qk_scale, BLOCK_N, False,
                                  CAUSAL, PRECISION)  # fmt: skip
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, sk_n, sk_d, sv_n, sv_d, offs_m,
                                  offs_d, full_end, hi, n_k, offset, qk_scale, BLOCK_N, True,
                                  CAUSAL, PRECISION)  # fmt: skip
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]  # a query that sees no key: 0
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / 1.4426950408889634,
                   -float("inf"))  # fmt: skip
    row_ok = offs_m < n_q
    Out += b * so_b + h * so_h
    tl.store(Out + offs_m[:, None] * so_m + offs_d[None, :] * so_d,
             out.to(Out.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip
    tl.store(Lse + b * sl_b + h * sl_h + offs_m * sl_m, lse, mask=row_ok)


def _require_attention_inputs(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, n, d); got {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ):
        raise TypeError(f"q, k, v must share float16, bfloat16 or float32; got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")  # fmt: skip
    if INTERPRETED and q.dtype == torch.bfloat16:
        # The interpreter's tl.dot returns wrong values for bfloat16 (errors of 1e8 seen).
        raise TypeError("q, k, v in bfloat16 need a GPU: Triton's interpreter computes wrong "
                        "products in bfloat16; use float16 or float32")  # fmt: skip
    B, H, _, d = q.shape
    if k.shape[:2] != (B, H) or v.shape[:2] != (B, H) or k.shape[2] != v.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
            "(B, H, n_q, d), (B, H, n_k, d), (B, H, n_k, d)"
        )
    if k.shape[3] != d or v.shape[3] != d or d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"d must be the same power of two from 16 to 256 in q, k, v; got "
                         f"{q.shape[3]}, {k.shape[3]}, {v.shape[3]}")  # fmt: skip
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def _require_blocks(block_m, block_n) -> None:
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if not isinstance(blk, int) or blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two >= 16; got {blk!r}")


def _attention_results(q: torch.Tensor, k: torch.Tensor):
    """``(out (B, H, n_q, d), lse (B, H, n_q) float32, done)`` for a forward launch: empty
    buffers, or, with ``done``, the whole answer when there is nothing to launch (no query:
    empty; no key: out 0 and lse -inf)."""
    B, H, n_q, d = q.shape
    out = torch.empty(B, H, n_q, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    if B * H * n_q == 0:
        return out, lse, True
    if k.shape[2] == 0:
        return out.zero_(), lse.fill_(-math.inf), True
    return out, lse, False


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_m: int = 16,
    block_n: int = 16,
    *,
    allow_tf32: bool = False,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's forward pass as one Triton kernel.

    Args:
        q: ``(B, H, n_q, d)``; k, v: ``(B, H, n_k, d)``; float16, bfloat16 (compiled only:
            ``TypeError`` in the interpreter) or float32, any strides; ``d`` a power of two
            from 16 to 256.
        causal: query ``i`` sees key ``j <= i + (n_k - n_q)`` (bottom-right alignment, as
            ``torch.nn.attention.bias.causal_lower_right``; PyTorch's ``is_causal`` is
            ``j <= i``: the two agree when ``n_q == n_k``); tiles entirely in its future
            are never loaded; a query that sees no key gets output 0 and ``lse = -inf``.
        block_m, block_n: queries per program and keys per tile (powers of two, >= 16).
        allow_tf32: float32 inputs on a GPU: let ``tl.dot`` use TF32 (faster, about 1e-3
            relative error) instead of full float32.
        num_warps, num_stages: Triton's launch options (compiled kernels; None: its default).

    Returns:
        ``(out (B, H, n_q, d) in q's dtype, lse (B, H, n_q) float32)`` with
        ``lse = log(sum_j exp(q_i . k_j / sqrt(d)))`` over the keys query ``i`` sees.
    """
    _require_attention_inputs(q, k, v)
    _require_blocks(block_m, block_n)
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    out, lse, done = _attention_results(q, k)
    if done:
        return out, lse
    precision = "tf32" if allow_tf32 and q.dtype == torch.float32 else "ieee"
    grid = (triton.cdiv(n_q, block_m), B * H)
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v}
    _attention_kernel[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        H, n_q, n_k, LOG2E / math.sqrt(d),
        D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), PRECISION=precision,
        **launch,
    )  # fmt: skip
    return out, lse


def triton_causal_split(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = 16, block_n: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal FlashAttention's forward pass with its loop split in two: per block of queries,
    the whole tiles of keys that every query of the block sees, without a mask, then the
    tiles that cross the diagonal or the end of the keys, masked; the future never visited.

    Same arguments and results as :func:`triton_attention` with ``causal=True`` (query ``i``
    sees key ``j <= i + n_k - n_q``), whose kernel splits its loop this way."""
    return triton_attention(q, k, v, True, block_m, block_n)


# ----------------------------------------------------------------------------- backward
@triton.jit
def _bwd_delta_kernel(
    Out, DO, Delta,
    so_b, so_h, so_m, so_d,
    sdo_b, sdo_h, sdo_m, sdo_d,
    sd_b, sd_h, sd_m,
    n_heads, n_q,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """D_i = rowsum(dO_i * O_i) in float32, one program per block of queries."""
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m < n_q
    o = tl.load(Out + b * so_b + h * so_h + offs_m[:, None] * so_m + offs_d[None, :] * so_d,
                mask=rows[:, None], other=0.0)  # fmt: skip
    do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_m + offs_d[None, :] * sdo_d,
                 mask=rows[:, None], other=0.0)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + b * sd_b + h * sd_h + offs_m * sd_m, delta, mask=rows)


@triton.jit
def _bwd_weights(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL: tl.constexpr,
                 PRECISION: tl.constexpr):  # fmt: skip
    """The tile's weights recomputed from the saved log-sum-exp: P = exp(S - lse), 0 where a
    query may not see a key (and past n_q or n_k)."""
    s = tl.dot(q, kt, input_precision=PRECISION) * scale
    allowed = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    if CAUSAL:
        allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + offset)
    # lse = -inf (a query that sees no key) has every weight masked: exp(-inf + inf) is NaN
    return tl.where(allowed, tl.exp(s - tl.where(allowed, lse[:, None], 0.0)), 0.0)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV,
    sq_b, sq_h, sq_m, sq_d,
    sk_b, sk_h, sk_n, sk_d,
    sv_b, sv_h, sv_n, sv_d,
    sdo_b, sdo_h, sdo_m, sdo_d,
    sl_b, sl_h, sl_m,
    sd_b, sd_h, sd_m,
    sdk_b, sdk_h, sdk_n, sdk_d,
    sdv_b, sdv_h, sdv_n, sdv_d,
    n_heads, n_q, n_k, scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per tile of BLOCK_N keys: dV = sum_i P^T dO, dK = sum_i dS^T Q * scale over
    the tiles of queries that see some key of the tile."""
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    Q += b * sq_b + h * sq_h
    DO += b * sdo_b + h * sdo_h
    Lse += b * sl_b + h * sl_h
    Delta += b * sd_b + h * sd_h
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    cols = offs_n < n_k
    kt = tl.load(K + b * sk_b + h * sk_h + offs_n[None, :] * sk_n + offs_d[:, None] * sk_d,
                 mask=cols[None, :], other=0.0)  # fmt: skip
    vt = tl.load(V + b * sv_b + h * sv_h + offs_n[None, :] * sv_n + offs_d[:, None] * sv_d,
                 mask=cols[None, :], other=0.0)  # fmt: skip
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    offset = n_k - n_q  # query i sees key j <= i + offset when causal
    lo = 0
    if CAUSAL:
        # the first query that sees the tile's first key: i = block * BLOCK_N - offset
        lo = (tl.maximum(block * BLOCK_N - offset, 0) // BLOCK_M) * BLOCK_M
    for start in range(lo, n_q, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        rows = offs_m < n_q
        q = tl.load(Q + offs_m[:, None] * sq_m + offs_d[None, :] * sq_d, mask=rows[:, None],
                    other=0.0)  # fmt: skip
        do = tl.load(DO + offs_m[:, None] * sdo_m + offs_d[None, :] * sdo_d,
                     mask=rows[:, None], other=0.0)  # fmt: skip
        lse = tl.load(Lse + offs_m * sl_m, mask=rows, other=0.0)
        delta = tl.load(Delta + offs_m * sd_m, mask=rows, other=0.0)
        p = _bwd_weights(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL, PRECISION)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, vt.to(do.dtype), input_precision=PRECISION)  # dO V^T
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    dk = dk * scale
    tl.store(DK + b * sdk_b + h * sdk_h + offs_n[:, None] * sdk_n + offs_d[None, :] * sdk_d,
             dk.to(DK.dtype.element_ty), mask=cols[:, None])  # fmt: skip
    tl.store(DV + b * sdv_b + h * sdv_h + offs_n[:, None] * sdv_n + offs_d[None, :] * sdv_d,
             dv.to(DV.dtype.element_ty), mask=cols[:, None])  # fmt: skip


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ,
    sq_b, sq_h, sq_m, sq_d,
    sk_b, sk_h, sk_n, sk_d,
    sv_b, sv_h, sv_n, sv_d,
    sdo_b, sdo_h, sdo_m, sdo_d,
    sl_b, sl_h, sl_m,
    sd_b, sd_h, sd_m,
    sdq_b, sdq_h, sdq_m, sdq_d,
    n_heads, n_q, n_k, scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per tile of BLOCK_M queries: dQ = sum_j dS K * scale over the tiles of keys
    up to the block's last diagonal."""
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    K += b * sk_b + h * sk_h
    V += b * sv_b + h * sv_h
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m < n_q
    q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + offs_d[None, :] * sq_d,
                mask=rows[:, None], other=0.0)  # fmt: skip
    do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_m + offs_d[None, :] * sdo_d,
                 mask=rows[:, None], other=0.0)  # fmt: skip
    lse = tl.load(Lse + b * sl_b + h * sl_h + offs_m * sl_m, mask=rows, other=0.0)
    delta = tl.load(Delta + b * sd_b + h * sd_h + offs_m * sd_m, mask=rows, other=0.0)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    offset = n_k - n_q
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(tl.maximum((block + 1) * BLOCK_M + offset, 0), n_k)
    for start in range(0, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        cols = offs_n < n_k
        kt = tl.load(K + offs_n[None, :] * sk_n + offs_d[:, None] * sk_d, mask=cols[None, :],
                     other=0.0)  # fmt: skip
        vt = tl.load(V + offs_n[None, :] * sv_n + offs_d[:, None] * sv_d, mask=cols[None, :],
                     other=0.0)  # fmt: skip
        p = _bwd_weights(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL, PRECISION)
        dp = tl.dot(do, vt.to(do.dtype), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
    dq = dq * scale
    tl.store(DQ + b * sdq_b + h * sdq_h + offs_m[:, None] * sdq_m + offs_d[None, :] * sdq_d,
             dq.to(DQ.dtype.element_ty), mask=rows[:, None])  # fmt: skip


def triton_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_m: int = 16,
    block_n: int = 16,
    *,
    allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward pass as Triton kernels: ``(dq, dk, dv)``.

    Args:
        q, k, v, causal: as :func:`triton_attention` (any strides; float16, or float32;
            bfloat16 on a GPU only); ``out (B, H, n_q, d)`` and ``lse (B, H, n_q)``
            float32 its results (``lse = -inf`` where a query sees no key: its gradients are
            0); ``grad_out``: the gradient of the loss with respect to ``out``, ``out``'s
            shape, any strides.
        block_m, block_n: queries and keys per tile (powers of two, >= 16).

    Three launches: ``D = rowsum(grad_out * out)`` (float32); dK and dV, one program per
    tile of keys, looping over the tiles of queries that see some of its keys (causal: the
    ones from the first query that sees its first key); dQ, one program per tile of
    queries, looping over the tiles of keys up to the block's last diagonal. Each program
    writes only its own tile (no atomics); the weights are recomputed, ``P = exp(S - lse)``.

    Returns:
        ``(dq, dk, dv)`` in the inputs' dtype, shaped as q, k, v.
    """
    _require_attention_inputs(q, k, v)
    _require_blocks(block_m, block_n)
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    for name, t, shape in (("out", out, q.shape), ("grad_out", grad_out, q.shape),
                           ("lse", lse, q.shape[:3])):  # fmt: skip
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}; got "
                             f"{tuple(getattr(t, 'shape', ()))}")  # fmt: skip
    dq = torch.zeros(B, H, n_q, d, dtype=q.dtype, device=q.device)
    dk = torch.zeros(B, H, n_k, d, dtype=k.dtype, device=q.device)
    dv = torch.zeros(B, H, n_k, d, dtype=v.dtype, device=q.device)
    if B * H * n_q == 0 or n_k == 0:
        return dq, dk, dv
    lse = lse.float()
    delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    precision = "tf32" if allow_tf32 and q.dtype == torch.float32 else "ieee"
    _bwd_delta_kernel[(triton.cdiv(n_q, block_m), B * H)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), *delta.stride(),
        H, n_q, D=d, BLOCK_M=block_m,
    )  # fmt: skip
    common = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *lse.stride(),
              *delta.stride())  # fmt: skip
    meta = dict(D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), PRECISION=precision)
    _bwd_dkdv_kernel[(triton.cdiv(n_k, block_n), B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, *common, *dk.stride(), *dv.stride(),
        H, n_q, n_k, 1.0 / math.sqrt(d), **meta,
    )  # fmt: skip
    _bwd_dq_kernel[(triton.cdiv(n_q, block_m), B * H)](
        q, k, v, grad_out, lse, delta, dq, *common, *dq.stride(),
        H, n_q, n_k, 1.0 / math.sqrt(d), **meta,
    )  # fmt: skip
    return dq, dk, dv


class TritonFlashAttention(torch.autograd.Function):
    """``TritonFlashAttention.apply(q, k, v, causal=False)``: the output of
    :func:`triton_attention` (saved with its ``lse`` for the backward pass) and the backward
    kernels of :func:`triton_attention_backward`, which recompute each tile's weights
    ``P = exp(S - lse)``."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = triton_attention(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = bool(causal)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = triton_attention_backward(q, k, v, out, lse, grad_out, ctx.causal)
        return dq, dk, dv, None


def triton_flash_attention(q, k, v, causal: bool = False) -> torch.Tensor:
    """Differentiable attention with :func:`triton_attention`'s forward pass and
    :func:`triton_attention_backward`'s kernels: ``out``."""
    _require_attention_inputs(q, k, v)
    return TritonFlashAttention.apply(q, k, v, causal)
