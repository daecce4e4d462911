"""Catalog for notebook 15: sliding_window_mask, rolling_append, absorbed_scores, route,
deepseek_route, load_balancing_loss."""

import math

import torch

from . import alternative, mistake

# ----------------------------------------------------------------------------- sliding_window_mask


def _window_mask(q_positions, k_positions, window, key_padding=None, *, wide=0, causal=True,
                 empty=True, padding=True):  # fmt: skip
    q, k = q_positions[:, None], k_positions[None, :]
    allowed = k <= q if causal else torch.ones(len(q_positions), len(k_positions), dtype=bool)
    if empty:
        allowed = allowed & (k >= 0)
    if window is not None:
        allowed = allowed & (k > q - window - wide)
    if key_padding is None or not padding:
        return allowed
    return allowed & key_padding[:, None, None, :]


@mistake("sliding_window_mask", id="window_off_by_one_wide")
def window_ge(q_positions, k_positions, window, key_padding=None):
    return _window_mask(q_positions, k_positions, window, key_padding, wide=1)


@mistake("sliding_window_mask", id="window_off_by_one_narrow")
def window_flash_attention_count(q_positions, k_positions, window, key_padding=None):
    # flash-attention's window_size=(left, right) counts the keys besides the query
    return _window_mask(q_positions, k_positions, window, key_padding, wide=-1)


@mistake("sliding_window_mask", id="window_not_causal")
def window_abs_distance(q_positions, k_positions, window, key_padding=None):
    q, k = q_positions[:, None], k_positions[None, :]
    allowed = k >= 0
    if window is not None:
        allowed = allowed & ((q - k).abs() < window)
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]
    return allowed


@mistake("sliding_window_mask", id="window_empty_slots_attended")
def window_no_empty_slots(q_positions, k_positions, window, key_padding=None):
    return _window_mask(q_positions, k_positions, window, key_padding, empty=False)


@mistake("sliding_window_mask", id="window_padding_ignored")
def window_padding_ignored(q_positions, k_positions, window, key_padding=None):
    return _window_mask(q_positions, k_positions, window, key_padding, padding=False)


@mistake("sliding_window_mask", id="window_mask_wrong_device")
def window_started_on_the_cpu(q_positions, k_positions, window, key_padding=None):
    allowed = torch.ones(len(q_positions), len(k_positions), dtype=torch.bool)  # no device=
    allowed = allowed & (k_positions[None, :] <= q_positions[:, None]) & (k_positions >= 0)
    if window is not None:
        allowed = allowed & (k_positions[None, :] > q_positions[:, None] - window)
    return allowed if key_padding is None else allowed & key_padding[:, None, None, :]


@mistake("sliding_window_mask", id="window_mask_not_boolean")
def window_float(q_positions, k_positions, window, key_padding=None):
    return _window_mask(q_positions, k_positions, window, key_padding).float()


@alternative("sliding_window_mask")
def window_loops(q_positions, k_positions, window, key_padding=None):
    n_q, n_k = len(q_positions), len(k_positions)
    mask = torch.zeros(n_q, n_k, dtype=torch.bool, device=q_positions.device)
    for i, q in enumerate(q_positions.tolist()):
        for j, k in enumerate(k_positions.tolist()):
            mask[i, j] = 0 <= k <= q and (window is None or q - k < window)
    if key_padding is not None:
        mask = mask[None, None] & key_padding[:, None, None, :].bool()
    return mask


@alternative("sliding_window_mask")
def window_distance(q_positions, k_positions, window, key_padding=None):
    distance = q_positions.unsqueeze(-1) - k_positions.unsqueeze(0)  # (n_q, n_k)
    limit = torch.iinfo(distance.dtype).max if window is None else window - 1
    mask = (distance >= 0) & (distance <= limit) & (k_positions >= 0)
    if key_padding is not None:
        mask = torch.where(key_padding[:, None, None, :], mask, False)
    return mask


# ----------------------------------------------------------------------------- rolling_append


def _ring_loop(slots, positions, new, start, slot_of=None, record=True, read_after=False,
               on=None):  # fmt: skip
    size, t = slots.shape[-2], new.shape[-2]
    ring, ring_pos = slots.clone(), positions.clone()
    for i in range(t):
        p = start + i
        s = p % size if slot_of is None else slot_of(p, size)
        ring[..., s, :] = new[..., i, :]
        if record:
            ring_pos[s] = p
    new_pos = torch.arange(start, start + t, device=positions.device if on is None else on)
    read, read_pos = (ring, ring_pos) if read_after else (slots, positions)
    return torch.cat([read, new], dim=-2), torch.cat([read_pos, new_pos]), ring, ring_pos


@mistake("rolling_append", id="ring_overwrites_newest")
def ring_fill_then_replace_last(slots, positions, new, start):
    # fills the slots in order, then keeps replacing the last one (a full stack's top)
    return _ring_loop(slots, positions, new, start, slot_of=lambda p, size: min(p, size - 1))


@alternative("rolling_append")
def ring_one_based_slots_consistently(slots, positions, new, start):
    # slot (p + 1) % size, entry and position alike: another layout, read back as written
    return _ring_loop(slots, positions, new, start, slot_of=lambda p, size: (p + 1) % size)


@mistake("rolling_append", id="ring_slot_off_by_one")
def ring_entry_one_slot_off(slots, positions, new, start):
    size, t = slots.shape[-2], new.shape[-2]
    ring, ring_pos = slots.clone(), positions.clone()
    for i in range(t):
        p = start + i
        ring[..., (p + 1) % size, :] = new[..., i, :]  # one slot off ...
        ring_pos[p % size] = p  # ... from where its position is recorded
    new_pos = torch.arange(start, start + t, device=positions.device)
    return torch.cat([slots, new], dim=-2), torch.cat([positions, new_pos]), ring, ring_pos


@mistake("rolling_append", id="ring_new_entries_not_attended")
def ring_mistral_write_then_read(slots, positions, new, start):
    # mistral-inference's RotatingBufferCache while decoding: write into the W slots, then
    # attend to them (right for a ring of W slots; this one has W - 1)
    _, _, ring, ring_pos = _ring_loop(slots, positions, new, start)
    return ring, ring_pos, ring, ring_pos


@mistake("rolling_append", id="ring_new_entries_not_attended")
def ring_mistral_unrotated(slots, positions, new, start):
    # the same, the ring "unrotated" into time order and its empty slots left out
    _, _, ring, ring_pos = _ring_loop(slots, positions, new, start)
    order = torch.sort(ring_pos).indices
    order = order[ring_pos[order] >= 0]
    return ring[..., order, :], ring_pos[order], ring, ring_pos


@mistake("rolling_append", id="ring_positions_not_recorded")
def ring_positions_forgotten(slots, positions, new, start):
    return _ring_loop(slots, positions, new, start, record=False)


@mistake("rolling_append", id="ring_written_before_read")
def ring_attends_the_updated_ring(slots, positions, new, start):
    return _ring_loop(slots, positions, new, start, read_after=True)


@mistake("rolling_append", id="ring_first_new_kept")
def ring_truncates_new(slots, positions, new, start):
    size, t = slots.shape[-2], new.shape[-2]
    n = min(t, size)  # only room for `size`: keeps the first n new entries
    where = torch.arange(start, start + n) % size
    ring, ring_pos = slots.clone(), positions.clone()
    ring[..., where, :] = new[..., :n, :]
    ring_pos[where] = torch.arange(start, start + n)
    new_pos = torch.arange(start, start + t)
    return torch.cat([slots, new], dim=-2), torch.cat([positions, new_pos]), ring, ring_pos


@mistake("rolling_append", id="ring_positions_wrong_device")
def ring_new_positions_on_the_cpu(slots, positions, new, start):
    # torch.arange(start, start + t) without device=: right on a CPU, raises on a GPU
    return _ring_loop(slots, positions, new, start, on="cpu")


@mistake("rolling_append", id="ring_new_entries_not_attended")
def ring_attends_the_ring_only(slots, positions, new, start):
    _, _, ring, ring_pos = _ring_loop(slots, positions, new, start)
    return ring, ring_pos, ring, ring_pos  # as Mistral's ring of W slots, but with W - 1


@alternative("rolling_append")
def ring_in_time_order_like_transformers(slots, positions, new, start):
    # transformers' DynamicSlidingWindowLayer: concatenate, keep the last size entries (the
    # ring stays oldest-first, its empty slots first; the cache hands it back as returned)
    size, t = slots.shape[-2], new.shape[-2]
    attend = torch.cat([slots, new], dim=-2)
    attend_positions = torch.cat(
        [positions, torch.arange(start, start + t, device=positions.device)]
    )
    return attend, attend_positions, attend[..., -size:, :], attend_positions[-size:]


@alternative("rolling_append")
def ring_one_position_at_a_time(slots, positions, new, start):
    return _ring_loop(slots, positions, new, start)  # the later writes overwrite the earlier


@alternative("rolling_append")
def ring_rotated_with_torch_roll(slots, positions, new, start):
    size, t = slots.shape[-2], new.shape[-2]
    new_pos = torch.arange(start, start + t, device=positions.device)
    attend = torch.cat([slots, new], dim=-2)
    attend_positions = torch.cat([positions, new_pos])
    n = min(t, size)  # the last n new entries survive; the first of them goes to slot r
    r = (start + t - n) % size
    ring = torch.roll(slots, -r, dims=-2)  # slot r first
    ring_pos = torch.roll(positions, -r, dims=0)
    ring = torch.cat([new[..., t - n :, :], ring[..., n:, :]], dim=-2)
    ring_pos = torch.cat([new_pos[t - n :], ring_pos[n:]])
    return attend, attend_positions, torch.roll(ring, r, dims=-2), torch.roll(ring_pos, r, 0)


# ----------------------------------------------------------------------------- absorbed_scores


def _scores(q_nope, q_rope, c_kv, k_rope, w_uk, *, width=None, rotary=True, equation=None):
    q_latent = torch.einsum(equation or "bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, t, r)
    scores = q_latent @ c_kv[:, None].transpose(-1, -2)
    if rotary:
        scores = scores + q_rope @ k_rope[:, None].transpose(-1, -2)
    return scores / math.sqrt(width or q_nope.shape[-1] + q_rope.shape[-1])


@mistake("absorbed_scores", id="mla_scale_without_rope_dims")
def scores_scaled_by_d_nope(q_nope, q_rope, c_kv, k_rope, w_uk):
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, width=q_nope.shape[-1])


@mistake("absorbed_scores", id="mla_scale_by_latent_width")
def scores_scaled_by_r(q_nope, q_rope, c_kv, k_rope, w_uk):
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, width=c_kv.shape[-1])


@mistake("absorbed_scores", id="mla_scale_by_latent_and_rope_width")
def scores_scaled_by_cached_width(q_nope, q_rope, c_kv, k_rope, w_uk):
    # the width of what is cached, r + d_rope (as flashinfer's MLA benchmark scales)
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, width=c_kv.shape[-1] + k_rope.shape[-1])


@mistake("absorbed_scores", id="mla_scores_wrong_device")
def scores_accumulated_on_the_cpu(q_nope, q_rope, c_kv, k_rope, w_uk):
    B, H, t, _ = q_nope.shape
    scores = torch.zeros(B, H, t, c_kv.shape[1], dtype=q_nope.dtype)  # no device=
    scores = scores + (q_nope @ w_uk) @ c_kv[:, None].mT + q_rope @ k_rope[:, None].mT
    return scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])


@mistake("absorbed_scores", id="mla_scores_not_scaled")
def scores_unscaled(q_nope, q_rope, c_kv, k_rope, w_uk):
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, width=1)


@mistake("absorbed_scores", id="mla_rotary_part_dropped")
def scores_latent_only(q_nope, q_rope, c_kv, k_rope, w_uk):
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, rotary=False)


@mistake("absorbed_scores", id="mla_up_projection_transposed")
def scores_w_uk_transposed(q_nope, q_rope, c_kv, k_rope, w_uk):
    # w_uk[h] read as (r, d_nope): runs only where d_nope == r, and is wrong there
    return _scores(q_nope, q_rope, c_kv, k_rope, w_uk, equation="bhtn,hrn->bhtr")


@alternative("absorbed_scores")
def scores_of_concatenated_parts(q_nope, q_rope, c_kv, k_rope, w_uk):
    # one matmul: [w_uk^T q_nope, q_rope] . [c_kv, k_rope]; q_nope @ w_uk broadcasts over heads
    q = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (B, H, t, r + d_rope)
    k = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, n, r + d_rope)
    return q @ k.transpose(-1, -2) * (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5


@alternative("absorbed_scores")
def scores_head_by_head_float64(q_nope, q_rope, c_kv, k_rope, w_uk):
    # a loop over the heads, in float64, cast back at the end
    d_q = q_nope.shape[-1] + q_rope.shape[-1]
    heads = []
    for h in range(w_uk.shape[0]):
        q_latent = q_nope[:, h].double() @ w_uk[h].double()  # (B, t, r)
        s = q_latent @ c_kv.double().transpose(1, 2) + q_rope[:, h].double() @ k_rope.double().mT
        heads.append(s / math.sqrt(d_q))  # (B, t, n)
    return torch.stack(heads, dim=1).to(q_nope.dtype)


# ----------------------------------------------------------------------------- route


def _route(logits, top_k, router, norm_topk_prob, renorm=None, dim=-1):
    probs = logits.softmax(dim=dim)
    gates, experts = probs.topk(top_k, dim=-1)
    if renorm is None:
        renorm = router in ("mixtral", "gpt_oss") or norm_topk_prob
    if renorm:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates, experts, probs


@mistake("route", id="route_gates_not_renormalised")
def route_not_renormalised(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    return _route(logits, top_k, router, norm_topk_prob, renorm=False)


@mistake("route", id="route_norm_topk_prob_ignored")
def route_always_renormalised(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    return _route(logits, top_k, router, norm_topk_prob, renorm=True)


@mistake("route", id="route_softmax_over_tokens")
def route_softmax_dim0(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    return _route(logits, top_k, router, norm_topk_prob, dim=0)


@mistake("route", id="route_gates_not_renormalised")
def route_gpt_oss_softmax_before_topk(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    # GPT-OSS's softmax runs over the top k logits; this takes the top k of the full softmax
    probs = logits.softmax(-1)
    gates, experts = probs.topk(top_k, dim=-1)
    if router == "gpt_oss":
        return gates, experts, probs
    return _route(logits, top_k, router, norm_topk_prob)


@mistake("route", id="route_gates_not_renormalised")
def route_default_not_normalised(logits, top_k, router="mixtral", *, norm_topk_prob=False):
    # the spec's default is norm_topk_prob=True: qwen3 called without it must renormalise
    return _route(logits, top_k, router, norm_topk_prob)


@mistake("route", id="route_gates_not_renormalised")
def route_mixtral_obeys_norm_topk_prob(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    # norm_topk_prob is Qwen3's switch; Mixtral renormalises whatever it says
    return _route(
        logits, top_k, router, norm_topk_prob, renorm=router == "gpt_oss" or norm_topk_prob
    )


@mistake("route", id="route_experts_not_indices")
def route_experts_as_float(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    gates, experts, probs = _route(logits, top_k, router, norm_topk_prob)
    return gates, experts.to(logits.dtype), probs


@mistake("route", id="route_wrong_device")
def route_gates_filled_on_the_cpu(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    probs = logits.softmax(-1)
    top, experts = probs.topk(top_k, dim=-1)
    gates = torch.zeros(logits.shape[0], top_k, dtype=logits.dtype)  # no device=
    gates = gates + (top if router == "qwen3" and not norm_topk_prob
                     else top / top.sum(-1, keepdim=True))  # fmt: skip
    return gates, experts, probs


@alternative("route")
def route_softmax_in_float32_like_transformers(logits, top_k, router="mixtral", *,
                                               norm_topk_prob=True):  # fmt: skip
    # transformers 4.57's Mixtral and Qwen3-MoE blocks (and Mistral's moe.py): the softmax in
    # float32 whatever the logits' dtype, the gates cast back; GPT-OSS's router as it is
    routing_weights = torch.nn.functional.softmax(logits, dim=1, dtype=torch.float)
    if router == "gpt_oss":
        top, experts = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=1), experts, routing_weights.to(logits.dtype)
    gates, experts = torch.topk(routing_weights, top_k, dim=-1)
    if router == "mixtral" or norm_topk_prob:
        gates /= gates.sum(dim=-1, keepdim=True)
    return gates.to(logits.dtype), experts, routing_weights.to(logits.dtype)


@mistake("route", id="wrong_default")
def route_qwen3_by_default(logits, top_k, router="qwen3", *, norm_topk_prob=True):
    """Right for every router it is given; left out, it routes as Qwen3-MoE, which differs
    from the spec's Mixtral only when norm_topk_prob=False."""
    top, experts = logits.topk(top_k, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if router == "qwen3" and not norm_topk_prob:
        return probs.gather(-1, experts), experts, probs
    return torch.softmax(top, dim=-1), experts, probs


@alternative("route")
def route_softmax_of_chosen_logits(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    # renormalising the top-k probabilities = softmax over the top-k logits
    top, experts = logits.topk(top_k, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if router == "qwen3" and not norm_topk_prob:
        return probs.gather(-1, experts), experts, probs
    return torch.softmax(top, dim=-1), experts, probs


@alternative("route")
def route_sorted_by_expert_float64(logits, top_k, router="mixtral", *, norm_topk_prob=True):
    # float64 inside, experts listed in increasing index order (the order is free)
    z = logits.double()
    probs = torch.exp(z - z.max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    experts = probs.argsort(-1, descending=True)[:, :top_k].sort(-1).values
    gates = probs.gather(-1, experts)
    if router != "qwen3" or norm_topk_prob:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates.to(logits.dtype), experts, probs.to(logits.dtype)


# ----------------------------------------------------------------------------- deepseek_route
def _deepseek(logits, bias, top_k, n_group, topk_group, scale, *, fill=float("-inf"),
              group="top2", gates_from="scores", score="sigmoid", normalise=True,
              groups=True, use_bias=True, group_bias=True):  # fmt: skip
    """DeepSeek's gate, with one of its parts changed by the keywords."""
    N, E = logits.shape
    scores = logits.softmax(-1) if score == "softmax" else logits.sigmoid()
    choice = scores + bias if use_bias else scores
    grouped = (choice if group_bias else scores).view(N, n_group, -1)
    if group == "max":
        group_scores = grouped.amax(-1)
    else:
        group_scores = grouped.topk(min(2, E // n_group), -1)[0].sum(-1)
    keep = group_scores.topk(topk_group, -1)[1]
    mask = torch.ones(N, n_group, dtype=torch.bool, device=logits.device).scatter_(1, keep, False)
    if not groups:
        mask = torch.zeros_like(mask)
    picked = choice.masked_fill(mask.repeat_interleave(E // n_group, 1), fill).topk(top_k, -1)[1]
    gates = (choice if gates_from == "choice" else scores).gather(1, picked)
    if normalise:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates * scale, picked, scores


@mistake("deepseek_route", id="deepseek_groups_masked_with_zero")
def deepseek_like_transformers(logits, bias, top_k, *, n_group=1, topk_group=1,
                               routed_scaling_factor=1.0):  # fmt: skip
    """transformers' DeepseekV3TopkRouter: the other groups' experts score 0.0."""
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor, fill=0.0)


@mistake("deepseek_route", id="deepseek_group_score_max")
def deepseek_group_by_best(logits, bias, top_k, *, n_group=1, topk_group=1,
                           routed_scaling_factor=1.0):  # fmt: skip
    """DeepSeek's gate without a bias (and DeepSeek-V2's): a group scores its best expert."""
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     group="max")  # fmt: skip


@mistake("deepseek_route", id="deepseek_groups_scored_without_bias")
def deepseek_groups_on_scores(logits, bias, top_k, *, n_group=1, topk_group=1,
                              routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     group_bias=False)  # fmt: skip


@mistake("deepseek_route", id="deepseek_gates_include_bias")
def deepseek_biased_gates(logits, bias, top_k, *, n_group=1, topk_group=1,
                          routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     gates_from="choice")  # fmt: skip


@mistake("deepseek_route", id="deepseek_softmax_scores")
def deepseek_softmax(logits, bias, top_k, *, n_group=1, topk_group=1, routed_scaling_factor=1.0):
    """DeepSeek-V2's softmax scores."""
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     score="softmax")  # fmt: skip


@mistake("deepseek_route", id="deepseek_bias_ignored")
def deepseek_unbiased_choice(logits, bias, top_k, *, n_group=1, topk_group=1,
                             routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     use_bias=False)  # fmt: skip


@mistake("deepseek_route", id="deepseek_no_group_limit")
def deepseek_every_group(logits, bias, top_k, *, n_group=1, topk_group=1,
                         routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     groups=False)  # fmt: skip


@mistake("deepseek_route", id="deepseek_gates_not_normalised")
def deepseek_raw_gates(logits, bias, top_k, *, n_group=1, topk_group=1,
                       routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor,
                     normalise=False)  # fmt: skip


@mistake("deepseek_route", id="deepseek_scaling_factor_missing")
def deepseek_unscaled(logits, bias, top_k, *, n_group=1, topk_group=1,
                      routed_scaling_factor=1.0):  # fmt: skip
    return _deepseek(logits, bias, top_k, n_group, topk_group, 1.0)


@mistake("deepseek_route", id="deepseek_scaling_factor_missing")
def deepseek_scaled_then_normalised(logits, bias, top_k, *, n_group=1, topk_group=1,
                                    routed_scaling_factor=1.0):  # fmt: skip
    gates, experts, scores = _deepseek(logits, bias, top_k, n_group, topk_group, 1.0,
                                       normalise=False)  # fmt: skip
    gates = gates * routed_scaling_factor
    return gates / gates.sum(-1, keepdim=True), experts, scores


@alternative("deepseek_route")
def deepseek_gate_as_deepseek_writes_it(logits, bias, top_k, *, n_group=1, topk_group=1,
                                        routed_scaling_factor=1.0):  # fmt: skip
    """DeepSeek's inference/model.py Gate (a boolean mask of the groups, -inf), extended to
    groups of one expert."""
    return _deepseek(logits, bias, top_k, n_group, topk_group, routed_scaling_factor)


@alternative("deepseek_route")
def deepseek_route_per_token(logits, bias, top_k, *, n_group=1, topk_group=1,
                             routed_scaling_factor=1.0):  # fmt: skip
    """A loop over the tokens, in float32 (cast back), with sorted lists of groups."""
    N, E = logits.shape
    size = E // n_group
    scores = logits.float().sigmoid()
    gates = torch.empty(N, top_k, dtype=logits.dtype, device=logits.device)
    experts = torch.empty(N, top_k, dtype=torch.long, device=logits.device)
    for t in range(N):
        choice = scores[t] + bias.float()
        group_score = [choice[g * size : (g + 1) * size].sort(descending=True).values[:2].sum()
                       for g in range(n_group)]  # fmt: skip
        best = sorted(range(n_group), key=lambda g: -float(group_score[g]))[:topk_group]
        allowed = [e for g in best for e in range(g * size, (g + 1) * size)]
        ranked = sorted(allowed, key=lambda e: -float(choice[e]))[:top_k]
        picked = scores[t, ranked]
        experts[t] = torch.tensor(ranked, device=logits.device)
        gates[t] = (picked / picked.sum() * routed_scaling_factor).to(logits.dtype)
    return gates, experts, scores.to(logits.dtype)


# ----------------------------------------------------------------------------- load_balancing_loss


@mistake("load_balancing_loss", id="aux_loss_wrong_axis")
def balance_mean_over_experts(probs, experts):
    N, E = probs.shape
    f = (
        torch.zeros(E, dtype=probs.dtype).index_add_(
            0, experts.flatten(), torch.ones(experts.numel(), dtype=probs.dtype)
        )
        / N
    )
    P = probs.mean(dim=1, keepdim=True)  # (N, 1): the wrong axis
    return E * (f * P).sum()


@mistake("load_balancing_loss", id="aux_loss_fraction_of_slots")
def balance_one_hot_mean(probs, experts):
    E = probs.shape[-1]
    f = torch.nn.functional.one_hot(experts, E).to(probs.dtype).mean(dim=(0, 1))
    return E * (f * probs.mean(0)).sum()


@mistake("load_balancing_loss", id="aux_loss_missing_num_experts")
def balance_no_e(probs, experts):
    N, E = probs.shape
    f = torch.bincount(experts.flatten(), minlength=E).to(probs.dtype) / N
    return (f * probs.mean(0)).sum()


@mistake("load_balancing_loss", id="aux_loss_probs_of_chosen_only")
def balance_chosen_probs(probs, experts):
    N, E = probs.shape
    f = torch.bincount(experts.flatten(), minlength=E).to(probs.dtype) / N
    chosen = torch.zeros_like(probs).scatter(1, experts, probs.gather(1, experts))
    return E * (f * chosen.mean(0)).sum()


@mistake("load_balancing_loss", id="aux_loss_first_choice_only")
def balance_deepspeed_top2(probs, experts):
    # DeepSpeed's top2gating: the mask of the first choices only, mean(me * ce) * E * E
    E = probs.shape[-1]
    mask1 = torch.nn.functional.one_hot(experts[:, 0], E).to(probs.dtype)
    me, ce = probs.mean(dim=0), mask1.mean(dim=0)
    return (me * ce).mean() * E * E


@mistake("load_balancing_loss", id="aux_loss_wrong_axis")
def balance_transformers_4_36(probs, experts):
    # transformers 4.36's Mixtral load_balancing_loss_func, fed the chosen experts and their
    # renormalised probabilities (the softmax of the top-k logits): a constant, E / top_k
    E = probs.shape[-1]
    routing_weights = probs.gather(-1, experts)
    routing_weights = routing_weights / routing_weights.sum(-1, keepdim=True)
    expert_mask = torch.nn.functional.one_hot(experts.unsqueeze(2), E)  # (N, k, 1, E)
    expert_mask = torch.max(expert_mask, dim=-2).values.to(probs.dtype)  # (N, k, E)
    tokens_per_group_and_expert = torch.mean(expert_mask, dim=-2)  # (N, E)
    router_prob_per_group_and_expert = torch.mean(routing_weights, dim=-1)  # (N,)
    return torch.mean(
        tokens_per_group_and_expert * router_prob_per_group_and_expert.unsqueeze(-1)
    ) * (E**2)


@mistake("load_balancing_loss", id="aux_loss_probs_of_chosen_only")
def balance_maxtext_topk_gates(probs, experts):
    # MaxText's dense_matmul before its fix: the load from the top-k gates (renormalised), not
    # from every expert's probability
    N, E = probs.shape
    top = probs.gather(1, experts)
    weights = torch.zeros_like(probs).scatter(1, experts, top / top.sum(-1, keepdim=True))
    density = torch.nn.functional.one_hot(experts, E).sum(dim=1).to(probs.dtype).mean(dim=0)
    return torch.mean(density * weights.mean(dim=0)) * E**2


@mistake("load_balancing_loss", id="aux_loss_wrong_device")
def balance_counts_on_the_cpu(probs, experts):
    N, E = probs.shape
    counts = torch.zeros(E, dtype=probs.dtype)  # no device=
    counts.index_add_(0, experts.flatten(), torch.ones(experts.numel(), dtype=probs.dtype))
    return E * (counts / N * probs.mean(0)).sum()


@mistake("load_balancing_loss", id="aux_loss_not_differentiable")
def balance_detached(probs, experts):
    N, E = probs.shape
    f = torch.bincount(experts.flatten(), minlength=E).to(probs.dtype) / N
    return E * (f * probs.detach().mean(0)).sum()  # the right value, no gradient


@mistake("sliding_window_mask", id="window_empty_slots_attended")
def window_none_forgets_empty_slots(q_positions, k_positions, window, key_padding=None):
    if window is None:  # plain causal: the empty slots (-1 <= q) slip through
        mask = k_positions[None, :] <= q_positions[:, None]
        return mask if key_padding is None else mask & key_padding[:, None, None, :]
    return _window_mask(q_positions, k_positions, window, key_padding)


@alternative("load_balancing_loss")
def balance_bincount(probs, experts):
    N, E = probs.shape
    f = torch.bincount(experts.flatten(), minlength=E).to(probs.dtype) / N
    return E * torch.dot(f, probs.mean(dim=0))


@alternative("load_balancing_loss")
def balance_transformers_style(probs, experts):
    # as transformers' load_balancing_loss_func: one-hot (N, k, E), mean over tokens
    E = probs.shape[-1]
    tokens_per_expert = torch.nn.functional.one_hot(experts, E).to(probs.dtype).mean(dim=0)
    router_prob_per_expert = probs.mean(dim=0)
    return (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * E
