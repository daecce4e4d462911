"""Catalog for notebook 11: gpt_block, sample_next_token, grouped_query_attention."""

import math

import torch
from torch import nn

from attention_ref import MultiHeadAttention, merge_heads, sdpa, split_heads
from attention_ref.encoder import FeedForward

from . import alternative, mistake

# ----------------------------------------------------------------------------- gpt_block


class _Block(nn.Module):
    """A configurable GPT block with the exercise's attribute names."""

    mode = "correct"

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def mask(self, T, device):
        ones = torch.ones(T, T, dtype=torch.bool, device=device)
        return {"no_mask": None, "strict": ones.tril(-1), "upper": ones.triu()}.get(
            self.mode, ones.tril()
        )

    def forward(self, x):
        m = self.mask(x.shape[1], x.device)
        if self.mode == "post_norm":
            a, w = self.attn(x, x, x, m)
            x = self.ln1(x + self.dropout(a))
            return self.ln2(x + self.dropout(self.ff(x))), w
        if self.mode == "normed_residual":
            h = self.ln1(x)
            a, w = self.attn(h, h, h, m)
            x = self.ln2(h + self.dropout(a))
            return x + self.dropout(self.ff(x)), w
        h = self.ln1(x)
        a, w = self.attn(h, h, h, m)
        x = x + a if self.mode == "no_dropout" else x + self.dropout(a)
        if self.mode == "no_dropout":
            return x + self.ff.linear2(torch.relu(self.ff.linear1(self.ln2(x)))), w
        return x + self.dropout(self.ff(self.ln2(x))), w


@mistake("gpt_block", id="block_no_mask")
class BlockNoMask(_Block):
    mode = "no_mask"


@mistake("gpt_block", id="block_strict")
class BlockStrictMask(_Block):
    mode = "strict"


@mistake("gpt_block", id="block_upper")
class BlockUpperMask(_Block):
    mode = "upper"


@mistake("gpt_block", id="block_post_norm")
class BlockPostNorm(_Block):
    mode = "post_norm"


@mistake("gpt_block", id="block_normed_residual")
class BlockNormedResidual(_Block):
    mode = "normed_residual"


@mistake("gpt_block", id="block_dropout_never_applied")
class BlockNoDropout(_Block):
    mode = "no_dropout"


@mistake("gpt_block", id="block_dropout_never_applied")
class BlockNoSelfDropout(nn.Module):
    """No self.dropout at all: only the FeedForward's own dropout (on its hidden units)
    acts in training mode."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x):
        T = x.shape[1]
        h = self.ln1(x)
        a, w = self.attn(h, h, h, torch.ones(T, T, dtype=torch.bool, device=x.device).tril())
        x = x + a
        return x + self.ff(self.ln2(x)), w


@mistake("gpt_block", id="block_dropout_on_residual")
class BlockDropoutOnSum(_Block):
    """Dropout on the residual sum: x = self.dropout(x + out)."""

    def forward(self, x):
        m = self.mask(x.shape[1], x.device)
        h = self.ln1(x)
        a, w = self.attn(h, h, h, m)
        x = self.dropout(x + a)
        return self.dropout(x + self.ff(self.ln2(x))), w


@mistake("gpt_block", id="block_sublayer_dropout_missing")
class BlockDropoutOnAttentionOnly(_Block):
    """The attention's output dropped, the feed-forward's not (its own dropout on the hidden
    units taken for the block's)."""

    def forward(self, x):
        m = self.mask(x.shape[1], x.device)
        h = self.ln1(x)
        a, w = self.attn(h, h, h, m)
        x = x + self.dropout(a)
        return x + self.ff(self.ln2(x)), w


@mistake("gpt_block", id="block_dropout_misplaced")
class BlockDropoutOnInput(_Block):
    """Dropout on each sub-layer's input, after the norm."""

    def forward(self, x):
        m = self.mask(x.shape[1], x.device)
        h = self.dropout(self.ln1(x))
        a, w = self.attn(h, h, h, m)
        x = x + a
        return x + self.ff(self.dropout(self.ln2(x))), w


@mistake("gpt_block", id="parameter_names")
class BlockTorchAttention(_Block):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)


@mistake("gpt_block", id="block_gelu")
class BlockGELU(_Block):
    """GPT-2's activation in place of the spec's FeedForward (ReLU)."""

    def forward(self, x):
        T = x.shape[1]
        h = self.ln1(x)
        a, w = self.attn(h, h, h, torch.ones(T, T, dtype=torch.bool, device=x.device).tril())
        x = x + self.dropout(a)
        h = self.ff.linear2(self.ff.dropout(nn.functional.gelu(self.ff.linear1(self.ln2(x)))))
        return x + self.dropout(h), w


@alternative("gpt_block")
class BlockMaskInBuffer(_Block):
    """nanoGPT's pattern: the causal mask built once, kept in a registered buffer (not a
    parameter), sliced to the length in forward."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.register_buffer("causal", torch.ones(256, 256, dtype=torch.bool).tril())

    def mask(self, T, device):
        return self.causal[:T, :T]


@alternative("gpt_block")
class BlockCorrect(_Block):
    pass


@alternative("gpt_block")
class BlockFunctionalDropout(_Block):
    """nn.functional.dropout with the module's p and training flag; GPT-2's attention
    dropout (on the weights) passed to MultiHeadAttention as well."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__(d_model, n_heads, d_ff, dropout)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)

    def forward(self, x):
        m = self.mask(x.shape[1], x.device)
        p = self.dropout.p
        h = self.ln1(x)
        a, w = self.attn(h, h, h, m)
        x = x + nn.functional.dropout(a, p, self.training)
        return x + nn.functional.dropout(self.ff(self.ln2(x)), p, self.training), w


@alternative("gpt_block")
class BlockBoolMaskFromArange(_Block):
    """Mask from position comparisons; attention called with keyword arguments."""

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)
        allowed = pos[None, :] <= pos[:, None]  # (T, T): key j <= query i
        h = self.ln1(x)
        out, weights = self.attn(query=h, key=h, value=h, mask=allowed[None])
        x = x + self.dropout(out)
        x = x + self.dropout(self.ff(self.ln2(x)))
        return x, weights


# ----------------------------------------------------------------------------- sampler


def _sampler(logits, temperature=1.0, top_k=None, top_p=None, generator=None, *, mode="ok"):
    if temperature == 0:
        return logits.argmax(-1)
    if mode == "after_softmax":
        probs = torch.softmax(logits, -1) / temperature
        scores = torch.log(probs / probs.sum(-1, keepdim=True))
    elif mode == "times":
        scores = logits * temperature
    else:
        scores = logits / temperature
    if top_k is not None:
        if mode == "k_exact":
            idx = scores.topk(top_k, -1).indices
            keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)
            scores = scores.masked_fill(~keep, -math.inf)
        else:
            kth = scores.topk(top_k, -1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores, -1)
    if top_p is not None:
        if mode in ("exclusive", "sorted"):
            sp, order = probs.sort(dim=-1, descending=True, stable=True)
            cum = sp.cumsum(-1)
            keep_sorted = cum < top_p if mode == "exclusive" else cum - sp < top_p
            keep_sorted[..., 0] = True
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        else:
            above = (probs[..., None, :] * (probs[..., None, :] > probs[..., :, None])).sum(-1)
            keep = above < top_p
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    flat = probs.reshape(-1, probs.shape[-1])
    gen = None if mode == "no_generator" else generator
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


@mistake("sample_next_token", id="sampler_p_exclusive")
def sampler_top_p_exclusive(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="exclusive")


@mistake("sample_next_token", id="sampler_after_softmax")
def sampler_temperature_after_softmax(
    logits, temperature=1.0, top_k=None, top_p=None, generator=None
):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="after_softmax")


@mistake("sample_next_token", id="sampler_times")
def sampler_temperature_times(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="times")


@mistake("sample_next_token", id="sampler_k_exact_high")
def sampler_top_k_exact(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="k_exact")


@mistake("sample_next_token", id="sampler_p_sorted_ties")
def sampler_top_p_sorted(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="sorted")


@mistake("sample_next_token", id="generator_ignored")
def sampler_no_generator(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator, mode="no_generator")


@mistake("sample_next_token", id="temperature_zero_not_handled")
def sampler_no_greedy(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = torch.softmax(logits / temperature, -1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(
        probs.shape[:-1]
    )


@mistake("sample_next_token", id="greedy_last_tie")
def sampler_greedy_last(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0:
        V = logits.shape[-1]
        return V - 1 - logits.flip(-1).argmax(-1)
    return _sampler(logits, temperature, top_k, top_p, generator)


@mistake("sample_next_token", id="greedy_after_top_k")
def sampler_top_k_before_greedy(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Top-k first, then greedy as the first of topk's indices: a maximum, but topk does
    not promise the lowest index among ties."""
    if top_k is not None and temperature == 0:
        return logits.topk(top_k, -1).indices[..., 0]
    return _sampler(logits, temperature, top_k, top_p, generator)


@mistake("sample_next_token", id="code_raised")
def sampler_top_k_threshold_shape(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """The k-th score without keepdim, applied before greedy: the error is the shape's,
    and must not be put down to temperature 0."""
    scores = logits
    if top_k is not None:
        kth = scores.topk(top_k, -1).values[..., -1]  # (rows,): does not broadcast
        scores = scores.masked_fill(scores < kth, -math.inf)
    if temperature == 0:
        return scores.argmax(-1)
    return _sampler(scores, temperature, None, top_p, generator)


@mistake("sample_next_token", id="sampler_k_exact_high")
def sampler_top_k_exact_high(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Exactly k tokens, ties at the k-th broken toward the highest index."""
    if temperature == 0 or top_k is None:
        return _sampler(logits, temperature, top_k, top_p, generator)
    scores = logits / temperature
    V = scores.shape[-1]
    rank = scores * V + torch.arange(V, dtype=scores.dtype) / V  # ties: higher index first
    idx = rank.double().topk(top_k, -1).indices
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)
    return _sampler(scores.masked_fill(~keep, -math.inf), 1.0, None, top_p, generator)


@mistake("sample_next_token", id="sampler_p_sorted_ties_high")
def sampler_top_p_sorted_ascending(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """A widely used library's top-p: sort ascending, drop the tokens whose cumulative mass
    stays <= 1 - top_p; among tied tokens the higher index ends up kept."""
    if temperature == 0 or top_p is None:
        return _sampler(logits, temperature, top_k, top_p, generator)
    scores = logits / temperature
    if top_k is not None:
        kth = scores.topk(top_k, -1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores.double(), -1)
    sp, order = probs.sort(dim=-1, stable=True)
    drop_sorted = sp.cumsum(-1) <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    probs = probs.masked_fill(drop, 0.0)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


@mistake("sample_next_token", id="sampler_p_le")
def sampler_top_p_less_or_equal(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    if temperature == 0 or top_p is None:
        return _sampler(logits, temperature, top_k, top_p, generator)
    scores = logits / temperature
    if top_k is not None:
        kth = scores.topk(top_k, -1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    p = torch.softmax(scores, -1)
    above = (p[..., None, :] * (p[..., None, :] > p[..., :, None])).sum(-1)
    p = torch.where(above <= top_p, p, torch.zeros_like(p))
    flat = p.reshape(-1, p.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(p.shape[:-1])


@alternative("sample_next_token")
def sampler_reference_style(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return _sampler(logits, temperature, top_k, top_p, generator)


@mistake("sample_next_token", id="wrong_device")
def sampler_gumbel_noise_on_cpu(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Gumbel-max whose noise is drawn on the CPU whatever the logits' device."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits.double() / temperature
    if top_k is not None:
        kth = scores.topk(top_k, -1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    logp = torch.log_softmax(scores, -1)
    if top_p is not None:
        p = logp.exp()
        above = (p[..., None, :] * (p[..., None, :] > p[..., :, None])).sum(-1)
        logp = logp.masked_fill(above >= top_p, -math.inf)
    u = torch.rand(logp.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    return (logp - torch.log(-torch.log(u))).argmax(-1)


@alternative("sample_next_token")
def sampler_gumbel_max(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Gumbel-max: argmax(log p + Gumbel noise) is a draw from p; float64 throughout."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits.double() / temperature
    if top_k is not None:
        kth = torch.sort(scores, -1, descending=True).values[..., top_k - 1 : top_k]
        scores = torch.where(scores >= kth, scores, torch.full_like(scores, -math.inf))
    logp = torch.log_softmax(scores, -1)
    if top_p is not None:
        p = logp.exp()
        above = torch.stack([(p * (p > p[..., i : i + 1])).sum(-1) for i in range(p.shape[-1])], -1)
        logp = torch.where(above < top_p, logp, torch.full_like(logp, -math.inf))
    u = torch.rand(logp.shape, generator=generator, dtype=torch.float64, device=logp.device)
    u = u.clamp_min(1e-300)
    return (logp - torch.log(-torch.log(u))).argmax(-1)


# ----------------------------------------------------------------------------- GQA


class _GQA(nn.Module):
    mode = "correct"

    def __init__(self, d_model, n_heads, n_kv_heads, bias=True):
        super().__init__()
        self.h, self.g, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        q = split_heads(self.w_q(query), self.h)
        k = split_heads(self.w_k(key), self.g)
        v = split_heads(self.w_v(value), self.g)
        group = self.h // self.g
        if self.mode == "repeat":
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        else:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        if self.mode == "no_scale":
            q = q * math.sqrt(self.d_head)
        if self.mode == "uniform_masked" and mask is not None:
            s = (q @ k.transpose(-2, -1) / math.sqrt(self.d_head)).masked_fill(~mask, -1e9)
            w = torch.softmax(s, dim=-1)  # a fully masked row comes out uniform
            return self.w_o(merge_heads(w @ v)), w
        out, w = sdpa(q, k, v, None if self.mode == "no_mask" else mask)
        return self.w_o(merge_heads(out)), w


@mistake("grouped_query_attention", id="gqa_repeat")
class GQARepeat(_GQA):
    mode = "repeat"


@mistake("grouped_query_attention", id="gqa_no_scale")
class GQANoScale(_GQA):
    mode = "no_scale"


@mistake("grouped_query_attention", id="gqa_no_mask")
class GQANoMask(_GQA):
    mode = "no_mask"


@mistake("grouped_query_attention", id="gqa_uniform_masked")
class GQAUniformMaskedRows(_GQA):
    mode = "uniform_masked"


@mistake("grouped_query_attention", id="gqa_full_projections")
class GQAFullKV(_GQA):
    """Projects keys and values for every head, then averages groups."""

    def __init__(self, d_model, n_heads, n_kv_heads, bias=True):
        super().__init__(d_model, n_heads, n_kv_heads, bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)


@alternative("grouped_query_attention")
class GQACorrect(_GQA):
    pass


@alternative("grouped_query_attention")
class GQAEinsumGroups(_GQA):
    """Queries reshaped into (B, G, group, T, d) and attended per group with einsum."""

    def forward(self, query, key, value, mask=None):
        B, n_q, D = query.shape
        n_k = key.shape[1]
        group = self.h // self.g
        q = self.w_q(query).view(B, n_q, self.g, group, self.d_head).permute(0, 2, 3, 1, 4)
        k = self.w_k(key).view(B, n_k, self.g, self.d_head).transpose(1, 2)  # (B, G, n_k, d)
        v = self.w_v(value).view(B, n_k, self.g, self.d_head).transpose(1, 2)
        s = torch.einsum("bgqtd,bgsd->bgqts", q, k) / math.sqrt(self.d_head)
        s = s.reshape(B, self.h, n_q, n_k)
        if mask is not None:
            m = mask.unsqueeze(1) if mask.dim() == 3 else mask
            m = m.expand(B, self.h, n_q, n_k)
            s = s.masked_fill(~m, -math.inf)
            w = torch.softmax(s, -1).nan_to_num(0.0)
        else:
            w = torch.softmax(s, -1)
        out = torch.einsum("bgqts,bgsd->bgqtd", w.view(B, self.g, group, n_q, n_k), v)
        out = out.reshape(B, self.h, n_q, self.d_head).transpose(1, 2).reshape(B, n_q, D)
        return self.w_o(out), w
