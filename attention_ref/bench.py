"""The course's benchmarks: ``python -m attention_ref.bench [calibrate|attention|apps|...|all]``
(no argument: ``all``, as ``make bench`` runs it, the calibration first).

- ``calibrate``: how fast this machine is, so that budget figures compare across machines:
  one line per thread count of ``--threads`` (default 1, then 2),
  ``calibration threads=1 matmul_s=0.123 train_s=0.456 cpu_s=2.3 (...)``: the seconds of a
  fixed float32 matrix multiply and of a fixed small training loop (20 AdamW steps of a
  two-layer GPT), the best of 3 each, and the CPU time of the whole line. A figure
  measured on a machine whose ``train_s`` is 2.5 times this one's scales by about 2.5.
- ``notebooks``: each solution notebook executed top to bottom in a fresh kernel (as nbval
  runs it), one line each, ``notebook=01_dot_product_attention seconds=9.8 budget_s=60
  within``, then the total against the budget of all of them (``--notebooks`` names some).
- ``attention`` (notebook 12): time and peak extra memory of naive attention, the reference
  :func:`~attention_ref.efficient.online_softmax_attention` and PyTorch's fused
  ``scaled_dot_product_attention``, for several sequence lengths, with the ratios to
  PyTorch; then the speed-up of key-value-cached decoding over recomputation. It prints
  whether the course's targets are met.
- ``apps`` (notebooks 08-11 and 13): trains each application model as its notebook does and
  prints one line per application, e.g. ``app=translation metric=exact_match value=0.995
  train_seconds=48.1``; the GPT of notebook 11 adds its agreement, grammatical and novel
  samples, bigram baseline and training speed (``app=gpt metric=cross_entropy_over_floor
  value=1.002 train_seconds=... steps=1500 agreement=1.000 grammatical=0.978 ...``).
  Notebook 13 adds two lines: ``app=modern``, its modern model against notebook 11's GPT at
  equal parameter count, 60 s of training each on two seeds (cross-entropy over the floor
  and grammatical samples per seed), and ``app=convert``, the Hugging Face models converted
  (the max |logit difference| per architecture and dtype, and whether 32 greedy tokens are
  equal). Notebook 15 adds ``app=variants``: Mixtral, Qwen3-MoE, GPT-OSS and DeepSeek-V3
  converted (the same figures, float64 to 1e-12) and the experts' load.
- ``grading`` (``make grade``): what one submission of notebook 01 that loops forever in
  ``sdpa`` costs (its grading time minus a solution's); then, in the same run, the grading
  of issue 13 (one worker, every model trained in full: ``ATTENTION_REF_GRADING_STEPS=all``)
  on ``--baseline-students`` students, and the time to grade a class of ``--students``
  students with full solutions to every assignment with each of ``--grading-jobs`` workers
  (default 1 and 2); the ratio of the best to the baseline scaled to the class (sequential
  grading is a sum over students, each graded alone); and the same class graded once more
  with the most workers without the sandbox (``ATTENTION_REF_SANDBOX=off``), for the
  sandbox's cost, and once more judged by the kernel itself as nbgrader alone does
  (``ATTENTION_REF_TRUSTED_CHECKER=off``), for the trusted checker's cost. First, the
  engine of ``make grade`` (Dask): ``--cluster-students`` solutions of notebook 01 graded on
  the command's own local cluster of two workers and on a running two-worker cluster (a
  ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1), the seconds, their
  ratio and each one's overhead per job (its wall time times two workers, less the seconds
  the jobs graded, per job) as a share of a job's time: the target is 10% on a class of 20
  (``--cluster-only`` runs this part alone). With ``--semester`` (``--semester-only``: alone),
  the semester's class of tests/test_busy_class.py (30 submissions of notebook 01 as students
  save them) graded two at a time by the code of ``--semester-before`` (default: the last
  commit before issue 39, taken with ``git archive``) and by this code, one after the other:
  the seconds each spent on the students both graded exactly, and their ratio (target 1.10).
  Takes minutes.

Benchmarks are registered in :data:`BENCHMARKS` with :func:`benchmark`; each takes the
parsed command-line options, prints its lines and returns True when it ran without error
(a missed performance target is reported, not an error; ``--strict`` makes it one).

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` above what was allocated before the
call; on the CPU, :class:`~attention_ref.efficient.PeakMemory`, which counts the tensors
PyTorch operations create (a fused kernel's internal scratch buffers are not tensors and are
not counted).

Timing: the best of ``--repeats`` runs. On the CPU the attention benchmark runs once per
thread count in ``--threads`` (default: 1, then 2) and prints a header line naming it before
that count's rows: on a shared or busy machine multi-threaded timings of many medium-sized
operations swing more, and one thread compares the implementations most fairly. The target
(online attention at most 1.5x PyTorch's fused kernel at 4,096 tokens) is checked for each
thread count.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .triton_bench import (  # noqa: F401 - TritonRow and triton_rows: notebook 14 reads them here
    BACKWARD_LAUNCH,
    PASSES,
    TRITON_LAUNCH,
    TritonRow,
    triton_rows,
    write_record,
)

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    run: Callable[[argparse.Namespace], bool]


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str, help: str) -> Callable:
    """Register ``fn(options) -> ok`` as the benchmark ``name``."""

    def register(fn: Callable[[argparse.Namespace], bool]) -> Callable:
        if name in BENCHMARKS or name == "all":
            raise RuntimeError(f"benchmark {name!r} is registered twice (or is reserved)")
        BENCHMARKS[name] = Benchmark(name, help, fn)
        return fn

    return register


# ----------------------------------------------------------------------------- measuring
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` (after one warm-up call when
    ``repeats > 1``)."""
    if repeats > 1:
        fn()
    best = math.inf
    for _ in range(max(repeats, 1)):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by ``fn`` beyond what was allocated before it ran."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from .efficient import PeakMemory

    with PeakMemory() as pm:
        fn()
    return pm.peak


def naive_bytes(batch: int, heads: int, n: int, itemsize: int) -> int:
    """Memory naive attention needs for its two ``n x n`` matrices per head (the scores and
    the softmax weights)."""
    return 2 * batch * heads * n * n * itemsize


def _fmt_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


# ----------------------------------------------------------------------------- calibration
#: The fixed work of ``calibrate``: ``CALIBRATION_MATMULS`` products of two float32
#: ``CALIBRATION_N x CALIBRATION_N`` matrices, and ``CALIBRATION_STEPS`` AdamW steps of a
#: small GPT (the course's, two layers, ``d_model`` 64) on seeded random token batches.
CALIBRATION_N = 1024
CALIBRATION_MATMULS = 8
CALIBRATION_STEPS = 20


def calibration(threads: int | None = None, repeats: int = 3) -> dict[str, float]:
    """How fast this machine runs the course's kind of work, on the CPU with ``threads``
    PyTorch threads (None or 0: PyTorch's current setting; restored after):
    ``matmul_s``, the seconds of the fixed matrix products, and ``train_s``, the seconds
    of the fixed small training loop (the best of ``repeats`` runs each, after a warm-up),
    with ``threads`` (``torch.get_num_threads()`` while it ran) and ``cpu_s``, the
    process's CPU time for the whole calibration (less sensitive than wall time to other
    work on a shared machine). A budget figure measured on two machines compares through
    these: a machine whose ``train_s`` is 2.5 times another's trains the course's models
    about 2.5 times slower. The course trains on one thread (:func:`~attention_ref.training.
    train`'s ``cpu_threads=1``); on a busy machine two threads can be many times slower."""
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _calibration(repeats)
    finally:
        torch.set_num_threads(old_threads)


def _calibration(repeats: int) -> dict[str, float]:
    from .gpt import GPT

    cpu = torch.device("cpu")
    cpu0 = time.process_time()
    gen = torch.Generator().manual_seed(0)
    n = CALIBRATION_N
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)

    def matmuls() -> None:
        for _ in range(CALIBRATION_MATMULS):
            a @ b

    vocab, batch, T = 64, 64, 16
    tokens = torch.randint(0, vocab, (CALIBRATION_STEPS, batch, T + 1), generator=gen)

    def train_loop() -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = GPT(vocab, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=T)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x in tokens:
            logits = model(x[:, :-1])  # (batch, T, vocab)
            loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    matmul_s = best_time(matmuls, cpu, repeats)
    train_s = best_time(train_loop, cpu, repeats)
    return {
        "threads": torch.get_num_threads(),
        "matmul_s": matmul_s,
        "train_s": train_s,
        "cpu_s": time.process_time() - cpu0,
    }


def calibration_line(figures: dict[str, float]) -> str:
    """``calibration threads=1 matmul_s=0.123 train_s=0.456 cpu_s=2.3 (...)``."""
    return (
        f"calibration threads={figures['threads']} matmul_s={figures['matmul_s']:.3f} "
        f"train_s={figures['train_s']:.3f} cpu_s={figures['cpu_s']:.1f} "
        f"({CALIBRATION_MATMULS} float32 matmuls {CALIBRATION_N}x{CALIBRATION_N}; "
        f"{CALIBRATION_STEPS} AdamW steps of a 2-layer d_model=64 GPT, batch 64x16; "
        f"best of 3, CPU, torch={torch.__version__})"
    )


@benchmark("calibrate", "this machine's speed: a fixed matmul and a fixed small training loop")
def bench_calibrate(opts: argparse.Namespace) -> bool:
    for n_threads in opts.threads:  # one line per thread count (default: 1, then 2)
        print(calibration_line(calibration(n_threads)), flush=True)
    return True


# ----------------------------------------------------------------------------- notebooks
#: The budgets of COURSE_DESIGN.md section 7 on a 2-core CPU: one solution notebook executed
#: top to bottom (the applications and the GPT, notebooks 08 to 11: 90 s), and all of them.
NOTEBOOK_BUDGET_S = 60.0
LONG_NOTEBOOK_BUDGET_S = 90.0
LONG_NOTEBOOKS = ("08_", "09_", "10_", "11_")
ALL_NOTEBOOKS_BUDGET_S = 420.0


def notebook_budget(aid: str) -> float:
    """The seconds solution notebook ``aid`` may take, executed top to bottom."""
    return LONG_NOTEBOOK_BUDGET_S if aid.startswith(LONG_NOTEBOOKS) else NOTEBOOK_BUDGET_S


def _execute_seconds(path) -> float:
    """Seconds to execute the notebook at ``path`` top to bottom in a fresh ``python3``
    kernel started in its folder (as nbval runs it); raises on a failing cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    t0 = time.perf_counter()
    client.execute()
    return time.perf_counter() - t0


@benchmark("notebooks", "each solution notebook executed top to bottom, against its budget")
def bench_notebooks(opts: argparse.Namespace) -> bool:
    """One line per solution notebook (``--notebooks``, default all), its seconds and budget,
    then the total against the budget of all 15; printed after the calibration, so that the
    figures compare across machines."""
    from .course.load import cores
    from .course.plumbing import assignments, course_root

    root = course_root()
    aids = opts.notebooks or assignments(root)
    unknown = sorted(set(aids) - set(assignments(root)))
    if unknown:
        print(f"notebooks FAILED: no solution notebook {', '.join(unknown)}", flush=True)
        return False
    ok, met, total = True, True, 0.0
    for aid in aids:
        try:
            seconds = _execute_seconds(root / "solutions" / aid / f"{aid}.ipynb")
        except Exception as err:  # report and go on with the next notebook
            ok = False
            print(f"notebook={aid} FAILED: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        total += seconds
        budget = notebook_budget(aid)
        met &= seconds <= budget
        print(
            f"notebook={aid} seconds={seconds:.1f} budget_s={budget:.0f} "
            f"{'within' if seconds <= budget else 'OVER'}",
            flush=True,
        )
    if ok and len(aids) == len(assignments(root)):
        met &= _target(
            "all notebooks", total <= ALL_NOTEBOOKS_BUDGET_S,
            f"{total:.0f} s of {ALL_NOTEBOOKS_BUDGET_S:.0f} on {cores()} cores",
        )  # fmt: skip
    else:
        print(f"notebooks={len(aids)} seconds={total:.1f} cores={cores()}", flush=True)
    return ok and (met or not opts.strict)


# ----------------------------------------------------------------------------- attention
def _attention_line(n: int, opts: argparse.Namespace, device: torch.device) -> dict:
    """Measure one sequence length; print its line; return the figures."""
    from .efficient import naive_attention, online_softmax_attention

    dtype = getattr(torch, opts.dtype)
    gen = torch.Generator(device="cpu").manual_seed(n)
    shape = (opts.batch, opts.heads, n, opts.d_head)
    q, k, v = (torch.randn(shape, generator=gen, dtype=dtype).to(device) for _ in range(3))
    repeats = opts.repeats if n <= 4096 else 1
    fns = {
        "torch": lambda: F.scaled_dot_product_attention(q, k, v),
        "online": lambda: online_softmax_attention(
            q, k, v, opts.block_size, q_block_size=opts.q_block_size
        ),
        "naive": lambda: naive_attention(q, k, v),
    }
    need = naive_bytes(opts.batch, opts.heads, n, q.element_size())
    limit = opts.naive_limit_gib * GiB
    res: dict = {"n": n}
    with torch.no_grad():
        for name, fn in fns.items():
            if name == "naive" and need > limit:
                res[name] = None
                continue
            res[f"{name}_s"] = best_time(fn, device, repeats)
            res[f"{name}_bytes"] = peak_extra_bytes(fn, device)
    parts = [f"n={n}"]
    for name in ("naive", "online", "torch"):
        if f"{name}_s" in res:
            parts.append(f"{name}_ms={1000 * res[f'{name}_s']:.1f}")
            parts.append(f"{name}_mib={res[f'{name}_bytes'] / MiB:.1f}")
        else:
            parts.append(
                f"{name}=skipped(needs {_fmt_bytes(need)} for scores+weights "
                f"> limit {opts.naive_limit_gib:g} GiB)"
            )
    for name in ("naive", "online"):
        if f"{name}_s" in res:
            parts.append(f"{name}/torch_time={res[f'{name}_s'] / res['torch_s']:.2f}x")
    if "naive_s" in res:
        ratio = res["online_bytes"] / max(res["naive_bytes"], 1)
        parts.append(f"online/naive_mem={ratio:.3f}x")
    print(" ".join(parts), flush=True)
    return res


def _kv_cache_line(opts: argparse.Namespace, device: torch.device) -> float:
    """Greedy decoding of ``opts.kv_tokens`` tokens with and without the cache."""
    from .kv_cache import CachedDecoder, greedy_decode

    torch.manual_seed(0)
    n = opts.kv_tokens
    model = CachedDecoder(
        vocab_size=512,
        d_model=opts.kv_d_model,
        n_heads=8,
        d_ff=4 * opts.kv_d_model,
        n_layers=2,
        max_len=n + 1,
    )
    model = model.to(device).eval()
    memory = torch.randn(1, 32, opts.kv_d_model, device=device)
    times, outs = {}, {}
    for use_cache in (False, True):
        result = []
        times[use_cache] = best_time(
            lambda use_cache=use_cache: result.append(
                greedy_decode(model, memory, n, use_cache=use_cache)
            ),
            device,
            repeats=1,
        )
        outs[use_cache] = result[-1]
    same = bool(torch.equal(outs[False], outs[True]))
    speedup = times[False] / times[True]
    print(
        f"kv_cache tokens={n} recompute_s={times[False]:.2f} cached_s={times[True]:.2f} "
        f"speedup={speedup:.1f}x same_tokens={same}",
        flush=True,
    )
    if not same:
        raise RuntimeError("cached decoding gave different tokens from recomputation")
    return speedup


def _target(name: str, ok: bool, detail: str) -> bool:
    print(f"target {name}: {'met' if ok else 'MISSED'} ({detail})", flush=True)
    return ok


ONLINE_OVER_TORCH_TARGET = 1.5  # online attention's time at 4,096 tokens / PyTorch's fused


@benchmark("attention", "naive vs online vs PyTorch attention; KV-cache speed-up")
def bench_attention(opts: argparse.Namespace) -> bool:
    device = torch.device(opts.device)
    thread_counts = opts.threads if device.type == "cpu" else [0]
    met = []
    for n_threads in thread_counts:
        if device.type == "cpu" and n_threads:
            torch.set_num_threads(n_threads)
        threads = torch.get_num_threads() if device.type == "cpu" else "-"
        print(
            f"attention device={device} threads={threads} batch={opts.batch} "
            f"heads={opts.heads} d_head={opts.d_head} dtype={opts.dtype} "
            f"block_size={opts.block_size} q_block_size={opts.q_block_size} "
            f"torch={torch.__version__}",
            flush=True,
        )
        rows = {n: _attention_line(n, opts, device) for n in opts.lengths}
        if 4096 in rows:
            r = rows[4096]
            ratio = r["online_s"] / r["torch_s"]
            goal = ONLINE_OVER_TORCH_TARGET
            met.append(
                _target(
                    f"online_time_4096<={goal:g}x_torch threads={threads}",
                    ratio <= goal,
                    f"{ratio:.2f}x",
                )
            )
            if "naive_bytes" in r:
                mem = r["online_bytes"] / max(r["naive_bytes"], 1)
                met.append(_target("online_mem_4096<=0.1x_naive", mem <= 0.1, f"{mem:.3f}x"))
        if 16384 in rows:
            met.append(_target("online_16384_completes", "online_s" in rows[16384], "ran"))
    if device.type == "cpu" and thread_counts[0]:
        torch.set_num_threads(thread_counts[0])  # the cache line runs with the first count
    speedup = _kv_cache_line(opts, device) if opts.kv_tokens > 0 else None
    if speedup is not None and opts.kv_tokens >= 256:
        met.append(_target("kv_cache_speedup>=5x", speedup >= 5.0, f"{speedup:.1f}x"))
    return all(met) or not opts.strict


# ----------------------------------------------------------------------------- apps
APPS = (
    ("translation", "attention_ref.apps.translation", "train_translation"),
    ("qa", "attention_ref.apps.qa", "train_qa"),
    ("summarization", "attention_ref.apps.summarization", "train_summarization"),
    ("gpt", "attention_ref.apps.language_model", "train_gpt"),
    ("modern", "attention_ref.apps.modern_lm", "train_modern"),
    ("convert", "attention_ref.convert", "bench_convert"),
    ("variants", "attention_ref.apps.variants", "bench_variants"),
)


@benchmark("apps", "train the application models of notebooks 08-11, 13 and 15")
def bench_apps(opts: argparse.Namespace) -> bool:
    ok = True
    for app, module_name, fn_name in APPS:
        try:
            module = importlib.import_module(module_name)
            train = getattr(module, fn_name, None)
            if train is None:
                raise LookupError(f"{module_name} has no {fn_name}()")
            result = train()
            v = float(result.value)
            shown = f"{v:.1e}" if 0 < abs(v) < 1e-3 else f"{v:.3f}"  # a logit difference
            line = (
                f"app={app} metric={result.metric} value={shown} "
                f"train_seconds={float(result.train_seconds):.1f}"
            )
            if getattr(result, "bleu", None) is not None:  # sacrebleu corpus BLEU, 0-100
                line += f" bleu={float(result.bleu):.1f}"
            if callable(getattr(result, "extras", None)):  # the GPT's further figures
                line += " " + result.extras()
        except Exception as err:  # report and go on with the next application
            ok = False
            line = f"app={app} FAILED: {type(err).__name__}: {err}"
        print(line, flush=True)
    return ok


# ----------------------------------------------------------------------------- grading
#: Issue 13's measurements of the course before per-cell limits and parallel grading
#: (2 CPU cores): one submission of notebook 01 looping forever in ``sdpa`` cost 900 s
#: (three cells x the 300 s limit); a student with full solutions to every assignment
#: took 212 s to grade, sequentially.
OLD_LOOP_S = 900.0
OLD_STUDENT_S = 212.0
LOOP_TARGET_S = 60.0


def _grading_course(dest, aids: list[str], root=None):
    """A throwaway course: nbgrader_config.py and solutions/ of this course (or of the
    course's files in ``root``)."""
    import shutil

    from .course.plumbing import course_root

    root = root or course_root()
    dest.mkdir(parents=True)
    shutil.copy(root / "nbgrader_config.py", dest / "nbgrader_config.py")
    for aid in aids:
        shutil.copytree(root / "solutions" / aid, dest / "solutions" / aid)
    return dest


def _solved(aid: str, loop: str | None = None):
    """The student notebook of ``aid`` with every answer cell solved as in solutions/;
    with ``loop``, that exercise's function loops forever after its solution."""
    import re

    import nbformat

    from .course.plumbing import course_root

    root = course_root()
    nb = nbformat.read(root / "notebooks" / aid / f"{aid}.ipynb", as_version=4)
    src = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)

    def answers(book):
        return {
            c.metadata["nbgrader"]["grade_id"]: c
            for c in book.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
        }

    solved = answers(src)
    for gid, cell in answers(nb).items():
        cell.source = re.sub(r"(?m)^\s*### (BEGIN|END) SOLUTION\n?", "", solved[gid].source)
        if gid == loop:
            cell.source += f"\n\ndef {gid}(*args, **kwargs):\n    while True:\n        pass\n"
    return nb


def _submit(course, student: str, aid: str, nb) -> None:
    import nbformat

    folder = course / "submitted" / student / aid
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{aid}.ipynb")


def _make_grade(
    course, jobs: int, env: dict | None = None, check: bool = True
) -> tuple[float, str]:
    """Seconds of `make grade --jobs JOBS` in ``course`` (its code path), and its output
    (with ``check``, a failed command is an error)."""
    import os
    import subprocess

    full_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
    full_env.pop("NBGRADER_DB_URL", None)
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "attention_ref.course", "grade", "--jobs", str(jobs)],
        cwd=course,
        capture_output=True,
        text=True,
        env=full_env,
    )
    seconds = time.perf_counter() - start
    if check and proc.returncode != 0:
        raise RuntimeError(f"make grade failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def _interrupted(nb_path) -> tuple[list[str], int]:
    """The limits (s) of the cells grading interrupted, and how many checks reported a
    call that did not return in time."""
    import re

    import nbformat

    cells, checks = [], 0
    for cell in nbformat.read(nb_path, as_version=4).cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") != "error":
                continue
            if o.get("ename") == "CellTimeoutError":
                cells.append(re.search(r"within (\d+) s", o["evalue"]).group(1))
            elif "did not return within" in o.get("evalue", ""):
                checks += 1
    return cells, checks


def _seconds_of(out: str, student: str) -> float:
    import re

    found = re.findall(rf"\] \S+ {re.escape(student)}: .*\(([\d.]+) s\)", out)
    return sum(float(s) for s in found)


@contextlib.contextmanager
def _dask_cluster(tmp, workers: int = 2):
    """A `dask scheduler` and ``workers`` `dask worker` processes (one thread each) on
    127.0.0.1, each worker in an empty folder of its own; yields the scheduler's address."""
    import json
    import os
    import signal
    import subprocess

    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("NBGRADER_DB_URL", None)
    tmp.mkdir(parents=True, exist_ok=True)
    info = tmp / "scheduler.json"
    procs = []

    def start(argv, cwd):
        procs.append(
            subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    dask = os.path.join(bindir, "dask")
    try:
        start([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
               "--scheduler-file", str(info)], tmp)  # fmt: skip
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        for i in range(workers):
            folder = tmp / f"worker{i + 1}"
            folder.mkdir()
            start([dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                   "--memory-limit", "0", "--no-dashboard", "--local-directory",
                   str(folder)], folder)  # fmt: skip
        yield address
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


#: The engine's overhead per job (around the grading on its worker, writing its result,
#: and the once-only costs spread over the class) as a share of a job's grading, at 20.
CLUSTER_OVERHEAD_TARGET = 0.10


def _engine_overhead(out: str, workers: int, students: int) -> dict[str, float]:
    """From `make grade`'s ``engine:`` line: a job's grading (s), the engine's own cost per
    job (s), its once-only cost (s), and the overhead as a share of a job's grading, for
    this class and for one of 20 (the once-only cost idles ``workers`` workers)."""
    import re

    m = re.search(
        r"engine: templates ([\d.]+) s, cluster ([\d.]+) s; per job: grading ([\d.]+) s, "
        r"around it on its worker ([\d.]+) s, writing its result ([\d.]+) s",
        out,
    )
    if not m:
        raise RuntimeError(f"make grade printed no engine line:\n{out[-2000:]}")
    templates, cluster, grading, around, writing = map(float, m.groups())
    per_job, once = around + writing, templates + cluster
    return {
        "grading": grading,
        "per_job": per_job,
        "once": once,
        "share": (per_job + once * workers / students) / grading,
        "share_at_20": (per_job + once * workers / 20) / grading,
    }


def _bench_cluster(opts: argparse.Namespace, tmp) -> bool:
    """The same class (``--cluster-students`` solutions of notebook 01) graded by `make
    grade` on its local cluster of two workers and on a running two-worker cluster."""
    import os

    from .course.cluster import PLAINTEXT_ENV, SCHEDULER_ENV

    n, aid, jobs = opts.cluster_students, "01_dot_product_attention", 2
    times, shares = {}, {}
    for where in ("local", "cluster"):
        course = _grading_course(tmp / f"cluster-{where}", [aid])
        for k in range(n):
            _submit(course, f"student{k + 1:03d}", aid, _solved(aid))
        if where == "local":
            seconds, out = _make_grade(course, jobs)
        else:
            with _dask_cluster(tmp / "dask", jobs) as address:
                env = {SCHEDULER_ENV: address, PLAINTEXT_ENV: "1"}
                seconds, out = _make_grade(course, jobs, env)
        e = _engine_overhead(out, jobs, n)
        times[where], shares[where] = seconds, e["share_at_20"]
        print(
            f"grading engine={where} students={n} notebook={aid} workers={jobs} "
            f"seconds={seconds:.1f} job_grading_s={e['grading']:.1f} "
            f"engine_per_job_s={e['per_job']:.2f} engine_once_s={e['once']:.1f} "
            f"overhead_share={e['share']:.3f} overhead_share_at_20={e['share_at_20']:.3f} "
            f"load_average={os.getloadavg()[0]:.1f}",
            flush=True,
        )
    ratio = times["cluster"] / times["local"]
    print(
        f"grading cluster students={n} local_s={times['local']:.1f} "
        f"two_worker_cluster_s={times['cluster']:.1f} ratio={ratio:.2f}",
        flush=True,
    )
    worst = max(shares.values())
    return _target(
        f"engine_overhead<={CLUSTER_OVERHEAD_TARGET:.0%}_per_job_at_20_students",
        worst <= CLUSTER_OVERHEAD_TARGET,
        f"{worst:.1%}" + ("" if n >= 20 else f" (projected from {n} students)"),
    )


#: The last commit before issue 39 (every wait of grading stretched with the load, a
#: grader's own failure graded again, notebooks as JupyterLab saves them repaired):
#: ``--semester`` grades the semester's class with it too, in the same run.
BEFORE_ISSUE_39 = "eb4e98f"
#: Issue 39's budget: the semester's class, graded two at a time on a quiet machine, at most
#: this many times the time the code before the issue takes on the same class.
SEMESTER_TARGET = 1.10


def _tree_at(rev: str, dest) -> None:
    """The repository's files at commit ``rev`` (``git archive``), extracted into ``dest``."""
    import subprocess

    from .course.plumbing import course_root

    dest.mkdir(parents=True)
    tar = dest.parent / f"{dest.name}.tar"
    try:
        subprocess.run(
            ["git", "-C", str(course_root()), "archive", "--format=tar", "-o", str(tar), rev],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(["tar", "-xf", str(tar), "-C", str(dest)], check=True, capture_output=True)
    except FileNotFoundError as err:
        raise SystemExit(f"error: bench grading --semester needs git and tar: {err}") from None
    except subprocess.CalledProcessError as err:
        raise SystemExit(
            f"error: bench grading --semester: the course's files at commit {rev!r} could not "
            f"be read ({(err.stderr or '').strip() or err}); run it in a clone of the "
            "repository that has that commit, or name another with --semester-before"
        ) from None


def _report_rows(out: str) -> dict[str, tuple[str, str]]:
    """From `make grade`'s report: {student: (score, status)} of its one assignment."""
    rows = {}
    for line in out.split("\nGrading report", 1)[-1].splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[3] == "/":
            rows[parts[1]] = (parts[2], " ".join(parts[5:]))
    return rows


def semester_comparison(before: str, after: str, expected: dict[str, float]) -> dict[str, object]:
    """Compare two `make grade` outputs on the same class: the students both graded to the
    score they must get (``expected``), each grading's seconds on those students (the sum
    of their per-submission seconds), and the ratio after / before."""
    rows = {"before": _report_rows(before), "after": _report_rows(after)}

    def exact(which: str) -> set[str]:
        def right(student: str, score: str) -> bool:
            try:
                return float(score) == expected.get(student)
            except ValueError:  # "?": no score exported
                return False

        graded = rows[which].items()
        return {s for s, (score, status) in graded if status == "graded" and right(s, score)}

    both = sorted(exact("before") & exact("after"))
    seconds = {
        which: sum(_seconds_of(out, s) for s in both)
        for which, out in (("before", before), ("after", after))
    }
    return {
        "students": len(expected),
        "exact_before": len(exact("before")),
        "exact_after": len(exact("after")),
        "both": both,
        "before_s": seconds["before"],
        "after_s": seconds["after"],
        "ratio": seconds["after"] / seconds["before"] if seconds["before"] else float("nan"),
    }


def _bench_semester(opts: argparse.Namespace, tmp) -> bool:
    """Issue 39's budget: the semester's class of tests/test_busy_class.py graded two at a
    time by the code before the issue (``--semester-before``) and by this code, in one run,
    on whatever load the machine has (run it quiet)."""
    import os
    import shutil

    from .course.plumbing import course_root

    root = course_root()
    tests = root / "tests"
    if not (tests / "test_busy_class.py").is_file():
        raise SystemExit(
            "error: bench grading --semester builds the class with tests/test_busy_class.py; "
            f"run it in a clone of the repository (no {tests / 'test_busy_class.py'})"
        )
    sys.path.insert(0, str(tests))
    try:
        from test_busy_class import AID, semester_class
    finally:
        sys.path.remove(str(tests))
    old_tree = tmp / "before-tree"
    _tree_at(opts.semester_before, old_tree)
    after = _grading_course(tmp / "semester-after", [AID])
    expected = semester_class(after)
    before = _grading_course(tmp / "semester-before", [AID], root=old_tree)
    shutil.copytree(after / "submitted", before / "submitted", symlinks=True)
    # The old code from its own tree (PYTHONPATH comes before the editable install's finder);
    # both measure the machine's load, as `make grade` does outside the tests.
    old_env = {"PYTHONPATH": str(old_tree), "ATTENTION_REF_LOAD_FACTOR": ""}
    new_env = {"ATTENTION_REF_LOAD_FACTOR": ""}
    # Each code's once-only costs (its student edition, its caches) before either is timed.
    for which, env, tree in (("before", old_env, old_tree), ("after", new_env, None)):
        warm = _grading_course(tmp / f"warm-{which}", [AID], root=tree)
        _submit(warm, "warm", AID, _solved(AID))
        _make_grade(warm, 2, env, check=False)
    outs, seconds = {}, {}
    code = {"before": opts.semester_before, "after": "this"}
    for which, course, env in (("before", before, old_env), ("after", after, new_env)):
        seconds[which], outs[which] = _make_grade(course, 2, env, check=False)
        print(
            f"grading semester code={code[which]} "
            f"students={len(expected)} jobs=2 seconds={seconds[which]:.1f} "
            f"load_average={os.getloadavg()[0]:.1f}",
            flush=True,
        )
    c = semester_comparison(outs["before"], outs["after"], expected)
    print(
        f"grading semester students={c['students']} exact_before={c['exact_before']} "
        f"exact_after={c['exact_after']} both_exact={len(c['both'])} "
        f"before_s={c['before_s']:.1f} after_s={c['after_s']:.1f} ratio={c['ratio']:.3f} "
        f"(per-submission seconds summed over the students both graded exactly; whole class: "
        f"before {seconds['before']:.1f} s, after {seconds['after']:.1f} s)",
        flush=True,
    )
    ok = c["exact_after"] == c["students"]
    exact = _target("semester_graded_exactly", ok, f"{c['exact_after']}/{c['students']}")
    return exact & _target(
        f"semester<={SEMESTER_TARGET:.2f}x_before",
        c["ratio"] <= SEMESTER_TARGET,
        f"{c['ratio']:.3f}x",
    )


@benchmark(
    "grading",
    "cost of a looping submission; a class graded with 1 vs 2 workers, with and without sandbox",
)
def bench_grading(opts: argparse.Namespace) -> bool:
    import os
    import tempfile
    from pathlib import Path

    from .course.plumbing import assignments, course_root
    from .training import GRADING_STEPS_ENV

    aids = assignments(course_root())
    loop_aid = "01_dot_product_attention"
    met = []
    from .trust import sandbox

    if sandbox.enabled() and not sandbox.unavailable_reason():
        sandbox.student_edition()  # built once for these sources, before any run is timed
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        # 6. (first, so that --cluster-only runs it alone) make grade's engine: the same
        #    class on its own local cluster and on a running two-worker Dask cluster.
        if opts.cluster_students > 0:
            met.append(_bench_cluster(opts, tmp))
        if opts.cluster_only:
            return all(met) or not opts.strict
        # 7. Issue 39's budget: the semester's class graded by the code before the issue and
        #    by this code, two at a time (``--semester``; ``--semester-only`` runs it alone).
        if opts.semester or opts.semester_only:
            met.append(_bench_semester(opts, tmp))
        if opts.semester_only:
            return all(met) or not opts.strict
        # 1. One submission of notebook 01 whose sdpa loops forever, next to a solution:
        #    both graded one at a time, so the difference is what the loop costs.
        course = _grading_course(tmp / "loop", [loop_aid])
        _submit(course, "solution", loop_aid, _solved(loop_aid))
        _submit(course, "looping", loop_aid, _solved(loop_aid, loop="sdpa"))
        _, out = _make_grade(course, 1)
        loop_cost = _seconds_of(out, "looping") - _seconds_of(out, "solution")
        graded = course / "autograded" / "looping" / loop_aid / f"{loop_aid}.ipynb"
        cells, checks = _interrupted(graded)
        print(
            f"grading loop notebook={loop_aid} exercise=sdpa before_s={OLD_LOOP_S:.0f} "
            f"(issue 13, 300 s per cell) after_s={loop_cost:.1f} "
            f"(looping {_seconds_of(out, 'looping'):.1f} s - solution "
            f"{_seconds_of(out, 'solution'):.1f} s) interrupted_cells_s={'+'.join(cells)} "
            f"check_time_limits_hit={checks} load_average={os.getloadavg()[0]:.1f}",
            flush=True,
        )
        met.append(
            _target(f"loop<={LOOP_TARGET_S:.0f}s", loop_cost <= LOOP_TARGET_S, f"{loop_cost:.1f} s")
        )
        # 2. Issue 13's grading, measured in this run: one worker, every training cell
        #    trained in full, on K students (each graded alone: the cost is K per-student
        #    costs, so it scales to the class exactly).
        n = opts.students
        k = opts.baseline_students
        baseline = None
        if k > 0:
            course = _grading_course(tmp / "baseline", aids)
            for i in range(k):
                for aid in aids:
                    _submit(course, f"student{i + 1:03d}", aid, _solved(aid))
            seconds, _ = _make_grade(course, 1, {GRADING_STEPS_ENV: "all"})
            baseline = seconds / k
            print(
                f"grading baseline students={k} assignments={len(aids)} jobs=1 training=full "
                f"seconds={seconds:.1f} per_student_s={baseline:.1f} (issue 13 measured "
                f"{OLD_STUDENT_S:.0f}) load_average={os.getloadavg()[0]:.1f}",
                flush=True,
            )
        # 3. A class of N students with full solutions to every assignment, graded with
        #    each number of workers in turn (each in a fresh copy of the same course).
        times = {}
        for jobs in opts.grading_jobs:
            course = _grading_course(tmp / f"class-{jobs}", aids)
            for k in range(n):
                for aid in aids:
                    _submit(course, f"student{k + 1:03d}", aid, _solved(aid))
            times[jobs], _ = _make_grade(course, jobs)
            print(
                f"grading class students={n} assignments={len(aids)} jobs={jobs} "
                f"seconds={times[jobs]:.1f} per_student_s={times[jobs] / n:.1f} "
                f"load_average={os.getloadavg()[0]:.1f}",
                flush=True,
            )
        # 4. The sandbox's cost, 5. the trusted checker's and 6. the grading editions':
        #    the same class, with the most workers, graded once more without the sandbox
        #    (ATTENTION_REF_SANDBOX=off), once more judged by the kernel as nbgrader alone
        #    does (ATTENTION_REF_TRUSTED_CHECKER=off), and once more with every kernel on
        #    the student edition (ATTENTION_REF_GRADING_EDITIONS=off), in this run.
        jobs = max(opts.grading_jobs)
        compared = (
            (
                "sandbox",
                opts.sandbox_compare,
                "ATTENTION_REF_SANDBOX",
                "sandboxed_s",
                "unsandboxed_s",
                "sandbox<=1.10x_unsandboxed",
                1.10,
            ),
            (
                "trusted_checker",
                opts.trusted_compare,
                "ATTENTION_REF_TRUSTED_CHECKER",
                "checker_s",
                "kernel_judged_s",
                "checker<=1.25x_kernel_judged",
                1.25,
            ),
            (
                "grading_editions",
                opts.editions_compare,
                "ATTENTION_REF_GRADING_EDITIONS",
                "editions_s",
                "student_edition_s",
                "editions<=1.05x_student_edition",
                1.05,
            ),
        )
        for what, wanted, switch, with_name, without_name, target, most in compared:
            if not wanted:
                continue
            course = _grading_course(tmp / f"class-without-{what}", aids)
            for k in range(n):
                for aid in aids:
                    _submit(course, f"student{k + 1:03d}", aid, _solved(aid))
            without, _ = _make_grade(course, jobs, {switch: "off"})
            cost = times[jobs] / without
            print(
                f"grading {what} students={n} jobs={jobs} {with_name}={times[jobs]:.1f} "
                f"{without_name}={without:.1f} ratio={cost:.3f} "
                f"load_average={os.getloadavg()[0]:.1f}",
                flush=True,
            )
            met.append(_target(target, cost <= most, f"{cost:.3f}x"))
    if 1 in times:
        for jobs, t in times.items():
            if jobs != 1:
                print(f"grading class jobs={jobs}/jobs=1 time={t / times[1]:.2f}x", flush=True)
    best = min(times.values())
    if baseline is not None:
        old, source = baseline * n, f"measured in this run: {baseline:.1f} s per student x {n}"
    else:
        old, source = OLD_STUDENT_S * n, f"issue 13: {OLD_STUDENT_S:.0f} s per student x {n}"
    ratio = best / old
    print(
        f"grading class students={n} best_s={best:.1f} old_sequential_s={old:.0f} "
        f"({source}) ratio={ratio:.2f}; against issue 13's {OLD_STUDENT_S:.0f} s per "
        f"student: {best / (OLD_STUDENT_S * n):.2f}",
        flush=True,
    )
    met.append(_target("class<=1/3_old_sequential", ratio <= 1 / 3, f"{ratio:.2f}x"))
    return all(met) or not opts.strict


# ----------------------------------------------------------------------------- triton (nb 14)
@benchmark("triton", "notebook 14: the Triton kernels vs PyTorch's fused attention (GPU)")
def bench_triton(opts: argparse.Namespace) -> bool:
    if not torch.cuda.is_available() or opts.device == "cpu":
        print("triton: needs a CUDA GPU (Triton's interpreter on a CPU is for correctness, "
              "not speed); skipped")  # fmt: skip
        return True
    import triton

    print(
        f"triton device={torch.cuda.get_device_name()} torch={torch.__version__} "
        f"triton={triton.__version__} batch=4 heads=16 d_heads={opts.d_heads} "
        f"launch={TRITON_LAUNCH} backward={BACKWARD_LAUNCH} passes={opts.passes}"
    )
    rows = triton_rows(lengths=opts.lengths, dtypes=opts.triton_dtypes, d_head=opts.d_heads,
                       repeats=opts.repeats, passes=opts.passes, tuned=True)  # fmt: skip
    for row in rows:
        print(row.line(), flush=True)
    if opts.record:
        print(f"triton record={write_record(rows, opts.record, batch=4, heads=16)}")
    limits = {(4096, False): 1.2, (16384, False): 1.2, (4096, True): 1.25, (16384, True): 1.25}
    met = True
    for r in rows:
        limit = limits.get((r.n, r.causal))
        if r.pass_ == "bwd":
            limit = 1.5 if r.n in (4096, 16384) else None
        if r.impl == "reference" and r.dtype == "float16" and r.d_head == 64 and limit:
            ok = r.ratio <= limit
            met = met and ok
            print(f"triton target pass={r.pass_} n={r.n} causal={r.causal} float16 "
                  f"ratio={r.ratio:.2f} limit={limit} met={ok}")  # fmt: skip
    return met or not opts.strict


# ----------------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attention_ref.bench",
        description="Benchmarks of the Attention from Scratch course.",
    )
    p.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=[*BENCHMARKS, "all"],
        help="which benchmark to run (default: all, the calibration first)",
    )
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", default=default_device)
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="CPU thread counts, one run of the attention lines and one calibration line "
        "each (0: PyTorch's default)",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--block-size", type=int, default=512, help="keys per block (online)")
    p.add_argument("--q-block-size", type=int, default=256, help="queries per block (online)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--naive-limit-gib",
        type=float,
        default=4.0,
        help="skip naive attention when its score and weight matrices need more",
    )
    p.add_argument("--kv-tokens", type=int, default=256, help="tokens generated (0: skip)")
    p.add_argument("--kv-d-model", type=int, default=256)
    p.add_argument("--students", type=int, default=2, help="grading: students in the class")
    p.add_argument(
        "--baseline-students",
        type=int,
        default=1,
        help="grading: students graded as issue 13 did (one worker, full training); 0: skip",
    )
    p.add_argument(
        "--grading-jobs", type=int, nargs="+", default=[1, 2], help="grading: workers to compare"
    )
    p.add_argument(
        "--no-sandbox-compare",
        dest="sandbox_compare",
        action="store_false",
        help="grading: skip grading the class again without the sandbox",
    )
    p.add_argument(
        "--no-trusted-compare",
        dest="trusted_compare",
        action="store_false",
        help="grading: skip grading the class again without the trusted checker",
    )
    p.add_argument(
        "--no-editions-compare",
        dest="editions_compare",
        action="store_false",
        help="grading: skip grading the class again with every kernel on the student edition "
        "(no answer withheld)",
    )
    p.add_argument(
        "--cluster-students",
        type=int,
        default=2,
        help="grading: students of notebook 01 graded on the local and on a two-worker Dask "
        "cluster (the overhead target is for 20); 0: skip",
    )
    p.add_argument(
        "--cluster-only",
        action="store_true",
        help="grading: only the local against the two-worker cluster",
    )
    p.add_argument(
        "--semester",
        action="store_true",
        help="grading: also grade the semester's class of tests/test_busy_class.py (30 "
        "notebooks as students save them) with the code of --semester-before and with this "
        "code, two at a time, and compare their times (issue 39's budget: 1.10x)",
    )
    p.add_argument(
        "--semester-only", action="store_true", help="grading: only the semester's comparison"
    )
    p.add_argument(
        "--semester-before",
        default=BEFORE_ISSUE_39,
        metavar="COMMIT",
        help=f"grading: the commit whose code --semester compares with (default "
        f"{BEFORE_ISSUE_39}, the last before issue 39)",
    )
    p.add_argument(
        "--notebooks",
        nargs="+",
        default=None,
        metavar="NN_name",
        help="notebooks: the solution notebooks to execute (default: all)",
    )
    p.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=list(PASSES),
        help="triton: the passes to time (forward, backward, both)",
    )
    p.add_argument("--d-heads", type=int, nargs="+", default=[64, 128], help="triton: head sizes")
    p.add_argument(
        "--triton-dtypes",
        nargs="+",
        choices=["float16", "float32", "float32+tf32"],
        default=["float16", "float32"],
        help="triton: dtypes (float32+tf32: tl.dot allowed TF32)",
    )
    p.add_argument(
        "--record",
        default=None,
        metavar="PATH",
        help="triton: write the table, with the GPU and the versions, to this JSON file "
        "(notebook 14 draws attention_ref/records/triton_bench.json)",
    )
    p.add_argument("--strict", action="store_true", help="a missed target is an error")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks named on the command line; 0 if all ran (and, with --strict,
    met their targets)."""
    opts = _parser().parse_args(argv)
    names = list(BENCHMARKS) if opts.which == "all" else [opts.which]
    failed = []
    for name in names:
        try:
            ok = BENCHMARKS[name].run(opts)
        except Exception as err:
            print(f"benchmark {name} FAILED: {type(err).__name__}: {err}", flush=True)
            ok = False
        if not ok:
            failed.append(name)
    if failed:
        print(f"FAILED: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
