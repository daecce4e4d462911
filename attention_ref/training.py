"""Training utilities shared by the application notebooks (08-10).

- :func:`seed_everything` and :func:`pick_device`: the same run on every machine, on a
  GPU when there is one;
- :func:`masked_cross_entropy`: the token-level loss with padding ignored (an exercise of
  notebook 08);
- :func:`train`: a small training loop with AdamW, warm-up and cosine decay, gradient
  clipping, a tqdm progress bar (a widget in JupyterLab, text in a terminal) and a
  wall-clock cap; under nbgrader's autograde it runs only a few steps;
- :func:`under_autograde` and :data:`GRADING`: whether nbgrader is autograding;
- :class:`Stream`: endless seeded mini-batches of example indices.

The loop runs a fixed number of steps, so a given seed gives the same model (on the same
device); the time cap only protects a slow machine, and the result says whether it hit.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ._validate import require_tensor


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device() -> torch.device:
    """``cuda`` when a GPU is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------- the loss
def masked_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy over the real (unmasked) positions only.

    Args:
        logits: ``(B, T, V)`` unnormalised scores for each position's next token.
        targets: ``(B, T)`` integer ids of the correct tokens; at masked positions any
            integer (``-100``, PyTorch's ``ignore_index``, or an id outside the vocabulary):
            they are never used as indices.
        mask: ``(B, T)`` bool, True at the positions that count (real tokens), False at
            padding; at least one position is True.
        label_smoothing: ``eps`` in ``[0, 1]``, with the semantics of
            ``F.cross_entropy(label_smoothing=eps)``: the target distribution is
            ``(1 - eps)`` on the correct token plus ``eps / V`` on every token, so each
            position's loss is ``(1 - eps) * (-log p[target]) + eps * mean_v(-log p[v])``.
            The Transformer paper trains with ``eps = 0.1``.

    Returns:
        A scalar tensor: the per-position loss summed over the real positions and divided
        by ``mask.sum()`` (with ``eps = 0``, ``-sum(mask * log softmax(logits)[targets]) /
        mask.sum()``), the average over real tokens, so padding changes neither the value
        nor the gradient. Dtype and device follow ``logits``. Equal to
        ``F.cross_entropy(logits.transpose(1, 2), targets.masked_fill(~mask, -100),
        label_smoothing=eps)``.
    """
    require_tensor("logits", logits)
    require_tensor("targets", targets, floating=False)
    require_tensor("mask", mask, floating=False)
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, seq, vocab); got shape {tuple(logits.shape)}")
    if tuple(targets.shape) != tuple(logits.shape[:2]) or tuple(mask.shape) != tuple(targets.shape):
        raise ValueError(
            f"targets and mask must be (batch, seq) = {tuple(logits.shape[:2])}; got targets "
            f"{tuple(targets.shape)} and mask {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = real token); got {mask.dtype}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float):
        raise TypeError(f"label_smoothing must be a float in [0, 1]; got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1]; got {label_smoothing}")
    V = logits.shape[-1]
    safe = torch.where(mask, targets, torch.zeros_like(targets))  # (B, T): masked -> id 0
    if bool(((safe < 0) | (safe >= V)).any()):
        raise ValueError(f"targets at real (mask True) positions must be ids in [0, {V})")
    log_p = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    loss = -log_p.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if label_smoothing > 0:
        loss = (1 - label_smoothing) * loss - label_smoothing * log_p.mean(-1)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss.sum() / mask.sum().clamp(min=1).to(logits.dtype)


# ----------------------------------------------------------------------------- batches
class Stream:
    """Endless mini-batches of indices into ``range(n)``: epoch after epoch, each in a new
    seeded random order. ``next(stream)`` gives an int64 array of ``batch_size`` indices."""

    def __init__(self, n: int, batch_size: int, seed: int = 0) -> None:
        if n < 1 or batch_size < 1:
            raise ValueError(f"n and batch_size must be >= 1; got n={n}, batch_size={batch_size}")
        self.n, self.batch_size = n, batch_size
        self.rng = np.random.default_rng(seed)
        self._order = np.empty(0, dtype=np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while len(self._order) < self.batch_size:
            self._order = np.concatenate([self._order, self.rng.permutation(self.n)])
        out, self._order = self._order[: self.batch_size], self._order[self.batch_size :]
        return out


# ----------------------------------------------------------------------------- grading
def under_autograde() -> bool:
    """True while nbgrader autogrades the notebook (it sets ``NBGRADER_EXECUTION`` to
    ``autograde`` in the kernel). Training cells then run a token version of themselves:
    no graded cell depends on a trained model, so training it would only cost time."""
    return os.environ.get("NBGRADER_EXECUTION") == "autograde"


#: The environment variable that sets how many steps :func:`train` takes while autograding:
#: a number, or ``all`` to train in full (e.g. to show trained models in the feedback, or
#: to measure what grading cost before training was cut short). Unset: ``grading_steps``.
GRADING_STEPS_ENV = "ATTENTION_REF_GRADING_STEPS"


def grading_step_cap(default: int) -> int | None:
    """The steps :func:`train` takes while autograding: ``$ATTENTION_REF_GRADING_STEPS``
    (``all``: None, no cap) or ``default``."""
    raw = os.environ.get(GRADING_STEPS_ENV, "").strip()
    if not raw:
        return default
    if raw.lower() == "all":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{GRADING_STEPS_ENV} must be a whole number of steps >= 1 or 'all'; got {raw!r}"
        )
    return value


#: ``under_autograde()`` when the package was imported: write claims about a trained model
#: as ``assert GRADING or accuracy >= 0.95, ...`` so they hold in every normal run and are
#: skipped only while autograding (where :func:`train` runs ``grading_steps`` steps).
GRADING = under_autograde()


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    """What :func:`train` did: the loss of every step, how many steps, how long."""

    losses: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    timed_out: bool = False
    threads: int | None = None  # PyTorch's CPU threads while it trained (None on a GPU)

    def __repr__(self) -> str:
        tail = f", final loss {self.losses[-1]:.4f}" if self.losses else ""
        cut = " (stopped by the time limit)" if self.timed_out else ""
        return f"TrainResult({self.steps} steps in {self.seconds:.1f} s{tail}{cut})"

    def running_mean(self, window: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, means)`` to plot: the mean loss of each ``window`` consecutive steps
        (of all of them when fewer were taken, as while autograding), drawn at the last step
        of its window, steps counted from 1. ``ax.plot(*history.running_mean(20))``."""
        losses = np.asarray(self.losses, dtype=float)
        if len(losses) == 0:
            return np.arange(0), losses
        w = max(1, min(window, len(losses)))
        means = np.convolve(losses, np.ones(w) / w, mode="valid")  # (len - w + 1,)
        return np.arange(w, len(losses) + 1), means


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up for ``warmup`` steps, then cosine decay to 5% of ``lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    batches: Iterator[Any],
    *,
    steps: int,
    lr: float = 3e-3,
    warmup: int = 50,
    weight_decay: float = 0.01,
    clip: float = 1.0,
    time_limit: float | None = 60.0,
    progress: bool = True,
    desc: str = "training",
    cpu_threads: int | None = 1,
    grading_steps: int = 2,
) -> TrainResult:
    """Train ``model`` for ``steps`` steps of AdamW on ``loss_fn(model, next(batches))``.

    Args:
        model: the module to train (put in train mode for the loop, eval mode after).
        loss_fn: returns the scalar loss of one batch.
        batches: an iterator of batches (anything ``loss_fn`` understands).
        steps: the number of optimisation steps; with the seeds fixed, the same steps
            give the same model.
        lr, warmup: peak learning rate and warm-up steps (then cosine decay).
        clip: the gradient-norm clip (None for none).
        time_limit: stop early after this many seconds (None: no limit); the result's
            ``timed_out`` says whether it did.
        progress: show a progress bar (tqdm: a widget in JupyterLab, text elsewhere).
        cpu_threads: PyTorch intra-op threads while training on the CPU, restored after
            (None: leave PyTorch's setting). The course's models are small: one thread is
            as fast as two on an idle machine, many times faster on a busy one (threads
            that wait for each other at every operation), and gives the same model on
            every machine whatever its number of cores.
        grading_steps: while nbgrader autogrades (:func:`under_autograde`), train only
            this many steps: the graded cells never depend on the trained model, and a
            class's grading should not train hundreds of models. A note says so.
            ``$ATTENTION_REF_GRADING_STEPS`` overrides it (:func:`grading_step_cap`).

    Returns:
        A :class:`TrainResult` with the per-step losses, steps done and seconds taken.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    planned = steps
    cap = grading_step_cap(grading_steps) if under_autograde() else None
    if cap is not None:
        steps = max(1, min(steps, cap))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    bar = tqdm(total=steps, desc=desc, unit="step", mininterval=0.25) if progress else None
    result = TrainResult()
    model.train()
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    threads = torch.get_num_threads()
    if on_cpu and cpu_threads:
        torch.set_num_threads(cpu_threads)
    result.threads = torch.get_num_threads() if on_cpu else None
    try:
        _loop(model, loss_fn, batches, opt, result, bar, steps, lr, warmup, clip, time_limit)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    if bar is not None:
        bar.close()
    if result.timed_out:
        print(f"{desc}: stopped by the time limit after {result.steps} of {steps} steps")
    if steps < planned:
        print(
            f"{desc}: autograding, so only {steps} of {planned} steps were trained; "
            "results after this cell are not meaningful (no graded cell uses them)."
        )
    return result


def _loop(model, loss_fn, batches, opt, result, bar, steps, lr, warmup, clip, time_limit):
    start = time.perf_counter()
    running = None
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss = loss_fn(model, next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        value = float(loss.detach())
        result.losses.append(value)
        running = value if running is None else 0.9 * running + 0.1 * value
        result.steps = step + 1
        elapsed = time.perf_counter() - start
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4g}", refresh=False)
        if time_limit is not None and elapsed > time_limit and step + 1 < steps:
            result.timed_out = True
            break
    result.seconds = time.perf_counter() - start


@contextmanager
def evaluating(model: nn.Module):
    """``with evaluating(model):`` eval mode and no gradients inside, the previous mode
    restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)
