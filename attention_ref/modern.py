"""The modern decoder: notebook 13.

Today's open-weight models (Llama, Qwen, Mistral, Gemma) are the GPT of notebook 11 with a
handful of changes, each a small module here:

- :class:`RMSNorm`: ``x / sqrt(mean(x^2) + eps) * weight``: no mean subtracted, no shift;
  the epsilon inside the square root, as the Llama family computes it;
- :class:`SwiGLU`: the gated feed-forward ``w_down(silu(w_gate(x)) * w_up(x))``, no biases;
  its hidden size defaults to ``8 * d_model // 3`` (2/3 of the usual ``4 d``), so it has
  as many weights as a ReLU feed-forward of hidden size ``4 d``;
- :class:`RotaryAttention`: causal self-attention with rotary positions applied to the
  queries and keys of each head (notebook 05's :func:`~attention_ref.positional.rope`,
  which rotates *adjacent* pairs of features) and grouped-query heads (notebook 11);
- :class:`ModernBlock` and :class:`ModernGPT`: the pre-norm block and the decoder-only model
  built from them, with a key-value cache for generation (:meth:`ModernGPT.step`, used by
  :func:`~attention_ref.sampling.generate`).

Shapes: batch first; token ids ``(B, T)``; heads ``(B, H, T, d_head)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ._validate import describe, require_tensor
from .gpt import GroupedQueryAttention
from .positional import rope
from .weights import is_a, with_weights_of


def _positive_int(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int; got {describe(n)}")
    return n


# ----------------------------------------------------------------------------- RMSNorm
class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019)::

        y = x / sqrt(mean(x^2 over the last axis) + eps) * weight

    Unlike LayerNorm no mean is subtracted and there is no shift (bias). The statistic is
    computed in at least float32 (a float16 input is normalised in float32, then cast back).

    Attribute ``weight`` ``(d_model,)``, initialised to ones.
    forward(x ``(..., d_model)``) returns ``(..., d_model)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        _positive_int("d_model", d_model)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or eps < 0:
            raise ValueError(f"eps must be a non-negative number; got {describe(eps)}")
        self.d_model, self.eps = d_model, float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        if x.dim() < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (..., d_model={self.d_model}); got shape {tuple(x.shape)}")
        work = x.to(torch.promote_types(x.dtype, torch.float32))
        mean_square = work.pow(2).mean(-1, keepdim=True)  # (..., 1)
        normed = work * torch.rsqrt(mean_square + self.eps)  # (..., d_model)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps:g}"


# ----------------------------------------------------------------------------- SwiGLU
def swiglu_hidden(d_model: int) -> int:
    """The default hidden size of :class:`SwiGLU`: ``8 * d_model // 3``, two thirds of
    ``4 * d_model``, so that its three matrices hold about as many weights as the two of a
    ReLU feed-forward of hidden size ``4 * d_model``."""
    return 8 * _positive_int("d_model", d_model) // 3


class SwiGLU(nn.Module):
    """The gated feed-forward network of PaLM and Llama (Shazeer, 2020)::

        SwiGLU(x) = w_down(silu(w_gate(x)) * w_up(x)),   silu(z) = z * sigmoid(z)

    Attributes ``w_gate`` and ``w_up`` (``nn.Linear(d_model, d_ff, bias=bias)``), ``w_down``
    (``nn.Linear(d_ff, d_model, bias=bias)``) and ``dropout`` (on the gated hidden units).
    ``d_ff`` defaults to :func:`swiglu_hidden` ``(d_model)``.
    forward(x ``(..., d_model)``) returns ``(..., d_model)``.
    """

    def __init__(
        self, d_model: int, d_ff: int | None = None, dropout: float = 0.0, bias: bool = False
    ) -> None:
        super().__init__()
        d_ff = swiglu_hidden(d_model) if d_ff is None else _positive_int("d_ff", d_ff)
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.w_up = nn.Linear(d_model, d_ff, bias=bias)
        self.w_down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        gated = nn.functional.silu(self.w_gate(x)) * self.w_up(x)  # (..., d_ff)
        return self.w_down(self.dropout(gated))  # (..., d_model)


# ----------------------------------------------------------------------------- attention
class RotaryAttention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads.

    ``w_q`` maps ``d_model -> n_heads * d_head``, ``w_k`` and ``w_v`` map ``d_model ->
    n_kv_heads * d_head``, ``w_o`` maps back to ``d_model`` (``d_head`` defaults to
    ``d_model // n_heads``; no biases unless asked for: Qwen2 has them on q, k and v). After
    splitting heads, the queries and keys of each head are rotated by their positions
    (:func:`~attention_ref.positional.rope`, adjacent pairs, frequencies over ``d_head``);
    the values are not. Query head ``h`` uses key/value head ``h // (n_heads // n_kv_heads)``
    (``repeat_interleave``). With ``rotary=False`` nothing is rotated (for a model with
    learned positions added to its input, as in notebook 11).

    forward(x ``(B, T, d_model)``, mask optional bool broadcastable to ``(B, 1, T, T)``
    (True = may attend; combined with the causal mask, e.g. a padding mask ``(B, 1, 1, T)``),
    positions optional ``(T,)`` or ``(B, 1, T)``, default ``0..T-1``) returns
    ``(out (B, T, d_model), weights (B, n_heads, T, T))``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        base: float = 10000.0,
        *,
        d_head: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        rotary: bool = True,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        for name, n in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            _positive_int(name, n)
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
            d_head = d_model // n_heads
        if n_heads % n_kv_heads or d_head % 2:
            raise ValueError(
                f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}, and "
                f"d_head={d_head} even (rotary pairs)"
            )
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_head
        self.base = float(base)
        self.rotary = rotary  # False: no rotation (positions come from elsewhere)
        self.w_q = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.w_o = nn.Linear(n_heads * d_head, d_model, bias=out_bias)

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, n, self.d_head).transpose(1, 2)  # (B, n, T, d_head)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None):
        """Rotated queries ``(B, H, T, d_head)``, rotated keys and values ``(B, G, T, d_head)``."""
        q = self._heads(self.w_q(x), self.n_heads)  # (B, H, T, d_head)
        k = self._heads(self.w_k(x), self.n_kv_heads)  # (B, G, T, d_head)
        v = self._heads(self.w_v(x), self.n_kv_heads)  # (B, G, T, d_head)
        if self.rotary:
            q = rope(q, positions, self.base)  # each head's adjacent pairs rotated
            k = rope(k, positions, self.base)  # the values are not rotated
        return q, k, v

    # q (B, H, n_q, d_head) over k, v (B, G, n_k, d_head): notebook 11's grouped heads.
    attend = GroupedQueryAttention.attend

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}"
            )
        T = x.shape[1]
        q, k, v = self.project(x, positions)
        allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
        if mask is not None:
            allowed = allowed & mask
        return self.attend(q, k, v, allowed)

    def step(self, x_new: torch.Tensor, cache, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The ``t`` new positions ``x_new (B, t, d_model)`` over the cached past and
        themselves; their rotated keys and their values are appended to ``cache``
        (:class:`~attention_ref.kv_cache.KVCache`). ``mask`` (optional, bool broadcastable to
        ``(B, 1, t, len)``) excludes padded keys."""
        start, t = len(cache), x_new.shape[1]
        positions = torch.arange(start, start + t, device=x_new.device)
        q, k, v = self.project(x_new, positions)
        k_all, v_all = cache.append(k, v)  # (B, G, T, d_head), T = start + t
        T = k_all.shape[2]
        allowed = torch.ones(t, T, dtype=torch.bool, device=x_new.device).tril(T - t)
        if mask is not None:
            allowed = allowed & mask
        return self.attend(q, k_all, v_all, allowed)[0]


# ----------------------------------------------------------------------------- the model
class ModernBlock(nn.Module):
    """The pre-norm block of the Llama family::

        x = x + attn(norm1(x))       (causal, rotary positions, grouped-query heads)
        x = x + ff(norm2(x))         (SwiGLU)

    Attributes ``norm1``, ``attn`` (:class:`RotaryAttention`), ``norm2``, ``ff``
    (:class:`SwiGLU`), ``dropout`` (on each sub-layer's output). ``norm`` and ``ff`` are the
    classes used for the norms and the feed-forward network (the learner's own may be
    passed: ``norm(d_model, eps=eps)``, ``ff(d_model, d_ff)``).
    forward(x ``(B, T, d_model)``, mask, positions as for :class:`RotaryAttention`) returns
    ``(x (B, T, d_model), weights (B, H, T, T))``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_ff: int | None = None,
        *,
        dropout: float = 0.0,
        eps: float = 1e-6,
        base: float = 10000.0,
        d_head: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        rotary: bool = True,
        norm: Callable[..., nn.Module] = RMSNorm,
        ff: Callable[..., nn.Module] = SwiGLU,
    ) -> None:
        super().__init__()
        self.norm1 = norm(d_model, eps=eps)
        self.attn = RotaryAttention(
            d_model,
            n_heads,
            n_kv_heads,
            base,
            d_head=d_head,
            bias=bias,
            out_bias=out_bias,
            rotary=rotary,
        )
        self.norm2 = norm(d_model, eps=eps)
        self.ff = ff(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask=None, positions=None):
        a, weights = self.attn(self.norm1(x), mask, positions)  # (B, T, D), (B, H, T, T)
        x = x + self.dropout(a)
        return x + self.dropout(self.ff(self.norm2(x))), weights

    def step(self, x_new: torch.Tensor, cache, mask=None) -> torch.Tensor:
        """Only the new positions ``(B, t, d_model)``, their keys and values cached."""
        x = x_new + self.dropout(self.attn.step(self.norm1(x_new), cache, mask))
        return x + self.dropout(self.ff(self.norm2(x)))


class ModernGPT(nn.Module):
    """A decoder-only model of the Llama family.

    ``logits = lm_head(norm_f(blocks(tok(ids) * embed_scale)))``, no position embedding
    (the attention rotates queries and keys; ``learned_positions=True`` adds notebook 11's
    instead), no biases by default. With ``tie=True`` the
    output layer is the token embedding, initialised ``N(0, d_model**-0.5)`` and the input
    scaled by ``embed_scale = sqrt(d_model)``: the course's scheme (notebook 11; Gemma does
    the same). Llama and Qwen scale by 1 and the converter sets ``embed_scale=1.0``.

    forward(ids ``(B, T)``, attention_mask optional ``(B, T)`` (True or 1 = a real token,
    False or 0 = padding)) returns logits ``(B, T, vocab_size)``; with ``return_weights``
    also every block's attention weights.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        n_kv_heads: int | None = None,
        d_ff: int | None = None,
        *,
        max_len: int = 128,
        dropout: float = 0.0,
        eps: float = 1e-6,
        base: float = 10000.0,
        d_head: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
        tie: bool = True,
        embed_scale: float | None = None,
        learned_positions: bool = False,
        norm: Callable[..., nn.Module] = RMSNorm,
        ff: Callable[..., nn.Module] = SwiGLU,
    ) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.max_len = d_model, n_heads, max_len
        self.embed_scale = math.sqrt(d_model) if embed_scale is None else float(embed_scale)
        self.tok = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok.weight, std=d_model**-0.5)
        # Notebook 11's learned positions, added to the input, instead of rotary ones.
        self.pos = nn.Embedding(max_len, d_model) if learned_positions else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            ModernBlock(
                d_model,
                n_heads,
                n_kv_heads,
                d_ff,
                dropout=dropout,
                eps=eps,
                base=base,
                d_head=d_head,
                bias=bias,
                out_bias=out_bias,
                rotary=not learned_positions,
                norm=norm,
                ff=ff,
            )
            for _ in range(n_layers)
        )
        self.norm_f = norm(d_model, eps=eps)
        self.lm_head = None if tie else nn.Linear(d_model, vocab_size, bias=False)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_f(x)
        if self.lm_head is None:
            return x @ self.tok.weight.T  # tied output layer: (B, T, vocab)
        return self.lm_head(x)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token embeddings ``(B, T, D)``, scaled, plus learned positions ``start ..`` when
        the model has them."""
        x = self.tok(ids) * self.embed_scale
        if self.pos is not None:
            x = x + self.pos(torch.arange(start, start + ids.shape[1], device=ids.device))
        return self.drop(x)

    @staticmethod
    def key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """``(B, T)`` padding mask -> bool ``(B, 1, 1, T)`` over the keys (None stays None)."""
        if attention_mask is None:
            return None
        return attention_mask.bool()[:, None, None, :]

    def forward(self, ids: torch.Tensor, attention_mask=None, return_weights: bool = False):
        require_tensor("ids", ids, floating=False)
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq); got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"{ids.shape[1]} positions exceed the model's max_len={self.max_len}")
        x = self.embed(ids)  # (B, T, D)
        mask = self.key_mask(attention_mask)
        weights = []
        for block in self.blocks:
            x, w = block(x, mask)
            weights.append(w)
        logits = self.head(x)
        return (logits, weights) if return_weights else logits

    def step(self, ids_new: torch.Tensor, caches: list, attention_mask=None) -> torch.Tensor:
        """Logits ``(B, t, vocab)`` of the new tokens ``(B, t)`` only, each layer's keys and
        values appended to its cache (``attention_mask``: ``(B, len)`` over every position
        so far, the new ones included)."""
        if len(caches[0]) + ids_new.shape[1] > self.max_len:
            raise ValueError(f"more than max_len={self.max_len} positions")
        x = self.embed(ids_new, len(caches[0]))  # (B, t, D)
        mask = self.key_mask(attention_mask)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.step(x, cache, mask)
        return self.head(x)


def with_parts_of(
    model: nn.Module,
    *,
    norm: Callable[..., nn.Module] | None = None,
    ff: Callable[..., nn.Module] | None = None,
) -> nn.Module:
    """``model`` with every :class:`RMSNorm` in it replaced, in place, by ``norm(d_model,
    eps)`` and every :class:`SwiGLU` by ``ff(d_model, d_ff)`` (the learner's classes), each
    holding the replaced module's weights (:func:`~attention_ref.weights.with_weights_of`):
    the same model, computed by the learner's parts. Every replacement is built before any
    is put in, so a class that fails leaves ``model`` as it was. Returns ``model``.

    Raises:
        ValueError: for a :class:`SwiGLU` with biases or dropout, which the learner's
            (``SwiGLU(d_model, d_ff=None)``, no biases) cannot hold.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    swaps = []  # (parent, attribute, replacement)
    for parent in model.modules():
        for name, child in parent.named_children():
            if is_a(child, RMSNorm) and norm is not None:
                new = with_weights_of(child, norm, child.d_model, eps=child.eps)
            elif is_a(child, SwiGLU) and ff is not None:
                if child.w_up.bias is not None or child.dropout.p:
                    raise ValueError(
                        f"{name}: a SwiGLU with biases or dropout; the learner's has neither"
                    )
                new = with_weights_of(child, ff, child.w_up.in_features, child.w_up.out_features)
            else:
                continue
            swaps.append((parent, name, new))
    for parent, name, new in swaps:
        setattr(parent, name, new)
    return model


def count_parameters(module: nn.Module) -> int:
    """The number of distinct parameters (a tied matrix counted once)."""
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "RMSNorm",
    "SwiGLU",
    "RotaryAttention",
    "ModernBlock",
    "ModernGPT",
    "swiglu_hidden",
    "count_parameters",
    "with_parts_of",
]
