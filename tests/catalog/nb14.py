"""Catalog for notebook 14: triton_softmax, triton_attention, triton_causal_split,
triton_flash_attention.

The kernels are written once each, with a ``BUG`` constexpr that switches on one learner's
mistake at a time (Triton compiles each value of a constexpr as its own kernel, so every
entry below is the kernel a learner with that mistake would have written). Importing
attention_ref.triton_attention first selects the interpreter when there is no GPU.
"""

import math

import torch

# triton as the reference module imports it: after choosing the interpreter when no GPU is
# present (a kernel defined before that would not run in the interpreter).
from attention_ref.triton_attention import tl, triton

from . import alternative, mistake

LOG2E = 1.4426950408889634

# ----------------------------------------------------------------------------- triton_softmax


@triton.jit
def _softmax_rows(X, Y, n_cols, sxr, sxc, syr, syc, BLOCK: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    if BUG == 1:  # the tail loaded as 0
        x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    elif BUG == 4:  # Triton's tutorial 02: the columns assumed adjacent (unit stride)
        x = tl.load(X + row * sxr + cols, mask=inside, other=-float("inf")).to(tl.float32)
    else:
        x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=-float("inf")).to(tl.float32)
    if BUG == 2:  # no maximum subtracted
        e = tl.exp(x)
        e = tl.where(inside, e, 0.0)
    elif BUG == 3:  # exp2 with log2(e) folded in: correct
        e = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)
    else:
        e = tl.exp(x - tl.max(x, axis=0))
    if BUG == 5:  # the whole block stored: past the end of the row
        tl.store(Y + row * syr + cols * syc, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty))
    else:
        tl.store(
            Y + row * syr + cols * syc, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty),
            mask=inside,
        )  # fmt: skip


def _softmax(x, bug=0, contiguous_strides=False):
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rows, n = x.shape
    sx = (n, 1) if contiguous_strides else x.stride()
    _softmax_rows[(rows,)](x, y, n, *sx, *y.stride(), BLOCK=triton.next_power_of_2(n), BUG=bug)
    return y


@mistake("triton_softmax", id="triton_tail_loaded_as_zero")
def softmax_tail_zero(x):
    return _softmax(x, bug=1)


@mistake("triton_softmax", id="triton_softmax_no_max")
def softmax_no_max(x):
    return _softmax(x, bug=2)


@mistake("triton_softmax", id="triton_unit_column_stride")
def softmax_unit_column_stride(x):
    """Triton's tutorial 02: X + row * stride + cols, the columns assumed adjacent."""
    return _softmax(x, bug=4)


@mistake("triton_softmax", id="triton_store_out_of_bounds")
def softmax_store_unmasked(x):
    """The whole power-of-two block stored: the tail writes past the row."""
    return _softmax(x, bug=5)


@mistake("triton_softmax", id="triton_strides_contiguous")
def softmax_row_stride_is_width(x):
    return _softmax(x, contiguous_strides=True)


@alternative("triton_softmax")
def softmax_exp2(x):
    return _softmax(x, bug=3)


@alternative("triton_softmax")
def softmax_of_a_contiguous_copy(x):
    """Copies the input to a contiguous tensor first: correct (one copy more)."""
    return _softmax(x.contiguous(), contiguous_strides=True)


# ----------------------------------------------------------------------------- triton_attention
#: BUG: 1 acc not rescaled, 2 l not rescaled, 3 max not carried, 4 tail not masked, 6 causal
#: loop ends a block early, 7 diagonal tile unmasked, 8 strict mask, 9 mask ignores n_k - n_q,
#: 10 exp2 without log2(e), 11 lse in base 2, 12 lse = max only, 13 no tile skipped,
#: 14 tl.dot on float32 tiles (float16 inputs upcast), 15 causal loop one key short
#: (an end of (start_m + 1) * BM + n_k - n_q - 1), 16 every key tile visited (the future's
#: loads masked off), 17 q loaded without its row mask, 18 out stored without its row mask,
#: 19 lse stored without its row mask, 21 Triton's tutorial 06's finite mask (-1.0e6),
#: 22 weights against the tile's maximum, 23 the scale applied twice, 24 exp with the scores
#: in log2 units, 25 the causal loop's end at least one tile (a block whose queries see no
#: key loads the first tile), 20 exp2 with log2(e) (correct).
@triton.jit
def _attn(
    Q, K, V, O_, L_,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, slb, slh, slm,
    H, n_q, n_k, scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    BUG: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    if BUG == 17:
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd)
    else:
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                    mask=offs_m[:, None] < n_q, other=0.0)  # fmt: skip
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    offset = n_k - n_q
    hi = n_k
    if CAUSAL:
        if BUG == 6:
            hi = tl.minimum(tl.maximum(start_m * BM + offset, 0), n_k)
        elif BUG == 15:
            hi = tl.minimum(tl.maximum((start_m + 1) * BM + offset - 1, 0), n_k)
        elif BUG == 25:  # "every block visits a tile": one in the future of all its queries
            hi = tl.minimum(tl.maximum((start_m + 1) * BM + offset, BN), n_k)
        elif BUG != 13 and BUG != 16:
            hi = tl.minimum(tl.maximum((start_m + 1) * BM + offset, 0), n_k)
    end = n_k
    if BUG == 16 and CAUSAL:  # loads stop at the diagonal, the loop does not
        end = tl.minimum(tl.maximum((start_m + 1) * BM + offset, 0), n_k)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        kt = tl.load(K + b * skb + h * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
                     mask=offs_n[None, :] < end, other=0.0)  # fmt: skip
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
                    mask=offs_n[:, None] < end, other=0.0)  # fmt: skip
        if BUG == 14:  # float32 tiles: a TF32 product on a GPU
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32)) * scale
        elif BUG == 23:  # q scaled in the launcher, and the scores scaled again
            s = tl.dot(q, kt) * scale * scale
        else:
            s = tl.dot(q, kt) * scale
        if BUG == 11 or BUG == 20 or BUG == 24:
            s = s * 1.4426950408889634
        if BUG == 21:  # Triton's tutorial 06: a finite mask
            s = tl.where(offs_n[None, :] < n_k, s, -1.0e6)
            if CAUSAL:
                s = tl.where(offs_n[None, :] <= offs_m[:, None] + offset, s, -1.0e6)
        elif BUG != 4:
            s = tl.where(offs_n[None, :] < n_k, s, -float("inf"))
        if CAUSAL and BUG != 21:
            if BUG == 8:
                s = tl.where(offs_n[None, :] < offs_m[:, None] + offset, s, -float("inf"))
            elif BUG == 9:
                s = tl.where(offs_n[None, :] <= offs_m[:, None], s, -float("inf"))
            elif BUG != 7:
                s = tl.where(offs_n[None, :] <= offs_m[:, None] + offset, s, -float("inf"))
        if BUG == 3:  # noqa: SIM108 - a constexpr branch, compiled away
            m_new = tl.max(s, axis=1)
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        if BUG == 10 or BUG == 11 or BUG == 20:
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
        elif BUG == 22:  # the weights against the tile's maximum, alpha against the running one
            alpha = tl.exp(m_i - m_safe)
            m_tile = tl.max(s, axis=1)
            p = tl.exp(s - tl.where(m_tile == -float("inf"), 0.0, m_tile)[:, None])
        else:
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
        if BUG == 3:  # noqa: SIM108 - a constexpr branch, compiled away
            alpha = tl.full([BM], 1.0, tl.float32)
        if BUG == 2:  # noqa: SIM108 - a constexpr branch
            l_i = l_i + tl.sum(p, axis=1)
        else:
            l_i = l_i * alpha + tl.sum(p, axis=1)
        if BUG == 1:
            acc = acc + tl.dot(p.to(v.dtype), v)
        elif BUG == 14:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    m_fin = tl.where(seen, m_i, 0.0)
    if BUG == 20 or BUG == 24:
        lse = (m_fin + tl.log2(l_safe)) / 1.4426950408889634
    elif BUG == 11:
        lse = m_fin + tl.log2(l_safe)
    elif BUG == 12:
        lse = m_fin
    else:
        lse = m_fin + tl.log(l_safe)
    lse = tl.where(seen, lse, -float("inf"))
    rows = offs_m < n_q
    if BUG == 18:
        tl.store(O_ + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                 (acc / l_safe[:, None]).to(O_.dtype.element_ty))  # fmt: skip
    else:
        tl.store(O_ + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                 (acc / l_safe[:, None]).to(O_.dtype.element_ty), mask=rows[:, None])  # fmt: skip
    if BUG == 19:
        tl.store(L_ + b * slb + h * slh + offs_m * slm, lse)
    else:
        tl.store(L_ + b * slb + h * slh + offs_m * slm, lse, mask=rows)


def _contiguous_strides(t):
    B, H, n, d = t.shape
    return (H * n * d, n * d, d, 1)


def _attention(
    q, k, v, causal, bm, bn, bug=0, contiguous_strides=False, v_strides_of_k=False,
    heads_one_axis=False,
):  # fmt: skip
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, n_q, device=q.device, dtype=torch.float32)
    strides = [_contiguous_strides(t) if contiguous_strides else t.stride() for t in (q, k, v)]
    if v_strides_of_k:
        strides[2] = strides[1]
    if heads_one_axis:  # b * (H * stride_h) + h * stride_h = bh * stride_h
        strides = [(H * s[1], *s[1:]) for s in strides]
    grid = (triton.cdiv(n_q, bm), B * H)
    _attn[grid](
        q, k, v, out, lse, *strides[0], *strides[1], *strides[2], *out.stride(), *lse.stride(),
        H, n_q, n_k, 1 / math.sqrt(d), D=d, BM=bm, BN=bn, CAUSAL=causal, BUG=bug,
    )  # fmt: skip
    return out, lse


def triton_attention(q, k, v, causal=False, block_m=16, block_n=16):
    """The catalog's correct kernel (what triton_flash_attention's entries call)."""
    return _attention(q, k, v, causal, block_m, block_n)


for _bug, _id in [
    (1, "flash_accumulator_rescaled_when"),
    (2, "flash_running_sum_l"),
    (3, "triton_max_not_carried"),
    (4, "triton_tail_loaded_as_zero"),
    (6, "triton_causal_tile_bound"),
    (7, "triton_diagonal_tile_unmasked"),
    (8, "flash_causal_mask_strict"),
    (9, "triton_causal_offset"),
    (10, "triton_exp2_without_log2e"),
    (11, "triton_lse_base2"),
    (12, "triton_lse_wrong"),
    (13, "triton_future_tiles_loaded"),
    (14, "triton_dot_upcast"),
    (15, "triton_causal_end_short"),
    (16, "triton_future_tiles_computed"),
    (17, "triton_load_out_of_bounds"),
    (18, "triton_store_out_of_bounds"),
    (19, "triton_store_out_of_bounds"),
    (21, "triton_finite_mask"),
    (22, "triton_weights_tile_max"),
    (23, "triton_scale_twice"),
    (24, "triton_exp_of_log2_scores"),
    (25, "triton_future_tiles_loaded"),
]:

    def _entry(q, k, v, causal=False, block_m=16, block_n=16, _bug=_bug):
        return _attention(q, k, v, causal, block_m, block_n, bug=_bug)

    _entry.__name__ = f"attention_bug_{_id}" + {19: "_lse", 25: "_no_key"}.get(_bug, "")
    mistake("triton_attention", id=_id)(_entry)


@mistake("triton_attention", id="triton_strides_contiguous")
def attention_strides_from_shape(q, k, v, causal=False, block_m=16, block_n=16):
    return _attention(q, k, v, causal, block_m, block_n, contiguous_strides=True)


@mistake("triton_attention", id="triton_v_strides_of_k")
def attention_v_with_k_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """v addressed with k's strides (one set of strides passed for both)."""
    return _attention(q, k, v, causal, block_m, block_n, v_strides_of_k=True)


@mistake("triton_attention", id="triton_batch_head_one_axis")
def attention_batch_and_heads_one_axis(q, k, v, causal=False, block_m=16, block_n=16):
    """Triton's early tutorial 06: each (batch, head) at bh * stride_h, right only when
    stride_b = H * stride_h (a contiguous tensor)."""
    return _attention(q, k, v, causal, block_m, block_n, heads_one_axis=True)


@mistake("triton_attention", id="triton_score_matrix_allocated")
def attention_scores_buffer(q, k, v, causal=False, block_m=16, block_n=16):
    scratch = torch.zeros(*q.shape[:3], k.shape[2], device=q.device)  # "for debugging"
    out = _attention(q, k, v, causal, block_m, block_n)
    del scratch
    return out


@alternative("triton_attention")
def attention_single_loop(q, k, v, causal=False, block_m=16, block_n=16):
    """One loop over the tiles up to the diagonal, every tile masked (natural exp)."""
    return _attention(q, k, v, causal, block_m, block_n)


@alternative("triton_attention")
def attention_exp2_contiguous_copies(q, k, v, causal=False, block_m=16, block_n=16):
    """exp2 with log2(e) folded into the scale; inputs copied to contiguous tensors first."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    return _attention(q, k, v, causal, block_m, block_n, bug=20, contiguous_strides=True)


# ----------------------------------------------------------------------------- triton_causal_split
@triton.jit
def _split_stage(
    acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d, lo, hi, split, n_k, offset,
    scale, BM: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Keys lo .. hi tile by tile. MASKED: 1 every tile masked, 0 none, 2 each tile asks at
    run time whether it starts at or after ``split`` (then it needs the mask), 3 masked as
    1 with three tl.where per tile (the k tile's columns past n_k zeroed, a causal bias
    built before the score product, the keys past n_k after it), 4 masked as 1 through a
    tl.where on the scores flattened to one dimension."""
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        kt = tl.load(K + offs_n[None, :] * skn + offs_d[:, None] * skd,
                     mask=offs_n[None, :] < n_k, other=0.0)  # fmt: skip
        v = tl.load(V + offs_n[:, None] * svn + offs_d[None, :] * svd,
                    mask=offs_n[:, None] < n_k, other=0.0)  # fmt: skip
        if MASKED == 3:
            kt = tl.where(offs_n[None, :] < n_k, kt, 0.0)
            bias = tl.where(offs_n[None, :] <= offs_m[:, None] + offset, 0.0, -float("inf"))
        s = tl.dot(q, kt) * scale
        if MASKED == 3:
            s = tl.where(offs_n[None, :] < n_k, s + bias, -float("inf"))
        if MASKED == 4:
            allowed = (offs_n[None, :] < n_k) & (offs_n[None, :] <= offs_m[:, None] + offset)
            flat = tl.where(tl.reshape(allowed, (BM * BN,)), tl.reshape(s, (BM * BN,)),
                            -float("inf"))  # fmt: skip
            s = tl.reshape(flat, (BM, BN))
        if MASKED == 1:
            allowed = (offs_n[None, :] < n_k) & (offs_n[None, :] <= offs_m[:, None] + offset)
            s = tl.where(allowed, s, -float("inf"))
        elif MASKED == 2:  # noqa: SIM102 - a constexpr branch holding a run-time one
            if start_n >= split:
                allowed = (offs_n[None, :] < n_k) & (offs_n[None, :] <= offs_m[:, None] + offset)
                s = tl.where(allowed, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


#: BUG: 1 no split (every tile masked, exercise 2's loop), 2 the split a tile early, 3 the
#: split a tile late, 4 both bounds without n_k - n_q (Triton's tutorial 06's start_m *
#: BLOCK_M), 5 the masked stage runs on to n_k, 6 the masked stage's end without n_k - n_q,
#: 7 the split from the first query's last key, not one past it (a tile early where that
#: key ends a tile), 8 no split, every tile masked through a flattened tl.where, 9 v read
#: with k's strides;
#: correct: 10 one loop whose tiles test at run time whether they need the mask, 11 the
#: masked tiles first, then the full ones, 12 the masked stage with three tl.where per tile
#: (k's columns, a causal bias before the product, the keys past n_k after it).
@triton.jit
def _split(
    Q, K, V, O_, L_,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, slb, slh, slm,
    H, n_q, n_k, scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=offs_m[:, None] < n_q, other=0.0)  # fmt: skip
    K += b * skb + h * skh
    V += b * svb + h * svh
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    offset = n_k - n_q
    MASK: tl.constexpr = 3 if BUG == 12 else (4 if BUG == 8 else 1)
    if BUG == 9:  # v addressed with k's strides
        svn, svd = skn, skd
    if BUG == 4:
        lo = tl.minimum(tl.maximum(start_m * BM + 1, 0), n_k) // BN * BN
    elif BUG == 7:  # the first query's last key, not one past it
        lo = tl.minimum(tl.maximum(start_m * BM + offset, 0), n_k) // BN * BN
    else:
        lo = tl.minimum(tl.maximum(start_m * BM + offset + 1, 0), n_k) // BN * BN
    if BUG == 2:
        lo = tl.maximum(lo - BN, 0)
    elif BUG == 3:
        lo = lo + BN
    elif BUG == 1 or BUG == 8:
        lo = 0
    if BUG == 4 or BUG == 6:
        hi = tl.minimum((start_m + 1) * BM, n_k)
    elif BUG == 5:
        hi = n_k
    else:
        hi = tl.minimum(tl.maximum((start_m + 1) * BM + offset, 0), n_k)
    if BUG == 10:
        acc, l_i, m_i = _split_stage(acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d,
                                     0, hi, lo, n_k, offset, scale, BM, BN, 2)  # fmt: skip
    elif BUG == 11:
        acc, l_i, m_i = _split_stage(acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d,
                                     lo, hi, lo, n_k, offset, scale, BM, BN, MASK)  # fmt: skip
        acc, l_i, m_i = _split_stage(acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d,
                                     0, lo, lo, n_k, offset, scale, BM, BN, 0)  # fmt: skip
    else:
        acc, l_i, m_i = _split_stage(acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d,
                                     0, lo, lo, n_k, offset, scale, BM, BN, 0)  # fmt: skip
        acc, l_i, m_i = _split_stage(acc, l_i, m_i, q, K, V, skn, skd, svn, svd, offs_m, offs_d,
                                     lo, hi, lo, n_k, offset, scale, BM, BN, MASK)  # fmt: skip
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, tl.where(seen, m_i, 0.0) + tl.log(l_safe), -float("inf"))
    rows = offs_m < n_q
    tl.store(O_ + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
             (acc / l_safe[:, None]).to(O_.dtype.element_ty), mask=rows[:, None])  # fmt: skip
    tl.store(L_ + b * slb + h * slh + offs_m * slm, lse, mask=rows)


def _causal_split(q, k, v, bm, bn, bug=0):
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, n_q, device=q.device, dtype=torch.float32)
    _split[(triton.cdiv(n_q, bm), B * H)](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        H, n_q, n_k, 1 / math.sqrt(d), D=d, BM=bm, BN=bn, BUG=bug,
    )  # fmt: skip
    return out, lse


for _bug, _id, _name in [
    (1, "triton_split_missing", "every_tile_masked"),
    (2, "triton_split_full_tile_masked", "split_a_tile_early"),
    (3, "triton_split_diagonal_unmasked", "split_a_tile_late"),
    (4, "triton_split_without_offset", "tutorial_06_bounds"),
    (5, "triton_future_tiles_loaded", "masked_stage_to_the_end"),
    (6, "triton_split_without_offset", "masked_stage_end_without_offset"),
    (7, "triton_split_full_tile_masked", "split_one_key_short"),
    (8, "triton_split_missing", "every_tile_masked_flattened"),
    (9, "triton_v_strides_of_k", "v_with_k_strides"),
]:

    def _split_entry(q, k, v, block_m=16, block_n=16, _bug=_bug):
        return _causal_split(q, k, v, block_m, block_n, bug=_bug)

    _split_entry.__name__ = f"causal_split_{_name}"
    mistake("triton_causal_split", id=_id)(_split_entry)


@mistake("triton_causal_split", id="triton_split_missing")
def causal_split_exercise_2s_kernel(q, k, v, block_m=16, block_n=16):
    """Exercise 2's one masked loop, called with causal=True."""
    return _attention(q, k, v, True, block_m, block_n)


@alternative("triton_causal_split")
def causal_split_two_loops(q, k, v, block_m=16, block_n=16):
    """The full tiles, then the diagonal's (loads masked to n_k in both stages)."""
    return _causal_split(q, k, v, block_m, block_n)


@alternative("triton_causal_split")
def causal_split_one_loop_asking(q, k, v, block_m=16, block_n=16):
    """One loop; each tile tests at run time whether it starts at the split."""
    return _causal_split(q, k, v, block_m, block_n, bug=10)


@alternative("triton_causal_split")
def causal_split_diagonal_first(q, k, v, block_m=16, block_n=16):
    """The masked tiles first, then the full ones (a softmax does not mind the order)."""
    return _causal_split(q, k, v, block_m, block_n, bug=11)


# ----------------------------------------------------------------------------- autograd function
def _backward(
    q, k, v, out, lse, do, causal, block=16, delta=True, guard=True, shift=True, upcast=True
):
    """Notebook 12's backward pass (tiles of ``block``), from the kernel's lse (B, H, n_q);
    ``guard``: a query that sees no key (lse = -inf) gets weights 0, not exp(-inf + inf);
    ``shift=False``: notebook 12's causal loop end and mask as they were (j <= i);
    ``upcast=False``: in the inputs' dtype, as notebook 12's (float16 with lse's float32)."""
    if upcast:
        q, k, v, out, do = (t.float() for t in (q, k, v, out, do))
    lse = lse[..., None]
    if guard:
        lse = torch.where(torch.isfinite(lse), lse, math.inf)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    D = (do * out).sum(-1, keepdim=True) if delta else torch.zeros_like(lse)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, n_q, block):
        i1 = min(i0 + block, n_q)
        offset = n_k - n_q if shift else 0
        for j0 in range(0, min(n_k, i1 + offset) if causal else n_k, block):
            j1 = min(j0 + block, n_k)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT * scale
            if causal:
                rows = torch.arange(i0, i1, device=q.device)[:, None] + offset
                s = s.masked_fill(torch.arange(j0, j1, device=q.device) > rows, -math.inf)
            p = torch.exp(s - lse[..., i0:i1, :])
            dv[..., j0:j1, :] += p.mT @ do[..., i0:i1, :]
            ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].mT - D[..., i0:i1, :])
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :] * scale
            dk[..., j0:j1, :] += ds.mT @ q[..., i0:i1, :] * scale
    return dq, dk, dv


class TritonFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = triton_attention(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, do, ctx.causal)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


alternative("triton_flash_attention")(TritonFlashAttention)


@mistake("triton_flash_attention", id="nan_or_inf")
class TritonFlashUnguardedLse(TritonFlashAttention):
    """Notebook 12's backward pass as it was: causal with n_q > n_k, a query that sees no key
    has lse = -inf and its weights exp(-inf - (-inf)) are NaN."""

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, do, ctx.causal, guard=False)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


@alternative("triton_flash_attention")
class TritonAttentionWideTiles(torch.autograd.Function):
    """Saves lse as (B, H, n_q, 1) and recomputes in tiles of 64."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = triton_attention(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse.unsqueeze(-1))
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _backward(q, k, v, out, lse[..., 0], do, ctx.causal, block=64)
        return (*(g.to(q.dtype) for g in grads), None)


@mistake("triton_flash_attention", id="flash_bwd_causal_mask")
class TritonAttentionBackwardNotCausal(TritonFlashAttention):
    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, out, lse, do, False), None)


@mistake("triton_flash_attention", id="triton_bwd_causal_offset")
class TritonAttentionNotebook12Mask(TritonFlashAttention):
    """Notebook 12's backward pass copied as it was: its loop end min(n_k, i1) and its mask
    j <= i, written for n_q = n_k."""

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, out, lse, do, ctx.causal, shift=False), None)


@mistake("triton_flash_attention", id="triton_bwd_float16_mixed")
class TritonAttentionNotUpcast(TritonFlashAttention):
    """Notebook 12's backward pass copied without upcasting: with float16 inputs the weights
    exp(s - lse) are float32 (the kernel's lse is) and p.mT @ do multiplies them by float16."""

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, do, ctx.causal, upcast=False)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


@alternative("triton_flash_attention")
class TritonAttentionFloat16Throughout(TritonFlashAttention):
    """The backward pass in the inputs' dtype throughout: lse cast down to q's dtype (float16
    weights, float16 accumulators), within float16's tolerance."""

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse.to(q.dtype), do, ctx.causal, upcast=False)
        return dq, dk, dv, None


@mistake("triton_flash_attention", id="flash_bwd_no_delta")
class TritonAttentionNoDelta(TritonFlashAttention):
    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, out, lse, do, ctx.causal, delta=False), None)


@mistake("triton_flash_attention", id="flash_bwd_gradient_count")
class TritonAttentionThreeGradients(TritonFlashAttention):
    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        return _backward(q, k, v, out, lse, do, ctx.causal)


@mistake("triton_flash_attention", id="wrong_type")
class TritonAttentionReturnsLse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = triton_attention(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, out, lse, do, ctx.causal), None)


@mistake("triton_flash_attention", id="reference_used")
class TritonAttentionNotebook12Backward(TritonFlashAttention):
    """The backward pass borrowed from notebook 12's reference (the package keeps it while
    notebook 14 is graded): forbidden there, so the tripwire names it."""

    @staticmethod
    def backward(ctx, do):
        from attention_ref.flash import _flash_backward

        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(q, k, v, out, lse[..., None], do, 16, ctx.causal, 16)
        return dq, dk, dv, None


@alternative("triton_causal_split")
def causal_split_three_wheres_per_tile(q, k, v, block_m=16, block_n=16):
    """The diagonal's tiles masked three times each: k's columns past n_k zeroed, a causal
    bias built before the score product, the keys past n_k after it (one tile each)."""
    return _causal_split(q, k, v, block_m, block_n, bug=12)


# ------------------------------------------------------------------- triton_attention_backward
@triton.jit
def _bwd_pre(O_, DO, Dl, sob, soh, som, sod, sgb, sgh, sgm, sgd, n_heads, n_q,
             D: tl.constexpr, BM: tl.constexpr, BUG: tl.constexpr):  # fmt: skip
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rows = offs_m < n_q
    o = tl.load(O_ + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                mask=rows[:, None], other=0.0)  # fmt: skip
    do = tl.load(DO + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
                 mask=rows[:, None], other=0.0)  # fmt: skip
    if BUG == 29:  # noqa: SIM108 - D in the inputs' dtype (float16 stays float16)
        delta = tl.sum(o * do, axis=1)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if BUG == 1:  # D left out
        delta = delta * 0.0
    tl.store(Dl + bh * n_q + offs_m, delta, mask=rows)


@triton.jit
def _bwd_p(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL: tl.constexpr,
           BUG: tl.constexpr):  # fmt: skip
    if BUG == 14:  # noqa: SIM108 - the scores recomputed without the scale
        s = tl.dot(q, kt)
    else:
        s = tl.dot(q, kt) * scale
    allowed = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    if CAUSAL:
        if BUG == 6:  # the future tiles skipped, but no mask
            allowed = allowed
        elif BUG == 7:  # notebook 12's j <= i
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        elif BUG == 26:  # strict: the diagonal left out
            allowed = allowed & (offs_n[None, :] < offs_m[:, None] + offset)
        else:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + offset)
    if BUG == 3:  # lse forgotten
        return tl.where(allowed, tl.exp(s), 0.0)
    if BUG == 18:  # the mask applied by multiplication, after exp(s - lse): inf * 0 = NaN
        return tl.exp(s - lse[:, None]) * allowed.to(tl.float32)
    if BUG == 21:  # exp2, log2(e) folded in
        return tl.where(allowed, tl.exp2((s - tl.where(allowed, lse[:, None], 0.0)) * LOG2E), 0.0)
    return tl.where(allowed, tl.exp(s - tl.where(allowed, lse[:, None], 0.0)), 0.0)


@triton.jit
def _bwd_kv(Q, K, V, O_, DO, L_, Dl, DK, DV, DQ,
            sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
            sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
            n_heads, n_q, n_k, scale,
            D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
            BUG: tl.constexpr, ATOMIC: tl.constexpr):  # fmt: skip
    """dK, dV of one tile of keys (outputs contiguous, (B, H, n_k, D)); ATOMIC: dQ too, added
    into a float32 buffer with tl.atomic_add."""
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    start_n = tl.program_id(0)
    offs_n = start_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    cols = offs_n < n_k
    kt = tl.load(K + b * skb + h * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
                 mask=cols[None, :], other=0.0)  # fmt: skip
    vt = tl.load(V + b * svb + h * svh + offs_n[None, :] * svn + offs_d[:, None] * svd,
                 mask=cols[None, :], other=0.0)  # fmt: skip
    dk = tl.zeros((BN, D), tl.float32)
    dv = tl.zeros((BN, D), tl.float32)
    offset = n_k - n_q
    if BUG == 7:
        offset = 0
    lo = 0
    if CAUSAL and BUG == 22:  # the first query tile without n_k - n_q
        lo = (start_n * BN // BM) * BM
    elif CAUSAL and BUG == 24:  # the first query that sees the tile, not rounded to a tile
        lo = tl.maximum(start_n * BN - offset, 0)
    elif CAUSAL and BUG != 12:  # 12: every tile of queries visited
        lo = (tl.maximum(start_n * BN - offset, 0) // BM) * BM
    n_tiles = tl.cdiv(n_q - lo, BM)
    for t in range(0, n_tiles):
        if BUG == 21:  # noqa: SIM108 - the tiles of queries from the last to the first
            start = lo + (n_tiles - 1 - t) * BM
        else:
            start = lo + t * BM
        offs_m = start + tl.arange(0, BM)
        rows = offs_m < n_q
        if BUG == 10:  # q's rows past n_q loaded too
            q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd)
        else:
            q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                        mask=rows[:, None], other=0.0)  # fmt: skip
        if BUG == 25:  # dO's padding rows loaded as NaN: 0 * NaN in every product over queries
            do = tl.load(DO + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
                         mask=rows[:, None], other=float("nan"))  # fmt: skip
        else:
            do = tl.load(DO + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
                         mask=rows[:, None], other=0.0)  # fmt: skip
        lse = tl.load(L_ + b * slb + h * slh + offs_m * slm, mask=rows, other=0.0)
        if BUG == 20 or ATOMIC:  # D computed here, from this tile of queries' O and dO
            o = tl.load(O_ + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                        mask=rows[:, None], other=0.0)  # fmt: skip
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
        else:
            delta = tl.load(Dl + bh * n_q + offs_m, mask=rows, other=0.0)
        p = _bwd_p(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL, BUG)
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None])
        if BUG == 9:  # dV from dS
            dv += tl.dot(tl.trans(ds.to(do.dtype)), do)
        elif BUG == 15:  # dO upcast to p's float32 for the product
            dv += tl.dot(tl.trans(p), do.to(tl.float32))
        else:
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        if BUG == 5:  # the scale inside the loop, and again at the end
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * scale
        else:
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
        if ATOMIC and BUG == 19:  # dQ added by a load and a store: programs race on a GPU
            dq = tl.dot(ds.to(q.dtype), tl.trans(kt)) * scale
            dq_ptrs = DQ + bh * n_q * D + offs_m[:, None] * D + offs_d[None, :]
            before = tl.load(dq_ptrs, mask=rows[:, None], other=0.0)
            tl.store(dq_ptrs, before + dq, mask=rows[:, None])
        elif ATOMIC:
            dq = tl.dot(ds.to(q.dtype), tl.trans(kt)) * scale
            tl.atomic_add(DQ + bh * n_q * D + offs_m[:, None] * D + offs_d[None, :], dq,
                          mask=rows[:, None])  # fmt: skip
    if BUG != 4:  # 4: the scale left out
        dk = dk * scale
    base = bh * n_k * D + offs_n[:, None] * D + offs_d[None, :]
    if BUG == 11:  # the tile stored whole, past n_k
        tl.store(DK + base, dk.to(DK.dtype.element_ty))
    else:
        tl.store(DK + base, dk.to(DK.dtype.element_ty), mask=cols[:, None])
    tl.store(DV + base, dv.to(DV.dtype.element_ty), mask=cols[:, None])


@triton.jit
def _bwd_q(Q, K, V, DO, L_, Dl, DQ,
           sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
           sgb, sgh, sgm, sgd, slb, slh, slm,
           n_heads, n_q, n_k, scale,
           D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
           BUG: tl.constexpr):  # fmt: skip
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rows = offs_m < n_q
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=rows[:, None], other=0.0)  # fmt: skip
    do = tl.load(DO + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
                 mask=rows[:, None], other=0.0)  # fmt: skip
    lse = tl.load(L_ + b * slb + h * slh + offs_m * slm, mask=rows, other=0.0)
    delta = tl.load(Dl + bh * n_q + offs_m, mask=rows, other=0.0)
    dq = tl.zeros((BM, D), tl.float32)
    offset = n_k - n_q
    if BUG == 7:
        offset = 0
    hi = n_k
    if CAUSAL and BUG == 17:  # the block's end with BN: (start_m + 1) * BLOCK_N
        hi = tl.minimum(tl.maximum((tl.program_id(0) + 1) * BN + offset, 0), n_k)
    elif CAUSAL and BUG != 13:  # 13: every tile of keys visited
        hi = tl.minimum(tl.maximum((tl.program_id(0) + 1) * BM + offset, 0), n_k)
    for start in range(0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n < n_k
        kt = tl.load(K + b * skb + h * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
                     mask=cols[None, :], other=0.0)  # fmt: skip
        vt = tl.load(V + b * svb + h * svh + offs_n[None, :] * svn + offs_d[:, None] * svd,
                     mask=cols[None, :], other=0.0)  # fmt: skip
        p = _bwd_p(q, kt, lse, offs_m, offs_n, n_q, n_k, offset, scale, CAUSAL, BUG)
        ds = p * (tl.dot(do, vt) - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt))
    if BUG != 4:
        dq = dq * scale
    if BUG == 5:
        dq = dq * scale
    tl.store(DQ + bh * n_q * D + offs_m[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=rows[:, None])  # fmt: skip


def _attention_backward(q, k, v, out, lse, do, causal, bm, bn, bug=0, atomic=False):
    atomic = atomic or bug == 19
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    dq = torch.zeros(B, H, n_q, d, dtype=torch.float32 if atomic else q.dtype, device=q.device)
    dk = torch.empty(B, H, n_k, d, dtype=k.dtype, device=q.device)
    dv = torch.empty_like(dk)
    delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    scale = 1 / math.sqrt(d)
    # 27: dO addressed with out's strides everywhere; 28: in D's pre-pass only
    s_do = out.stride() if bug == 27 else do.stride()
    if bug == 30:  # D by PyTorch in the inputs' dtype (float16), a float16 buffer
        delta = (do * out).sum(-1)
    elif not atomic and bug != 20:
        o = v if bug == 2 else out  # 2: D from the values
        s_pre = o.stride() if bug == 28 else s_do
        _bwd_pre[(triton.cdiv(n_q, bm), B * H)](
            o, do, delta, *o.stride(), *s_pre, H, n_q, D=d, BM=bm, BUG=bug
        )  # fmt: skip
    first, second = (dv, dk) if bug == 8 else (dk, dv)  # 8: dK and dV swapped
    _bwd_kv[(triton.cdiv(n_k, bn), B * H)](
        q, k, v, out, do, lse, delta, first, second, dq, *q.stride(), *k.stride(), *v.stride(),
        *out.stride(), *s_do, *lse.stride(), H, n_q, n_k, scale,
        D=d, BM=bm, BN=bn, CAUSAL=bool(causal), BUG=bug, ATOMIC=atomic,
    )  # fmt: skip
    if atomic:
        return dq.to(q.dtype), dk, dv
    if bug == 16:  # dQ by autograd through a hand-written softmax, dK and dV from the kernel
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        s = leaves[0] @ leaves[1].mT * scale
        if causal:
            keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
            s = s.masked_fill(~keep, -math.inf)
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))
        w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
        dq = torch.autograd.grad(w @ leaves[2], leaves[0], do.float())[0].to(q.dtype)
        return dq, dk, dv
    if bug == 20:  # D in the dK/dV kernel only: the dQ kernel's from a pre-pass of its own
        _bwd_pre[(triton.cdiv(n_q, bm), B * H)](
            out, do, delta, *out.stride(), *do.stride(), H, n_q, D=d, BM=bm, BUG=0
        )  # fmt: skip
    _bwd_q[(triton.cdiv(n_q, bm), B * H)](
        q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *s_do,
        *lse.stride(), H, n_q, n_k, scale, D=d, BM=bm, BN=bm if bug == 23 else bn,
        CAUSAL=bool(causal), BUG=bug,
    )  # fmt: skip
    return dq, dk, dv


for _bug, _id, _name in [
    (1, "triton_bwd_no_delta", "delta_left_out"),
    (2, "triton_bwd_delta_of_v", "delta_from_v"),
    (3, "triton_bwd_weights_not_lse", "weights_without_lse"),
    (4, "triton_bwd_scale", "scale_left_out"),
    (5, "triton_bwd_scale", "scale_twice"),
    (6, "triton_bwd_causal_mask", "no_causal_mask"),
    (7, "triton_bwd_causal_offset", "notebook_12s_mask"),
    (8, "triton_bwd_dk_dv_swapped", "dk_dv_swapped"),
    (9, "triton_bwd_dv_from_ds", "dv_from_ds"),
    (10, "triton_load_out_of_bounds", "q_rows_unmasked"),
    (11, "triton_store_out_of_bounds", "dk_stored_whole"),
    (12, "triton_bwd_future_tiles", "dkdv_every_query_tile"),
    (13, "triton_bwd_future_tiles", "dq_every_key_tile"),
    (14, "triton_bwd_scores_scale", "scores_unscaled"),
    (15, "triton_bwd_dot_upcast", "do_upcast_for_dv"),
    (16, "triton_bwd_not_in_kernel", "dq_by_autograd"),
    (17, "triton_bwd_dq_end_block_n", "dq_end_with_block_n"),
    (18, "triton_bwd_nan_no_key", "mask_by_multiplication"),
    (19, "triton_bwd_dq_race", "dq_added_by_load_and_store"),
    (22, "triton_bwd_causal_offset", "dkdv_start_without_offset"),
    (25, "triton_bwd_nan", "do_padding_loaded_as_nan"),
    (26, "triton_bwd_causal_mask_strict", "causal_mask_strict"),
    (27, "triton_bwd_do_strides_of_out", "do_with_out_strides"),
    (28, "triton_bwd_do_strides_of_out", "do_with_out_strides_in_delta"),
    (29, "triton_bwd_delta_float16", "delta_summed_in_float16"),
    (30, "triton_bwd_delta_float16", "delta_by_torch_in_float16"),
]:

    def _bwd_entry(q, k, v, out, lse, grad_out, causal=False, block_m=16, block_n=16, _bug=_bug):
        return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n, _bug)

    _bwd_entry.__name__ = f"attention_backward_{_name}"
    mistake("triton_attention_backward", id=_id)(_bwd_entry)


@mistake("triton_attention_backward", id="triton_bwd_not_in_kernel")
def attention_backward_by_autograd(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                   block_n=16):  # fmt: skip
    """The gradients from PyTorch's autograd through attention written with tensors."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].mT / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~keep, -math.inf)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, 0.0))
    w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
    grads = torch.autograd.grad(w @ leaves[2], leaves, grad_out.float())
    return tuple(g.to(q.dtype) for g in grads)


@mistake("triton_attention_backward", id="reference_used")
def attention_backward_notebook_12s(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                    block_n=16):  # fmt: skip
    """Notebook 12's backward pass (the reference's, kept in the package) in place of kernels."""
    from attention_ref.flash import _flash_backward

    lse = torch.where(torch.isfinite(lse), lse, math.inf)[..., None]
    f = [t.float() for t in (q, k, v, out, grad_out)]
    grads = _flash_backward(f[0], f[1], f[2], f[3], lse, f[4], 16, causal, 16)
    return tuple(g.to(q.dtype) for g in grads)


@alternative("triton_attention_backward")
def attention_backward_three_kernels(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                     block_n=16):  # fmt: skip
    """A pre-pass for D, then dK and dV per tile of keys, then dQ per tile of queries."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n)


@alternative("triton_attention_backward")
def attention_backward_delta_in_kernel(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                       block_n=16):  # fmt: skip
    """D computed inside the dK/dV kernel, per tile of queries, from O and dO."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n, bug=20)


@alternative("triton_attention_backward")
def attention_backward_reversed_exp2(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                     block_n=16):  # fmt: skip
    """The tiles of queries from the last to the first, the weights with exp2."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n, bug=21)


@alternative("triton_attention_backward")
def attention_backward_one_kernel_atomic(q, k, v, out, lse, grad_out, causal=False,
                                         block_m=16, block_n=16):  # fmt: skip
    """One kernel: dK and dV per tile of keys, dQ added into float32 with tl.atomic_add."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n,
                               atomic=True)  # fmt: skip


@alternative("triton_attention_backward")
def attention_backward_dq_key_tiles_of_block_m(q, k, v, out, lse, grad_out, causal=False,
                                               block_m=16, block_n=16):  # fmt: skip
    """The dQ kernel walks its keys in tiles of BLOCK_M (the dK/dV kernel in tiles of
    BLOCK_N)."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n, bug=23)


@alternative("triton_attention_backward")
def attention_backward_dkdv_start_mid_tile(q, k, v, out, lse, grad_out, causal=False,
                                           block_m=16, block_n=16):  # fmt: skip
    """The dK/dV kernel's loop starts at the first query that sees its tile, not rounded down
    to a tile of queries."""
    return _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n, bug=24)


# ----------------------------------------------------------- every exercise: results kept by shape
def _shape_key(args) -> tuple:
    """What a cache keyed by the inputs' shapes sees: each tensor's shape, dtype and strides,
    and the other arguments as they are."""
    return tuple(
        (tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else a for a in args
    )


def _kept_by_shape(compute):
    """``compute`` behind a cache of its results keyed by the inputs' shapes: the first call of
    a shape computes, every later call of that shape returns the first's result."""
    kept = {}

    def call(*args):
        key = _shape_key(args)
        if key not in kept:
            kept[key] = compute(*args)
        return kept[key]

    return call


_softmax_kept = _kept_by_shape(_softmax)
_attention_kept = _kept_by_shape(_attention)
_split_kept = _kept_by_shape(_causal_split)
_backward_kept = _kept_by_shape(_attention_backward)


@mistake("triton_softmax", id="result_cached_by_shape")
def softmax_cached_by_shape(x):
    """The result of the first call of each shape, kept and given back (to save the launch)."""
    return _softmax_kept(x)


@mistake("triton_attention", id="result_cached_by_shape")
def attention_cached_by_shape(q, k, v, causal=False, block_m=16, block_n=16):
    return _attention_kept(q, k, v, causal, block_m, block_n)


@mistake("triton_causal_split", id="result_cached_by_shape")
def causal_split_cached_by_shape(q, k, v, block_m=16, block_n=16):
    return _split_kept(q, k, v, block_m, block_n)


@mistake("triton_attention_backward", id="result_cached_by_shape")
def attention_backward_cached_by_shape(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                       block_n=16):  # fmt: skip
    return _backward_kept(q, k, v, out, lse, grad_out, causal, block_m, block_n)


_gradients_kept: dict = {}


@mistake("triton_flash_attention", id="result_cached_by_shape")
class TritonAttentionGradientsCachedByShape(TritonFlashAttention):
    """The gradients of the first backward pass of each shape, kept and given back."""

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        key = _shape_key((q, k, v, do, ctx.causal))
        if key not in _gradients_kept:
            dq, dk, dv = _backward(q, k, v, out, lse, do, ctx.causal)
            _gradients_kept[key] = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None)
        return _gradients_kept[key]


_buffers: dict = {}


@mistake("triton_softmax", id="result_buffer_reused")
def softmax_into_one_buffer(x):
    """The output buffer allocated once per shape and returned by every call (to save the
    allocation): a later call overwrites what an earlier one returned."""
    key = ("softmax", *_shape_key([x]))
    y = _buffers.setdefault(key, torch.empty(x.shape, dtype=x.dtype, device=x.device))
    rows, n = x.shape
    _softmax_rows[(rows,)](x, y, n, *x.stride(), *y.stride(), BLOCK=triton.next_power_of_2(n),
                           BUG=0)  # fmt: skip
    return y


@mistake("triton_attention_backward", id="result_buffer_reused")
def attention_backward_into_kept_buffers(q, k, v, out, lse, grad_out, causal=False, block_m=16,
                                         block_n=16):  # fmt: skip
    """dq, dk and dv copied into buffers allocated once per shape and returned every call."""
    grads = _attention_backward(q, k, v, out, lse, grad_out, causal, block_m, block_n)
    key = ("backward", *_shape_key([q, k, v, out, lse, grad_out, causal, block_m, block_n]))
    kept = _buffers.setdefault(key, tuple(torch.empty_like(g) for g in grads))
    for buffer, g in zip(kept, grads, strict=True):
        buffer.copy_(g)
    return kept
