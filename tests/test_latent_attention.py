"""Multi-head latent attention (notebook 15): the absorbed form equals the explicit one,
the cache holds only the latent and the rotary key, the cache bytes of MHA, GQA and MLA."""

from __future__ import annotations

import pytest
import torch

from attention_ref.checks import CheckFailure, check
from attention_ref.latent_attention import (
    MultiHeadLatentAttention,
    absorbed_scores,
    cache_bytes_table,
    cache_values_per_token,
)


def _mla(q_lora_rank: int | None = 12) -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(32, 4, kv_lora_rank=10, d_nope=6, d_rope=4, d_v=5,
                                   q_lora_rank=q_lora_rank)  # fmt: skip
    return mla.double().eval()


def _x(T: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("chunks", [[9], [4, 1, 1, 3], [1] * 9])
def test_the_absorbed_form_with_the_cache_equals_the_explicit_form(q_lora_rank, chunks):
    mla, x = _mla(q_lora_rank), _x()
    explicit = mla(x)[0]
    cache, outs, start = mla.new_cache(9), [], 0
    for t in chunks:
        outs.append(mla.step(x[:, start : start + t], cache))
        start += t
    torch.testing.assert_close(torch.cat(outs, 1), explicit, rtol=0, atol=1e-12)


def test_the_cache_holds_only_the_latent_and_the_rotary_key():
    mla, x = _mla(), _x()
    cache = mla.new_cache(9)
    mla.step(x, cache)
    assert cache.k.shape == (2, 1, 9, 10)  # c_kv: kv_lora_rank per token, no heads
    assert cache.v.shape == (2, 1, 9, 4)  # k_rope: d_rope per token, shared by the heads
    c_kv, k_rope = mla.latents(x, torch.arange(9))
    torch.testing.assert_close(cache.k[:, 0], c_kv)
    torch.testing.assert_close(cache.v[:, 0], k_rope)


def test_the_rotary_key_carries_the_positions():
    """Shifting every position by the same offset changes nothing (only differences of
    positions reach the scores); spreading them apart does."""
    mla, x = _mla(), _x()
    out = mla(x)[0]
    torch.testing.assert_close(mla(x, positions=torch.arange(9) + 5)[0], out)
    assert (mla(x, positions=torch.arange(9) * 2)[0] - out).abs().max() > 1e-6


def test_the_latent_is_normalised():
    mla, x = _mla(), _x()
    with torch.no_grad():
        mla.kv_a_layernorm.weight.fill_(1.0)
    c_kv, _ = mla.latents(x, torch.arange(9))
    torch.testing.assert_close(
        c_kv.pow(2).mean(-1), torch.ones(2, 9, dtype=torch.float64), atol=1e-4, rtol=0
    )  # fmt: skip (eps)


def test_absorbing_without_folding_w_uv_would_differ():
    """The absorbed step's output projection is W_o W_uv; W_o alone would not fit."""
    mla, x = _mla(), _x()
    W_uk, W_uv = mla.up_weights()
    assert W_uk.shape == (4, 6, 10) and W_uv.shape == (4, 5, 10)
    explicit = mla(x)[0]
    with torch.no_grad():
        mla.kv_b_proj.weight.view(4, 11, 10)[:, 6:] *= 2  # scale W_uv only
    assert (mla(x)[0] - explicit).abs().max() > 1e-3


def test_cache_bytes_per_token_mha_gqa_mla():
    """DeepSeek-V3's shape: 61 layers, 128 heads of 128, latent 512 + rotary key 64."""
    rows = cache_bytes_table(61, 128, 128, n_kv_heads=8, kv_lora_rank=512, d_rope=64)
    by = {r["attention"]: r for r in rows}
    assert by["MHA"]["bytes"] == 61 * 2 * 128 * 128 * 2
    assert by["GQA"]["bytes"] == 61 * 2 * 8 * 128 * 2
    assert by["MLA"]["bytes"] == 61 * 576 * 2  # 70,272 bytes per token
    assert by["MLA"]["vs_mha"] == pytest.approx(576 / 32768)
    assert cache_values_per_token(1, kv_lora_rank=10, d_rope=4) == 14


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="d_rope"):
        MultiHeadLatentAttention(32, 4, 10, 6, 3, 5)
    with pytest.raises(ValueError, match="d_model=32"):
        _mla()(torch.zeros(1, 3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="d_head"):
        cache_values_per_token(2, n_heads=4)


def test_padding_through_the_absorbed_cache_equals_the_masked_explicit_form():
    mla, x = _mla(), _x()
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, :3] = False  # left padding: its rows are fully masked at first
    explicit = mla(x, keep[:, None, None, :])[0]
    cache = mla.new_cache(9)
    got = torch.cat([mla.step(x[:, i : i + 1], cache, keep[:, i : i + 1]) for i in range(9)], 1)
    assert not got.isnan().any()
    torch.testing.assert_close(got[keep], explicit[keep], rtol=0, atol=1e-12)


def test_absorbed_scores_equal_the_scores_of_the_decompressed_keys():
    g = torch.Generator().manual_seed(2)
    q_nope, q_rope = (torch.randn(2, 3, 4, d, generator=g, dtype=torch.float64) for d in (6, 4))
    c_kv, k_rope = (torch.randn(2, 7, d, generator=g, dtype=torch.float64) for d in (10, 4))
    w_uk = torch.randn(3, 6, 10, generator=g, dtype=torch.float64)
    k_nope = torch.einsum("hnr,bjr->bhjn", w_uk, c_kv)  # (B, H, n, d_nope): decompressed
    q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, t, 10)
    k = torch.cat([k_nope, k_rope[:, None].expand(2, 3, 7, 4)], dim=-1)  # (B, H, n, 10)
    explicit = q @ k.transpose(-1, -2) / 10**0.5
    assert torch.allclose(absorbed_scores(q_nope, q_rope, c_kv, k_rope, w_uk), explicit)
    with pytest.raises(ValueError, match="w_uk"):
        absorbed_scores(q_nope, q_rope, c_kv, k_rope, w_uk.transpose(1, 2))


def test_the_check_refuses_a_scale_wrong_only_where_d_nope_equals_r():
    """Where d_nope = r the two scale mistakes give the same scores; the check waits for an
    input that tells them apart, and still refuses an answer wrong only there."""

    def wrong_only_where_square(q_nope, q_rope, c_kv, k_rope, w_uk):
        d_nope, r = q_nope.shape[-1], c_kv.shape[-1]
        width = d_nope if d_nope == r else d_nope + q_rope.shape[-1]
        q = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (B, H, t, r + d_rope)
        k = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, n, r + d_rope)
        return q @ k.transpose(-1, -2) / width**0.5

    with pytest.raises(CheckFailure, match="where d_nope = r, yet right on every other input"):
        check("absorbed_scores", wrong_only_where_square)


# ----------------------------------------------------------------------------- serving
def _attend_inputs(t: int, n: int, r: int = 12, device: str = "cpu"):
    g = torch.Generator().manual_seed(t * 100 + n)
    H, d_nope, d_rope, d_v = 3, 6, 4, 5

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g).to(device)

    return (rand(2, H, t, d_nope), rand(2, H, t, d_rope), rand(2, n, r), rand(2, n, d_rope),
            rand(H, d_nope, r), rand(H, d_v, r))  # fmt: skip


@pytest.mark.parametrize(("t", "n"), [(1, 7), (7, 7), (3, 11)])
def test_the_explicit_and_absorbed_forms_agree_with_and_without_a_mask(t, n):
    from attention_ref.latent_serving import attend_latent

    args = _attend_inputs(t, n)
    mask = torch.rand(t, n, generator=torch.Generator().manual_seed(0)) < 0.6
    mask[0] = False  # a query that sees nothing: zeros in both forms
    for m in (None, mask):
        explicit = attend_latent(*args, form="explicit", mask=m)
        absorbed = attend_latent(*args, form="absorbed", mask=m)
        assert explicit.shape == (2, 3, t, 5)
        torch.testing.assert_close(explicit, absorbed, rtol=0, atol=1e-12)
    assert (attend_latent(*args, form="absorbed", mask=mask)[:, :, 0] == 0).all()


def test_the_explicit_form_is_ordinary_attention_over_the_decompressed_keys():
    from attention_ref.attention import sdpa
    from attention_ref.latent_serving import attend_latent

    q_nope, q_rope, c_kv, k_rope, w_uk, w_uv = _attend_inputs(4, 9)
    k = torch.cat([torch.einsum("hdr,bnr->bhnd", w_uk, c_kv),
                   k_rope[:, None].expand(-1, 3, -1, -1)], dim=-1)  # fmt: skip
    v = torch.einsum("hvr,bnr->bhnv", w_uv, c_kv)
    expected, _ = sdpa(torch.cat([q_nope, q_rope], -1), k, v)
    got = attend_latent(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, form="explicit")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("t", "n", "r"), [(1, 7, 12), (7, 7, 12), (3, 11, 4)])
def test_the_flop_formulas_are_what_pytorch_counts(t, n, r):
    from torch.utils.flop_counter import FlopCounterMode

    from attention_ref.latent_serving import attend_latent, latent_attention_flops

    args = _attend_inputs(t, n, r)
    shape = dict(n_heads=3, kv_lora_rank=r, d_nope=6, d_rope=4, d_v=5)
    for form in ("explicit", "absorbed"):
        with FlopCounterMode(display=False) as counter:
            attend_latent(*args, form=form)
        # a batch of two sequences: twice one sequence's products
        assert counter.get_total_flops() == 2 * latent_attention_flops(t, n, form=form, **shape)


def test_prefill_favours_the_explicit_form_and_decoding_the_absorbed_one():
    from attention_ref.latent_serving import latent_attention_flops

    deepseek = dict(n_heads=128, kv_lora_rank=512, d_nope=128, d_rope=64, d_v=128)
    for n in (16, 1024, 131072):
        prefill = {
            f: latent_attention_flops(n, n, form=f, **deepseek) for f in ("explicit", "absorbed")
        }
        decode = {
            f: latent_attention_flops(1, n, form=f, **deepseek) for f in ("explicit", "absorbed")
        }
        assert prefill["explicit"] < prefill["absorbed"] < prefill["explicit"] * 1088 / 320
        assert decode["absorbed"] < decode["explicit"]


def test_yarn_mscale_and_bad_arguments_are_named():
    import math

    from attention_ref.latent_serving import attend_latent, latent_attention_flops, yarn_mscale

    assert yarn_mscale(1.0) == 1.0 and yarn_mscale(0.5) == 1.0
    assert yarn_mscale(40.0) == pytest.approx(1 + 0.1 * math.log(40))
    assert round(yarn_mscale(40.0) ** 2, 3) == 1.874
    with pytest.raises(ValueError, match="factor must be positive"):
        yarn_mscale(0.0)
    with pytest.raises(ValueError, match="form must be one of"):
        latent_attention_flops(1, 2, n_heads=1, kv_lora_rank=1, d_nope=1, d_rope=1, d_v=1, form="x")
    with pytest.raises(ValueError, match="n must be a positive int"):
        latent_attention_flops(1, 0, n_heads=1, kv_lora_rank=1, d_nope=1, d_rope=1, d_v=1,
                               form="explicit")  # fmt: skip
    with pytest.raises(ValueError, match="form must be one of"):
        attend_latent(*_attend_inputs(1, 2), form="mha")
    with pytest.raises(TypeError, match="c_kv"):
        q_nope, q_rope, _, k_rope, w_uk, w_uv = _attend_inputs(1, 2)
        attend_latent(q_nope, q_rope, [[0.0]], k_rope, w_uk, w_uv, form="explicit")
