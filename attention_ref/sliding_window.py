"""Sliding-window attention and the rolling key-value cache: notebook 15.

Mistral 7B (v0.1), the local layers of Gemma 2 and 3 and every other layer of GPT-OSS let
each query see only the last ``window`` positions (the released Mixtral and Qwen3-MoE models
have no window: Mixtral's ``sliding_window`` is unset, Qwen3-MoE's ``use_sliding_window``
False; their configurations can set one, as notebook 15's tiny models do). The convention of
``transformers`` 4.57 (``masking_utils.sliding_window_overlay``, used alike by every model
above that sets ``config.sliding_window``, taken as ``window``)::

    query i may see key j  <=>  i - window < j <= i      (and key j is not padding)

so a query sees ``window`` keys, itself included (OpenAI's own GPT-OSS code masks
``j <= i - window``: the same set). Beware the off-by-one elsewhere: flash-attention's
``window_size=(left, right)`` counts the keys *besides* the query, so a query sees
``left + 1`` of them, and ``transformers`` passes ``left = sliding_window - 1``; a
converter must know which count its checkpoint's ``sliding_window`` means.

Since no query ever looks further back than ``window - 1`` positions, the cache of such a
layer needs only the last ``window - 1`` keys and values (``transformers``'
``DynamicSlidingWindowLayer`` keeps as many): :class:`RollingKVCache` is a ring buffer of
that size; position ``p`` is stored in slot ``p % size``, overwriting the oldest entry
(:func:`rolling_append`, an exercise of notebook 15, does the writing).
Its memory stays constant however long the text grows (:func:`cache_bytes_as_text_grows`);
a model that mixes such local layers with global ones (Gemma 2 and 3) has a cache that grows
with its global layers only (:func:`mixed_layout_cache_bytes`).

Shapes: batch first; heads ``(B, H, T, d_head)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import describe, require_tensor
from .kv_cache import require_kv
from .modern import RMSNorm, RotaryAttention
from .positional import rope


def _window(window) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int or None; got {describe(window)}")
    return window


def sliding_window_mask(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    window: int | None,
    key_padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """The boolean mask of sliding-window causal attention (True = may attend).

    Args:
        q_positions: the absolute position of each query, ``(n_q,)`` ints.
        k_positions: the absolute position of each key, ``(n_k,)`` ints; a negative
            position marks an empty slot (never attended).
        window: each query sees ``window`` keys, itself included
            (``q - window < k <= q``); None: plain causal attention (``k <= q``).
        key_padding: optional bool ``(B, n_k)``, True at real tokens.

    Returns:
        bool ``(n_q, n_k)``, or ``(B, 1, n_q, n_k)`` with ``key_padding`` (broadcasts over
        heads).
    """
    require_tensor("q_positions", q_positions, floating=False)
    require_tensor("k_positions", k_positions, floating=False)
    window = _window(window)
    if q_positions.dim() != 1 or k_positions.dim() != 1:
        raise ValueError(
            "q_positions and k_positions must be 1-D (n_q,) and (n_k,); got "
            f"{tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
        )
    q = q_positions[:, None]  # (n_q, 1)
    k = k_positions[None, :]  # (1, n_k)
    allowed = (k <= q) & (k >= 0)  # (n_q, n_k): causal, empty slots out
    if window is not None:
        allowed = allowed & (k > q - window)
    if key_padding is None:
        return allowed
    require_tensor("key_padding", key_padding, floating=False)
    if key_padding.dim() != 2 or key_padding.shape[-1] != k_positions.shape[0]:
        raise ValueError(
            f"key_padding must be (batch, n_k={k_positions.shape[0]}); got "
            f"{tuple(key_padding.shape)}"
        )
    return allowed & key_padding.bool()[:, None, None, :]  # (B, 1, n_q, n_k)


def rolling_append(
    slots: torch.Tensor, positions: torch.Tensor, new: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write ``t`` new entries into a ring buffer of ``size`` slots (position ``p`` in slot
    ``p % size``, overwriting the oldest), and say what the new queries attend to.

    Args:
        slots: the ring ``(..., size, d)`` (keys, values, or any per-position data).
        positions: ``(size,)`` ints, the absolute position held in each slot; -1: empty.
        new: the entries of positions ``start .. start + t - 1``, ``(..., t, d)``; any
            ``t >= 1``, even more than ``size`` (then only the last ``size`` are kept).
        start: the absolute position of ``new``'s first entry.

    Returns:
        ``(attend (..., size + t, d), attend_positions (size + t,), slots, positions)``:
        the ring as it was followed by the new entries, with their positions, then the
        ring after writing. The inputs are not modified.
    """
    require_tensor("slots", slots, floating=False)
    require_tensor("positions", positions, floating=False)
    require_tensor("new", new, floating=False)
    size, t = slots.shape[-2], new.shape[-2]
    if positions.shape != (size,) or new.shape[:-2] + new.shape[-1:] != (
        slots.shape[:-2] + slots.shape[-1:]
    ):
        raise ValueError(
            f"slots (..., size, d), positions (size,) and new (..., t, d) must agree; got "
            f"{tuple(slots.shape)}, {tuple(positions.shape)} and {tuple(new.shape)}"
        )
    new_positions = torch.arange(start, start + t, device=positions.device)  # (t,)
    attend = torch.cat([slots, new], dim=-2)  # (..., size + t, d): read before writing
    attend_positions = torch.cat([positions, new_positions.to(positions.dtype)])
    kept = new_positions[-size:]  # only the last `size` new positions survive
    where = kept % size  # their slots, all distinct
    slots, positions = slots.clone(), positions.clone()
    slots[..., where, :] = new[..., t - len(kept) :, :]
    positions[where] = kept.to(positions.dtype)
    return attend, attend_positions, slots, positions


class RollingKVCache:
    """A key-value cache of fixed size that overwrites its oldest entry (a ring buffer).

    Holds the keys and values of the last ``size`` positions (``size = window - 1`` is all
    a sliding-window layer needs), each with its absolute position and, optionally, whether
    it is a real token. Position ``p`` lives in slot ``p % size`` (with the course's
    :func:`rolling_append`; a learner's may keep another layout: the cache hands each call
    back the ring the previous one returned, and the mask goes by the positions).

    :meth:`append` returns the cached positions *and* the new ones (so ``t`` new queries
    can attend to all of them, whatever ``t``), then keeps only the last ``size``: the
    keys, the values and ``keep`` each go through :func:`rolling_append`.

    Example::

        cache = RollingKVCache(size=3)
        k, v, pos, keep = cache.append(k_new, v_new)   # k_new (B, H, t, d_k)
        len(cache)            # positions seen so far (not the number stored)
    """

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int; got {describe(size)}")
        self.size = size
        self.seen = 0  # positions appended so far
        self.k: torch.Tensor | None = None  # (B, H, size, d_k) once allocated
        self.v: torch.Tensor | None = None  # (B, H, size, d_v)
        self.positions: torch.Tensor | None = None  # (size,), -1 = empty slot
        self.keep: torch.Tensor | None = None  # (B, size) bool: real tokens

    def __len__(self) -> int:
        return self.seen

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values (0 before the first append)."""
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    def append(
        self, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add ``t`` new positions.

        Args:
            k: keys of the new positions ``(B, H, t, d_k)``.
            v: values ``(B, H, t, d_v)``.
            keep: optional bool ``(B, t)``, True at real tokens (default: all real).

        Returns:
            ``(k_all (B, H, n, d_k), v_all (B, H, n, d_v), positions (n,), keep (B, n))``:
            the stored slots (in slot order, empty ones with position -1) followed by the
            ``t`` new positions, ``n = size + t``.
        """
        require_kv(k, v)
        B, H, t, d_k = k.shape
        if keep is None:
            keep = torch.ones(B, t, dtype=torch.bool, device=k.device)
        elif keep.shape != (B, t):
            raise ValueError(f"keep must be (batch, t) = {(B, t)}; got {tuple(keep.shape)}")
        if self.k is None:
            self.k = k.new_zeros(B, H, self.size, d_k)
            self.v = v.new_zeros(B, H, self.size, v.shape[-1])
            self.positions = torch.full((self.size,), -1, dtype=torch.long, device=k.device)
            self.keep = torch.zeros(B, self.size, dtype=torch.bool, device=k.device)
        elif (B, H, d_k, v.shape[-1]) != (*self.k.shape[:2], self.k.shape[-1], self.v.shape[-1]):
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} do not match the cached keys "
                f"{tuple(self.k.shape)} and values {tuple(self.v.shape)} (batch, heads, d)"
            )
        # rolling_append looked up when called: notebook 15 puts the learner's in its place
        old = self.positions
        k_all, pos_all, self.k, self.positions = rolling_append(self.k, old, k, self.seen)
        v_all, _, self.v, _ = rolling_append(self.v, old, v, self.seen)
        keep_all, _, kept, _ = rolling_append(self.keep[..., None], old, keep.bool()[..., None],
                                              self.seen)  # fmt: skip
        self.keep = kept[..., 0]  # (B, size)
        self.seen += t
        return k_all, v_all, pos_all, keep_all[..., 0]


class SlidingWindowAttention(RotaryAttention):
    """:class:`~attention_ref.modern.RotaryAttention` whose queries see only the last
    ``window`` positions (``i - window < j <= i``; ``window=None``: all of them), with the
    optional per-head RMSNorm of Qwen3 on queries and keys (``qk_norm=True``: attributes
    ``q_norm`` and ``k_norm``, ``RMSNorm(d_head)``, applied to each head before rotation).

    forward(x ``(B, T, d_model)``, mask optional bool broadcastable to ``(B, 1, T, T)``,
    positions optional) returns ``(out (B, T, d_model), weights (B, H, T, T))``.
    :meth:`step` works with a :class:`RollingKVCache` (or, for ``window=None``, with it
    as well: give it a size of the longest text).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        base: float = 10000.0,
        *,
        window: int | None = None,
        qk_norm: bool = False,
        eps: float = 1e-6,
        **kwargs,
    ) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, base, **kwargs)
        self.window = _window(window)
        self.q_norm = RMSNorm(self.d_head, eps=eps) if qk_norm else None
        self.k_norm = RMSNorm(self.d_head, eps=eps) if qk_norm else None

    def project(self, x: torch.Tensor, positions: torch.Tensor | None):
        q = self._heads(self.w_q(x), self.n_heads)  # (B, H, T, d_head)
        k = self._heads(self.w_k(x), self.n_kv_heads)  # (B, G, T, d_head)
        v = self._heads(self.w_v(x), self.n_kv_heads)  # (B, G, T, d_head)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # each head's vector normalised
        if self.rotary:
            q = rope(q, positions, self.base)  # adjacent pairs rotated
            k = rope(k, positions, self.base)
        return q, k, v

    def forward(self, x: torch.Tensor, mask=None, positions=None):
        require_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}"
            )
        pos = torch.arange(x.shape[1], device=x.device)  # (T,)
        q, k, v = self.project(x, positions)
        allowed = sliding_window_mask(pos, pos, self.window)  # (T, T)
        if mask is not None:
            allowed = allowed & mask
        return self.attend(q, k, v, allowed)

    def step(
        self,
        x_new: torch.Tensor,
        cache,
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The ``t`` new positions ``x_new (B, t, d_model)`` over the cached ones and
        themselves; their keys and values go into ``cache`` (:class:`RollingKVCache`).
        ``keep`` (optional bool ``(B, t)``): which new positions are real tokens.
        ``positions`` (optional, ``(t,)`` or ``(B, 1, t)``): the rotary positions, when they
        are not the slots' (a left-padded prompt counts from its first real token); the
        window is always over the slots."""
        start, t = len(cache), x_new.shape[1]
        q_pos = torch.arange(start, start + t, device=x_new.device)  # (t,): the slots
        q, k, v = self.project(x_new, q_pos if positions is None else positions)
        k_all, v_all, k_pos, keep_all = cache.append(k, v, keep)  # (B, G, n, d_head), (n,)
        allowed = sliding_window_mask(q_pos, k_pos, self.window, keep_all)  # (B, 1, t, n)
        return self.attend(q, k_all, v_all, allowed)[0]


class SinkAttention(SlidingWindowAttention):
    """:class:`SlidingWindowAttention` with GPT-OSS's *attention sinks*: one learned logit
    ``sinks[h]`` per head joins every row's softmax (in its denominator only) and is then
    dropped, so a head can attend to "nothing" (StreamingLLM's attention sinks are another
    thing: the first tokens of a text, kept in the cache beside the window)::

        weights[i, j] = exp(s_ij) / (sum_j' exp(s_ij') + exp(sinks[h]))

    The rows sum to less than 1; a fully masked row gives zero weights. Attribute ``sinks``
    ``(n_heads,)``.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 base: float = 10000.0, **kwargs) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, n_kv_heads, base, **kwargs)
        self.sinks = nn.Parameter(torch.zeros(n_heads))

    def attend(self, q, k, v, mask=None):
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, n_k, d_head)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / self.d_head**0.5  # (B, H, n_q, n_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = self.sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, n_q, 1)
        weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]  # sink dropped
        out = weights @ v  # (B, H, n_q, d_head)
        B, H, n_q, d = out.shape
        return self.w_o(out.transpose(1, 2).reshape(B, n_q, H * d)), weights


def cache_bytes_as_text_grows(
    lengths: list[int],
    window: int,
    n_layers: int,
    n_kv_heads: int,
    d_head: int,
    bytes_per_value: int = 2,
) -> list[dict[str, int]]:
    """The key-value cache of a model, in bytes, as the text grows: a full cache (every
    position) against a rolling cache of ``window - 1`` positions per layer.

    Returns one row per length: ``{"tokens", "full", "rolling"}`` (table-ready), with
    ``full = 2 * n_layers * n_kv_heads * d_head * bytes_per_value * tokens`` and ``rolling``
    the same with ``min(tokens, window - 1)`` positions.
    """
    _window(window)
    per_token = 2 * n_layers * n_kv_heads * d_head * bytes_per_value
    return [
        {"tokens": n, "full": per_token * n, "rolling": per_token * min(n, max(window - 1, 1))}
        for n in lengths
    ]


def _count(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int of at least {least}; got {describe(value)}")
    return value


def local_layers(n_layers: int, local_per_global: int) -> list[bool]:
    """Which of ``n_layers`` layers are local (sliding-window: True) and which global (full
    attention: False) when ``local_per_global`` local layers come before each global one:
    the last of every ``local_per_global + 1`` layers is global, layer 0 local, as Gemma 2
    (1: they alternate) and Gemma 3 (5) place them. ``0`` makes every layer global."""
    _count("n_layers", n_layers, 1)
    _count("local_per_global", local_per_global, 0)
    return [(i + 1) % (local_per_global + 1) != 0 for i in range(n_layers)]


def mixed_layout_cache_bytes(
    lengths: list[int],
    n_layers: int,
    local_per_global: int,
    window: int,
    n_kv_heads: int,
    d_head: int,
    bytes_per_value: int = 2,
) -> list[dict[str, int]]:
    """The key-value cache of a model whose layers mix local and global attention
    (:func:`local_layers`), in bytes, as the text grows, against every layer global.

    Returns one row per length: ``{"tokens", "full", "mixed"}``, ``full`` as in
    :func:`cache_bytes_as_text_grows` and ``mixed`` the global layers' full caches plus the
    local layers' rolling caches of ``window - 1`` positions. Past the window, only the
    global layers' part grows: ``mixed / full`` falls toward their share of the layers.
    """
    local = local_layers(n_layers, local_per_global)
    n_local = sum(local)
    # one layer's caches, full and rolling; the model has n_layers of them
    one = cache_bytes_as_text_grows(lengths, window, 1, n_kv_heads, d_head, bytes_per_value)
    return [
        {
            "tokens": r["tokens"],
            "full": n_layers * r["full"],
            "mixed": (n_layers - n_local) * r["full"] + n_local * r["rolling"],
        }
        for r in one
    ]


def rolling_cache_size(window: int) -> int:
    """The ring buffer a layer with this window needs: ``window - 1`` positions (at least
    one slot)."""
    return max(_window(window) - 1, 1)


__all__ = [
    "sliding_window_mask",
    "rolling_append",
    "RollingKVCache",
    "SlidingWindowAttention",
    "SinkAttention",
    "cache_bytes_as_text_grows",
    "local_layers",
    "mixed_layout_cache_bytes",
    "rolling_cache_size",
]
