"""The wire between the trusted checker and a graded kernel: framing and encodings.

Under grading, a check runs in the trusted checker process and the learner's code in the
kernel (:mod:`attention_ref.trust.remote`, :mod:`attention_ref.trust.agent`). They talk
over one Unix socket, in frames of an 8-byte length and a payload.

The two directions are encoded differently, on purpose:

- **checker -> kernel** is pickled. The kernel trusts the checker (it is the grader's own
  code), so the checker may send anything it would pass to the learner's code in the
  learner's own process: arrays, tensors, a reference module, a table of a check.
  Handles of kernel objects travel as persistent ids, and a checker-side function that
  cannot be pickled (a closure) as a callback the kernel calls back across the wire.
- **kernel -> checker** is **data only**: :func:`encode` / :func:`decode`. A JSON tree of
  ``None``, ``bool``, ``int``, ``float``, ``str``, tuples, lists, dicts with string keys,
  NumPy arrays and torch tensors (dtype from an allowlist, the raw bytes copied), dtypes
  and devices; every other object becomes a *handle*: an id the kernel keeps, the name of
  its type, and what it is (a module, a callable, ...). Nothing is unpickled, no code is
  named or imported, no object of the kernel's reaches the checker: the checker builds
  fresh ``numpy.ndarray`` / ``torch.Tensor`` objects from bytes. A frame is at most
  :data:`MAX_FRAME` bytes.

This module imports only the standard library, NumPy and (lazily) torch.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import time
from typing import Any

import numpy as np

#: The largest frame either side accepts (a check's inputs are small; a frame near this
#: size is a kernel trying to exhaust the checker's memory).
MAX_FRAME = 256 * 2**20
#: The most bytes of arrays and tensors the checker builds from one frame: a buffer that
#: the tree references many times counts as many times (24 references to one 200 MB buffer
#: would otherwise take 4.8 GB from a 200 MB frame).
MAX_DECODED = MAX_FRAME
_LEN = struct.Struct("!Q")

#: dtypes that cross as raw bytes (anything else is a handle).
NP_DTYPES = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
}
TORCH_DTYPES = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
}
#: How deep a container may nest before the rest of it becomes a handle.
MAX_DEPTH = 32
#: The devices a tensor may name (anything else is malformed, not PyTorch's to parse).
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu)(:[0-9]{1,3})?")


class WireError(RuntimeError):
    """The other side broke the protocol, or closed the connection."""


# ----------------------------------------------------------------------------- framing
def send_frame(sock: socket.socket, payload: bytes) -> None:
    if len(payload) > MAX_FRAME:
        raise WireError(f"a frame of {len(payload)} bytes is over the limit of {MAX_FRAME}")
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes from ``sock``; with a ``deadline`` (``time.monotonic()``), a
    :class:`WireError` once it passes, however slowly the bytes trickle in."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"a frame not received in time ({got} of {n} bytes came)")
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except TimeoutError:
            raise WireError(f"a frame not received in time ({got} of {n} bytes came)") from None
        if not chunk:
            raise WireError("the connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, deadline: float | None = None, limit: int = MAX_FRAME) -> bytes:
    """One frame; a :class:`WireError` when it announces more than ``limit`` bytes, or when
    it has not fully come by ``deadline`` (``time.monotonic()``; None: the socket's own
    timeout applies)."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline))
    if n > limit:
        raise WireError(f"a frame of {n} bytes announced, over the limit of {limit}")
    return _recv_exact(sock, n, deadline)


class FrameReader:
    """The first frame of one connection, read without ever waiting on it: the checker
    :meth:`feed` s it whatever bytes the connection has (a non-blocking socket), however
    few, and serves other connections meanwhile."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.size: int | None = None

    def feed(self, data: bytes) -> bytes | None:
        """Add ``data``; the whole frame once it has come (None until then). A
        :class:`WireError` when the frame announces more than the limit."""
        self.buf += data
        if self.size is None and len(self.buf) >= _LEN.size:
            (self.size,) = _LEN.unpack(bytes(self.buf[: _LEN.size]))
            if self.size > self.limit:
                raise WireError(
                    f"a frame of {self.size} bytes announced, over the limit of {self.limit}"
                )
        if self.size is not None and len(self.buf) >= _LEN.size + self.size:
            with memoryview(self.buf) as view:
                frame = bytes(view[_LEN.size : _LEN.size + self.size])
            self.buf = bytearray()
            return frame
        return None

    @property
    def wanted(self) -> int:
        """How many more bytes the frame needs (at least 1 before its length is known)."""
        if self.size is None:
            return _LEN.size - len(self.buf)
        return _LEN.size + self.size - len(self.buf)


# ----------------------------------------------------------------------------- kernel -> checker
def pack(tree: Any, buffers: list[bytes]) -> bytes:
    """One payload: a JSON header (the tree) and the raw buffers it points to."""
    header = json.dumps({"tree": tree, "sizes": [len(b) for b in buffers]}).encode()
    return _LEN.pack(len(header)) + header + b"".join(buffers)


def unpack(payload: bytes) -> tuple[Any, list[memoryview]]:
    if len(payload) < _LEN.size:
        raise WireError("a payload without a header")
    (n,) = _LEN.unpack(payload[: _LEN.size])
    end = _LEN.size + n
    if end > len(payload):
        raise WireError("a header longer than its payload")
    try:
        head = json.loads(payload[_LEN.size : end])
        sizes = [int(s) for s in head["sizes"]]
        tree = head["tree"]
    except (ValueError, KeyError, TypeError) as err:
        raise WireError(f"an unreadable header: {err}") from None
    if any(s < 0 for s in sizes) or end + sum(sizes) != len(payload):
        raise WireError("buffer sizes that do not add up to the payload")
    view, buffers, at = memoryview(payload), [], end
    for s in sizes:
        buffers.append(view[at : at + s])
        at += s
    return tree, buffers


class Encoder:
    """Kernel side: turns values into a data tree; every other object into a handle
    (``handle(obj)`` gives its id and description)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.buffers: list[bytes] = []

    def __call__(self, x: Any, depth: int = 0, *, refs: bool | str = False) -> Any:
        """``refs``: True, tensors also carry a handle, so that the checker can change them
        in place (a module's parameters); ``"results"``, only tensors that autograd can
        differentiate (the checker may ask for their gradients); False, plain data."""
        t = type(x)
        if x is None or t is bool or t is str:
            return {"t": "v", "v": x}
        if t is int:
            return {"t": "v", "v": x} if abs(x) < 2**63 else {"t": "bigint", "v": str(x)}
        if t is float:
            return {"t": "float", "v": x.hex()}
        if depth >= MAX_DEPTH:
            return self.handle(x)
        if t is tuple or t is list:
            return {"t": t.__name__, "v": [self(v, depth + 1, refs=refs) for v in x]}
        if t is dict and all(type(k) is str for k in x):
            return {"t": "dict", "v": [[k, self(v, depth + 1, refs=refs)] for k, v in x.items()]}
        if isinstance(x, np.ndarray | np.generic):
            arr = np.asarray(x)  # an ndarray subclass crosses as the plain array it holds
            if arr.dtype.name in NP_DTYPES:
                self.buffers.append(np.ascontiguousarray(arr).tobytes())
                return {
                    "t": "nd" if isinstance(x, np.ndarray) else "npscalar",
                    "dtype": arr.dtype.name,
                    "shape": list(arr.shape),
                    "buf": len(self.buffers) - 1,
                }
            return self.handle(x)
        torch = _torch()
        if torch is not None:
            if isinstance(x, torch.Tensor):
                return self._tensor(x, refs)
            if t is torch.dtype:
                return {"t": "dtype", "v": str(x).removeprefix("torch.")}
            if t is torch.device:
                return {"t": "device", "v": str(x)}
            if t is torch.Size:
                return {"t": "size", "v": [int(v) for v in x]}
        return self.handle(x)

    def _tensor(self, x, refs: bool | str) -> Any:
        torch = _torch()
        dtype = str(x.dtype).removeprefix("torch.")
        plain = type(x) is torch.Tensor or type(x) is torch.nn.Parameter
        if (
            not plain
            and refs is not True
            and not isinstance(x, torch.nn.parameter.UninitializedTensorMixin)
        ):
            try:  # a subclass crosses as the plain tensor it holds
                x = x.as_subclass(torch.Tensor)
                plain = type(x) is torch.Tensor
            except Exception:  # noqa: BLE001 - then it is a handle
                plain = False
        if not plain or x.layout != torch.strided or dtype not in TORCH_DTYPES:
            return self.handle(x)
        node = {
            "t": "tensor",
            "dtype": dtype,
            "shape": list(x.shape),
            "device": str(x.device),
            "param": type(x) is torch.nn.Parameter,
            "grad": bool(x.requires_grad),
        }
        if refs is True or (refs == "results" and x.grad_fn is not None):
            node["ref"] = self.handle(x)["id"]
            node["fn"] = x.grad_fn is not None
        if x.device.type != "meta":
            data = x.detach().cpu().contiguous()
            if dtype == "bfloat16":
                data = data.view(torch.int16)
            self.buffers.append(data.numpy().tobytes())
            node["buf"] = len(self.buffers) - 1
        return node


def _torch():
    import sys

    return sys.modules.get("torch")


class Decoder:
    """Checker side: builds fresh values from a data tree; ``handle(node)`` makes the
    checker's stand-in for a kernel object (:class:`attention_ref.trust.remote.Remote`),
    ``tensor_ref(tensor, node)`` one for a tensor the kernel keeps."""

    def __init__(self, buffers: list[memoryview], handle, tensor_ref=None) -> None:
        self.buffers = buffers
        self.handle = handle
        self.tensor_ref = tensor_ref
        self.budget = MAX_DECODED  # bytes of arrays this frame may still make here

    def __call__(self, node: Any, depth: int = 0) -> Any:
        """The value of ``node``: a :class:`WireError` for anything malformed, whatever
        went wrong in building it (a device PyTorch does not know, a shape it refuses)."""
        if depth:
            return self._value(node, depth)
        try:
            return self._value(node, depth)
        except WireError:
            raise
        except RecursionError:
            raise WireError("a value nested too deep") from None
        except Exception as err:  # noqa: BLE001 - the kernel's malformed data, never a crash
            raise WireError(f"a malformed value ({type(err).__name__}: {err})"[:500]) from None

    def _value(self, node: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH + 1 or not isinstance(node, dict):
            raise WireError("a malformed value")
        t = node.get("t")
        if t == "v":
            v = node.get("v")
            if v is None or type(v) in (bool, int, str):
                return v
            raise WireError("a malformed plain value")
        if t == "bigint":
            return int(str(node["v"]))
        if t == "float":
            return float.fromhex(str(node["v"]))
        if t in ("tuple", "list"):
            items = [self._value(v, depth + 1) for v in _list(node["v"])]
            return tuple(items) if t == "tuple" else items
        if t == "dict":
            return {str(k): self._value(v, depth + 1) for k, v in _list(node["v"])}
        if t in ("nd", "npscalar"):
            dtype = str(node["dtype"])
            if dtype not in NP_DTYPES:
                raise WireError(f"an array of dtype {dtype!r}")
            arr = self._array(node, np.dtype(dtype))
            return arr[()] if t == "npscalar" else arr
        if t == "tensor":
            return self._tensor(node)
        import torch

        if t == "dtype":
            name = str(node["v"])
            if name not in TORCH_DTYPES and not hasattr(torch, name):
                raise WireError(f"an unknown dtype {name!r}")
            dt = getattr(torch, name, None)
            if not isinstance(dt, torch.dtype):
                raise WireError(f"an unknown dtype {name!r}")
            return dt
        if t == "device":
            name = str(node["v"])
            if not _DEVICE.fullmatch(name):
                raise WireError(f"an unknown device {name[:40]!r}")
            return torch.device(name)
        if t == "size":
            return torch.Size([int(v) for v in _list(node["v"])])
        if t in ("handle", "checker"):
            return self.handle(node)
        raise WireError(f"a value of unknown kind {t!r}")

    def _array(self, node: dict, dtype: np.dtype) -> np.ndarray:
        shape = tuple(int(s) for s in _list(node["shape"]))
        if any(s < 0 for s in shape):
            raise WireError("a negative dimension")
        index = int(node["buf"])
        if not 0 <= index < len(self.buffers):
            raise WireError("an array whose buffer is not in the frame")
        buf = self.buffers[index]
        n = 1
        for s in shape:
            n *= s
        if n * dtype.itemsize != len(buf):
            raise WireError("an array whose bytes do not match its shape")
        self.budget -= len(buf)
        if self.budget < 0:
            raise WireError(
                f"a frame whose arrays come to more than {MAX_DECODED} bytes (a buffer "
                "counts once for each time it is used)"
            )
        return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()

    def _tensor(self, node: dict):
        import torch

        dtype = str(node["dtype"])
        if dtype not in TORCH_DTYPES:
            raise WireError(f"a tensor of dtype {dtype!r}")
        shape = [int(s) for s in _list(node["shape"])]
        device = str(node.get("device", "cpu"))
        if "buf" not in node:
            x = torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
        else:
            np_dtype = np.dtype("int16" if dtype == "bfloat16" else dtype)
            arr = self._array(node, np_dtype)
            x = torch.from_numpy(arr)
            if dtype == "bfloat16":
                x = x.view(torch.bfloat16)
            if device != "cpu" and not device.startswith("meta"):
                with contextlib.suppress(RuntimeError, AssertionError):  # no such device
                    x = x.to(device)
        if node.get("param"):
            x = torch.nn.Parameter(x, requires_grad=bool(node.get("grad")))
        elif node.get("grad") and x.is_floating_point():
            x.requires_grad_(True)
        if "ref" in node and self.tensor_ref is not None:
            return self.tensor_ref(x, node)
        return x


def _list(v: Any) -> list:
    if not isinstance(v, list):
        raise WireError("a malformed list")
    return v
