"""argmax over the last dim of [rows, V], exactly torch.argmax (first index among equal maxima, first NaN wins).

torch.argmax reduces a row in one thread block: ~27 µs for one 128k-vocabulary row on an H100. Splitting the row
into chunks reduced side by side (max per chunk, then the first chunk holding the row maximum) takes a few.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=64)
def argmax_chunks(vocab: int) -> int:
    """Most chunks (<= 1024, each >= 128 ids) that split the vocabulary evenly; 1 if none does."""
    return next((d for d in range(min(1024, vocab // 128), 1, -1) if vocab % d == 0), 1)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of x [rows, V] (int64 [rows]), in two parallel passes where V splits into chunks."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax expects x [rows, V] with V >= 1, got shape {tuple(x.shape)}")
    rows, vocab = x.shape
    chunks = argmax_chunks(vocab)
    if chunks == 1 or x.stride(1) != 1:
        return x.argmax(dim=-1)
    values, within = x.view(rows, chunks, vocab // chunks).max(dim=-1)  # first maximum (or NaN) in each chunk
    chunk = values.argmax(dim=-1, keepdim=True)  # first chunk holding the row maximum
    return (chunk * (vocab // chunks) + within.gather(-1, chunk)).squeeze(-1)
