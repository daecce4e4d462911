"""Extractive summarization (notebook 10): sentence scoring, selection, F1, and the
attention shortcut it is compared with.

The summariser encodes the whole document, averages the token vectors of each sentence
(:func:`pool_sentences`) and scores each sentence with a linear layer; a sentence is in
the summary when its logit is positive. :func:`attention_received` is the popular
shortcut that ranks sentences by how much attention their tokens receive instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._validate import require_tensor
from ..data.summarization import SummaryData, SummaryExample, make_summarization_data
from ..data.vocab import Vocab, pad_batch
from ..training import Stream, evaluating, pick_device, seed_everything, train
from .qa import AppResult, encoder_for_app


def _k_per_row(k: int | torch.Tensor, B: int, device: torch.device) -> torch.Tensor:
    if isinstance(k, torch.Tensor):
        if k.dim() == 0:
            return k.to(device=device, dtype=torch.long).expand(B)
        if tuple(k.shape) != (B,):
            raise ValueError(f"k must be an int or a (batch,) tensor; got shape {tuple(k.shape)}")
        if k.is_floating_point():
            raise TypeError(f"k must hold integers; got {k.dtype}")
        return k.to(device=device, dtype=torch.long)
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int or a (batch,) long tensor; got {type(k).__name__}")
    return torch.full((B,), k, dtype=torch.long, device=device)


def select_sentences(
    scores: torch.Tensor, mask: torch.Tensor, k: int | torch.Tensor
) -> torch.Tensor:
    """Pick the ``k`` highest-scoring real sentences of each document.

    Args:
        scores: ``(B, S)`` float, one score per sentence.
        mask: ``(B, S)`` bool, True at real sentences, False at padding.
        k: how many to pick, an int for every document or a ``(B,)`` long tensor (one per
            document); a document with fewer than ``k[b]`` real sentences gets all of them.

    Returns:
        A bool tensor ``(B, S)``, True at the selected sentences (so the summary keeps the
        document's order). Padding is never selected.
    """
    require_tensor("scores", scores)
    require_tensor("mask", mask, floating=False)
    if scores.dim() != 2 or tuple(mask.shape) != tuple(scores.shape):
        raise ValueError(
            f"scores and mask must both be (batch, sentences); got {tuple(scores.shape)} and "
            f"{tuple(mask.shape)}"
        )
    B, S = scores.shape
    k = _k_per_row(k, B, scores.device)
    filled = scores.masked_fill(~mask, float("-inf"))
    order = filled.argsort(dim=1, descending=True, stable=True)  # (B, S), best first
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(S, device=scores.device).expand(B, S)
    )
    return (rank < k[:, None]) & mask


def sentence_f1(pred: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Per-document F1 of the selected sentences against the reference summary.

    Args:
        pred, gold: ``(B, S)`` bool, True at the selected / reference sentences.

    Returns:
        ``(B,)`` float32: ``2 TP / (2 TP + FP + FN)`` per document (the harmonic mean of
        precision and recall), and 1.0 for a document where both are empty.
    """
    for name, t in (("pred", pred), ("gold", gold)):
        require_tensor(name, t, floating=False)
        if t.dtype != torch.bool:
            raise TypeError(f"{name} must be boolean; got {t.dtype}")
    if pred.dim() != 2 or pred.shape != gold.shape:
        raise ValueError(
            f"pred and gold must both be (batch, sentences); got {tuple(pred.shape)} and "
            f"{tuple(gold.shape)}"
        )
    tp = (pred & gold).sum(1).float()
    fp = (pred & ~gold).sum(1).float()
    fn = (~pred & gold).sum(1).float()
    denom = 2 * tp + fp + fn
    return torch.where(denom > 0, 2 * tp / denom.clamp(min=1), torch.ones_like(denom))


def pool_sentences(h: torch.Tensor, sentence_ids: torch.Tensor, n_sentences: int) -> torch.Tensor:
    """Average the token vectors of each sentence.

    Args:
        h: ``(B, T, D)`` token vectors.
        sentence_ids: ``(B, T)`` long, the sentence of each token, -1 for tokens in no
            sentence (the header, padding).
        n_sentences: ``S``, the number of sentence slots.

    Returns:
        ``(B, S, D)``: the mean of the vectors of sentence s's tokens (zeros for an empty
        slot). Dtype and device follow ``h``.
    """
    require_tensor("h", h)
    require_tensor("sentence_ids", sentence_ids, floating=False)
    if h.dim() != 3 or tuple(sentence_ids.shape) != tuple(h.shape[:2]):
        raise ValueError(
            f"h must be (batch, seq, d) and sentence_ids (batch, seq); got h {tuple(h.shape)} "
            f"and sentence_ids {tuple(sentence_ids.shape)}"
        )
    if isinstance(n_sentences, bool) or not isinstance(n_sentences, int) or n_sentences < 1:
        raise ValueError(f"n_sentences must be an int >= 1; got {n_sentences!r}")
    onehot = sentence_ids[:, None, :] == torch.arange(n_sentences, device=h.device)[None, :, None]
    weights = onehot.to(h.dtype)  # (B, S, T): 1 where token t belongs to sentence s
    counts = weights.sum(-1, keepdim=True).clamp(min=1)  # (B, S, 1)
    return weights @ h / counts  # (B, S, D)


def attention_received(
    weights: torch.Tensor, token_mask: torch.Tensor, sentence_ids: torch.Tensor, n_sentences: int
) -> torch.Tensor:
    """The "attention as importance" shortcut: how much attention each sentence receives.

    Args:
        weights: ``(B, H, T, T)`` attention weights of one layer (or their average over
            layers), rows = queries.
        token_mask: ``(B, T)`` bool, True at real tokens (only their queries count).
        sentence_ids: ``(B, T)`` long, each token's sentence, -1 for none.
        n_sentences: ``S``.

    Returns:
        ``(B, S)``: the attention each key token receives, summed over the real queries and
        averaged over heads, then averaged over the tokens of each sentence.
    """
    w = weights.mean(1) * token_mask[:, :, None].to(weights.dtype)  # (B, T_q, T_k)
    received = w.sum(1)  # (B, T_k): column sums
    return pool_sentences(received[..., None], sentence_ids, n_sentences)[..., 0]


# ----------------------------------------------------------------------------- batching
@dataclass
class SummaryBatch:
    """A padded batch of documents.

    ``ids (B, T)`` long, padded with 0; ``sentence_ids (B, T)`` long, each token's body
    sentence (-1 in the header and the padding); ``labels (B, S)`` bool, True at summary
    sentences; ``sentence_mask (B, S)`` bool, True at real sentences.
    """

    ids: torch.Tensor
    sentence_ids: torch.Tensor
    labels: torch.Tensor
    sentence_mask: torch.Tensor

    def to(self, device: torch.device | str | None) -> SummaryBatch:
        return SummaryBatch(
            *(t.to(device) for t in (self.ids, self.sentence_ids, self.labels, self.sentence_mask))
        )

    def __getitem__(self, idx: Any) -> SummaryBatch:
        """Rows ``idx``, trimmed to their longest document and largest sentence count."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        ids = self.ids[idx]
        T = int((ids != 0).sum(1).max())
        S = int(self.sentence_mask[idx].sum(1).max())
        return SummaryBatch(
            ids[:, :T],
            self.sentence_ids[idx, :T],
            self.labels[idx, :S],
            self.sentence_mask[idx, :S],
        )


def summary_vocab(data: SummaryData) -> Vocab:
    """The vocabulary of the training documents."""
    return Vocab.build(d.tokens for d in data.train)


def encode_summaries(docs: Sequence[SummaryExample], vocab: Vocab) -> SummaryBatch:
    """Token ids, each token's sentence, and the sentence labels, padded."""
    if len(docs) == 0:
        raise ValueError("docs must hold at least one SummaryExample; got none")
    ids, _ = pad_batch([vocab.encode(d.tokens) for d in docs], pad_id=vocab.pad_id)
    sids, _ = pad_batch([[s + 1 for s in d.sentence_ids] for d in docs], pad_id=0)
    labels, smask = pad_batch([[int(x) for x in d.labels] for d in docs], pad_id=0)
    return SummaryBatch(ids, sids - 1, labels.bool(), smask)


# ----------------------------------------------------------------------------- the model
def sentence_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of each real sentence's logit against its label, averaged over
    the real sentences (padding slots count for nothing)."""
    per = nn.functional.binary_cross_entropy_with_logits(
        logits, labels.to(logits.dtype), reduction="none"
    )  # (B, S)
    m = mask.to(logits.dtype)
    return (per * m).sum() / m.sum().clamp(min=1)


class Summarizer(nn.Module):
    """The extractive summariser: an :class:`~attention_ref.encoder.Encoder` over the
    document, :func:`pool_sentences`, and ``score = nn.Linear(d_model, 1)``.

    forward(ids ``(B, T)``, sentence_ids ``(B, T)``, n_sentences ``S``) returns
    ``(logits (B, S), weights)``; a sentence is in the summary when its logit is > 0.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 32,
        n_heads: int = 2,
        d_ff: int = 64,
        n_layers: int = 1,
        max_len: int = 128,
    ) -> None:
        super().__init__()
        self.encoder = encoder_for_app(vocab_size, d_model, n_heads, d_ff, n_layers, max_len)
        self.score = nn.Linear(d_model, 1)

    def forward(
        self, ids: torch.Tensor, sentence_ids: torch.Tensor, n_sentences: int
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h, weights = self.encoder(ids)  # (B, T, D), [(B, H, T, T)] * n_layers
        sent = pool_sentences(h, sentence_ids, n_sentences)  # (B, S, D)
        return self.score(sent).squeeze(-1), weights  # (B, S)


@dataclass
class SummaryPredictions:
    """Everything the evaluation computes on a set of documents (CPU tensors)."""

    logits: torch.Tensor  # (N, S)
    received: torch.Tensor  # (N, S): attention received, averaged over layers
    labels: torch.Tensor  # (N, S) bool
    mask: torch.Tensor  # (N, S) bool


def predict_summaries(
    model: Summarizer, batch: SummaryBatch, batch_size: int = 250
) -> SummaryPredictions:
    """The model's sentence logits and the attention each sentence receives."""
    device = next(model.parameters()).device
    S = batch.labels.shape[1]
    logits, received = [], []
    with evaluating(model):
        for i in range(0, batch.ids.shape[0], batch_size):
            ids = batch.ids[i : i + batch_size].to(device)
            sids = batch.sentence_ids[i : i + batch_size].to(device)
            lg, weights = model(ids, sids, S)
            w = torch.stack(weights).mean(0)  # (B, H, T, T): averaged over layers
            received.append(attention_received(w, ids != 0, sids, S).cpu())
            logits.append(lg.cpu())
    return SummaryPredictions(
        torch.cat(logits), torch.cat(received), batch.labels, batch.sentence_mask
    )


SUMMARY_CONFIG = dict(
    n_train=4000,
    n_test=500,
    d_model=32,
    n_heads=2,
    d_ff=64,
    n_layers=1,
    steps=500,
    batch_size=32,
    lr=3e-3,
    warmup=30,
)


def train_summarization(
    seed: int = 0, device: torch.device | str | None = None, *, progress: bool = True
) -> AppResult:
    """Generate the documents, train the :class:`Summarizer` for a fixed number of steps
    (``SUMMARY_CONFIG``) and measure sentence F1 on the held-out documents (a sentence is
    selected when its logit is > 0), as notebook 10 does.

    Returns an :class:`AppResult` with ``metric="sentence_f1"``.
    """
    cfg = SUMMARY_CONFIG
    device = torch.device(device) if device is not None else pick_device()
    seed_everything(seed)
    data = make_summarization_data(cfg["n_train"], cfg["n_test"], seed=seed)
    vocab = summary_vocab(data)
    train_set = encode_summaries(data.train, vocab)
    test_set = encode_summaries(data.test, vocab)
    model = Summarizer(len(vocab), cfg["d_model"], cfg["n_heads"], cfg["d_ff"], cfg["n_layers"]).to(
        device
    )
    stream = Stream(len(data.train), cfg["batch_size"], seed=seed)

    def loss_fn(m: nn.Module, idx: Any) -> torch.Tensor:
        b = train_set[idx].to(device)
        logits, _ = m(b.ids, b.sentence_ids, b.labels.shape[1])
        return sentence_loss(logits, b.labels, b.sentence_mask)

    history = train(
        model,
        loss_fn,
        stream,
        steps=cfg["steps"],
        lr=cfg["lr"],
        warmup=cfg["warmup"],
        progress=progress,
        desc="summariser",
        time_limit=None,  # a fixed number of steps: the same model on every machine
    )
    pred = predict_summaries(model, test_set)
    chosen = (pred.logits > 0) & pred.mask
    value = float(sentence_f1(chosen, pred.labels).mean())
    return AppResult("sentence_f1", value, history.seconds, model, data, vocab, history, device)
