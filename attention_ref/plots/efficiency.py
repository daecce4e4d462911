"""Figures of notebook 12: how time and memory grow with the sequence length, which tiles
causal blocked attention computes, and what a key-value cache saves while decoding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle


def _series(name: str, values, n: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have one value per length, shape ({n},); got {arr.shape}")
    return arr


def plot_scaling(
    lengths: Sequence[int],
    times: Mapping[str, Sequence[float]],
    memory: Mapping[str, Sequence[float]] | None = None,
    *,
    axes=None,
):
    """Time (seconds) and, if given, peak extra memory (bytes) against the sequence length,
    one line per implementation, on log-log axes (a slope of 2 is quadratic growth).

    Args:
        lengths: the sequence lengths ``(m,)``.
        times: implementation name -> ``(m,)`` seconds.
        memory: implementation name -> ``(m,)`` bytes (optional).
        axes: matplotlib axes to draw on (one, or two with ``memory``).

    Returns:
        The axes drawn on (a tuple when there are two).
    """
    n = np.asarray(lengths, dtype=np.float64)
    if n.ndim != 1 or n.size == 0 or np.any(n <= 0):
        raise ValueError(
            f"lengths must be a non-empty 1-D sequence of positive ints; got {lengths}"
        )
    panels = 2 if memory else 1
    if axes is None:
        _, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.6))
    axes = np.atleast_1d(axes)
    data = [("time (s)", "time per call", times, 1.0)] + (
        [("peak extra memory (MiB)", "peak extra memory per call", memory, 2**20)] if memory else []
    )
    styles = ("o-", "s--", "^:", "D-.")  # told apart without colour, too
    for ax, (label, title, series, unit) in zip(axes, data, strict=True):
        for i, (name, values) in enumerate(series.items()):
            style = styles[i % len(styles)]
            ax.loglog(n, _series(name, values, n.size) / unit, style, label=name)
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.set_title(title + " (log-log)")
        ax.set_xticks(n, [str(int(v)) for v in n])
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
    plt.tight_layout()
    return tuple(axes) if panels == 2 else axes[0]


def causal_tiles(n: int, block_size: int) -> np.ndarray:
    """``(n_blocks, n_blocks)`` ints for causal blocked attention over ``n`` positions:
    0 = skipped (entirely in the future), 1 = computed and masked (crosses the diagonal),
    2 = computed in full."""
    if n < 1 or block_size < 1:
        raise ValueError(f"n and block_size must be >= 1; got n={n}, block_size={block_size}")
    nb = -(-n // block_size)
    tiles = np.zeros((nb, nb), dtype=int)
    for bi in range(nb):
        i0, i1 = bi * block_size, min((bi + 1) * block_size, n)
        for bj in range(nb):
            j0, j1 = bj * block_size, min((bj + 1) * block_size, n)
            if j0 >= i1:
                tiles[bi, bj] = 0
            elif j1 - 1 > i0:
                tiles[bi, bj] = 1
            else:
                tiles[bi, bj] = 2
    return tiles


def plot_causal_tiles(n: int, block_size: int, *, ax=None):
    """Which (query block, key block) tiles causal online attention computes."""
    tiles = causal_tiles(n, block_size)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 4.0))
    colors = ["#eeeeee", "#f4a261", "#2a9d8f"]
    ax.imshow(tiles, cmap=ListedColormap(colors), vmin=0, vmax=2)
    for bi, bj in zip(*np.nonzero(tiles == 1), strict=True):  # hatched: readable in grey too
        ax.add_patch(
            Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, hatch="///", lw=0, color="0.3")
        )
    nb = tiles.shape[0]
    ax.set_xticks(range(nb), [f"{j * block_size}" for j in range(nb)], rotation=90)
    ax.set_yticks(range(nb), [f"{i * block_size}" for i in range(nb)])
    ax.set_xlabel("key block (first position)")
    ax.set_ylabel("query block (first position)")
    done = int((tiles > 0).sum())
    ax.set_title(f"n={n}, block_size={block_size}: {done} of {nb * nb} tiles computed")
    ax.legend(
        handles=[
            Patch(color=colors[2], label="computed"),
            Patch(facecolor=colors[1], hatch="///", edgecolor="0.3", label="computed, masked"),
            Patch(color=colors[0], label="skipped (future)"),
        ],
        loc="upper right",
        fontsize=8,
    )
    return ax


def plot_decoding_times(n_tokens: Sequence[int], recompute, cached, *, ax=None):
    """Seconds to generate ``n_tokens`` tokens with and without a key-value cache, and the
    speed-up written above each point."""
    n = np.asarray(n_tokens, dtype=np.float64)
    r = _series("recompute", recompute, n.size)
    c = _series("cached", cached, n.size)
    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.plot(n, r, "o-", label="recompute the prefix every step")
    ax.plot(n, c, "s--", label="key-value cache")
    for x, a, b in zip(n, r, c, strict=True):
        ax.annotate(f"{a / b:.1f}x", (x, a), textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xlabel("tokens generated")
    ax.set_ylabel("time (s)")
    ax.set_title("greedy decoding, with the speed-up of the cache")
    ax.margins(y=0.12)  # room for the speed-up labels
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax
