"""Efficient attention (notebook 12): the online softmax and blocked attention equal PyTorch's
softmax and fused attention, never build the full score matrix and skip future blocks;
the key-value cache decodes the same tokens as recomputation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attention_ref import (
    KVCache,
    MultiHeadAttention,
    cached_self_attention,
    naive_attention,
    online_softmax,
    online_softmax_attention,
    split_heads,
)
from attention_ref.efficient import OpRecorder, PeakMemory
from attention_ref.kv_cache import CachedDecoder, greedy_decode


def _qkv(shape_q, shape_k, d_v, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(*shape_q, generator=g, dtype=dtype)
    k = scale * torch.randn(*shape_k, generator=g, dtype=dtype)
    v = torch.randn(*shape_k[:-1], d_v, generator=g, dtype=dtype)
    return q, k, v


# ----------------------------------------------------------------------------- online softmax
@pytest.mark.parametrize("n,block", [(1, 1), (10, 3), (12, 4), (7, 10), (50, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_online_softmax_equals_torch_softmax(n, block, dtype):
    x = 5 * torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=dtype)
    torch.testing.assert_close(online_softmax(x, block), torch.softmax(x, 0))


def test_online_softmax_is_stable_for_huge_and_tiny_logits():
    for x in (torch.tensor([1000.0, 1001.0, 999.0, 1002.0, 0.0]), torch.full((6,), -1000.0)):
        got = online_softmax(x, 2)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, torch.softmax(x, 0))


def test_online_softmax_rejects_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        online_softmax(torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(torch.zeros(3), 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        online_softmax([1.0, 2.0], 1)


# ----------------------------------------------------------------------------- online attention
CASES = [
    ((2, 3, 40, 8), (2, 3, 40, 8), 8, 16),  # n not a multiple of the block size
    ((1, 64, 16), (1, 64, 16), 16, 64),  # one block
    ((2, 33, 4), (2, 33, 4), 6, 1),  # block_size 1, d_v != d_k
    ((3, 100, 8), (3, 100, 8), 8, 32),
    ((7, 4), (7, 4), 4, 3),  # no batch dimension
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,d_v,block", CASES)
def test_online_attention_equals_pytorch_sdpa(sq, sk, d_v, block, causal):
    q, k, v = _qkv(sq, sk, d_v)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = online_softmax_attention(q, k, v, block_size=block, causal=causal)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", [5, 16, 64])
def test_online_attention_with_fewer_queries_than_keys(block):
    q, k, v = _qkv((2, 9, 8), (2, 45, 8), 5)
    torch.testing.assert_close(
        online_softmax_attention(q, k, v, block), F.scaled_dot_product_attention(q, k, v)
    )
    # causal: the queries are the last 9 of the 45 positions (bottom-right alignment).
    mask = torch.ones(9, 45, dtype=torch.bool).tril(45 - 9)
    torch.testing.assert_close(
        online_softmax_attention(q, k, v, block, causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


def test_online_attention_float32_large_logits_and_query_blocks():
    q, k, v = _qkv((2, 4, 130, 16), (2, 4, 130, 16), 16, dtype=torch.float32, scale=4.0)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).float()
    for qbs in (None, 17, 64):
        got = online_softmax_attention(q, k, v, 32, q_block_size=qbs)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)


def test_naive_attention_equals_pytorch_sdpa():
    q, k, v = _qkv((2, 2, 20, 8), (2, 2, 20, 8), 8)
    for causal in (False, True):
        torch.testing.assert_close(
            naive_attention(q, k, v, causal=causal),
            F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        )


def test_online_attention_never_materialises_the_score_matrix():
    n = 512
    q, k, v = _qkv((1, n, 16), (1, n, 16), 16, dtype=torch.float32)
    for causal in (False, True):
        with OpRecorder() as rec:
            online_softmax_attention(q, k, v, block_size=64, causal=causal)
        numel, shape, _ = rec.largest()
        assert numel <= n * 64, f"a tensor of shape {shape} was built"
    with OpRecorder() as rec:
        naive_attention(q, k, v)
    assert rec.largest()[0] == n * n  # the recorder does see a full score matrix


def test_queries_are_tiled_by_default():
    """The fast configuration is the default: tiles of DEFAULT_Q_BLOCK_SIZE queries."""
    from attention_ref.efficient import DEFAULT_Q_BLOCK_SIZE

    n, block = 1024, 128
    q, k, v = _qkv((1, n, 8), (1, n, 8), 8, dtype=torch.float32)
    with OpRecorder() as rec:
        got = online_softmax_attention(q, k, v, block_size=block)
    assert DEFAULT_Q_BLOCK_SIZE == 256
    assert rec.largest()[0] == DEFAULT_Q_BLOCK_SIZE * block  # one (256, 128) tile of scores
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v))


def test_causal_skips_future_blocks():
    n, block = 512, 64
    q, k, v = _qkv((1, n, 16), (1, n, 16), 16, dtype=torch.float32)
    flops = {}
    for causal in (False, True):
        with OpRecorder() as rec:
            online_softmax_attention(q, k, v, block_size=block, q_block_size=block, causal=causal)
        flops[causal] = sum(op.flops for op in rec.ops)
    blocks = n // block
    assert flops[False] == 2 * 2 * n * n * 16  # q k^T and p v, every tile
    assert flops[True] == flops[False] * (blocks * (blocks + 1) // 2) // blocks**2


def test_peak_memory_of_online_is_a_fraction_of_naive():
    q, k, v = _qkv((1, 2, 512, 16), (1, 2, 512, 16), 16, dtype=torch.float32)
    with PeakMemory() as naive:
        naive_attention(q, k, v)
    with PeakMemory() as online:
        online_softmax_attention(q, k, v, 64, q_block_size=64)
    assert naive.peak >= 2 * 2 * 512 * 512 * 4  # scores and weights
    assert online.peak < naive.peak / 10


def test_online_attention_rejects_bad_input():
    q, k, v = _qkv((2, 5, 4), (2, 6, 4), 4)
    with pytest.raises(ValueError, match="block_size"):
        online_softmax_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match="d_k"):
        online_softmax_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="n_k"):
        online_softmax_attention(q, k, v[:, :5])
    with pytest.raises(TypeError, match="dtype"):
        online_softmax_attention(q, k.float(), v)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        online_softmax_attention(q.numpy(), k, v)


# ----------------------------------------------------------------------------- KV cache
def test_cached_self_attention_equals_full_causal_attention_for_any_chunking():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    with torch.no_grad():
        full, _ = mha(x, x, x, mask)
        for chunks in ([1] * 9, [4, 1, 3, 1], [9]):
            cache, outs, s = KVCache(9), [], 0
            for t in chunks:
                outs.append(cached_self_attention(mha, x[:, s : s + t], cache))
                s += t
                assert len(cache) == s
            torch.testing.assert_close(torch.cat(outs, dim=1), full)


def test_kv_cache_appends_and_rejects_overflow_and_mismatch():
    cache = KVCache(3)
    k_all, v_all = cache.append(torch.zeros(1, 2, 2, 4), torch.ones(1, 2, 2, 5))
    assert k_all.shape == (1, 2, 2, 4) and v_all.shape == (1, 2, 2, 5) and len(cache) == 2
    with pytest.raises(ValueError, match="exceed"):
        cache.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 5))
    with pytest.raises(ValueError, match="do not match"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 5))
    with pytest.raises(ValueError, match="max_len"):
        KVCache(0)
    with pytest.raises(ValueError, match="batch, heads, t, d"):
        KVCache(2).append(torch.zeros(2, 4), torch.zeros(2, 4))


def test_cached_greedy_decoding_gives_the_same_tokens_as_recomputation():
    torch.manual_seed(0)
    model = CachedDecoder(vocab_size=30, d_model=32, n_heads=4, d_ff=64, max_len=64).eval()
    memory = torch.randn(3, 7, 32)
    cached = greedy_decode(model, memory, 40)
    recomputed = greedy_decode(model, memory, 40, use_cache=False)
    assert cached.shape == (3, 41)
    assert torch.equal(cached, recomputed)
    # the logits of every step agree too, not just their argmax
    with torch.no_grad():
        full = model(cached[:, :-1], memory)
        caches, kv = [KVCache(41) for _ in model.layers], model.memory_kv(memory)
        steps = torch.cat([model.step(cached[:, i : i + 1], caches, kv) for i in range(40)], 1)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


def test_greedy_decode_rejects_bad_input():
    model = CachedDecoder(vocab_size=10, d_model=8, n_heads=2, d_ff=16, max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, torch.zeros(1, 3, 8), 8)
    with pytest.raises(ValueError, match="memory must be"):
        greedy_decode(model, torch.zeros(3, 8), 2)
    with pytest.raises(ValueError, match="n_tokens"):
        greedy_decode(model, torch.zeros(1, 3, 8), -1)
    with pytest.raises(ValueError, match="x_new must be"):
        cached_self_attention(model.layers[0].self_attn, torch.zeros(1, 2, 5), KVCache(2))


def test_math_of_the_merge_rule():
    """Merging two partial (max, sum) pairs equals the sum over the union."""
    a, b = torch.randn(5, dtype=torch.float64), torch.randn(7, dtype=torch.float64) + 3
    m_a, m_b = a.max(), b.max()
    l_a, l_b = torch.exp(a - m_a).sum(), torch.exp(b - m_b).sum()
    m = torch.maximum(m_a, m_b)
    merged = l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)
    assert math.isclose(float(merged * torch.exp(m)), float(torch.exp(torch.cat([a, b])).sum()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_layer_step_equals_the_notebook_07_decoder_layer(norm_first):
    from attention_ref import DecoderLayer
    from attention_ref.kv_cache import CachedDecoderLayer

    torch.manual_seed(0)
    layer = DecoderLayer(16, 4, 32, norm_first=norm_first).double().eval()
    cached = CachedDecoderLayer.from_layer(layer)
    y, memory = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 5, 16).double()
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.no_grad():
        full = layer(y, memory, mask)[0]
        cache, kv = (
            KVCache(6),
            (
                split_heads(layer.cross_attn.w_k(memory), 4),
                split_heads(layer.cross_attn.w_v(memory), 4),
            ),
        )
        steps = torch.cat([cached.step(y[:, i : i + 1], cache, kv) for i in range(6)], dim=1)
    torch.testing.assert_close(steps, full)


# ----------------------------------------------------------------------------- FlashAttention
FLASH_CASES = [
    # q shape, k shape, d_v, block_size, causal, q_block_size
    ((2, 3, 40, 8), (2, 3, 40, 8), 8, 16, False, None),  # n not a multiple of the block
    ((2, 3, 40, 8), (2, 3, 40, 8), 8, 16, True, None),
    ((1, 5, 8), (1, 23, 8), 6, 8, False, None),  # n_q < n_k, d_k != d_v
    ((1, 5, 8), (1, 23, 8), 6, 8, True, 2),  # the queries are the last 5 positions
    ((30, 4), (30, 4), 4, 7, True, None),  # no batch dimension
    ((1, 1, 4), (1, 1, 4), 3, 4, True, None),  # one token
    ((2, 1, 12, 8), (1, 3, 12, 8), 8, 5, False, 3),  # broadcast batch dimensions
    ((2, 70, 8), (2, 45, 8), 5, 16, False, 32),
]


@pytest.mark.parametrize("sq,sk,d_v,block,causal,qbs", FLASH_CASES)
def test_flash_attention_gradients_equal_autograd_through_naive_attention(
    sq, sk, d_v, block, causal, qbs
):
    from attention_ref import flash_attention

    q, k, v = (t.requires_grad_() for t in _qkv(sq, sk, d_v))
    out = flash_attention(q, k, v, block, causal, q_block_size=qbs)
    expected = naive_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = torch.autograd.grad(expected, (q, k, v), grad_out)
    for g, w, x in zip(got, want, (q, k, v), strict=True):
        assert g.shape == x.shape
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_flash_attention_passes_gradcheck_and_gives_zeros_where_a_query_sees_nothing():
    from attention_ref import flash_attention

    q, k, v = (t.requires_grad_() for t in _qkv((2, 7, 4), (2, 7, 4), 3))
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attention(q, k, v, 3, True), (q, k, v))
    # causal with n_q > n_k: the first 4 of 9 queries see no key (j <= i + (n_k - n_q))
    q, k, v = (t.requires_grad_() for t in _qkv((2, 9, 4), (2, 5, 4), 3))
    out = flash_attention(q, k, v, 2, causal=True)
    out.sum().backward()
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))
    assert torch.equal(q.grad[:, :4], torch.zeros_like(q.grad[:, :4]))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    mask = torch.ones(9, 5, dtype=torch.bool).tril(5 - 9)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out[:, 4:], expected[:, 4:])


def test_flash_attention_keeps_no_score_matrix_for_the_backward_pass():
    from attention_ref import flash_attention

    n, block = 512, 64
    q, k, v = (t.requires_grad_() for t in _qkv((2, n, 16), (2, n, 16), 16, torch.float32))
    full = 2 * n * n * 4  # bytes of the batch's float32 score matrices
    kept = {}
    for name, attention in [("naive", naive_attention), ("flash", flash_attention)]:
        with OpRecorder() as rec_f, PeakMemory() as mem:
            out = attention(q, k, v)
            kept[name] = mem.current - out.untyped_storage().nbytes()
        with OpRecorder() as rec_b:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        largest = max(rec_f.largest()[0], rec_b.largest()[0])
        if name == "flash":
            assert largest <= 2 * 256 * block  # a (2, 256, 64) tile at most
    assert kept["naive"] >= full  # autograd keeps the weights (and more)
    assert kept["flash"] <= 2 * n * 4 + 1024  # the log-sum-exp, one float per query


def test_flash_backward_skips_the_future_tiles():
    from attention_ref import flash_attention

    n, block = 256, 32
    q, k, v = (t.requires_grad_() for t in _qkv((1, n, 8), (1, n, 8), 8, torch.float32))
    flops = {}
    for causal in (False, True):
        out = flash_attention(q, k, v, block, causal, q_block_size=block)
        with OpRecorder() as rec:
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        flops[causal] = sum(op.flops for op in rec.ops)
    blocks = n // block
    assert flops[False] == 5 * 2 * n * n * 8  # five matrix products per tile, every tile
    assert flops[True] == flops[False] * (blocks * (blocks + 1) // 2) // blocks**2


def test_flash_attention_rejects_bad_input():
    from attention_ref import flash_attention

    q, k, v = _qkv((2, 5, 4), (2, 6, 4), 4)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match="n_k"):
        flash_attention(q, k, v[:, :5])
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(q, k.float(), v)


def test_a_training_step_with_flash_attention_equals_one_with_pytorch_attention():
    from attention_ref import flash_attention
    from attention_ref.flash import TinyAttentionLM

    ids = torch.randint(0, 20, (3, 17), generator=torch.Generator().manual_seed(0))
    results = []
    for attention in (
        lambda q, k, v: flash_attention(q, k, v, 4, causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    ):
        torch.manual_seed(0)
        lm = TinyAttentionLM(20, 16, 2, 16, attention).double()
        loss = F.cross_entropy(lm(ids[:, :-1]).reshape(-1, 20), ids[:, 1:].reshape(-1))
        loss.backward()
        results.append([loss.detach()] + [p.grad for p in lm.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_check_rejects_the_reference_and_stops_a_looping_backward():
    from attention_ref import FlashAttention
    from attention_ref.checks import check

    from catalog.nb12 import _flash_forward

    with pytest.raises(AssertionError, match="calls the reference attention_ref.FlashAttention"):
        check("flash_attention", FlashAttention)

    class LoopingBackward(torch.autograd.Function):
        forward = staticmethod(_flash_forward)

        @staticmethod
        def backward(ctx, grad_out):
            while True:
                pass

    with pytest.raises(AssertionError, match="your LoopingBackward.backward did not return"):
        check("flash_attention", LoopingBackward, time_limit=0.5)
