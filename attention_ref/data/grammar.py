"""A small probabilistic grammar of English sentences whose true entropy is known
(notebook 11).

Sentences such as ``the keys near the old cabinet are rusty .`` or ``the queen that
visits the kings praises herself .`` have two kinds of long-range structure that a bigram model
cannot see:

- **number agreement**: the main verb agrees with the subject noun, across a prepositional
  phrase or a relative clause that holds an *attractor* noun of either number
  (``the keys near the cabinet are`` ...);
- **reflexive agreement**: a reflexive pronoun agrees with the subject in number and gender
  (``the queen near the kings praises herself``);
- **selection**: the subject's class (person, animal, thing) chooses the verbs and the
  predicate adjectives, and each transitive verb chooses the class of its object.

The grammar is a probabilistic context-free grammar (:class:`PCFG`) without recursion, and
it is unambiguous: every sentence has exactly one derivation, so its probability is the
product of the rule probabilities of that derivation, and :meth:`PCFG.log_prob` computes
it for any word sequence (``-inf`` when the sequence is not a sentence of the language).
The average ``-log p(sentence)`` per token of a held-out set is the **entropy floor**: the
cross-entropy that the true distribution itself gets, which no model beats on average.

Everything is seeded: :func:`make_grammar_data` gives the same sentences on every run.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from .vocab import SPECIALS, Vocab

END = "."


class PCFG:
    """A probabilistic context-free grammar without recursion.

    Args:
        rules: ``{nonterminal: [(probability, (symbol, ...)), ...]}``; each nonterminal's
            probabilities sum to 1.
        lexicon: ``{category: {word: probability}}``: preterminals, each a distribution
            over words.
        start: the start symbol.

    A symbol that is neither a nonterminal nor a category is a literal word.
    """

    def __init__(
        self,
        rules: dict[str, list[tuple[float, tuple[str, ...]]]],
        lexicon: dict[str, dict[str, float]],
        start: str = "S",
    ) -> None:
        for nt, options in rules.items():
            total = sum(p for p, _ in options)
            if not math.isclose(total, 1.0, abs_tol=1e-9):
                raise ValueError(f"the rules of {nt!r} have probabilities summing to {total}")
        for cat, words in lexicon.items():
            total = sum(words.values())
            if not math.isclose(total, 1.0, abs_tol=1e-9):
                raise ValueError(f"the words of {cat!r} have probabilities summing to {total}")
        self.rules = {
            nt: [(p, tuple(rhs)) for p, rhs in opts if p > 0] for nt, opts in rules.items()
        }
        self.lexicon = lexicon
        self.start = start
        # Cumulative probabilities as Python lists (NumPy's cumsum, so the same floats):
        # sampling draws one uniform number and bisects them, which picks exactly what
        # np.searchsorted would, several times faster on lists this short.
        self._cum = {
            nt: np.cumsum([p for p, _ in opts]).tolist() for nt, opts in self.rules.items()
        }
        self._words = {c: list(ws) for c, ws in lexicon.items()}
        self._wcum = {c: np.cumsum(list(ws.values())).tolist() for c, ws in lexicon.items()}
        self._logp = {
            c: {w: math.log(p) if p > 0 else -math.inf for w, p in ws.items()}
            for c, ws in lexicon.items()
        }
        # sample_many's table: symbol -> (is a category, choices, cumulative, log p of each)
        self._plan = {
            **{
                c: (1, self._words[c], self._wcum[c], [self._logp[c][w] for w in self._words[c]])
                for c in lexicon
            },
            **{
                nt: (0, opts, self._cum[nt], [math.log(p) for p, _ in opts])
                for nt, opts in self.rules.items()
            },
        }

    # -------------------------------------------------------------------------- words
    def words(self) -> list[str]:
        """Every word the grammar can produce, sorted."""
        out = set()
        for ws in self.lexicon.values():
            out.update(w for w, p in ws.items() if p > 0)
        for opts in self.rules.values():
            for _, rhs in opts:
                out.update(s for s in rhs if s not in self.rules and s not in self.lexicon)
        return sorted(out)

    # -------------------------------------------------------------------------- sampling
    def sample(self, rng: np.random.Generator) -> tuple[list[str], float, list[str]]:
        """One sentence: ``(words, log probability, category of each word)``; the
        category of a literal word is the word itself."""
        words: list[str] = []
        cats: list[str] = []
        logp = self._expand(self.start, rng, words, cats)
        return words, logp, cats

    def sample_many(
        self, rng: np.random.Generator, n: int
    ) -> list[tuple[list[str], float, list[str]]]:
        """``n`` sentences as ``n`` calls of :meth:`sample` draw them from ``rng``: the same
        sentences, several times faster. Each choice takes the next uniform number of
        ``rng``'s stream, here drawn in blocks (``rng.random(size)`` gives the same numbers
        as that many calls of ``rng.random()``), and each symbol is looked up once. Unlike
        :meth:`sample`, it leaves ``rng`` further on (the rest of the last block drawn)."""
        plan, bisect_left = self._plan, bisect.bisect_left
        buffer: list[float] = []

        def uniform() -> float:
            if not buffer:
                buffer.extend(reversed(rng.random(4096).tolist()))
            return buffer.pop()

        def expand(sym: str, words: list, cats: list) -> float:
            entry = plan.get(sym)
            if entry is None:  # a literal word
                words.append(sym)
                cats.append(sym)
                return 0.0
            kind, opts, cum, logps = entry
            i = min(bisect_left(cum, uniform() * cum[-1]), len(opts) - 1)
            if kind:
                words.append(opts[i])
                cats.append(sym)
                return logps[i]
            # sum(), as sample's does: from Python 3.12 it adds floats with compensation, so
            # a loop of += would differ in the last bits there
            return logps[i] + sum(expand(s, words, cats) for s in opts[i][1])

        out = []
        for _ in range(n):
            words: list[str] = []
            cats: list[str] = []
            out.append((words, expand(self.start, words, cats), cats))
        return out

    def _expand(self, sym: str, rng, words: list, cats: list) -> float:
        if sym in self.rules:
            opts, cum = self.rules[sym], self._cum[sym]
            i = min(bisect.bisect_left(cum, rng.random() * cum[-1]), len(opts) - 1)
            p, rhs = opts[i]
            return math.log(p) + sum(self._expand(s, rng, words, cats) for s in rhs)
        if sym in self.lexicon:
            ws, cum = self._words[sym], self._wcum[sym]
            i = min(bisect.bisect_left(cum, rng.random() * cum[-1]), len(ws) - 1)
            words.append(ws[i])
            cats.append(sym)
            return self._logp[sym][ws[i]]
        words.append(sym)
        cats.append(sym)
        return 0.0

    # -------------------------------------------------------------------------- parsing
    def parses(self, words: Sequence[str]) -> tuple[float, int]:
        """``(probability, number of derivations)`` of the word sequence as a whole
        sentence (``(0.0, 0)`` when it is not one)."""
        words = tuple(words)

        @cache
        def sym_at(sym: str, i: int) -> dict[int, tuple[float, int]]:
            if sym in self.rules:
                out: dict[int, tuple[float, int]] = {}
                for p, rhs in self.rules[sym]:
                    for end, (q, n) in seq_at(rhs, i).items():
                        old = out.get(end, (0.0, 0))
                        out[end] = (old[0] + p * q, old[1] + n)
                return out
            if i >= len(words):
                return {}
            if sym in self.lexicon:
                p = self.lexicon[sym].get(words[i], 0.0)
                return {i + 1: (p, 1)} if p > 0 else {}
            return {i + 1: (1.0, 1)} if words[i] == sym else {}

        @cache
        def seq_at(rhs: tuple[str, ...], i: int) -> dict[int, tuple[float, int]]:
            if not rhs:
                return {i: (1.0, 1)}
            out: dict[int, tuple[float, int]] = {}
            for mid, (p, n) in sym_at(rhs[0], i).items():
                for end, (q, m) in seq_at(rhs[1:], mid).items():
                    old = out.get(end, (0.0, 0))
                    out[end] = (old[0] + p * q, old[1] + n * m)
            return out

        return sym_at(self.start, 0).get(len(words), (0.0, 0))

    def log_prob(self, words: Sequence[str]) -> float:
        """``log p(words)`` under the grammar; ``-inf`` if ``words`` is not a sentence."""
        p, _ = self.parses(words)
        return math.log(p) if p > 0 else -math.inf

    def is_grammatical(self, words: Sequence[str]) -> bool:
        """Whether ``words`` (a list of words, ending with ``"."``) is a sentence."""
        return self.parses(words)[1] > 0


# ----------------------------------------------------------------------------- the lexicon
def _zipf(words: Sequence[str], s: float = 1.0) -> dict[str, float]:
    """Probabilities proportional to ``1 / rank**s`` (the first word is the most common)."""
    w = np.array([1.0 / (r + 1) ** s for r in range(len(words))])
    w /= w.sum()
    return {word: float(p) for word, p in zip(words, w, strict=True)}


def _pairs(text: str) -> list[tuple[str, str]]:
    """``"man/men boy/boys"`` -> ``[("man", "men"), ("boy", "boys")]``."""
    return [tuple(item.split("/")) for item in text.split()]  # type: ignore[misc]


NOUNS = {
    ("person", "m"): _pairs(
        "man/men boy/boys king/kings father/fathers brother/brothers uncle/uncles "
        "prince/princes son/sons husband/husbands monk/monks nephew/nephews duke/dukes "
        "lord/lords waiter/waiters actor/actors grandfather/grandfathers"
    ),
    ("person", "f"): _pairs(
        "woman/women girl/girls queen/queens mother/mothers sister/sisters aunt/aunts "
        "princess/princesses daughter/daughters wife/wives nun/nuns niece/nieces "
        "duchess/duchesses lady/ladies waitress/waitresses actress/actresses "
        "grandmother/grandmothers"
    ),
    ("animal", "n"): _pairs(
        "dog/dogs cat/cats horse/horses bird/birds fox/foxes wolf/wolves mouse/mice "
        "rabbit/rabbits bear/bears lion/lions tiger/tigers duck/ducks goat/goats cow/cows "
        "pig/pigs frog/frogs snake/snakes owl/owls monkey/monkeys donkey/donkeys "
        "camel/camels goose/geese"
    ),
    ("thing", "n"): _pairs(
        "key/keys box/boxes book/books door/doors table/tables cup/cups lamp/lamps "
        "chair/chairs knife/knives clock/clocks coin/coins bottle/bottles letter/letters "
        "bell/bells brush/brushes candle/candles basket/baskets ring/rings bag/bags "
        "shelf/shelves cabinet/cabinets window/windows mirror/mirrors blanket/blankets"
    ),
}
CLASSES = ("person", "animal", "thing")
ADJECTIVES = [
    "old",
    "young",
    "small",
    "big",
    "little",
    "tall",
    "short",
    "quiet",
    "loud",
    "happy",
    "tired",
    "clever",
    "brave",
    "proud",
    "strange",
    "famous",
    "lonely",
    "angry",
    "gentle",
    "patient",
    "busy",
    "lazy",
    "hungry",
    "curious",
]
PREDICATES = {
    "person": ["tired", "happy", "clever", "busy", "angry", "brave", "patient", "lonely"],
    "animal": ["hungry", "wild", "tame", "noisy", "sleepy", "fierce", "hairy", "calm"],
    "thing": ["rusty", "broken", "heavy", "empty", "dusty", "shiny", "useful", "cheap"],
}
INTRANSITIVE = {
    "person": _pairs("sleeps/sleep laughs/laugh sings/sing smiles/smile waits/wait cries/cry"),
    "animal": _pairs("barks/bark runs/run hides/hide growls/growl jumps/jump eats/eat"),
    "thing": _pairs("falls/fall shines/shine breaks/break rattles/rattle creaks/creak rolls/roll"),
}
# transitive verbs: subject class -> object class -> (singular, plural) forms
TRANSITIVE = {
    "person": {
        "person": _pairs("admires/admire visits/visit trusts/trust thanks/thank"),
        "animal": _pairs("feeds/feed walks/walk chases/chase"),
        "thing": _pairs("carries/carry opens/open buys/buy cleans/clean"),
    },
    "animal": {
        "person": _pairs("follows/follow bites/bite watches/watch"),
        "animal": _pairs("hunts/hunt fights/fight"),
        "thing": _pairs("sniffs/sniff knocks/knock"),
    },
    "thing": {
        "person": _pairs("hurts/hurt pleases/please"),
        "thing": _pairs("holds/hold covers/cover"),
    },
}
REFLEXIVE_VERBS = _pairs("praises/praise blames/blame sees/see washes/wash")
REFLEXIVES = {("m", "sg"): "himself", ("f", "sg"): "herself", ("n", "sg"): "itself"}
PREPOSITIONS = ["near", "behind", "beside", "with", "under"]
DETS = {"sg": ("the", "this", "every"), "pl": ("the", "these", "some")}
#: how often the subject has no modifier, a prepositional phrase, a subject relative clause
#: ("that chases the cats") or an object relative clause ("that the dogs follow")
MODIFIERS = {"none": 0.25, "pp": 0.5, "src": 0.25, "orc": 0.0}
#: the Zipf exponent of each word class: word r of a list has probability ~ 1 / r**s
ZIPF = {"det": 1.5, "noun": 2.0, "verb": 1.5, "pred": 1.5, "adj": 2.0, "prep": 1.5}
NUMBERS = ("sg", "pl")


def _genders(c: str) -> tuple[str, ...]:
    return ("m", "f") if c == "person" else ("n",)


def _refl(g: str, n: str) -> str:
    return "themselves" if n == "pl" else REFLEXIVES[(g, n)]


def english_grammar() -> PCFG:
    """The course's grammar (see the module docstring); unambiguous and without recursion.

    Naming: nonterminals and categories are ``KIND/feature/...``; the main verb's category
    starts with ``v:`` and the attractor noun's (in a modifier of the subject) with ``a:``.
    """
    lex: dict[str, dict[str, float]] = {}
    rules: dict[str, list[tuple[float, tuple[str, ...]]]] = {}
    for n in NUMBERS:
        lex[f"DET/{n}"] = _zipf(DETS[n], ZIPF["det"])
        for c in CLASSES:
            for g in _genders(c):
                nouns = [pair[0 if n == "sg" else 1] for pair in NOUNS[(c, g)]]
                lex[f"N/{c}/{g}/{n}"] = _zipf(nouns, ZIPF["noun"])
                lex[f"a:N/{c}/{g}/{n}"] = lex[f"N/{c}/{g}/{n}"]
            iv = [pair[0 if n == "sg" else 1] for pair in INTRANSITIVE[c]]
            lex[f"v:IV/{c}/{n}"] = _zipf(iv, ZIPF["verb"])
            lex[f"RCV/{c}/{n}"] = {}
            for o, verbs in TRANSITIVE[c].items():
                forms = [pair[0 if n == "sg" else 1] for pair in verbs]
                lex[f"v:TV/{c}/{o}/{n}"] = _zipf(forms, ZIPF["verb"])
                lex[f"TV/{c}/{o}/{n}"] = lex[f"v:TV/{c}/{o}/{n}"]
        lex[f"v:AUX/{n}"] = {"is": 0.7, "was": 0.3} if n == "sg" else {"are": 0.7, "were": 0.3}
        lex[f"v:RV/{n}"] = _zipf([p[0 if n == "sg" else 1] for p in REFLEXIVE_VERBS], ZIPF["verb"])
    for c in CLASSES:
        lex[f"PRED/{c}"] = _zipf(PREDICATES[c], ZIPF["pred"])
    lex["ADJ"] = _zipf(ADJECTIVES, ZIPF["adj"])
    lex["P"] = _zipf(PREPOSITIONS, ZIPF["prep"])
    lex = {k: v for k, v in lex.items() if v}

    # sentences: a subject of number n, class c, gender g, then a verb phrase that agrees
    p_class = {"person": 0.4, "animal": 0.3, "thing": 0.3}
    s_rules = []
    for n in NUMBERS:
        for c in CLASSES:
            for g in _genders(c):
                p = 0.5 * p_class[c] / len(_genders(c))
                s_rules.append((p, (f"SUBJ/{n}/{c}/{g}", f"VP/{n}/{c}/{g}", END)))
    rules["S"] = s_rules

    # any noun phrase of number n and class c (objects and attractors): det [adj] noun
    def np_rules(prefix: str, n: str, c: str, g: str) -> list:
        noun = f"{prefix}N/{c}/{g}/{n}"
        return [(0.75, (f"DET/{n}", noun)), (0.25, (f"DET/{n}", "ADJ", noun))]

    for n in NUMBERS:
        for c in CLASSES:
            for g in _genders(c):
                rules[f"NP/{n}/{c}/{g}"] = np_rules("", n, c, g)
                rules[f"ANP/{n}/{c}/{g}"] = np_rules("a:", n, c, g)
            gs = _genders(c)
            rules[f"NPC/{n}/{c}"] = [(1 / len(gs), (f"NP/{n}/{c}/{g}",)) for g in gs]
            rules[f"ANPC/{n}/{c}"] = [(1 / len(gs), (f"ANP/{n}/{c}/{g}",)) for g in gs]
        # the attractor: any number, any class
        rules[f"ATTR/{n}"] = [(1 / 3, (f"ANPC/{n}/{c}",)) for c in CLASSES]
    rules["ATTR"] = [(0.5, ("ATTR/sg",)), (0.5, ("ATTR/pl",))]
    for c in CLASSES:
        rules[f"OBJ/{c}"] = [(0.5, (f"NPC/sg/{c}",)), (0.5, (f"NPC/pl/{c}",))]
        # the object inside a subject relative clause is an attractor too
        rules[f"AOBJ/{c}"] = [(0.5, (f"ANPC/sg/{c}",)), (0.5, (f"ANPC/pl/{c}",))]

    for n in NUMBERS:
        for c in CLASSES:
            objs = list(TRANSITIVE[c])
            for g in _genders(c):
                head = [
                    (0.75, (f"DET/{n}", f"N/{c}/{g}/{n}")),
                    (0.25, (f"DET/{n}", "ADJ", f"N/{c}/{g}/{n}")),
                ]
                # relative clauses: subject ("that chases the cats") or object ("that the
                # dogs follow", whose verb agrees with the attractor, not the head)
                src = [(1 / len(objs), ("that", f"TV/{c}/{o}/{n}", f"AOBJ/{o}")) for o in objs]
                rules[f"SRC/{n}/{c}"] = src
                orc = []
                subj_classes = [s for s in CLASSES if c in TRANSITIVE[s]]
                for s in subj_classes:
                    for m in NUMBERS:
                        orc.append(
                            (
                                1 / (2 * len(subj_classes)),
                                ("that", f"ANPC/{m}/{s}", f"TV/{s}/{c}/{m}"),
                            )
                        )
                rules[f"ORC/{c}"] = orc
                mods = [
                    (MODIFIERS["none"], ()),
                    (MODIFIERS["pp"], ("P", "ATTR")),
                    (MODIFIERS["src"], (f"SRC/{n}/{c}",)),
                    (MODIFIERS["orc"], (f"ORC/{c}",)),
                ]
                rules[f"SUBJ/{n}/{c}/{g}"] = [
                    (p_head * p_mod, (*h, *mod)) for p_head, h in head for p_mod, mod in mods
                ]
                vps = [
                    (0.25, (f"v:IV/{c}/{n}",)),
                    (0.2, (f"v:AUX/{n}", f"PRED/{c}")),
                ]
                refl = 0.25 if c != "thing" else 0.0
                trans = 1.0 - 0.45 - refl
                vps += [(trans / len(objs), (f"v:TV/{c}/{o}/{n}", f"OBJ/{o}")) for o in objs]
                if refl:
                    vps.append((refl, (f"v:RV/{n}", _refl(g, n))))
                rules[f"VP/{n}/{c}/{g}"] = vps
    return PCFG(rules, lex, "S")


# ----------------------------------------------------------------------------- the data set
@dataclass
class Sentence:
    """One generated sentence and what the notebook measures on it."""

    words: list[str]
    log_prob: float
    number: str  # the subject's number, "sg" or "pl"
    verb_pos: int  # index in ``words`` of the main verb (or auxiliary)
    wrong_verb: str  # the main verb with the other number ("are" for "is")
    subject_pos: int  # index of the subject noun
    attractor_pos: int | None  # index of the attractor noun, None if there is none
    attractor_number: str | None

    @property
    def has_attractor(self) -> bool:
        """True when a noun of the other number stands between subject and verb."""
        return self.attractor_number is not None and self.attractor_number != self.number


VERB_FLIP: dict[str, str] = {"is": "are", "are": "is", "was": "were", "were": "was"}
for _pairs_ in [*INTRANSITIVE.values(), REFLEXIVE_VERBS]:
    for _sg, _pl in _pairs_:
        VERB_FLIP[_sg], VERB_FLIP[_pl] = _pl, _sg
for _by_obj in TRANSITIVE.values():
    for _verbs in _by_obj.values():
        for _sg, _pl in _verbs:
            VERB_FLIP[_sg], VERB_FLIP[_pl] = _pl, _sg


def _annotate(words: list[str], logp: float, cats: list[str]) -> Sentence:
    verb_pos = next(i for i, c in enumerate(cats) if c.startswith("v:"))
    number = cats[verb_pos].rsplit("/", 1)[-1]
    subject_pos = next(i for i, c in enumerate(cats) if c.startswith("N/"))
    attr = [i for i, c in enumerate(cats[:verb_pos]) if c.startswith("a:N/")]
    a_pos = attr[0] if attr else None
    a_num = cats[a_pos].rsplit("/", 1)[-1] if attr else None
    return Sentence(
        words, logp, number, verb_pos, VERB_FLIP[words[verb_pos]], subject_pos, a_pos, a_num
    )


@dataclass
class GrammarData:
    """Sentences of :func:`english_grammar`: ``train``, ``valid`` and ``test`` (disjoint
    random draws), the ``grammar`` itself and a ``vocab`` (specials first, then every word
    of the grammar)."""

    grammar: PCFG
    vocab: Vocab
    train: list[Sentence]
    valid: list[Sentence]
    test: list[Sentence]
    train_set: set[tuple[str, ...]] = field(default_factory=set)

    def floor(self, sentences: Sequence[Sentence] | None = None) -> float:
        """The entropy floor of ``sentences`` (default: the test set) in nats per token:
        ``sum(-log p(sentence)) / sum(len(sentence))``, every word and the final ``"."``
        counted as a token (each is predicted once)."""
        return entropy_floor(self.test if sentences is None else sentences)

    def attractor_test(self) -> list[Sentence]:
        """Held-out sentences with an attractor of the other number before the verb."""
        return [s for s in self.test if s.has_attractor]


def entropy_floor(sentences: Sequence[Sentence]) -> float:
    """Average ``-log p`` per token (nats) of ``sentences`` under the true grammar."""
    nll = -sum(s.log_prob for s in sentences)
    return nll / sum(len(s.words) for s in sentences)


def sample_sentences(grammar: PCFG, n: int, seed: int = 0) -> list[Sentence]:
    """``n`` sentences drawn from ``grammar`` with a seeded generator."""
    rng = np.random.default_rng(seed)
    return [_annotate(*drawn) for drawn in grammar.sample_many(rng, n)]


def make_grammar_data(
    n_train: int = 20000, n_valid: int = 1000, n_test: int = 2000, seed: int = 0
) -> GrammarData:
    """Draw the train, validation and test sentences (seeds ``seed``, ``seed+1``,
    ``seed+2``): the same data on every run."""
    g = english_grammar()
    vocab = Vocab(list(SPECIALS) + g.words())
    train = sample_sentences(g, n_train, seed)
    valid = sample_sentences(g, n_valid, seed + 1)
    test = sample_sentences(g, n_test, seed + 2)
    return GrammarData(g, vocab, train, valid, test, {tuple(s.words) for s in train})


# ----------------------------------------------------------------------------- bigram baseline
class BigramModel:
    """A count-based bigram language model over words, ``<bos>`` before each sentence,
    interpolated with the unigram distribution (add-one smoothed):
    ``p(w | v) = lam * c(v, w) / c(v) + (1 - lam) * p_uni(w)``.
    :meth:`fit` chooses ``lam`` on held-out sentences."""

    def __init__(self, vocab: Sequence[str]) -> None:
        self.words = ["<bos>", *vocab]
        self.index = {w: i for i, w in enumerate(self.words)}
        self.lam = 0.9

    def fit(self, train: Sequence[Sequence[str]], valid: Sequence[Sequence[str]]) -> BigramModel:
        V = len(self.words)
        counts = np.zeros((V, V))
        prev, nxt = self._pairs(train)
        np.add.at(counts, (prev, nxt), 1)  # every (previous word, word) pair at once
        uni = counts.sum(0) + 1.0
        uni[0] = 0.0
        self.unigram = uni / uni.sum()
        rows = counts.sum(1, keepdims=True)
        self.ml = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
        best = None
        prev, nxt = self._pairs(valid)
        ml, unigram = self.ml[prev, nxt], self.unigram[nxt]  # per held-out token
        for lam in np.linspace(0.5, 0.999, 40):  # cross_entropy(valid) for each lam
            ce = float(-np.log(lam * ml + (1 - lam) * unigram).mean())
            if best is None or ce < best[0]:
                best = (ce, float(lam))
        self.lam = best[1]
        return self

    def _pairs(self, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of every ``(previous word, word)`` pair of ``sentences``, ``<bos>``
        (id 0) before each sentence: two int64 arrays, one entry per token."""
        prev: list[int] = []
        nxt: list[int] = []
        for s in sentences:
            ids = [self.index[w] for w in s]
            prev += [0, *ids[:-1]]
            nxt += ids
        return np.array(prev, dtype=np.int64), np.array(nxt, dtype=np.int64)

    def probs(self, prev: str) -> dict[str, float]:
        """The next-word distribution after ``prev`` (``"<bos>"`` at a sentence start)."""
        row = self.lam * self.ml[self.index[prev]] + (1 - self.lam) * self.unigram
        return {w: float(row[i]) for i, w in enumerate(self.words) if i}

    def _p(self, prev: str, w: str) -> float:
        i, j = self.index[prev], self.index[w]
        return self.lam * self.ml[i, j] + (1 - self.lam) * self.unigram[j]

    def cross_entropy(self, sentences: Sequence[Sequence[str]]) -> float:
        """Average ``-log p`` per token (nats), the final ``"."`` included."""
        nll, n = 0.0, 0
        for s in sentences:
            prev = "<bos>"
            for w in s:
                nll -= math.log(self._p(prev, w))
                prev = w
                n += 1
        return nll / n

    def agreement(self, sentences: Sequence[Sentence]) -> float:
        """Share of sentences where the bigram prefers the correct verb form to the
        wrong-number one."""
        ok = [
            self._p(s.words[s.verb_pos - 1], s.words[s.verb_pos])
            > self._p(s.words[s.verb_pos - 1], s.wrong_verb)
            for s in sentences
        ]
        return float(np.mean(ok))


def distinct_ngrams(sentences: Sequence[Sequence[str]], n: int) -> float:
    """Distinct n-grams / all n-grams over ``sentences`` (a diversity measure)."""
    grams = Counter(tuple(s[i : i + n]) for s in sentences for i in range(len(s) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0
