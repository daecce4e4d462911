"""Efficient attention: notebook 12.

- ``naive_attention``: softmax(q k^T / sqrt(d_k)) v with the whole ``n_q x n_k`` score matrix
  in memory: the baseline the other two are measured against.
- ``online_softmax``: the softmax of a vector computed block by block with a running maximum
  ``m`` and a running sum ``l``.
- ``online_softmax_attention``: the same trick over key blocks (and query blocks), so the
  score matrix is never built: memory grows with ``n``, not ``n^2``. With ``causal=True``,
  key blocks entirely in the future of a query block are skipped.
- ``OpRecorder`` and ``PeakMemory``: dispatch modes that watch every PyTorch operation, to
  show the largest tensor an implementation builds and to measure peak memory on the CPU.

The online algorithm in one line: for a row of scores seen in blocks ``s_1, s_2, ...``,
keep ``m = max`` so far, ``l = sum(exp(s - m))`` so far and ``acc = sum(exp(s - m) v)`` so
far; when a new block raises the maximum from ``m`` to ``m'``, multiply ``l`` and ``acc`` by
``exp(m - m')`` before adding the block's terms. At the end ``out = acc / l``.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._validate import check_qkv, describe, require_tensor

DEFAULT_Q_BLOCK_SIZE = 256
"""Queries per tile of :func:`online_softmax_attention` when ``causal=False`` (the fast
configuration measured by ``python -m attention_ref.bench attention``)."""


def _require_block(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {describe(value)}")
    return value


def _require_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    check_qkv(tuple(q.shape), tuple(k.shape), tuple(v.shape))


def _causal_allowed(
    i0: int, i1: int, j0: int, j1: int, offset: int, device: torch.device
) -> torch.Tensor:
    """Bool ``(i1 - i0, j1 - j0)``: True where query ``i`` may see key ``j``
    (``j <= i + offset``)."""
    rows = torch.arange(i0, i1, device=device)[:, None] + offset  # (bq, 1)
    cols = torch.arange(j0, j1, device=device)[None, :]  # (1, bk)
    return cols <= rows


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Attention the direct way: the whole score matrix, then softmax, then ``@ v``.

    Args:
        q: queries ``(..., n_q, d_k)``; k: keys ``(..., n_k, d_k)``; v: values
            ``(..., n_k, d_v)``.
        causal: if True, query ``i`` sees key ``j`` only when ``j <= i + (n_k - n_q)``
            (queries aligned with the last keys; ``j <= i`` when ``n_q == n_k``).

    Returns:
        ``out (..., n_q, d_v)``. Builds two ``(..., n_q, n_k)`` tensors (scores and
        weights): memory grows as ``n_q * n_k``.
    """
    _require_qkv(q, k, v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
    if causal:
        allowed = _causal_allowed(0, n_q, 0, n_k, n_k - n_q, q.device)  # (n_q, n_k)
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing
    else:
        weights = torch.softmax(scores, dim=-1)  # (..., n_q, n_k)
    return weights @ v


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax of a vector, reading it ``block_size`` entries at a time.

    One pass over the blocks keeps a running maximum ``m`` and a running sum
    ``l = sum(exp(x_seen - m))``; when a block raises the maximum to ``m_new``, the sum so far
    is rescaled by ``exp(m - m_new)``. A second, elementwise pass gives ``exp(x - m) / l``.

    Args:
        x: 1-D float tensor ``(n,)``, ``n >= 1``.
        block_size: how many entries each step reads (the last block may be shorter).

    Returns:
        ``(n,)``, equal to ``torch.softmax(x, 0)``; same dtype and device as ``x``.
    """
    require_tensor("x", x)
    if x.dim() != 1 or x.numel() == 0:
        raise ValueError(f"x must be a non-empty 1-D tensor (n,); got shape {tuple(x.shape)}")
    block_size = _require_block("block_size", block_size)
    m = x.new_tensor(float("-inf"))  # running maximum
    l = x.new_tensor(0.0)  # running sum of exp(x_seen - m)  # noqa: E741
    for start in range(0, x.numel(), block_size):
        block = x[start : start + block_size]
        m_new = torch.maximum(m, block.max())
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum()  # noqa: E741
        m = m_new
    return torch.exp(x - m) / l


def online_softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int = 64,
    causal: bool = False,
    *,
    q_block_size: int | None = None,
) -> torch.Tensor:
    """The output of scaled dot-product attention, computed block by block.

    Keys and values are read ``block_size`` at a time; for each query the algorithm keeps a
    running maximum ``m``, a running sum ``l`` and an unnormalised output ``acc``, rescaled
    by ``exp(m_old - m_new)`` whenever a block raises the maximum. No ``n_q x n_k`` tensor is
    ever built: the largest is one tile of scores ``(..., q_block, block_size)``.

    Args:
        q: queries ``(..., n_q, d_k)``; k: keys ``(..., n_k, d_k)``; v: values
            ``(..., n_k, d_v)``; batch dimensions broadcast.
        block_size: keys per block (the last block may be shorter).
        causal: if True, query ``i`` sees key ``j`` only when ``j <= i + (n_k - n_q)``: the
            queries are the last ``n_q`` positions of the ``n_k`` keys, so with
            ``n_q == n_k`` this is ``j <= i`` (``is_causal=True`` of
            ``scaled_dot_product_attention``). Key blocks entirely in the future of a query
            block are skipped, roughly halving the work. A query that sees no key gets 0.
        q_block_size: queries per block; default: ``block_size`` when causal (so that whole
            future blocks can be skipped), otherwise :data:`DEFAULT_Q_BLOCK_SIZE` (256). Query
            tiles keep each tile of scores small enough to stay in the CPU's cache: at 4,096
            tokens, with key blocks of 512, tiling the queries in 256s brought the time from
            2.3x PyTorch's fused kernel to 1.4x (two threads; see ``make bench``).

    Returns:
        ``out (..., n_q, d_v)``, the dtype and device of ``q``.
    """
    _require_qkv(q, k, v)
    block_size = _require_block("block_size", block_size)
    return _online_attention(q, k, v, block_size, causal, q_block_size)[0]


def _q_block_size(n_q: int, block_size: int, causal: bool, q_block_size: int | None) -> int:
    """Queries per tile: ``q_block_size`` checked, or by default ``block_size`` when causal
    (so that whole future tiles can be skipped), else up to :data:`DEFAULT_Q_BLOCK_SIZE`."""
    if q_block_size is None:
        q_block_size = block_size if causal else min(DEFAULT_Q_BLOCK_SIZE, max(n_q, 1))
    return _require_block("q_block_size", q_block_size)


def _online_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    causal: bool,
    q_block_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop of :func:`online_softmax_attention` on validated inputs: ``(out, lse)``,
    where ``lse (..., n_q, 1)`` is each query's log-sum-exp of its (scaled, masked) scores,
    ``m + log(l)``, and ``+inf`` for a query that sees no key (so that ``exp(s - lse)`` gives
    it zero weights). FlashAttention's backward pass (:mod:`attention_ref.flash`) recomputes
    the weights of each tile from it."""
    n_q, n_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    q_block_size = _q_block_size(n_q, block_size, causal, q_block_size)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    offset = n_k - n_q  # query i sits at key position i + offset
    # In place, the loop keeps one tile at a time; autograd needs the values it saved, so
    # when a gradient is wanted every update makes a new tensor.
    in_place = not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    q = q * (1.0 / math.sqrt(d_k))  # scale once, not every tile
    k_t = k.transpose(-2, -1)  # (..., d_k, n_k), a view
    out = q.new_empty(*batch, n_q, d_v)
    lse = q.new_empty(*batch, n_q, 1)
    for i0 in range(0, n_q, q_block_size):
        i1 = min(i0 + q_block_size, n_q)
        q_blk = q[..., i0:i1, :]  # (..., bq, d_k)
        m = q.new_full((*batch, i1 - i0, 1), float("-inf"))  # running max per query
        l = q.new_zeros((*batch, i1 - i0, 1))  # running sum of exp(s - m)  # noqa: E741
        acc = q.new_zeros((*batch, i1 - i0, d_v))  # running sum of exp(s - m) v
        # Keys after the last visible one of this query block's last query are skipped.
        j_end = min(n_k, i1 + offset) if causal else n_k
        for j0 in range(0, max(j_end, 0), block_size):
            j1 = min(j0 + block_size, n_k)
            s = q_blk @ k_t[..., j0:j1]  # (..., bq, bk) one tile of scores
            if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal
                allowed = _causal_allowed(i0, i1, j0, j1, offset, q.device)  # (bq, bk)
                s = (
                    s.masked_fill_(~allowed, float("-inf"))
                    if in_place
                    else s.masked_fill(~allowed, float("-inf"))
                )
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., bq, 1)
            if causal:  # a query that has seen nothing yet keeps m = -inf: shift by 0
                m_new = m_new.masked_fill(m_new == float("-inf"), 0.0)
            alpha = torch.exp(m - m_new)  # rescales what was accumulated so far
            if in_place:
                # (..., bq, bk): no second tile, unless v's batch dimensions are wider than
                # q's and k's (then the tile broadcasts to them)
                p = (s.sub_(m_new) if s.shape[:-2] == batch else s - m_new).exp_()
                l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
                acc.mul_(alpha).add_(p @ v[..., j0:j1, :])  # (..., bq, d_v)
            else:
                p = torch.exp(s - m_new)  # (..., bq, bk)
                l = l * alpha + p.sum(dim=-1, keepdim=True)  # noqa: E741
                acc = acc * alpha + p @ v[..., j0:j1, :]  # (..., bq, d_v)
            m = m_new
        # A query that saw no key (causal with n_q > n_k) has l = 0 and acc = 0: output 0.
        seen = l > 0
        out[..., i0:i1, :] = acc / torch.where(seen, l, torch.ones_like(l))
        lse[..., i0:i1, :] = torch.where(seen, m + torch.log(l), float("inf"))
    return out, lse


# ----------------------------------------------------------------------------- watching ops
def _tensors(obj) -> list[torch.Tensor]:
    """The tensors in an operation's arguments or results (a tensor, or tensors nested in
    tuples, lists and dicts). A few Python calls per operation: the checks run these modes
    under a profiler hook that costs time per Python call."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        found = []
        for item in obj:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, tuple | list | dict):
                found.extend(_tensors(item))
        return found
    if isinstance(obj, dict):
        return _tensors(list(obj.values()))
    return []


def _flops(func, args) -> int:
    """Multiply-adds x 2 of a matrix product (0 for any other operation)."""
    name = func.overloadpacket.__name__
    try:
        if name in ("mm", "bmm"):
            a, b = args[0], args[1]
        elif name in ("addmm", "baddbmm", "addbmm"):
            a, b = args[1], args[2]
        elif name in ("mv", "dot", "vdot"):
            a, b = args[0], args[1]
            return 2 * a.numel()
        else:
            return 0
        return 2 * a.numel() * b.shape[-1]
    except (AttributeError, IndexError, TypeError):
        return 0


@dataclass(frozen=True)
class OpRecord:
    """One PyTorch operation seen by :class:`OpRecorder`."""

    name: str  # e.g. "aten.bmm.default"
    shapes: tuple[tuple[int, ...], ...]  # shapes of its tensor results
    flops: int  # 2 x multiply-adds for matrix products, else 0
    args: tuple = ()  # (only when OpRecorder(keep_args=True)) the positional arguments


class OpRecorder(TorchDispatchMode):
    """Record every PyTorch operation run inside ``with OpRecorder() as rec:``.

    ``rec.ops`` lists each operation's name, result shapes and matrix-product FLOPs;
    ``rec.largest()`` is the biggest tensor any operation produced, and ``rec.work()`` a
    rough amount of work (FLOPs of matrix products plus elements produced by the rest).
    """

    def __init__(self, keep_args: bool = False) -> None:
        super().__init__()
        self.keep_args = keep_args
        self.ops: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(t.shape) for t in _tensors(out))
        kept = tuple(args) if self.keep_args else ()
        self.ops.append(OpRecord(str(func), shapes, _flops(func, args), kept))
        return out

    def largest(self) -> tuple[int, tuple[int, ...], str]:
        """``(numel, shape, op name)`` of the biggest result of any recorded operation."""
        best = (0, (), "")
        for op in self.ops:
            for shape in op.shapes:
                n = math.prod(shape)
                if n > best[0]:
                    best = (n, shape, op.name)
        return best

    def work(self) -> int:
        """FLOPs of matrix products plus the elements every other operation produced."""
        return sum(
            op.flops if op.flops else sum(math.prod(s) for s in op.shapes) for op in self.ops
        )


class PeakMemory(TorchDispatchMode):
    """Peak bytes of tensors created by PyTorch operations inside the ``with`` block and
    alive at the same time (CPU or any device): a tracemalloc for tensors.

    Tensors that existed before the block (the inputs) are not counted; a view adds
    nothing (it shares its base's storage). Scratch memory a fused kernel allocates
    internally, without returning it as a tensor, is invisible to this count: on CUDA
    prefer ``torch.cuda.max_memory_allocated``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, live tensors]
        # One weak reference per counted tensor, until it dies (keyed by id: comparing two
        # weak references compares their tensors).
        self._refs: dict[int, weakref.ref] = {}

    def _dead(self, ref: weakref.ref, ptr: int) -> None:
        self._refs.pop(id(ref), None)
        self._release(ptr)

    def _release(self, ptr: int) -> None:
        entry = self._live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in _tensors((args, kwargs or {}))}
        for t in _tensors(out):
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr == 0:
                continue
            entry = self._live.get(ptr)
            if entry is None:
                if ptr in inputs:
                    continue  # a view of, or an in-place op on, a tensor from outside
                entry = self._live[ptr] = [storage.nbytes(), 0]
                self.current += entry[0]
                self.peak = max(self.peak, self.current)
            entry[1] += 1
            ref = weakref.ref(t, lambda dead, ptr=ptr: self._dead(dead, ptr))
            self._refs[id(ref)] = ref
        return out


class KernelLoads:
    """What Triton's interpreter does while watched (interpreter only: a compiled kernel
    cannot be watched; ``available`` says whether it counts):

    - ``loaded``: the elements loaded from memory (mask true): the evidence that a causal
      kernel skips the tiles in the future of its queries;
    - ``work``: the multiply-adds of every ``tl.dot`` (a tile visited with its loads masked
      off still costs its products);
    - ``dtype_pairs``: the dtypes of the operands of every ``tl.dot`` (pairs such as
      ``("fp16", "fp16")``), the evidence of tiles upcast before a product;
    - ``masked_tiles``: for each number of elements ``n``, the tile steps in which a
      ``tl.where`` of ``n`` elements ran, in any shape (a tile step of size ``n``: one
      program's code between two ``tl.dot`` whose products do not have ``n`` elements, so
      that the ``tl.where`` before and after a tile's score product count once): with
      ``BLOCK_M * BLOCK_N``, the tiles whose scores were masked, whatever the shape of the
      tile (the evidence of a causal loop split: only the tiles that cross the diagonal or
      the end of the keys);
    - ``out_of_bounds``: what went wrong with the kernel's addresses (the first few, in
      words): an element loaded or stored outside the tensors the launch was given (each
      address is checked against the span of memory of the argument its tile starts in; such
      an access is left out, masked off, so that the interpreter neither reads nor writes
      memory it does not own, which would crash the process), or an element stored by two
      programs (the interpreter runs the programs one after another, so the last one wins;
      on a GPU they run at once and race), told apart when the program had loaded those
      elements first (a read-modify-write: programs adding to one sum without atomics).

    In a graded kernel the watcher runs in the learner's process and its records travel back
    to the checker through the wire's ``dots`` field (``dots`` holds the dtype pairs and the
    other records as pairs tagged ``"@work"`` and ``"@oob"``; assigning ``dots`` merges the
    records of another watcher; ``"@sel"`` pairs carry ``masked_tiles``)."""

    #: descriptions kept in ``out_of_bounds``
    KEEP = 4

    def __init__(self) -> None:
        self.loaded = 0
        self.work = 0
        self.dtype_pairs: set[tuple[str, str]] = set()
        self.out_of_bounds: list[str] = []
        self.masked_tiles: dict[int, int] = {}
        self.available = False
        self._saved = None
        self._token = os.urandom(6).hex()
        self._merged: set[str] = set()
        self._regions: list[tuple[int, int, str]] = []  # (first byte, end byte, argument)
        self._writers: dict[tuple[int, int], object] = {}  # (region, bytes) -> program ids
        self._launches = 0
        # (launch, program) -> {elements of a product: its tl.dot calls so far}
        self._dots_in: dict[tuple, dict[int, int]] = {}
        self._steps_seen: set[tuple] = set()  # (launch, program, other products, elements)
        self._loads_of: tuple = (None, [])  # (launch, program), the addresses it loaded

    # -- the records as the wire carries them
    @property
    def dots(self) -> set[tuple[str, str]]:
        tagged = {("@work", f"{self._token}:{self.work}")}
        tagged |= {
            ("@oob", f"{self._token}:{i:03d}:{text}") for i, text in enumerate(self.out_of_bounds)
        }
        tagged |= {("@sel", f"{self._token}:{size}:{n}") for size, n in self.masked_tiles.items()}
        return set(self.dtype_pairs) | tagged

    @dots.setter
    def dots(self, pairs) -> None:
        for a, b in sorted(pairs):
            a, b = str(a), str(b)
            if a not in ("@work", "@oob", "@sel"):
                self.dtype_pairs.add((a, b))
                continue
            token, _, rest = b.partition(":")
            if token == self._token or b in self._merged:
                continue
            self._merged.add(b)
            if a == "@work":
                self.work += int(rest) if rest.isdigit() else 0
            elif a == "@sel":
                size, _, n = rest.partition(":")
                if size.isdigit() and n.isdigit():
                    key = int(size)
                    self.masked_tiles[key] = self.masked_tiles.get(key, 0) + int(n)
            elif len(self.out_of_bounds) < self.KEEP:
                self.out_of_bounds.append(rest.partition(":")[2])

    # -- the interpreter's hooks
    def _launch(self, arg_names, args, kwargs) -> None:
        """A kernel launch: the spans of memory of its tensor arguments."""
        self._regions, self._writers = [], {}
        self._launches += 1
        named = list(zip(arg_names, args, strict=False)) + list(kwargs.items())
        for name, t in named:
            if isinstance(t, torch.Tensor) and t.numel():
                span = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1
                first = t.data_ptr()
                self._regions.append((first, first + span * t.element_size(), str(name)))

    def _note(self, text: str) -> None:
        if len(self.out_of_bounds) < self.KEEP and text not in self.out_of_bounds:
            self.out_of_bounds.append(text)

    def _within(self, ptrs, mask, store: bool):
        """The mask with every element outside its tensor left out (None: unchanged)."""
        import numpy as np

        addr = ptrs.data
        width = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        on = np.ones(addr.shape, bool) if mask is None else np.broadcast_to(mask.data, addr.shape)
        used = addr[on]
        if not store:
            from triton.runtime import interpreter

            key = (self._launches, tuple(interpreter.interpreter_builder.grid_idx))
            if self._loads_of[0] != key:
                self._loads_of = (key, [])
            self._loads_of[1].append(used.ravel())
        if not used.size or not self._regions:
            return None
        low, high = int(used.min()), int(used.max()) + width
        owner = next((r for r in self._regions if r[0] <= low < r[1]), None)
        verb = "stores" if store else "loads"
        if owner is not None and high <= owner[1]:
            keep = None
        else:
            ok = np.zeros(addr.shape, bool)
            if owner is not None:
                ok = (addr >= owner[0]) & (addr + width <= owner[1])
            outside = on & ~ok
            where = (
                f"past the end of {owner[2]}'s memory (the tile starts in {owner[2]})"
                if owner is not None
                else "outside every tensor the kernel was given"
            )
            self._note(
                f"a tl.{verb[:-1]} {verb} {int(outside.sum())} of its {int(on.sum())} "
                f"elements {where}"
            )
            keep = on & ok
        if store and owner is not None:
            self._race(addr[on if keep is None else keep], width, owner)
        if keep is None:
            return None
        from triton import language as tl
        from triton.runtime.interpreter import TensorHandle

        return TensorHandle(np.ascontiguousarray(keep), tl.int1)

    def _race(self, addr, width: int, owner) -> None:
        """Two programs storing to one element: a race on a GPU."""
        import numpy as np
        from triton.runtime import interpreter

        key = (owner[0], width)
        writers = self._writers.get(key)
        if writers is None:
            writers = self._writers[key] = np.full((owner[1] - owner[0]) // width + 1, -1)
        builder = interpreter.interpreter_builder
        x, y, z = builder.grid_idx
        _, gy, gz = builder.grid_dim
        me = (x * gy + y) * gz + z
        index = ((addr - owner[0]) // width).astype(np.int64)
        before = writers[index]
        clash = (before >= 0) & (before != me)
        key = (self._launches, (x, y, z))
        if clash.any() and self._loads_of[0] == key and self._loads_of[1]:
            loaded = np.concatenate(self._loads_of[1])
            if np.isin(addr[clash], loaded).all():  # a read-modify-write: a sum, not a leak
                self._note(
                    f"two programs add to the same {int(clash.sum())} elements of {owner[2]} by "
                    "a tl.load and a tl.store (a read-modify-write, where a GPU races)"
                )
                clash[:] = False
        if clash.any():
            self._note(
                f"two programs store to the same {int(clash.sum())} elements of {owner[2]} "
                "(a store whose mask lets a program write rows or columns of another)"
            )
        writers[index] = me

    def __enter__(self) -> KernelLoads:
        if os.environ.get("TRITON_INTERPRET") != "1":
            return self
        try:
            from triton.runtime import interpreter
        except ImportError:
            return self

        builder = interpreter.interpreter_builder
        executor = interpreter.GridExecutor
        original = (
            builder.create_masked_load,
            builder.create_masked_store,
            builder.create_dot,
            builder.create_select,
        )
        original_init = executor._init_args_hst
        self._saved = (builder, executor, original, original_init)
        self.available = True

        def init_args(grid, args_dev, kwargs):
            args_hst, kwargs_hst = original_init(grid, args_dev, kwargs)
            self._launch(grid.arg_names, args_hst, kwargs_hst)
            return args_hst, kwargs_hst

        def load(ptrs, mask, *args, **kwargs):
            self.loaded += int(mask.data.sum()) if hasattr(mask, "data") else 0
            inside = self._within(ptrs, mask, store=False)
            return original[0](ptrs, mask if inside is None else inside, *args, **kwargs)

        def store(ptrs, value, mask, *args, **kwargs):
            inside = self._within(ptrs, mask, store=True)
            return original[1](ptrs, value, mask if inside is None else inside, *args, **kwargs)

        def dot(a, b, *args, **kwargs):
            self.dtype_pairs.add((str(a.get_element_ty()), str(b.get_element_ty())))
            self.work += int(a.data.size) * int(b.data.shape[-1])
            products = self._dots_in.setdefault((self._launches, builder.grid_idx), {})
            size = int(a.data.size) // int(a.data.shape[-1]) * int(b.data.shape[-1])
            products[size] = products.get(size, 0) + 1
            return original[2](a, b, *args, **kwargs)

        def select(cond, lhs, rhs):
            out = original[3](cond, lhs, rhs)
            size = int(getattr(out.data, "size", 1))
            if size > 1:
                where = (self._launches, builder.grid_idx)
                products = self._dots_in.get(where, {})
                others = sum(n for s, n in products.items() if s != size)
                step = (*where, others, size)
                if step not in self._steps_seen:
                    self._steps_seen.add(step)
                    self.masked_tiles[size] = self.masked_tiles.get(size, 0) + 1
            return out

        builder.create_masked_load = load
        builder.create_masked_store = store
        builder.create_dot = dot
        builder.create_select = select
        executor._init_args_hst = init_args
        return self

    def __exit__(self, *exc) -> bool:
        if self._saved is not None:
            builder, executor, original, original_init = self._saved
            builder.create_masked_load, builder.create_masked_store = original[:2]
            builder.create_dot = original[2]
            builder.create_select = original[3]
            executor._init_args_hst = original_init
            self._saved = None
        return False
