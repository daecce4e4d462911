"""PyTorch's fused attention, removed from a graded kernel before the learner's first cell.

The checks forbid PyTorch's own attention to the exercises that ask the learner to write
it, and the graded tripwire (:mod:`attention_ref.checks.agent`) watches for it during a
check's call. A watch is per thread and per call, though: a thread that an earlier cell
started, or a table filled before the test cell, is not watched. So a kernel that grades a
notebook whose exercises all do without it (``course/trusted.py``'s
``FUSED_ATTENTION_REMOVED_EXERCISES``) runs :func:`remove_fused_attention` silently before
the learner's first cell: every operator of the family (``aten::scaled_dot_product_attention``,
its math, flash, memory-efficient, cuDNN and CPU kernels and their backwards, the native
multi-head attention and the encoder layer's fast path) gets a kernel that raises, on every
backend, for the whole process, every thread, every way of calling it (the functional API,
``torch.ops.aten``, ``torch._C``, the JIT's operators, a ``partial``).

Why the kernel's code cannot put it back: the dispatcher runs the newest registration of
an operator's kernel, and the older ones (PyTorch's) come back only when the newer one is
deregistered, which happens when its registration handle is destroyed. The handle here is
kept alive by a reference count that no Python object holds, and a pybind11 handle is not
tracked by the garbage collector, so no code can find it to destroy it. A learner's own
registration on top only replaces one raising kernel with the learner's own code.

What stays: ``nn.MultiheadAttention`` with ``need_weights=True`` computes in Python
(matrix products and a softmax, which no notebook can do without), and PyTorch's Python
sources can be read again from disk; those stay watched by the tripwire's code objects.
"""

from __future__ import annotations

import ctypes
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
#: The dispatch keys whose kernels are replaced (those PyTorch registers these operators at).
_KEYS = ("CPU", "CUDA", "Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
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
            for key in _KEYS:
                handle.impl(op, key, _raiser(name))
    # Kept alive by a count no object holds, so that nothing can find it and destroy it.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))
    del handle
    fastpath = getattr(getattr(torch.backends, "mha", None), "set_fastpath_enabled", None)
    if fastpath is not None:
        fastpath(False)  # the Python path: need_weights=True then needs no fused kernel
    _removed.extend(ops)
    return list(ops)
