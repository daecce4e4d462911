"""Catalog for notebook 12: online_softmax, online_softmax_attention, cached_self_attention."""

import math
from types import SimpleNamespace

import torch

from attention_ref import merge_heads, sdpa, split_heads

from . import alternative, mistake

# ----------------------------------------------------------------------------- online_softmax


def _online_softmax(x, block_size, *, rescale=True, stop=None, m0=-math.inf, running=True):
    m = x.new_tensor(m0)
    l = x.new_tensor(0.0)  # noqa: E741
    for start in range(0, x.numel() if stop is None else stop, block_size):
        block = x[start : start + block_size]
        m_new = torch.maximum(m, block.max()) if running else block.max()
        l = (l * torch.exp(m - m_new) if rescale else l) + torch.exp(block - m_new).sum()  # noqa: E741
        m = m_new
    return torch.exp(x - m) / l


@mistake("online_softmax", id="online_sum_not_rescaled")
def softmax_no_rescale(x, block_size):
    return _online_softmax(x, block_size, rescale=False)


@mistake("online_softmax", id="online_last_block_dropped")
def softmax_drop_last(x, block_size):
    return _online_softmax(x, block_size, stop=x.numel() - x.numel() % block_size)


@mistake("online_softmax", id="online_max_starts_at_0")
def softmax_m0_zero(x, block_size):
    return _online_softmax(x, block_size, m0=0.0)


@mistake("online_softmax", id="online_no_max")
def softmax_no_max(x, block_size):
    l = x.new_tensor(0.0)  # noqa: E741
    for start in range(0, x.numel(), block_size):
        l = l + torch.exp(x[start : start + block_size]).sum()  # noqa: E741
    return torch.exp(x) / l


@mistake("online_softmax", id="online_global_max_first")
def softmax_two_pass(x, block_size):
    m = x.max()  # the ordinary softmax's first pass
    l = sum(torch.exp(x[s : s + block_size] - m).sum() for s in range(0, len(x), block_size))  # noqa: E741
    return torch.exp(x - m) / l


@mistake("online_softmax", id="online_two_passes")
def softmax_two_pass_by_blocks(x, block_size):
    """The ordinary two-pass softmax, each pass block by block: no whole-vector reduction,
    but not the one pass with a running maximum that the exercise asks for."""
    blocks = x.split(block_size)
    m = x.new_tensor(-math.inf)
    for block in blocks:  # pass 1: the global maximum
        m = torch.maximum(m, block.max())
    l = sum(torch.exp(block - m).sum() for block in blocks)  # noqa: E741  pass 2
    return torch.exp(x - m) / l


@alternative("online_softmax")
def softmax_per_block_max(x, block_size):
    """Each block against its own maximum, merged into the running sum (the merge rule)."""
    m, l = x.new_tensor(-math.inf), x.new_tensor(0.0)  # noqa: E741
    for block in x.split(block_size):
        bm = block.max()
        bl = torch.exp(block - bm).sum()
        m_new = torch.maximum(m, bm)
        l = l * torch.exp(m - m_new) + bl * torch.exp(bm - m_new)  # noqa: E741
        m = m_new
    return torch.exp(x - m) / l


@alternative("online_softmax")
def softmax_python_floats(x, block_size):
    m, l = -math.inf, 0.0  # noqa: E741
    for start in range(0, len(x), block_size):
        block = x[start : start + block_size].tolist()
        m_new = max(m, *block)
        l = l * math.exp(m - m_new) + sum(math.exp(b - m_new) for b in block)  # noqa: E741
        m = m_new
    return torch.exp(x - m) / l


@alternative("online_softmax")
def softmax_float64_state(x, block_size):
    x64 = x.double()
    m = torch.tensor(-math.inf, dtype=torch.float64)
    l = torch.tensor(0.0, dtype=torch.float64)  # noqa: E741
    for block in torch.split(x64, block_size):
        m_new = torch.maximum(m, torch.amax(block))
        alpha = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - m_new))
        l = alpha * l + torch.exp(block - m_new).sum()  # noqa: E741
        m = m_new
    return (torch.exp(x64 - m) / l).to(x.dtype)


# ----------------------------------------------------------------------------- online attention


def _online_attention(
    q,
    k,
    v,
    block_size=64,
    causal=False,
    *,
    rescale_l=True,
    rescale_acc=True,
    drop_last=False,
    skip_extra=0,
    full_scores=False,
    skip=True,
    mask_on_cpu=False,
):
    """Blocked online attention with switchable bugs; queries in blocks of block_size."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    q = q / math.sqrt(q.shape[-1])
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = q.new_zeros(*batch, n_q, v.shape[-1])
    stop = n_k - n_k % block_size if drop_last else n_k
    all_scores = q @ k.transpose(-2, -1) if full_scores else None
    for i0 in range(0, n_q, block_size):
        i1 = min(i0 + block_size, n_q)
        m = q.new_full((*batch, i1 - i0, 1), -math.inf)
        l = q.new_zeros((*batch, i1 - i0, 1))  # noqa: E741
        acc = q.new_zeros((*batch, i1 - i0, v.shape[-1]))
        j_end = min(stop, i1 + skip_extra) if causal and skip else stop
        for j0 in range(0, j_end, block_size):
            j1 = min(j0 + block_size, n_k)
            if full_scores:
                s = all_scores[..., i0:i1, j0:j1]
            else:
                s = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            if causal:
                on = None if mask_on_cpu else q.device
                rows = torch.arange(i0, i1, device=on)[:, None]
                cols = torch.arange(j0, j1, device=on)[None, :]
                s = s.masked_fill(cols > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)
            p = torch.exp(s - m_safe)
            l = (l * alpha if rescale_l else l) + p.sum(-1, keepdim=True)  # noqa: E741
            acc = (acc * alpha if rescale_acc else acc) + p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / l
    return out


@mistake("online_softmax_attention", id="wrong_device")
def attn_causal_mask_on_cpu(q, k, v, block_size=64, causal=False):
    """The tiles' causal mask built without device=: on the CPU whatever q's device."""
    return _online_attention(q, k, v, block_size, causal, mask_on_cpu=True)


@mistake("online_softmax_attention", id="flash_running_sum_l")
def attn_no_rescale_l(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, rescale_l=False)


@mistake("online_softmax_attention", id="flash_accumulator_rescaled_when")
def attn_no_rescale_acc(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, rescale_acc=False)


@mistake("online_softmax_attention", id="flash_running_maximum")
def attn_block_max_only(q, k, v, block_size=64, causal=False):
    n_k = k.shape[-2]
    q = q / math.sqrt(q.shape[-1])
    l, acc = 0, 0  # noqa: E741
    for j0 in range(0, n_k, block_size):
        s = q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1)
        if causal:
            rows = torch.arange(q.shape[-2])[:, None]
            s = s.masked_fill(torch.arange(j0, j0 + s.shape[-1])[None, :] > rows, -math.inf)
        m = s.amax(-1, keepdim=True).clamp_min(-1e30)
        p = torch.exp(s - m)
        l = l + p.sum(-1, keepdim=True)  # noqa: E741
        acc = acc + p @ v[..., j0 : j0 + block_size, :]
    return acc / l


@mistake("online_softmax_attention", id="flash_last_partial_block")
def attn_drop_last(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, drop_last=True)


@mistake("online_softmax_attention", id="flash_causal_block_skip")
def attn_skip_diagonal(q, k, v, block_size=64, causal=False):
    out = _online_attention(q, k, v, block_size, causal, skip_extra=-block_size)
    return out.nan_to_num(0.0)


@mistake("online_softmax_attention", id="flash_future_blocks_not_skipped")
def attn_mask_only(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, skip=False)


@mistake("online_softmax_attention", id="flash_future_blocks_not_skipped")
def attn_skip_one_late(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, skip_extra=block_size)


@mistake("online_softmax_attention", id="flash_full_score_matrix")
def attn_full_scores(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, causal, full_scores=True)


@mistake("online_softmax_attention", id="flash_causal_ignored")
def attn_ignores_causal(q, k, v, block_size=64, causal=False):
    return _online_attention(q, k, v, block_size, False)


@mistake("online_softmax_attention", id="flash_causal_ignored")
def attn_ignores_causal_in_float32(q, k, v, block_size=64, causal=False):
    """Real code: causal ignored, and the tiles computed in float32 (cast back at the end); it
    was told only "precision loss" (on the first, non-causal, float64 input)."""
    out = _online_attention(q.float(), k.float(), v.float(), block_size, False)
    return out.to(q.dtype)


@mistake("online_softmax_attention", id="online_inplace_autograd")
def attn_in_place_updates(q, k, v, block_size=64, causal=False):
    """The running state updated in place, as attention_ref's own inference-only loop does:
    the right output, and a backward pass that autograd refuses."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = q / math.sqrt(q.shape[-1])
    out = q.new_empty(*batch, n_q, v.shape[-1])
    for i0 in range(0, n_q, block_size):
        i1 = min(i0 + block_size, n_q)
        m = q.new_full((*batch, i1 - i0, 1), -math.inf)
        l = q.new_zeros((*batch, i1 - i0, 1))  # noqa: E741
        acc = q.new_zeros((*batch, i1 - i0, v.shape[-1]))
        for j0 in range(0, min(n_k, i1) if causal else n_k, block_size):
            j1 = min(j0 + block_size, n_k)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT + q.new_zeros(*batch, 1, 1)  # (*batch, ...)
            if causal and j1 - 1 > i0:
                allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                s.masked_fill_(~allowed, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = s.sub_(m_new).exp_()
            l.mul_(alpha).add_(p.sum(-1, keepdim=True))
            acc.mul_(alpha).add_(p @ v[..., j0:j1, :])
            m = m_new
        out[..., i0:i1, :] = acc / l
    return out


@mistake("online_softmax_attention", id="online_no_autograd")
def attn_under_no_grad(q, k, v, block_size=64, causal=False):
    """Computed under torch.no_grad(), "since it is only the forward pass"."""
    with torch.no_grad():
        return _online_attention(q, k, v, block_size, causal)


@alternative("online_softmax_attention")
def attn_einsum_where(q, k, v, block_size=64, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    outs = []
    for i0 in range(0, n_q, block_size):
        qb = q[..., i0 : i0 + block_size, :] * scale
        rows = torch.arange(i0, i0 + qb.shape[-2], device=q.device)[:, None]
        m = l = acc = None  # noqa: E741
        for j0 in range(0, min(n_k, i0 + qb.shape[-2]) if causal else n_k, block_size):
            kb, vb = k[..., j0 : j0 + block_size, :], v[..., j0 : j0 + block_size, :]
            s = torch.einsum("...qd,...kd->...qk", qb, kb)
            if causal:
                cols = torch.arange(j0, j0 + kb.shape[-2], device=q.device)[None, :]
                s = torch.where(cols <= rows, s, -math.inf)
            bm = s.amax(-1, keepdim=True)
            if m is None:
                m = bm
                p = torch.exp(s - m)
                l, acc = p.sum(-1, keepdim=True), torch.einsum("...qk,...kd->...qd", p, vb)  # noqa: E741
            else:
                m_new = torch.maximum(m, bm)
                alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
                l = alpha * l + p.sum(-1, keepdim=True)  # noqa: E741
                acc = alpha * acc + torch.einsum("...qk,...kd->...qd", p, vb)
                m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)


@alternative("online_softmax_attention")
def attn_running_logsumexp(q, k, v, block_size=64, causal=False):
    """A running log-sum-exp per query: torch.logsumexp on each tile, torch.logaddexp to
    merge; the accumulator is kept normalised, so nothing is divided at the end."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    q = q / math.sqrt(q.shape[-1])
    outs = []
    for i0 in range(0, n_q, block_size):
        i1 = min(i0 + block_size, n_q)
        lse = acc = None
        for j0 in range(0, min(n_k, i1) if causal else n_k, block_size):
            j1 = min(j0 + block_size, n_k)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT
            if causal:
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                allowed = cols <= torch.arange(i0, i1, device=q.device)[:, None]
                s = s.masked_fill(~allowed, -math.inf)
            tile_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            if lse is None:  # the first tile holds key 0: every row has a finite lse
                lse, acc = tile_lse, torch.exp(s - tile_lse) @ v[..., j0:j1, :]
            else:
                new = torch.logaddexp(lse, tile_lse)
                acc = acc * torch.exp(lse - new) + torch.exp(s - new) @ v[..., j0:j1, :]
                lse = new
        outs.append(acc)
    return torch.cat(outs, dim=-2)


@alternative("online_softmax_attention")
def attn_float64_all_queries(q, k, v, block_size=64, causal=False):
    """All queries at once when not causal; float64 state; cast back at the end."""
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    if not causal:
        return _online_attention_all(q, k, v, block_size).to(dtype)
    return _online_attention(q, k, v, block_size, True).to(dtype)


def _online_attention_all(q, k, v, block_size):
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    m = torch.tensor(-math.inf, dtype=q.dtype)
    l = acc = 0.0  # noqa: E741
    for kb, vb in zip(k.split(block_size, dim=-2), v.split(block_size, dim=-2), strict=True):
        s = q @ kb.mT
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
        acc = acc * alpha + p @ vb
        m = m_new
    return acc / l


# ----------------------------------------------------------------------------- KV cache


def _cached(mha, x_new, cache, *, append=1, mask="correct", only_new=False, w_o=True):
    H = mha.n_heads
    q = split_heads(mha.w_q(x_new), H)
    k = split_heads(mha.w_k(x_new), H)
    v = split_heads(mha.w_v(x_new), H)
    k_all, v_all = k, v
    for _ in range(append):
        k_all, v_all = cache.append(k, v)
    if only_new:
        k_all, v_all = k, v
    t, T = q.shape[2], k_all.shape[2]
    m = None
    if mask == "correct":
        m = torch.ones(t, T, dtype=torch.bool).tril(T - t)
    elif mask == "unshifted":
        m = torch.ones(t, T, dtype=torch.bool).tril()
    out, _ = sdpa(q, k_all, v_all, m)
    out = merge_heads(out)
    return mha.w_o(out) if w_o else out


@mistake("cached_self_attention", id="cache_not_appended")
def kv_not_appended(mha, x_new, cache):
    return _cached(mha, x_new, cache, append=0)


@mistake("cached_self_attention", id="kv_appended_twice")
def kv_appended_twice(mha, x_new, cache):
    return _cached(mha, x_new, cache, append=2)


@mistake("cached_self_attention", id="kv_no_mask")
def kv_no_mask(mha, x_new, cache):
    return _cached(mha, x_new, cache, mask=None)


@mistake("cached_self_attention", id="kv_unshifted")
def kv_unshifted_mask(mha, x_new, cache):
    return _cached(mha, x_new, cache, mask="unshifted")


@mistake("cached_self_attention", id="kv_only_new")
def kv_only_new(mha, x_new, cache):
    return _cached(mha, x_new, cache, only_new=True)


@mistake("cached_self_attention", id="kv_no_w_o")
def kv_no_w_o(mha, x_new, cache):
    return _cached(mha, x_new, cache, w_o=False)


@mistake("cached_self_attention", id="kv_mask_wrong_device")
def kv_mask_on_cpu(mha, x_new, cache):
    """The notebook's solution with its mask built on the CPU whatever x_new's device."""
    return _cached(mha, x_new, cache)


@alternative("cached_self_attention")
def kv_einsum_manual_softmax(mha, x_new, cache):
    B, t, D = x_new.shape
    H, d = mha.n_heads, D // mha.n_heads
    q = mha.w_q(x_new).view(B, t, H, d).transpose(1, 2)
    k = mha.w_k(x_new).view(B, t, H, d).transpose(1, 2)
    v = mha.w_v(x_new).view(B, t, H, d).transpose(1, 2)
    past = len(cache)
    k_all, v_all = cache.append(k, v)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k_all) / math.sqrt(d)
    q_pos = past + torch.arange(t, device=x_new.device)[:, None]
    k_pos = torch.arange(k_all.shape[2], device=x_new.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqk,bhkd->bhqd", w, v_all).transpose(1, 2).reshape(B, t, D)
    return mha.w_o(out)


@alternative("cached_self_attention")
def kv_one_position_at_a_time(mha, x_new, cache):
    outs = []
    for i in range(x_new.shape[1]):  # each new token appends itself, then attends
        x_i = x_new[:, i : i + 1]
        q = split_heads(mha.w_q(x_i), mha.n_heads)
        k_all, v_all = cache.append(
            split_heads(mha.w_k(x_i), mha.n_heads), split_heads(mha.w_v(x_i), mha.n_heads)
        )
        out, _ = sdpa(q, k_all, v_all)
        outs.append(merge_heads(out))
    return mha.w_o(torch.cat(outs, dim=1))


# ----------------------------------------------------------------------------- flash_attention


def _tiled_forward(q, k, v, block_size, causal, *, rescale_acc=True, keep_tiles=False):
    """The notebook's tiled forward pass (queries and keys in blocks of block_size):
    ``(out, L, m, l, tiles)`` with ``L = m + log(l)``, the running maximum ``m`` and sum
    ``l`` at the end (each ``(..., n_q, 1)``) and, if asked, every tile's weights."""
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    qs = q / math.sqrt(q.shape[-1])
    out = q.new_empty(*q.shape[:-1], d_v)
    ms, ls, tiles = [], [], []
    for i0 in range(0, n_q, block_size):
        i1 = min(i0 + block_size, n_q)
        m = q.new_full((*q.shape[:-2], i1 - i0, 1), -math.inf)
        l = q.new_zeros((*q.shape[:-2], i1 - i0, 1))  # noqa: E741
        acc = q.new_zeros((*q.shape[:-2], i1 - i0, d_v))
        for j0 in range(0, min(n_k, i1) if causal else n_k, block_size):
            j1 = min(j0 + block_size, n_k)
            s = qs[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            if causal and j1 - 1 > i0:
                allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                s = s.masked_fill(~allowed, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            l = alpha * l + p.sum(-1, keepdim=True)  # noqa: E741
            acc = (alpha * acc if rescale_acc else acc) + p @ v[..., j0:j1, :]
            m = m_new
            if keep_tiles:
                tiles.append((i0, j0, p, m_new))
        out[..., i0:i1, :] = acc / l
        ms.append(m)
        ls.append(l)
    m, l = torch.cat(ms, dim=-2), torch.cat(ls, dim=-2)  # noqa: E741
    lse = m + torch.log(l)
    # every tile's weights, normalised once the row's sum is known
    tiles = [
        (i0, j0, p * torch.exp(m_t - lse[..., i0 : i0 + p.shape[-2], :]))
        for i0, j0, p, m_t in tiles
    ]
    return out, lse, m, l, tiles


def _flash_forward(ctx, q, k, v, block_size=64, causal=False, *, save="lse", rescale_acc=True):
    """The tiled forward pass, saving what the backward pass needs: the log-sum-exp L (or,
    buggy, the running maximum m, or every tile's weights)."""
    out, lse, m, l, tiles = _tiled_forward(  # noqa: E741
        q, k, v, block_size, causal, rescale_acc=rescale_acc, keep_tiles=save == "tiles"
    )
    if save == "m_l":  # the maximum and the sum, two numbers per query: also right
        ctx.save_for_backward(q, k, v, out, m, l)
    else:
        ctx.save_for_backward(q, k, v, out, m if save == "max" else lse)
    ctx.tiles = tiles
    ctx.block_size, ctx.causal = block_size, causal
    return out


def _flash_backward(
    ctx,
    do,
    *,
    delta="out",
    scale_dq=True,
    dk_scaled_twice=False,
    transposes=True,
    mask=True,
    skip=True,
    n_grads=5,
    full=False,
):
    """The notebook's backward pass: P = exp(S - L) per tile, D = rowsum(dO * O),
    dS = P (dP - D), with switchable bugs."""
    q, k, v, out, lse = ctx.saved_tensors
    bs, causal = ctx.block_size, ctx.causal
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    qs = q * scale
    D = (do * out).sum(-1, keepdim=True)  # noqa: N806 - the paper's name
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    saved = {(i0, j0): p for i0, j0, p in getattr(ctx, "tiles", [])}
    if full:  # the weights of all keys at once
        s_all = qs @ k.transpose(-2, -1)
        if causal:
            s_all = s_all.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), -math.inf)
        p_all = torch.exp(s_all - lse)
    for i0 in range(0, n_q, bs):
        i1 = min(i0 + bs, n_q)
        for j0 in range(0, min(n_k, i1) if causal and skip else n_k, bs):
            j1 = min(j0 + bs, n_k)
            if full:
                p = p_all[..., i0:i1, j0:j1]
            elif saved:
                p = saved[(i0, j0)]
            else:
                s = qs[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
                if causal and mask:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                p = torch.exp(s - lse[..., i0:i1, :])
            dp = do[..., i0:i1, :] @ v[..., j0:j1, :].transpose(-2, -1)
            if delta == "out":
                ds = p * (dp - D[..., i0:i1, :])
            elif delta == "tile":
                ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            else:
                ds = p * dp
            if transposes:
                dv[..., j0:j1, :] += p.transpose(-2, -1) @ do[..., i0:i1, :]
                dk[..., j0:j1, :] += ds.transpose(-2, -1) @ qs[..., i0:i1, :]
            else:
                dv[..., j0:j1, :] += p @ do[..., i0:i1, :]
                dk[..., j0:j1, :] += ds @ qs[..., i0:i1, :]
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :]
    if scale_dq:
        dq = dq * scale
    if dk_scaled_twice:
        dk = dk * scale
    return (dq, dk, dv, None, None)[:n_grads]


class FlashNoDelta(torch.autograd.Function):
    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, delta="none")


class FlashDeltaPerTile(torch.autograd.Function):
    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, delta="tile")


class FlashSavesTheMaximum(torch.autograd.Function):
    """Saves the running maximum m where L = m + log(l) belongs: P = exp(S - m)."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        return _flash_forward(ctx, q, k, v, block_size, causal, save="max")

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do)


class FlashRawExp(torch.autograd.Function):
    """Recomputes the weights as exp(S), ignoring the saved L."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, _ = ctx.saved_tensors
        return _raw_exp_backward(q, k, v, out, do, ctx.block_size, ctx.causal)


def _raw_exp_backward(q, k, v, out, do, bs, causal):
    scale = 1 / math.sqrt(q.shape[-1])
    D = (do * out).sum(-1, keepdim=True)  # noqa: N806
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, q.shape[-2], bs):
        i1 = min(i0 + bs, q.shape[-2])
        for j0 in range(0, min(k.shape[-2], i1) if causal else k.shape[-2], bs):
            j1 = min(j0 + bs, k.shape[-2])
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT * scale
            if causal:
                allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                s = s.masked_fill(~allowed, -math.inf)
            p = torch.exp(s)  # forgot "- L"
            dv[..., j0:j1, :] += p.mT @ do[..., i0:i1, :]
            ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].mT - D[..., i0:i1, :])
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :] * scale
            dk[..., j0:j1, :] += ds.mT @ q[..., i0:i1, :] * scale
    return dq, dk, dv, None, None


class FlashDqUnscaled(torch.autograd.Function):
    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, scale_dq=False)


class FlashDkScaledTwice(torch.autograd.Function):
    """dK = dS^T (q * scale) is already scaled; scaling it again is off by 1/sqrt(d_k)."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, dk_scaled_twice=True)


class FlashNoTransposes(torch.autograd.Function):
    """dV = P dO and dK = dS Q: the transposes forgotten (square tiles hide the shapes)."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, transposes=False)


class FlashBackwardUnmasked(torch.autograd.Function):
    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, mask=False)


class FlashBackwardNoSkip(torch.autograd.Function):
    """Masks the future tiles in backward instead of skipping them: right, but twice the work."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, skip=False)


class FlashSavesTheWeights(torch.autograd.Function):
    """Keeps every tile's weights from the forward pass instead of recomputing them."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        return _flash_forward(ctx, q, k, v, block_size, causal, save="tiles")

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do)


class FlashAutogradThroughTiles(torch.autograd.Function):
    """Runs the tiled forward pass under autograd and differentiates it in backward: the
    graph keeps every tile."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            out = _online_attention(*leaves, block_size, causal)
        ctx.graph = (out, leaves)
        return out.detach()

    @staticmethod
    def backward(ctx, do):
        out, leaves = ctx.graph
        return (*torch.autograd.grad(out, leaves, do), None, None)


class FlashBackwardAllKeysAtOnce(torch.autograd.Function):
    """Recomputes the weights of all keys at once in backward: an n_q x n_k tensor."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, full=True)


class FlashBackwardThroughAutograd(torch.autograd.Function):
    """backward recomputes the tiled forward pass under autograd and calls
    torch.autograd.grad: the right gradients, but the graph holds every tile's weights at
    once (no one tensor of n_q x n_k elements)."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _ = ctx.saved_tensors
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            out = _online_attention(*leaves, ctx.block_size, ctx.causal)
        return (*torch.autograd.grad(out, leaves, do), None, None)


class FlashBackwardKeepsTileParts(torch.autograd.Function):
    """backward appends every tile's contributions to dq, dk and dv to lists and sums them
    at the end: n^2 d / block_size numbers at once, memory x3 when n doubles."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        bs, causal = ctx.block_size, ctx.causal
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = 1 / math.sqrt(q.shape[-1])
        D = (do * out).sum(-1, keepdim=True)  # noqa: N806
        dq_parts, dk_parts, dv_parts = [], [], []
        for i0 in range(0, n_q, bs):
            i1 = min(i0 + bs, n_q)
            qs = q[..., i0:i1, :] * scale
            for j0 in range(0, min(n_k, i1) if causal else n_k, bs):
                j1 = min(j0 + bs, n_k)
                s = qs @ k[..., j0:j1, :].mT
                if causal:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                p = torch.exp(s - lse[..., i0:i1, :])
                ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].mT - D[..., i0:i1, :])
                dv_parts.append((j0, p.mT @ do[..., i0:i1, :]))
                dk_parts.append((j0, ds.mT @ qs))
                dq_parts.append((i0, ds @ k[..., j0:j1, :] * scale))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for grad, parts in ((dq, dq_parts), (dk, dk_parts), (dv, dv_parts)):
            for start, part in parts:
                grad[..., start : start + part.shape[-2], :] += part
        return dq, dk, dv, None, None


class FlashKeepsTileOutputs(torch.autograd.Function):
    """The forward pass keeps every tile's partial output P V (bq x d_v each, "in case"):
    n^2 d / block_size numbers, under the absolute limit at n = 256 but x4 when n doubles."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        out = _flash_forward(ctx, q, k, v, block_size, causal)
        tiles = _tiled_forward(q, k, v, block_size, causal, keep_tiles=True)[4]
        ctx.partials = [p @ v[..., j0 : j0 + p.shape[-1], :] for _, j0, p in tiles]
        del tiles
        ctx.tiles = []
        return out

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do)


class FlashStateOnTheClass(torch.autograd.Function):
    """Keeps the output, L and the block size on the class instead of ctx: right for one
    call at a time, wrong once a second call comes before the first one's backward pass."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        out, lse, *_ = _tiled_forward(q, k, v, block_size, causal)
        FlashStateOnTheClass.state = SimpleNamespace(
            saved_tensors=(q, k, v, out, lse), block_size=block_size, causal=causal
        )
        return out

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(FlashStateOnTheClass.state, do)


class FlashThreeGradients(torch.autograd.Function):
    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do, n_grads=3)


class FlashNoValueGradient(torch.autograd.Function):
    """dv left for later: backward returns None in its place."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        dq, dk, _, _, _ = _flash_backward(ctx, do)
        return dq, dk, None, None, None


class FlashGradientsSwapped(torch.autograd.Function):
    """dk and dv returned in each other's place."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv, _, _ = _flash_backward(ctx, do)
        return dq, dv, dk, None, None


class FlashForwardAccNotRescaled(torch.autograd.Function):
    """The forward pass of exercise 2 with its accumulator not rescaled."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        return _flash_forward(ctx, q, k, v, block_size, causal, rescale_acc=False)

    @staticmethod
    def backward(ctx, do):
        return _flash_backward(ctx, do)


for _cls, _id in [
    (FlashNoDelta, "flash_bwd_no_delta"),
    (FlashDeltaPerTile, "flash_bwd_delta_per_tile"),
    (FlashSavesTheMaximum, "flash_bwd_unnormalised_weights"),
    (FlashRawExp, "flash_bwd_unnormalised_weights"),
    (FlashDqUnscaled, "flash_bwd_scale"),
    (FlashDkScaledTwice, "flash_bwd_scale"),
    (FlashNoTransposes, "flash_bwd_transposes"),
    (FlashBackwardUnmasked, "flash_bwd_causal_mask"),
    (FlashBackwardNoSkip, "flash_bwd_future_tiles"),
    (FlashSavesTheWeights, "flash_bwd_saves_weights"),
    (FlashAutogradThroughTiles, "flash_bwd_saves_weights"),
    (FlashBackwardAllKeysAtOnce, "flash_bwd_full_matrix"),
    (FlashBackwardThroughAutograd, "flash_bwd_quadratic_memory"),
    (FlashStateOnTheClass, "flash_bwd_state_outside_ctx"),
    (FlashKeepsTileOutputs, "flash_bwd_saves_weights"),
    (FlashBackwardKeepsTileParts, "flash_bwd_quadratic_memory"),
    (FlashThreeGradients, "flash_bwd_gradient_count"),
    (FlashNoValueGradient, "flash_bwd_no_gradient"),
    (FlashGradientsSwapped, "flash_bwd_gradient_order"),
    (FlashForwardAccNotRescaled, "flash_accumulator_rescaled_when"),
]:
    mistake("flash_attention", id=_id)(_cls)


@mistake("flash_attention", id="not_an_autograd_function")
def flash_as_a_plain_function(q, k, v, block_size=64, causal=False):
    """The forward pass as a function: autograd would differentiate every tile."""
    return _online_attention(q, k, v, block_size, causal)


@alternative("flash_attention")
class FlashKeyBlocksOuter(torch.autograd.Function):
    """FlashAttention-2's loop order in backward: key blocks outer (dK, dV of one block
    accumulated locally), query blocks inner; einsum; D per query tile."""

    forward = staticmethod(_flash_forward)

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        bs, causal = ctx.block_size, ctx.causal
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = q.shape[-1] ** -0.5
        dq = torch.zeros_like(q)
        dks, dvs = [], []
        for j0 in range(0, n_k, bs):
            j1 = min(j0 + bs, n_k)
            kb, vb = k[..., j0:j1, :], v[..., j0:j1, :]
            dk_b, dv_b = torch.zeros_like(kb), torch.zeros_like(vb)
            first = (j0 // bs) * bs if causal else 0  # query blocks ending after j0
            for i0 in range(first, n_q, bs):
                i1 = min(i0 + bs, n_q)
                qb, dob = q[..., i0:i1, :] * scale, do[..., i0:i1, :]
                s = torch.einsum("...qd,...kd->...qk", qb, kb)
                if causal:
                    cols = torch.arange(j0, j1)[None, :]
                    s = torch.where(cols <= torch.arange(i0, i1)[:, None], s, -math.inf)
                p = torch.exp(s - lse[..., i0:i1, :])
                d = torch.einsum("...qd,...qd->...q", dob, out[..., i0:i1, :])[..., None]
                dp = torch.einsum("...qd,...kd->...qk", dob, vb)
                ds = p * (dp - d)
                dv_b += torch.einsum("...qk,...qd->...kd", p, dob)
                dk_b += torch.einsum("...qk,...qd->...kd", ds, qb)
                dq[..., i0:i1, :] += torch.einsum("...qk,...kd->...qd", ds, kb) * scale
            dks.append(dk_b)
            dvs.append(dv_b)
        return dq, torch.cat(dks, dim=-2), torch.cat(dvs, dim=-2), None, None


@alternative("flash_attention")
class FlashFloat64AllQueries(torch.autograd.Function):
    """float64 inside, cast back; all queries at once when not causal; L saved as
    (..., n_q) without the trailing 1."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        dtype = q.dtype
        q64, k64, v64 = q.double(), k.double(), v.double()
        if causal:
            out, lse, *_ = _tiled_forward(q64, k64, v64, block_size, True)
            lse = lse[..., 0]
        else:
            qs = q64 / math.sqrt(q.shape[-1])
            m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=torch.float64)
            l = torch.zeros_like(m)  # noqa: E741
            acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
            for kb, vb in zip(k64.split(block_size, -2), v64.split(block_size, -2), strict=True):
                s = qs @ kb.mT
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)
                l = l * torch.exp(m - m_new) + p.sum(-1, keepdim=True)  # noqa: E741
                acc = acc * torch.exp(m - m_new) + p @ vb
                m = m_new
            out, lse = acc / l, (m + torch.log(l))[..., 0]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_size, ctx.causal, ctx.dtype = block_size, causal, dtype
        return out.to(dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        bs, causal, dtype = ctx.block_size, ctx.causal, ctx.dtype
        q, k, v, do = q.double(), k.double(), v.double(), do.double()
        scale = 1 / math.sqrt(q.shape[-1])
        D = (do * out).sum(-1)  # noqa: N806
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        q_block = bs if causal else q.shape[-2]
        for i0 in range(0, q.shape[-2], q_block):
            i1 = min(i0 + q_block, q.shape[-2])
            for j0 in range(0, min(k.shape[-2], i1) if causal else k.shape[-2], bs):
                j1 = min(j0 + bs, k.shape[-2])
                s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT * scale
                if causal:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                p = torch.exp(s - lse[..., i0:i1, None])
                dv[..., j0:j1, :] += p.mT @ do[..., i0:i1, :]
                ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].mT - D[..., i0:i1, None])
                dq[..., i0:i1, :] += ds @ k[..., j0:j1, :] * scale
                dk[..., j0:j1, :] += ds.mT @ q[..., i0:i1, :] * scale
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None


@alternative("flash_attention")
class FlashSavesMaxAndSum(torch.autograd.Function):
    """Saves the running maximum m and sum l (two numbers per query) and recomputes the
    weights as exp(S - m) / l."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        return _flash_forward(ctx, q, k, v, block_size, causal, save="m_l")

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, m, l = ctx.saved_tensors  # noqa: E741
        bs, causal = ctx.block_size, ctx.causal
        scale = 1 / math.sqrt(q.shape[-1])
        D = (do * out).sum(-1, keepdim=True)  # noqa: N806
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for i0 in range(0, q.shape[-2], bs):
            i1 = min(i0 + bs, q.shape[-2])
            for j0 in range(0, min(k.shape[-2], i1) if causal else k.shape[-2], bs):
                j1 = min(j0 + bs, k.shape[-2])
                s = q[..., i0:i1, :] @ k[..., j0:j1, :].mT * scale
                if causal and j1 - 1 > i0:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                p = torch.exp(s - m[..., i0:i1, :]) / l[..., i0:i1, :]
                dv[..., j0:j1, :] += p.mT @ do[..., i0:i1, :]
                ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].mT - D[..., i0:i1, :])
                dq[..., i0:i1, :] += ds @ k[..., j0:j1, :] * scale
                dk[..., j0:j1, :] += ds.mT @ q[..., i0:i1, :] * scale
        return dq, dk, dv, None, None


@alternative("flash_attention")
class FlashRunningLogSumExp(torch.autograd.Function):
    """The forward pass keeps a running log-sum-exp (torch.logsumexp on a tile,
    torch.logaddexp to merge) instead of m and l; L of shape (..., n_q) and the output kept
    as ctx attributes, not with save_for_backward; dq accumulated per query block and
    concatenated; the backward's peak memory still linear."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = q.shape[-1] ** -0.5
        outs, lses = [], []
        for i0 in range(0, n_q, block_size):
            i1 = min(i0 + block_size, n_q)
            qb = q[..., i0:i1, :] * scale
            lse = q.new_full((*q.shape[:-2], i1 - i0), -math.inf)
            acc = q.new_zeros((*q.shape[:-2], i1 - i0, v.shape[-1]))
            for j0 in range(0, min(n_k, i1) if causal else n_k, block_size):
                j1 = min(j0 + block_size, n_k)
                s = qb @ k[..., j0:j1, :].mT
                if causal and j1 - 1 > i0:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                new = torch.logaddexp(lse, torch.logsumexp(s, -1))
                p = torch.exp(s - new[..., None])
                acc = acc * torch.exp(lse - new)[..., None] + p @ v[..., j0:j1, :]
                lse = new
            outs.append(acc)
            lses.append(lse)
        out = torch.cat(outs, -2)
        ctx.save_for_backward(q, k, v)
        ctx.out, ctx.lse, ctx.bs, ctx.causal = out, torch.cat(lses, -1), block_size, causal
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        out, lse, bs, causal = ctx.out, ctx.lse, ctx.bs, ctx.causal
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = q.shape[-1] ** -0.5
        dk, dv, dqs = torch.zeros_like(k), torch.zeros_like(v), []
        for i0 in range(0, n_q, bs):
            i1 = min(i0 + bs, n_q)
            qb, dob = q[..., i0:i1, :] * scale, do[..., i0:i1, :]
            d = torch.einsum("...id,...id->...i", dob, out[..., i0:i1, :])[..., None]
            dqb = torch.zeros_like(qb)
            for j0 in range(0, min(n_k, i1) if causal else n_k, bs):
                j1 = min(j0 + bs, n_k)
                s = qb @ k[..., j0:j1, :].mT
                if causal and j1 - 1 > i0:
                    allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
                    s = s.masked_fill(~allowed, -math.inf)
                p = torch.exp(s - lse[..., i0:i1, None])
                dv[..., j0:j1, :] += p.mT @ dob
                ds = p * (dob @ v[..., j0:j1, :].mT - d)
                dqb = dqb + ds @ k[..., j0:j1, :]
                dk[..., j0:j1, :] += ds.mT @ qb
            dqs.append(dqb * scale)
        return torch.cat(dqs, -2), dk, dv, None, None
