"""Extractive summarization for notebook 10: short reports in which a few sentences carry
the key facts and the rest is filler; the summary is those sentences, in order.

A document opens with a header naming its topic, then mixes three kinds of sentence::

    report on the harbor :                              (header, never part of a summary)
    the weather stayed mild all week .                  filler
    the harbor repaired its gate in may .               KEY: a fact about the topic
    the mill hired its staff in june .                  distractor: a fact, but not the topic's
    the harbor opened its hall in march .               KEY

Key sentences and distractors have exactly the same form; only the comparison with the
header tells them apart, so a model must relate each sentence to the start of the
document, which is what attention is for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOPICS = [
    "harbor",
    "mill",
    "school",
    "bridge",
    "market",
    "library",
    "station",
    "museum",
    "clinic",
    "theater",
]
VERBS = ["opened", "closed", "repaired", "expanded", "sold", "rebuilt", "painted", "inspected"]
OBJECTS = ["wing", "roof", "gate", "office", "garden", "hall", "tower", "kitchen"]
MONTHS = ["january", "march", "april", "may", "june", "august", "october", "december"]
FILLERS = [
    "the weather stayed mild all week .",
    "people talked about many things .",
    "nothing else was reported that day .",
    "it rained late in the evening .",
    "a few visitors came and went .",
    "the streets were busy as usual .",
    "some notes were lost in the post .",
    "the radio played old songs again .",
]


@dataclass(frozen=True)
class SummaryExample:
    """One document: its header, its body sentences and which of them are the summary."""

    header: list[str]
    sentences: list[list[str]]
    labels: list[bool]

    @property
    def tokens(self) -> list[str]:
        return self.header + [w for s in self.sentences for w in s]

    @property
    def sentence_ids(self) -> list[int]:
        """For each token: the index of its body sentence, or -1 in the header."""
        return [-1] * len(self.header) + [i for i, s in enumerate(self.sentences) for _ in s]

    @property
    def summary(self) -> list[list[str]]:
        return [s for s, key in zip(self.sentences, self.labels, strict=True) if key]


@dataclass(frozen=True)
class SummaryData:
    train: list[SummaryExample]
    test: list[SummaryExample]


def _fact(rng: np.random.Generator, entity: str) -> list[str]:
    verb = VERBS[rng.integers(len(VERBS))]
    obj = OBJECTS[rng.integers(len(OBJECTS))]
    month = MONTHS[rng.integers(len(MONTHS))]
    return ["the", entity, verb, "its", obj, "in", month, "."]


def _document(
    rng: np.random.Generator, n_sentences: tuple[int, int], n_key: tuple[int, int]
) -> SummaryExample:
    topic = TOPICS[rng.integers(len(TOPICS))]
    others = [t for t in TOPICS if t != topic]
    n = int(rng.integers(n_sentences[0], n_sentences[1] + 1))
    k = int(rng.integers(n_key[0], n_key[1] + 1))
    n_distract = int(rng.integers(1, max(2, (n - k) // 2 + 1)))
    kinds = ["key"] * k + ["distractor"] * n_distract + ["filler"] * (n - k - n_distract)
    kinds = [kinds[i] for i in rng.permutation(n)]
    sentences = []
    for kind in kinds:
        if kind == "key":
            sentences.append(_fact(rng, topic))
        elif kind == "distractor":
            sentences.append(_fact(rng, others[rng.integers(len(others))]))
        else:
            sentences.append(FILLERS[rng.integers(len(FILLERS))].split())
    return SummaryExample(
        header=["report", "on", "the", topic, ":"],
        sentences=sentences,
        labels=[kind == "key" for kind in kinds],
    )


def make_summarization_data(
    n_train: int = 4000,
    n_test: int = 500,
    *,
    seed: int = 0,
    n_sentences: tuple[int, int] = (6, 8),
    n_key: tuple[int, int] = (2, 3),
) -> SummaryData:
    """Generate the summarization data.

    Args:
        n_train, n_test: the number of documents in each split.
        seed: everything follows from it.
        n_sentences: the smallest and largest number of body sentences.
        n_key: the smallest and largest number of key (summary) sentences.

    Returns:
        A :class:`SummaryData`. No test document occurs in training.
    """
    if not 1 <= n_key[0] <= n_key[1] < n_sentences[0] <= n_sentences[1]:
        raise ValueError(
            "need 1 <= n_key[0] <= n_key[1] < n_sentences[0] <= n_sentences[1]; got "
            f"n_key={n_key}, n_sentences={n_sentences}"
        )
    rng = np.random.default_rng([seed, 100])
    train = [_document(rng, n_sentences, n_key) for _ in range(n_train)]
    seen = {tuple(d.tokens) for d in train}
    test: list[SummaryExample] = []
    while len(test) < n_test:
        d = _document(rng, n_sentences, n_key)
        if tuple(d.tokens) not in seen:
            test.append(d)
    return SummaryData(train=train, test=test)
