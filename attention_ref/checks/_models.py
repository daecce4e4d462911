"""NumPy models of correct and mistaken attention, used to name a learner's mistake.

Each model takes float64 NumPy inputs and returns what that (possibly buggy) version of
the code would compute. They are deliberately plain: one line of difference each.
"""

from __future__ import annotations

import math

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def masked_softmax(scores: np.ndarray, mask: np.ndarray | None, axis: int = -1) -> np.ndarray:
    """Correct masked softmax (zeros for fully masked rows)."""
    if mask is None:
        return softmax(scores, axis)
    mask = np.broadcast_to(mask, scores.shape)
    filled = np.where(mask, scores, -np.inf)
    m = np.max(filled, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask, np.exp(filled - m), 0.0)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def fill_softmax(scores: np.ndarray, mask: np.ndarray, fill: float, axis: int = -1):
    """Masked softmax by filling masked scores with a big negative number (the -1e9 way):
    a fully masked row comes out uniform instead of zero."""
    return softmax(np.where(np.broadcast_to(mask, scores.shape), scores, fill), axis)


def scores(Q, K, scale: float | None = None):
    d_k = Q.shape[-1]
    s = Q @ np.swapaxes(K, -1, -2)
    return s / (math.sqrt(d_k) if scale is None else scale)


def attention(Q, K, V, mask=None, *, scale=None, axis=-1, mask_mode="correct"):
    """Attention with one knob per mistake.

    mask_mode: "correct", "inverted", "after_softmax" (weights * mask, no renormalising),
    "multiply" (scores * mask, then softmax), "fill" (-1e9 fill: uniform fully masked
    rows), "ignored".
    """
    s = scores(Q, K, scale)
    if mask is None or mask_mode == "ignored":
        w = softmax(s, axis)
    elif mask_mode == "correct":
        w = masked_softmax(s, mask, axis)
    elif mask_mode == "inverted":
        w = masked_softmax(s, ~mask, axis)
    elif mask_mode == "after_softmax":
        w = softmax(s, axis) * mask
    elif mask_mode == "multiply":
        w = softmax(s * mask, axis)
    elif mask_mode == "fill":
        w = fill_softmax(s, mask, -1e9, axis)
    else:  # pragma: no cover - programming error in a check
        raise ValueError(mask_mode)
    return w @ V, w
