"""PyTorch's fused attention, removed from a graded kernel before the learner's first cell.

The checks forbid PyTorch's own attention to the exercises that ask the learner to write
it, and the graded tripwire (:mod:`attention_ref.trust.agent`) watches for it during a
check's call. A watch is per thread and per call, though: a thread that an earlier cell
started, or a table filled before the test cell, is not watched. So a kernel that grades a
notebook whose exercises all do without it (``trust/trusted.py``'s
``FUSED_ATTENTION_REMOVED_EXERCISES``) runs :func:`remove_fused_attention` silently before
the learner's first cell: every operator of the family (``aten::scaled_dot_product_attention``,
its math, flash, memory-efficient, cuDNN and CPU kernels and their backwards, the native
multi-head attention and the encoder layer's fast path) gets a kernel that raises at every
dispatch key where PyTorch registers one of its own (backends, nested tensors, composite
kernels, autograd, autocast, functorch's batching rules), for the whole process, every
thread, every way of calling it (the functional API, ``torch.ops.aten``, ``torch._C``, the
JIT's operators, ``vmap``, ``torch.func``, a kernel fetched from the dispatch table, a
``partial``).

Why no Python object leads back to PyTorch's kernels: the dispatcher runs the newest
registration of an operator's kernel, and the older ones (PyTorch's) come back only when
the newer one is deregistered, which happens when its registration handle is destroyed or
reset. The handle here is kept alive by a reference count that no Python object holds, and
a pybind11 handle is not tracked by the garbage collector, so no object leads to it. A
learner's own registration on top only replaces one raising kernel with the learner's own
code.

What it cannot stop (docs/INSTRUCTOR_GUIDE.md lists these as residual risks): code that uses
``ctypes`` to read the process's memory can find the handle and reset it, or call a kernel
by its address; a new Python process would have PyTorch whole (a graded kernel can start
none, :mod:`.no_exec`, but in notebook 14); and
PyTorch's attention written in Python (``nn.MultiheadAttention`` with ``need_weights=True``,
``flex_attention`` in eager mode, ``torch.ao.nn.quantizable.MultiheadAttention``) is
computed with matrix products and a softmax, which no notebook can do without, so it stays
watched by the tripwire, and only in the thread the check runs.
"""

from __future__ import annotations

import ctypes
import re
import warnings

#: Parts of the operator names removed: every ``aten::`` operator whose name holds one.
FUSED_ATTENTION_PARTS = (
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "fused_attention",
    "multi_head_attention",
    "transformer_encoder_layer",
)
#: A kernel's line in the dispatcher's dump of an operator: ``Key[alias]: registered at``.
_KERNEL_LINE = re.compile(r"^(\w+)(?:\[alias\])?: registered at ")
#: What the learner's code gets from a removed operator.
REMOVED_MESSAGE = (
    "{op} is not available while this notebook is graded: PyTorch's fused attention is "
    "removed from the grading kernel (the exercises ask you to write it). Compute it "
    "yourself; the demonstrations that compare with it run in your own kernel only."
)

_removed: list[str] = []


def fused_attention_ops() -> list[str]:
    """The ``aten::`` operators of PyTorch's fused attention that this PyTorch has."""
    import torch

    return sorted(
        {
            s.name
            for s in torch._C._jit_get_all_schemas()
            if s.name.startswith("aten::") and any(p in s.name for p in FUSED_ATTENTION_PARTS)
        }
    )


def kernel_keys(op: str) -> list[str]:
    """The dispatch keys (alias keys included) at which this PyTorch registers a kernel of
    ``op``: its backends (CPU, CUDA, Meta, NestedTensorCPU, ...), its composite kernels,
    autograd, autocast, and functorch's batching rules (``vmap``). Keys with no kernel are
    left alone (a composite kernel added where PyTorch has none would make
    ``torch.compile`` see the operator both as decomposable and as a fallback)."""
    import torch

    keys = []
    for line in torch._C._dispatch_dump(op).splitlines():
        m = _KERNEL_LINE.match(line)
        if m and m.group(1) not in ("debug", "Tracer"):
            keys.append(m.group(1))
    return keys


def _raiser(op: str):
    def removed(*args, **kwargs):
        raise RuntimeError(REMOVED_MESSAGE.format(op=op))

    return removed


def remove_fused_attention() -> list[str]:
    """Give every operator of :func:`fused_attention_ops` a kernel that raises, for the
    rest of this process (see the module's docstring); switch off ``nn.MultiheadAttention``
    and ``nn.TransformerEncoderLayer``'s fast path, which would call them. Returns the
    operators removed (once per process: a second call changes nothing)."""
    import torch

    if _removed:
        return list(_removed)
    ops = fused_attention_ops()
    handle = torch._C._dispatch_library("IMPL", "aten", "", "", 0)
    with warnings.catch_warnings():  # "overriding a previously registered kernel": intended
        warnings.simplefilter("ignore")
        for name in ops:
            op = name.split("::", 1)[1]
            for key in kernel_keys(name):
                handle.impl(op, key, _raiser(name))
    # Kept alive by a count no object holds, so that nothing can find it and destroy it.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))
    del handle
    fastpath = getattr(getattr(torch.backends, "mha", None), "set_fastpath_enabled", None)
    if fastpath is not None:
        fastpath(False)  # the Python path: need_weights=True then needs no fused kernel
    _removed.extend(ops)
    return list(ops)
