"""Notebook 14's reference backward kernels (attention_ref.triton_attention_backward) against
float64 autograd through plain attention, and the autograd function that uses them."""

import math

import pytest
import torch

# the module chooses Triton's interpreter (no GPU) before it imports triton
ta = pytest.importorskip("attention_ref.triton_attention")


def _exact_grads(q, k, v, do, causal):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].mT / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q), -math.inf)
    w = torch.nan_to_num(torch.softmax(s, -1))  # a query that sees no key: weights 0
    return torch.autograd.grad(w @ leaves[2], leaves, do.double())


@pytest.mark.parametrize(
    "shape, causal, dtype, bm, bn, tol",
    [
        ((1, 2, 40, 40, 16), False, torch.float32, 16, 16, 1e-5),
        ((2, 1, 45, 20, 16), True, torch.float32, 16, 32, 1e-5),  # 25 queries see no key
        ((1, 1, 20, 45, 32), True, torch.float32, 32, 16, 1e-5),
        ((1, 1, 33, 50, 16), True, torch.float16, 16, 16, 5e-3),
    ],
)
def test_backward_kernels_equal_autograd(shape, causal, dtype, bm, bn, tol):
    B, H, n_q, n_k, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, d, generator=g).to(dtype) for n in (n_q, n_k, n_k))
    k = k.transpose(2, 3).contiguous().transpose(2, 3)  # any strides
    do = torch.randn(B, H, d, n_q, generator=g).to(dtype).transpose(2, 3)
    out, lse = ta.triton_attention(q, k, v, causal, bm, bn)
    got = ta.triton_attention_backward(q, k, v, out, lse, do, causal, bm, bn)
    for a, b, t in zip(got, _exact_grads(q, k, v, do, causal), (q, k, v), strict=True):
        assert a.dtype == t.dtype and a.shape == t.shape
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol)


def test_the_autograd_function_trains_on_both_kernels():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g, requires_grad=True) for _ in range(3))
    out = ta.triton_flash_attention(q, k, v, True)
    do = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q, k, v), do)
    for a, b in zip(got, _exact_grads(q, k, v, do, True), strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)
