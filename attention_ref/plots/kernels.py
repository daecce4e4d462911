"""Figures of notebook 14 (attention as a Triton kernel): the tiles a causal kernel visits."""

from __future__ import annotations

import numpy as np
from matplotlib import pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

SKIPPED, MASKED, FULL = 0, 1, 2


def kernel_tiles(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> np.ndarray:
    """``(programs, key tiles)``: what the reference kernel does with each tile. FULL: loaded
    and used without a mask; MASKED: loaded, then masked (it crosses the diagonal or the end
    of the keys); SKIPPED: never loaded (entirely in the future of every query of the
    program). Query ``i`` sees key ``j <= i + n_k - n_q`` when causal."""
    n_prog, n_tiles = -(-n_q // block_m), -(-n_k // block_n)
    tiles = np.full((n_prog, n_tiles), SKIPPED)
    offset = n_k - n_q
    for p in range(n_prog):
        if causal:  # the loop bounds of attention_ref.triton_attention's kernel
            first_sees = min(max(p * block_m + offset + 1, 0), n_k)
            hi = min(max((p + 1) * block_m + offset, 0), n_k)
        else:
            first_sees = hi = n_k
        full_end = first_sees // block_n * block_n
        for t in range(n_tiles):
            j0 = t * block_n
            tiles[p, t] = FULL if j0 + block_n <= full_end else MASKED if j0 < hi else SKIPPED
    return tiles


def plot_kernel_tiles(n_q: int, n_k: int, block_m: int, block_n: int, *, causal=True, ax=None):
    """The tiles of :func:`kernel_tiles` as a grid: one row per program (a block of queries),
    one column per tile of keys."""
    tiles = kernel_tiles(n_q, n_k, block_m, block_n, causal)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6, 4.2))
    colors = ["#eeeeee", "#f4a261", "#2a9d8f"]
    ax.imshow(tiles, cmap=ListedColormap(colors), vmin=0, vmax=2)
    n_prog, n_tiles = tiles.shape
    ax.set_xticks(range(n_tiles), [f"{t * block_n}" for t in range(n_tiles)], rotation=90)
    ax.set_yticks(range(n_prog), [f"{p}" for p in range(n_prog)])
    ax.set_xlabel(f"tile of keys (first key; {block_n} keys each)")
    ax.set_ylabel(f"program ({block_m} queries each)")
    loaded = int((tiles > SKIPPED).sum())
    ax.set_title(f"n_q={n_q}, n_k={n_k}: {loaded} of {tiles.size} tiles loaded", fontsize=10)
    ax.legend(
        handles=[
            Patch(color=colors[2], label="loaded, no mask"),
            Patch(color=colors[1], label="loaded, masked"),
            Patch(color=colors[0], label="never loaded"),
        ],
        # Below the tick labels and the axis label, at a fixed distance in points (a
        # fraction of the axes would overlap them on a short panel).
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        borderaxespad=5.5,
        ncol=3,
        fontsize=8,
    )
    return ax
