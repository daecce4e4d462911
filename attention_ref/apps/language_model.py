"""The GPT of notebook 11 as an application: encoding the grammar's sentences, the
measurements of the notebook (cross-entropy, agreement, sample quality, the subject head,
generation time) and training (:func:`make_gpt`, :func:`fit`, :func:`train_gpt`).

The model itself is :mod:`attention_ref.gpt`; sampling is :mod:`attention_ref.sampling`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.grammar import BigramModel, GrammarData, Sentence, distinct_ngrams, make_grammar_data
from ..data.vocab import BOS_ID, PAD_ID, SPECIALS
from ..gpt import GPT
from ..sampling import generate
from ..training import Stream, TrainResult, evaluating, pick_device, seed_everything, train


# ----------------------------------------------------------------------------- data plumbing
def encode_sentences(
    sentences: Sequence[Sentence | Sequence[str]], vocab, device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inputs, targets, mask)``, each ``(N, T)``: inputs ``<bos> w_1 .. w_{n-1}``,
    targets ``w_1 .. w_n`` (the final ``"."`` included), padding masked out."""
    rows = [s.words if isinstance(s, Sentence) else list(s) for s in sentences]
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    T = max(int(lengths.max(initial=0)), 1)
    stoi = vocab.stoi
    ids = np.fromiter((stoi[w] for r in rows for w in r), dtype=np.int64, count=lengths.sum())
    real = np.arange(T) < lengths[:, None]  # (N, T): the positions that hold a word
    targets = np.full((len(rows), T), PAD_ID, dtype=np.int64)
    targets[real] = ids  # row by row, each row's words from position 0
    inputs = np.full_like(targets, PAD_ID)
    inputs[:, 0] = BOS_ID
    inputs[:, 1:] = targets[:, :-1]  # the targets shifted right by one, after <bos>
    inputs[~real] = PAD_ID
    inputs, targets = torch.from_numpy(inputs), torch.from_numpy(targets)
    mask = targets != PAD_ID
    return inputs.to(device), targets.to(device), mask.to(device)


def batch_loss(model: GPT, inputs, targets, mask, parts: int = 1) -> torch.Tensor:
    """Mean next-token cross-entropy over the real tokens (nats).

    ``parts > 1``: the same loss, and so the same gradient, computed on ``parts`` groups of
    sentences of similar length (the batch sorted by length and cut into ``parts`` groups,
    each run only as long as its longest sentence), so that less of the work is padding."""
    if parts <= 1:
        T = int(mask.sum(1).max())
        logits = model(inputs[:, :T])
        return nn.functional.cross_entropy(logits[mask[:, :T]], targets[:, :T][mask[:, :T]])
    lengths = mask.sum(1)
    total = 0.0
    for group in lengths.argsort().tensor_split(parts):
        if len(group) == 0:
            continue
        T = int(lengths[group].max())
        m = mask[group, :T]
        logits = model(inputs[group, :T])
        nll = nn.functional.cross_entropy(logits[m], targets[group, :T][m], reduction="sum")
        total = total + nll
    return total / lengths.sum()


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


def time_generation(
    model: GPT, prompt: torch.Tensor, n_tokens: int, use_cache: bool, repeats: int = 1
):
    """``(seconds, tokens)`` of greedy generation of ``n_tokens`` after ``prompt``, timed
    by the benchmark's timer (:func:`attention_ref.bench.best_time`: the fastest of
    ``repeats`` runs, after a warm-up run when there are several), which waits for the GPU
    to finish before it reads the clock."""
    from ..bench import best_time

    out = []
    with evaluating(model):
        seconds = best_time(
            lambda: out.append(
                generate(model, prompt, n_tokens, temperature=0, use_cache=use_cache)
            ),
            prompt.device,
            repeats=repeats,
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
    steps=1200,
    batch_size=160,
    lr=1.2e-2,
    warmup=50,
    # No weight decay: with each of 100,000 sentences drawn once or twice there is no
    # overfitting to hold back, and decay would pull the tied embeddings, so the logits,
    # towards zero, keeping probability on words that cannot come next.
    weight_decay=0.0,
    # One thread: a model this small trains as fast on one as on two (47 s for the 1,200
    # steps either way, on an idle 2-core machine) for half the CPU time, and far faster
    # on a busy machine, where threads wait for each other at every operation.
    cpu_threads=1,
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
    cpu_threads: int | None = 1,
    parts: int | None = None,
) -> TrainResult:
    """Train ``model`` on ``data.train`` with :func:`~attention_ref.training.train`: batches
    of ``batch_size`` sentences from a seeded :class:`~attention_ref.training.Stream`, the
    loss of each computed in ``parts`` groups of similar length (:func:`batch_loss`: the
    same loss and gradient as in one piece, less of the work spent on padding). ``parts``
    None: on a CPU one part per 80 sentences (a batch of 256 in 3 parts, which makes a step
    about a fifth cheaper on one thread; smaller parts cost more in overhead than they
    save), on a GPU one part (a model this small is bound by kernel launches there)."""
    device = next(model.parameters()).device
    if parts is None:
        parts = max(1, batch_size // 80) if device.type == "cpu" else 1
    inputs, targets, mask = encode_sentences(data.train, data.vocab, device)
    stream = Stream(len(data.train), batch_size, seed=seed)

    def loss_fn(m: nn.Module, idx) -> torch.Tensor:
        idx = torch.as_tensor(idx, device=device)
        return batch_loss(m, inputs[idx], targets[idx], mask[idx], parts)

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
