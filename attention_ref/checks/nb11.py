"""Checks for notebook 11 (a GPT): the module ``gpt_block``, the sampler
``sample_next_token`` and the module ``grouped_query_attention``.

Modules are checked by loading seeded random weights (LayerNorm scales and shifts included,
so the order of the norms matters) into the learner's class by parameter name and comparing
with float64 models of the correct block and of realistic mistakes (no causal mask, post-norm,
no residual, K/V heads repeated in the wrong order, ...). The sampler is checked on its
distribution: thousands of draws from the same logits must match the exact probabilities
the spec defines (tokens that must never be drawn are never drawn), and the draw that
matches a mistaken sampler (top-p without the crossing token, temperature applied after the
softmax, ...) names that mistake.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
from torch import nn

from .. import gpt as ref
from .. import sampling
from ..attention import sdpa
from ..multihead import MultiHeadAttention, merge_heads, split_heads
from . import _models as M
from ._core import CheckFailure, Context, Mistake, exercise, naming
from .mistakes import named
from .toolkit import (
    BUILTIN_ATTENTION,
    TOL,
    DropoutMistakes,
    build_module,
    dtype_name,
    earlier_position_changed,
    expect_follows_device,
    expect_spec_defaults,
    expect_sublayer_dropout,
    load_reference_weights,
)


def random_state_dict(module: nn.Module, g: torch.Generator, scale: float = 0.4) -> dict:
    """Seeded random values for every parameter (LayerNorm weights around 1)."""
    sd = {}
    for name, p in module.state_dict().items():
        r = torch.randn(p.shape, generator=g, dtype=torch.float64)
        sd[name] = 1.0 + 0.3 * r if name.endswith("weight") and p.dim() == 1 else scale * r
    return sd


def _loaded(ctx: Context, mod, P: dict, dtype, case: str, layout: str, likely=None):
    """The learner's module ``mod`` in ``dtype`` and eval mode, holding exactly the parameters
    ``P`` (by name; a buffer, e.g. a causal mask, is left as it is)."""
    mod.to(dtype)
    load_reference_weights(ctx, mod, P, {}, case, likely, layout=layout)
    return mod.eval()


def _expect_outputs(ctx: Context, got, model, mistakes: list, dtype, case: str) -> None:
    """``got`` is ``(out, weights)`` as ``model("correct")`` computes them in float64: the
    weights, then out, a difference named by the first of ``mistakes`` (id, the model's
    mode) whose model reproduces it."""
    exp_out, exp_w = model("correct")
    out, w = ctx.expect_tuple(got, ("out", "weights"), case=case)
    ctx.expect_array(out, exp_out.to(dtype), what="the output", case=case)
    ctx.expect_array(w, exp_w.to(dtype), what="the attention weights", case=case)
    for what, value, expected, i in (
        ("the attention weights", w, exp_w, 1),
        ("the output", out, exp_out, 0),
    ):
        models = [
            Mistake.of(m, model=lambda mode=mode, i=i: model(mode)[i]) for m, mode in mistakes
        ]
        ctx.expect_close(value, expected, what=what, case=case, mistakes=models, **TOL[dtype])


# ----------------------------------------------------------------------------- gpt_block
BLOCK_LAYOUT = (
    "ln1 = nn.LayerNorm(d_model), attn = MultiHeadAttention(d_model, n_heads), "
    "ln2 = nn.LayerNorm(d_model), ff = FeedForward(d_model, d_ff, dropout), "
    "dropout = nn.Dropout(dropout)"
)
#: label (the input), d_model, n_heads, d_ff, B, T
BLOCK_CASES = [
    ("d_model=16, n_heads=4, d_ff=32; x (2, 7, 16)", 16, 4, 32, 2, 7),
    ("one token; x (3, 1, 8)", 8, 2, 16, 3, 1),
    ("batch of one; d_model=12, n_heads=3, d_ff=20; x (1, 9, 12)", 12, 3, 20, 1, 9),
]
BLOCK_THOROUGH_CASES = [("d_model=24, n_heads=6, d_ff=48; x (2, 13, 24)", 24, 6, 48, 2, 13)]


def _block_model(P: dict, x: torch.Tensor, H: int, mode: str = "correct"):
    """What a (possibly buggy) GPT block computes, ``(out, the attention weights)``, in
    float64 with the parameters ``P``."""
    x = x.double()
    _, T, D = x.shape
    weights = []

    def attn(t):
        q, k, v = (split_heads(M.linear(t, P, f"attn.{n}"), H) for n in ("w_q", "w_k", "w_v"))
        mask = {
            "no_mask": None,
            "strict": torch.ones(T, T, dtype=torch.bool).tril(-1),
            "upper": torch.ones(T, T, dtype=torch.bool).triu(),
        }.get(mode, torch.ones(T, T, dtype=torch.bool).tril())
        out, w = sdpa(q, k, v, mask)
        weights.append(w)
        return M.linear(merge_heads(out), P, "attn.w_o")

    def ff(t):
        act = nn.functional.gelu if mode == "gelu" else torch.relu
        return M.linear(act(M.linear(t, P, "ff.linear1")), P, "ff.linear2")

    def ln(name):
        return lambda t: nn.functional.layer_norm(t, (D,), P[f"{name}.weight"], P[f"{name}.bias"])

    order = {"post_norm": "post", "normed_residual": "residual_normed"}.get(mode, "pre")
    x = M.sublayer(x, attn, ln("ln1"), order, residual=mode != "no_residual")
    x = M.sublayer(x, ff, ln("ln2"), "no_norm" if mode == "ff_no_norm" else order)
    return x, weights[0]


BLOCK_MISTAKES = [
    ("block_no_mask", "no_mask"),
    ("block_strict", "strict"),
    ("block_upper", "upper"),
    ("block_post_norm", "post_norm"),
    ("block_normed_residual", "normed_residual"),
    ("block_no_residual", "no_residual"),
    ("block_ff_no_norm", "ff_no_norm"),
    ("block_gelu", "gelu"),
]


@exercise(
    "gpt_block",
    kind="module",
    forbidden=lambda: [
        (ref.GPTBlock.forward, "the reference attention_ref.gpt.GPTBlock"),
        (ref.GPTBlock.step, "the reference GPTBlock.step (its cached forward)"),
        *BUILTIN_ATTENTION,
    ],
    summary="a pre-norm GPT block with causal multi-head self-attention",
)
def check_gpt_block(cls, ctx: Context) -> None:
    g = ctx.torch_gen(1101)
    for label, D, H, F, B, T in BLOCK_CASES + (BLOCK_THOROUGH_CASES if ctx.thorough else []):
        P = random_state_dict(ref.GPTBlock(D, H, F), g)
        x64 = torch.randn(B, T, D, generator=g, dtype=torch.float64)
        for dtype in (torch.float64, torch.float32):
            case = f"GPTBlock({D}, {H}, {F}) in eval mode, {dtype_name(dtype)}; {label}"
            mod = build_module(ctx, cls, (D, H, F), {}, case, sample=(x64.to(dtype),))
            mod = _loaded(ctx, mod, P, dtype, case, BLOCK_LAYOUT)
            x = x64.to(dtype)
            with torch.no_grad():
                got = ctx.call(mod, x, case=case)
            _expect_outputs(ctx, got, partial(_block_model, P, x, H), BLOCK_MISTAKES, dtype, case)
    _check_block_causal(cls, ctx, g)
    _check_block_dropout(cls, ctx, g)


def _small_block(cls, ctx: Context, g, case: str, **kwargs) -> nn.Module:
    """The learner's GPTBlock(8, 2, 16, **kwargs) in float64 with seeded weights."""
    sample = (torch.zeros(1, 2, 8, dtype=torch.float64),)
    mod = build_module(ctx, cls, (8, 2, 16), kwargs, case, sample=sample)
    P = random_state_dict(ref.GPTBlock(8, 2, 16), g)
    return _loaded(ctx, mod, P, torch.float64, case, BLOCK_LAYOUT)


def _check_block_causal(cls, ctx: Context, g) -> None:
    """Changing the last token changes no earlier output."""
    case = "GPTBlock(8, 2, 16), x (1, 6, 8) float64: the last token changed"
    mod = _small_block(cls, ctx, g, case)
    x = torch.randn(1, 6, 8, generator=g, dtype=torch.float64)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        a = ctx.call(mod, x, case=case)[0]
        b = ctx.call(mod, x2, case=case)[0]
    i = earlier_position_changed(a, b, atol=1e-9)
    if i is not None:
        ctx.fail(
            "future tokens change earlier outputs: changing token 5 changed the "
            f"output at position {i}.",
            case=case,
            mistake="block_no_causal_mask",
        )


#: The block's sub-layers, whose outputs the spec's ``self.dropout`` drops, and the layer
#: that makes each one's output: with its weight and bias zeroed the sub-layer returns 0.
SUBLAYERS = {"attn": "attn.w_o", "ff": "ff.linear2"}

#: The ids the block's dropout check names (the toolkit's property, the block's own ids).
BLOCK_DROPOUT_MISTAKES = DropoutMistakes(
    on_residual="block_dropout_on_residual",
    missing="block_sublayer_dropout_missing",
    never_applied="block_dropout_never_applied",
    misplaced="block_dropout_misplaced",
)


def _check_block_dropout(cls, ctx: Context, g) -> None:
    """Dropout where the spec puts it (``toolkit.expect_sublayer_dropout``), with dropout=0.5:
    on each sub-layer's output, before the residual add, rescaled by 1 / (1 - p). A sub-layer
    is silenced by zeroing the layer that makes its output (a forward hook would miss a
    learner's ``self.attn.forward(...)``)."""
    p = 0.5
    label = f"GPTBlock(8, 2, 16, dropout={p}), x (2, 5, 8) float64"
    sample = (torch.zeros(1, 2, 8, dtype=torch.float64),)
    mod = build_module(ctx, cls, (8, 2, 16), {"dropout": p}, label, sample=sample)
    P = random_state_dict(ref.GPTBlock(8, 2, 16), g)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    _loaded(ctx, mod, P, torch.float64, label, BLOCK_LAYOUT)

    @contextmanager
    def silence(names: list[str]):
        zeroed = [SUBLAYERS[name] for name in names]
        silenced = {
            k: torch.zeros_like(v) if k.rsplit(".", 1)[0] in zeroed else v for k, v in P.items()
        }
        _loaded(ctx, mod, silenced, torch.float64, label, BLOCK_LAYOUT)
        try:
            yield
        finally:
            _loaded(ctx, mod, P, torch.float64, label, BLOCK_LAYOUT)

    def run(case: str) -> torch.Tensor:
        with torch.no_grad():
            return ctx.call(mod, x, case=case)[0]

    expect_sublayer_dropout(
        ctx,
        mod,
        run,
        {name: "dropout" for name in SUBLAYERS},
        p=p,
        case=label,
        mistakes=BLOCK_DROPOUT_MISTAKES,
        silence=silence,
        residual=x,
    )


# ----------------------------------------------------------------------------- sampler
def next_token_distribution(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    mode: str = "correct",
) -> np.ndarray:
    """The exact distribution ``sample_next_token`` draws from (one row of logits), or
    that of a mistaken sampler, in float64."""
    s = logits.double().numpy().copy()
    V = s.size
    if mode == "after_softmax":
        p = M.softmax(s)
        s = np.log(np.maximum(p / temperature, 1e-300))  # softmax first: T has no effect
    elif mode == "times":
        s = s * temperature
    else:
        s = s / temperature
    if top_p is not None and mode == "p_before_k":
        s = _top_p(s, top_p, "correct")
    if top_k is not None:
        if mode in ("k_exact", "k_exact_high"):  # exactly k, ties by index (low or high)
            idx = np.arange(V) if mode == "k_exact" else -np.arange(V)
            keep = np.zeros(V, dtype=bool)
            keep[np.lexsort((idx, -s))[: min(top_k, V)]] = True
        else:
            kth = np.sort(s)[::-1][min(top_k, V) - 1]
            keep = s >= kth
        s = np.where(keep, s, -np.inf)
    if top_p is not None and mode != "p_before_k":
        s = _top_p(s, top_p, mode)
    return M.softmax(s)


def _top_p(s: np.ndarray, top_p: float, mode: str) -> np.ndarray:
    """The logits ``s`` with the tokens outside the nucleus set to -inf, as ``mode`` keeps
    them ("correct": while the probability above a token is < top_p)."""
    p = M.softmax(s)
    above = np.array([p[p > pi].sum() for pi in p])
    if mode == "p_exclusive":  # keeps tokens while the sum *including* them stays < p
        keep = above + p < top_p
        if not keep.any():
            keep = p == p.max()
    elif mode in ("p_sorted_ties", "p_sorted_ties_high"):  # exclusive cumsum, sorted
        idx = np.arange(p.size) if mode == "p_sorted_ties" else -np.arange(p.size)
        order = np.lexsort((idx, -p))  # most probable first; ties by index, low or high
        cum = np.cumsum(p[order]) - p[order]
        keep = np.zeros_like(p, dtype=bool)
        keep[order] = cum < top_p
    elif mode == "p_le":  # keeps a token while the mass before it is <= top_p
        keep = above <= top_p + 1e-12
    else:
        keep = above < top_p
    return np.where(keep, s, -np.inf)


SAMPLER_MISTAKES = [
    ("sampler_p_exclusive", "p_exclusive"),
    ("sampler_after_softmax", "after_softmax"),
    ("sampler_times", "times"),
    ("sampler_k_exact", "k_exact"),
    ("sampler_k_exact_high", "k_exact_high"),
    ("sampler_p_before_k", "p_before_k"),
    ("sampler_p_sorted_ties", "p_sorted_ties"),
    ("sampler_p_sorted_ties_high", "p_sorted_ties_high"),
    ("sampler_p_le", "p_le"),
]


#: probabilities 0.125, 0.5, 0.125, 0.25 (exact in float32 and float64: logits -2 ln 2,
#: 0, -2 ln 2, -ln 2): 0.5 + 0.25 reach top_p = 0.75 exactly, so "< top_p" and "<= top_p" differ
#: and rounding cannot decide between them. Run in both dtypes.
EXACT_TOP_P = "top_p=0.75, reached exactly by 0.5 + 0.25 (probabilities 0.125, 0.5, 0.125, 0.25)"
#: label, the row of logits (named in _sampler_rows), temperature, top_k, top_p
SAMPLER_CASES = [
    ("plain sampling, T=1", "base", 1.0, None, None),
    ("T=2 (flatter)", "base", 2.0, None, None),
    ("T=0.5 (sharper)", "base", 0.5, None, None),
    ("top_p=0.6 (0.4 + 0.25 cross it)", "base", 1.0, None, 0.6),
    (EXACT_TOP_P, "exact", 1.0, None, 0.75),
    ("top_k=2 with a tie at the 2nd place", "tie", 1.0, 2, None),
    ("top_k=3, then top_p=0.7", "base", 1.0, 3, 0.7),
    ("top_p=0.45 with three tokens tied at 0.2 after 0.3", "tied", 1.0, None, 0.45),
    ("a token with logit -inf (never drawn), T=1.5", "-inf", 1.5, None, None),
]
SAMPLER_THOROUGH_CASES = [
    ("random logits, T=0.8, top_k=5", "random", 0.8, 5, None),
    ("random logits, T=1.3, top_p=0.75", "random", 1.3, None, 0.75),
    ("random logits, top_k=4, top_p=0.8", "random", 1.0, 4, 0.8),
]


def _sampler_rows(ctx: Context) -> dict[str, torch.Tensor]:
    rng = ctx.rng(1102)
    perm = rng.permutation(6)

    def log(probs) -> torch.Tensor:
        return torch.log(torch.tensor(probs, dtype=torch.float64))

    return {
        "base": log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])[perm]),
        "exact": torch.tensor([-2.0, 0.0, -2.0, -1.0], dtype=torch.float64) * math.log(2),
        "tie": torch.tensor([2.0, 1.0, 0.5, 1.0, -1.0, 0.0], dtype=torch.float64)[perm],
        "tied": log([0.3, 0.2, 0.2, 0.2, 0.1]),
        "-inf": torch.tensor([0.5, -math.inf, 1.0, 0.0, 2.0], dtype=torch.float64),
        "random": torch.from_numpy(rng.normal(size=8) * 1.5),
    }


def _sample(ctx, fn, logits, temperature, top_k, top_p, generator, case):
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    return ctx.call(fn, logits, case=case, **kw)


def _expect_ids(ctx: Context, got, shape: tuple, V: int, case: str) -> None:
    if not isinstance(got, torch.Tensor):
        ctx.fail(
            f"must return a torch.Tensor of token ids; got {type(got).__name__}.",
            case=case,
            mistake="wrong_type",
        )
    if tuple(got.shape) != shape:
        ctx.fail(
            f"returned shape {tuple(got.shape)}, expected {shape} (logits.shape[:-1]).",
            case=case,
            hint="one id per row of logits: drop the vocabulary axis (e.g. .squeeze(-1) after "
            "torch.multinomial(..., 1)).",
            mistake="wrong_shape",
        )
    if got.dtype != torch.long:
        ctx.fail(f"returned dtype {got.dtype}, expected torch.int64 (token ids).", case=case)
    if got.numel() and (int(got.min()) < 0 or int(got.max()) >= V):
        ctx.fail(f"returned ids outside 0..{V - 1}.", case=case)


@exercise(
    "sample_next_token",
    forbidden=lambda: [
        (sampling.sample_next_token, "the reference attention_ref.sample_next_token")
    ],
    summary="greedy, temperature, top-k and top-p sampling of the next token",
)
def check_sample_next_token(fn, ctx: Context) -> None:
    _check_greedy(fn, ctx)
    N = 6000 if ctx.thorough else 4000
    rows = _sampler_rows(ctx)
    for label, name, T, k, p in SAMPLER_CASES + (SAMPLER_THOROUGH_CASES if ctx.thorough else []):
        row = rows[name]
        for dtype in (torch.float32, torch.float64) if label == EXACT_TOP_P else (torch.float32,):
            case = (
                f"{label}: logits ({N}, {row.numel()}) {dtype_name(dtype)} (the same row {N} "
                f"times), temperature={T}, top_k={k}, top_p={p}"
            )
            gen = torch.Generator().manual_seed(ctx.seed * 31 + N)
            got = _sample(ctx, fn, row.to(dtype).expand(N, -1).contiguous(), T, k, p, gen, case)
            _expect_ids(ctx, got, (N,), row.numel(), case)
            freq = np.bincount(got.numpy(), minlength=row.numel()) / N
            _compare_distribution(ctx, freq, row, T, k, p, N, case)
    _check_generator(fn, ctx)
    _check_batch_shape(fn, ctx)
    _check_leading_dims(fn, ctx, rows["base"])
    base = rows["base"].float().expand(2000, -1).contiguous()
    expect_spec_defaults(
        ctx,
        fn,
        lambda: (base,),
        {"temperature": 1.0, "top_k": None, "top_p": None},
        case="logits (2000, 6) float32 (the same row), temperature, top_k and top_p left out",
        signature="sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, "
        "generator=None)",
        kwargs=lambda: {"generator": torch.Generator().manual_seed(ctx.seed + 11)},
    )
    meta = torch.device("meta")
    for kwargs in ({"temperature": 0.8, "top_k": 3, "top_p": 0.9}, {"temperature": 0.0}):
        expect_follows_device(
            ctx,
            fn,
            (torch.empty(2, 7, device=meta),),
            ("the tokens",),
            "wrong_device",
            "logits (2, 7), " + ", ".join(f"{k}={v}" for k, v in kwargs.items()),
            **kwargs,
        )


def _fits(freq: np.ndarray, dist: np.ndarray, N: int) -> bool:
    if np.any((dist == 0) & (freq > 0)):
        return False
    tol = 5 * np.sqrt(dist * (1 - dist) / N) + 2e-3
    return bool(np.all(np.abs(freq - dist) <= tol))


def _compare_distribution(ctx, freq, row, T, k, p, N, case) -> None:
    """The frequencies ``freq`` of N draws fit the exact distribution; if not, the first of
    SAMPLER_MISTAKES whose (different) distribution they fit names the mistake."""
    expected = next_token_distribution(row, T, k, p)
    if _fits(freq, expected, N):
        return
    likely = ""
    for mistake_id, mode in SAMPLER_MISTAKES:
        try:
            alt = next_token_distribution(row, T, k, p, mode)
        except Exception:
            continue
        if not np.allclose(alt, expected, atol=1e-3) and _fits(freq, alt, N):
            likely = named(mistake_id)
            break
    never = np.nonzero((expected == 0) & (freq > 0))[0]
    i = int(never[0]) if len(never) else int(np.argmax(np.abs(freq - expected)))
    what = (
        f"token {i} was drawn {int(round(freq[i] * N))} times, but its probability must be 0"
        if len(never)
        else f"token {i} was drawn with frequency {freq[i]:.3f}, expected {expected[i]:.3f} "
        f"(exact distribution {np.round(expected, 3).tolist()}, drawn "
        f"{np.round(freq, 3).tolist()})"
    )
    ctx.fail(
        f"the samples do not follow the distribution the spec defines: {what}.",
        case=case,
        likely=likely,
        hint=getattr(likely, "hint", "")
        or "follow the spec step by step: divide by T, top-k, softmax, top-p, "
        "renormalise, torch.multinomial.",
    )


#: What an error says when temperature 0 was divided by: inf/nan logits (multinomial's
#: "probability tensor contains either `inf`, `nan` or element < 0") or a ZeroDivisionError.
_DIVIDED_BY_ZERO = re.compile(r"\binf\b|\bnan\b|ZeroDivision|division by zero", re.IGNORECASE)


def _check_greedy(fn, ctx: Context) -> None:
    g = ctx.torch_gen(1103)
    rows = torch.randint(0, 4, (6, 7), generator=g).double()  # many ties
    rows[0] = torch.tensor([1.0, 3.0, 0.0, 3.0, 2.0, 3.0, -1.0])
    for dtype in (torch.float32, torch.float64):
        logits = rows.to(dtype)
        expected = torch.tensor([int(np.argmax(r)) for r in rows.numpy()])
        for k, p in ((None, None), (2, 0.5)):
            case = (
                f"temperature=0 (greedy), top_k={k}, top_p={p}: logits (6, 7) {dtype_name(dtype)} "
                "with ties for the maximum"
            )
            try:
                got = _sample(ctx, fn, logits, 0.0, k, p, None, case)
            except CheckFailure as err:
                said = str(err).split("\n")[0]  # the error itself, not the quoted line
                if "Likely mistake" in str(err) or not _DIVIDED_BY_ZERO.search(said):
                    raise  # the cause is elsewhere (or already named)
                raise naming(err, named("temperature_zero_not_handled")) from None
            _expect_ids(ctx, got, (6,), 7, case)
            if not torch.equal(got.cpu(), expected):
                got = got.cpu()
                i = int((got != expected).nonzero()[0])
                last = torch.tensor([6 - int(np.argmax(r[::-1])) for r in rows.numpy()])
                tied_max = bool((rows.gather(1, got[:, None]) == rows.amax(1, keepdim=True)).all())
                if torch.equal(got, last):
                    likely = named("greedy_last_tie")
                elif tied_max and k is not None:
                    likely = named("greedy_after_top_k")
                elif tied_max:
                    likely = named("greedy_other_tie")
                else:
                    likely = named("greedy_not_argmax")
                ctx.fail(
                    f"row {i}: got id {int(got[i])}, expected {int(expected[i])} (the first "
                    f"index of the largest logit).",
                    case=case,
                    likely=likely,
                    hint=likely.hint,
                )
    # any number of leading dimensions, none included: the argmax is along the last axis
    for shape in ((2, 3, 7), (7,)):
        case = f"temperature=0 (greedy): logits {shape}, {len(shape) - 1} leading dimension(s)"
        logits = (rows if len(shape) == 3 else rows[0]).reshape(shape).float()
        got = _sample(ctx, fn, logits, 0.0, None, None, None, case)
        _expect_ids(ctx, got, shape[:-1], 7, case)
        want = expected.reshape(shape[:-1]) if len(shape) == 3 else expected[0]
        if not torch.equal(got.cpu(), want):
            ctx.fail(
                f"got ids {got.tolist()}, expected {want.tolist()} (the first index of the "
                "largest logit along the LAST axis).",
                case=case,
                hint="take the argmax over dim=-1, the vocabulary, whatever the number of "
                "leading dimensions.",
            )


def _check_generator(fn, ctx: Context) -> None:
    logits = torch.zeros(300, 10)
    case = "logits (300, 10) all zero (uniform), T=1, called twice with generators seeded alike"
    draws = []
    for _ in range(2):
        torch.manual_seed(len(draws) + 12345)  # a different global state each time
        gen = torch.Generator().manual_seed(7)
        draws.append(_sample(ctx, fn, logits, 1.0, None, None, gen, case))
    _expect_ids(ctx, draws[0], (300,), 10, case)
    if not torch.equal(draws[0], draws[1]):
        ctx.fail(
            "two calls with generators seeded the same gave different tokens.",
            case=case,
            mistake="generator_ignored",
        )


def _check_batch_shape(fn, ctx: Context) -> None:
    g = ctx.torch_gen(1104)
    logits = torch.randn(2, 3, 5, generator=g)
    case = "logits (2, 3, 5): two leading batch dimensions, top_k=2, top_p=0.9"
    got = _sample(ctx, fn, logits, 1.0, 2, 0.9, torch.Generator().manual_seed(1), case)
    _expect_ids(ctx, got, (2, 3), 5, case)
    for idx in np.ndindex(2, 3):
        dist = next_token_distribution(logits[idx], 1.0, 2, 0.9)
        if dist[int(got[idx])] == 0:
            ctx.fail(
                f"at {idx} token {int(got[idx])} was drawn, but it is outside top_k/top_p.",
                case=case,
                hint="work along the last axis only; keep the leading axes as they are.",
            )


def _check_leading_dims(fn, ctx: Context, row: torch.Tensor) -> None:
    """top_k is counted along the vocabulary whatever the leading dimensions: the same
    row drawn as logits (2, 2000, V) and (2000, 2, V) follows the exact distribution."""
    V = row.numel()
    for lead in ((2, 2000), (2000, 2)):
        shape = (*lead, V)
        case = f"top_k=4 on logits {shape}: the same row {lead[0] * lead[1]} times, T=1"
        gen = torch.Generator().manual_seed(ctx.seed * 37 + lead[0])
        logits = row.float().expand(shape).contiguous()
        got = _sample(ctx, fn, logits, 1.0, 4, None, gen, case)
        _expect_ids(ctx, got, lead, V, case)
        freq = np.bincount(got.flatten().numpy(), minlength=V) / got.numel()
        if not _fits(freq, next_token_distribution(row, 1.0, 4, None), got.numel()):
            _compare_distribution(ctx, freq, row, 1.0, 4, None, got.numel(), case)


# ----------------------------------------------------------------------------- GQA
def _gqa_model(P, query, key, value, mask, H, G, mode="correct"):
    """What (possibly buggy) grouped-query attention computes, in float64."""
    q = split_heads(M.linear(query.double(), P, "w_q"), H)
    k, v = (split_heads(M.linear(t.double(), P, n), G) for t, n in ((key, "w_k"), (value, "w_v")))
    r = H // G
    k, v = (t.repeat(1, r, 1, 1) if mode == "repeat" else t.repeat_interleave(r, 1) for t in (k, v))
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)
    if mode == "no_scale":
        q = q * math.sqrt(q.shape[-1])
    if mode == "uniform_masked" and mask is not None:  # masked_fill(-1e9): no zero rows
        s = M.scores(q.numpy(), k.numpy())
        w = torch.from_numpy(M.attention_weights(s, mask.numpy(), mask_mode="fill"))
        out = w @ v
    else:
        out, w = sdpa(q, k, v, None if mode == "no_mask" else mask)
    out = merge_heads(out)
    return (out if mode == "no_w_o" else M.linear(out, P, "w_o")), w


GQA_MISTAKES = [
    ("gqa_repeat", "repeat"),
    ("gqa_no_scale", "no_scale"),
    ("gqa_no_mask", "no_mask"),
    ("gqa_no_w_o", "no_w_o"),
    ("gqa_uniform_masked", "uniform_masked"),
]


GQA_LAYOUT = (
    "w_q = nn.Linear(d_model, d_model, bias=bias), w_k and w_v = nn.Linear(d_model, "
    "n_kv_heads * d_head, bias=bias), w_o = nn.Linear(d_model, d_model, bias=bias)"
)
#: label, d_model, n_heads, n_kv_heads, B, n_q, n_k, the mask (see _gqa_mask), bias
GQA_CASES = [
    ("2 groups of 2 query heads", 16, 4, 2, 2, 5, 5, "causal", True),
    ("multi-query (n_kv_heads=1)", 12, 3, 1, 2, 4, 6, None, True),
    ("n_kv_heads = n_heads (multi-head attention)", 12, 4, 4, 1, 6, 6, "causal", True),
    ("3 groups of 2, cross-attention n_q=3, n_k=7, padding mask", 24, 6, 3, 2, 3, 7, "pad", False),
    ("one token, 4 query heads sharing 1 kv head", 8, 4, 1, 1, 1, 1, None, True),
]
GQA_THOROUGH_CASES = [("4 groups of 2, n=9, causal", 32, 8, 4, 2, 9, 9, "causal", True)]


def _gqa_mask(kind: str | None, B: int, n_q: int, n_k: int) -> torch.Tensor | None:
    if kind == "causal":
        return torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    if kind == "pad":
        mask = torch.ones(B, n_q, n_k, dtype=torch.bool)
        mask[0, :, 4:] = False
        mask[1, 1, :] = False  # a fully masked row: zero weights
        return mask
    return None


@exercise(
    "grouped_query_attention",
    kind="module",
    forbidden=lambda: [
        (
            ref.GroupedQueryAttention.forward,
            "the reference attention_ref.gpt.GroupedQueryAttention",
        ),
        (ref.GroupedQueryAttention.attend, "the reference GroupedQueryAttention.attend"),
        (MultiHeadAttention.forward, "attention_ref.MultiHeadAttention"),
        *BUILTIN_ATTENTION,
    ],
    summary="attention with fewer key/value heads than query heads",
)
def check_grouped_query_attention(cls, ctx: Context) -> None:
    g = ctx.torch_gen(1105)
    full = named("gqa_full_projections")  # w_k or w_v with n_heads heads of outputs
    for label, D, H, G, B, n_q, n_k, mask_kind, bias in GQA_CASES + (
        GQA_THOROUGH_CASES if ctx.thorough else []
    ):
        P = random_state_dict(ref.GroupedQueryAttention(D, H, G, bias=bias), g)
        query = torch.randn(B, n_q, D, generator=g, dtype=torch.float64)
        kv = query if n_q == n_k else torch.randn(B, n_k, D, generator=g, dtype=torch.float64)
        mask = _gqa_mask(mask_kind, B, n_q, n_k)
        for dtype in (torch.float64, torch.float32):
            case = (
                f"{label}: GroupedQueryAttention(d_model={D}, n_heads={H}, n_kv_heads={G}, "
                f"bias={bias}) {dtype_name(dtype)}; query ({B}, {n_q}, {D}), key/value ({B}, "
                f"{n_k}, {D}), mask {None if mask is None else tuple(mask.shape)}"
            )
            sample = (query.to(dtype), kv.to(dtype), kv.to(dtype), mask)
            mod = build_module(ctx, cls, (D, H, G), {"bias": bias}, case, sample=sample)
            mod = _loaded(
                ctx, mod, P, dtype, case, GQA_LAYOUT, {"shape w_k": full, "shape w_v": full}
            )
            with torch.no_grad():
                got = ctx.call(mod, query.to(dtype), kv.to(dtype), kv.to(dtype), mask, case=case)
            model = partial(_gqa_model, P, query, kv, kv, mask, H, G)
            _expect_outputs(ctx, got, model, GQA_MISTAKES, dtype, case)
    _check_gqa_memory(cls, ctx)


def _check_gqa_memory(cls, ctx: Context) -> None:
    case = "GroupedQueryAttention(d_model=16, n_heads=4, n_kv_heads=2)"
    mod = build_module(ctx, cls, (16, 4, 2), {}, case, sample=(torch.zeros(1, 2, 16),) * 3)
    n = sum(p.numel() for name, p in mod.named_parameters() if name.startswith(("w_k", "w_v")))
    if n != 2 * (16 * 8 + 8):
        ctx.fail(
            f"w_k and w_v hold {n} parameters; with 2 key/value heads of d_head=4 they hold "
            f"2 * (16 * 8 + 8) = {2 * (16 * 8 + 8)}.",
            case=case,
            mistake="gqa_full_projections_reduced",
        )


__all__ = ["next_token_distribution"]
