"""GGUF tokenizers: SmolLM2 agrees with transformers (bar digits), Gemma 3 with a llama.cpp-style SentencePiece reference."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf import GGUFWriter, TokenType
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

from infer.loader.gguf_file import gguf_numbers, gguf_strings, open_gguf
from infer.loader.tokenizer import SpecialTokens, Tokenizer

TEXTS = (
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "😀🎉 emoji 👩‍👩‍👧 family",
    "日本語のテキストと中文",
    "Ça va ? Crème brûlée, naïve façade — Ελληνικά, עברית.",
    "  leading,   inner   spaces\n\ttabs\n\n\n trailing  ",
    "def f(x):\n    return {'a': [x, x ** 2]}  # comment",
    "rare chars: \u0b85\u0bb5\u0bb0\u0bcd \U0001f9ec \u2603",
)
# Digits pre-tokenize differently in transformers' conversion (see below). Characters whose bytes SmolLM2's
# vocabulary lacks (C0 controls such as 0x04, planes 4+ with lead bytes 0xF1/0xF2) are dropped here, as by
# llama.cpp, while transformers emits <|endoftext|> as unk for them.
SMOLLM2_COMPARABLE = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc", "Nd", "Nl", "No"), max_codepoint=0x3FFFF), max_size=40
)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Tokenizer:
    return Tokenizer.from_path(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2_gguf: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def gemma3(gemma3_gguf: Path) -> Tokenizer:
    return Tokenizer.from_path(gemma3_gguf)


@pytest.fixture(scope="module")
def gemma3_transformers(gemma3_gguf: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(gemma3_gguf.parent, gguf_file=gemma3_gguf.name)


class SentencePieceReference:
    """llama.cpp's SPM tokenizer, transcribed: split out special/user-defined tokens, then greedy best-score merges."""

    def __init__(self, gguf: Path) -> None:
        reader = open_gguf(gguf)
        tokens = gguf_strings(reader, "tokenizer.ggml.tokens")
        self.scores = gguf_numbers(reader, "tokenizer.ggml.scores")
        types = gguf_numbers(reader, "tokenizer.ggml.token_type")
        self.ids = {tok: i for i, tok in enumerate(tokens)}
        self.specials = sorted((tokens[i] for i in range(len(tokens)) if types[i] in (2, 3, 4)), key=len, reverse=True)

    def encode(self, text: str) -> list[int]:
        fragments: list[str | int] = [text]
        for special in self.specials:  # longest first, as llama.cpp partitions
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or special not in frag:
                    split.append(frag)
                    continue
                for j, part in enumerate(frag.split(special)):
                    split.extend(([self.ids[special]] if j else []) + ([part] if part else []))
            fragments = split
        return [t for frag in fragments for t in ([frag] if isinstance(frag, int) else self._bpe(frag))]

    def _bpe(self, text: str) -> list[int]:
        symbols = list(text.replace(" ", "▁"))
        while True:
            best: tuple[float, int] | None = None
            for i in range(len(symbols) - 1):
                merged = self.ids.get(symbols[i] + symbols[i + 1])
                if merged is not None and (best is None or self.scores[merged] > best[0]):
                    best = (self.scores[merged], i)
            if best is None:
                break
            i = best[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        out: list[int] = []
        for sym in symbols:
            out.extend([self.ids[sym]] if sym in self.ids else [self.ids[f"<0x{b:02X}>"] for b in sym.encode()])
        return out


@pytest.fixture(scope="module")
def spm_reference(gemma3_gguf: Path) -> SentencePieceReference:
    return SentencePieceReference(gemma3_gguf)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_matches_transformers(
    smollm2: Tokenizer, smollm2_transformers: PreTrainedTokenizerBase, text: str
) -> None:
    ids = smollm2.encode(text)
    assert ids == smollm2_transformers.encode(text)
    assert smollm2.decode(ids) == smollm2_transformers.decode(ids, skip_special_tokens=True) == text


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(text=SMOLLM2_COMPARABLE)
def test_smollm2_matches_transformers_on_random_text(
    smollm2: Tokenizer, smollm2_transformers: PreTrainedTokenizerBase, text: str
) -> None:
    assert smollm2.encode(text) == smollm2_transformers.encode(text)


@pytest.mark.slow
def test_smollm2_splits_digits_like_its_hf_tokenizer(smollm2: Tokenizer) -> None:
    """SmolLM2's tokenizer.json pre-tokenizes with Digits(individual_digits=True); transformers' GGUF path does not."""
    assert smollm2.convert_ids_to_tokens(smollm2.encode("2024 x")) == ["2", "0", "2", "4", "Ġx"]


@pytest.mark.slow
def test_smollm2_special_tokens(smollm2: Tokenizer) -> None:
    assert smollm2.eos_token_ids == frozenset({2})
    assert smollm2.convert_ids_to_tokens([2]) == ["<|im_end|>"]
    assert (smollm2.bos_token, smollm2.bos_token_id) == ("<|im_start|>", 1)
    assert smollm2.encode("Hi") == smollm2.encode("Hi", add_special_tokens=False)  # no BOS for SmolLM2
    chat = smollm2.encode("<|im_start|>user\nHi<|im_end|>")
    assert (chat[0], chat[-1]) == (1, 2)
    assert smollm2.vocab_size == 49152
    assert smollm2.embedded_chat_template is not None
    assert smollm2.embedded_chat_template.startswith("{% for message in messages %}")


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_gemma3_matches_spm_reference(gemma3: Tokenizer, spm_reference: SentencePieceReference, text: str) -> None:
    assert gemma3.encode(text, add_special_tokens=False) == spm_reference.encode(text)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=30))
def test_gemma3_matches_spm_reference_on_random_text(
    gemma3: Tokenizer, spm_reference: SentencePieceReference, text: str
) -> None:
    ids = gemma3.encode(text, add_special_tokens=False)
    assert ids == spm_reference.encode(text)
    if "▁" not in text:  # the only lossy character: SentencePiece's own space marker
        assert gemma3.decode(ids) == text


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_gemma3_decode_matches_transformers(
    gemma3: Tokenizer, gemma3_transformers: PreTrainedTokenizerBase, text: str
) -> None:
    ids = gemma3.encode(text)
    assert gemma3.decode(ids) == text
    assert gemma3.decode(ids, skip_special_tokens=False) == gemma3_transformers.decode(ids) == "<bos>" + text


@pytest.mark.slow
def test_gemma3_known_ids_and_special_tokens(gemma3: Tokenizer) -> None:
    assert gemma3.encode("Hello world") == [2, 9259, 1902]
    assert gemma3.encode("Hello world", add_special_tokens=False) == [9259, 1902]
    assert gemma3.encode("<start_of_turn>user\nHi<end_of_turn>\n") == [2, 105, 2364, 107, 10979, 106, 107]
    assert (gemma3.bos_token, gemma3.bos_token_id) == ("<bos>", 2)
    assert gemma3.eos_token_ids == frozenset({1, 106})
    assert gemma3.convert_ids_to_tokens([1, 106]) == ["<eos>", "<end_of_turn>"]
    assert gemma3.vocab_size == 262144
    assert gemma3.embedded_chat_template is None  # this GGUF ships no template


@pytest.mark.slow
def test_hf_directory(smollm2: Tokenizer, tmp_path: Path) -> None:
    """An HF directory loads through AutoTokenizer; generation_config.json adds EOS ids."""
    smollm2.to_transformers().save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    loaded = Tokenizer.from_path(tmp_path)
    assert loaded.eos_token_ids == frozenset({0, 2})
    assert [loaded.encode(t) for t in TEXTS] == [smollm2.encode(t) for t in TEXTS]
    assert loaded.embedded_chat_template == smollm2.embedded_chat_template


def test_from_path_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="model.bin"):
        Tokenizer.from_path(tmp_path / "model.bin")


def _byte_level_gguf(path: Path, pre: str) -> Path:
    """A tokenizer-only GGUF: two control tokens, the 256 byte-level symbols and one merge."""
    tokens = ["<s>", "</s>", *bytes_to_unicode().values(), "He"]
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL] * 2 + [TokenType.NORMAL] * 257)
    writer.add_token_merges(["H e"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("gpt-2", ["Hello", "Ġ12345", "Ġcafe", "Ìģ"]),
        ("smollm", ["Hello", "Ġ", "1", "2", "3", "4", "5", "Ġcafe", "Ìģ"]),
        ("llama-bpe", ["Hello", "Ġ", "123", "45", "Ġcafe", "Ìģ"]),
        ("qwen2", ["Hello", "Ġ", "1", "2", "3", "4", "5", "ĠcafÃ©"]),
    ],
)
def test_bpe_pre_tokenizers(tmp_path: Path, pre: str, pieces: list[str]) -> None:
    """llama.cpp's pre-tokenizer names map to their HF splits; only qwen2 NFC-composes e + U+0301 (bytes shown as Ìģ)."""
    tokenizer = Tokenizer.from_path(_byte_level_gguf(tmp_path / f"{pre}.gguf", pre))
    backend = tokenizer.backend
    raw = "Hello 12345 cafe\u0301"
    text = backend.normalizer.normalize_str(raw) if backend.normalizer else raw
    assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] == pieces
    assert tokenizer.eos_token_ids == frozenset({1})
    assert tokenizer.encode("</s>", add_special_tokens=False) == [1]
    assert tokenizer.encode("He") == ([0] if pre == "llama-bpe" else []) + [258]  # llama.cpp's BOS default


def test_unsupported_bpe_pre_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'deepseek-llm'.*gpt-2, llama-bpe, .*qwen2, smollm"):
        Tokenizer.from_path(_byte_level_gguf(tmp_path / "deepseek.gguf", "deepseek-llm"))


def test_has_token_looks_up_one_piece(smollm2: Tokenizer) -> None:
    """Chat requests look up their template's marker in the Rust vocabulary (never a dict of all of it)."""
    assert smollm2.has_token("<|im_start|>") and smollm2.has_token("Hello")
    assert not smollm2.has_token("<|no such marker|>")


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_add_up_to_the_text(smollm2: Tokenizer, gemma3: Tokenizer, text: str) -> None:
    """Byte-level BPE (SmolLM2) and SentencePiece byte fallback (Gemma 3): a token may hold part of a character
    (decoded alone it is U+FFFD), yet the tokens' bytes join into the text's UTF-8."""
    for tok in (smollm2, gemma3):
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8") == tok.decode(ids), tok.kind
    emoji = smollm2.encode("😀", add_special_tokens=False)
    assert len(emoji) > 1 and "\ufffd" in smollm2.decode(emoji[:1])  # the case the bytes are for
    end = smollm2.token_id("<|im_end|>")
    assert smollm2.token_bytes(end) == b"<|im_end|>"


def test_token_bytes_keep_the_space_a_llama2_style_decoder_strips(tmp_path: Path) -> None:
    """A SentencePiece-style BPE whose decoder strips the leading space (Llama 2, Mistral): a piece decoded alone
    loses its space, its bytes keep it, and byte-fallback pieces give their byte."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, trainers
    rust = RustTokenizer(models.BPE(byte_fallback=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    rust.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["</s>"] + [f"<0x{b:02X}>" for b in range(256)])
    rust.train_from_iterator(["Hello world, hello there.", "The world is wide."] * 10, trainer)
    tok = Tokenizer(rust, specials=SpecialTokens(eos="</s>"))
    for text in ("Hello world", "wide world 😀"):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids[1:2]) == tok.decode(ids[1:2]).lstrip()  # the decoder strips a lone piece's space
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8") == " " + text


def test_a_pickled_tokenizer_is_the_same_tokenizer(smollm2: Tokenizer, gemma3: Tokenizer, tmp_path: Path) -> None:
    """The engine core hands its tokenizer to the API servers pickled: ids, specials, EOS set and template survive."""
    import pickle

    hf_dir = tmp_path / "hf"
    smollm2.to_transformers().save_pretrained(hf_dir)
    for tok in (smollm2, gemma3, Tokenizer.from_path(hf_dir)):
        copy = pickle.loads(pickle.dumps(tok))
        for text in TEXTS:
            assert copy.encode(text) == tok.encode(text)
        assert (copy.eos_token_ids, copy.specials, copy.kind, copy.embedded_chat_template, copy.vocab_size) == \
            (tok.eos_token_ids, tok.specials, tok.kind, tok.embedded_chat_template, tok.vocab_size)


def test_a_gguf_tokenizer_loads_without_transformers(smollm2_gguf: Path) -> None:
    """The API server process reads tokenizers without transformers (which imports torch)."""
    import subprocess
    import sys

    code = ("import sys; from infer.loader.tokenizer import Tokenizer; "
            f"t = Tokenizer.from_path({str(smollm2_gguf)!r}); t.encode('hi'); "
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
