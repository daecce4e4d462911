"""Attention from Scratch: the reference package behind the course notebooks.

- reference implementations of every function exercise, under the exercise's id
  (``attention_ref.sdpa`` is the reference for the exercise ``sdpa``);
- ``attention_ref.checks.check(exercise_id, candidate)``, the self-check and autograder;
- ``attention_ref.data``: small, deterministic data sets generated on the spot;
- ``attention_ref.plots``: the figures the notebooks draw.
"""

from .attention import sdpa, sdpa_np, softmax_np
from .masking import causal_mask, masked_softmax, padding_mask
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .positional import offset_rotation, rope, sinusoidal_encoding
from .self_attention import SelfAttention, self_attention_cost

__version__ = "0.1.0"

__all__ = [
    "softmax_np",
    "sdpa_np",
    "sdpa",
    "padding_mask",
    "causal_mask",
    "masked_softmax",
    "SelfAttention",
    "self_attention_cost",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "sinusoidal_encoding",
    "rope",
    "offset_rotation",
]
