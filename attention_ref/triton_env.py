"""Which Triton the course runs: the CPU interpreter where there is no GPU.

Triton reads ``TRITON_INTERPRET`` when ``triton.language`` is first imported (its standard
library's ``@triton.jit`` functions, ``tl.zeros`` and kin, are made for the interpreter or
for the compiler then), and PyTorch may import it on its own: the meta device's first use
loads ``torch._dynamo``, which imports ``triton.language``. So the setting is made before
either, here: by :mod:`attention_ref.triton_attention` and by the checks when they load (a
trusted checker that ran a meta-device case of an earlier notebook, and then notebook 14's
checks, once failed with "Cannot call @triton.jit'd outside of the scope of a kernel").
This module imports PyTorch, never Triton.
"""

from __future__ import annotations

import os
import tempfile

import torch


def use_interpreter_without_gpu() -> bool:
    """Select Triton's CPU interpreter when no CUDA device is present (before triton is
    imported, which reads the setting when a kernel is defined), and give Triton a writable
    cache directory; returns whether the interpreter is on. A setting already made wins."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    home = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"triton-cache-{os.getuid() if hasattr(os, 'getuid') else 0}"
    )
    os.environ.setdefault("TRITON_CACHE_DIR", home)
    return os.environ.get("TRITON_INTERPRET") == "1"
