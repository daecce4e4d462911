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

PyTorch's attention written in Python goes too (:data:`PYTHON_ATTENTION`):
``F.multi_head_attention_forward`` (``nn.MultiheadAttention`` with ``need_weights=True``),
``torch.ao.nn.quantizable.MultiheadAttention`` and ``flex_attention`` with its
higher-order operators (in eager mode they compute with plain matrix products and a
softmax, which no fused kernel is needed for). Each function is replaced, wherever the
process refers to it (modules, classes, the checks' forbidden lists, the operators' kernel
tables, closures), by a stand-in of the same name that raises, and the original, which
nothing then refers to, is freed: no object leads back to it.

What it cannot stop (docs/INSTRUCTOR_GUIDE.md lists these as residual risks): code that uses
``ctypes`` to read the process's memory can find the handle and reset it, or call a kernel
by its address; a new Python process would have PyTorch whole (a graded kernel can start
none, :mod:`.no_exec`, but notebook 14's outside the sandbox on a GPU); PyTorch's Python
source is on disk, so code that executes it again (``importlib.reload``) gets the Python
attention back, as code that copies it would; and the softmax and matrix products that
attention is made of stay (every notebook needs them), watched by the tripwire in the
thread the check runs.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import re
import types
import warnings
import weakref

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
#: PyTorch's attention written in Python: (module, attribute path) of each function that
#: computes it, removed with the fused kernels. A PyTorch that lacks one is skipped.
PYTHON_ATTENTION = (
    ("torch.nn.functional", "multi_head_attention_forward"),
    ("torch.nn.modules.activation", "MultiheadAttention.forward"),
    ("torch.ao.nn.quantizable.modules.activation", "MultiheadAttention.forward"),
    ("torch.ao.nn.quantizable.modules.activation", "MultiheadAttention._forward_impl"),
    ("torch.nn.attention.flex_attention", "flex_attention"),
    ("torch._higher_order_ops.flex_attention", "math_attention"),
    ("torch._higher_order_ops.flex_attention", "_math_attention_inner"),
    ("torch._higher_order_ops.flex_attention", "sdpa_dense"),
    ("torch._higher_order_ops.flex_attention", "sdpa_dense_backward"),
)
#: The higher-order operators of flex attention (module, name): every kernel in their
#: tables (per dispatch key, per mode, functorch's) becomes one that raises.
PYTHON_ATTENTION_OPERATORS = (
    ("torch._higher_order_ops.flex_attention", "flex_attention"),
    ("torch._higher_order_ops.flex_attention", "flex_attention_backward"),
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
#: What :func:`remove_python_attention` could not free (empty: nothing leads back).
still_reachable: list[str] = []


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
        fastpath(False)  # the Python path, which raises too, with a clearer message
    ops += remove_python_attention()
    _removed.extend(ops)
    return list(ops)


def _stand_in(original: types.FunctionType | None, name: str):
    """A function of ``original``'s name and module that raises. Its code is named for the
    whole ``name`` (the traceback's line), which also makes it unequal to every other
    stand-in's: the tripwire knows a forbidden function by its code, and code objects equal
    in all but their qualified names would be one key to it."""
    template = _raiser(name)
    short = name.rsplit(".", 1)[-1]
    code = template.__code__.replace(co_name=name, co_qualname=name)
    fn = types.FunctionType(code, template.__globals__, short, None, template.__closure__)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        if original is not None and hasattr(original, attr):
            setattr(fn, attr, getattr(original, attr))
    return fn


def _replace_everywhere(stand_ins: dict[int, tuple[object, object]]) -> None:
    """Every reference of the process to each original (``stand_ins``: id(original) ->
    (original, stand-in); a module's or class's attribute, a list's or dict's item, a
    tuple in a list or dict, a closure's cell) made one to its stand-in. A few passes over
    the garbage collector's objects in all, whatever the number of functions."""

    def swap(x):
        return _swapped(x, stand_ins)

    originals = [original for original, _ in stand_ins.values()]
    refs = [r for r in gc.get_referrers(*originals) if r is not stand_ins]
    dicts = [r for r in refs if isinstance(r, dict)]
    # a class's attributes are set through the class, so that its caches follow: the dict
    # behind a class is among the objects the class refers to
    wanted = {id(d) for d in dicts}
    owners = {
        id(d): t
        for t in (gc.get_referrers(*dicts) if dicts else [])
        if isinstance(t, type)
        for d in gc.get_referents(t)
        if id(d) in wanted and isinstance(d, dict)
    }
    tuples: dict[int, tuple] = {}
    for ref in refs:
        if isinstance(ref, list):
            ref[:] = [swap(x) for x in ref]
        elif isinstance(ref, dict):
            owner = owners.get(id(ref))
            for key in [k for k, v in ref.items() if swap(v) is not v]:
                if owner is not None:
                    setattr(owner, key, swap(ref[key]))  # through the type: its caches follow
                else:
                    ref[key] = swap(ref[key])
        elif isinstance(ref, tuple):
            tuples[id(ref)] = (ref, tuple(swap(x) for x in ref))
        elif isinstance(ref, types.CellType):
            ref.cell_contents = swap(ref.cell_contents)
    if tuples:  # a tuple cannot change: its holders get a new one
        for holder in gc.get_referrers(*(old for old, _ in tuples.values())):
            if isinstance(holder, list):
                holder[:] = [_swapped(x, tuples) for x in holder]
            elif isinstance(holder, dict):
                for key in [k for k, v in holder.items() if _swapped(v, tuples) is not v]:
                    holder[key] = _swapped(holder[key], tuples)


def _swapped(x, table: dict[int, tuple[object, object]]):
    """What ``table`` (id(old) -> (old, new)) puts in place of ``x``: its new object if
    ``x`` is one of the old ones (by identity, not a later object given the same id), else
    ``x``."""
    pair = table.get(id(x))
    return pair[1] if pair is not None and pair[0] is x else x


def remove_python_attention() -> list[str]:
    """Replace each function of :data:`PYTHON_ATTENTION` by a stand-in that raises,
    everywhere the process refers to it, and every kernel of the operators of
    :data:`PYTHON_ATTENTION_OPERATORS` by one that raises; the originals are freed (what
    could not be is in :data:`still_reachable`). Returns the names removed."""
    removed: list[str] = []
    gone: list[tuple[str, weakref.ref]] = []
    stand_ins: dict[int, tuple[object, object]] = {}
    for module_name, path in PYTHON_ATTENTION:
        try:
            owner = importlib.import_module(module_name)
            *parents, attr = path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        except (ImportError, AttributeError, KeyError):  # not in this PyTorch
            continue
        name = f"{module_name}.{path}"
        stand_ins[id(original)] = (original, _stand_in(original, name))
        gone.append((name, weakref.ref(original)))
        removed.append(name)
    if stand_ins:
        _replace_everywhere(stand_ins)
    original = owner = None
    stand_ins.clear()
    for module_name, attr in PYTHON_ATTENTION_OPERATORS:
        try:
            op = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            continue
        name = f"{module_name}.{attr}"
        for table in ("py_kernels", "python_key_table", "functorch_table"):
            kernels = getattr(op, table, None)
            if isinstance(kernels, dict):
                # (each calls the operator again, below its key, or computes only shapes,
                # but sdpa_dense and its backward, which compute it, replaced above)
                for key, kernel in list(kernels.items()):
                    kernels[key] = _stand_in(kernel, name)
        cache = getattr(op, "_dispatch_cache", None)
        if isinstance(cache, dict):
            cache.clear()
        removed.append(name)
    gc.collect()
    still_reachable[:] = [name for name, ref in gone if ref() is not None]
    return removed
