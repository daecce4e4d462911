"""The kernel's side of a graded check: it serves the trusted checker, it does not judge.

Under grading (``make grade``), ``check(exercise_id, candidate)`` in the learner's kernel
connects to the checker over the Unix socket named by ``$ATTENTION_REF_CHECKER`` and asks
it to check ``candidate``. The checker runs the check's code in its own process
(:mod:`attention_ref.trust.remote`) and asks back for what only the kernel can do: call
the learner's function, build the learner's module, read its attributes, set its
weights. :func:`serve` does each request and answers with data
(:mod:`attention_ref.trust.wire`): tensors and arrays by value, any other object as a
handle that the checker can use in a later request.

What the kernel observes here is *evidence*, not a verdict: the time a call took (the same
per-call limit as the self-check) and whether it reached a forbidden function (the same
tripwire). The checker decides, and the grader takes the points from the checker's
record, never from this process. Nothing here can make a check pass that the checker
failed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import socket
import sys
import types
from typing import Any

from . import wire

#: The environment variable that names the checker's socket in a graded kernel.
SOCKET_ENV = "ATTENTION_REF_CHECKER"


class CallbackFailed(BaseException):  # noqa: N818 - an event: the checker's callable raised
    """Raised in the learner's code when a callable of the check's (a table language model,
    say) failed on what the learner passed it; the checker has the real error."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, agent: Agent) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.agent = agent

    def persistent_load(self, pid: Any) -> Any:
        kind, key = pid[0], pid[1]
        if kind == "k":
            return self.agent.objects[key]
        if kind == "cb":
            return self.agent.callback(key)
        if kind == "obj":
            return CheckerObject(self.agent, key)
        if kind == "leaf":  # a tensor of the check's that autograd differentiates
            leaf = self.agent.leaves.get(key)
            if leaf is None:
                leaf = self.agent.leaves[key] = pid[2].requires_grad_(True)
            return leaf
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def describe(obj: Any) -> dict:
    """What the checker may know of a kernel object besides its id: its type's name, the
    torch or course classes it is an instance of (so that ``isinstance`` against them
    answers as in the kernel), and whether it is a class, a callable, a module."""
    t = type(obj)
    names = []
    for base in t.__mro__:
        mod = getattr(base, "__module__", "") or ""
        if mod.split(".")[0] in ("torch", "attention_ref", "numpy", "builtins"):
            names.append(f"{mod}:{base.__qualname__}")
    info: dict[str, Any] = {
        "type": t.__name__,
        "mro": names,
        "callable": callable(obj),
        "is_type": isinstance(obj, type),
    }
    if isinstance(obj, type):
        info["name"] = obj.__name__
        info["bases"] = [
            f"{b.__module__}:{b.__qualname__}"
            for b in obj.__mro__
            if (b.__module__ or "").split(".")[0] in ("torch", "attention_ref")
        ]
    elif isinstance(obj, types.ModuleType):
        name = vars(obj).get("__name__")
        if isinstance(name, str):
            info["module"] = name
    else:
        name = getattr(obj, "__name__", None) if callable(obj) else None
        if isinstance(name, str):
            info["name"] = name
    return info


class Agent:
    """The kernel's objects the checker holds handles to, and the requests it serves."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.objects: dict[int, Any] = {}
        self._ids: dict[int, int] = {}
        self.leaves: dict[int, Any] = {}  # the check's tensors that require gradients
        self._swaps: list[tuple[Any, dict]] = []  # names replaced in the learner's globals
        self._forbidden: dict[tuple[str, bool], list] = {}

    # -- objects
    def handle(self, obj: Any) -> dict:
        mine = _checker_key(obj)
        if mine is not None:  # the checker's own object, given back
            return {"t": "checker", "id": mine}
        key = self._ids.get(id(obj))
        if key is None or self.objects.get(key) is not obj:
            key = len(self.objects) + 1
            self.objects[key] = obj
            self._ids[id(obj)] = key
        return {"t": "handle", "id": key, **describe(obj)}

    def encode(self, value: Any, *, refs: bool = False) -> bytes:
        enc = wire.Encoder(self.handle)
        try:
            tree = enc(value, refs=refs)
        except Exception as err:  # noqa: BLE001 - a value that cannot be read: say so
            return self.reply_error("unreadable", err)
        return wire.pack({"ok": tree}, enc.buffers)

    def reply_error(self, kind: str, err: BaseException | None = None, **extra: Any) -> bytes:
        info = {"kind": kind, **extra}
        if err is not None:
            info.setdefault("type", type(err).__name__)
            try:
                info.setdefault("message", str(err))
            except Exception:  # noqa: BLE001 - an exception whose str() raises
                info.setdefault("message", "")
        return wire.pack({"error": info}, [])

    def ask_checker(self, key: int, op: str, *args: Any, name: str = "", **kwargs: Any) -> Any:
        """Use the check's object ``key`` (``op``: call, method, getattr, len, getitem) in
        the checker; what it returns."""
        enc = wire.Encoder(self.handle)
        tree = {"cb": key, "op": op, "name": name, "args": enc(list(args)), "kwargs": enc(kwargs)}
        wire.send_frame(self.sock, wire.pack(tree, enc.buffers))
        while True:
            msg = self.receive()
            if msg.get("op") == "cb_result":
                return _Method() if msg.get("method") else msg["value"]
            if msg.get("op") == "cb_error":
                raise CallbackFailed(msg.get("message", ""))
            self.answer(msg)  # the checker reads something while it computes

    def callback(self, key: int):
        agent = self

        def call_checker(*args: Any, **kwargs: Any) -> Any:
            return agent.ask_checker(key, "call", *args, **kwargs)

        call_checker.__name__ = f"check_callable_{key}"
        call_checker._checker_key = key
        return call_checker

    # -- the loop
    def receive(self) -> dict:
        frame = wire.recv_frame(self.sock)
        try:
            msg = _Unpickler(frame, self).load()
        except Exception as err:  # noqa: BLE001 - the checker learns of it, as data
            import pickle as _p

            seq = None
            with contextlib.suppress(Exception):  # the request's number, to answer it
                seq = _p.loads(frame).get("seq")
            return {"op": "unreadable", "seq": seq, "error": f"{type(err).__name__}: {err}"}
        return msg if isinstance(msg, dict) else {"op": "unreadable", "seq": None}

    def answer(self, msg: dict) -> None:
        wire.send_frame(self.sock, self.serve(msg))

    def serve(self, msg: dict) -> bytes:
        """Do one request of the checker's; the answer, encoded."""
        import torch

        op = msg.get("op")
        seq = msg.get("seq")
        with torch.set_grad_enabled(bool(msg.get("grad", True))):
            try:
                if op in ("call", "grad", "backward"):
                    out = self._call(msg)
                elif op == "getattr":
                    return self._tag(seq, self._guarded(msg, getattr, msg["target"], msg["name"]))
                elif op == "setattr":
                    out = self._guarded(msg, setattr, msg["target"], msg["name"], msg["value"])
                elif op == "list":
                    out = self._guarded(msg, list, msg["target"])
                elif op == "next":
                    out = self._guarded(msg, next, msg["target"], _STOP)
                elif op == "len":
                    out = self._guarded(msg, len, msg["target"])
                elif op == "bool":
                    out = self._guarded(msg, bool, msg["target"])
                elif op == "contains":
                    out = self._guarded(msg, _contains, msg["target"], msg["value"])
                elif op == "getitem":
                    out = self._guarded(msg, _getitem, msg["target"], msg["value"])
                elif op == "setitem":
                    out = self._guarded(msg, _setitem, msg["target"], msg["name"], msg["value"])
                elif op == "swap":
                    out = self._guarded(msg, self._swap, msg["target"], msg["value"])
                elif op == "restore":
                    out = self._guarded(msg, self._restore, msg["value"])
                elif op == "slot":  # where a module's tensor lives (weights loading)
                    out = self._guarded(msg, _tensor_slots, msg["target"], msg["value"])
                elif op == "global":  # a name a test cell of plain asserts uses
                    out = self._guarded(msg, _global, msg["name"])
                elif op == "inplace_many":
                    out = self._guarded(msg, _inplace_many, msg["value"])
                elif op == "inplace":
                    out = self._guarded(msg, _inplace, msg["target"], msg["name"], msg["args"])
                else:
                    return self._tag(seq, self.reply_error("protocol", note=f"op {op!r}"))
            except _Failed as failed:
                return self._tag(seq, failed.reply)
        return self._tag(seq, out)

    def _report(self, seq: Any, desc: Any) -> None:
        """Tell the checker at once that the call ``seq`` reached ``desc``, a forbidden
        function: the checker fails that call whatever its answer."""
        wire.send_frame(self.sock, wire.pack({"fired": str(desc)[:300], "seq": seq}, []))

    def _swap(self, candidate: Any, functions: dict) -> int:
        """The learner's function (a class: its ``forward``) sees ``functions`` under their
        names in its globals (only names it defines); a key to restore them."""
        namespace = getattr(candidate, "__globals__", None)
        if namespace is None:
            namespace = getattr(getattr(candidate, "forward", None), "__globals__", None)
        saved = {}
        if isinstance(namespace, dict):
            saved = {n: namespace[n] for n in functions if callable(namespace.get(n))}
            namespace.update({n: functions[n] for n in saved})
        self._swaps.append((namespace, saved))
        return len(self._swaps) - 1

    def _restore(self, key: int) -> None:
        namespace, saved = self._swaps[key]
        if isinstance(namespace, dict):
            namespace.update(saved)

    def _tag(self, seq: Any, payload: bytes) -> bytes:
        tree, buffers = wire.unpack(payload)
        tree["seq"] = seq
        return wire.pack(tree, [bytes(b) for b in buffers])

    def _guarded(self, msg: dict, fn, *args: Any) -> bytes:
        """``fn(*args)`` on the learner's objects (a property, an iterator, ``__len__`` are
        the learner's code too): under the time limit; errors come back as data."""
        from ..checks._core import _Deadline, _TimeUp

        deadline = _Deadline(msg.get("limit"))
        try:
            with deadline:
                out = fn(*args)
        except _TimeUp as up:
            if up.deadline is not deadline:
                raise
            raise _Failed(self.reply_error("timeout", limit=msg.get("limit"))) from None
        except CallbackFailed:
            raise _Failed(self.reply_error("callback")) from None
        except Exception as err:  # noqa: BLE001 - the learner's error is data
            raise _Failed(self._raised(err)) from None
        if out is _STOP:
            return wire.pack({"stop": True}, [])
        return self.encode(out, refs=msg.get("op") != "call")

    def _call(self, msg: dict) -> bytes:
        """The learner's code itself, as ``Context.call`` runs it in the self-check: under
        the time limit and the tripwire of the exercise's forbidden functions."""
        import contextlib

        import torch

        from ..checks._core import (
            ReferenceUsed,
            _Deadline,
            _TimeUp,
            on_meta,
            warm_autograd,
            warm_meta,
        )

        op = msg.get("op")
        target, args, kwargs = msg.get("target"), msg.get("args", ()), msg.get("kwargs", {})
        if op == "grad":  # the learner's backward pass, through autograd
            target, args, kwargs = torch.autograd.grad, args, kwargs
        elif op == "backward":
            target, args = _backward, args
        if op in ("grad", "backward"):
            warm_autograd()  # not the learner's time
        if on_meta(args, kwargs):
            warm_meta()  # nor the meta device's first use (seconds of imports)
        forbid = msg.get("forbid")
        key = (
            str(msg.get("exercise") or ""),
            bool(msg.get("tripwire")),
            tuple(str(e) for e in forbid) if isinstance(forbid, list) else None,
        )
        if key not in self._forbidden:
            self._forbidden[key] = _forbidden_for(*key)
        seq = msg.get("seq")
        tripwire = graded_tripwire(self._forbidden[key], lambda desc: self._report(seq, desc))
        deadline = _Deadline(msg.get("limit"))
        before = [_snapshot(a) for a in args]
        if msg.get("rng") is not None:  # the random state the checker's process would have
            torch.set_rng_state(msg["rng"])
        watchers = [_watcher(w) for w in msg.get("watch", [])]
        try:
            with deadline, tripwire, contextlib.ExitStack() as stack:
                for w in watchers:
                    stack.enter_context(w)
                out = target(*args, **kwargs)
                if op == "backward":
                    out = {str(k): leaf.grad for k, leaf in self.leaves.items()}
            if tripwire.fired:  # caught by the learner's own try/except: fired all the same
                raise ReferenceUsed(tripwire.fired[0])
        except _TimeUp as up:
            if up.deadline is not deadline:
                raise
            return self.reply_error("timeout", limit=msg.get("limit"))
        except ReferenceUsed as used:
            return self.reply_error(
                "reference", name=tripwire.fired[0] if tripwire.fired else used.name
            )
        except NotImplementedError as err:
            return self.reply_error("not_implemented", err)
        except CallbackFailed:
            return self.reply_error("callback")
        except Exception as err:  # noqa: BLE001 - the learner's error is data
            if tripwire.fired:  # a forbidden call made the learner's code fail later
                return self.reply_error("reference", name=tripwire.fired[0])
            return self._raised(err)
        except KeyboardInterrupt:
            raise  # the grader interrupted the cell at its time limit: the cell ends here
        except BaseException as err:  # SystemExit and the like: the checker decides
            return self.reply_error("base", err)
        modified = next(
            (i for i, (a, b) in enumerate(zip(args, before, strict=True)) if not _unchanged(a, b)),
            None,
        )
        extra = {"rng": torch.get_rng_state()} if msg.get("rng") is not None else {}
        if watchers:
            extra["watched"] = [_watched(w) for w in watchers]
        return self.encode((out, modified, extra), refs="results")

    def _raised(self, err: BaseException) -> bytes:
        from ..checks._core import _student_line

        try:
            where, line = _student_line(err)
        except Exception:  # noqa: BLE001
            where, line = "", ""
        return self.reply_error("raised", err, where=where, line=line)


def _checker_key(obj: Any) -> int | None:
    if type(obj) is CheckerObject:
        return object.__getattribute__(obj, "_key")
    key = getattr(obj, "_checker_key", None) if type(obj).__name__ == "function" else None
    return key if isinstance(key, int) else None


class CheckerObject:
    """An object of the check's that the learner's code uses by reference (a watched
    cache): its methods and attributes are the checker's, reached across the wire."""

    __slots__ = ("_agent", "_key")

    def __init__(self, agent: Agent, key: int) -> None:
        object.__setattr__(self, "_agent", agent)
        object.__setattr__(self, "_key", key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        agent, key = object.__getattribute__(self, "_agent"), object.__getattribute__(self, "_key")
        value = agent.ask_checker(key, "getattr", name=name)
        if isinstance(value, _Method):

            def method(*args: Any, **kwargs: Any) -> Any:
                return agent.ask_checker(key, "method", *args, name=name, **kwargs)

            method.__name__ = name
            return method
        return value

    def __len__(self) -> int:
        return self._ask("len")

    def __getitem__(self, item: Any) -> Any:
        return self._ask("getitem", item)

    def _ask(self, op: str, *args: Any) -> Any:
        agent, key = object.__getattribute__(self, "_agent"), object.__getattribute__(self, "_key")
        return agent.ask_checker(key, op, *args)


class _Method:
    """What the checker answers when the learner's code reads a method of a check's object:
    the kernel calls it by name."""


class _Failed(Exception):  # noqa: N818 - carries an error reply out of a guarded request
    def __init__(self, reply: bytes) -> None:
        super().__init__("failed")
        self.reply = reply


_STOP = object()


#: The files whose functions the learner's code may reach while graded: of the trust
#: machinery, the wire and this agent (a check's objects used by reference) and the kernels
#: that raise in place of PyTorch's fused attention (fused_removal), the reference parts a
#: check puts in the learner's module, which the checker computes (computed); of the checks,
#: the time limit's handler (_core). Any other file of attention_ref/checks/ or
#: attention_ref/trust/ (the checks' models of the answers, the checker's side) fires the
#: tripwire.
_ALLOWED_TRUST_FILES = ("agent", "wire", "remote", "fused_removal", "computed", "__init__")
_ALLOWED_CHECK_FILES = ("_core", "__init__")


def graded_tripwire(forbidden: list, report: Any = None):
    """The self-check's tripwire, and under grading more: the learner's code may not switch
    the watch off (``sys.setprofile``, ``sys.settrace``, ``threading``'s), start a thread
    (which the watch does not follow), or call the checks' own code (their float64 models
    of the right answer). Each time it fires, ``report(what)`` tells the checker at once
    (the kernel's record of it, which the learner's code could find and clear, is not
    what the checker goes by)."""
    return _graded_tripwire_class()([*forbidden, *_watch_off()], report)


class _Reported(list):
    """What a graded tripwire stopped: a list, each item also reported as it is added."""

    def __init__(self, report: Any) -> None:
        super().__init__()
        self._report = report

    def append(self, desc: Any) -> None:
        super().append(desc)
        if self._report is not None:
            with contextlib.suppress(Exception):  # a dead socket: the call fails anyway
                self._report(desc)


@functools.cache
def _watch_off() -> tuple:
    import _thread
    import threading

    out = [
        (sys.setprofile, "sys.setprofile (which would switch off the check's watch)"),
        (sys.settrace, "sys.settrace (which would switch off the check's watch)"),
        (threading.setprofile, "threading.setprofile (the check's watch)"),
        (threading.settrace, "threading.settrace (the check's watch)"),
    ]
    for name in ("start_new_thread", "start_joinable_thread", "start_new"):
        fn = getattr(_thread, name, None)
        if fn is not None:
            out.append((fn, "a new thread (the check watches the code it calls)"))
    return tuple(out)


#: forbidden code objects (and their descriptions) -> {code object: what the learner's code
#: may not reach there, or "" where it may}: filled as the learner's code runs.
_VERDICTS: dict[frozenset, dict] = {}
_CHECKS_REACHED = "the course's checks (attention_ref.checks)"


@functools.cache
def _graded_tripwire_class():
    import re

    from ..checks._core import ReferenceUsed, _Tripwire

    allowed = "|".join(_ALLOWED_CHECK_FILES)
    allowed_trust = "|".join(_ALLOWED_TRUST_FILES)
    checks = re.compile(
        rf"attention_ref[/\\](checks[/\\](?!({allowed})\.py)|trust[/\\](?!({allowed_trust})\.py))"
    )

    class GradedTripwire(_Tripwire):
        def __init__(self, forbidden: list, report: Any = None) -> None:
            self._report = report
            super().__init__(forbidden)  # the codes, builtins, fired, and _make_profile's hook
            self._guard = _torch_guard(forbidden, self.fired)

        def _make_profile(self):
            self.fired = _Reported(self._report)  # before the hook holds it
            # One flat function (it runs on every call the learner's code makes: the
            # course's Triton notebook runs millions of calls in Triton's interpreter): one
            # dict lookup per event. A code object's verdict (forbidden, the checks' own,
            # or "" for allowed) is kept across calls for the same forbidden list, its file
            # name matched once.
            key = frozenset(self.codes.items())
            verdicts = _VERDICTS.get(key)
            if verdicts is None:
                verdicts = _VERDICTS[key] = dict(self.codes)
            verdict, builtins_, fired = verdicts.get, self.builtins.get, self.fired

            def profile(frame, event, arg):
                if event == "c_call":
                    desc = builtins_(arg)
                    if desc is None or frame.f_code in own:
                        return None  # the tripwire's own exit puts the old profile back
                elif event == "call":
                    code = frame.f_code
                    desc = verdict(code)
                    if desc is None:
                        desc = verdicts[code] = (
                            _CHECKS_REACHED if checks.search(code.co_filename) else ""
                        )
                    if not desc:
                        return None
                else:
                    return None
                sys.setprofile(None)
                fired.append(desc)
                raise ReferenceUsed(desc)

            return profile

        def __enter__(self):
            self._old = sys.getprofile()
            if self._guard is not None:
                self._guard.__enter__()
            sys.setprofile(self._profile)  # always on: the checks' code is always forbidden
            return self

        def __exit__(self, *exc):
            sys.setprofile(self._old)
            if self._guard is not None:
                self._guard.__exit__(*exc)
            return False

    own = {_Tripwire.__exit__.__code__, GradedTripwire.__exit__.__code__}
    return GradedTripwire


def _forbidden_for(exercise: str, tripwire: bool, forbid: tuple[str, ...] | None) -> list:
    """What the learner's call may not reach: the exercise's forbidden list, or in a test
    cell of plain asserts (``forbid``) those of the notebook's exercises and PyTorch's
    fused attention in every case."""
    from ..checks._core import REGISTRY

    if not tripwire:
        return []
    if forbid is None:
        ex = REGISTRY.get(exercise)
        return ex.forbidden() if ex is not None else []
    from ..checks.toolkit import BUILTIN_ATTENTION

    out: list = list(BUILTIN_ATTENTION)
    for name in forbid:
        ex = REGISTRY.get(name)
        if ex is not None:
            out.extend(ex.forbidden())
    return out


#: PyTorch's attention as its operators are named, however they are reached (the
#: functional API, ``torch.ops.aten.*`` and its overloads, ``torch._C``, a ``partial`` or
#: ``map`` of any of them, which no profile hook sees): forbidding the public function
#: forbids the family.
_ATEN_FAMILIES = {
    "scaled_dot_product_attention": (
        "scaled_dot_product",
        "flash_attention",
        "efficient_attention",
        "cudnn_attention",
        "fused_attention",
    ),
    "multi_head_attention_forward": ("multi_head_attention", "transformer_encoder_layer"),
    # "=": the operator of exactly that name (not log_softmax, not a backward)
    "softmax": ("=aten::softmax", "=aten::_softmax", "=aten::special_softmax"),
}


def _in_family(name: str, pattern: str) -> bool:
    """Whether the operator ``name`` (``aten::op`` or ``aten::op.overload``) is of
    ``pattern`` (a part of its name, or ``=`` and the whole name without overload)."""
    if pattern.startswith("="):
        return name.split(".")[0] == pattern[1:]
    return pattern in name


def _torch_guard(forbidden: list, fired: list):
    """A torch-function mode that stops the learner's call at any forbidden PyTorch function,
    whatever way it is called (None when nothing of PyTorch's is forbidden); what it
    stopped is added to ``fired``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    by_id: dict[int, str] = {}
    families: list[tuple[str, str]] = []
    for fn, desc in forbidden:
        mod = getattr(fn, "__module__", None) or ""
        name = getattr(fn, "__name__", "") or ""
        if not (mod.startswith("torch") or getattr(fn, "__self__", None) is torch):
            continue
        by_id[id(fn)] = desc
        for part in _ATEN_FAMILIES.get(name, ()):
            families.append((part, desc))
    if not by_id:
        return None
    return _guard_class()(by_id, families, fired)


@functools.cache
def _guard_class():
    import torch
    from torch.overrides import TorchFunctionMode

    from ..checks._core import ReferenceUsed

    class ForbiddenTorch(TorchFunctionMode):
        def __init__(self, by_id: dict, families: list, fired: list) -> None:
            super().__init__()
            self.by_id, self.families, self.fired = by_id, families, fired
            self.names: dict[str, str | None] = {}
            self.depth = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            desc = self.by_id.get(id(func))
            if desc is None and isinstance(
                func, torch._ops.OpOverload | torch._ops.OpOverloadPacket
            ):
                name = str(getattr(func, "_qualified_op_name", "") or func.name())
                if name not in self.names:
                    self.names[name] = next(
                        (d for p, d in self.families if _in_family(name, p)), None
                    )
                desc = self.names[name]
            if desc is not None:
                self.fired.append(desc)
                raise ReferenceUsed(desc)
            return func(*args, **(kwargs or {}))

        def __enter__(self):
            self.depth = torch._C._len_torch_function_stack()
            return super().__enter__()

        def __exit__(self, *exc):
            stack = torch._C._len_torch_function_stack()
            if stack != self.depth + 1 or torch._C._get_function_stack_at(stack - 1) is not self:
                self.fired.append("a switch of PyTorch's function modes (the check's watch)")
                return False  # the learner's code took this mode off: leave the stack be
            return super().__exit__(*exc)

    return ForbiddenTorch


def _backward(tensor: Any, gradient: Any = None) -> None:
    tensor.backward(gradient)


def _watcher(spec: Any):
    """A recorder of what the learner's code does in this process, as the check asks:
    ``("ops", keep_args)`` an OpRecorder, ``("memory",)`` a PeakMemory, ``("loads",)`` a
    KernelLoads (what Triton's interpreter loads)."""
    from ..efficient import KernelLoads, OpRecorder, PeakMemory

    if spec[0] == "ops":
        return OpRecorder(keep_args=bool(spec[1]))
    if spec[0] == "loads":
        return KernelLoads()
    return PeakMemory()


def _watched(w: Any) -> Any:
    from ..efficient import KernelLoads, OpRecorder

    if isinstance(w, KernelLoads):
        return {"loaded": w.loaded, "available": w.available, "dots": sorted(w.dots)}
    if isinstance(w, OpRecorder):
        return [[op.name, [list(s) for s in op.shapes], op.flops, list(op.args)] for op in w.ops]
    return {"peak": w.peak, "current": w.current}


def _snapshot(x: Any) -> Any:
    """A copy of an array or tensor argument, to see afterwards whether it was modified."""
    from ..checks._core import _clone

    copy = _clone(x)
    return None if copy is x else copy


def _unchanged(x: Any, before: Any) -> bool:
    from ..checks._core import _same

    if before is None:
        return True
    try:
        return _same(x, before)
    except Exception:  # noqa: BLE001 - an input replaced by something else: not in place
        return True


def _tensor_slots(module: Any, names: list) -> list[dict]:
    """The kernel's side of :func:`attention_ref.trust.remote.tensor_slots`."""
    return [_tensor_slot(module, n) for n in names]


def _tensor_slot(module: Any, name: str) -> dict:
    """The learner's ``get_submodule``, parametrizations and ``_parameters``, read as the
    check reads them."""
    from torch.nn.utils import parametrize

    owner, _, leaf = str(name).rpartition(".")
    try:
        sub = module.get_submodule(owner) if owner else module
    except AttributeError:
        return {"found": False}
    if parametrize.is_parametrized(sub, leaf):
        return {"found": True, "sub": sub, "parametrized": True, "param": None}
    param = sub._parameters.get(leaf) if leaf else None
    return {"found": True, "sub": sub, "parametrized": False, "param": param}


def _global(name: str) -> Any:
    """The kernel's global ``name`` (``KeyError`` when it has none)."""
    if not isinstance(name, str):
        raise TypeError("a global's name must be a string")
    return vars(sys.modules["__main__"])[name]


def _contains(obj: Any, value: Any) -> bool:
    return value in obj


def _getitem(obj: Any, key: Any) -> Any:
    return obj[key]


def _setitem(obj: Any, key: Any, value: Any) -> None:
    obj[key] = value


#: In-place tensor methods the checker may apply to a kernel tensor (a parameter).
INPLACE = {"copy_", "fill_", "zero_", "normal_", "uniform_", "mul_", "add_", "requires_grad_"}


def _inplace(obj: Any, name: str, args: tuple) -> Any:
    import torch

    if name not in INPLACE or not isinstance(obj, torch.Tensor):
        raise TypeError(f"{name} is not an in-place tensor method the checker may use")
    getattr(obj, name)(*args)
    return None


def _inplace_many(batch: list) -> None:
    for obj, name, args in batch:
        _inplace(obj, name, args)


def connect() -> socket.socket | None:
    """The connection to the checker, when this kernel is graded through one."""
    path = os.environ.get(SOCKET_ENV, "")
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def check_through_checker(exercise_id: str, candidate: Any) -> dict:
    """Ask the checker to check ``candidate`` and serve its requests until its verdict
    comes: ``{"passed": bool, "message": str, "cases": int}``."""
    sock = connect()
    if sock is None:  # pragma: no cover - only called under grading
        raise RuntimeError(f"${SOCKET_ENV} is not set")
    with sock:
        agent = Agent(sock)
        enc = wire.Encoder(agent.handle)
        request = {"op": "check", "id": str(exercise_id), "candidate": enc(candidate)}
        wire.send_frame(sock, wire.pack(request, enc.buffers))
        while True:
            msg = agent.receive()
            if msg.get("op") == "verdict":
                return msg
            agent.answer(msg)


def serve_test_cell() -> None:
    """Under grading, what the kernel runs in place of a graded test cell of plain asserts:
    it asks the checker to run the cell, serves the checker's reads of its globals and
    calls of its functions, and shows the checker's feedback. The checker's record of the
    cell is what earns its points, whatever happens here."""
    sock = connect()
    if sock is None:  # pragma: no cover - only run under grading
        raise RuntimeError(f"${SOCKET_ENV} is not set")
    with sock:
        agent = Agent(sock)
        wire.send_frame(sock, wire.pack({"op": "cell"}, []))
        while True:
            msg = agent.receive()
            if msg.get("op") == "verdict":
                break
            agent.answer(msg)
    if not msg.get("passed"):
        raise AssertionError(msg.get("message", ""))
    print(msg.get("message", ""))


def graded() -> bool:
    """Whether ``check`` in this process serves a checker (the kernel is being graded)."""
    return bool(os.environ.get(SOCKET_ENV)) and "attention_ref.trust.checker" not in sys.modules
