"""The reference SelfAttention (notebook 03) against PyTorch's attention, by its properties
(permutation equivariance, causality, fully masked rows), its cost model against PyTorch's
FLOP counter, its errors on bad input, and its figure."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attention_ref import MultiHeadAttention, SelfAttention, causal_mask, self_attention_cost
from attention_ref.plots import plot_attention_cost

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-10, atol=1e-12)}
BATCH_SHAPES = [(), (1,), (3,), (2, 4)]


def make(d_in, d_k, d_v, dtype=torch.float64, seed=0) -> SelfAttention:
    torch.manual_seed(seed)
    return SelfAttention(d_in, d_k, d_v).to(dtype)


def inputs(batch, T, d_in, dtype=torch.float64, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, T, d_in, generator=g, dtype=dtype)


def test_parameters_are_three_bias_free_linear_layers_with_the_documented_shapes():
    sa = SelfAttention(6, 4, 3)
    assert isinstance(sa.w_q, nn.Linear) and isinstance(sa.w_k, nn.Linear)
    assert isinstance(sa.w_v, nn.Linear)
    assert {n: tuple(p.shape) for n, p in sa.named_parameters()} == {
        "w_q.weight": (4, 6),
        "w_k.weight": (4, 6),
        "w_v.weight": (3, 6),
    }
    assert "d_in=6, d_k=4, d_v=3" in repr(sa)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", BATCH_SHAPES)
def test_matches_torch_sdpa_on_the_projections(dtype, batch):
    sa = make(6, 4, 5, dtype)
    x = inputs(batch, 7, 6, dtype)
    out, weights = sa(x)
    q = x @ sa.w_q.weight.T
    k = x @ sa.w_k.weight.T
    v = x @ sa.w_v.weight.T
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TOL[dtype])
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected_w, **TOL[dtype])
    assert out.shape == (*batch, 7, 5) and weights.shape == (*batch, 7, 7)
    assert out.dtype == dtype and weights.dtype == dtype


@pytest.mark.parametrize("use_mask", [False, True])
def test_matches_single_head_nn_multiheadattention(use_mask):
    """nn.MultiheadAttention with one head, no bias and an identity output projection is
    self-attention with W_Q, W_K, W_V taken from its in_proj_weight."""
    d = 8
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(d, num_heads=1, bias=False, batch_first=True).double()
    with torch.no_grad():
        mha.out_proj.weight.copy_(torch.eye(d))
    sa = SelfAttention(d, d, d).double()
    wq, wk, wv = mha.in_proj_weight.chunk(3)
    sa.load_state_dict({"w_q.weight": wq, "w_k.weight": wk, "w_v.weight": wv})
    x = inputs((2,), 5, d)
    mask = causal_mask(5) if use_mask else None
    # PyTorch's boolean attn_mask means the opposite: True = may NOT attend.
    want_out, want_w = mha(x, x, x, attn_mask=None if mask is None else ~mask)
    out, weights = sa(x, mask)
    torch.testing.assert_close(out, want_out, **TOL[torch.float64])
    torch.testing.assert_close(weights, want_w, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_permuting_the_tokens_permutes_the_output_the_same_way(dtype):
    sa = make(5, 4, 3, dtype)
    x = inputs((2,), 6, 5, dtype)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out, weights = sa(x)
    out_p, weights_p = sa(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm], **TOL[dtype])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm], **TOL[dtype])
    # ... and the output does change, so the test can fail: order is not ignored per token.
    assert not torch.allclose(out_p, out)


def test_a_causal_mask_keeps_later_tokens_from_changing_earlier_outputs():
    sa = make(5, 4, 3)
    x = inputs((1,), 6, 5)
    x2 = x.clone()
    x2[:, 4:] += 2.0
    out, weights = sa(x, causal_mask(6))
    out2, _ = sa(x2, causal_mask(6))
    torch.testing.assert_close(out2[:, :4], out[:, :4], rtol=0, atol=1e-12)
    assert not torch.allclose(out2[:, 4:], out[:, 4:])
    assert torch.all(weights.triu(1) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 6, dtype=torch.float64))


def test_padding_mask_broadcasts_over_queries_and_fully_masked_rows_give_zeros():
    sa = make(4, 3, 2)
    x = inputs((2,), 5, 4)
    mask = torch.ones(2, 1, 5, dtype=torch.bool)
    mask[1, :, 3:] = False
    out, weights = sa(x, mask)
    assert torch.all(weights[1, :, 3:] == 0)
    # Padding does not change what the real tokens see.
    out_short, _ = sa(x[1:, :3])
    torch.testing.assert_close(out[1:, :3], out_short, **TOL[torch.float64])

    dead = torch.ones(5, 5, dtype=torch.bool)
    dead[2] = False
    out, weights = sa(x, dead)
    assert torch.all(weights[:, 2] == 0) and torch.all(out[:, 2] == 0)
    assert torch.isfinite(out).all()


def test_gradients_reach_all_three_projections():
    sa = make(4, 3, 2)
    out, _ = sa(inputs((2,), 5, 4))
    out.square().sum().backward()
    for name, p in sa.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_the_worked_example_of_the_notebook_with_identity_projections():
    """With W_Q = W_K = W_V = I the tokens [1,0,1,0,...], [0,1,0,1,...] and all ones give
    scores x_i . x_j / sqrt(8): 4/sqrt 8 on the diagonal of the first two, 0 between them,
    4/sqrt 8 against the all-ones token and 8/sqrt 8 for it with itself."""
    x = torch.tensor([[1.0, 0] * 4, [0.0, 1] * 4, [1.0] * 8], dtype=torch.float64)
    sa = SelfAttention(8, 8, 8).double()
    sa.load_state_dict({f"w_{n}.weight": torch.eye(8, dtype=torch.float64) for n in "qkv"})
    out, weights = sa(x)
    s = math.sqrt(2)  # 4 / sqrt(8)
    scores = torch.tensor([[s, 0, s], [0, s, s], [s, s, 2 * s]], dtype=torch.float64)
    torch.testing.assert_close(weights, torch.softmax(scores, -1))
    torch.testing.assert_close(out, weights @ x)
    # Token 0 and token 1 are mirror images, so their weights are too.
    torch.testing.assert_close(weights[0, [0, 1, 2]], weights[1, [1, 0, 2]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_runs_on_the_device_of_its_input():
    sa = make(6, 4, 3, torch.float32).cuda()
    x = inputs((2,), 5, 6, torch.float32)
    out, weights = sa(x.cuda(), causal_mask(5, device="cuda"))
    ref_out, ref_w = sa.cpu()(x, causal_mask(5))
    assert out.device.type == "cuda" and weights.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), ref_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weights.cpu(), ref_w, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "x, exc, words",
    [
        ([[1.0] * 6], TypeError, "x must be a torch.Tensor"),
        (torch.ones(3, 6, dtype=torch.long), TypeError, "floating dtype"),
        (torch.ones(6), ValueError, "(6,)"),
        (torch.ones(2, 3, 5), ValueError, "d_in=6"),
    ],
)
def test_bad_input_names_the_argument_and_the_shapes(x, exc, words):
    with pytest.raises(exc, match="x must") as info:
        SelfAttention(6, 4, 3)(x)
    assert words in str(info.value)


@pytest.mark.parametrize("args", [(0, 4, 3), (6, -1, 3), (6, 4, 2.5), (True, 4, 3)])
def test_bad_sizes_are_rejected_by_name(args):
    with pytest.raises(ValueError, match=r"d_(in|k|v) must be a positive int"):
        SelfAttention(*args)


def test_cost_rejects_a_bad_length():
    with pytest.raises(ValueError, match="n_tokens must be a positive int"):
        self_attention_cost(0, 8, 8, 8)


# ----------------------------------------------------------------------------- cost
@pytest.mark.parametrize("T, d_in, d_k, d_v, batch", [(16, 8, 4, 6, 2), (64, 32, 16, 16, 1)])
def test_cost_counts_the_flops_pytorch_counts(T, d_in, d_k, d_v, batch):
    sa = make(d_in, d_k, d_v, torch.float32)
    x = inputs((batch,), T, d_in, torch.float32)
    with FlopCounterMode(display=False) as counter:
        _, weights = sa(x)
    cost = self_attention_cost(T, d_in, d_k, d_v, batch=batch)
    assert counter.get_total_flops() == cost["total"]
    assert cost["total"] == cost["projections"] + cost["scores"] + cost["weighted_sum"]
    assert cost["score_bytes"] == weights.numel() * weights.element_size()


def test_cost_of_the_scores_is_quadratic_and_of_the_projections_linear_in_T():
    small, big = self_attention_cost(100, 64, 64, 64), self_attention_cost(200, 64, 64, 64)
    assert big["projections"] == 2 * small["projections"]
    assert big["scores"] == 4 * small["scores"]
    assert big["weighted_sum"] == 4 * small["weighted_sum"]
    assert big["score_bytes"] == 4 * small["score_bytes"]
    half = self_attention_cost(100, 64, 64, 64, bytes_per_float=2)
    assert half["score_bytes"] * 2 == small["score_bytes"]


def test_cost_figure_draws_both_panels_and_rejects_mismatched_data():
    ns = [64, 256, 1024]
    costs = [self_attention_cost(n, 64, 64, 64) for n in ns]
    ax_f, ax_m = plot_attention_cost(ns, costs, memory_limit_bytes=1e6)
    assert len(ax_f.get_lines()) >= 3
    assert list(ax_m.get_lines()[0].get_ydata()) == [c["score_bytes"] for c in costs]
    plt.close("all")
    with pytest.raises(ValueError, match="one dict per length"):
        plot_attention_cost(ns, costs[:2])
    with pytest.raises(ValueError, match="increasing"):
        plot_attention_cost([256, 64, 1024], costs)
    with pytest.raises(ValueError, match="lacks"):
        plot_attention_cost(ns, [{"total": 1}] * 3)


def test_load_projections_fills_every_declaration_the_spec_allows():
    """nn.Linear, nn.LazyLinear, a raw (d_in, d_k) parameter and a parametrized weight all
    compute x @ W^T once given W in nn.Linear's layout; a wrong shape or name is an error."""
    from attention_ref.weights import load_projections

    class Identity(nn.Module):
        def forward(self, w):
            return w

    torch.manual_seed(0)
    w, x = torch.randn(4, 6), torch.randn(3, 6)
    linear = nn.Linear(6, 4, bias=False)
    lazy = nn.LazyLinear(4, bias=False)
    param = nn.ParameterDict({"w_q": nn.Parameter(torch.zeros(6, 4))})
    parametrized = nn.Linear(6, 4, bias=False)
    nn.utils.parametrize.register_parametrization(parametrized, "weight", Identity())
    # weight_norm's right_inverse returns g and v: original0, original1, no original
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(6, 4, bias=False))
    for layer in (linear, lazy, parametrized, normed):
        holder = nn.Module()
        holder.w_q = layer
        load_projections(holder, w_q=w)
        torch.testing.assert_close(holder.w_q(x), x @ w.T)
    holder = nn.Module()
    holder.w_q = param["w_q"]
    load_projections(holder, w_q=w)
    torch.testing.assert_close(x @ holder.w_q, x @ w.T)
    with pytest.raises(ValueError, match=r"w_q has shape \(4, 6\); the weight given fits \(6, 4\)"):
        holder = nn.Module()
        holder.w_q = nn.Linear(6, 4, bias=False)
        load_projections(holder, w_q=w.T)
    with pytest.raises(ValueError, match="no projection 'w_k'.*its attributes: w_q"):
        load_projections(holder, w_k=w)


def test_load_weights_is_load_state_dict_for_every_declaration_the_spec_allows():
    """Issue 29: a weight_norm layer or a persistent buffer of the learner's own passed the
    checks, then load_state_dict failed in notebooks 04 and 06. A name that does not match
    is still an error."""
    from attention_ref.weights import load_weights

    torch.manual_seed(0)
    ref = MultiHeadAttention(8, 2)
    mine = MultiHeadAttention(8, 2)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        setattr(mine, name, nn.utils.parametrizations.weight_norm(getattr(mine, name)))
    mine.register_buffer("calls", torch.zeros((), dtype=torch.long))
    with pytest.raises(RuntimeError, match="Missing key"):
        mine.load_state_dict(ref.state_dict())
    load_weights(mine, ref.state_dict())
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(mine(x, x, x)[0], ref(x, x, x)[0])
    renamed = MultiHeadAttention(8, 2)
    renamed.w_out = renamed.w_o
    del renamed.w_o
    with pytest.raises(ValueError, match="not loaded: w_out.weight.*no such tensor.*w_o.weight"):
        load_weights(renamed, ref.state_dict())


def test_load_weights_loads_a_parameter_held_under_two_names_by_either():
    """Notebook 06's catalog: a FeedForward whose layers sit in a Sequential and also as
    linear1 and linear2 takes the reference's weights by the spec's names."""
    from attention_ref.encoder import FeedForward
    from attention_ref.weights import load_weights

    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
            self.linear1, self.linear2 = self.net[0], self.net[2]

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(0)
    ref, mine = FeedForward(4, 8), Aliased()
    load_weights(mine, ref.state_dict())
    x = torch.randn(3, 4)
    torch.testing.assert_close(mine(x), ref(x))
    with pytest.raises(ValueError, match="not loaded: net.2.weight, net.2.bias"):
        load_weights(mine, {k: v for k, v in ref.state_dict().items() if "linear2" not in k})


def test_with_weights_of_builds_the_learners_class_with_the_references_numbers():
    """The learner's module holds the reference's weights, dtype and mode, and building it
    leaves the caller's seeded random draws as they were."""
    from attention_ref.weights import with_weights_of

    class Drawing(MultiHeadAttention):  # a learner's class that draws more at init
        def __init__(self, d_model, n_heads):
            super().__init__(d_model, n_heads)
            torch.randn(1000)

    torch.manual_seed(0)
    ref = MultiHeadAttention(8, 2).double().eval()
    torch.manual_seed(1)
    mine = with_weights_of(ref, Drawing, 8, 2)
    after = torch.rand(1)
    torch.manual_seed(1)
    assert torch.equal(after, torch.rand(1))  # the draws after it are the seed's
    assert isinstance(mine, Drawing) and not mine.training
    assert mine.w_q.weight.dtype == torch.float64
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(mine(x, x, x)[0], ref(x, x, x)[0])
    with pytest.raises(TypeError, match="reference must be an nn.Module"):
        with_weights_of("not a module", Drawing, 8, 2)
    with pytest.raises(TypeError, match="not an nn.Module"):
        with_weights_of(ref, lambda *a: object())
