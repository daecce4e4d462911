"""Figures of notebook 13 (the modern decoder): notebook 11's GPT changed one thing at a
time, and the modern model against notebook 11's GPT on several seeds."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np


def plot_ladder(names: Sequence[str], ce_over_floor: Sequence[float], seconds: float):
    """Cross-entropy over the floor after ``seconds`` of training, one bar per step of the
    ladder (notebook 11's GPT, then one change at a time)."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    y = np.arange(len(names))[::-1]
    bars = ax.barh(y, ce_over_floor, color=["0.55"] + ["C0"] * (len(names) - 1))
    for b, v in zip(bars, ce_over_floor, strict=True):
        ax.text(v, b.get_y() + b.get_height() / 2, f" {v:.3f}", va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.axvline(1.0, color="black", ls="--", lw=1)  # the entropy floor
    lo = min(1.0, min(ce_over_floor)) * 0.98
    ax.set_xlim(lo, max(ce_over_floor) * 1.06)
    ax.set_xlabel("held-out cross-entropy / entropy floor (1 = perfect)")
    ax.set_title(f"One change at a time, each trained {seconds:g} s (one seed)")
    fig.tight_layout()
    return fig


def plot_block_comparison(runs: Sequence, seconds: float):
    """Left: cross-entropy over the floor, right: share of grammatical samples, for each
    block (colour) and seed (position); ``runs`` are :class:`~attention_ref.apps.modern_lm.Run`."""
    names = list(dict.fromkeys(r.name for r in runs))
    seeds = sorted({r.seed for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(names)
    for ax, key, label in (
        (axes[0], "ce_over_floor", "held-out cross-entropy / floor"),
        (axes[1], "grammatical", "share of grammatical samples (T = 1)"),
    ):
        for i, name in enumerate(names):
            vals = [next(getattr(r, key) for r in runs if r.name == name and r.seed == s)
                    for s in seeds]  # fmt: skip
            xs = np.arange(len(seeds)) + (i - (len(names) - 1) / 2) * width
            bars = ax.bar(xs, vals, width, label=name, color=f"C{i}", hatch=["", "//"][i % 2])
            for b, v in zip(bars, vals, strict=True):
                ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.3f}", ha="center",
                        va="bottom", fontsize=7)  # fmt: skip
        ax.set_xticks(np.arange(len(seeds)), [f"seed {s}" for s in seeds])
        ax.set_ylabel(label)
    axes[0].axhline(1.0, color="black", ls="--", lw=1, label="entropy floor")
    top = max(r.ce_over_floor for r in runs)
    axes[0].set_ylim(min(0.95, min(r.ce_over_floor for r in runs) * 0.98), top * 1.08)
    axes[1].set_ylim(0, 1.1)
    axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    fig.suptitle(f"The same data, {seconds:g} s of training each, equal parameter counts")
    fig.tight_layout()
    return fig
