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

tokenizer_identity(tokenizer) -> TokenizerIdentity: full 64-hex SHA-256 digests (spec §3.2, appendix
I.8) of the vocabulary, the merges, the added tokens, the normalizer, the pre-tokenizer and the special
tokens (special added tokens plus the post-processor that inserts them), and `tokenizer_id`, a digest
of the whole serialized tokenizer (model parameters, decoder, truncation and padding included). Two
tokenizers that could encode any text differently never share a tokenizer_id. It serializes the whole
tokenizer, so compute it once per tokenizer and again only after the tokenizer is changed.
"""

from __future__ import annotations

import hashlib
import json
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
