"""The Transformer encoder: notebook 06.

- ``FeedForward``: the position-wise network ``linear2(dropout(relu(linear1(x))))``, the
  same two-layer MLP applied to every token on its own.
- ``EncoderLayer``: self-attention and the feed-forward network, each wrapped in a
  residual connection, dropout and layer normalisation. Post-norm (the original paper,
  ``norm_first=False``) normalises after adding the residual; pre-norm
  (``norm_first=True``) normalises the input of each sublayer and leaves the residual
  path untouched.
- ``Encoder``: token embedding scaled by ``sqrt(d_model)``, sinusoidal positions, dropout
  and a stack of ``n_layers`` encoder layers (plus a final LayerNorm for pre-norm).

Embedding scale (one scheme for the whole course): as in tensor2tensor, the paper's authors'
code (the paper itself states only the sqrt(d_model) factor), the token embedding is
initialised ``N(0, 1/d_model)`` and multiplied by ``sqrt(d_model)`` in forward, so the
scaled token vectors have per-coordinate std 1, the same size as the sinusoidal positions
(values in [-1, 1], per-coordinate RMS about 0.71). ``nn.Embedding``'s own ``N(0, 1)``
initialisation would make the scaled tokens ``sqrt(d_model)`` times larger and drown the
positions. See :func:`init_embedding`.

Dropout, as in ``nn.TransformerEncoderLayer``: one probability for the attention weights
(inside ``MultiHeadAttention``), the hidden activations of the feed-forward network and
each sublayer's output before the residual add. In eval mode none is applied.

Shapes: batch first, ``(B, T, d_model)``. Masks are boolean, True = may attend,
broadcastable to ``(B, H, T, T)``; a padding mask is ``(B, 1, 1, T)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._validate import describe, require_tensor
from .multihead import MultiHeadAttention
from .positional import sinusoidal_encoding
from .weights import with_weights_of


def init_embedding(embed: nn.Embedding) -> nn.Embedding:
    """Rescale ``embed.weight`` in place from ``nn.Embedding``'s ``N(0, 1)`` to
    ``N(0, 1/d)`` (``d = embedding_dim``): multiplied by ``sqrt(d)`` in forward, a token
    vector then has per-coordinate std 1, like the sinusoidal positions it is added to.

    It rescales the weights ``nn.Embedding`` drew (no new random numbers), so seeded models
    draw the same random stream as before. Returns ``embed``.
    """
    with torch.no_grad():
        embed.weight.mul_(embed.embedding_dim**-0.5)
    return embed


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``FFN(x) = W_2 ReLU(W_1 x + b_1) + b_2``.

    Attributes ``linear1`` (``d_model -> d_ff``), ``linear2`` (``d_ff -> d_model``) and
    ``dropout`` (applied to the hidden activations, as in ``nn.TransformerEncoderLayer``).
    forward(x ``(..., d_model)``) returns ``(..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        d_model = self.linear1.in_features
        if x.dim() < 1 or x.shape[-1] != d_model:
            raise ValueError(f"x must be (..., d_model={d_model}); got shape {tuple(x.shape)}")
        hidden = torch.relu(self.linear1(x))  # (..., d_ff)
        return self.linear2(self.dropout(hidden))  # (..., d_model)


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention then the feed-forward network, each with a
    residual connection, dropout and LayerNorm.

    Post-norm (``norm_first=False``, the original paper)::

        x = norm1(x + dropout1(self_attn(x, x, x)))
        x = norm2(x + dropout2(ff(x)))

    Pre-norm (``norm_first=True``)::

        x = x + dropout1(self_attn(norm1(x)))
        x = x + dropout2(ff(norm2(x)))

    forward(x ``(B, T, d_model)``, mask bool broadcastable to ``(B, H, T, T)``, True = may
    attend) returns ``(out (B, T, d_model), weights (B, H, T, T))``; in training mode with
    ``dropout > 0`` the weights are the dropped ones the attention used.

    ``dropout`` is used three ways, as in ``nn.TransformerEncoderLayer``: on the attention
    weights (``self_attn``), inside ``ff`` and by ``dropout1``/``dropout2``. The two layers
    agree exactly in eval mode.
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
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        require_tensor("x", x)
        d_model = self.self_attn.d_model
        if x.dim() != 3 or x.shape[-1] != d_model:
            raise ValueError(
                f"x must be (batch, seq, d_model={d_model}); got shape {tuple(x.shape)}"
            )
        if self.norm_first:
            h = self.norm1(x)
            attn, weights = self.self_attn(h, h, h, mask)  # (B, T, D), (B, H, T, T)
            x = x + self.dropout1(attn)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            attn, weights = self.self_attn(x, x, x, mask)  # (B, T, D), (B, H, T, T)
            x = self.norm1(x + self.dropout1(attn))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """Copy the weights of a ``torch.nn.TransformerEncoderLayer`` built with
        ``batch_first=True`` and the ReLU activation (either ``norm_first``).

        The attention weights go through ``MultiHeadAttention.from_torch`` (which unpacks
        the packed ``in_proj_weight``); ``linear1``, ``linear2``, ``norm1`` and ``norm2``
        have the same names on both sides.
        """
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"layer must be an nn.TransformerEncoderLayer; got {describe(layer)}")
        if not layer.self_attn.batch_first:
            raise ValueError("from_torch needs an nn.TransformerEncoderLayer with batch_first=True")
        act = layer.activation
        if not (act is torch.nn.functional.relu or isinstance(act, nn.ReLU)):
            raise ValueError(f"from_torch supports activation='relu' only; got {act!r}")
        if layer.linear1.bias is None:
            raise ValueError("from_torch needs an nn.TransformerEncoderLayer with bias=True")
        w = layer.linear1.weight
        new = cls(
            d_model=layer.self_attn.embed_dim,
            n_heads=layer.self_attn.num_heads,
            d_ff=layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        ).to(device=w.device, dtype=w.dtype)
        new.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        new.norm1.eps, new.norm2.eps = layer.norm1.eps, layer.norm2.eps
        with torch.no_grad():
            for ours, theirs in (
                (new.ff.linear1, layer.linear1),
                (new.ff.linear2, layer.linear2),
                (new.norm1, layer.norm1),
                (new.norm2, layer.norm2),
            ):
                ours.weight.copy_(theirs.weight)
                ours.bias.copy_(theirs.bias)
        return new.train(layer.training)


class Encoder(nn.Module):
    """A stack of ``n_layers`` encoder layers over embedded tokens.

    ``x = dropout(embed(src) * sqrt(d_model) + PE[:S])``, with ``embed`` initialised
    ``N(0, 1/d_model)`` (tensor2tensor's scheme, see the module docstring), then each layer in
    turn, then ``final_norm`` (a LayerNorm for pre-norm, whose residual stream is never normalised
    otherwise; the identity for post-norm).

    forward(src ``(B, S)`` long token ids, mask optional bool broadcastable to
    ``(B, H, S, S)``; by default the padding mask ``(src != pad_id)`` as ``(B, 1, 1, S)``)
    returns ``(memory (B, S, d_model), weights)`` with ``weights`` a list of
    ``(B, H, S, S)``, one per layer.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        dropout: float = 0.0,
        max_len: int = 256,
        pad_id: int = 0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.embed = init_embedding(nn.Embedding(vocab_size, d_model))  # N(0, 1/d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def embed_tokens(self, src: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` ids -> ``(B, S, d_model)``: scaled embeddings plus positions, dropout."""
        S = src.shape[1]
        x = self.embed(src) * math.sqrt(self.d_model)  # (B, S, D)
        pe = self.pe[:S].to(device=x.device, dtype=x.dtype)  # (S, D)
        return self.dropout(x + pe)

    def forward(
        self, src: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        require_tensor("src", src, floating=False)
        if src.is_floating_point() or src.is_complex() or src.dtype == torch.bool:
            raise TypeError(f"src must hold integer token ids (torch.long); got {src.dtype}")
        if src.dim() != 2:
            raise ValueError(f"src must be (batch, seq) token ids; got shape {tuple(src.shape)}")
        if src.shape[1] > self.max_len:
            raise ValueError(
                f"src has seq length {src.shape[1]} (shape {tuple(src.shape)}) but the "
                f"encoder's max_len is {self.max_len}"
            )
        if mask is None:
            mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S): keys that are real
        x = self.embed_tokens(src)  # (B, S, D)
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask)  # (B, S, D), (B, H, S, S)
            weights.append(w)
        return self.final_norm(x), weights


def with_layers_of(encoder: Encoder, layer: type[nn.Module]) -> Encoder:
    """``encoder`` with each of its layers replaced, in place, by a module of the class
    ``layer`` (the learner's ``EncoderLayer(d_model, n_heads, d_ff, dropout=..., norm_first=...)``)
    holding that layer's weights (:func:`~attention_ref.weights.with_weights_of`): the same
    model, computed by the learner's code. Returns ``encoder``."""
    if not isinstance(getattr(encoder, "layers", None), nn.ModuleList):
        raise TypeError(
            f"encoder must be an Encoder, whose layers are an nn.ModuleList; got "
            f"{type(encoder).__name__}"
        )
    for i, old in enumerate(encoder.layers):
        d_model, n_heads = old.self_attn.d_model, old.self_attn.n_heads
        d_ff, dropout = old.ff.linear1.out_features, old.dropout1.p
        encoder.layers[i] = with_weights_of(
            old, layer, d_model, n_heads, d_ff, dropout=dropout, norm_first=old.norm_first
        )
    return encoder
