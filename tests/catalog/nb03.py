"""Catalog for notebook 03: the module exercise self_attention (learner's class)."""

import math

import torch
from torch import nn

import attention_ref

from . import alternative, mistake


class _Base(nn.Module):
    """The required parameters; subclasses write forward (correctly or not)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_in, d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)


def _softmax_masked(scores, mask):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


# ----------------------------------------------------------------------------- mistakes


@mistake("self_attention", id="scale_missing")
class SelfAttentionNoScale(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1), mask)
        return w @ v, w


@mistake("self_attention", id="queries_keys_swapped")
class SelfAttentionSwappedQK(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="linear_weight_transposed")
class SelfAttentionRawLinearWeight(_Base):
    def forward(self, x, mask=None):
        q = x @ self.w_q.weight
        k = x @ self.w_k.weight
        v = x @ self.w_v.weight
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="keys_from_w_q")
class SelfAttentionCopyPasteKey(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_q(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="weights_times_x")
class SelfAttentionWeightsTimesX(_Base):
    def forward(self, x, mask=None):
        q, k = self.w_q(x), self.w_k(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ x, w


@mistake("self_attention", id="scale_by_d_in")
class SelfAttentionScaleByDin(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="softmax_over_queries")
class SelfAttentionSoftmaxDim1(_Base):
    """dim=1 is right for a 2-D x (T, d_in) but means the queries for a batch (B, T, T)."""

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=1).nan_to_num(0.0)
        return w @ v, w


@mistake("self_attention", id="batched_dot_t")
class SelfAttentionBatchedDotT(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.T / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="mask_inverted")
class SelfAttentionInvertedMask(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(mask, -1e9)
        w = torch.softmax(s, dim=-1)
        return w @ v, w


@mistake("self_attention", id="fully_masked_row_uniform_fill")
class SelfAttentionMinus1e9(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -1e9)
        w = torch.softmax(s, dim=-1)
        return w @ v, w


@mistake("self_attention", id="causal_mask_by_default")
class SelfAttentionAlwaysCausal(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        T = x.shape[-2]
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool).tril()
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="bias_by_default")
class SelfAttentionWithBias(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_in, d_k)
        self.w_k = nn.Linear(d_in, d_k)
        self.w_v = nn.Linear(d_in, d_v)

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="linear_in_out_swapped")
class SelfAttentionLinearSwapped(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_k, d_in, bias=False)
        self.w_k = nn.Linear(d_k, d_in, bias=False)
        self.w_v = nn.Linear(d_v, d_in, bias=False)

    def forward(self, x, mask=None):
        raise RuntimeError("never reached: the weights cannot be loaded")


@mistake("self_attention", id="sa_extra_w_o")
class SelfAttentionExtraOutputProjection(_Base):
    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        self.w_o = nn.Linear(d_v, d_v)

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return self.w_o(w @ v), w


@mistake("self_attention", id="parameter_names")
class SelfAttentionOtherNames(nn.Module):
    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.query = nn.Linear(d_in, d_k, bias=False)
        self.key = nn.Linear(d_in, d_k, bias=False)
        self.value = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.query(x), self.key(x), self.value(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="reference_used")
class SelfAttentionSubclassesReference(attention_ref.SelfAttention):
    pass


@mistake("self_attention", id="reference_used")
class SelfAttentionBuiltin(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out, None


@mistake("self_attention", id="outputs_swapped_order")
class SelfAttentionWrongOrder(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w, w @ v


@mistake("self_attention", id="mask_ignored")
class SelfAttentionIgnoresMask(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return w @ v, w


@mistake("self_attention", id="mask_after_softmax_weights")
class SelfAttentionMaskAfterSoftmax(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        if mask is not None:
            w = w * mask
        return w @ v, w


@mistake("self_attention", id="sa_values_from_w_k")
class SelfAttentionCopyPasteValue(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_k(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("self_attention", id="wrong_dtype")
class SelfAttentionHardcodedFloat32(_Base):
    def forward(self, x, mask=None):
        q, k, v = (t.float() for t in (self.w_q(x), self.w_k(x), self.w_v(x)))
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


# ----------------------------------------------------------------------------- alternatives


@alternative("self_attention")
class SelfAttentionWithSdpa(_Base):
    """Projections, then the attention of notebook 01 (reusing earlier work is allowed)."""

    def forward(self, x, mask=None):
        return attention_ref.sdpa(self.w_q(x), self.w_k(x), self.w_v(x), mask)


@alternative("self_attention")
class SelfAttentionRawParameters(nn.Module):
    """Raw weight matrices (d_in, d_out) used as x @ W, einsum, torch.where for the mask."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Parameter(torch.randn(d_in, d_k) / math.sqrt(d_in))
        self.w_k = nn.Parameter(torch.randn(d_in, d_k) / math.sqrt(d_in))
        self.w_v = nn.Parameter(torch.randn(d_in, d_v) / math.sqrt(d_in))

    def forward(self, x, mask=None):
        q, k, v = x @ self.w_q, x @ self.w_k, x @ self.w_v
        s = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = torch.where(mask, s, torch.tensor(float("-inf"), dtype=s.dtype))
        w = torch.softmax(s, dim=-1)
        if mask is not None:
            w = torch.where(mask.any(-1, keepdim=True), w, torch.zeros((), dtype=w.dtype))
        return torch.einsum("...ij,...jd->...id", w, v), w


@alternative("self_attention")
class SelfAttentionFloat64Loop(_Base):
    """One query at a time in float64, cast back: slow and plain, but correct."""

    def forward(self, x, mask=None):
        q, k, v = (t.double() for t in (self.w_q(x), self.w_k(x), self.w_v(x)))
        T = x.shape[-2]
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool)
        mask = mask.expand(*q.shape[:-2], T, T)
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
        weights = torch.zeros(*q.shape[:-1], T, dtype=torch.float64)
        for i in range(T):
            s = (q[..., i : i + 1, :] @ k.transpose(-2, -1))[..., 0, :] / math.sqrt(q.shape[-1])
            allowed = mask[..., i, :]
            s = s.masked_fill(~allowed, float("-inf"))
            e = torch.exp(s - s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0))
            total = e.sum(-1, keepdim=True)
            w = e / torch.where(total > 0, total, torch.ones_like(total))
            weights[..., i, :] = w
            out[..., i, :] = (w[..., None, :] @ v)[..., 0, :]
        return out.to(x.dtype), weights.to(x.dtype)


@alternative("self_attention")
class SelfAttentionFusedQKV(nn.Module):
    """One nn.Linear for Q, K and V, sliced into the three named projections' weights."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_in, d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)
        self.d_k = d_k

    def forward(self, x, mask=None):
        w_qkv = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # (2dk+dv, d_in)
        q, k, v = (x @ w_qkv.T).split([self.d_k, self.d_k, w_qkv.shape[0] - 2 * self.d_k], -1)
        s = (q / math.sqrt(self.d_k)) @ k.mT
        if mask is not None:
            s = s.masked_fill(~mask, -torch.inf)
        allowed = torch.ones_like(s, dtype=torch.bool) if mask is None else mask.expand_as(s)
        m = s.amax(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).min)
        e = torch.exp(s - m) * allowed
        w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
        return w @ v, w


@alternative("self_attention")
class SelfAttentionLazyLinear(nn.Module):
    """nn.LazyLinear layers: the input size is found on the first call."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.w_q = nn.LazyLinear(d_k, bias=False)
        self.w_k = nn.LazyLinear(d_k, bias=False)
        self.w_v = nn.LazyLinear(d_v, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


class _Unconstrained(nn.Module):
    """A parametrization that leaves the weight as it is (e.g. a hook point for later)."""

    def forward(self, w):
        return w


@alternative("self_attention")
class SelfAttentionParametrized(_Base):
    """Weights behind torch.nn.utils.parametrize (with no right_inverse), and the scale
    1/sqrt(d_k) kept in a registered buffer."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        for layer in (self.w_q, self.w_k, self.w_v):
            nn.utils.parametrize.register_parametrization(layer, "weight", _Unconstrained())
        self.register_buffer("scale", torch.tensor(1 / math.sqrt(d_k), dtype=torch.float64))

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked((q @ k.transpose(-2, -1)) * self.scale, mask)
        return w @ v, w


class _Symmetric(nn.Module):
    def forward(self, w):
        return (w + w.T) / 2


@mistake("self_attention", id="parametrization_changes_weight")
class SelfAttentionSymmetricWeights(_Base):
    """Constrains W_Q to be symmetric: not the free projection the exercise asks for."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        if d_in == d_k:
            nn.utils.parametrize.register_parametrization(self.w_q, "weight", _Symmetric())

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@alternative("self_attention")
class SelfAttentionWeightNorm(_Base):
    """Weight-normalised projections (torch.nn.utils.parametrizations.weight_norm: its
    right_inverse returns two tensors, g and v, so the original is original0, original1)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__(d_in, d_k, d_v)
        for name in ("w_q", "w_k", "w_v"):
            setattr(self, name, nn.utils.parametrizations.weight_norm(getattr(self, name)))

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_masked(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w
