"""Figures the notebooks draw. Each function takes an optional ``ax`` and returns it, so a
notebook can place several figures side by side."""

from .cost import plot_attention_cost
from .efficiency import plot_causal_tiles, plot_decoding_times, plot_scaling
from .encoder import plot_layer_heads, plot_per_layer
from .heads import plot_heads
from .heatmaps import plot_attention, plot_mask
from .kernels import kernel_tiles, plot_kernel_tiles, plot_triton_bench
from .positional import plot_encoding, plot_encoding_dims, plot_similarity_by_distance
from .reading import plot_question_attention, plot_sentence_scores
from .scaling import plot_score_scaling
from .translation import plot_alignment

__all__ = ["plot_attention", "plot_mask"]
__all__ += ["plot_encoding", "plot_encoding_dims", "plot_similarity_by_distance"]
__all__ += ["plot_score_scaling"]
__all__ += ["plot_attention_cost"]
__all__ += ["plot_heads"]
__all__ += ["plot_question_attention", "plot_sentence_scores"]
__all__ += ["plot_alignment"]
__all__ += ["plot_layer_heads", "plot_per_layer"]
__all__ += ["plot_scaling", "plot_causal_tiles", "plot_decoding_times"]
__all__ += ["kernel_tiles", "plot_kernel_tiles", "plot_triton_bench"]
