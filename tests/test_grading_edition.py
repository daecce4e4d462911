"""The grading editions (attention_ref/course/edition.py, ``build-grading``): a kernel that
grades notebook NN holds no reference function of its own exercises (but any that KEPT_OWN
lists with a reason, none today; its classes' methods stay but WITHHELD_OWN_METHODS), no
reference of a later notebook's (but those notebook NN builds on), nor the checks' own
models of the answers; earlier notebooks' references stay; a stand-in runs the learner's own
function or says why it cannot. That the solutions still earn every mark graded this way,
with no cell failing, is tests/test_grading.py's, and that a wrong answer borrowing the
checks' models or a stand-in gains nothing is tests/test_forgery.py's."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_ref.checks._core import REGISTRY
from attention_ref.course import edition as ed
from attention_ref.trust import sandbox

NOTEBOOKS = range(1, 16)

# Imports each notebook's grading edition in turn (PyTorch stays loaded) and reports, for
# every function named in the table, whether it is a stand-in: its code does nothing but
# ask attention_ref._withheld what to run.
PROBE = r"""
import importlib, inspect, json, sys, types
import torch  # noqa: F401
editions, table = sys.argv[1], json.loads(sys.argv[2])
out = {}
for nb in range(1, 16):
    for name in [m for m in sys.modules if m.split(".")[0] == "attention_ref"]:
        del sys.modules[name]
    sys.path[0] = f"{editions}/graded/{nb:02d}"
    importlib.invalidate_caches()
    import attention_ref
    assert attention_ref.__file__.startswith(sys.path[0]), attention_ref.__file__
    for module, owners in table.items():
        obj_module = importlib.import_module(module)
        for qual in owners:
            obj = obj_module
            for part in qual.split("."):
                obj = getattr(obj, part)
            fn = inspect.unwrap(getattr(obj, "fn", obj))  # a Triton kernel wraps its own
            code = fn.__code__
            nested = any(isinstance(c, types.CodeType) for c in code.co_consts)
            stand_in = "attention_ref._withheld" in code.co_consts
            assert not stand_in or (code.co_names == ("__import__", "answer") and not nested)
            out[f"{nb}|{module}|{qual}"] = stand_in
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def editions() -> Path:
    """The grading editions grading builds for these sources (in the user's cache, shared
    with the grading tests: built once)."""
    return sandbox.student_edition()


def run_in(folder: Path, code: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-s", "-c", code, *args],
        cwd=folder,
        env=dict(os.environ, PYTHONPATH=str(folder)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_each_notebook_has_a_grading_edition_and_grading_picks_it(editions, tmp_path, monkeypatch):
    for nb in NOTEBOOKS:
        folder = editions / "graded" / f"{nb:02d}"
        assert (folder / "attention_ref" / "__init__.pyc").is_file(), folder
    aid = tmp_path / "submitted" / "s1" / "03_self_attention"
    assert sandbox.edition_for(editions, aid) == editions / "graded" / "03"
    # An instructor's own assignment (no notebook number): the student edition.
    assert sandbox.edition_for(editions, tmp_path / "my_quiz") == editions
    assert sandbox.edition_for(editions, tmp_path / "99_later") == editions
    # The grader's switch, to measure what the editions cost.
    monkeypatch.setenv(sandbox.EDITIONS_SWITCH, "off")
    assert sandbox.edition_for(editions, aid) == editions


def test_a_grading_edition_holds_no_answer_of_its_notebook_or_a_later_one(editions):
    references = ed.withheld_references()
    own = ed.own_references()
    checks = ed.checks_code()
    # Every graded exercise's own reference is in the table, by the first notebook that
    # grades it or builds on it.
    owners = {f"{m}:{q}": nb for m, qs in references.items() for q, nb in qs.items()}
    assert owners["attention_ref.attention:sdpa"] == 1
    assert owners["attention_ref.multihead:MultiHeadAttention.forward"] == 2  # shown in 02
    assert owners["attention_ref.training:masked_cross_entropy"] == 7  # trains in 07
    assert owners["attention_ref.gpt:GroupedQueryAttention.forward"] == 11  # not 13
    assert owners["attention_ref.flash:_flash_backward"] == 12  # a private helper
    assert owners["attention_ref.triton_attention:_attention_kernel"] == 14  # a kernel
    assert "attention_ref.encoder:Encoder.forward" not in owners  # shown in notebook 06
    # Its own notebook's too: every exercise's reference but the few kept with a reason.
    mine = {f"{m}:{q}": nbs for m, qs in own.items() for q, nbs in qs.items()}
    assert mine["attention_ref.attention:softmax_np"] == {1}  # sdpa_np's check calls back
    assert mine["attention_ref.efficient:naive_attention"] == {1}  # sdpa's answer too
    assert mine["attention_ref.efficient:_online_attention"] == {12}  # a private helper
    # Withheld since issue 40: in notebook 02, sdpa with a mask runs the learner's
    # masked_softmax; in 04, MultiHeadAttention their split_heads; 05 uses their table;
    # 08 trains with F.cross_entropy; 15's DeepSeek-V3 routes with transformers' port
    assert mine["attention_ref.masking:masked_softmax"] == {2}
    assert mine["attention_ref.multihead:split_heads"] == {4}
    assert mine["attention_ref.positional:sinusoidal_encoding"] == {5}
    assert mine["attention_ref.positional:frequencies"] == {5}
    assert mine["attention_ref.training:masked_cross_entropy"] == {8}
    assert mine["attention_ref.experts:route"] == {15}
    # A class's methods stay (the reference modules are built in the kernel), but those
    # that nothing in the kernel runs: notebook 03's SelfAttention, 04's MultiHeadAttention
    # and 06's FeedForward and EncoderLayer (their demonstrations run the learner's with the
    # reference's weights; the layer's check builds its part of PyTorch's modules), 07's
    # DecoderLayer, Decoder, Transformer and TransformerCore (its demonstrations run the
    # learner's; the Transformer's check has the checker compute its decoder layers), 11's
    # GroupedQueryAttention (its conversion runs the learner's, graded) and GPTBlock (the GPT
    # is built of the learner's blocks, graded, and generates without the cache), 13's RMSNorm
    # and SwiGLU (its models are built of the learner's, graded), the autograd
    # Functions of notebooks 12 and 14 (with the helper only they use)
    methods = {name: nbs for name, nbs in mine.items() if "." in name.split(":")[1]}
    assert methods == {
        "attention_ref.self_attention:SelfAttention.forward": {3},
        "attention_ref.multihead:MultiHeadAttention.forward": {4},
        "attention_ref.encoder:FeedForward.forward": {6},
        "attention_ref.encoder:EncoderLayer.forward": {6},
        "attention_ref.decoder:DecoderLayer.forward": {7},
        "attention_ref.decoder:Decoder.forward": {7},
        "attention_ref.transformer:Transformer.encode": {7},
        "attention_ref.transformer:Transformer.decode": {7},
        "attention_ref.transformer:Transformer.forward": {7},
        "attention_ref.transformer:TransformerCore.forward": {7},
        "attention_ref.gpt:GroupedQueryAttention.forward": {11},
        "attention_ref.gpt:GroupedQueryAttention.attend": {11},
        "attention_ref.gpt:GPTBlock.forward": {11},
        "attention_ref.gpt:GPTBlock.step": {11},
        "attention_ref.modern:RMSNorm.forward": {13},
        "attention_ref.modern:SwiGLU.forward": {13},
        "attention_ref.flash:FlashAttention.forward": {12},
        "attention_ref.flash:FlashAttention.backward": {12},
        "attention_ref.triton_attention:TritonFlashAttention.forward": {14},
        "attention_ref.triton_attention:TritonFlashAttention.backward": {14},
    }, methods
    assert mine["attention_ref.flash:_flash_backward"] == {12}
    assert "_forbidden_attention" not in checks["attention_ref.checks.nb01"]
    assert "attention" in checks["attention_ref.checks._models"]  # a whole sdpa_np
    table = {
        m: sorted(set(references.get(m, {})) | set(checks.get(m, {})) | set(own.get(m, {})))
        for m in set(references) | set(checks) | set(own)
    }
    seen = json.loads(run_in(editions, PROBE, str(editions), json.dumps(table)).splitlines()[-1])
    wrong = []
    for nb in NOTEBOOKS:
        for module, quals in table.items():
            for qual in quals:
                withheld = (
                    qual in checks.get(module, {})
                    or references.get(module, {}).get(qual, 0) > nb
                    or nb in own.get(module, {}).get(qual, ())
                )
                if seen[f"{nb}|{module}|{qual}"] != withheld:
                    wrong.append((nb, module, qual, "kept" if withheld else "withheld"))
    assert not wrong, wrong[:20]
    assert len(seen) == 15 * sum(map(len, table.values()))


def test_every_reference_an_edition_keeps_of_its_own_notebook_is_one_it_would_withhold():
    # KEPT_OWN names only references that the notebook's own exercises name as the
    # reference (so each entry keeps something, and says why), each with its reason.
    kept = dict(ed.KEPT_OWN)
    try:
        ed.KEPT_OWN.clear()
        own = ed.own_references()
    finally:
        ed.KEPT_OWN.update(kept)
    for (nb, module, qual), reason in kept.items():
        assert nb in own.get(module, {}).get(qual, ()), (nb, module, qual)
        assert reason.strip(), (nb, module, qual)
    # The guide counts them (and names each).
    guide = (Path(__file__).parents[1] / "docs" / "INSTRUCTOR_GUIDE.md").read_text()
    text = " ".join(guide.split())
    if kept:
        assert f"So do {len(kept)} of a notebook's own reference functions" in text
    else:
        assert "None of a notebook's own reference functions stays" in text


STAND_IN = r"""
import __main__, torch, attention_ref
from attention_ref._withheld import NotAvailableWhileGradedError
logits, targets = torch.randn(2, 3, 5), torch.tensor([[1, 2, 0], [4, 0, 0]])

def refused(call):
    try:
        call()
    except NotAvailableWhileGradedError as err:
        return str(err)
    raise AssertionError("the stand-in ran")

# No learner's function of that name: refused, saying why.
print(refused(lambda: attention_ref.sample_next_token(logits[0, 0])))
# The learner's own function runs in its place (a loop of the package's would get it).
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return torch.tensor(7)
__main__.sample_next_token = sample_next_token
sample_next_token.__module__ = "__main__"
print(int(attention_ref.sample_next_token(logits[0, 0])))
# A learner's function that calls the reference is told so, not sent round in circles.
def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return attention_ref.sample_next_token(logits, temperature, top_k, top_p, generator)
__main__.sample_next_token = sample_next_token
sample_next_token.__module__ = "__main__"
print(refused(lambda: sample_next_token(logits[0, 0])))
# A method has no learner's stand-in: refused.
print(refused(lambda: attention_ref.GPTBlock(8, 2, 16)(torch.randn(1, 3, 8))))
# An earlier notebook's reference is whole.
q, k = torch.ones(1, 2, 4), torch.ones(1, 3, 4)
print(tuple(attention_ref.sdpa(q, k, k)[1].shape))
"""


def test_a_stand_in_runs_the_learners_own_function_or_says_why_not(editions):
    out = run_in(editions / "graded" / "10", STAND_IN).splitlines()
    assert "sample_next_token is not available while this notebook is graded" in out[0]
    assert "of notebook 10 or a later one" in out[0]
    assert "Define your own sample_next_token" in out[0]
    assert out[1] == "7"
    assert "Your sample_next_token calls it" in out[2]
    assert "GPTBlock.forward is not available" in out[3] and "Use your own class" in out[3]
    assert out[4] == "(1, 2, 3)"


def test_the_checks_models_are_not_in_a_graded_kernel_but_every_forbidden_list_is(editions):
    code = (
        "import numpy as np\n"
        "from attention_ref.checks import _core, _models, toolkit\n"
        "from attention_ref._withheld import NotAvailableWhileGradedError\n"
        "lists = sum(len(ex.forbidden()) for ex in _core.REGISTRY.values())\n"
        "for f in (lambda: _models.attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3))),\n"
        "          lambda: toolkit.additive_softmax(np.ones(3), np.ones(3, bool))):\n"
        "    try:\n"
        "        f()\n"
        "    except NotAvailableWhileGradedError as err:\n"
        "        print(err)\n"
        "print(len(_core.REGISTRY), lists)\n"
    )
    for nb in (1, 15):
        out = run_in(editions / "graded" / f"{nb:02d}", code).splitlines()
        assert len(out) == 3, out
        assert all("the checks run in the trusted checker" in line for line in out[:2]), out
        n_exercises, n_forbidden = map(int, out[2].split())
        assert n_exercises == len(REGISTRY) and n_forbidden > n_exercises, out


def test_a_grading_edition_refuses_what_it_cannot_withhold(tmp_path):
    src = tmp_path / "attention_ref"
    src.mkdir()
    (src / "m.py").write_text("def f(x):\n    return x\n")
    with pytest.raises(ValueError, match=r"attention_ref\.m defines no \['g'\] to withhold"):
        ed.compile_module(src / "m.py", Path("m.py"), {"g": 1})


# Calls every function a grading edition keeps (but the course's tooling and the grading
# machinery) on the inputs each exercise of that notebook was checked on, and reports each
# one whose result holds the reference's answer: a whole helper that computes an answer.
ORACLES = r"""
import collections, importlib, inspect, json, pkgutil, signal, sys, time, warnings
import numpy as np, torch
import matplotlib
matplotlib.use("Agg")
warnings.simplefilter("ignore")
editions, cases_file = sys.argv[1], sys.argv[2]
cases = torch.load(cases_file, weights_only=False)
# the course's tooling and the grading machinery (which installs filters, removes operators)
SKIPPED = ("attention_ref.course", "attention_ref.trust")

class TooLong(BaseException):  # not an Exception: the function's own handlers miss it
    pass

def on_alarm(*_):
    raise TooLong

signal.signal(signal.SIGPROF, on_alarm)
signal.signal(signal.SIGALRM, on_alarm)  # and for one that waits without computing
torch.set_num_threads(1)  # CPU time below: one thread's, whatever else the machine runs

def tensors(x):
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x) if x.dtype != object else None
    if isinstance(x, torch.Tensor):
        return [x.detach()] if x.layout == torch.strided and x.device.type != "meta" else []
    if isinstance(x, tuple | list):
        return [t for item in x for t in tensors(item)]
    if isinstance(x, dict):
        return tensors(list(x.values()))
    return []

def same(a, b):
    if a.shape != b.shape or a.numel() == 0:
        return False
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        return bool(torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-6))
    return bool(torch.equal(a.long(), b.long()))

def targets(record):
    args, kwargs, result, _ = record
    given = tensors([args, kwargs])
    return [t for t in tensors(result)
            if t.numel() >= 4 and not bool((t.flatten() == t.flatten()[0]).all())
            and not any(same(t, g) for g in given)]

out = {}
slow = set()  # what ran out of time once (a training loop given tensors) is not called again
for nb in sorted({c["nb"] for c in cases.values()}):
    for name in [m for m in sys.modules if m.split(".")[0] == "attention_ref"]:
        del sys.modules[name]
    sys.path[0] = f"{editions}/graded/{nb:02d}"
    importlib.invalidate_caches()
    import attention_ref
    assert attention_ref.__file__.startswith(sys.path[0]), attention_ref.__file__
    functions = {}
    for info in pkgutil.walk_packages(attention_ref.__path__, "attention_ref."):
        if info.name.startswith(SKIPPED):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            # its functions, and those in its tables (a list of mistakes' lambdas)
            inner = obj.values() if isinstance(obj, dict) else obj
            inner = inner if isinstance(obj, list | tuple | dict) else ()
            inner = [x for item in inner for x in (item if isinstance(item, tuple) else [item])]
            for i, fn in enumerate([obj, *inner]):
                if inspect.isfunction(fn) and fn.__module__ == info.name:
                    where = f"@{name}[{i}]" if i else ""
                    functions.setdefault(f"{info.name}:{fn.__qualname__}{where}", fn)
    for eid, case in cases.items():
        if case["nb"] != nb:
            continue
        matched = collections.Counter()  # on how many of the inputs each one matched
        for record in case["records"]:
            wanted = targets(record)
            if not wanted:
                continue
            for name, fn in functions.items():
                # as the check called it, its arguments alone, and by the parameters' names
                try:
                    params = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    params = {}
                by_name = {p: v for p, v in record[3].items() if p in params}
                for call in ((record[0], record[1]), (record[0], {}), ((), by_name)):
                    if name in slow:
                        break  # slow on these small inputs: a training loop, not a helper
                    torch.manual_seed(0)
                    signal.setitimer(signal.ITIMER_PROF, 1.0)  # CPU seconds
                    signal.setitimer(signal.ITIMER_REAL, 10.0)
                    start = time.process_time()
                    try:
                        got = tensors(fn(*call[0], **call[1]))
                    except TooLong:
                        slow.add(name)
                        got = []
                    except BaseException:
                        got = []
                    finally:
                        signal.setitimer(signal.ITIMER_PROF, 0)
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    if time.process_time() - start > 0.5:
                        slow.add(name)
                    if any(same(g, w) for g in got for w in wanted):
                        matched[name] += 1
                        break
        # two inputs, not one: a mistake's model can agree with the answer on one input
        out[eid] = sorted(name for name, n in matched.items() if n >= 2)
print(json.dumps(out))
"""


def _checked_inputs() -> dict:
    """Each function exercise's reference, called by its own check (its forbidden list set
    aside): the notebook, the forbidden list's names, and the first calls' inputs and
    results."""
    import dataclasses

    import numpy as np
    import torch
    from torch.utils._pytree import tree_map

    from attention_ref.checks._core import CheckFailure, run_check

    def copy(x):
        def one(t):
            if isinstance(t, torch.Tensor):
                return t.detach().clone()
            return t.copy() if isinstance(t, np.ndarray) else t

        return tree_map(one, x)

    cases = {}
    for eid, ex in list(REGISTRY.items()):
        named = [
            obj
            for obj, name in ex.forbidden()
            if name.startswith("the reference") and inspect.isfunction(obj)
        ]
        reference = next((f for f in named if f.__name__ == eid), named[0] if named else None)
        if ex.kind != "function" or reference is None:
            continue  # a class (a module, an autograd function): its methods stay
        records = []

        def spy(*args, reference=reference, records=records, **kwargs):
            given = copy((args, kwargs))
            named = inspect.signature(reference).bind(*given[0], **given[1]).arguments
            result = reference(*args, **kwargs)
            if len(records) < 3:
                records.append((*given, copy(result), dict(named)))
            return result

        REGISTRY[eid] = dataclasses.replace(ex, forbidden=lambda: [])
        try:
            run_check(eid, spy, seed=7, time_limit=0)
        except CheckFailure as failure:
            # an autograd Function's exercise: a class, whose methods stay
            assert "[mistake: not_an_autograd_function]" in str(failure), str(failure)
            continue
        finally:
            REGISTRY[eid] = ex
        forbidden = [
            f"{obj.__module__}:{obj.__qualname__}"
            for obj, _ in ex.forbidden()
            if hasattr(obj, "__qualname__")
        ]
        notebook = int(ex.run.__module__.rsplit(".nb", 1)[1])
        cases[eid] = {"nb": notebook, "records": records, "forbidden": forbidden}
    return cases


# A minute and a half of calls (the longest test in make test's longest lane): make
# test-later runs it; make test keeps the editions' other tests.
@pytest.mark.later
def test_no_function_a_grading_edition_keeps_computes_an_answer_it_does_not_forbid(
    editions, tmp_path
):
    # A whole helper that returns an exercise's answer (notebook 12's naive_attention is
    # notebook 01's sdpa) is either withheld from that notebook's edition or on the
    # exercise's forbidden list (the tripwire names it). Found by calling every function an
    # edition keeps on the inputs the exercise's check gave its reference.
    import torch

    cases = _checked_inputs()
    assert len(cases) >= 25 and all(c["records"] for c in cases.values()), sorted(cases)
    torch.save(cases, tmp_path / "cases.pt")
    proc = subprocess.run(  # in a folder of its own: what a function writes lands there
        [sys.executable, "-s", "-c", ORACLES, str(editions), str(tmp_path / "cases.pt")],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(editions), MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert set(found) == set(cases)
    unforbidden = {
        eid: [name for name in names if name not in cases[eid]["forbidden"]]
        for eid, names in found.items()
    }
    assert not any(unforbidden.values()), {e: n for e, n in unforbidden.items() if n}
    # It finds what it looks for: answers an edition keeps and forbids (notebook 11's causal
    # mask in 02; notebook 12's loop in 14) ...
    assert "attention_ref.gpt:causal_mask_like" in found["causal_mask"]
    assert "attention_ref.efficient:online_softmax_attention" in found["triton_attention"]
    # ... and not those withheld since (issue 40).
    withheld = ["masked_softmax", "split_heads", "merge_heads", "sinusoidal_encoding"]
    withheld += ["masked_cross_entropy", "route"]
    assert not any(found[eid] for eid in withheld), {eid: found[eid] for eid in withheld}
