"""The reference multi-head attention (notebook 04): head splitting, equivalence with
torch.nn.MultiheadAttention through from_torch (masks included), and bad-input errors."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from torch import nn

from attention_ref import MultiHeadAttention, causal_mask, merge_heads, sdpa, split_heads
from attention_ref.multihead import SharedHeadProjectionAttention, mask_from_key_padding

matplotlib.use("Agg")

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def torch_mha(d_model, n_heads, *, bias=True, dtype=torch.float64, seed=0, batch_first=True):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=batch_first)
    with torch.no_grad():  # PyTorch initialises the biases to 0: make them count
        if bias:
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha.to(dtype).eval()


# ----------------------------------------------------------------------------- split / merge
@pytest.mark.parametrize("B,T,D,H", [(2, 3, 8, 2), (1, 1, 6, 3), (3, 5, 12, 12), (2, 4, 6, 1)])
def test_split_heads_gives_head_h_the_block_of_features_h(B, T, D, H):
    x = torch.arange(B * T * D, dtype=torch.float32).reshape(B, T, D)
    heads = split_heads(x, H)
    dh = D // H
    assert heads.shape == (B, H, T, dh)
    for h in range(H):
        assert torch.equal(heads[:, h], x[..., h * dh : (h + 1) * dh])


@pytest.mark.parametrize("B,T,D,H", [(2, 3, 8, 2), (1, 1, 6, 3), (3, 5, 12, 4)])
def test_merge_heads_is_the_exact_inverse_of_split_heads(B, T, D, H):
    x = randn(B, T, D, seed=1)
    assert torch.equal(merge_heads(split_heads(x, H)), x)
    y = randn(B, H, T, D // H, seed=2)
    assert torch.equal(split_heads(merge_heads(y), H), y)


# ----------------------------------------------------------------------------- vs PyTorch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_matches_nn_multihead_attention_self_attention(dtype, bias):
    mha = torch_mha(16, 4, bias=bias, dtype=dtype)
    ours = MultiHeadAttention.from_torch(mha)
    assert ours.w_q.weight.dtype == dtype and (ours.w_q.bias is not None) == bias
    x = randn(2, 5, 16, seed=3, dtype=dtype)
    out, weights = ours(x, x, x)
    expected, expected_w = mha(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    torch.testing.assert_close(weights, expected_w, **TOL[dtype])
    # nn.MultiheadAttention's default weights are the mean over the heads.
    _, averaged = mha(x, x, x)
    torch.testing.assert_close(weights.mean(dim=1), averaged, **TOL[dtype])


def test_from_torch_matches_cross_attention_with_n_q_different_from_n_k():
    mha = torch_mha(12, 3, seed=1)
    ours = MultiHeadAttention.from_torch(mha)
    q, k, v = randn(2, 3, 12, seed=4), randn(2, 7, 12, seed=5), randn(2, 7, 12, seed=6)
    out, weights = ours(q, k, v)
    expected, expected_w = mha(q, k, v, average_attn_weights=False)
    assert weights.shape == (2, 3, 3, 7)
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    torch.testing.assert_close(weights, expected_w, **TOL[torch.float64])


def test_from_torch_unpacks_in_proj_weight_rows_as_q_then_k_then_v():
    mha = torch_mha(8, 2, seed=2)
    ours = MultiHeadAttention.from_torch(mha)
    D = 8
    assert torch.equal(ours.w_q.weight, mha.in_proj_weight[:D])
    assert torch.equal(ours.w_k.weight, mha.in_proj_weight[D : 2 * D])
    assert torch.equal(ours.w_v.weight, mha.in_proj_weight[2 * D :])
    assert torch.equal(ours.w_v.bias, mha.in_proj_bias[2 * D :])
    assert torch.equal(ours.w_o.weight, mha.out_proj.weight)
    # a copy, not a view: training one must not change the other
    with torch.no_grad():
        ours.w_q.weight.zero_()
    assert mha.in_proj_weight[:D].abs().sum() > 0


def test_key_padding_mask_means_the_opposite_and_converts_to_our_mask():
    mha = torch_mha(8, 2, seed=3)
    ours = MultiHeadAttention.from_torch(mha)
    q, kv = randn(3, 4, 8, seed=7), randn(3, 6, 8, seed=8)
    lengths = torch.tensor([6, 2, 4])
    key_padding_mask = torch.arange(6)[None, :] >= lengths[:, None]  # True = padding
    mask = mask_from_key_padding(key_padding_mask)
    assert mask.shape == (3, 1, 1, 6) and mask.dtype == torch.bool
    out, weights = ours(q, kv, kv, mask)
    expected, expected_w = mha(
        q, kv, kv, key_padding_mask=key_padding_mask, average_attn_weights=False
    )
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    torch.testing.assert_close(weights, expected_w, **TOL[torch.float64])
    assert torch.all(weights[1, :, :, 2:] == 0)
    # Passing PyTorch's mask unconverted masks the real tokens instead of the padding.
    wrong, _ = ours(q, kv, kv, key_padding_mask[:, None, None, :])
    assert not torch.allclose(wrong[0], expected[0])


def test_boolean_attn_mask_of_torch_is_also_inverted_causal_example():
    mha = torch_mha(16, 4, seed=4)
    ours = MultiHeadAttention.from_torch(mha)
    x = randn(2, 6, 16, seed=9)
    allowed = causal_mask(6)  # ours: True = may attend
    out, weights = ours(x, x, x, allowed)
    expected, _ = mha(x, x, x, attn_mask=~allowed, average_attn_weights=False)  # True = block
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    assert torch.all(weights.triu(1) == 0)


def test_from_torch_works_for_a_sequence_first_module():
    mha = torch_mha(8, 2, seed=5, batch_first=False)
    ours = MultiHeadAttention.from_torch(mha)
    x = randn(2, 5, 8, seed=10)
    out, _ = ours(x, x, x)
    expected, _ = mha(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
    torch.testing.assert_close(out, expected.transpose(0, 1), **TOL[torch.float64])


def test_from_torch_refuses_what_it_cannot_represent():
    with pytest.raises(ValueError, match="kdim = vdim = embed_dim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv=False"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


# ----------------------------------------------------------------------------- properties
def test_loop_over_heads_equals_the_batched_computation():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double()
    x = randn(2, 5, 12, seed=11)
    out, weights = mha(x, x, x)
    Q, K, V = mha.w_q(x), mha.w_k(x), mha.w_v(x)
    heads = []
    for h in range(3):
        cols = slice(4 * h, 4 * (h + 1))
        o_h, w_h = sdpa(Q[..., cols], K[..., cols], V[..., cols])
        torch.testing.assert_close(w_h, weights[:, h])
        heads.append(o_h)
    torch.testing.assert_close(mha.w_o(torch.cat(heads, dim=-1)), out)


def test_a_3d_mask_is_shared_by_the_heads_and_a_4d_mask_can_differ_per_head():
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2).double()
    x = randn(3, 4, 8, seed=12)
    mask3 = torch.rand(3, 4, 4, generator=torch.Generator().manual_seed(0)) < 0.6
    mask3[..., 0] = True
    out3, w3 = mha(x, x, x, mask3)
    out4, w4 = mha(x, x, x, mask3[:, None])
    torch.testing.assert_close(out3, out4)
    assert torch.all(w3[~mask3[:, None].expand_as(w3)] == 0)
    per_head = torch.stack([mask3, torch.ones_like(mask3)], dim=1)  # head 1 sees everything
    _, wh = mha(x, x, x, per_head)
    assert torch.all(wh[:, 0][~mask3] == 0) and torch.all(wh[:, 1] > 0)


def test_a_fully_masked_query_gets_zero_weights_and_zero_attention_not_nan():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2).double()
    x = randn(1, 3, 8, seed=13)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 1] = False
    out, weights = mha(x, x, x, mask)
    assert torch.isfinite(out).all()
    assert torch.all(weights[0, :, 1] == 0)
    torch.testing.assert_close(out[0, 1], mha.w_o.bias)  # no value mixed in: W_O(0) = bias


def test_gradients_are_correct_float64():
    torch.manual_seed(3)
    mha = MultiHeadAttention(6, 3).double()
    x = randn(1, 3, 6, seed=14).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: mha(t, t, t, causal_mask(3))[0], (x,))


def test_reference_follows_device_and_dtype_of_its_parameters():
    mha = MultiHeadAttention(8, 2).to(torch.float64)
    out, weights = mha(*(randn(1, 2, 8),) * 3)
    assert out.dtype == weights.dtype == torch.float64


# ----------------------------------------------------------------------------- the variant
def test_shared_head_projection_has_fewer_parameters_and_blind_heads():
    D, H = 16, 4
    dh = D // H
    standard, shared = MultiHeadAttention(D, H), SharedHeadProjectionAttention(D, H)
    n_standard = sum(p.numel() for p in standard.parameters())
    n_shared = sum(p.numel() for p in shared.parameters())
    assert n_standard == 4 * (D * D + D)
    assert n_shared == 3 * (dh * dh + dh) + D * D + D
    # In the variant, head 0's queries depend only on input features 0..dh-1; in the
    # standard module they depend on every feature.
    x = randn(1, 1, D, seed=15)

    def head0_query(module, t):
        if isinstance(module, SharedHeadProjectionAttention):
            return module.w_q(split_heads(t, H))[:, 0]
        return split_heads(module.w_q(t), H)[:, 0]

    for module, blind in ((shared, True), (standard, False)):
        module.double()
        jac = torch.autograd.functional.jacobian(lambda t, m=module: head0_query(m, t), x)
        jac = jac.reshape(dh, D)
        assert (jac[:, dh:].abs().sum() == 0) == blind
    out, weights = shared(x, x, x)
    assert out.shape == (1, 1, D) and weights.shape == (1, H, 1, 1)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("d_model,n_heads", [(10, 3), (6, 4), (8, 0), (0, 2), (8.0, 2)])
def test_constructor_refuses_sizes_that_cannot_be_split(d_model, n_heads):
    with pytest.raises(ValueError) as err:
        MultiHeadAttention(d_model, n_heads)
    text = str(err.value)
    assert "n_heads" in text or "d_model" in text
    if n_heads and d_model and isinstance(d_model, int):
        assert f"d_model={d_model}" in text and f"n_heads={n_heads}" in text
        assert "divisible" in text


def test_split_and_merge_reject_bad_input_with_the_shape_seen():
    with pytest.raises(ValueError, match=r"d_model=10.*not divisible by n_heads=3"):
        split_heads(torch.zeros(2, 3, 10), 3)
    with pytest.raises(ValueError, match=r"\(batch, seq, d_model\); got shape \(3, 8\)"):
        split_heads(torch.zeros(3, 8), 2)
    with pytest.raises(ValueError, match="n_heads must be a positive int"):
        split_heads(torch.zeros(1, 3, 8), 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        split_heads([[1.0, 2.0]], 1)
    with pytest.raises(ValueError, match=r"\(batch, heads, seq, d_head\); got shape \(2, 3, 4\)"):
        merge_heads(torch.zeros(2, 3, 4))


def test_forward_rejects_inputs_of_the_wrong_width_or_mask():
    mha = MultiHeadAttention(8, 2)
    x = torch.zeros(2, 3, 8)
    with pytest.raises(ValueError, match=r"key must be \(batch, seq, d_model=8\); got shape"):
        mha(x, torch.zeros(2, 3, 6), x)
    with pytest.raises(ValueError, match=r"query must be .*got shape \(3, 8\)"):
        mha(torch.zeros(3, 8), x, x)
    with pytest.raises(TypeError, match="mask must be boolean"):
        mha(x, x, x, torch.ones(2, 3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(x, x, x, torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="True = padding"):
        mask_from_key_padding(torch.zeros(2, 3))


def test_plot_heads_draws_one_heatmap_per_head():
    from attention_ref.plots import plot_heads

    w = torch.softmax(randn(3, 4, 4, seed=16), dim=-1)
    axes = plot_heads(w, list("abcd"), head_names=["x", "y", "z"])
    assert [ax.get_title() for ax in axes] == ["x", "y", "z"]
    with pytest.raises(ValueError, match=r"\(heads, n_q, n_k\)"):
        plot_heads(w[0])
    assert math.isclose(float(w.sum()), 12.0)


# ----------------------------------------------------------------------------- dropout
def test_attention_dropout_drops_the_weights_in_training_mode_only():
    """Like nn.MultiheadAttention: dropout on the weights after the softmax, the returned
    weights are the dropped ones (kept entries scaled by 1/(1-p)) and the output uses them."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.5).double()
    x = randn(2, 7, 16)
    mha.eval()
    out_eval, w_eval = mha(x, x, x)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(2, 4, 7, dtype=torch.float64))
    mha.train()
    out, w = mha(x, x, x)
    dropped = w == 0
    assert 0.3 < dropped.double().mean() < 0.7, "about half the weights are dropped"
    torch.testing.assert_close(w[~dropped], 2.0 * w_eval[~dropped])  # kept: scaled by 1/(1-p)
    v = split_heads(mha.w_v(x), 4)
    torch.testing.assert_close(out, mha.w_o(merge_heads(w @ v)))  # the output uses them
    assert not torch.allclose(out, out_eval)


def test_attention_dropout_zero_is_deterministic_and_from_torch_copies_p():
    mha = MultiHeadAttention(8, 2).double().train()
    x = randn(1, 5, 8)
    torch.testing.assert_close(mha(x, x, x)[1], mha(x, x, x)[1], rtol=0, atol=0)
    theirs = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True).double()
    ours = MultiHeadAttention.from_torch(theirs)
    assert ours.attn_dropout.p == 0.25 and ours.training
    # equivalence holds in eval mode (in training mode the two draw different masks)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        expected, w_expected = theirs(x, x, x, average_attn_weights=False)
    out, w = ours(x, x, x)
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    torch.testing.assert_close(w, w_expected, **TOL[torch.float64])


def test_constructor_rejects_a_dropout_given_as_bias_or_out_of_range():
    with pytest.raises(TypeError, match="bias must be a bool.*dropout=0.1"):
        MultiHeadAttention(8, 2, 0.1)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.0)
