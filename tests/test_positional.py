"""The reference positional encodings (notebook 05): the sinusoidal table, the offset
rotation and rotary position embeddings (RoPE)."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_ref import offset_rotation, rope, sinusoidal_encoding
from attention_ref.positional import frequencies


def _formula(n: int, d: int) -> torch.Tensor:
    """The table straight from the definition, one entry at a time, in float64."""
    pe = torch.empty(n, d, dtype=torch.float64)
    for p in range(n):
        for i in range(d // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / d))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d))
    return pe


# ----------------------------------------------------------------------------- sinusoidal
@pytest.mark.parametrize(("n", "d"), [(1, 2), (7, 4), (50, 16), (3, 130)])
def test_sinusoidal_encoding_matches_the_formula_entry_by_entry(n, d):
    pe = sinusoidal_encoding(n, d, dtype=torch.float64)
    torch.testing.assert_close(pe, _formula(n, d), rtol=0, atol=1e-12)


def test_sinusoidal_encoding_first_rows():
    pe = sinusoidal_encoding(2, 4)
    expected = torch.tensor(
        [[0.0, 1.0, 0.0, 1.0], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]]
    )
    torch.testing.assert_close(pe, expected)


def test_sinusoidal_encoding_is_float32_by_default_and_follows_dtype_and_device():
    assert sinusoidal_encoding(3, 4).dtype == torch.float32
    pe = sinusoidal_encoding(3, 4, dtype=torch.float64, device="cpu")
    assert pe.dtype == torch.float64 and pe.device.type == "cpu"
    assert sinusoidal_encoding(0, 6).shape == (0, 6)


def test_sinusoidal_encoding_float32_is_the_float64_table_rounded_once():
    pe32 = sinusoidal_encoding(2000, 64)
    pe64 = sinusoidal_encoding(2000, 64, dtype=torch.float64)
    assert torch.equal(pe32, pe64.float())


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((4, 7), ValueError, ["d_model", "even", "7"]),
        ((4, 0), ValueError, ["d_model", ">= 2"]),
        ((-1, 4), ValueError, ["n_positions", ">= 0"]),
        ((4.0, 4), TypeError, ["n_positions", "int"]),
        ((4, "8"), TypeError, ["d_model", "int"]),
    ],
)
def test_sinusoidal_encoding_rejects_bad_input(args, error, words):
    with pytest.raises(error) as err:
        sinusoidal_encoding(*args)
    for w in words:
        assert w in str(err.value)


def test_sinusoidal_encoding_rejects_integer_dtype():
    with pytest.raises(TypeError, match="floating"):
        sinusoidal_encoding(3, 4, dtype=torch.int64)


def test_frequencies_run_from_one_down_to_base_to_the_minus_one_plus_2_over_d():
    w = frequencies(8)
    torch.testing.assert_close(w, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64))


# ----------------------------------------------------------------------------- offset rotation
@pytest.mark.parametrize("k", [1, 3, 17])
def test_shifting_the_position_is_a_fixed_rotation(k):
    pe = sinusoidal_encoding(60, 16, dtype=torch.float64)
    M = offset_rotation(k, 16)
    # PE[p + k] = M_k @ PE[p] for every p, with one matrix for all p.
    torch.testing.assert_close(pe[k:], pe[:-k] @ M.T, rtol=0, atol=1e-12)


def test_offset_rotation_is_orthogonal_block_diagonal_and_composes():
    M3, M4, M7 = (offset_rotation(k, 8) for k in (3, 4, 7))
    torch.testing.assert_close(M3 @ M3.T, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(M3 @ M4, M7)
    mask = torch.block_diag(*[torch.ones(2, 2)] * 4).bool()
    assert torch.all(M7[~mask] == 0)


def test_dot_product_of_encodings_depends_only_on_the_distance():
    pe = sinusoidal_encoding(80, 32, dtype=torch.float64)
    sim = pe @ pe.T  # (80, 80)
    for delta in (0, 1, 5, 30):
        diag = torch.diagonal(sim, offset=delta)
        torch.testing.assert_close(diag, diag[0].expand_as(diag))
    # sum over pairs of cos(delta * w_i): d/2 at distance 0
    assert sim[0, 0].item() == pytest.approx(16.0)


# ----------------------------------------------------------------------------- rope
def _rope_complex(x, positions, base=10000.0):
    """RoPE as complex multiplication: pair (2i, 2i+1) is the number x_2i + j x_2i+1."""
    d = x.shape[-1]
    theta = positions.double()[..., None] * base ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d
    )
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.exp(1j * theta)).reshape(x.shape)


@pytest.mark.parametrize("shape", [(5, 2), (1, 6), (2, 7, 8), (2, 3, 4, 16)])
def test_rope_is_complex_multiplication_by_e_to_the_i_theta(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    T = shape[-2]
    torch.testing.assert_close(rope(x), _rope_complex(x, torch.arange(T)))
    pos = torch.randint(0, 500, (T,), generator=g)
    torch.testing.assert_close(rope(x, pos, base=123.0), _rope_complex(x, pos, 123.0))


def test_rope_interleaved_equals_rotate_half_on_permuted_features():
    """RoPE on pairs (2i, 2i+1) is the GPT-NeoX 'rotate_half' RoPE on pairs (i, i + d/2)
    after moving even features to the first half and odd ones to the second."""
    g = torch.Generator().manual_seed(1)
    T, d = 9, 12
    x = torch.randn(2, T, d, generator=g, dtype=torch.float64)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    xh = x[..., perm]
    theta = torch.arange(T, dtype=torch.float64)[:, None] * frequencies(d)  # (T, d/2)
    cos, sin = theta.cos().repeat(1, 2), theta.sin().repeat(1, 2)
    x1, x2 = xh.chunk(2, dim=-1)
    neox = xh * cos + torch.cat([-x2, x1], dim=-1) * sin
    torch.testing.assert_close(rope(x)[..., perm], neox)


def test_rope_keeps_lengths_and_is_the_identity_at_position_zero():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 10, 8, generator=g, dtype=torch.float64)
    out = rope(x)
    pairs = lambda t: t.unflatten(-1, (4, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pairs(out), pairs(x))
    torch.testing.assert_close(out[:, 0], x[:, 0])
    torch.testing.assert_close(rope(x, torch.zeros(10)), x)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 3000),
    n=st.integers(0, 3000),
    shift=st.integers(-500, 5000),
    seed=st.integers(0, 2**16),
    half_d=st.integers(1, 16),
)
def test_rope_scores_depend_only_on_the_relative_offset(m, n, shift, seed, half_d):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 2 * half_d, generator=g, dtype=torch.float64)
    shift = max(shift, -min(m, n))  # keep positions >= 0

    def score(a, b):
        return (rope(q, torch.tensor([a])) * rope(k, torch.tensor([b]))).sum()

    torch.testing.assert_close(score(m + shift, n + shift), score(m, n), rtol=1e-9, atol=1e-9)


def test_rope_positions_default_to_arange_and_broadcast_per_sequence():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 6, generator=g)
    torch.testing.assert_close(rope(x), rope(x, torch.arange(5)))
    starts = torch.tensor([[0], [7]])  # (B, 1): sequence b starts at starts[b]
    out = rope(x, starts + torch.arange(5))  # positions (B, T)
    torch.testing.assert_close(out[1], rope(x[1], torch.arange(7, 12)))
    torch.testing.assert_close(out[0], rope(x[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rope_keeps_the_dtype_of_x(dtype):
    x = torch.randn(4, 8).to(dtype)
    out = rope(x, torch.arange(4) + 100)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(
        out.double(),
        _rope_complex(x, torch.arange(4) + 100),
        rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
        atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
    )


def test_rope_gradient_is_the_inverse_rotation():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rope(t, torch.tensor([0, 5, 40])), (x,))


@pytest.mark.parametrize(
    ("x", "positions", "base", "error", "words"),
    [
        (torch.randn(4, 7), None, 10000.0, ValueError, ["even", "(4, 7)"]),
        (torch.randn(8), None, 10000.0, ValueError, ["at least 2", "(8,)"]),
        (torch.randn(4, 8), torch.arange(5), 10000.0, ValueError, ["positions", "(5,)", "(4,)"]),
        (torch.randn(4, 8), torch.ones(4, dtype=torch.bool), 10000.0, TypeError, ["positions"]),
        (torch.randn(4, 8), [0, 1, 2, 3], 10000.0, TypeError, ["positions", "Tensor"]),
        (torch.randn(4, 8), None, 0.0, ValueError, ["base", "positive"]),
        (torch.arange(8).reshape(2, 4), None, 10000.0, TypeError, ["x", "floating"]),
    ],
)
def test_rope_rejects_bad_input(x, positions, base, error, words):
    with pytest.raises(error) as err:
        rope(x, positions, base)
    for w in words:
        assert w in str(err.value)


# ----------------------------------------------------------------------------- figures
def test_positional_figures_draw_on_given_axes():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention_ref.plots import plot_encoding, plot_encoding_dims, plot_similarity_by_distance

    pe = sinusoidal_encoding(30, 16)
    fig, axes = plt.subplots(1, 3)
    assert plot_encoding(pe, ax=axes[0]) is axes[0]
    assert plot_encoding_dims(pe, [0, 1, 6], ax=axes[1]) is axes[1]
    assert len(axes[1].lines) == 3
    assert plot_similarity_by_distance(pe, anchors=(0, 10), ax=axes[2]) is axes[2]
    assert len(axes[2].lines) == 2
    plt.close(fig)
