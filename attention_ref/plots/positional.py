"""Figures of positional encodings: the table, single dimensions, similarity by distance."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from .heatmaps import _to_np


def _table(pe) -> np.ndarray:
    table = _to_np(pe).astype(np.float64)
    if table.ndim != 2:
        raise ValueError(f"pe must be 2-D (n_positions, d_model); got shape {table.shape}")
    return table


def plot_encoding(pe, *, ax=None, title: str = "", cmap: str = "viridis"):
    """Heatmap of a positional encoding table ``(n_positions, d_model)``: one row per
    position, one column per feature, from -1 (dark) to +1 (light). The default colour map
    is sequential, so the picture still reads in greyscale."""
    table = _table(pe)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    im = ax.imshow(table, cmap=cmap, vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xlabel("feature (column of PE)")
    ax.set_ylabel("position p")
    ax.set_title(title or f"positional encoding {table.shape[0]} x {table.shape[1]}")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="PE[p, feature]")
    return ax


def plot_encoding_dims(pe, dims: Sequence[int], *, ax=None, title: str = ""):
    """One curve per feature in ``dims``: ``PE[p, dim]`` as a function of the position."""
    table = _table(pe)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    positions = np.arange(table.shape[0])
    styles = ("-", "--", "-.", ":")  # told apart without colour, too
    for n_curve, j in enumerate(dims):
        if not 0 <= j < table.shape[1]:
            raise ValueError(f"dims must be in 0..{table.shape[1] - 1}; got {j}")
        kind = "sin" if j % 2 == 0 else "cos"
        ax.plot(
            positions,
            table[:, j],
            styles[n_curve % len(styles)],
            label=f"feature {j} ({kind}, pair {j // 2})",
        )
    ax.set_xlabel("position p")
    ax.set_ylabel("PE[p, feature]")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    ax.set_title(title or "single features of the encoding")
    return ax


def plot_similarity_by_distance(pe, anchors: Sequence[int] = (0,), *, ax=None, title: str = ""):
    """``PE[a] . PE[a + delta]`` against ``delta`` for each anchor position ``a``.

    For the sinusoidal table the curves lie on top of each other: the dot product of two
    encodings depends only on how far apart the positions are.
    """
    table = _table(pe)
    n = table.shape[0]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    styles = ("-", "--", ":", "-.")
    for n_curve, a in enumerate(anchors):
        if not 0 <= a < n:
            raise ValueError(f"anchors must be in 0..{n - 1}; got {a}")
        sims = table[a:] @ table[a]  # (n - a,)
        style = styles[n_curve % len(styles)]
        ax.plot(np.arange(n - a), sims, style, label=f"from position {a}", alpha=0.8)
    ax.set_xlabel("distance delta = p - a")
    ax.set_ylabel("PE[a] . PE[a + delta]")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "dot product of two encodings vs their distance")
    return ax
