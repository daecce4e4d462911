"""The mixture-of-experts feed-forward (notebook 15): each model's gates, experts that run
only on their tokens, the load-balancing loss."""

from __future__ import annotations

import pytest
import torch

from attention_ref import experts as experts_module
from attention_ref.experts import (
    ClampedSwiGLU,
    MoEFeedForward,
    deepseek_port_route,
    deepseek_route,
    load_balancing_loss,
    route,
)


def _logits(N: int = 10, E: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(N, E, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_mixtral_gates_are_the_top_k_softmax_renormalised():
    z = _logits()
    gates, experts, probs = route(z, 2, "mixtral")
    p = z.softmax(-1)
    torch.testing.assert_close(probs, p)
    top = p.topk(2, -1)
    assert torch.equal(experts, top.indices)
    torch.testing.assert_close(gates, top.values / top.values.sum(-1, keepdim=True))
    torch.testing.assert_close(gates.sum(-1), torch.ones(10, dtype=torch.float64))


def test_qwen3_renormalises_only_with_norm_topk_prob():
    z = _logits()
    raw = route(z, 2, "qwen3", norm_topk_prob=False)[0]
    torch.testing.assert_close(raw, z.softmax(-1).topk(2, -1).values)
    assert (raw.sum(-1) < 1).all()
    torch.testing.assert_close(route(z, 2, "qwen3")[0], route(z, 2, "mixtral")[0])


def test_deepseek_selects_with_the_bias_but_gates_without_it():
    z = _logits(N=6, E=8)
    bias = torch.zeros(8, dtype=torch.float64)
    bias[7] = 10.0  # expert 7 always selected, yet its gate is its own sigmoid score
    gates, experts, scores = route(z, 2, "deepseek_v3", correction_bias=bias,
                                   norm_topk_prob=False, routed_scaling_factor=2.5)  # fmt: skip
    assert (experts == 7).any(-1).all()
    s = z.sigmoid()
    torch.testing.assert_close(scores, s)
    torch.testing.assert_close(gates, 2.5 * s.gather(1, experts))


def test_deepseek_selects_only_within_the_best_groups():
    z = _logits(N=20, E=8, seed=1)
    _, experts, _ = route(z, 2, "deepseek_v3", n_group=4, topk_group=1)
    groups = experts // 2  # 4 groups of 2 experts
    assert (groups[:, 0] == groups[:, 1]).all()  # both from the one best group
    s = z.sigmoid().view(20, 4, 2).sum(-1)  # a group of 2 scores the sum of its 2 best
    assert torch.equal(groups[:, 0], s.argmax(-1))


def test_deepseek_normalised_gates_sum_to_the_scaling_factor():
    gates = route(_logits(), 3, "deepseek_v3", routed_scaling_factor=2.5)[0]
    torch.testing.assert_close(gates.sum(-1), torch.full((10,), 2.5, dtype=torch.float64))


def test_the_port_is_deepseeks_gate_but_for_the_experts_outside_the_best_groups():
    # transformers' port scores the experts outside the best groups 0, DeepSeek's gate -inf:
    # the same choice while every eligible s + b > 0 (no bias), not once a bias of -1 makes
    # every s + b negative. route's "deepseek_v3" is the port.
    z = _logits(N=30, E=8, seed=3)
    chosen = {}
    for name, bias in (("none", torch.zeros(8)), ("low", torch.full((8,), -1.0))):
        bias = bias.double()
        port = deepseek_port_route(z, bias, 3, n_group=4, topk_group=2, routed_scaling_factor=2.5)
        gate = deepseek_route(z, bias, 3, n_group=4, topk_group=2, routed_scaling_factor=2.5)
        again = route(z, 3, "deepseek_v3", correction_bias=bias, n_group=4, topk_group=2,
                      routed_scaling_factor=2.5)  # fmt: skip
        for a, b in zip(port, again, strict=True):
            assert torch.equal(a, b)
        chosen[name] = (port[1].sort(-1).values, gate[1].sort(-1).values)
        if name == "none":
            torch.testing.assert_close(port[0].sum(-1), gate[0].sum(-1))
    assert torch.equal(*chosen["none"])
    assert not torch.equal(*chosen["low"])


def test_moe_gives_route_only_the_exercises_arguments(monkeypatch):
    # A kernel grading notebook 15 runs the learner's route in MoEFeedForward: it takes the
    # exercise's arguments only, and DeepSeek-V3 (the port) never calls it.
    calls = []

    def spec_route(logits, top_k, router="mixtral", *, norm_topk_prob=True):
        calls.append(router)
        return route(logits, top_k, router, norm_topk_prob=norm_topk_prob)

    monkeypatch.setattr(experts_module, "route", spec_route)
    x = torch.randn(2, 3, 12, dtype=torch.float64)
    for router in ("mixtral", "qwen3", "gpt_oss"):
        _moe(router=router, norm_topk_prob=False)(x)
    _moe(router="deepseek_v3", n_group=2, topk_group=1, routed_scaling_factor=2.5)(x)
    assert calls == ["mixtral", "qwen3", "gpt_oss"]


def _moe(**kw) -> MoEFeedForward:
    torch.manual_seed(0)
    return MoEFeedForward(12, 20, 4, 2, **kw).double()


def test_each_expert_runs_only_on_its_tokens():
    moe = _moe()
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    seen = {}
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda m, a, out, e=e: seen.__setitem__(e, a[0].clone()))
    moe(x)
    _, experts, _ = moe.last_routing
    flat = x.reshape(-1, 12)
    for e in range(4):
        mine = (experts == e).any(-1)
        assert int(moe.tokens_per_expert[e]) == int(mine.sum())
        if mine.any():
            torch.testing.assert_close(seen[e], flat[mine])  # exactly its rows, in order
    assert int(moe.tokens_per_expert.sum()) == 15 * 2  # no dense compute: 2 of 4 per token


def test_the_output_equals_a_dense_gated_sum():
    moe = _moe(router="qwen3", n_shared=1)
    x = torch.randn(7, 12, dtype=torch.float64)
    gates, experts, _ = route(moe.gate(x), 2, "qwen3")
    dense = torch.stack([ex(x) for ex in moe.experts], 1)  # (N, E, D): every expert
    weight = torch.zeros(7, 4, dtype=torch.float64).scatter(1, experts, gates)  # (N, E)
    expected = (weight[..., None] * dense).sum(1) + moe.shared(x)
    torch.testing.assert_close(moe(x), expected, rtol=0, atol=1e-12)


def test_the_load_balancing_loss_is_one_per_slot_when_balanced_and_more_when_not():
    E, N = 4, 8
    uniform = torch.full((N, E), 1 / E, dtype=torch.float64)
    balanced = torch.arange(N)[:, None] % E  # (N, 1): each expert twice
    torch.testing.assert_close(load_balancing_loss(uniform, balanced), torch.tensor(1.0).double())
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]], dtype=torch.float64).expand(N, E)
    loss = load_balancing_loss(skewed, torch.zeros(N, 1, dtype=torch.long))
    torch.testing.assert_close(loss, torch.tensor(4 * 0.7).double())


def test_the_load_balancing_loss_equals_transformers():
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    z = _logits(N=12, E=8)
    _, experts, probs = route(z, 2, "mixtral")
    theirs = mixtral.load_balancing_loss_func((z,), 8, 2)
    ours = load_balancing_loss(probs, experts)
    if theirs.dtype == torch.float32:  # transformers 5.x sums the probabilities in float32
        torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=0)
    else:
        torch.testing.assert_close(ours, theirs)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="top_k"):
        route(_logits(), 9)
    with pytest.raises(ValueError, match="router"):
        MoEFeedForward(4, 4, 2, 1, router="switch")
    with pytest.raises(ValueError, match="d_model=12"):
        _moe()(torch.zeros(2, 5, dtype=torch.float64))


def test_gpt_oss_gates_are_the_softmax_of_the_top_k_logits():
    z = _logits()
    gates, experts, _ = route(z, 3, "gpt_oss")
    top = z.topk(3, -1)
    assert torch.equal(experts, top.indices)
    torch.testing.assert_close(gates, top.values.softmax(-1))
    torch.testing.assert_close(gates, route(z, 3, "mixtral")[0])  # the same gates


def test_the_clamped_swiglu_equals_gpt_oss_expert_where_the_clamp_matters():
    modeling = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    import transformers as tf

    cfg = tf.GptOssConfig(hidden_size=8, intermediate_size=6, num_local_experts=1,
                          num_experts_per_tok=1, num_attention_heads=2, head_dim=4)  # fmt: skip
    torch.manual_seed(0)
    theirs = modeling.GptOssExperts(cfg).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours = ClampedSwiGLU(8, 6).double()
    with torch.no_grad():
        ours.w_gate.weight.copy_(theirs.gate_up_proj[0][:, 0::2].T)
        ours.w_gate.bias.copy_(theirs.gate_up_proj_bias[0][0::2])
        ours.w_up.weight.copy_(theirs.gate_up_proj[0][:, 1::2].T)
        ours.w_up.bias.copy_(theirs.gate_up_proj_bias[0][1::2])
        ours.w_down.weight.copy_(theirs.down_proj[0].T)
        ours.w_down.bias.copy_(theirs.down_proj_bias[0])
    x = 4 * torch.randn(1, 20, 8, dtype=torch.float64)
    g = ours.w_gate(x)
    assert (g > 7).any() and (ours.w_up(x).abs() > 7).any()  # both clamps are exercised
    routed = (torch.zeros(20, 1, dtype=torch.long), torch.ones(20, 1).double())
    expected = theirs(x.view(20, 8), *routed).view(1, 20, 8)  # (N, D): as 5.x takes them
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-12)
