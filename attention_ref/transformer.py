"""The encoder-decoder Transformer, teacher forcing and greedy decoding: notebook 07.

- :class:`Transformer`: source tokens -> :class:`~attention_ref.encoder.Encoder` ->
  ``memory``; target prefix -> scaled embedding + sinusoidal positions -> decoder layers
  (causal self-attention, cross-attention to ``memory``) -> output projection to the
  target vocabulary.
- :class:`TransformerCore`: the part of the model that ``torch.nn.Transformer`` is (the two
  stacks, each with a final LayerNorm, no embeddings), with ``from_torch``.
- :func:`shift_right`, :func:`teacher_forcing_loss`: training on ``(src, tgt)`` pairs.
- :func:`greedy_decode`: generation that stops each sequence at its end-of-sequence token.
- :func:`make_reversal_data`, :func:`exact_match_rate`: a synthetic task for a sanity run.

Conventions: batch first; token ids are ``torch.long``; masks are boolean, True = may
attend. A source mask is ``(B, 1, 1, S)`` (the real source tokens), a target self mask
``(B, 1, T, T)`` (causal AND the real target tokens).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ._validate import describe
from .decoder import DecoderLayer
from .encoder import Encoder, EncoderLayer, init_embedding
from .positional import sinusoidal_encoding
from .training import masked_cross_entropy


def _check_ids(name: str, x, vocab: int | None = None, max_len: int | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids; got {describe(x)}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long); got {x.dtype}")
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"{name} must be (batch, seq) token ids, seq >= 1; got {tuple(x.shape)}")
    if max_len is not None and x.shape[1] > max_len:
        raise ValueError(
            f"{name} has seq length {x.shape[1]} (shape {tuple(x.shape)}) but the model's "
            f"max_len is {max_len}"
        )
    if vocab is not None and x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab):
        raise ValueError(
            f"{name} holds ids from {int(x.min())} to {int(x.max())}, outside the vocabulary "
            f"0 .. {vocab - 1}"
        )


def target_self_mask(tgt_in: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(B, 1, T, T)`` bool: query ``t`` may see key ``j`` iff ``j <= t`` (causal) and
    ``tgt_in[b, j]`` is not padding."""
    T = tgt_in.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).tril()  # (T, T)
    real = (tgt_in != pad_id)[:, None, None, :]  # (B, 1, 1, T)
    return causal & real  # (B, 1, T, T)


class Transformer(nn.Module):
    """An encoder-decoder Transformer for sequence-to-sequence tasks.

    Attributes: ``encoder`` (:class:`Encoder`: source embedding, positions, layers, its
    final norm), ``tgt_embed`` (``nn.Embedding(tgt_vocab, d_model)`` initialised
    ``N(0, 1/d_model)`` and scaled by ``sqrt(d_model)``, the scheme of
    :mod:`attention_ref.encoder`, as the source embedding), the buffer ``pe``
    (sinusoidal, ``(max_len, d_model)``), ``dropout``,
    ``decoder_layers`` (``nn.ModuleList`` of :class:`DecoderLayer`), ``final_norm``
    (``nn.LayerNorm`` when ``norm_first``, else ``nn.Identity``) and ``out_proj``
    (``nn.Linear(d_model, tgt_vocab)``, its own weights: NOT tied to ``tgt_embed``).

    - ``encode(src (B, S))`` -> ``(memory (B, S, D), src_mask (B, 1, 1, S))``;
    - ``decode(tgt_in (B, T), memory, src_mask)`` -> ``logits (B, T, tgt_vocab)``; with
      ``return_weights=True`` also ``{"self": [...], "cross": [...]}``, one
      ``(B, H, T, T)`` / ``(B, H, T, S)`` tensor per layer;
    - ``forward(src, tgt_in)`` -> logits: ``decode(tgt_in, *encode(src))``.
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 128,
        dropout: float = 0.0,
        max_len: int = 256,
        pad_id: int = 0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1; got {n_layers}")
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.encoder = Encoder(
            src_vocab, d_model, n_heads, d_ff, n_layers, dropout, max_len, pad_id, norm_first
        )
        self.tgt_embed = init_embedding(nn.Embedding(tgt_vocab, d_model))  # N(0, 1/d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.out_proj = nn.Linear(d_model, tgt_vocab)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src (B, S)`` -> ``(memory (B, S, D), src_mask (B, 1, 1, S))``, the mask True at
        real (non-padding) source tokens."""
        _check_ids("src", src, self.src_vocab, self.max_len)
        src_mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        memory, _ = self.encoder(src, src_mask)
        return memory, src_mask

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """Logits ``(B, T, tgt_vocab)`` for the next token after each prefix of
        ``tgt_in (B, T)`` (which starts with the begin-of-sequence token)."""
        _check_ids("tgt_in", tgt_in, self.tgt_vocab, self.max_len)
        T = tgt_in.shape[1]
        y = self.tgt_embed(tgt_in) * math.sqrt(self.d_model)  # (B, T, D)
        y = self.dropout(y + self.pe[:T].to(device=y.device, dtype=y.dtype))
        self_mask = target_self_mask(tgt_in, self.pad_id)  # (B, 1, T, T)
        weights: dict[str, list[torch.Tensor]] = {"self": [], "cross": []}
        for layer in self.decoder_layers:
            y, w_self, w_cross = layer(y, memory, self_mask, src_mask)
            weights["self"].append(w_self)  # (B, H, T, T)
            weights["cross"].append(w_cross)  # (B, H, T, S)
        logits = self.out_proj(self.final_norm(y))  # (B, T, tgt_vocab)
        return (logits, weights) if return_weights else logits

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """``src (B, S)``, ``tgt_in (B, T)`` -> logits ``(B, T, tgt_vocab)``."""
        _check_ids("src", src)
        _check_ids("tgt_in", tgt_in)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                f"src and tgt_in must have the same batch size; got src {tuple(src.shape)} "
                f"and tgt_in {tuple(tgt_in.shape)}"
            )
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)


class TransformerCore(nn.Module):
    """What ``torch.nn.Transformer`` computes: an encoder stack with a final LayerNorm and
    a decoder stack with a final LayerNorm, on already embedded inputs (``nn.Transformer``
    has no embeddings and no output projection, and always has both final norms).

    Attributes ``encoder_layers`` (:class:`EncoderLayer`), ``encoder_norm``,
    ``decoder_layers`` (:class:`DecoderLayer`), ``decoder_norm``.

    forward(src ``(B, S, D)``, tgt ``(B, T, D)``, src_mask ``(.., S, S)``, tgt_mask
    ``(.., T, T)``, memory_mask ``(.., T, S)``; bool, True = may attend) -> ``(B, T, D)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_encoder_layers: int,
        n_decoder_layers: int,
        dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
            for _ in range(n_encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(d_model)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
            for _ in range(n_decoder_layers)
        )
        self.decoder_norm = nn.LayerNorm(d_model)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = src
        for layer in self.encoder_layers:
            x, _ = layer(x, src_mask)
        memory = self.encoder_norm(x)  # (B, S, D)
        y = tgt
        for layer in self.decoder_layers:
            y, _, _ = layer(y, memory, tgt_mask, memory_mask)
        return self.decoder_norm(y)  # (B, T, D)

    @classmethod
    def from_torch(cls, model: nn.Transformer) -> TransformerCore:
        """Copy every weight of a ``torch.nn.Transformer`` built with ``batch_first=True``
        and ReLU. PyTorch's masks mean the opposite of ours: pass ``~mask`` to it (or its
        ``*_key_padding_mask`` arguments, True = padding)."""
        if not isinstance(model, nn.Transformer):
            raise TypeError(f"model must be an nn.Transformer; got {describe(model)}")
        enc = [EncoderLayer.from_torch(layer) for layer in model.encoder.layers]
        dec = [DecoderLayer.from_torch(layer) for layer in model.decoder.layers]
        first = model.encoder.layers[0]
        new = cls(
            model.d_model,
            model.nhead,
            first.linear1.out_features,
            len(enc),
            len(dec),
            first.dropout.p,
            first.norm_first,
        ).to(device=first.linear1.weight.device, dtype=first.linear1.weight.dtype)
        new.encoder_layers = nn.ModuleList(enc)
        new.decoder_layers = nn.ModuleList(dec)
        for ours, theirs in (
            ("encoder_norm", model.encoder.norm),
            ("decoder_norm", model.decoder.norm),
        ):
            if theirs is None:
                setattr(new, ours, nn.Identity())
            else:
                getattr(new, ours).load_state_dict(theirs.state_dict())
                getattr(new, ours).eps = theirs.eps
        return new.train(model.training)


# ----------------------------------------------------------------------------- training
def shift_right(tgt: torch.Tensor, bos_id: int) -> torch.Tensor:
    """The decoder input for teacher forcing: ``[bos] + tgt[:, :-1]`` along the SEQUENCE
    dimension (dim 1). ``tgt (B, T)`` -> ``(B, T)``; position ``t`` of the result holds the
    token the decoder has seen before predicting ``tgt[:, t]``."""
    _check_ids("tgt", tgt)
    bos = torch.full_like(tgt[:, :1], bos_id)  # (B, 1)
    return torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, T)


def teacher_forcing_loss(
    model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, bos_id: int
) -> torch.Tensor:
    """Mean cross-entropy of ``model(src, shift_right(tgt))`` against ``tgt``, ignoring
    the positions where ``tgt`` is padding (``model.pad_id``)."""
    logits = model(src, shift_right(tgt, bos_id))  # (B, T, V)
    return masked_cross_entropy(logits, tgt, tgt != model.pad_id)


# ----------------------------------------------------------------------------- decoding
@torch.no_grad()
def greedy_decode(
    model: nn.Module, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int
) -> torch.Tensor:
    """Generate with the most likely token at each step.

    Args:
        model: anything with ``encode(src) -> (memory, src_mask)``,
            ``decode(tgt_in, memory, src_mask) -> logits`` and ``pad_id`` (a
            :class:`Transformer`). It is run in eval mode; its mode is restored after.
        src: ``(B, S)`` source token ids.
        bos_id, eos_id: the begin- and end-of-sequence ids.
        max_len: the most tokens to generate per sequence (>= 1).

    Returns:
        ``(B, L)`` long, ``L <= max_len``: the generated tokens WITHOUT the leading
        ``bos``, each row up to and including its ``eos``, then ``pad_id``. A sequence
        stops at its own ``eos``; the loop stops when every sequence has (or at
        ``max_len``).
    """
    _check_ids("src", src)
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1; got {max_len!r}")
    pad_id = model.pad_id
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)
        B = src.shape[0]
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        out = []
        for _ in range(max_len):
            logits = model.decode(ys, memory, src_mask)  # (B, t, V)
            nxt = logits[:, -1].argmax(dim=-1)  # (B,)
            nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
            out.append(nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            finished = finished | (nxt == eos_id)
            if bool(finished.all()):
                break
        return torch.stack(out, dim=1)  # (B, L)
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------- sanity task
PAD, BOS, EOS = 0, 1, 2
N_SPECIAL = 3


def make_reversal_data(
    n: int,
    n_symbols: int = 10,
    min_len: int = 3,
    max_len: int = 8,
    seed: int = 0,
    task: str = "reverse",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic sequence-to-sequence task: copy or reverse a random sequence.

    Ids: ``PAD = 0``, ``BOS = 1``, ``EOS = 2``, symbols ``3 .. 3 + n_symbols - 1`` (so the
    vocabulary has ``n_symbols + 3`` ids, shared by source and target).

    Returns:
        ``src (n, max_len)``: the symbols, padded with ``PAD``; ``tgt (n, max_len + 1)``:
        the reversed (or copied) symbols, then ``EOS``, then ``PAD``.
    """
    if task not in ("reverse", "copy"):
        raise ValueError(f"task must be 'reverse' or 'copy'; got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len; got {min_len}, {max_len}")
    rng = np.random.default_rng(seed)
    src = np.full((n, max_len), PAD, dtype=np.int64)
    tgt = np.full((n, max_len + 1), PAD, dtype=np.int64)
    for i in range(n):
        L = int(rng.integers(min_len, max_len + 1))
        seq = rng.integers(N_SPECIAL, N_SPECIAL + n_symbols, size=L)
        src[i, :L] = seq
        tgt[i, :L] = seq[::-1] if task == "reverse" else seq
        tgt[i, L] = EOS
    return torch.from_numpy(src), torch.from_numpy(tgt)


def exact_match_rate(pred: torch.Tensor, tgt: torch.Tensor, pad_id: int = PAD) -> float:
    """The fraction of rows where ``pred`` equals ``tgt`` (after padding both with
    ``pad_id`` to the same length): every token up to and including ``eos`` is right and
    nothing follows it."""
    L = max(pred.shape[1], tgt.shape[1])
    p = torch.nn.functional.pad(pred, (0, L - pred.shape[1]), value=pad_id)
    t = torch.nn.functional.pad(tgt.to(pred.device), (0, L - tgt.shape[1]), value=pad_id)
    return float((p == t).all(dim=1).float().mean())


def make_reversal_split(
    n_train: int,
    n_test: int,
    n_symbols: int = 8,
    min_len: int = 3,
    max_len: int = 8,
    seed: int = 0,
    task: str = "reverse",
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Training and held-out sets of :func:`make_reversal_data`, the held-out sources
    never seen in training (so exact match on them measures generalisation, not memory).
    Returns ``((src_train, tgt_train), (src_test, tgt_test))``; the test set may have
    slightly fewer than ``n_test`` rows."""
    train = make_reversal_data(n_train, n_symbols, min_len, max_len, seed, task)
    src, tgt = make_reversal_data(n_test, n_symbols, min_len, max_len, seed + 1, task)
    seen = {tuple(row) for row in train[0].tolist()}
    fresh = torch.tensor([tuple(row) not in seen for row in src.tolist()], dtype=torch.bool)
    return train, (src[fresh], tgt[fresh])
