"""The decoder side of the encoder-decoder Transformer: notebook 07.

A decoder layer has three sub-layers, each wrapped in a residual connection and a
LayerNorm:

1. masked self-attention over the target prefix (a causal mask, so position ``t`` sees
   only positions ``<= t``; combined with target padding);
2. cross-attention: queries from the decoder, keys and values from the encoder output
   ``memory`` (masked by the source padding);
3. a position-wise feed-forward network.

``norm_first=False`` is the original "post-norm" layer, ``x = norm(x + sublayer(x))``;
``norm_first=True`` is "pre-norm", ``x = x + sublayer(norm(x))``, which trains more easily
in deep stacks and needs a final LayerNorm after the last layer.

Shapes: batch first; ``y (B, T, D)`` the target side, ``memory (B, S, D)`` the encoder
output. Masks are boolean, True = may attend: ``self_mask`` broadcastable to
``(B, H, T, T)``, ``memory_mask`` to ``(B, H, T, S)`` (e.g. ``(B, 1, 1, S)``).
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import require_tensor
from .encoder import FeedForward
from .multihead import MultiHeadAttention
from .weights import is_a, with_weights_of


def _check_layer_inputs(y: torch.Tensor, memory: torch.Tensor, d_model: int) -> None:
    require_tensor("y", y)
    require_tensor("memory", memory)
    if y.dim() != 3 or y.shape[-1] != d_model:
        raise ValueError(
            f"y must be (batch, tgt_len, d_model={d_model}); got shape {tuple(y.shape)}"
        )
    if memory.dim() != 3 or memory.shape[-1] != d_model or memory.shape[0] != y.shape[0]:
        raise ValueError(
            f"memory must be (batch={y.shape[0]}, src_len, d_model={d_model}), the encoder "
            f"output for the same batch as y; got shape {tuple(memory.shape)}"
        )


def _check_mask(name: str, mask: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """A bool mask broadcastable to ``shape`` = (B, H, n_q, n_k) (a 3-D mask is (B, n_q, n_k))."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor (True = may attend); got "
            f"{getattr(mask, 'dtype', type(mask).__name__)}"
        )
    m = mask.shape if mask.dim() != 3 else (mask.shape[0], 1, *mask.shape[1:])
    try:
        ok = tuple(torch.broadcast_shapes(m, shape)) == tuple(shape)
    except RuntimeError:
        ok = False
    if not ok or mask.dim() > 4:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to (batch, heads, n_q, "
            f"n_k) = {tuple(shape)}"
        )


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention, feed-forward.

    Attributes (the names ``from_torch`` and the notebook's check rely on): ``self_attn``
    and ``cross_attn`` (:class:`MultiHeadAttention`), ``ff`` (:class:`FeedForward`),
    ``norm1, norm2, norm3`` (``nn.LayerNorm(d_model)``) and ``dropout1..3``.

    forward(y ``(B, T, D)``, memory ``(B, S, D)``, self_mask, memory_mask) returns
    ``(out (B, T, D), self_weights (B, H, T, T), cross_weights (B, H, T, S))``.

    ``dropout`` is used as in ``nn.TransformerDecoderLayer``: on the attention weights of
    both attentions, inside ``ff`` and by ``dropout1..3``; in training mode the returned
    weights are the dropped ones. The two layers agree exactly in eval mode.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.norm_first = d_model, n_heads, norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _check_layer_inputs(y, memory, self.d_model)
        B, T, S, H = y.shape[0], y.shape[1], memory.shape[1], self.n_heads
        _check_mask("self_mask", self_mask, (B, H, T, T))
        _check_mask("memory_mask", memory_mask, (B, H, T, S))
        if self.norm_first:
            h = self.norm1(y)
            a, w_self = self.self_attn(h, h, h, self_mask)  # queries, keys, values: target
            y = y + self.dropout1(a)
            h = self.norm2(y)
            a, w_cross = self.cross_attn(h, memory, memory, memory_mask)  # k, v: encoder
            y = y + self.dropout2(a)
            y = y + self.dropout3(self.ff(self.norm3(y)))
        else:
            a, w_self = self.self_attn(y, y, y, self_mask)
            y = self.norm1(y + self.dropout1(a))
            a, w_cross = self.cross_attn(y, memory, memory, memory_mask)
            y = self.norm2(y + self.dropout2(a))
            y = self.norm3(y + self.dropout3(self.ff(y)))
        return y, w_self, w_cross

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """Copy the weights of a ``torch.nn.TransformerDecoderLayer`` (``batch_first=True``,
        ReLU activation, either norm order). Dropout is copied as a probability; in eval
        mode (or with ``dropout=0``) the outputs match."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(
                f"layer must be an nn.TransformerDecoderLayer; got {type(layer).__name__}"
            )
        if not layer.self_attn.batch_first:
            raise ValueError(
                "from_torch needs an nn.TransformerDecoderLayer built with batch_first=True "
                "(this course is batch first: (batch, seq, d_model))"
            )
        act = layer.activation
        if not (act is torch.nn.functional.relu or isinstance(act, nn.ReLU)):
            raise ValueError(f"from_torch supports the ReLU activation only; got {act!r}")
        d_model = layer.self_attn.embed_dim
        new = cls(
            d_model,
            layer.self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        )
        p = layer.linear1.weight
        new = new.to(device=p.device, dtype=p.dtype)
        new.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        new.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        new.ff.linear1.load_state_dict(layer.linear1.state_dict())
        new.ff.linear2.load_state_dict(layer.linear2.state_dict())
        for name in ("norm1", "norm2", "norm3"):
            src = getattr(layer, name)
            getattr(new, name).load_state_dict(src.state_dict())
            getattr(new, name).eps = src.eps
        return new.train(layer.training)


class Decoder(nn.Module):
    """A stack of decoder layers and a final LayerNorm (``final_norm``; ``nn.Identity`` when
    not wanted). It works on embedded targets; :class:`attention_ref.Transformer` adds the
    embeddings.

    forward(y ``(B, T, D)``, memory ``(B, S, D)``, self_mask, memory_mask) returns
    ``(out (B, T, D), self_weights, cross_weights)``, the last two lists with one
    ``(B, H, T, T)`` / ``(B, H, T, S)`` tensor per layer.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        final_norm: bool | None = None,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1; got {n_layers}")
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        use_norm = norm_first if final_norm is None else final_norm
        self.final_norm = nn.LayerNorm(d_model) if use_norm else nn.Identity()

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        self_ws, cross_ws = [], []
        for layer in self.layers:
            y, w_self, w_cross = layer(y, memory, self_mask, memory_mask)
            self_ws.append(w_self)
            cross_ws.append(w_cross)
        return self.final_norm(y), self_ws, cross_ws


def with_layers_of(model: nn.Module, layer: type[nn.Module]) -> nn.Module:
    """``model`` with every :class:`DecoderLayer` in it replaced, in place, by a module of
    the class ``layer`` (the learner's ``DecoderLayer(d_model, n_heads, d_ff,
    dropout=..., norm_first=...)``) holding that layer's weights
    (:func:`~attention_ref.weights.with_weights_of`): the same model, computed by the
    learner's layers. As the notebook's check grades the layer, its attention and
    feed-forward parts (earlier notebooks' exercises) are copies of the course's. Returns
    ``model``, or its replacement when ``model`` is itself a ``DecoderLayer``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: as ``with_weights_of``, when the learner's layer has other parameters.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")

    def replacement(old: DecoderLayer) -> nn.Module:
        sizes = (old.d_model, old.n_heads, old.ff.linear1.out_features)
        # dropout and norm_first by keyword, as the check builds the learner's layer
        return with_weights_of(
            old,
            layer,
            *sizes,
            dropout=old.dropout1.p,
            norm_first=old.norm_first,
            keep=("self_attn", "cross_attn", "ff"),
        )

    if is_a(model, DecoderLayer):
        return replacement(model)
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if is_a(child, DecoderLayer)
    ]
    new = [replacement(child) for _, _, child in found]  # all built before any goes in
    for (parent, name, _), module in zip(found, new, strict=True):
        setattr(parent, name, module)
    return model
