"""Build a tokenizer from a GGUF vocabulary so that it tokenizes the way llama.cpp (and the source model) does.

transformers' own GGUF tokenizer conversion is wrong for the models infer bundles: it turns Gemma's
SentencePiece-BPE vocabulary into a Unigram model (different ids, no BOS), drops SmolLM's per-digit
pre-tokenization, and reports the BOS token as EOS for BPE vocabularies.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from infer.loader.gguf_file import gguf_numbers, gguf_strings, gguf_value, open_gguf

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level_after(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# Llama 3 takes a pre-token that is a whole vocabulary entry as is (HF `ignore_merges`), and adds BOS by default.
_LLAMA3_NAMES = frozenset({"llama-bpe", "llama3", "llama-v3"})
# `tokenizer.ggml.pre` -> the pre-tokenizer of the HF tokenizer.json that llama.cpp's regexes reproduce.
_BPE_PRE_TOKENIZERS = {
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
    "qwen2": lambda: _byte_level_after(_QWEN2_PATTERN),
    **dict.fromkeys(_LLAMA3_NAMES, lambda: _byte_level_after(_LLAMA3_PATTERN)),
}
# Qwen's tokenizer.json NFC-normalizes its input (llama.cpp does not).
_NFC = frozenset({"qwen2"})


def _split_merge(merge: str) -> tuple[str, str]:
    """Split a stored merge "a b" into ("a", "b"); as in llama.cpp, at the first space after the first character."""
    i = merge.index(" ", 1)
    return merge[:i], merge[i + 1 :]


def _bpe_backend(reader: GGUFReader, tokens: list[str]) -> Backend:
    """Byte-level BPE (`tokenizer.ggml.model == "gpt2"`): merges are stored; the pre-tokenizer is named."""
    pre = gguf_value(reader, "tokenizer.ggml.pre")
    if pre not in _BPE_PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF BPE pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_BPE_PRE_TOKENIZERS))})"
        )
    merges = [_split_merge(m) for m in gguf_strings(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Backend(BPE(vocab, merges, ignore_merges=pre in _LLAMA3_NAMES))
    backend.pre_tokenizer = _BPE_PRE_TOKENIZERS[pre]()
    if pre in _NFC:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_merges(tokens: list[str], scores: np.ndarray, types: np.ndarray) -> list[tuple[str, str]]:
    """SentencePiece-BPE merge order: every split of a normal piece, ranked by the piece's score, best first.

    llama.cpp (like SentencePiece) repeatedly merges the adjacent pair whose concatenation is the
    highest-scoring piece; ranking each piece's splits by that score makes HF's BPE do the same.
    """
    vocab = set(tokens)
    order = np.lexsort((np.arange(len(tokens)), -scores))  # by score descending, then id
    merges: list[tuple[str, str]] = []
    for i in order[types[order] == TokenType.NORMAL]:
        piece = tokens[i]
        merges.extend(
            (piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab
        )
    return merges


def _spm_backend(reader: GGUFReader, tokens: list[str], types: np.ndarray) -> Backend:
    """SentencePiece BPE (`tokenizer.ggml.model == "llama"`, e.g. Gemma): merges are derived from piece scores."""
    if gguf_value(reader, "tokenizer.ggml.add_space_prefix", True):
        raise ValueError("SentencePiece GGUF vocabularies with add_space_prefix=true are not supported")
    scores = gguf_numbers(reader, "tokenizer.ggml.scores")
    if scores is None:
        raise ValueError("SentencePiece GGUF vocabulary has no tokenizer.ggml.scores")
    unk_id = gguf_value(reader, "tokenizer.ggml.unknown_token_id")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    model = BPE(
        vocab,
        _spm_merges(tokens, scores, types),
        unk_token=None if unk_id is None else tokens[unk_id],
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = Backend(model)
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return backend


def _add_vocab_tokens(backend: Backend, tokens: list[str], types: np.ndarray) -> None:
    """Control tokens become special tokens; user-defined ones are matched verbatim in raw text, as llama.cpp does."""
    special = np.isin(types, (TokenType.CONTROL, TokenType.UNKNOWN))
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in np.flatnonzero(special)])
    backend.add_tokens(
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i in np.flatnonzero(types == TokenType.USER_DEFINED)
        ]
    )


def _adds_bos_by_default(reader: GGUFReader, kind: str) -> bool:
    """llama.cpp's default when `tokenizer.ggml.add_bos_token` is absent: SentencePiece and Llama 3 add BOS."""
    return kind == "llama" or gguf_value(reader, "tokenizer.ggml.pre") in _LLAMA3_NAMES


class GGUFVocabulary(NamedTuple):
    """A GGUF's tokenizer: the Rust backend, its special tokens' text by role (bos, eos, unk, pad), its EOS id and
    its chat template."""

    backend: Backend
    specials: dict[str, str | None]
    eos_token_ids: frozenset[int]
    chat_template: str | None


def _add_bos_eos(backend: Backend, bos: str | None, eos: str | None) -> None:
    """A post-processor that puts BOS before (and EOS after) each sequence when `add_special_tokens` asks."""
    single = " ".join([*(f"{bos}:0",) * (bos is not None), "$A:0", *(f"{eos}:0",) * (eos is not None)])
    pair = " ".join([single, *(f"{bos}:1",) * (bos is not None), "$B:1", *(f"{eos}:1",) * (eos is not None)])
    special = [(t, backend.token_to_id(t)) for t in (bos, eos) if t is not None]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def vocabulary_from_gguf(path: str | Path) -> GGUFVocabulary:
    """The GGUF's embedded vocabulary, BOS/EOS flags and chat template."""
    reader = open_gguf(path)
    kind = gguf_value(reader, "tokenizer.ggml.model")
    tokens = gguf_strings(reader, "tokenizer.ggml.tokens")
    types = gguf_numbers(reader, "tokenizer.ggml.token_type")
    if types is None:
        types = np.full(len(tokens), int(TokenType.NORMAL))
    if kind == "gpt2":
        backend = _bpe_backend(reader, tokens)
    elif kind == "llama":
        backend = _spm_backend(reader, tokens, types)
    else:
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    _add_vocab_tokens(backend, tokens, types)

    def token(key: str) -> str | None:
        token_id = gguf_value(reader, f"tokenizer.ggml.{key}_token_id")
        return None if token_id is None else tokens[token_id]

    specials = {"bos": token("bos"), "eos": token("eos"), "unk": token("unknown"), "pad": token("padding")}
    bos = specials["bos"] if gguf_value(reader, "tokenizer.ggml.add_bos_token", _adds_bos_by_default(reader, kind)) else None
    eos = specials["eos"] if gguf_value(reader, "tokenizer.ggml.add_eos_token", False) else None
    if bos is not None or eos is not None:
        _add_bos_eos(backend, bos, eos)
    eos_id = gguf_value(reader, "tokenizer.ggml.eos_token_id")
    return GGUFVocabulary(backend, specials, frozenset(() if eos_id is None else (int(eos_id),)),
                          gguf_value(reader, "tokenizer.chat_template"))
