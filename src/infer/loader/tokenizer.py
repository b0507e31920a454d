"""The tokenizer: a Rust `tokenizers` backend plus the special tokens generation needs. It imports neither
transformers nor torch, and pickles (as its tokenizer.json) so the engine core hands the API servers the very
tokenizer it loaded (transformers, used to read an HF directory, may rewrite the backend's post-processor)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer as Backend

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

# End-of-turn markers of the chat formats infer serves; chat models stop on them, not only on EOS.
CHAT_STOP_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback (Gemma)


@dataclass(frozen=True)
class SpecialTokens:
    """The checkpoint's named special tokens (their text), as its tokenizer config declares them."""

    bos: str | None = None
    eos: str | None = None
    unk: str | None = None
    pad: str | None = None


def _eos_ids(value: int | list[int] | None) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list) else {int(value)}


def _rebuild(backend_json: str, eos_token_ids: frozenset[int], specials: SpecialTokens, chat_template: str | None,
             kind: str) -> Tokenizer:
    return Tokenizer(Backend.from_str(backend_json), eos_token_ids, specials, chat_template, kind)


class Tokenizer:
    """Encode/decode plus the ids generation needs (BOS, every EOS); decoding never cleans up spaces so streams add up.
    `kind`: the tokenizer class the checkpoint names (reported by /tokenizer_info)."""

    def __init__(self, backend: Backend, eos_token_ids: frozenset[int] = frozenset(),
                 specials: SpecialTokens = SpecialTokens(), chat_template: str | None = None,
                 kind: str = "PreTrainedTokenizerFast") -> None:
        backend.no_truncation()  # a tokenizer.json may carry them; generation never wants either
        backend.no_padding()
        self.backend = backend
        self.specials = specials
        self.kind = kind
        self._eos_token_ids = frozenset(eos_token_ids) | self._chat_stop_ids()
        self._chat_template = chat_template

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.backend.to_str(), self._eos_token_ids, self.specials, self._chat_template, self.kind)

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
        """Read by transformers (which applies tokenizer_config.json's BOS/EOS flags to the backend). EOS ids: the
        tokenizer's, generation_config.json's, and any chat end-of-turn special token."""
        from transformers import AutoTokenizer  # ~3 s to import; only HF directories need it

        hf = AutoTokenizer.from_pretrained(path)
        eos = _eos_ids(hf.eos_token_id)
        gen_config = path / "generation_config.json"
        if gen_config.exists():
            eos |= _eos_ids(json.loads(gen_config.read_text()).get("eos_token_id"))
        return cls.from_transformers(hf, frozenset(eos))

    @classmethod
    def from_transformers(cls, hf: PreTrainedTokenizerBase, eos_token_ids: frozenset[int] = frozenset()) -> Tokenizer:
        """A transformers fast tokenizer's backend and special tokens (its EOS among `eos_token_ids`)."""
        if not getattr(hf, "is_fast", False):
            raise ValueError(f"{type(hf).__name__} is a slow (Python) tokenizer; infer reads fast tokenizers only "
                             "(a checkpoint with a tokenizer.json)")
        template = hf.chat_template
        specials = SpecialTokens(hf.bos_token, hf.eos_token, hf.unk_token, hf.pad_token)
        backend = Backend.from_str(hf.backend_tokenizer.to_str())  # a copy: ours is changed (no truncation)
        return cls(backend, eos_token_ids | _eos_ids(hf.eos_token_id), specials,
                   template.get("default") if isinstance(template, dict) else template, type(hf).__name__)

    @classmethod
    def from_gguf(cls, path: Path) -> Tokenizer:
        """The GGUF's embedded vocabulary, BOS/EOS flags and chat template; EOS ids: its
        `tokenizer.ggml.eos_token_id` and any chat end-of-turn special token."""
        from infer.loader.gguf_tokenizer import vocabulary_from_gguf

        vocab = vocabulary_from_gguf(path)
        return cls(vocab.backend, vocab.eos_token_ids, SpecialTokens(**vocab.specials), vocab.chat_template)

    def to_transformers(self) -> PreTrainedTokenizerFast:
        """The same tokenizer as a transformers one (to `save_pretrained` it, or to hand it to HF code)."""
        from transformers import PreTrainedTokenizerFast

        specials = self.specials
        return PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(self.backend.to_str()), bos_token=specials.bos,
                                       eos_token=specials.eos, unk_token=specials.unk, pad_token=specials.pad,
                                       chat_template=self._chat_template, clean_up_tokenization_spaces=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; `add_special_tokens` adds the checkpoint's BOS/EOS (special-token text is always parsed)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def has_token(self, token: str) -> bool:
        """Whether `token` is one piece of the vocabulary (chat-template markers are looked up this way), without
        building a dict of the whole vocabulary (15 ms for SmolLM2's 49k)."""
        return self.backend.token_to_id(token) is not None

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.backend.id_to_token(i) for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A byte-level piece (GPT-2 style BPE: Llama 3, Qwen, SmolLM2) or a
        byte-fallback piece (`<0xE2>`) may hold part of a UTF-8 character, which its decoded text shows as U+FFFD;
        its bytes are read off the piece instead. An added token is its content. A SentencePiece piece is its text
        with `▁` as the space (decoded alone, a Llama-2-style decoder would strip that space); anything else its
        decoded text."""
        piece = self.backend.id_to_token(token_id)
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
        longest = max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)
        normalizer = str(self.backend.normalizer or "")
        return longest * (3 if "NF" in normalizer else 1)

    def _chat_stop_ids(self) -> set[int]:
        specials = {tok.content: i for i, tok in self.backend.get_added_tokens_decoder().items() if tok.special}
        return {specials[t] for t in CHAT_STOP_TOKENS if t in specials}

    @functools.cached_property
    def _added_tokens(self) -> dict[int, str]:
        return {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}

    @functools.cached_property
    def _byte_level_inverse(self) -> dict[str, int] | None:
        """Character -> byte of byte-level BPE's alphabet, when the tokenizer decodes that way; else None."""
        if type(self.backend.decoder).__name__ != "ByteLevel":
            return None
        return {c: b for b, c in _bytes_to_unicode().items()}

    @property
    def bos_token_id(self) -> int | None:
        return None if self.specials.bos is None else self.backend.token_to_id(self.specials.bos)

    @property
    def bos_token(self) -> str | None:
        return self.specials.bos

    @property
    def eos_token(self) -> str | None:
        return self.specials.eos

    @property
    def pad_token_id(self) -> int | None:
        return None if self.specials.pad is None else self.backend.token_to_id(self.specials.pad)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def embedded_chat_template(self) -> str | None:
        """The chat template the checkpoint ships (for reference; infer renders its own templates)."""
        return self._chat_template


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (the printable Latin-1 bytes as themselves,
    the rest shifted past 255), the map byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return dict(zip(printable, map(chr, chars)))
