"""The reference attention (notebook 01) against PyTorch, by properties, and by gradcheck."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_ref import causal_mask, sdpa, sdpa_np, softmax_np

BATCH_SHAPES = [(), (1,), (3,), (2, 4)]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def qkv(batch, n_q, n_k, d_k, d_v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*batch, n_q, d_k, generator=g, dtype=dtype),
        torch.randn(*batch, n_k, d_k, generator=g, dtype=dtype),
        torch.randn(*batch, n_k, d_v, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_sdpa_matches_torch_without_mask(dtype, batch):
    q, k, v = qkv(batch, 5, 7, 8, 3, dtype)
    out, weights = sdpa(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    assert weights.shape == (*batch, 5, 7)
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_sdpa_matches_torch_with_boolean_mask(dtype, batch):
    q, k, v = qkv(batch, 6, 6, 4, 5, dtype, seed=1)
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(*batch, 6, 6, generator=g) < 0.7
    mask[..., 0] = True  # PyTorch returns NaN for rows with nothing to attend to
    out, _ = sdpa(q, k, v, mask)
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_causal_mask_matches_is_causal(dtype):
    q, k, v = qkv((2,), 9, 9, 16, 16, dtype, seed=3)
    out, weights = sdpa(q, k, v, causal_mask(9))
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL[dtype]
    )
    assert torch.all(weights.triu(1) == 0)


def test_sdpa_np_matches_torch_version():
    q, k, v = qkv((2, 3), 4, 6, 5, 2, torch.float64, seed=4)
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) < 0.5
    out_t, w_t = sdpa(q, k, v, mask)
    out_n, w_n = sdpa_np(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    np.testing.assert_allclose(out_n, out_t.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_n, w_t.numpy(), rtol=1e-12, atol=1e-12)


def test_fully_masked_row_gives_zero_weights_and_zero_output_not_nan():
    q, k, v = qkv((1,), 3, 4, 4, 2, torch.float32, seed=6)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out, weights = sdpa(q, k, v, mask)
    assert torch.all(weights[:, 1] == 0) and torch.all(out[:, 1] == 0)
    assert torch.isfinite(out).all()
    out_n, w_n = sdpa_np(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    assert np.all(w_n[:, 1] == 0) and np.all(out_n[:, 1] == 0)


def test_pytorch_behaviour_on_fully_masked_rows_that_notebook_02_describes():
    """Notebook 02 tells learners what PyTorch 2.13 does; this fails if that changes."""
    q, k, v = qkv((1,), 3, 3, 4, 4, torch.float32, seed=7)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    # the fused kernel returns zeros for a query with nothing to attend to ...
    assert torch.all(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[:, 1] == 0)
    # ... while nn.MultiheadAttention with every key padded returns NaN.
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    out, _ = mha(q, q, q, key_padding_mask=torch.ones(1, 3, dtype=torch.bool))
    assert torch.isnan(out).all()


def test_softmax_np_is_stable_for_large_logits():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    p = softmax_np(x)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[0], p[1][::-1], rtol=1e-12)
    np.testing.assert_allclose(p.sum(-1), 1.0)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    scale=st.sampled_from([1.0, 30.0, 800.0]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_softmax_np_rows_are_distributions(shape, scale, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = scale * np.random.default_rng(seed).normal(size=shape)
    p = softmax_np(x, axis=axis)
    assert p.shape == x.shape
    assert np.all(p >= 0) and np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=axis), 1.0, rtol=1e-12)
    # softmax is invariant to adding a constant along the axis
    np.testing.assert_allclose(softmax_np(x + 7.0, axis=axis), p, rtol=1e-9, atol=1e-300)


@settings(max_examples=40, deadline=None)
@given(
    n_q=st.integers(1, 6),
    n_k=st.integers(1, 6),
    d_k=st.integers(1, 8),
    d_v=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    p_mask=st.floats(0.0, 1.0),
)
def test_sdpa_properties(n_q, n_k, d_k, d_v, seed, p_mask):
    q, k, v = qkv((2,), n_q, n_k, d_k, d_v, torch.float64, seed=seed)
    mask = torch.rand(2, n_q, n_k, generator=torch.Generator().manual_seed(seed)) >= p_mask
    out, w = sdpa(q, k, v, mask)
    assert torch.all(w[~mask] == 0)
    alive = mask.any(-1)
    torch.testing.assert_close(w.sum(-1)[alive], torch.ones_like(w.sum(-1)[alive]))
    assert torch.all(out[~alive] == 0)
    # permuting the keys and values together (and the mask) leaves the output unchanged
    perm = torch.randperm(n_k, generator=torch.Generator().manual_seed(seed + 1))
    out_p, w_p = sdpa(q, k[:, perm], v[:, perm], mask[..., perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(w_p, w[..., perm])


def test_sdpa_scales_by_sqrt_dk():
    q = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    k = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    v = torch.eye(2)
    _, w = sdpa(q, k, v)
    # scores are 4/sqrt(4) = 2 and 0
    torch.testing.assert_close(w[0, 0], torch.tensor(math.exp(2) / (math.exp(2) + 1)))


def test_sdpa_gradcheck_float64_with_fully_masked_row():
    q, k, v = (t.requires_grad_() for t in qkv((2,), 3, 4, 3, 2, torch.float64, seed=8))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 1:] = False
    mask[2] = False  # a fully masked row must still have finite gradients
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa(a, b, c, mask)[0], (q, k, v))
    out, _ = sdpa(q, k, v, mask)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_sdpa_follows_input_dtype_and_keeps_float64():
    q, k, v = qkv((), 2, 3, 4, 5, torch.float64)
    out, w = sdpa(q, k, v)
    assert out.dtype == w.dtype == torch.float64


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (
            (torch.randn(3, 4), torch.randn(5, 6), torch.randn(5, 2)),
            ValueError,
            ["d_k", "(3, 4)", "(5, 6)"],
        ),
        (
            (torch.randn(3, 4), torch.randn(5, 4), torch.randn(6, 2)),
            ValueError,
            ["n_k", "(5, 4)", "(6, 2)"],
        ),
        (
            (torch.randn(4), torch.randn(5, 4), torch.randn(5, 2)),
            ValueError,
            ["q", "at least 2", "(4,)"],
        ),
        (
            (torch.randn(2, 3, 4), torch.randn(3, 5, 4), torch.randn(3, 5, 2)),
            ValueError,
            ["broadcast", "(2, 3, 4)", "(3, 5, 4)"],
        ),
        (
            (np.zeros((3, 4)), torch.randn(5, 4), torch.randn(5, 2)),
            TypeError,
            ["q", "torch.Tensor", "ndarray"],
        ),
        (
            (torch.randn(3, 4), torch.randn(5, 4).double(), torch.randn(5, 2)),
            TypeError,
            ["dtype", "float64"],
        ),
        (
            (torch.ones(3, 4, dtype=torch.long), torch.randn(5, 4), torch.randn(5, 2)),
            TypeError,
            ["q", "floating"],
        ),
    ],
)
def test_sdpa_rejects_bad_shapes_and_types_with_a_clear_message(args, error, words):
    with pytest.raises(error) as err:
        sdpa(*args)
    for w in words:
        assert w in str(err.value), f"{w!r} not in {err.value}"


def test_sdpa_rejects_a_mask_that_does_not_broadcast():
    q, k, v = qkv((2,), 3, 5, 4, 2, torch.float32)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\).*\(2, 3, 5\)"):
        sdpa(q, k, v, torch.ones(3, 4, dtype=torch.bool))


def test_sdpa_rejects_a_float_mask():
    q, k, v = qkv((), 3, 5, 4, 2, torch.float32)
    with pytest.raises(TypeError, match="mask must be boolean"):
        sdpa(q, k, v, torch.zeros(3, 5))


def test_sdpa_np_rejects_a_mask_that_does_not_broadcast():
    Q, K, V = np.zeros((3, 4)), np.zeros((5, 4)), np.zeros((5, 2))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\)"):
        sdpa_np(Q, K, V, np.ones((5, 3), dtype=bool))
    with pytest.raises(TypeError, match="boolean"):
        sdpa_np(Q, K, V, np.ones((3, 5)))


def test_softmax_np_rejects_a_bad_axis_and_non_numbers():
    with pytest.raises(ValueError, match=r"axis 2 is out of range for x of shape \(3, 4\)"):
        softmax_np(np.zeros((3, 4)), axis=2)
    with pytest.raises(TypeError, match="x must be an array of numbers"):
        softmax_np(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="torch"):
        softmax_np(torch.zeros(3))
