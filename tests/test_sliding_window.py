"""Sliding-window attention (notebook 15): the window mask, the rolling cache against full
recomputation, the cache's bytes."""

from __future__ import annotations

import itertools

import pytest
import torch

from attention_ref import sliding_window as window_module
from attention_ref.sliding_window import (
    RollingKVCache,
    SinkAttention,
    SlidingWindowAttention,
    cache_bytes_as_text_grows,
    local_layers,
    mixed_layout_cache_bytes,
    rolling_append,
    rolling_cache_size,
    sliding_window_mask,
)


def test_a_query_sees_the_last_window_positions_itself_included():
    pos = torch.arange(6)
    mask = sliding_window_mask(pos, pos, 3)
    for i in range(6):
        for j in range(6):
            assert bool(mask[i, j]) == (i - 3 < j <= i), (i, j)
    assert mask.sum(-1).tolist() == [1, 2, 3, 3, 3, 3]


def test_no_window_is_causal_and_padding_excludes_keys():
    pos = torch.arange(4)
    assert torch.equal(sliding_window_mask(pos, pos, None), torch.ones(4, 4).tril().bool())
    keep = torch.tensor([[True, True, False, True]])
    mask = sliding_window_mask(pos, pos, 2, keep)  # (1, 1, 4, 4)
    assert mask.shape == (1, 1, 4, 4)
    assert not mask[0, 0, :, 2].any()
    assert mask[0, 0, 3].tolist() == [False, False, False, True]


def test_empty_slots_are_never_attended():
    mask = sliding_window_mask(torch.tensor([5]), torch.tensor([-1, 4, 5]), 4)
    assert mask.tolist() == [[False, True, True]]


def test_the_mask_equals_transformers_sliding_window_overlay():
    masking_utils = pytest.importorskip("transformers.masking_utils")
    overlay = masking_utils.sliding_window_overlay(4)
    pos = torch.arange(9)
    ours = sliding_window_mask(pos, pos, 4)
    theirs = torch.tensor([[bool(overlay(0, 0, i, j)) and j <= i for j in range(9)]
                           for i in range(9)])  # fmt: skip
    assert torch.equal(ours, theirs)


def _attention(window: int = 4) -> SlidingWindowAttention:
    torch.manual_seed(0)
    return SlidingWindowAttention(16, 4, 2, window=window, qk_norm=True).double().eval()


def _decode(attn, x, cache, chunks) -> torch.Tensor:
    outs, start = [], 0
    for t in chunks:
        outs.append(attn.step(x[:, start : start + t], cache))
        start += t
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("chunks", [[1] * 11, [5, 1, 1, 1, 3], [9, 2]])
def test_the_rolling_cache_equals_full_recomputation(chunks):
    attn = _attention(window=4)
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    full = attn(x)[0]
    cache = RollingKVCache(rolling_cache_size(4))
    got = _decode(attn, x, cache, chunks)
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    assert cache.k.shape[2] == 3  # window - 1 slots, however long the text
    assert sorted(cache.positions.tolist()) == [8, 9, 10]


def overwrites_the_newest(slots, positions, new, start):
    """A wrong ring buffer: once full, every position lands in the last slot."""
    size, t = slots.shape[-2], new.shape[-2]
    attend = torch.cat([slots, new], dim=-2)
    attend_positions = torch.cat([positions, torch.arange(start, start + t)])
    slots, positions = slots.clone(), positions.clone()
    for i in range(t):
        s = min(start + i, size - 1)
        slots[..., s, :] = new[..., i, :]
        positions[s] = start + i
    return attend, attend_positions, slots, positions


def test_a_cache_that_overwrites_its_newest_entry_differs(monkeypatch):
    attn = _attention(window=4)
    x = torch.randn(1, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = attn(x)[0]
    monkeypatch.setattr(window_module, "rolling_append", overwrites_the_newest)
    got = _decode(attn, x, RollingKVCache(3), [1] * 9)
    torch.testing.assert_close(got[:, :4], full[:, :4])  # the same until it is full
    assert (got[:, 5:] - full[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("t", [1, 2, 5, 7])
def test_rolling_append_keeps_the_last_size_positions_in_slot_p_mod_size(t):
    slots = torch.arange(10.0).view(1, 5, 2)  # (B, size=5, d=2)
    positions = torch.tensor([5, 6, 2, 3, 4])  # positions 2..6 seen
    new = -torch.arange(1.0, 2 * t + 1).view(1, t, 2)
    attend, attend_pos, got, got_pos = rolling_append(slots, positions, new, 7)
    assert torch.equal(attend, torch.cat([slots, new], 1))
    assert attend_pos.tolist() == [5, 6, 2, 3, 4, *range(7, 7 + t)]
    want = dict(zip(positions.tolist(), slots[0], strict=True))
    want.update({7 + i: new[0, i] for i in range(t)})
    for s in range(5):
        p = int(got_pos[s])
        assert p % 5 == s and p > 6 + t - 5 - 1 and torch.equal(got[0, s], want[p])
    assert torch.equal(slots, torch.arange(10.0).view(1, 5, 2))  # the inputs untouched


def test_the_window_matters_beyond_it():
    attn = _attention(window=4)
    x = torch.randn(1, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    windowed = attn(x)[0]
    attn.window = None
    full = attn(x)[0]
    torch.testing.assert_close(windowed[:, :4], full[:, :4])  # within the window: same
    assert (windowed[:, 4:] - full[:, 4:]).abs().max() > 1e-3


def test_padding_through_the_rolling_cache_equals_the_masked_forward():
    attn = _attention(window=3)
    x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, :3] = False  # left padding
    full = attn(x, keep[:, None, None, :])[0]
    cache = RollingKVCache(2)
    got = torch.cat([attn.step(x[:, i : i + 1], cache, keep[:, i : i + 1]) for i in range(8)], 1)
    torch.testing.assert_close(got[keep], full[keep], rtol=0, atol=1e-12)


def test_cache_bytes_stay_constant_while_a_full_cache_grows():
    rows = cache_bytes_as_text_grows([1, 100, 4096, 32768], window=4096, n_layers=32,
                                     n_kv_heads=8, d_head=128)  # fmt: skip
    per_token = 2 * 32 * 8 * 128 * 2  # Mistral 7B, 16-bit values: 128 KiB per token
    assert [r["full"] for r in rows] == [per_token * n for n in (1, 100, 4096, 32768)]
    assert [r["rolling"] for r in rows] == [per_token * n for n in (1, 100, 4095, 4095)]


def test_the_measured_cache_holds_what_the_table_says():
    attn = _attention(window=4).float()
    cache = RollingKVCache(rolling_cache_size(4))
    for _ in range(20):
        attn.step(torch.randn(1, 1, 16), cache)
    row = cache_bytes_as_text_grows([20], 4, 1, 2, attn.d_head, bytes_per_value=4)[0]
    assert cache.nbytes == row["rolling"]


def test_local_and_global_layers_are_placed_as_gemma_places_them():
    assert local_layers(4, 1) == [True, False, True, False]  # Gemma 2: they alternate
    gemma3 = local_layers(48, 5)  # Gemma 3: five local layers before each global one
    assert [i for i, local in enumerate(gemma3) if not local] == list(range(5, 48, 6))
    assert local_layers(3, 0) == [False] * 3  # every layer global


def test_a_mixed_layout_s_cache_grows_with_its_global_layers_only():
    lengths = [1, 1023, 1024, 4096, 131072]
    shape = dict(n_layers=48, n_kv_heads=8, d_head=256)  # Gemma 3 12B's, 16-bit values
    rows = mixed_layout_cache_bytes(lengths, local_per_global=5, window=1024, **shape)
    rolling = cache_bytes_as_text_grows(lengths, window=1024, **shape)
    for row, roll in zip(rows, rolling, strict=True):
        assert row["full"] == roll["full"]
        # 8 global layers hold every position, 40 local ones the last 1,023
        assert row["mixed"] * 48 == 8 * roll["full"] + 40 * roll["rolling"]
    assert rows[0]["mixed"] == rows[0]["full"] and rows[1]["mixed"] == rows[1]["full"]
    ratios = [r["mixed"] / r["full"] for r in rows[2:]]
    assert all(a > b > 1 / 6 for a, b in itertools.pairwise(ratios))  # toward 8 / 48, above
    same = mixed_layout_cache_bytes(lengths, local_per_global=0, window=1024, **shape)
    assert [r["mixed"] for r in same] == [r["full"] for r in same]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="local_per_global"):
        local_layers(4, -1)
    with pytest.raises(ValueError, match="n_layers"):
        mixed_layout_cache_bytes([8], 0, 1, 4, 1, 1)
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(torch.arange(3), torch.arange(3), 0)
    with pytest.raises(ValueError, match="size"):
        RollingKVCache(0)
    with pytest.raises(ValueError, match="keep must be"):
        RollingKVCache(2).append(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4),
                                 torch.ones(1, 3, dtype=torch.bool))  # fmt: skip


def test_a_sink_takes_its_share_of_each_row_and_a_masked_row_gives_zero():
    torch.manual_seed(0)
    attn = SinkAttention(16, 4, 2, window=3).double()
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    keep = torch.tensor([[False, True, True, True, True, True]])
    out, weights = attn(x, keep[:, None, None, :])
    q, k, v = attn.project(x, None)
    k = k.repeat_interleave(2, dim=1)
    s = (q @ k.transpose(-1, -2) / 2).masked_fill(~(torch.ones(6, 6).tril().bool()), -torch.inf)
    s = s.masked_fill(~torch.ones(6, 6).bool().triu(-2), -torch.inf)[:, :, 1:, 1:]
    expected = s.exp() / (s.exp().sum(-1, keepdim=True) + attn.sinks.exp().view(1, 4, 1, 1))
    torch.testing.assert_close(weights[:, :, 1:, 1:], expected)
    assert (weights.sum(-1)[:, :, 1:] < 1).all()
    assert (weights[:, :, 0] == 0).all() and (out[:, 0] == 0).all()  # no bias on w_o


def test_without_sinks_the_sink_attention_is_plain_attention():
    torch.manual_seed(0)
    attn = SinkAttention(16, 4, 2, window=3).double()
    plain = SlidingWindowAttention(16, 4, 2, window=3).double()
    plain.load_state_dict(attn.state_dict(), strict=False)
    with torch.no_grad():
        attn.sinks.fill_(-torch.inf)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    torch.testing.assert_close(attn(x)[0], plain(x)[0])
