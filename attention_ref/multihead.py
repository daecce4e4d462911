"""Multi-head attention: notebook 04.

Shapes: batch first. ``d_model = n_heads * d_head``; head ``h`` owns features
``h*d_head .. (h+1)*d_head - 1`` of the projected queries, keys and values.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import require_tensor
from .attention import sdpa


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(B, T, D) -> (B, H, T, D/H)``; head ``h`` gets features ``h*D/H .. (h+1)*D/H - 1``."""
    require_tensor("x", x, floating=False)
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, seq, d_model); got shape {tuple(x.shape)}")
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(f"d_model={D} (x.shape[-1]) is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, D/H)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d_head) -> (B, T, H*d_head)``: the exact inverse of ``split_heads``."""
    require_tensor("x", x, floating=False)
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    B, H, T, d_head = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d_head)  # (B, T, H*d_head)


def _check_sizes(d_model: int, n_heads: int) -> None:
    for name, n in (("d_model", d_model), ("n_heads", n_heads)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int; got {n!r}")
    if d_model % n_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets "
            "d_model // n_heads features, so d_model must be a multiple of n_heads"
        )


def check_mha_inputs(
    d_model: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor | None:
    """Validate the inputs of a multi-head attention (each ``(batch, seq, d_model)``) and
    return the mask ready for the heads: a ``(B, n_q, n_k)`` mask gets a head axis,
    ``(B, 1, n_q, n_k)``; other masks are returned as they are."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        require_tensor(name, t)
        if t.dim() != 3 or t.shape[-1] != d_model:
            raise ValueError(
                f"{name} must be (batch, seq, d_model={d_model}); got shape {tuple(t.shape)}"
            )
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)  # (B, n_q, n_k) -> (B, 1, n_q, n_k): same for every head
    return mask


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate ``W_Q, W_K, W_V`` of size ``d_model x d_model``
    and an output projection ``W_O``.

    forward(query ``(B, n_q, d_model)``, key ``(B, n_k, d_model)``, value
    ``(B, n_k, d_model)``, mask bool broadcastable to ``(B, H, n_q, n_k)``, True = may
    attend) returns ``(out (B, n_q, d_model), weights (B, H, n_q, n_k))``.

    ``dropout`` is attention-weight dropout, as in ``nn.MultiheadAttention``: in training
    mode each weight is zeroed with probability ``dropout`` after the softmax (the kept ones
    scaled by ``1 / (1 - dropout)``) and the values are averaged with those dropped weights.
    The returned ``weights`` are the ones used, i.e. AFTER dropout, which is PyTorch's
    choice too (``nn.MultiheadAttention`` returns its dropped weights in training mode). In
    eval mode, or with ``dropout=0.0`` (the default), nothing is dropped and each row of
    ``weights`` sums to 1 (0 for a fully masked row).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        _check_sizes(d_model, n_heads)
        if not isinstance(bias, bool):
            raise TypeError(
                f"bias must be a bool; got {bias!r}. The third positional argument is bias: "
                f"for attention dropout write MultiHeadAttention(d_model, n_heads, "
                f"dropout={bias!r})"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, int | float):
            raise TypeError(f"dropout must be a float in [0, 1); got {dropout!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout!r}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.attn_dropout = nn.Dropout(float(dropout))  # on the weights, after the softmax

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = check_mha_inputs(self.d_model, query, key, value, mask)
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, n_q, d_head)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, n_k, d_head)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, n_k, d_head)
        out, weights = sdpa(q, k, v, mask)  # (B, H, n_q, d_head), (B, H, n_q, n_k)
        if self.training and self.attn_dropout.p > 0:
            weights = self.attn_dropout(weights)  # dropped and rescaled, as PyTorch does
            out = weights @ v  # (B, H, n_q, d_head): the values under the dropped weights
        return self.w_o(merge_heads(out)), weights

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same embed_dim for q, k,
        v; no bias_k/bias_v). Its packed ``in_proj_weight`` stacks W_Q, W_K, W_V as rows.
        Its attention dropout probability and training mode are copied too, so the two agree
        exactly in eval mode (in training mode they draw different dropout masks).
        """
        if not mha._qkv_same_embed_dim or mha.bias_k is not None:
            raise ValueError(
                "from_torch supports nn.MultiheadAttention with kdim = vdim = "
                "embed_dim and add_bias_kv=False"
            )
        bias = mha.in_proj_bias is not None
        new = cls(mha.embed_dim, mha.num_heads, bias=bias, dropout=float(mha.dropout))
        new = new.to(device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3, dim=0)  # 3 x (D, D)
        with torch.no_grad():
            for lin, w in ((new.w_q, w_q), (new.w_k, w_k), (new.w_v, w_v)):
                lin.weight.copy_(w)
            new.w_o.weight.copy_(mha.out_proj.weight)
            if bias:
                b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
                for lin, b in ((new.w_q, b_q), (new.w_k, b_k), (new.w_v, b_v)):
                    lin.bias.copy_(b)
                new.w_o.bias.copy_(mha.out_proj.bias)
        return new.train(mha.training)


def mask_from_key_padding(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Turn ``nn.MultiheadAttention``'s ``key_padding_mask`` into this course's mask.

    PyTorch's ``key_padding_mask`` is ``(B, n_k)`` with **True = padding, ignore this
    key**; the course's masks mean the opposite (True = may attend). Returns a bool mask
    ``(B, 1, 1, n_k)`` that broadcasts over heads and queries.
    """
    require_tensor("key_padding_mask", key_padding_mask, floating=False)
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError(
            "key_padding_mask must be a bool tensor (batch, n_k), True = padding; got "
            f"{key_padding_mask.dtype} of shape {tuple(key_padding_mask.shape)}"
        )
    return ~key_padding_mask[:, None, None, :]  # (B, 1, 1, n_k), True = may attend


class SharedHeadProjectionAttention(nn.Module):
    """The widely copied NON-standard variant, for comparison only.

    It splits the *input* into ``n_heads`` slices first and applies one
    ``d_head x d_head`` projection, shared by all heads, to each slice. Head ``h``
    therefore sees only input features ``h*d_head .. (h+1)*d_head - 1``, and all heads
    use the same ``W_Q, W_K, W_V``. Same interface as :class:`MultiHeadAttention`:
    forward returns ``(out (B, n_q, d_model), weights (B, H, n_q, n_k))``.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        _check_sizes(d_model, n_heads)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(self.d_head, self.d_head, bias=bias)  # shared by every head
        self.w_k = nn.Linear(self.d_head, self.d_head, bias=bias)
        self.w_v = nn.Linear(self.d_head, self.d_head, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, n_q, n_k) -> (B, 1, n_q, n_k)
        q = self.w_q(split_heads(query, self.n_heads))  # split first: (B, H, n_q, d_head)
        k = self.w_k(split_heads(key, self.n_heads))  # (B, H, n_k, d_head)
        v = self.w_v(split_heads(value, self.n_heads))  # (B, H, n_k, d_head)
        out, weights = sdpa(q, k, v, mask)  # (B, H, n_q, d_head), (B, H, n_q, n_k)
        return self.w_o(merge_heads(out)), weights
