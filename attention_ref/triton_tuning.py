"""Tuning notebook 14's forward kernel with ``triton.autotune``.

A kernel's speed on a GPU depends on launch choices the algorithm leaves open:

- ``BLOCK_M`` and ``BLOCK_N`` (queries per program, keys per tile): bigger tiles re-read
  ``K`` and ``V`` fewer times and keep the tensor cores busier, but need more registers and
  shared memory, and give fewer programs to spread over the GPU's multiprocessors;
- ``num_warps``: how many warps (32 threads each) run one program; more warps split a big
  tile's work, too many leave each with too little;
- ``num_stages``: how many tiles of ``K`` and ``V`` the compiled loop fetches ahead
  (software pipelining), which hides the memory's latency at the price of shared memory.

The best choice depends on the GPU, the head size, the dtype and the lengths, so
:func:`tuned_attention_kernel` wraps the reference kernel in ``triton.autotune``: at the
first call for each key (``n_q``, ``n_k``, ``D``, ``CAUSAL``, ``PRECISION`` and the tensors'
dtypes) it times every configuration on the GPU and keeps the fastest.

Triton's interpreter runs one program after another with NumPy: ``num_warps`` and
``num_stages`` change nothing there, and block sizes only change how much NumPy does per
call, so its timings cannot rank configurations for a GPU. Without a GPU the autotuner has
no timer at all (it needs a GPU driver); :func:`interpreter_timer` gives it the CPU's clock,
so that the mechanism runs, not so that its choice means anything.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from . import triton_attention as tri
from .triton_attention import LOG2E, _require_attention_inputs, triton

#: (BLOCK_M, BLOCK_N, num_warps, num_stages): launches that FlashAttention-style forward
#: kernels commonly win with on Ampere and Hopper GPUs for d = 64 and 128.
TUNING_SPACE: tuple[tuple[int, int, int, int], ...] = (
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 128, 8, 2),
    (128, 32, 4, 4),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (64, 32, 4, 4),
    (64, 128, 4, 2),
)

#: The arguments whose values choose a configuration (the tensors' dtypes are added by
#: Triton): each new combination is tuned once, at its first call.
TUNING_KEY = ("n_q", "n_k", "D", "CAUSAL", "PRECISION")


def tuning_configs(space: Sequence[tuple[int, int, int, int]] = TUNING_SPACE) -> list:
    """``triton.Config`` objects for ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` tuples."""
    configs = []
    for entry in space:
        if len(entry) != 4 or not all(isinstance(x, int) and x > 0 for x in entry):
            raise ValueError(
                "each tuning entry must be (BLOCK_M, BLOCK_N, num_warps, num_stages), "
                f"positive ints; got {entry!r}"
            )
        bm, bn, warps, stages = entry
        for name, blk in (("BLOCK_M", bm), ("BLOCK_N", bn)):
            if blk < 16 or blk & (blk - 1):
                raise ValueError(f"{name} must be a power of two >= 16; got {blk} in {entry}")
        configs.append(
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
        )
    return configs


def interpreter_timer(kernel_call: Callable[[], object], quantiles=None) -> list[float]:
    """A stand-in for ``triton.testing.do_bench`` on a CPU: the median, fastest and slowest
    of three wall-clock timings of ``kernel_call`` after one untimed call, in milliseconds
    (the three figures the autotuner asks for). It times the interpreter, not a GPU."""
    kernel_call()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        kernel_call()
        times.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(times), min(times), max(times)]


def tuned_attention_kernel(
    space: Sequence[tuple[int, int, int, int]] = TUNING_SPACE,
    do_bench: Callable | None = None,
):
    """The reference forward kernel wrapped in ``triton.autotune`` over ``space``.

    ``do_bench``: the autotuner's timer (None: Triton's own, which needs a GPU; in the
    interpreter :func:`interpreter_timer` is used). Launch the result with a grid that
    reads the chosen block, ``lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), B * H)``,
    and without ``BLOCK_M``/``BLOCK_N``; its ``best_config`` is the last choice."""
    if do_bench is None and tri.INTERPRETED:
        do_bench = interpreter_timer
    return triton.autotune(configs=tuning_configs(space), key=list(TUNING_KEY),
                           do_bench=do_bench)(tri._attention_kernel)  # fmt: skip


_DEFAULT_TUNER = None


def triton_attention_tuned(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    *,
    allow_tf32: bool = False,
    tuner=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_ref.triton_attention` with its launch chosen by ``triton.autotune``.

    Same inputs and results: ``q (B, H, n_q, d)``, ``k, v (B, H, n_k, d)`` give
    ``(out (B, H, n_q, d), lse (B, H, n_q))``. ``tuner``: a kernel from
    :func:`tuned_attention_kernel` (None: one shared over :data:`TUNING_SPACE`, which
    remembers its choices for the life of the process)."""
    global _DEFAULT_TUNER
    _require_attention_inputs(q, k, v)
    if tuner is None:
        if _DEFAULT_TUNER is None:
            _DEFAULT_TUNER = tuned_attention_kernel()
        tuner = _DEFAULT_TUNER
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    out, lse, done = tri._attention_results(q, k)
    if done:
        return out, lse
    precision = "tf32" if allow_tf32 and q.dtype == torch.float32 else "ieee"

    def grid(meta):
        return (triton.cdiv(n_q, meta["BLOCK_M"]), B * H)

    tuner[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        H, n_q, n_k, LOG2E / math.sqrt(d),
        D=d, CAUSAL=bool(causal), PRECISION=precision,
    )  # fmt: skip
    return out, lse
