"""Positional encodings: notebook 05.

Self-attention treats its input as a set: permute the tokens and the outputs are permuted
the same way. These functions give it a sense of order.

- ``sinusoidal_encoding``: the fixed table of "Attention Is All You Need", added to the
  token embeddings. Pair ``i`` of features holds ``sin`` and ``cos`` of ``p * w_i`` with
  ``w_i = 10000^(-2i/d)``, so shifting the position by ``k`` rotates each pair by ``k * w_i``.
- ``rope``: rotary position embeddings (RoFormer), applied to queries and keys. Pair
  ``(2i, 2i+1)`` of a vector at position ``p`` is rotated by the angle ``p * w_i``, so the
  score between a query at ``m`` and a key at ``n`` depends only on ``m - n``.
- ``offset_rotation``: the block-diagonal matrix that maps ``PE[p]`` to ``PE[p + k]``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._validate import describe, require_tensor


def _require_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int; got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def _require_even_d(d_model) -> int:
    d_model = _require_int("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(
            f"d_model must be even (features come in (sin, cos) pairs); got d_model={d_model}"
        )
    return d_model


def _require_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, int | float | np.integer | np.floating):
        raise TypeError(f"base must be a number; got {describe(base)}")
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base must be a positive finite number; got {base}")
    return float(base)


def frequencies(
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The angular frequencies ``w_i = base^(-2i/d_model)`` for ``i = 0 .. d_model/2 - 1``.

    Returns a ``(d_model // 2,)`` tensor, from ``w_0 = 1`` (one radian per position)
    down to ``base^(-(d-2)/d)`` (a wavelength of almost ``2 pi base`` positions).
    """
    d_model = _require_even_d(d_model)
    base = _require_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,), float64 on the CPU
    return torch.pow(base, -two_i / d_model).to(device=device, dtype=dtype)


def sinusoidal_encoding(
    n_positions: int,
    d_model: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The fixed sinusoidal positional encoding ``(n_positions, d_model)``.

    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))`` for
    positions ``p = 0 .. n_positions - 1``: even columns hold sines, odd columns cosines,
    interleaved, each (sin, cos) pair sharing one frequency.

    Args:
        n_positions: how many positions (rows), ``>= 0``.
        d_model: the model width (columns); must be even.
        dtype: a floating dtype for the result (default ``torch.float32``, the dtype of
            embeddings; the values are computed in float64 and rounded once).
        device: where to put the result (default: the CPU), e.g. ``x.device``.

    Returns:
        A ``(n_positions, d_model)`` tensor with entries in ``[-1, 1]``; add it to token
        embeddings ``(batch, n_positions, d_model)`` and it broadcasts over the batch.

    Raises:
        ValueError: if ``d_model`` is odd or smaller than 2, or ``n_positions < 0``.
        TypeError: if either size is not an int, or ``dtype`` is not floating.
    """
    n_positions = _require_int("n_positions", n_positions, 0)
    d_model = _require_even_d(d_model)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype; got {dtype!r}")
    p = torch.arange(n_positions, dtype=torch.float64)  # (n,), float64 on the CPU
    angles = p[:, None] * frequencies(d_model)[None, :]  # (n, d/2)
    pe = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1)  # (n, d/2, 2)
    pe = pe.reshape(n_positions, d_model)  # (n, d): sin, cos, sin, cos, ...
    return pe.to(device=device, dtype=dtype)


def offset_rotation(
    k: int | float,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``(d_model, d_model)`` matrix ``M_k`` with ``PE[p + k] = M_k @ PE[p]`` for every p.

    ``M_k`` is block diagonal; block ``i`` rotates the pair ``(sin, cos)`` of frequency
    ``w_i`` by the angle ``k * w_i``: ``[[cos, sin], [-sin, cos]]`` of ``k * w_i``. It does not
    depend on ``p``: a shift in position is the same linear map wherever it starts.
    For a table ``pe = sinusoidal_encoding(n, d)``: ``pe[k:] == pe[:-k] @ M_k.T``.
    """
    if isinstance(k, bool) or not isinstance(k, int | float | np.integer | np.floating):
        raise TypeError(f"k must be a number; got {describe(k)}")
    d_model = _require_even_d(d_model)
    # The frequencies of frequencies(), computed here: notebook 05's grading edition
    # withholds frequencies (its exercise's answer), and its demonstration calls this.
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,)
    angles = float(k) * torch.pow(_require_base(base), -two_i / d_model)  # (d/2,): k * w_i
    c, s = torch.cos(angles), torch.sin(angles)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(device=device, dtype=dtype)  # (d, d)


def rope(
    x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0
) -> torch.Tensor:
    """Rotary position embedding: rotate each feature pair of ``x`` by its position's angle.

    For a vector at position ``p`` and pair ``i`` (features ``2i`` and ``2i+1``), with
    ``theta = p * base^(-2i/d)``::

        out[2i]   = x[2i] * cos(theta) - x[2i+1] * sin(theta)
        out[2i+1] = x[2i] * sin(theta) + x[2i+1] * cos(theta)

    Apply it to queries and keys (not values): then ``rope(q)[m] . rope(k)[n]`` depends on
    the positions only through ``m - n``.

    Args:
        x: ``(..., T, d)`` queries or keys (any leading dims, e.g. ``(B, H, T, d_head)``);
            ``d`` must be even.
        positions: the position of each of the ``T`` vectors: a ``(T,)`` tensor of ints or
            floats (or any shape that broadcasts to ``x.shape[:-1]``, e.g. ``(B, 1, T)``
            for per-sequence positions). Default ``torch.arange(T)``: positions 0..T-1.
        base: the base of the frequencies (10000 in RoFormer; larger bases rotate slower).

    Returns:
        A tensor like ``x`` (same shape, dtype and device). Each pair keeps its length.
    """
    require_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(
            f"x must have at least 2 dimensions (..., T, d); got shape {tuple(x.shape)}"
        )
    T, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(
            f"the last dimension of x must be even (features are rotated in pairs); got x of "
            f"shape {tuple(x.shape)} with d={d}"
        )
    base = _require_base(base)
    work = torch.promote_types(x.dtype, torch.float32)  # angles in at least float32
    if positions is None:
        positions = torch.arange(T, device=x.device)
    else:
        require_tensor("positions", positions, floating=False)
        if positions.dtype == torch.bool or positions.is_complex():
            raise TypeError(f"positions must hold ints or floats; got dtype {positions.dtype}")
        try:
            fits = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"positions of shape {tuple(positions.shape)} does not broadcast to "
                f"x.shape[:-1] = {tuple(x.shape[:-1])} (one position per vector; usually (T,) "
                f"with T={T})"
            )
    inv_freq = frequencies(d, base, dtype=work, device=x.device)  # (d/2,)
    angles = positions.to(device=x.device, dtype=work)[..., None] * inv_freq  # (..., T, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    pairs = x.to(work).unflatten(-1, (d // 2, 2))  # (..., T, d/2, 2)
    x_even, x_odd = pairs[..., 0], pairs[..., 1]  # (..., T, d/2) each
    rotated = torch.stack(
        [x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1
    )  # (..., T, d/2, 2)
    return rotated.flatten(-2).to(x.dtype)  # (..., T, d)
