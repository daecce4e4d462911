"""The checker's side of a graded check: the check runs here, the learner's code there.

A :class:`Link` is one connection to a graded kernel (:mod:`attention_ref.trust.agent`).
The check's code runs in this process unchanged, on a :class:`Remote` stand-in for the
learner's function or class: calling it, reading or setting its attributes, iterating
over what it returns (a module's parameters) become requests to the kernel, and what comes
back is data (fresh arrays and tensors built from bytes, :mod:`attention_ref.trust.wire`)
or another stand-in. A stand-in's type has the name of the kernel object's type and
answers ``isinstance`` against the torch and course classes the kernel object is an
instance of, so the feedback names things as the self-check does. A parameter of the
learner's module is a :class:`RemoteTensor`: a tensor holding a copy of its values whose
in-place methods (``copy_``, ...) are applied to the kernel's tensor too.

Nothing the kernel sends is executed or unpickled here; a kernel that sends garbage,
stops answering or closes the connection makes the check fail (:class:`KernelGone`),
never the checker crash.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import socket
import sys
import time
from typing import Any

import torch

from . import wire

#: Seconds the checker waits for an answer beyond the kernel's own limit for the request.
GRACE = 30.0
#: The longest the checker waits for an answer to a request without a time limit.
NO_LIMIT_WAIT = 600.0
#: The longest one frame to the kernel may take to send (a kernel that stops reading).
SEND_WAIT = 60.0


class KernelGone(Exception):  # noqa: N818 - an event
    """The kernel stopped answering, closed the connection or broke the protocol."""


class KernelError(Exception):
    """A request of the checker's raised in the kernel (the learner's code, or an attribute
    it does not have): ``info`` is what the kernel said, as data."""

    def __init__(self, info: dict) -> None:
        self.info = info
        super().__init__(f"{info.get('type', 'Error')}: {info.get('message', '')}")


_ERRORS: dict[str, type] = {}


def kernel_error(info: dict) -> KernelError:
    """The kernel's error as an exception here: for the learner's code raising a built-in
    exception (``ValueError``, ``AttributeError``...), an instance of a class of that name
    that is both that built-in and a :class:`KernelError`, so that the check's own
    ``except ValueError`` and its feedback read it as in the learner's process."""
    import builtins

    name = info.get("type", "")
    base = getattr(builtins, name, None) if info.get("kind") == "raised" else None
    if not (isinstance(base, type) and issubclass(base, Exception)) or issubclass(
        base, StopIteration | StopAsyncIteration
    ):  # an iteration of the checker's own is never ended from the kernel
        return KernelError(info)
    cls = _ERRORS.get(name)
    if cls is None:
        text = {"__str__": lambda self: self.info.get("message", "")}
        cls = type(name, (KernelError, base), text)
        cls.__module__ = "builtins"
        _ERRORS[name] = cls
    err = cls.__new__(cls)
    err.info = info
    err.args = (info.get("message", ""),)
    return err


def _of_checks(obj: Any) -> bool:
    """Whether ``obj`` (a function or a class) is defined by the checks' own modules or by
    the trust machinery's (this package)."""
    mod = getattr(obj, "__module__", "") or ""
    return mod.startswith(("attention_ref.checks.", "attention_ref.trust.")) or mod in (
        "attention_ref.checks",
        "attention_ref.trust",
    )


class _Pickler(pickle.Pickler):
    """Pickles what the checker sends; kernel objects go as their ids, and a function that
    pickle cannot name (a closure, a lambda) as a callback the kernel calls back."""

    def __init__(self, buf, link: Link) -> None:
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.link = link

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Remote):
            return ("k", object.__getattribute__(obj, "_id"))
        if isinstance(obj, RemoteTensor):
            return ("k", obj._ref)
        if (
            (type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter)
            and obj.requires_grad
            and obj.is_leaf
        ):
            return ("leaf", self.link.leaf_key(obj), obj.detach().clone())
        # The checks' own objects stay here (the learner's code uses them by reference):
        # none of the checks' code runs in the kernel, so calling it can be forbidden there.
        by_reference = getattr(type(obj), "__by_reference__", False) or _of_checks(type(obj))
        if by_reference and not isinstance(obj, type | torch.nn.Module) and not callable(obj):
            return ("obj", self.link.register_callback(obj))
        if callable(obj) and not isinstance(obj, type | torch.nn.Module):
            qual = getattr(obj, "__qualname__", "") or ""
            if "<" in qual or not getattr(obj, "__module__", None) or _of_checks(obj):
                return ("cb", self.link.register_callback(obj))
        return None


class Link:
    """One connection to one graded kernel, for one check."""

    def __init__(self, sock: socket.socket, abort: int | None = None) -> None:
        self.sock = sock
        #: A file descriptor (the grader's orders) whose being readable ends the check: the
        #: cell is over, and no answer of its kernel is waited for any longer.
        self.abort = abort
        with contextlib.suppress(OSError):
            sock.settimeout(SEND_WAIT)  # a kernel that stops reading cannot hold a send
        self.seq = 0
        self.proxies: dict[int, Any] = {}
        self.tensors: dict[int, RemoteTensor] = {}
        self.callbacks: dict[int, Any] = {}
        #: The requests whose call the kernel's tripwire stopped (seq -> what it reached),
        #: as the kernel reported it the moment it fired.
        self.fired: dict[Any, str] = {}
        self.waiting: list[int] = []  # the requests whose answers are being waited for
        self.pending: BaseException | None = None
        self.limit: float | None = None  # the per-request limit of attribute reads
        self.exercise = ""
        #: In a test cell of plain asserts: the exercises whose forbidden functions the
        #: learner's calls may not reach (None: the exercise's own list).
        self.forbid: tuple[str, ...] | None = None
        self.dead: str = ""
        self.leaves: dict[int, torch.Tensor] = {}  # key -> the check's tensor
        self._leaf_keys: dict[int, int] = {}  # id(tensor) -> key
        self.watchers: list[Any] = []  # OpRecorder / PeakMemory the check watches with
        self.learner_limit: Any = None  # inside Context.call of a function of the check's
        self.queued: list[tuple] = []  # copies into kernel tensors not sent yet (flush)

    def leaf_key(self, t: torch.Tensor) -> int:
        key = self._leaf_keys.get(id(t))
        if key is None or self.leaves.get(key) is not t:
            key = len(self.leaves) + 1
            self.leaves[key] = t
            self._leaf_keys[id(t)] = key
        return key

    def learner_request(
        self,
        op: str,
        target: Any,
        args: tuple,
        kwargs: dict,
        limit: Any = "default",
        tripwire: bool = True,
    ) -> tuple[Any, Any]:
        """Run the learner's code in the kernel (``op``: call, grad, backward) as the
        self-check runs it: the per-call limit, the tripwire, the checker's random state,
        and the watchers the check has on; ``(result, input modified in place or None)``."""
        from ..efficient import KernelLoads, OpRecorder

        watch = [
            ["ops", w.keep_args]
            if isinstance(w, OpRecorder)
            else ["loads"]
            if isinstance(w, KernelLoads)
            else ["memory"]
            for w in self.watchers
        ]
        try:
            value, modified, extra = self.request(
                op,
                target,
                args=tuple(args),
                kwargs=dict(kwargs),
                limit=limit,
                exercise=self.exercise,
                tripwire=tripwire,
                **({"forbid": list(self.forbid)} if self.forbid is not None else {}),
                rng=torch.get_rng_state(),
                watch=watch,
            )
        except KernelError as err:
            self._name_the_callback_error(err)
            raise

        if isinstance(extra, dict):
            if isinstance(extra.get("rng"), torch.Tensor):
                torch.set_rng_state(extra["rng"])
            for w, seen in zip(self.watchers, extra.get("watched", []), strict=False):
                _merge(w, seen)
        self.raise_pending()
        return value, modified

    # -- sending
    def register_callback(self, fn: Any) -> int:
        key = len(self.callbacks) + 1
        self.callbacks[key] = fn
        return key

    def _send(self, msg: dict) -> None:
        buf = io.BytesIO()
        _Pickler(buf, self).dump(msg)
        wire.send_frame(self.sock, buf.getvalue())

    def request(self, op: str, target: Any = None, *, limit: Any = "default", **fields) -> Any:
        """Send one request; the decoded answer. Raises :class:`KernelError` with the
        kernel's error, or :class:`KernelGone`."""
        if self.dead:
            raise KernelGone(self.dead)
        if self.queued:
            self.flush()
        self.seq += 1
        seq = self.seq
        lim = self.limit if limit == "default" else limit
        msg = {"op": op, "seq": seq, "grad": torch.is_grad_enabled(), "limit": lim, **fields}
        if target is not None:
            msg["target"] = target
        try:
            self._send(msg)
            wait = NO_LIMIT_WAIT if lim is None else 4 * lim + GRACE
            return self._answer(seq, wait)
        except (KernelError, StopIteration):
            raise
        except (OSError, wire.WireError, ValueError, KeyError, TypeError) as err:
            self.dead = f"the kernel stopped answering the checker ({type(err).__name__}: {err})"
            raise KernelGone(self.dead) from None

    def flush(self) -> None:
        """Apply the queued copies into the kernel's tensors (loading a module's weights:
        one request for them all, made before any other request, so that the kernel sees
        them in order)."""
        batch, self.queued = self.queued, []
        with torch.no_grad():
            self.request("inplace_many", None, value=batch)

    def _receive(self, deadline: float, wait: float) -> bytes:
        """The kernel's next frame, by ``deadline`` (``time.monotonic()``): read as its
        bytes come, never blocking on them, and given up as soon as the grader's next order
        comes (the cell is over)."""
        import selectors

        reader = wire.FrameReader()
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.sock, selectors.EVENT_READ, "kernel")
            if self.abort is not None:
                sel.register(self.abort, selectors.EVENT_READ, "grader")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wire.WireError(f"no answer within {wait:g} s")
                events = sel.select(left)
                if any(key.data == "grader" for key, _ in events):
                    raise wire.WireError("the test cell ended before the check finished")
                if not events:
                    continue
                chunk = self.sock.recv(max(1, min(reader.wanted, 1 << 20)))
                if not chunk:
                    raise wire.WireError("the connection closed")
                frame = reader.feed(chunk)
                if frame is not None:
                    return frame
        finally:
            sel.close()

    def _answer(self, seq: int, wait: float) -> Any:
        self.waiting.append(seq)
        try:
            return self._await(seq, wait)
        finally:
            self.waiting.remove(seq)
            self.fired.pop(seq, None)

    def _await(self, seq: int, wait: float) -> Any:
        deadline = time.monotonic() + wait
        while True:
            tree, buffers = wire.unpack(self._receive(deadline, wait))
            if not isinstance(tree, dict):
                raise wire.WireError("an answer that is not a record")
            if "cb" in tree:
                self._serve_callback(tree, buffers)
                deadline = time.monotonic() + wait  # the kernel's call goes on
                continue
            if "fired" in tree:  # the call reached a forbidden function: told at once
                if tree.get("seq") in self.waiting:  # a request still waited for, only
                    self.fired.setdefault(tree["seq"], str(tree["fired"])[:300])
                continue
            if tree.get("seq") not in (seq, None):
                continue  # the late answer of a request the checker gave up on
            fired = self.fired.pop(seq, None)
            if fired is not None:  # whatever the kernel answers (its record can be reset)
                raise kernel_error({"kind": "reference", "name": fired})
            if "error" in tree:
                info = tree["error"]
                if not isinstance(info, dict):
                    raise wire.WireError("a malformed error")
                raise kernel_error({str(k): str(v) if k != "limit" else v for k, v in info.items()})
            if tree.get("stop"):
                raise StopIteration
            return self.decode(tree["ok"], buffers)

    def decode(self, node: Any, buffers) -> Any:
        return wire.Decoder(buffers, self._proxy, self._tensor_ref)(node)

    def _serve_callback(self, tree: dict, buffers) -> None:
        """The kernel uses an object of the check's (a callable, a watched cache): do it
        here, on the data the kernel sent."""
        obj = self.callbacks.get(int(tree["cb"]))
        try:
            if obj is None:
                raise wire.WireError("a callback the checker never gave")
            args = self.decode(tree["args"], buffers)
            kwargs = self.decode(tree["kwargs"], buffers)
            op = tree.get("op", "call")
            if op == "call":
                value = obj(*args, **kwargs)
            elif op == "method":
                name = str(tree.get("name", ""))
                if name.startswith("_"):
                    raise AttributeError(name)
                value = getattr(obj, name)(*args, **kwargs)
            elif op == "getattr":
                name = str(tree.get("name", ""))
                if name.startswith("_"):
                    raise AttributeError(name)
                value = getattr(obj, name)
                if callable(value) and not isinstance(value, type | torch.Tensor):
                    self._send({"op": "cb_result", "method": True})
                    return
            elif op == "len":
                value = len(obj)
            elif op == "getitem":
                value = obj[args[0]]
            else:
                raise wire.WireError(f"a callback op {op!r}")
        except BaseException as err:  # noqa: BLE001 - kept; the call fails with it
            if self.pending is None:
                self.pending = err
            self._send({"op": "cb_error", "message": type(err).__name__})
            return
        self._send({"op": "cb_result", "value": value})

    # -- stand-ins
    def _proxy(self, node: dict) -> Any:
        key = int(node["id"])
        if node.get("t") == "checker":  # one of the check's objects, given back
            if key not in self.callbacks:
                raise wire.WireError("an object the checker never gave")
            return self.callbacks[key]
        p = self.proxies.get(key)
        if p is None:
            p = _proxy_class(node)(self, key, node)
            self.proxies[key] = p
        return p

    def _tensor_ref(self, x: torch.Tensor, node: dict) -> torch.Tensor:
        key = int(node["ref"])
        t = self.tensors.get(key)
        if t is not None and t.shape == x.shape and t.dtype == x.dtype:
            with torch.no_grad():
                torch.Tensor.copy_(t, x)
            return t
        t = RemoteTensor.make(x, self, key, bool(node.get("fn")))
        self.tensors[key] = t
        return t

    def _name_the_callback_error(self, err: KernelError) -> None:
        """The learner's call failed because a callable of the check's raised here (the
        reference's own refusal of a bad input, say): the kernel knows only that, so the
        feedback takes this error's type and message, as the self-check shows them. An
        error that is not about the learner's input (the check's deadline, a broken link)
        is raised instead."""
        if err.info.get("kind") != "callback" or self.pending is None:
            return
        pending, self.pending = self.pending, None
        if not isinstance(pending, Exception) or isinstance(pending, wire.WireError):
            raise pending from None
        err.info.setdefault("type", type(pending).__name__)
        with contextlib.suppress(Exception):  # an exception whose str() raises
            err.info.setdefault("message", str(pending))

    def raise_pending(self) -> None:
        if self.pending is not None:
            err, self.pending = self.pending, None
            raise err


# ----------------------------------------------------------------------------- stand-ins
_CLASSES: dict[tuple, type] = {}
#: The stand-in classes kept for reuse, at most; a kernel that names a new class in every
#: handle (a million of them) empties the cache rather than fills the checker's memory.
CLASSES_KEPT = 2048


def _resolve(name: str) -> type | None:
    """A class of the checker's own, by ``module:qualname``, among modules already
    imported here (nothing is imported on a kernel's word)."""
    mod, _, qual = name.partition(":")
    if mod.startswith(("attention_ref.checks", "attention_ref.course", "attention_ref.trust")):
        return None  # never the checker's own classes
    obj: Any = sys.modules.get(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not in C


def _data_class(c: type) -> bool:
    """Whether ``c`` is a class whose objects cross only as data (a tensor, an array, a
    NumPy scalar) or one of Python's built-in types."""
    import numpy as np

    return issubclass(c, torch.Tensor | np.ndarray | np.generic) or c.__module__ == "builtins"


def _claimable(c: type) -> bool:
    """Whether a stand-in may answer ``isinstance`` against ``c``: only a class written in
    Python all the way down (``torch.nn.Module``, a course class). A class with a base made
    in C (a tensor, an array, a built-in type) is one the checker's C libraries read the
    memory of, and a stand-in claiming it would make them read garbage."""
    if c is object or _data_class(c):
        return False
    return all(b is object or b.__flags__ & _HEAPTYPE for b in c.__mro__) and not any(
        (b.__module__ or "").startswith("torch._C") for b in c.__mro__
    )


def _proxy_class(node: dict) -> type:
    # (a real class's method resolution order is a few dozen names long, each short)
    mro = tuple(str(n)[:300] for n in _list_of(node.get("mro", []))[:64])
    key = (str(node.get("type", "object"))[:100], mro, bool(node.get("is_type")))
    cls = _CLASSES.get(key)
    if cls is None:
        if len(_CLASSES) >= CLASSES_KEPT:
            _CLASSES.clear()  # the stand-ins made so far keep their classes
        resolved = [c for c in map(_resolve, mro) if c is not None]
        spoof = next((c for c in resolved if _claimable(c)), None)
        attrs: dict[str, Any] = {"__slots__": ()}
        base: type = Remote
        lazy = torch.nn.parameter.UninitializedTensorMixin in resolved
        if lazy:
            # A lazy module's parameter before its first call: ``is_lazy`` holds (the mixin
            # is plain Python); it is never a tensor here, and what it does runs there.
            attrs["__class__"] = property(lambda self: torch.nn.parameter.UninitializedTensorMixin)
        elif not node.get("is_type") and any(_data_class(c) for c in resolved if c is not object):
            # A tensor or an array that did not cross as data (a subclass that would not
            # let go, a layout or dtype the wire does not carry): nothing of it is used,
            # and it never passes for the data it claims to be.
            base = _Inert
        elif spoof is not None and not node.get("is_type"):
            attrs["__class__"] = property(lambda self, c=spoof: c)
        if node.get("is_type"):
            # A class of the kernel's: isinstance(x, type) holds, and issubclass against
            # the torch and course classes it derives from answers as in the kernel
            # (issubclass walks __bases__ of what is not a real class); never a data class.
            bases = tuple(
                c
                for c in map(_resolve, _list_of(node.get("bases", [])))
                if c is not None and not _data_class(c)
            )[:1] or (object,)
            attrs["__class__"] = property(lambda self: type)
            attrs["__bases__"] = property(lambda self, b=bases: b)
        cls = type(key[0], (base,), attrs)
        _CLASSES[key] = cls
    return cls


def _list_of(v: Any) -> list:
    if not isinstance(v, list):
        raise wire.WireError("a malformed description")
    return v


class Remote:
    """The checker's stand-in for an object in the kernel."""

    __slots__ = ("_link", "_id", "_desc")

    def __init__(self, link: Link, key: int, desc: dict) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_id", key)
        object.__setattr__(self, "_desc", desc)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in REMOTE_DUNDERS:
            raise AttributeError(name)
        link = object.__getattribute__(self, "_link")
        try:
            return link.request("getattr", self, name=name)
        except KernelError as err:
            if err.info.get("type") == "AttributeError":
                raise AttributeError(err.info.get("message", name)) from None
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        object.__getattribute__(self, "_link").request("setattr", self, name=name, value=value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return remote_call(self, args, kwargs)

    def __iter__(self):
        # One request: the kernel runs the iteration to its end (under the time limit)
        # and sends every item; the checks always iterate to the end.
        link = object.__getattribute__(self, "_link")
        return iter(link.request("list", self))

    def __next__(self) -> Any:
        return object.__getattribute__(self, "_link").request("next", self)

    def __len__(self) -> int:
        return int(object.__getattribute__(self, "_link").request("len", self))

    def __bool__(self) -> bool:
        return bool(object.__getattribute__(self, "_link").request("bool", self))

    def __contains__(self, value: Any) -> bool:
        return bool(object.__getattribute__(self, "_link").request("contains", self, value=value))

    def __getitem__(self, key: Any) -> Any:
        return object.__getattribute__(self, "_link").request("getitem", self, value=key)

    def __setitem__(self, key: Any, value: Any) -> None:
        link = object.__getattribute__(self, "_link")
        link.request("setitem", self, name=key, value=value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in the graded kernel>"


class _Inert(Remote):
    """The stand-in of a kernel object that claims to be a tensor or an array but did not
    cross as data: every use of it is a ``TypeError`` (nothing of it runs, here or in the
    kernel)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"a {type(self).__name__} that is not a plain tensor or array (it could not be "
            "read as data: a subclass, or a layout or dtype the checks do not take)"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._refuse()

    def __setattr__(self, name: str, value: Any) -> None:
        self._refuse()

    __call__ = __iter__ = __next__ = __len__ = __bool__ = _refuse
    __contains__ = __getitem__ = __setitem__ = _refuse


#: Dunder attributes a stand-in fetches from the kernel (others are the stand-in's own).
REMOTE_DUNDERS = {"__name__", "__qualname__", "__self__", "__func__", "__wrapped__"}


def describe(obj: Any) -> dict:
    """What the kernel told about a stand-in (``{}`` for anything else)."""
    return object.__getattribute__(obj, "_desc") if isinstance(obj, Remote) else {}


def is_remote_class(obj: Any, base: type) -> bool:
    """Whether a stand-in is a class in the kernel that subclasses ``base``."""
    d = describe(obj)
    return bool(d.get("is_type")) and f"{base.__module__}:{base.__qualname__}" in d.get("bases", [])


def is_remote(obj: Any) -> bool:
    return isinstance(obj, Remote)


def tensor_slots(module: Any, names: list[str]) -> dict[str, dict]:
    """Where each tensor ``name`` (dotted) of a kernel module lives, in one request:
    ``{"found": False}`` when its owner is not a submodule, else ``{"found": True, "sub":
    the owner, "parametrized": bool, "param": the parameter or None}`` (a parameter by
    reference: its in-place methods reach the kernel's tensor)."""
    link: Link = object.__getattribute__(module, "_link")
    found = link.request("slot", module, value=[str(n) for n in names])
    return dict(zip(names, found, strict=True))


def prepare(candidate: Any, exercise_id: str, limit: float | None) -> None:
    """Before a check of a learner's object in a kernel: the exercise (for the tripwire)
    and the time limit of every request about it."""
    prepare_active(candidate)
    if isinstance(candidate, Remote):
        link: Link = object.__getattribute__(candidate, "_link")
        link.exercise = exercise_id
        link.limit = limit


def remote_call(target: Any, args: tuple, kwargs: dict) -> Any:
    """Call a kernel object from the check's own code: inside ``Context.call`` (a function
    of the check's that calls the learner's code) as the learner's code, else as a method
    the check uses (building a module, moving it to a dtype)."""
    link: Link = object.__getattribute__(target, "_link")
    inside = link.learner_limit is not None
    limit = link.learner_limit[0] if inside else "default"
    value, _ = link.learner_request("call", target, args, kwargs, limit=limit, tripwire=inside)
    return value


def call_learner(target: Any, args: list, kwargs: dict, limit: float | None) -> tuple[Any, Any]:
    """``Context.call`` of a kernel object: run under ``limit`` and the exercise's
    tripwire; ``(result, index of an input it modified in place or None)``."""
    link: Link = object.__getattribute__(target, "_link")
    return link.learner_request("call", target, args, kwargs, limit=limit)


#: The link of the check running now (None in the self-check).
ACTIVE: list[Link] = []


class learner_code:  # noqa: N801 - used as a context manager, reads as what it marks
    """``with learner_code(limit):`` the check's own function calls the learner's code
    in the kernel: those calls get the per-call limit and the tripwire."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.saved: Any = None

    def __enter__(self) -> learner_code:
        if ACTIVE:
            self.saved = ACTIVE[-1].learner_limit
            ACTIVE[-1].learner_limit = (self.limit,)
        return self

    def __exit__(self, *exc: Any) -> None:
        if ACTIVE:
            ACTIVE[-1].learner_limit = self.saved


class watching:  # noqa: N801 - a context manager
    """``with watching(OpRecorder()) as rec:``: in the self-check the recorder watches this
    process; in a graded check it watches the kernel, call by call, and the records come
    back as data (evidence from inside the kernel, not a verdict)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def __enter__(self) -> Any:
        if ACTIVE:
            ACTIVE[-1].watchers.append(self.recorder)
            return self.recorder
        return self.recorder.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        if ACTIVE:
            ACTIVE[-1].watchers.remove(self.recorder)
            return False
        return self.recorder.__exit__(*exc)


def _merge(watcher: Any, seen: Any) -> None:
    from ..efficient import KernelLoads, OpRecord, OpRecorder

    if isinstance(watcher, KernelLoads):
        watcher.loaded += int(seen["loaded"])
        watcher.available = watcher.available or bool(seen["available"])
        watcher.dots |= {(str(a), str(b)) for a, b in seen.get("dots", [])}
    elif isinstance(watcher, OpRecorder):
        for name, shapes, flops, args in seen:
            shapes = tuple(tuple(int(d) for d in s) for s in shapes)
            watcher.ops.append(OpRecord(str(name), shapes, int(flops), tuple(args)))
    else:
        watcher.peak = max(watcher.peak, watcher.current + int(seen["peak"]))
        watcher.current += int(seen["current"])


def autograd_grad(outputs: Any, inputs: Any, grad_outputs: Any = None, allow_unused: bool = False):
    """``torch.autograd.grad``, also for outputs of the learner's code in a graded kernel
    (the backward pass then runs there, as the learner's code)."""
    outs = outputs if isinstance(outputs, tuple | list) else (outputs,)
    if not any(isinstance(o, RemoteTensor) for o in outs):
        return torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=allow_unused)
    link = next(o._link for o in outs if isinstance(o, RemoteTensor))
    limit = link.learner_limit[0] if link.learner_limit is not None else "default"
    value, _ = link.learner_request(
        "grad", None, (outputs, inputs, grad_outputs), {"allow_unused": allow_unused}, limit=limit
    )
    return tuple(value)


def _computed_here(fn: Any) -> Any:
    """``fn`` as the kernel sees it: a callback, so each call is computed here, in the
    checker, on the data the kernel sends (a graded kernel holds no reference of its own
    notebook's exercises). A reference class (a module the learner's ``__init__`` builds)
    goes as itself: its parameters must live in the kernel."""
    if isinstance(fn, type):
        return fn

    def reference(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    reference.__name__ = getattr(fn, "__name__", "reference")
    return reference


class reference_functions:  # noqa: N801 - a context manager
    """The kernel's side of :func:`attention_ref.checks.toolkit.reference_functions`: the
    learner's code in the kernel sees the reference ``functions`` under their names (each
    call computed here, in the checker, :func:`_computed_here`), restored on the way
    out."""

    def __init__(self, candidate: Any, functions: dict) -> None:
        self.link: Link = object.__getattribute__(candidate, "_link")
        self.candidate = candidate
        self.functions = {name: _computed_here(fn) for name, fn in functions.items()}
        self.token: Any = None

    def __enter__(self) -> None:
        self.token = self.link.request("swap", self.candidate, value=self.functions)

    def __exit__(self, *exc: Any) -> None:
        if self.token is not None and not self.link.dead:
            with contextlib.suppress(KernelError, KernelGone):
                self.link.request("restore", None, value=self.token)


def prepare_active(candidate: Any) -> None:
    """Make ``candidate``'s link the active one (or none, for the self-check)."""
    ACTIVE.clear()
    if isinstance(candidate, Remote):
        ACTIVE.append(object.__getattribute__(candidate, "_link"))


class _GradFn:
    """Stands for the kernel tensor's ``grad_fn`` (the graph lives in the kernel)."""

    def __repr__(self) -> str:
        return "<grad_fn in the graded kernel>"


_GRAD_FN = _GradFn()


class RemoteTensor(torch.Tensor):
    """A tensor of the learner's module (a parameter): a copy of its values here, and
    in-place methods that change the kernel's tensor as well."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def make(x: torch.Tensor, link: Link, ref: int, has_fn: bool = False) -> RemoteTensor:
        t = torch.Tensor._make_subclass(RemoteTensor, x.detach(), x.requires_grad)
        t._link = link
        t._ref = ref
        t._param = isinstance(x, torch.nn.Parameter)
        t._has_fn = has_fn
        return t

    @property
    def grad_fn(self):  # noqa: D102 - the kernel tensor's: a marker when it has one
        return _GRAD_FN if getattr(self, "_has_fn", False) else None

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """The learner's backward pass, in the kernel; the gradients of the check's tensors
        that crossed to the kernel come back to their ``.grad``."""
        link = self._link
        limit = link.learner_limit[0] if link.learner_limit is not None else "default"
        grads, _ = link.learner_request("backward", None, (self, gradient), {}, limit=limit)
        for key, g in grads.items():
            leaf = link.leaves.get(int(key))
            if leaf is not None and g is not None:
                leaf.grad = g if leaf.grad is None else leaf.grad + g

    def _remote_inplace(self, name: str, *args: Any) -> RemoteTensor:
        if name == "copy_" and not torch.is_grad_enabled():
            self._link.queued.append((self, name, args))  # sent with the next request
        else:
            self._link.request("inplace", self, name=name, args=args)
        with torch.no_grad():
            getattr(torch.Tensor, name)(self, *args)
        return self

    def copy_(self, src, non_blocking=False):  # noqa: D102
        value = torch.Tensor.detach(src).as_subclass(torch.Tensor).to(self.dtype)
        return self._remote_inplace("copy_", value)

    def fill_(self, value):  # noqa: D102
        return self._remote_inplace("fill_", value)

    def zero_(self):  # noqa: D102
        return self._remote_inplace("zero_")
