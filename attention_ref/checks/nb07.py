"""Checks for notebook 07: the module exercises ``decoder_layer`` and ``transformer``.

No cascading penalties: the decoder layer is graded with the reference
``MultiHeadAttention`` and ``FeedForward`` in place of the learner's, the Transformer with
the reference ``DecoderLayer`` in place of the learner's (each with the learner's dropout
probability), so a bug in an earlier exercise costs points once.

``decoder_layer``: the learner's ``DecoderLayer(d_model, n_heads, d_ff, dropout=0.0,
norm_first=False)`` must hold ``self_attn`` and ``cross_attn`` (``MultiHeadAttention``
with ``w_q, w_k, w_v, w_o``), ``ff`` (``FeedForward`` with ``linear1, linear2``) and
``norm1, norm2, norm3``. Known weights are copied in by name and ``forward(y, memory,
self_mask, memory_mask) -> (out, self_weights, cross_weights)`` is compared with the
reference in float64; mistakes are named by running buggy variants of the reference
(self mask ignored, keys and values of the cross-attention taken from the decoder, memory
mask ignored, no residual, the other norm order).

``transformer``: the learner's ``Transformer(src_vocab, tgt_vocab, d_model, n_heads,
n_layers, d_ff, dropout=0.0, max_len=256, pad_id=0, norm_first=False)`` must hold
``encoder`` (an ``attention_ref.Encoder`` or the same names), ``tgt_embed``,
``decoder_layers``, ``final_norm`` and ``out_proj``; the reference's weights are loaded
with ``load_state_dict`` and the logits at the real target positions compared, then
causality and source-padding invariance are checked as properties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .. import decoder as ref_dec
from .. import encoder as ref_enc
from .. import multihead as ref_mha
from .. import transformer as ref_tf
from . import _models as M
from ._core import Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    MODEL_TOL,
    TOL,
    build_module,
    dropout_p,
    dtype_name,
    expect_dropout_applied,
    load_reference_weights,
    materialize_with,
    randomize_parameters,
    same_in_both_modes,
    substitute,
)

# ----------------------------------------------------------------------------- decoder_layer
DEC_SPECS = {
    "self_attn": "MultiHeadAttention(d_model, n_heads, dropout=dropout) (from attention_ref)",
    "cross_attn": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "ff": "FeedForward(d_model, d_ff, dropout) (from attention_ref or notebook 06)",
    "norm1": "nn.LayerNorm(d_model)",
    "norm2": "nn.LayerNorm(d_model)",
    "norm3": "nn.LayerNorm(d_model)",
}


def _dec_substitute(ctx, mod, D, H, Fd, case) -> None:
    """Grade the layer with the reference attention (notebook 04) and feed-forward network
    (notebook 06) in place of the learner's, each with the learner's dropout probability."""

    def mha(p):
        return ref_mha.MultiHeadAttention(D, H, dropout=p)

    parts = {"self_attn": mha, "cross_attn": mha, "ff": lambda p: ref_enc.FeedForward(D, Fd, p)}
    for name, make in parts.items():
        substitute(ctx, mod, name, make, case, DEC_SPECS[name])


def decoder_model(
    r: ref_dec.DecoderLayer,
    y: torch.Tensor,
    memory: torch.Tensor,
    self_mask,
    memory_mask,
    *,
    norm_first: bool,
    use_self_mask: bool = True,
    use_memory_mask: bool = True,
    kv_from: str = "correct",
    residual: bool = True,
    norm_order: str = "correct",
):
    """The decoder layer ``(out, self_weights, cross_weights)`` in float64 with the
    reference's sub-modules, one knob per mistake (each knob's right value is its default):
    ``kv_from`` "decoder" (keys and values of the cross-attention from the decoder's own
    states); ``residual=False`` drops every skip connection; ``norm_order`` "flipped" (the
    other norm order than ``norm_first`` asks for)."""
    sm = self_mask if use_self_mask else None
    mm = memory_mask if use_memory_mask else None

    def self_block(h):
        return r.self_attn(h, h, h, sm)

    def cross_block(h):
        if kv_from == "correct":  # from the encoder's memory
            return r.cross_attn(h, memory, memory, mm)
        return r.cross_attn(h, h, h, None)

    def ff_block(h):
        return r.ff(h), None

    x, ws = y, []

    def keeping_weights(fn):
        def f(h):
            a, w = fn(h)
            ws.append(w)
            return a

        return f

    pre_norm = norm_first if norm_order == "correct" else not norm_first  # or "flipped"
    order = "pre" if pre_norm else "post"
    for fn, norm in ((self_block, r.norm1), (cross_block, r.norm2), (ff_block, r.norm3)):
        x = M.sublayer(x, keeping_weights(fn), norm, order, residual=residual)
    return x, ws[0], ws[1]


#: The decoder layer's mistake models: (id, the model's options, the cases it shows on: a
#: "self_mask" or a "memory_mask" given, "any"), tried in this order.
DEC_MISTAKES = [
    ("decoder_self_mask_ignored", dict(use_self_mask=False), "self_mask"),
    ("decoder_memory_mask_ignored", dict(use_memory_mask=False), "memory_mask"),
    ("decoder_cross_kv_from_decoder", dict(kv_from="decoder"), "any"),
    ("decoder_residual_missing", dict(residual=False), "any"),
    ("decoder_norm_order", dict(norm_order="flipped"), "any"),
]


def _dec_mistakes(r, y, memory, sm, mm, norm_first, which: int) -> list[Mistake]:
    """The mistake models that apply to these masks; ``which`` 0 = out, 1 = self_weights,
    2 = cross_weights."""
    shows_on = {"any"} | {n for n, m in (("self_mask", sm), ("memory_mask", mm)) if m is not None}
    computed = {"computed": "post-norm" if norm_first else "pre-norm", "norm_first": norm_first}
    params = {"decoder_norm_order": computed}

    def model(kw):
        return lambda: decoder_model(r, y, memory, sm, mm, norm_first=norm_first, **kw)[which]

    return [
        Mistake.of(i, model=model(kw), **params.get(i, {}))
        for i, kw, shows in DEC_MISTAKES
        if shows in shows_on
    ]


def _dec_forbidden():
    return [
        (ref_dec.DecoderLayer.forward, "the reference attention_ref.DecoderLayer"),
        (ref_dec.Decoder.forward, "the reference attention_ref.Decoder"),
        (nn.TransformerDecoderLayer.forward, "torch.nn.TransformerDecoderLayer"),
        (nn.TransformerDecoder.forward, "torch.nn.TransformerDecoder"),
        (nn.MultiheadAttention.forward, "torch.nn.MultiheadAttention"),
        *BUILTIN_ATTENTION,
    ]


@dataclass
class DecCase:
    label: str
    D: int
    H: int
    Fd: int
    norm_first: bool | None
    B: int
    T: int
    S: int
    causal: bool = False
    lengths: tuple[int, ...] | None = None  # source lengths -> memory_mask (B, 1, 1, S)
    self_mask_4d: bool = False  # causal AND target padding as (B, 1, T, T)


def _dec_cases(ctx: Context) -> list[DecCase]:
    cases = [
        DecCase("post-norm (the defaults), no masks, T=4, S=6", 8, 2, 16, None, 2, 4, 6),
        DecCase("pre-norm, no masks, T=4, S=6", 8, 2, 16, True, 2, 4, 6),
        DecCase(
            "post-norm, a causal self_mask (5, 5) and a memory_mask (3, 1, 1, 6) for source "
            "lengths 6, 3, 1",
            *(8, 2, 12, False, 3, 5, 6),
            causal=True,
            lengths=(6, 3, 1),
        ),
        DecCase(
            "pre-norm, a causal self_mask (5, 5) and a memory_mask (3, 1, 1, 6) for source "
            "lengths 6, 3, 1",
            *(8, 4, 12, True, 3, 5, 6),
            causal=True,
            lengths=(6, 3, 1),
        ),
        DecCase("pre-norm, one target token, a batch of one, one head", 6, 1, 8, True, 1, 1, 3),
        DecCase(
            "post-norm, self_mask (2, 1, 4, 4) causal and target padding, S=3",
            *(12, 3, 24, False, 2, 4, 3),
            causal=True,
            lengths=(3, 2),
            self_mask_4d=True,
        ),
    ]
    if ctx.thorough:
        cases += [
            DecCase("pre-norm, T=7, S=9, d_model=16, 4 heads", 16, 4, 32, True, 3, 7, 9, True),
            DecCase("post-norm, T=6, S=2, masks", 8, 2, 8, False, 2, 6, 2, True, lengths=(2, 1)),
        ]
    return cases


def _dec_masks(c: DecCase):
    sm = mm = None
    if c.causal:
        sm = torch.ones(c.T, c.T, dtype=torch.bool).tril()
    if c.lengths is not None:
        keep = torch.arange(c.S)[None, :] < torch.tensor(c.lengths)[:, None]  # (B, S)
        mm = keep[:, None, None, :]
    if c.self_mask_4d:
        tgt_keep = torch.ones(c.B, c.T, dtype=torch.bool)
        tgt_keep[-1, c.T - 1 :] = False  # the last target token of the last row is padding
        sm = sm & tgt_keep[:, None, None, :]
    return sm, mm


def _dec_build(cls, ctx, c: DecCase, r, dtype, case, dropout=None) -> nn.Module:
    kwargs = {} if c.norm_first is None else {"norm_first": c.norm_first}
    if dropout is not None:
        kwargs["dropout"] = dropout
    mod = build_module(ctx, cls, (c.D, c.H, c.Fd), kwargs, case)
    _dec_substitute(ctx, mod, c.D, c.H, c.Fd, case)
    mod.to(dtype)
    y0, m0 = torch.zeros(1, 2, c.D, dtype=dtype), torch.zeros(1, 3, c.D, dtype=dtype)
    materialize_with(ctx, mod, lambda: ctx.call(mod, y0, m0, case=case), case)
    load_reference_weights(ctx, mod, r, DEC_SPECS, case)
    mod.eval()
    return mod


def _dec_call(ctx, mod, y, memory, sm, mm, case):
    args = [y, memory]
    if sm is not None or mm is not None:
        args.append(sm)
    if mm is not None:
        args.append(mm)
    got = ctx.call(mod, *args, case=case)
    if isinstance(got, torch.Tensor):
        ctx.fail(
            "forward must return a tuple (out, self_weights, cross_weights); got a single tensor.",
            case=case,
            hint="return y, self_weights, cross_weights (the weights that self.self_attn and "
            "self.cross_attn returned).",
            mistake="wrong_type",
        )
    return ctx.expect_tuple(got, ("out", "self_weights", "cross_weights"), case=case)


@exercise(
    "decoder_layer",
    kind="module",
    forbidden=_dec_forbidden,
    summary="decoder layer: masked self-attention, cross-attention to memory, feed-forward",
)
def check_decoder_layer(cls, ctx: Context) -> None:
    for i, c in enumerate(_dec_cases(ctx)):
        for dtype in (torch.float64, torch.float32):
            _check_dec_case(cls, ctx, c, i, dtype)
    _check_dec_causality(cls, ctx)
    _check_dec_dropout(cls, ctx)


def _check_dec_dropout(cls, ctx: Context) -> None:
    """dropout=0.3: the reference in eval mode; in training mode the output and both
    attention maps are dropped (PyTorch's layer applies its dropout to the weights too)."""
    gen = ctx.torch_gen(795)
    D, H, Fd, T, S = 8, 2, 16, 5, 6
    for nf in (False, True):
        r = ref_dec.DecoderLayer(D, H, Fd, norm_first=nf).double()
        randomize_parameters(r, gen)
        r.eval()
        y = torch.randn(2, T, D, generator=gen, dtype=torch.float64)
        memory = torch.randn(2, S, D, generator=gen, dtype=torch.float64)
        c = DecCase("", D, H, Fd, nf, 2, T, S)
        case = (
            f"DecoderLayer({D}, {H}, {Fd}, dropout=0.3, norm_first={nf}), y (2, {T}, {D}), "
            f"memory (2, {S}, {D}) float64, no masks"
        )
        mod = _dec_build(cls, ctx, c, r, torch.float64, case, dropout=0.3)
        eval_out, eval_self, eval_cross = _dec_call(ctx, mod, y, memory, None, None, case)
        with torch.no_grad():
            e_out = decoder_model(r, y, memory, None, None, norm_first=nf)[0]
        ctx.expect_close(
            eval_out,
            e_out,
            what="out in eval mode",
            case=case + ", eval mode",
            mistakes=_dec_mistakes(r, y, memory, None, None, nf, 0),
            hint="in eval mode dropout does nothing.",
            **TOL[torch.float64],
        )
        mod.train()
        torch.manual_seed(ctx.seed)
        out, w_self, w_cross = _dec_call(ctx, mod, y, memory, None, None, case + ", training")
        training = case + ", training mode"
        expect_dropout_applied(
            ctx, out, eval_out, p=0.3, case=training, mistake="decoder_dropout_ignored"
        )
        for got, ev, name in (
            (w_self, eval_self, "self_attn"),
            (w_cross, eval_cross, "cross_attn"),
        ):
            if same_in_both_modes(got, ev):
                ctx.fail(
                    f"with dropout=0.3 the {name} weights in training mode are the eval-mode "
                    "weights: the attention weights are not dropped. nn.TransformerDecoderLayer "
                    "applies its dropout to the attention weights too.",
                    case=training,
                    mistake=named("dropout_not_passed_on", name=name),
                )


DEC_OUT_HINT = (
    "both attention maps are right; look at the residual connections, the norms and the "
    "feed-forward sub-layer."
)


def _check_dec_case(cls, ctx: Context, c: DecCase, i: int, dtype) -> None:
    gen = ctx.torch_gen(700 + i)
    nf = bool(c.norm_first)
    r = ref_dec.DecoderLayer(c.D, c.H, c.Fd, norm_first=nf).double()
    randomize_parameters(r, gen)
    r = r.to(dtype).double().eval()  # the values the candidate holds, in float64
    y = torch.randn(c.B, c.T, c.D, generator=gen, dtype=torch.float64).to(dtype)
    memory = torch.randn(c.B, c.S, c.D, generator=gen, dtype=torch.float64).to(dtype)
    sm, mm = _dec_masks(c)
    nfs = "" if c.norm_first is None else f", norm_first={c.norm_first}"
    case = (
        f"{c.label}: DecoderLayer({c.D}, {c.H}, {c.Fd}{nfs}), y {tuple(y.shape)}, memory "
        f"{tuple(memory.shape)} {dtype_name(dtype)}"
        + ("" if sm is None else f", self_mask {tuple(sm.shape)}")
        + ("" if mm is None else f", memory_mask {tuple(mm.shape)}")
    )
    mod = _dec_build(cls, ctx, c, r, dtype, case)
    out, w_self, w_cross = _dec_call(ctx, mod, y, memory, sm, mm, case)
    y64, m64 = y.double(), memory.double()
    with torch.no_grad():
        e_out, e_self, e_cross = decoder_model(r, y64, m64, sm, mm, norm_first=nf)
        B, H, T, S = c.B, c.H, c.T, c.S
        if isinstance(w_cross, torch.Tensor) and tuple(w_cross.shape) != (B, H, T, S):
            likely = ""
            if tuple(w_cross.shape) == (B, H, T, T):
                likely = named("cross_kv_from_decoder")
            elif tuple(w_cross.shape) == (B, H, S, T):
                likely = named("cross_q_from_memory")
            ctx.fail(
                f"cross_weights has shape {tuple(w_cross.shape)}, expected (B, H, T, S) = "
                f"{(B, H, T, S)}.",
                case=case,
                likely=likely,
                hint="self.cross_attn(y, memory, memory, memory_mask): queries from the "
                "decoder, keys and values from the encoder.",
                mistake="wrong_shape",
            )
        # which output (the index the mistake models return it at), what came back, expected
        outputs = [
            (1, w_self, e_self, "self_weights"),
            (2, w_cross, e_cross, "cross_weights"),
            (0, out, e_out, "out"),
        ]
        for _, got, exp, what in outputs:
            ctx.expect_array(got, y.new_zeros(exp.shape), what=what, case=case)
        for which, got, exp, what in outputs:
            mistakes = _dec_mistakes(r, y64, m64, sm, mm, nf, which)
            hint = "" if which else DEC_OUT_HINT
            ctx.expect_close(
                got, exp, what=what, case=case, mistakes=mistakes, hint=hint, **TOL[dtype]
            )


def _check_dec_causality(cls, ctx: Context) -> None:
    """With a causal self_mask, changing target positions >= t must not change out[:, :t]."""
    gen = ctx.torch_gen(790)
    D, H, Fd, T, S = 8, 2, 16, 5, 4
    r = ref_dec.DecoderLayer(D, H, Fd).double()
    randomize_parameters(r, gen)
    y = torch.randn(2, T, D, generator=gen, dtype=torch.float64)
    memory = torch.randn(2, S, D, generator=gen, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    case = f"DecoderLayer({D}, {H}, {Fd}), y (2, {T}, {D}) float64, causal self_mask ({T}, {T})"
    mod = _dec_build(cls, ctx, DecCase("", D, H, Fd, None, 2, T, S), r, torch.float64, case)
    base = _dec_call(ctx, mod, y, memory, causal, None, case)[0]
    for t in range(1, T):
        changed = y.clone()
        changed[:, t:] = torch.randn(2, T - t, D, generator=gen, dtype=torch.float64)
        out = _dec_call(ctx, mod, changed, memory, causal, None, case)[0]
        if not torch.allclose(out[:, :t], base[:, :t], **TOL[torch.float64]):
            ctx.fail(
                f"changing the target tokens at positions >= {t} changed the output at "
                f"earlier positions: the future is not masked.",
                case=case,
                mistake="self_mask_not_applied",
            )


# ----------------------------------------------------------------------------- transformer
TF_SPECS = {
    "encoder": "Encoder(src_vocab, d_model, n_heads, d_ff, n_layers, dropout, max_len, "
    "pad_id, norm_first) (from attention_ref)",
    "tgt_embed": "init_embedding(nn.Embedding(tgt_vocab, d_model))",
    "decoder_layers": "nn.ModuleList of n_layers DecoderLayer(d_model, n_heads, d_ff, "
    "dropout, norm_first)",
    "final_norm": "nn.LayerNorm(d_model) if norm_first else nn.Identity()",
    "out_proj": "nn.Linear(d_model, tgt_vocab)",
}


def _tf_prepare(ctx, mod, c: TfCase, case) -> None:
    """Before loading weights: ``pad_id`` is stored, ``tgt_embed`` follows the course's
    initialisation, and the decoder layers are replaced by the reference ``DecoderLayer``
    (the previous exercise; with the learner's dropout and ``norm_first``), so a bug in the
    learner's layer costs points once."""
    pad = getattr(mod, "pad_id", None)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad != c.pad_id:
        ctx.fail(
            f"self.pad_id is {pad!r}, expected {c.pad_id} (the pad_id argument): the spec "
            "asks for it, and greedy_decode reads model.pad_id.",
            case=case,
            mistake="pad_id_not_stored",
        )
    emb = getattr(mod, "tgt_embed", None)
    w = getattr(emb, "weight", None)
    if isinstance(w, torch.Tensor) and not is_lazy(w) and w.dim() == 2 and w.numel() > 1:
        std, want = float(w.detach().double().std()), c.D**-0.5
        if not want / 2 <= std <= 2 * want:
            likely = ""
            if 0.7 <= std <= 1.4:
                likely = named("tgt_embed_init")
            ctx.fail(
                f"tgt_embed.weight has standard deviation {std:.3g} after __init__, expected "
                f"about d_model**-0.5 = {want:.3g} (the course's embedding scheme).",
                case=case,
                likely=likely,
                hint=named("tgt_embed_init").hint,
            )
    layers = getattr(mod, "decoder_layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) != c.L:
        got = type(layers).__name__ if layers is not None else "nothing"
        n = f" of length {len(layers)}" if isinstance(layers, nn.ModuleList) else ""
        ctx.fail(
            f"self.decoder_layers is {got}{n}; expected an nn.ModuleList of n_layers={c.L} "
            "decoder layers.",
            case=case,
            hint="self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, n_heads, d_ff, "
            "dropout, norm_first) for _ in range(n_layers)]).",
        )
    for i, layer in enumerate(layers):
        nf = getattr(layer, "norm_first", None)
        nf = nf if isinstance(nf, bool) else bool(c.norm_first)
        p = dropout_p(layer) if isinstance(layer, nn.Module) else 0.0
        layers[i] = ref_dec.DecoderLayer(c.D, c.H, c.Fd, p, nf)


def transformer_model(
    r: ref_tf.Transformer,
    src: torch.Tensor,
    tgt_in: torch.Tensor,
    *,
    causal: bool = True,
    scale: bool = True,
    pe: bool = True,
    memory_mask: bool = True,
    encoder_causal: bool = False,
    final_norm: bool = True,
) -> torch.Tensor:
    """The reference Transformer's logits with one knob per mistake."""
    S, T, D = src.shape[1], tgt_in.shape[1], r.d_model
    src_mask = (src != r.pad_id)[:, None, None, :]  # (B, 1, 1, S)
    enc_mask = src_mask
    if encoder_causal:
        enc_mask = src_mask & torch.ones(S, S, dtype=torch.bool).tril()
    memory, _ = r.encoder(src, enc_mask)
    y = r.tgt_embed(tgt_in) * (math.sqrt(D) if scale else 1.0)
    if pe:
        y = y + r.pe[:T].to(y.dtype)
    self_mask = ref_tf.target_self_mask(tgt_in, r.pad_id)
    if not causal:
        self_mask = (tgt_in != r.pad_id)[:, None, None, :]
    for layer in r.decoder_layers:
        y = layer(y, memory, self_mask, src_mask if memory_mask else None)[0]
    if final_norm:
        y = r.final_norm(y)
    return r.out_proj(y)


def _tf_mistakes(r, src, tgt_in, keep, norm_first) -> list[Mistake]:
    def m(mistake_id, **kw):
        return Mistake.of(mistake_id, model=lambda: transformer_model(r, src, tgt_in, **kw)[keep])

    out = [
        m("transformer_no_causal_mask", causal=False),
        m("transformer_memory_mask_not_passed", memory_mask=False),
        m("transformer_causal_encoder", encoder_causal=True),
        m("tgt_embed_not_scaled", scale=False),
        m("tgt_no_positional_encoding", pe=False),
    ]
    if norm_first:
        out.append(m("transformer_final_norm_missing", final_norm=False))
    return out


def _tf_forbidden():
    return [
        (ref_tf.Transformer.forward, "the reference attention_ref.Transformer"),
        (ref_tf.Transformer.encode, "the reference attention_ref.Transformer.encode"),
        (ref_tf.Transformer.decode, "the reference attention_ref.Transformer.decode"),
        (ref_tf.TransformerCore.forward, "the reference attention_ref.TransformerCore"),
        (nn.Transformer.forward, "torch.nn.Transformer"),
        (nn.TransformerDecoder.forward, "torch.nn.TransformerDecoder"),
        (nn.TransformerDecoderLayer.forward, "torch.nn.TransformerDecoderLayer"),
        (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
        (nn.MultiheadAttention.forward, "torch.nn.MultiheadAttention"),
        *BUILTIN_ATTENTION,
    ]


@dataclass
class TfCase:
    label: str
    V_src: int
    V_tgt: int
    D: int
    H: int
    L: int
    Fd: int
    norm_first: bool | None
    src: list[list[int]]
    tgt: list[list[int]]
    pad_id: int = 0

    @property
    def sizes(self) -> tuple[int, ...]:
        """The constructor's sizes: src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff."""
        return (self.V_src, self.V_tgt, self.D, self.H, self.L, self.Fd)


def _tf_cases(ctx: Context) -> list[TfCase]:
    rng = ctx.rng(77)

    def ids(V, B, T, lengths, pad=0, first=None):
        x = rng.integers(1, V, size=(B, T))
        x[x == pad] = (pad + 1) % V
        if first is not None:
            x[:, 0] = first
        for b, n in enumerate(lengths):
            x[b, n:] = pad
        return x.tolist()

    cases = [
        TfCase(
            "post-norm (the defaults), source lengths 6 and 4, target lengths 5 and 3",
            *(11, 13, 8, 2, 2, 16, None),
            ids(11, 2, 6, (6, 4)),
            ids(13, 2, 5, (5, 3), first=1),
        ),
        TfCase(
            "pre-norm, source lengths 5, 2, 1, target lengths 4, 4, 2",
            *(9, 7, 8, 2, 1, 12, True),
            ids(9, 3, 5, (5, 2, 1)),
            ids(7, 3, 4, (4, 4, 2), first=1),
        ),
        TfCase(
            "post-norm, one target token (the start token), a batch of one",
            *(7, 7, 6, 3, 2, 8, False),
            ids(7, 1, 3, (3,)),
            [[1]],
        ),
        TfCase(
            "pre-norm, pad_id=3, 3 layers",
            *(10, 10, 8, 4, 3, 16, True),
            ids(10, 2, 5, (5, 3), pad=3),
            ids(10, 2, 4, (4, 2), pad=3, first=1),
            3,
        ),
    ]
    if ctx.thorough:
        cases += [
            TfCase(
                "post-norm, T=8, S=3, d_model=16",
                *(6, 12, 16, 4, 2, 32, False),
                ids(6, 3, 3, (3, 2, 3)),
                ids(12, 3, 8, (8, 5, 1), first=1),
            ),
        ]
    return cases


def _tf_build(cls, ctx, c: TfCase, r, dtype, case) -> nn.Module:
    kwargs = {"max_len": 32, "pad_id": c.pad_id}
    if c.norm_first is not None:
        kwargs["norm_first"] = c.norm_first
    mod = build_module(ctx, cls, c.sizes, kwargs, case)
    _tf_prepare(ctx, mod, c, case)
    mod.to(dtype)
    tok = 1 if c.pad_id != 1 else 2
    src0, tgt0 = torch.full((1, 2), tok), torch.full((1, 1), tok)
    materialize_with(ctx, mod, lambda: ctx.call(mod, src0, tgt0, case=case), case)
    load_reference_weights(ctx, mod, r, TF_SPECS, case)
    mod.eval()
    return mod


def _tf_logits(ctx, mod, src, tgt_in, case, what="logits") -> torch.Tensor:
    got = ctx.call(mod, src, tgt_in, case=case)
    if isinstance(got, tuple | list):
        ctx.fail(
            f"forward must return the {what} tensor (B, T, tgt_vocab); got a "
            f"{type(got).__name__} of length {len(got)}.",
            case=case,
            hint="forward(src, tgt_in) returns only the logits.",
        )
    if not isinstance(got, torch.Tensor):
        ctx.fail(
            f"forward must return a torch.Tensor; got {type(got).__name__}.",
            case=case,
            mistake="wrong_type",
        )
    return got


def _tf_reference(c: TfCase, i: int, ctx: Context, dtype) -> ref_tf.Transformer:
    r = ref_tf.Transformer(*c.sizes, max_len=32, pad_id=c.pad_id, norm_first=bool(c.norm_first))
    r = r.double()
    randomize_parameters(r, ctx.torch_gen(770 + i))
    return r.to(dtype).double().eval()


@exercise(
    "transformer",
    kind="module",
    forbidden=_tf_forbidden,
    summary="encoder-decoder Transformer: embeddings, positions, encoder, decoder, output",
)
def check_transformer(cls, ctx: Context) -> None:
    for i, c in enumerate(_tf_cases(ctx)):
        for dtype in (torch.float64, torch.float32):
            _check_tf_case(cls, ctx, c, i, dtype)
    _check_tf_encode_decode(cls, ctx)
    _check_tf_properties(cls, ctx)


# The positional table may be held in float32 (as the reference's buffer) or computed in
# float64; the difference (~1e-8) passes through a few layers, so float64 cases of the
# whole model are compared a little more loosely than single layers. Every mistake
# changes the logits by O(1).


def _check_tf_case(cls, ctx: Context, c: TfCase, i: int, dtype) -> None:
    r = _tf_reference(c, i, ctx, dtype)
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    nfs = "" if c.norm_first is None else f", norm_first={c.norm_first}"
    case = (
        f"{c.label}: Transformer({c.V_src}, {c.V_tgt}, d_model={c.D}, n_heads={c.H}, "
        f"n_layers={c.L}, d_ff={c.Fd}, max_len=32, pad_id={c.pad_id}{nfs}) in {dtype_name(dtype)}, "
        f"src {c.src}, tgt_in {c.tgt}"
    )
    mod = _tf_build(cls, ctx, c, r, dtype, case)
    got = _tf_logits(ctx, mod, src, tgt_in, case)
    B, T = tgt_in.shape
    if tuple(got.shape) != (B, T, c.V_tgt):
        likely = ""
        if tuple(got.shape) == (B, T, c.D):
            likely = named("out_proj_missing")
        ctx.fail(
            f"the logits have shape {tuple(got.shape)}, expected (B, T, tgt_vocab) = "
            f"{(B, T, c.V_tgt)}.",
            case=case,
            likely=likely,
        )
    keep = tgt_in != c.pad_id  # (B, T): logits at padding positions are not checked
    got_real = got[keep]
    with torch.no_grad():
        expected = transformer_model(r, src, tgt_in)[keep]
        ctx.expect_array(
            got_real, got_real.new_zeros(expected.shape).to(dtype), what="logits", case=case
        )
        ctx.expect_close(
            got_real,
            expected,
            what="the logits at the real target positions",
            case=case,
            mistakes=_tf_mistakes(r, src, tgt_in, keep, bool(c.norm_first)),
            hint="check each step against the spec: scaled embeddings + positions, encoder "
            "with the source padding mask, decoder layers with the causal + padding self "
            "mask and the source mask as memory_mask, final norm, out_proj.",
            **MODEL_TOL[dtype],
        )


def _check_tf_encode_decode(cls, ctx: Context) -> None:
    """encode(src) -> (memory, src_mask); decode(tgt_in, memory, src_mask) -> logits, the
    same as forward (greedy decoding relies on them)."""
    c = _tf_cases(ctx)[0]
    r = _tf_reference(c, 0, ctx, torch.float64)
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    case = f"Transformer({c.V_src}, {c.V_tgt}, {c.D}, {c.H}, {c.L}, {c.Fd}), src {c.src}"
    mod = _tf_build(cls, ctx, c, r, torch.float64, case)
    for name in ("encode", "decode"):
        if not callable(getattr(mod, name, None)):
            ctx.fail(
                f"your Transformer has no method {name}: the spec asks for encode(src) -> "
                "(memory, src_mask) and decode(tgt_in, memory, src_mask) -> logits.",
                case=case,
            )
    memory, src_mask = ctx.expect_tuple(
        ctx.call(mod.encode, src, case=case), ("memory", "src_mask"), case=case
    )
    with torch.no_grad():
        e_mem, _ = r.encoder(src, (src != r.pad_id)[:, None, None, :])
    ctx.expect_array(memory, e_mem, what="memory", case=case)
    ctx.expect_close(memory, e_mem, what="memory", case=case, **MODEL_TOL[torch.float64])
    e_mask = (src != r.pad_id)[:, None, None, :]
    if not isinstance(src_mask, torch.Tensor) or src_mask.dtype != torch.bool:
        ctx.fail(
            "src_mask must be a boolean tensor (True = real source token).",
            case=case,
            mistake="wrong_type",
        )
    try:
        same = torch.equal(torch.broadcast_to(src_mask, e_mask.shape), e_mask)
    except RuntimeError:
        same = False
    if not same:
        ctx.fail(
            f"src_mask is wrong: expected (src != pad_id) as (B, 1, 1, S) = "
            f"{tuple(e_mask.shape)}; got shape {tuple(src_mask.shape)}.",
            case=case,
            likely="the mask is inverted (True must mean a real token)"
            if src_mask.shape == e_mask.shape and torch.equal(~src_mask, e_mask)
            else "",
        )
    logits = ctx.call(mod.decode, tgt_in, memory, src_mask, case=case)
    full = _tf_logits(ctx, mod, src, tgt_in, case)
    keep = tgt_in != r.pad_id
    if not isinstance(logits, torch.Tensor) or logits.shape != full.shape:
        ctx.fail(
            "decode(tgt_in, memory, src_mask) must return the logits (B, T, tgt_vocab) "
            "(without extra return values by default).",
            case=case,
        )
    ctx.expect_close(
        logits[keep],
        full[keep],
        what="decode(...) vs forward(...)",
        case=case,
        **MODEL_TOL[torch.float64],
    )


def _check_tf_properties(cls, ctx: Context) -> None:
    """Causality (future target tokens leave earlier logits alone) and source padding
    (more padding columns leave the logits alone)."""
    c = _tf_cases(ctx)[1]
    r = _tf_reference(c, 1, ctx, torch.float64)
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    case = f"Transformer({c.V_src}, {c.V_tgt}, {c.D}, {c.H}, {c.L}, {c.Fd}, norm_first=True)"
    mod = _tf_build(cls, ctx, c, r, torch.float64, case)
    full = tgt_in.clone()
    full[full == c.pad_id] = 2  # no padding: every position is checked
    base = _tf_logits(ctx, mod, src, full, case)
    rng = ctx.rng(78)
    T = full.shape[1]
    for t in range(1, T):
        changed = full.clone()
        changed[:, t:] = torch.from_numpy(rng.integers(1, c.V_tgt, size=(full.shape[0], T - t)))
        out = _tf_logits(ctx, mod, src, changed, case)
        if not torch.allclose(out[:, :t], base[:, :t], **MODEL_TOL[torch.float64]):
            ctx.fail(
                f"changing the target tokens at positions >= {t} changed the logits at "
                "earlier positions: the decoder sees the future.",
                case=case + f", tgt_in {full.tolist()}",
                mistake="decoder_no_causal_mask",
            )
    padded = torch.cat([src, torch.full((src.shape[0], 2), c.pad_id)], dim=1)
    out = _tf_logits(ctx, mod, padded, full, case)
    if out.shape != base.shape or not torch.allclose(out, base, **MODEL_TOL[torch.float64]):
        ctx.fail(
            "adding two more padding tokens to every source sentence changed the logits: "
            "padding must be invisible.",
            case=case + f", src {src.tolist()} then the same with two more pad_id columns",
            mistake="src_mask_not_used",
        )
