"""Notebook 15's expert-load experiment (attention_ref.apps.expert_load) and its bench line."""

import math

import pytest
import torch

from attention_ref.apps import expert_load as expert_load_module
from attention_ref.apps.expert_load import coefficient_of_variation, dropped_share, expert_load
from attention_ref.apps.variants import VariantsResult
from attention_ref.data.vocab import pad_batch
from attention_ref.experts import load_balancing_loss, router_z_loss


def test_expert_load_gives_each_experts_share_and_trains_with_the_given_loss():
    calls = []

    def counting_loss(probs, experts):
        calls.append((probs.shape, experts.shape))
        return load_balancing_loss(probs, experts)

    load = expert_load(counting_loss, alpha=0.1, seed=0, steps=3)
    assert load.shape == (8,) and load.dtype == torch.float64
    assert abs(load.sum().item() - 1) < 1e-12 and (load >= 0).all()
    assert len(calls) == 3 and all(p[1] == 8 and e[1] == 2 for p, e in calls)


def test_the_balancing_loss_sees_the_real_tokens_only(monkeypatch):
    # as transformers' load_balancing_loss_func given an attention mask: no padding positions
    real_inputs, sizes = [], []

    def recording_pad_batch(sequences):
        ids, real = pad_batch(sequences)
        real_inputs.append((int(real[:, :-1].sum()), real[:, :-1].numel()))  # reads ids[:, :-1]
        return ids, real

    def recording_loss(probs, experts):
        sizes.append((probs.shape[0], experts.shape[0]))
        return load_balancing_loss(probs, experts)

    monkeypatch.setattr(expert_load_module, "pad_batch", recording_pad_batch)
    expert_load(recording_loss, alpha=0.1, seed=0, steps=2)
    assert sizes == [(n, n) for n, _ in real_inputs[:2]]
    assert any(n < positions for n, positions in real_inputs[:2])  # those batches had padding


def test_coefficient_of_variation_is_zero_when_balanced_and_grows_with_the_spread():
    assert coefficient_of_variation(torch.full((8,), 1 / 8)) == 0
    skewed = torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    assert abs(coefficient_of_variation(skewed) - 3**0.5) < 1e-12  # std 0.2165 / mean 0.125


def _result(loads):
    row = {"model": "mixtral", "float32": 1e-6, "float64": 1e-14, "greedy_equal": True}
    return VariantsResult("max_logit_diff_float32", 1e-6, 1.0, [row], loads)


def test_variants_line_reports_the_expert_load_and_whether_the_loss_balanced_each_seed():
    even, skewed = [1 / 8] * 8, [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]
    line = _result({(0.0, 0): skewed, (0.1, 0): even, (0.0, 1): skewed, (0.1, 1): even}).extras()
    assert "busiest_expert_alpha0.0=30.0%/30.0%" in line
    assert "busiest_expert_alpha0.1=12.5%/12.5%" in line
    assert "load_cv_alpha0.1=0.00/0.00" in line
    assert line.endswith("loss_balances_each_seed=True targets_met=True")
    # Seed 1 got worse with the loss: the line says so, and the targets are not met.
    line = _result({(0.0, 0): skewed, (0.1, 0): even, (0.0, 1): even, (0.1, 1): skewed}).extras()
    assert line.endswith("loss_balances_each_seed=False targets_met=False")


def test_dropped_share_counts_what_exceeds_each_experts_capacity():
    balanced = torch.full((8,), 1 / 8, dtype=torch.float64)
    assert dropped_share(balanced, 1.0) == 0.0
    one_busy = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert abs(dropped_share(one_busy, 1.0) - 0.5) < 1e-12  # each takes 1/4: half dropped
    assert abs(dropped_share(one_busy, 1.5) - 0.25) < 1e-12  # each takes 3/8
    assert dropped_share(one_busy, 2.0) == 0.0
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        dropped_share(balanced, 0.0)
    with pytest.raises(ValueError, match="summing to 1"):
        dropped_share(2 * balanced, 1.0)


def test_router_z_loss_is_the_mean_squared_log_sum_exp_and_grows_when_all_logits_shift():
    logits = torch.tensor([[0.0, 0.0], [1.0, -1.0]], dtype=torch.float64)
    expected = (math.log(2.0) ** 2 + math.log(math.e + 1 / math.e) ** 2) / 2
    assert abs(router_z_loss(logits).item() - expected) < 1e-12
    # a shift that leaves the routing alone still raises the loss: what it is there for
    assert router_z_loss(logits + 5) > router_z_loss(logits)
    logits.requires_grad_(True)
    router_z_loss(logits).backward()
    assert logits.grad is not None and (logits.grad.sum(-1) > 0).all()
    with pytest.raises(ValueError, match="tokens, experts"):
        router_z_loss(torch.zeros(3))
