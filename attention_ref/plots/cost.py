"""How the cost of self-attention grows with the sequence length (notebook 03): FLOPs split
into the part linear in T (the projections) and the part quadratic in T (the score matrix
and the weighted sum), and the memory of the ``T x T`` weight matrix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

_KEYS = ("projections", "scores", "weighted_sum", "total", "score_bytes")


def plot_attention_cost(
    n_tokens: Sequence[int],
    costs: Sequence[Mapping[str, int]],
    *,
    memory_limit_bytes: float | None = None,
    axes=None,
):
    """Two log-log panels: FLOPs against T, and score-matrix memory against T.

    Args:
        n_tokens: the sequence lengths ``T``, increasing.
        costs: one dict per ``T`` as returned by ``attention_ref.self_attention_cost``
            (keys ``projections``, ``scores``, ``weighted_sum``, ``total``,
            ``score_bytes``).
        memory_limit_bytes: draw a horizontal line at this memory (e.g. a GPU's memory).
        axes: two matplotlib axes to draw on (default: a new figure).

    Returns:
        The two axes.
    """
    T = np.asarray(n_tokens, dtype=np.float64)
    if T.ndim != 1 or T.size < 2 or np.any(T <= 0) or np.any(np.diff(T) <= 0):
        raise ValueError(
            f"n_tokens must be at least two increasing positive lengths; got {list(n_tokens)}"
        )
    if len(costs) != T.size:
        raise ValueError(f"costs must have one dict per length ({T.size}); got {len(costs)}")
    for i, c in enumerate(costs):
        missing = [k for k in _KEYS if k not in c]
        if missing:
            raise ValueError(f"costs[{i}] lacks {missing}; use attention_ref.self_attention_cost")
    get = {k: np.array([c[k] for c in costs], dtype=np.float64) for k in _KEYS}
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_f, ax_m = axes

    ax_f.loglog(T, get["total"], "k-", lw=2, label="total")
    ax_f.loglog(T, get["projections"], "o--", label="projections Q, K, V  (∝ T)")
    ax_f.loglog(T, get["scores"] + get["weighted_sum"], "s--", label="QKᵀ and weights·V  (∝ T²)")
    cross = np.nonzero(get["scores"] + get["weighted_sum"] >= get["projections"])[0]
    if cross.size and cross[0] > 0:
        ax_f.axvline(T[cross[0]], color="grey", lw=0.8, ls=":")
    ax_f.set_xlabel("sequence length T")
    ax_f.set_ylabel("FLOPs per forward")
    ax_f.set_title("compute")
    ax_f.legend(fontsize=8)

    ax_m.loglog(T, get["score_bytes"], "s-", color="C3", label="weights (T × T)")
    if memory_limit_bytes is not None:
        ax_m.axhline(memory_limit_bytes, color="grey", ls=":", label="memory limit")
    ax_m.set_xlabel("sequence length T")
    ax_m.set_ylabel("bytes")
    ax_m.set_title("memory of the score matrix")
    ax_m.legend(fontsize=8)
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    return axes
