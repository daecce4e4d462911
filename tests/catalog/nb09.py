"""Catalog for notebook 09: best_span, span_loss."""

import numpy as np
import torch
import torch.nn.functional as F

from . import alternative, mistake

NEG = float("-inf")

# ----------------------------------------------------------------------------- best_span


@mistake("best_span", id="span_end_before_start")
def best_span_two_argmaxes(start_logits, end_logits, mask, max_len=None):
    s = start_logits.masked_fill(~mask, NEG).argmax(1)
    e = end_logits.masked_fill(~mask, NEG).argmax(1)
    return s, e


@mistake("best_span", id="span_end_before_start")
def best_span_no_triangle(start_logits, end_logits, mask, max_len=None):
    T = mask.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    ok = mask[:, :, None] & mask[:, None, :]
    if max_len is not None:
        i = torch.arange(T)
        ok = ok & ((i[None, :] - i[:, None]) < max_len)
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat // T, flat % T


@mistake("best_span", id="span_mask_ignored")
def best_span_no_mask(start_logits, end_logits, mask, max_len=None):
    T = mask.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    ok = torch.ones(T, T, dtype=torch.bool).triu()
    if max_len is not None:
        ok = ok & ~torch.ones(T, T, dtype=torch.bool).triu(max_len)
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat // T, flat % T


@mistake("best_span", id="span_no_single_token")
def best_span_strict(start_logits, end_logits, mask, max_len=None):
    T = mask.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    ok = torch.ones(T, T, dtype=torch.bool).triu(1)
    if max_len is not None:
        ok = ok & ~torch.ones(T, T, dtype=torch.bool).triu(max_len)
    ok = ok & mask[:, :, None] & mask[:, None, :]
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat // T, flat % T


@mistake("best_span", id="span_max_len_ignored")
def best_span_ignores_max_len(start_logits, end_logits, mask, max_len=None):
    T = mask.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    ok = torch.ones(T, T, dtype=torch.bool).triu() & mask[:, :, None] & mask[:, None, :]
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat // T, flat % T


@mistake("best_span", id="span_start_end_swapped")
def best_span_swapped_decode(start_logits, end_logits, mask, max_len=None):
    T = mask.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    ok = torch.ones(T, T, dtype=torch.bool).triu()
    if max_len is not None:
        ok = ok & ~torch.ones(T, T, dtype=torch.bool).triu(max_len)
    ok = ok & mask[:, :, None] & mask[:, None, :]
    flat = scores.masked_fill(~ok, NEG).flatten(1).argmax(1)
    return flat % T, flat // T


@alternative("best_span")
def best_span_loops(start_logits, end_logits, mask, max_len=None):
    B, T = start_logits.shape
    starts, ends = [], []
    for b in range(B):
        best, arg = None, None
        for s in range(T):
            if not mask[b, s]:
                continue
            for e in range(s, T if max_len is None else min(T, s + max_len)):
                if not mask[b, e]:
                    continue
                score = float(start_logits[b, s]) + float(end_logits[b, e])
                if best is None or score > best:
                    best, arg = score, (s, e)
        starts.append(arg[0])
        ends.append(arg[1])
    kw = dict(dtype=torch.long, device=start_logits.device)
    return torch.tensor(starts, **kw), torch.tensor(ends, **kw)


@mistake("best_span", id="wrong_device")
def best_span_band_on_cpu(start_logits, end_logits, mask, max_len=None):
    """The valid spans' band built without device=: on the CPU whatever the logits' device."""
    B, T = start_logits.shape
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band = (j >= i) & ((j - i < max_len) if max_len is not None else True)  # (T, T)
    pair = mask[:, :, None] & mask[:, None, :] & band  # (B, T, T)
    score = start_logits[:, :, None] + end_logits[:, None, :]
    flat = score.masked_fill(~pair, NEG).flatten(1).argmax(1)  # (B,)
    return flat // T, flat % T


@alternative("best_span")
def best_span_running_max(start_logits, end_logits, mask, max_len=None):
    # For each end, the best start at or before it (a running maximum), when there is no
    # length limit; with one, score a band of diagonals.
    B, T = start_logits.shape
    s = start_logits.double().masked_fill(~mask, NEG)
    e = end_logits.double().masked_fill(~mask, NEG)
    best = s.new_full((B,), NEG)
    out_s = torch.zeros(B, dtype=torch.long, device=s.device)
    out_e = torch.zeros(B, dtype=torch.long, device=s.device)
    width = T if max_len is None else min(T, max_len)
    for d in range(width):  # spans of d + 1 tokens: start i, end i + d
        score = s[:, : T - d] + e[:, d:]  # (B, T - d)
        val, i = score.max(1)
        better = val > best
        best = torch.where(better, val, best)
        out_s = torch.where(better, i, out_s)
        out_e = torch.where(better, i + d, out_e)
    return out_s, out_e


# ----------------------------------------------------------------------------- span_loss


def _ce(logits, target, mask):
    log_p = torch.log_softmax(logits.masked_fill(~mask, NEG), dim=-1)
    return -log_p[torch.arange(len(target)), target].mean()


@mistake("span_loss", id="span_loss_mask_not_applied")
def span_loss_no_mask(start_logits, end_logits, start, end, mask):
    return (F.cross_entropy(start_logits, start) + F.cross_entropy(end_logits, end)) / 2


@mistake("span_loss", id="span_loss_summed_ends")
def span_loss_summed(start_logits, end_logits, start, end, mask):
    return _ce(start_logits, start, mask) + _ce(end_logits, end, mask)


@mistake("span_loss", id="span_loss_one_end")
def span_loss_start_only(start_logits, end_logits, start, end, mask):
    return _ce(start_logits, start, mask)


@mistake("span_loss", id="span_loss_summed_batch")
def span_loss_batch_sum(start_logits, end_logits, start, end, mask):
    return (_ce(start_logits, start, mask) + _ce(end_logits, end, mask)) / 2 * len(start)


@mistake("span_loss", id="span_loss_not_averaged")
def span_loss_per_example(start_logits, end_logits, start, end, mask):
    def ce(x, t):
        return F.cross_entropy(x.masked_fill(~mask, NEG), t, reduction="none")

    return (ce(start_logits, start) + ce(end_logits, end)) / 2


@mistake("span_loss", id="span_loss_probabilities")
def span_loss_probs(start_logits, end_logits, start, end, mask):
    rows = torch.arange(len(start))
    ps = torch.softmax(start_logits.masked_fill(~mask, NEG), -1)[rows, start]
    pe = torch.softmax(end_logits.masked_fill(~mask, NEG), -1)[rows, end]
    return -(ps.mean() + pe.mean()) / 2


@mistake("span_loss", id="wrong_device")
def span_loss_fill_on_cpu(start_logits, end_logits, start, end, mask):
    """Right on the CPU; the -inf table of the masked positions is built there."""
    minus_inf = torch.full(mask.shape, float("-inf"), dtype=start_logits.dtype)
    ls = F.cross_entropy(torch.where(mask, start_logits, minus_inf), start)
    le = F.cross_entropy(torch.where(mask, end_logits, minus_inf), end)
    return (ls + le) / 2


@alternative("span_loss")
def span_loss_cross_entropy(start_logits, end_logits, start, end, mask):
    ls = F.cross_entropy(start_logits.masked_fill(~mask, float("-inf")), start)
    le = F.cross_entropy(end_logits.masked_fill(~mask, float("-inf")), end)
    return (ls + le) / 2


@alternative("span_loss")
def span_loss_logsumexp(start_logits, end_logits, start, end, mask):
    # -log p = logsumexp over the context - the true logit; -1e9 plays the role of -inf.
    total = 0.0
    for logits, target in ((start_logits, start), (end_logits, end)):
        x = torch.where(mask, logits, torch.full_like(logits, -1e9))
        true = x.gather(1, target[:, None]).squeeze(1)
        total = total + (torch.logsumexp(x, dim=1) - true).mean()
    return total / 2


@alternative("span_loss")
def span_loss_stacked(start_logits, end_logits, start, end, mask):
    logits = torch.stack([start_logits, end_logits])  # (2, B, T)
    logits = logits.masked_fill(~mask, float("-inf"))
    targets = torch.stack([start, end])  # (2, B)
    log_p = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    return -log_p.mean()


@mistake("span_loss", id="span_loss_not_differentiable")
def span_loss_numpy(start_logits, end_logits, start, end, mask):
    """Computed in NumPy and wrapped in torch.tensor: the right number, no gradient."""

    def ce(logits, target):
        x = np.where(mask.numpy(), logits.detach().numpy(), -np.inf)
        x = x - x.max(-1, keepdims=True)
        log_p = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return -log_p[np.arange(len(target)), target.numpy()].mean()

    loss = (ce(start_logits, start) + ce(end_logits, end)) / 2
    return torch.tensor(loss, dtype=start_logits.dtype)


@mistake("span_loss", id="span_loss_not_differentiable")
def span_loss_detached(start_logits, end_logits, start, end, mask):
    """The right loss, detached (e.g. to log it) before it is returned."""
    return span_loss_cross_entropy(start_logits, end_logits, start, end, mask).detach()


@alternative("span_loss")
def span_loss_nll(start_logits, end_logits, start, end, mask):
    """F.nll_loss on log_softmax, with torch.where and a -inf tensor of the logits' dtype."""
    neg = torch.tensor(float("-inf"), dtype=start_logits.dtype)
    ls = F.nll_loss(torch.where(mask, start_logits, neg).log_softmax(-1), start)
    le = F.nll_loss(torch.where(mask, end_logits, neg).log_softmax(-1), end)
    return 0.5 * ls + 0.5 * le
