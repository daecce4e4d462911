"""Input validation shared by the reference functions.

Every error names the argument, the shape (or type) seen and what was expected, so a
learner who passes the wrong thing to a reference function learns what to fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def describe(x: Any) -> str:
    """A short description of ``x``: its type, shape and dtype where it has them."""
    if isinstance(x, torch.Tensor):
        return f"Tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    if isinstance(x, np.ndarray):
        return f"ndarray of shape {x.shape} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"[:120]


def require_tensor(name: str, x: Any, *, floating: bool = True) -> torch.Tensor:
    """Raise TypeError unless ``x`` is a torch Tensor (of a floating dtype if asked)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {describe(x)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float32 or float64); got {x.dtype}")
    return x


def require_array(name: str, x: Any) -> np.ndarray:
    """Convert ``x`` to a floating ndarray, or raise TypeError naming ``name``."""
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a NumPy array, not a torch.Tensor (use the torch version)")
    arr = np.asarray(x)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise TypeError(f"{name} must be an array of numbers; got {describe(x)}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    return arr


def require_rank(name: str, shape: tuple[int, ...], min_rank: int, layout: str) -> None:
    """Raise ValueError if ``shape`` has fewer than ``min_rank`` dimensions."""
    if len(shape) < min_rank:
        raise ValueError(
            f"{name} must have at least {min_rank} dimensions {layout}; got shape {tuple(shape)}"
        )


def check_qkv(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...]) -> None:
    """Check the shapes of attention inputs ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``,
    ``v (..., n_k, d_v)``, including that their batch dimensions broadcast."""
    require_rank("q", q_shape, 2, "(..., n_q, d_k)")
    require_rank("k", k_shape, 2, "(..., n_k, d_k)")
    require_rank("v", v_shape, 2, "(..., n_k, d_v)")
    if q_shape[-1] != k_shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension d_k; got q {tuple(q_shape)} "
            f"(d_k={q_shape[-1]}) and k {tuple(k_shape)} (d_k={k_shape[-1]})"
        )
    if k_shape[-2] != v_shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys n_k (dimension -2); got k "
            f"{tuple(k_shape)} and v {tuple(v_shape)}"
        )
    try:
        np.broadcast_shapes(q_shape[:-2], k_shape[:-2], v_shape[:-2])
    except ValueError:
        raise ValueError(
            f"the batch dimensions of q, k and v must broadcast; got q {tuple(q_shape)}, "
            f"k {tuple(k_shape)}, v {tuple(v_shape)}"
        ) from None


def check_mask(
    mask_shape: tuple[int, ...], mask_is_bool: bool, scores_shape: tuple[int, ...], name="mask"
) -> None:
    """Check that a mask is boolean and broadcasts to ``scores_shape`` without growing it."""
    if not mask_is_bool:
        raise TypeError(
            f"{name} must be boolean (True = may attend); got a non-boolean mask. "
            "Convert an additive mask with `mask = additive == 0`, or a 0/1 mask with "
            "`mask.bool()`"
        )
    try:
        out = np.broadcast_shapes(tuple(mask_shape), tuple(scores_shape))
    except ValueError:
        out = None
    if out is None or tuple(out) != tuple(scores_shape):
        raise ValueError(
            f"{name} of shape {tuple(mask_shape)} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)} (..., n_q, n_k)"
        )
