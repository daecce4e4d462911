"""The GPT of notebook 11: shapes, causality, the KV cache, grouped-query attention, the
sampler's exact semantics, and a short training run."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_ref import MultiHeadAttention
from attention_ref.apps.language_model import (
    batch_loss,
    cross_entropy,
    encode_sentences,
    fit,
    make_gpt,
    per_token_standard_error,
    sample_quality,
    sample_sentences,
    sentence_nll,
    time_generation,
)
from attention_ref.checks.nb11 import next_token_distribution
from attention_ref.data.grammar import make_grammar_data
from attention_ref.data.vocab import BOS_ID, PAD_ID
from attention_ref.gpt import (
    GPT,
    GPTBlock,
    GroupedQueryAttention,
    kv_cache_bytes_per_token,
    with_blocks_of,
)
from attention_ref.sampling import generate, sample_next_token


def small(n_kv_heads=None, seed=0) -> GPT:
    torch.manual_seed(seed)
    return GPT(
        50, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=20, n_kv_heads=n_kv_heads
    ).eval()


def test_shapes_and_tied_output_layer():
    model = small()
    ids = torch.randint(0, 50, (3, 7))
    logits, weights = model(ids, return_weights=True)
    assert logits.shape == (3, 7, 50)
    assert len(weights) == 2 and weights[0].shape == (3, 4, 7, 7)
    names = [n for n, _ in model.named_parameters()]
    assert not any("out" in n or "lm_head" in n for n in names)  # tied: no separate output
    std = GPT(50, d_model=64).tok.weight.std().item()
    assert abs(std - 64**-0.5) < 0.02


@pytest.mark.parametrize("n_kv", [None, 2, 1])
def test_future_tokens_do_not_change_earlier_logits(n_kv):
    model = small(n_kv)
    ids = torch.randint(0, 50, (2, 9))
    other = ids.clone()
    other[:, 5:] = torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        a, b = model(ids), model(other)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("n_kv", [None, 2, 1])
def test_kv_cache_gives_the_same_logits_and_tokens(n_kv):
    model = small(n_kv)
    prompt = torch.randint(0, 50, (2, 3))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = generate(model, prompt, 12, generator=g1, use_cache=True)
    b = generate(model, prompt, 12, generator=g2, use_cache=False)
    assert torch.equal(a, b)
    greedy_a = generate(model, prompt, 12, temperature=0, use_cache=True)
    greedy_b = generate(model, prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(greedy_a, greedy_b)


def test_with_blocks_of_builds_the_same_model_of_the_learners_blocks_without_a_cache():
    """Graded, notebook 11's GPT is built of the learner's GPTBlock, which has no cached
    step: the same logits, and generation recomputes the prefix (the same tokens)."""

    class Mine(GPTBlock):
        step = None  # the learner's block: forward only

    model = small()
    prompt = torch.randint(0, 50, (2, 3))
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        before = model(ids)
    cached = generate(model, prompt, 8, temperature=0)
    assert model.can_cache
    assert with_blocks_of(model, Mine) is model
    assert all(type(b) is Mine for b in model.blocks) and not model.can_cache
    with torch.no_grad():
        torch.testing.assert_close(model(ids), before)
    assert torch.equal(generate(model, prompt, 8, temperature=0), cached)  # use_cache=None
    with pytest.raises(TypeError, match="no cached step.*use_cache=False"):
        generate(model, prompt, 8, use_cache=True)
    with pytest.raises(TypeError, match="must be a GPT"):
        with_blocks_of(nn.Linear(2, 2), Mine)
    with pytest.raises(ValueError, match="before to_gqa"):
        with_blocks_of(small().to_gqa(2), Mine)


def test_gqa_equals_mha_when_the_counts_match():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).double()
    gqa = GroupedQueryAttention.from_mha(mha, 4)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    o1, w1 = mha(x, x, x, mask)
    o2, w2 = gqa(x, x, x, mask)
    assert torch.allclose(o1, o2) and torch.allclose(w1, w2)


def test_gqa_conversion_averages_key_value_heads():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    gqa = GroupedQueryAttention.from_mha(mha, 2)
    assert gqa.w_k.weight.shape == (8, 16)
    w = mha.w_k.weight.view(4, 4, 16)  # (heads, d_head, D)
    assert torch.allclose(gqa.w_k.weight.view(2, 4, 16)[0], (w[0] + w[1]) / 2)
    mqa = GroupedQueryAttention.from_mha(mha, 1)
    assert torch.allclose(mqa.w_v.weight, mha.w_v.weight.view(4, 4, 16).mean(0))
    with pytest.raises(ValueError):
        GroupedQueryAttention(16, 4, 3)


def test_cache_bytes_per_token():
    assert kv_cache_bytes_per_token(2, 4, 16) == 2 * 2 * 4 * 16 * 4
    assert kv_cache_bytes_per_token(2, 1, 16) * 4 == kv_cache_bytes_per_token(2, 4, 16)


def test_sampler_greedy_ties_and_shapes():
    logits = torch.tensor([[1.0, 3.0, 3.0], [0.0, -1.0, 0.0]])
    assert sample_next_token(logits, 0.0).tolist() == [1, 0]
    out = sample_next_token(torch.randn(2, 3, 7), 1.0, 3, 0.9, torch.Generator().manual_seed(0))
    assert out.shape == (2, 3) and out.dtype == torch.long


def test_sampler_top_p_keeps_the_crossing_token_and_ties():
    logits = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04], dtype=torch.float64))
    dist = next_token_distribution(logits, 1.0, None, 0.6)
    assert (dist > 0).tolist() == [True, True, False, False, False, False]
    tied = torch.log(torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1], dtype=torch.float64))
    assert (next_token_distribution(tied, 1.0, None, 0.45) > 0).sum() == 4
    kt = torch.tensor([2.0, 1.0, 1.0, 0.0])
    assert (next_token_distribution(kt, 1.0, 2, None) > 0).sum() == 3
    draws = sample_next_token(
        logits.expand(20000, 6), 1.0, None, 0.6, torch.Generator().manual_seed(1)
    )
    freq = torch.bincount(draws, minlength=6).double() / 20000
    assert abs(freq[0] - 0.4 / 0.65) < 0.02 and freq[2:].sum() == 0


def test_sampler_temperature():
    logits = torch.tensor([0.0, 1.0])
    g = torch.Generator().manual_seed(0)
    draws = sample_next_token(logits.expand(20000, 2), 2.0, generator=g)
    p1 = 1 / (1 + math.exp(-0.5))
    assert abs(draws.double().mean().item() - p1) < 0.02


def test_a_short_training_run_lowers_the_loss_and_samples_are_scored():
    data = make_grammar_data(400, 50, 100, seed=0)
    torch.manual_seed(0)
    model = make_gpt(len(data.vocab), d_model=32, n_heads=2, n_layers=1, d_ff=64)
    before = cross_entropy(model, data.test, data.vocab)
    hist = fit(model, data, steps=40, batch_size=32, progress=False)
    after = cross_entropy(model, data.test, data.vocab)
    assert hist.steps == 40 and after < before - 1.0
    quality = sample_quality(sample_sentences(model, data.vocab, 20), data)
    assert set(quality) == {"grammatical", "novel", "distinct_2", "distinct_3"}


def test_encoding_pads_and_shifts_each_sentence():
    data = make_grammar_data(50, 10, 20, seed=3)
    rows = [s.words for s in data.test]
    inputs, targets, mask = encode_sentences(rows, data.vocab)
    assert inputs.shape == targets.shape == (20, max(map(len, rows)))
    for i, words in enumerate(rows):
        ids = [data.vocab.stoi[w] for w in words]
        n = len(ids)
        assert targets[i, :n].tolist() == ids and inputs[i, :n].tolist() == [BOS_ID, *ids[:-1]]
        assert (targets[i, n:] == PAD_ID).all() and (inputs[i, n:] == PAD_ID).all()
        assert mask[i].tolist() == [j < n for j in range(mask.shape[1])]


@pytest.mark.parametrize("parts", [2, 3, 7, 40])
def test_batch_loss_in_length_sorted_parts_is_the_whole_batch_loss(parts):
    """fit computes each batch in groups of similar length: same loss, same gradient."""
    data = make_grammar_data(200, 10, 10, seed=2)
    torch.manual_seed(0)
    model = make_gpt(len(data.vocab), d_model=16, n_heads=2, n_layers=1, d_ff=32).double()
    inputs, targets, mask = encode_sentences(data.train[:30], data.vocab)
    whole = batch_loss(model, inputs, targets, mask)
    (g_whole,) = torch.autograd.grad(whole, model.tok.weight)
    split = batch_loss(model, inputs, targets, mask, parts)
    (g_split,) = torch.autograd.grad(split, model.tok.weight)
    assert torch.allclose(whole, split, rtol=1e-12) and torch.allclose(g_whole, g_split)


def test_sentence_nll_sums_to_the_cross_entropy_and_its_standard_error():
    data = make_grammar_data(100, 20, 60, seed=1)
    torch.manual_seed(0)
    model = make_gpt(len(data.vocab), d_model=16, n_heads=2, n_layers=1, d_ff=32)
    nll = sentence_nll(model, data.test, data.vocab, batch_size=7)  # several batches
    lengths = torch.tensor([len(s.words) for s in data.test], dtype=torch.float64)
    assert nll.shape == (60,) and nll.dtype == torch.float64
    assert math.isclose(
        nll.sum() / lengths.sum(), cross_entropy(model, data.test, data.vocab), rel_tol=1e-5
    )
    # the delta method for a ratio of sums, against a direct computation
    se = per_token_standard_error(nll, lengths)
    r = nll.sum() / lengths.sum()
    direct = math.sqrt(((nll - r * lengths) ** 2).sum() / (60 * 59)) / lengths.mean()
    assert math.isclose(se, float(direct), rel_tol=1e-9)
    # equal per-token values in every sentence: no spread, no error
    assert per_token_standard_error(2 * lengths, lengths) == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        per_token_standard_error(nll[:1], lengths[:1])


def test_time_generation_returns_the_greedy_tokens():
    model = small()
    prompt = torch.zeros(2, 1, dtype=torch.long)
    seconds, out = time_generation(model, prompt, 5, use_cache=True)
    assert seconds > 0 and out.shape == (2, 6)
    assert torch.equal(out, generate(model, prompt, 5, temperature=0))


def test_notebook_11_imports_the_moved_names_from_attention_ref_gpt():
    """Notebook 11 imports the measurements and the training from attention_ref.gpt."""
    import attention_ref.gpt as gpt
    from attention_ref.apps import language_model

    assert gpt.fit is language_model.fit and gpt.sample_next_token is sample_next_token
    with pytest.raises(AttributeError):
        _ = gpt.no_such_name
