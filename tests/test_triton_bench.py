"""Notebook 14's benchmark table and tuning, run on a CPU through Triton's interpreter: the
table's code (every pass, every implementation, the errors it reports), its record and its
figure, and the autotuned kernel's answers. The GPU's figures come from tools/gpu_nb14.py."""

from __future__ import annotations

import json
import math

import matplotlib
import pytest
import torch

from attention_ref.triton_bench import (
    PASSES,
    TritonRow,
    attention_flops,
    load_record,
    triton_rows,
    write_record,
)

# The module chooses Triton's interpreter (no GPU) before it imports triton; an older Triton
# than its floor (the oldest PyTorch pins 3.1) cannot run notebook 14's kernels.
triton_attention = pytest.importorskip("attention_ref.triton_attention").triton_attention
from attention_ref.triton_tuning import (  # noqa: E402 - needs the interpreter chosen above
    interpreter_timer,
    triton_attention_tuned,
    tuned_attention_kernel,
    tuning_configs,
)

matplotlib.use("Agg")


def clock(call, grad_to_none):
    """A CPU stand-in for do_bench: the median of three wall-clock timings, in ms."""
    return interpreter_timer(call)[0]


@pytest.fixture(scope="module")
def small_table() -> list[TritonRow]:
    return triton_rows(lengths=(40,), dtypes=("float32",), batch=1, heads=2, d_head=(16,),
                       passes=PASSES, tuned=True, device="cpu", timer=clock)  # fmt: skip


def test_the_table_times_every_pass_of_every_implementation_against_the_fused_one(small_table):
    seen = {(r.impl, r.pass_, r.causal) for r in small_table}
    for causal in (False, True):
        for pass_ in PASSES:
            assert {("fused", pass_, causal), ("reference", pass_, causal)} <= seen
        assert ("tuned", "fwd", causal) in seen  # the autotuned kernel: forward only
    assert ("tuned", "bwd", False) not in seen
    for r in small_table:
        assert r.ms > 0 and r.tflops > 0
        if r.impl == "fused":
            assert r.ratio == 1.0
        flops = attention_flops(1, 2, 40, 16, r.causal, r.pass_)
        assert math.isclose(r.tflops, flops / (r.ms / 1e3) / 1e12, rel_tol=1e-9)


def test_the_table_measures_each_result_against_float64(small_table):
    """The forward rows compare the output, the backward rows dq, dk and dv: a table whose
    kernels were wrong would show it in its errors."""
    for r in small_table:
        assert r.max_err < 1e-5, r.line()


def test_flops_count_the_backward_as_two_and_a_half_forwards_and_causal_as_half():
    fwd = attention_flops(2, 3, 128, 64, False)
    assert fwd == 4 * 2 * 3 * 128 * 128 * 64
    assert attention_flops(2, 3, 128, 64, False, "bwd") == 2.5 * fwd
    assert attention_flops(2, 3, 128, 64, True, "fwd+bwd") == 3.5 * fwd / 2
    with pytest.raises(ValueError, match="pass_ must be one of"):
        attention_flops(1, 1, 8, 8, False, "backward")


def test_a_recorded_table_reads_back_with_its_versions_and_draws(tmp_path, small_table):
    from attention_ref.plots import plot_triton_bench

    path = write_record(small_table, tmp_path / "r" / "triton_bench.json", batch=1, heads=2)
    record = load_record(path)
    assert record["rows"] == small_table
    assert {"device", "torch", "triton", "date"} <= set(record)
    axes = plot_triton_bench(record["rows"], dtype="float32", d_head=16, title="CPU")
    assert [ax.get_title() for ax in axes] == ["forward", "backward", "forward + backward"]
    assert len(axes[0].get_lines()) == 6  # fused, reference and tuned, each causal and not
    with pytest.raises(ValueError, match="no rows of dtype 'float16'"):
        plot_triton_bench(record["rows"])


def test_a_missing_record_is_none_and_a_broken_one_names_its_file(tmp_path):
    assert load_record(tmp_path / "absent.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": "x", "rows": [{"impl": "fused"}]}))
    with pytest.raises(ValueError, match="bad.json is not a recorded Triton benchmark"):
        load_record(bad)


@pytest.mark.parametrize("causal", [False, True])
def test_the_autotuned_kernel_gives_the_reference_answers_and_keeps_its_choice(causal):
    torch.manual_seed(1)
    q = torch.randn(1, 2, 33, 16)
    k, v = torch.randn(2, 1, 2, 47, 16)
    tuner = tuned_attention_kernel(space=((16, 16, 4, 2), (32, 16, 8, 3)))
    out, lse = triton_attention_tuned(q, k, v, causal, tuner=tuner)
    ref_out, ref_lse = triton_attention(q, k, v, causal)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert tuner.best_config.kwargs["BLOCK_M"] in (16, 32)
    assert len(tuner.cache) == 1  # one key (the lengths, d, causal, precision, dtypes)


def test_a_tuning_entry_that_is_not_a_launch_names_what_was_expected():
    with pytest.raises(ValueError, match=r"\(BLOCK_M, BLOCK_N, num_warps, num_stages\)"):
        tuning_configs([(64, 64, 4)])
    with pytest.raises(ValueError, match="BLOCK_N must be a power of two >= 16; got 48"):
        tuning_configs([(64, 48, 4, 2)])
