"""Incremental detokenization with SmolLM2's byte-level BPE: deltas add up to the full decode and never split a character."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infer.loader.detokenizer import IncrementalDetokenizer
from infer.loader.tokenizer import Tokenizer

TEXTS = (
    "Hello, world!",
    "😀🎉 emoji 👩‍👩‍👧 family",
    "日本語のテキストと中文",
    "Ça va ? Crème brûlée, naïve façade — Ελληνικά, עברית.",
    "  leading,   inner   spaces\n\ttabs\n\n trailing  ",
    "digits 1234567890 and symbols ∑∞≠ ½",
)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: Path) -> Tokenizer:
    return Tokenizer.from_path(smollm2_gguf)


def stream(tokenizer: Tokenizer, ids: list[int], prompt_ids: Sequence[int] = (), skip: bool = True) -> list[str]:
    """Every delta, the flush included."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert detok.text == "".join(deltas)
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_emoji_split_across_tokens_is_held_back(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) == 3  # byte-level BPE: one 4-byte character over three tokens
    assert tokenizer.decode(ids[:1]).endswith("\ufffd")  # an undecodable intermediate state
    assert stream(tokenizer, ids) == ["", "", "😀", ""]


def test_flush_emits_held_back_bytes(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a😀", add_special_tokens=False)[:-1]
    deltas = stream(tokenizer, ids)
    assert deltas[-1].endswith("\ufffd")
    assert "".join(deltas) == tokenizer.decode(ids)


def test_special_tokens_skipped_or_kept(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Sure!<|im_end|>", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids)) == "Sure!"
    assert "".join(stream(tokenizer, ids, skip=False)) == "Sure!<|im_end|>"


def test_prompt_context_does_not_leak_into_output(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("<|im_start|>user\nHi 😀<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(" Hello there, 42 ünïcode 🎉", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids, prompt)) == tokenizer.decode(ids)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40))
def test_random_unicode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.decode(ids)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in d for d in deltas)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40), cut=st.integers(0, 3), ends_on_text=st.booleans())
@example(text=" \x80Ä", cut=3, ends_on_text=False)  # one token " \xc2": the stream holds back its space too
def test_held_tokens_decode_at_the_end_to_the_streamed_text(tokenizer: Tokenizer, text: str, cut: int,
                                                            ends_on_text: bool) -> None:
    """A caller that reads only the final text holds every token and flushes once; it gets what the pushes give,
    for outputs that may end inside a character: the flush at a text token's end, none after an EOS."""
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids = ids[: max(len(ids) - cut, 0)]
    pushed = IncrementalDetokenizer(tokenizer, prompt)
    for i in ids:
        pushed.push(i)
    if ends_on_text:
        pushed.flush()
    held = IncrementalDetokenizer(tokenizer, prompt)
    for i in ids:
        held.hold(i)
    assert held.text == ""
    assert held.flush(keep_incomplete=ends_on_text) == held.text == pushed.text
