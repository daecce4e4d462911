"""Figures the notebooks draw. Each function takes an optional ``ax`` and returns it, so a
notebook can place several figures side by side."""

from .heatmaps import plot_attention, plot_mask

__all__ = ["plot_attention", "plot_mask"]
