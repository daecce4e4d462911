"""The behaviour of ``check`` itself: errors, feedback format, tripwire, tamper-proofing."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from attention_ref.checks import _core, check, exercise_ids
from attention_ref.course.authoring import HIDDEN_CHECK

from catalog.nb01 import sdpa_einsum_where


def test_unknown_exercise_id_is_a_value_error_listing_the_known_ids():
    with pytest.raises(ValueError) as err:
        check("sdpa_typo", sdpa_einsum_where)
    assert "sdpa_typo" in str(err.value) and "masked_softmax" in str(err.value)


def test_every_reference_export_has_a_check_of_the_same_name():
    import attention_ref

    functions = ["softmax_np", "sdpa_np", "sdpa", "padding_mask", "causal_mask", "masked_softmax"]
    for name in functions:
        assert name in exercise_ids()
        assert callable(getattr(attention_ref, name))


def test_passing_a_non_callable_gets_its_own_message():
    with pytest.raises(AssertionError, match="pass your function itself; got int"):
        check("sdpa", 3)


def test_not_implemented_stub_is_reported_as_such():
    def sdpa(q, k, v, mask=None):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="not implemented yet"):
        check("sdpa", sdpa)


def test_an_exception_in_student_code_quotes_the_students_line():
    def sdpa(q, k, v, mask=None):
        scores = q @ k  # forgot the transpose
        return scores, scores

    with pytest.raises(AssertionError) as err:
        check("sdpa", sdpa)
    msg = str(err.value)
    assert "your code raised RuntimeError" in msg
    assert "scores = q @ k  # forgot the transpose" in msg
    assert "Traceback" not in msg


def test_wrong_return_type_gets_a_clear_message():
    def sdpa(q, k, v, mask=None):
        return q

    with pytest.raises(
        AssertionError,
        match=r"must return a tuple \(out, weights\); got a "
        r"single Tensor",
    ):
        check("sdpa", sdpa)


def test_numpy_exercise_returning_a_tensor_is_told_to_use_numpy():
    def softmax_np(x, axis=-1):
        return torch.softmax(torch.from_numpy(np.asarray(x)), axis)

    with pytest.raises(AssertionError, match="calls torch.softmax"):
        check("softmax_np", softmax_np)


def test_the_tripwire_restores_any_profiler_that_was_running():
    calls = []

    def profiler(frame, event, arg):
        calls.append(event)

    sys.setprofile(profiler)
    try:
        check("sdpa", sdpa_einsum_where)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)


def test_check_prints_a_success_line(capsys):
    check("sdpa", sdpa_einsum_where)
    assert "✓ sdpa: passed" in capsys.readouterr().out


def _run_in_fresh_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_hidden_tests_cannot_be_fooled_by_replacing_the_checker():
    """A wrong answer plus `attention_ref.checks.check = lambda *a, **k: None` (and the
    reference swapped for the student's code) still fails the hidden test block."""
    hidden = HIDDEN_CHECK.format(id="sdpa", name="sdpa", seed=2024)
    code = """
        import torch, attention_ref, attention_ref.checks, attention_ref.attention
        def sdpa(q, k, v, mask=None):          # wrong: no scaling
            w = torch.softmax(q @ k.transpose(-2, -1), -1)
            return w @ v, w
        attention_ref.checks.check = lambda *a, **k: None
        attention_ref.attention.sdpa = sdpa
        attention_ref.sdpa = sdpa
        from attention_ref.checks import check
        check("sdpa", sdpa)                     # the visible test now passes ...
        print("VISIBLE PASSED")
    """ + textwrap.indent(hidden, " " * 8)
    proc = _run_in_fresh_python(code)
    assert "VISIBLE PASSED" in proc.stdout
    assert proc.returncode != 0
    assert "not scaled by 1/sqrt(d_k)" in proc.stderr


def test_hidden_tests_pass_a_correct_answer():
    hidden = HIDDEN_CHECK.format(id="causal_mask", name="causal_mask", seed=2024)
    code = """
        import torch
        def causal_mask(n):
            return torch.ones(n, n, dtype=torch.bool).tril()
    """ + textwrap.indent(hidden, " " * 8)
    proc = _run_in_fresh_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "✓ causal_mask: passed" in proc.stdout


def test_expected_and_got_are_printed_with_enough_digits_to_differ():
    from catalog.framework import sdpa_softmax_in_float32

    with pytest.raises(AssertionError) as err:
        check("sdpa", sdpa_softmax_in_float32)
    want, got = re.search(r"expected (\S+), got (\S+) \(", str(err.value)).groups()
    assert want != got
    assert "precision loss" in str(err.value)


def test_a_mistake_that_changes_nothing_on_the_input_is_not_named():
    """A mistake is named only if its model differs from the correct output there."""
    ctx = _core.Context(_core.REGISTRY["sdpa"], 0, False)
    expected = np.array([0.25, 0.75])
    got = np.array([0.3, 0.7])
    mistakes = [
        _core.Mistake("harmless here", "-", model=lambda: expected.copy()),
        _core.Mistake("the real one", "-", model=lambda: got.copy()),
    ]
    with pytest.raises(AssertionError) as err:
        ctx.expect_close(got, expected, what="w", rtol=1e-7, atol=1e-10, mistakes=mistakes)
    assert "harmless here" not in str(err.value)
    assert "Likely mistake: the real one" in str(err.value)


@pytest.mark.parametrize(("seed", "thorough"), [(0, False), (2024, True)])
def test_the_large_logit_case_of_sdpa_np_overflows_an_unstable_softmax(seed, thorough):
    """Issue 29: "scores around 1000" peaked at 679, below where float64's exp overflows, so
    an unstable softmax passed the self-check and failed only the graded run."""
    from attention_ref.checks import nb01

    ctx = _core.Context(_core.REGISTRY["sdpa_np"], seed, thorough)
    (case,) = [c for c in nb01.attention_cases(ctx) if c.label.startswith("large logits")]
    scores = case.q @ case.k.T / np.sqrt(case.q.shape[-1])
    assert (scores > nb01.EXP_OVERFLOW).all(), scores
    assert abs(scores.mean() - 1000) < 100, scores  # "around 1000"
    assert np.ptp(scores, axis=-1).min() > 10, scores  # tens apart: the weights still differ


MHA_ON_NOTEBOOK_HELPERS = """
import math
import torch
from torch import nn


def split_heads(x, n_heads):  # exercise 1, wrong: view without transpose
    B, T, D = x.shape
    return x.view(B, n_heads, T, D // n_heads)


def merge_heads(x):  # exercise 2, right
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)
        self.w_v, self.w_o = nn.Linear(d_model, d_model, bias), nn.Linear(d_model, d_model, bias)

    def forward(self, query, key, value, mask=None):
        H = self.n_heads
        q, k, v = (split_heads(f(t), H) for f, t in ((self.w_q, query), (self.w_k, key),
                                                      (self.w_v, value)))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~(mask.unsqueeze(1) if mask.dim() == 3 else mask), float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        return self.w_o(merge_heads(w @ v)), w
"""


def test_multi_head_attention_is_graded_on_the_reference_split_heads():
    """Issue 29: a bug in split_heads cost its own 2 points and multi-head attention's 5. The
    module is graded with the reference helpers under the names its forward looks up, and
    the notebook's own functions are back afterwards, after a failure too."""
    namespace: dict = {"__name__": "notebook"}
    exec(MHA_ON_NOTEBOOK_HELPERS, namespace)
    mine = namespace["split_heads"]
    with pytest.raises(AssertionError):
        check("split_heads", mine)  # costs split_heads' points...
    check("multi_head_attention", namespace["MultiHeadAttention"])  # ... and only those
    assert namespace["split_heads"] is mine
    exec("def unmerged(x):\n    return x\n", namespace)
    namespace["merge_heads"] = namespace["unmerged"]  # a broken merge_heads is replaced too
    check("multi_head_attention", namespace["MultiHeadAttention"])
    exec("def forward(self, query, key, value, mask=None):\n    return query, None\n", namespace)
    namespace["MultiHeadAttention"].forward = namespace["forward"]  # wrong: fails...
    with pytest.raises(AssertionError):
        check("multi_head_attention", namespace["MultiHeadAttention"])
    assert namespace["split_heads"] is mine  # ... and the notebook's own are back
    assert namespace["merge_heads"] is namespace["unmerged"]


def test_sdpa_np_is_graded_on_the_reference_softmax_np():
    """Issue 29: an unstable softmax_np cost its own 2 points and sdpa_np's 3. sdpa_np is
    graded with the reference softmax_np under its name; a softmax written inside sdpa_np
    is still graded there (the catalog's sdpa_np_unstable_softmax)."""
    namespace: dict = {"np": np}
    exec(
        "def softmax_np(x, axis=-1):  # exercise 1, unstable\n"
        "    e = np.exp(x)\n"
        "    return e / e.sum(axis=axis, keepdims=True)\n"
        "\n"
        "def sdpa_np(Q, K, V, mask=None):\n"
        "    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])\n"
        "    if mask is not None:\n"
        "        s = np.where(mask, s, -np.inf)\n"
        "    w = softmax_np(s)\n"
        "    return w @ V, w\n",
        namespace,
    )
    mine = namespace["softmax_np"]
    with pytest.raises(AssertionError, match="softmax_unstable"):
        check("softmax_np", mine)  # costs softmax_np's points...
    check("sdpa_np", namespace["sdpa_np"])  # ... and only those
    check("sdpa_np", namespace["sdpa_np"], seed=2024, thorough=True)
    assert namespace["softmax_np"] is mine
