"""The reference encoder (notebook 06) against nn.TransformerEncoderLayer, by properties,
and its errors on bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_ref import Encoder, EncoderLayer, FeedForward
from attention_ref.positional import sinusoidal_encoding

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def torch_layer(norm_first: bool, dtype=torch.float32, d_model=16, n_heads=4, d_ff=32, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        d_model, n_heads, d_ff, dropout=0.1, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped norm shows
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer.to(dtype).eval()


def padded_inputs(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, 16, generator=g, dtype=dtype)
    lengths = torch.tensor([7, 4, 1])
    real = torch.arange(7)[None, :] < lengths[:, None]  # (B, T) True at real tokens
    return x, real


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm_first", [False, True])
def test_from_torch_matches_transformer_encoder_layer_without_mask(norm_first, dtype):
    theirs = torch_layer(norm_first, dtype)
    ours = EncoderLayer.from_torch(theirs).eval()
    assert ours.norm_first == norm_first
    x, _ = padded_inputs(dtype)
    out, weights = ours(x)
    with torch.no_grad():
        expected = theirs(x)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    assert weights.shape == (3, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7, dtype=dtype))


@pytest.mark.parametrize("norm_first", [False, True])
def test_from_torch_matches_with_padding_mask_of_opposite_convention(norm_first):
    theirs = torch_layer(norm_first, torch.float64, seed=2)
    ours = EncoderLayer.from_torch(theirs).eval()
    x, real = padded_inputs(torch.float64)
    out, weights = ours(x, real[:, None, None, :])  # ours: True = may attend
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=~real)  # nn: True = ignore this key
    torch.testing.assert_close(out[real], expected[real], **TOL[torch.float64])
    assert torch.all(weights.masked_select(~real[:, None, None, :]) == 0)


def test_from_torch_follows_training_mode_and_rejects_other_layers():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    assert EncoderLayer.from_torch(layer).training
    assert not EncoderLayer.from_torch(layer.eval()).training
    with pytest.raises(ValueError, match="batch_first"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.raises(ValueError, match="relu"):
        EncoderLayer.from_torch(
            nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, activation="gelu")
        )
    with pytest.raises(TypeError, match="layer"):
        EncoderLayer.from_torch(nn.Linear(8, 8))


def test_feed_forward_is_relu_mlp_applied_per_position():
    torch.manual_seed(0)
    ff = FeedForward(6, 10)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    ff = ff.double()
    out = ff(x)
    expected = torch.relu(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T
    torch.testing.assert_close(out, expected + ff.linear2.bias)
    torch.testing.assert_close(ff(x[:, :, 2]), out[:, :, 2])  # each position on its own


def test_feed_forward_dropout_acts_in_training_only():
    torch.manual_seed(0)
    ff = FeedForward(8, 64, dropout=0.5)
    x = torch.randn(4, 8)
    assert ff.dropout.p == 0.5
    assert not torch.allclose(ff(x), ff(x))  # two dropout masks differ
    ff.eval()
    torch.testing.assert_close(ff(x), ff(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_padding_invariance(norm_first):
    torch.manual_seed(3)
    layer = EncoderLayer(16, 4, 32, norm_first=norm_first).double()
    x, real = padded_inputs(torch.float64, seed=4)
    mask = real[:, None, None, :]
    out, _ = layer(x, mask)
    noisy = torch.where(real[..., None], x, 100 * torch.randn_like(x))  # change padding only
    out2, _ = layer(noisy, mask)
    torch.testing.assert_close(out2[real], out[real])


def test_encoder_layer_without_mask_is_permutation_equivariant():
    torch.manual_seed(5)
    layer = EncoderLayer(8, 2, 16).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    perm = torch.randperm(6)
    torch.testing.assert_close(layer(x[:, perm])[0], layer(x)[0][:, perm])


def test_encoder_shapes_default_padding_mask_and_positions():
    torch.manual_seed(6)
    enc = Encoder(vocab_size=20, d_model=16, n_heads=4, d_ff=32, n_layers=3, pad_id=0).eval()
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 3, 0, 0, 0, 0]])
    memory, weights = enc(src)
    assert memory.shape == (2, 6, 16)
    assert len(weights) == 3 and all(w.shape == (2, 4, 6, 6) for w in weights)
    for w in weights:  # padded keys get no attention
        assert torch.all(w[0, :, :, 4:] == 0) and torch.all(w[1, :, :, 2:] == 0)
    x = enc.embed_tokens(src)
    expected = enc.embed(src) * math.sqrt(16) + sinusoidal_encoding(6, 16)
    torch.testing.assert_close(x, expected)
    assert isinstance(enc.final_norm, nn.Identity)
    assert isinstance(Encoder(20, 16, 4, 32, 1, norm_first=True).final_norm, nn.LayerNorm)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padding_invariance_and_explicit_mask(norm_first):
    torch.manual_seed(7)
    enc = Encoder(30, 16, 4, 32, 2, pad_id=0, norm_first=norm_first).eval()
    src = torch.tensor([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]])
    real = src != 0
    memory, _ = enc(src)
    other = src.masked_fill(~real, 13)  # change the padded ids; mask them explicitly
    memory2, _ = enc(other, real[:, None, None, :])
    torch.testing.assert_close(memory2[real], memory[real])
    torch.testing.assert_close(enc(src[1:])[0], memory[1:])  # batch rows are independent


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_transformer_encoder(norm_first):
    torch.manual_seed(10)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first)
    final = nn.LayerNorm(16) if norm_first else None
    theirs = nn.TransformerEncoder(layer, 2, norm=final, enable_nested_tensor=False).eval()
    enc = Encoder(20, 16, 4, 32, 2, norm_first=norm_first).eval()
    enc.layers = nn.ModuleList(EncoderLayer.from_torch(lay) for lay in theirs.layers)
    if norm_first:
        enc.final_norm.load_state_dict(final.state_dict())
    src = torch.tensor([[3, 4, 5, 6, 0], [7, 8, 9, 10, 11]])
    real = src != 0
    memory, _ = enc(src)
    with torch.no_grad():
        expected = theirs(enc.embed_tokens(src), src_key_padding_mask=~real)
    torch.testing.assert_close(memory[real], expected[real], **TOL[torch.float32])


def test_encoder_follows_dtype_and_device_float64():
    torch.manual_seed(8)
    enc = Encoder(12, 8, 2, 16, 2, max_len=10).double()
    memory, weights = enc(torch.randint(1, 12, (2, 10)))
    assert memory.dtype == torch.float64 and weights[0].dtype == torch.float64
    layer = EncoderLayer(8, 2, 16).double()
    out, w = layer(torch.randn(1, 3, 8, dtype=torch.float64))
    assert out.dtype == w.dtype == torch.float64
    if torch.cuda.is_available():
        cuda_mem, _ = enc.cuda()(torch.randint(1, 12, (2, 10), device="cuda"))
        assert cuda_mem.device.type == "cuda"


def test_encoder_bad_input_errors_name_the_argument_and_shapes():
    enc = Encoder(12, 8, 2, 16, 1, max_len=5)
    with pytest.raises(ValueError, match=r"src .*\(batch, seq\).*\(2, 3, 4\)"):
        enc(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"seq length 6 .*max_len is 5"):
        enc(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(TypeError, match=r"src .*integer.*float32"):
        enc(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        enc([[1, 2, 3]])
    layer = EncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, d_model=8\).*\(2, 3, 6\)"):
        layer(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"x must be .*\(3, 8\)"):
        layer(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"x must be \(\.\.\., d_model=8\)"):
        FeedForward(8, 16)(torch.randn(2, 7))


def test_plot_layer_heads_draws_one_map_per_layer_and_head():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention_ref.plots import plot_layer_heads, plot_per_layer

    torch.manual_seed(9)
    enc = Encoder(10, 8, 2, 16, 3).eval()
    _, weights = enc(torch.tensor([[1, 2, 3, 0]]))
    axes = plot_layer_heads(weights, ["a", "b", "c", "pad"])
    assert axes.shape == (3, 2)
    torch.testing.assert_close(
        torch.from_numpy(axes[2, 1].images[0].get_array().data), weights[2][0, 1]
    )
    with pytest.raises(ValueError, match="weights"):
        plot_layer_heads([torch.zeros(4, 4)])
    ax = plot_per_layer({"post-norm": [1.0, 2.0, 3.0]}, logy=True)
    assert len(ax.lines) == 1 and ax.get_yscale() == "log"
    plt.close("all")


# ----------------------------------------------------------------------------- dropout, embeddings
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_drops_attention_weights_in_training_like_pytorch(norm_first):
    theirs = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3, batch_first=True)
    assert theirs.self_attn.dropout == 0.3  # PyTorch uses the layer's dropout for attention
    ours = EncoderLayer.from_torch(theirs)
    assert ours.self_attn.attn_dropout.p == 0.3
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    _, w_train = ours.train()(x)
    _, w_eval = ours.eval()(x)
    assert (w_train == 0).any() and not torch.allclose(w_train, w_eval)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(2, 2, 6))
    assert EncoderLayer(8, 2, 16, dropout=0.2).self_attn.attn_dropout.p == 0.2


def test_encoder_embedding_follows_the_papers_scheme():
    """N(0, 1/d_model) times sqrt(d_model): scaled tokens have std ~1, like the positions."""
    torch.manual_seed(0)
    d = 64
    enc = Encoder(vocab_size=1000, d_model=d, n_heads=4, d_ff=16, n_layers=1)
    assert abs(enc.embed.weight.std().item() - d**-0.5) < 0.05 * d**-0.5
    src = torch.randint(0, 1000, (4, 50))
    with torch.no_grad():
        tokens = enc.embed(src) * d**0.5
    token_rms = tokens.pow(2).mean().sqrt().item()
    position_rms = enc.pe[:50].pow(2).mean().sqrt().item()
    assert 0.9 < token_rms < 1.1 and 0.65 < position_rms < 0.75


def test_with_layers_of_puts_the_learners_layers_in_with_the_same_weights():
    """Graded, notebook 06's encoders run the learner's EncoderLayer: the same model."""
    from attention_ref.encoder import Encoder, EncoderLayer, with_layers_of

    class Mine(EncoderLayer):
        pass

    torch.manual_seed(0)
    enc = Encoder(12, 8, 2, 16, n_layers=2, norm_first=True).eval()
    src = torch.tensor([[3, 4, 5, 0], [1, 2, 0, 0]])
    before, _ = enc(src)
    assert with_layers_of(enc, Mine) is enc
    assert all(type(layer) is Mine and layer.norm_first for layer in enc.layers)
    after, _ = enc(src)
    torch.testing.assert_close(after, before)
    with pytest.raises(TypeError, match="layers are an nn.ModuleList"):
        with_layers_of(nn.Linear(2, 2), Mine)
