"""A GPT: a decoder-only language model and grouped-query attention (notebook 11).

- :class:`GPTBlock`: a pre-norm block, ``x + attn(ln1(x))`` with a causal mask, then
  ``x + ff(ln2(x))``, built on :class:`~attention_ref.multihead.MultiHeadAttention`
  (or :class:`GroupedQueryAttention`) and :class:`~attention_ref.encoder.FeedForward`;
- :class:`GPT`: token embeddings (``N(0, d_model**-0.5)``, scaled by ``sqrt(d_model)``) plus
  learned positions, a stack of blocks, a final LayerNorm and an output layer *tied* to the
  token embedding;
- :class:`GroupedQueryAttention`: ``n_kv_heads`` key/value heads shared by groups of query
  heads (multi-head attention when ``n_kv_heads == n_heads``, multi-query when it is 1),
  and :meth:`GroupedQueryAttention.from_mha`, which averages a trained layer's key and
  value heads.

Sampling (:func:`~attention_ref.sampling.sample_next_token`,
:func:`~attention_ref.sampling.generate`) is in :mod:`attention_ref.sampling`; the
notebook's data, measurements and training (:func:`train_gpt`) are in
:mod:`attention_ref.apps.language_model`.

Shapes: batch first; token ids ``(B, T)``; heads ``(B, H, T, d_head)``.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ._validate import describe, require_tensor
from .attention import sdpa
from .encoder import FeedForward
from .kv_cache import cached_self_attention
from .multihead import MultiHeadAttention, check_mha_inputs, merge_heads, split_heads
from .weights import is_a, with_weights_of


def causal_mask_like(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``(T, T)`` bool, True where key ``j <= i`` (query ``i`` may see ``j``)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# ----------------------------------------------------------------------------- grouped-query
class GroupedQueryAttention(nn.Module):
    """Attention with ``n_heads`` query heads and ``n_kv_heads`` key/value heads.

    ``w_q`` and ``w_o`` are ``d_model x d_model`` as in multi-head attention; ``w_k`` and
    ``w_v`` map ``d_model -> n_kv_heads * d_head``. Query heads are grouped in order: query
    head ``h`` uses key/value head ``h // (n_heads // n_kv_heads)`` (consecutive query heads
    share, like ``repeat_interleave``). ``n_kv_heads == n_heads`` is multi-head attention,
    ``n_kv_heads == 1`` multi-query attention.

    forward(query ``(B, n_q, d_model)``, key, value ``(B, n_k, d_model)``, mask bool
    broadcastable to ``(B, H, n_q, n_k)`` (a 3-D mask ``(B, n_q, n_k)`` is shared by the
    heads), True = may attend) returns ``(out (B, n_q, d_model), weights (B, H, n_q, n_k))``.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool = True) -> None:
        super().__init__()
        for name, n in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int; got {describe(n)}")
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(
                f"d_model={d_model} must be divisible by n_heads={n_heads}, and n_heads by "
                f"n_kv_heads={n_kv_heads}"
            )
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x (B, T, d_model)``, one per key/value head:
        ``(B, n_kv_heads, T, d_head)`` each (what a cache stores)."""
        return split_heads(self.w_k(x), self.n_kv_heads), split_heads(self.w_v(x), self.n_kv_heads)

    def attend(self, q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``q (B, H, n_q, d_head)`` over ``k, v (B, n_kv_heads, n_k, d_head)``: each key/value
        head serves ``n_heads // n_kv_heads`` consecutive query heads; ``(out, weights)``.
        (Notebook 13's :class:`~attention_ref.modern.RotaryAttention` attends the same way.)"""
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, n_k, d_head): head h uses kv h // group
        v = v.repeat_interleave(group, dim=1)
        out, weights = sdpa(q, k, v, mask)  # (B, H, n_q, d_head), (B, H, n_q, n_k)
        return self.w_o(merge_heads(out)), weights

    def forward(self, query, key, value, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        mask = check_mha_inputs(self.d_model, query, key, value, mask)
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, n_q, d_head)
        k = split_heads(self.w_k(key), self.n_kv_heads)  # (B, G, n_k, d_head)
        v = split_heads(self.w_v(value), self.n_kv_heads)
        return self.attend(q, k, v, mask)

    @classmethod
    def from_mha(cls, mha: MultiHeadAttention, n_kv_heads: int) -> GroupedQueryAttention:
        """Convert trained multi-head attention: queries and output projection copied, the
        key and value heads of each group of ``n_heads // n_kv_heads`` consecutive heads
        averaged (weights and biases), as in Ainslie et al. (2023)."""
        bias = mha.w_q.bias is not None
        new = cls(mha.d_model, mha.n_heads, n_kv_heads, bias=bias)
        new = new.to(device=mha.w_q.weight.device, dtype=mha.w_q.weight.dtype)
        group, d_head, D = mha.n_heads // n_kv_heads, mha.d_head, mha.d_model
        with torch.no_grad():
            new.w_q.load_state_dict(mha.w_q.state_dict())
            new.w_o.load_state_dict(mha.w_o.state_dict())
            for src, dst in ((mha.w_k, new.w_k), (mha.w_v, new.w_v)):
                w = src.weight.view(n_kv_heads, group, d_head, D).mean(1)  # (G, d_head, D)
                dst.weight.copy_(w.reshape(n_kv_heads * d_head, D))
                if bias:
                    dst.bias.copy_(src.bias.view(n_kv_heads, group, d_head).mean(1).reshape(-1))
        return new


def kv_cache_bytes_per_token(
    n_layers: int, n_kv_heads: int, d_head: int, bytes_per_value: int = 4
) -> int:
    """Bytes the cache holds per generated token: a key and a value vector of ``d_head``
    numbers for each key/value head of each layer."""
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_value


def gqa_cached_self_attention(attn, x_new: torch.Tensor, cache) -> torch.Tensor:
    """:func:`~attention_ref.kv_cache.cached_self_attention` for either attention module:
    the cache holds ``n_kv_heads`` key/value heads (fewer than the query heads for GQA)."""
    if isinstance(attn, MultiHeadAttention):
        return cached_self_attention(attn, x_new, cache)
    q = split_heads(attn.w_q(x_new), attn.n_heads)  # (B, H, t, d_head)
    k, v = attn.project_kv(x_new)  # (B, G, t, d_head)
    k_all, v_all = cache.append(k, v)  # (B, G, T, d_head)
    t, T = q.shape[2], k_all.shape[2]
    mask = None
    if t > 1:
        mask = torch.ones(t, T, dtype=torch.bool, device=x_new.device).tril(T - t)
    return attn.attend(q, k_all, v_all, mask)[0]


# ----------------------------------------------------------------------------- the model
class GPTBlock(nn.Module):
    """A pre-norm decoder-only block (GPT-2)::

        h, weights = attn(ln1(x), ln1(x), ln1(x), causal mask)
        x = x + dropout(h)
        x = x + dropout(ff(ln2(x)))

    Attributes: ``ln1``, ``attn`` (:class:`MultiHeadAttention`, or
    :class:`GroupedQueryAttention` when ``n_kv_heads`` is given and smaller than
    ``n_heads``), ``ln2``, ``ff`` (:class:`FeedForward`), ``dropout``.
    forward(x ``(B, T, d_model)``) returns ``(x (B, T, d_model), weights (B, H, T, T))``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        if n_kv_heads is None or n_kv_heads == n_heads:
            self.attn: nn.Module = MultiHeadAttention(d_model, n_heads)
        else:
            self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        require_tensor("x", x)
        T = x.shape[1]
        h = self.ln1(x)
        a, weights = self.attn(h, h, h, causal_mask_like(T, x.device))  # (B, T, D), (B, H, T, T)
        x = x + self.dropout(a)
        x = x + self.dropout(self.ff(self.ln2(x)))
        return x, weights

    def step(self, x_new: torch.Tensor, cache) -> torch.Tensor:
        """Only the new positions ``(B, t, d_model)``, their keys and values appended to
        ``cache``."""
        x = x_new + self.dropout(gqa_cached_self_attention(self.attn, self.ln1(x_new), cache))
        return x + self.dropout(self.ff(self.ln2(x)))


class GPT(nn.Module):
    """A decoder-only Transformer language model.

    ``logits = ln_f(blocks(tok(ids) * sqrt(d_model) + pos(positions))) @ tok.weight.T``:
    the output layer is the token embedding (tied), initialised ``N(0, d_model**-0.5)``.
    forward(ids ``(B, T)``) returns logits ``(B, T, vocab_size)``; with
    ``return_weights=True`` also every block's attention weights ``[(B, H, T, T), ...]``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 256,
        max_len: int = 64,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.max_len = d_model, n_heads, max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok.weight, std=d_model**-0.5)
        self.pos = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            GPTBlock(d_model, n_heads, d_ff, dropout, n_kv_heads) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"{start + T} positions exceed the model's max_len={self.max_len}")
        positions = torch.arange(start, start + T, device=ids.device)
        return self.drop(self.tok(ids) * math.sqrt(self.d_model) + self.pos(positions))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x) @ self.tok.weight.T  # tied output layer: (B, T, vocab)

    def forward(self, ids: torch.Tensor, return_weights: bool = False):
        require_tensor("ids", ids, floating=False)
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq); got shape {tuple(ids.shape)}")
        x = self.embed(ids)
        weights = []
        for block in self.blocks:
            x, w = block(x)
            weights.append(w)
        logits = self.head(x)
        return (logits, weights) if return_weights else logits

    def _uncached(self) -> list[nn.Module]:
        """The blocks without a cached ``step`` (a learner's ``GPTBlock``, put in by
        :func:`with_blocks_of`)."""
        return [b for b in self.blocks if not callable(getattr(b, "step", None))]

    @property
    def can_cache(self) -> bool:
        """Whether every block has a cached ``step``, which :meth:`step` needs."""
        return not self._uncached()

    def step(self, ids_new: torch.Tensor, caches: list) -> torch.Tensor:
        """Logits ``(B, t, vocab)`` of the new tokens ``(B, t)`` only, every layer's keys
        and values appended to ``caches`` (one cache per block)."""
        if uncached := self._uncached():
            kinds = sorted({type(b).__name__ for b in uncached})
            raise TypeError(
                f"this GPT's blocks ({', '.join(kinds)}) have no cached step(x_new, cache): "
                "generate without the cache (use_cache=False)"
            )
        x = self.embed(ids_new, len(caches[0]))
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.step(x, cache)
        return self.head(x)

    def to_gqa(self, n_kv_heads: int) -> GPT:
        """A copy whose attention layers are grouped-query, key/value heads averaged."""
        new = copy.deepcopy(self)
        for block in new.blocks:
            if isinstance(block.attn, MultiHeadAttention):
                block.attn = GroupedQueryAttention.from_mha(block.attn, n_kv_heads)
        return new


def with_blocks_of(model: GPT, block: type[nn.Module]) -> GPT:
    """``model`` with each of its blocks replaced, in place, by a module of the class
    ``block`` (the learner's ``GPTBlock(d_model, n_heads, d_ff, dropout)``) holding that
    block's weights (:func:`~attention_ref.weights.with_weights_of`): the same model,
    computed by the learner's code. Such blocks have no cached ``step``, so ``model`` then
    generates without the cache (:attr:`GPT.can_cache`). Returns ``model``."""
    if not is_a(model, GPT):
        raise TypeError(f"model must be a GPT; got {type(model).__name__}")
    for i, old in enumerate(model.blocks):
        if not is_a(old.attn, MultiHeadAttention):
            raise ValueError(
                f"block {i} has {type(old.attn).__name__} attention; a GPTBlock of the "
                "notebook's has MultiHeadAttention: put the blocks in before to_gqa"
            )
        d_model, n_heads = old.attn.d_model, old.attn.n_heads
        d_ff, dropout = old.ff.linear1.out_features, old.dropout.p
        model.blocks[i] = with_weights_of(old, block, d_model, n_heads, d_ff, dropout)
    return model


# Notebook 11 (and code written against earlier versions) imports the sampler, the
# measurements and the training from here; they live in their own modules now.
_MOVED = {
    "sampling": ("sample_next_token", "generate"),
    "apps.language_model": (
        "GPT_CONFIG",
        "GPTResult",
        "agreement",
        "batch_loss",
        "cross_entropy",
        "encode_sentences",
        "fit",
        "make_gpt",
        "per_token_standard_error",
        "sample_quality",
        "sample_sentences",
        "sentence_nll",
        "subject_attention",
        "time_generation",
        "train_gpt",
    ),
}


def __getattr__(name: str):
    import importlib

    for module, names in _MOVED.items():
        if name in names:
            return getattr(importlib.import_module(f"{__package__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
