"""Cross-attention alignment heatmaps for the translation notebook (08)."""

from __future__ import annotations

from collections.abc import Sequence

from .heatmaps import _to_np, plot_attention


def plot_alignment(
    weights,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    *,
    gold: Sequence[int | None] | None = None,
    ax=None,
    title: str = "",
):
    """Cross-attention ``(len(tgt_tokens), len(src_tokens))``: row ``t`` shows which
    source words the decoder reads while it writes target word ``t``. ``gold[t]``, the
    index of the source word that target word ``t`` translates (None for none), is
    marked with a red square."""
    w = _to_np(weights)
    if w.shape != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(
            f"weights must be (len(tgt_tokens), len(src_tokens)) = "
            f"({len(tgt_tokens)}, {len(src_tokens)}); got shape {w.shape}"
        )
    ax = plot_attention(w, list(tgt_tokens), list(src_tokens), ax=ax, title=title, annotate=False)
    ax.set_xlabel("source (English)")
    ax.set_ylabel("target being written (Velish)")
    if gold is not None:
        for t, s in enumerate(gold):
            if s is not None:
                ax.plot(
                    s,
                    t,
                    marker="s",
                    markersize=9,
                    markerfacecolor="none",
                    markeredgecolor="red",
                    markeredgewidth=1.5,
                )
    return ax
