"""Catalog entries about the check framework itself (``attention_ref/checks/_core.py``):
mistakes it names generically for every exercise, such as precision loss."""

import math

import torch

from attention_ref import merge_heads, split_heads

from . import mistake
from .nb03 import _Base


def _softmax_in_float32(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """A masked softmax computed in float32 and cast back to the scores' dtype: the
    result has the right dtype, but only float32 precision."""
    s = scores.float()
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0).to(scores.dtype)


@mistake("sdpa", id="precision_loss")
def sdpa_softmax_in_float32(q, k, v, mask=None):
    w = _softmax_in_float32(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
    return w @ v, w


@mistake("cached_self_attention", id="precision_loss")
def kv_softmax_in_float32(mha, x_new, cache):
    """Correct but for a float32 softmax: at a one-token step the (irrelevant) causal mask
    of the new chunk must not be named."""
    H = mha.n_heads
    q = split_heads(mha.w_q(x_new), H)
    k_all, v_all = cache.append(split_heads(mha.w_k(x_new), H), split_heads(mha.w_v(x_new), H))
    t, T = q.shape[2], k_all.shape[2]
    allowed = torch.ones(t, T, dtype=torch.bool).tril(T - t)
    w = _softmax_in_float32(q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1]), allowed)
    return mha.w_o(merge_heads(w @ v_all))


@mistake("self_attention", id="precision_loss")
class SelfAttentionFloat32Softmax(_Base):
    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        w = _softmax_in_float32(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
        return w @ v, w


@mistake("online_softmax", id="epsilon_in_denominator")
def softmax_epsilon_in_sum(x, block_size):
    """The running softmax with ``+ 1e-6`` in the final division: right to float32 precision
    on float64 inputs, but not because of float32, so "precision loss" must not be named."""
    m = x.new_tensor(-math.inf)
    l = x.new_tensor(0.0)  # noqa: E741
    for block in x.split(block_size):
        m_new = torch.maximum(m, block.max())
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum()  # noqa: E741
        m = m_new
    return torch.exp(x - m) / (l + 1e-6)
