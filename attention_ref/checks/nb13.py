"""Checks for notebook 13 (the modern decoder): the modules ``rms_norm``, ``swiglu`` and
``rotary_attention``.

Each module is built from the learner's class, given seeded random weights by parameter
name (the toolkit's :func:`~attention_ref.checks.toolkit.load_reference_weights` and
:func:`~attention_ref.checks.toolkit.load_linear_weights`) and compared, in float64 and
float32, with float64 models of the right computation and of realistic mistakes (epsilon
outside the square root, SiLU on the wrong branch, rotary positions on the values or in the
wrong layout, key/value heads repeated in the wrong order, ...). The modules need no part
of an earlier exercise: the learner writes each whole, using the course's ``rope``,
``sdpa``, ``split_heads`` and ``merge_heads`` where they like.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import gpt
from .. import modern as ref
from ..attention import sdpa
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from ..positional import frequencies, rope
from ._core import Context, Mistake, exercise
from .mistakes import named
from .nb01 import BUILTIN_ATTENTION
from .toolkit import (
    TOL,
    build_module,
    dtype_name,
    earlier_position_changed,
    expect_follows_device,
    load_linear_weights,
    load_reference_weights,
)

DTYPES = (torch.float64, torch.float32)


def _outputs_tuple(ctx: Context, got, like_out, like_w, case: str):
    out, w = ctx.expect_tuple(got, ("out", "weights"), case=case)
    ctx.expect_array(out, like_out, what="the output", case=case)
    ctx.expect_array(w, like_w, what="the attention weights", case=case)
    return out, w


# ----------------------------------------------------------------------------- rms_norm
RMS_SPEC = {"weight": "nn.Parameter(torch.ones(d_model))"}


def rms_model(x: torch.Tensor, w: torch.Tensor, eps: float, mode: str = "correct"):
    """What a (possibly mistaken) RMSNorm computes, in float64."""
    x, w = x.double(), w.double()
    if mode.startswith("eps_outside"):  # at the given eps, or at another default's
        eps = {"eps_outside_1e-5": 1e-5, "eps_outside_1e-8": 1e-8}.get(mode, eps)
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w
    if mode == "sum":
        return x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w
    if mode == "centred":
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w
    if mode == "std":
        return x / (x.std(-1, keepdim=True) + eps) * w
    if mode == "all_axes":
        return x / (x.pow(2).mean() + eps).sqrt() * w
    if mode == "no_weight":
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if mode == "mean_not_squared":  # NaN wherever the mean of x is below -eps
        return x / (x.mean(-1, keepdim=True) + eps).sqrt() * w
    fixed = {"no_eps": 0.0, "eps_ignored": 1e-6, "default_eps_1e-5": 1e-5, "default_eps_1e-8": 1e-8}
    eps = fixed.get(mode, eps)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w


RMS_MISTAKES = [
    ("rms_eps_outside_root", "eps_outside"),
    ("rms_sum_not_mean", "sum"),
    ("rms_centred", "centred"),
    ("rms_std", "std"),
    ("rms_mean_all_axes", "all_axes"),
    ("rms_no_weight", "no_weight"),
    ("rms_mean_not_squared", "mean_not_squared"),
    # structure before precision: no epsilon at all, or one outside the root whatever its
    # value, is named before a default epsilon that is merely wrong
    ("rms_eps_missing", "no_eps"),
    ("rms_eps_outside_root", "eps_outside_1e-5"),
    ("rms_eps_outside_root", "eps_outside_1e-8"),
]


def _rms_cases(ctx: Context) -> list[tuple]:
    # label, x shape, eps (None: the default, 1e-6), scale of x
    cases = [
        ("x (2, 5, 16)", (2, 5, 16), None, 1.0),
        ("two dims: x (3, 8), eps=0.1", (3, 8), 0.1, 1.0),
        ("one token: x (1, 1, 4)", (1, 1, 4), None, 1.0),
        ("extra batch dims: x (2, 3, 4, 12), eps=0.01", (2, 3, 4, 12), 0.01, 1.0),
        ("small inputs (|x| about 1e-3, where eps matters): x (2, 4, 8)", (2, 4, 8), None, 1e-3),
    ]
    if ctx.thorough:
        cases += [("x (4, 9, 32), eps=1e-5", (4, 9, 32), 1e-5, 3.0)]
    return cases


@exercise(
    "rms_norm",
    kind="module",
    forbidden=lambda: [
        (ref.RMSNorm.forward, "the reference attention_ref.RMSNorm"),
        (nn.RMSNorm.forward, "torch.nn.RMSNorm"),
        (nn.functional.rms_norm, "torch.nn.functional.rms_norm"),
        (torch.rms_norm, "torch.rms_norm"),
    ],
    summary="root-mean-square normalisation with a learned scale",
)
def check_rms_norm(cls, ctx: Context) -> None:
    g = ctx.torch_gen(1301)
    for label, shape, eps, scale in _rms_cases(ctx):
        D = shape[-1]
        x64 = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        w64 = 1.0 + 0.3 * torch.randn(D, generator=g, dtype=torch.float64)
        used_eps = 1e-6 if eps is None else eps
        for dtype in DTYPES:
            args, kwargs = (D,), ({} if eps is None else {"eps": eps})
            case = (
                f"RMSNorm({D}{'' if eps is None else f', eps={eps:g}'}) {dtype_name(dtype)}; "
                f"{label}"
            )
            mod = build_module(ctx, cls, args, kwargs, case)
            _expect_ones(ctx, mod, D, case)
            reference = ref.RMSNorm(D).double()
            with torch.no_grad():
                reference.weight.copy_(w64)
            mod.to(dtype).eval()
            load_reference_weights(ctx, mod, reference, RMS_SPEC, case)
            x = x64.to(dtype)
            with torch.no_grad():
                got = ctx.call(mod, x, case=case)
            expected = rms_model(x, w64, used_eps)
            _nan_from_mean_not_squared(
                ctx, got, rms_model(x, w64, used_eps, "mean_not_squared"), case
            )
            ctx.expect_array(got, expected.to(dtype), what="the output", case=case)
            modes = list(RMS_MISTAKES)
            if eps is None:
                modes += [
                    ("rms_default_eps", "default_eps_1e-5"),
                    ("rms_default_eps", "default_eps_1e-8"),
                ]
            else:
                modes += [("rms_eps_ignored", "eps_ignored")]
            mistakes = [
                Mistake.of(mid, model=lambda mode=mode: rms_model(x, w64, used_eps, mode))
                for mid, mode in modes
            ]
            ctx.expect_close(
                got, expected, what="the output", case=case, mistakes=mistakes, **TOL[dtype]
            )


def _expect_ones(ctx: Context, mod, D: int, case: str) -> None:
    """The spec's initial scale: ``weight`` all ones (a model built from the learner's class
    and not loaded from a checkpoint starts as the identity map up to the normalisation)."""
    try:
        w = getattr(mod, "weight", None)
        ones = bool((w.detach() == 1).all()) if tuple(w.shape) == (D,) else True
    except Exception:  # no weight, a lazy one, not a tensor: judged when weights are loaded
        return
    if not ones:
        ctx.fail(
            f"a new RMSNorm({D}) has weight {w.detach().flatten()[:4].tolist()}..., "
            "expected all ones.",
            case=case,
            mistake="rms_weight_init",
        )


def _nan_from_mean_not_squared(ctx: Context, got, wrong: torch.Tensor, case: str) -> None:
    """NaN exactly where the square root of mean(x) + eps is the square root of a negative
    number: the mean of x was taken, not the mean of its squares."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(wrong.shape):
        return
    nan = torch.isnan(got.detach().cpu())
    if bool(nan.any()) and torch.equal(nan, torch.isnan(wrong)):
        ctx.fail("the output contains NaN.", case=case, mistake="rms_mean_not_squared")


# ----------------------------------------------------------------------------- swiglu
def swiglu_model(P: dict, x: torch.Tensor, mode: str = "correct") -> torch.Tensor:
    """What a (possibly mistaken) SwiGLU computes, in float64, with the weights ``P``."""
    x = x.double()
    gate, up = x @ P["w_gate"].T, x @ P["w_up"].T  # (..., d_ff)
    act = {
        "silu_on_up": lambda: gate * nn.functional.silu(up),
        "after_product": lambda: nn.functional.silu(gate * up),
        "sigmoid": lambda: torch.sigmoid(gate) * up,
        "gelu": lambda: nn.functional.gelu(gate) * up,
        "gelu_tanh": lambda: nn.functional.gelu(gate, approximate="tanh") * up,
        "up_unused": lambda: nn.functional.silu(gate),
        "relu": lambda: torch.relu(gate) * up,
        "no_activation": lambda: gate * up,
    }.get(mode, lambda: nn.functional.silu(gate) * up)()
    return act @ P["w_down"].T  # (..., d_model)


SWIGLU_MISTAKES = [
    ("swiglu_silu_on_up", "silu_on_up"),
    ("swiglu_silu_after_product", "after_product"),
    ("swiglu_sigmoid_gate", "sigmoid"),
    ("swiglu_gelu", "gelu"),
    ("swiglu_gelu_tanh", "gelu_tanh"),
    ("swiglu_up_unused", "up_unused"),
    ("swiglu_relu_gate", "relu"),
    ("swiglu_no_activation", "no_activation"),
]


def _swiglu_cases(ctx: Context) -> list[tuple]:
    # label, d_model, d_ff (None: the default), x shape
    cases = [
        ("d_model=12, d_ff=20; x (2, 5, 12)", 12, 20, (2, 5, 12)),
        ("the default d_ff = 8 * 12 // 3 = 32; x (3, 12)", 12, None, (3, 12)),
        ("one token; d_model=8, d_ff=8; x (1, 1, 8)", 8, 8, (1, 1, 8)),
        (
            "extra batch dims; d_model=6, the default d_ff = 16; x (2, 2, 3, 6)",
            6,
            None,
            (2, 2, 3, 6),
        ),
    ]
    if ctx.thorough:
        cases += [("d_model=32, d_ff=48; x (2, 9, 32)", 32, 48, (2, 9, 32))]
    return cases


@exercise(
    "swiglu",
    kind="module",
    forbidden=lambda: [(ref.SwiGLU.forward, "the reference attention_ref.SwiGLU")],
    summary="the gated feed-forward network w_down(silu(w_gate(x)) * w_up(x))",
)
def check_swiglu(cls, ctx: Context) -> None:
    g = ctx.torch_gen(1302)
    for label, D, F, shape in _swiglu_cases(ctx):
        hidden = ref.swiglu_hidden(D) if F is None else F
        P = {
            "w_gate": torch.randn(hidden, D, generator=g, dtype=torch.float64) / math.sqrt(D),
            "w_up": torch.randn(hidden, D, generator=g, dtype=torch.float64) / math.sqrt(D),
            "w_down": torch.randn(D, hidden, generator=g, dtype=torch.float64) / math.sqrt(hidden),
        }
        x64 = torch.randn(shape, generator=g, dtype=torch.float64)
        for dtype in DTYPES:
            args = (D,) if F is None else (D, F)
            case = f"SwiGLU({', '.join(map(str, args))}) {dtype_name(dtype)}; {label}"
            mod = build_module(ctx, cls, args, {}, case, sample=(torch.zeros(1, D, dtype=dtype),))
            spec_ff = "d_ff" if F is not None else "8 * d_model // 3"
            gate_spec = f"nn.Linear(d_model={D}, {spec_ff}={hidden}, bias=False)"
            down_spec = f"nn.Linear({spec_ff}={hidden}, d_model={D}, bias=False)"
            layers = {
                "w_gate": (P["w_gate"], None, gate_spec),
                "w_up": (P["w_up"], None, gate_spec),
                "w_down": (P["w_down"], None, down_spec),
            }
            likely = {}
            if F is None:
                wrong = named("swiglu_default_hidden")
                likely = {"shape w_gate": wrong, "shape w_up": wrong, "shape w_down": wrong}
            mod.to(dtype).eval()
            load_linear_weights(ctx, mod, layers, case, raw_ok=False, likely=likely)
            x = x64.to(dtype)
            with torch.no_grad():
                got = ctx.call(mod, x, case=case)
            expected = swiglu_model(P, x)
            ctx.expect_array(got, expected.to(dtype), what="the output", case=case)
            mistakes = [
                Mistake.of(mid, model=lambda mode=mode: swiglu_model(P, x, mode))
                for mid, mode in SWIGLU_MISTAKES
            ]
            ctx.expect_close(
                got, expected, what="the output", case=case, mistakes=mistakes, **TOL[dtype]
            )


# ----------------------------------------------------------------------------- rotary_attention
def _rotate_half_rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary positions in the halves layout: feature ``i`` with ``i + d/2``."""
    T, d = x.shape[-2], x.shape[-1]
    angles = torch.arange(T, dtype=x.dtype)[:, None] * frequencies(d, base, dtype=x.dtype)
    cos, sin = angles.cos(), angles.sin()  # (T, d/2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rotary_model(P: dict, x: torch.Tensor, H: int, G: int, base: float, mode: str = "correct"):
    """What (possibly mistaken) rotary grouped-query self-attention computes, in float64:
    ``(out (B, T, D), weights (B, H, T, T))``."""
    x = x.double()
    B, T, D = x.shape
    dh = D // H
    q_flat, k_flat, v_flat = (x @ P[n].T for n in ("w_q", "w_k", "w_v"))  # (B, T, .)
    if mode == "before_split":
        q_flat, k_flat = rope(q_flat, base=base), rope(k_flat, base=base)
    if mode == "heads_as_positions":
        q = rope(q_flat.view(B, T, H, dh), base=base).transpose(1, 2)  # (B, H, T, dh)
        k = rope(k_flat.view(B, T, G, dh), base=base).transpose(1, 2)  # (B, G, T, dh)
    elif mode == "split_view":  # (B, T, n * dh) viewed as (B, n, T, dh): tokens mixed
        q, k = q_flat.reshape(B, H, T, dh), k_flat.reshape(B, G, T, dh)
    else:
        q, k = split_heads(q_flat, H), split_heads(k_flat, G)  # (B, H, T, dh), (B, G, T, dh)
    v = v_flat.reshape(B, G, T, dh) if mode == "split_view" else split_heads(v_flat, G)
    b = 10000.0 if mode == "base_ignored" else base
    if mode == "half_exponent":  # base^(-i/d) = sqrt(base)^(-2i/d)
        b = math.sqrt(base)
    positions = -torch.arange(T) if mode == "reversed" else None  # sin's sign flipped
    if mode == "rotate_half":
        q, k = _rotate_half_rope(q, b), _rotate_half_rope(k, b)
    elif mode not in ("no_rope", "before_split", "heads_as_positions", "queries_only"):
        q, k = rope(q, positions, base=b), rope(k, positions, base=b)
        if mode == "values":
            v = rope(v, base=b)
    elif mode == "queries_only":
        q = rope(q, base=b)
    group = H // G
    if mode == "repeat":
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)  # (B, H, T, dh)
    else:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if mode == "no_scale":
        q = q * math.sqrt(dh)
    if mode == "scale_d_model":  # divided by sqrt(D) instead of sqrt(dh)
        q = q * math.sqrt(dh / D)
    mask = None if mode == "no_mask" else torch.ones(T, T, dtype=torch.bool).tril()
    out, w = sdpa(q, k, v, mask)  # (B, H, T, dh), (B, H, T, T)
    merged = out.reshape(B, T, D) if mode == "merge_view" else merge_heads(out)  # (B, T, D)
    return merged @ P["w_o"].T, w


ROTARY_MISTAKES = [
    ("rope_not_applied", "no_rope"),
    ("rope_on_values", "values"),
    ("rope_queries_only", "queries_only"),
    ("rope_before_split", "before_split"),
    ("rope_heads_as_positions", "heads_as_positions"),
    ("rotary_rotate_half", "rotate_half"),
    ("rope_base_ignored", "base_ignored"),
    ("gqa_repeat", "repeat"),
    ("rotary_no_causal_mask", "no_mask"),
    ("gqa_no_scale", "no_scale"),
    ("scale_by_d_model", "scale_d_model"),
    ("rope_reversed", "reversed"),
    ("rope_half_exponent", "half_exponent"),
    ("split_view_without_transpose", "split_view"),
    ("merge_without_transpose", "merge_view"),
]

ROTARY_LAYOUT = (
    "w_q = nn.Linear(d_model, d_model, bias=False), w_k and w_v = nn.Linear(d_model, "
    "n_kv_heads * d_head, bias=False), w_o = nn.Linear(d_model, d_model, bias=False)"
)


def _rotary_cases(ctx: Context) -> list[tuple]:
    # label, d_model, n_heads, n_kv_heads, batch, T, base (None: the default 10000)
    cases = [
        ("2 groups of 2 query heads", 16, 4, 2, 2, 7, None),
        ("multi-query (n_kv_heads=1)", 12, 3, 1, 2, 5, None),
        ("n_kv_heads = n_heads, base=100", 16, 2, 2, 1, 6, 100.0),
        ("3 groups of 2, base=50", 24, 6, 3, 2, 9, 50.0),
        ("one token, 2 query heads sharing 1 kv head", 8, 2, 1, 3, 1, None),
    ]
    if ctx.thorough:
        cases += [("4 groups of 2, T=11, base=500", 32, 8, 4, 2, 11, 500.0)]
    return cases


def _rotary_weights(D: int, H: int, G: int, g: torch.Generator) -> dict:
    dh = D // H
    return {
        "w_q": 1.2 * torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D),
        "w_k": 1.2 * torch.randn(G * dh, D, generator=g, dtype=torch.float64) / math.sqrt(D),
        "w_v": torch.randn(G * dh, D, generator=g, dtype=torch.float64) / math.sqrt(D),
        "w_o": torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D),
    }


def _load_rotary(ctx: Context, mod, P: dict, D: int, H: int, G: int, case: str) -> None:
    dh = D // H
    kv = f"nn.Linear(d_model={D}, n_kv_heads * d_head={G * dh}, bias=False)"
    layers = {
        "w_q": (P["w_q"], None, f"nn.Linear(d_model={D}, d_model={D}, bias=False)"),
        "w_k": (P["w_k"], None, kv),
        "w_v": (P["w_v"], None, kv),
        "w_o": (P["w_o"], None, f"nn.Linear(d_model={D}, d_model={D}, bias=False)"),
    }
    full = named("gqa_full_projections")
    load_linear_weights(
        ctx, mod, layers, case, raw_ok=False, likely={"shape w_k": full, "shape w_v": full}
    )


@exercise(
    "rotary_attention",
    kind="module",
    forbidden=lambda: [
        (ref.RotaryAttention.forward, "the reference attention_ref.RotaryAttention"),
        (ref.RotaryAttention.attend, "the reference RotaryAttention.attend"),
        (ref.RotaryAttention.project, "the reference RotaryAttention.project"),
        (gpt.GroupedQueryAttention.forward, "the reference attention_ref.GroupedQueryAttention"),
        (gpt.GroupedQueryAttention.attend, "the reference GroupedQueryAttention.attend"),
        (MultiHeadAttention.forward, "attention_ref.MultiHeadAttention"),
        *BUILTIN_ATTENTION,
    ],
    summary="causal self-attention with rotary positions and grouped-query heads",
)
def check_rotary_attention(cls, ctx: Context) -> None:
    g = ctx.torch_gen(1303)
    for label, D, H, G, B, T, base in _rotary_cases(ctx):
        P = _rotary_weights(D, H, G, g)
        x64 = torch.randn(B, T, D, generator=g, dtype=torch.float64)
        b = 10000.0 if base is None else base
        for dtype in DTYPES:
            kwargs = {} if base is None else {"base": base}
            case = (
                f"{label}: RotaryAttention(d_model={D}, n_heads={H}, n_kv_heads={G}"
                f"{'' if base is None else f', base={base:g}'}) {dtype_name(dtype)}; "
                f"x ({B}, {T}, {D})"
            )
            x = x64.to(dtype)
            mod = build_module(ctx, cls, (D, H, G), kwargs, case, sample=(x,))
            mod.to(dtype).eval()
            _load_rotary(ctx, mod, P, D, H, G, case)
            with torch.no_grad():
                got = ctx.call(mod, x, case=case)
            exp_out, exp_w = rotary_model(P, x, H, G, b)
            out, w = _outputs_tuple(ctx, got, exp_out.to(dtype), exp_w.to(dtype), case)
            modes = [(m, mode) for m, mode in ROTARY_MISTAKES if base or mode != "base_ignored"]
            for what, value, expected, idx in (
                ("the attention weights", w, exp_w, 1),
                ("the output", out, exp_out, 0),
            ):
                mistakes = [
                    Mistake.of(
                        mid, model=lambda mode=mode, idx=idx: rotary_model(P, x, H, G, b, mode)[idx]
                    )
                    for mid, mode in modes
                ]
                ctx.expect_close(
                    value, expected, what=what, case=case, mistakes=mistakes, **TOL[dtype]
                )
    _check_rotary_causal(cls, ctx, g)
    _check_rotary_device(cls, ctx, g)


def _check_rotary_device(cls, ctx: Context, g) -> None:
    """The module on PyTorch's meta device (a stand-in for a GPU): what forward builds (the
    positions, the mask) must follow x."""
    D, H, G, T = 8, 2, 1, 5
    case = f"RotaryAttention({D}, {H}, {G}) and x (2, {T}, {D}) on PyTorch's meta device"
    x = torch.randn(2, T, D, generator=g)
    mod = build_module(ctx, cls, (D, H, G), {}, case, sample=(x,))
    mod.to(torch.device("meta")).eval()
    with torch.no_grad():
        expect_follows_device(
            ctx, mod, (torch.empty(2, T, D, device="meta"),), ("out", "weights"),
            "wrong_device", f"RotaryAttention({D}, {H}, {G}), x (2, {T}, {D})",
        )  # fmt: skip


def _check_rotary_causal(cls, ctx: Context, g) -> None:
    D, H, G, T = 8, 2, 1, 6
    case = f"RotaryAttention({D}, {H}, {G}), x (1, {T}, {D}) float64: the last token changed"
    x = torch.randn(1, T, D, generator=g, dtype=torch.float64)
    mod = build_module(ctx, cls, (D, H, G), {}, case, sample=(x,))
    mod.double().eval()
    _load_rotary(ctx, mod, _rotary_weights(D, H, G, g), D, H, G, case)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        a = ctx.expect_tuple(ctx.call(mod, x, case=case), ("out", "weights"), case=case)[0]
        b = ctx.expect_tuple(ctx.call(mod, x2, case=case), ("out", "weights"), case=case)[0]
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != x.shape:
        return  # the value checks above already judged the output's type and shape
    i = earlier_position_changed(a, b, atol=1e-9)
    if i is not None:
        ctx.fail(
            f"future tokens change earlier outputs: changing token {T - 1} changed the "
            f"output at position {i}.",
            case=case,
            mistake="rotary_no_causal_mask",
        )
