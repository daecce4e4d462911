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


_IMPL_STYLE = {
    "fused": ("black", "PyTorch fused (SDPA)"),
    "reference": ("tab:blue", "course's Triton kernels"),
    "tuned": ("tab:green", "Triton forward, autotuned"),
    "learner": ("tab:orange", "your kernel"),
}


def plot_triton_bench(rows, *, dtype="float16", d_head=64, title=None, axes=None):
    """TFLOP/s against sequence length, one panel per pass (forward, backward, both), for
    the rows of one dtype and head size (``attention_ref.triton_bench.TritonRow``): a line
    per implementation, solid without a mask and dashed causal. Returns the axes."""
    rows = [r for r in rows if r.dtype == dtype and r.d_head == d_head]
    if not rows:
        raise ValueError(f"no rows of dtype {dtype!r} and d_head {d_head} to plot")
    passes = [p for p in ("fwd", "bwd", "fwd+bwd") if any(r.pass_ == p for r in rows)]
    if axes is None:
        _, axes = plt.subplots(1, len(passes), figsize=(4.2 * len(passes), 3.6), squeeze=False)
        axes = axes[0]
    names = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}
    for ax, pass_ in zip(axes, passes, strict=False):
        for impl, (color, label) in _IMPL_STYLE.items():
            for causal, style in ((False, "-"), (True, "--")):
                mine = [r for r in rows if (r.pass_, r.impl, r.causal) == (pass_, impl, causal)]
                pts = sorted((r.n, r.tflops) for r in mine)
                if pts:
                    n, tflops = zip(*pts, strict=True)
                    tag = f"{label}{', causal' if causal else ''}"
                    ax.plot(n, tflops, style, marker="o", color=color, label=tag)
        ax.set_xscale("log", base=2)
        ns = sorted({r.n for r in rows})
        ax.set_xticks(ns, [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("tokens")
        ax.set_title(names[pass_])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"TFLOP/s ({dtype}, d = {d_head})")
    axes[0].legend(fontsize=7, loc="lower right")  # the forward panel has every kernel
    if title:
        axes[0].figure.suptitle(title, fontsize=10, y=1.02)
    return axes
