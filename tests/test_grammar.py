"""The grammar of notebook 11: deterministic, exact probabilities, a validator, and a
language in which a bigram model is clearly worse than the entropy floor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from attention_ref.data.grammar import (
    PCFG,
    SPECIALS,
    BigramModel,
    english_grammar,
    entropy_floor,
    make_grammar_data,
    sample_sentences,
)


def tiny() -> PCFG:
    """a^n-like toy: S -> A B . | A . ; A -> 'x' | 'y' ; B from a lexicon."""
    rules = {
        "S": [(0.6, ("A", "B", ".")), (0.4, ("A", "."))],
        "A": [(0.3, ("x",)), (0.7, ("y",))],
    }
    lexicon = {"B": {"u": 0.5, "v": 0.25, "w": 0.25}}
    return PCFG(rules, lexicon)


def test_tiny_grammar_probabilities_are_exact_and_sum_to_one():
    g = tiny()
    total = 0.0
    for n in (2, 3):
        for words in itertools.product(["x", "y", "u", "v", "w", "."], repeat=n):
            p, derivations = g.parses(words)
            assert derivations in (0, 1)
            total += p
    assert math.isclose(total, 1.0, rel_tol=1e-12)
    assert math.isclose(g.log_prob(["y", "v", "."]), math.log(0.6 * 0.7 * 0.25))
    assert g.log_prob(["x", "u"]) == -math.inf


def test_tiny_grammar_sampling_matches_probabilities():
    g = tiny()
    rng = np.random.default_rng(0)
    draws = [tuple(g.sample(rng)[0]) for _ in range(20000)]
    freq = draws.count(("y", "u", ".")) / len(draws)
    assert abs(freq - 0.6 * 0.7 * 0.5) < 0.015
    # the exact entropy of the tiny language, and the sample average close to it
    sents = [s for n in (2, 3) for s in itertools.product("xyuvw.", repeat=n)]
    probs = [g.parses(s)[0] for s in sents]
    H = -sum(p * math.log(p) for p in probs if p > 0)
    avg = -np.mean([g.log_prob(d) for d in draws])
    assert abs(avg - H) < 0.03


def test_sample_many_draws_what_repeated_sample_draws():
    # make_grammar_data draws with sample_many (fast); the data must be sample's, exactly
    for g, n in ((english_grammar(), 3000), (tiny(), 5000)):
        rng = np.random.default_rng(5)
        one_by_one = [g.sample(rng) for _ in range(n)]  # (words, log p, categories) each
        assert g.sample_many(np.random.default_rng(5), n) == one_by_one


def test_probabilities_must_sum_to_one():
    with pytest.raises(ValueError, match="summing"):
        PCFG({"S": [(0.5, ("a",))]}, {})


def test_generation_is_deterministic_and_seeded():
    g = english_grammar()
    a = [s.words for s in sample_sentences(g, 50, seed=3)]
    b = [s.words for s in sample_sentences(g, 50, seed=3)]
    c = [s.words for s in sample_sentences(g, 50, seed=4)]
    assert a == b and a != c


def test_every_sentence_has_one_derivation_and_its_log_prob():
    g = english_grammar()
    for s in sample_sentences(g, 300, seed=1):
        p, derivations = g.parses(s.words)
        assert derivations == 1, " ".join(s.words)
        assert math.isclose(math.log(p), s.log_prob, rel_tol=1e-9, abs_tol=1e-9)


def test_validator_accepts_generated_and_rejects_corrupted_sentences():
    g = english_grammar()
    sents = sample_sentences(g, 200, seed=2)
    assert all(g.is_grammatical(s.words) for s in sents)
    rejected = 0
    for s in sents:
        bad = list(s.words)
        bad[s.verb_pos] = s.wrong_verb  # break the agreement
        rejected += not g.is_grammatical(bad)
    assert rejected == len(sents)
    assert not g.is_grammatical(["the", "keys", "."])
    assert not g.is_grammatical(["the", "key", "near", "the", "boxes", "are", "rusty", "."])
    assert g.is_grammatical(["the", "key", "near", "the", "boxes", "is", "rusty", "."])
    assert g.is_grammatical(["the", "queen", "near", "the", "kings", "praises", "herself", "."])
    assert not g.is_grammatical(["the", "queen", "near", "the", "kings", "praises", "himself", "."])


def test_vocabulary_and_annotations():
    data = make_grammar_data(2000, 200, 500, seed=0)
    assert len(data.vocab) - len(SPECIALS) >= 300
    att = data.attractor_test()
    assert len(att) > 50
    for s in att:
        assert s.attractor_pos is not None and s.subject_pos < s.attractor_pos < s.verb_pos
        assert s.attractor_number != s.number


def test_bigram_is_at_least_1_3_times_the_floor_and_fails_on_attractors():
    data = make_grammar_data(20000, 1000, 2000, seed=0)
    floor = data.floor()
    assert math.isclose(floor, entropy_floor(data.test))
    bigram = BigramModel(data.vocab.itos[len(SPECIALS) :]).fit(
        [s.words for s in data.train], [s.words for s in data.valid]
    )
    ratio = bigram.cross_entropy([s.words for s in data.test]) / floor
    assert ratio >= 1.3, ratio
    assert bigram.agreement(data.attractor_test()) <= 0.6
