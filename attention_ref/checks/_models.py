"""Float64 models of correct and mistaken attention, used to name a learner's mistake.

Each model returns what one (possibly buggy) version of the code computes. Every knob's
right value is its default, spelled ``"correct"`` where the knob is a string (the one
vocabulary of options of every mistake model of the checks): the mask modes of
:func:`attention_weights` and the norm orders of :func:`sublayer` are written once, here.
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


def attention_weights(s: np.ndarray, mask: np.ndarray | None, axis: int = -1, mask_mode="correct"):
    """The attention weights for the scores ``s``, the mask (True = may attend, broadcast to
    ``s``) applied as ``mask_mode`` says: "correct" (zeros for a fully masked row),
    "inverted", "after_softmax" (weights * mask, no renormalising), "multiply" (scores *
    mask, then softmax), "fill" (-1e9 fill: uniform fully masked rows), "ignored"."""
    if mask is None or mask_mode == "ignored":
        return softmax(s, axis)
    if mask_mode == "correct":
        return masked_softmax(s, mask, axis)
    if mask_mode == "inverted":
        return masked_softmax(s, ~mask, axis)
    if mask_mode == "after_softmax":
        return softmax(s, axis) * mask
    if mask_mode == "multiply":
        return softmax(s * mask, axis)
    if mask_mode == "fill":
        return fill_softmax(s, mask, -1e9, axis)
    raise ValueError(mask_mode)  # pragma: no cover - programming error in a check


def attention(Q, K, V, mask=None, *, scale=None, axis=-1, mask_mode="correct"):
    """Attention ``(out, weights)`` with one knob per mistake: ``scale`` (default
    sqrt(d_k)), the softmax ``axis``, and ``mask_mode`` (see :func:`attention_weights`)."""
    w = attention_weights(scores(Q, K, scale), mask, axis, mask_mode)
    return w @ V, w


def linear(x, P: dict, name: str):
    """``x W^T + b`` with ``P[name + ".weight"]`` (out, in) and ``P[name + ".bias"]`` (or
    None, or absent): an ``nn.Linear`` in float64."""
    b = P.get(f"{name}.bias")
    return x @ P[f"{name}.weight"].T + (0.0 if b is None else b)


#: The orders of a residual sublayer and its norm that the mistake models know.
NORM_ORDERS = ("post", "pre", "sublayer_norm", "residual_normed", "no_norm")


def sublayer(x, f, norm, order: str, *, residual: bool = True, f_input=None):
    """One residual sublayer ``f`` with its norm, as (possibly mistaken) code computes it;
    works on arrays and tensors alike. ``order``: "post" norm(x + f(x)) (the original
    Transformer), "pre" x + f(norm(x)) (GPT), "sublayer_norm" x + norm(f(x)),
    "residual_normed" h + f(h) with h = norm(x), "no_norm" x + f(x).
    ``residual=False`` drops the skip connection (``x +``); ``f_input`` feeds ``f`` (and its
    norm) another tensor than ``x`` (a sublayer given the layer's input)."""
    u = x if f_input is None else f_input

    def add(skip, y):
        return skip + y if residual else y

    if order == "post":
        return norm(add(x, f(u)))
    if order == "pre":
        return add(x, f(norm(u)))
    if order == "sublayer_norm":
        return add(x, norm(f(u)))
    if order == "residual_normed":
        h = norm(u)
        return add(h, f(h))
    if order == "no_norm":
        return add(x, f(u))
    raise ValueError(order)  # pragma: no cover - programming error in a check
