"""Checks for notebook 06: the module exercises ``feed_forward`` and ``encoder_layer``.

Both checks build the learner's class, copy known weights into it by parameter name
(``linear1``, ``linear2`` for ``FeedForward``; ``self_attn.w_q`` ... ``self_attn.w_o``,
``ff.linear1``, ``ff.linear2``, ``norm1``, ``norm2`` for ``EncoderLayer``, whose
``self_attn`` and ``ff`` are first replaced by the reference parts, so that a bug in an
earlier exercise costs points once) and compare its
forward with the reference computed in float64 on the same (dtype-rounded) weights. A
mismatch is named by running buggy variants of the reference (no residual, the norm in the
wrong place, no ReLU, the mask ignored, ...) and seeing which reproduces the learner's
numbers. Dropout is checked by behaviour: nothing random with ``dropout=0.0`` in training
mode, something random with ``dropout > 0`` in training mode, nothing random in eval mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    load_reference_weights,
    materialize_with,
    normal,
    padding_mask,
    same_in_both_modes,
    substitute,
)

# ----------------------------------------------------------------------------- loading


def _random_values(
    names_shapes: dict[str, tuple[int, ...]], rng: np.random.Generator
) -> dict[str, torch.Tensor]:
    """Seeded float64 parameter values: weights ~ N(0, 1/fan_in), biases ~ N(0, 0.25),
    LayerNorm gains in [0.5, 1.5] and shifts in [-0.5, 0.5] (so swapping norms shows)."""
    out = {}
    for name, shape in names_shapes.items():
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


# ----------------------------------------------------------------------------- feed_forward
FF_SPECS = {
    "linear1": "nn.Linear(d_model, d_ff)",
    "linear2": "nn.Linear(d_ff, d_model)",
}


def ff_model(x: torch.Tensor, P: dict[str, torch.Tensor], act: str = "correct", prefix: str = ""):
    """The feed-forward network in float64 with one knob per mistake.

    act: "correct" (ReLU), "none", "after" (ReLU after linear2 only), "both" (after each layer),
    "gelu" (exact), "gelu_tanh" (the tanh approximation).
    """
    w1, b1 = P[f"{prefix}linear1.weight"], P[f"{prefix}linear1.bias"]
    w2, b2 = P[f"{prefix}linear2.weight"], P[f"{prefix}linear2.bias"]
    h = F.linear(x, w1, b1)
    if act in ("correct", "both"):
        h = torch.relu(h)
    elif act == "gelu":
        h = F.gelu(h)
    elif act == "gelu_tanh":
        h = F.gelu(h, approximate="tanh")
    y = F.linear(h, w2, b2)
    if act in ("after", "both"):
        y = torch.relu(y)
    return y


def _ff_mistakes(x64, P, prefix="") -> list[Mistake]:
    def m(mistake_id, act):
        return Mistake.of(mistake_id, model=lambda: ff_model(x64, P, act, prefix))

    def nearer(act, other):
        """The learner's output matches ``act``'s model, and is nearer to it than to
        ``other``'s (the two GELUs differ by less than the diagnosis tolerance)."""

        def applies(g, _e):
            a = ff_model(x64, P, act, prefix).numpy()
            b = ff_model(x64, P, other, prefix).numpy()
            if a.shape != g.shape or not np.allclose(g, a, rtol=1e-3, atol=1e-4):
                return False
            return float(np.abs(g - a).max()) < float(np.abs(g - b).max())

        return applies

    return [
        m("relu_missing", "none"),
        m("relu_after_linear2", "after"),
        m("relu_after_linear2", "both"),
        Mistake.of("activation_gelu_tanh", applies=nearer("gelu_tanh", "gelu")),
        m("activation_gelu", "gelu"),
    ]


def _ff_shapes(D: int, Fd: int) -> dict[str, tuple[int, ...]]:
    """The feed-forward network's parameters and their shapes."""
    return {
        "linear1.weight": (Fd, D),
        "linear1.bias": (Fd,),
        "linear2.weight": (D, Fd),
        "linear2.bias": (D,),
    }


def _ff_forbidden():
    return [
        (ref.FeedForward.forward, "the reference attention_ref.FeedForward"),
        (ref.EncoderLayer.forward, "the reference attention_ref.EncoderLayer"),
        (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
    ]


def _ff_build(cls, ctx, D, Fd, dropout, P, dtype, case) -> nn.Module:
    args = (D, Fd) if dropout is None else (D, Fd, dropout)
    mod = build_module(ctx, cls, args, {}, case)
    mod.to(dtype)
    materialize_with(
        ctx, mod, lambda: ctx.call(mod, torch.zeros(1, D, dtype=dtype), case=case), case
    )
    load_reference_weights(ctx, mod, P, FF_SPECS, case)
    return mod


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
    forbidden=_ff_forbidden,
    summary="position-wise feed-forward network linear2(dropout(relu(linear1(x))))",
)
def check_feed_forward(cls, ctx: Context) -> None:
    rng = ctx.rng(61)
    cases = [
        ("a batch of 2, T=5, d_model=8, d_ff=16 (default dropout)", (2, 5), 8, 16),
        ("no batch dimension: x (T=4, d_model=6), d_ff=10", (4,), 6, 10),
        ("one token, a batch of one, d_ff < d_model", (1, 1), 8, 4),
        ("two batch dims (2, 3), T=4, d_model=4, d_ff=12", (2, 3, 4), 4, 12),
        ("large inputs", (2, 3), 6, 24),
    ]
    if ctx.thorough:
        cases += [
            ("a batch of 4, T=9, d_model=32, d_ff=64", (4, 9), 32, 64),
            ("d_model=1, d_ff=3", (2, 2), 1, 3),
        ]
    for i, (label, lead, D, Fd) in enumerate(cases):
        P = _random_values(_ff_shapes(D, Fd), ctx.rng(600 + i))
        scale = 5.0 if label == "large inputs" else 1.0
        x64 = torch.from_numpy(scale * rng.normal(size=(*lead, D)))
        for dtype in (torch.float64, torch.float32):
            x = x64.to(dtype)
            case = f"{label}: FeedForward({D}, {Fd}), x {tuple(x.shape)} {dtype_name(dtype)}"
            mod = _ff_build(cls, ctx, D, Fd, None, P, dtype, case)  # training mode
            got = _ff_out(ctx, ctx.call(mod, x, case=case), x, case)
            P64 = _rounded(P, dtype)
            xr = x.double()
            expected = ff_model(xr, P64)
            if i == 0:
                again = ctx.call(mod, x, case=case)
                if not torch.equal(got, again):
                    ctx.fail(
                        "two calls on the same input gave different outputs, in training mode "
                        "with the default dropout=0.0.",
                        case=case,
                        mistake="ff_dropout_hard_coded",
                    )
            ctx.expect_close(
                got,
                expected,
                what="the output",
                case=case,
                mistakes=_ff_mistakes(xr, P64),
                hint="FFN(x) = linear2(dropout(relu(linear1(x)))).",
                **LAYER_TOL[dtype],
            )
    _check_ff_position_wise(cls, ctx)
    _check_ff_dropout(cls, ctx)


def _check_ff_position_wise(cls, ctx: Context) -> None:
    """Each position on its own: the output for one token must not depend on the others."""
    rng = ctx.rng(62)
    D, Fd = 6, 12
    P = _random_values(_ff_shapes(D, Fd), ctx.rng(63))
    x = torch.from_numpy(rng.normal(size=(2, 5, D)))
    case = f"FeedForward({D}, {Fd}), x {tuple(x.shape)} float64, then x with token 3 changed"
    mod = _ff_build(cls, ctx, D, Fd, None, P, torch.float64, case)
    out = _ff_out(ctx, ctx.call(mod, x, case=case), x, case)
    x2 = x.clone()
    x2[:, 3] = torch.from_numpy(rng.normal(size=(2, D)))
    out2 = _ff_out(ctx, ctx.call(mod, x2, case=case), x2, case)
    keep = [0, 1, 2, 4]
    if not torch.allclose(out2[:, keep], out[:, keep], **LAYER_TOL[torch.float64]):
        ctx.fail(
            "changing token 3 changed the output at other positions: the feed-forward network "
            "must act on every position separately.",
            case=case,
            mistake="tokens_mixed",
        )


def _check_ff_dropout(cls, ctx: Context) -> None:
    """dropout=0.5: random in training mode, applied to the hidden ReLU activations with
    the 1/(1-p) scaling; deterministic and equal to the reference in eval mode."""
    rng = ctx.rng(64)
    D, Fd, p = 8, 6, 0.5  # d_ff <= d_model: the hidden activations can be solved for
    P = _random_values(_ff_shapes(D, Fd), ctx.rng(65))
    x = torch.from_numpy(rng.normal(size=(4, 16, D)))
    case = f"FeedForward({D}, {Fd}, dropout={p}), x {tuple(x.shape)} float64"
    mod = _ff_build(cls, ctx, D, Fd, p, P, torch.float64, case)
    torch.manual_seed(ctx.seed)
    train_out = _ff_out(ctx, ctx.call(mod, x, case=case + ", training mode"), x, case)
    mod.eval()
    eval_out = _ff_out(ctx, ctx.call(mod, x, case=case + ", eval mode"), x, case)
    expected = ff_model(x, P)
    ctx.expect_close(
        eval_out,
        expected,
        what="the output in eval mode",
        case=case + ", eval mode",
        mistakes=_ff_mistakes(x, P),
        hint="in eval mode dropout does nothing: FFN(x) = linear2(relu(linear1(x))).",
        **LAYER_TOL[torch.float64],
    )
    expect_dropout_applied(ctx, train_out, eval_out, p=p, case=case, mistake="ff_dropout_ignored")
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
        likely = named("dropout_after_linear2") if zeros > 0.2 else named("dropout_misplaced")
        ctx.fail(
            "in training mode the output is not linear2 of the (randomly dropped, rescaled "
            "by 1/(1-p)) hidden activations.",
            case=case + ", training mode",
            mistake=likely,
        )


# ----------------------------------------------------------------------------- encoder_layer
LAYER_SPECS = {
    "self_attn": "MultiHeadAttention(d_model, n_heads, dropout=dropout) (from attention_ref)",
    "self_attn.w_q": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "self_attn.w_k": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "self_attn.w_v": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "self_attn.w_o": "MultiHeadAttention(d_model, n_heads, dropout=dropout)",
    "ff": "FeedForward(d_model, d_ff, dropout)",
    "ff.linear1": "FeedForward(d_model, d_ff, dropout)",
    "ff.linear2": "FeedForward(d_model, d_ff, dropout)",
    "norm1": "nn.LayerNorm(d_model)",
    "norm2": "nn.LayerNorm(d_model)",
}
# The parts that are earlier exercises (multi-head attention from notebook 04, the
# feed-forward network from exercise 1) are replaced by the reference ones before grading,
# with the dropout probability found in the learner's part: a bug in them costs points
# once, in their own exercise.
SUBSTITUTED = "self_attn (reference MultiHeadAttention) and ff (reference FeedForward)"


def _layer_shapes(D: int, Fd: int) -> dict[str, tuple[int, ...]]:
    """The encoder layer's parameters and their shapes, in the reference's order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for n in ("w_q", "w_k", "w_v", "w_o"):
        shapes[f"self_attn.{n}.weight"] = (D, D)
        shapes[f"self_attn.{n}.bias"] = (D,)
    shapes.update({f"ff.{name}": shape for name, shape in _ff_shapes(D, Fd).items()})
    for n in ("norm1", "norm2"):
        shapes.update({f"{n}.weight": (D,), f"{n}.bias": (D,)})
    return shapes


def _ref_layer(D, H, Fd, norm_first, P64) -> ref.EncoderLayer:
    layer = ref.EncoderLayer(D, H, Fd, norm_first=norm_first).double().eval()
    layer.load_state_dict(P64)
    return layer


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
    act: str = "correct",
    ff_input: str = "correct",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder layer in float64 (with the reference's weights), one knob per mistake.

    Every knob's default, "correct", is the right computation. order: "correct" (as
    ``r.norm_first`` says), "post", "pre", "sublayer_norm" (x + norm(f(x))),
    "residual_normed" (h = norm(x); h + f(h)), "no_norm". ff_input: "layer_input"
    (the feed-forward network gets the layer's input x instead of the attention sublayer's
    output).
    """
    if order == "correct":
        order = "pre" if r.norm_first else "post"
    n1, n2 = (r.norm2, r.norm1) if swap_norms else (r.norm1, r.norm2)
    m = mask if use_mask else None
    P = {k: v for k, v in r.ff.state_dict().items()}
    weights = []

    def attn(h):
        out, w = r.self_attn(h, h, h, m)
        weights.append(w)
        return out

    def ff(h):
        return ff_model(h, P, act)

    x0 = x if ff_input == "layer_input" else None
    with torch.no_grad():
        x = M.sublayer(x, attn, n1, order, residual=res_attn)
        x = M.sublayer(x, ff, n2, order, residual=res_ff, f_input=x0)
    return x, weights[0]


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


def _layer_mistakes(r, x64, mask, which: int) -> list[Mistake]:
    """The mistake models that apply to this layer and mask; ``which`` 0 = out, 1 = weights."""
    shows_on = {"any", "pre" if r.norm_first else "post"} | (
        {"masked"} if mask is not None else set()
    )

    def then(mistake_id: str) -> dict:
        if mistake_id not in NORM_AFTER:
            return {}
        return {"then": "." if r.norm_first else f" (then norm{NORM_AFTER[mistake_id]})."}

    return [
        Mistake.of(i, model=lambda kw=kw: layer_model(r, x64, mask, **kw)[which], **then(i))
        for i, kw, shows in LAYER_MISTAKES
        if shows in shows_on
    ]


def _layer_forbidden():
    return [
        (ref.EncoderLayer.forward, "the reference attention_ref.EncoderLayer"),
        (ref.Encoder.forward, "the reference attention_ref.Encoder"),
        (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
        (nn.TransformerEncoder.forward, "torch.nn.TransformerEncoder"),
        *BUILTIN_ATTENTION,
    ]


@dataclass
class LayerCase:
    label: str
    D: int
    H: int
    Fd: int
    norm_first: bool | None  # None: rely on the default (False)
    x: np.ndarray
    mask: np.ndarray | None = None


def _layer_cases(ctx: Context) -> list[LayerCase]:
    """Rows: label, EncoderLayer(D, H, d_ff, norm_first), x's (B, T), the mask, [x's scale]."""
    rng = ctx.rng(66)
    pad = padding_mask([6, 3, 1], 6)[:, None]  # (3, 1, 1, 6)
    rows = [
        ("post-norm (the defaults), T=5, d_model=8, 2 heads", (8, 2, 16, None), (2, 5), None),
        ("pre-norm, T=5, d_model=8, 2 heads", (8, 2, 16, True), (2, 5), None),
        ("post-norm, a padding mask (3, 1, 1, 6): lengths 6, 3, 1", (8, 2, 12, False), (3, 6), pad),
        ("pre-norm, a padding mask (3, 1, 1, 6): lengths 6, 3, 1", (8, 4, 12, True), (3, 6), pad),
        ("post-norm, a causal mask (5, 5)", (12, 3, 24, False), (2, 5), causal_mask(5)),
        ("pre-norm, one token, a batch of one, one head", (6, 1, 8, True), (1, 1), None),
        ("post-norm, large inputs", (8, 2, 16, False), (2, 4), None, 5.0),  # x's scale
    ]
    if ctx.thorough:
        rows += [
            ("pre-norm, T=9, d_model=16, 4 heads", (16, 4, 32, True), (3, 9), None),
            ("pre-norm, a causal mask (5, 5)", (8, 2, 16, True), (2, 5), causal_mask(5)),
            ("post-norm, d_ff < d_model", (16, 8, 8, False), (2, 3), None),
        ]
    return [
        LayerCase(label, *layer, normal(rng, *bt, layer[0], scale=scale[0] if scale else 1.0), m)
        for label, layer, bt, m, *scale in rows
    ]


def _layer_build(cls, ctx, c: LayerCase, P, dtype, case, dropout=None) -> nn.Module:
    args: tuple = (c.D, c.H, c.Fd)
    kwargs: dict = {}
    if dropout is not None:
        kwargs["dropout"] = dropout
    if c.norm_first is not None:
        kwargs["norm_first"] = c.norm_first
    mod = build_module(ctx, cls, args, kwargs, case)
    parts = {
        "self_attn": lambda p: ref_mha.MultiHeadAttention(c.D, c.H, dropout=p),
        "ff": lambda p: ref.FeedForward(c.D, c.Fd, p),
    }
    for name, make in parts.items():
        substitute(ctx, mod, name, make, case, LAYER_SPECS[name])
    mod.to(dtype)
    x0 = torch.zeros(1, 2, c.D, dtype=dtype)
    materialize_with(ctx, mod, lambda: ctx.call(mod, x0, case=case), case)
    likely = {"missing norm2": "each sublayer has its own LayerNorm: norm1 and norm2."}
    load_reference_weights(ctx, mod, P, LAYER_SPECS, case, likely=likely)
    return mod


def _layer_call(ctx, mod, x, mask, case) -> tuple[torch.Tensor, torch.Tensor]:
    args = (x,) if mask is None else (x, mask)
    got = ctx.call(mod, *args, case=case)
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


def _describe_case(c: LayerCase, dtype, x, mask, dropout=None) -> str:
    nf = "" if c.norm_first is None else f", norm_first={c.norm_first}"
    dr = "" if dropout is None else f", dropout={dropout}"
    m = "" if mask is None else f", mask {tuple(mask.shape)}"
    layer = f"EncoderLayer({c.D}, {c.H}, {c.Fd}{dr}{nf})"
    return f"{c.label}: {layer}, x {tuple(x.shape)} {dtype_name(dtype)}{m}"


@exercise(
    "encoder_layer",
    kind="module",
    forbidden=_layer_forbidden,
    summary="encoder layer: self-attention and feed-forward, residuals, LayerNorm, "
    "post-norm or pre-norm",
)
def check_encoder_layer(cls, ctx: Context) -> None:
    cases = _layer_cases(ctx)
    for i, c in enumerate(cases):
        P = _random_values(_layer_shapes(c.D, c.Fd), ctx.rng(660 + i))
        for dtype in (torch.float64, torch.float32):
            _check_layer_case(cls, ctx, c, P, dtype, first=i == 0 and dtype == torch.float64)
    _check_padding_invariance(cls, ctx)
    _check_layer_dropout(cls, ctx)


def _check_layer_case(cls, ctx: Context, c: LayerCase, P, dtype, first: bool) -> None:
    x = torch.from_numpy(c.x).to(dtype)
    mask = None if c.mask is None else torch.from_numpy(c.mask)
    case = _describe_case(c, dtype, x, mask)
    mod = _layer_build(cls, ctx, c, P, dtype, case)  # training mode, dropout 0.0
    out, weights = _layer_call(ctx, mod, x, mask, case)
    B, T, D = x.shape
    expect_not_swapped(ctx, out, weights, (B, T, D), (B, c.H, T, T), case=case, types=torch.Tensor)
    ctx.expect_array(out, x, what="out", case=case)
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) != (B, c.H, T, T):
        ctx.fail(
            f"weights has shape {tuple(weights.shape)}, expected (B, H, T, T) = {(B, c.H, T, T)}.",
            case=case,
            hint="return the weights self.self_attn returns, one map per head.",
            mistake="wrong_shape",
        )
    ctx.expect_array(weights, x.new_zeros(B, c.H, T, T), what="weights", case=case)
    if first:
        out2, _ = _layer_call(ctx, mod, x, mask, case)
        if not torch.equal(out, out2):
            ctx.fail(
                "two calls on the same input gave different outputs, in training mode with "
                "the default dropout=0.0.",
                case=case,
                mistake="encoder_dropout_hard_coded",
            )
    r = _ref_layer(c.D, c.H, c.Fd, bool(c.norm_first), _rounded(P, dtype))
    x64 = x.double()
    exp_out, exp_w = layer_model(r, x64, mask)
    tol = LAYER_TOL[dtype]
    # out first: every catalogued mistake changes it in its own way
    ctx.expect_close(
        out,
        exp_out,
        what="out",
        case=case,
        mistakes=_layer_mistakes(r, x64, mask, 0),
        hint="post-norm: x = norm1(x + attn(x)); x = norm2(x + ff(x)). Pre-norm: "
        "x = x + attn(norm1(x)); x = x + ff(norm2(x)).",
        **tol,
    )
    ctx.expect_close(
        weights,
        exp_w,
        what="weights",
        case=case,
        mistakes=_layer_mistakes(r, x64, mask, 1),
        hint="weights are what self.self_attn returns"
        + (" for norm1(x) (pre-norm)." if c.norm_first else " for x (post-norm)."),
        **tol,
    )


def _check_padding_invariance(cls, ctx: Context) -> None:
    """With a padding mask, the padded tokens' vectors must not change the real outputs."""
    rng = ctx.rng(67)
    D, H, Fd = 8, 2, 16
    real = np.array([[True] * 6, [True] * 4 + [False] * 2])
    for nf in (False, True):
        P = _random_values(_layer_shapes(D, Fd), ctx.rng(68 + nf))
        c = LayerCase(
            f"padding invariance, norm_first={nf}", D, H, Fd, nf, rng.normal(size=(2, 6, D))
        )
        x = torch.from_numpy(c.x)
        mask = torch.from_numpy(real[:, None, None, :])
        case = (
            _describe_case(c, torch.float64, x, mask)
            + ", then the same x with new values at the padded positions"
        )
        mod = _layer_build(cls, ctx, c, P, torch.float64, case)
        out, _ = _layer_call(ctx, mod, x, mask, case)
        x2 = x.clone()
        x2[1, 4:] = torch.from_numpy(10 * rng.normal(size=(2, D)))
        out2, _ = _layer_call(ctx, mod, x2, mask, case)
        ok = isinstance(out2, torch.Tensor) and tuple(out2.shape) == tuple(out.shape)
        keep = torch.from_numpy(real)
        if not ok or not torch.allclose(out2[keep], out[keep], **LAYER_TOL[torch.float64]):
            ctx.fail(
                "changing the padded tokens changed the outputs at real tokens: padding "
                "must be invisible to the real tokens.",
                case=case,
                mistake="encoder_mask_ignored",
            )


def _check_layer_dropout(cls, ctx: Context) -> None:
    """dropout=0.3: random in training mode, the reference in eval mode."""
    rng = ctx.rng(69)
    for nf in (False, True):
        c = LayerCase("dropout", 8, 2, 16, nf, rng.normal(size=(2, 5, 8)))
        P = _random_values(_layer_shapes(c.D, c.Fd), ctx.rng(70 + nf))
        x = torch.from_numpy(c.x)
        case = _describe_case(c, torch.float64, x, None, dropout=0.3)
        mod = _layer_build(cls, ctx, c, P, torch.float64, case, dropout=0.3)
        torch.manual_seed(ctx.seed)
        train_out, _ = _layer_call(ctx, mod, x, None, case + ", training mode")
        mod.eval()
        eval_out, _ = _layer_call(ctx, mod, x, None, case + ", eval mode")
        r = _ref_layer(c.D, c.H, c.Fd, nf, P)
        ctx.expect_close(
            eval_out,
            layer_model(r, x, None)[0],
            what="out in eval mode",
            case=case + ", eval mode",
            mistakes=_layer_mistakes(r, x, None, 0),
            hint="in eval mode dropout does nothing.",
            **LAYER_TOL[torch.float64],
        )
        expect_dropout_applied(
            ctx, train_out, eval_out, p=0.3, case=case, mistake="encoder_dropout_ignored"
        )
        mod.train()
        _, train_w = _layer_call(ctx, mod, x, None, case + ", training mode")
        mod.eval()
        _, eval_w = _layer_call(ctx, mod, x, None, case + ", eval mode")
        if same_in_both_modes(train_w, eval_w):
            ctx.fail(
                "with dropout=0.3 the attention weights in training mode are the eval-mode "
                "weights: the attention weights are not dropped. nn.TransformerEncoderLayer "
                "applies its dropout to the attention weights too.",
                case=case + ", training mode",
                mistake="attention_dropout_not_passed",
            )
