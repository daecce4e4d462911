"""Catalog for notebook 04: split_heads, merge_heads, multi_head_attention."""

import math

import torch
import torch.nn.functional as F
from torch import nn

import attention_ref

from . import alternative, mistake

# ----------------------------------------------------------------------------- split_heads


@mistake("split_heads", id="split_view_without_transpose")
def split_heads_view_only(x, n_heads):
    B, T, D = x.shape
    return x.view(B, n_heads, T, D // n_heads)


@mistake("split_heads", id="split_interleaved")
def split_heads_interleaved(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, D // n_heads, n_heads).permute(0, 3, 1, 2)


@mistake("split_heads", id="split_heads_not_moved")
def split_heads_no_transpose(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads)


@mistake("split_heads", id="split_heads_last_axes_swapped")
def split_heads_permute_wrong(x, n_heads):
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).permute(0, 2, 3, 1)


@mistake("split_heads", id="split_heads_folded")
def split_heads_folded(x, n_heads):
    B, T, D = x.shape
    h = x.view(B, T, n_heads, D // n_heads).transpose(1, 2)
    return h.reshape(B * n_heads, T, D // n_heads)


@mistake("split_heads", id="reference_used")
def split_heads_calls_reference(x, n_heads):
    return attention_ref.split_heads(x, n_heads)


@alternative("split_heads")
def split_heads_stack_slices(x, n_heads):
    d_head = x.shape[-1] // n_heads
    return torch.stack([x[..., h * d_head : (h + 1) * d_head] for h in range(n_heads)], dim=1)


@alternative("split_heads")
def split_heads_unflatten_permute(x, n_heads):
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3).contiguous()


@alternative("split_heads")
def split_heads_chunk(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)


# ----------------------------------------------------------------------------- merge_heads


@mistake("merge_heads", id="merge_without_transpose")
def merge_heads_reshape_only(x):
    B, H, T, d = x.shape
    return x.reshape(B, T, H * d)


@mistake("merge_heads", id="merge_wrong_order")
def merge_heads_wrong_order(x):
    B, H, T, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, H * d)


@mistake("merge_heads", id="view_non_contiguous")
def merge_heads_view_after_transpose(x):
    B, H, T, d = x.shape
    return x.transpose(1, 2).view(B, T, H * d)


@mistake("merge_heads", id="merge_heads_not_flattened")
def merge_heads_not_flattened(x):
    return x.transpose(1, 2)


@alternative("merge_heads")
def merge_heads_cat(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


@alternative("merge_heads")
def merge_heads_contiguous_view(x):
    B, H, T, d = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * d)


@alternative("merge_heads")
def merge_heads_einsum_flatten(x):
    return torch.einsum("bhtd->bthd", x).flatten(2)


# ----------------------------------------------------------------------------- multi_head_attention


def _split(x, H):
    B, T, D = x.shape
    return x.view(B, T, H, D // H).transpose(1, 2)


def _merge(x):
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


def _masked_softmax(s, mask):
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


class _Base(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def heads(self, query, key, value):
        H = self.n_heads
        return _split(self.w_q(query), H), _split(self.w_k(key), H), _split(self.w_v(value), H)

    @staticmethod
    def head_mask(mask):
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        return mask


@mistake("multi_head_attention", id="mha_split_view")
class MHAViewWithoutTranspose(_Base):
    def forward(self, query, key, value, mask=None):
        H, d = self.n_heads, self.d_head
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        q = self.w_q(query).view(B, H, n_q, d)
        k = self.w_k(key).view(B, H, n_k, d)
        v = self.w_v(value).view(B, H, n_k, d)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d), self.head_mask(mask))
        return self.w_o((w @ v).reshape(B, n_q, self.d_model)), w


@mistake("multi_head_attention", id="mha_merge_wrong_order")
class MHAMergeWrongOrder(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        o = w @ v
        B, H, T, d = o.shape
        return self.w_o(o.permute(0, 2, 3, 1).reshape(B, T, H * d)), w


@mistake("multi_head_attention", id="mha_merge_without_transpose")
class MHAMergeNoTranspose(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        o = w @ v
        B, H, T, d = o.shape
        return self.w_o(o.reshape(B, T, H * d)), w


@mistake("multi_head_attention", id="w_o_not_applied")
class MHAForgetsWO(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        return _merge(w @ v), w


@mistake("multi_head_attention", id="mha_w_o_missing")
class MHANoWOAtAll(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q, k, v = _split(self.w_q(query), H), _split(self.w_k(key), H), _split(self.w_v(value), H)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return _merge(w @ v), w


@mistake("multi_head_attention", id="mask_no_head_axis")
class MHAMaskWithoutHeadAxis(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="mask_repeat_wrong_order")
class MHAMaskRepeatWrongOrder(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        B, H, n_q, _ = q.shape
        n_k = k.shape[2]
        if mask is not None and mask.dim() == 3:
            mask = mask.expand(B, n_q, n_k).repeat(H, 1, 1).view(B, H, n_q, n_k)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="scale_missing_head")
class MHANoScale(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1), self.head_mask(mask))
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="mask_inverted_heads")
class MHAMaskInverted(_Base):
    """Treats True as 'blocked', as nn.MultiheadAttention's key_padding_mask does."""

    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        mask = self.head_mask(mask)
        w = _masked_softmax(
            q @ k.transpose(-2, -1) / math.sqrt(self.d_head), None if mask is None else ~mask
        )
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="softmax_over_queries_heads")
class MHASoftmaxOverQueries(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        mask = self.head_mask(mask)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=-2).nan_to_num(0.0)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="scale_by_d_model")
class MHAScaleByDModel(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_model), self.head_mask(mask))
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="weights_averaged_over_heads")
class MHAAveragesWeights(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        return self.w_o(_merge(w @ v)), w.mean(dim=1)


@mistake("multi_head_attention", id="keys_from_query")
class MHASelfAttentionOnly(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, query, query)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="values_from_key")
class MHAValuesFromKey(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, key)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), self.head_mask(mask))
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="mha_shared_head_projection")
class MHASharedHeadProjection(nn.Module):
    """The widely copied variant: one d_head x d_head projection shared by all heads."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(self.d_head, self.d_head, bias=bias)
        self.w_k = nn.Linear(self.d_head, self.d_head, bias=bias)
        self.w_v = nn.Linear(self.d_head, self.d_head, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q, k, v = self.w_q(_split(query, H)), self.w_k(_split(key, H)), self.w_v(_split(value, H))
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="no_value_error")
class MHANoDivisibilityCheck(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q, k, v = _split(self.w_q(query), H), _split(self.w_k(key), H), _split(self.w_v(value), H)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="bias_argument_ignored")
class MHAIgnoresBias(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, query, key, value, mask=None):
        raise RuntimeError("never reached: the weights cannot be loaded")


@mistake("multi_head_attention", id="fully_masked_row_uniform_heads")
class MHAMinus1e9(_Base):
    def forward(self, query, key, value, mask=None):
        q, k, v = self.heads(query, key, value)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        mask = self.head_mask(mask)
        if mask is not None:
            s = s.masked_fill(~mask, -1e9)
        w = torch.softmax(s, dim=-1)
        return self.w_o(_merge(w @ v)), w


@mistake("multi_head_attention", id="reference_used")
class MHASubclassesReference(attention_ref.MultiHeadAttention):
    pass


@mistake("multi_head_attention", id="reference_used")
class MHAWrapsTorch(_Base):
    """Declares the right layers, then hands them to PyTorch's module in forward."""

    def forward(self, query, key, value, mask=None):
        mha = nn.MultiheadAttention(
            self.d_model, self.n_heads, bias=self.w_q.bias is not None, batch_first=True
        ).to(query.dtype)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight]))
            mha.out_proj.weight.copy_(self.w_o.weight)
        attn_mask = None if mask is None else ~mask
        return mha(query, key, value, attn_mask=attn_mask, average_attn_weights=False)


@mistake("multi_head_attention", id="reference_used")
class MHAFunctionalTorch(_Base):
    def forward(self, query, key, value, mask=None):
        out, w = F.multi_head_attention_forward(
            query.transpose(0, 1),
            key.transpose(0, 1),
            value.transpose(0, 1),
            self.d_model,
            self.n_heads,
            torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight]),
            None
            if self.w_q.bias is None
            else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]),
            None,
            None,
            False,
            0.0,
            self.w_o.weight,
            self.w_o.bias,
            need_weights=True,
            average_attn_weights=False,
        )
        return out.transpose(0, 1), w


# ----------------------------------------------------------------------------- alternatives


@alternative("multi_head_attention")
class MHAWithReferenceHelpers(_Base):
    """Projections, then attention_ref's split_heads, sdpa and merge_heads (allowed)."""

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q = attention_ref.split_heads(self.w_q(query), H)
        k = attention_ref.split_heads(self.w_k(key), H)
        v = attention_ref.split_heads(self.w_v(value), H)
        out, w = attention_ref.sdpa(q, k, v, self.head_mask(mask))
        return self.w_o(attention_ref.merge_heads(out)), w


@alternative("multi_head_attention")
class MHALoopOverHeads(_Base):
    """One head at a time, slicing each projection's rows: the definition, head by head."""

    def forward(self, query, key, value, mask=None):
        d, H = self.d_head, self.n_heads
        Q, K, V = self.w_q(query), self.w_k(key), self.w_v(value)
        B, n_q, n_k = query.shape[0], query.shape[1], key.shape[1]
        mask = self.head_mask(mask)
        if mask is not None:
            mask = torch.broadcast_to(mask, (B, H, n_q, n_k))
        outs, weights = [], []
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            s = Q[..., sl] @ K[..., sl].transpose(-2, -1) / math.sqrt(d)
            w = _masked_softmax(s, None if mask is None else mask[:, h])
            outs.append(w @ V[..., sl])
            weights.append(w)
        return self.w_o(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


@alternative("multi_head_attention")
class MHAFoldedBatchHeads(nn.Module):
    """Batch and heads folded into one axis for torch.bmm, the mask expanded to match;
    stores only what it needs (no d_head attribute) and checks divisibility its own way."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        d_head, rest = divmod(d_model, n_heads)
        if rest:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.h = n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)
        self.w_v, self.w_o = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)

    def forward(self, query, key, value, mask=None):
        B, n_q, D = query.shape
        n_k, H = key.shape[1], self.h
        d = D // H

        def fold(t):  # (B, T, D) -> (B*H, T, d)
            return t.reshape(B, -1, H, d).permute(0, 2, 1, 3).reshape(B * H, -1, d)

        q, k, v = fold(self.w_q(query)), fold(self.w_k(key)), fold(self.w_v(value))
        s = torch.bmm(q, k.transpose(1, 2)) * d**-0.5  # (B*H, n_q, n_k)
        if mask is not None:
            if mask.dim() == 3:
                mask = mask[:, None]
            mask = mask.expand(B, H, n_q, n_k).reshape(B * H, n_q, n_k)
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=-1)
        w = torch.where(torch.isnan(w), torch.zeros_like(w), w)
        o = torch.bmm(w, v).reshape(B, H, n_q, d).transpose(1, 2).reshape(B, n_q, D)
        return self.w_o(o), w.reshape(B, H, n_q, n_k)


@alternative("multi_head_attention")
class MHAEinsumWhere(_Base):
    """einsum with the heads as an explicit axis, torch.where for the mask, float64 inside."""

    def forward(self, query, key, value, mask=None):
        H, d = self.n_heads, self.d_head
        q = self.w_q(query).unflatten(-1, (H, d)).double()  # (B, n_q, H, d)
        k = self.w_k(key).unflatten(-1, (H, d)).double()
        v = self.w_v(value).unflatten(-1, (H, d)).double()
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        mask = self.head_mask(mask)
        if mask is not None:
            s = torch.where(mask, s, torch.tensor(float("-inf"), dtype=s.dtype))
        w = torch.softmax(s, dim=-1)
        if mask is not None:
            w = torch.where(mask.any(-1, keepdim=True), w, torch.zeros((), dtype=w.dtype))
        out = torch.einsum("bhqk,bkhd->bqhd", w, v).flatten(2).to(query.dtype)
        return self.w_o(out), w.to(query.dtype)


@alternative("multi_head_attention")
class MHALazyProjections(MHAWithReferenceHelpers):
    """Projections as nn.LazyLinear: their shapes are set by the first forward call."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        self.w_q, self.w_k = nn.LazyLinear(d_model, bias), nn.LazyLinear(d_model, bias)
        self.w_v, self.w_o = nn.LazyLinear(d_model, bias), nn.LazyLinear(d_model, bias)


@alternative("multi_head_attention")
class MHAWeightNormWithBuffer(MHAWithReferenceHelpers):
    """Weight-normalised projections (weight_norm keeps original0 and original1, not
    original) and a persistent buffer (a call counter): the spec allows both."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            setattr(self, name, nn.utils.parametrizations.weight_norm(getattr(self, name)))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))


@mistake("multi_head_attention", id="raw_parameter")
class MHARawParameters(nn.Module):
    """Raw (d_model, d_model) matrices used as x @ W, bias ignored: the feedback must say
    what w_q is, not that there is "no parameter named w_q" while listing w_q."""

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        for name in ("w_q", "w_k", "w_v", "w_o"):
            setattr(self, name, nn.Parameter(torch.randn(d_model, d_model) / d_model**0.5))

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q, k, v = (
            _split(query @ self.w_q, H),
            _split(key @ self.w_k, H),
            _split(value @ self.w_v, H),
        )
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        w = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), mask)
        return _merge(w @ v) @ self.w_o, w
