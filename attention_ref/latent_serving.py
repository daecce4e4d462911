"""Latent attention in serving (notebook 15): which form runs when, and what each costs.

Given the cached latents ``c_kv (B, n, r)`` and the shared rotary keys ``k_rope (B, n, d_R)``,
``t`` queries ``q_nope (B, H, t, d_nope)`` and ``q_rope (B, H, t, d_R)`` can attend in two
ways (:func:`attend_latent`):

- **explicit**: decompress every cached position's keys and values (``W_uk c`` and ``W_uv c``:
  ``2 n H r (d_nope + d_v)`` FLOPs), then ordinary attention whose heads are ``d_nope + d_R``
  wide for the scores and ``d_v`` for the values (``2 t n H (d_nope + d_R + d_v)``);
- **absorbed**: map each query into the latent space (``2 t H d_nope r``), attend over the
  latents themselves (``2 t n H (r + d_R)`` for the scores, ``2 t n H r`` for the values) and
  map the result out (``2 t H r d_v``).

FLOPs count a multiply-add as two and only the matrix products, the same ones PyTorch's
``torch.utils.flop_counter.FlopCounterMode`` counts (softmax and masking are a small share
of either form). In prefill (``t = n``) both pay ``2 H r (d_nope + d_v)`` per token once,
and the absorbed form's wider heads (``2 r + d_R`` against ``d_nope + d_R + d_v`` per key)
cost more; in decoding (``t = 1``) the explicit form decompresses the whole cache for one
token. Hence servers prefill in the explicit form and decode in the absorbed one.
"""

from __future__ import annotations

import math

import torch

from ._validate import require_tensor
from .latent_attention import absorbed_scores
from .masking import masked_softmax

FORMS = ("explicit", "absorbed")


def latent_attention_flops(
    t: int,
    n: int,
    *,
    n_heads: int,
    kv_lora_rank: int,
    d_nope: int,
    d_rope: int,
    d_v: int,
    form: str,
) -> int:
    """FLOPs of the matrix products with which ``t`` queries of one sequence attend to
    ``n`` cached positions (the module's doc has each term). Projections that both forms
    share (queries, latents, the output) are not counted."""
    for name, value in (("t", t), ("n", n), ("n_heads", n_heads), ("kv_lora_rank", kv_lora_rank),
                        ("d_nope", d_nope), ("d_rope", d_rope), ("d_v", d_v)):  # fmt: skip
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    H, r = n_heads, kv_lora_rank
    if form == "explicit":
        return 2 * n * H * r * (d_nope + d_v) + 2 * t * n * H * (d_nope + d_rope + d_v)
    if form == "absorbed":
        return 2 * t * H * r * (d_nope + d_v) + 2 * t * n * H * (2 * r + d_rope)
    raise ValueError(f"form must be one of {FORMS}; got {form!r}")


def attend_latent(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    c_kv: torch.Tensor,
    k_rope: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    *,
    form: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Latent attention's output before the output projection, ``(B, H, t, d_v)``, in either
    form (the two agree to round-off).

    Args:
        q_nope, q_rope: ``(B, H, t, d_nope)`` and the rotated ``(B, H, t, d_R)``.
        c_kv, k_rope: the cache, ``(B, n, r)`` and ``(B, n, d_R)``.
        w_uk, w_uv: ``(H, d_nope, r)`` and ``(H, d_v, r)``
            (:meth:`~attention_ref.latent_attention.MultiHeadLatentAttention.up_weights`).
        mask: optional bool, broadcastable to ``(B, H, t, n)``, True = may attend.
    """
    for name, x in (("q_nope", q_nope), ("q_rope", q_rope), ("c_kv", c_kv),
                    ("k_rope", k_rope), ("w_uk", w_uk), ("w_uv", w_uv)):  # fmt: skip
        require_tensor(name, x)
    if form == "explicit":
        k_nope = torch.einsum("bnr,hdr->bhnd", c_kv, w_uk)  # (B, H, n, d_nope): decompressed
        v = torch.einsum("bnr,hvr->bhnv", c_kv, w_uv)  # (B, H, n, d_v)
        scores = q_nope @ k_nope.transpose(-1, -2)  # (B, H, t, n)
        scores = scores + q_rope @ k_rope[:, None].transpose(-1, -2)  # the shared rotary key
        scores = scores * (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5
    elif form == "absorbed":
        scores = absorbed_scores(q_nope, q_rope, c_kv, k_rope, w_uk)  # (B, H, t, n)
    else:
        raise ValueError(f"form must be one of {FORMS}; got {form!r}")
    weights = scores.softmax(-1) if mask is None else masked_softmax(scores, mask)
    if form == "explicit":
        return weights @ v  # (B, H, t, d_v)
    out_latent = weights @ c_kv[:, None]  # (B, H, t, r): the values never decompressed
    return torch.einsum("bhtr,hvr->bhtv", out_latent, w_uv)  # (B, H, t, d_v)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature factor for a context stretched ``factor`` times:
    ``0.1 * mscale * ln(factor) + 1`` (1 when ``factor <= 1``). DeepSeek-V3's checkpoints
    (``rope_scaling``: YaRN, factor 40, ``mscale_all_dim`` 1) multiply the softmax scale by
    its square, in both forms."""
    if not factor > 0:
        raise ValueError(f"factor must be positive; got {factor!r}")
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


__all__ = ["FORMS", "attend_latent", "latent_attention_flops", "yarn_mscale"]
