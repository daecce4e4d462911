"""Catalog for notebook 12: online_softmax, online_softmax_attention, cached_self_attention."""

import math

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
                rows = torch.arange(i0, i1)[:, None]
                cols = torch.arange(j0, j1)[None, :]
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


@alternative("online_softmax_attention")
def attn_einsum_where(q, k, v, block_size=64, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    outs = []
    for i0 in range(0, n_q, block_size):
        qb = q[..., i0 : i0 + block_size, :] * scale
        rows = torch.arange(i0, i0 + qb.shape[-2])[:, None]
        m = l = acc = None  # noqa: E741
        for j0 in range(0, min(n_k, i0 + qb.shape[-2]) if causal else n_k, block_size):
            kb, vb = k[..., j0 : j0 + block_size, :], v[..., j0 : j0 + block_size, :]
            s = torch.einsum("...qd,...kd->...qk", qb, kb)
            if causal:
                s = torch.where(torch.arange(j0, j0 + kb.shape[-2])[None, :] <= rows, s, -math.inf)
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
                allowed = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None]
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
    q_pos = past + torch.arange(t)[:, None]
    k_pos = torch.arange(k_all.shape[2])[None, :]
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
