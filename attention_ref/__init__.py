"""Attention from Scratch: the reference package behind the course notebooks.

- reference implementations of every function exercise, under the exercise's id
  (``attention_ref.sdpa`` is the reference for the exercise ``sdpa``);
- ``attention_ref.checks.check(exercise_id, candidate)``, the self-check and autograder;
- ``attention_ref.data``: small, deterministic data sets generated on the spot;
- ``attention_ref.plots``: the figures the notebooks draw.
"""

import importlib
import importlib.util

# What each submodule exports here, loaded on first use (PEP 562): the grading command, its
# Dask workers and the other course tools import attention_ref.course, which needs no
# PyTorch; importing all of this eagerly cost each of those processes a second of CPU.
# `from attention_ref import sdpa` and `attention_ref.sdpa` work as before.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "apps.qa": ("best_span", "span_loss"),
    "apps.summarization": ("pool_sentences", "select_sentences"),
    "apps.translation": ("beam_search", "bleu", "exact_match", "greedy_search", "make_batch"),
    "attention": ("sdpa", "sdpa_np", "softmax_np"),
    "decoder": ("Decoder", "DecoderLayer"),
    "efficient": ("naive_attention", "online_softmax", "online_softmax_attention"),
    "encoder": ("Encoder", "EncoderLayer", "FeedForward"),
    "experts": ("MoEFeedForward", "deepseek_route", "load_balancing_loss", "route"),
    "flash": ("FlashAttention", "flash_attention"),
    "gpt": ("GPT", "GPTBlock", "GroupedQueryAttention"),
    "kv_cache": ("KVCache", "cached_self_attention"),
    "latent_attention": ("MultiHeadLatentAttention", "absorbed_scores"),
    "masking": ("causal_mask", "masked_softmax", "padding_mask"),
    "modern": ("ModernBlock", "ModernGPT", "RMSNorm", "RotaryAttention", "SwiGLU"),
    "multihead": ("MultiHeadAttention", "merge_heads", "split_heads"),
    "positional": ("offset_rotation", "rope", "sinusoidal_encoding"),
    "sampling": ("generate", "sample_next_token"),
    "self_attention": ("SelfAttention", "self_attention_cost"),
    "sliding_window": (
        "RollingKVCache",
        "SinkAttention",
        "SlidingWindowAttention",
        "rolling_append",
        "sliding_window_mask",
    ),
    "training": ("masked_cross_entropy",),
    "transformer": (
        "Transformer",
        "TransformerCore",
        "greedy_decode",
        "shift_right",
        "teacher_forcing_loss",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    """An exported name or a submodule, imported on first use."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__version__ = "0.1.0"

__all__ = list(_MODULE_OF)
