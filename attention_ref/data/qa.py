"""Extractive question answering for notebook 09: short contexts about invented people,
their inventions, birthplaces and years, and templated questions whose answer is a span
of the context.

A context tells the story of two or three people, its sentences shuffled::

    lina brask invented the glass pump in 1871 . odo fennel was born in marrow in 1843 .
    lina brask was born in tessel in 1839 . odo fennel invented the steam lamp in 1866 .

    question: when was odo fennel born ?              answer: 1843 (one token)
    question: who invented the glass pump ?           answer: lina brask (two tokens)
    question: what did odo fennel invent ?            answer: steam lamp

Every context holds several years, places and names, so the answer cannot be found by
its type alone: the model must find the sentence about the person (or invention) the
question names. Test contexts are fresh combinations of people and facts, never seen in
training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIRST_NAMES = [
    "ada",
    "lina",
    "odo",
    "bram",
    "celia",
    "ivo",
    "nora",
    "tam",
    "vera",
    "emil",
    "hugo",
    "ines",
    "karl",
    "mila",
    "otto",
    "rosa",
]
LAST_NAMES = [
    "brask",
    "fennel",
    "orlow",
    "tamsin",
    "quill",
    "harrow",
    "dunmore",
    "petrak",
    "solvay",
    "kestrel",
]
PLACES = [
    "marrow",
    "tessel",
    "ostrava",
    "lindqvist",
    "carrow",
    "velden",
    "amberley",
    "hollin",
    "skarn",
    "dumas",
]
MATERIALS = ["glass", "steam", "copper", "paper", "iron", "silk", "electric", "water"]
DEVICES = ["pump", "lamp", "loom", "press", "clock", "engine", "compass", "telegraph"]
YEARS = [str(y) for y in range(1800, 1900, 3)]

QUESTION_KINDS = ("born_where", "born_when", "invented_what", "invented_when", "invented_who")


@dataclass(frozen=True)
class QAExample:
    """One question about one context; the answer is ``context[start : end + 1]``."""

    question: list[str]
    context: list[str]
    start: int
    end: int
    kind: str

    @property
    def answer(self) -> list[str]:
        return self.context[self.start : self.end + 1]


@dataclass(frozen=True)
class QAData:
    train: list[QAExample]
    test: list[QAExample]


def _people(rng: np.random.Generator, n: int) -> list[dict]:
    firsts = rng.choice(len(FIRST_NAMES), size=n, replace=False)
    lasts = rng.choice(len(LAST_NAMES), size=n, replace=False)
    places = rng.choice(len(PLACES), size=n, replace=False)
    mats = rng.choice(len(MATERIALS), size=n, replace=False)
    devs = rng.choice(len(DEVICES), size=n, replace=False)
    years = rng.choice(len(YEARS), size=2 * n, replace=False)
    out = []
    for i in range(n):
        born, made = sorted((years[2 * i], years[2 * i + 1]))
        out.append(
            dict(
                name=[FIRST_NAMES[firsts[i]], LAST_NAMES[lasts[i]]],
                place=PLACES[places[i]],
                invention=[MATERIALS[mats[i]], DEVICES[devs[i]]],
                born=YEARS[born],
                made=YEARS[made],
            )
        )
    return out


def _example(rng: np.random.Generator, n_people: int) -> QAExample:
    people = _people(rng, n_people)
    sentences = []  # (tokens, person index, kind)
    for i, p in enumerate(people):
        sentences.append((p["name"] + ["was", "born", "in", p["place"], "in", p["born"], "."], i))
        sentences.append(
            (p["name"] + ["invented", "the", *p["invention"], "in", p["made"], "."], i)
        )
    order = rng.permutation(len(sentences))
    context: list[str] = []
    starts: dict[tuple[int, str], int] = {}  # (person, "born"|"invented") -> sentence start
    for j in order:
        tokens, i = sentences[j]
        starts[(i, tokens[2])] = len(context)
        context += tokens
    who = int(rng.integers(n_people))
    p = people[who]
    kind = QUESTION_KINDS[rng.integers(len(QUESTION_KINDS))]
    if kind == "born_where":
        q, s = ["where", "was", *p["name"], "born", "?"], starts[(who, "was")] + 5
        e = s
    elif kind == "born_when":
        q, s = ["when", "was", *p["name"], "born", "?"], starts[(who, "was")] + 7
        e = s
    elif kind == "invented_what":
        q, s = ["what", "did", *p["name"], "invent", "?"], starts[(who, "invented")] + 4
        e = s + 1
    elif kind == "invented_when":
        q = ["when", "did", *p["name"], "invent", "the", *p["invention"], "?"]
        s = e = starts[(who, "invented")] + 7
    else:
        q, s = ["who", "invented", "the", *p["invention"], "?"], starts[(who, "invented")]
        e = s + 1
    return QAExample(question=q, context=context, start=int(s), end=int(e), kind=kind)


def make_qa_data(
    n_train: int = 6000, n_test: int = 500, *, seed: int = 0, n_people: tuple[int, int] = (2, 3)
) -> QAData:
    """Generate the question-answering data.

    Args:
        n_train, n_test: the number of (question, context) examples in each split.
        seed: everything follows from it.
        n_people: the smallest and largest number of people a context talks about.

    Returns:
        A :class:`QAData`; each example's answer is ``context[start : end + 1]``. No test
        context occurs in training.
    """
    lo, hi = n_people
    if not 1 <= lo <= hi <= min(len(LAST_NAMES), len(DEVICES)):
        raise ValueError(f"n_people must be (lo, hi) with 1 <= lo <= hi <= 8; got {n_people}")
    rng = np.random.default_rng([seed, 90])
    train = [_example(rng, int(rng.integers(lo, hi + 1))) for _ in range(n_train)]
    seen = {tuple(ex.context) for ex in train}
    test: list[QAExample] = []
    while len(test) < n_test:
        ex = _example(rng, int(rng.integers(lo, hi + 1)))
        if tuple(ex.context) not in seen:
            test.append(ex)
    return QAData(train=train, test=test)
