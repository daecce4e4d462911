"""Checks for notebook 07: the module exercises ``decoder_layer`` and ``transformer``.

Each is graded with the reference parts of the earlier exercises in place of the learner's
(``MultiHeadAttention`` and ``FeedForward`` in the layer, ``DecoderLayer`` in the
Transformer; each with the learner's dropout probability), so a bug costs points once.
Known weights are copied in by name (``DEC_SPECS``, ``TF_SPECS``: the parts the spec asks
for) and the outputs compared with one float64 model of the reference; its mistaken modes
(``DEC_MISTAKES``, ``TF_MISTAKES``) name the mistakes. Properties: the layer's causality
and dropout, the Transformer's ``encode``/``decode``, causality and padding invariance.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .. import decoder as ref_dec
from .. import encoder as ref_enc
from .. import multihead as ref_mha
from .. import transformer as ref_tf
from ..trust import remote as _remote
from ..trust.computed import ComputedInChecker
from . import _models as M
from ._core import Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    MODEL_TOL,
    TOL,
    _visible_parameters,
    build_module,
    causal_mask,
    dropout_p,
    dtype_name,
    expect_dropout_applied,
    expect_sublayer_dropout,
    load_reference_weights,
    materialize_with,
    padding_mask,
    randomize_parameters,
    same_in_both_modes,
    substitute,
)

# ----------------------------------------------------------------------------- decoder_layer
DEC_SPECS = {
    "self_attn": "MultiHeadAttention(d_model, n_heads, dropout=dropout) (from attention_ref)",
    "cross_attn": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "ff": "FeedForward(d_model, d_ff, dropout) (from attention_ref or notebook 06)",
    **dict.fromkeys(("norm1", "norm2", "norm3"), "nn.LayerNorm(d_model)"),
}


@dataclass
class DecCase:
    label: str
    D: int
    H: int
    Fd: int
    norm_first: bool | None  # None: rely on the default (post-norm)
    B: int
    T: int
    S: int
    causal: bool = False  # a causal self_mask (T, T)
    lengths: tuple[int, ...] | None = None  # source lengths -> memory_mask (B, 1, 1, S)
    self_mask_4d: bool = False  # causal AND target padding as (B, 1, T, T)

    def masks(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(self_mask, memory_mask)``; in a (B, 1, T, T) self_mask the last target token
        of the last row is padding."""
        sm = torch.from_numpy(causal_mask(self.T)) if self.causal else None
        mm = None
        if self.lengths is not None:
            mm = torch.from_numpy(padding_mask(self.lengths, self.S)[:, None])  # (B, 1, 1, S)
        if self.self_mask_4d:
            tgt = padding_mask([self.T] * (self.B - 1) + [self.T - 1], self.T)  # (B, 1, T)
            sm = sm & torch.from_numpy(tgt[:, None])
        return sm, mm


MASKS = "a causal self_mask (5, 5) and a memory_mask (3, 1, 1, 6) for source lengths 6, 3, 1"
#: The rows of DecCase: label, d_model, n_heads, d_ff, norm_first, B, T, S[, causal,
#: source lengths, self_mask (B, 1, T, T)].
DEC_CASES = [
    ("post-norm (the defaults), no masks, T=4, S=6", 8, 2, 16, None, 2, 4, 6),
    ("pre-norm, no masks, T=4, S=6", 8, 2, 16, True, 2, 4, 6),
    (f"post-norm, {MASKS}", 8, 2, 12, False, 3, 5, 6, True, (6, 3, 1)),
    (f"pre-norm, {MASKS}", 8, 4, 12, True, 3, 5, 6, True, (6, 3, 1)),
    ("pre-norm, one target token, a batch of one, one head", 6, 1, 8, True, 1, 1, 3),
    (
        "post-norm, self_mask (2, 1, 4, 4) causal and target padding, S=3",
        *(12, 3, 24, False, 2, 4, 3, True, (3, 2), True),
    ),
]
DEC_THOROUGH_CASES = [
    ("pre-norm, T=7, S=9, d_model=16, 4 heads", 16, 4, 32, True, 3, 7, 9, True),
    ("post-norm, T=6, S=2, masks", 8, 2, 8, False, 2, 6, 2, True, (2, 1)),
]


def decoder_model(
    r: ref_dec.DecoderLayer, y, memory, self_mask, memory_mask, *, norm_first: bool, mode="correct"
):
    """The decoder layer ``(out, self_weights, cross_weights)`` in float64 with the
    reference's sub-modules, or as a mistaken ``mode`` computes it: "self_mask_ignored",
    "memory_mask_ignored", "kv_from_decoder" (keys and values of the cross-attention from
    the decoder's own states), "no_residual" (no skip connection), "norm_flipped" (the
    other norm order than ``norm_first`` asks for)."""
    sm = None if mode == "self_mask_ignored" else self_mask
    mm = None if mode == "memory_mask_ignored" else memory_mask
    ws = []

    def keeping_weights(attn, kv, mask):
        def f(h):
            a, w = attn(h, *(kv or (h, h)), mask)
            ws.append(w)
            return a

        return f

    cross = (None, None) if mode == "kv_from_decoder" else ((memory, memory), mm)
    blocks = (
        (keeping_weights(r.self_attn, None, sm), r.norm1),
        (keeping_weights(r.cross_attn, *cross), r.norm2),
        (r.ff, r.norm3),
    )
    order = "pre" if norm_first != (mode == "norm_flipped") else "post"
    x = y
    for f, norm in blocks:
        x = M.sublayer(x, f, norm, order, residual=mode != "no_residual")
    return x, ws[0], ws[1]


#: The decoder layer's mistake models: (id, the model's mode, the mask it needs given:
#: "self_mask", "memory_mask" or None), tried in this order.
DEC_MISTAKES = [
    ("decoder_self_mask_ignored", "self_mask_ignored", "self_mask"),
    ("decoder_memory_mask_ignored", "memory_mask_ignored", "memory_mask"),
    ("decoder_cross_kv_from_decoder", "kv_from_decoder", None),
    ("decoder_residual_missing", "no_residual", None),
    ("decoder_norm_order", "norm_flipped", None),
]


def _dec_mistakes(r, y, memory, sm, mm, norm_first: bool, which: int) -> list[Mistake]:
    """The mistake models that apply to these masks; ``which`` 0 = out, 1 = self_weights,
    2 = cross_weights."""
    given = {"self_mask": sm, "memory_mask": mm, None: True}
    computed = {"computed": "post-norm" if norm_first else "pre-norm", "norm_first": norm_first}
    return [
        Mistake.of(
            m,
            model=lambda mode=mode: decoder_model(
                r, y, memory, sm, mm, norm_first=norm_first, mode=mode
            )[which],
            **(computed if m == "decoder_norm_order" else {}),
        )
        for m, mode, needs in DEC_MISTAKES
        if given[needs] is not None
    ]


def _torch_layers(*names: str) -> list[tuple]:
    """The forbidden ``torch.nn`` layers ``names`` (their ``forward``)."""
    return [(getattr(nn, n).forward, f"torch.nn.{n}") for n in names]


def _dec_forbidden():
    return [
        (ref_dec.DecoderLayer.forward, "the reference attention_ref.DecoderLayer"),
        (ref_dec.Decoder.forward, "the reference attention_ref.Decoder"),
        *_torch_layers("TransformerDecoderLayer", "TransformerDecoder", "MultiheadAttention"),
        *BUILTIN_ATTENTION,
    ]


def _dec_build(cls, ctx, c: DecCase, gen: torch.Generator, dtype, case, dropout=None):
    """``(r, y, memory, mod)``: the reference layer with seeded weights (in float64, as they
    are held in ``dtype``), the inputs ``y (B, T, D)`` and ``memory (B, S, D)`` in ``dtype``,
    and the learner's layer in ``dtype`` with the reference attention (notebook 04) and
    feed-forward network (notebook 06) in place of the learner's, each with the learner's
    dropout probability, and the weights of ``r``; in eval mode."""
    r = ref_dec.DecoderLayer(c.D, c.H, c.Fd, norm_first=bool(c.norm_first)).double()
    randomize_parameters(r, gen)
    r = r.to(dtype).double().eval()
    y = torch.randn(c.B, c.T, c.D, generator=gen, dtype=torch.float64).to(dtype)
    memory = torch.randn(c.B, c.S, c.D, generator=gen, dtype=torch.float64).to(dtype)
    kwargs = {} if c.norm_first is None else {"norm_first": c.norm_first}
    if dropout is not None:
        kwargs["dropout"] = dropout
    mod = build_module(ctx, cls, (c.D, c.H, c.Fd), kwargs, case)
    parts = {
        "self_attn": lambda p: ref_mha.MultiHeadAttention(c.D, c.H, dropout=p),
        "cross_attn": lambda p: ref_mha.MultiHeadAttention(c.D, c.H, dropout=p),
        "ff": lambda p: ref_enc.FeedForward(c.D, c.Fd, p),
    }
    for name, make in parts.items():
        substitute(ctx, mod, name, make, case, DEC_SPECS[name])
    mod.to(dtype)
    y0, m0 = torch.zeros(1, 2, c.D, dtype=dtype), torch.zeros(1, 3, c.D, dtype=dtype)
    materialize_with(ctx, mod, lambda: ctx.call(mod, y0, m0, case=case), case)
    load_reference_weights(ctx, mod, r, DEC_SPECS, case)
    return r, y, memory, mod.eval()


def _dec_call(ctx, mod, y, memory, sm, mm, case):
    n = 4 if mm is not None else 3 if sm is not None else 2  # the masks given
    got = ctx.call(mod, *(y, memory, sm, mm)[:n], case=case)
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
    rows = DEC_CASES + (DEC_THOROUGH_CASES if ctx.thorough else [])
    for i, row in enumerate(rows):
        for dtype in (torch.float64, torch.float32):
            _check_dec_case(cls, ctx, DecCase(*row), i, dtype)
    _check_dec_causality(cls, ctx)
    _check_dec_dropout(cls, ctx)


DEC_OUT_HINT = (
    "both attention maps are right; look at the residual connections, the norms and the "
    "feed-forward sub-layer."
)


def _check_dec_case(cls, ctx: Context, c: DecCase, i: int, dtype) -> None:
    """One case: the cross-attention map's shape, then both maps and the output against
    the model, naming the mistake model that explains a difference."""
    sm, mm = c.masks()
    nfs = "" if c.norm_first is None else f", norm_first={c.norm_first}"
    case = (
        f"{c.label}: DecoderLayer({c.D}, {c.H}, {c.Fd}{nfs}), y {(c.B, c.T, c.D)}, memory "
        f"{(c.B, c.S, c.D)} {dtype_name(dtype)}"
        + ("" if sm is None else f", self_mask {tuple(sm.shape)}")
        + ("" if mm is None else f", memory_mask {tuple(mm.shape)}")
    )
    r, y, memory, mod = _dec_build(cls, ctx, c, ctx.torch_gen(700 + i), dtype, case)
    out, w_self, w_cross = _dec_call(ctx, mod, y, memory, sm, mm, case)
    y64, m64, nf = y.double(), memory.double(), bool(c.norm_first)
    B, H, T, S = c.B, c.H, c.T, c.S
    with torch.no_grad():
        expected = decoder_model(r, y64, m64, sm, mm, norm_first=nf)
        if isinstance(w_cross, torch.Tensor) and tuple(w_cross.shape) != (B, H, T, S):
            likely = {
                (B, H, T, T): named("cross_kv_from_decoder"),
                (B, H, S, T): named("cross_q_from_memory"),
            }
            ctx.fail(
                f"cross_weights has shape {tuple(w_cross.shape)}, expected (B, H, T, S) = "
                f"{(B, H, T, S)}.",
                case=case,
                likely=likely.get(tuple(w_cross.shape), ""),
                hint="self.cross_attn(y, memory, memory, memory_mask): queries from the "
                "decoder, keys and values from the encoder.",
                mistake="wrong_shape",
            )
        # (the index the mistake models return it at, what came back, its name)
        outputs = [(1, w_self, "self_weights"), (2, w_cross, "cross_weights"), (0, out, "out")]
        for which, got, what in outputs:
            ctx.expect_array(got, y.new_zeros(expected[which].shape), what=what, case=case)
        for which, got, what in outputs:
            ctx.expect_close(
                got,
                expected[which],
                what=what,
                case=case,
                mistakes=_dec_mistakes(r, y64, m64, sm, mm, nf, which),
                hint="" if which else DEC_OUT_HINT,
                **TOL[dtype],
            )


def _check_dec_causality(cls, ctx: Context) -> None:
    """With a causal self_mask, changing target positions >= t must not change out[:, :t]."""
    gen = ctx.torch_gen(790)
    c = DecCase("", 8, 2, 16, None, 2, 5, 4)
    causal = torch.ones(c.T, c.T, dtype=torch.bool).tril()
    case = "DecoderLayer(8, 2, 16), y (2, 5, 8) float64, causal self_mask (5, 5)"
    _, y, memory, mod = _dec_build(cls, ctx, c, gen, torch.float64, case)
    base = _dec_call(ctx, mod, y, memory, causal, None, case)[0]
    for t in range(1, c.T):
        changed = y.clone()
        changed[:, t:] = torch.randn(2, c.T - t, c.D, generator=gen, dtype=torch.float64)
        out = _dec_call(ctx, mod, changed, memory, causal, None, case)[0]
        if not torch.allclose(out[:, :t], base[:, :t], **TOL[torch.float64]):
            ctx.fail(
                f"changing the target tokens at positions >= {t} changed the output at "
                f"earlier positions: the future is not masked.",
                case=case,
                mistake="self_mask_not_applied",
            )


def _check_dec_dropout(cls, ctx: Context) -> None:
    """dropout=0.3: the reference in eval mode; in training mode the output and both
    attention maps are dropped (PyTorch's layer applies its dropout to the weights too), and
    each sub-layer's output on its own."""
    gen = ctx.torch_gen(795)
    for nf in (False, True):
        c = DecCase("", 8, 2, 16, nf, 2, 5, 6)
        case = (
            f"DecoderLayer(8, 2, 16, dropout=0.3, norm_first={nf}), y (2, 5, 8), "
            "memory (2, 6, 8) float64, no masks"
        )
        r, y, memory, mod = _dec_build(cls, ctx, c, gen, torch.float64, case, dropout=0.3)
        eval_out, *eval_weights = _dec_call(ctx, mod, y, memory, None, None, case)
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
        out, *weights = _dec_call(ctx, mod, y, memory, None, None, case + ", training")
        training = case + ", training mode"
        expect_dropout_applied(
            ctx, out, eval_out, p=0.3, case=training, mistake="decoder_dropout_ignored"
        )
        for got, ev, name in zip(weights, eval_weights, ("self_attn", "cross_attn"), strict=True):
            if same_in_both_modes(got, ev):
                ctx.fail(
                    f"with dropout=0.3 the {name} weights in training mode are the eval-mode "
                    "weights: the attention weights are not dropped. nn.TransformerDecoderLayer "
                    "applies its dropout to the attention weights too.",
                    case=training,
                    mistake=named("dropout_not_passed_on", name=name),
                )

        def run(c: str, mod=mod, y=y, memory=memory):
            return _dec_call(ctx, mod, y, memory, None, None, c)[0]

        sublayers = {"self_attn": "dropout1", "cross_attn": "dropout2", "ff": "dropout3"}
        expect_sublayer_dropout(ctx, mod, run, sublayers, p=0.3, case=case)


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

#: label, (src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff), norm_first (None: the
#: default), the source lengths, the target lengths (None: the start token alone), pad_id.
#: Each sentence holds random tokens up to its length, then pad_id; a target starts with 1.
TF_CASES = [
    (
        "post-norm (the defaults), source lengths 6 and 4, target lengths 5 and 3",
        *((11, 13, 8, 2, 2, 16), None, (6, 4), (5, 3), 0),
    ),
    (
        "pre-norm, source lengths 5, 2, 1, target lengths 4, 4, 2",
        *((9, 7, 8, 2, 1, 12), True, (5, 2, 1), (4, 4, 2), 0),
    ),
    (
        "post-norm, one target token (the start token), a batch of one",
        *((7, 7, 6, 3, 2, 8), False, (3,), None, 0),
    ),
    ("pre-norm, pad_id=3, 3 layers", (10, 10, 8, 4, 3, 16), True, (5, 3), (4, 2), 3),
]
TF_THOROUGH_CASES = [
    ("post-norm, T=8, S=3, d_model=16", (6, 12, 16, 4, 2, 32), False, (3, 2, 3), (8, 5, 1), 0),
]


@dataclass
class TfCase:
    label: str
    sizes: tuple[int, ...]  # src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff
    norm_first: bool | None
    src: list[list[int]]
    tgt: list[list[int]]
    pad_id: int


def _tf_cases(ctx: Context) -> list[TfCase]:
    rng = ctx.rng(77)

    def ids(V, lengths, pad, first=None) -> list[list[int]]:
        x = rng.integers(1, V, size=(len(lengths), max(lengths)))
        x[x == pad] = (pad + 1) % V
        if first is not None:
            x[:, 0] = first
        for b, n in enumerate(lengths):
            x[b, n:] = pad
        return x.tolist()

    rows = TF_CASES + (TF_THOROUGH_CASES if ctx.thorough else [])
    return [
        TfCase(
            label, sizes, nf, ids(sizes[0], s, pad), ids(sizes[1], t, pad, 1) if t else [[1]], pad
        )
        for label, sizes, nf, s, t, pad in rows
    ]


def transformer_model(r: ref_tf.Transformer, src, tgt_in, mode: str = "correct") -> torch.Tensor:
    """The reference Transformer's logits in float64, or as a mistaken ``mode`` computes
    them: "no_causal_mask", "no_memory_mask" (the source mask not passed to the decoder
    layers), "causal_encoder", "unscaled" (the embeddings not times sqrt(d_model)), "no_pe",
    "no_final_norm"."""
    S, T = src.shape[1], tgt_in.shape[1]
    src_mask = (src != r.pad_id)[:, None, None, :]  # (B, 1, 1, S)
    causal_src = src_mask & torch.ones(S, S, dtype=torch.bool).tril()
    memory, _ = r.encoder(src, causal_src if mode == "causal_encoder" else src_mask)
    y = r.tgt_embed(tgt_in) * (1.0 if mode == "unscaled" else math.sqrt(r.d_model))
    if mode != "no_pe":
        y = y + r.pe[:T].to(y.dtype)
    self_mask = ref_tf.target_self_mask(tgt_in, r.pad_id)
    if mode == "no_causal_mask":
        self_mask = (tgt_in != r.pad_id)[:, None, None, :]
    for layer in r.decoder_layers:
        y = layer(y, memory, self_mask, None if mode == "no_memory_mask" else src_mask)[0]
    return r.out_proj(y if mode == "no_final_norm" else r.final_norm(y))


#: The Transformer's mistake models: (id, the model's mode), tried in this order; the last
#: one only for pre-norm (a post-norm model has no final norm).
TF_MISTAKES = [
    ("transformer_no_causal_mask", "no_causal_mask"),
    ("transformer_memory_mask_not_passed", "no_memory_mask"),
    ("transformer_causal_encoder", "causal_encoder"),
    ("tgt_embed_not_scaled", "unscaled"),
    ("tgt_no_positional_encoding", "no_pe"),
    ("transformer_final_norm_missing", "no_final_norm"),
]


def _tf_forbidden():
    return [
        (ref_tf.Transformer.forward, "the reference attention_ref.Transformer"),
        (ref_tf.Transformer.encode, "the reference attention_ref.Transformer.encode"),
        (ref_tf.Transformer.decode, "the reference attention_ref.Transformer.decode"),
        (ref_tf.TransformerCore.forward, "the reference attention_ref.TransformerCore"),
        *_torch_layers("Transformer", "TransformerDecoder", "TransformerDecoderLayer"),
        *_torch_layers("TransformerEncoderLayer", "MultiheadAttention"),
        *BUILTIN_ATTENTION,
    ]


#: The largest d_model, n_heads or d_ff of a decoder layer that a graded kernel may have the
#: checker build (the check's own are below 130; a kernel's __init__ chooses the sizes).
LAYER_SIZE_LIMIT = 512
#: The most decoder layers a graded kernel's Transformer may have the checker build.
LAYERS_LIMIT = 16
#: The most that one call of such a layer may have the checker compute: attention weights,
#: B * n_heads * T * (T + S), and rows times width, B * (T + S) * max(d_model, d_ff), each
#: (the check's own calls need a few thousand; a kernel chooses the shapes it calls with).
WORK_LIMIT = 1 << 22


def _bounded_call(layer: nn.Module, call_args: tuple, call_kwargs: dict) -> None:
    """Refuse a call of the decoder ``layer`` whose attention maps or linear layers would
    be larger than :data:`WORK_LIMIT` (other bad inputs are refused by the reference's own
    checks)."""
    given = dict(zip(("y", "memory"), call_args, strict=False)) | call_kwargs
    y, memory = given.get("y"), given.get("memory")
    tensors = isinstance(y, torch.Tensor) and isinstance(memory, torch.Tensor)
    if not tensors or y.dim() != 3 or memory.dim() != 3:
        return
    (B, T, _), S = y.shape, memory.shape[1]
    width = max(layer.d_model, layer.ff.linear1.out_features)
    if max(B * layer.n_heads * T * (T + S), B * (T + S) * width) > WORK_LIMIT:
        raise ValueError(
            f"y {tuple(y.shape)} and memory {tuple(memory.shape)} are larger than a check's "
            "decoder layer computes"
        )


def _decoder_layer_in_checker(*args, **kwargs) -> nn.Module:
    """``ref_dec.DecoderLayer(*args, **kwargs)`` as a graded kernel gets it: its parts, whose
    parameters live in the kernel, and every call computed here by the reference
    (:class:`ComputedInChecker`): notebook 07's graded kernel has no ``DecoderLayer.forward``
    of the course's to run."""
    bound = inspect.signature(ref_dec.DecoderLayer).bind(*args, **kwargs)  # a TypeError as
    for name in ("d_model", "n_heads", "d_ff"):  # the class's own, for a wrong call
        v = bound.arguments.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= LAYER_SIZE_LIMIT:
            raise ValueError(
                f"DecoderLayer's {name} must be an int from 1 to {LAYER_SIZE_LIMIT} in a "
                f"check; got {v!r}"
            )
    part = ref_dec.DecoderLayer(*bound.args, **bound.kwargs)
    layer = copy.deepcopy(part)  # the checker's own copy, which computes

    def compute(state: dict, training: bool, call_args: tuple, call_kwargs: dict):
        _bounded_call(layer, call_args, call_kwargs)
        floats = {t.dtype for t in state.values() if t.is_floating_point()}
        if not floats <= {torch.float32, torch.float64} or len(floats) > 1:
            raise ValueError(
                "a check's decoder layer holds float32 or float64 weights, one dtype; got "
                + ", ".join(sorted(str(f) for f in floats))
            )
        layer.to(floats.pop() if floats else torch.float32).train(bool(training))
        layer.load_state_dict(state)
        with torch.no_grad():
            return layer(*call_args, **call_kwargs)

    return ComputedInChecker(part, compute)


def _reference_layer(candidate):
    """The reference ``DecoderLayer`` class as the check puts it in the learner's
    Transformer: the class itself, or in a graded kernel one computed by the checker."""
    if _remote.is_remote(candidate):
        return _decoder_layer_in_checker
    return ref_dec.DecoderLayer


def _layers_computed_in_checker(ctx: Context, mod, case: str) -> None:
    """In a graded kernel, each reference ``DecoderLayer`` in ``mod.decoder_layers`` (built
    while the learner's ``__init__`` ran, with the reference class under its name) replaced
    by one of the same sizes that the checker computes, before anything calls it."""
    layers = getattr(mod, "decoder_layers", None)
    if not _remote.is_remote(mod) or not isinstance(layers, nn.ModuleList):
        return
    if len(layers) > LAYERS_LIMIT:
        ctx.fail(
            f"self.decoder_layers has {len(layers)} layers; a check builds at most "
            f"{LAYERS_LIMIT}: build n_layers of them (its default is 2).",
            case=case,
            mistake="wrong_default",
        )
    for i, layer in enumerate(layers):
        if isinstance(layer, ref_dec.DecoderLayer):
            sizes = (layer.d_model, layer.n_heads, layer.ff.linear1.out_features)
            try:
                layers[i] = _decoder_layer_in_checker(
                    *sizes, dropout_p(layer), bool(layer.norm_first)
                )
            except ValueError as err:  # sizes or a dropout the check never builds
                ctx.fail(
                    f"self.decoder_layers[{i}] is DecoderLayer{sizes}, which a check does not "
                    f"build: {err}. Build each layer with the d_model, n_heads, d_ff and "
                    "dropout your Transformer was given.",
                    case=case,
                )


def _tf_prepare(ctx, mod, c: TfCase, case) -> None:
    """Before loading weights: ``pad_id`` is stored, ``tgt_embed`` follows the course's
    initialisation, and the decoder layers are replaced by the reference ``DecoderLayer``
    (the previous exercise; with the learner's dropout and ``norm_first``), so a bug in the
    learner's layer costs points once. In a graded kernel each is computed by the checker
    (:func:`_decoder_layer_in_checker`)."""
    _, _, D, H, L, Fd = c.sizes
    pad = getattr(mod, "pad_id", None)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad != c.pad_id:
        ctx.fail(
            f"self.pad_id is {pad!r}, expected {c.pad_id} (the pad_id argument): the spec "
            "asks for it, and greedy_decode reads model.pad_id.",
            case=case,
            mistake="pad_id_not_stored",
        )
    w = getattr(getattr(mod, "tgt_embed", None), "weight", None)
    if isinstance(w, torch.Tensor) and not is_lazy(w) and w.dim() == 2 and w.numel() > 1:
        std, want = float(w.detach().double().std()), D**-0.5
        if not want / 2 <= std <= 2 * want:
            ctx.fail(
                f"tgt_embed.weight has standard deviation {std:.3g} after __init__, expected "
                f"about d_model**-0.5 = {want:.3g} (the course's embedding scheme).",
                case=case,
                likely=named("tgt_embed_init") if 0.7 <= std <= 1.4 else "",
                hint=named("tgt_embed_init").hint,
            )
    layers = getattr(mod, "decoder_layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) != L:
        got = type(layers).__name__ if layers is not None else "nothing"
        n = f" of length {len(layers)}" if isinstance(layers, nn.ModuleList) else ""
        ctx.fail(
            f"self.decoder_layers is {got}{n}; expected an nn.ModuleList of n_layers={L} "
            "decoder layers.",
            case=case,
            hint="self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, n_heads, d_ff, "
            "dropout, norm_first) for _ in range(n_layers)]).",
        )
    for i, layer in enumerate(layers):
        nf = getattr(layer, "norm_first", None)
        nf = nf if isinstance(nf, bool) else bool(c.norm_first)
        p = dropout_p(layer) if isinstance(layer, nn.Module) else 0.0
        layers[i] = _reference_layer(mod)(D, H, Fd, p, nf)


def _tf_build(cls, ctx, c: TfCase, i: int, dtype, case) -> tuple[ref_tf.Transformer, nn.Module]:
    """The reference of case ``i`` (seeded weights, in float64 as they are held in ``dtype``)
    and the learner's Transformer in ``dtype`` with those weights, in eval mode."""
    r = ref_tf.Transformer(*c.sizes, max_len=32, pad_id=c.pad_id, norm_first=bool(c.norm_first))
    randomize_parameters(r.double(), ctx.torch_gen(770 + i))
    r = r.to(dtype).double().eval()
    kwargs = {"max_len": 32, "pad_id": c.pad_id}
    if c.norm_first is not None:
        kwargs["norm_first"] = c.norm_first
    # Built with the reference DecoderLayer under its name: a stub left in exercise 1
    # costs its points there only (the layers are replaced by _tf_prepare anyway).
    mod = build_module(
        ctx, cls, c.sizes, kwargs, case, earlier={"DecoderLayer": ref_dec.DecoderLayer}
    )
    _tf_prepare(ctx, mod, c, case)
    mod.to(dtype)
    tok = 1 if c.pad_id != 1 else 2
    src0, tgt0 = torch.full((1, 2), tok), torch.full((1, 1), tok)
    materialize_with(ctx, mod, lambda: ctx.call(mod, src0, tgt0, case=case), case)
    load_reference_weights(ctx, mod, r, TF_SPECS, case)
    return r, mod.eval()


def _tf_logits(ctx, mod, src, tgt_in, case) -> torch.Tensor:
    got = ctx.call(mod, src, tgt_in, case=case)
    if isinstance(got, tuple | list):
        ctx.fail(
            "forward must return the logits tensor (B, T, tgt_vocab); got a "
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


@exercise(
    "transformer",
    kind="module",
    forbidden=_tf_forbidden,
    summary="encoder-decoder Transformer: embeddings, positions, encoder, decoder, output",
)
def check_transformer(cls, ctx: Context) -> None:
    cases = _tf_cases(ctx)
    for i, c in enumerate(cases):
        for dtype in (torch.float64, torch.float32):
            _check_tf_case(cls, ctx, c, i, dtype)
    _check_tf_encode_decode(cls, ctx, cases[0])
    _check_tf_properties(cls, ctx, cases[1])
    _check_tf_dropout(cls, ctx, cases[0])
    _check_tf_defaults(cls, ctx)


#: The spec's defaults of Transformer(src_vocab, tgt_vocab, ...).
TF_DEFAULTS = dict(
    d_model=64,
    n_heads=4,
    n_layers=2,
    d_ff=128,
    dropout=0.0,
    max_len=256,
    pad_id=0,
    norm_first=False,
)


def _check_tf_defaults(cls, ctx: Context) -> None:
    """Built with the sizes left out, the Transformer has the parameters, buffers and pad_id
    of the one built with the spec's defaults given."""
    spelled = ", ".join(f"{k}={v!r}" for k, v in TF_DEFAULTS.items())
    case = f"Transformer(11, 13) against Transformer(11, 13, {spelled})"
    sample = (torch.full((1, 2), 1), torch.full((1, 1), 1))
    built = []
    for kwargs in ({}, TF_DEFAULTS):
        mod = build_module(
            ctx,
            cls,
            (11, 13),
            kwargs,
            case,
            sample=sample,
            earlier={"DecoderLayer": ref_dec.DecoderLayer},
            prepare=lambda m: _layers_computed_in_checker(ctx, m, case),
        )
        shapes = _visible_parameters(mod)
        shapes.update({f"buffer {n}": tuple(b.shape) for n, b in mod.named_buffers()})
        built.append((shapes, getattr(mod, "pad_id", None)))
    (left_out, pad_left_out), (given, pad_given) = built
    if left_out != given or pad_left_out != pad_given:
        differ = sorted(k for k in set(left_out) | set(given) if left_out.get(k) != given.get(k))
        what = (
            f"pad_id is {pad_left_out!r} instead of {pad_given!r}"
            if pad_left_out != pad_given
            else f"{differ[0]} is {left_out.get(differ[0])} instead of {given.get(differ[0])}"
        )
        ctx.fail(
            f"built with the sizes left out, your Transformer differs from one built with the "
            f"spec's defaults: {what}.",
            case=case,
            mistake="wrong_default",
            hint=f"give __init__'s optional arguments the spec's defaults: {spelled}.",
        )


# MODEL_TOL: the positional table may be held in float32 or computed in float64 (~1e-8 apart,
# through a few layers); every mistake changes the logits by O(1).


def _check_tf_case(cls, ctx: Context, c: TfCase, i: int, dtype) -> None:
    """One case: the logits' shape, then their values at the real target positions against
    the model, naming the mistake model that explains a difference."""
    V_src, V_tgt, D, H, L, Fd = c.sizes
    nfs = "" if c.norm_first is None else f", norm_first={c.norm_first}"
    case = (
        f"{c.label}: Transformer({V_src}, {V_tgt}, d_model={D}, n_heads={H}, n_layers={L}, "
        f"d_ff={Fd}, max_len=32, pad_id={c.pad_id}{nfs}) in {dtype_name(dtype)}, "
        f"src {c.src}, tgt_in {c.tgt}"
    )
    r, mod = _tf_build(cls, ctx, c, i, dtype, case)
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    got = _tf_logits(ctx, mod, src, tgt_in, case)
    B, T = tgt_in.shape
    if tuple(got.shape) != (B, T, V_tgt):
        ctx.fail(
            f"the logits have shape {tuple(got.shape)}, expected (B, T, tgt_vocab) = "
            f"{(B, T, V_tgt)}.",
            case=case,
            likely=named("out_proj_missing") if tuple(got.shape) == (B, T, D) else "",
        )
    keep = tgt_in != c.pad_id  # (B, T): logits at padding positions are not checked
    got_real = got[keep]
    mistakes = [
        Mistake.of(m, model=lambda mode=mode: transformer_model(r, src, tgt_in, mode)[keep])
        for m, mode in TF_MISTAKES
        if c.norm_first or mode != "no_final_norm"
    ]
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
            mistakes=mistakes,
            hint="check each step against the spec: scaled embeddings + positions, encoder "
            "with the source padding mask, decoder layers with the causal + padding self "
            "mask and the source mask as memory_mask, final norm, out_proj.",
            **MODEL_TOL[dtype],
        )


def _check_tf_encode_decode(cls, ctx: Context, c: TfCase) -> None:
    """encode(src) -> (memory, src_mask); decode(tgt_in, memory, src_mask) -> logits, the
    same as forward (greedy decoding relies on them). Case 0, in float64."""
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    case = f"Transformer{c.sizes}, src {c.src}"
    r, mod = _tf_build(cls, ctx, c, 0, torch.float64, case)
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
    e_mask = (src != r.pad_id)[:, None, None, :]
    with torch.no_grad():
        e_mem, _ = r.encoder(src, e_mask)
    ctx.expect_array(memory, e_mem, what="memory", case=case)
    ctx.expect_close(memory, e_mem, what="memory", case=case, **MODEL_TOL[torch.float64])
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
        inverted = src_mask.shape == e_mask.shape and torch.equal(~src_mask, e_mask)
        ctx.fail(
            f"src_mask is wrong: expected (src != pad_id) as (B, 1, 1, S) = "
            f"{tuple(e_mask.shape)}; got shape {tuple(src_mask.shape)}.",
            case=case,
            likely="the mask is inverted (True must mean a real token)" if inverted else "",
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
    what = "decode(...) vs forward(...)"
    ctx.expect_close(logits[keep], full[keep], what=what, case=case, **MODEL_TOL[torch.float64])


def _check_tf_dropout(cls, ctx: Context, c: TfCase) -> None:
    """dropout=0.5 with the encoder and the decoder layers (reference parts) in eval mode
    and the model in training mode: the logits are not the eval-mode logits, so the target
    embeddings pass through the model's own dropout."""
    kwargs = {"max_len": 32, "pad_id": c.pad_id, "dropout": 0.5}
    case = (
        f"Transformer{c.sizes}"[:-1] + ", dropout=0.5, max_len=32, pad_id="
        f"{c.pad_id}) in training mode, its encoder and decoder layers in eval mode, "
        f"src {c.src}, tgt_in {c.tgt}"
    )
    mod = build_module(
        ctx, cls, c.sizes, kwargs, case, earlier={"DecoderLayer": ref_dec.DecoderLayer}
    )
    _tf_prepare(ctx, mod, c, case)
    mod.double()
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    mod.eval()
    eval_out = _tf_logits(ctx, mod, src, tgt_in, case)
    mod.train()
    mod.encoder.eval()
    for layer in mod.decoder_layers:
        layer.eval()
    torch.manual_seed(ctx.seed)
    train_out = _tf_logits(ctx, mod, src, tgt_in, case)
    expect_dropout_applied(
        ctx, train_out, eval_out, p=0.5, case=case, mistake="tgt_embedding_dropout_missing"
    )


def _check_tf_properties(cls, ctx: Context, c: TfCase) -> None:
    """Case 1 (pre-norm), in float64: causality (future target tokens leave earlier logits
    alone) and source padding (more padding columns leave the logits alone)."""
    src, tgt_in = torch.tensor(c.src), torch.tensor(c.tgt)
    case = f"Transformer{c.sizes}"[:-1] + ", norm_first=True)"
    _, mod = _tf_build(cls, ctx, c, 1, torch.float64, case)
    full = tgt_in.clone()
    full[full == c.pad_id] = 2  # no padding: every position is checked
    base = _tf_logits(ctx, mod, src, full, case)
    rng, (B, T) = ctx.rng(78), full.shape
    for t in range(1, T):
        changed = full.clone()
        changed[:, t:] = torch.from_numpy(rng.integers(1, c.sizes[1], size=(B, T - t)))
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
