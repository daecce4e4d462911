"""Why attention divides the scores by sqrt(d_k): the variance of q . k grows with d_k, and
unscaled scores push softmax towards a one-hot distribution."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from .heatmaps import _to_np


def _series(name: str, values, n: int) -> np.ndarray:
    arr = _to_np(values).astype(np.float64)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one value per d_k, shape ({n},); got {arr.shape}")
    return arr


def plot_score_scaling(
    d_ks: Sequence[int],
    *,
    var_unscaled,
    max_weight_unscaled,
    max_weight_scaled,
    var_scaled=None,
    n_keys: int | None = None,
    axes=None,
):
    """Two panels against the key dimension ``d_k``.

    Left (log-log): the variance of the dot product ``q . k`` of random unit-variance
    vectors, with the theoretical line ``Var = d_k`` (and, if given, the variance after dividing by
    ``sqrt(d_k)``, which stays at 1). Right: how saturated the softmax over ``n_keys``
    scores is, measured as the mean largest weight, for unscaled and scaled scores; 1 means
    one-hot, ``1 / n_keys`` uniform.

    Args:
        d_ks: the key dimensions, ``(m,)``.
        var_unscaled, var_scaled: measured ``Var(q . k)`` and ``Var(q . k / sqrt(d_k))``,
            ``(m,)`` each (``var_scaled`` optional).
        max_weight_unscaled, max_weight_scaled: mean largest softmax weight, ``(m,)`` each.
        n_keys: the number of keys per softmax, to draw the uniform level ``1 / n_keys``.
        axes: two matplotlib axes to draw on (a new 1 x 2 figure by default).

    Returns:
        The two axes ``(left, right)``.
    """
    d = _to_np(d_ks).astype(np.float64)
    if d.ndim != 1 or d.size == 0 or np.any(d <= 0):
        raise ValueError(f"d_ks must be a non-empty 1-D sequence of positive sizes; got {d_ks!r}")
    n = d.size
    var_u = _series("var_unscaled", var_unscaled, n)
    top_u = _series("max_weight_unscaled", max_weight_unscaled, n)
    top_s = _series("max_weight_scaled", max_weight_scaled, n)
    var_s = None if var_scaled is None else _series("var_scaled", var_scaled, n)
    if n_keys is not None and n_keys < 1:
        raise ValueError(f"n_keys must be >= 1; got {n_keys}")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    if len(axes) != 2:
        raise ValueError(f"axes must hold two axes (left, right); got {len(axes)}")
    left, right = axes

    left.plot(d, d, color="0.6", linestyle="--", label="theory: Var = $d_k$")
    left.plot(d, var_u, "o-", color="C3", label=r"measured Var($q \cdot k$)")
    if var_s is not None:
        left.plot(d, var_s, "s-", color="C0", label=r"Var($q \cdot k\,/\sqrt{d_k}$)")
    # log-log: the line Var = d_k is straight, and the scaled variance (about 1) stays visible
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xlabel("$d_k$ (log scale)")
    left.set_ylabel("variance of the score (log scale)")
    left.set_title("dot products grow with $d_k$")
    left.legend(fontsize=8)

    right.plot(d, top_u, "o-", color="C3", label=r"unscaled $q \cdot k$")
    right.plot(d, top_s, "s-", color="C0", label=r"scaled $q \cdot k\,/\sqrt{d_k}$")
    right.axhline(1.0, color="0.6", linestyle="--", linewidth=1)
    right.text(d[0], 1.0, " one-hot", va="bottom", fontsize=8, color="0.4")
    if n_keys is not None:
        right.axhline(1.0 / n_keys, color="0.6", linestyle=":", linewidth=1)
        right.text(
            d[0], 1.0 / n_keys, f" uniform (1/{n_keys})", va="bottom", fontsize=8, color="0.4"
        )
    right.set_xscale("log", base=2)
    right.set_ylim(0.0, 1.1)
    right.set_xlabel("$d_k$ (log scale)")
    right.set_ylabel("mean largest softmax weight")
    right.set_title("unscaled scores saturate the softmax")
    right.legend(fontsize=8, loc="center right")
    return left, right
