"""Checks for notebook 15 (the attention of today's open models): the functions
``sliding_window_mask``, ``rolling_append``, ``absorbed_scores``, ``route`` and
``load_balancing_loss``.

Each is compared with a model of the right computation and of realistic mistakes, on seeded
inputs: masks exactly (a window one too wide or too narrow, causality dropped, the padding
or the empty slots of a rolling cache ignored), the ring buffer of the rolling cache exactly
(the newest entry overwritten, a slot off by one, positions not recorded, the ring written
before it is read, the first of too many new entries kept), latent attention's absorbed
scores against the explicit form in float64 (the wrong scale, the rotary part dropped, the
up-projection transposed), the router's gates and choices
as one dense ``(tokens, experts)`` matrix (so the order of the chosen experts is free), in
float64 and float32, and the auxiliary loss in both dtypes (counts over the wrong axis, no
factor E, shares of the slots instead of the tokens).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import experts as ref_experts
from .. import latent_attention as ref_latent
from .. import sliding_window as ref_window
from ..trust.remote import autograd_grad
from ._core import Context, Mistake, exercise, warm_autograd
from .toolkit import TOL, dtype_name, expect_follows_device, expect_spec_defaults, normal

DTYPES = (torch.float64, torch.float32)


# ----------------------------------------------------------------------------- sliding_window_mask
def window_model(q, k, window, key_padding=None, mode: str = "correct") -> torch.Tensor:
    """What a (possibly mistaken) sliding-window mask returns."""
    q, k = q[:, None], k[None, :]
    causal = k <= q
    if mode in ("not_causal", "symmetric"):
        causal = torch.ones_like(causal)
    if mode == "symmetric" and window is not None:  # |q - k| < window
        causal = k < q + window
    allowed = causal if mode == "empty_slots" else causal & (k >= 0)
    if window is not None:
        edge = {"off_by_one_wide": window + 1, "off_by_one_narrow": window - 1}.get(mode, window)
        allowed = allowed & (k > q - edge)
    if key_padding is None:
        return allowed
    if mode == "padding_ignored":
        return allowed.expand(key_padding.shape[0], 1, *allowed.shape)
    return allowed & key_padding.bool()[:, None, None, :]


WINDOW_MISTAKES = [
    ("window_not_causal", "symmetric"),
    ("window_not_causal", "not_causal"),
    ("window_off_by_one_wide", "off_by_one_wide"),
    ("window_off_by_one_narrow", "off_by_one_narrow"),
    ("window_empty_slots_attended", "empty_slots"),
    ("window_padding_ignored", "padding_ignored"),
]


def _ring(size: int, seen: int) -> list[int]:
    """The positions a rolling cache of ``size`` slots holds after ``seen`` positions, in slot
    order (position p in slot p % size; -1: an empty slot)."""
    slots = [-1] * size
    for p in range(max(0, seen - size), seen):
        slots[p % size] = p
    return slots


def _window_cases(ctx: Context, rng: np.random.Generator) -> list[tuple]:
    # label, q positions, k positions, window, padding lengths (None: no key_padding)
    n = list(range(8))
    cases = [
        ("8 tokens, window=3", n, n, 3, None),
        ("6 tokens, window=None (plain causal)", n[:6], n[:6], None, None),
        ("one token, window=4", [0], [0], 4, None),
        ("5 tokens, window=1 (each query sees itself only)", n[:5], n[:5], 1, None),
        ("4 tokens, window=10 (wider than the text)", n[:4], n[:4], 10, None),
        (
            "decoding position 9 against a rolling cache of 4 slots then the new key, window=5",
            [9], [*_ring(4, 9), 9], 5, None,
        ),
        (
            "decoding position 2 against a rolling cache of 4 slots (two empty), window=5",
            [2], [*_ring(4, 2), 2], 5, None,
        ),
        ("batch of 3, key lengths (7, 4, 2), 7 tokens, window=3", n[:7], n[:7], 3, [7, 4, 2]),
        ("batch of 1, key length 3, 5 tokens, window=None", n[:5], n[:5], None, [3]),
        (
            "decoding position 2 against a cache of 5 slots (three empty), window=None",
            [2], [*_ring(5, 2), 2], None, None,
        ),
    ]  # fmt: skip
    if ctx.thorough:
        start = int(rng.integers(20, 60))
        cases += [
            (f"12 tokens from position {start}, window=5",
             list(range(start, start + 12)), list(range(start, start + 12)), 5, None),
            ("3 new tokens at 13..15 against a cache of 6 slots, window=7",
             [13, 14, 15], [*_ring(6, 13), 13, 14, 15], 7, None),
            ("batch of 2, key lengths (5, 9), 9 tokens, window=4", list(range(9)),
             list(range(9)), 4, [5, 9]),
            ("32 tokens, window=8", list(range(32)), list(range(32)), 8, None),
        ]  # fmt: skip
    return cases


@exercise(
    "sliding_window_mask",
    forbidden=lambda: [
        (ref_window.sliding_window_mask, "the reference attention_ref.sliding_window_mask")
    ],
    summary="True where q - window < k <= q, k not an empty slot, not padding",
)
def check_sliding_window_mask(candidate, ctx: Context) -> None:
    rng = ctx.rng(1501)
    for label, qp, kp, window, lengths in _window_cases(ctx, rng):
        q = torch.tensor(qp, dtype=torch.long)
        k = torch.tensor(kp, dtype=torch.long)
        args = [q, k, window]
        pad = None
        if lengths is not None:
            pad = torch.arange(len(kp))[None, :] < torch.tensor(lengths)[:, None]  # (B, n_k)
            args.append(pad)
        got = ctx.call(candidate, *args, case=label)
        expected = window_model(q, k, window, pad)
        if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
            ctx.fail(
                f"the mask must be boolean (True = may attend); got dtype {got.dtype}.",
                case=label,
                mistake="window_mask_not_boolean",
            )
        if pad is not None and isinstance(got, torch.Tensor) and got.shape == (len(qp), len(kp)):
            ctx.fail(
                f"with key_padding the mask has shape {tuple(got.shape)}, expected "
                f"{tuple(expected.shape)}.",
                case=label,
                mistake="window_padding_ignored",
            )
        ctx.expect_array(got, expected, what="the mask", case=label)
        mistakes = [
            Mistake.of(i, model=lambda m=m: window_model(q, k, window, pad, mode=m))
            for i, m in WINDOW_MISTAKES
        ]
        ctx.expect_close(got, expected, what="the mask", case=label, mistakes=mistakes,
                         rtol=0, atol=0)  # fmt: skip
    meta = torch.device("meta")
    q = torch.empty(5, dtype=torch.long, device=meta)
    pad = torch.empty(2, 5, dtype=torch.bool, device=meta)
    for window, extra, what in ((None, (), "5 tokens, window=None"),
                                (3, (pad,), "5 tokens, window=3, key_padding (2, 5)")):  # fmt: skip
        expect_follows_device(ctx, candidate, (q, q, window, *extra), ("the mask",),
                      "window_mask_wrong_device", what)  # fmt: skip


# ----------------------------------------------------------------------------- rolling_append
def ring_model(slots, positions, new, start: int, mode: str = "correct") -> tuple:
    """``(attend, attend_positions, slots, positions)`` of a (possibly mistaken) ring buffer
    that keeps position p in slot p % size, written one position at a time (the last write to
    a slot wins). The check compares them whatever the layout (:func:`canonical`)."""
    size, t = slots.shape[-2], new.shape[-2]
    ring, ring_pos = slots.clone(), positions.clone()
    chosen = range(min(t, size)) if mode == "first_new_kept" else range(t)
    for i in chosen:
        p = start + i
        slot = {"newest": min(p, size - 1), "entry_slot_plus": (p + 1) % size}.get(mode, p % size)
        ring[..., slot, :] = new[..., i, :]
        if mode == "entry_slot_plus":  # the entry one slot off, its position where it belongs
            ring_pos[p % size] = p
        elif mode != "positions_not_recorded":
            ring_pos[slot] = p
    read, read_pos = (ring, ring_pos) if mode == "written_first" else (slots, positions)
    new_pos = torch.arange(start, start + t, dtype=positions.dtype, device=positions.device)
    return torch.cat([read, new], dim=-2), torch.cat([read_pos, new_pos]), ring, ring_pos


def canonical(entries, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """A ring (or what the queries attend to) in a layout-free form, on the CPU: the positions
    sorted, the entries in the same order, an empty slot's entry (position < 0) zeroed (its
    content is never read). Two layouts of the same cache give the same form."""
    pos = positions.detach().cpu().long()
    order = torch.sort(pos, stable=True).indices
    entries = entries.detach().cpu()[..., order, :].clone()
    pos = pos[order]
    entries[..., pos < 0, :] = 0
    return entries, pos


def ring_expected(slots, positions, new, start: int) -> tuple:
    """What a correct cache returns, whatever the layout of the ring it is given: the ring
    as it was then the new entries, and a ring that keeps the last ``size`` positions."""
    size, t = slots.shape[-2], new.shape[-2]
    new_pos = torch.arange(start, start + t, dtype=positions.dtype, device=positions.device)
    attend, attend_pos = torch.cat([slots, new], dim=-2), torch.cat([positions, new_pos])
    order = torch.sort(attend_pos, stable=True).indices[-size:]  # the newest size (or empty)
    return attend, attend_pos, attend[..., order, :], attend_pos[order]


RING_MISTAKES = [
    ("ring_overwrites_newest", "newest"),
    ("ring_slot_off_by_one", "entry_slot_plus"),
    ("ring_positions_not_recorded", "positions_not_recorded"),
    ("ring_first_new_kept", "first_new_kept"),
    ("ring_written_before_read", "written_first"),
]
RING_OUTPUTS = ("attend", "attend_positions", "slots", "positions")


def _ring_cases(ctx: Context) -> list[tuple]:
    # label, leading dims, size, d, positions seen before, t new, dtype; a ring that has seen
    # positions is first filled by the candidate itself (its own layout), from an empty one
    f32, f64 = torch.float32, torch.float64
    cases = [
        ("an empty ring of 3 slots, one new position", (1, 1), 3, 2, 0, 1, f32),
        ("a ring of 3 slots holding positions 0..1, one new (position 2)", (2, 2), 3, 4, 2, 1,
         f64),
        ("a full ring of 3 slots (positions 4..6), one new (position 7)", (1, 2), 3, 2, 7, 1,
         f32),
        ("a full ring of 4 slots (positions 5..8), one new (position 9)", (2, 1), 4, 3, 9, 1,
         f64),
        ("a ring of 5 slots (positions 0..6 seen), 3 new at once (7..9)", (1, 2), 5, 2, 7, 3,
         f32),
        ("an empty ring of 3 slots, a prompt of 7 positions (more than the slots)", (2, 1), 3,
         2, 0, 7, f64),
        ("a ring of 4 slots (positions 3..6), 6 new (7..12)", (1, 1), 4, 2, 7, 6, f32),
        ("one slot (positions 0..3 seen), one new (position 4)", (1, 1), 1, 3, 4, 1, f64),
        ("a bool buffer (B, size, 1) as the cache keeps for its padding: 4 slots, 2 new",
         (2,), 4, 1, 5, 2, torch.bool),
    ]  # fmt: skip
    if ctx.thorough:
        cases += [
            ("a ring of 7 slots (positions 0..39 seen), one new (40)", (2, 3), 7, 4, 40, 1, f32),
            ("a ring of 6 slots (positions 0..12 seen), 13 new (13..25)", (1, 2), 6, 3, 13, 13,
             f64),
            ("a ring of 8 slots (positions 0..4 seen), 5 new (5..9)", (3, 2), 8, 2, 5, 5, f32),
        ]  # fmt: skip
    return cases


def _entries(rng, lead, n, d, dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.from_numpy(normal(rng, *lead, n, d) > 0)
    return torch.from_numpy(normal(rng, *lead, n, d)).to(dtype)


def _ring_step(ctx: Context, candidate, slots, positions, new, start: int, case: str) -> tuple:
    """Call the candidate on a ring (in whatever layout it returned last) and judge what came
    back in a layout-free form; returns the ring it wrote, for the next call."""
    size, t = slots.shape[-2], new.shape[-2]
    got = ctx.call(candidate, slots, positions, new, start, case=case)
    got = ctx.expect_tuple(got, RING_OUTPUTS, case=case)
    want = ring_expected(slots, positions, new, start)
    attend, attend_pos, _, ring_pos = got
    if (
        all(isinstance(g, torch.Tensor) for g in got)
        and attend.dim() == slots.dim()
        and attend.shape[-2] != size + t
        and attend_pos.dim() == 1
        and ring_pos.dim() == 1
        and sorted(p for p in attend_pos.tolist() if p >= 0)
        == sorted(p for p in ring_pos.tolist() if p >= 0)
    ):  # what the queries read is the ring after writing: Mistral's cache of W slots
        ctx.fail(
            f"attend has shape {tuple(attend.shape)} and holds the ring after writing; "
            f"expected {tuple(want[0].shape)}, the ring as it was then the new entries.",
            case=case,
            mistake="ring_new_entries_not_attended",
        )
    for name, g, w in zip(RING_OUTPUTS, got, want, strict=True):
        ctx.expect_array(g, w, what=name, case=case)
    models = {m: ring_model(slots, positions, new, start, m) for _, m in RING_MISTAKES}
    # the ring first (where a write went wrong), then what the queries attend to; positions
    # before entries, each in the layout-free form
    for entries, pos in ((2, 3), (0, 1)):
        mine = canonical(got[entries], got[pos])
        right = canonical(want[entries], want[pos])
        for i, what in ((1, RING_OUTPUTS[pos]), (0, f"{RING_OUTPUTS[entries]} (the entry "
                                                   "next to each position)")):  # fmt: skip
            mistakes = [
                Mistake.of(mid, model=lambda m=m, i=i, e=entries, p=pos: canonical(
                    models[m][e], models[m][p])[i])
                for mid, m in RING_MISTAKES
            ]  # fmt: skip
            ctx.expect_close(mine[i], right[i], what=what + ", sorted by position", case=case,
                             mistakes=mistakes, rtol=0, atol=0)  # fmt: skip
    return got[2].detach().clone(), got[3].detach().clone()


@exercise(
    "rolling_append",
    forbidden=lambda: [
        (ref_window.rolling_append, "the reference attention_ref.rolling_append"),
        (ref_window.RollingKVCache.append, "attention_ref's RollingKVCache.append"),
    ],
    summary="the ring as it was, then the new entries, attended; the ring keeps the last "
    "size positions, each entry next to its position (p % size, or any layout)",
)
def check_rolling_append(candidate, ctx: Context) -> None:
    rng = ctx.rng(1504)
    for label, lead, size, d, seen, t, dtype in _ring_cases(ctx):
        case = f"{label}, {dtype_name(dtype) if dtype.is_floating_point else 'bool'}"
        slots = torch.zeros(*lead, size, d, dtype=dtype)  # an empty ring: zeros, position -1
        positions = torch.full((size,), -1, dtype=torch.long)
        if seen:  # the ring as the candidate fills it: its own layout
            slots, positions = _ring_step(
                ctx, candidate, slots, positions, _entries(rng, lead, seen, d, dtype), 0,
                case=f"{case}: first, positions 0..{seen - 1} written into an empty ring "
                f"of {size} slots in one call",
            )  # fmt: skip
        _ring_step(ctx, candidate, slots, positions, _entries(rng, lead, t, d, dtype), seen,
                   case=case)  # fmt: skip
    _check_ring_device(ctx, candidate)


def _check_ring_device(ctx: Context, candidate) -> None:
    meta = torch.device("meta")
    slots, new = torch.empty(1, 3, 2, device=meta), torch.empty(1, 2, 2, device=meta)
    positions = torch.empty(3, dtype=torch.long, device=meta)
    expect_follows_device(ctx, candidate, (slots, positions, new, 3), RING_OUTPUTS,
                  "ring_positions_wrong_device",
                  "a ring of 3 slots (positions 0..2), 2 new (3..4)")  # fmt: skip


# ----------------------------------------------------------------------------- absorbed_scores
def scores_model(q_nope, q_rope, c_kv, k_rope, w_uk, mode: str = "correct") -> torch.Tensor:
    """What a (possibly mistaken) ``absorbed_scores`` returns, in float64, computed the
    explicit way (every head's key decompressed)."""
    qn, qr, c, kr, w = (t.double() for t in (q_nope, q_rope, c_kv, k_rope, w_uk))
    d_nope, d_rope, r = qn.shape[-1], qr.shape[-1], c.shape[-1]
    if mode == "w_uk_transposed":  # w_uk[h]^T in place of w_uk[h] (shapes agree if d_nope == r)
        w = w.transpose(-1, -2)
    k_nope = torch.einsum("hnr,bjr->bhjn", w, c)  # (B, H, n, d_nope): the keys decompressed
    nope = qn @ k_nope.transpose(-1, -2)  # (B, H, t, n)
    rotary = qr @ kr[:, None].transpose(-1, -2)  # (B, H, t, n): the shared rotary key
    width = {"scale_nope": d_nope, "scale_latent": r, "scale_latent_rope": r + d_rope,
             "no_scale": 1}.get(mode, d_nope + d_rope)  # fmt: skip
    return (nope if mode == "rope_dropped" else nope + rotary) * width**-0.5


SCORES_MISTAKES = [
    ("mla_scale_without_rope_dims", "scale_nope"),
    ("mla_scale_by_latent_width", "scale_latent"),
    ("mla_scale_by_latent_and_rope_width", "scale_latent_rope"),
    ("mla_scores_not_scaled", "no_scale"),
    ("mla_rotary_part_dropped", "rope_dropped"),
    ("mla_up_projection_transposed", "w_uk_transposed"),
]


def _scores_cases(ctx: Context) -> list[tuple]:
    # label, B, H, t new queries, n keys, d_nope, d_rope, r, input scale
    cases = [
        ("one new token against 6 cached, 2 heads, d_nope = r = 8", 1, 2, 1, 6, 8, 4, 8, 1.0),
        ("a prompt of 5 tokens against itself, batch 2, 3 heads, r = 12", 2, 3, 5, 5, 8, 4, 12,
         1.0),
        ("3 new tokens against 7, 4 heads, d_nope = 16, d_rope = 8, r = 6", 1, 4, 3, 7, 16, 8, 6,
         1.0),
        ("one token against itself, one head, r = 6", 1, 1, 1, 1, 4, 2, 6, 1.0),
    ]  # fmt: skip
    if ctx.thorough:
        cases += [
            ("2 new tokens against 20, 8 heads, d_nope = 24, d_rope = 8, r = 32", 2, 8, 2, 20, 24,
             8, 32, 1.0),
            ("large values, 2 heads, d_nope = r = 16", 1, 2, 4, 9, 16, 4, 16, 4.0),
        ]  # fmt: skip
    return cases


@exercise(
    "absorbed_scores",
    forbidden=lambda: [
        (ref_latent.absorbed_scores, "the reference attention_ref.absorbed_scores"),
        (ref_latent.MultiHeadLatentAttention.step, "attention_ref's MultiHeadLatentAttention"),
    ],
    summary="(w_uk^T q_nope) . c_kv + q_rope . k_rope, over sqrt(d_nope + d_rope)",
)
def check_absorbed_scores(candidate, ctx: Context) -> None:
    rng = ctx.rng(1505)
    deferred = None  # a case where the two scale mistakes agree and the scores matched both
    for label, B, H, t, n, d_nope, d_rope, r, scale in _scores_cases(ctx):
        inputs64 = [
            torch.from_numpy(normal(rng, *shape, scale=scale))
            for shape in ((B, H, t, d_nope), (B, H, t, d_rope), (B, n, r), (B, n, d_rope))
        ] + [torch.from_numpy(normal(rng, H, d_nope, r)) / r**0.5]
        modes = [(i, m) for i, m in SCORES_MISTAKES if m != "w_uk_transposed" or d_nope == r]
        for dtype in DTYPES:
            case = f"{label}, {dtype_name(dtype)}"
            inputs = [x.to(dtype) for x in inputs64]
            got = ctx.call(candidate, *[x.clone() for x in inputs], case=case)
            want = scores_model(*inputs)
            ctx.expect_array(got, inputs[0].new_zeros(B, H, t, n), what="the scores", case=case)
            if d_nope == r and deferred in (None, label):
                # 1/sqrt(d_nope) and 1/sqrt(r) are the same scale here: a later case (r !=
                # d_nope) names which of the two it is
                both = scores_model(*inputs, mode="scale_nope")
                if torch.allclose(got.detach().cpu().double(), both, **TOL[dtype]):
                    deferred = label
                    continue
            mistakes = [Mistake.of(i, model=lambda m=m: scores_model(*inputs, mode=m))
                        for i, m in modes]  # fmt: skip
            ctx.expect_close(got, want, what="the scores", case=case, mistakes=mistakes,
                             **TOL[dtype])  # fmt: skip
    if deferred is not None:
        ctx.fail(
            "the scores are scaled by 1/sqrt(d_nope) (= 1/sqrt(r) there) where d_nope = r, yet "
            "right on every other input.",
            case=deferred,
        )
    meta = torch.device("meta")
    shapes = ((1, 2, 3, 8), (1, 2, 3, 4), (1, 5, 6), (1, 5, 4), (2, 8, 6))
    expect_follows_device(ctx, candidate, tuple(torch.empty(*s, device=meta) for s in shapes),
                  ("the scores",), "mla_scores_wrong_device",
                  "3 new tokens against 5, 2 heads, d_nope = 8, d_rope = 4, r = 6")  # fmt: skip


# ----------------------------------------------------------------------------- route
def dense_gates(gates: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """``(N, E)``: each token's gate at each chosen expert, 0 elsewhere (order-free)."""
    out = torch.zeros(gates.shape[0], n_experts, dtype=torch.float64)
    return out.scatter_add(1, experts.long().cpu(), gates.detach().double().cpu())


def route_model(logits, top_k, router, norm_topk_prob=True, mode="correct"):
    """``(dense gates (N, E), probs (N, E))`` of a (possibly mistaken) router, in float64."""
    z = logits.double()
    axis = 0 if mode == "softmax_tokens" else -1
    probs = z.softmax(axis)
    if router == "gpt_oss" and mode != "not_renormalised":
        top, chosen = z.topk(top_k, dim=-1)
        gates = top.softmax(-1)
    else:
        gates, chosen = probs.topk(top_k, dim=-1)
        renorm = router == "mixtral" or norm_topk_prob
        if mode == "norm_ignored":
            renorm = True
        if mode == "not_renormalised":
            renorm = False
        if renorm:
            gates = gates / gates.sum(-1, keepdim=True)
    if mode == "softmax_tokens" and router == "gpt_oss":
        probs = z.softmax(0)
    return dense_gates(gates, chosen, z.shape[1]), probs


ROUTE_MISTAKES = [
    ("route_gates_not_renormalised", "not_renormalised"),
    ("route_norm_topk_prob_ignored", "norm_ignored"),
    ("route_softmax_over_tokens", "softmax_tokens"),
]


def _route_cases(ctx: Context) -> list[tuple]:
    # label, tokens N, experts E, top_k, router, norm_topk_prob (None: the default), scale
    cases = [
        ("mixtral: 10 tokens, 8 experts, top_k=2", 10, 8, 2, "mixtral", None, 1.0),
        ("qwen3: 7 tokens, 6 experts, top_k=3, norm_topk_prob=True", 7, 6, 3, "qwen3", True, 1.0),
        ("qwen3: 9 tokens, 8 experts, top_k=2, norm_topk_prob=False", 9, 8, 2, "qwen3", False,
         1.0),
        ("gpt_oss: 6 tokens, 4 experts, top_k=2", 6, 4, 2, "gpt_oss", None, 1.0),
        ("qwen3: 8 tokens, 6 experts, top_k=2, norm_topk_prob left at route's default (True)", 8, 6,
         2, "qwen3", None, 1.0),
        ("mixtral: 6 tokens, 4 experts, top_k=2, norm_topk_prob=False (mixtral renormalises "
         "whatever it says)", 6, 4, 2, "mixtral", False, 1.0),
        ("mixtral: one token, 4 experts, top_k=1", 1, 4, 1, "mixtral", None, 1.0),
        ("mixtral: 5 tokens, 3 experts, top_k=3 (every expert)", 5, 3, 3, "mixtral", None, 1.0),
        ("gpt_oss: large logits (about 50), 8 tokens, 8 experts, top_k=4", 8, 8, 4, "gpt_oss",
         None, 20.0),
    ]  # fmt: skip
    if ctx.thorough:
        cases += [
            ("mixtral: 64 tokens, 16 experts, top_k=2", 64, 16, 2, "mixtral", None, 2.0),
            ("qwen3: 33 tokens, 12 experts, top_k=4, norm_topk_prob=False", 33, 12, 4, "qwen3",
             False, 1.0),
            ("gpt_oss: 40 tokens, 32 experts, top_k=4", 40, 32, 4, "gpt_oss", None, 3.0),
        ]  # fmt: skip
    return cases


def _expect_experts(ctx: Context, experts, N: int, top_k: int, E: int, case: str) -> None:
    if not isinstance(experts, torch.Tensor):
        ctx.fail(f"experts must be a torch.Tensor; got {type(experts).__name__}.", case=case,
                 mistake="wrong_type")  # fmt: skip
    if tuple(experts.shape) != (N, top_k):
        ctx.fail(f"experts has shape {tuple(experts.shape)}, expected {(N, top_k)}.", case=case,
                 mistake="wrong_shape")  # fmt: skip
    if experts.dtype.is_floating_point or experts.dtype == torch.bool:
        ctx.fail(f"experts must hold integer indices (torch.long); got dtype {experts.dtype}.",
                 case=case, mistake="route_experts_not_indices")  # fmt: skip
    e = experts.long().cpu()
    if bool(((e < 0) | (e >= E)).any()):
        ctx.fail(f"experts holds indices outside 0..{E - 1}.", case=case,
                 mistake="route_experts_not_indices")  # fmt: skip
    if top_k > 1 and bool((e.sort(-1).values.diff(dim=-1) == 0).any()):
        ctx.fail("a token chose the same expert twice: its top_k experts must be distinct.",
                 case=case, mistake="route_experts_not_indices")  # fmt: skip


@exercise(
    "route",
    forbidden=lambda: [(ref_experts.route, "the reference attention_ref.route")],
    summary="top-k gates from the router's logits, as Mixtral, Qwen3-MoE and GPT-OSS do",
)
def check_route(candidate, ctx: Context) -> None:
    rng = ctx.rng(1502)
    # Real routers take the softmax in float32 whatever the logits' dtype (transformers'
    # Mixtral and Qwen3-MoE, Mistral's moe.py, DBRX, Megatron: softmax(..., dtype=float32),
    # then cast back), and the spec allows it: float32's accuracy in both dtypes.
    tol = TOL[torch.float32]
    for label, N, E, top_k, router, norm, scale in _route_cases(ctx):
        z64 = torch.from_numpy(normal(rng, N, E, scale=scale))
        for dtype in DTYPES:
            case = f"{label}, {dtype_name(dtype)}"
            z = z64.to(dtype)
            kwargs = {} if norm is None else {"norm_topk_prob": norm}
            got = ctx.call(candidate, z, top_k, router, case=case, **kwargs)
            gates, experts, probs = ctx.expect_tuple(got, ("gates", "experts", "probs"),
                                                     case=case)  # fmt: skip
            ctx.expect_array(gates, z.new_zeros(N, top_k), what="gates", case=case)
            ctx.expect_array(probs, z.new_zeros(N, E), what="probs", case=case)
            _expect_experts(ctx, experts, N, top_k, E, case)
            dense, want_probs = route_model(z, top_k, router, norm is not False)
            models = {m: route_model(z, top_k, router, norm is not False, mode=m)
                      for _, m in ROUTE_MISTAKES}  # fmt: skip
            mistakes = [Mistake.of(i, model=lambda m=m: models[m][0]) for i, m in ROUTE_MISTAKES]
            ctx.expect_close(dense_gates(gates, experts, E), dense,
                             what="the gates (each token's gate at each chosen expert)",
                             case=case, mistakes=mistakes, **tol)  # fmt: skip
            mistakes = [Mistake.of("route_softmax_over_tokens",
                                   model=lambda: models["softmax_tokens"][1])]  # fmt: skip
            ctx.expect_close(probs, want_probs, what="probs", case=case, mistakes=mistakes,
                             **tol)  # fmt: skip
    z = torch.from_numpy(normal(rng, 5, 4))
    for given, defaults in (  # norm_topk_prob=False tells "mixtral" from "qwen3"
        ({}, {"router": "mixtral", "norm_topk_prob": True}),
        ({"norm_topk_prob": False}, {"router": "mixtral"}),
        ({"router": "qwen3"}, {"norm_topk_prob": True}),
    ):
        expect_spec_defaults(
            ctx,
            candidate,
            lambda: (z.clone(), 2),
            defaults,
            case="logits (5, 4) float64, top_k=2"
            + "".join(f", {k}={v!r}" for k, v in given.items())
            + f", {' and '.join(defaults)} left out",
            signature='route(logits, top_k, router="mixtral", *, norm_topk_prob=True)',
            kwargs=lambda given=given: dict(given),
        )
    logits = torch.empty(6, 4, device="meta")
    for router, kwargs in (("mixtral", {}), ("qwen3", {"norm_topk_prob": False}),
                           ("gpt_oss", {})):  # fmt: skip
        expect_follows_device(ctx, candidate, (logits, 2, router), ("gates", "experts", "probs"),
                      "route_wrong_device", f"{router}: 6 tokens, 4 experts, top_k=2",
                      **kwargs)  # fmt: skip


# ----------------------------------------------------------------------------- deepseek_route
def deepseek_model(logits, bias, top_k, n_group=1, topk_group=1, scale=1.0, mode="correct"):
    """``(dense gates (N, E), scores (N, E))`` of DeepSeek-V3's router, or of a mistaken
    version of it, in float64."""
    z, b = logits.double().cpu(), bias.double().cpu()
    N, E = z.shape
    scores = z.softmax(-1) if mode == "softmax" else z.sigmoid()
    choice = scores if mode == "bias_ignored" else scores + b
    grouped = (scores if mode == "groups_unbiased" else choice).view(N, n_group, E // n_group)
    if mode == "group_max":
        group_score = grouped.max(-1).values
    else:
        group_score = grouped.topk(min(2, E // n_group), dim=-1).values.sum(-1)
    best = group_score.topk(topk_group, dim=-1).indices
    eligible = torch.zeros(N, n_group, dtype=torch.bool).scatter(1, best, True)
    eligible = eligible[:, :, None].expand(N, n_group, E // n_group).reshape(N, E)
    if mode == "no_group_limit":
        eligible = torch.ones(N, E, dtype=torch.bool)
    fill = 0.0 if mode == "masked_with_zero" else float("-inf")
    chosen = choice.masked_fill(~eligible, fill).topk(top_k, dim=-1).indices
    gates = (choice if mode == "gates_biased" else scores).gather(1, chosen)
    if mode != "not_normalised":
        gates = gates / gates.sum(-1, keepdim=True)
    if mode != "scale_missing":
        gates = gates * scale
    return dense_gates(gates, chosen, E), scores


DEEPSEEK_MISTAKES = [
    ("deepseek_gates_include_bias", "gates_biased"),
    ("deepseek_softmax_scores", "softmax"),
    ("deepseek_bias_ignored", "bias_ignored"),
    ("deepseek_group_score_max", "group_max"),
    ("deepseek_groups_scored_without_bias", "groups_unbiased"),
    ("deepseek_groups_masked_with_zero", "masked_with_zero"),
    ("deepseek_no_group_limit", "no_group_limit"),
    ("deepseek_gates_not_normalised", "not_normalised"),
    ("deepseek_scaling_factor_missing", "scale_missing"),
]


def _deepseek_cases(ctx: Context) -> list[tuple]:
    # label, tokens N, experts E, top_k, n_group, topk_group, routed_scaling_factor, bias kind
    cases = [
        ("10 tokens, 8 experts, top_k=2, no groups", 10, 8, 2, 1, 1, 1.0, "random"),
        ("9 tokens, 8 experts in 4 groups, topk_group=2, top_k=3, routed_scaling_factor=2.5",
         9, 8, 3, 4, 2, 2.5, "random"),
        ("12 tokens, 12 experts in 3 groups, topk_group=1, top_k=2", 12, 12, 2, 3, 1, 1.0,
         "random"),
        ("8 tokens, 8 experts in 4 groups, topk_group=2, top_k=4, every bias -1 (each eligible "
         "s + b below 0)", 8, 8, 4, 4, 2, 1.0, "negative"),
        ("6 tokens, 8 experts in 4 groups, topk_group=2, top_k=2, bias 0", 6, 8, 2, 4, 2, 1.0,
         "zero"),
        ("one token, 4 experts in 4 groups of one, topk_group=3, top_k=3", 1, 4, 3, 4, 3, 1.0,
         "random"),
    ]  # fmt: skip
    if ctx.thorough:
        cases += [
            ("64 tokens, 32 experts in 8 groups, topk_group=4, top_k=8, routed_scaling_factor="
             "2.5 (DeepSeek-V3's proportions)", 64, 32, 8, 8, 4, 2.5, "random"),
            ("20 tokens, 16 experts in 4 groups, topk_group=2, top_k=4, a bias around -0.5",
             20, 16, 4, 4, 2, 1.0, "negative_mixed"),
        ]  # fmt: skip
    return cases


def _deepseek_bias(rng: np.random.Generator, E: int, kind: str) -> torch.Tensor:
    if kind == "zero":
        return torch.zeros(E, dtype=torch.float64)
    if kind == "negative":
        return torch.full((E,), -1.0, dtype=torch.float64)
    scale, shift = (0.3, -0.5) if kind == "negative_mixed" else (0.3, 0.0)
    return torch.from_numpy(normal(rng, E, scale=scale)) + shift


@exercise(
    "deepseek_route",
    forbidden=lambda: [
        (ref_experts.deepseek_route, "the reference attention_ref.deepseek_route"),
        (ref_experts.route, "the reference attention_ref.route"),
        # transformers' port of the router, which notebook 15's DeepSeek-V3 runs in its
        # kernel: the answer wherever every eligible expert has s + b > 0
        (ref_experts.deepseek_port_route, "attention_ref.experts.deepseek_port_route"),
    ],
    summary="DeepSeek-V3's router: sigmoid scores, a selection bias, group-limited top-k",
)
def check_deepseek_route(candidate, ctx: Context) -> None:
    rng = ctx.rng(1504)
    tol = TOL[torch.float32]  # a sigmoid in float32, cast back, is allowed (as for route)
    for label, N, E, top_k, n_group, topk_group, scale, kind in _deepseek_cases(ctx):
        z64 = torch.from_numpy(normal(rng, N, E, scale=1.5))
        b64 = _deepseek_bias(rng, E, kind)
        for dtype in DTYPES:
            case = f"{label}, {dtype_name(dtype)}"
            z, b = z64.to(dtype), b64.to(dtype)
            got = ctx.call(candidate, z, b, top_k, case=case, n_group=n_group,
                           topk_group=topk_group, routed_scaling_factor=scale)  # fmt: skip
            gates, experts, scores = ctx.expect_tuple(got, ("gates", "experts", "scores"),
                                                      case=case)  # fmt: skip
            ctx.expect_array(gates, z.new_zeros(N, top_k), what="gates", case=case)
            ctx.expect_array(scores, z.new_zeros(N, E), what="scores", case=case)
            _expect_experts(ctx, experts, N, top_k, E, case)
            args = (z, b, top_k, n_group, topk_group, scale)
            dense, want_scores = deepseek_model(*args)
            models = {m: deepseek_model(*args, mode=m) for _, m in DEEPSEEK_MISTAKES}
            mistakes = [Mistake.of(i, model=lambda m=m: models[m][0]) for i, m in DEEPSEEK_MISTAKES]
            ctx.expect_close(dense_gates(gates, experts, E), dense,
                             what="the gates (each token's gate at each chosen expert)",
                             case=case, mistakes=mistakes, **tol)  # fmt: skip
            mistakes = [Mistake.of("deepseek_softmax_scores", model=lambda: models["softmax"][1])]
            ctx.expect_close(scores, want_scores, what="scores", case=case, mistakes=mistakes,
                             **tol)  # fmt: skip
    z, b = torch.from_numpy(normal(rng, 6, 8)), torch.from_numpy(normal(rng, 8, scale=0.3))
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (z.clone(), b.clone(), 2),
        {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0},
        case="logits (6, 8) float64, bias (8,), top_k=2, the keywords left out",
        signature="deepseek_route(logits, bias, top_k, *, n_group=1, topk_group=1, "
        "routed_scaling_factor=1.0)",
    )
    meta = torch.device("meta")
    expect_follows_device(ctx, candidate, (torch.empty(6, 8, device=meta),
                          torch.empty(8, device=meta), 3), ("gates", "experts", "scores"),
                          "route_wrong_device", "6 tokens, 8 experts in 4 groups, top_k=3",
                          n_group=4, topk_group=2)  # fmt: skip


# ----------------------------------------------------------------------------- load_balancing_loss
def balance_model(probs, experts, mode: str = "correct") -> torch.Tensor:
    """E * sum_i f_i * P_i (or what a mistaken version computes), in float64."""
    p = probs.double()
    N, E = p.shape
    counts = torch.zeros(E, dtype=torch.float64).index_add_(
        0, experts.flatten().long(), torch.ones(experts.numel(), dtype=torch.float64)
    )
    f = counts / N
    P = p.mean(0)
    if mode == "slots":
        f = counts / experts.numel()
    if mode == "first_choice":  # DeepSpeed's top-2 loss: the first choices counted only
        f = (
            torch.zeros(E, dtype=torch.float64).index_add_(
                0, experts[:, 0].long(), torch.ones(N, dtype=torch.float64)
            )
            / N
        )
    if mode == "no_E":
        return (f * P).sum()
    if mode == "wrong_axis":  # P averaged over the experts of each token: (N, 1)
        return E * (f[None, :] * p.mean(1, keepdim=True)).sum()
    if mode == "wrong_axis_mean":
        # transformers 4.36's Mixtral loss: the gates averaged over each token's k experts
        # (1/k), one-hot counts averaged over the k slots, a mean over (N, E) times E^2: E/k
        return torch.tensor(E / experts.shape[1], dtype=torch.float64)
    if mode in ("chosen_only", "chosen_renormalised"):
        chosen = torch.zeros_like(p).scatter_(1, experts.long(), 1.0)
        P = p * chosen
        if mode == "chosen_renormalised":  # MaxText's top-k gates in place of the softmax
            P = P / P.sum(-1, keepdim=True)
        P = P.mean(0)
    return E * (f * P).sum()


BALANCE_MISTAKES = [
    ("aux_loss_wrong_axis", "wrong_axis"),
    ("aux_loss_wrong_axis", "wrong_axis_mean"),
    ("aux_loss_fraction_of_slots", "slots"),
    ("aux_loss_first_choice_only", "first_choice"),
    ("aux_loss_missing_num_experts", "no_E"),
    ("aux_loss_probs_of_chosen_only", "chosen_only"),
    ("aux_loss_probs_of_chosen_only", "chosen_renormalised"),
]
#: A scalar is one number: a mistake is named only when its model gives what came back to
#: the precision of a correct computation in that dtype, not to the diagnosis's usual 1e-3
#: (DeepSpeed's first-choice loss once came within 8e-4 of the shares-of-slots model).
SCALAR_MATCH = {torch.float64: 1e-9, torch.float32: 1e-5}


def _scalar_mistake(mistake_id: str, model, dtype) -> Mistake:
    rtol = SCALAR_MATCH[dtype]

    def applies(got: np.ndarray, expected: np.ndarray) -> bool:
        pred = model().detach().double().numpy()
        return bool(np.allclose(got, pred, rtol=rtol, atol=0)
                    and not np.allclose(pred, expected, rtol=rtol, atol=0))  # fmt: skip

    return Mistake.of(mistake_id, applies=applies)


def _balance_cases(ctx: Context) -> list[tuple]:
    # label, tokens N, experts E, top_k, logit scale, how the experts are chosen
    cases = [
        ("12 tokens, 8 experts, top_k=2", 12, 8, 2, 1.0, "top"),
        ("one token, 4 experts, top_k=1", 1, 4, 1, 1.0, "top"),
        ("16 tokens, 4 experts, top_k=1, a skewed router", 16, 4, 1, 3.0, "top"),
        ("10 tokens, 6 experts, top_k=3, experts drawn at random", 10, 6, 3, 1.0, "random"),
        ("5 tokens, 3 experts, top_k=3 (every expert)", 5, 3, 3, 1.0, "top"),
    ]
    if ctx.thorough:
        cases += [
            ("128 tokens, 16 experts, top_k=4", 128, 16, 4, 2.0, "top"),
            ("40 tokens, 8 experts, top_k=2, experts drawn at random", 40, 8, 2, 1.0, "random"),
        ]
    return cases


@exercise(
    "load_balancing_loss",
    forbidden=lambda: [
        (ref_experts.load_balancing_loss, "the reference attention_ref.load_balancing_loss")
    ],
    summary="the Switch Transformer's E * sum_i f_i * P_i",
)
def check_load_balancing_loss(candidate, ctx: Context) -> None:
    rng = ctx.rng(1503)
    for label, N, E, top_k, scale, how in _balance_cases(ctx):
        probs64 = torch.from_numpy(normal(rng, N, E, scale=scale)).softmax(-1)
        if how == "top":
            experts = probs64.topk(top_k, dim=-1).indices
        else:
            experts = torch.from_numpy(np.stack([rng.permutation(E)[:top_k] for _ in range(N)]))
        for dtype in DTYPES:
            case = f"{label}, probs {dtype_name(dtype)}"
            probs = probs64.to(dtype)
            got = ctx.call(candidate, probs, experts.clone(), case=case)
            expected = balance_model(probs, experts)
            ctx.expect_array(got, probs.new_zeros(()), what="the loss", case=case)
            mistakes = [
                _scalar_mistake(i, lambda m=m: balance_model(probs, experts, m), dtype)
                for i, m in BALANCE_MISTAKES
            ]
            ctx.expect_close(got, expected, what="the loss", case=case, mistakes=mistakes,
                             **TOL[dtype])  # fmt: skip
        _expect_gradient(candidate, ctx, probs64, experts, label)
    meta = torch.device("meta")
    expect_follows_device(ctx, candidate, (torch.empty(6, 4, device=meta),
                                   torch.empty(6, 2, dtype=torch.long, device=meta)),
                  ("the loss",), "aux_loss_wrong_device",
                  "6 tokens, 4 experts, top_k=2")  # fmt: skip


def _expect_gradient(candidate, ctx: Context, probs64, experts, label: str) -> None:
    """The loss trains the router: autograd reaches ``probs``, with E * f_i / N in every
    row of column i (the counts f_i are constants)."""
    case = f"{label}, probs float64 requiring grad"
    probs = probs64.detach().clone().requires_grad_()
    # Called through a lambda: ctx.call copies its arguments, which would cut them off
    # from the leaf whose gradient is checked.
    got = ctx.call(lambda: candidate(probs, experts.clone()), case=case,
                   call_name="load_balancing_loss")  # fmt: skip
    if not isinstance(got, torch.Tensor) or got.grad_fn is None:
        ctx.fail(
            "the loss is not connected to probs for autograd (it has no grad_fn): was it "
            "detached, or rebuilt from Python numbers?",
            case=case,
            mistake="aux_loss_not_differentiable",
        )
    warm_autograd()
    (grad,) = ctx.call(
        lambda: autograd_grad(got, [probs], allow_unused=True),
        case=case,
        call_name="autograd's backward pass through load_balancing_loss",
    )
    if grad is None:
        ctx.fail("no gradient reached probs.", case=case, mistake="aux_loss_not_differentiable")
    leaf = probs64.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(balance_model(leaf, experts), [leaf])
    ctx.expect_close(grad, want, what="the gradient of the loss with respect to probs",
                     case=case, **TOL[torch.float64])  # fmt: skip
