"""Notebook 13 as an application: the modern decoder against notebook 11's GPT on the
grammar of notebook 11, at equal parameter count and for the same training time (on a CPU
the training thread's CPU time, PyTorch held to one thread; on a GPU the wall clock: see
:func:`fit_for`).

- :func:`make_modern`: a :class:`~attention_ref.modern.ModernGPT` whose SwiGLU hidden size is
  chosen so that it has as many parameters as notebook 11's GPT (:func:`matched_d_ff`);
- :data:`LADDER` and :func:`make_step`: notebook 11's GPT changed one thing at a time
  (RMSNorm, SwiGLU, rotary positions, grouped-query heads and no biases);
- :func:`fit_for`: train for a given number of seconds, with a learning-rate schedule over
  the time budget (so it runs to its end however fast a step is);
- :func:`measure` and :func:`compare_blocks`: cross-entropy over the entropy floor and the
  share of grammatical samples, per block and seed;
- :func:`train_modern`: the benchmark (``python -m attention_ref.bench apps``): both models,
  60 s of training each, on two seeds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..data.grammar import GrammarData
from ..encoder import FeedForward
from ..modern import ModernGPT, RMSNorm, SwiGLU, count_parameters
from ..training import (
    Stream,
    TrainResult,
    grading_step_cap,
    seed_everything,
    under_autograde,
)
from .language_model import (
    GPT_CONFIG,
    batch_loss,
    cross_entropy,
    encode_sentences,
    make_gpt,
    sample_quality,
    sample_sentences,
)

#: The modern model: notebook 11's sizes (``GPT_CONFIG``), 2 key/value heads for 4 query
#: heads, no biases; the SwiGLU hidden size is matched to the GPT's parameter count.
MODERN_CONFIG = dict(
    d_model=GPT_CONFIG["d_model"],
    n_heads=GPT_CONFIG["n_heads"],
    n_layers=GPT_CONFIG["n_layers"],
    n_kv_heads=2,
)
#: Training: notebook 11's batch size, learning rate and warm-up for both models.
TRAIN_CONFIG = dict(
    batch_size=GPT_CONFIG["batch_size"], lr=GPT_CONFIG["lr"], warmup=GPT_CONFIG["warmup"]
)


def _relu_ff(d_model: int, d_ff: int | None) -> nn.Module:
    return FeedForward(d_model, 4 * d_model if d_ff is None else d_ff)


def _layer_norm(d_model: int, eps: float = 1e-5) -> nn.Module:
    return nn.LayerNorm(d_model, eps=eps)


#: Training in the notebook, a few seconds per model: a smaller batch and a short warm-up
#: (more steps in the time; the benchmark uses :data:`TRAIN_CONFIG`).
NOTEBOOK_TRAIN = dict(batch_size=64, lr=6e-3, warmup=10)


#: Notebook 11's GPT, then one change at a time: ``(name, ModernGPT options)``. The first
#: step is notebook 11's architecture rebuilt from the modern model's parts.
LADDER: list[tuple[str, dict[str, Any]]] = [
    ("notebook 11 (LayerNorm, ReLU, learned positions, biases)",
     dict(norm=_layer_norm, ff=_relu_ff, learned_positions=True, bias=True, out_bias=True,
          n_kv_heads=None)),
    ("+ RMSNorm",
     dict(norm=RMSNorm, ff=_relu_ff, learned_positions=True, bias=True, out_bias=True,
          n_kv_heads=None)),
    ("+ SwiGLU",
     dict(norm=RMSNorm, ff=SwiGLU, learned_positions=True, bias=True, out_bias=True,
          n_kv_heads=None)),
    ("+ rotary positions",
     dict(norm=RMSNorm, ff=SwiGLU, learned_positions=False, bias=True, out_bias=True,
          n_kv_heads=None)),
    ("+ grouped-query heads, no biases (the modern block)",
     dict(norm=RMSNorm, ff=SwiGLU, learned_positions=False, bias=False, out_bias=False,
          n_kv_heads=2)),
]  # fmt: skip


def gpt_parameters(vocab_size: int) -> int:
    """The parameters of notebook 11's GPT (``make_gpt``) for this vocabulary."""
    return count_parameters(make_gpt(vocab_size))


def matched_d_ff(vocab_size: int, target: int, **options: Any) -> int:
    """The SwiGLU hidden size that brings a :class:`ModernGPT` (``MODERN_CONFIG`` and
    ``options``) closest to ``target`` parameters."""
    cfg = {**MODERN_CONFIG, **options}

    def params(d_ff: int) -> int:
        return count_parameters(ModernGPT(vocab_size, d_ff=d_ff, **cfg))

    base, one_more = params(1), params(2)
    per_unit = one_more - base  # every hidden unit costs the same in every layer
    d_ff = max(1, round((target - base) / per_unit) + 1)
    return min((d_ff - 1, d_ff, d_ff + 1), key=lambda f: (abs(params(max(f, 1)) - target), f))


def make_step(vocab_size: int, options: dict[str, Any], match: int | None = None) -> ModernGPT:
    """A model of :data:`LADDER` (its ``options``); with ``match``, a SwiGLU step's hidden
    size is chosen to give ``match`` parameters."""
    cfg = {**MODERN_CONFIG, **options}
    if match is not None and cfg.get("ff", SwiGLU) is SwiGLU:
        cfg["d_ff"] = matched_d_ff(vocab_size, match, **options)
    return ModernGPT(vocab_size, max_len=GPT_CONFIG.get("max_len", 128), **cfg)


def make_modern(vocab_size: int, match: int | None = None) -> ModernGPT:
    """The modern model (the last step of :data:`LADDER`), with as many parameters as
    notebook 11's GPT unless ``match`` says otherwise."""
    target = gpt_parameters(vocab_size) if match is None else match
    return make_step(vocab_size, LADDER[-1][1], match=target)


def fit_for(
    model: nn.Module,
    data: GrammarData,
    seconds: float,
    *,
    seed: int = 0,
    **config: Any,
) -> TrainResult:
    """Train ``model`` on ``data.train`` (AdamW, gradient clipping at 1) for ``seconds`` of
    training time, with a schedule that runs to its end whatever the speed of a step:
    linear warm-up over the first ``warmup`` steps, then cosine decay to 5% of ``lr`` over
    the *time* budget. So two models get the same time however fast each step is.

    On a CPU the clock is the training thread's CPU time (PyTorch runs on that one thread,
    restored after): on a quiet machine the wall clock, and on a busy one other processes
    cannot take a model's time. On a GPU it is the wall clock (synchronised). Batch size,
    learning rate and warm-up are :data:`TRAIN_CONFIG`'s unless ``config`` overrides them.
    While nbgrader autogrades, only a token few steps are taken (as
    :func:`~attention_ref.training.train` does). The result's ``seconds`` is that clock's
    time."""
    device = next(model.parameters()).device
    inputs, targets, mask = encode_sentences(data.train, data.vocab, device)
    cfg = {**TRAIN_CONFIG, **config}
    batches = Stream(len(data.train), cfg["batch_size"], seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    cap = grading_step_cap(2) if under_autograde() else None
    on_cpu = device.type == "cpu"

    def clock() -> float:
        if not on_cpu and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.thread_time() if on_cpu else time.perf_counter()

    threads = torch.get_num_threads()
    if on_cpu:
        torch.set_num_threads(1)
    result = TrainResult(threads=1 if on_cpu else None)
    model.train()
    start = clock()
    try:
        while (used := clock() - start) < seconds and (cap is None or result.steps < cap):
            step = result.steps
            if step < cfg["warmup"]:
                lr = cfg["lr"] * (step + 1) / cfg["warmup"]
            else:
                lr = cfg["lr"] * (0.05 + 0.475 * (1 + math.cos(math.pi * used / seconds)))
            for group in opt.param_groups:
                group["lr"] = lr
            idx = torch.as_tensor(next(batches), device=device)
            loss = batch_loss(model, inputs[idx], targets[idx], mask[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            result.losses.append(float(loss.detach()))
            result.steps = step + 1
        result.seconds = clock() - start
    finally:
        torch.set_num_threads(threads)
    model.eval()
    if cap is not None:
        print(f"autograding: {result.steps} steps only; the results are not meaningful")
    return result


@dataclass
class Run:
    """One trained model's figures (``seconds``: training time on :func:`fit_for`'s clock)."""

    name: str
    seed: int
    parameters: int
    steps: int
    seconds: float
    ce_over_floor: float
    grammatical: float
    losses: list[float] = field(default_factory=list, repr=False)


def measure(
    name: str, model: nn.Module, data: GrammarData, history: TrainResult, seed: int, samples: int
) -> Run:
    """Cross-entropy over the floor on the test sentences and the share of grammatical
    sentences among ``samples`` sampled at temperature 1."""
    ce = cross_entropy(model, data.test, data.vocab)
    quality = sample_quality(sample_sentences(model, data.vocab, samples, seed=seed), data)
    return Run(name, seed, count_parameters(model), history.steps, history.seconds,
               ce / data.floor(), quality["grammatical"], history.losses)  # fmt: skip


BLOCKS: dict[str, Callable[[int], nn.Module]] = {
    "GPT (notebook 11)": make_gpt,
    "modern": make_modern,
}


def compare_blocks(
    data: GrammarData,
    seconds: float,
    seeds: Sequence[int] = (0, 1),
    samples: int = 200,
    device=None,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    **config: Any,
) -> list[Run]:
    """Notebook 11's GPT and the modern model, each trained for ``seconds`` on every seed
    (the same data, the same batches for both), measured by :func:`measure`. ``prepare``,
    if given, is applied to each model as it is built (notebook 13, graded, puts in the
    learner's parts)."""
    runs = []
    for seed in seeds:
        for name, make in BLOCKS.items():
            seed_everything(seed)
            model = make(len(data.vocab))
            if prepare is not None:
                model = prepare(model)
            model = model.to(device or "cpu")
            hist = fit_for(model, data, seconds, seed=seed, **config)
            runs.append(measure(name, model, data, hist, seed, samples))
    return runs


@dataclass
class ModernResult:
    """What :func:`train_modern` measured (``metric``/``value`` as for the other apps)."""

    metric: str
    value: float
    train_seconds: float
    runs: list[Run]

    def extras(self) -> str:
        parts = []
        for name, key in (("GPT (notebook 11)", "gpt"), ("modern", "modern")):
            rs = [r for r in self.runs if r.name == name]
            parts.append(f"{key}_ce_over_floor=" + "/".join(f"{r.ce_over_floor:.4f}" for r in rs))
            parts.append(f"{key}_grammatical=" + "/".join(f"{r.grammatical:.3f}" for r in rs))
            parts.append(f"{key}_steps=" + "/".join(str(r.steps) for r in rs))
            parts.append(f"{key}_seconds=" + "/".join(f"{r.seconds:.1f}" for r in rs))
            parts.append(f"{key}_params={rs[0].parameters}")
        return " ".join(parts)


def train_modern(
    seconds: float = 60.0, seeds: Sequence[int] = (0, 1), samples: int = 1000
) -> ModernResult:
    """The benchmark: notebook 11's data (``GPT_CONFIG["n_train"]`` sentences), both models
    trained ``seconds`` each on every seed. ``value``: the modern model's worst
    cross-entropy over the floor across the seeds."""
    from ..data.grammar import make_grammar_data

    data = make_grammar_data(GPT_CONFIG["n_train"], seed=0)
    runs = compare_blocks(data, seconds, seeds, samples)
    worst = max(r.ce_over_floor for r in runs if r.name == "modern")
    return ModernResult(
        "modern_cross_entropy_over_floor", worst, max(r.seconds for r in runs), runs
    )
