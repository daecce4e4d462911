"""Scaled dot-product attention: notebook 01.

``softmax_np`` and ``sdpa_np`` are the NumPy versions; ``sdpa`` is the batched PyTorch one.
All follow the course conventions: masks are boolean with True = may attend, and a query
whose keys are all masked gets all-zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._validate import check_mask, check_qkv, require_array, require_tensor
from .masking import masked_softmax


def softmax_np(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax of ``x`` along ``axis``.

    Args:
        x: array of any shape.
        axis: the axis whose entries become a probability distribution.

    Returns:
        An array of the same shape whose entries along ``axis`` are positive and sum to 1.
        Subtracting the maximum first means ``exp`` never overflows, even for logits of 1000.
    """
    x = require_array("x", x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension; got a scalar")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for x of shape {x.shape}")
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def sdpa_np(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention in NumPy.

    Args:
        Q: queries ``(..., n_q, d_k)``.
        K: keys ``(..., n_k, d_k)``.
        V: values ``(..., n_k, d_v)``.
        mask: optional boolean array broadcastable to ``(..., n_q, n_k)``; True = may attend.

    Returns:
        ``(out, weights)`` with ``out (..., n_q, d_v)`` and ``weights (..., n_q, n_k)``,
        ``weights = softmax(Q K^T / sqrt(d_k))`` over the keys. A fully masked query row
        gets zero weights and a zero output.
    """
    Q, K, V = require_array("Q", Q), require_array("K", K), require_array("V", V)
    check_qkv(Q.shape, K.shape, V.shape)
    d_k = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)  # (..., n_q, n_k)
    if mask is None:
        weights = softmax_np(scores, axis=-1)
    else:
        mask = np.asarray(mask)
        check_mask(mask.shape, mask.dtype == np.bool_, scores.shape)
        filled = np.where(mask, scores, -np.inf)
        row_max = np.max(filled, axis=-1, keepdims=True)
        row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # fully masked rows
        e = np.where(mask, np.exp(filled - row_max), 0.0)
        total = np.sum(e, axis=-1, keepdims=True)
        weights = e / np.where(total > 0, total, 1.0)
    weights = weights.astype(scores.dtype, copy=False)
    return weights @ V, weights


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched scaled dot-product attention in PyTorch.

    Args:
        q: queries ``(..., n_q, d_k)``.
        k: keys ``(..., n_k, d_k)``.
        v: values ``(..., n_k, d_v)``.
        mask: optional bool tensor broadcastable to ``(..., n_q, n_k)``; True = may attend
            (the convention of the boolean ``attn_mask`` of
            ``torch.nn.functional.scaled_dot_product_attention``).

    Returns:
        ``(out, weights)``: ``out (..., n_q, d_v)``, ``weights (..., n_q, n_k)``. Device and
        dtype follow ``q``. A fully masked query row gets zero weights and a zero output.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    check_qkv(tuple(q.shape), tuple(k.shape), tuple(v.shape))
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., n_q, n_k)
    if mask is not None:
        require_tensor("mask", mask, floating=False)
        check_mask(tuple(mask.shape), mask.dtype == torch.bool, tuple(scores.shape))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)  # (..., n_q, n_k)
    else:  # notebook 02's grading edition runs the learner's masked_softmax here
        weights = masked_softmax(scores, mask, dim=-1)  # (..., n_q, n_k)
    return weights @ v, weights
