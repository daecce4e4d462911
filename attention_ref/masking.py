"""Masks and the masked softmax: notebook 02.

Masks are boolean and True means "may attend", as for the boolean ``attn_mask`` of
``torch.nn.functional.scaled_dot_product_attention``. (``nn.MultiheadAttention``'s
``key_padding_mask`` uses the opposite convention: True there means "ignore".)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ._validate import check_mask, describe, require_tensor


def padding_mask(lengths: torch.Tensor | Sequence[int], max_len: int) -> torch.Tensor:
    """Boolean padding mask ``(batch, max_len)``, True at the real tokens.

    Args:
        lengths: the true length of each sequence, ``(batch,)`` integers, each in
            ``0..max_len``.
        max_len: the padded length.

    Returns:
        ``mask[b, t] = t < lengths[b]``, on the device of ``lengths`` when it is a tensor.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int | np.integer):
        raise TypeError(f"max_len must be an int; got {describe(max_len)}")
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0; got {max_len}")
    if not isinstance(lengths, torch.Tensor):
        arr = np.asarray(lengths)
        if arr.dtype == object or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"lengths must be integers; got {describe(lengths)}")
        lengths = torch.as_tensor(arr, dtype=torch.long)
    if lengths.is_floating_point() or lengths.dtype == torch.bool or lengths.is_complex():
        raise TypeError(f"lengths must have an integer dtype; got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,); got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.max()) > max_len:
        raise ValueError(
            f"lengths must be <= max_len={max_len}; got a length of {int(lengths.max())} "
            f"in lengths {lengths.tolist()}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0; got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]  # (batch, max_len)


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean causal mask ``(n, n)``: True where key ``j <= i``, so query ``i`` sees only
    itself and the past."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise TypeError(f"n must be an int; got {describe(n)}")
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """Softmax of ``scores`` along ``dim`` over the positions the mask allows.

    Args:
        scores: float tensor of any shape.
        mask: bool tensor broadcastable to ``scores.shape`` (True = may attend), or None
            for a plain softmax.
        dim: the dimension to normalise over.

    Returns:
        Weights of the same shape as ``scores``: exactly 0 where the mask is False, summing
        to 1 along ``dim`` wherever at least one position is allowed, and all zero (never
        NaN) where none is. Safe to differentiate, fully masked rows included.
    """
    require_tensor("scores", scores)
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension; got a scalar")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim {dim} is out of range for scores of shape {tuple(scores.shape)}")
    if mask is None:
        return torch.softmax(scores, dim=dim)
    require_tensor("mask", mask, floating=False)
    check_mask(tuple(mask.shape), mask.dtype == torch.bool, tuple(scores.shape))
    filled = scores.masked_fill(~mask, float("-inf"))
    row_max = filled.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(filled - row_max)  # exp(-inf) = 0 at masked positions
    total = e.sum(dim=dim, keepdim=True)
    # Fully masked rows have total 0: divide by 1 instead, leaving zeros and finite grads.
    return e / torch.where(total > 0, total, torch.ones_like(total))
