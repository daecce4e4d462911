"""The course's training loop while nbgrader autogrades: a token number of steps, or what
ATTENTION_REF_GRADING_STEPS says."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from attention_ref.training import GRADING_STEPS_ENV, train


def steps_trained(steps: int) -> int:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    batches = itertools.repeat(torch.randn(4, 3))
    result = train(
        model, lambda m, x: m(x).pow(2).mean(), batches, steps=steps, warmup=1, progress=False
    )
    return result.steps


def test_outside_grading_every_step_is_trained(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv(GRADING_STEPS_ENV, "3")  # read only while autograding
    assert steps_trained(7) == 7


@pytest.mark.parametrize(("setting", "expected"), [(None, 2), ("5", 5), ("all", 7), ("50", 7)])
def test_under_autograde_the_steps_are_capped_as_configured(monkeypatch, setting, expected):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    if setting is None:
        monkeypatch.delenv(GRADING_STEPS_ENV, raising=False)
    else:
        monkeypatch.setenv(GRADING_STEPS_ENV, setting)
    assert steps_trained(7) == expected


@pytest.mark.parametrize("bad", ["soon", "0", "-3", "2.5"])
def test_a_bad_grading_steps_setting_names_the_variable(monkeypatch, bad):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv(GRADING_STEPS_ENV, bad)
    with pytest.raises(ValueError, match=rf"{GRADING_STEPS_ENV} must be .* got '{bad}'"):
        steps_trained(7)


def test_a_running_mean_is_drawn_at_the_last_step_of_each_window():
    from attention_ref.training import TrainResult

    steps, means = TrainResult(losses=[1.0, 2.0, 3.0, 4.0, 5.0]).running_mean(2)
    assert steps.tolist() == [2, 3, 4, 5] and means.tolist() == [1.5, 2.5, 3.5, 4.5]
    # fewer steps than the window (autograding): one mean of them all, at the last step
    steps, means = TrainResult(losses=[1.0, 2.0, 3.0]).running_mean(20)
    assert steps.tolist() == [3] and means.tolist() == [2.0]
    steps, means = TrainResult().running_mean()
    assert len(steps) == len(means) == 0
