"""``app=variants`` of ``python -m attention_ref.bench apps``: notebook 15's four open
architectures (Mixtral, Qwen3-MoE, GPT-OSS, DeepSeek-V3) on the course's parts.

For each, :func:`~attention_ref.convert_moe.conversion_figures`: the worst max |logit
difference| against ``transformers`` over batches of 1, 7 and 33 tokens and a batch padded
on each side, in float32 (target 1e-5) and in float64 with ``transformers``' float32
internals made float64 (target 1e-12), and whether 32 greedy tokens with the course's
rolling caches equal ``generate(do_sample=False)``. Then the expert-load experiment of
:mod:`.expert_load`: on seeds 0 and 1, the busiest expert's share of the held-out assignments
and the load's coefficient of variation, without and with the load-balancing loss
(alpha = 0.1); the loss is to lower both on each seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

FLOAT32_TARGET = 1e-5
FLOAT64_TARGET = 1e-12
ALPHAS = (0.0, 0.1)  # without and with the load-balancing loss
SEEDS = (0, 1)


def _cv(load: list[float]) -> float:
    from .expert_load import coefficient_of_variation

    return coefficient_of_variation(torch.tensor(load, dtype=torch.float64))


@dataclass
class VariantsResult:
    """What :func:`bench_variants` measured; ``value``: the worst float32 difference."""

    metric: str
    value: float
    train_seconds: float
    rows: list[dict] = field(default_factory=list)
    loads: dict[tuple[float, int], list[float]] = field(default_factory=dict)

    def extras(self) -> str:
        parts = []
        for r in self.rows:
            parts.append(f"{r['model']}_f32={r['float32']:.1e} {r['model']}_f64={r['float64']:.1e}")
        same = sum(bool(r["greedy_equal"]) for r in self.rows)
        parts.append(f"greedy32_equal={same}/{len(self.rows)}")
        balanced = True
        for alpha in ALPHAS:
            busiest = [max(self.loads[alpha, seed]) for seed in SEEDS]
            spread = [_cv(self.loads[alpha, seed]) for seed in SEEDS]
            parts.append(
                f"busiest_expert_alpha{alpha}=" + "/".join(f"{100 * b:.1f}%" for b in busiest)
            )
            parts.append(f"load_cv_alpha{alpha}=" + "/".join(f"{c:.2f}" for c in spread))
        for seed in SEEDS:
            without, with_loss = (self.loads[alpha, seed] for alpha in ALPHAS)
            balanced &= max(with_loss) < max(without) and _cv(with_loss) < _cv(without)
        parts.append(f"loss_balances_each_seed={balanced}")
        ok = (
            all(r["float32"] <= FLOAT32_TARGET for r in self.rows)
            and all(r["float64"] <= FLOAT64_TARGET for r in self.rows)
            and same == len(self.rows)
            and balanced
        )
        parts.append(f"targets_met={ok}")
        return " ".join(parts)


def bench_variants(seed: int = 1) -> VariantsResult:
    """The four conversions of notebook 15 and its expert-load experiment, measured (a few
    seconds each on a CPU)."""
    from ..convert_moe import conversion_figures
    from ..experts import load_balancing_loss
    from .expert_load import expert_load, single_threaded_on_cpu

    t0 = time.perf_counter()
    rows = conversion_figures(seed=seed, n_tokens=32)
    worst = max(r["float32"] for r in rows)
    with single_threaded_on_cpu("cpu"):
        loads = {
            (alpha, s): expert_load(load_balancing_loss, alpha, s).tolist()
            for alpha in ALPHAS
            for s in SEEDS
        }
    return VariantsResult("max_logit_diff_float32", worst, time.perf_counter() - t0, rows, loads)
