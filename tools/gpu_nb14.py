"""Notebook 14 on a CUDA machine, without Jupyter: its code, the benchmark, the checks.

    python tools/gpu_nb14.py [--skip-bench] [--skip-catalog]

Run from the repository root with torch and triton installed (``pip install -e .``). It
1. runs every code cell of solutions/14_triton_attention/14_triton_attention.ipynb as one
   script (the kernels compiled for the GPU; the self-checks and hidden tests included),
   printing each cell's seconds;
2. runs ``python -m attention_ref.bench triton`` (the course's kernels, forward, backward
   and both, and the autotuned forward, against PyTorch's fused attention at 1k, 4k and 16k
   tokens, d = 64 and 128, float16 and float32) and records the table for notebook 14 in
   attention_ref/records/triton_bench.json (and in $OUT/triton_bench.json when $OUT is set:
   commit the record, with the GPU, PyTorch and Triton versions it names);
3. runs the catalog of notebook 14 (tests/catalog/nb14.py) through the checks on CUDA: every
   mistake must be named by its id, every alternative must pass, visibly and thoroughly
   (except the mistakes only the interpreter can see, INTERPRETER_ONLY: their verdict is
   printed, not judged).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import linecache
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # attention_ref from this checkout, installed or not
RECORD = ROOT / "attention_ref" / "records" / "triton_bench.json"
NOTEBOOK = ROOT / "solutions" / "14_triton_attention" / "14_triton_attention.ipynb"
#: Mistakes the checks see only by watching Triton's interpreter (loads, tl.dot's work and
#: dtypes, addresses): compiled, the output may be right (a read past a tensor's end may
#: return garbage that a mask then drops, a store past it may corrupt memory or race).
INTERPRETER_ONLY = {
    "triton_future_tiles_loaded",
    "triton_future_tiles_computed",
    "triton_dot_upcast",
    "triton_load_out_of_bounds",
    "triton_store_out_of_bounds",
    "triton_split_missing",
    "triton_split_full_tile_masked",
    "triton_bwd_future_tiles",
    "triton_bwd_not_in_kernel",
}


def run_notebook() -> bool:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {"__name__": "__nb14__"}
    os.chdir(NOTEBOOK.parent)
    ok, start = True, time.perf_counter()
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        # @triton.jit reads its function's source (inspect.getsourcelines): give each cell
        # a name in linecache, as IPython does, or Triton refuses a kernel defined in it.
        name = f"<nb14 cell {i}>"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        t = time.perf_counter()
        try:
            exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our notebook
            print(f"cell {i}: ok {time.perf_counter() - t:.2f} s", flush=True)
        except Exception:  # noqa: BLE001 - report and go on
            ok = False
            print(f"cell {i}: FAILED\n{traceback.format_exc()}", flush=True)
    print(f"notebook: {'ok' if ok else 'FAILED'} in {time.perf_counter() - start:.1f} s")
    os.chdir(ROOT)
    return ok


def run_catalog() -> bool:
    sys.path.insert(0, str(ROOT / "tests"))
    from attention_ref.checks import check
    from attention_ref.checks.mistakes import mistake_id

    from catalog import ALTERNATIVES, MISTAKES

    ok = True
    for entry in [e for e in MISTAKES + ALTERNATIVES if e.exercise.startswith("triton_")]:
        t = time.perf_counter()
        verdicts = []
        for kwargs in ({}, {"seed": 2024, "thorough": True}):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    check(entry.exercise, entry.impl, **kwargs)
                verdicts.append("passed")
            except AssertionError as err:
                verdicts.append(mistake_id(str(err)) or "failed")
                if not entry.mistake_id:
                    print(str(err)[:600])
        if entry.mistake_id in INTERPRETER_ONLY:
            good = True  # not judged: the verdict below is for the record
        else:
            good = (
                verdicts[0] == entry.mistake_id and verdicts[1] != "passed"
                if entry.mistake_id
                else verdicts == ["passed", "passed"]
            )
        ok = ok and good
        print(
            f"catalog {entry.id}: want {entry.mistake_id or 'pass'} got {verdicts} "
            f"{'ok' if good else 'WRONG'} {time.perf_counter() - t:.1f} s",
            flush=True,
        )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-catalog", action="store_true")
    opts = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_nb14: no CUDA device; this script is for a GPU machine")
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    print(f"device={torch.cuda.get_device_name()} torch={torch.__version__}", flush=True)
    results = {"notebook": run_notebook()}
    if not opts.skip_bench:
        from attention_ref.bench import main as bench_main

        t = time.perf_counter()
        record = Path(os.environ.get("OUT") or RECORD.parent) / "triton_bench.json"
        results["bench"] = bench_main(["triton", "--record", str(record)]) in (0, None)
        if record != RECORD and record.exists():
            RECORD.parent.mkdir(parents=True, exist_ok=True)
            RECORD.write_text(record.read_text())
        print(f"bench: {time.perf_counter() - t:.1f} s")
    if not opts.skip_catalog:
        results["catalog"] = run_catalog()
    print("gpu_nb14:", " ".join(f"{k}={'ok' if v else 'FAILED'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
