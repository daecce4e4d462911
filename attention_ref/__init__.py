"""Attention from Scratch: the reference package behind the course notebooks.

- reference implementations of every function exercise, under the exercise's id
  (``attention_ref.sdpa`` is the reference for the exercise ``sdpa``);
- ``attention_ref.checks.check(exercise_id, candidate)``, the self-check and autograder;
- ``attention_ref.data``: small, deterministic data sets generated on the spot;
- ``attention_ref.plots``: the figures the notebooks draw.
"""

from .apps.qa import best_span, span_loss
from .apps.summarization import pool_sentences, select_sentences
from .apps.translation import beam_search, bleu, exact_match, greedy_search, make_batch
from .attention import sdpa, sdpa_np, softmax_np
from .decoder import Decoder, DecoderLayer
from .efficient import naive_attention, online_softmax, online_softmax_attention
from .encoder import Encoder, EncoderLayer, FeedForward
from .experts import MoEFeedForward, load_balancing_loss, route
from .flash import FlashAttention, flash_attention
from .gpt import GPT, GPTBlock, GroupedQueryAttention
from .kv_cache import KVCache, cached_self_attention
from .latent_attention import MultiHeadLatentAttention, absorbed_scores
from .masking import causal_mask, masked_softmax, padding_mask
from .modern import ModernBlock, ModernGPT, RMSNorm, RotaryAttention, SwiGLU
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .positional import offset_rotation, rope, sinusoidal_encoding
from .sampling import generate, sample_next_token
from .self_attention import SelfAttention, self_attention_cost
from .sliding_window import (
    RollingKVCache,
    SinkAttention,
    SlidingWindowAttention,
    rolling_append,
    sliding_window_mask,
)
from .training import masked_cross_entropy
from .transformer import (
    Transformer,
    TransformerCore,
    greedy_decode,
    shift_right,
    teacher_forcing_loss,
)

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
    "naive_attention",
    "online_softmax",
    "online_softmax_attention",
    "FlashAttention",
    "flash_attention",
    "KVCache",
    "cached_self_attention",
    "GPT",
    "GPTBlock",
    "GroupedQueryAttention",
    "RMSNorm",
    "SwiGLU",
    "RotaryAttention",
    "ModernBlock",
    "ModernGPT",
    "sliding_window_mask",
    "rolling_append",
    "RollingKVCache",
    "SlidingWindowAttention",
    "SinkAttention",
    "MultiHeadLatentAttention",
    "absorbed_scores",
    "MoEFeedForward",
    "load_balancing_loss",
    "route",
    "sample_next_token",
    "generate",
    "FeedForward",
    "EncoderLayer",
    "Encoder",
    "DecoderLayer",
    "Decoder",
    "Transformer",
    "TransformerCore",
    "greedy_decode",
    "shift_right",
    "teacher_forcing_loss",
    "best_span",
    "span_loss",
    "pool_sentences",
    "select_sentences",
    "make_batch",
    "masked_cross_entropy",
    "beam_search",
    "greedy_search",
    "exact_match",
    "bleu",
]
