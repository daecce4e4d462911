"""Checks for notebook 06: the module exercises ``feed_forward`` and ``encoder_layer``.

Both checks build the learner's class, copy seeded weights into it by parameter name
(``EncoderLayer``'s ``self_attn`` and ``ff``, earlier exercises, are first replaced by the
reference parts, so that a bug in them costs points once) and compare its forward with a
float64 model on the same (dtype-rounded) weights; a mismatch is named by the mistake model
(no residual, the norm in the wrong place, no ReLU, the mask ignored, ...) that reproduces
it. Properties by behaviour: the same output twice with the default dropout=0.0, tokens that
cannot see each other (positions, padding), dropout random in training mode only.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import encoder as ref
from .. import multihead as ref_mha
from . import _models as M
from ._core import Context, Mistake, exercise
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    LAYER_TOL,
    build_module,
    causal_mask,
    dtype_name,
    expect_dropout_applied,
    expect_not_swapped,
    expect_sublayer_dropout,
    load_reference_weights,
    materialize_with,
    normal,
    padding_mask,
    same_in_both_modes,
    substitute,
)

TOL64 = LAYER_TOL[torch.float64]


# ----------------------------------------------------------------------------- shared
def _random_values(parts: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict:
    """Seeded float64 values for each part's weight (of the shape given) and bias: weights ~
    N(0, 1/fan_in), biases ~ N(0, 0.25), LayerNorm gains in [0.5, 1.5] and shifts in
    [-0.5, 0.5] (so swapping norms shows)."""
    out = {}
    for part, w in parts.items():
        for name, shape in ((f"{part}.weight", w), (f"{part}.bias", w[:1])):
            if name.startswith("norm"):
                lo, hi = (0.5, 1.5) if name.endswith("weight") else (-0.5, 0.5)
                v = rng.uniform(lo, hi, size=shape)
            elif name.endswith("weight"):
                v = rng.normal(size=shape) / math.sqrt(shape[1])
            else:
                v = 0.5 * rng.normal(size=shape)
            out[name] = torch.from_numpy(v)
    return out


def _rounded(values: dict[str, torch.Tensor], dtype) -> dict[str, torch.Tensor]:
    """The float64 values of the parameters as the candidate holds them in ``dtype``."""
    return {k: v.to(dtype).double() for k, v in values.items()}


#: The earlier exercise the encoder layer's __init__ builds a part from: the reference class
#: while it is built, so a stub FeedForward costs exercise 1's points only.
EARLIER = {"FeedForward": ref.FeedForward}


def _build(ctx, cls, args, kwargs, P, dtype, case, specs, sample, parts=None, likely=None):
    """The learner's module: built (with ``parts``, the earlier exercises' classes, the
    reference ones), ``parts`` (name -> make(p)) replaced by the reference ones, converted to
    ``dtype``, lazy layers set up on zeros of shape ``sample``, then the values ``P`` loaded
    by name."""
    mod = build_module(ctx, cls, args, kwargs, case, earlier=EARLIER if parts else None)
    for name, make in (parts or {}).items():
        substitute(ctx, mod, name, make, case, specs[name])
    mod.to(dtype)
    x0 = torch.zeros(*sample, dtype=dtype)
    materialize_with(ctx, mod, lambda: ctx.call(mod, x0, case=case), case)
    load_reference_weights(ctx, mod, P, specs, case, likely=likely)
    return mod


def _expect_deterministic(ctx: Context, got, again, case: str, mistake: str) -> None:
    """The default dropout is 0.0: two calls on the same input, in training mode, agree."""
    if not torch.equal(got, again):
        ctx.fail(
            "two calls on the same input gave different outputs, in training mode with the "
            "default dropout=0.0.",
            case=case,
            mistake=mistake,
        )


#: The properties "tokens that must not see each other" by their mistake ids: the message.
INVARIANT = {
    "tokens_mixed": "changing token 3 changed the output at other positions: the feed-forward "
    "network must act on every position separately.",
    "encoder_mask_ignored": "changing the padded tokens changed the outputs at real tokens: "
    "padding must be invisible to the real tokens.",
}


def _expect_invariant(ctx, run, x, change, scale, rng, keep, case, mistake) -> None:
    """New values (``scale`` times N(0, 1), from ``rng``) at ``x[change]`` leave ``run``'s
    output at ``keep`` unchanged, else the property ``INVARIANT[mistake]`` fails."""
    out = run(x)
    x2 = x.clone()
    x2[change] = torch.from_numpy(scale * rng.normal(size=tuple(x2[change].shape)))
    out2 = run(x2)
    ok = isinstance(out2, torch.Tensor) and tuple(out2.shape) == tuple(out.shape)
    if not ok or not torch.allclose(out2[keep], out[keep], **TOL64):
        ctx.fail(INVARIANT[mistake], case=case, mistake=mistake)


def _expect_dropout(ctx, mod, run, case, *, p, mistake, model, what, hint):
    """Built with dropout ``p``: in eval mode the output is ``model()``'s (expected, mistake
    models), in training mode (seeded) it is not; returns the training-mode output."""
    torch.manual_seed(ctx.seed)
    train_out = run(case + ", training mode")
    mod.eval()
    eval_out = run(case + ", eval mode")
    expected, mistakes = model()
    ctx.expect_close(
        eval_out,
        expected,
        what=what,
        case=case + ", eval mode",
        mistakes=mistakes,
        hint=hint,
        **TOL64,
    )
    expect_dropout_applied(ctx, train_out, eval_out, p=p, case=case, mistake=mistake)
    return train_out


# ----------------------------------------------------------------------------- feed_forward
FF_SPECS = {"linear1": "nn.Linear(d_model, d_ff)", "linear2": "nn.Linear(d_ff, d_model)"}
FF_HINT = "FFN(x) = linear2(dropout(relu(linear1(x))))."
#: label, x's leading dims, d_model, d_ff, x's scale
FF_CASES = [
    ("a batch of 2, T=5, d_model=8, d_ff=16 (default dropout)", (2, 5), 8, 16, 1.0),
    ("no batch dimension: x (T=4, d_model=6), d_ff=10", (4,), 6, 10, 1.0),
    ("one token, a batch of one, d_ff < d_model", (1, 1), 8, 4, 1.0),
    ("two batch dims (2, 3), T=4, d_model=4, d_ff=12", (2, 3, 4), 4, 12, 1.0),
    ("large inputs", (2, 3), 6, 24, 5.0),
]
FF_THOROUGH_CASES = [
    ("a batch of 4, T=9, d_model=32, d_ff=64", (4, 9), 32, 64, 1.0),
    ("d_model=1, d_ff=3", (2, 2), 1, 3, 1.0),
]
#: id, the activation of ff_model that makes the mistake, and the one it must be nearer to
#: than to (the two GELUs differ by less than the diagnosis tolerance).
FF_MISTAKES = [
    ("relu_missing", "none", None),
    ("relu_after_linear2", "after", None),
    ("relu_after_linear2", "both", None),
    ("activation_gelu_tanh", "gelu_tanh", "gelu"),
    ("activation_gelu", "gelu", None),
]


def ff_model(x: torch.Tensor, P: dict[str, torch.Tensor], act: str = "correct"):
    """The feed-forward network in float64. act: "correct" (ReLU), "none", "after" (ReLU
    after linear2 only), "both" (after each layer), "gelu", "gelu_tanh" (tanh approximation).
    """
    h = F.linear(x, P["linear1.weight"], P["linear1.bias"])
    if act in ("correct", "both"):
        h = torch.relu(h)
    elif act in ("gelu", "gelu_tanh"):
        h = F.gelu(h, approximate="tanh" if act == "gelu_tanh" else "none")
    y = F.linear(h, P["linear2.weight"], P["linear2.bias"])
    return torch.relu(y) if act in ("after", "both") else y


def _ff_mistakes(x64, P) -> list[Mistake]:
    def nearer(act, other):
        def applies(g, _e):
            a, b = ff_model(x64, P, act).numpy(), ff_model(x64, P, other).numpy()
            if a.shape != g.shape or not np.allclose(g, a, rtol=1e-3, atol=1e-4):
                return False
            return float(np.abs(g - a).max()) < float(np.abs(g - b).max())

        return applies

    return [
        Mistake.of(i, applies=nearer(act, other))
        if other
        else Mistake.of(i, model=lambda act=act: ff_model(x64, P, act))
        for i, act, other in FF_MISTAKES
    ]


def _ff_parts(D: int, Fd: int) -> dict[str, tuple[int, ...]]:
    return {"linear1": (Fd, D), "linear2": (D, Fd)}


def _ff_build(cls, ctx, D, Fd, dropout, P, dtype, case) -> nn.Module:
    args = (D, Fd) if dropout is None else (D, Fd, dropout)
    return _build(ctx, cls, args, {}, P, dtype, case, FF_SPECS, (1, D))


def _ff_out(ctx, got, x, case) -> torch.Tensor:
    if isinstance(got, tuple | list):
        ctx.fail(
            f"forward must return one tensor (..., d_model); got a {type(got).__name__} of "
            f"length {len(got)}.",
            case=case,
        )
    ctx.expect_array(got, x, what="the output", case=case)
    return got


@exercise(
    "feed_forward",
    kind="module",
    forbidden=lambda: [
        (ref.FeedForward.forward, "the reference attention_ref.FeedForward"),
        (ref.EncoderLayer.forward, "the reference attention_ref.EncoderLayer"),
        (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
    ],
    summary="position-wise feed-forward network linear2(dropout(relu(linear1(x))))",
)
def check_feed_forward(cls, ctx: Context) -> None:
    """The output on every case in float64 and float32 (twice the same on the first: the
    default dropout is 0.0), each position on its own, then dropout."""
    rng = ctx.rng(61)
    for i, (label, lead, D, Fd, scale) in enumerate(
        FF_CASES + (FF_THOROUGH_CASES if ctx.thorough else [])
    ):
        P = _random_values(_ff_parts(D, Fd), ctx.rng(600 + i))
        x64 = torch.from_numpy(normal(rng, *lead, D, scale=scale))
        for dtype in (torch.float64, torch.float32):
            x = x64.to(dtype)
            case = f"{label}: FeedForward({D}, {Fd}), x {tuple(x.shape)} {dtype_name(dtype)}"
            mod = _ff_build(cls, ctx, D, Fd, None, P, dtype, case)  # training mode
            got = _ff_out(ctx, ctx.call(mod, x, case=case), x, case)
            P64, xr = _rounded(P, dtype), x.double()
            if i == 0:
                again = ctx.call(mod, x, case=case)
                _expect_deterministic(ctx, got, again, case, "ff_dropout_hard_coded")
            ctx.expect_close(
                got,
                ff_model(xr, P64),
                what="the output",
                case=case,
                mistakes=_ff_mistakes(xr, P64),
                hint=FF_HINT,
                **LAYER_TOL[dtype],
            )
    # Position-wise: changing token 3 leaves the other tokens' outputs as they were.
    rng, D, Fd = ctx.rng(62), 6, 12
    P = _random_values(_ff_parts(D, Fd), ctx.rng(63))
    x = torch.from_numpy(normal(rng, 2, 5, D))
    case = f"FeedForward({D}, {Fd}), x {tuple(x.shape)} float64, then x with token 3 changed"
    mod = _ff_build(cls, ctx, D, Fd, None, P, torch.float64, case)

    def run(x):
        return _ff_out(ctx, ctx.call(mod, x, case=case), x, case)

    keep = (slice(None), [0, 1, 2, 4])
    _expect_invariant(ctx, run, x, (slice(None), 3), 1.0, rng, keep, case, "tokens_mixed")
    _check_ff_dropout(cls, ctx)


def _check_ff_dropout(cls, ctx: Context) -> None:
    """dropout=0.5: random in training mode, applied to the hidden ReLU activations with
    the 1/(1-p) scaling; deterministic and equal to the reference in eval mode."""
    rng = ctx.rng(64)
    D, Fd, p = 8, 6, 0.5  # d_ff <= d_model: the hidden activations can be solved for
    P = _random_values(_ff_parts(D, Fd), ctx.rng(65))
    x = torch.from_numpy(normal(rng, 4, 16, D))
    case = f"FeedForward({D}, {Fd}, dropout={p}), x {tuple(x.shape)} float64"
    mod = _ff_build(cls, ctx, D, Fd, p, P, torch.float64, case)
    train_out = _expect_dropout(
        ctx,
        mod,
        lambda c: _ff_out(ctx, ctx.call(mod, x, case=c), x, case),
        case,
        p=p,
        mistake="ff_dropout_ignored",
        model=lambda: (ff_model(x, P), _ff_mistakes(x, P)),
        what="the output in eval mode",
        hint="in eval mode dropout does nothing: FFN(x) = linear2(relu(linear1(x))).",
    )
    # Solve linear2 for the hidden activations it was given: each must be 0 (dropped) or
    # relu(linear1(x)) / (1 - p) (kept and rescaled).
    w2, b2 = P["linear2.weight"], P["linear2.bias"]
    hidden = torch.linalg.lstsq(w2, (train_out - b2).reshape(-1, D).T).solution.T
    h = torch.relu(F.linear(x, P["linear1.weight"], P["linear1.bias"])).reshape(-1, Fd)
    fits = torch.isclose(hidden, torch.zeros_like(hidden), atol=1e-6) | torch.isclose(
        hidden, h / (1 - p), rtol=1e-6, atol=1e-6
    )
    if not bool(fits.all()):
        zeros = float((train_out == 0).double().mean())
        unscaled = torch.isclose(hidden, torch.zeros_like(hidden), atol=1e-6) | torch.isclose(
            hidden, h, rtol=1e-6, atol=1e-6
        )
        if zeros > 0.2:
            mistake = "dropout_after_linear2"
        elif bool(unscaled.all()):
            mistake = "ff_dropout_not_rescaled"
        elif _dropped_input_explains(hidden, x.reshape(-1, D), P, p):
            mistake = "ff_dropout_on_input"
        else:
            mistake = "dropout_misplaced"
        ctx.fail(
            "in training mode the output is not linear2 of the (randomly dropped, rescaled "
            "by 1/(1-p)) hidden activations.",
            case=case + ", training mode",
            mistake=named(mistake),
        )


def _dropped_input_explains(hidden, x, P, p: float) -> bool:
    """Every row of ``hidden`` (N, d_ff) is relu(linear1(x_row * m / (1 - p))) for some
    dropout pattern m in {0, 1}^d_model (2^d_model tried, d_model small): dropout on the
    input of linear1 rather than on the hidden activations."""
    D = x.shape[-1]
    bits = torch.arange(2**D)[:, None] >> torch.arange(D) & 1  # (2^D, D): every pattern
    dropped = x[:, None, :] * bits.to(x.dtype) / (1 - p)  # (N, 2^D, D)
    h = torch.relu(F.linear(dropped, P["linear1.weight"], P["linear1.bias"]))
    close = torch.isclose(h, hidden[:, None, :], rtol=1e-6, atol=1e-6).all(-1)  # (N, 2^D)
    return bool(close.any(-1).all())


# ----------------------------------------------------------------------------- encoder_layer
_MHA = "MultiHeadAttention(d_model, n_heads, dropout=dropout)"
_FF = "FeedForward(d_model, d_ff, dropout)"
LAYER_SPECS = {
    "self_attn": _MHA + " (from attention_ref)",
    **{f"self_attn.{n}": _MHA for n in ("w_q", "w_k", "w_v", "w_o")},
    "ff": _FF,
    "ff.linear1": _FF,
    "ff.linear2": _FF,
    "norm1": "nn.LayerNorm(d_model)",
    "norm2": "nn.LayerNorm(d_model)",
}
# The parts that are earlier exercises (multi-head attention from notebook 04, the
# feed-forward network from exercise 1) are replaced by the reference ones before grading,
# with the dropout probability found in the learner's part: a bug in them costs points
# once, in their own exercise.
LAYER_HINT = (
    "post-norm: x = norm1(x + attn(x)); x = norm2(x + ff(x)). Pre-norm: "
    "x = x + attn(norm1(x)); x = x + ff(norm2(x))."
)
#: The masks of the cases below, built when a check runs, not when this module is imported:
#: so the toolkit's mask builders need not run in a graded kernel, and are withheld from it.
LAYER_MASKS = {
    "pad": lambda: padding_mask([6, 3, 1], 6)[:, None],  # (3, 1, 1, 6)
    "causal": lambda: causal_mask(5),  # (5, 5)
}
#: label, EncoderLayer(d_model, n_heads, d_ff, norm_first) (None: the default, False),
#: x's (B, T), the mask (a key of LAYER_MASKS), x's scale
LAYER_CASES = [
    ("post-norm (the defaults), T=5, d_model=8, 2 heads", (8, 2, 16, None), (2, 5), None, 1.0),
    ("pre-norm, T=5, d_model=8, 2 heads", (8, 2, 16, True), (2, 5), None, 1.0),
    ("post-norm, a padding mask (3, 1, 1, 6): lengths 6, 3, 1", (8, 2, 12, False), (3, 6), "pad",
     1.0),
    ("pre-norm, a padding mask (3, 1, 1, 6): lengths 6, 3, 1", (8, 4, 12, True), (3, 6), "pad",
     1.0),
    ("post-norm, a causal mask (5, 5)", (12, 3, 24, False), (2, 5), "causal", 1.0),
    ("pre-norm, one token, a batch of one, one head", (6, 1, 8, True), (1, 1), None, 1.0),
    ("post-norm, large inputs", (8, 2, 16, False), (2, 4), None, 5.0),
]  # fmt: skip
LAYER_THOROUGH_CASES = [
    ("pre-norm, T=9, d_model=16, 4 heads", (16, 4, 32, True), (3, 9), None, 1.0),
    ("pre-norm, a causal mask (5, 5)", (8, 2, 16, True), (2, 5), "causal", 1.0),
    ("post-norm, d_ff < d_model", (16, 8, 8, False), (2, 3), None, 1.0),
]
#: The encoder layer's mistake models: (id, the model's options, the layers it shows on:
#: "pre"-norm or "post"-norm ones, "masked" (a mask is given), "any"), tried in this order.
LAYER_MISTAKES = [
    ("encoder_layer_mask_ignored", dict(use_mask=False), "masked"),
    ("residual_missing_attention", dict(res_attn=False), "any"),
    ("residual_missing_ff", dict(res_ff=False), "any"),
    ("residual_missing", dict(res_attn=False, res_ff=False), "any"),
    ("norms_swapped", dict(swap_norms=True), "any"),
    ("norms_never_applied", dict(order="no_norm"), "any"),
    ("ff_given_layer_input", dict(ff_input="layer_input"), "any"),
    ("norm_first_ignored", dict(order="post"), "pre"),
    ("pre_norm_on_sublayer_output", dict(order="sublayer_norm"), "pre"),
    ("pre_norm_residual_normalised", dict(order="residual_normed"), "pre"),
    ("pre_norm_although_post", dict(order="pre"), "post"),
    ("post_norm_before_residual", dict(order="sublayer_norm"), "post"),
]
#: The norm a post-norm sublayer applies after its residual, which a hint names.
NORM_AFTER = {"residual_missing_attention": 1, "residual_missing_ff": 2}


def layer_model(
    r: ref.EncoderLayer,
    x: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    order: str = "correct",
    res_attn: bool = True,
    res_ff: bool = True,
    swap_norms: bool = False,
    use_mask: bool = True,
    ff_input: str = "correct",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder layer in float64 (with the reference's weights), one knob per mistake.

    Every knob's default is the right computation. order: "correct" (as ``r.norm_first``
    says), "post", "pre", "sublayer_norm" (x + norm(f(x))), "residual_normed" (h = norm(x);
    h + f(h)), "no_norm". ff_input: "layer_input" (the feed-forward network gets the layer's
    input x instead of the attention sublayer's output).
    """
    if order == "correct":
        order = "pre" if r.norm_first else "post"
    n1, n2 = (r.norm2, r.norm1) if swap_norms else (r.norm1, r.norm2)
    P = dict(r.ff.state_dict())
    weights = []

    def attn(h):
        out, w = r.self_attn(h, h, h, mask if use_mask else None)
        weights.append(w)
        return out

    x0 = x if ff_input == "layer_input" else None
    with torch.no_grad():
        x = M.sublayer(x, attn, n1, order, residual=res_attn)
        x = M.sublayer(x, lambda h: ff_model(h, P), n2, order, residual=res_ff, f_input=x0)
    return x, weights[0]


def _layer_mistakes(r, x64, mask, which: int) -> list[Mistake]:
    """The mistake models that apply to this layer and mask; ``which`` 0 = out, 1 = weights."""
    shows_on = {"any", "pre" if r.norm_first else "post", "masked" if mask is not None else ""}

    def then(i: str) -> dict:
        if i not in NORM_AFTER:
            return {}
        return {"then": "." if r.norm_first else f" (then norm{NORM_AFTER[i]})."}

    return [
        Mistake.of(i, model=lambda kw=kw: layer_model(r, x64, mask, **kw)[which], **then(i))
        for i, kw, shows in LAYER_MISTAKES
        if shows in shows_on
    ]


def _layer_parts(D: int, Fd: int) -> dict[str, tuple[int, ...]]:
    """The encoder layer's parts and their weights' shapes, in the reference's order."""
    attn = {f"self_attn.{n}": (D, D) for n in ("w_q", "w_k", "w_v", "w_o")}
    ff = {f"ff.{name}": shape for name, shape in _ff_parts(D, Fd).items()}
    return attn | ff | {"norm1": (D,), "norm2": (D,)}


def _ref_layer(D, H, Fd, norm_first, P64) -> ref.EncoderLayer:
    layer = ref.EncoderLayer(D, H, Fd, norm_first=norm_first).double().eval()
    layer.load_state_dict(P64)
    return layer


def _feed_forward_part(D: int, Fd: int, p: float) -> nn.Module:
    """The reference feed-forward network built of PyTorch's modules alone, with
    ``FeedForward``'s parameter names (``linear1``, ReLU, ``dropout``, ``linear2``, applied in
    that order): the part this check puts in the learner's layer, where notebook 06's graded
    kernel has no ``FeedForward.forward`` of the course's to run."""
    return nn.Sequential(
        OrderedDict(
            linear1=nn.Linear(D, Fd),
            relu=nn.ReLU(),
            dropout=nn.Dropout(p),
            linear2=nn.Linear(Fd, D),
        )
    )


def _layer_build(cls, ctx, layer: tuple, P, dtype, case, dropout=None) -> nn.Module:
    D, H, Fd, norm_first = layer
    kwargs = {k: v for k, v in (("dropout", dropout), ("norm_first", norm_first)) if v is not None}
    parts = {
        "self_attn": lambda p: ref_mha.MultiHeadAttention(D, H, dropout=p),
        "ff": lambda p: _feed_forward_part(D, Fd, p),
    }
    likely = {"missing norm2": "each sublayer has its own LayerNorm: norm1 and norm2."}
    args = (D, H, Fd), kwargs, P, dtype, case, LAYER_SPECS, (1, 2, D), parts, likely
    return _build(ctx, cls, *args)


def _layer_call(ctx, mod, x, mask, case) -> tuple[torch.Tensor, torch.Tensor]:
    got = ctx.call(mod, *((x,) if mask is None else (x, mask)), case=case)
    if isinstance(got, torch.Tensor):
        ctx.fail(
            "forward must return a tuple (out, weights); got a single tensor.",
            case=case,
            mistake="not_a_tuple",
            hint="return x, weights, where weights are the self-attention weights "
            "(B, H, T, T) that self.self_attn returned.",
        )
    out, weights = ctx.expect_tuple(got, ("out", "weights"), case=case)
    return out, weights


def _describe(label: str, layer: tuple, dtype, x, mask, dropout=None) -> str:
    D, H, Fd, norm_first = layer
    nf = "" if norm_first is None else f", norm_first={norm_first}"
    dr = "" if dropout is None else f", dropout={dropout}"
    m = "" if mask is None else f", mask {tuple(mask.shape)}"
    x_ = f"x {tuple(x.shape)} {dtype_name(dtype)}"
    return f"{label}: EncoderLayer({D}, {H}, {Fd}{dr}{nf}), {x_}{m}"


@exercise(
    "encoder_layer",
    kind="module",
    forbidden=lambda: [
        (ref.EncoderLayer.forward, "the reference attention_ref.EncoderLayer"),
        (ref.Encoder.forward, "the reference attention_ref.Encoder"),
        (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
        (nn.TransformerEncoder.forward, "torch.nn.TransformerEncoder"),
        *BUILTIN_ATTENTION,
    ],
    summary="encoder layer: self-attention and feed-forward, residuals, LayerNorm, "
    "post-norm or pre-norm",
)
def check_encoder_layer(cls, ctx: Context) -> None:
    """out and weights on every case in float64 and float32 (twice the same on the first),
    then padding that real tokens cannot see, then dropout."""
    rng = ctx.rng(66)
    for i, (label, layer, bt, mask_name, scale) in enumerate(
        LAYER_CASES + (LAYER_THOROUGH_CASES if ctx.thorough else [])
    ):
        (D, H, Fd, norm_first), (B, T) = layer, bt
        P = _random_values(_layer_parts(D, Fd), ctx.rng(660 + i))
        x_np = normal(rng, B, T, D, scale=scale)
        mask = None if mask_name is None else torch.from_numpy(LAYER_MASKS[mask_name]())
        for dtype in (torch.float64, torch.float32):
            x = torch.from_numpy(x_np).to(dtype)
            case = _describe(label, layer, dtype, x, mask)
            mod = _layer_build(cls, ctx, layer, P, dtype, case)  # training mode, dropout 0.0
            out, weights = _layer_call(ctx, mod, x, mask, case)
            expect_not_swapped(
                ctx, out, weights, (B, T, D), (B, H, T, T), case=case, types=torch.Tensor
            )
            ctx.expect_array(out, x, what="out", case=case)
            if isinstance(weights, torch.Tensor) and tuple(weights.shape) != (B, H, T, T):
                ctx.fail(
                    f"weights has shape {tuple(weights.shape)}, expected (B, H, T, T) = "
                    f"{(B, H, T, T)}.",
                    case=case,
                    hint="return the weights self.self_attn returns, one map per head.",
                    mistake="wrong_shape",
                )
            ctx.expect_array(weights, x.new_zeros(B, H, T, T), what="weights", case=case)
            if i == 0 and dtype == torch.float64:
                again, _ = _layer_call(ctx, mod, x, mask, case)
                _expect_deterministic(ctx, out, again, case, "encoder_dropout_hard_coded")
            r = _ref_layer(D, H, Fd, bool(norm_first), _rounded(P, dtype))
            x64 = x.double()
            w_hint = "weights are what self.self_attn returns" + (
                " for norm1(x) (pre-norm)." if norm_first else " for x (post-norm)."
            )
            # out first: every catalogued mistake changes it in its own way
            outputs = [("out", out, LAYER_HINT), ("weights", weights, w_hint)]
            for which, (what, got, hint) in enumerate(outputs):
                ctx.expect_close(
                    got,
                    layer_model(r, x64, mask)[which],
                    what=what,
                    case=case,
                    mistakes=_layer_mistakes(r, x64, mask, which),
                    hint=hint,
                    **LAYER_TOL[dtype],
                )
    _check_layer_properties(cls, ctx)


def _check_layer_properties(cls, ctx: Context) -> None:
    """Post-norm then pre-norm: with a padding mask, new values at the padded tokens leave
    the real outputs unchanged; then dropout=0.3, random in training mode (the attention
    weights too, and each sub-layer's output on its own), the reference in eval mode."""
    rng = ctx.rng(67)
    real = np.array([[True] * 6, [True] * 4 + [False] * 2])
    mask = torch.from_numpy(real[:, None, None, :])
    for nf in (False, True):
        layer = (8, 2, 16, nf)
        P = _random_values(_layer_parts(8, 16), ctx.rng(68 + nf))
        x = torch.from_numpy(normal(rng, 2, 6, 8))
        case = _describe(f"padding invariance, norm_first={nf}", layer, torch.float64, x, mask)
        case += ", then the same x with new values at the padded positions"
        mod = _layer_build(cls, ctx, layer, P, torch.float64, case)

        def run_padded(x, mod=mod, case=case):
            return _layer_call(ctx, mod, x, mask, case)[0]

        change, keep = (1, slice(4, None)), torch.from_numpy(real)
        _expect_invariant(ctx, run_padded, x, change, 10.0, rng, keep, case, "encoder_mask_ignored")
    rng = ctx.rng(69)
    for nf in (False, True):
        layer, x = (8, 2, 16, nf), torch.from_numpy(normal(rng, 2, 5, 8))
        P = _random_values(_layer_parts(8, 16), ctx.rng(70 + nf))
        case = _describe("dropout", layer, torch.float64, x, None, dropout=0.3)
        mod = _layer_build(cls, ctx, layer, P, torch.float64, case, dropout=0.3)

        def run(c: str, which: int = 0, mod=mod, x=x):
            return _layer_call(ctx, mod, x, None, c)[which]

        def model(nf=nf, P=P, x=x) -> tuple:
            r = _ref_layer(8, 2, 16, nf, P)
            return layer_model(r, x, None)[0], _layer_mistakes(r, x, None, 0)

        _expect_dropout(
            ctx,
            mod,
            run,
            case,
            p=0.3,
            mistake="encoder_dropout_ignored",
            model=model,
            what="out in eval mode",
            hint="in eval mode dropout does nothing.",
        )
        mod.train()
        train_w = run(case + ", training mode", 1)
        mod.eval()
        if same_in_both_modes(train_w, run(case + ", eval mode", 1)):
            ctx.fail(
                "with dropout=0.3 the attention weights in training mode are the eval-mode "
                "weights: the attention weights are not dropped. nn.TransformerEncoderLayer "
                "applies its dropout to the attention weights too.",
                case=case + ", training mode",
                mistake="attention_dropout_not_passed",
            )
        sublayers = {"self_attn": "dropout1", "ff": "dropout2"}
        expect_sublayer_dropout(ctx, mod, run, sublayers, p=0.3, case=case)
