"""Notebook 15's expert-load experiment: does the load-balancing loss spread the tokens?

A small language model on notebook 11's invented English (:class:`TinyMoELM`: a token
embedding, one mixture-of-experts feed-forward layer and the output layer) is trained with
and without the Switch Transformer's auxiliary loss; :func:`expert_load` returns each
expert's share of the held-out tokens' assignments. The notebook passes the learner's
``load_balancing_loss``; ``python -m attention_ref.bench apps`` the course's.

Example::

    load = expert_load(load_balancing_loss, alpha=0.1, seed=0)   # (8,), sums to 1
    coefficient_of_variation(load)                             # 0 when balanced
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..data.grammar import GrammarData, make_grammar_data
from ..data.vocab import pad_batch
from ..experts import MoEFeedForward
from ..modern import RMSNorm
from ..training import seed_everything

N_EXPERTS = 8
TOP_K = 2


class TinyMoELM(nn.Module):
    """Embedding, one residual mixture-of-experts layer (pre-norm), output layer.

    ``forward(ids (B, T)) -> logits (B, T, vocab_size)``; after a forward pass,
    ``self.moe.last_routing`` holds ``(gates, experts, probs)`` of the ``B*T`` tokens.
    """

    def __init__(
        self, vocab_size: int, d_model: int = 32, n_experts: int = N_EXPERTS, top_k: int = TOP_K
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.norm = RMSNorm(d_model)
        self.moe = MoEFeedForward(d_model, 32, n_experts, top_k)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)  # (B, T, d_model)
        return self.head(x + self.moe(self.norm(x)))


def expert_load(
    balancing_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    alpha: float,
    seed: int,
    *,
    steps: int = 150,
    device: torch.device | str = "cpu",
    data: GrammarData | None = None,
) -> torch.Tensor:
    """Train :class:`TinyMoELM` with loss ``lm + alpha * balancing_loss(probs, experts)``,
    both over the real tokens only (padding is left out of the balancing loss, as
    ``transformers`` leaves it out given an attention mask).

    Args:
        balancing_loss: ``(probs (N, E), experts (N, k)) -> scalar``, the auxiliary loss.
        alpha: its weight (0 trains on the language-model loss alone).
        seed: seeds the weights and the batches (32 sentences a step, Adam at 1e-2).
        steps: training steps.
        device: where the model trains.
        data: the grammar's sentences (default ``make_grammar_data(n_train=3000, seed=0)``).

    Returns:
        ``(N_EXPERTS,)`` float64 on the CPU: each expert's share of the assignments of the real
        tokens of 300 held-out sentences (sums to 1; ``1 / N_EXPERTS`` each when balanced).
    """
    data = data if data is not None else make_grammar_data(n_train=3000, seed=0)
    vocab_size = len(data.vocab)

    def encode(sentences):
        return pad_batch([data.vocab.encode(s.words, bos=True) for s in sentences])

    seed_everything(seed)
    model = TinyMoELM(vocab_size).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(0, len(data.train), (32,), generator=g)
        ids, real = encode([data.train[i] for i in batch])
        ids = ids.to(device)  # (32, T)
        logits = model(ids[:, :-1])  # (32, T-1, V)
        lm = nn.functional.cross_entropy(
            logits.reshape(-1, vocab_size), ids[:, 1:].reshape(-1), ignore_index=0
        )
        _, chosen, probs = model.moe.last_routing  # (N, k), (N, E)
        # the real tokens only, as transformers' load_balancing_loss_func does with an
        # attention mask: else the padding positions (one embedding, so all routed alike)
        # would be balanced too, though the language-model loss and the load leave them out
        real_in = real[:, :-1].reshape(-1).to(device)  # (N,)
        loss = lm + alpha * balancing_loss(probs[real_in], chosen[real_in])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ids, real = encode(data.test[:300])
        model(ids[:, :-1].to(device))
        real_tokens = real[:, :-1].reshape(-1).to(device)  # (N,) True at real tokens
        chosen = model.moe.last_routing[1][real_tokens]  # (N_real, k)
        load = torch.bincount(chosen.flatten(), minlength=N_EXPERTS).double().cpu()
    return load / load.sum()


def coefficient_of_variation(load: torch.Tensor) -> float:
    """Standard deviation over mean of the shares (population form); 0 when balanced."""
    return (load.std(correction=0) / load.mean()).item()


def dropped_share(load: torch.Tensor, capacity_factor: float) -> float:
    """The share of the assignments that experts of limited capacity drop, if the assignments
    ``load`` describes came in one batch: each expert takes at most ``capacity_factor / E`` of
    them (``capacity_factor`` times an equal share; the Switch Transformer's capacity), and
    the rest pass it by (the token keeps its residual stream for that expert).
    ``load (E,)``: each expert's share, summing to 1."""
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive; got {capacity_factor!r}")
    if load.dim() != 1 or abs(load.sum().item() - 1) > 1e-6:
        raise ValueError(f"load must be (E,) shares summing to 1; got {load.tolist()!r}")
    return (load - capacity_factor / load.numel()).clamp(min=0).sum().item()


@contextmanager
def single_threaded_on_cpu(device: torch.device | str) -> Iterator[None]:
    """Run torch on one thread on a CPU while the block runs (these matrices are tiny, and
    threads waiting for a busy core only slow them down); nothing changes on a GPU."""
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


__all__ = [
    "TinyMoELM",
    "expert_load",
    "coefficient_of_variation",
    "dropped_share",
    "single_threaded_on_cpu",
]
