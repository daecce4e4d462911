"""The key-value cache and cached (incremental) decoding: notebook 12.

When a decoder generates token ``t``, its self-attention needs the keys and values of
tokens ``0..t``. Recomputing them each step repeats all the work of the previous steps; a
:class:`KVCache` keeps them, so each step only projects the one new token and attends from
its single query. The cross-attention keys and values of the encoder's memory never change
during decoding, so they are computed once.

The decoder here stacks the decoder layer of notebook 07
(:class:`attention_ref.decoder.DecoderLayer`: masked self-attention, cross-attention over
the memory, feed-forward, each with add & norm), extended with a cached ``step``, under
token and learned position embeddings. :func:`greedy_decode` runs it with or without a cache;
both give the same tokens.

Shapes: batch first; heads ``(B, H, T, d_head)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._validate import describe, require_tensor
from .attention import sdpa
from .decoder import DecoderLayer
from .multihead import MultiHeadAttention, merge_heads, split_heads


def require_kv(k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise unless ``k`` and ``v`` are tensors ``(batch, heads, t, d)`` with the same batch,
    heads and t (what a KV cache appends)."""
    require_tensor("k", k)
    require_tensor("v", v)
    if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "k and v must be (batch, heads, t, d) with the same batch, heads and t; got "
            f"k {tuple(k.shape)} and v {tuple(v.shape)}"
        )


class KVCache:
    """Keys and values of one attention layer for the positions processed so far.

    The storage for ``max_len`` positions is allocated at the first :meth:`append` (its
    batch, heads, dtype and device are those of the first keys and values) and filled in
    place, so appending costs only the new positions, not a copy of the whole past.

    Example::

        cache = KVCache(max_len=16)
        k_all, v_all = cache.append(k, v)    # k (B, H, 1, d_k), v (B, H, 1, d_v)
        len(cache)                           # 1
    """

    def __init__(self, max_len: int) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive int; got {describe(max_len)}")
        self.max_len = max_len
        self.length = 0
        self.k: torch.Tensor | None = None  # (B, H, max_len, d_k) once allocated
        self.v: torch.Tensor | None = None  # (B, H, max_len, d_v)

    def __len__(self) -> int:
        return self.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``t`` new positions and return every cached position so far.

        Args:
            k: keys of the new positions ``(B, H, t, d_k)``.
            v: values of the new positions ``(B, H, t, d_v)``.

        Returns:
            ``(k_all (B, H, len, d_k), v_all (B, H, len, d_v))``, oldest position first,
            with ``len = len(self)`` after the append.

        Raises:
            ValueError: if the cache would hold more than ``max_len`` positions, or the
                shapes do not match what is cached.
        """
        require_kv(k, v)
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(
                f"the cache holds {self.length} positions and max_len={self.max_len}; "
                f"appending {t} more would exceed it"
            )
        if self.k is None:
            B, H, _, d_k = k.shape
            self.k = k.new_empty(B, H, self.max_len, d_k)
            self.v = v.new_empty(B, H, self.max_len, v.shape[-1])
        elif (
            k.shape[:2] != self.k.shape[:2]
            or k.shape[-1] != self.k.shape[-1]
            or (v.shape[-1] != self.v.shape[-1])
        ):
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} do not match the cached keys "
                f"{tuple(self.k.shape)} and values {tuple(self.v.shape)} (batch, heads, d)"
            )
        end = self.length + t
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def cached_self_attention(mha: MultiHeadAttention, x_new: torch.Tensor, cache) -> torch.Tensor:
    """Causal self-attention of ``t`` new positions over the cached past and themselves.

    Only the new positions are projected; their keys and values go into ``cache``.

    Args:
        mha: the layer's self-attention (its ``w_q, w_k, w_v, w_o``).
        x_new: ``(B, t, d_model)``, the inputs of the new positions.
        cache: a :class:`KVCache` (or anything with ``append(k, v) -> (k_all, v_all)``).

    Returns:
        ``(B, t, d_model)``: new position ``i`` (at absolute position ``len_before + i``)
        attends to every cached position and to the new ones up to itself.
    """
    require_tensor("x_new", x_new)
    if x_new.dim() != 3 or x_new.shape[-1] != mha.d_model or x_new.shape[1] < 1:
        raise ValueError(
            f"x_new must be (batch, t >= 1, d_model={mha.d_model}); got shape {tuple(x_new.shape)}"
        )
    q = split_heads(mha.w_q(x_new), mha.n_heads)  # (B, H, t, d_head)
    k = split_heads(mha.w_k(x_new), mha.n_heads)  # (B, H, t, d_head)
    v = split_heads(mha.w_v(x_new), mha.n_heads)
    k_all, v_all = cache.append(k, v)  # (B, H, T, d_head), T = cached + t
    t, T = q.shape[2], k_all.shape[2]
    mask = None
    if t > 1:  # new positions must not see the new positions after them
        mask = torch.ones(t, T, dtype=torch.bool, device=x_new.device).tril(T - t)
    out, _ = sdpa(q, k_all, v_all, mask)  # (B, H, t, d_head)
    return mha.w_o(merge_heads(out))


def memory_kv(mha: MultiHeadAttention, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cross-attention keys and values of the encoder output, computed once:
    ``memory (B, S, d_model) -> (k (B, H, S, d_head), v (B, H, S, d_head))``."""
    return split_heads(mha.w_k(memory), mha.n_heads), split_heads(mha.w_v(memory), mha.n_heads)


def attend_to_memory(
    mha: MultiHeadAttention,
    y: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    memory_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-attention of ``y (B, t, d_model)`` over precomputed memory keys and values."""
    q = split_heads(mha.w_q(y), mha.n_heads)  # (B, H, t, d_head)
    out, _ = sdpa(q, kv[0], kv[1], memory_mask)
    return mha.w_o(merge_heads(out))


class CachedDecoderLayer(DecoderLayer):
    """The decoder layer of notebook 07 (:class:`attention_ref.decoder.DecoderLayer`: the
    same parameters ``self_attn, cross_attn, ff, norm1..3``, post-norm or ``norm_first``)
    with a :meth:`step` that runs only the new positions against a cache.

    ``forward(y, memory, self_mask)`` is the layer's ordinary forward (everything
    recomputed; returns ``(out, self_weights, cross_weights)``); ``step(y_new, cache,
    mem_kv)`` processes only the new positions and returns their outputs.
    """

    @classmethod
    def from_layer(cls, layer: DecoderLayer) -> CachedDecoderLayer:
        """A cached copy of a trained ``DecoderLayer`` (same weights, same norm order)."""
        first = layer.self_attn.w_q.weight
        new = cls(
            layer.d_model, layer.n_heads, layer.ff.linear1.out_features, norm_first=layer.norm_first
        )
        new = new.to(device=first.device, dtype=first.dtype)
        new.load_state_dict(layer.state_dict())
        return new.train(layer.training)

    def step(
        self,
        y_new: torch.Tensor,
        cache,
        mem_kv: tuple[torch.Tensor, torch.Tensor],
        self_attention: Callable = cached_self_attention,
    ) -> torch.Tensor:
        """Only the new positions ``y_new (B, t, d_model)`` -> ``(B, t, d_model)``;
        ``self_attention(mha, x_new, cache)`` is the cached attention step (pass your own
        to try it)."""
        if self.norm_first:
            h = self.norm1(y_new)
            y = y_new + self.dropout1(self_attention(self.self_attn, h, cache))
            h = self.norm2(y)
            y = y + self.dropout2(attend_to_memory(self.cross_attn, h, mem_kv))
            return y + self.dropout3(self.ff(self.norm3(y)))
        y = self.norm1(y_new + self.dropout1(self_attention(self.self_attn, y_new, cache)))
        y = self.norm2(y + self.dropout2(attend_to_memory(self.cross_attn, y, mem_kv)))
        return self.norm3(y + self.dropout3(self.ff(y)))


class CachedDecoder(nn.Module):
    """The decoder side of a small encoder-decoder Transformer: token and learned position
    embeddings, ``n_layers`` :class:`CachedDecoderLayer`, and a projection to the
    vocabulary. The memory (the encoder's output) is given.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        d_ff: int = 256,
        n_layers: int = 2,
        max_len: int = 512,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(
            CachedDecoderLayer(d_model, n_heads, d_ff, norm_first=norm_first)
            for _ in range(n_layers)
        )
        self.out = nn.Linear(d_model, vocab_size)

    def _embed(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        return self.embed(tokens) + self.pos(positions)  # (B, t, d_model)

    def hidden(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Full recomputation: ``tokens (B, T)`` -> hidden states ``(B, T, d_model)``."""
        T = tokens.shape[1]
        y = self._embed(tokens, 0)
        mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        for layer in self.layers:
            y = layer(y, memory, mask)[0]
        return y

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T)``, ``memory (B, S, d_model)`` -> logits ``(B, T, vocab)``."""
        return self.out(self.hidden(tokens, memory))

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values of ``memory``, computed once."""
        return [memory_kv(layer.cross_attn, memory) for layer in self.layers]

    def step(
        self,
        tokens_new: torch.Tensor,
        caches: list,
        mem_kv: list[tuple[torch.Tensor, torch.Tensor]],
        self_attention: Callable = cached_self_attention,
    ) -> torch.Tensor:
        """Process only the new tokens ``(B, t)`` (positions ``len(caches[0])`` onwards),
        appending their keys and values to each layer's cache; returns logits ``(B, t,
        vocab)``."""
        y = self._embed(tokens_new, len(caches[0]))
        for layer, cache, kv in zip(self.layers, caches, mem_kv, strict=True):
            y = layer.step(y, cache, kv, self_attention)
        return self.out(y)


@torch.no_grad()
def greedy_decode(
    model: CachedDecoder,
    memory: torch.Tensor,
    n_tokens: int,
    bos: int = 0,
    *,
    use_cache: bool = True,
    cache_factory: Callable[[int], object] = KVCache,
    self_attention: Callable = cached_self_attention,
) -> torch.Tensor:
    """Generate ``n_tokens`` tokens greedily after a start token.

    Args:
        model: the decoder.
        memory: the encoder output ``(B, S, d_model)``.
        n_tokens: how many tokens to generate.
        bos: the start token.
        use_cache: False recomputes the whole prefix at every step (the decoding of
            notebook 07); True keeps a cache per layer and processes one token per step.
        cache_factory: builds one layer's cache from ``max_len`` (default :class:`KVCache`;
            pass your own class to try it).
        self_attention: the cached attention step ``(mha, x_new, cache) -> (B, t,
            d_model)`` used with the cache (default :func:`cached_self_attention`; pass your
            own to try it).

    Returns:
        ``(B, 1 + n_tokens)`` token ids, starting with ``bos``.
    """
    require_tensor("memory", memory)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
        raise ValueError(f"n_tokens must be an int >= 0; got {describe(n_tokens)}")
    if memory.dim() != 3:
        raise ValueError(f"memory must be (batch, S, d_model); got shape {tuple(memory.shape)}")
    if n_tokens + 1 > model.max_len:
        raise ValueError(f"n_tokens={n_tokens} + 1 exceeds the model's max_len={model.max_len}")
    B = memory.shape[0]
    ys = torch.full((B, 1), bos, dtype=torch.long, device=memory.device)
    if use_cache:
        caches = [cache_factory(n_tokens + 1) for _ in model.layers]
        mem_kv = model.memory_kv(memory)
    for _ in range(n_tokens):
        if use_cache:
            logits = model.step(ys[:, -1:], caches, mem_kv, self_attention)[:, -1]  # (B, V)
        else:
            logits = model.out(model.hidden(ys, memory)[:, -1])  # (B, vocab)
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)
    return ys
