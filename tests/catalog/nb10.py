"""Catalog for notebook 10: pool_sentences, select_sentences."""

import torch

from . import alternative, mistake

# ----------------------------------------------------------------------------- pool_sentences


@mistake("pool_sentences", id="pool_summed")
def pool_sum(h, sentence_ids, n_sentences):
    onehot = sentence_ids[:, None, :] == torch.arange(n_sentences)[None, :, None]
    return onehot.to(h.dtype) @ h


@mistake("pool_sentences", id="pool_divided_by_length")
def pool_divide_by_T(h, sentence_ids, n_sentences):
    onehot = sentence_ids[:, None, :] == torch.arange(n_sentences)[None, :, None]
    return onehot.to(h.dtype) @ h / h.shape[1]


@mistake("pool_sentences", id="pool_header_in_sentence_0")
def pool_clamped_ids(h, sentence_ids, n_sentences):
    ids = sentence_ids.clamp(min=0)
    onehot = (ids[:, None, :] == torch.arange(n_sentences)[None, :, None]).to(h.dtype)
    return onehot @ h / onehot.sum(-1, keepdim=True).clamp(min=1)


@mistake("pool_sentences", id="nan_or_inf")
def pool_no_clamp(h, sentence_ids, n_sentences):
    onehot = (sentence_ids[:, None, :] == torch.arange(n_sentences)[None, :, None]).to(h.dtype)
    return onehot @ h / onehot.sum(-1, keepdim=True)


@mistake("pool_sentences", id="pool_off_by_one")
def pool_shifted(h, sentence_ids, n_sentences):
    ids = torch.where(sentence_ids >= 0, sentence_ids + 1, sentence_ids)
    onehot = (ids[:, None, :] == torch.arange(n_sentences)[None, :, None]).to(h.dtype)
    return onehot @ h / onehot.sum(-1, keepdim=True).clamp(min=1)


@mistake("pool_sentences", id="wrong_device")
def pool_onehot_on_cpu(h, sentence_ids, n_sentences):
    """The one-hot table of slots built without device=: on the CPU whatever h's device."""
    onehot = (sentence_ids[:, None, :] == torch.arange(n_sentences)[None, :, None]).to(h.dtype)
    sums = onehot @ h  # (B, S, D)
    return sums / onehot.sum(-1, keepdim=True).clamp(min=1)


@alternative("pool_sentences")
def pool_loops(h, sentence_ids, n_sentences):
    B, T, D = h.shape
    out = h.new_zeros(B, n_sentences, D)
    for b in range(B):
        for s in range(n_sentences):
            sel = sentence_ids[b] == s
            if sel.any():
                out[b, s] = h[b, sel].mean(0)
    return out


@alternative("pool_sentences")
def pool_index_add(h, sentence_ids, n_sentences):
    # Send every token to slot id + 1 of an (S + 1)-slot table; slot 0 collects the -1s.
    B, T, D = h.shape
    slot = (sentence_ids + 1).clamp(max=n_sentences + 1)
    sums = h.new_zeros(B, n_sentences + 1, D).scatter_add(1, slot[..., None].expand(B, T, D), h)
    counts = h.new_zeros(B, n_sentences + 1).scatter_add(1, slot, torch.ones_like(h[..., 0]))
    return (sums / counts.clamp(min=1)[..., None])[:, 1:]


@alternative("pool_sentences")
def pool_einsum(h, sentence_ids, n_sentences):
    onehot = torch.nn.functional.one_hot(sentence_ids + 1, n_sentences + 1)[..., 1:]  # (B,T,S)
    onehot = onehot.to(h.dtype)
    sums = torch.einsum("bts,btd->bsd", onehot, h)
    return sums / onehot.sum(1)[..., None].clamp(min=1)


# ----------------------------------------------------------------------------- select_sentences


def _per_row(k, B):
    return k.tolist() if isinstance(k, torch.Tensor) else [k] * B


@mistake("select_sentences", id="select_padding")
def select_no_mask(scores, mask, k):
    out = torch.zeros_like(mask)
    for b, kb in enumerate(_per_row(k, scores.shape[0])):
        out[b, scores[b].topk(min(kb, scores.shape[1])).indices] = True
    return out


@mistake("select_sentences", id="select_lowest")
def select_lowest(scores, mask, k):
    x = scores.masked_fill(~mask, float("inf"))
    out = torch.zeros_like(mask)
    for b, kb in enumerate(_per_row(k, scores.shape[0])):
        out[b, x[b].argsort()[:kb]] = True
    return out & mask


@mistake("select_sentences", id="select_threshold")
def select_threshold(scores, mask, k):
    return (scores > 0) & mask


@mistake("select_sentences", id="select_returns_indices")
def select_indices(scores, mask, k):
    kk = k if isinstance(k, int) else int(k.max())
    return scores.masked_fill(~mask, float("-inf")).topk(kk, dim=1).indices


@mistake("select_sentences", id="wrong_device")
def select_k_on_cpu(scores, mask, k):
    """Right on the CPU; an int k is made a tensor there whatever the scores' device."""
    x = scores.masked_fill(~mask, float("-inf"))
    rank = x.argsort(1, descending=True).argsort(1)  # (B, S)
    kk = k if isinstance(k, torch.Tensor) else torch.full((scores.shape[0],), k)
    return (rank < kk[:, None]) & mask


@alternative("select_sentences")
def select_rank(scores, mask, k):
    x = scores.masked_fill(~mask, float("-inf"))
    # rank of each sentence = how many sentences score higher
    rank = (x[:, None, :] > x[:, :, None]).sum(-1)  # (B, S)
    kk = k[:, None] if isinstance(k, torch.Tensor) else k
    return (rank < kk) & mask


@alternative("select_sentences")
def select_topk_loop(scores, mask, k):
    out = torch.zeros_like(mask)
    for b, kb in enumerate(_per_row(k, scores.shape[0])):
        n = min(int(kb), int(mask[b].sum()))
        idx = scores[b].masked_fill(~mask[b], float("-inf")).topk(n).indices
        out[b, idx] = True
    return out


@mistake("select_sentences", id="select_mask_after_topk")
def select_topk_then_mask(scores, mask, k):
    """Top k over every slot, padding included, then the padding dropped."""
    out = torch.zeros_like(mask)
    for b, kb in enumerate(_per_row(k, scores.shape[0])):
        out[b, scores[b].topk(min(int(kb), scores.shape[1])).indices] = True
    return out & mask


@mistake("select_sentences", id="select_k_above_slots")
def select_topk_k(scores, mask, k):
    """topk(k) on the masked scores, assuming k <= S (a -inf slot is then dropped)."""
    x = scores.masked_fill(~mask, float("-inf"))
    out = torch.zeros_like(mask)
    for b, kb in enumerate(_per_row(k, scores.shape[0])):
        out[b, x[b].topk(int(kb)).indices] = True
    return out & mask


@alternative("select_sentences")
def select_sort_threshold(scores, mask, k):
    """The k-th best real score per row as a threshold (k clamped to the real count;
    k = 0 selects nothing)."""
    x = scores.masked_fill(~mask, float("-inf"))
    B, S = scores.shape
    kk = k if isinstance(k, torch.Tensor) else torch.full((B,), k, device=scores.device)
    kk = torch.minimum(kk, mask.sum(1))
    kth = x.sort(1, descending=True).values.gather(1, (kk - 1).clamp(min=0)[:, None])
    return (x >= kth) & mask & (kk > 0)[:, None]
