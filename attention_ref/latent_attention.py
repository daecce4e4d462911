"""Multi-head latent attention (DeepSeek-V2 and V3): notebook 15.

Grouped-query attention shrinks the cache by sharing keys and values between heads;
latent attention compresses them instead. Each token's input ``x`` is projected to one
low-rank *latent* ``c_kv = RMSNorm(W_dkv x)`` (``kv_lora_rank`` numbers, e.g. 512 for
``n_heads * d_head = 16384``) from which every head's key and value are *decompressed*::

    k_nope[h] = W_uk[h] c_kv        v[h] = W_uv[h] c_kv

Rotary positions cannot pass through the compression (a rotation between ``W_uk`` and the
query would depend on the positions), so a separate, small *decoupled rotary key*
``k_rope = rope(W_kr x)`` (``d_rope`` numbers) is shared by all heads, and each query has a
rotary part too::

    score[h] = (q_nope[h] . k_nope[h] + q_rope[h] . k_rope) / sqrt(d_nope + d_rope)

The queries may go through their own low-rank bottleneck: ``q = W_uq RMSNorm(W_dq x)``
(``q_lora_rank``; None: one matrix ``W_q``). The cache holds only ``c_kv`` and ``k_rope``:
``kv_lora_rank + d_rope`` numbers per token and layer, whatever the number of heads.

**The absorbed form** (for decoding): ``q_nope[h] . (W_uk[h] c_kv) = (W_uk[h]^T q_nope[h])
. c_kv``, so each query is mapped into the latent space once and attends to the cached
latents directly; and ``W_o[h] (sum_j a_j W_uv[h] c_kv_j) = (W_o[h] W_uv[h]) (sum_j a_j
c_kv_j)``: ``W_uv`` folds into the output projection. No key or value is ever
decompressed. :meth:`MultiHeadLatentAttention.step` computes it that way (the scores with
:func:`absorbed_scores`, an exercise of notebook 15); it equals the explicit form
(:meth:`~MultiHeadLatentAttention.forward`).

Parameter names follow DeepSeek's: ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/
``q_b_proj``; ``kv_a_proj_with_mqa`` (``x -> [c_kv, k_rope]``), ``kv_a_layernorm``,
``kv_b_proj`` (``c_kv -> [k_nope, v]`` per head), ``o_proj``.
Rotary pairs are adjacent (:func:`~attention_ref.positional.rope`), as DeepSeek-V3's
``rope_interleave=True``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import describe, require_tensor
from .attention import sdpa
from .masking import masked_softmax
from .modern import RMSNorm
from .positional import rope
from .sliding_window import RollingKVCache, sliding_window_mask


def _positive(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int; got {describe(n)}")
    return n


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention.

    Args:
        d_model: model width ``D``.
        n_heads: ``H``.
        kv_lora_rank: ``r``, the width of the latent ``c_kv``.
        d_nope: per-head width of the query and key parts without positions.
        d_rope: width of the rotary parts (the shared key, each query's).
        d_v: per-head width of the values.
        q_lora_rank: width of the queries' bottleneck, or None (one matrix).

    forward(x ``(B, T, D)``, mask optional bool broadcastable to ``(B, 1, T, T)``) returns
    ``(out (B, T, D), weights (B, H, T, T))``. :meth:`step` (absorbed form) caches only
    ``c_kv`` and ``k_rope`` in a :class:`~attention_ref.sliding_window.RollingKVCache`
    (:meth:`new_cache`; ``k`` slot: ``(B, 1, T, r)``, ``v`` slot: ``(B, 1, T, d_rope)``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_lora_rank: int,
        d_nope: int,
        d_rope: int,
        d_v: int,
        q_lora_rank: int | None = None,
        *,
        base: float = 10000.0,
        eps: float = 1e-6,
        bias: bool = False,
    ) -> None:
        """``bias``: on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` (DeepSeek's
        ``attention_bias``); ``q_proj``, ``q_b_proj`` and ``kv_b_proj`` never have one."""
        super().__init__()
        for name, n in (("d_model", d_model), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                        ("d_nope", d_nope), ("d_rope", d_rope), ("d_v", d_v)):  # fmt: skip
            _positive(name, n)
        if d_rope % 2:
            raise ValueError(f"d_rope must be even (rotary pairs); got {d_rope}")
        self.d_model, self.n_heads, self.r = d_model, n_heads, kv_lora_rank
        self.d_nope, self.d_rope, self.d_v, self.base = d_nope, d_rope, d_v, float(base)
        d_q = d_nope + d_rope
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, n_heads * d_q, bias=False)  # as DeepSeek
        else:
            self.q_a_proj = nn.Linear(d_model, _positive("q_lora_rank", q_lora_rank), bias=bias)
            self.q_a_layernorm = RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, n_heads * d_q, bias=False)
        self.q_lora_rank = q_lora_rank
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + d_rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, n_heads * (d_nope + d_v), bias=False)
        self.o_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)

    window = None  # full attention (for models that ask their layers for a window)

    def new_cache(self, max_len: int) -> RollingKVCache:
        """A cache for :meth:`step`: ``c_kv`` and ``k_rope`` of up to ``max_len`` positions
        (a ring that never wraps: it keeps each position's slot and padding flag)."""
        return RollingKVCache(max_len)

    # -- the pieces
    def queries(self, x: torch.Tensor, positions: torch.Tensor):
        """``q_nope (B, H, T, d_nope)`` and rotated ``q_rope (B, H, T, d_rope)``."""
        B, T, _ = x.shape
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (B, T, H * d_q)
        q = q.view(B, T, self.n_heads, self.d_nope + self.d_rope).transpose(1, 2)  # (B,H,T,d_q)
        q_nope, q_rope = q.split([self.d_nope, self.d_rope], dim=-1)
        return q_nope, rope(q_rope, positions, self.base)

    def latents(self, x: torch.Tensor, positions: torch.Tensor):
        """What the cache holds: ``c_kv (B, T, r)`` (normalised) and the rotated shared key
        ``k_rope (B, T, d_rope)``."""
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.r, self.d_rope], dim=-1)
        if positions.dim() == 3:  # (B, 1, T), per sequence: k_rope has no head axis
            positions = positions[:, 0]  # (B, T)
        return self.kv_a_layernorm(c_kv), rope(k_rope, positions, self.base)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_uk (H, d_nope, r)`` and ``W_uv (H, d_v, r)``, the rows of ``kv_b_proj``."""
        w = self.kv_b_proj.weight.view(self.n_heads, self.d_nope + self.d_v, self.r)
        return w[:, : self.d_nope], w[:, self.d_nope :]

    # -- the explicit form
    def forward(self, x: torch.Tensor, mask=None, positions=None):
        require_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}"
            )
        B, T, _ = x.shape
        pos = torch.arange(T, device=x.device) if positions is None else positions
        q_nope, q_rope = self.queries(x, pos)
        c_kv, k_rope = self.latents(x, pos)  # (B, T, r), (B, T, d_rope)
        kv = self.kv_b_proj(c_kv).view(B, T, self.n_heads, self.d_nope + self.d_v)
        k_nope, v = kv.transpose(1, 2).split([self.d_nope, self.d_v], dim=-1)  # (B, H, T, .)
        k_rope = k_rope[:, None].expand(B, self.n_heads, T, self.d_rope)  # shared by heads
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, d_nope + d_rope)
        k = torch.cat([k_nope, k_rope], dim=-1)
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if mask is not None:
            allowed = allowed & mask
        out, weights = sdpa(q, k, v, allowed)  # (B, H, T, d_v), sdpa scales by 1/sqrt(d_q)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), weights

    # -- the absorbed form, with the cache
    def step(
        self,
        x_new: torch.Tensor,
        cache: RollingKVCache,
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``t`` new positions ``x_new (B, t, D)`` over the cached latents and themselves,
        in the absorbed form; their ``c_kv`` and ``k_rope`` go into ``cache`` (a
        :class:`~attention_ref.sliding_window.RollingKVCache` as long as the text:
        :meth:`new_cache`). ``keep`` (optional bool ``(B, t)``): which new positions are
        real tokens; ``positions`` (optional ``(t,)`` or ``(B, 1, t)``): their rotary
        positions, default their slots."""
        B, t, _ = x_new.shape
        start = len(cache)
        q_pos = torch.arange(start, start + t, device=x_new.device)  # (t,): the slots
        pos = q_pos if positions is None else positions
        q_nope, q_rope = self.queries(x_new, pos)  # (B, H, t, d_nope), (B, H, t, d_rope)
        c_new, k_rope_new = self.latents(x_new, pos)  # (B, t, r), (B, t, d_rope)
        c_kv, k_rope, k_pos, keep_all = cache.append(c_new[:, None], k_rope_new[:, None], keep)
        # c_kv (B, 1, n, r), k_rope (B, 1, n, d_rope): one "head", shared by all
        W_uk, W_uv = self.up_weights()  # (H, d_nope, r), (H, d_v, r)
        # looked up when called: notebook 15 puts the learner's absorbed_scores in its place
        scores = absorbed_scores(q_nope, q_rope, c_kv[:, 0], k_rope[:, 0], W_uk)  # (B, H, t, n)
        allowed = sliding_window_mask(q_pos, k_pos, None, keep_all)  # (B, 1, t, n): causal
        weights = masked_softmax(scores, allowed)  # (B, H, t, n); a fully masked row: zeros
        out_latent = weights @ c_kv  # (B, H, t, r): values never decompressed
        W_o = self.o_proj.weight.view(self.d_model, self.n_heads, self.d_v)  # (D, H, d_v)
        W_ov = torch.einsum("dhv,hvr->dhr", W_o, W_uv)  # (D, H, r): W_uv folded into W_o
        out = torch.einsum("bhtr,dhr->btd", out_latent, W_ov)  # (B, t, D)
        return out if self.o_proj.bias is None else out + self.o_proj.bias


def absorbed_scores(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    c_kv: torch.Tensor,
    k_rope: torch.Tensor,
    w_uk: torch.Tensor,
) -> torch.Tensor:
    """Latent attention's scores in the absorbed form: no key is ever decompressed.

    Args:
        q_nope: the queries' parts without positions ``(B, H, t, d_nope)``.
        q_rope: their rotary parts, already rotated, ``(B, H, t, d_rope)``.
        c_kv: the latents of the ``n`` keys ``(B, n, r)``.
        k_rope: the decoupled rotary key of each, already rotated, ``(B, n, d_rope)``;
            shared by every head.
        w_uk: the keys' up-projection ``(H, d_nope, r)``: head ``h``'s key part without
            positions would be ``w_uk[h] @ c_kv[b, j]``.

    Returns:
        ``(B, H, t, n)``: ``(q_nope[h] . (w_uk[h] c_kv_j) + q_rope[h] . k_rope_j) /
        sqrt(d_nope + d_rope)``, computed as ``(w_uk[h]^T q_nope[h]) . c_kv_j``: each
        query is mapped into the latent space once (``w_uk`` absorbed into it).
    """
    for name, t, dims in (("q_nope", q_nope, 4), ("q_rope", q_rope, 4), ("c_kv", c_kv, 3),
                          ("k_rope", k_rope, 3), ("w_uk", w_uk, 3)):  # fmt: skip
        require_tensor(name, t)
        if t.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimensions; got shape {tuple(t.shape)}")
    B, H, t, d_nope = q_nope.shape
    n, r = c_kv.shape[1], c_kv.shape[2]
    d_rope = q_rope.shape[-1]
    if (
        q_rope.shape[:3] != (B, H, t)
        or c_kv.shape[0] != B
        or k_rope.shape != (B, n, d_rope)
        or w_uk.shape != (H, d_nope, r)
    ):
        raise ValueError(
            "expected q_nope (B, H, t, d_nope), q_rope (B, H, t, d_rope), c_kv (B, n, r), "
            f"k_rope (B, n, d_rope) and w_uk (H, d_nope, r); got {tuple(q_nope.shape)}, "
            f"{tuple(q_rope.shape)}, {tuple(c_kv.shape)}, {tuple(k_rope.shape)} and "
            f"{tuple(w_uk.shape)}"
        )
    q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, t, r): w_uk absorbed
    scores = q_latent @ c_kv[:, None].transpose(-1, -2)  # (B, H, t, n): against the latents
    scores = scores + q_rope @ k_rope[:, None].transpose(-1, -2)  # the shared rotary key
    return scores * (d_nope + d_rope) ** -0.5


def cache_values_per_token(
    n_layers: int,
    *,
    n_heads: int | None = None,
    d_head: int | None = None,
    n_kv_heads: int | None = None,
    kv_lora_rank: int | None = None,
    d_rope: int | None = None,
) -> int:
    """Numbers cached per token: multi-head (``2 * n_heads * d_head``), grouped-query
    (``2 * n_kv_heads * d_head``) or latent attention (``kv_lora_rank + d_rope``), times
    ``n_layers``; whichever the arguments describe."""
    if kv_lora_rank is not None:
        return n_layers * (kv_lora_rank + (d_rope or 0))
    heads = n_kv_heads if n_kv_heads is not None else n_heads
    if heads is None or d_head is None:
        raise ValueError("give n_heads (or n_kv_heads) and d_head, or kv_lora_rank and d_rope")
    return n_layers * 2 * heads * d_head


def cache_bytes_table(
    n_layers: int,
    n_heads: int,
    d_head: int,
    n_kv_heads: int,
    kv_lora_rank: int,
    d_rope: int,
    bytes_per_value: int = 2,
) -> list[dict[str, object]]:
    """Cache bytes per token of one model shape under MHA, GQA and MLA (table-ready rows
    ``{"attention", "values", "bytes", "vs_mha"}``)."""
    rows = []
    for name, kw in (
        ("MHA", dict(n_heads=n_heads, d_head=d_head)),
        ("GQA", dict(n_kv_heads=n_kv_heads, d_head=d_head)),
        ("MLA", dict(kv_lora_rank=kv_lora_rank, d_rope=d_rope)),
    ):
        values = cache_values_per_token(n_layers, **kw)
        rows.append({"attention": name, "values": values, "bytes": values * bytes_per_value})
    for row in rows:
        row["vs_mha"] = row["bytes"] / rows[0]["bytes"]
    return rows


__all__ = [
    "MultiHeadLatentAttention",
    "absorbed_scores",
    "cache_values_per_token",
    "cache_bytes_table",
]
