"""Sampling from a language model (notebook 11): :func:`sample_next_token` (greedy,
temperature, top-k and top-p sampling of the next token from logits) and :func:`generate`
(autoregressive generation with or without a key-value cache)."""

from __future__ import annotations

import math

import torch

from ._validate import require_tensor
from .gpt import GPT
from .kv_cache import KVCache


# ----------------------------------------------------------------------------- sampling
def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw the next token from ``logits (..., V)``; returns int64 ids ``(...)``.

    - ``temperature == 0``: greedy, the index of the largest logit (the lowest index among
      ties); ``top_k`` and ``top_p`` are then irrelevant.
    - Otherwise the scores are ``logits / temperature``, then
      ``top_k``: keep the tokens whose score is at least the k-th largest (ties with it
      are kept, so more than k may remain); the others get probability 0;
      ``top_p``: with ``p = softmax(scores)`` of the tokens left, keep token ``i`` when
      the total probability of the tokens strictly more probable than ``i`` is less than
      ``top_p`` (the smallest set of most probable tokens whose probability reaches
      ``top_p``, the token that crosses it included);
      then sample from the kept tokens' renormalised probabilities with
      ``torch.multinomial(..., generator=generator)``.
    """
    require_tensor("logits", logits)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0; got {temperature}")
    if temperature == 0:
        return logits.argmax(-1)  # the first maximum
    scores = logits / temperature
    if top_k is not None:
        kth = scores.topk(min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores.double(), dim=-1)  # (..., V)
    if top_p is not None:
        # mass of the tokens strictly more probable than each token (ties count alike)
        asc = probs.sort(dim=-1).values  # (..., V) ascending
        cum = torch.cat([torch.zeros_like(asc[..., :1]), asc.cumsum(-1)], dim=-1)  # (..., V+1)
        at_most = torch.searchsorted(asc.contiguous(), probs.contiguous(), right=True)
        above = cum[..., -1:] - cum.gather(-1, at_most)  # (..., V)
        probs = torch.where(above < top_p, probs, torch.zeros_like(probs))
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


@torch.no_grad()
def generate(
    model: GPT,
    prompt: torch.Tensor,
    n_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool | None = None,
) -> torch.Tensor:
    """Append ``n_tokens`` sampled tokens to ``prompt (B, T0)``; returns ``(B, T0 +
    n_tokens)``. Without the cache every step recomputes the whole prefix; with it each
    step runs only the newest token (same tokens, fewer operations). ``use_cache=None``
    uses it when the model can (:attr:`~attention_ref.gpt.GPT.can_cache`: not when its
    blocks are the learner's)."""
    require_tensor("prompt", prompt, floating=False)
    if use_cache is None:
        use_cache = getattr(model, "can_cache", True)
    ids = prompt
    caches = None
    if use_cache:
        caches = [KVCache(prompt.shape[1] + n_tokens) for _ in model.blocks]
    for _ in range(n_tokens):
        if use_cache:
            new = ids if len(caches[0]) == 0 else ids[:, -1:]
            logits = model.step(new, caches)[:, -1]  # (B, V)
        else:
            logits = model(ids)[:, -1]  # (B, V)
        nxt = sample_next_token(logits, temperature, top_k, top_p, generator)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids
