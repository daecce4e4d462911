"""The modern decoder of notebook 13: RMSNorm, SwiGLU, rotary grouped-query attention, the
block and the model with its key-value cache."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_ref import GroupedQueryAttention, rope
from attention_ref.encoder import FeedForward
from attention_ref.gpt import GPTBlock
from attention_ref.kv_cache import KVCache
from attention_ref.modern import (
    ModernBlock,
    ModernGPT,
    RMSNorm,
    RotaryAttention,
    SwiGLU,
    count_parameters,
    swiglu_hidden,
    with_parts_of,
)
from attention_ref.sampling import generate
from attention_ref.weights import is_a


def test_rms_norm_equals_pytorchs_with_the_same_epsilon():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64) * 1e-3  # eps matters here
    ours = RMSNorm(16, eps=1e-6).double()
    theirs = nn.RMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        w = torch.randn(16, generator=g, dtype=torch.float64)
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-15)
    # ... and the epsilon is inside the root: outside it, the result differs at this scale.
    outside = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * w
    assert (ours(x) - outside).abs().max() > 1e-4


def test_rms_norm_keeps_a_low_precision_dtype_and_normalises_in_float32():
    x = torch.randn(2, 8, dtype=torch.float64) * 100
    y = RMSNorm(8).to(torch.bfloat16)(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double().pow(2).mean(-1), torch.ones(2, dtype=torch.float64),
                               rtol=2e-2, atol=0)  # fmt: skip


def test_swiglu_hidden_size_gives_the_parameters_of_a_4d_relu_network():
    for d in (12, 64, 96):
        assert swiglu_hidden(d) == 8 * d // 3
        swiglu = count_parameters(SwiGLU(d))
        relu = 2 * d * 4 * d  # the two matrices of FeedForward(d, 4d) without biases
        assert abs(swiglu - relu) / relu < 0.02


def test_swiglu_computes_the_gated_product():
    torch.manual_seed(0)
    f = SwiGLU(8, 12).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    gate, up = x @ f.w_gate.weight.T, x @ f.w_up.weight.T
    expected = (gate * torch.sigmoid(gate) * up) @ f.w_down.weight.T
    torch.testing.assert_close(f(x), expected)
    assert all(m.bias is None for m in (f.w_gate, f.w_up, f.w_down))


def _copy_projections(src: nn.Module, dst: nn.Module) -> None:
    with torch.no_grad():
        for name in ("w_q", "w_k", "w_v", "w_o"):
            getattr(dst, name).weight.copy_(getattr(src, name).weight)


def test_rotary_attention_at_position_zero_is_grouped_query_attention():
    """With every position 0 nothing is rotated: notebook 11's grouped-query attention."""
    torch.manual_seed(0)
    ours = RotaryAttention(16, 4, 2).double()
    gqa = GroupedQueryAttention(16, 4, 2, bias=False).double()
    _copy_projections(ours, gqa)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    out, w = ours(x, positions=torch.zeros(6))
    out_g, w_g = gqa(x, x, x, causal)
    torch.testing.assert_close(out, out_g)
    torch.testing.assert_close(w, w_g)
    # ... and with positions 0..T-1 the rotation changes the weights.
    assert (ours(x)[1] - w_g).abs().max() > 1e-3


def test_rotary_attention_depends_only_on_relative_positions():
    torch.manual_seed(1)
    attn = RotaryAttention(16, 4, 1, base=100.0).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    out0, w0 = attn(x)
    out5, w5 = attn(x, positions=torch.arange(5, 12))
    torch.testing.assert_close(w0, w5)
    torch.testing.assert_close(out0, out5)


def test_rotary_attention_rotates_queries_and_keys_per_head_with_the_course_rope():
    torch.manual_seed(2)
    attn = RotaryAttention(12, 3, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    q, k, v = attn.project(x, None)
    heads = attn.w_q(x).view(2, 5, 3, 4).transpose(1, 2)  # (B, H, T, d_head)
    torch.testing.assert_close(q, rope(heads))
    torch.testing.assert_close(v, attn.w_v(x).view(2, 5, 3, 4).transpose(1, 2))


def test_modern_block_is_causal_and_its_step_matches_forward():
    torch.manual_seed(3)
    block = ModernBlock(16, 4, 2).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    y, _ = block(x)
    x2 = x.clone()
    x2[:, -1] += 1
    assert torch.allclose(block(x2)[0][:, :-1], y[:, :-1])
    cache = KVCache(6)
    steps = [block.step(x[:, :4], cache), block.step(x[:, 4:5], cache), block.step(x[:, 5:], cache)]
    torch.testing.assert_close(torch.cat(steps, 1), y)


def test_modern_gpt_cached_generation_equals_uncached_and_padding_is_masked():
    torch.manual_seed(4)
    model = ModernGPT(30, 16, 4, 2, 2, max_len=32).double().eval()
    prompt = torch.randint(0, 30, (3, 4))
    with torch.no_grad():
        a = generate(model, prompt, 10, temperature=0)
        b = generate(model, prompt, 10, temperature=0, use_cache=False)
        assert torch.equal(a, b)
        # A right-padded row gives the logits of its unpadded tokens.
        ids = torch.randint(1, 30, (2, 7))
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, 4:] = 0
        padded = model(ids, attention_mask=mask)
        torch.testing.assert_close(padded[1, :4], model(ids[1:, :4])[0])
        # A left-padded row: same positions 0..T-1, the pads masked as keys.
        left = mask.flip(1)
        logits = model(ids, attention_mask=left)
        assert torch.isfinite(logits[left.bool()]).all()


def test_modern_block_has_about_the_parameters_of_notebook_11s_block():
    d = 64
    modern = count_parameters(ModernBlock(d, 4, 4))
    gpt = count_parameters(GPTBlock(d, 4, 4 * d))
    assert abs(modern - gpt) / gpt < 0.03
    assert count_parameters(FeedForward(d, 4 * d)) > count_parameters(SwiGLU(d))


def test_modern_gpt_can_be_built_from_other_parts():
    class MyNorm(RMSNorm):
        pass

    model = ModernGPT(10, 8, 2, 1, norm=MyNorm, ff=lambda d, f: SwiGLU(d, 16))
    assert isinstance(model.blocks[0].norm1, MyNorm) and isinstance(model.norm_f, MyNorm)
    assert model.blocks[0].ff.w_up.out_features == 16
    assert model.embed_scale == pytest.approx(math.sqrt(8))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_sizes_are_value_errors(bad):
    with pytest.raises(ValueError, match="d_model"):
        RMSNorm(bad)
    with pytest.raises(ValueError):
        RotaryAttention(16, 4, bad)


def test_every_step_of_the_ladder_has_notebook_11s_parameter_count():
    from attention_ref.apps.modern_lm import LADDER, gpt_parameters, make_modern, make_step

    V = 309  # the grammar's vocabulary
    target = gpt_parameters(V)
    for name, options in LADDER:
        n = count_parameters(make_step(V, options, match=target))
        assert abs(n - target) / target < 0.005, name
    modern = make_modern(V)
    assert modern.blocks[0].attn.n_kv_heads == 2 and modern.pos is None
    assert all(p.dim() > 1 for n, p in modern.named_parameters() if "norm" not in n)  # no biases


def test_fit_for_stops_near_its_time_and_the_model_learns():
    import time

    from attention_ref.apps.modern_lm import NOTEBOOK_TRAIN, fit_for, make_modern
    from attention_ref.data.grammar import make_grammar_data

    data = make_grammar_data(300, n_valid=10, n_test=10, seed=0)
    model = make_modern(len(data.vocab))
    t0 = time.perf_counter()
    history = fit_for(model, data, 0.5, **NOTEBOOK_TRAIN)
    assert time.perf_counter() - t0 < 5.0
    assert history.steps >= 3
    assert history.losses[-1] < history.losses[0]


def test_the_hub_is_not_tried_offline(monkeypatch):
    from attention_ref.convert import hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False


def test_the_benchmark_line_lists_each_seed_of_each_model():
    from attention_ref.apps.modern_lm import ModernResult, Run

    runs = [
        Run("GPT (notebook 11)", 0, 128064, 1500, 60.0, 1.0026, 0.978),
        Run("modern", 0, 128000, 1300, 60.0, 1.0023, 0.988),
        Run("GPT (notebook 11)", 1, 128064, 1400, 60.0, 1.0031, 0.981),
        Run("modern", 1, 128000, 1200, 60.0, 1.0030, 0.975),
    ]
    line = ModernResult("modern_cross_entropy_over_floor", 1.003, 60.0, runs).extras()
    assert "gpt_ce_over_floor=1.0026/1.0031" in line
    assert "modern_grammatical=0.988/0.975" in line
    assert "modern_steps=1300/1200" in line and "gpt_params=128064" in line


def test_with_parts_of_builds_the_same_model_of_the_learners_norm_and_feed_forward():
    """Graded, notebook 13's models are built of the learner's RMSNorm and SwiGLU: the same
    logits, the cached generation included; a class that fails leaves the model whole."""

    class MyNorm(RMSNorm):
        pass

    class MyFF(SwiGLU):
        def __init__(self, d_model, d_ff=None):
            super().__init__(d_model, d_ff)

    class Blank(nn.Module):
        def __init__(self, *args, **kwargs):
            raise NotImplementedError

    torch.manual_seed(0)
    model = ModernGPT(50, 16, 4, 2, 2, 24, max_len=20, eps=1e-5).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        before = model(ids)
    tokens = generate(model, ids[:, :2], 6, temperature=0)
    with pytest.raises(NotImplementedError):
        with_parts_of(model, norm=MyNorm, ff=Blank)
    assert not any(type(m) in (MyNorm, Blank) for m in model.modules())  # nothing swapped
    assert with_parts_of(model, norm=MyNorm, ff=MyFF) is model
    kinds = [type(m) for m in model.modules()]
    assert RMSNorm not in kinds and SwiGLU not in kinds
    assert kinds.count(MyNorm) == 5 and kinds.count(MyFF) == 2  # 2 per block, the final one
    assert all(m.eps == 1e-5 for m in model.modules() if type(m) is MyNorm)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), before)
    assert torch.equal(generate(model, ids[:, :2], 6, temperature=0), tokens)
    with pytest.raises(ValueError, match="biases or dropout"):
        with_parts_of(nn.Sequential(SwiGLU(8, 12, bias=True)), ff=MyFF)
    # a copy of the module imported afresh (as after a hidden test) holds other classes
    import importlib.util

    import attention_ref.modern as first

    spec = importlib.util.find_spec("attention_ref.modern")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    other = nn.Sequential(fresh.RMSNorm(8), fresh.SwiGLU(8, 12))
    assert type(other[0]) is not first.RMSNorm
    with_parts_of(other, norm=MyNorm, ff=MyFF)
    assert [type(m) for m in other] == [MyNorm, MyFF]
    # and a class of the learner's that subclasses the course's is one of them too
    assert is_a(MyNorm(4), fresh.RMSNorm) and not is_a(MyFF(4), fresh.RMSNorm)
