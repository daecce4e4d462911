"""The batches a converted model's logits are compared on (tests/test_convert.py,
tests/test_convert_moe.py): 1, 7 and 33 tokens, and 12 tokens padded right and left."""

from __future__ import annotations

import torch

V = 97


def batches(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    out = [(torch.randint(0, V, (3, T), generator=g), None) for T in (1, 7, 33)]
    ids = torch.randint(0, V, (3, 12), generator=g)
    right = torch.ones(3, 12, dtype=torch.long)
    right[0, 8:] = 0
    right[2, 3:] = 0
    out += [(ids, right), (ids, right.flip(1))]  # right- and left-padded
    return out
