"""Mixtral, Qwen3-MoE, GPT-OSS and DeepSeek-V3 (notebook 15), built from small
configurations with random weights (no download; sliding window 6, shorter than the texts
tested; DeepSeek-V3 has latent attention and no window), loaded into the course's parts:
the same logits, the same greedy tokens with the rolling cache."""

from __future__ import annotations

import pytest
import torch

# The converters read transformers 4.57's weight layouts (the lock's) and 5.x's (every
# expert's weights in one tensor; make versions' newest environment): both are tested there.
transformers = pytest.importorskip("transformers")

from logit_batches import V  # noqa: E402
from logit_batches import batches as _batches  # noqa: E402

from attention_ref import convert_moe  # noqa: E402
from attention_ref.convert import float64_internals, max_logit_difference  # noqa: E402
from attention_ref.convert_moe import (  # noqa: E402
    MOE_KINDS,
    float64_internals_moe,
    from_hf_moe,
    greedy_generate,
    tiny_moe_model,
)


def _worst(ours, theirs, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    return max(max_logit_difference(ours, theirs, ids, mask) for ids, mask in _batches(g))


def _tiny(kind: str):
    return tiny_moe_model(kind, seed=1, vocab_size=V)


@pytest.fixture(scope="module", params=MOE_KINDS)
def hf(request):
    return request.param, _tiny(request.param)


def test_float32_logits_equal(hf):
    kind, model = hf
    assert _worst(from_hf_moe(model), model, 2) <= 1e-5


def test_float64_logits_equal_with_the_routers_in_float64(hf):
    kind, _ = hf
    model = float64_internals_moe(tiny_moe_model(kind, seed=1, vocab_size=V).double())
    ours = from_hf_moe(model)
    assert next(ours.parameters()).dtype == torch.float64
    assert _worst(ours, model, 3) <= 1e-12


def test_float64_differs_by_float32_rounding_without_the_patch(hf):
    kind, _ = hf
    model = tiny_moe_model(kind, seed=1, vocab_size=V).double()
    if kind == "deepseek_v3" and int(transformers.__version__.split(".")[0]) < 5:
        # 4.57: its router's float32 gates meet float64 states in index_add_: no float64
        with pytest.raises(RuntimeError, match="same scalar type"):
            _worst(from_hf_moe(model), model, 3)
        return
    assert 1e-10 < _worst(from_hf_moe(model), model, 3) < 1e-5


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_float64_differs_by_float32_rounding_when_only_norms_and_rotary_are_patched(kind):
    """The routers' softmax in float32 alone: a float32-sized difference in float64."""
    _tiny(kind)
    model = float64_internals(tiny_moe_model(kind, seed=1, vocab_size=V).double())
    assert 1e-10 < _worst(from_hf_moe(model), model, 3) < 1e-5


def test_greedy_generation_with_the_rolling_cache_equals_generate(hf):
    kind, model = hf
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=24, do_sample=False, pad_token_id=0)  # fmt: skip
    ours = from_hf_moe(model)
    caches = ours.new_caches(29)
    windowed = [b.attn.window is not None for b in ours.blocks]
    if kind == "deepseek_v3":  # latent attention: c_kv and k_rope only, every position
        assert not any(windowed) and [c.size for c in caches] == [29] * len(caches)
    else:  # window 6: 5 slots; GPT-OSS's full layers (every other one) keep every position
        assert [c.size for c in caches] == [5 if w else 29 for w in windowed]
        assert windowed == ([True, False] if kind == "gpt_oss" else [True] * len(caches))
    assert theirs.shape == (2, 29)
    assert torch.equal(greedy_generate(ours, prompt, 24), theirs)


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe", "gpt_oss"])  # DeepSeek-V3: no window
def test_without_the_window_the_logits_differ(kind):
    model = _tiny(kind)
    ours = from_hf_moe(model)
    for block in ours.blocks:
        block.attn.window = None
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(5))
    assert max_logit_difference(ours, model, ids) > 1e-3


def test_qwen3_layers_are_sparse_or_dense_as_configured():
    ours = from_hf_moe(_tiny("qwen3_moe"))
    kinds = [type(b.ff).__name__ for b in ours.blocks]
    assert kinds == ["MoEFeedForward", "SwiGLU", "MoEFeedForward"]
    assert ours.blocks[0].attn.q_norm is not None


def test_without_qwen3s_query_and_key_norms_the_logits_differ():
    model = _tiny("qwen3_moe")
    ours = from_hf_moe(model)
    for block in ours.blocks:
        block.attn.q_norm = block.attn.k_norm = None
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(6))
    assert max_logit_difference(ours, model, ids) > 1e-3


def test_other_models_are_refused():
    model = _tiny("mixtral")
    with pytest.raises(ValueError, match="not a Qwen3-MoE"):
        convert_moe.from_qwen3_moe(model)
    with pytest.raises(ValueError, match="not a GPT-OSS"):
        convert_moe.from_gpt_oss(model)
    with pytest.raises(ValueError, match="kind must be one of"):
        tiny_moe_model("switch")


def test_gpt_oss_without_its_sinks_the_logits_differ():
    model = _tiny("gpt_oss")
    ours = from_hf_moe(model)
    with torch.no_grad():
        for block in ours.blocks:
            block.attn.sinks.fill_(float("-inf"))  # exp(-inf) = 0: no sink
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(7))
    assert max_logit_difference(ours, model, ids) > 1e-3


def test_deepseek_layers_shared_experts_and_the_selection_bias():
    model = _tiny("deepseek_v3")
    ours = from_hf_moe(model)
    kinds = [type(b.ff).__name__ for b in ours.blocks]
    assert kinds == ["SwiGLU", "MoEFeedForward", "MoEFeedForward"]  # first_k_dense_replace=1
    assert ours.blocks[1].ff.shared is not None
    assert ours.blocks[1].ff.e_score_correction_bias.abs().max() > 0
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(8))
    for block in ours.blocks[1:]:
        block.ff.e_score_correction_bias.zero_()  # selection without the bias
    assert max_logit_difference(ours, model, ids) > 1e-4


def test_deepseek_cache_holds_only_latents():
    model = _tiny("deepseek_v3")
    ours = from_hf_moe(model)
    caches = ours.new_caches(12)
    with torch.no_grad():
        ours.step(torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(9)), caches)
    assert caches[0].k.shape == (2, 1, 12, 12) and caches[0].v.shape == (2, 1, 12, 4)


def test_conversion_figures_meet_the_targets():
    _tiny("qwen3_moe")
    rows = convert_moe.conversion_figures(kinds=("qwen3_moe",), n_tokens=8)
    assert [r["model"] for r in rows] == ["qwen3_moe"]
    assert rows[0]["float32"] <= 1e-5 and rows[0]["float64"] <= 1e-12 and rows[0]["greedy_equal"]


def test_deepseek_attention_scaled_otherwise_is_refused_not_silently_wrong():
    # YaRN's mscale changes transformers' scaling; the course's MLA divides by sqrt(d_q)
    model = _tiny("deepseek_v3")
    model.model.layers[0].self_attn.scaling *= 1.1
    with pytest.raises(NotImplementedError, match="only unscaled attention"):
        from_hf_moe(model)


def test_a_weight_layout_other_than_4_57s_is_refused_by_name(monkeypatch):
    model = _tiny("mixtral")
    monkeypatch.setitem(convert_moe.LAYOUT, "mixtral", "model.layers.0.mlp.experts.gate_up_proj")
    with pytest.raises(NotImplementedError, match="mlp.experts.gate_up_proj"):
        from_hf_moe(model)


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_greedy_generation_from_a_left_padded_prompt_equals_generate(kind):
    """transformers counts a left-padded prompt's rotary positions from its first real
    token; the window and the rolling cache go by slots."""
    model = _tiny(kind)
    prompt = torch.randint(0, V, (3, 9), generator=torch.Generator().manual_seed(11))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    with torch.no_grad():
        theirs = model.generate(prompt, attention_mask=mask, max_new_tokens=20,
                                do_sample=False, pad_token_id=0)  # fmt: skip
    ours = from_hf_moe(model)
    assert torch.equal(greedy_generate(ours, prompt, 20, attention_mask=mask), theirs)
    unmasked = greedy_generate(ours, prompt, 20)  # the padding read as text
    assert not torch.equal(unmasked[0], theirs[0])
