"""Figures of notebook 11 (a GPT): cross-entropy against the entropy floor, agreement,
the subject head, sampling against temperature, and grouped-query attention."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np


def plot_cross_entropy(
    losses: Sequence[float], floor: float, gpt: float, bigram: float, *, smooth: int = 25
):
    """Left: the training loss (moving average) with the floor; right: held-out
    cross-entropy of the bigram, the GPT and the floor."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    losses = np.asarray(losses, dtype=float)
    if len(losses) >= smooth:
        avg = np.convolve(losses, np.ones(smooth) / smooth, mode="valid")
        ax1.plot(
            np.arange(smooth - 1, len(losses)), avg, color="C0", label="GPT (training batches)"
        )
    else:
        ax1.plot(losses, color="C0", label="GPT (training batches)")
    ax1.axhline(floor, color="black", ls="--", label=f"entropy floor {floor:.3f}")
    ax1.axhline(bigram, color="C3", ls=":", label=f"bigram (held out) {bigram:.3f}")
    ax1.set_ylim(floor * 0.9, max(bigram * 1.35, floor * 1.6))
    ax1.set_xlabel("training step")
    ax1.set_ylabel("cross-entropy (nats per token)")
    ax1.set_title("Training loss")
    ax1.legend(fontsize=8)
    names = ["entropy floor", "GPT", "bigram"]
    values = [floor, gpt, bigram]
    bars = ax2.bar(names, values, color=["0.25", "C0", "C3"], hatch=["", "//", ".."])
    for b, v in zip(bars, values, strict=True):
        ax2.text(
            b.get_x() + b.get_width() / 2,
            v,
            f"{v:.3f}\n({v / floor:.2f}x)",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax2.set_ylim(0, max(values) * 1.25)
    ax2.set_ylabel("held-out cross-entropy (nats/token)")
    ax2.set_title("Held-out sentences")
    fig.tight_layout()
    return fig


def plot_agreement(scores: dict[str, dict[str, float]]):
    """Grouped bars: agreement accuracy of each model (``scores[model][subset]``)."""
    models = list(scores)
    subsets = list(next(iter(scores.values())))
    x = np.arange(len(subsets))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    hatches = ["//", "..", "xx", ""]
    for i, m in enumerate(models):
        vals = [scores[m][s] for s in subsets]
        bars = ax.bar(
            x + i * width - 0.4 + width / 2,
            vals,
            width,
            label=m,
            hatch=hatches[i % 4],
            color=f"C{[0, 3, 2, 4][i % 4]}",
        )
        for b, v in zip(bars, vals, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.01, f"{v:.2f}", ha="center", fontsize=8)
    ax.axhline(0.5, color="0.5", ls=":", lw=1)
    ax.set_xticks(x, subsets)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("agreement accuracy")
    ax.set_title("Correct verb number preferred over the wrong one")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_subject_head(
    words: Sequence[str],
    weights: np.ndarray,
    head_scores: np.ndarray,
    best: tuple[int, int],
    query: int,
):
    """Left: every head's mean attention to the subject from the query position that
    predicts the verb (the word before it: the attractor noun in an attractor sentence;
    rows layers, columns heads); right: the chosen head's weights on one sentence, that
    query's row outlined."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1, 2.2]})
    im = ax1.imshow(head_scores, cmap="viridis", vmin=0, vmax=1)
    ax1.set_xticks(range(head_scores.shape[1]), [f"head {h}" for h in range(head_scores.shape[1])])
    ax1.set_yticks(range(head_scores.shape[0]), [f"layer {i}" for i in range(head_scores.shape[0])])
    for (i, j), v in np.ndenumerate(head_scores):
        ax1.text(
            j,
            i,
            f"{v:.2f}",
            ha="center",
            va="center",
            color="white" if v < 0.6 else "black",
            fontsize=9,
        )
    ax1.add_patch(plt.Rectangle((best[1] - 0.5, best[0] - 0.5), 1, 1, fill=False, ec="red", lw=2))
    ax1.set_title(
        "Mean weight from the word before\nthe verb to the subject\n(held-out attractor sentences)",
        fontsize=10,
    )
    fig.colorbar(im, ax=ax1, fraction=0.046)
    im2 = ax2.imshow(weights, cmap="Greys", vmin=0, vmax=1)
    ax2.set_xticks(range(len(words)), words, rotation=60, ha="right", fontsize=8)
    ax2.set_yticks(range(len(words)), words, fontsize=8)
    ax2.add_patch(plt.Rectangle((-0.5, query - 0.5), len(words), 1, fill=False, ec="red", lw=1.5))
    ax2.set_xlabel("key (attended to)")
    ax2.set_ylabel("query")
    ax2.set_title(f"Layer {best[0]}, head {best[1]} on one sentence", fontsize=10)
    fig.colorbar(im2, ax=ax2, fraction=0.046)
    fig.tight_layout()
    return fig


def plot_sampling(temperatures: Sequence[float], rows: Sequence[dict[str, float]]):
    """Grammaticality and diversity of samples against the temperature."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    styles = [
        ("grammatical", "share grammatical", "C0", "o", "-"),
        ("novel", "share of grammatical ones not in training", "C2", "s", "--"),
        ("distinct_2", "distinct bigrams / all bigrams", "C3", "^", ":"),
    ]
    for key, label, color, marker, ls in styles:
        ax.plot(
            temperatures, [r[key] for r in rows], marker=marker, ls=ls, color=color, label=label
        )
    ax.set_xlabel("temperature")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.05)
    ax.set_title("Sampling: grammaticality against diversity")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_gqa(
    names: Sequence[str], cache_bytes: Sequence[int], ce: dict[str, Sequence[float]], floor: float
):
    """Left: cache bytes per token; right: held-out cross-entropy after conversion and
    after uptraining, against the floor."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    bars = ax1.bar(
        names,
        cache_bytes,
        color=["C0", "C1", "C2"][: len(names)],
        hatch=["", "//", ".."][: len(names)],
    )
    for b, v in zip(bars, cache_bytes, strict=True):
        ax1.text(b.get_x() + b.get_width() / 2, v, f"{v} B", ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("KV-cache bytes per token")
    ax1.set_title("Cache memory per generated token")
    ax1.set_ylim(0, max(cache_bytes) * 1.2)
    x = np.arange(len(names))
    width = 0.8 / len(ce)
    for i, (label, vals) in enumerate(ce.items()):
        ax2.bar(
            x + i * width - 0.4 + width / 2,
            vals,
            width,
            label=label,
            hatch=["", "//", ".."][i % 3],
            color=f"C{[0, 1, 2][i % 3]}",
        )
    ax2.axhline(floor, color="black", ls="--", label="entropy floor")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("held-out cross-entropy (nats/token)")
    top = max(max(v) for v in ce.values())
    ax2.set_ylim(floor * 0.9, top * 1.08)
    ax2.set_title("Converted from the trained model")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig
