"""A synthetic language pair for notebook 08: English-like sentences and their
translation into "Velish", an invented language with its own words and another word order.

English (subject-verb-object, adjective before the noun, prepositions)::

    the old farmer paints a red house near the river

Velish (subject-object-verb, adjective after the noun, the article after both, the
subject marked ``ta`` and the object ``ko``, postpositions, the place before the verb)::

    tuvak vek la ta domi ruza un ko ulva la apud pentas

Every English word has exactly one Velish word, so a translator has to *reorder*, not just
substitute: the verb moves to the end, the prepositional phrase jumps in front of it and
each noun phrase is mirrored. The split is compositional: a few adjective-noun pairs (e.g.
"red horse") never occur in training, and every test sentence contains at least one of
them, so the test measures whether the model learned the rules rather than the phrases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOUNS = {
    "dog": "varo",
    "cat": "mesi",
    "bird": "pilu",
    "horse": "kandor",
    "farmer": "tuvak",
    "child": "nimo",
    "teacher": "selka",
    "king": "rauk",
    "house": "domi",
    "river": "ulva",
    "tree": "arbo",
    "garden": "hesta",
}
ADJECTIVES = {
    "big": "grano",
    "small": "pit",
    "red": "ruza",
    "old": "vek",
    "young": "jun",
    "happy": "felu",
    "quiet": "tiso",
    "green": "verd",
}
VERBS = {
    "sees": "vidas",
    "likes": "amas",
    "follows": "sekas",
    "finds": "trovas",
    "helps": "jutas",
    "watches": "gardas",
    "paints": "pentas",
    "visits": "vizitas",
}
PREPOSITIONS = {
    "near": "apud",
    "behind": "post",
    "under": "sub",
    "beside": "flank",
    "above": "supr",
}
ARTICLES = {"the": "la", "a": "un"}
SUBJECT_MARK, OBJECT_MARK = "ta", "ko"

LEXICON = {**NOUNS, **ADJECTIVES, **VERBS, **PREPOSITIONS, **ARTICLES}


@dataclass(frozen=True)
class TranslationData:
    """The generated corpus: parallel token lists and the held-out adjective-noun pairs."""

    train_src: list[list[str]]
    train_tgt: list[list[str]]
    test_src: list[list[str]]
    test_tgt: list[list[str]]
    held_out_pairs: tuple[tuple[str, str], ...]


def held_out_pairs(n_pairs: int = 12, seed: int = 0) -> tuple[tuple[str, str], ...]:
    """``n_pairs`` adjective-noun pairs kept out of training. Each adjective and each noun
    appears in at most two of them, so every word is still seen in many other pairs."""
    rng = np.random.default_rng([seed, 8])
    adjs, nouns = list(ADJECTIVES), list(NOUNS)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n_pairs:
        a, n = adjs[rng.integers(len(adjs))], nouns[rng.integers(len(nouns))]
        if (a, n) in pairs:
            continue
        if sum(p[0] == a for p in pairs) >= 2 or sum(p[1] == n for p in pairs) >= 2:
            continue
        pairs.append((a, n))
    return tuple(sorted(pairs))


def _noun_phrase(rng: np.random.Generator, p_adj: float) -> tuple[str, str | None, str]:
    art = ("the", "a")[rng.integers(2)]
    adj = list(ADJECTIVES)[rng.integers(len(ADJECTIVES))] if rng.random() < p_adj else None
    noun = list(NOUNS)[rng.integers(len(NOUNS))]
    return art, adj, noun


def _en_np(np_: tuple[str, str | None, str]) -> list[str]:
    art, adj, noun = np_
    return [art] + ([adj] if adj else []) + [noun]


def _ve_np(np_: tuple[str, str | None, str]) -> list[str]:
    art, adj, noun = np_
    return [NOUNS[noun]] + ([ADJECTIVES[adj]] if adj else []) + [ARTICLES[art]]


def translate_sentence(src: list[str]) -> list[str]:
    """The rule-based Velish translation of one English sentence of the grammar
    (``NP verb NP [preposition NP]``, each NP ``article [adjective] noun``)."""

    def parse_np(i: int) -> tuple[tuple[str, str | None, str], int]:
        art = src[i]
        if art not in ARTICLES:
            raise ValueError(f"expected an article at position {i} of {src}; got {art!r}")
        if src[i + 1] in ADJECTIVES:
            return (art, src[i + 1], src[i + 2]), i + 3
        return (art, None, src[i + 1]), i + 2

    subj, i = parse_np(0)
    verb = src[i]
    obj, i = parse_np(i + 1)
    out = _ve_np(subj) + [SUBJECT_MARK] + _ve_np(obj) + [OBJECT_MARK]
    if i < len(src):
        prep = src[i]
        place, i = parse_np(i + 1)
        out += _ve_np(place) + [PREPOSITIONS[prep]]
    if i != len(src):
        raise ValueError(f"unexpected words after the sentence: {src[i:]}")
    return out + [VERBS[verb]]


def alignment(src: list[str]) -> list[int | None]:
    """Where each word of ``translate_sentence(src)`` comes from: for target position
    ``j`` the index of its English word in ``src``, or None for the case markers ``ta``
    and ``ko``, which translate no single word."""
    idx = list(range(len(src)))

    def np_at(i: int) -> tuple[list[int], int]:  # English NP indices -> Velish order
        if src[i + 1] in ADJECTIVES:
            return [i + 2, i + 1, i], i + 3  # noun, adjective, article
        return [i + 1, i], i + 2

    translate_sentence(src)  # validates the sentence
    subj, i = np_at(0)
    verb = idx[i]
    obj, i = np_at(i + 1)
    out: list[int | None] = [*subj, None, *obj, None]
    if i < len(src):
        place, j = np_at(i + 1)
        out += [*place, i]
    return out + [verb]


def _sentence(rng: np.random.Generator, p_adj: float, p_pp: float) -> list[str]:
    subj, obj = _noun_phrase(rng, p_adj), _noun_phrase(rng, p_adj)
    verb = list(VERBS)[rng.integers(len(VERBS))]
    src = _en_np(subj) + [verb] + _en_np(obj)
    if rng.random() < p_pp:
        prep = list(PREPOSITIONS)[rng.integers(len(PREPOSITIONS))]
        src += [prep] + _en_np(_noun_phrase(rng, p_adj))
    return src


def _pairs_in(src: list[str]) -> set[tuple[str, str]]:
    return {(a, n) for a, n in zip(src, src[1:], strict=False) if a in ADJECTIVES and n in NOUNS}


def make_translation_data(
    n_train: int = 6000,
    n_test: int = 500,
    *,
    seed: int = 0,
    n_held_out: int = 12,
    p_adj: float = 0.6,
    p_pp: float = 0.5,
) -> TranslationData:
    """Generate the English-Velish corpus.

    Args:
        n_train, n_test: the number of sentence pairs in each split.
        seed: everything follows from it; the same seed gives the same corpus.
        n_held_out: how many adjective-noun pairs are kept out of training.
        p_adj: the probability that a noun phrase has an adjective.
        p_pp: the probability that a sentence ends with a prepositional phrase.

    Returns:
        A :class:`TranslationData`. No training sentence contains a held-out pair; every
        test sentence contains at least one; no test sentence occurs in training.
    """
    for name, n in (("n_train", n_train), ("n_test", n_test)):
        if n < 1:
            raise ValueError(f"{name} must be >= 1; got {n}")
    held = held_out_pairs(n_held_out, seed)
    held_set = set(held)
    rng = np.random.default_rng([seed, 80])
    train: list[list[str]] = []
    test: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    while len(train) < n_train:
        s = _sentence(rng, p_adj, p_pp)
        if not (_pairs_in(s) & held_set):
            train.append(s)
            seen.add(tuple(s))
    # Test sentences: plant a held-out pair in a random noun phrase of a fresh sentence.
    while len(test) < n_test:
        s = _sentence(rng, p_adj, p_pp)
        np_starts = [i for i, w in enumerate(s) if w in ARTICLES]
        i = np_starts[rng.integers(len(np_starts))]
        adj, noun = held[rng.integers(len(held))]
        end = i + (3 if s[i + 1] in ADJECTIVES else 2)
        s = s[: i + 1] + [adj, noun] + s[end:]
        if tuple(s) not in seen:
            test.append(s)
            seen.add(tuple(s))
    return TranslationData(
        train_src=train,
        train_tgt=[translate_sentence(s) for s in train],
        test_src=test,
        test_tgt=[translate_sentence(s) for s in test],
        held_out_pairs=held,
    )
