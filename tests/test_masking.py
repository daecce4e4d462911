"""The reference masks and masked softmax (notebook 02)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_ref import causal_mask, masked_softmax, padding_mask


def test_padding_mask_is_true_at_real_tokens():
    m = padding_mask(torch.tensor([3, 1, 0, 4]), 4)
    expected = torch.tensor(
        [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool
    )
    assert m.dtype == torch.bool and torch.equal(m, expected)


def test_padding_mask_accepts_lists_and_numpy():
    assert torch.equal(padding_mask([2, 1], 3), padding_mask(np.array([2, 1]), 3))


@pytest.mark.parametrize(
    ("lengths", "max_len", "error", "words"),
    [
        ([2, 5], 4, ValueError, ["max_len=4", "5"]),
        ([-1, 2], 4, ValueError, [">= 0"]),
        (torch.tensor([[1, 2]]), 4, ValueError, ["1-D", "(1, 2)"]),
        (torch.tensor([1.0, 2.0]), 4, TypeError, ["integer", "float32"]),
        ([1, 2], 2.5, TypeError, ["max_len", "int"]),
    ],
)
def test_padding_mask_rejects_bad_input(lengths, max_len, error, words):
    with pytest.raises(error) as err:
        padding_mask(lengths, max_len)
    for w in words:
        assert w in str(err.value)


def test_causal_mask_lets_each_query_see_itself_and_the_past():
    m = causal_mask(4)
    for i in range(4):
        for j in range(4):
            assert bool(m[i, j]) == (j <= i)
    assert m.dtype == torch.bool


@pytest.mark.parametrize("n", [0, -2])
def test_causal_mask_rejects_non_positive_sizes(n):
    with pytest.raises(ValueError, match=f"n must be >= 1; got {n}"):
        causal_mask(n)


def test_causal_mask_rejects_non_int():
    with pytest.raises(TypeError, match="n must be an int"):
        causal_mask(3.0)


@settings(max_examples=50, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    p=st.floats(0, 1),
    big=st.booleans(),
    data=st.data(),
)
def test_masked_softmax_properties(shape, seed, p, big, data):
    g = torch.Generator().manual_seed(seed)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * (1000 if big else 1)
    mask = torch.rand(*shape, generator=g) >= p
    w = masked_softmax(scores, mask, dim=dim)
    assert torch.isfinite(w).all()
    assert torch.all(w[~mask] == 0)
    alive = mask.any(dim=dim)
    sums = w.sum(dim=dim)
    torch.testing.assert_close(sums[alive], torch.ones_like(sums[alive]))
    assert torch.all(sums[~alive] == 0)
    # allowed positions match a plain softmax over just those positions
    if mask.all():
        torch.testing.assert_close(w, torch.softmax(scores, dim=dim))


def test_masked_softmax_gradients_are_finite_on_fully_masked_rows():
    scores = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, mask), (scores,))
    masked_softmax(scores, mask).pow(2).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.all(scores.grad[1] == 0)


def test_masked_softmax_broadcasts_a_padding_mask():
    scores = torch.randn(2, 3, 5)
    mask = padding_mask(torch.tensor([5, 2]), 5)[:, None, :]  # (2, 1, 5)
    w = masked_softmax(scores, mask)
    assert torch.all(w[1, :, 2:] == 0)


def test_masked_softmax_rejects_bad_masks():
    with pytest.raises(TypeError, match="mask must be boolean"):
        masked_softmax(torch.randn(3, 4), torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3\) does not broadcast"):
        masked_softmax(torch.randn(3, 4), torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        masked_softmax(torch.randn(3, 4), None, dim=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_masked_softmax_gives_zero_rows_in_every_dtype_where_the_fill_idioms_do_not(dtype):
    """Notebook 02's comparison: the reference needs no fill value that could overflow
    float16, and gives an all-zero row where -1e9 and additive masks give something else."""
    scores = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.3, 0.1, 2.0, 1.0]], dtype=dtype)
    allowed = torch.tensor([[True, True, False, False], [False, False, False, False]])
    w = masked_softmax(scores, allowed)
    assert w.dtype == dtype and torch.isfinite(w).all()
    assert torch.equal(w[1], torch.zeros(4, dtype=dtype))
    assert torch.equal(w[0, 2:], torch.zeros(2, dtype=dtype))
    torch.testing.assert_close(w[0].sum(), torch.tensor(1.0, dtype=dtype))
    m01 = allowed.to(dtype)
    if dtype == torch.float16:
        with pytest.raises(RuntimeError, match="overflow"):
            scores.masked_fill(~allowed, -1e9)
    else:
        additive = torch.softmax(scores + (1 - m01) * -1e9, -1)
        assert not torch.equal(additive[1], w[1])  # uniform (float32) or unmasked (float64)
