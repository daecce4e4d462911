"""A GPT: a decoder-only language model, its sampler, its key-value cache and grouped-query
attention (notebook 11).

- :class:`GPTBlock`: a pre-norm block, ``x + attn(ln1(x))`` with a causal mask, then
  ``x + ff(ln2(x))``, built on :class:`~attention_ref.multihead.MultiHeadAttention`
  (or :class:`GroupedQueryAttention`) and :class:`~attention_ref.encoder.FeedForward`;
- :class:`GPT`: token embeddings (``N(0, d_model**-0.5)``, scaled by ``sqrt(d_model)``) plus
  learned positions, a stack of blocks, a final LayerNorm and an output layer *tied* to the
  token embedding;
- :func:`sample_next_token`: greedy, temperature, top-k and top-p (nucleus) sampling;
- :func:`generate`: autoregressive generation, with or without a key-value cache;
- :class:`GroupedQueryAttention`: ``n_kv_heads`` key/value heads shared by groups of query
  heads (multi-head attention when ``n_kv_heads == n_heads``, multi-query when it is 1),
  and :meth:`GroupedQueryAttention.from_mha`, which averages a trained layer's key and
  value heads;
- :func:`train_gpt`: the notebook's model trained on the grammar of
  :mod:`attention_ref.data.grammar`, with the measurements of the notebook.

Shapes: batch first; token ids ``(B, T)``; heads ``(B, H, T, d_head)``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._validate import describe, require_tensor
from .attention import sdpa
from .data.grammar import BigramModel, GrammarData, Sentence, distinct_ngrams, make_grammar_data
from .data.vocab import BOS_ID, PAD_ID, SPECIALS
from .encoder import FeedForward
from .kv_cache import KVCache, cached_self_attention
from .multihead import MultiHeadAttention, check_qkv, merge_heads, split_heads
from .training import Stream, TrainResult, evaluating, pick_device, seed_everything, train


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
        """``q (B, H, n_q, d_head)`` over ``k, v (B, n_kv_heads, n_k, d_head)``."""
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=1)  # (B, H, n_k, d_head): head h uses kv h // group
        v = v.repeat_interleave(group, dim=1)
        out, weights = sdpa(q, k, v, mask)  # (B, H, n_q, d_head), (B, H, n_q, n_k)
        return self.w_o(merge_heads(out)), weights

    def forward(self, query, key, value, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        mask = check_qkv(self.d_model, query, key, value, mask)
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

    def step(self, ids_new: torch.Tensor, caches: list) -> torch.Tensor:
        """Logits ``(B, t, vocab)`` of the new tokens ``(B, t)`` only, every layer's keys
        and values appended to ``caches`` (one cache per block)."""
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
    use_cache: bool = True,
) -> torch.Tensor:
    """Append ``n_tokens`` sampled tokens to ``prompt (B, T0)``; returns ``(B, T0 +
    n_tokens)``. Without the cache every step recomputes the whole prefix; with it each
    step runs only the newest token (same tokens, fewer operations)."""
    require_tensor("prompt", prompt, floating=False)
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


# ----------------------------------------------------------------------------- data plumbing
def encode_sentences(
    sentences: Sequence[Sentence | Sequence[str]], vocab, device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inputs, targets, mask)``, each ``(N, T)``: inputs ``<bos> w_1 .. w_{n-1}``,
    targets ``w_1 .. w_n`` (the final ``"."`` included), padding masked out."""
    rows = [s.words if isinstance(s, Sentence) else list(s) for s in sentences]
    T = max(len(r) for r in rows)
    inputs = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    targets = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        ids = [vocab.stoi[w] for w in r]
        inputs[i, : len(ids)] = torch.tensor([BOS_ID, *ids[:-1]])
        targets[i, : len(ids)] = torch.tensor(ids)
    mask = targets != PAD_ID
    return inputs.to(device), targets.to(device), mask.to(device)


def batch_loss(model: GPT, inputs, targets, mask) -> torch.Tensor:
    """Mean next-token cross-entropy over the real tokens (nats)."""
    T = int(mask.sum(1).max())
    logits = model(inputs[:, :T])
    return nn.functional.cross_entropy(logits[mask[:, :T]], targets[:, :T][mask[:, :T]])


@torch.no_grad()
def cross_entropy(model: GPT, sentences, vocab, batch_size: int = 500) -> float:
    """Held-out cross-entropy in nats per token (every word and the final ``"."``)."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    with evaluating(model):
        for i in range(0, len(sentences), batch_size):
            inputs, targets, mask = encode_sentences(sentences[i : i + batch_size], vocab, device)
            logits = model(inputs)
            nll = nn.functional.cross_entropy(logits[mask], targets[mask], reduction="sum")
            total += float(nll)
            n += int(mask.sum())
    return total / n


@torch.no_grad()
def sentence_nll(model: GPT, sentences, vocab, batch_size: int = 500) -> torch.Tensor:
    """Each sentence's total ``-log q`` under the model (nats, every word and the final
    ``"."``): ``(N,)`` float64 on the CPU. Its sum over the number of tokens is
    :func:`cross_entropy`."""
    device = next(model.parameters()).device
    out = []
    with evaluating(model):
        for i in range(0, len(sentences), batch_size):
            inputs, targets, mask = encode_sentences(sentences[i : i + batch_size], vocab, device)
            logits = model(inputs)
            nll = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            out.append((nll * mask).double().sum(1).cpu())
    return torch.cat(out)


def per_token_standard_error(nll: torch.Tensor, lengths: torch.Tensor) -> float:
    """The standard error of ``nll.sum() / lengths.sum()``, an average per token over
    sentences drawn independently (``nll`` and ``lengths`` per sentence; the delta method
    for a ratio of sums)."""
    nll, lengths = nll.double(), lengths.double()
    n = len(nll)
    if n < 2:
        raise ValueError(f"need at least 2 sentences; got {n}")
    ratio = nll.sum() / lengths.sum()
    resid = nll - ratio * lengths
    return float(resid.pow(2).sum().div(n * (n - 1)).sqrt() / lengths.mean())


@torch.no_grad()
def agreement(model: GPT, sentences: Sequence[Sentence], vocab) -> float:
    """Share of sentences where the model gives the correct main verb a higher
    probability than the same verb with the other number, given the words before it."""
    device = next(model.parameters()).device
    with evaluating(model):
        inputs, _, _ = encode_sentences(sentences, vocab, device)
        logits = model(inputs)  # (N, T, V)
    ok = []
    for i, s in enumerate(sentences):
        row = logits[i, s.verb_pos]  # predicts words[verb_pos]
        ok.append(float(row[vocab.stoi[s.words[s.verb_pos]]] > row[vocab.stoi[s.wrong_verb]]))
    return sum(ok) / len(ok)


@torch.no_grad()
def sample_sentences(
    model: GPT,
    vocab,
    n: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    max_len: int = 24,
) -> list[list[str]]:
    """``n`` sentences sampled from ``<bos>``, each cut after its first ``"."``."""
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    prompt = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
    with evaluating(model):
        ids = generate(
            model, prompt, max_len, temperature=temperature, top_k=top_k, top_p=top_p, generator=g
        )
    out = []
    for row in ids[:, 1:].tolist():
        words = [vocab.itos[i] for i in row]
        out.append(words[: words.index(".") + 1] if "." in words else words)
    return out


def sample_quality(sentences: list[list[str]], data: GrammarData) -> dict[str, float]:
    """Grammaticality, novelty (share of the grammatical ones not in the training set) and
    distinct bigrams/trigrams of sampled sentences."""
    gram = [s for s in sentences if data.grammar.is_grammatical(s)]
    novel = [s for s in gram if tuple(s) not in data.train_set]
    return {
        "grammatical": len(gram) / len(sentences),
        "novel": len(novel) / max(len(gram), 1),
        "distinct_2": distinct_ngrams(sentences, 2),
        "distinct_3": distinct_ngrams(sentences, 3),
    }


@torch.no_grad()
def subject_attention(
    model: GPT, sentences: Sequence[Sentence], vocab, *, query: str = "verb"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention weight of every head (``(n_layers, n_heads)`` each) from the query
    position to the subject noun and to the attractor noun, over ``sentences``.

    ``query="verb"``: the position where the main verb is the input (the model's input is
    ``<bos> w_1 ...``, so word ``i`` sits at position ``i + 1``); ``query="before_verb"``:
    the position whose output predicts the verb."""
    device = next(model.parameters()).device
    with evaluating(model):
        inputs, _, _ = encode_sentences(sentences, vocab, device)
        _, weights = model(inputs, return_weights=True)
    w = torch.stack(weights, 1)  # (N, L, H, T, T)
    rows = torch.arange(len(sentences), device=device)
    shift = 1 if query == "verb" else 0
    q = torch.tensor([s.verb_pos + shift for s in sentences], device=device)
    subj = torch.tensor([s.subject_pos + 1 for s in sentences], device=device)
    attr = torch.tensor(
        [
            (s.attractor_pos if s.attractor_pos is not None else s.subject_pos) + 1
            for s in sentences
        ],
        device=device,
    )
    at_q = w[rows, :, :, q]  # (N, L, H, T)
    to_subj = at_q[rows, :, :, subj].mean(0)  # (L, H)
    to_attr = at_q[rows, :, :, attr].mean(0)
    return to_subj.cpu(), to_attr.cpu()


def time_generation(model: GPT, prompt: torch.Tensor, n_tokens: int, use_cache: bool):
    """``(seconds, tokens)`` of greedy generation of ``n_tokens`` after ``prompt``, timed
    by the benchmark's timer (:func:`attention_ref.bench.best_time`, one run), which waits
    for the GPU to finish before it reads the clock."""
    from .bench import best_time

    out = []
    with evaluating(model):
        seconds = best_time(
            lambda: out.append(
                generate(model, prompt, n_tokens, temperature=0, use_cache=use_cache)
            ),
            prompt.device,
            repeats=1,
        )
    return seconds, out[-1]


# ----------------------------------------------------------------------------- training
GPT_CONFIG = dict(
    n_train=100000,
    d_model=64,
    n_heads=4,
    n_layers=2,
    d_ff=256,
    dropout=0.0,
    steps=1800,
    batch_size=256,
    lr=1.2e-2,
    warmup=50,
    # No weight decay: with each of 100,000 sentences drawn four or five times there is no
    # overfitting to hold back, and decay would pull the tied embeddings, so the logits,
    # towards zero, keeping probability on words that cannot come next.
    weight_decay=0.0,
    # None: PyTorch's own thread count (every core; the tests pin one per process).
    cpu_threads=None,
)


def make_gpt(vocab_size: int, config: dict | None = None, **overrides: Any) -> GPT:
    cfg = {**GPT_CONFIG, **(config or {}), **overrides}
    return GPT(
        vocab_size,
        cfg["d_model"],
        cfg["n_heads"],
        cfg["n_layers"],
        cfg["d_ff"],
        max_len=cfg.get("max_len", 128),
        dropout=cfg["dropout"],
        n_kv_heads=cfg.get("n_kv_heads"),
    )


def fit(
    model: GPT,
    data: GrammarData,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    warmup: int = 50,
    seed: int = 0,
    progress: bool = True,
    desc: str = "GPT",
    weight_decay: float = 0.0,
    cpu_threads: int | None = None,
) -> TrainResult:
    """Train ``model`` on ``data.train`` with :func:`~attention_ref.training.train`."""
    device = next(model.parameters()).device
    inputs, targets, mask = encode_sentences(data.train, data.vocab, device)
    stream = Stream(len(data.train), batch_size, seed=seed)

    def loss_fn(m: nn.Module, idx) -> torch.Tensor:
        idx = torch.as_tensor(idx, device=device)
        return batch_loss(m, inputs[idx], targets[idx], mask[idx])

    return train(
        model,
        loss_fn,
        stream,
        steps=steps,
        lr=lr,
        warmup=warmup,
        progress=progress,
        desc=desc,
        weight_decay=weight_decay,
        time_limit=None,
        cpu_threads=cpu_threads,
    )


@dataclass
class GPTResult:
    """What :func:`train_gpt` measured (``metric``/``value`` as for the applications)."""

    metric: str
    value: float
    train_seconds: float
    model: GPT
    data: GrammarData
    history: TrainResult
    figures: dict[str, float] = field(default_factory=dict)

    def extras(self) -> str:
        """The figures for the benchmark line, ``key=value`` separated by spaces."""
        f = self.figures
        keys = ("agreement", "grammatical", "novel", "bigram_ratio", "bigram_agreement")
        parts = [f"{k}={f[k]:.3f}" for k in keys]
        parts += [
            f"floor={f['floor']:.4f}",
            f"steps={self.history.steps}",
            f"steps_per_second={f['steps_per_second']:.1f}",
            f"threads={self.history.threads}",
        ]
        return " ".join(parts)


def train_gpt(
    seed: int = 0, device=None, *, progress: bool = True, samples: int = 1000
) -> GPTResult:
    """Generate the grammar data, train the GPT of ``GPT_CONFIG`` as notebook 11 does and
    measure it: held-out cross-entropy over the entropy floor, agreement on attractor
    sentences, the share of grammatical and novel samples at temperature 1, and the same
    for the count-based bigram baseline."""
    cfg = GPT_CONFIG
    device = torch.device(device) if device is not None else pick_device()
    data = make_grammar_data(cfg["n_train"], seed=seed)
    seed_everything(seed)
    model = make_gpt(len(data.vocab)).to(device)
    hist = fit(
        model,
        data,
        steps=cfg["steps"],
        batch_size=cfg["batch_size"],
        lr=cfg["lr"],
        warmup=cfg["warmup"],
        weight_decay=cfg["weight_decay"],
        seed=seed,
        progress=progress,
        cpu_threads=cfg["cpu_threads"],
    )
    floor = data.floor()
    ce = cross_entropy(model, data.test, data.vocab)
    attractors = data.attractor_test()
    bigram = BigramModel(data.vocab.itos[len(SPECIALS) :]).fit(
        [s.words for s in data.train], [s.words for s in data.valid]
    )
    t0 = time.perf_counter()
    quality = sample_quality(sample_sentences(model, data.vocab, samples, seed=seed), data)
    figures = {
        "floor": floor,
        "cross_entropy": ce,
        "agreement": agreement(model, attractors, data.vocab),
        "grammatical": quality["grammatical"],
        "novel": quality["novel"],
        "bigram_ratio": bigram.cross_entropy([s.words for s in data.test]) / floor,
        "bigram_agreement": bigram.agreement(attractors),
        "steps_per_second": hist.steps / max(hist.seconds, 1e-9),
        "sample_seconds": time.perf_counter() - t0,
    }
    return GPTResult(
        "cross_entropy_over_floor", ce / floor, hist.seconds, model, data, hist, figures
    )
