"""Notebook 14's benchmark table: the Triton kernels against PyTorch's fused attention.

:func:`triton_rows` times, on a CUDA GPU, the forward pass, the backward pass and both, of
``F.scaled_dot_product_attention`` ("fused"), the course's Triton kernels at a fixed launch
("reference", :data:`TRITON_LAUNCH`), the forward kernel tuned by ``triton.autotune``
("tuned", :mod:`attention_ref.triton_tuning`) and a learner's forward kernel, over sequence
length, head size, dtype and causality, with ``triton.testing.do_bench`` (the median of its
repetitions), in TFLOP/s. ``python -m attention_ref.bench triton --record PATH`` writes the
table with the GPU's name and the PyTorch and Triton versions (:func:`write_record`);
notebook 14 draws the recorded table (:func:`attention_ref.plots.plot_triton_bench`) where
no GPU is present, and measures its own where one is.

Nothing here imports Triton until a GPU table is asked for.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

#: The reference kernel's launch on a GPU: blocks of 128 queries and 64 keys, 8 warps.
TRITON_LAUNCH = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
#: The reference backward kernels' tiles on a GPU (queries and keys per block).
BACKWARD_LAUNCH = dict(block_m=64, block_n=64)
PASSES = ("fwd", "bwd", "fwd+bwd")
#: Multiply-adds of each pass against the forward's two products (Q K^T and P V): the
#: backward recomputes S and computes dV, dP, dQ and dK, five products.
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
#: Where ``tools/gpu_nb14.py`` keeps the recorded table that notebook 14 draws.
RECORD = Path(__file__).resolve().parent / "records" / "triton_bench.json"


@dataclass
class TritonRow:
    """One timing of ``python -m attention_ref.bench triton``."""

    impl: str  # "fused", "reference", "tuned" or "learner"
    n: int
    dtype: str  # float16, float32, float32+tf32
    causal: bool
    ms: float
    tflops: float
    ratio: float  # time / the fused call's time for the same pass
    max_err: float  # max |result - float64| over one (batch, head): out, or dq, dk and dv
    pass_: str = "fwd"  # "fwd", "bwd" or "fwd+bwd"
    d_head: int = 64

    def line(self) -> str:
        return (
            f"triton impl={self.impl} pass={self.pass_} n={self.n} d_head={self.d_head} "
            f"dtype={self.dtype} causal={self.causal} ms={self.ms:.3f} "
            f"tflops={self.tflops:.1f} ratio_to_fused={self.ratio:.2f} "
            f"max_err={self.max_err:.2e}"
        )


def attention_flops(
    batch: int, heads: int, n: int, d_head: int, causal: bool, pass_: str = "fwd"
) -> float:
    """Floating-point operations of attention over ``n`` tokens, counted as products of
    ``2 n^2 d`` each: the forward's two, ``4 n^2 d`` per head, half of it when causal (the
    future is skipped), times :data:`FLOP_FACTOR` of the pass."""
    if pass_ not in FLOP_FACTOR:
        raise ValueError(f"pass_ must be one of {PASSES}; got {pass_!r}")
    return 4.0 * batch * heads * n * n * d_head * (0.5 if causal else 1.0) * FLOP_FACTOR[pass_]


def _backward_call(q, k, v, out, lse, dout, causal):
    """The reference's backward pass as a call: the Triton backward kernels where the course
    has them, else the reference autograd function's backward."""
    from . import triton_attention as tri

    kernels = getattr(tri, "triton_attention_backward", None)
    if kernels is not None:
        return lambda: kernels(q, k, v, out, lse, dout, causal, **BACKWARD_LAUNCH)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    result = tri.TritonFlashAttention.apply(qg, kg, vg, causal)
    return lambda: torch.autograd.grad(result, (qg, kg, vg), dout, retain_graph=True)


def _calls(impl: str, pass_: str, q, k, v, dout, causal, tf32, learner):
    """(the call to time, the tensors its gradients accumulate into, the call that gives the
    result whose error is measured)."""
    from . import triton_attention as tri

    def fused():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    if impl == "fused":
        if pass_ == "fwd":

            def forward_only():
                with torch.no_grad():  # no graph kept: the forward's time alone
                    return fused()

            return forward_only, None, forward_only
        grads = [q, k, v]
        if pass_ == "bwd":
            out = fused()
            return lambda: out.backward(dout, retain_graph=True), grads, None
        return lambda: fused().backward(dout), grads, None
    if impl == "learner":
        return lambda: learner(q, k, v, causal)[0], None, lambda: learner(q, k, v, causal)[0]
    if impl == "tuned":
        from .triton_tuning import triton_attention_tuned

        def tuned():
            return triton_attention_tuned(q.detach(), k.detach(), v.detach(), causal,
                                          allow_tf32=tf32)[0]  # fmt: skip

        return tuned, None, tuned

    def forward():
        return tri.triton_attention(q.detach(), k.detach(), v.detach(), causal,
                                    allow_tf32=tf32, **TRITON_LAUNCH)  # fmt: skip

    if pass_ == "fwd":
        return lambda: forward()[0], None, lambda: forward()[0]
    out, lse = forward()
    detached = (q.detach(), k.detach(), v.detach())
    if pass_ == "bwd":
        call = _backward_call(*detached, out, lse, dout, causal)
        return call, None, call

    def both():
        o, m = forward()
        return _backward_call(*detached, o, m, dout, causal)()

    return both, None, both


def _error(result, exact) -> float:
    """Max |result - exact| over the first (batch, head): ``exact`` is the float64 output,
    or the float64 (dq, dk, dv)."""
    if result is None:
        return math.nan
    if isinstance(result, torch.Tensor):
        result = (result,)
    pairs = zip(result, exact, strict=True)
    return max(float((r[:1, :1].double() - e).abs().max()) for r, e in pairs)


def triton_rows(
    lengths: Sequence[int] = (1024, 4096, 16384),
    dtypes: Sequence[str] = ("float16", "float32", "float32+tf32"),
    batch: int = 4,
    heads: int = 16,
    d_head: int | Sequence[int] = 64,
    repeats: int = 5,
    learner: Callable | None = None,
    passes: Sequence[str] = ("fwd",),
    tuned: bool = False,
    device: torch.device | str = "cuda",
    timer: Callable | None = None,
) -> list[TritonRow]:
    """On a CUDA GPU: each implementation against ``F.scaled_dot_product_attention`` for
    every length, head size (``d_head``: one or several), dtype, causality and pass.

    ``float32+tf32``: Triton's ``tl.dot`` allowed TF32; PyTorch's ``allow_tf32`` flag is
    set too, but it switches PyTorch's matmuls, not its fused attention (SDPA took the same
    time with it on or off on an H200). ``learner(q, k, v, causal) -> (out, lse)`` is timed
    forward only; ``tuned`` adds the autotuned forward kernel. Each time is
    ``triton.testing.do_bench``'s median (warm-up 25 ms, ``25 * repeats`` ms of calls);
    the error of each result against float64 is measured on the first (batch, head).
    ``device`` and ``timer(call, grad_to_none) -> ms``: a CPU and a clock run the same
    table through the interpreter, to test it (its figures then say nothing of a GPU)."""
    if timer is None:
        import triton.testing

        def timer(call, grad_to_none):
            rep = 25 * max(repeats, 1)
            return triton.testing.do_bench(
                call, warmup=25, rep=rep, grad_to_none=grad_to_none, return_mode="median"
            )

    for p in passes:
        if p not in PASSES:
            raise ValueError(f"passes must be among {PASSES}; got {p!r}")
    dev = torch.device(device)
    d_heads = (d_head,) if isinstance(d_head, int) else tuple(d_head)
    impls = ["fused", "reference"] + (["tuned"] if tuned else []) + (["learner"] if learner else [])
    rows: list[TritonRow] = []
    for n, d, name, causal in itertools.product(lengths, d_heads, dtypes, (False, True)):
        dtype = torch.float16 if name == "float16" else torch.float32
        tf32 = name.endswith("tf32")
        g = torch.Generator(device=dev).manual_seed(n * 1000 + d)
        q, k, v, dout = (
            torch.randn(batch, heads, n, d, device=dev, dtype=dtype, generator=g) for _ in range(4)
        )  # each (batch, heads, n, d)
        exact_in = [t[:1, :1].double().requires_grad_() for t in (q, k, v)]
        exact_out = F.scaled_dot_product_attention(*exact_in, is_causal=causal)
        exact_grads = torch.autograd.grad(exact_out, exact_in, dout[:1, :1].double())
        exact_out = exact_out.detach()
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32 and dev.type == "cuda"
        try:
            for pass_ in passes:
                times = {}
                for impl in impls:
                    if impl in ("learner", "tuned") and pass_ != "fwd":
                        continue
                    call, grads, result = _calls(impl, pass_, q, k, v, dout, causal, tf32,
                                                 learner)  # fmt: skip
                    if result is not None:
                        got = result()
                        exact = (exact_out,) if pass_ == "fwd" else exact_grads
                        err = _error(got, exact)
                    else:
                        err = _fused_grad_error(pass_, q, k, v, dout, causal, exact_grads)
                    times[impl] = timer(call, grads) / 1e3
                    tflops = attention_flops(batch, heads, n, d, causal, pass_) / 1e12
                    rows.append(TritonRow(impl, n, name, causal, times[impl] * 1e3,
                                          tflops / times[impl], 0.0, err, pass_, d))  # fmt: skip
                for r in rows[-len(times) :]:
                    r.ratio = times[r.impl] / times["fused"]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
            for t in (q, k, v):
                t.grad = None
    return rows


def _fused_grad_error(pass_, q, k, v, dout, causal, exact_grads) -> float:
    """The fused backward's error against float64 on the first (batch, head)."""
    if pass_ == "fwd":
        return math.nan
    inputs = [t[:1, :1].detach().clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, is_causal=causal)
    grads = torch.autograd.grad(out, inputs, dout[:1, :1])
    return _error(grads, exact_grads)


def write_record(rows: Sequence[TritonRow], path: Path | str, **meta) -> Path:
    """Write ``rows`` and what measured them (GPU, PyTorch and Triton versions, the date,
    ``meta``) to ``path`` as JSON; returns the path."""
    import triton

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    record = {
        "device": torch.cuda.get_device_name() if gpu else "CPU (Triton's interpreter)",
        "capability": list(torch.cuda.get_device_capability()) if gpu else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        **meta,
        "rows": [asdict(r) for r in rows],
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def load_record(path: Path | str = RECORD) -> dict | None:
    """The recorded table (``rows`` as :class:`TritonRow`), or None when none is recorded.
    A record that is not the table's raises ``ValueError`` naming the file."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        record["rows"] = [TritonRow(**r) for r in record["rows"]]
        for key in ("device", "torch", "triton"):
            str(record[key])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a recorded Triton benchmark table: {err}") from err
    return record
