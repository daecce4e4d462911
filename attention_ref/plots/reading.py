"""Figures of notebooks 09 and 10: where the question looks in the context, and how the
summariser's sentence scores compare with the attention each sentence receives."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from .heatmaps import _to_np


def plot_question_attention(
    weights,
    question: Sequence[str],
    context: Sequence[str],
    span: tuple[int, int],
    *,
    ax=None,
    title: str = "",
):
    """Heatmap of attention from the question tokens (rows) to the context tokens
    (columns), with the answer span ``(start, end)`` (context positions) outlined."""
    w = _to_np(weights)
    if w.shape != (len(question), len(context)):
        raise ValueError(
            f"weights must be (len(question), len(context)) = ({len(question)}, "
            f"{len(context)}); got shape {w.shape}"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(0.28 * len(context) + 2, 0.35 * len(question) + 1.6))
    im = ax.imshow(w, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(1e-9, float(w.max())))
    ax.figure.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="weight")
    ax.set_xticks(range(len(context)), labels=list(context), rotation=90, fontsize=8)
    ax.set_yticks(range(len(question)), labels=list(question), fontsize=9)
    s, e = span
    ax.add_patch(
        Rectangle(
            (s - 0.5, -0.5), e - s + 1, len(question), fill=False, edgecolor="red", linewidth=2
        )
    )
    ax.set_xlabel("context token (answer outlined in red)")
    ax.set_ylabel("question token")
    if title:
        ax.set_title(title)
    return ax


def plot_sentence_scores(
    model_scores,
    attention_scores,
    labels,
    *,
    ax=None,
    title: str = "",
):
    """Bars of each sentence's model score and attention received (each scaled to [0, 1]
    within the document), the reference summary sentences marked with a star."""
    m = _to_np(model_scores).astype(float)
    a = _to_np(attention_scores).astype(float)
    lab = np.asarray(_to_np(labels), dtype=bool)

    def unit(x):
        span = x.max() - x.min()
        return (x - x.min()) / span if span > 0 else np.zeros_like(x)

    if ax is None:
        _, ax = plt.subplots(figsize=(0.8 * len(m) + 2, 3.2))
    i = np.arange(len(m))
    ax.bar(i - 0.2, unit(m), width=0.4, color="tab:blue", label="model score")
    ax.bar(
        i + 0.2,
        unit(a),
        width=0.4,
        color="tab:orange",
        hatch="///",
        edgecolor="black",
        linewidth=0.5,
        label="attention received",
    )
    ref = np.flatnonzero(lab)
    ax.plot(
        ref,
        np.full(len(ref), 1.08),
        linestyle="none",
        marker="*",
        markersize=11,
        color="red",
        label="reference summary",
    )
    ax.set_xticks(i, labels=[f"s{j}" for j in i])
    ax.set_yticks([0.0, 0.5, 1.0])
    ax.set_ylim(0, 1.62)
    ax.set_xlabel("sentence of the document")
    ax.set_ylabel("scaled within the document")
    ax.legend(loc="upper center", ncols=2, fontsize=7, frameon=False, handlelength=1.5)
    if title:
        ax.set_title(title)
    return ax
