"""Attention-weight and mask heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch


def _to_np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.numpy() if x.dtype == torch.bool else x.float().numpy()
    return np.asarray(x)


def plot_attention(
    weights,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    *,
    ax=None,
    title: str = "",
    annotate: bool | None = None,
    cmap: str = "viridis",
    colorbar_label: str = "weight",
):
    """Heatmap of attention weights ``(n_q, n_k)``: row i shows where query i looks.

    Args:
        weights: ``(n_q, n_k)`` array or tensor.
        queries, keys: optional labels (tokens) for the rows and columns.
        annotate: write each weight in its cell (default: when the matrix is small).
        cmap: a colour map whose lightness rises with the value (viridis by default), so the
            figure reads the same in greyscale.
        colorbar_label: the label of the colour bar.
    """
    w = _to_np(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (n_q, n_k); got shape {w.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * w.shape[1] + 2, 0.5 * w.shape[0] + 1.5))
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=max(1e-9, float(w.max())), aspect="auto")
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if keys is not None:
        ax.set_xticks(range(len(keys)), labels=list(keys), rotation=45, ha="right")
    if queries is not None:
        ax.set_yticks(range(len(queries)), labels=list(queries))
    if annotate is None:
        annotate = w.size <= 100
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(
                    j,
                    i,
                    f"{w[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if w[i, j] < 0.6 * w.max() else "black",
                )
    if title:
        ax.set_title(title)
    cbar = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if colorbar_label:
        cbar.set_label(colorbar_label)
    return ax


def plot_mask(
    mask,
    *,
    ax=None,
    title: str = "",
    row_label: str = "query i",
    col_label: str = "key j",
    row_names: Sequence[str] | None = None,
    col_names: Sequence[str] | None = None,
):
    """Draw a boolean mask: filled = may attend (True), empty = blocked (False)."""
    m = _to_np(mask).astype(bool)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D; got shape {m.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * m.shape[1] + 1.5, 0.45 * m.shape[0] + 1.2))
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1.3, aspect="equal")
    ax.set_xticks(range(m.shape[1]), labels=col_names if col_names is not None else None)
    ax.set_yticks(range(m.shape[0]), labels=row_names if row_names is not None else None)
    ax.set_xlabel(col_label)
    ax.set_ylabel(row_label)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(
                j,
                i,
                "✓" if m[i, j] else "·",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if m[i, j] else "0.5",
            )
    ax.set_title(title or "mask (✓ = may attend)")
    return ax
