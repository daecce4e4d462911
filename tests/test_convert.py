"""The converter of notebook 13: Hugging Face GPT-2 and Llama-family models, built from
small configurations with random weights (no download), loaded into the course's modules
give the same logits and the same greedy tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from logit_batches import V  # noqa: E402
from logit_batches import batches as _batches  # noqa: E402

from attention_ref import convert  # noqa: E402
from attention_ref.convert import (  # noqa: E402
    float64_internals,
    from_hf,
    from_llama,
    max_logit_difference,
    rotate_half_permutation,
    tiny_hf_model,
)
from attention_ref.positional import frequencies, rope  # noqa: E402
from attention_ref.sampling import generate  # noqa: E402

from catalog.nb13 import RMSRsqrt, RMSVectorNormEpsBuffer, SwiGLUEinsum  # noqa: E402


def _worst(ours, theirs, g) -> float:
    return max(max_logit_difference(ours, theirs, ids, mask) for ids, mask in _batches(g))


@pytest.fixture(scope="module", params=convert.TINY_KINDS)
def hf(request):
    return request.param, tiny_hf_model(request.param, seed=1, vocab_size=V)


def test_float32_logits_equal(hf):
    kind, model = hf
    ours = from_hf(model)
    assert _worst(ours, model, torch.Generator().manual_seed(2)) <= 1e-5


def test_float64_logits_equal(hf):
    kind, model = hf
    model = tiny_hf_model(kind, seed=1, vocab_size=V).double()
    if kind != "gpt2":
        float64_internals(model)
    ours = from_hf(model)
    assert next(ours.parameters()).dtype == torch.float64
    assert _worst(ours, model, torch.Generator().manual_seed(3)) <= 1e-10


def test_greedy_generation_with_the_cache_equals_generate(hf):
    kind, model = hf
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=32,
            do_sample=False,
            pad_token_id=0,
        )
        ours = generate(from_hf(model), prompt, 32, temperature=0)
    assert theirs.shape == (2, 37)
    assert torch.equal(ours, theirs)


def test_float64_llama_differs_by_float32_rounding_without_the_patch():
    """transformers' Llama computes the norm and the rotary angles in float32 even in
    float64: the difference is at float32 precision, not float64."""
    model = tiny_hf_model("llama", seed=1, vocab_size=V).double()
    diff = _worst(from_hf(model), model, torch.Generator().manual_seed(5))
    assert 1e-10 < diff < 1e-5


def test_without_the_permutation_the_logits_differ(monkeypatch):
    model = tiny_hf_model("llama", seed=1, vocab_size=V)
    monkeypatch.setattr(convert, "rotate_half_permutation", lambda d: torch.arange(d))
    assert _worst(from_hf(model), model, torch.Generator().manual_seed(6)) > 1e-3


def test_the_permutation_turns_rotate_half_into_adjacent_pairs():
    d, T = 8, 5
    x = torch.randn(2, T, d, dtype=torch.float64)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * frequencies(d)  # (T, d/2)
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., : d // 2], x[..., d // 2 :]
    halves = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)  # feature i with i + d/2
    perm = rotate_half_permutation(d)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    torch.testing.assert_close(rope(x[..., perm]), halves[..., perm])


@pytest.mark.parametrize("norm", [RMSRsqrt, RMSVectorNormEpsBuffer])
def test_the_learners_parts_run_the_architecture(norm):
    """Any RMSNorm the check accepts, one that keeps eps as a buffer included."""
    model = tiny_hf_model("qwen2", seed=1, vocab_size=V)
    ours = from_llama(model, norm=norm, ff=SwiGLUEinsum)
    assert isinstance(ours.blocks[0].norm1, norm)
    assert _worst(ours, model, torch.Generator().manual_seed(7)) <= 1e-5


def test_unknown_architectures_are_refused():
    class Config:
        model_type = "bert"

    class Model(torch.nn.Module):
        config = Config()

    with pytest.raises(NotImplementedError, match="bert"):
        from_hf(Model())


def test_llama_with_wider_heads_and_every_bias():
    """head_dim larger than hidden_size / heads, biases on all four projections and on the
    feed-forward network: every optional path of the converter."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
        mlp_bias=True, max_position_embeddings=64, rope_theta=500.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    ours = from_hf(model)
    assert ours.blocks[0].attn.d_head == 16 and ours.blocks[0].attn.w_o.bias is not None
    assert ours.blocks[0].ff.w_up.bias is not None
    assert _worst(ours, model, torch.Generator().manual_seed(8)) <= 1e-5
