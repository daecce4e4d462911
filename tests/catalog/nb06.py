"""Catalog for notebook 06: feed_forward, encoder_layer."""

import math

import torch
import torch.nn.functional as F
from torch import nn

import attention_ref
from attention_ref import MultiHeadAttention

from . import alternative, mistake

# ----------------------------------------------------------------------------- feed_forward


class _FFBase(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)


@mistake("feed_forward", id="relu_missing")
class FFNoReLU(_FFBase):
    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


@mistake("feed_forward", id="relu_after_linear2")
class FFReLUAfterLinear2(_FFBase):
    def forward(self, x):
        return torch.relu(self.linear2(self.dropout(self.linear1(x))))


@mistake("feed_forward", id="unexpected_parameters")
class FFLearnedOutputScale(_FFBase):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.out_scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x)))) * self.out_scale


@mistake("feed_forward", id="relu_after_linear2")
class FFReLUAfterBoth(_FFBase):
    def forward(self, x):
        return torch.relu(self.linear2(self.dropout(torch.relu(self.linear1(x)))))


@mistake("feed_forward", id="activation_gelu")
class FFGelu(_FFBase):
    def forward(self, x):
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))


@mistake("feed_forward", id="activation_gelu_tanh")
class FFGeluTanh(_FFBase):
    """The GPT-2 / BERT activation, brought from other code."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.linear2(self.dropout(self.act(self.linear1(x))))


@mistake("feed_forward", id="ff_dropout_hard_coded")
class FFDropoutHardCoded(_FFBase):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


@mistake("feed_forward", id="ff_dropout_ignored")
class FFDropoutNeverUsed(_FFBase):
    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


@mistake("feed_forward", id="dropout_after_linear2")
class FFDropoutOnOutput(_FFBase):
    def forward(self, x):
        return self.dropout(self.linear2(torch.relu(self.linear1(x))))


@mistake("feed_forward", id="ff_dropout_not_rescaled")
class FFDropoutNotRescaled(_FFBase):
    """A hand-made dropout mask without the 1/(1-p) rescale."""

    def forward(self, x):
        h = torch.relu(self.linear1(x))
        if self.training:
            h = h * (torch.rand_like(h) >= self.dropout.p)
        return self.linear2(h)


@mistake("feed_forward", id="ff_dropout_on_input")
class FFDropoutOnInput(_FFBase):
    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(self.dropout(x))))


@mistake("feed_forward", id="dropout_misplaced")
class FFDropoutTwice(_FFBase):
    def forward(self, x):
        return self.linear2(self.dropout(self.dropout(torch.relu(self.linear1(x)))))


@mistake("feed_forward", id="linear_in_out_swapped")
class FFLinearSizesSwapped(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_ff, d_model)
        self.linear2 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


@mistake("feed_forward", id="built_without_bias")
class FFNoBias(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


@mistake("feed_forward", id="reference_used")
class FFSubclassesReference(attention_ref.FeedForward):
    pass


@alternative("feed_forward")
class FFSequential(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.net = nn.Sequential(self.linear1, nn.ReLU(), self.dropout, self.linear2)

    def forward(self, x):
        return self.net(x)


@alternative("feed_forward")
class FFSequentialFirst(nn.Module):
    """The Sequential is registered first, so its names come first in named_parameters."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.linear1, self.dropout, self.linear2 = self.net[0], self.net[2], self.net[3]

    def forward(self, x):
        return self.net(x)


@alternative("feed_forward")
class FFFunctional(_FFBase):
    def forward(self, x):
        h = F.relu(F.linear(x, self.linear1.weight, self.linear1.bias))
        h = F.dropout(h, p=self.dropout.p, training=self.training)
        return F.linear(h, self.linear2.weight, self.linear2.bias)


@alternative("feed_forward")
class FFEinsumClamp(_FFBase):
    def forward(self, x):
        h = torch.einsum("...d,fd->...f", x, self.linear1.weight) + self.linear1.bias
        h = self.dropout(h.clamp(min=0))
        return torch.einsum("...f,df->...d", h, self.linear2.weight) + self.linear2.bias


@alternative("feed_forward")
class FFLazyLinear(nn.Module):
    """nn.LazyLinear infers in_features at the first call: the check materialises it with a
    dry forward pass before loading weights."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.LazyLinear(d_ff)
        self.linear2 = nn.LazyLinear(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


@alternative("feed_forward")
class FFWeightNorm(_FFBase):
    """Weight-normalised layers (a parametrization): the check sets the weights through it."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.linear1 = nn.utils.parametrizations.weight_norm(self.linear1)
        self.linear2 = nn.utils.parametrizations.weight_norm(self.linear2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # an extra buffer

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


# ----------------------------------------------------------------------------- encoder_layer


class FeedForward(_FFBase):
    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class _LayerBase(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def attn(self, h, mask):
        out, w = self.self_attn(h, h, h, mask)
        return self.dropout1(out), w


@mistake("encoder_layer", id="residual_missing_attention")
class LayerNoAttnResidual(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), mask)
            x = a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="residual_missing_ff")
class LayerNoFFResidual(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), mask)
            x = x + a
            return self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="norm_first_ignored")
class LayerAlwaysPostNorm(_LayerBase):
    def forward(self, x, mask=None):
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="pre_norm_although_post")
class LayerAlwaysPreNorm(_LayerBase):
    def forward(self, x, mask=None):
        a, w = self.attn(self.norm1(x), mask)
        x = x + a
        return x + self.dropout2(self.ff(self.norm2(x))), w


@mistake("encoder_layer", id="pre_norm_on_sublayer_output")
class LayerPreNormOnSublayerOutput(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(x, mask)
            x = x + self.norm1(a)
            return x + self.norm2(self.dropout2(self.ff(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="pre_norm_residual_normalised")
class LayerPreNormResidualFromNormed(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            a, w = self.attn(h, mask)
            x = h + a
            h = self.norm2(x)
            return h + self.dropout2(self.ff(h)), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="norms_swapped")
class LayerNormsSwapped(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm2(x), mask)
            x = x + a
            return x + self.dropout2(self.ff(self.norm1(x))), w
        a, w = self.attn(x, mask)
        x = self.norm2(x + a)
        return self.norm1(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="encoder_layer_mask_ignored")
class LayerMaskIgnored(_LayerBase):
    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), None)
            x = x + a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, None)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="ff_given_layer_input")
class LayerFFOnLayerInput(_LayerBase):
    def forward(self, x, mask=None):
        a, w = self.attn(x, mask)
        h = self.norm1(x + a)
        return self.norm2(h + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="dropout_on_residual_stream")
class LayerDropoutOnResidualSum(_LayerBase):
    """norm1(dropout1(x + a)): the dropout moved across the add, onto the residual sum."""

    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.self_attn(self.norm1(x), self.norm1(x), self.norm1(x), mask)
            x = self.dropout1(x + a)
            return self.dropout2(x + self.ff(self.norm2(x))), w
        a, w = self.self_attn(x, x, x, mask)
        x = self.norm1(self.dropout1(x + a))
        return self.norm2(self.dropout2(x + self.ff(x))), w


@mistake("encoder_layer", id="dropout_on_residual_stream")
class LayerDropoutAfterNorm(_LayerBase):
    """dropout1(norm1(x + a)): post-norm with the dropout after the norm."""

    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            a, w = self.attn(h, mask)
            x = x + a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.self_attn(x, x, x, mask)
        x = self.dropout1(self.norm1(x + a))
        return self.dropout2(self.norm2(x + self.ff(x))), w


@mistake("encoder_layer", id="encoder_dropout_hard_coded")
class LayerDropoutHardCoded(_LayerBase):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, 0.1, norm_first)

    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), mask)
            x = x + a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="encoder_dropout_ignored")
class LayerDropoutNeverUsed(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff)  # dropout not passed on, and not used below
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            a, w = self.self_attn(h, h, h, mask)
            x = x + a
            return x + self.ff(self.norm2(x)), w
        a, w = self.self_attn(x, x, x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x)), w


@mistake("encoder_layer", id="sublayer_dropout_missing")
class LayerNoSublayerDropout(LayerDropoutNeverUsed):
    """Dropout passed on to the attention weights and the FFN's hidden units, but no
    dropout1/dropout2 on the sublayers' outputs: training mode still differs from eval."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        nn.Module.__init__(self)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.norm_first = norm_first


@mistake("encoder_layer", id="parameter_names")
class LayerWrongAttributeName(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        a, w = self.attention(x, x, x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x)), w


@mistake("encoder_layer", id="outputs_swapped_order")
class LayerReturnsWeightsFirst(_LayerBase):
    def forward(self, x, mask=None):
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return w, self.norm2(x + self.dropout2(self.ff(x)))


@mistake("encoder_layer", id="not_a_tuple")
class LayerReturnsOnlyOut(_LayerBase):
    def forward(self, x, mask=None):
        a, _ = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x)))


@mistake("encoder_layer", id="reference_used")
class LayerSubclassesReference(attention_ref.EncoderLayer):
    pass


@mistake("encoder_layer", id="reference_used")
class LayerUsesTorchSDPA(_LayerBase):
    """Attention written inside the layer with PyTorch's fused kernel."""

    def forward(self, x, mask=None):
        B, T, D = x.shape
        H, a = self.self_attn.n_heads, self.self_attn

        def split(t):
            return t.view(B, -1, H, D // H).transpose(1, 2)

        q, k, v = split(a.w_q(x)), split(a.w_k(x)), split(a.w_v(x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        w = (q @ k.transpose(-2, -1) / math.sqrt(D // H)).softmax(-1)
        x = self.norm1(x + self.dropout1(a.w_o(out.transpose(1, 2).reshape(B, T, D))))
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="attention_dropout_not_passed")
class LayerAttnDropoutMissing(_LayerBase):
    """Dropout everywhere except on the attention weights."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), mask)
            x = x + a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


@mistake("encoder_layer", id="code_raised")
class LayerAttnDropoutPositional(LayerAttnDropoutMissing):
    """MultiHeadAttention(d_model, n_heads, dropout): the third positional argument is bias."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)


@alternative("encoder_layer")
class LayerReference(_LayerBase):
    """Straight from the spec."""

    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            a, weights = self.self_attn(h, h, h, mask)
            x = x + self.dropout1(a)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            a, weights = self.self_attn(x, x, x, mask)
            x = self.norm1(x + self.dropout1(a))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights


@alternative("encoder_layer")
class LayerSublayerHelper(_LayerBase):
    """One helper for 'residual + dropout + norm', functional LayerNorm, reference FFN."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.ff = attention_ref.FeedForward(d_model, d_ff, dropout)

    def sublayer(self, x, norm, drop, f):
        def ln(t):
            return F.layer_norm(t, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

        if self.norm_first:
            y, extra = f(ln(x))
            return x + drop(y), extra
        y, extra = f(x)
        return ln(x + drop(y)), extra

    def forward(self, x, mask=None):
        x, weights = self.sublayer(
            x, self.norm1, self.dropout1, lambda h: self.self_attn(h, h, h, mask)
        )
        x, _ = self.sublayer(x, self.norm2, self.dropout2, lambda h: (self.ff(h), None))
        return x, weights


class _MyLayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


class _MyMHA(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.h, self.drop = n_heads, nn.Dropout(dropout)
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        def split(t):
            return t.unflatten(-1, (self.h, -1))  # (B, T, H, d_head)

        q, k, v = split(self.w_q(query)), split(self.w_k(key)), split(self.w_v(value))
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = self.drop(torch.softmax(s, dim=-1).nan_to_num(0.0))
        out = torch.einsum("bhqk,bkhd->bqhd", w, v).flatten(2)
        return self.w_o(out), w


@alternative("encoder_layer")
class LayerOwnParts(nn.Module):
    """Hand-written LayerNorm and einsum attention, functional dropout."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = _MyMHA(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1, self.norm2 = _MyLayerNorm(d_model), _MyLayerNorm(d_model)
        self.p, self.norm_first = dropout, norm_first

    def forward(self, x, mask=None):
        def drop(t):
            return F.dropout(t, self.p, self.training)

        h = self.norm1(x) if self.norm_first else x
        a, weights = self.self_attn(h, h, h, mask)
        x = x + drop(a) if self.norm_first else self.norm1(x + drop(a))
        h = self.norm2(x) if self.norm_first else x
        x = x + drop(self.ff(h))
        return (x if self.norm_first else self.norm2(x)), weights


class _FusedLazyMHA(nn.Module):
    """nanoGPT style: one fused, lazy qkv projection (c_attn) and dropout on the weights."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_head = n_heads
        self.c_attn = nn.LazyLinear(3 * d_model)
        self.c_proj = nn.LazyLinear(d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        B, T, D = query.shape
        q, k, v = self.c_attn(query).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = self.attn_dropout(torch.softmax(s, dim=-1).nan_to_num(0.0))
        return self.c_proj((w @ v).transpose(1, 2).reshape(B, T, D)), w


class _BuggyFeedForward(_FFBase):
    """The learner's exercise-1 answer, still wrong (no ReLU)."""

    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


@alternative(
    "encoder_layer",
    check_only="its feed-forward network fails exercise 1 on purpose, and its attention is "
    "not the spec's MultiHeadAttention, so the notebook cannot load the reference weights",
)
class LayerOwnEarlierParts(_LayerBase):
    """A right layer on the learner's own earlier parts: a fused, lazy attention (nanoGPT
    style) and a feed-forward network that still fails exercise 1. The check grades the
    layer with the reference parts, so neither crashes it nor costs points again here."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = _FusedLazyMHA(d_model, n_heads, dropout)
        self.ff = _BuggyFeedForward(d_model, d_ff, dropout)

    def forward(self, x, mask=None):
        if self.norm_first:
            a, w = self.attn(self.norm1(x), mask)
            x = x + a
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.attn(x, mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.dropout2(self.ff(x))), w


class _StubFeedForward(nn.Module):
    """Exercise 1 as the student notebook gives it: not written yet."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        raise NotImplementedError()

    def forward(self, x):
        raise NotImplementedError()


#: A notebook's namespace where exercise 1 (FeedForward) is still the stub.
_STUB_NOTEBOOK = {
    "nn": nn,
    "MultiHeadAttention": MultiHeadAttention,
    "FeedForward": _StubFeedForward,
}
exec(  # noqa: S102 - a notebook's answer cell, run in its own namespace
    """
class LayerOnStubFeedForward(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            a, w = self.self_attn(h, h, h, mask)
            x = x + self.dropout1(a)
            return x + self.dropout2(self.ff(self.norm2(x))), w
        a, w = self.self_attn(x, x, x, mask)
        x = self.norm1(x + self.dropout1(a))
        return self.norm2(x + self.dropout2(self.ff(x))), w
""",
    _STUB_NOTEBOOK,
)
alternative(
    "encoder_layer",
    check_only="exercise 1 (FeedForward) is still the stub in its namespace: graded with the "
    "reference FeedForward, it passes here, and exercise 1 alone loses its points",
)(_STUB_NOTEBOOK["LayerOnStubFeedForward"])
