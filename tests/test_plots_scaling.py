"""The scaling figure of notebook 01: it draws the numbers it is given, the theory line and
the reference levels, and rejects data that does not line up with d_ks."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from attention_ref.plots import plot_score_scaling

D_KS = [1, 4, 16, 64]
DATA = dict(
    var_unscaled=[1.1, 3.9, 16.5, 63.0],
    max_weight_unscaled=[0.4, 0.6, 0.8, 0.95],
    max_weight_scaled=[0.4, 0.41, 0.39, 0.40],
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_draws_the_measurements_and_the_theory_line_on_two_panels():
    left, right = plot_score_scaling(D_KS, var_scaled=[1.0, 0.9, 1.1, 1.0], n_keys=8, **DATA)
    assert left.figure is right.figure and left is not right
    lines = _lines(left)
    theory = next(line for label, line in lines.items() if "theory" in label)
    np.testing.assert_array_equal(theory.get_xdata(), D_KS)
    np.testing.assert_array_equal(theory.get_ydata(), D_KS)  # Var = d_k
    ydata = sorted(tuple(line.get_ydata()) for line in lines.values())
    assert tuple(DATA["var_unscaled"]) in ydata
    assert (1.0, 0.9, 1.1, 1.0) in ydata
    curves = {tuple(line.get_ydata()) for line in right.get_lines()}
    assert tuple(DATA["max_weight_unscaled"]) in curves
    assert tuple(DATA["max_weight_scaled"]) in curves
    assert (1.0, 1.0) in curves  # the one-hot level
    assert (1 / 8, 1 / 8) in curves  # the uniform level for n_keys = 8
    assert right.get_xscale() == "log"


def test_uses_the_axes_it_is_given_and_accepts_tensors():
    fig, axes = plt.subplots(1, 2)
    data = {k: torch.tensor(v) for k, v in DATA.items()}
    got = plot_score_scaling(torch.tensor(D_KS), axes=axes, **data)
    assert got[0] is axes[0] and got[1] is axes[1]
    assert len(fig.axes) == 2
    # no scaled variance and no n_keys: no extra curve, no uniform level
    assert len(axes[0].get_lines()) == 2
    assert len(axes[1].get_lines()) == 3


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (dict(var_unscaled=[1.0, 2.0]), ["var_unscaled", "(4,)", "(2,)"]),
        (dict(max_weight_scaled=np.ones((4, 1))), ["max_weight_scaled", "(4, 1)"]),
        (dict(var_scaled=[1.0]), ["var_scaled", "(4,)", "(1,)"]),
        (dict(n_keys=0), ["n_keys", ">= 1"]),
    ],
)
def test_rejects_data_that_does_not_match_d_ks(change, words):
    kwargs = {**DATA, **change}
    with pytest.raises(ValueError) as err:
        plot_score_scaling(D_KS, **kwargs)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("d_ks", [[], [0, 4], [[1, 2]]])
def test_rejects_bad_d_ks(d_ks):
    with pytest.raises(ValueError, match="d_ks"):
        plot_score_scaling(d_ks, **DATA)


def test_rejects_the_wrong_number_of_axes():
    _, ax = plt.subplots()
    with pytest.raises(ValueError, match="two axes"):
        plot_score_scaling(D_KS, axes=[ax], **DATA)


def test_the_variance_panel_is_log_log_so_the_scaled_variance_stays_visible():
    left, _ = plot_score_scaling(D_KS, var_scaled=[1.0, 0.9, 1.1, 1.0], **DATA)
    assert left.get_xscale() == "log" and left.get_yscale() == "log"
    assert "log" in left.get_xlabel() and "log" in left.get_ylabel()
