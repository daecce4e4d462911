"""Catalog for notebook 08: make_batch, masked_cross_entropy, beam_search."""

import math

import torch
import torch.nn.functional as F

from . import alternative, mistake

# ----------------------------------------------------------------------------- make_batch


def _right_pad(seqs, pad_id):
    T = max(len(s) for s in seqs)
    out = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


@mistake("make_batch", id="tgt_in_out_swapped")
def batch_swapped(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, pad_id), _right_pad(tgt_seqs, pad_id)
    return src, tgt[:, 1:], tgt[:, :-1], tgt[:, :-1] != pad_id


@mistake("make_batch", id="tgt_mask_from_tgt_in")
def batch_mask_from_input(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, pad_id), _right_pad(tgt_seqs, pad_id)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    return src, tgt_in, tgt_out, tgt_in != pad_id


@mistake("make_batch", id="target_not_shifted")
def batch_not_shifted(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, pad_id), _right_pad(tgt_seqs, pad_id)
    return src, tgt, tgt, tgt != pad_id


@mistake("make_batch", id="padded_on_left")
def batch_left_padded(src_seqs, tgt_seqs, pad_id=0):
    def left(seqs):
        T = max(len(s) for s in seqs)
        return torch.tensor([[pad_id] * (T - len(s)) + list(s) for s in seqs])

    src, tgt = left(src_seqs), left(tgt_seqs)
    return src, tgt[:, :-1], tgt[:, 1:], tgt[:, 1:] != pad_id


@mistake("make_batch", id="pad_with_zero")
def batch_pads_with_zero(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, 0), _right_pad(tgt_seqs, 0)
    return src, tgt[:, :-1], tgt[:, 1:], tgt[:, 1:] != 0


@mistake("make_batch", id="tgt_mask_inverted")
def batch_mask_inverted(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, pad_id), _right_pad(tgt_seqs, pad_id)
    return src, tgt[:, :-1], tgt[:, 1:], tgt[:, 1:] == pad_id


@mistake("make_batch", id="mask_not_boolean")
def batch_float_mask(src_seqs, tgt_seqs, pad_id=0):
    src, tgt = _right_pad(src_seqs, pad_id), _right_pad(tgt_seqs, pad_id)
    return src, tgt[:, :-1], tgt[:, 1:], (tgt[:, 1:] != pad_id).float()


@alternative("make_batch")
def batch_pad_sequence(src_seqs, tgt_seqs, pad_id=0):
    from torch.nn.utils.rnn import pad_sequence

    src = pad_sequence([torch.tensor(s) for s in src_seqs], batch_first=True, padding_value=pad_id)
    tgt = pad_sequence([torch.tensor(t) for t in tgt_seqs], batch_first=True, padding_value=pad_id)
    lengths = torch.tensor([len(t) for t in tgt_seqs])
    mask = torch.arange(tgt.shape[1])[None, :] < lengths[:, None]
    return src.long(), tgt[:, :-1].long(), tgt[:, 1:].long(), mask[:, 1:]


@alternative("make_batch")
def batch_lists(src_seqs, tgt_seqs, pad_id=0):
    S = max(map(len, src_seqs))
    T = max(map(len, tgt_seqs))
    src = [list(s) + [pad_id] * (S - len(s)) for s in src_seqs]
    tin = [list(t[:-1]) + [pad_id] * (T - len(t)) for t in tgt_seqs]
    tout = [list(t[1:]) + [pad_id] * (T - len(t)) for t in tgt_seqs]
    mask = [[True] * (len(t) - 1) + [False] * (T - len(t)) for t in tgt_seqs]
    return (
        torch.tensor(src, dtype=torch.long),
        torch.tensor(tin, dtype=torch.long),
        torch.tensor(tout, dtype=torch.long),
        torch.tensor(mask, dtype=torch.bool),
    )


# ----------------------------------------------------------------------------- masked_cross_entropy


def _nll(logits, targets, mask=None):
    """-log p(target) per position; masked targets (arbitrary) are replaced by id 0 first."""
    if mask is not None:
        targets = torch.where(mask, targets, torch.zeros_like(targets))
    return -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@mistake("masked_cross_entropy", id="loss_padding_averaged")
def mce_plain_mean(logits, targets, mask):
    return _nll(logits, targets).mean()


@mistake("masked_cross_entropy", id="loss_per_batch")
def mce_batch_mean(logits, targets, mask):
    return (_nll(logits, targets, mask) * mask).sum() / logits.shape[0]


@mistake("masked_cross_entropy", id="loss_per_sentence")
def mce_per_sentence(logits, targets, mask):
    per = (_nll(logits, targets, mask) * mask).sum(1) / mask.sum(1)
    return per[mask.any(1)].mean()


@mistake("masked_cross_entropy", id="loss_per_padded_length")
def mce_all_positions(logits, targets, mask):
    return (_nll(logits, targets, mask) * mask).sum() / mask.numel()


@mistake("masked_cross_entropy", id="loss_per_padded_length")
def mce_per_sequence_over_max_len(logits, targets, mask):
    """Each sentence's summed loss over the padded length T, then the batch mean."""
    T = mask.shape[1]
    return ((_nll(logits, targets, mask) * mask).sum(1) / T).mean()


@mistake("masked_cross_entropy", id="masked_targets_as_indices")
def mce_gather_raw_targets(logits, targets, mask):
    """Correct arithmetic, but it indexes with the targets of the padding too."""
    picked = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum() / mask.sum()


@mistake("masked_cross_entropy", id="masked_targets_as_indices")
def mce_builtin_without_ignore_index(logits, targets, mask):
    """F.cross_entropy on every position, then masked: fails on ids outside the vocabulary."""
    per = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return (per * mask).sum() / mask.sum()


@mistake("masked_cross_entropy", id="loss_no_log_softmax")
def mce_raw_logits(logits, targets, mask):
    picked = -logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum() / mask.sum()


@mistake("masked_cross_entropy", id="loss_mask_inverted")
def mce_inverted(logits, targets, mask):
    keep = ~mask
    return (_nll(logits, targets) * keep).sum() / keep.sum().clamp(min=1)


@mistake("masked_cross_entropy", id="loss_item")
def mce_item(logits, targets, mask):
    return ((_nll(logits, targets, mask) * mask).sum() / mask.sum()).item()


@mistake("masked_cross_entropy", id="loss_log_underflow")
def mce_log_of_softmax(logits, targets, mask):
    p = torch.softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return -(torch.log(p) * mask).sum() / mask.sum()


@mistake("masked_cross_entropy", id="wrong_device")
def mce_zeros_on_cpu(logits, targets, mask):
    """Right on the CPU; the zeros of the masked positions are built there."""
    safe = targets.masked_fill(~mask, 0)
    nll = -torch.log_softmax(logits, -1).gather(-1, safe[..., None])[..., 0]  # (B, T)
    nll = torch.where(mask, nll, torch.zeros(mask.shape, dtype=nll.dtype))
    return nll.sum() / mask.sum()


@alternative("masked_cross_entropy")
def mce_builtin_reduction_none(logits, targets, mask):
    B, T, V = logits.shape
    safe = targets.masked_fill(~mask, 0)  # any valid id: these positions are dropped
    per_token = F.cross_entropy(logits.reshape(B * T, V), safe.reshape(B * T), reduction="none")
    return per_token[mask.reshape(-1)].sum() / mask.sum()


@alternative("masked_cross_entropy")
def mce_logsumexp_float64(logits, targets, mask):
    x = logits.double()
    picked = x.gather(-1, targets.clamp(0, x.shape[-1] - 1)[..., None])[..., 0]
    nll = torch.logsumexp(x, -1) - picked
    nll = torch.where(mask, nll, torch.zeros_like(nll))
    return (nll.sum() / mask.sum().clamp(min=1)).to(logits.dtype)


@alternative("masked_cross_entropy")
def mce_boolean_selection(logits, targets, mask):
    """Select the real positions first: the masked targets are never touched."""
    log_p = torch.log_softmax(logits[mask], -1)  # (N, V)
    return -log_p.gather(-1, targets[mask][:, None]).mean()


@alternative("masked_cross_entropy")
def mce_ignore_index(logits, targets, mask):
    t = targets.masked_fill(~mask, -100)
    return F.cross_entropy(logits.transpose(1, 2), t, ignore_index=-100)


# ----------------------------------------------------------------------------- beam_search


def _beam(step_fn, bos_id, eos_id, beam_size, max_len, **bug):
    """A plain-Python beam search; ``bug`` switches on one mistake."""
    alive = [([bos_id], 0.0)]
    finished = []
    for _ in range(max_len):
        lp = step_fn(torch.tensor([seq for seq, _ in alive], dtype=torch.long))
        cands = []
        for (seq, s), row in zip(alive, lp.tolist(), strict=False):
            for tok, v in enumerate(row):
                if bug.get("last_only"):
                    cands.append((seq + [tok], v))
                elif bug.get("prob"):
                    cands.append((seq + [tok], s + math.exp(v)))
                else:
                    cands.append((seq + [tok], s + v))
        cands.sort(key=lambda c: -c[1])
        width = 1 if bug.get("greedy") else beam_size
        alive = []
        for seq, s in cands[:width]:
            if seq[-1] == eos_id:
                finished.append((seq[1:-1], s))
            else:
                alive.append((seq, s))
        if bug.get("first") and finished:
            return finished[0]
        if not alive:
            break
        best_done = max((s for _, s in finished), default=-math.inf)
        if bug.get("stop_worst") and best_done >= min(s for _, s in alive):  # min: the bug
            break
    else:
        finished += [(seq[1:], s) for seq, s in alive]
    toks, s = max(finished, key=lambda f: f[1])
    if bug.get("with_bos"):
        toks = [bos_id] + toks
    return toks, s


@mistake("beam_search", id="beam_greedy")
def beam_greedy(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, greedy=True)


@mistake("beam_search", id="beam_last_only")
def beam_last_only(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, last_only=True)


@mistake("beam_search", id="beam_probabilities")
def beam_probabilities(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, prob=True)


@mistake("beam_search", id="beam_first_finished")
def beam_first_finished(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, first=True)


@mistake("beam_search", id="beam_stop_against_worst")
def beam_stop_against_worst(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, stop_worst=True)


@mistake("beam_search", id="wrong_default")
def beam_default_beam_size_5(step_fn, bos_id, eos_id, beam_size=5, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len)


@mistake("beam_search", id="wrong_type")
def beam_tokens_as_tensor(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    tokens, score = _beam(step_fn, bos_id, eos_id, beam_size, max_len)
    return torch.tensor(tokens, dtype=torch.long), score


@mistake("beam_search", id="output_includes_bos")
def beam_with_bos(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len, with_bos=True)


@alternative("beam_search")
def beam_refill(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    """The common variant that refills the beam to beam_size unfinished hypotheses: the
    extra hypotheses all score below a finished one, so the answer is the same."""
    alive = torch.tensor([[bos_id]])
    scores = torch.zeros(1, dtype=torch.float64)
    finished = []
    for _ in range(max_len):
        cand = scores[:, None] + step_fn(alive).double()  # (n, V)
        V = cand.shape[1]
        order = cand.flatten().argsort(descending=True)
        for f in order[:beam_size].tolist():
            if f % V == eos_id:
                finished.append((alive[f // V, 1:].tolist(), float(cand.flatten()[f])))
        keep = [f for f in order.tolist() if f % V != eos_id][:beam_size]
        alive = torch.cat([alive[[f // V for f in keep]], torch.tensor([[f % V] for f in keep])], 1)
        scores = cand.flatten()[keep]
        if finished and max(s for _, s in finished) >= float(scores.max()):
            break
    else:
        finished += [(a[1:].tolist(), float(s)) for a, s in zip(alive, scores, strict=False)]
    return max(finished, key=lambda f: f[1])


@alternative("beam_search")
def beam_python_lists(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    """One prefix at a time, no early stop: runs all max_len steps unless the beam empties."""
    return _beam(step_fn, bos_id, eos_id, beam_size, max_len)


@alternative("beam_search")
def beam_tensor_topk(step_fn, bos_id, eos_id, beam_size=4, max_len=20):
    seqs = torch.full((1, 1), bos_id, dtype=torch.long)
    scores = torch.zeros(1, dtype=torch.float64)
    best_tokens, best_score = None, -math.inf
    for _ in range(max_len):
        logp = step_fn(seqs).to(torch.float64)  # (n, V)
        total = (scores.unsqueeze(1) + logp).reshape(-1)
        k = min(beam_size, total.numel())
        top_scores, top_idx = torch.topk(total, k)
        parent = torch.div(top_idx, logp.shape[1], rounding_mode="floor")
        token = top_idx % logp.shape[1]
        ended = token == eos_id
        for s, p in zip(top_scores[ended].tolist(), parent[ended].tolist(), strict=False):
            if s > best_score:
                best_tokens, best_score = seqs[p, 1:].tolist(), s
        if bool(ended.all()):
            break
        seqs = torch.cat([seqs[parent[~ended]], token[~ended].unsqueeze(1)], dim=1)
        scores = top_scores[~ended]
    else:
        for row, s in zip(seqs.tolist(), scores.tolist(), strict=False):
            if s > best_score:
                best_tokens, best_score = row[1:], s
    return best_tokens, best_score
