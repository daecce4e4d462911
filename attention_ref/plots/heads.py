"""One attention heatmap per head, side by side (notebook 04)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from .heatmaps import _to_np


def plot_heads(
    weights,
    tokens: Sequence[str] | None = None,
    *,
    head_names: Sequence[str] | None = None,
    axes=None,
    title: str = "",
    cmap: str = "viridis",
):
    """Draw the weights of every head, ``(H, n_q, n_k)``, as ``H`` heatmaps in a row.

    Args:
        weights: ``(H, n_q, n_k)`` array or tensor (one batch element's weights).
        tokens: labels of the queries and keys (self-attention over one sentence).
        head_names: a title per head (default "head 0", "head 1", ...).
        axes: ``H`` matplotlib axes to draw on (default: a new figure).
    Returns the array of axes.
    """
    w = _to_np(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must be (heads, n_q, n_k); got shape {w.shape}")
    H, n_q, n_k = w.shape
    if head_names is not None and len(head_names) != H:
        raise ValueError(f"head_names has {len(head_names)} names for {H} heads")
    if axes is None:
        size = 0.28 * max(n_q, n_k) + 1.0
        _, axes = plt.subplots(1, H, figsize=(size * H, size + 0.4), squeeze=False)
        axes = axes[0]
    axes = np.asarray(axes).ravel()
    image = None
    for h, ax in enumerate(axes[:H]):
        image = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=1.0, aspect="equal")
        ax.set_title(head_names[h] if head_names is not None else f"head {h}", fontsize=10)
        ax.set_xticks(range(n_k), labels=list(tokens) if tokens else None, rotation=90)
        ax.set_yticks(range(n_q), labels=list(tokens) if tokens and h == 0 else None)
        if not tokens or h:
            ax.tick_params(axis="y", labelleft=h == 0)
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    if title:
        axes[0].figure.suptitle(title)
    fig = axes[0].figure
    fig.tight_layout()
    fig.colorbar(image, ax=list(axes[:H]), fraction=0.02, pad=0.01, label="attention weight")
    return axes
