"""Catalog for notebook 02: padding_mask, causal_mask, masked_softmax."""

import torch

from . import alternative, mistake

# ----------------------------------------------------------------------------- padding_mask


@mistake("padding_mask", id="padding_mask_inverted")
def padding_inverted(lengths, max_len):
    return torch.arange(max_len)[None, :] >= lengths[:, None]


@mistake("padding_mask", id="padding_mask_off_by_one_long")
def padding_off_by_one(lengths, max_len):
    return torch.arange(max_len)[None, :] <= lengths[:, None]


@mistake("padding_mask", id="mask_not_boolean")
def padding_float(lengths, max_len):
    return (torch.arange(max_len)[None, :] < lengths[:, None]).float()


@mistake("padding_mask", id="wrong_device")
def padding_on_cpu(lengths, max_len):
    """The positions built without device=: on the CPU whatever lengths' device."""
    return torch.arange(max_len)[None, :] < lengths[:, None]


@mistake("padding_mask", id="mask_transposed")
def padding_transposed(lengths, max_len):
    return torch.arange(max_len)[:, None] < lengths[None, :]


@mistake("padding_mask", id="padding_mask_off_by_one_short")
def padding_one_based(lengths, max_len):
    return torch.arange(1, max_len + 1)[None, :] < lengths[:, None]


@alternative("padding_mask")
def padding_loop(lengths, max_len):
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        mask[b, :n] = True
    return mask


@alternative("padding_mask")
def padding_expand(lengths, max_len):
    pos = torch.arange(max_len, device=lengths.device).expand(len(lengths), max_len)
    return pos < lengths.unsqueeze(1)


# ----------------------------------------------------------------------------- causal_mask


@mistake("causal_mask", id="causal_mask_triu")
def causal_triu(n):
    return torch.ones(n, n, dtype=torch.bool).triu()


@mistake("causal_mask", id="causal_mask_no_diagonal")
def causal_strict(n):
    return torch.ones(n, n, dtype=torch.bool).tril(diagonal=-1)


@mistake("causal_mask", id="causal_mask_inverted")
def causal_inverted(n):
    return ~torch.ones(n, n, dtype=torch.bool).tril()


@mistake("causal_mask", id="mask_not_boolean")
def causal_float(n):
    return torch.tril(torch.ones(n, n))


@alternative("causal_mask")
def causal_compare(n):
    i = torch.arange(n)
    return i[None, :] <= i[:, None]


@alternative("causal_mask")
def causal_not_triu(n):
    return ~torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)


# ----------------------------------------------------------------------------- masked_softmax


@mistake("masked_softmax", id="fully_masked_row_nan")
def masked_softmax_nan(scores, mask, dim=-1):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)


@mistake("masked_softmax", id="wrong_device")
def masked_softmax_zeros_on_cpu(scores, mask, dim=-1):
    """Right on the CPU; the zeros of the dead rows are built there whatever scores' device."""
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return torch.where(torch.isnan(w), torch.zeros(w.shape, dtype=w.dtype), w)


@mistake("masked_softmax", id="fully_masked_row_uniform")
def masked_softmax_minus_1e9(scores, mask, dim=-1):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=dim)


@mistake("masked_softmax", id="additive_mask_full_row")
def masked_softmax_additive(scores, mask, dim=-1):
    return torch.softmax(scores + (~mask).to(scores.dtype) * -1e10, dim=dim)


@mistake("masked_softmax", id="additive_mask_full_row")
def masked_softmax_additive_bert(scores, mask, dim=-1):
    """BERT's extended attention mask: (1.0 - mask) * -10000.0."""
    return torch.softmax(scores + (1.0 - mask.to(scores.dtype)) * -10000.0, dim=dim)


@mistake("masked_softmax", id="fully_masked_row_uniform")
def masked_softmax_seed_idiom(scores, mask, dim=-1):
    """scores * mask + -1e9 * (1 - mask) with a 0/1 float mask."""
    m = mask.to(scores.dtype)
    return torch.softmax(scores * m + -1e9 * (1 - m), dim=dim)


@mistake("masked_softmax", id="mask_inverted")
def masked_softmax_inverted(scores, mask, dim=-1):
    w = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=dim)
    return w.nan_to_num(0.0)


@mistake("masked_softmax", id="mask_after_softmax")
def masked_softmax_after(scores, mask, dim=-1):
    return torch.softmax(scores, dim=dim) * mask


@mistake("masked_softmax", id="mask_multiplied")
def masked_softmax_multiply(scores, mask, dim=-1):
    return torch.softmax(scores * mask, dim=dim)


@mistake("masked_softmax", id="softmax_dim_ignored")
def masked_softmax_ignores_dim(scores, mask, dim=-1):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return w.nan_to_num(0.0)


@mistake("masked_softmax", id="dead_rows_found_along_last_dim")
def masked_softmax_dead_rows_last_dim(scores, mask, dim=-1):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return torch.where(mask.any(-1, keepdim=True), w, torch.zeros_like(w))  # -1, not dim


@mistake("masked_softmax", id="input_modified")
def masked_softmax_in_place(scores, mask, dim=-1):
    scores.masked_fill_(~mask, float("-inf"))
    return torch.softmax(scores, dim=dim).nan_to_num(0.0)


@mistake("masked_softmax", id="wrong_default")
def masked_softmax_default_dim_1(scores, mask, dim=1):
    """Right when dim is given, as every call of the check does but one; on 2-D scores
    dim=1 is the last axis, so the slip shows only with more dimensions."""
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return torch.where(mask.any(dim=dim, keepdim=True), w, torch.zeros_like(w))


@alternative("masked_softmax")
def masked_softmax_where(scores, mask, dim=-1):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return torch.where(mask.any(dim=dim, keepdim=True), w, torch.zeros_like(w))


@alternative("masked_softmax")
def masked_softmax_exp_mask(scores, mask, dim=-1):
    """exp of the shifted scores, zeroed by the mask, divided by a safe sum."""
    shift = scores.masked_fill(~mask, float("-inf")).amax(dim, keepdim=True)
    shift = torch.nan_to_num(shift, neginf=0.0)
    e = torch.exp((scores - shift).clamp(max=0.0)) * mask  # clamp: masked scores may be larger
    total = e.sum(dim, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


@alternative("masked_softmax")
def masked_softmax_logsumexp(scores, mask, dim=-1):
    filled = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(filled, dim=dim, keepdim=True)
    w = torch.exp(filled - lse)
    return torch.nan_to_num(w, nan=0.0)


@alternative("masked_softmax")
def masked_softmax_additive_then_zero_rows(scores, mask, dim=-1):
    """The additive mask, with the rows that have no allowed position zeroed afterwards."""
    w = torch.softmax(scores + (~mask).to(scores.dtype) * -1e10, dim=dim)
    return w * mask.any(dim=dim, keepdim=True)


@mistake("causal_mask", id="reference_used")
def causal_from_notebook_11(n):
    """Notebook 11's causal mask helper, which the package keeps while notebook 02 is
    graded: forbidden there, so the tripwire names it."""
    from attention_ref.gpt import causal_mask_like

    return causal_mask_like(n)
