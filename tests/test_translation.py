"""Notebook 08's reference code: the English-Velish corpus, batching, the masked loss,
greedy and beam search, exact match and BLEU, and the training entry point."""

from __future__ import annotations

import itertools
import math

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from attention_ref import (
    beam_search,
    bleu,
    exact_match,
    greedy_search,
    make_batch,
    masked_cross_entropy,
)
from attention_ref.apps import translation as T
from attention_ref.apps.translation import bleu_by_hand
from attention_ref.checks.nb08 import GREEDY_TRAP, LATE_WINNER, TableLM
from attention_ref.data.translation import (
    ADJECTIVES,
    NOUNS,
    VERBS,
    held_out_pairs,
    make_translation_data,
    translate_sentence,
)


@pytest.fixture(scope="module")
def data():
    return make_translation_data(2000, 200, seed=0)


# ----------------------------------------------------------------------------- the corpus
def test_a_sentence_is_reordered_subject_object_place_verb():
    src = ["the", "old", "farmer", "paints", "a", "red", "house", "near", "the", "river"]
    assert translate_sentence(src) == (
        ["tuvak", "vek", "la", "ta", "domi", "ruza", "un", "ko", "ulva", "la", "apud", "pentas"]
    )
    assert translate_sentence(["a", "dog", "sees", "the", "cat"]) == [
        "varo",
        "un",
        "ta",
        "mesi",
        "la",
        "ko",
        "vidas",
    ]


def test_the_corpus_is_deterministic_per_seed():
    a, b = make_translation_data(300, 40, seed=5), make_translation_data(300, 40, seed=5)
    assert a == b
    c = make_translation_data(300, 40, seed=6)
    assert c.train_src != a.train_src


def test_targets_are_the_rule_translation_with_two_markers(data):
    for s, t in zip(data.train_src + data.test_src, data.train_tgt + data.test_tgt, strict=True):
        assert t == translate_sentence(s)
        assert len(t) == len(s) + 2
        assert t[-1] in VERBS.values()  # the verb comes last


def test_held_out_pairs_never_occur_in_training_and_every_test_sentence_has_one(data):
    held = set(data.held_out_pairs)
    assert len(held) == 12

    def pairs(s):
        return {(a, n) for a, n in itertools.pairwise(s) if a in ADJECTIVES and n in NOUNS}

    assert all(not (pairs(s) & held) for s in data.train_src)
    assert all(pairs(s) & held for s in data.test_src)
    train = {tuple(s) for s in data.train_src}
    assert not any(tuple(s) in train for s in data.test_src)
    # Only the combinations are new: every test word occurs in training.
    words = {w for s in data.train_src for w in s}
    assert {w for s in data.test_src for w in s} <= words


def test_held_out_pairs_spread_over_words():
    pairs = held_out_pairs(12, seed=3)
    assert len(set(pairs)) == 12
    for i in (0, 1):
        counts = [sum(p[i] == w for p in pairs) for w in {p[i] for p in pairs}]
        assert max(counts) <= 2


@pytest.mark.parametrize("bad", ["dog sees a cat", "the dog sees a cat loudly", "the dog sees"])
def test_translate_sentence_rejects_sentences_outside_the_grammar(bad):
    with pytest.raises((ValueError, IndexError, KeyError)):
        translate_sentence(bad.split())


def test_make_translation_data_rejects_empty_splits():
    with pytest.raises(ValueError, match="n_train"):
        make_translation_data(0, 10)


# ----------------------------------------------------------------------------- batching
def test_make_batch_pads_right_and_splits_for_teacher_forcing():
    src, tgt_in, tgt_out, mask = make_batch(
        [[5, 6, 7], [8]], [[1, 9, 2], [1, 9, 9, 9, 2]], pad_id=0
    )
    assert src.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert tgt_in.tolist() == [[1, 9, 2, 0], [1, 9, 9, 9]]
    assert tgt_out.tolist() == [[9, 2, 0, 0], [9, 9, 9, 2]]
    assert mask.tolist() == [[True, True, False, False], [True] * 4]
    assert mask.dtype == torch.bool and src.dtype == tgt_in.dtype == torch.long


def test_make_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="as many"):
        make_batch([[3]], [[1, 2], [1, 2]])
    with pytest.raises(ValueError, match="tgt_seqs\\[0\\]"):
        make_batch([[3]], [[1]])


# ----------------------------------------------------------------------------- the loss
def test_masked_cross_entropy_equals_torch_with_ignore_index():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    mask = torch.arange(5)[None] < torch.tensor([5, 2, 3])[:, None]
    want = F.cross_entropy(logits.transpose(1, 2), targets.masked_fill(~mask, -100))
    assert torch.allclose(masked_cross_entropy(logits, targets, mask), want)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_label_smoothing_equals_torch_cross_entropy(eps, dtype):
    g = torch.Generator().manual_seed(2)
    logits = (3 * torch.randn(4, 6, 9, generator=g, dtype=torch.float64)).to(dtype)
    logits.requires_grad_(True)
    targets = torch.randint(0, 9, (4, 6), generator=g)
    mask = torch.arange(6)[None] < torch.tensor([6, 1, 3, 5])[:, None]
    # Arbitrary targets at the padding (-100 and ids outside the vocabulary) are fine.
    junk = torch.tensor([-100, 9, 50, -1])[torch.randint(0, 4, (4, 6), generator=g)]
    ours = masked_cross_entropy(logits, torch.where(mask, targets, junk), mask, eps)
    ref_logits = logits.detach().clone().requires_grad_(True)
    want = F.cross_entropy(
        ref_logits.transpose(1, 2), targets.masked_fill(~mask, -100), label_smoothing=eps
    )
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=0)
    torch.testing.assert_close(ours, want, **tol)
    ours.backward()
    want.backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, **tol)
    assert ours.dtype == dtype


def test_label_smoothing_rejects_bad_values():
    logits, targets = torch.randn(1, 2, 3), torch.zeros(1, 2, dtype=torch.long)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="label_smoothing"):
        masked_cross_entropy(logits, targets, mask, label_smoothing=1.5)
    with pytest.raises(TypeError, match="label_smoothing"):
        masked_cross_entropy(logits, targets, mask, label_smoothing="0.1")
    with pytest.raises(ValueError, match="real"):
        masked_cross_entropy(logits, torch.tensor([[0, 7]]), mask)


def test_padding_changes_neither_loss_nor_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 6, generator=g, requires_grad=True)
    targets = torch.randint(0, 6, (2, 4), generator=g)
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    other = logits.detach().clone()
    other[~mask] = 1e4 * torch.randn(int((~mask).sum()), 6, generator=g)
    other.requires_grad_(True)
    a, b = masked_cross_entropy(logits, targets, mask), masked_cross_entropy(other, targets, mask)
    a.backward()
    b.backward()
    assert torch.allclose(a, b)
    assert torch.allclose(logits.grad, other.grad)
    assert torch.all(logits.grad[~mask] == 0)


def test_masked_cross_entropy_rejects_bad_input():
    logits = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="targets and mask"):
        masked_cross_entropy(logits, torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4) > 0)
    with pytest.raises(TypeError, match="mask must be boolean"):
        masked_cross_entropy(logits, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(ValueError, match="logits"):
        masked_cross_entropy(
            torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3) > 0
        )


# ----------------------------------------------------------------------------- decoding
def _argmax_decode(step_fn, bos, eos, max_len):
    seq, score = [bos], 0.0
    for _ in range(max_len):
        lp = step_fn(torch.tensor([seq]))[0]
        tok = int(lp.argmax())
        score += float(lp[tok])
        if tok == eos:
            return seq[1:], score
        seq.append(tok)
    return seq[1:], score


@pytest.mark.parametrize("seed", range(6))
def test_beam_of_one_is_greedy_decoding(seed):
    lm = TableLM(8, 1, 2, seed)
    tokens, score = beam_search(lm, 1, 2, beam_size=1, max_len=10)
    want_tokens, want_score = _argmax_decode(lm, 1, 2, 10)
    assert tokens == want_tokens == greedy_search(lm, 1, 2, max_len=10)
    assert math.isclose(score, want_score, rel_tol=1e-12)


def test_beam_search_finds_a_better_sequence_than_greedy():
    lm = TableLM(5, 1, 2, 0, table=GREEDY_TRAP)
    greedy_tokens, greedy_score = beam_search(lm, 1, 2, beam_size=1, max_len=5)
    tokens, score = beam_search(lm, 1, 2, beam_size=2, max_len=5)
    assert greedy_tokens == [3, 3] and tokens == [4]
    assert math.isclose(score, math.log(0.45 * 0.95), rel_tol=1e-4) and score > greedy_score


def test_beam_search_keeps_searching_after_the_first_finished_hypothesis():
    lm = TableLM(7, 1, 2, 0, table=LATE_WINNER)
    assert beam_search(lm, 1, 2, beam_size=3, max_len=6)[0] == [4, 5]


@pytest.mark.parametrize("seed", range(4))
def test_a_wide_beam_finds_the_most_probable_sequence(seed):
    V, max_len = 4, 3
    lm = TableLM(V, 1, 2, seed, temp=1.0)

    def score(seq):  # log-probability of seq (+ eos unless truncated)
        s, prefix = 0.0, [1]
        for tok in seq:
            s += float(lm(torch.tensor([prefix]))[0, tok])
            prefix.append(tok)
        return s

    best = -math.inf
    for n in range(max_len + 1):
        for seq in itertools.product([t for t in range(V) if t != 2], repeat=n):
            full = list(seq) + ([2] if n < max_len else [])
            best = max(best, score(full))
    _, got = beam_search(lm, 1, 2, beam_size=V**max_len, max_len=max_len)
    assert math.isclose(got, best, rel_tol=1e-12)


def test_beam_search_rejects_bad_input():
    lm = TableLM(5, 1, 2, 0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(lm, 1, 2, beam_size=0)
    with pytest.raises(TypeError, match="bos_id"):
        beam_search(lm, 1.0, 2)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(lm, 1, 2, max_len=0)
    with pytest.raises(ValueError, match="step_fn must return"):
        beam_search(lambda p: torch.zeros(5), 1, 2)


# ----------------------------------------------------------------------------- metrics
def test_bleu_is_sacrebleu_corpus_bleu_on_the_0_to_100_scale():
    refs = [["a", "b", "c", "d", "e"], ["x", "y", "z", "w", "v", "u"]]
    cands = [["a", "b", "c", "d", "f"], ["x", "y", "z", "w", "u"]]
    want = sacrebleu.corpus_bleu(
        [" ".join(c) for c in cands], [[" ".join(r) for r in refs]], tokenize="none"
    ).score
    assert bleu(cands, refs) == pytest.approx(want)
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert bleu([["q", "r", "s", "t"]], [refs[0]]) == pytest.approx(0.0)
    # The corpus has no punctuation: sacrebleu's default tokenizer (13a) agrees.
    assert bleu(cands, refs, tokenize="13a") == pytest.approx(bleu(cands, refs))


def test_bleu_by_hand_on_known_cases():
    ref = ["a", "b", "c", "d", "e"]
    assert bleu_by_hand([ref], [ref]) == pytest.approx(100.0)
    assert bleu_by_hand([["x", "y", "z", "w"]], [ref]) == 0.0
    # Clipping: "the" counts at most once, as often as in the reference.
    assert bleu_by_hand([["the"] * 4], [["the", "cat"]], max_n=1) == pytest.approx(25.0)
    # p1..p4 = 3/4, 2/3, 1/2, 0/1: zero without smoothing.
    assert bleu_by_hand([["a", "b", "c", "d"]], [["a", "b", "c", "e"]]) == 0.0
    # Brevity penalty: a correct but short candidate, exp(1 - 5/4) with p_n = 1 (max_n=2).
    assert bleu_by_hand([ref[:4]], [ref], max_n=2) == pytest.approx(100 * math.exp(1 - 5 / 4))


@pytest.mark.parametrize("seed", range(8))
def test_bleu_by_hand_agrees_with_sacrebleu(seed):
    """The teaching aid is sacrebleu's corpus BLEU without smoothing, on random corpora
    (clipping, brevity penalty, zero precisions); with every p_n > 0 it equals bleu()."""
    g = torch.Generator().manual_seed(seed)
    words = [f"w{i}" for i in range(6)]

    def sentence(n):
        return [words[i] for i in torch.randint(0, len(words), (n,), generator=g).tolist()]

    refs = [sentence(int(torch.randint(3, 9, (1,), generator=g))) for _ in range(12)]
    cands = [(r[: len(r) - seed % 3] if i % 2 else sentence(len(r))) for i, r in enumerate(refs)]
    hyp_s, ref_s = [" ".join(c) for c in cands], [[" ".join(r) for r in refs]]
    plain = sacrebleu.corpus_bleu(hyp_s, ref_s, tokenize="none", smooth_method="none")
    assert bleu_by_hand(cands, refs) == pytest.approx(plain.score, abs=1e-9)
    if min(plain.counts) > 0:
        assert bleu_by_hand(cands, refs) == pytest.approx(bleu(cands, refs), abs=1e-9)


def test_bleu_and_exact_match_reject_mismatched_lists():
    with pytest.raises(ValueError, match="as many"):
        bleu([["a"]], [["a"], ["b"]])
    with pytest.raises(ValueError, match="as many"):
        bleu_by_hand([["a"]], [["a"], ["b"]])
    with pytest.raises(TypeError, match="token lists"):
        bleu(["a b"], [["a", "b"]])
    with pytest.raises(ValueError, match="as many"):
        exact_match([], [])
    assert exact_match([["a"], ["b", "c"]], [["a"], ["b"]]) == 0.5


# ----------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def tiny(monkeypatch_module):
    monkeypatch_module.setitem(T.TRANSLATION_CONFIG, "n_train", 300)
    monkeypatch_module.setitem(T.TRANSLATION_CONFIG, "n_test", 12)
    monkeypatch_module.setitem(T.TRANSLATION_CONFIG, "steps", 6)
    monkeypatch_module.setitem(T.TRANSLATION_CONFIG, "warmup", 2)
    return T.train_translation(seed=1, device="cpu", progress=False)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_train_translation_follows_the_benchmark_contract(tiny):
    assert tiny.metric == "exact_match"
    assert 0.0 <= tiny.value <= 1.0 and 0.0 <= tiny.bleu <= 100.0
    assert tiny.bleu == pytest.approx(bleu(tiny.predictions, tiny.data.test_tgt))
    assert tiny.train_seconds > 0 and tiny.history.steps == 6
    assert isinstance(tiny.model, torch.nn.Module)
    assert tiny.value == exact_match(tiny.predictions, tiny.data.test_tgt)


def test_training_is_deterministic_per_seed(tiny):
    again = T.train_translation(seed=1, device="cpu", progress=False)
    assert again.history.losses == tiny.history.losses
    assert again.predictions == tiny.predictions


def test_beam_of_one_through_the_model_equals_batched_greedy(tiny):
    src = tiny.data.test_src[:4]
    greedy = T.translate(tiny.model, src, tiny.src_vocab, tiny.tgt_vocab, max_len=8)
    beam1 = T.translate(tiny.model, src, tiny.src_vocab, tiny.tgt_vocab, beam_size=1, max_len=8)
    assert greedy == beam1
    # beam_size=1 via beam_search, one sentence at a time
    one = []
    for s in src:
        ids = torch.tensor([tiny.src_vocab.encode(s)])
        toks, _ = beam_search(T.model_step_fn(tiny.model, ids), 1, 2, beam_size=1, max_len=8)
        one.append(tiny.tgt_vocab.decode(toks))
    assert one == greedy


def test_cross_attention_has_one_distribution_per_target_step(tiny):
    s, t = tiny.data.test_src[0], tiny.data.test_tgt[0]
    w = T.cross_attention(tiny.model, s, t, tiny.src_vocab, tiny.tgt_vocab)
    cfg = T.TRANSLATION_CONFIG
    assert w.shape == (cfg["n_layers"], cfg["n_heads"], len(t) + 1, len(s))
    assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)
