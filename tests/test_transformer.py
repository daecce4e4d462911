"""The reference decoder layer and encoder-decoder Transformer (notebook 07): equivalence
with PyTorch's nn.TransformerDecoderLayer and nn.Transformer in both norm orders,
causality, padding invariance, teacher forcing, greedy decoding and bad-input errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attention_ref import (
    DecoderLayer,
    Transformer,
    TransformerCore,
    greedy_decode,
    shift_right,
    teacher_forcing_loss,
)
from attention_ref.decoder import Decoder, with_layers_of
from attention_ref.training import masked_cross_entropy
from attention_ref.transformer import (
    BOS,
    EOS,
    PAD,
    exact_match_rate,
    make_reversal_data,
    target_self_mask,
)
from attention_ref.weights import with_weights_of

D, H, F = 16, 4, 32


def _keep(B: int, S: int, lengths) -> torch.Tensor:
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)


def _causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


# ----------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch_decoder_layer(norm_first):
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(
        D, H, F, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()
    ours = DecoderLayer.from_torch(theirs)
    y = torch.randn(3, 5, D, dtype=torch.float64)
    memory = torch.randn(3, 7, D, dtype=torch.float64)
    keep = _keep(3, 7, [7, 4, 1])
    expected = theirs(y, memory, tgt_mask=~_causal(5), memory_key_padding_mask=~keep)
    out, w_self, w_cross = ours(y, memory, _causal(5), keep[:, None, None, :])
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    assert w_self.shape == (3, H, 5, 5) and w_cross.shape == (3, H, 5, 7)
    assert torch.all(w_self[..., ~_causal(5)] == 0)
    assert torch.all(w_cross.masked_select(~keep[:, None, None, :]) == 0)
    # without masks too
    torch.testing.assert_close(ours(y, memory)[0], theirs(y, memory), rtol=1e-10, atol=1e-12)


def test_decoder_layer_from_torch_float32_and_eval_mode():
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(D, 2, F, dropout=0.1, batch_first=True).eval()
    ours = DecoderLayer.from_torch(theirs)
    assert not ours.training and ours.dropout1.p == 0.1
    y, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    torch.testing.assert_close(ours(y, memory)[0], theirs(y, memory), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_core_matches_torch_transformer(norm_first):
    torch.manual_seed(2)
    theirs = nn.Transformer(
        D, H, 2, 3, F, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()
    ours = TransformerCore.from_torch(theirs)
    assert len(ours.encoder_layers) == 2 and len(ours.decoder_layers) == 3
    src = torch.randn(2, 7, D, dtype=torch.float64)
    tgt = torch.randn(2, 5, D, dtype=torch.float64)
    keep = _keep(2, 7, [7, 3])
    expected = theirs(
        src,
        tgt,
        tgt_mask=~_causal(5),
        src_key_padding_mask=~keep,
        memory_key_padding_mask=~keep,
    )
    got = ours(src, tgt, keep[:, None, None, :], _causal(5), keep[:, None, None, :])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_transformer_core_uses_both_final_norms():
    torch.manual_seed(3)
    theirs = nn.Transformer(D, H, 1, 1, F, dropout=0.0, batch_first=True).double()
    with torch.no_grad():
        theirs.decoder.norm.weight.mul_(3.0)
        theirs.encoder.norm.bias.add_(0.5)
    ours = TransformerCore.from_torch(theirs)
    src = torch.randn(2, 4, D, dtype=torch.float64)
    tgt = torch.randn(2, 3, D, dtype=torch.float64)
    torch.testing.assert_close(ours(src, tgt), theirs(src, tgt), rtol=1e-10, atol=1e-12)


def test_decoder_stack_is_the_layers_in_turn_then_its_norm():
    torch.manual_seed(4)
    dec = Decoder(D, H, F, n_layers=2, norm_first=True).double()
    y, memory = torch.randn(2, 3, D, dtype=torch.float64), torch.randn(2, 5, D, dtype=torch.float64)
    out, self_ws, cross_ws = dec(y, memory, _causal(3))
    h = y
    for layer in dec.layers:
        h = layer(h, memory, _causal(3))[0]
    torch.testing.assert_close(out, dec.final_norm(h))
    assert len(self_ws) == len(cross_ws) == 2 and isinstance(dec.final_norm, nn.LayerNorm)


# ----------------------------------------------------------------------------- properties
def _model(norm_first=False, seed=0) -> Transformer:
    torch.manual_seed(seed)
    return (
        Transformer(
            11, 13, d_model=D, n_heads=H, n_layers=2, d_ff=F, max_len=20, norm_first=norm_first
        )
        .double()
        .eval()
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_target_tokens_do_not_change_earlier_logits(norm_first):
    model = _model(norm_first)
    src = torch.tensor([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]])
    tgt = torch.tensor([[1, 4, 5, 6, 7, 8], [1, 9, 10, 11, 12, 3]])
    logits = model(src, tgt)
    for t in range(tgt.shape[1]):
        changed = tgt.clone()
        changed[:, t:] = torch.tensor([[9, 3, 12, 5, 7, 6][: 6 - t]] * 2)
        torch.testing.assert_close(model(src, changed)[:, :t], logits[:, :t])
    assert logits.shape == (2, 6, 13)


def test_source_padding_content_does_not_matter():
    model = _model()
    src = torch.tensor([[3, 4, 5, 0, 0], [7, 8, 9, 10, 6]])
    tgt = torch.tensor([[1, 4, 5], [1, 9, 10]])
    logits = model(src, tgt)
    # shorter and longer padding give the same logits for each sequence
    torch.testing.assert_close(model(src[:1, :3], tgt[:1]), logits[:1])
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded, tgt), logits)
    # a batch of one gives the same as the batch
    torch.testing.assert_close(model(src[1:], tgt[1:]), logits[1:])


def test_target_padding_does_not_change_real_positions():
    model = _model(norm_first=True)
    src = torch.tensor([[3, 4, 5, 6]])
    tgt = torch.tensor([[1, 4, 5]])
    padded = torch.tensor([[1, 4, 5, 0, 0]])
    torch.testing.assert_close(model(src, padded)[:, :3], model(src, tgt))


def test_decode_returns_attention_maps_with_masked_entries_zero():
    model = _model()
    src = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    tgt = torch.tensor([[1, 4, 0], [1, 6, 7]])
    memory, src_mask = model.encode(src)
    assert memory.shape == (2, 4, D) and src_mask.shape == (2, 1, 1, 4)
    logits, w = model.decode(tgt, memory, src_mask, return_weights=True)
    torch.testing.assert_close(logits, model(src, tgt))
    assert len(w["self"]) == len(w["cross"]) == 2
    assert w["self"][0].shape == (2, H, 3, 3) and w["cross"][1].shape == (2, H, 3, 4)
    assert torch.all(w["cross"][0][0, :, :, 3] == 0)  # source padding
    assert torch.all(w["self"][0][:, :, 0, 1:] == 0)  # causal
    assert torch.all(w["self"][1][0, :, 1:, 2] == 0)  # target padding as a key


def test_target_self_mask_is_causal_and_hides_padding():
    m = target_self_mask(torch.tensor([[1, 5, 0]]), pad_id=0)
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert m.shape == (1, 1, 3, 3) and torch.equal(m[0, 0], expected)


# ----------------------------------------------------------------------------- training
def test_shift_right_moves_along_the_sequence_dimension():
    tgt = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    assert torch.equal(shift_right(tgt, bos_id=1), torch.tensor([[1, 5, 6, 7], [1, 8, 2, 0]]))


def test_teacher_forcing_loss_ignores_padding():
    model = _model()
    src = torch.tensor([[3, 4, 5]])
    tgt = torch.tensor([[4, 5, 2]])
    loss = teacher_forcing_loss(model, src, tgt, BOS)
    tgt_padded = torch.tensor([[4, 5, 2, 0, 0]])
    torch.testing.assert_close(teacher_forcing_loss(model, src, tgt_padded, BOS), loss)
    logits = model(src, shift_right(tgt, BOS))
    manual = nn.functional.cross_entropy(logits[0], tgt[0])
    torch.testing.assert_close(loss, manual)
    assert torch.isclose(loss, masked_cross_entropy(logits, tgt, tgt != 0))


def test_a_tiny_model_learns_from_teacher_forcing():
    torch.manual_seed(0)
    src, tgt = make_reversal_data(256, n_symbols=4, min_len=2, max_len=4, seed=0)
    model = Transformer(7, 7, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(80):
        loss = teacher_forcing_loss(model, src, tgt, BOS)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.5 * losses[0]


# ----------------------------------------------------------------------------- decoding
class _Scripted(nn.Module):
    """A fake model whose decoder emits a fixed script per sequence (then EOS forever)."""

    pad_id = PAD

    def __init__(self, scripts):
        super().__init__()
        self.scripts = scripts
        self.calls = 0

    def encode(self, src):
        return src, None

    def decode(self, tgt_in, memory, src_mask):
        self.calls += 1
        B, T = tgt_in.shape
        logits = torch.zeros(B, T, 10)
        for b, script in enumerate(self.scripts):
            tok = script[T - 1] if len(script) > T - 1 else EOS
            logits[b, -1, tok] = 1.0
        return logits


def test_greedy_decode_stops_each_sequence_at_its_eos():
    model = _Scripted([[5, EOS, 7, 7], [6, 6, 6, EOS], [EOS]]).train()
    out = greedy_decode(model, torch.zeros(3, 2, dtype=torch.long), BOS, EOS, max_len=10)
    expected = torch.tensor([[5, EOS, PAD, PAD], [6, 6, 6, EOS], [EOS, PAD, PAD, PAD]])
    assert torch.equal(out, expected)
    assert model.calls == 4  # the loop stops once all are finished
    assert model.training  # the mode is restored


def test_greedy_decode_respects_max_len():
    model = _Scripted([[5, 6, 7, 8, 9]])
    out = greedy_decode(model, torch.zeros(1, 2, dtype=torch.long), BOS, EOS, max_len=3)
    assert torch.equal(out, torch.tensor([[5, 6, 7]]))


def test_greedy_decode_with_a_real_model_has_the_right_shape():
    model = _model()
    src = torch.tensor([[3, 4, 5], [6, 7, 0]])
    out = greedy_decode(model, src, BOS, EOS, max_len=6)
    assert out.dtype == torch.long and out.shape[0] == 2 and 1 <= out.shape[1] <= 6


def test_exact_match_rate_pads_before_comparing():
    pred = torch.tensor([[4, 2], [4, 5]])
    tgt = torch.tensor([[4, 2, 0], [4, 2, 0]])
    assert exact_match_rate(pred, tgt) == 0.5


def test_reversal_data_is_reversed_and_terminated():
    src, tgt = make_reversal_data(5, n_symbols=4, min_len=2, max_len=4, seed=1)
    for s, t in zip(src, tgt, strict=True):
        seq = s[s != PAD]
        L = len(seq)
        assert torch.equal(t[:L], seq.flip(0)) and t[L] == EOS and torch.all(t[L + 1 :] == PAD)
    c_src, c_tgt = make_reversal_data(5, 4, 2, 4, seed=1, task="copy")
    assert torch.equal(c_src, src)


# ----------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_clear_errors():
    layer = DecoderLayer(D, H, F)
    y, memory = torch.randn(2, 3, D), torch.randn(2, 5, D)
    with pytest.raises(ValueError, match=r"y must be .*d_model=16.*\(2, 3, 8\)"):
        layer(torch.randn(2, 3, 8), memory)
    with pytest.raises(ValueError, match=r"memory must be .*batch=2.*\(3, 5, 16\)"):
        layer(y, torch.randn(3, 5, D))
    with pytest.raises(TypeError, match="memory_mask must be a boolean"):
        layer(y, memory, memory_mask=torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match=r"self_mask of shape \(4, 4\)"):
        layer(y, memory, self_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="nn.TransformerDecoderLayer"):
        DecoderLayer.from_torch(nn.TransformerEncoderLayer(D, H, F, batch_first=True))
    with pytest.raises(ValueError, match="batch_first=True"):
        DecoderLayer.from_torch(nn.TransformerDecoderLayer(D, H, F))
    with pytest.raises(ValueError, match="ReLU"):
        DecoderLayer.from_torch(
            nn.TransformerDecoderLayer(D, H, F, batch_first=True, activation="gelu")
        )
    with pytest.raises(TypeError, match="nn.Transformer"):
        TransformerCore.from_torch(nn.Linear(2, 2))

    model = _model()
    with pytest.raises(TypeError, match="src must hold integer token ids"):
        model(torch.randn(2, 3), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tgt_in must be \(batch, seq\)"):
        model(torch.ones(2, 3, dtype=torch.long), torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match="same batch size"):
        model(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids from 1 to 11, outside the vocabulary 0 \.\. 10"):
        model(torch.tensor([[1, 11]]), torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len is 20"):
        model(torch.ones(1, 21, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len must be an int >= 1"):
        greedy_decode(model, torch.ones(1, 2, dtype=torch.long), BOS, EOS, max_len=0)
    with pytest.raises(ValueError, match="task must be"):
        make_reversal_data(3, task="sort")


def test_target_embedding_follows_the_papers_scheme_and_is_not_tied():
    torch.manual_seed(0)
    d = 32
    model = Transformer(50, 400, d_model=d)
    for emb in (model.encoder.embed, model.tgt_embed):
        assert abs(emb.weight.std().item() - d**-0.5) < 0.1 * d**-0.5
    assert model.out_proj.weight.data_ptr() != model.tgt_embed.weight.data_ptr()


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_drops_both_attention_maps_in_training(norm_first):
    theirs = nn.TransformerDecoderLayer(
        D, H, F, dropout=0.3, batch_first=True, norm_first=norm_first
    )
    ours = DecoderLayer.from_torch(theirs)
    assert ours.self_attn.attn_dropout.p == ours.cross_attn.attn_dropout.p == 0.3
    g = torch.Generator().manual_seed(0)
    y, memory = torch.randn(2, 5, D, generator=g), torch.randn(2, 6, D, generator=g)
    torch.manual_seed(0)
    _, ws, wc = ours.train()(y, memory, _causal(5))
    _, ws_eval, wc_eval = ours.eval()(y, memory, _causal(5))
    assert not torch.allclose(ws, ws_eval) and not torch.allclose(wc, wc_eval)
    with torch.no_grad():
        theirs.eval()
        expected = theirs(y, memory, tgt_mask=~_causal(5))
    torch.testing.assert_close(ours(y, memory, _causal(5))[0], expected, rtol=1e-5, atol=1e-5)


def test_with_layers_of_puts_the_learners_layers_in_holding_the_same_weights():
    class Mine(DecoderLayer):  # a learner's class: another class, the same computation
        pass

    torch.manual_seed(0)
    model = Transformer(11, 13, d_model=D, n_heads=H, n_layers=2, d_ff=F, norm_first=True)
    model.eval()
    src, tgt_in = torch.tensor([[3, 4, 5, PAD]]), torch.tensor([[BOS, 6, 7]])
    before = model(src, tgt_in)
    old = list(model.decoder_layers)
    assert with_layers_of(model, Mine) is model
    assert all(type(layer) is Mine for layer in model.decoder_layers)
    assert all(new is not o for new, o in zip(model.decoder_layers, old, strict=True))
    assert not model.decoder_layers[0].training  # the replaced layer's mode
    torch.testing.assert_close(model(src, tgt_in), before, rtol=0, atol=0)
    # a layer on its own is given back replaced
    layer = DecoderLayer(D, H, F, dropout=0.1, norm_first=True)
    mine = with_layers_of(layer, Mine)
    assert type(mine) is Mine and mine.norm_first and mine.dropout1.p == 0.1
    with pytest.raises(TypeError, match="nn.Module"):
        with_layers_of("a model", Mine)


def test_with_layers_of_builds_the_learners_layer_as_the_check_does_dropout_by_keyword():
    class KeywordsOnly(DecoderLayer):  # the spec's defaults, given only by keyword
        def __init__(self, d_model, n_heads, d_ff, *, dropout=0.1, norm_first=False):
            super().__init__(d_model, n_heads, d_ff, dropout, norm_first)

    layer = DecoderLayer(D, H, F, dropout=0.2, norm_first=True)
    mine = with_layers_of(layer, KeywordsOnly)
    assert type(mine) is KeywordsOnly and mine.norm_first and mine.dropout1.p == 0.2


def test_with_layers_of_leaves_the_model_whole_when_the_learners_layer_does_not_fit():
    class Stub(nn.Module):  # a stub left in the exercise: no parameters of the spec
        def __init__(self, *args, **kwargs):
            super().__init__()

    model = Transformer(11, 13, d_model=D, n_heads=H, n_layers=2, d_ff=F)
    with pytest.raises(ValueError):
        with_layers_of(model, Stub)
    assert all(type(layer) is DecoderLayer for layer in model.decoder_layers)


def test_with_layers_of_keeps_the_courses_earlier_parts_as_the_check_grades_the_layer():
    class OwnAttention(nn.Module):  # an earlier exercise written again, named otherwise
        def __init__(self, d_model):
            super().__init__()
            self.qkv = nn.Linear(d_model, 3 * d_model)

    class OwnParts(DecoderLayer):
        def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
            super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
            self.self_attn = OwnAttention(d_model)  # the check puts the course's in
            self.cross_attn = OwnAttention(d_model)

    torch.manual_seed(0)
    layer = DecoderLayer(D, H, F).double().eval()
    mine = with_layers_of(layer, OwnParts)
    assert type(mine) is OwnParts and type(mine.self_attn) is type(layer.self_attn)
    assert mine.self_attn is not layer.self_attn  # a copy: the reference is left alone
    y, memory = torch.randn(2, 3, D, dtype=torch.float64), torch.randn(2, 4, D, dtype=torch.float64)
    torch.testing.assert_close(mine(y, memory)[0], layer(y, memory)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="no submodule 'missing' to keep"):
        with_weights_of(layer, OwnParts, D, H, F, keep=("missing",))
