"""Tokens, vocabularies, padding and batching for the application notebooks (08-10).

The course's data sets are small and already tokenised by their generators (a sentence is
a list of words), so tokenisation here is splitting on spaces. A :class:`Vocab` maps words
to integer ids with the special tokens first, so that ``<pad>`` is always id 0 (the
``pad_id=0`` every model of the course assumes)::

    vocab = Vocab.build(sentences)           # sentences: lists of words
    ids = vocab.encode(["the", "dog"], bos=True, eos=True)
    batch, mask = pad_batch([ids, ...])      # (B, T) long, (B, T) bool, True at tokens
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from .._validate import describe

PAD, BOS, EOS, UNK, SEP, CLS = "<pad>", "<bos>", "<eos>", "<unk>", "<sep>", "<cls>"
SPECIALS = (PAD, BOS, EOS, UNK, SEP, CLS)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, SEP_ID, CLS_ID = range(len(SPECIALS))


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it on whitespace (the generators' sentences are
    already spaced, punctuation included: ``"the dog sees a cat ."``)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str; got {describe(text)}")
    return text.lower().split()


class Vocab:
    """A bidirectional map between tokens and ids; the special tokens come first.

    ``Vocab.build(sentences)`` collects every token of ``sentences`` (lists of tokens or
    strings) in sorted order after the specials, so the ids are the same on every run.
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        if tokens[: len(SPECIALS)] != list(SPECIALS):
            raise ValueError(f"a Vocab's first tokens must be the specials {SPECIALS}")
        if len(set(tokens)) != len(tokens):
            dup = sorted({t for t in tokens if tokens.count(t) > 1})
            raise ValueError(f"tokens must be unique; repeated: {dup[:10]}")
        self.itos: list[str] = tokens
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(tokens)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str] | str]) -> Vocab:
        words: set[str] = set()
        for s in sentences:
            words.update(tokenize(s) if isinstance(s, str) else s)
        return cls(list(SPECIALS) + sorted(words - set(SPECIALS)))

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens: {' '.join(self.itos[len(SPECIALS) :][:8])} ...)"

    pad_id, bos_id, eos_id, unk_id, sep_id, cls_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID, SEP_ID, CLS_ID

    def encode(
        self, tokens: Sequence[str] | str, *, bos: bool = False, eos: bool = False
    ) -> list[int]:
        """Ids of ``tokens`` (unknown tokens become ``<unk>``), optionally wrapped in
        ``<bos>`` ... ``<eos>``."""
        if isinstance(tokens, str):
            tokens = tokenize(tokens)
        ids = [self.stoi.get(t, UNK_ID) for t in tokens]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def decode(self, ids: Iterable[int] | torch.Tensor, *, strip: bool = True) -> list[str]:
        """Tokens of ``ids``; with ``strip`` the output stops at the first ``<eos>`` and
        leaves out ``<pad>`` and ``<bos>``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if strip and i == EOS_ID:
                break
            if strip and i in (PAD_ID, BOS_ID):
                continue
            out.append(self.itos[i])
        return out


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a list of id sequences into one tensor.

    Args:
        sequences: ``B`` sequences of token ids (lists or 1-D integer tensors), of any
            lengths >= 0.
        pad_id: the id written after the end of each shorter sequence.

    Returns:
        ``(ids, mask)``: ``ids`` a long tensor ``(B, T)`` with ``T`` the longest length,
        row ``b`` holding ``sequences[b]`` followed by ``pad_id``; ``mask`` a bool tensor
        ``(B, T)``, True at the real tokens (the course's convention: True = may attend).
    """
    if isinstance(sequences, torch.Tensor) or not isinstance(sequences, Sequence):
        raise TypeError(f"sequences must be a list of id sequences; got {describe(sequences)}")
    if len(sequences) == 0:
        raise ValueError("sequences must hold at least one sequence; got an empty list")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer):
        raise TypeError(f"pad_id must be an int; got {describe(pad_id)}")
    rows = []
    for i, s in enumerate(sequences):
        t = torch.as_tensor(s if isinstance(s, torch.Tensor) else list(s), dtype=torch.long)
        if t.dim() != 1:
            raise ValueError(f"sequences[{i}] must be 1-D; got shape {tuple(t.shape)}")
        rows.append(t)
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), int(pad_id), dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)  # (B, T)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
        mask[b, : len(r)] = True
    return ids, mask


def batches(
    n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> Iterator[np.ndarray]:
    """Yield index arrays that split ``range(n)`` into batches of ``batch_size``, in a
    seeded random order when ``shuffle`` (one epoch)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]
