"""Catalog for notebook 13: rms_norm, swiglu, rotary_attention."""

import math

import torch
from torch import nn

from attention_ref import merge_heads, rope, sdpa, split_heads

from . import alternative, mistake

# ----------------------------------------------------------------------------- rms_norm


class _RMS(nn.Module):
    """RMSNorm with the exercise's parameter name; ``statistic`` is what differs."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x / self.denominator(x) * self.weight

    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


@mistake("rms_norm", id="rms_eps_outside_root")
class RMSEpsOutsideRoot(_RMS):
    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps


@mistake("rms_norm", id="rms_eps_outside_root")
class RMSEpsOutsideRootTinyDefault(_RMS):
    """Real code: the norm plus a tiny epsilon (1e-8) outside the root; it was told its
    default epsilon was wrong."""

    def __init__(self, d_model, eps=1e-8):
        super().__init__(d_model, eps)

    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps


@mistake("rms_norm", id="rms_eps_outside_root")
class RMSEpsOutsideRootLayerNormDefault(RMSEpsOutsideRootTinyDefault):
    """Epsilon 1e-5 (LayerNorm's) outside the root; it was told only epsilon_in_denominator."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)


@mistake("rms_norm", id="rms_eps_missing")
class RMSNoEps(_RMS):
    """Real code: no epsilon at all; it was told to change its default epsilon."""

    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True))


@mistake("rms_norm", id="rms_sum_not_mean")
class RMSNormOfVector(_RMS):
    def denominator(self, x):
        return torch.sqrt(x.pow(2).sum(-1, keepdim=True) + self.eps)


@mistake("rms_norm", id="rms_centred")
class RMSCentred(_RMS):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@mistake("rms_norm", id="rms_std")
class RMSStd(_RMS):
    def denominator(self, x):
        return x.std(-1, keepdim=True) + self.eps


@mistake("rms_norm", id="rms_mean_all_axes")
class RMSMeanOverEverything(_RMS):
    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean() + self.eps)


@mistake("rms_norm", id="rms_no_weight")
class RMSNoWeight(_RMS):
    def forward(self, x):
        return x / self.denominator(x)


@mistake("rms_norm", id="rms_eps_ignored")
class RMSEpsIgnored(_RMS):
    def denominator(self, x):
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@mistake("rms_norm", id="rms_default_eps")
class RMSLayerNormDefaultEps(_RMS):
    def __init__(self, d_model, eps=1e-5):  # nn.LayerNorm's default
        super().__init__(d_model, eps)


@mistake("rms_norm", id="rms_default_eps")
class RMSTinyDefaultEps(_RMS):
    """Epsilon 1e-8 inside the root: nearly no epsilon, but the model of a wrong default
    reproduces it more closely than that of a missing one (rms_eps_missing)."""

    def __init__(self, d_model, eps=1e-8):
        super().__init__(d_model, eps)


@mistake("rms_norm", id="rms_mean_not_squared")
class RMSMeanNotSquared(_RMS):
    def denominator(self, x):
        return torch.sqrt(x.mean(-1, keepdim=True) + self.eps)


@mistake("rms_norm", id="rms_weight_init")
class RMSZeroInitialWeight(_RMS):
    def __init__(self, d_model, eps=1e-6):
        super().__init__(d_model, eps)
        self.weight = nn.Parameter(torch.zeros(d_model))  # as a bias would be


@mistake("rms_norm", id="reference_used")
class RMSPyTorchFunctional(_RMS):
    def forward(self, x):
        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@mistake("rms_norm", id="reference_used")
class RMSPyTorchModule(nn.RMSNorm):
    """PyTorch's own RMSNorm (its parameter is even named weight): forbidden by the spec."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__(d_model, eps=eps)


@alternative("rms_norm")
class RMSRsqrt(_RMS):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@alternative("rms_norm")
class RMSFloat64Accumulation(_RMS):
    def forward(self, x):
        x64 = x.double()
        ms = torch.einsum("...d,...d->...", x64, x64)[..., None] / x.shape[-1]
        return (x64 / torch.sqrt(ms + self.eps)).to(x.dtype) * self.weight


@alternative("rms_norm")
class RMSVectorNormEpsBuffer(_RMS):
    """The root mean square from the vector's norm; eps kept as a buffer (so it is in the
    module's state_dict, and follows .to(dtype))."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__(d_model, eps)
        del self.eps
        self.register_buffer("eps", torch.tensor(float(eps)))

    def denominator(self, x):
        d = x.shape[-1]
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return torch.sqrt(norm**2 / d + self.eps)


# ----------------------------------------------------------------------------- swiglu
class _SwiGLU(nn.Module):
    bias = False

    def __init__(self, d_model, d_ff=None):
        super().__init__()
        d_ff = self.hidden(d_model) if d_ff is None else d_ff
        self.w_gate = nn.Linear(d_model, d_ff, bias=self.bias)
        self.w_up = nn.Linear(d_model, d_ff, bias=self.bias)
        self.w_down = nn.Linear(d_ff, d_model, bias=self.bias)

    @staticmethod
    def hidden(d_model):
        return 8 * d_model // 3

    def forward(self, x):
        return self.w_down(self.act(self.w_gate(x), self.w_up(x)))

    def act(self, gate, up):
        return nn.functional.silu(gate) * up


@mistake("swiglu", id="swiglu_silu_on_up")
class SwiGLUSiluOnUp(_SwiGLU):
    def act(self, gate, up):
        return gate * nn.functional.silu(up)


@mistake("swiglu", id="swiglu_silu_after_product")
class SwiGLUSiluAfterProduct(_SwiGLU):
    def act(self, gate, up):
        return nn.functional.silu(gate * up)


@mistake("swiglu", id="swiglu_sigmoid_gate")
class SwiGLUSigmoid(_SwiGLU):
    def act(self, gate, up):
        return torch.sigmoid(gate) * up


@mistake("swiglu", id="swiglu_gelu")
class SwiGLUGelu(_SwiGLU):
    def act(self, gate, up):
        return nn.functional.gelu(gate) * up


@mistake("swiglu", id="swiglu_gelu_tanh")
class GeGLUTanh(_SwiGLU):
    """Real code: Gemma's GeGLU, the tanh-approximate GELU; it was rejected unnamed."""

    def act(self, gate, up):
        return nn.functional.gelu(gate, approximate="tanh") * up


@mistake("swiglu", id="swiglu_up_unused")
class SwiGLUUpUnused(_SwiGLU):
    def act(self, gate, up):
        return nn.functional.silu(gate)


@mistake("swiglu", id="swiglu_relu_gate")
class SwiGLUReLU(_SwiGLU):
    def act(self, gate, up):
        return torch.relu(gate) * up


@mistake("swiglu", id="swiglu_no_activation")
class SwiGLUBilinear(_SwiGLU):
    def act(self, gate, up):
        return gate * up


@mistake("swiglu", id="swiglu_default_hidden")
class SwiGLUHidden4d(_SwiGLU):
    @staticmethod
    def hidden(d_model):
        return 4 * d_model


@mistake("swiglu", id="bias_by_default")
class SwiGLUWithBiases(_SwiGLU):
    bias = True


@alternative("swiglu")
class SwiGLUByHand(_SwiGLU):
    def act(self, gate, up):
        return gate * torch.sigmoid(gate) * up


@alternative("swiglu")
class SwiGLUEinsum(_SwiGLU):
    def forward(self, x):
        gate = torch.einsum("...d,fd->...f", x, self.w_gate.weight)
        up = torch.einsum("...d,fd->...f", x, self.w_up.weight)
        return torch.einsum("...f,df->...d", nn.functional.silu(gate) * up, self.w_down.weight)


@alternative("swiglu")
class SwiGLUIntegerRounding(_SwiGLU):
    @staticmethod
    def hidden(d_model):
        return int(2 * (4 * d_model) / 3)


# ----------------------------------------------------------------------------- rotary_attention
class _Rotary(nn.Module):
    """Rotary grouped-query self-attention with the exercise's names; ``mode`` selects a
    mistake."""

    mode = "correct"
    kv_full = False
    bias = False

    def __init__(self, d_model, n_heads, n_kv_heads, base=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.base = n_heads, n_kv_heads, base
        self.d_head = d_model // n_heads
        kv = d_model if self.kv_full else n_kv_heads * self.d_head
        self.w_q = nn.Linear(d_model, d_model, bias=self.bias)
        self.w_k = nn.Linear(d_model, kv, bias=self.bias)
        self.w_v = nn.Linear(d_model, kv, bias=self.bias)
        self.w_o = nn.Linear(d_model, d_model, bias=self.bias)

    def rotate(self, t):
        base = 10000.0 if self.mode == "base_ignored" else self.base
        return rope(t, base=base)

    def forward(self, x):
        B, T, D = x.shape
        H, G, dh = self.n_heads, self.n_kv_heads, self.d_head
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        if self.kv_full:
            G = H
        if self.mode == "before_split":
            q, k = self.rotate(q), self.rotate(k)
        if self.mode == "heads_as_positions":
            q = self.rotate(q.view(B, T, H, dh)).transpose(1, 2)  # (B, H, T, dh)
            k = self.rotate(k.view(B, T, G, dh)).transpose(1, 2)
        else:
            q, k = split_heads(q, H), split_heads(k, G)
        v = split_heads(v, G)
        if self.mode in ("correct", "values", "base_ignored", "repeat", "no_mask", "mask_on_cpu"):
            q, k = self.rotate(q), self.rotate(k)
        if self.mode == "values":
            v = self.rotate(v)
        if self.mode == "queries_only":
            q = self.rotate(q)
        if self.mode == "repeat":
            k, v = k.repeat(1, H // G, 1, 1), v.repeat(1, H // G, 1, 1)
        else:
            k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
        on = None if self.mode == "mask_on_cpu" else x.device
        mask = torch.ones(T, T, dtype=torch.bool, device=on).tril()
        out, w = sdpa(q, k, v, None if self.mode == "no_mask" else mask)
        return self.w_o(merge_heads(out)), w


@mistake("rotary_attention", id="wrong_device")
class RotaryMaskOnCpu(_Rotary):
    """Right on the CPU; the causal mask is built there whatever x's device."""

    mode = "mask_on_cpu"


@mistake("rotary_attention", id="rope_not_applied")
class RotaryNoRope(_Rotary):
    mode = "none"


@mistake("rotary_attention", id="rope_on_values")
class RotaryValuesRotated(_Rotary):
    mode = "values"


@mistake("rotary_attention", id="rope_queries_only")
class RotaryQueriesOnly(_Rotary):
    mode = "queries_only"


@mistake("rotary_attention", id="rope_before_split")
class RotaryBeforeSplit(_Rotary):
    mode = "before_split"


@mistake("rotary_attention", id="rope_heads_as_positions")
class RotaryHeadsAsPositions(_Rotary):
    mode = "heads_as_positions"


@mistake("rotary_attention", id="rope_base_ignored")
class RotaryBaseIgnored(_Rotary):
    mode = "base_ignored"


@mistake("rotary_attention", id="gqa_repeat")
class RotaryRepeatTiles(_Rotary):
    mode = "repeat"


@mistake("rotary_attention", id="rotary_no_causal_mask")
class RotaryNoMask(_Rotary):
    mode = "no_mask"


@mistake("rotary_attention", id="gqa_full_projections")
class RotaryFullKV(_Rotary):
    kv_full = True


@mistake("rotary_attention", id="bias_by_default")
class RotaryBiases(_Rotary):
    bias = True


@mistake("rotary_attention", id="rotary_rotate_half")
class RotaryRotateHalf(_Rotary):
    """Rotary positions as in Hugging Face's Llama code, pairing feature i with i + d/2."""

    def rotate(self, t):
        T, d = t.shape[-2], t.shape[-1]
        inv = self.base ** (-torch.arange(0, d, 2, dtype=t.dtype) / d)
        angles = torch.arange(T, dtype=t.dtype)[:, None] * inv  # (T, d/2)
        cos = torch.cat([angles.cos(), angles.cos()], -1)
        sin = torch.cat([angles.sin(), angles.sin()], -1)
        rotated_half = torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1)
        return t * cos + rotated_half * sin


@mistake("rotary_attention", id="gqa_no_scale")
class RotaryNoScale(_Rotary):
    def forward(self, x):
        B, T, _ = x.shape
        H, G = self.n_heads, self.n_kv_heads
        q = self.rotate(split_heads(self.w_q(x), H))
        k = self.rotate(split_heads(self.w_k(x), G)).repeat_interleave(H // G, 1)
        v = split_heads(self.w_v(x), G).repeat_interleave(H // G, 1)
        scores = q @ k.transpose(-2, -1)  # forgot / sqrt(d_head)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        w = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        return self.w_o(merge_heads(w @ v)), w


@mistake("rotary_attention", id="scale_by_d_model")
class RotaryScaledByDModel(_Rotary):
    def forward(self, x):
        B, T, D = x.shape
        H, G = self.n_heads, self.n_kv_heads
        q = self.rotate(split_heads(self.w_q(x), H)) * math.sqrt(self.d_head / D)
        k = self.rotate(split_heads(self.w_k(x), G)).repeat_interleave(H // G, 1)
        v = split_heads(self.w_v(x), G).repeat_interleave(H // G, 1)
        out, w = sdpa(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())  # q.k / sqrt(D)
        return self.w_o(merge_heads(out)), w


class _RotaryOwnTables(_Rotary):
    """Cos and sin tables for up to ``max_len`` positions built once in __init__ (float64,
    cast to the input's dtype), adjacent pairs rotated by hand."""

    exponent = 2  # angle of pair i: p * base^(-exponent * i / d_head)
    sign = 1.0

    def __init__(self, d_model, n_heads, n_kv_heads, base=10000.0, max_len=256):
        super().__init__(d_model, n_heads, n_kv_heads, base)
        i = torch.arange(self.d_head // 2, dtype=torch.float64)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * base ** (
            -self.exponent * i / self.d_head
        )  # (max_len, d_head / 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", self.sign * angles.sin(), persistent=False)

    def rotate(self, t):
        T = t.shape[-2]
        cos, sin = self.cos[:T].to(t.dtype), self.sin[:T].to(t.dtype)
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


@mistake("rotary_attention", id="rope_reversed")
class RotaryReversed(_RotaryOwnTables):
    sign = -1.0


@mistake("rotary_attention", id="rope_half_exponent")
class RotaryHalfExponent(_RotaryOwnTables):
    exponent = 1


@mistake("rotary_attention", id="split_view_without_transpose")
class RotarySplitByView(_Rotary):
    def forward(self, x):
        B, T, D = x.shape
        H, G, dh = self.n_heads, self.n_kv_heads, self.d_head
        q = self.rotate(self.w_q(x).view(B, H, T, dh))  # should be view(B, T, H, dh).transpose
        k = self.rotate(self.w_k(x).view(B, G, T, dh)).repeat_interleave(H // G, 1)
        v = self.w_v(x).view(B, G, T, dh).repeat_interleave(H // G, 1)
        out, w = sdpa(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
        return self.w_o(merge_heads(out)), w


@mistake("rotary_attention", id="merge_without_transpose")
class RotaryMergeByReshape(_Rotary):
    def forward(self, x):
        B, T, D = x.shape
        H, G = self.n_heads, self.n_kv_heads
        q = self.rotate(split_heads(self.w_q(x), H))
        k = self.rotate(split_heads(self.w_k(x), G)).repeat_interleave(H // G, 1)
        v = split_heads(self.w_v(x), G).repeat_interleave(H // G, 1)
        out, w = sdpa(q, k, v, torch.ones(T, T, dtype=torch.bool).tril())
        return self.w_o(out.reshape(B, T, D)), w  # (B, H, T, dh) read as (B, T, D)


@alternative("rotary_attention")
class RotaryOwnTables(_RotaryOwnTables):
    """Cos/sin tables built once in __init__ for up to max_len positions; the key/value
    heads repeated first and the repeated keys rotated (the same rotation, H // G times)."""

    def forward(self, x):
        T = x.shape[1]
        H, G = self.n_heads, self.n_kv_heads
        q = split_heads(self.w_q(x), H)
        k = split_heads(self.w_k(x), G).repeat_interleave(H // G, 1)
        v = split_heads(self.w_v(x), G).repeat_interleave(H // G, 1)
        q, k = self.rotate(q), self.rotate(k)
        out, w = sdpa(q, k, v, torch.ones(T, T, dtype=torch.bool, device=x.device).tril())
        return self.w_o(merge_heads(out)), w


@alternative("rotary_attention")
class RotaryComplexNumbers(_Rotary):
    """Pairs as complex numbers multiplied by e^{i p w} (as Meta's Llama code does)."""

    def rotate(self, t):
        T, d = t.shape[-2], t.shape[-1]
        on = dict(dtype=torch.float64, device=t.device)
        w = self.base ** (-torch.arange(0, d, 2, **on) / d)
        angles = torch.arange(T, **on)[:, None] * w  # (T, d/2)
        turn = torch.polar(torch.ones_like(angles), angles)  # (T, d/2) complex128
        z = torch.view_as_complex(t.double().reshape(*t.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(z * turn).flatten(-2).to(t.dtype)


@alternative("rotary_attention")
class RotaryEinsumExpand(_Rotary):
    """Own cos/sin tables, einsum scores, expand + reshape for the groups, -inf masking."""

    def forward(self, x):
        B, T, D = x.shape
        H, G, dh = self.n_heads, self.n_kv_heads, self.d_head
        q = self.w_q(x).view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh)
        k = self.w_k(x).view(B, T, G, dh).transpose(1, 2)  # (B, G, T, dh)
        v = self.w_v(x).view(B, T, G, dh).transpose(1, 2)
        pos = torch.arange(T, dtype=x.dtype, device=x.device)
        inv = 1.0 / self.base ** (torch.arange(0, dh, 2, dtype=x.dtype, device=x.device) / dh)
        cos, sin = torch.cos(pos[:, None] * inv), torch.sin(pos[:, None] * inv)  # (T, dh/2)

        def rot(t):
            even, odd = t[..., 0::2], t[..., 1::2]
            out = torch.empty_like(t)
            out[..., 0::2] = even * cos - odd * sin
            out[..., 1::2] = even * sin + odd * cos
            return out

        q, k = rot(q), rot(k)
        k = k[:, :, None].expand(B, G, H // G, T, dh).reshape(B, H, T, dh)  # (B, H, T, dh)
        v = v[:, :, None].expand(B, G, H // G, T, dh).reshape(B, H, T, dh)
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(dh)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        w = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", w, v)
        return self.w_o(out.transpose(1, 2).reshape(B, T, D)), w
