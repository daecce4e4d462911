"""Checks for notebook 05: ``sinusoidal_encoding`` and ``rope``.

Each is compared with one float64 model on a table of cases; the model's mistaken variants
name the mistakes. Properties: an odd ``d_model`` raises ``ValueError``; a RoPE score
depends on the positions only through ``m - n``.

Tolerances. A correct float32 implementation makes an error in the angle ``p * w_i`` that
grows with the position ``p`` (a relative error of a few 1e-7), so the absolute tolerance
grows with the largest position. For ``rope`` the sin/cos tables may be built in float32
whatever the dtype of ``x`` (the usual ``torch.arange(0, d, 2).float()``), so float64 inputs
get the same tolerance; the output's dtype must still be the input's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .. import positional as ref
from ._core import Context, Mistake, _as_np, exercise
from .mistakes import named
from .toolkit import dtype_name, expect_follows_device


def _angle_tol(max_position: float, scale: float = 1.0) -> dict:
    """Tolerance for values that are sin/cos of ``position * w`` computed in float32,
    times numbers of size ``scale``."""
    return dict(rtol=1e-4, atol=(2e-5 + 4e-7 * float(max_position)) * max(1.0, scale))


def _frequencies(d: int, base: float, variant: str) -> np.ndarray:
    """``w_i = base^(-2i/d)`` (d/2,), or as a mistaken ``variant`` computes them."""
    two_i = np.arange(0, d, 2, dtype=np.float64)
    exponent = {
        "half_exponent": -(two_i / 2) / d,
        "half_layout_t2t": -(two_i / 2) / max(d // 2 - 1, 1),  # tensor2tensor / fairseq
        "multiplied": two_i / d,
        "int_division": 0.0 * two_i,  # 2 * i // d: every w is 1
    }.get(variant, -two_i / d)
    w = base**exponent
    if variant == "llama3_scaling":  # Llama 3.1: factor 8, wavelengths 2048..8192 blended
        factor, low, high, old = 8.0, 1.0, 4.0, 8192.0
        wavelen = 2 * np.pi / w
        smooth = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)
        w = np.where(wavelen < old / high, w, (1 - smooth) * w / factor + smooth * w)
    return w


# ----------------------------------------------------------------------------- sinusoidal
def pe_model(n: int, d: int, variant: str = "correct", base: float = 10000.0) -> np.ndarray:
    """The sinusoidal table as correct or mistaken code computes it, in float64."""
    p = np.arange(n, dtype=np.float64) + (1.0 if variant == "from_one" else 0.0)
    ang = p[:, None] * _frequencies(d, base, variant)[None, :]  # (n, d/2)
    s, c = np.sin(ang), np.cos(ang)
    if variant == "swapped":
        s, c = c, s
    if variant in ("concat", "half_layout_t2t"):
        return np.concatenate([s, c], axis=1)
    out = np.empty((n, d))
    out[:, 0::2], out[:, 1::2] = s, c
    if variant == "column_exponent":  # column j uses base^(-j/d): odd columns use (2i+1)/d
        odd = np.arange(1, d, 2, dtype=np.float64)
        out[:, 1::2] = np.cos(p[:, None] * base ** (-odd / d)[None, :])
    return out


#: (id, the model's variant), tried in this order ("multiplied": see _multiplied_matches).
PE_MISTAKES = [
    ("pe_swapped", "swapped"),
    ("pe_half_exponent", "half_exponent"),
    ("pe_column_exponent", "column_exponent"),
    ("pe_from_one", "from_one"),
    ("pe_concat", "concat"),
    ("pe_half_layout_t2t", "half_layout_t2t"),
    ("pe_multiplied", "multiplied"),
    ("pe_int_division", "int_division"),
]
#: (n_positions, d_model) of the table; odd d_model must raise.
PE_SIZES = [(10, 16), (1, 4), (64, 2), (50, 6), (128, 32), (20, 64)]
PE_THOROUGH_SIZES = [(512, 128), (3, 10), (1000, 8), (7, 256)]
PE_ODD, PE_THOROUGH_ODD = [(4, 7)], [(3, 1), (2, 33)]


def _multiplied_matches(n: int, d: int, limit: float = 200.0):
    """pe_multiplied's angles grow huge (and so, in float32, chaotic): a predicate that the
    learner's table matches its model wherever the mistaken angle is below ``limit`` (float32
    still resolves it to ~1e-5), on entries that differ from the correct table."""
    model = pe_model(n, d, "multiplied")
    angles = np.arange(n)[:, None] * _frequencies(d, 10000.0, "multiplied")[None, :]
    resolved = np.repeat(np.abs(angles) <= limit, 2, axis=1)  # (n, d)

    def applies(got: np.ndarray, expected: np.ndarray) -> bool:
        ok = np.broadcast_to(resolved, got.shape)
        informative = ok & ~np.isclose(model, expected, atol=1e-3)
        return bool(informative.any()) and bool(
            np.allclose(got[ok], model[ok], rtol=1e-3, atol=1e-4)
        )

    return applies


def _is_half_layout(got: np.ndarray, expected: np.ndarray) -> bool:
    """Any [sin | cos] table: row 0 is (0, ..., 0, 1, ..., 1) and column j is the cosine
    partner of column j - d/2 (sin^2 + cos^2 = 1), whatever the frequencies."""
    if got.ndim != 2 or got.shape[1] < 4 or got.shape[0] < 2 or got.shape[1] % 2:
        return False
    h = got.shape[1] // 2
    return bool(
        np.allclose(got[0, :h], 0.0, atol=1e-4)
        and np.allclose(got[0, h:], 1.0, atol=1e-4)
        and np.allclose(got[:, :h] ** 2 + got[:, h:] ** 2, 1.0, atol=1e-3)
    )


def _pe_mistakes(n: int, d: int) -> list[Mistake]:
    """The models of PE_MISTAKES, then a [sin | cos] table with any other frequencies."""
    return [
        Mistake.of(i, applies=_multiplied_matches(n, d))
        if v == "multiplied"
        else Mistake.of(i, model=lambda v=v: pe_model(n, d, v))
        for i, v in PE_MISTAKES
    ] + [Mistake.of("pe_sin_cos_half", applies=_is_half_layout)]


def _raised(fn: Callable, *args):
    """Call ``fn(*args)``; return the exception it raised (None if it returned). Runs under
    ctx.call, so NotImplementedError and forbidden calls are still reported as such."""
    try:
        fn(*args)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - any exception is the learner's answer here
        return err
    return None


@exercise(
    "sinusoidal_encoding",
    forbidden=lambda: [
        (ref.sinusoidal_encoding, "the reference attention_ref.sinusoidal_encoding"),
        (ref.frequencies, "the reference attention_ref.positional.frequencies"),
        # its rotation by k positions turns row 0 of the table into row k
        (ref.offset_rotation, "attention_ref.offset_rotation, whose angles are the table's"),
    ],
    summary="the fixed sinusoidal positional encoding table",
)
def check_sinusoidal_encoding(candidate, ctx: Context) -> None:
    for n, d in PE_SIZES + (PE_THOROUGH_SIZES if ctx.thorough else []):
        case = f"n_positions={n}, d_model={d}"
        got = ctx.call(candidate, n, d, case=case)
        if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
            ctx.fail(
                f"the encoding has dtype {got.dtype}, expected torch.float32.",
                case=case,
                mistake="wrong_dtype",
                hint="build it in float32 (torch.arange(...).float(), or "
                "dtype=torch.float32), or end with .float(); a float64 table added to "
                "float32 embeddings would turn the whole model into float64.",
            )
        ctx.expect_array(
            got,
            torch.zeros(n, d, dtype=torch.float32),
            what="the encoding",
            case=case,
            check_dtype=False,
            swapped=torch.zeros(d, n) if n != d else None,
            swapped_msg="the table is transposed: rows must be positions and "
            "columns features, (n_positions, d_model).",
        )
        ctx.expect_close(
            got,
            pe_model(n, d),
            what="the encoding",
            case=case,
            mistakes=_pe_mistakes(n, d),
            **_angle_tol(n - 1),
        )
    for n, d in PE_ODD + (PE_THOROUGH_ODD if ctx.thorough else []):
        case = f"n_positions={n}, d_model={d} (odd)"
        err = ctx.call(_raised, candidate, n, d, case=case)
        if err is None:
            ctx.fail(
                "an odd d_model must raise ValueError (the features come in (sin, cos) "
                "pairs), but your function returned.",
                case=case,
                mistake=named(
                    "no_value_error",
                    condition="d_model % 2",
                    message="d_model must be even; got d_model={d_model}",
                ),
            )
        if not isinstance(err, ValueError):
            ctx.fail(
                f"an odd d_model must raise ValueError; your code raised "
                f"{type(err).__name__}: {err}",
                case=case,
                hint="check d_model % 2 at the start and raise ValueError yourself.",
            )
        if "d_model" not in str(err):
            ctx.fail(
                f"the ValueError for an odd d_model must name d_model; its message "
                f"was {str(err)!r}.",
                case=case,
                mistake="value_error_vague",
            )


# ----------------------------------------------------------------------------- rope
def rope_model(x, positions=None, base: float = 10000.0, variant: str = "correct"):
    """RoPE as correct or mistaken code computes it, in float64 NumPy."""
    x = _as_np(x)
    T, d = x.shape[-2], x.shape[-1]
    if positions is None or variant == "ignores_positions":
        pos = np.arange(1, T + 1) if variant == "from_one" and positions is None else np.arange(T)
    else:
        pos = _as_np(positions)
    if variant == "fixed_base":
        base = 10000.0
    theta = np.asarray(pos, dtype=np.float64)[..., None] * _frequencies(d, base, variant)
    c, s = np.cos(theta), np.sin(theta)  # (..., T, d/2)
    if variant == "swapped":
        c, s = s, c
    if variant == "reversed":
        s = -s
    if variant == "added":
        pe = np.empty(theta.shape[:-1] + (d,))
        pe[..., 0::2], pe[..., 1::2] = np.sin(theta), np.cos(theta)
        return x + pe
    if variant == "rotate_half":
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    xe, xo = x[..., 0::2], x[..., 1::2]
    oe = xe * c - xo * s
    oo = (oe if variant == "overwritten" else xe) * s + xo * c
    if variant == "concat":
        return np.concatenate([oe, oo], axis=-1)
    out = np.empty(np.broadcast_shapes(x.shape, oe.shape[:-1] + (d,)))
    out[..., 0::2], out[..., 1::2] = oe, oo
    return out


#: (id, the model's variant), tried in this order.
ROPE_MISTAKES = [
    ("rope_reversed", "reversed"),
    ("rope_swapped", "swapped"),
    ("rope_rotate_half", "rotate_half"),
    ("rope_concat", "concat"),
    ("rope_overwritten", "overwritten"),
    ("rope_half_exponent", "half_exponent"),
    ("rope_half_layout_t2t", "half_layout_t2t"),
    ("rope_multiplied", "multiplied"),
    ("rope_ignores_positions", "ignores_positions"),
    ("rope_from_one", "from_one"),
    ("rope_added", "added"),
    ("rope_fixed_base", "fixed_base"),
    ("rope_llama3_scaling", "llama3_scaling"),
]
#: label, the shape of x, the positions (None: the default 0, 1, ...; "shuffled": a
#: permutation of 0..T-1), base. The first case settles the type, shape and dtype before
#: the property.
ROPE_CASES = [
    ("x (T=6, d=8), default positions", (6, 8), None, 10000.0),
    ("x (B=2, T=5, d=4), default positions", (2, 5, 4), None, 10000.0),
    ("x (B=2, H=3, T=4, d=16) (heads), default positions", (2, 3, 4, 16), None, 10000.0),
    ("one token (T=1, d=6), default positions", (1, 6), None, 10000.0),
    ("x (T=3, d=2), positions given", (3, 2), (4, 9, 2), 10000.0),
    ("x (T=5, d=8), positions 10..14 (as with a KV cache)", (5, 8), (*range(10, 15),), 10000.0),
    ("x (B=2, T=6, d=8), shuffled positions", (2, 6, 8), "shuffled", 10000.0),
    ("x (T=4, d=8), base=100", (4, 8), None, 100.0),
]
ROPE_THOROUGH_CASES = [
    ("x (T=64, d=64), default positions", (64, 64), None, 10000.0),
    ("x (B=3, T=7, d=10), positions 1000..1006", (3, 7, 10), (*range(1000, 1007),), 10000.0),
    ("x (T=5, d=12), base=500, positions given", (5, 12), (0, 3, 3, 8, 1), 500.0),
]


def _rope_mistakes(x, positions, base) -> list[Mistake]:
    return [
        Mistake.of(mistake_id, model=lambda v=v: rope_model(x, positions, base, v))
        for mistake_id, v in ROPE_MISTAKES
    ] + [Mistake.of("rope_partial", applies=_partial_matches(x, positions, base))]


def _partial_matches(x, positions, base):
    """Partial rotary (GPT-NeoX's rotary_pct): the first k features are rotated as rope (or
    rotate_half) of a k-dimensional vector, the last d - k are returned unchanged."""
    xn = _as_np(x)
    d = xn.shape[-1]

    def applies(got: np.ndarray, expected: np.ndarray) -> bool:
        if got.shape != xn.shape:
            return False
        close = dict(rtol=1e-3, atol=1e-4)
        for k in range(2, d, 2):
            if not np.allclose(got[..., k:], xn[..., k:], **close):
                continue
            for variant in ("correct", "rotate_half"):
                head = rope_model(xn[..., :k], positions, base, variant)
                if np.allclose(got[..., :k], head, **close):
                    return True
        return False

    return applies


def _call_rope(candidate, ctx: Context, x, positions, base, case):
    kwargs = {} if positions is None else {"positions": positions}
    if base != 10000.0:
        kwargs["base"] = base
    got = ctx.call(candidate, x, case=case, **kwargs)
    ctx.expect_array(got, torch.zeros_like(x), what="the output", case=case)
    return got


def _check_relative(candidate, ctx: Context) -> None:
    """rope(q)[m] . rope(k)[n] must not change when m and n are shifted together."""
    rng, g = ctx.rng(51), ctx.torch_gen(51)
    d, n_pairs = 16 if ctx.thorough else 8, 12
    q, k = (torch.randn(d, generator=g, dtype=torch.float64) for _ in "qk")
    Q, K = q.expand(n_pairs, d).clone(), k.expand(n_pairs, d).clone()  # (n_pairs, d)
    m, n = (torch.from_numpy(rng.integers(0, 20, size=n_pairs)) for _ in "mn")
    case = (
        f"q and k {tuple(Q.shape)} float64 (the same q and k in every row), "
        f"query positions {m.tolist()}, key positions {n.tolist()}"
    )

    def scores(shift: int, case: str) -> tuple[torch.Tensor, torch.Tensor]:
        """rope(q) at positions m + shift, and its scores with rope(k) at n + shift."""
        rq, rk = (
            _call_rope(candidate, ctx, x, p + shift, 10000.0, case) for x, p in ((Q, m), (K, n))
        )
        return rq, (rq.detach().double() * rk.detach().double()).sum(-1)  # (n_pairs,)

    for s in [7, 250] + ([1000] if ctx.thorough else []):
        rq, before = scores(0, case)
        _, after = scores(s, case + f", then both + {s}")
        tol = _angle_tol(max(int(m.max()), int(n.max())) + s, float(q.norm() * k.norm()))
        bad = ~np.isclose(after.numpy(), before.numpy(), **tol)
        if bad.any():
            j = int(np.argwhere(bad)[0][0])
            likely, hint = ctx.diagnose(rq, None, _rope_mistakes(Q, m, 10000.0), (), {})
            ctx.fail(
                f"the score rope(q)[m] . rope(k)[n] changed when both positions were shifted "
                f"by {s}: m={int(m[j])}, n={int(n[j])} gave {float(before[j]):.6g} but "
                f"m={int(m[j]) + s}, n={int(n[j]) + s} gave {float(after[j]):.6g}. With RoPE "
                "a score may depend on the positions only through the relative offset m - n.",
                case=case,
                likely=likely or named("rope_not_rotated"),
                hint=hint or named("rope_not_rotated").hint,
            )


@exercise(
    "rope",
    forbidden=lambda: [(ref.rope, "the reference attention_ref.rope")],
    summary="rotary position embedding",
)
def check_rope(candidate, ctx: Context) -> None:
    g, rng = ctx.torch_gen(50), ctx.rng(50)
    cases = []
    for label, shape, pos, base in ROPE_CASES + (ROPE_THOROUGH_CASES if ctx.thorough else []):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        if pos is not None:
            n = shape[-2]
            pos = torch.from_numpy(rng.permutation(n)) if pos == "shuffled" else torch.tensor(pos)
        cases.append((label, x, pos, base))
    label, x, pos, base = cases[0]
    _call_rope(candidate, ctx, x.float(), pos, base, f"{label}; float32")
    _check_relative(candidate, ctx)
    for label, x, pos, base in cases:
        max_pos = (x.shape[-2] - 1) if pos is None else int(pos.max())
        for dtype in (torch.float32, torch.float64):
            xd = x.to(dtype)
            case = f"{label}; {dtype_name(dtype)}"
            if pos is not None:
                case += f"; positions={pos.tolist()}"
            ctx.expect_close(
                _call_rope(candidate, ctx, xd, pos, base, case),
                rope_model(xd, pos, base),
                what="the output",
                case=case,
                mistakes=_rope_mistakes(xd, pos, base),
                **_angle_tol(max_pos, float(x.abs().max())),
            )
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        (torch.empty(2, 5, 8, device=meta),),
        ("the output",),
        "wrong_device",
        "x (B=2, T=5, d=8), default positions",
    )
