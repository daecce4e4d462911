"""Checks for notebook 08: ``make_batch``, ``masked_cross_entropy``, ``beam_search``."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import training as ref_training
from ..apps import translation as ref
from ._core import CheckFailure, Context, Mistake, exercise
from .mistakes import named
from .toolkit import dtype_name, expect_follows_device, expect_gradient, expect_spec_defaults

# ----------------------------------------------------------------------------- make_batch
BOS, EOS = 1, 2


def _make_pairs(rng: np.random.Generator, lengths_src, lengths_tgt, vocab=(10, 40)):
    src = [list(map(int, rng.integers(*vocab, size=n))) for n in lengths_src]
    tgt = [[BOS, *map(int, rng.integers(*vocab, size=n)), EOS] for n in lengths_tgt]
    return src, tgt


def _pad(seqs, pad_id: int, left: bool = False) -> torch.Tensor:
    T = max(len(s) for s in seqs)
    rows = [
        ([pad_id] * (T - len(s)) + list(s)) if left else (list(s) + [pad_id] * (T - len(s)))
        for s in seqs
    ]
    return torch.tensor(rows, dtype=torch.long)


#: label, source lengths, target lengths (without <bos>, <eos>), pad_id; a length given as
#: (low, high, n) is n lengths drawn at random, all of them before the first case is drawn.
BATCH_CASES = [
    ("3 pairs of different lengths", [4, 2, 6], [3, 5, 1], 0),
    ("pad_id=5", [3, 1, 2], [2, 4, 3], 5),
    ("a batch of one", [5], [4], 0),
    ("all the same length (no padding)", [3, 3], [2, 2], 0),
    ("8 random pairs", (1, 10, 8), (1, 12, 8), 0),
]
BATCH_THOROUGH_CASES = [
    ("one-word targets", [1, 2], [1, 1], 0),
    ("16 random pairs, pad_id=3", (1, 14, 16), (1, 14, 16), 3),
]
BATCH_OUTPUTS = ("src", "tgt_in", "tgt_out", "tgt_mask")
#: make_batch's mistake models (the modes of batch_model), tried in this order on each output.
BATCH_MISTAKES = [
    "tgt_in_out_swapped",
    "tgt_mask_inverted",
    "tgt_mask_from_tgt_in",
    "tgt_mask_no_eos",
    "padded_on_left",
    "pad_with_zero",
]


def batch_model(src_seqs, tgt_seqs, pad_id: int, mode: str = "correct") -> tuple:
    """``(src (B, S), tgt_in (B, T-1), tgt_out (B, T-1), tgt_mask (B, T-1))`` as the code
    with the mistake ``mode`` (an id of BATCH_MISTAKES, or "correct") builds them."""
    fill = 0 if mode == "pad_with_zero" else pad_id
    left = mode == "padded_on_left"
    src, tgt = _pad(src_seqs, fill, left), _pad(tgt_seqs, fill, left)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    if mode == "tgt_in_out_swapped":
        tgt_in, tgt_out = tgt_out, tgt_in
    real = tgt != fill
    mask = {
        "tgt_mask_inverted": ~real[:, 1:],
        "tgt_mask_from_tgt_in": real[:, :-1],
        "tgt_mask_no_eos": real[:, 1:] & (tgt[:, 1:] != EOS),
    }.get(mode, real[:, 1:])
    return src, tgt_in, tgt_out, mask


def _expect_batch_output(ctx: Context, name: str, g, e, B: int, T: int, case: str) -> None:
    """One of make_batch's outputs: a tensor of token ids (a boolean tgt_mask) of ``e``'s
    shape; a (B, T) one names the mistake of not shifting the target."""
    if not isinstance(g, torch.Tensor):
        ctx.fail(
            f"{name} must be a torch.Tensor; got {type(g).__name__}.",
            case=case,
            mistake="wrong_type",
        )
    if name == "tgt_mask" and g.dtype != torch.bool:
        ctx.fail(
            f"tgt_mask must be boolean (True = a real token); got dtype {g.dtype}.",
            case=case,
            mistake=named("mask_not_boolean", comparison="tgt_out != pad_id"),
        )
    if name != "tgt_mask" and g.dtype != torch.long:
        ctx.fail(
            f"{name} must hold token ids as torch.long; got dtype {g.dtype}.",
            case=case,
            hint="build it with dtype=torch.long.",
            mistake="wrong_type",
        )
    if tuple(g.shape) != tuple(e.shape):
        likely = ""
        if name in ("tgt_in", "tgt_out") and tuple(g.shape) == (B, T):
            likely = named("target_not_shifted", name=name)
        elif name == "tgt_mask" and tuple(g.shape) == (B, T):
            likely = named("tgt_mask_whole_target")
        ctx.fail(
            f"{name} has shape {tuple(g.shape)}, expected {tuple(e.shape)}.",
            case=case,
            likely=likely,
            mistake="wrong_shape",
        )


@exercise(
    "make_batch",
    forbidden=lambda: [(ref.make_batch, "the reference attention_ref.make_batch")],
    summary="padded sources; tgt_in, tgt_out, tgt_mask for teacher forcing",
)
def check_make_batch(candidate, ctx: Context) -> None:
    """The four outputs' types, dtypes and shapes, then their values exactly (tgt_in only
    where tgt_out is a real token: where it is padding, <eos> or padding are both right)."""
    rng = ctx.rng(81)

    def lengths(spec):
        return list(rng.integers(*spec)) if isinstance(spec, tuple) else spec

    rows = BATCH_CASES + (BATCH_THOROUGH_CASES if ctx.thorough else [])
    for label, ls, lt, pad_id in [(lb, lengths(s), lengths(t), p) for lb, s, t, p in rows]:
        src_seqs, tgt_seqs = _make_pairs(rng, ls, lt)
        case = (
            f"{label}: source lengths {list(map(int, ls))}, target lengths "
            f"{[n + 2 for n in lt]} (with <bos>, <eos>), pad_id={pad_id}"
        )
        got = ctx.call(candidate, src_seqs, tgt_seqs, pad_id=pad_id, case=case)
        got = ctx.expect_tuple(got, BATCH_OUTPUTS, case=case)
        expected = ref.make_batch(src_seqs, tgt_seqs, pad_id)
        B, T = _pad(tgt_seqs, pad_id).shape
        for name, g, e in zip(BATCH_OUTPUTS, got, expected, strict=True):
            _expect_batch_output(ctx, name, g, e, B, T, case)

        def counted(x, i, exp=expected):
            return torch.where(exp[3], x, exp[1]) if i == 1 else x

        models = {m: batch_model(src_seqs, tgt_seqs, pad_id, m) for m in BATCH_MISTAKES}
        for i, name in enumerate(BATCH_OUTPUTS):
            mistakes = [
                Mistake.of(m, model=lambda out=out, i=i: counted(out[i], i))
                for m, out in models.items()
            ]
            g, e = counted(got[i], i), expected[i]
            ctx.expect_close(g, e, what=name, case=case, rtol=0, atol=0, mistakes=mistakes)
    src_seqs, tgt_seqs = _make_pairs(rng, [3, 5], [2, 4])
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (src_seqs, tgt_seqs),
        {"pad_id": 0},
        case="two pairs of sentences, pad_id left out",
        signature="make_batch(src_seqs, tgt_seqs, pad_id=0)",
    )


# ----------------------------------------------------------------------------- the loss
#: The loss's mistake models, tried in this order: id, the per-token value the mistaken code
#: averages (the target's -log p, its -logit or its -p), how it reduces them (m: the mask as
#: 0/1, (B, T)).
LOSS_MISTAKES = [
    ("loss_padding_averaged", "log_p", lambda t, m: t.mean()),
    ("loss_per_padded_length", "log_p", lambda t, m: (t * m).sum() / m.numel()),
    ("loss_per_batch", "log_p", lambda t, m: (t * m).sum() / m.shape[0]),
    ("loss_summed", "log_p", lambda t, m: (t * m).sum()),
    (
        "loss_per_sentence",
        "log_p",
        lambda t, m: ((t * m).sum(1) / m.sum(1).clamp(min=1))[m.sum(1) > 0].mean(),
    ),
    ("loss_mask_inverted", "log_p", lambda t, m: (t * (1 - m)).sum() / (1 - m).sum().clamp(min=1)),
    ("loss_no_log_softmax", "logit", lambda t, m: (t * m).sum() / m.sum()),
    ("loss_probabilities", "p", lambda t, m: (t * m).sum() / m.sum()),
]


def _per_token(logits: torch.Tensor, targets: torch.Tensor, kind: str) -> torch.Tensor:
    """Minus the target's log-probability, logit or probability (``kind``), (B, T), in
    float64. The learner's code sees the targets as given; the models read them where they
    are valid ids (masked targets outside the vocabulary make a gather-based mistake raise,
    which the check names masked_targets_as_indices instead)."""
    z = logits.double()
    z = {"log_p": torch.log_softmax(z, -1), "logit": z, "p": torch.softmax(z, -1)}[kind]
    safe = torch.where((targets >= 0) & (targets < z.shape[-1]), targets, 0)
    return -z.gather(-1, safe[..., None]).squeeze(-1)


def _loss_mistakes(logits, targets, mask) -> list[Mistake]:
    m = mask.double()
    return [
        Mistake.of(i, model=lambda kind=kind, f=f: f(_per_token(logits, targets, kind), m))
        for i, kind, f in LOSS_MISTAKES
    ]


_INDEX_MISTAKE = named("masked_targets_as_indices")
CE_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-12)}
#: label, logits' shape (B, T, V), the mask (the lengths of right-padded rows; "scattered": a
#: random mask (3, 7), True in its first column, cut to (B, T); "random": 8 random lengths),
#: the logits' scale, the targets at the masked positions: random ids ("ids", so that a wrong
#: average is named by its value), or -100 and ids outside the vocabulary ("wild"), which a
#: correct loss never uses as indices.
LOSS_CASES = [
    ("logits (3, 5, 7), right padding", (3, 5, 7), [5, 2, 3], 2.0, "ids"),
    ("logits (1, 1, 4), one token", (1, 1, 4), [1], 2.0, "ids"),
    ("logits (2, 6, 9), a fully padded row", (2, 6, 9), [4, 0], 2.0, "ids"),
    ("logits (3, 7, 5), scattered mask", (3, 7, 5), "scattered", 2.0, "ids"),
    ("logits (4, 5, 11), no padding", (4, 5, 11), [5, 5, 5, 5], 2.0, "ids"),
    ("large logits (scale 200)", (3, 6, 8), [6, 3, 1], 200.0, "ids"),
    ("logits (3, 6, 7), right padding", (3, 6, 7), [6, 2, 4], 2.0, "wild"),
    ("logits (2, 5, 6), scattered mask", (2, 5, 6), "scattered", 2.0, "wild"),
]
LOSS_THOROUGH_CASES = [("logits (8, 12, 30), random lengths", (8, 12, 30), "random", 3.0, "wild")]


def _masked_targets(rng: np.random.Generator, targets: torch.Tensor, mask, V: int, kind: str):
    """Arbitrary targets at the masked positions: random ids ("ids"), or a mix of -100,
    ids past the vocabulary and random ids ("wild")."""
    if kind == "ids":
        junk = torch.from_numpy(rng.integers(0, V, size=tuple(targets.shape)))
    else:
        pool = np.array([-100, V, V + 7, -1, 10**6, 0])
        junk = torch.from_numpy(rng.choice(pool, size=tuple(targets.shape)))
    return torch.where(mask, targets, junk.long())


@exercise(
    "masked_cross_entropy",
    forbidden=lambda: [
        (ref_training.masked_cross_entropy, "the reference attention_ref.masked_cross_entropy"),
    ],
    summary="mean token cross-entropy over the real positions",
)
def check_masked_cross_entropy(candidate, ctx: Context) -> None:
    """In float32 and float64, with garbage logits at the padding: a scalar tensor that
    carries a gradient, its value, then its gradient."""
    rng = ctx.rng(82)
    g = ctx.torch_gen(82)
    scattered = torch.from_numpy(rng.random((3, 7)) < 0.6)
    scattered[:, 0] = True

    def mask_of(spec, B: int, T: int) -> torch.Tensor:
        if spec == "scattered":
            return scattered[:B, :T]
        lengths = list(rng.integers(1, 13, 8)) if spec == "random" else spec
        return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]

    rows = LOSS_CASES + (LOSS_THOROUGH_CASES if ctx.thorough else [])
    masks = [mask_of(spec, *shape[:2]) for _, shape, spec, _, _ in rows]
    for (label, shape, _, scale, kind), mask in zip(rows, masks, strict=True):
        B, T, V = shape
        base = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        targets = torch.randint(0, V, (B, T), generator=g)
        targets = _masked_targets(rng, targets, mask, V, kind)
        # Garbage at the padding: a correct loss does not see it.
        garbage = 50 * torch.randn(shape, generator=g, dtype=torch.float64)
        base = torch.where(mask[..., None], base, garbage)
        for dtype in (torch.float32, torch.float64):
            logits = base.to(dtype)
            case = f"{label}; {dtype_name(dtype)}; mask {mask.int().tolist()}"
            case += f"; targets {targets.tolist()}" if kind == "wild" else ""

            def run(lg, tg, mk):
                lg.requires_grad_(True)
                return candidate(lg, tg, mk), lg

            try:
                loss, leaf = ctx.call(run, logits, targets, mask, case=case)
            except CheckFailure as err:
                # An indexing error on "wild" targets: masked targets used as indices.
                text = str(err)
                indexing = "out of bounds" in text or "out of range" in text
                if kind == "wild" and "raised" in text and (indexing or "index" in text.lower()):
                    ctx.fail(
                        text.split("\n  Input: ")[0].removeprefix("masked_cross_entropy: "),
                        case=case,
                        likely=_INDEX_MISTAKE,
                        hint=_INDEX_MISTAKE.hint,
                    )
                raise
            if not isinstance(loss, torch.Tensor):
                ctx.fail(
                    f"must return a torch.Tensor (a scalar); got {type(loss).__name__}.",
                    case=case,
                    mistake="loss_item",
                )
            if loss.dim() != 0:
                ctx.fail(
                    f"the loss must be a scalar (shape ()); got shape {tuple(loss.shape)}.",
                    case=case,
                    hint="average over the real tokens to a single number.",
                    mistake="wrong_type",
                )
            if not loss.requires_grad:
                ctx.fail(
                    "the loss carries no gradient back to logits.",
                    case=case,
                    mistake="loss_left_autograd",
                )
            if not torch.isfinite(loss.detach()).all():
                ctx.fail(
                    f"the loss is {float(loss.detach())}.", case=case, mistake="loss_log_underflow"
                )
            ref_logits = logits.double().requires_grad_(True)
            expected = ref_training.masked_cross_entropy(ref_logits, targets, mask)
            ctx.expect_array(loss.detach(), logits.new_zeros(()), what="the loss", case=case)
            ctx.expect_close(
                loss.detach(),
                expected.detach(),
                what="the loss value",
                case=case,
                mistakes=_loss_mistakes(logits, targets, mask),
                **CE_TOL[dtype],
            )
            expect_gradient(
                ctx,
                loss,
                {"logits": leaf},
                torch.autograd.grad(expected, ref_logits),
                case=case,
                call_name="masked_cross_entropy",
                mistake="loss_left_autograd",
                disconnected="the loss is not connected to logits for autograd (it has no "
                "grad_fn): was it detached, or rebuilt from NumPy or Python numbers?",
                tol=CE_TOL[dtype],
                what="the gradient of the loss",
                hint="the padding must get zero gradient and each real token 1 / mask.sum() "
                "of its cross-entropy gradient.",
            )
    meta = torch.device("meta")
    expect_follows_device(
        ctx,
        candidate,
        (
            torch.empty(2, 3, 5, device=meta),
            torch.empty(2, 3, dtype=torch.long, device=meta),
            torch.empty(2, 3, dtype=torch.bool, device=meta),
        ),
        ("the loss",),
        "wrong_device",
        "logits (2, 3, 5), targets (2, 3), mask (2, 3)",
    )


# ----------------------------------------------------------------------------- beam search
class TableLM:
    """A seeded stand-in for a translation model: ``self(prefixes (N, t))`` -> ``(N, V)``
    log-probabilities that depend on the whole prefix (or come from a hand-made table)."""

    def __init__(
        self,
        V: int,
        bos: int,
        eos: int,
        seed: int,
        temp: float = 1.5,
        eos_push: float = 0.8,
        table: dict | None = None,
        never_ends: bool = False,
    ) -> None:
        self.V, self.bos, self.eos, self.seed = V, bos, eos, seed
        self.temp, self.eos_push, self.table = temp, eos_push, table
        self.never_ends = never_ends  # <eos> all but impossible: hypotheses reach max_len
        self.calls = 0

    def _row(self, prefix: tuple[int, ...]) -> np.ndarray:
        if self.table is not None:
            p = np.full(self.V, 1e-6)
            for tok, q in self.table.get(prefix[1:], {self.eos: 1.0}).items():
                p[tok] = q
            return np.log(p / p.sum())
        z = self.temp * np.random.default_rng([self.seed, *prefix]).normal(size=self.V)
        z[self.eos] = -30.0 if self.never_ends else z[self.eos] + self.eos_push * (len(prefix) - 3)
        z[self.bos] = -8.0
        z = z - z.max()
        return z - np.log(np.exp(z).sum())

    def __call__(self, prefixes):
        if not isinstance(prefixes, torch.Tensor):
            raise TypeError(
                f"step_fn expects a torch.Tensor of prefixes (N, t); got {type(prefixes).__name__}"
            )
        if prefixes.dim() != 2 or prefixes.dtype != torch.long:
            raise ValueError(
                f"step_fn expects prefixes as a (N, t) torch.long tensor; got shape "
                f"{tuple(prefixes.shape)} and dtype {prefixes.dtype}"
            )
        if prefixes.shape[1] < 1 or bool((prefixes[:, 0] != self.bos).any()):
            raise ValueError("step_fn expects every prefix to start with bos_id")
        self.calls += 1
        rows = [self._row(tuple(r)) for r in prefixes.tolist()]
        return torch.tensor(np.array(rows).reshape(len(rows), self.V), dtype=torch.float64)


#: beam_search's mistake models (the modes of beam_model), tried in this order.
BEAM_MISTAKES = [
    "beam_greedy",
    "beam_last_only",
    "beam_probabilities",
    "beam_first_finished",
    "beam_stop_against_worst",
    "beam_length_normalised",
    "beam_past_eos",
    "beam_eos_not_scored",
]


def beam_model(step_fn, bos, eos, k, max_len, mode: str = "correct") -> tuple[list[int], float]:
    """Beam search by the exercise's rule, or as the code with the mistake ``mode`` (an id of
    BEAM_MISTAKES) runs it: the best finished hypothesis (without <bos>, <eos>), its score."""
    k = 1 if mode == "beam_greedy" else k
    past_eos = mode == "beam_past_eos"
    alive: list[tuple[list[int], float]] = [([bos], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for _ in range(max_len):
        lp = step_fn(torch.tensor([a for a, _ in alive])).double()  # (n, V)
        cands = []
        for (seq, s), row in zip(alive, lp.tolist(), strict=True):
            for tok, v in enumerate(row):
                inc = math.exp(v) if mode == "beam_probabilities" else v
                cands.append((seq + [tok], inc if mode == "beam_last_only" else s + inc, s))
        cands.sort(key=lambda c: -c[1])
        keep = [c for c in cands[:k] if c[0][-1] != eos or past_eos]
        done = [c for c in cands[:k] if c[0][-1] == eos and not past_eos]
        scored = mode != "beam_eos_not_scored"
        finished += [(seq[1:-1], score if scored else prev) for seq, score, prev in done]
        if mode == "beam_first_finished" and finished:
            break
        alive = [(seq, score) for seq, score, _ in keep]
        if not alive:
            break
        best_done = max((s for _, s in finished), default=-math.inf)
        if mode == "beam_stop_against_worst" and best_done >= min(s for _, s in alive):
            break
    else:
        finished += [(seq[1:], s) for seq, s in alive]
    if not finished:
        finished = [(seq[1:], s) for seq, s in alive]
    if mode == "beam_length_normalised":
        return max(finished, key=lambda f: f[1] / (len(f[0]) + 1))
    if mode == "beam_first_finished":
        return finished[0]
    return max(finished, key=lambda f: f[1])


# A table where greedy decoding loses: "a" looks best first, but "b <eos>" is likelier
# than anything after "a". Ids: 0 pad, 1 bos, 2 eos, 3 "a", 4 "b".
GREEDY_TRAP = {
    (): {3: 0.55, 4: 0.45},
    (3,): {3: 0.36, 4: 0.34, 2: 0.30},
    (3, 3): {2: 1.0},
    (3, 4): {2: 1.0},
    (4,): {2: 0.95, 3: 0.05},
}

# A table where the first hypothesis to finish ("e") is not the best ("b c").
# Ids: 0 pad, 1 bos, 2 eos, 3 "a", 4 "b", 5 "c", 6 "e".
LATE_WINNER = {
    (): {3: 0.40, 4: 0.35, 6: 0.25},
    (3,): {5: 0.60, 2: 0.40},
    (3, 5): {2: 1.0},
    (4,): {5: 0.99, 2: 0.01},
    (4, 5): {2: 1.0},
    (6,): {2: 0.95, 5: 0.05},
}
# A table where a search that stops once a finished hypothesis beats the WORST unfinished one
# (not the best) returns "b c" (0.243), the first to finish is "e" (0.11), and the best is
# "a c c" (0.30), found one step later. Ids as in LATE_WINNER.
BEST_STILL_OPEN = {
    (): {3: 0.50, 4: 0.30, 6: 0.20},
    (3,): {5: 0.90, 2: 0.10},
    (4,): {5: 0.90, 2: 0.10},
    (6,): {2: 0.55, 5: 0.45},
    (3, 5): {5: 2 / 3, 3: 1 / 3},
    (4, 5): {2: 0.90, 5: 0.10},
}
#: label, V, bos_id, eos_id, beam_size, max_len, and the TableLM: its seed (added to the
#: check's) and options.
BEAM_CASES = [
    ("a table where greedy decoding loses, beam_size=2", 5, 1, 2, 2, 6, 0, dict(table=GREEDY_TRAP)),
    (
        "a table where the first hypothesis to finish is not the best, beam_size=3",
        *(7, 1, 2, 3, 6, 0, dict(table=LATE_WINNER)),
    ),
    (
        "a table where, after one hypothesis finishes, the best unfinished one still wins, "
        "beam_size=3",
        *(7, 1, 2, 3, 6, 0, dict(table=BEST_STILL_OPEN)),
    ),
    ("random table, V=6, beam_size=3", 6, 1, 2, 3, 8, 1, {}),
    ("random table, V=4, beam_size=6 (more than the vocabulary)", 4, 1, 2, 6, 5, 6, {}),
    ("random table, V=7, beam_size=1", 7, 1, 2, 1, 8, 2, {}),
    ("random table, V=8, beam_size=4, bos_id=5, eos_id=0", 8, 5, 0, 4, 8, 3, {}),
    (
        "random table, V=6, beam_size=3, max_len=3 (hypotheses left unfinished)",
        *(6, 1, 2, 3, 3, 4, dict(eos_push=-1.0)),
    ),
    ("random table, V=9, beam_size=5, flat distributions", 9, 1, 2, 5, 8, 5, dict(temp=0.6)),
]
#: More random tables, V=10: the first two in every run, all four when thorough.
BEAM_RANDOM_CASES = [
    (
        f"random table #{i}, V=10, beam_size={2 + i}",
        10,
        1,
        2,
        2 + i,
        10,
        10 + i,
        dict(temp=1 + 0.3 * i),
    )
    for i in range(4)
]


def _described(x) -> str:
    if isinstance(x, list | tuple) and x:
        return f"a {type(x).__name__} of {type(x[0]).__name__}"
    return f"a {type(x).__name__}"


def _as_tokens(x) -> list[int] | None:
    """The tokens as a list of ints, or None when ``x`` is not a list of (NumPy or Python)
    ints: a tensor or a tuple is not, since the notebook compares the tokens with lists."""
    if not isinstance(x, list) or not all(
        isinstance(t, int | np.integer) and not isinstance(t, bool) for t in x
    ):
        return None
    return [int(t) for t in x]


@exercise(
    "beam_search",
    forbidden=lambda: [
        (ref.beam_search, "the reference attention_ref.beam_search"),
        (ref.greedy_search, "the reference attention_ref.greedy_search"),
    ],
    summary="the best finished hypothesis and its summed log-probability",
)
def check_beam_search(candidate, ctx: Context) -> None:
    """The best finished hypothesis and its score on hand-made tables (where greedy decoding
    loses, where the first to finish is not the best) and seeded random ones; a wrong answer
    is named by the mistake model that gives the same tokens and score."""
    cases = BEAM_CASES + BEAM_RANDOM_CASES[: 4 if ctx.thorough else 2]
    for label, V, bos, eos, k, max_len, seed, options in cases:

        def make() -> TableLM:
            return TableLM(V, bos, eos, ctx.seed + seed, **options)

        case = f"{label}; bos_id={bos}, eos_id={eos}, beam_size={k}, max_len={max_len}"
        got = ctx.call(candidate, make(), bos, eos, beam_size=k, max_len=max_len, case=case)
        got = ctx.expect_tuple(got, ("tokens", "score"), case=case)
        tokens = _as_tokens(got[0])
        if tokens is None:
            ctx.fail(
                f"tokens must be a list of ints; got {_described(got[0])}"
                + (" (call .tolist() on it)." if isinstance(got[0], torch.Tensor) else "."),
                case=case,
                mistake="wrong_type",
            )
        try:
            score = float(got[1])
        except (TypeError, ValueError):
            ctx.fail(
                f"score must be a number; got {type(got[1]).__name__}.",
                case=case,
                mistake="wrong_type",
            )
        exp_tokens, exp_score = ref.beam_search(make(), bos, eos, k, max_len)
        if tokens == exp_tokens and math.isclose(score, exp_score, rel_tol=1e-7, abs_tol=1e-9):
            continue
        if tokens and tokens[0] == bos and tokens[1:] == exp_tokens[: len(tokens) - 1]:
            ctx.fail(
                "the returned tokens start with <bos>.", case=case, mistake="output_includes_bos"
            )
        if tokens and tokens[-1] == eos and tokens[:-1] == exp_tokens:
            ctx.fail(
                "the returned tokens end with <eos>.", case=case, mistake="output_includes_eos"
            )
        likely = _named_beam_mistake(make, (bos, eos, k, max_len), tokens, score)
        what = "tokens" if tokens != exp_tokens else "score"
        ctx.fail(
            f"the {what} are wrong: expected tokens {exp_tokens} with score {exp_score:.6f}, "
            f"got {tokens} with score {score:.6f}.",
            case=case,
            likely=likely,
            hint=getattr(likely, "hint", "")
            or "follow the rule step by step on the greedy-trap table by hand.",
        )
    # a fixed table (the check compares your function with itself): with V=5 and seed 30,
    # beam_size 4 and 5 (or 3) find different best hypotheses, and nothing ends before max_len
    expect_spec_defaults(
        ctx,
        candidate,
        lambda: (TableLM(5, 1, 2, 30, temp=1.0, never_ends=True), 1, 2),
        {"beam_size": 4, "max_len": 20},
        case="random table, V=5, bos_id=1, eos_id=2, <eos> never likely (hypotheses run to "
        "max_len); beam_size and max_len left out",
        signature="beam_search(step_fn, bos_id, eos_id, beam_size=4, max_len=20)",
    )


def _named_beam_mistake(make, args: tuple, tokens: list[int], score: float):
    """The first mistake model that returns these tokens and this score ("": none)."""
    for mistake_id in BEAM_MISTAKES:
        try:
            m_tokens, m_score = beam_model(make(), *args, mode=mistake_id)
        except Exception:
            continue
        if m_tokens == tokens and math.isclose(m_score, score, rel_tol=1e-6, abs_tol=1e-9):
            return named(mistake_id)
    return ""
