"""A reference part that lives in a graded kernel and is computed in the checker.

Some checks put a reference module inside the learner's: notebook 07's ``transformer`` is
graded with the course's ``DecoderLayer`` in place of the learner's, so that a bug in that
exercise costs its points once. A graded kernel holds none of its own notebook's answers,
so it cannot run that part's ``forward`` itself. A :class:`ComputedInChecker` holds the
part's submodules (its parameters live in the kernel, where the check loads weights into
them by name, as into any other part) and sends each call, with the weights it holds then
and its mode, to the checker, which computes the reference there.

The checker builds these and sends them to the kernel; ``compute`` is then a callback to
the checker. Outside grading (the learner's self-check) ``compute`` is a plain function,
and the checks put the reference module itself in place instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: compute(state, training, args, kwargs) -> what the reference's forward returns, where
#: state is the part's state_dict (its current weights, detached) and training its mode.
Compute = Callable[[dict[str, torch.Tensor], bool, tuple, dict], Any]
#: The types of the part's plain attributes (its settings) that are copied too.
SETTINGS = (bool, int, float, str)


class ComputedInChecker(nn.Module):
    """``part``'s submodules, parameters and buffers under their names, and a ``forward``
    that ``compute`` does: ``compute(state_dict, training, args, kwargs)``."""

    def __init__(self, part: nn.Module, compute: Compute) -> None:
        super().__init__()
        for name, child in part.named_children():
            self.add_module(name, child)
        for name, p in part.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in part.named_buffers(recurse=False):
            self.register_buffer(name, b)
        for name, value in vars(part).items():  # its settings (norm_first, d_model, ...)
            if not name.startswith("_") and name != "training" and type(value) in SETTINGS:
                setattr(self, name, value)
        self.compute = compute
        self.computes = type(part).__name__

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = {name: t.detach() for name, t in self.state_dict().items()}
        return self.compute(state, self.training, args, kwargs)

    def extra_repr(self) -> str:
        return f"{self.computes}, computed by the checker"
