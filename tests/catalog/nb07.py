"""Catalog for notebook 07: decoder_layer and transformer (module exercises: each entry is
a class)."""

import math

import torch
from torch import nn

import attention_ref
from attention_ref import DecoderLayer, Encoder, FeedForward, MultiHeadAttention
from attention_ref.encoder import init_embedding
from attention_ref.positional import sinusoidal_encoding

from . import alternative, mistake

# ----------------------------------------------------------------------------- decoder_layer


class _DecoderBase(nn.Module):
    """The right parts; subclasses write forward (a knob per mistake)."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def run(self, y, memory, self_mask, memory_mask, *, kv="memory", residual=True, nf=None):
        nf = self.norm_first if nf is None else nf

        def cross(h):
            kv_ = memory if kv == "memory" else h
            return self.cross_attn(h, kv_, kv_, memory_mask if kv == "memory" else None)

        blocks = (
            (lambda h: self.self_attn(h, h, h, self_mask), self.norm1, self.dropout1),
            (cross, self.norm2, self.dropout2),
            (lambda h: (self.ff(h), None), self.norm3, self.dropout3),
        )
        ws = []
        for fn, norm, drop in blocks:
            if nf:
                a, w = fn(norm(y))
                y = y + drop(a) if residual else drop(a)
            else:
                a, w = fn(y)
                y = norm(y + drop(a) if residual else drop(a))
            ws.append(w)
        return y, ws[0], ws[1]


@mistake("decoder_layer", id="dropout_on_residual_stream")
class DecoderDropoutOnResidualSum(_DecoderBase):
    """Each dropout moved across the add: norm(drop(y + a)) and, pre-norm, drop(y + a)."""

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        blocks = (
            (lambda h: self.self_attn(h, h, h, self_mask), self.norm1, self.dropout1),
            (lambda h: self.cross_attn(h, memory, memory, memory_mask), self.norm2, self.dropout2),
            (lambda h: (self.ff(h), None), self.norm3, self.dropout3),
        )
        ws = []
        for fn, norm, drop in blocks:
            if self.norm_first:
                a, w = fn(norm(y))
                y = drop(y + a)
            else:
                a, w = fn(y)
                y = norm(drop(y + a))
            ws.append(w)
        return y, ws[0], ws[1]


@mistake("decoder_layer", id="decoder_self_mask_ignored")
class DecoderNoCausalMask(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, None, memory_mask)


@mistake("decoder_layer", id="unexpected_parameters")
class DecoderLearnedOutputScale(_DecoderBase):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.out_scale = nn.Parameter(torch.ones(d_model))

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        out, w_self, w_cross = self.run(y, memory, self_mask, memory_mask)
        return out * self.out_scale, w_self, w_cross


@mistake("decoder_layer", id="cross_kv_from_decoder")
class DecoderCrossKeysFromDecoder(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask, kv="decoder")


@mistake("decoder_layer", id="decoder_memory_mask_ignored")
class DecoderMemoryMaskIgnored(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, None)


@mistake("decoder_layer", id="decoder_residual_missing")
class DecoderNoResidual(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask, residual=False)


@mistake("decoder_layer", id="decoder_norm_order")
class DecoderAlwaysPreNorm(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask, nf=True)


@mistake("decoder_layer", id="reference_used")
class DecoderCallsReference(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return DecoderLayer.forward(self, y, memory, self_mask, memory_mask)


@mistake("decoder_layer", id="reference_used")
class DecoderCallsTorch(_DecoderBase):
    def forward(self, y, memory, self_mask=None, memory_mask=None):
        D = y.shape[-1]
        layer = nn.TransformerDecoderLayer(D, self.self_attn.n_heads, 8, 0.0, batch_first=True)
        out = layer.to(y.dtype)(y, memory)
        return out, None, None


@mistake("decoder_layer", id="dropout_not_passed_on")
class DecoderAttnDropoutMissing(_DecoderBase):
    """Dropout on every sub-layer's output, none on the attention weights."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask)


@mistake("decoder_layer", id="sublayer_dropout_missing")
class DecoderNoCrossDropout(_DecoderBase):
    """dropout1 and dropout3 on their sub-layers' outputs, but the cross-attention's output
    added undropped (an identity where dropout2 belongs)."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.dropout2 = nn.Identity()

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask)


@alternative("decoder_layer")
class DecoderWithSublayerHelper(_DecoderBase):
    """A helper that wraps any sub-layer in residual + dropout + norm, in either order."""

    def _sub(self, y, norm, drop, fn):
        if self.norm_first:
            out, w = fn(norm(y))
            return y + drop(out), w
        out, w = fn(y)
        return norm(y + drop(out)), w

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        y, w_self = self._sub(
            y, self.norm1, self.dropout1, lambda h: self.self_attn(h, h, h, self_mask)
        )
        y, w_cross = self._sub(
            y, self.norm2, self.dropout2, lambda h: self.cross_attn(h, memory, memory, memory_mask)
        )
        y, _ = self._sub(y, self.norm3, self.dropout3, lambda h: (self.ff(h), None))
        return y, w_self, w_cross


class _OwnMHA(nn.Module):
    """Multi-head attention written with einsum (same parameter names as the reference)."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.h, self.drop = n_heads, nn.Dropout(dropout)
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, q, k, v, mask=None):
        B, Tq, D = q.shape
        Tk, dh = k.shape[1], D // self.h
        q = self.w_q(q).view(B, Tq, self.h, dh)
        k = self.w_k(k).view(B, Tk, self.h, dh)
        v = self.w_v(v).view(B, Tk, self.h, dh)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
        if mask is not None:
            if mask.dim() == 3:
                mask = mask[:, None]
            mask = mask.expand_as(s)
            s = s.masked_fill(~mask, float("-inf"))
            w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        else:
            w = torch.softmax(s, dim=-1)
        w = self.drop(w)
        out = torch.einsum("bhqk,bkhd->bqhd", w, v).reshape(B, Tq, D)
        return self.w_o(out), w


class _OwnFF(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


@alternative("decoder_layer")
class DecoderOwnParts(nn.Module):
    """Everything written by hand (einsum attention, own FFN), two explicit branches,
    functional dropout."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = _OwnMHA(d_model, n_heads, dropout)
        self.cross_attn = _OwnMHA(d_model, n_heads, dropout)
        self.ff = _OwnFF(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.norm_first, self.p = norm_first, dropout

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        def d(t):
            return nn.functional.dropout(t, self.p, self.training)

        if self.norm_first:
            h = self.norm1(y)
            a, ws = self.self_attn(h, h, h, self_mask)
            y = y + d(a)
            a, wc = self.cross_attn(self.norm2(y), memory, memory, memory_mask)
            y = y + d(a)
            return y + d(self.ff(self.norm3(y))), ws, wc
        a, ws = self.self_attn(y, y, y, self_mask)
        y = self.norm1(y + d(a))
        a, wc = self.cross_attn(y, memory, memory, memory_mask)
        y = self.norm2(y + d(a))
        return self.norm3(y + d(self.ff(y))), ws, wc


class _LazyFusedMHA(nn.Module):
    """A fused, lazy q/k/v projection (kv fused for cross-attention) with weight dropout."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.h, self.d = n_heads, d_model
        self.q_proj, self.kv_proj = nn.LazyLinear(d_model), nn.LazyLinear(2 * d_model)
        self.out = nn.LazyLinear(d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, mask=None):
        B, Tq, D = q.shape
        q = self.q_proj(q).view(B, Tq, self.h, -1).transpose(1, 2)
        k, v = self.kv_proj(k).split(D, dim=-1)
        k, v = (t.view(B, -1, self.h, D // self.h).transpose(1, 2) for t in (k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(D // self.h)
        if mask is not None:
            s = s.masked_fill(~(mask if mask.dim() != 3 else mask[:, None]), float("-inf"))
        w = self.attn_dropout(torch.softmax(s, dim=-1).nan_to_num(0.0))
        return self.out((w @ v).transpose(1, 2).reshape(B, Tq, D)), w


class _NoReLUFF(nn.Module):
    """The learner's notebook-06 FeedForward, still wrong (no ReLU), with lazy layers."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1, self.linear2 = nn.LazyLinear(d_ff), nn.LazyLinear(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))


@alternative("decoder_layer")
class DecoderOwnEarlierParts(_DecoderBase):
    """A right layer on the learner's own earlier parts: lazy, fused attention and a
    feed-forward network that still fails notebook 06. The check grades the layer with the
    reference parts, so neither crashes it nor costs points again."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = _LazyFusedMHA(d_model, n_heads, dropout)
        self.cross_attn = _LazyFusedMHA(d_model, n_heads, dropout)
        self.ff = _NoReLUFF(d_model, d_ff, dropout)

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        return self.run(y, memory, self_mask, memory_mask)


# ----------------------------------------------------------------------------- transformer


class _TransformerBase(nn.Module):
    """The right parts (reference Encoder and DecoderLayer); forward has knobs."""

    layer_cls = DecoderLayer

    def __init__(
        self, src_vocab, tgt_vocab, d_model=64, n_heads=4, n_layers=2, d_ff=128,
        dropout=0.0, max_len=256, pad_id=0, norm_first=False,
    ):  # fmt: skip
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.encoder = Encoder(
            src_vocab, d_model, n_heads, d_ff, n_layers, dropout, max_len, pad_id, norm_first
        )
        self.tgt_embed = init_embedding(nn.Embedding(tgt_vocab, d_model))
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.decoder_layers = nn.ModuleList(
            self.layer_cls(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src, encoder_causal=False):
        src_mask = (src != self.pad_id)[:, None, None, :]
        enc_mask = src_mask
        if encoder_causal:
            S = src.shape[1]
            enc_mask = src_mask & torch.ones(S, S, dtype=torch.bool, device=src.device).tril()
        return self.encoder(src, enc_mask)[0], src_mask

    def decode(
        self, tgt_in, memory, src_mask, *, causal=True, scale=True, final=True, mm=True, drop=True
    ):
        T = tgt_in.shape[1]
        y = self.tgt_embed(tgt_in) * (math.sqrt(self.d_model) if scale else 1.0)
        y = y + self.pe[:T].to(y.dtype)
        y = self.dropout(y) if drop else y
        mask = (tgt_in != self.pad_id)[:, None, None, :]
        if causal:
            mask = mask & torch.ones(T, T, dtype=torch.bool, device=y.device).tril()
        for layer in self.decoder_layers:
            y = layer(y, memory, mask, src_mask if mm else None)[0]
        return self.out_proj(self.final_norm(y) if final else y)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


@mistake("transformer", id="transformer_no_causal_mask")
class TransformerNoCausal(_TransformerBase):
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src), causal=False)


@mistake("transformer", id="transformer_causal_encoder")
class TransformerCausalEncoder(_TransformerBase):
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src, encoder_causal=True))


@mistake("transformer", id="transformer_memory_mask_not_passed")
class TransformerNoMemoryMask(_TransformerBase):
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src), mm=False)


@mistake("transformer", id="tgt_embed_not_scaled")
class TransformerNoScale(_TransformerBase):
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src), scale=False)


@mistake("transformer", id="tgt_embedding_dropout_missing")
class TransformerNoTargetDropout(_TransformerBase):
    """Right in eval mode; in training mode the target embeddings are never dropped."""

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src), drop=False)


@mistake("transformer", id="transformer_final_norm_missing")
class TransformerNoFinalNorm(_TransformerBase):
    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src), final=False)


@mistake("transformer", id="reference_used")
class TransformerCallsTorch(_TransformerBase):
    def forward(self, src, tgt_in):
        D = self.d_model
        core = nn.Transformer(D, 2, 1, 1, 8, 0.0, batch_first=True).to(self.out_proj.weight.dtype)
        x = core(self.encoder.embed(src), self.tgt_embed(tgt_in))
        return self.out_proj(x)


@mistake("transformer", id="reference_used")
class TransformerCallsReference(_TransformerBase):
    def forward(self, src, tgt_in):
        ref = attention_ref.Transformer(self.encoder.embed.num_embeddings, 5)
        return ref(src, tgt_in)


@alternative("transformer")
class TransformerReferenceLayers(_TransformerBase):
    """The straightforward version (reference Encoder and DecoderLayer)."""


@alternative("transformer")
class TransformerCausalOnlyOwnLoop(nn.Module):
    """Causal mask only (no target padding in the self mask: it changes only the padded
    positions, which the loss ignores), positions computed inline, weights collected."""

    def __init__(
        self, src_vocab, tgt_vocab, d_model=64, n_heads=4, n_layers=2, d_ff=128,
        dropout=0.0, max_len=256, pad_id=0, norm_first=False,
    ):  # fmt: skip
        super().__init__()
        self.pad_id, self.scale = pad_id, d_model**0.5
        self.encoder = Encoder(
            src_vocab, d_model, n_heads, d_ff, n_layers, dropout, max_len, pad_id, norm_first
        )
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        nn.init.normal_(self.tgt_embed.weight, std=d_model**-0.5)  # the paper's scheme
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)]
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.out_proj = nn.Linear(d_model, tgt_vocab)
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
        self.register_buffer("pe", pe.float(), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src):
        keep = src.ne(self.pad_id).unsqueeze(1).unsqueeze(2)
        memory, _ = self.encoder(src)  # the default mask is the same padding mask
        return memory, keep

    def decode(self, tgt_in, memory, src_mask):
        T = tgt_in.shape[1]
        y = self.dropout(self.tgt_embed(tgt_in) * self.scale + self.pe[:T].to(memory.dtype))
        causal = torch.tril(torch.ones(T, T, device=y.device)).bool()
        for layer in self.decoder_layers:
            y, _, _ = layer(y, memory, self_mask=causal, memory_mask=src_mask)
        return self.out_proj(self.final_norm(y))

    def forward(self, src, tgt_in):
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)


@mistake("transformer", id="tgt_embed_init")
class TransformerEmbeddingDefaultInit(_TransformerBase):
    """tgt_embed left at nn.Embedding's N(0, 1): the scaled tokens drown the positions."""

    def __init__(self, src_vocab, tgt_vocab, d_model=64, *args, **kwargs):
        super().__init__(src_vocab, tgt_vocab, d_model, *args, **kwargs)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)


@mistake("transformer", id="pad_id_not_stored")
class TransformerNoPadId(_TransformerBase):
    """pad_id kept under another name: greedy_decode reads model.pad_id."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pad, self.pad_id = self.pad_id, None

    def encode(self, src, encoder_causal=False):
        src_mask = (src != self.pad)[:, None, None, :]
        return self.encoder(src, src_mask)[0], src_mask


class _LayerNoResidual(DecoderLayer):
    """The learner's decoder layer, still wrong (no residual connections)."""

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        a, ws = self.self_attn(y, y, y, self_mask)
        y = self.norm1(a)
        a, wc = self.cross_attn(y, memory, memory, memory_mask)
        y = self.norm2(a)
        return self.norm3(self.ff(y)), ws, wc


@alternative("transformer")
class TransformerOwnBuggyLayersLazyOut(_TransformerBase):
    """A right Transformer on the learner's decoder layer that still fails its exercise,
    with a lazy output projection: graded with the reference DecoderLayer, it passes."""

    layer_cls = _LayerNoResidual

    def __init__(self, src_vocab, tgt_vocab, d_model=64, *args, **kwargs):
        super().__init__(src_vocab, tgt_vocab, d_model, *args, **kwargs)
        self.out_proj = nn.LazyLinear(tgt_vocab)


class _StubDecoderLayer(nn.Module):
    """Exercise 1 as the student notebook gives it: not written yet."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        raise NotImplementedError()

    def forward(self, y, memory, self_mask=None, memory_mask=None):
        raise NotImplementedError()


#: A notebook's namespace where exercise 1 (DecoderLayer) is still the stub.
_STUB_NOTEBOOK = {"Base": _TransformerBase, "DecoderLayer": _StubDecoderLayer}
exec(  # noqa: S102 - a notebook's answer cell, run in its own namespace
    """
class TransformerOnStubDecoderLayer(Base):
    # the decoder layers are built from the notebook's DecoderLayer, by its name
    layer_cls = property(lambda self: DecoderLayer)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))
""",
    _STUB_NOTEBOOK,
)
alternative(
    "transformer",
    check_only="exercise 1 (DecoderLayer) is still the stub in its namespace: graded with the "
    "reference DecoderLayer, it passes here, and exercise 1 alone loses its points",
)(_STUB_NOTEBOOK["TransformerOnStubDecoderLayer"])
