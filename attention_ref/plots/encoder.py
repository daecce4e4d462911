"""Figures of notebook 06: attention maps of every layer and head of an encoder, a
quantity per layer (such as gradient norms) for several models, and the learning-rate
schedule of ``attention_ref.training``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker as ticker
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
    fig, axes = plt.subplots(L, H, figsize=(size * H + 1.4, size * L + 0.4), squeeze=False)
    image = None
    for layer, m in enumerate(maps):
        for h in range(H):
            ax = axes[layer, h]
            image = ax.imshow(m[h], cmap=cmap, vmin=0.0, vmax=1.0, aspect="equal")
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
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
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
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("d", "-.")]  # tell lines apart in grey
    for i, (name, ys) in enumerate(values.items()):
        ys = np.asarray([float(v) for v in ys])
        marker, line = styles[i % len(styles)]
        ax.plot(np.arange(len(ys)), ys, marker=marker, linestyle=line, markersize=4, label=name)
    ax.set_xlabel("layer (0 = next to the input)")
    if ylabel:
        ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
        ax.tick_params(axis="y", which="minor", labelsize=8)
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def plot_lr_schedule(
    steps: int,
    lr: float,
    warmups: Sequence[int],
    *,
    ax=None,
    title: str = "learning rate per step: warm-up, then cosine decay",
):
    """The learning rate ``attention_ref.training.lr_at`` gives at each step of a run of
    ``steps`` steps with peak ``lr``, one line per warm-up length in ``warmups``."""
    from ..training import lr_at

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    styles = ["-", "--", ":", "-."]
    x = np.arange(steps)
    for i, w in enumerate(warmups):
        y = [lr_at(int(s), steps, lr, int(w)) for s in x]
        ax.plot(x, y, styles[i % len(styles)], lw=1.8, label=f"warmup={w}")
    ax.axhline(0.05 * lr, color="grey", lw=0.8, alpha=0.6)
    ax.annotate("floor: 5% of the peak", (0, 0.05 * lr), ha="left", va="bottom", fontsize=8)
    ax.set(xlabel="optimisation step", ylabel="learning rate", title=title, ylim=(0, lr * 1.08))
    ax.legend()
    ax.grid(alpha=0.3)
    return ax
