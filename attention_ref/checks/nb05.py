"""Checks for notebook 05: ``sinusoidal_encoding`` and ``rope``.

Tolerances. The reference is computed in float64. A correct float32 implementation makes
an error in the angle ``p * w_i`` that grows with the position ``p`` (a relative error of a
few 1e-7 in ``p * w_i``), so the absolute tolerance grows with the largest position. For
``rope`` the sin/cos tables may be built in float32 whatever the dtype of ``x`` (the usual
``torch.arange(0, d, 2).float()``), so float64 inputs get the same tolerance; the output's
dtype must still be the input's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .. import positional as ref
from ._core import Context, Mistake, _as_np, exercise
from .mistakes import named
from .toolkit import dtype_name


def _forbid_sinusoidal():
    return [
        (ref.sinusoidal_encoding, "the reference attention_ref.sinusoidal_encoding"),
        (ref.frequencies, "the reference attention_ref.positional.frequencies"),
    ]


def _forbid_rope():
    return [(ref.rope, "the reference attention_ref.rope")]


def _angle_tol(max_position: float, scale: float = 1.0) -> dict:
    """Tolerance for values that are sin/cos of ``position * w`` computed in float32,
    times numbers of size ``scale``."""
    return dict(rtol=1e-4, atol=(2e-5 + 4e-7 * float(max_position)) * max(1.0, scale))


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


# ----------------------------------------------------------------------------- sinusoidal
def pe_model(n: int, d: int, variant: str = "correct", base: float = 10000.0) -> np.ndarray:
    """The sinusoidal table as correct or mistaken code computes it, in float64."""
    p = (
        np.arange(1, n + 1, dtype=np.float64)
        if variant == "from_one"
        else np.arange(n, dtype=np.float64)
    )
    two_i = np.arange(0, d, 2, dtype=np.float64)  # (d/2,)
    if variant == "half_exponent":
        w = base ** (-(two_i / 2) / d)
    elif variant == "half_layout_t2t":  # tensor2tensor / fairseq: 10000^(-i / (d/2 - 1))
        w = base ** (-(two_i / 2) / max(d // 2 - 1, 1))
    elif variant == "multiplied":
        w = base ** (two_i / d)
    elif variant == "int_division":
        w = np.ones_like(two_i)
    else:
        w = base ** (-two_i / d)
    ang = p[:, None] * w[None, :]  # (n, d/2)
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


def _matches_where_resolvable(model: np.ndarray, angles: np.ndarray, limit: float = 200.0):
    """A predicate for mistakes whose angles grow huge (and so, in float32, chaotic): the
    learner's table must match ``model`` wherever the mistaken angle is below ``limit``
    (float32 still resolves it to ~1e-5), on entries that differ from the correct table."""

    def applies(got: np.ndarray, expected: np.ndarray) -> bool:
        ok = np.broadcast_to(np.abs(angles) <= limit, got.shape)
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
    out = []
    for mistake_id, v in PE_MISTAKES:
        if v == "multiplied":
            w = 10000.0 ** (np.arange(0, d, 2) / d)
            ang = np.repeat(np.arange(n)[:, None] * w[None, :], 2, axis=1)  # (n, d)
            out.append(
                Mistake.of(mistake_id, applies=_matches_where_resolvable(pe_model(n, d, v), ang))
            )
        else:
            out.append(Mistake.of(mistake_id, model=lambda v=v: pe_model(n, d, v)))
    out.append(Mistake.of("pe_sin_cos_half", applies=_is_half_layout))  # any other frequencies
    return out


@exercise(
    "sinusoidal_encoding",
    forbidden=_forbid_sinusoidal,
    summary="the fixed sinusoidal positional encoding table",
)
def check_sinusoidal_encoding(candidate, ctx: Context) -> None:
    sizes = [(10, 16), (1, 4), (64, 2), (50, 6), (128, 32), (20, 64)]
    if ctx.thorough:
        sizes += [(512, 128), (3, 10), (1000, 8), (7, 256)]
    for n, d in sizes:
        case = f"n_positions={n}, d_model={d}"
        got = ctx.call(candidate, n, d, case=case)
        expected = pe_model(n, d)
        like = torch.zeros(n, d, dtype=torch.float32)
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
            like,
            what="the encoding",
            case=case,
            check_dtype=False,
            swapped=torch.zeros(d, n) if n != d else None,
            swapped_msg="the table is transposed: rows must be positions and "
            "columns features, (n_positions, d_model).",
        )
        ctx.expect_close(
            got,
            expected,
            what="the encoding",
            case=case,
            mistakes=_pe_mistakes(n, d),
            **_angle_tol(n - 1),
        )
    for n, d in [(4, 7)] + ([(3, 1), (2, 33)] if ctx.thorough else []):
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
    pos = np.asarray(pos, dtype=np.float64)
    two_i = np.arange(0, d, 2, dtype=np.float64)
    if variant == "half_exponent":
        w = base ** (-(two_i / 2) / d)
    elif variant == "half_layout_t2t":  # tensor2tensor / fairseq: 10000^(-i / (d/2 - 1))
        w = base ** (-(two_i / 2) / max(d // 2 - 1, 1))
    elif variant == "multiplied":
        w = base ** (two_i / d)
    else:
        w = base ** (-two_i / d)
    theta = pos[..., None] * w  # (..., T, d/2)
    c, s = np.cos(theta), np.sin(theta)
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
]


def _rope_mistakes(x, positions, base) -> list[Mistake]:
    return [
        Mistake.of(mistake_id, model=lambda v=v: rope_model(x, positions, base, v))
        for mistake_id, v in ROPE_MISTAKES
    ]


def _call_rope(candidate, ctx: Context, x, positions, base, case):
    kwargs = {}
    if positions is not None:
        kwargs["positions"] = positions
    if base != 10000.0:
        kwargs["base"] = base
    got = ctx.call(candidate, x, case=case, **kwargs)
    ctx.expect_array(got, torch.zeros_like(x), what="the output", case=case)
    return got


def _check_relative(candidate, ctx: Context) -> None:
    """rope(q)[m] . rope(k)[n] must not change when m and n are shifted together."""
    rng = ctx.rng(51)
    g = ctx.torch_gen(51)
    d = 16 if ctx.thorough else 8
    n_pairs = 12
    shifts = [7, 250] + ([1000] if ctx.thorough else [])
    q = torch.randn(d, generator=g, dtype=torch.float64)
    k = torch.randn(d, generator=g, dtype=torch.float64)
    Q, K = q.expand(n_pairs, d).clone(), k.expand(n_pairs, d).clone()  # (n_pairs, d)
    m = torch.from_numpy(rng.integers(0, 20, size=n_pairs))
    n = torch.from_numpy(rng.integers(0, 20, size=n_pairs))
    for s in shifts:
        base_case = (
            f"q and k {tuple(Q.shape)} float64 (the same q and k in every row), "
            f"query positions {m.tolist()}, key positions {n.tolist()}"
        )
        rq = _call_rope(candidate, ctx, Q, m, 10000.0, base_case)
        rk = _call_rope(candidate, ctx, K, n, 10000.0, base_case)
        rq2 = _call_rope(candidate, ctx, Q, m + s, 10000.0, base_case + f", then both + {s}")
        rk2 = _call_rope(candidate, ctx, K, n + s, 10000.0, base_case + f", then both + {s}")
        before = (rq.detach().double() * rk.detach().double()).sum(-1)  # (n_pairs,)
        after = (rq2.detach().double() * rk2.detach().double()).sum(-1)
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
                case=base_case,
                likely=likely or named("rope_not_rotated"),
                hint=hint or named("rope_not_rotated").hint,
            )


@exercise("rope", forbidden=_forbid_rope, summary="rotary position embedding")
def check_rope(candidate, ctx: Context) -> None:
    g = ctx.torch_gen(50)
    rng = ctx.rng(50)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def pos(*p):  # the positions p
        return torch.tensor(p)

    def shuffled(n):
        return torch.from_numpy(rng.permutation(n))

    base = 10000.0  # the default
    cases = [  # label, x, positions (None: the default 0, 1, ...), base
        ("x (T=6, d=8), default positions", r(6, 8), None, base),
        ("x (B=2, T=5, d=4), default positions", r(2, 5, 4), None, base),
        ("x (B=2, H=3, T=4, d=16) (heads), default positions", r(2, 3, 4, 16), None, base),
        ("one token (T=1, d=6), default positions", r(1, 6), None, base),
        ("x (T=3, d=2), positions given", r(3, 2), pos(4, 9, 2), base),
        (
            "x (T=5, d=8), positions 10..14 (as with a KV cache)",
            r(5, 8),
            torch.arange(10, 15),
            base,
        ),
        ("x (B=2, T=6, d=8), shuffled positions", r(2, 6, 8), shuffled(6), base),
        ("x (T=4, d=8), base=100", r(4, 8), None, 100.0),
    ]
    if ctx.thorough:
        cases += [
            ("x (T=64, d=64), default positions", r(64, 64), None, base),
            (
                "x (B=3, T=7, d=10), positions 1000..1006",
                r(3, 7, 10),
                torch.arange(1000, 1007),
                base,
            ),
            ("x (T=5, d=12), base=500, positions given", r(5, 12), pos(0, 3, 3, 8, 1), 500.0),
        ]
    # The first case settles the type, shape and dtype before the property check.
    label, x, pos, base = cases[0]
    _call_rope(candidate, ctx, x.float(), pos, base, f"{label}; float32")
    _check_relative(candidate, ctx)
    for label, x, pos, base in cases:
        for dtype in (torch.float32, torch.float64):
            xd = x.to(dtype)
            case = f"{label}; {dtype_name(dtype)}"
            if pos is not None:
                case += f"; positions={pos.tolist()}"
            got = _call_rope(candidate, ctx, xd, pos, base, case)
            expected = rope_model(xd, pos, base)
            max_pos = (x.shape[-2] - 1) if pos is None else int(pos.max())
            ctx.expect_close(
                got,
                expected,
                what="the output",
                case=case,
                mistakes=_rope_mistakes(xd, pos, base),
                **_angle_tol(max_pos, float(x.abs().max())),
            )
