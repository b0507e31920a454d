"""A thin tokenizer facade over an HF fast tokenizer, loaded from an HF directory or a GGUF file."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from infer.loader.gguf_loader import gguf_value, open_gguf
from infer.loader.gguf_tokenizer import tokenizer_from_gguf

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# End-of-turn markers of the chat formats infer serves; chat models stop on them, not only on EOS.
CHAT_STOP_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback (Gemma)


def _eos_ids(value: int | list[int] | None) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list) else {int(value)}


def _chat_stop_ids(hf: PreTrainedTokenizerBase) -> set[int]:
    specials = {tok.content: i for i, tok in hf.added_tokens_decoder.items() if tok.special}
    return {specials[t] for t in CHAT_STOP_TOKENS if t in specials}


class Tokenizer:
    """Encode/decode plus the ids generation needs (BOS, every EOS); decoding never cleans up spaces so streams add up."""

    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: frozenset[int]) -> None:
        self.hf = hf
        self._eos_token_ids = eos_token_ids
        # transformers' decode checks every id in Python first (~40 us a call); the Rust tokenizer does not
        self._backend = hf.backend_tokenizer if getattr(hf, "is_fast", False) else None

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """From an HF checkpoint directory or a .gguf file (whose embedded vocabulary is used)."""
        path = Path(path)
        if path.is_dir():
            return cls.from_hf_dir(path)
        if path.suffix == ".gguf":
            return cls.from_gguf(path)
        raise ValueError(f"{path} is neither an HF checkpoint directory nor a .gguf file")

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        """EOS ids: the tokenizer's, generation_config.json's, and any chat end-of-turn special token."""
        from transformers import AutoTokenizer  # ~3 s to import; only HF directories need it

        hf = AutoTokenizer.from_pretrained(path)
        eos = _eos_ids(hf.eos_token_id) | _chat_stop_ids(hf)
        gen_config = path / "generation_config.json"
        if gen_config.exists():
            eos |= _eos_ids(json.loads(gen_config.read_text()).get("eos_token_id"))
        return cls(hf, frozenset(eos))

    @classmethod
    def from_gguf(cls, path: Path) -> Tokenizer:
        """EOS ids: the GGUF's `tokenizer.ggml.eos_token_id` and any chat end-of-turn special token."""
        hf = tokenizer_from_gguf(path)
        eos = _eos_ids(gguf_value(open_gguf(path), "tokenizer.ggml.eos_token_id")) | _chat_stop_ids(hf)
        return cls(hf, frozenset(eos))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; `add_special_tokens` adds the checkpoint's BOS/EOS (special-token text is always parsed)."""
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def has_token(self, token: str) -> bool:
        """Whether `token` is one piece of the vocabulary (chat-template markers are looked up this way). The Rust
        tokenizer looks it up; `get_vocab()` would build a dict of the whole vocabulary (15 ms for SmolLM2's 49k)."""
        if self._backend is not None:
            return self._backend.token_to_id(token) is not None
        return token in self.hf.get_vocab()

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A byte-level piece (GPT-2 style BPE: Llama 3, Qwen, SmolLM2) or a
        byte-fallback piece (`<0xE2>`) may hold part of a UTF-8 character, which its decoded text shows as U+FFFD;
        its bytes are read off the piece instead. An added token is its content. A SentencePiece piece is its text
        with `▁` as the space (decoded alone, a Llama-2-style decoder would strip that space); anything else its
        decoded text."""
        piece = self.hf.convert_ids_to_tokens(token_id)
        inverse = self._byte_level_inverse
        byte = _BYTE_PIECE.fullmatch(piece) if piece is not None and inverse is None else None
        if byte is not None:  # as the byte-fallback decoder reads it, an added token or not
            return bytes([int(byte.group(1), 16)])
        added = self._added_tokens.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        if piece is not None and inverse is not None and all(c in inverse for c in piece):
            return bytes(inverse[c] for c in piece)
        if piece is not None and "\u2581" in piece:
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """At most how many characters of text one token stands for: the longest vocabulary entry (byte-level and
        SentencePiece pieces are at least as long as their text), times 3 where a normalizer may compose characters
        (NFC/NFKC turn up to three code points into one). A longer text cannot fit that many tokens per character."""
        longest = max(map(len, self.hf.get_vocab()), default=1)
        normalizer = str(getattr(self._backend, "normalizer", None) or "")
        return longest * (3 if "NF" in normalizer or self._backend is None else 1)

    @functools.cached_property
    def _added_tokens(self) -> dict[int, str]:
        return {i: t.content for i, t in self.hf.added_tokens_decoder.items()}

    @functools.cached_property
    def _byte_level_inverse(self) -> dict[str, int] | None:
        """Character -> byte of byte-level BPE's alphabet, when the tokenizer decodes that way; else None."""
        slow = getattr(self.hf, "byte_decoder", None)  # a slow GPT-2 style tokenizer keeps the map itself
        if isinstance(slow, dict):
            return slow
        if type(getattr(self._backend, "decoder", None)).__name__ != "ByteLevel":
            return None
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        return {c: b for b, c in bytes_to_unicode().items()}

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def bos_token(self) -> str | None:
        return self.hf.bos_token

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, added tokens included."""
        return len(self.hf)

    @property
    def embedded_chat_template(self) -> str | None:
        """The chat template the checkpoint ships (for reference; infer renders its own templates)."""
        template = self.hf.chat_template
        if isinstance(template, dict):
            return template.get("default")
        return template
