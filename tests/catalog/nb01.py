"""Catalog for notebook 01: softmax_np, sdpa_np, sdpa."""

import math

import numpy as np
import torch

from . import alternative, mistake

# ----------------------------------------------------------------------------- softmax_np


@mistake("softmax_np", id="reference_used")
def softmax_from_multihead_attention(x, axis=-1):
    """nn.MultiheadAttention's weights, PyTorch's attention written in Python (one query of
    size 1, the row's entries as keys of size 1, every projection 1): the row's softmax
    (tests/test_forgery.py's forgers use it)."""
    x = np.asarray(x)
    t = torch.from_numpy(np.moveaxis(x.astype(np.float64), axis, -1).copy())
    rows = t.reshape(-1, t.shape[-1], 1)  # (R, n, 1)
    mha = torch.nn.MultiheadAttention(1, 1, bias=False, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.fill_(1.0)  # q = k = v = the input
        _, w = mha(torch.ones(len(rows), 1, 1, dtype=torch.float64), rows, rows)  # (R, 1, n)
    return np.moveaxis(w.reshape(t.shape).numpy(), -1, axis).astype(x.dtype)


@mistake("softmax_np", id="softmax_unstable")
def softmax_unstable(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax_np", id="softmax_axis_ignored")
def softmax_ignores_axis(x, axis=-1):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@mistake("softmax_np", id="softmax_global_sum")
def softmax_global_sum(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum()


@mistake("softmax_np", id="keepdims_missing")
def softmax_no_keepdims(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis))
    return e / np.sum(e, axis=axis)


@mistake("softmax_np", id="reference_used")
def softmax_from_fused_attention(x, axis=-1):
    """One query of size 1 whose scores are the row, the identity as values: PyTorch's
    fused attention returns the row's softmax (tests/test_forgery.py's forgers use it)."""
    x = np.asarray(x)
    t = torch.from_numpy(np.moveaxis(x.astype(np.float64), axis, -1).copy())
    n = t.shape[-1]
    q = torch.ones(*t.shape[:-1], 1, 1, dtype=t.dtype)  # (..., 1, 1)
    v = torch.eye(n, dtype=t.dtype).expand(*t.shape[:-1], n, n)  # (..., n, n)
    w = torch.nn.functional.scaled_dot_product_attention(q, t[..., None], v, scale=1.0)
    return np.moveaxis(w[..., 0, :].numpy(), -1, axis).astype(x.dtype)


@mistake("softmax_np", id="softmax_unstable")
def softmax_global_max(x, axis=-1):
    e = np.exp(x - x.max())
    return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax_np", id="softmax_shift_not_max")
def softmax_shift_by_min(x, axis=-1):
    e = np.exp(x - x.min(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax_np", id="softmax_shift_not_max")
def softmax_shift_by_mean(x, axis=-1):
    e = np.exp(x - x.mean(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@mistake("softmax_np", id="wrong_type")
def softmax_returns_list(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).tolist()


@mistake("softmax_np", id="wrong_dtype")
def softmax_upcasts_to_float64(x, axis=-1):
    x = np.asarray(x, dtype=float)  # float32 in, float64 out
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@alternative("softmax_np")
def softmax_logsumexp(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return np.exp(x - lse)


@alternative("softmax_np")
def softmax_moveaxis_loop(x, axis=-1):
    moved = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    out = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        e = np.exp(row - row.max())
        out[idx] = e / e.sum()
    return np.moveaxis(out, -1, axis).astype(np.asarray(x).dtype)


# ----------------------------------------------------------------------------- sdpa_np


def _np_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@mistake("sdpa_np", id="scale_missing")
def sdpa_np_no_scale(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2)
    if mask is not None:
        s = np.where(mask, s, -1e9)
    w = _np_softmax(s)
    return w @ V, w


@mistake("sdpa_np", id="scale_by_d_k")
def sdpa_np_scale_dk(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2) / Q.shape[-1]
    w = _np_softmax(np.where(mask, s, -np.inf) if mask is not None else s)
    return w @ V, w


@mistake("sdpa_np", id="batched_dot_t")
def sdpa_np_batched_transpose(Q, K, V, mask=None):
    s = Q @ K.T / math.sqrt(Q.shape[-1])
    w = _np_softmax(s)
    return w @ V, w


@mistake("sdpa_np", id="softmax_over_queries")
def sdpa_np_softmax_over_queries(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    e = np.exp(s - s.max(-2, keepdims=True))
    w = e / e.sum(-2, keepdims=True)
    return w @ V, w


@mistake("sdpa_np", id="mask_inverted")
def sdpa_np_inverted_mask(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, -1e9, s)
    w = _np_softmax(s)
    return w @ V, w


@mistake("sdpa_np", id="mask_inverted_nan_rows")
def sdpa_np_inverted_mask_inf(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, -np.inf, s)  # fills the allowed keys: full rows become all -inf
    with np.errstate(invalid="ignore"):
        w = _np_softmax(s)
    return w @ V, w


@mistake("sdpa_np", id="outputs_swapped_order")
def sdpa_np_wrong_order(Q, K, V, mask=None):
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    w = _np_softmax(s)
    return w, w @ V


@alternative("sdpa_np")
def sdpa_np_einsum(Q, K, V, mask=None):
    s = np.einsum("...qd,...kd->...qk", Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.einsum("...qk,...kv->...qv", w, V), w


@alternative("sdpa_np")
def sdpa_np_loops(Q, K, V, mask=None):
    """One query at a time, over flattened batch dims (a beginner's correct version)."""
    batch = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    n_q, n_k = Q.shape[-2], K.shape[-2]
    Qb = np.broadcast_to(Q, batch + Q.shape[-2:])
    Kb = np.broadcast_to(K, batch + K.shape[-2:])
    Vb = np.broadcast_to(V, batch + V.shape[-2:])
    Mb = np.broadcast_to(mask if mask is not None else True, batch + (n_q, n_k))
    out = np.zeros(batch + (n_q, V.shape[-1]))
    weights = np.zeros(batch + (n_q, n_k))
    for b in np.ndindex(batch):
        for i in range(n_q):
            allowed = Mb[b][i]
            if not allowed.any():
                continue
            s = np.array([Qb[b][i] @ Kb[b][j] for j in range(n_k)]) / math.sqrt(Q.shape[-1])
            s = s[allowed]
            e = np.exp(s - s.max())
            weights[b][i][allowed] = e / e.sum()
            out[b][i] = weights[b][i] @ Vb[b]
    return out, weights


@alternative("sdpa_np")
def sdpa_np_additive_mask(Q, K, V, mask=None):
    """The additive mask of much published NumPy code; every query in notebook 01 has at
    least one allowed key, so it is correct there."""
    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if mask is not None:
        s = s + (1 - mask) * -1e10
    w = _np_softmax(s)
    return w @ V, w


@alternative("sdpa_np")
def sdpa_np_seed_idiom(Q, K, V, mask=None):
    """scores * mask + -1e9 * (1 - mask), with the mask as 0/1 floats."""
    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if mask is not None:
        m = np.asarray(mask, dtype=s.dtype)
        s = s * m + -1e9 * (1 - m)
    w = _np_softmax(s)
    return w @ V, w


# ----------------------------------------------------------------------------- sdpa


@mistake("sdpa", id="reference_used")
def sdpa_from_naive_attention(q, k, v, mask=None):
    """Notebook 12's attention the direct way (the package's naive_attention, which this
    very exercise asks for): the weights are its output with the identity as values."""
    from attention_ref.efficient import naive_attention

    n_k = k.shape[-2]
    eye = torch.eye(n_k, dtype=q.dtype, device=q.device).expand(*k.shape[:-2], n_k, n_k)
    w = naive_attention(q, k, eye)  # (..., n_q, n_k)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w


@mistake("sdpa", id="scale_missing")
def sdpa_no_scale(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w


@mistake("sdpa", id="rows_not_normalised")
def sdpa_weights_scaled_by_keep_prob(q, k, v, mask=None):
    # dropout's eval-time scaling by the keep probability (1 - 0.1), applied by hand
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = 0.9 * torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w


@mistake("sdpa", id="scale_by_d_v")
def sdpa_scale_by_dv(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w


@mistake("sdpa", id="softmax_over_queries")
def sdpa_softmax_dim0(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-2).nan_to_num(0.0)
    return w @ v, w


@mistake("sdpa", id="mask_after_softmax_weights")
def sdpa_mask_after_softmax(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    if mask is not None:
        w = w * mask
    return w @ v, w


@mistake("sdpa", id="mask_multiplied_weights")
def sdpa_multiply_scores(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s * mask
    w = torch.softmax(s, dim=-1)
    return w @ v, w


@mistake("sdpa", id="scale_float32")
def sdpa_float32_scale(q, k, v, mask=None):
    # The tutorials' idiom: a float32 scale divides float64 scores.
    scores = q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(q.shape[-1], dtype=torch.float32))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@alternative("sdpa")
def sdpa_tensor_scale_in_q_dtype(q, k, v, mask=None):
    # The same idiom with the scale in q's dtype and on q's device.
    d_k = torch.tensor(q.shape[-1], dtype=q.dtype, device=q.device)
    scores = q @ k.transpose(-2, -1) / torch.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@alternative("sdpa")
def sdpa_minus_1e9(q, k, v, mask=None):
    """A -1e9 fill: correct wherever a query has an allowed key (always, in notebook 01)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, -1e9)
    w = torch.softmax(s, dim=-1)
    return w @ v, w


@alternative("sdpa")
def sdpa_inf_fill(q, k, v, mask=None):
    """The plain -inf fill; fully masked rows (NaN here) are notebook 02's topic."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w @ v, w


@mistake("sdpa", id="reference_used")
def sdpa_uses_builtin(q, k, v, mask=None):
    from torch.nn.functional import scaled_dot_product_attention as fast

    out = fast(q, k, v, attn_mask=mask)
    return out, None


@mistake("sdpa", id="reference_used")
def sdpa_uses_flex_attention(q, k, v, mask=None):
    """PyTorch's flex attention: no fused kernel on a CPU, but PyTorch's attention."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v), None


@mistake("sdpa", id="reference_used")
def sdpa_uses_quantizable_attention(q, k, v, mask=None):
    """torch.ao's quantizable MultiheadAttention: PyTorch's attention copied in Python."""
    from torch.ao.nn.quantizable import MultiheadAttention

    d, flat = q.shape[-1], (-1, *q.shape[-2:])  # (batch..., n, d) -> (B, n, d)
    mha = MultiheadAttention(d, 1, batch_first=True, kdim=d, vdim=v.shape[-1]).to(q)
    out, w = mha(q.reshape(flat), k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:]))
    return out.reshape(*q.shape[:-1], d), w.reshape(*q.shape[:-1], k.shape[-2])


@mistake("sdpa", id="reference_used")
def sdpa_calls_reference(q, k, v, mask=None):
    import attention_ref as ar

    helper = ar.sdpa  # an alias does not hide it
    return helper(q, k, v, mask)


@mistake("sdpa", id="wrong_dtype")
def sdpa_returns_float64(q, k, v, mask=None):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w


@alternative("sdpa")
def sdpa_einsum_where(q, k, v, mask=None):
    s = torch.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        s = torch.where(mask, s, torch.tensor(float("-inf"), dtype=s.dtype))
    w = torch.softmax(s, dim=-1)
    if mask is not None:
        w = torch.where(mask.any(-1, keepdim=True), w, torch.zeros((), dtype=w.dtype))
    return torch.einsum("...qk,...kv->...qv", w, v), w


@alternative("sdpa")
def sdpa_float64_then_cast(q, k, v, mask=None):
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = q64 @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (w @ v64).to(q.dtype), w.to(q.dtype)


@alternative("sdpa")
def sdpa_renormalised_after_softmax(q, k, v, mask=None):
    """Softmax, zero the masked weights, renormalise: the same thing, written differently."""
    s = q @ k.mT / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = (s - m).exp()
    total = e.sum(-1, keepdim=True)
    w = e / total.clamp_min(torch.finfo(e.dtype).tiny)
    return w @ v, w


@alternative("sdpa")
def sdpa_additive_mask(q, k, v, mask=None):
    """An additive float mask built from the boolean one."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + (~mask).to(s.dtype) * -1e10
    w = torch.softmax(s, dim=-1)
    return w @ v, w


@mistake("sdpa_np", id="softmax_unstable")
def sdpa_np_unstable_softmax(Q, K, V, mask=None):
    """The softmax written inline, without subtracting the maximum: exp overflows."""
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s)
        w = e / e.sum(-1, keepdims=True)
    return w @ V, w
