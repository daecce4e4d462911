"""Self-attention with learned projections: notebook 03.

A sequence attends to itself: queries, keys and values are all projections of the same
input ``x (..., T, d_in)``::

    Q = x W_Q,   K = x W_K,   V = x W_V,   out = softmax(Q K^T / sqrt(d_k)) V

``W_Q, W_K, W_V`` are ``nn.Linear`` layers without bias named ``w_q, w_k, w_v`` (PyTorch
stores ``w_q.weight`` as ``(d_k, d_in)``, the transpose of ``W_Q``).
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import describe, require_tensor
from .attention import sdpa


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {describe(value)}")
    return value


class SelfAttention(nn.Module):
    """Single-head self-attention with learned query, key and value projections.

    Args:
        d_in: features per input token.
        d_k: features per query and key (the scores are scaled by ``1/sqrt(d_k)``).
        d_v: features per value, hence per output token.

    Parameters: ``w_q = nn.Linear(d_in, d_k, bias=False)``, ``w_k = nn.Linear(d_in, d_k,
    bias=False)``, ``w_v = nn.Linear(d_in, d_v, bias=False)``.

    forward(x ``(..., T, d_in)``, mask bool broadcastable to ``(..., T, T)``, True = may
    attend) returns ``(out (..., T, d_v), weights (..., T, T))``. A query with no allowed
    key gets zero weights and a zero output. Without a mask the module is
    permutation-equivariant: permuting the tokens of ``x`` permutes the rows of ``out``
    (and the rows and columns of ``weights``) the same way.
    """

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.d_in = _positive_int("d_in", d_in)
        self.d_k = _positive_int("d_k", d_k)
        self.d_v = _positive_int("d_v", d_v)
        self.w_q = nn.Linear(d_in, d_k, bias=False)
        self.w_k = nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_tensor("x", x)
        if x.dim() < 2 or x.shape[-1] != self.d_in:
            raise ValueError(f"x must be (..., T, d_in={self.d_in}); got shape {tuple(x.shape)}")
        q = self.w_q(x)  # (..., T, d_k)
        k = self.w_k(x)  # (..., T, d_k)
        v = self.w_v(x)  # (..., T, d_v)
        return sdpa(q, k, v, mask)  # (..., T, d_v), (..., T, T)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_k={self.d_k}, d_v={self.d_v}"


def self_attention_cost(
    n_tokens: int, d_in: int, d_k: int, d_v: int, *, batch: int = 1, bytes_per_float: int = 4
) -> dict[str, int]:
    """Matrix-multiply FLOPs and score-matrix memory of one ``SelfAttention`` forward.

    A product of an ``(m, k)`` by a ``(k, n)`` matrix costs ``2*m*k*n`` FLOPs (one multiply
    and one add per term), the count ``torch.utils.flop_counter.FlopCounterMode`` uses.

    Returns:
        ``projections``: ``2*B*T*d_in*(2*d_k + d_v)`` (Q, K and V: linear in T);
        ``scores``: ``2*B*T*T*d_k`` (Q K^T: quadratic in T);
        ``weighted_sum``: ``2*B*T*T*d_v`` (weights @ V: quadratic in T);
        ``total``: their sum (the softmax's few FLOPs per score are not counted);
        ``score_bytes``: ``B*T*T*bytes_per_float``, the memory of one ``T x T`` weight
        matrix per sequence.
    """
    for name, value in (
        ("n_tokens", n_tokens),
        ("d_in", d_in),
        ("d_k", d_k),
        ("d_v", d_v),
        ("batch", batch),
        ("bytes_per_float", bytes_per_float),
    ):
        _positive_int(name, value)
    B, T = batch, n_tokens
    cost = {
        "projections": 2 * B * T * d_in * (2 * d_k + d_v),
        "scores": 2 * B * T * T * d_k,
        "weighted_sum": 2 * B * T * T * d_v,
    }
    cost["total"] = sum(cost.values())
    cost["score_bytes"] = B * T * T * bytes_per_float
    return cost
