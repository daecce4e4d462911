"""The data, decoding and metrics behind notebooks 09 (question answering) and 10
(summarization): generators are deterministic and keep the test split unseen, decoding
returns valid spans and selections, and bad input is refused with a clear error."""

from __future__ import annotations

import itertools

import pytest
import torch

from attention_ref import best_span, pool_sentences, select_sentences, span_loss
from attention_ref.apps.qa import SpanScorer, encode_qa, qa_vocab, sentence_mask
from attention_ref.apps.summarization import (
    attention_received,
    encode_summaries,
    sentence_f1,
    summary_vocab,
)
from attention_ref.data import make_qa_data, make_summarization_data


# ----------------------------------------------------------------------------- QA data
def test_qa_data_is_deterministic_per_seed():
    a, b = make_qa_data(50, 20, seed=3), make_qa_data(50, 20, seed=3)
    c = make_qa_data(50, 20, seed=4)
    assert a == b
    assert a.train != c.train


def test_qa_test_contexts_are_never_seen_in_training():
    data = make_qa_data(2000, 200, seed=0)
    seen = {tuple(ex.context) for ex in data.train}
    assert not any(tuple(ex.context) in seen for ex in data.test)


def test_qa_answers_are_spans_of_the_context_that_answer_the_question():
    data = make_qa_data(300, 10, seed=1)
    kinds = set()
    for ex in data.train:
        kinds.add(ex.kind)
        assert 0 <= ex.start <= ex.end < len(ex.context)
        ans = ex.answer
        if ex.kind in ("born_where", "born_when", "invented_when"):
            assert len(ans) == 1
        else:
            assert len(ans) == 2
        if ex.kind in ("born_when", "invented_when"):
            assert ans[0].isdigit()
        if ex.kind == "invented_who":
            assert " ".join(ans) in " ".join(ex.context)
            # the question names the invention, and the answer's sentence says who made it
            assert ex.context[ex.start + 2] == "invented"
        if ex.kind in ("born_where", "born_when", "invented_what", "invented_when"):
            name = ex.question[2:4]
            # the person the question names starts the answer's sentence
            back = ex.context[: ex.start][::-1]
            dot = back.index(".") if "." in back else len(back)
            first = ex.context[ex.start - dot : ex.start - dot + 2]
            assert first == name, (ex.question, ex.context, ex.answer)
    assert kinds == {"born_where", "born_when", "invented_what", "invented_when", "invented_who"}


def test_qa_contexts_hold_several_candidates_of_the_answer_type():
    data = make_qa_data(200, 10, seed=2)
    for ex in data.train:
        years = [w for w in ex.context if w.isdigit()]
        assert len(years) >= 4  # at least two people, two years each


def test_qa_generator_refuses_bad_sizes():
    with pytest.raises(ValueError, match="n_people"):
        make_qa_data(10, 10, n_people=(3, 2))
    with pytest.raises(ValueError, match="n_people"):
        make_qa_data(10, 10, n_people=(0, 2))


def test_encode_qa_puts_the_answer_at_the_shifted_positions():
    data = make_qa_data(40, 5, seed=0)
    vocab = qa_vocab(data)
    batch = encode_qa(data.train, vocab)
    for b, ex in enumerate(data.train):
        toks = vocab.decode(batch.ids[b], strip=False)
        assert toks[0] == "<cls>" and toks[len(ex.question) + 1] == "<sep>"
        assert toks[int(batch.start[b]) : int(batch.end[b]) + 1] == ex.answer
        ctx = [t for t, m in zip(toks, batch.context_mask[b].tolist(), strict=True) if m]
        assert ctx == ex.context
    with pytest.raises(ValueError, match="at least one"):
        encode_qa([], vocab)


def test_sentence_mask_lets_context_tokens_see_the_question_and_their_own_sentence_only():
    data = make_qa_data(5, 5, seed=0)
    vocab = qa_vocab(data)
    batch = encode_qa(data.train[:2], vocab)
    mask = sentence_mask(batch.segment)
    seg = batch.segment[0]
    T = seg.shape[0]
    assert mask.shape == (2, 1, T, T) and mask.dtype == torch.bool
    for i in range(T):
        for j in range(T):
            want = bool(seg[j] >= 0 and (seg[i] == 0 or seg[j] == 0 or seg[i] == seg[j]))
            assert bool(mask[0, 0, i, j]) == want
    # each context sentence ends with "." and a new sentence starts after it
    toks = vocab.decode(batch.ids[0], strip=False)
    for i in range(1, T):
        if seg[i] > 1 and seg[i] != seg[i - 1]:
            assert toks[i - 1] == "."


# ----------------------------------------------------------------------------- best_span
def _brute_force(s, e, mask, max_len):
    B, T = s.shape
    out = []
    for b in range(B):
        best = max(
            (
                (float(s[b, i] + e[b, j]), i, j)
                for i, j in itertools.product(range(T), repeat=2)
                if i <= j and mask[b, i] and mask[b, j] and (max_len is None or j - i < max_len)
            ),
        )
        out.append(best[1:])
    return out


@pytest.mark.parametrize("max_len", [None, 1, 3])
def test_best_span_is_the_best_valid_span(max_len):
    g = torch.Generator().manual_seed(0)
    s, e = torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g)
    mask = torch.zeros(6, 10, dtype=torch.bool)
    mask[:, 3:9] = True
    mask[2, 3:] = False
    mask[2, 5] = True  # a one-token context
    start, end = best_span(s, e, mask, max_len)
    assert start.dtype == torch.long and start.shape == (6,)
    assert [(int(a), int(b)) for a, b in zip(start, end, strict=True)] == _brute_force(
        s, e, mask, max_len
    )
    assert bool((start <= end).all()) and bool(mask[torch.arange(6), start].all())
    assert bool(mask[torch.arange(6), end].all())


def test_best_span_never_ends_before_it_starts_even_when_the_argmaxes_cross():
    s = torch.tensor([[0.0, 0.0, 0.0, 5.0]])
    e = torch.tensor([[4.0, 0.0, 0.0, 0.0]])
    start, end = best_span(s, e, torch.ones(1, 4, dtype=torch.bool))
    # independent argmaxes would give (3, 0); the best valid spans score 5 + 0 or 0 + 4
    assert (int(start), int(end)) == (3, 3)


def test_best_span_refuses_bad_input():
    s = torch.randn(2, 5)
    with pytest.raises(ValueError, match="mask"):
        best_span(s, s, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        best_span(s, s, [[True] * 5] * 2)
    with pytest.raises(ValueError, match="max_len"):
        best_span(s, s, torch.ones(2, 5, dtype=torch.bool), max_len=0)


def test_span_scorer_gives_minus_inf_outside_the_context():
    torch.manual_seed(0)
    scorer = SpanScorer(8)
    mask = torch.tensor([[False, True, True, False]])
    s, e = scorer(torch.randn(1, 4, 8), mask)
    assert torch.isinf(s[~mask]).all() and torch.isfinite(s[mask]).all()
    assert torch.isinf(e[~mask]).all()
    with pytest.raises(ValueError, match="context_mask"):
        scorer(torch.randn(1, 4, 8), torch.ones(1, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------- span_loss
def test_span_loss_equals_cross_entropy_over_the_context_and_ignores_the_rest():
    g = torch.Generator().manual_seed(1)
    s, e = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[:, 2:6] = True
    start, end = torch.tensor([2, 3, 5]), torch.tensor([4, 3, 5])
    F = torch.nn.functional
    want = (F.cross_entropy(s[:, 2:6], start - 2) + F.cross_entropy(e[:, 2:6], end - 2)) / 2
    got = span_loss(s, e, start, end, mask)
    torch.testing.assert_close(got, want)
    s2 = torch.where(mask, s, s + 100.0)
    torch.testing.assert_close(span_loss(s2, e, start, end, mask), got)


def test_span_loss_refuses_answers_outside_the_context_and_bad_shapes():
    s = torch.randn(2, 5)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, 2:] = True
    with pytest.raises(ValueError, match="inside the mask"):
        span_loss(s, s, torch.tensor([0, 2]), torch.tensor([3, 3]), mask)
    with pytest.raises(ValueError, match="start"):
        span_loss(s, s, torch.tensor([2]), torch.tensor([3, 3]), mask)
    with pytest.raises(TypeError, match="start"):
        span_loss(s, s, torch.tensor([2.0, 2.0]), torch.tensor([3, 3]), mask)


# ----------------------------------------------------------------------------- summarization data
def test_summarization_data_is_deterministic_and_test_documents_are_unseen():
    a = make_summarization_data(300, 50, seed=5)
    assert a == make_summarization_data(300, 50, seed=5)
    assert a.train != make_summarization_data(300, 50, seed=6).train
    seen = {tuple(d.tokens) for d in a.train}
    assert not any(tuple(d.tokens) in seen for d in a.test)


def test_summary_sentences_are_the_facts_about_the_headline_topic_in_order():
    data = make_summarization_data(200, 10, seed=0, n_sentences=(6, 8), n_key=(2, 3))
    for d in data.train:
        topic = d.header[3]
        assert 6 <= len(d.sentences) <= 8 and 2 <= sum(d.labels) <= 3
        for sent, key in zip(d.sentences, d.labels, strict=True):
            assert key == (sent[:2] == ["the", topic])
        assert d.summary == [s for s in d.sentences if s[1] == topic]
        assert len(d.sentence_ids) == len(d.tokens)


def test_summarization_generator_refuses_bad_sizes():
    with pytest.raises(ValueError, match="n_key"):
        make_summarization_data(5, 5, n_key=(3, 2))
    with pytest.raises(ValueError, match="n_key"):
        make_summarization_data(5, 5, n_sentences=(3, 4), n_key=(2, 3))


def test_encode_summaries_marks_sentences_and_padding():
    data = make_summarization_data(30, 5, seed=0)
    vocab = summary_vocab(data)
    batch = encode_summaries(data.train, vocab)
    for b, d in enumerate(data.train):
        n = len(d.tokens)
        assert batch.sentence_ids[b, :n].tolist() == d.sentence_ids
        assert (batch.sentence_ids[b, n:] == -1).all()
        assert batch.labels[b, : len(d.labels)].tolist() == d.labels
        assert batch.sentence_mask[b].sum() == len(d.sentences)


# ----------------------------------------------------------------------------- sentence F1
@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ([1, 1, 0, 0], [1, 1, 0, 0], 1.0),
        ([1, 0, 0, 0], [1, 1, 0, 0], 2 / 3),  # P = 1, R = 1/2
        ([1, 1, 1, 0], [1, 0, 0, 0], 0.5),  # P = 1/3, R = 1
        ([0, 0, 1, 1], [1, 1, 0, 0], 0.0),
        ([0, 0, 0, 0], [0, 0, 0, 0], 1.0),
        ([0, 0, 0, 0], [1, 0, 0, 0], 0.0),
    ],
)
def test_sentence_f1_values(pred, gold, f1):
    got = sentence_f1(torch.tensor([pred]).bool(), torch.tensor([gold]).bool())
    assert got.shape == (1,)
    assert float(got[0]) == pytest.approx(f1)


def test_sentence_f1_refuses_bad_input():
    with pytest.raises(TypeError, match="boolean"):
        sentence_f1(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="gold"):
        sentence_f1(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- selection, pooling
def test_select_sentences_picks_the_k_best_real_sentences():
    scores = torch.tensor([[0.1, 0.9, 0.5, 9.0], [3.0, 2.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = select_sentences(scores, mask, 2)
    assert got.tolist() == [[False, True, True, False], [True, True, False, False]]
    got = select_sentences(scores, mask, torch.tensor([5, 1]))  # more than the real ones
    assert got.tolist() == [[True, True, True, False], [True, False, False, False]]
    with pytest.raises(ValueError, match="k"):
        select_sentences(scores, mask, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="k"):
        select_sentences(scores, mask, 1.5)
    with pytest.raises(ValueError, match="mask"):
        select_sentences(scores, mask[:, :3], 1)


def test_pool_sentences_averages_each_sentence_and_ignores_minus_one():
    h = torch.arange(12, dtype=torch.float64).reshape(1, 6, 2)
    ids = torch.tensor([[-1, 0, 0, 1, -1, -1]])
    got = pool_sentences(h, ids, 3)
    want = torch.tensor([[[3.0, 4.0], [6.0, 7.0], [0.0, 0.0]]], dtype=torch.float64)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="sentence_ids"):
        pool_sentences(h, ids[:, :5], 3)
    with pytest.raises(ValueError, match="n_sentences"):
        pool_sentences(h, ids, 0)


def test_attention_received_sums_columns_over_real_queries():
    # one head, 4 tokens; token 3 is padding. Every real query puts all its weight on key 1.
    w = torch.zeros(1, 1, 4, 4)
    w[0, 0, :, 1] = 1.0
    token_mask = torch.tensor([[True, True, True, False]])
    ids = torch.tensor([[0, 0, 1, -1]])
    got = attention_received(w, token_mask, ids, 2)
    torch.testing.assert_close(got, torch.tensor([[1.5, 0.0]]))  # (0 + 3) / 2 tokens


# ----------------------------------------------------------------------------- the bench contract
@pytest.mark.parametrize(
    ("module", "fn", "metric"),
    [("qa", "train_qa", "exact_match"), ("summarization", "train_summarization", "sentence_f1")],
)
def test_train_functions_return_the_bench_contract(monkeypatch, module, fn, metric):
    import importlib

    mod = importlib.import_module(f"attention_ref.apps.{module}")
    cfg = mod.QA_CONFIG if module == "qa" else mod.SUMMARY_CONFIG
    monkeypatch.setitem(cfg, "n_train", 64)
    monkeypatch.setitem(cfg, "n_test", 16)
    monkeypatch.setitem(cfg, "steps", 3)
    monkeypatch.setitem(cfg, "warmup", 1)
    a = getattr(mod, fn)(seed=0, device="cpu", progress=False)
    b = getattr(mod, fn)(seed=0, device="cpu", progress=False)
    assert a.metric == metric
    assert 0.0 <= a.value <= 1.0 and a.train_seconds > 0
    assert isinstance(a.model, torch.nn.Module) and a.history.steps == 3
    assert a.history.losses == b.history.losses  # a fixed number of steps, seeded


# ------------------------------------------------------------------------- two streams (nb09 s3)
def test_encode_two_stream_pads_question_and_context_to_one_length():
    from attention_ref.apps.qa import encode_two_stream

    data = make_qa_data(40, 4, seed=2)
    vocab = qa_vocab(data)
    b = encode_two_stream(data.train[:5], vocab)
    T = max(max(len(ex.question), len(ex.context)) for ex in data.train[:5])
    assert b.q_ids.shape == b.c_ids.shape == b.c_sent.shape == (5, T)
    for i, ex in enumerate(data.train[:5]):
        assert vocab.decode(b.c_ids[i]) == ex.context and vocab.decode(b.q_ids[i]) == ex.question
        assert int(b.start[i]) == ex.start and int(b.end[i]) == ex.end
        assert int((b.c_sent[i] >= 0).sum()) == len(ex.context)
        assert int(b.c_sent[i, 0]) == 0 and int(b.c_sent[i].max()) == ex.context.count(".") - 1
    sub = b[[1, 2]]
    assert sub.q_ids.shape[1] <= T and len(sub) == 2


@pytest.mark.parametrize("queries", ["question", "context"])
def test_cross_attention_reader_scores_context_positions(queries):
    from attention_ref.apps.qa import CrossAttentionReader, encode_two_stream

    torch.manual_seed(0)
    data = make_qa_data(40, 4, seed=2)
    vocab = qa_vocab(data)
    b = encode_two_stream(data.train[:6], vocab)
    model = CrossAttentionReader(len(vocab), queries).eval()
    with torch.no_grad():
        s, e = model(b)
    assert s.shape == e.shape == b.c_ids.shape
    real = b.c_sent >= 0
    assert torch.isinf(s[~real]).all() and torch.isfinite(s[real]).all()
    if queries == "question":
        # Row i is question token i or nothing: past the question every context position
        # gets the same logit, whatever the context holds there.
        for i in range(6):
            lq = int((b.q_ids[i] != 0).sum())
            past = s[i][lq:][real[i][lq:]]
            torch.testing.assert_close(past, past[:1].expand_as(past))


def test_cross_attention_reader_refuses_an_unknown_design():
    from attention_ref.apps.qa import CrossAttentionReader

    with pytest.raises(ValueError, match="queries"):
        CrossAttentionReader(10, "keys")


def test_train_cross_reader_returns_the_bench_contract(monkeypatch):
    from attention_ref.apps import qa

    monkeypatch.setitem(qa.CROSS_CONFIG, "n_train", 64)
    data = make_qa_data(64, 16, seed=0)
    a = qa.train_cross_reader("context", device="cpu", data=data, steps=3, progress=False)
    b = qa.train_cross_reader("context", device="cpu", data=data, steps=3, progress=False)
    assert a.metric == "exact_match" and 0.0 <= a.value <= 1.0 and a.history.steps == 3
    assert a.history.losses == b.history.losses
