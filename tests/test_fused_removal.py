"""PyTorch's fused attention removed from a graded kernel (attention_ref/trust/fused_removal.py,
trust/trusted.py's FUSED_ATTENTION_REMOVED_EXERCISES): no way of calling it is left, in any
thread, and nothing the kernel's code can reach puts it back; the notebooks graded without
it are exactly those whose exercises all do without it.

The removal lasts for the whole process, so it is tried in a fresh Python process. The
graded kernels themselves: tests/test_grading.py grades every solution with no error in any
cell, and tests/test_forgery.py's forgers reach it in and outside the check's watch."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import numpy as np
import pytest

from attention_ref.checks._core import REGISTRY
from attention_ref.trust import trusted
from attention_ref.trust.fused_removal import (
    PYTHON_ATTENTION,
    PYTHON_ATTENTION_OPERATORS,
    REMOVED_MESSAGE,
    fused_attention_ops,
)

from catalog.nb01 import softmax_from_fused_attention
from course_tools import assignment_ids, solution_path

PROBE = r"""
import functools, gc, json, threading, types, warnings
import torch
import torch.nn.functional as F
from torch import nn

import attention_ref.checks  # the forbidden lists hold PyTorch's functions, as in a kernel
from attention_ref.trust import fused_removal
from attention_ref.trust.fused_removal import remove_fused_attention

flex = __import__("torch.nn.attention.flex_attention", fromlist=["flex_attention"])
flex_ops = __import__("sys").modules["torch._higher_order_ops.flex_attention"]
python_codes = {  # the code of PyTorch's attention written in Python, before the removal
    F.multi_head_attention_forward.__code__,
    nn.MultiheadAttention.forward.__code__,
    torch.ao.nn.quantizable.MultiheadAttention.forward.__code__,
    flex.flex_attention.__code__,
    flex_ops.math_attention.__code__,
    flex_ops.sdpa_dense.__code__,
}
removed = remove_fused_attention()
again = remove_fused_attention()
q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
x = torch.randn(2, 4, 8)
ways = {
    "functional": lambda: F.scaled_dot_product_attention(q, q, q),
    "partial": lambda: functools.partial(F.scaled_dot_product_attention)(q, q, q),
    "torch._C._nn": lambda: torch._C._nn.scaled_dot_product_attention(q, q, q),
    "aten": lambda: torch.ops.aten.scaled_dot_product_attention(q, q, q),
    "aten overload": lambda: torch.ops.aten.scaled_dot_product_attention.default(q, q, q),
    "aten math": lambda: torch.ops.aten._scaled_dot_product_attention_math(q, q, q),
    "aten cpu kernel": lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.float(), q.float(), q.float()),
    "the JIT's operator": lambda: torch._C._jit_get_operation(
        "aten::scaled_dot_product_attention")[0](q, q, q),
    "with a gradient": lambda: F.scaled_dot_product_attention(q.requires_grad_(), q, q),
    "on the meta device": lambda: F.scaled_dot_product_attention(*(q.to("meta"),) * 3),
    "nn.MultiheadAttention without weights": lambda: nn.MultiheadAttention(
        8, 2, batch_first=True)(x, x, x, need_weights=False),
    "nn.TransformerEncoderLayer": lambda: nn.TransformerEncoderLayer(
        8, 2, 16, batch_first=True).eval()(x),
    "vmap": lambda: torch.vmap(F.scaled_dot_product_attention)(q, q, q),
    "vmap of 3-D inputs": lambda: torch.vmap(F.scaled_dot_product_attention)(q[0], q[0], q[0]),
    "autocast": lambda: torch.autocast("cpu")(F.scaled_dot_product_attention)(q, q, q),
    "torch.func.grad": lambda: torch.func.grad(
        lambda a: F.scaled_dot_product_attention(a, q, q).sum())(q),
    "nested tensors, the fast path switched back on": lambda: nested_mha(),
    # PyTorch's attention written in Python
    "nn.MultiheadAttention with weights": lambda: nn.MultiheadAttention(
        8, 2, batch_first=True)(x, x, x),
    "F.multi_head_attention_forward": lambda: F.multi_head_attention_forward(
        x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), 8, 2,
        torch.eye(24, 8), None, None, None, False, 0.0, torch.eye(8), None),
    "nn.TransformerDecoderLayer": lambda: nn.TransformerDecoderLayer(
        8, 2, 16, batch_first=True).eval()(x, x),
    "the quantizable nn.MultiheadAttention": lambda: torch.ao.nn.quantizable.MultiheadAttention(
        8, 2, batch_first=True)(x, x, x),
    "flex_attention": lambda: flex.flex_attention(q.float(), q.float(), q.float()),
    "flex_attention from its module, imported afresh": lambda: __import__(
        "torch.nn.attention.flex_attention", fromlist=["x"]).flex_attention(q, q, q),
    "flex attention's operator": lambda: flex_ops.flex_attention(
        q, q, q, lambda s, b, h, i, j: s, (), 0.35, {}),
    "flex attention's math": lambda: flex_ops.math_attention(
        q, q, q, lambda s, b, h, i, j: s, (), 0.35, {}),
    "flex attention's backward operator": lambda: flex_ops.flex_attention_backward(
        q, q, q, q, q[..., 0], q, q[..., 0], lambda s, b, h, i, j: s, None, (), 0.35, {}),
    "the forbidden list's nn.MultiheadAttention": lambda: (
        attention_ref.checks.toolkit.BUILTIN_ATTENTION[2][0](
            nn.MultiheadAttention(8, 2, batch_first=True), x, x, x)),
}


if hasattr(torch._C, "_dispatch_get_computed_kernel_for_dispatch_key"):  # PyTorch 2.8+
    ways["a batching rule's kernel, called boxed"] = lambda: (
        torch._C._dispatch_get_computed_kernel_for_dispatch_key(
            "aten::_scaled_dot_product_attention_math", torch._C.DispatchKey.FuncTorchBatched
        ).call_boxed(torch._C._dispatch_keyset_full(), q, q, q))


def nested_mha():
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        nt = torch.nested.nested_tensor([torch.randn(5, 8), torch.randn(3, 8)])
        with torch.inference_mode():
            layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
            return layer(nt)
    finally:
        torch.backends.mha.set_fastpath_enabled(False)

raised = {}
for name, way in ways.items():
    try:
        way()
        raised[name] = ""
    except Exception as err:
        raised[name] = str(err)
seen = []
def in_a_thread():
    try:
        F.scaled_dot_product_attention(q, q, q)
        seen.append("")
    except Exception as err:
        seen.append(str(err))
t = threading.Thread(target=in_a_thread)
t.start()
t.join()
raised["another thread"] = seen[0]
# A registration of the kernel's own on top, then destroyed: PyTorch's does not come back.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mine = torch._C._dispatch_library("IMPL", "aten", "", "", 0)
    mine.impl("scaled_dot_product_attention", "CompositeImplicitAutograd", lambda *a, **k: q)
del mine
gc.collect()
try:
    F.scaled_dot_product_attention(q, q, q)
    raised["after the kernel's own registration"] = ""
except Exception as err:
    raised["after the kernel's own registration"] = str(err)
handles = [o for o in gc.get_objects() if "DispatchModule" in type(o).__name__]
# Nothing the kernel can reach leads back to the Python attention: no function left with
# its code, in any module, class, list, closure or kernel table.
python_left = sorted(
    f"{o.__module__}.{o.__qualname__}"
    for o in gc.get_objects()
    if isinstance(o, types.FunctionType) and o.__code__ in python_codes
)
# torch.compile of other code: a composite kernel added where PyTorch had none made
# inductor refuse every graph ("both a fallback and a decomp for same op").
try:
    compiled = torch.compile(lambda a: (a * 2).sin())
    compile_error = "" if torch.allclose(compiled(x), (x * 2).sin()) else "wrong values"
except Exception as err:
    compile_error = str(err)
still = {
    "softmax": bool(torch.allclose(torch.softmax(q, -1).sum(-1), torch.ones_like(q[..., 0]))),
    "matmul": tuple((q @ q.transpose(-1, -2)).shape) == (1, 2, 4, 4),
    "nn.Linear": tuple(nn.Linear(8, 3)(x).shape) == (2, 4, 3),
}
print(json.dumps({"removed": removed, "again": again, "raised": raised,
                  "compile_error": compile_error,
                  "handles": len(handles), "still": still, "python_left": python_left,
                  "still_reachable": fused_removal.still_reachable}))
"""


@pytest.fixture(scope="module")
def probe():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_way_to_call_pytorchs_fused_attention_raises_once_removed(probe):
    kept = {way: "" for way, err in probe["raised"].items() if "not available while" not in err}
    assert not kept, f"still callable: {sorted(kept)}"
    assert "aten::scaled_dot_product_attention" in probe["raised"]["functional"]


def test_the_removal_covers_the_whole_family_once(probe):
    assert probe["removed"] == probe["again"]
    ops = [n for n in probe["removed"] if n.startswith("aten::")]
    assert ops == fused_attention_ops()
    python = [n for n in probe["removed"] if not n.startswith("aten::")]
    assert python == [f"{m}.{a}" for m, a in PYTHON_ATTENTION + PYTHON_ATTENTION_OPERATORS]
    names = set(probe["removed"])
    assert {"aten::scaled_dot_product_attention", "aten::_native_multi_head_attention",
            "aten::_transformer_encoder_layer_fwd"} <= names  # fmt: skip
    assert not any("softmax" in n for n in names), names  # nothing else of PyTorch's


def test_no_python_object_leads_back_to_pytorchs_kernels(probe):
    assert probe["handles"] == 0  # no registration handle for gc to find and destroy
    assert "not available while" in probe["raised"]["after the kernel's own registration"]


def test_no_object_leads_back_to_pytorchs_attention_written_in_python(probe):
    """The originals are freed: no function with their code is left, and the removal freed
    every one it replaced."""
    assert probe["python_left"] == []
    assert probe["still_reachable"] == []
    assert "torch.nn.functional.multi_head_attention_forward" in probe["removed"]


def test_the_rest_of_pytorch_still_works(probe):
    assert probe["still"] == dict.fromkeys(probe["still"], True), probe["still"]


def test_torch_compile_still_compiles_other_code(probe):
    """Where the machine has what inductor needs (a C++ compiler), it compiles; either way
    the removal is not what stops it."""
    assert "both a fallback and a decomp" not in probe["compile_error"], probe["compile_error"]
    assert "not available while" not in probe["compile_error"], probe["compile_error"]


def test_the_message_names_the_operator_and_what_to_do():
    msg = REMOVED_MESSAGE.format(op="aten::scaled_dot_product_attention")
    assert "aten::scaled_dot_product_attention" in msg and "yourself" in msg


def test_the_forgers_fused_softmax_is_right_where_fused_attention_is_present():
    """The forgers of tests/test_forgery.py would be right without the removal: the fused
    softmax equals the softmax. The check's watch names it in the learner's own thread (it
    is on softmax_np's forbidden list: tests/catalog/nb01.py), but a thread that an earlier
    cell started is not watched; only the removal stops that one."""
    x = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32) * 10
    for axis in (-1, 0, 1):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        got = softmax_from_fused_attention(x, axis)  # the forgers' FUSED_SOFTMAX
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=1e-5)


def _checked(aid: str) -> list[str]:
    nb = nbformat.read(solution_path(aid), as_version=4)
    return [
        e.exercise
        for c in nb.cells
        if trusted.is_graded_test(c)
        for e in trusted.expected_checks(c.source)
    ]


#: Notebooks that forbid PyTorch's fused attention somewhere but are graded with it: notebook
#: 12's cached_self_attention may call it (a correct answer's choice), and notebook 13's
#: transformers models attend with it.
GRADED_WITH_IT = {"12_efficient_attention", "13_modern_llm"}


def _forbids_fused(exercise: str) -> bool:
    return any(
        getattr(fn, "__name__", "") == "scaled_dot_product_attention"
        for fn, _ in REGISTRY[exercise].forbidden()
    )


#: Notebook 14's exercises: their checks need Triton's interpreter, so their tests name
#: "triton" (tools/versions.py leaves those out where the Triton PyTorch pins is too old).
TRITON = "14_triton_attention"
NO_ATTENTION = {"softmax_np", "split_heads", "merge_heads", "feed_forward", "sample_next_token"}


def test_exactly_the_notebooks_whose_exercises_do_without_it_are_graded_without_it():
    removed = {aid for aid in assignment_ids() if trusted.removes_fused_attention(_checked(aid))}
    assert removed == {
        "01_dot_product_attention", "03_self_attention", "04_multi_head_attention",
        "06_encoder", "07_decoder_and_transformer", "11_gpt", TRITON,
    }  # fmt: skip
    others = [aid for aid in assignment_ids() if aid != TRITON]
    forbidding = {aid for aid in others if any(map(_forbids_fused, _checked(aid)))}
    assert removed - {TRITON} == forbidding - GRADED_WITH_IT, (removed, forbidding)


def test_every_exercise_on_the_list_forbids_it_or_has_no_attention_in_it():
    assert not trusted.removes_fused_attention([])
    for exercise in trusted.FUSED_ATTENTION_REMOVED_EXERCISES - set(_checked(TRITON)):
        assert exercise in REGISTRY, exercise
        assert _forbids_fused(exercise) or exercise in NO_ATTENTION, exercise


def test_notebook_14s_triton_exercises_all_forbid_it():
    triton = set(_checked(TRITON))
    assert triton == {
        "triton_softmax",
        "triton_attention",
        "triton_causal_split",
        "triton_flash_attention",
        "triton_attention_backward",
    }
    assert triton <= trusted.FUSED_ATTENTION_REMOVED_EXERCISES
    assert all(map(_forbids_fused, triton)), triton
