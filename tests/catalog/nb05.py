"""Catalog for notebook 05: sinusoidal_encoding, rope."""

import math

import numpy as np
import torch

from . import alternative, mistake


def _require_even(d_model):
    if d_model % 2:
        raise ValueError(f"d_model must be even; got d_model={d_model}")


def _interleave(sin, cos):
    return torch.stack([sin, cos], dim=-1).flatten(-2)


# ----------------------------------------------------------------------------- sinusoidal


def _angles(n_positions, d_model, exponent):
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]
    return pos / 10000.0**exponent


@mistake("sinusoidal_encoding", id="reference_used")
def pe_from_offset_rotation(n_positions, d_model):
    """Row p of the table is row 0 turned by the course's rotation by p positions."""
    import attention_ref as ar

    row0 = torch.zeros(d_model, dtype=torch.float64)
    row0[1::2] = 1.0  # (d,): sin 0 = 0, cos 0 = 1
    rows = [ar.offset_rotation(p, d_model) @ row0 for p in range(n_positions)]  # (d,) each
    return torch.stack(rows).float() if rows else torch.zeros(0, d_model)


@mistake("sinusoidal_encoding", id="pe_swapped")
def pe_swapped(n_positions, d_model):
    _require_even(d_model)
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) / d_model)
    return _interleave(torch.cos(ang), torch.sin(ang))


@mistake("sinusoidal_encoding", id="pe_half_exponent")
def pe_half_exponent(n_positions, d_model):
    _require_even(d_model)
    i = torch.arange(d_model // 2)
    ang = _angles(n_positions, d_model, i / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@mistake("sinusoidal_encoding", id="pe_column_exponent")
def pe_column_exponent(n_positions, d_model):
    _require_even(d_model)
    pe = torch.zeros(n_positions, d_model)
    for p in range(n_positions):
        for j in range(d_model):
            angle = p / 10000 ** (j / d_model)
            pe[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


@mistake("sinusoidal_encoding", id="pe_from_one")
def pe_from_one(n_positions, d_model):
    _require_even(d_model)
    pos = torch.arange(1, n_positions + 1, dtype=torch.float32)[:, None]
    ang = pos / 10000.0 ** (torch.arange(0, d_model, 2) / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@mistake("sinusoidal_encoding", id="pe_concat")
def pe_concatenated(n_positions, d_model):
    _require_even(d_model)
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) / d_model)
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=1)


@mistake("sinusoidal_encoding", id="pe_half_layout_t2t")
def pe_fairseq_half_layout(n_positions, d_model):
    """fairseq's SinusoidalPositionalEmbedding (and tensor2tensor's timing signal)."""
    _require_even(d_model)
    half_dim = d_model // 2
    emb = math.log(10000) / max(half_dim - 1, 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float) * -emb)
    emb = torch.arange(n_positions, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    return torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)


@mistake("sinusoidal_encoding", id="pe_sin_cos_half")
def pe_half_layout_other_frequencies(n_positions, d_model):
    """All sines, then all cosines, with the exponent i/d (pairs counted, not columns)."""
    _require_even(d_model)
    ang = _angles(n_positions, d_model, torch.arange(d_model // 2) / d_model)
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=1)


@mistake("sinusoidal_encoding", id="pe_multiplied")
def pe_multiplied(n_positions, d_model):
    _require_even(d_model)
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]
    ang = pos * 10000.0 ** (torch.arange(0, d_model, 2) / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@mistake("sinusoidal_encoding", id="pe_int_division")
def pe_integer_division(n_positions, d_model):
    _require_even(d_model)
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) // d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@mistake("sinusoidal_encoding", id="wrong_shape")
def pe_transposed(n_positions, d_model):
    _require_even(d_model)
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang)).T


@mistake("sinusoidal_encoding", id="wrong_dtype")
def pe_float64(n_positions, d_model):
    _require_even(d_model)
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    ang = pos / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@mistake("sinusoidal_encoding", id="wrong_type")
def pe_numpy(n_positions, d_model):
    _require_even(d_model)
    ang = np.arange(n_positions)[:, None] / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model), dtype=np.float32)
    pe[:, 0::2], pe[:, 1::2] = np.sin(ang), np.cos(ang)
    return pe


@mistake("sinusoidal_encoding", id="no_value_error")
def pe_no_odd_check(n_positions, d_model):
    pe = torch.zeros(n_positions, d_model)
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) / d_model)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang[:, : d_model // 2])
    return pe


@mistake("sinusoidal_encoding", id="value_error_vague")
def pe_vague_error(n_positions, d_model):
    if d_model % 2:
        raise ValueError("must be even")
    ang = _angles(n_positions, d_model, torch.arange(0, d_model, 2) / d_model)
    return _interleave(torch.sin(ang), torch.cos(ang))


@alternative("sinusoidal_encoding")
def pe_loops_math(n_positions, d_model):
    """Two loops and the math module, as the formula reads."""
    if d_model % 2 != 0:
        raise ValueError(f"d_model={d_model} is odd")
    rows = []
    for p in range(n_positions):
        row = []
        for i in range(d_model // 2):
            angle = p / 10000 ** (2 * i / d_model)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(n_positions, d_model)


@alternative("sinusoidal_encoding")
def pe_exp_log_float32(n_positions, d_model):
    """The exp(-log(10000) * 2i/d) form, all in float32, filled by slices."""
    if d_model % 2:
        raise ValueError("d_model must be even, got " + str(d_model))
    pe = torch.zeros(n_positions, d_model)
    position = torch.arange(0, n_positions).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


@alternative("sinusoidal_encoding")
def pe_numpy_float64(n_positions, d_model):
    """NumPy in float64, converted once at the end."""
    if d_model % 2:
        raise ValueError(f"odd d_model: {d_model}")
    i = np.arange(d_model // 2)
    angles = np.outer(np.arange(n_positions), 1.0 / np.power(10000.0, 2 * i / d_model))
    pe = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(n_positions, d_model)
    return torch.from_numpy(pe).float()


@alternative("sinusoidal_encoding")
def pe_einsum_pow(n_positions, d_model):
    """Outer product by einsum, frequencies by torch.pow."""
    if d_model % 2 == 1:
        raise ValueError(f"sinusoidal_encoding needs an even d_model, got {d_model}")
    freqs = torch.pow(torch.tensor(10000.0), -torch.arange(0, d_model, 2) / d_model)
    angles = torch.einsum("p,f->pf", torch.arange(n_positions, dtype=torch.float32), freqs)
    return torch.stack((angles.sin(), angles.cos()), dim=2).reshape(n_positions, d_model)


# ----------------------------------------------------------------------------- rope


def _theta(x, positions, base, exponent_scale=2.0):
    T, d = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(T)
    i = torch.arange(d // 2, dtype=torch.float32)
    inv_freq = base ** (-exponent_scale * i / d)
    return positions.float()[:, None] * inv_freq  # (T, d/2), float32 tables


def _rope_from_parts(x, cos, sin, sign=1.0):
    xe, xo = x[..., 0::2], x[..., 1::2]
    return _interleave(xe * cos - sign * xo * sin, sign * xe * sin + xo * cos)


@mistake("rope", id="rope_reversed")
def rope_reversed(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    return _rope_from_parts(x, th.cos(), th.sin(), sign=-1.0)


@mistake("rope", id="rope_swapped")
def rope_swapped(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    return _rope_from_parts(x, th.sin(), th.cos())


@mistake("rope", id="rope_rotate_half")
def rope_rotate_half(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    cos, sin = th.cos().repeat(1, 2), th.sin().repeat(1, 2)  # (T, d): halves
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


@mistake("rope", id="rope_concat")
def rope_concat(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.cat([xe * th.cos() - xo * th.sin(), xe * th.sin() + xo * th.cos()], dim=-1)


@mistake("rope", id="rope_overwritten")
def rope_overwritten(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    out = x.clone()
    out[..., 0::2] = x[..., 0::2] * th.cos() - x[..., 1::2] * th.sin()
    out[..., 1::2] = out[..., 0::2] * th.sin() + x[..., 1::2] * th.cos()
    return out


@mistake("rope", id="rope_half_exponent")
def rope_half_exponent(x, positions=None, base=10000.0):
    th = _theta(x, positions, base, exponent_scale=1.0)
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="rope_multiplied")
def rope_multiplied(x, positions=None, base=10000.0):
    th = _theta(x, positions, base, exponent_scale=-2.0)
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="rope_ignores_positions")
def rope_ignores_positions(x, positions=None, base=10000.0):
    th = _theta(x, None, base)
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="rope_from_one")
def rope_from_one(x, positions=None, base=10000.0):
    if positions is None:
        positions = torch.arange(1, x.shape[-2] + 1)
    th = _theta(x, positions, base)
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="rope_added")
def rope_added(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    return x + _interleave(th.sin(), th.cos())


@mistake("rope", id="rope_fixed_base")
def rope_gptj_fixed_base(x, positions=None, base=10000.0):
    """Real code (GPT-J style): the base is a constant, 10000, whatever was passed."""
    th = _theta(x, positions, 10000.0)
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="rope_partial")
def rope_neox_partial(x, positions=None, base=10000.0, rotary_pct=0.25):
    """Real code (GPT-NeoX's rotary_pct): only the first quarter of the features (at least
    one pair) is rotated, with frequencies over those features; the rest pass through."""
    d = x.shape[-1]
    rot = max(2, int(d * rotary_pct) // 2 * 2)
    head, tail = x[..., :rot], x[..., rot:]
    th = _theta(head, positions, base)
    return torch.cat([_rope_from_parts(head, th.cos(), th.sin()), tail], dim=-1)


@mistake("rope", id="rope_llama3_scaling")
def rope_llama31_scaled(x, positions=None, base=10000.0):
    """Real code (Llama 3.1): the slow frequencies are divided by 8, smoothly between the
    wavelengths 2048 and 8192."""
    T, d = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(T)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    inv_freq = torch.where(wavelen < old / high, inv_freq, scaled)
    th = positions.float()[:, None] * inv_freq
    return _rope_from_parts(x, th.cos(), th.sin())


@mistake("rope", id="input_modified")
def rope_in_place(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    xe, xo = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = xe * th.cos() - xo * th.sin()
    x[..., 1::2] = xe * th.sin() + xo * th.cos()
    return x


@mistake("rope", id="wrong_dtype")
def rope_float32_output(x, positions=None, base=10000.0):
    th = _theta(x, positions, base)
    return _rope_from_parts(x.float(), th.cos(), th.sin())


@mistake("rope", id="wrong_device")
def rope_positions_on_cpu(x, positions=None, base=10000.0):
    """Default positions built without device=: on the CPU whatever x's device."""
    T, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(T) if positions is None else positions
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    theta = pos.double()[:, None] * w  # (T, d/2)
    c, s = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


@alternative("rope")
def rope_complex(x, positions=None, base=10000.0):
    """Pairs as complex numbers, rotated by multiplying with e^{i theta}."""
    T, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(T, device=x.device) if positions is None else positions
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    theta = pos.double()[:, None] * inv_freq  # (T, d/2)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = xc * torch.polar(torch.ones_like(theta), theta)
    return torch.view_as_real(rotated).reshape(x.shape).to(x.dtype)


@alternative("rope")
def rope_rotation_matrices(x, positions=None, base=10000.0):
    """One explicit (d, d) block-diagonal rotation matrix per position."""
    T, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(T) if positions is None else positions  # read as numbers below
    mats = []
    for p in pos.tolist():
        blocks = []
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            blocks.append(
                torch.tensor(
                    [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]],
                    dtype=x.dtype,
                    device=x.device,
                )
            )
        mats.append(torch.block_diag(*blocks))
    R = torch.stack(mats)  # (T, d, d)
    return torch.einsum("tij,...tj->...ti", R, x)


@alternative("rope")
def rope_rotate_every_two(x, positions=None, base=10000.0):
    """GPT-J style: x * cos + rotate_every_two(x) * sin, float32 tables, repeat_interleave."""
    T, d = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(T, device=x.device)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device).float() / d))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, d/2)
    cos = freqs.cos().repeat_interleave(2, dim=-1).to(x.dtype)  # (T, d)
    sin = freqs.sin().repeat_interleave(2, dim=-1).to(x.dtype)
    x_even, x_odd = x[..., ::2], x[..., 1::2]
    rotated = torch.stack((-x_odd, x_even), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@alternative("rope")
def rope_pair_loop(x, positions=None, base=10000.0):
    """A loop over the pairs, writing into a new tensor."""
    T, d = x.shape[-2], x.shape[-1]
    pos = (torch.arange(T, device=x.device) if positions is None else positions).float()
    out = torch.empty_like(x)
    for i in range(d // 2):
        theta = pos * base ** (-2 * i / d)  # (T,)
        c, s = torch.cos(theta).to(x.dtype), torch.sin(theta).to(x.dtype)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * c - b * s
        out[..., 2 * i + 1] = a * s + b * c
    return out
