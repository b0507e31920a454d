"""Tokenize / detokenize references over a `tokenizers.Tokenizer`, and the tokenizer identity for cache keys.

Signatures (the canonical kernel signatures of the `tokenize` / `detokenize` ops):

    tokenize(texts: str | Sequence[str], tokenizer: Tokenizer, *, add_special_tokens: bool = True,
             return_offsets: bool = False) -> {"input_ids": list[int] | list[list[int]],
                                               "offsets": list[(start, end)] | list[list[(start, end)]]}
    detokenize(tokens: Sequence[int] | Sequence[Sequence[int]] | Tensor, tokenizer: Tokenizer, *,
               skip_special_tokens: bool = True) -> str | list[str]

A single string gives flat lists, a sequence of strings a list per text; "offsets" (character spans)
is present only when return_offsets=True. A flat token list decodes to one string, a nested one to a
list of strings.

tokenizer_identity(tokenizer) -> TokenizerIdentity: full 64-hex SHA-256 digests (
I.8) of the vocabulary, the merges, the added tokens, the normalizer, the pre-tokenizer and the special
tokens (special added tokens plus the post-processor that inserts them), and `tokenizer_id`, a digest
of the whole serialized tokenizer (model parameters, decoder, truncation and padding included). Two
tokenizers that could encode any text differently never share a tokenizer_id. It serializes the whole
tokenizer (milliseconds for a large vocabulary), so per-call users take cached_identity(tokenizer):
cached per tokenizer object, recomputed at once when the vocabulary size changes (added tokens), and
otherwise re-validated on a deterministic schedule (every 10th of the first 100 hits,
every 100th of the next 1000, every 1000th after), which catches in-place changes of the normalizer,
pre-tokenizer or post-processor.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tokenizers import Tokenizer


@dataclass(frozen=True)
class TokenizerIdentity:
    """SHA-256 digests of everything that decides a tokenizer's output; every field belongs in a cache key."""

    tokenizer_id: str
    vocab_hash: str
    merges_hash: str
    added_tokens_hash: str
    normalizer_id: str
    pretokenizer_id: str
    special_tokens_hash: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def tokenizer_identity(tokenizer: Tokenizer) -> TokenizerIdentity:
    """Hash the serialized tokenizer into its identity fields."""
    state = json.loads(tokenizer.to_str())
    model = state.get("model") or {}
    added = state.get("added_tokens") or []
    special = [token for token in added if token.get("special")]
    return TokenizerIdentity(
        tokenizer_id=_digest(state),
        vocab_hash=_digest([model.get("type"), model.get("vocab")]),
        merges_hash=_digest(model.get("merges")),
        added_tokens_hash=_digest(added),
        normalizer_id=_digest(state.get("normalizer")),
        pretokenizer_id=_digest(state.get("pre_tokenizer")),
        special_tokens_hash=_digest([special, state.get("post_processor")]),
    )


@dataclass
class _Cached:
    ref: weakref.ref
    vocab_size: int
    identity: TokenizerIdentity
    hits: int = 0


_SCHEDULE = ((100, 10), (1100, 100))  # (hits below, validate every n-th hit)
_STABLE_EVERY = 1000
_cache: dict[int, _Cached] = {}
_cache_lock = threading.Lock()
log = logging.getLogger("layerzero")


def _validation_due(hits: int) -> bool:
    every = next((n for below, n in _SCHEDULE if hits < below), _STABLE_EVERY)
    return hits % every == 0


def _forget(key: int, ref: weakref.ref) -> None:
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None and entry.ref is ref:
            del _cache[key]


def cached_identity(tokenizer: Tokenizer) -> TokenizerIdentity:
    """tokenizer_identity(tokenizer), cached per tokenizer object with adaptive re-validation (see module doc)."""
    key = id(tokenizer)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    entry = _cache.get(key)
    if entry is None or entry.ref() is not tokenizer or entry.vocab_size != size:
        identity = tokenizer_identity(tokenizer)
        ref = weakref.ref(tokenizer, lambda r, key=key: _forget(key, r))
        with _cache_lock:
            _cache[key] = _Cached(ref, size, identity)
        return identity
    entry.hits += 1
    if _validation_due(entry.hits):
        fresh = tokenizer_identity(tokenizer)
        if fresh != entry.identity:
            log.warning("layerzero: tokenizer %s changed in place; cache identity refreshed", fresh.tokenizer_id)
            entry.identity = fresh
    return entry.identity


def tokenize(
    texts: str | Sequence[str],
    tokenizer: Tokenizer,
    *,
    add_special_tokens: bool = True,
    return_offsets: bool = False,
) -> dict[str, list]:
    """Encode one text or a batch of texts into token ids (and character offsets when asked)."""
    single = isinstance(texts, str)
    encodings = tokenizer.encode_batch([texts] if single else list(texts), add_special_tokens=add_special_tokens)
    out: dict[str, list] = {"input_ids": [e.ids for e in encodings]}
    if return_offsets:
        out["offsets"] = [list(e.offsets) for e in encodings]
    return {name: value[0] for name, value in out.items()} if single else out


def detokenize(
    tokens: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor,
    tokenizer: Tokenizer,
    *,
    skip_special_tokens: bool = True,
) -> str | list[str]:
    """Decode a flat token list to a string, or a batch (nested lists or a 2-D tensor) to a list of strings."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    if ids and isinstance(ids[0], (list, tuple)):
        return tokenizer.decode_batch([list(row) for row in ids], skip_special_tokens=skip_special_tokens)
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
