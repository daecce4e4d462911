"""``app=variants`` of ``python -m attention_ref.bench apps``: notebook 15's four open
architectures (Mixtral, Qwen3-MoE, GPT-OSS, DeepSeek-V3) on the course's parts.

For each, :func:`~attention_ref.convert_moe.conversion_figures`: the worst max |logit
difference| against ``transformers`` over batches of 1, 7 and 33 tokens and a batch padded
on each side, in float32 (target 1e-5) and in float64 with ``transformers``' float32
internals made float64 (target 1e-12), and whether 32 greedy tokens with the course's
rolling caches equal ``generate(do_sample=False)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FLOAT32_TARGET = 1e-5
FLOAT64_TARGET = 1e-12


@dataclass
class VariantsResult:
    """What :func:`bench_variants` measured; ``value``: the worst float32 difference."""

    metric: str
    value: float
    train_seconds: float
    rows: list[dict] = field(default_factory=list)

    def extras(self) -> str:
        parts = []
        for r in self.rows:
            parts.append(f"{r['model']}_f32={r['float32']:.1e} {r['model']}_f64={r['float64']:.1e}")
        same = sum(bool(r["greedy_equal"]) for r in self.rows)
        parts.append(f"greedy32_equal={same}/{len(self.rows)}")
        ok = (
            all(r["float32"] <= FLOAT32_TARGET for r in self.rows)
            and all(r["float64"] <= FLOAT64_TARGET for r in self.rows)
            and same == len(self.rows)
        )
        parts.append(f"targets_met={ok}")
        return " ".join(parts)


def bench_variants(seed: int = 1) -> VariantsResult:
    """The four conversions of notebook 15, measured (a few seconds on a CPU)."""
    from ..convert_moe import conversion_figures

    t0 = time.perf_counter()
    rows = conversion_figures(seed=seed, n_tokens=32)
    worst = max(r["float32"] for r in rows)
    return VariantsResult("max_logit_diff_float32", worst, time.perf_counter() - t0, rows)
