"""FlashAttention's backward pass: notebook 12.

Online-softmax attention (:func:`attention_ref.online_softmax_attention`) never holds the
``n_q x n_k`` matrix of weights in the forward pass. Training also needs the backward pass,
and autograd through naive attention keeps that matrix (the weights ``P``, and the scores) for
it: memory grows as ``n^2`` again. FlashAttention keeps instead, per query, the output ``O``
and the log-sum-exp ``L = m + log(l)`` of its scores, and the backward pass recomputes each
tile's weights from them, ``P = exp(S - L)``. With ``dO`` the gradient of the output
(FlashAttention-2's recipe; ``scale = 1/sqrt(d_k)``):

- ``D = rowsum(dO * O)`` (one number per query, computed once);
- per tile of queries ``I`` and keys ``J``: ``S = scale Q_I K_J^T`` (masked if causal),
  ``P = exp(S - L_I)``, ``dV_J += P^T dO_I``, ``dP = dO_I V_J^T``, ``dS = P * (dP - D_I)``,
  ``dQ_I += scale dS K_J`` and ``dK_J += scale dS^T Q_I``.

``D`` is where the softmax's normalisation went: ``dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)``,
and ``sum_k P_ik dP_ik = sum_k P_ik (dO_i . v_k) = dO_i . O_i``. Tiles entirely in the future
of a causal query block are skipped in both passes.

- :class:`FlashAttention`: the ``torch.autograd.Function`` (``FlashAttention.apply(q, k, v,
  block_size, causal)``);
- :func:`flash_attention`: the same, with keyword arguments and input validation;
- :class:`TinyAttentionLM`: a one-block causal language model whose attention is a function
  passed in, to show that a training step with :class:`FlashAttention` equals one with
  PyTorch's fused attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .efficient import (
    _causal_allowed,
    _online_attention,
    _q_block_size,
    _require_block,
    _require_qkv,
)


def _flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    block_size: int,
    causal: bool,
    q_block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of attention, tile by tile, from the saved ``out (..., n_q, d_v)``
    and ``lse (..., n_q, 1)``; never more than one ``(..., q_block_size, block_size)`` tile
    of scores at a time. The gradients have the broadcast batch shape of the inputs."""
    n_q, n_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    scale = 1.0 / math.sqrt(d_k)
    offset = n_k - n_q  # query i sits at key position i + offset
    q = q * scale  # (..., n_q, d_k), scaled once as in the forward pass
    k_t = k.transpose(-2, -1)  # (..., d_k, n_k), a view
    v_t = v.transpose(-2, -1)  # (..., d_v, n_k), a view
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # D (..., n_q, 1)
    dq = q.new_zeros(*batch, n_q, d_k)
    dk = q.new_zeros(*batch, n_k, d_k)
    dv = q.new_zeros(*batch, n_k, d_v)
    for i0 in range(0, n_q, q_block_size):
        i1 = min(i0 + q_block_size, n_q)
        q_blk = q[..., i0:i1, :]  # (..., bq, d_k)
        do_blk = grad_out[..., i0:i1, :]  # (..., bq, d_v)
        lse_blk, d_blk = lse[..., i0:i1, :], delta[..., i0:i1, :]  # (..., bq, 1)
        dq_blk = dq[..., i0:i1, :]  # (..., bq, d_k), a view: accumulated in place
        j_end = min(n_k, i1 + offset) if causal else n_k
        for j0 in range(0, max(j_end, 0), block_size):
            j1 = min(j0 + block_size, n_k)
            s = q_blk @ k_t[..., j0:j1]  # (..., bq, bk) the tile of scores, again
            if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal
                allowed = _causal_allowed(i0, i1, j0, j1, offset, q.device)  # (bq, bk)
                s.masked_fill_(~allowed, float("-inf"))
            p = s.sub_(lse_blk).exp_()  # (..., bq, bk) the weights P, in place
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_blk  # (..., bk, d_v)
            dp = do_blk @ v_t[..., j0:j1]  # (..., bq, bk)
            ds = p.mul_(dp.sub_(d_blk))  # dS = P * (dP - D), in place of P
            dq_blk += ds @ k[..., j0:j1, :]  # (..., bq, d_k), scaled at the end
            dk[..., j0:j1, :] += ds.transpose(-2, -1) @ q_blk  # q_blk already carries scale
    dq.mul_(scale)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention whose forward pass is online-softmax attention over tiles and whose backward
    pass recomputes each tile's weights from the saved output and log-sum-exp.

    ``FlashAttention.apply(q, k, v, block_size=64, causal=False, q_block_size=None)`` with
    ``q (..., n_q, d_k)``, ``k (..., n_k, d_k)``, ``v (..., n_k, d_v)`` returns
    ``out (..., n_q, d_v)``, equal to scaled dot-product attention; ``causal`` and
    ``q_block_size`` as in :func:`attention_ref.online_softmax_attention`. For the backward
    pass it saves ``q``, ``k``, ``v`` (the inputs, no copies), ``out`` and
    ``lse (..., n_q, 1)``: memory linear in ``n``, where autograd through naive attention
    keeps ``n_q x n_k`` weights per head.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_size: int = 64,
        causal: bool = False,
        q_block_size: int | None = None,
    ) -> torch.Tensor:
        _require_qkv(q, k, v)
        block_size = _require_block("block_size", block_size)
        q_block_size = _q_block_size(q.shape[-2], block_size, causal, q_block_size)
        out, lse = _online_attention(q, k, v, block_size, causal, q_block_size)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_size, ctx.causal, ctx.q_block_size = block_size, bool(causal), q_block_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(
            q, k, v, out, lse, grad_out, ctx.block_size, ctx.causal, ctx.q_block_size
        )
        # Batch dimensions that were broadcast get their gradients summed.
        return (
            dq.sum_to_size(q.shape),
            dk.sum_to_size(k.shape),
            dv.sum_to_size(v.shape),
            None,
            None,
            None,
        )


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int = 64,
    causal: bool = False,
    *,
    q_block_size: int | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with FlashAttention's memory: ``out (..., n_q, d_v)``,
    differentiable, holding no ``n_q x n_k`` tensor in the forward or the backward pass.

    Args:
        q: queries ``(..., n_q, d_k)``; k: keys ``(..., n_k, d_k)``; v: values
            ``(..., n_k, d_v)``; batch dimensions broadcast.
        block_size: keys per tile.
        causal: query ``i`` sees key ``j <= i + (n_k - n_q)``; future tiles are skipped in
            both passes. A query that sees no key gets output 0 and zero gradients.
        q_block_size: queries per tile (default: ``block_size`` when causal, else up to 256).
    """
    _require_qkv(q, k, v)
    _require_block("block_size", block_size)
    return FlashAttention.apply(q, k, v, block_size, causal, q_block_size)


class TinyAttentionLM(nn.Module):
    """A one-block causal language model: embeddings (tokens and positions), one multi-head
    self-attention with a residual connection, a linear read-out. ``attention(q, k, v)``
    (heads ``(B, H, T, d_head)``, causal) is passed in, so that the same weights can be
    trained with different attention implementations and the steps compared.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        max_len: int,
        attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.attention = n_heads, attention
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids (B, T)`` -> logits ``(B, T, vocab_size)``."""
        B, T = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))  # (B, T, D)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, T, D)
        q, k, v = (
            t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v)
        )  # (B, H, T, d)
        a = self.attention(q, k, v)  # (B, H, T, d)
        x = x + self.w_o(a.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)
        return self.head(x)
