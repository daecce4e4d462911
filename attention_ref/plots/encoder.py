"""Figures of notebook 06: attention maps of every layer and head of an encoder, and a
quantity per layer (such as gradient norms) for several models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from .heatmaps import _to_np


def plot_layer_heads(
    weights: Sequence,
    tokens: Sequence[str] | None = None,
    *,
    index: int = 0,
    title: str = "",
    cmap: str = "viridis",
):
    """A grid of attention maps: one row per layer, one column per head.

    Args:
        weights: one ``(B, H, S, S)`` (or ``(H, S, S)``) array or tensor per layer, as
            returned by ``attention_ref.Encoder``.
        tokens: labels of the ``S`` positions (queries and keys).
        index: which batch element to draw when the weights have a batch axis.
    Returns the ``(n_layers, H)`` array of axes.
    """
    maps = [_to_np(w) for w in weights]
    if not maps:
        raise ValueError("weights is empty: pass one (B, H, S, S) array per layer")
    maps = [m[index] if m.ndim == 4 else m for m in maps]
    if any(m.ndim != 3 for m in maps):
        raise ValueError(
            f"each layer's weights must be (B, H, S, S) or (H, S, S); got shapes "
            f"{[tuple(_to_np(w).shape) for w in weights]}"
        )
    L, (H, S, _) = len(maps), maps[0].shape
    size = 0.16 * S + 0.9
    fig, axes = plt.subplots(L, H, figsize=(size * H + 0.6, size * L + 0.4), squeeze=False)
    for layer, m in enumerate(maps):
        for h in range(H):
            ax = axes[layer, h]
            ax.imshow(m[h], cmap=cmap, vmin=0.0, vmax=1.0, aspect="equal")
            ax.set_xticks(range(S), labels=list(tokens) if tokens else None, fontsize=7)
            ax.set_yticks(range(S), labels=list(tokens) if tokens else None, fontsize=7)
            ax.tick_params(labelbottom=layer == L - 1, labelleft=h == 0, length=0)
            if layer == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(f"layer {layer}\nquery", fontsize=9)
            if layer == L - 1:
                ax.set_xlabel("key", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return axes


def plot_per_layer(
    values: Mapping[str, Sequence[float]],
    *,
    ax=None,
    ylabel: str = "",
    title: str = "",
    logy: bool = False,
):
    """One line per model of a quantity per layer (layer 0 = next to the input)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    for name, ys in values.items():
        ys = np.asarray([float(v) for v in ys])
        ax.plot(np.arange(len(ys)), ys, marker="o", markersize=3, label=name)
    ax.set_xlabel("layer (0 = next to the input)")
    if ylabel:
        ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax
