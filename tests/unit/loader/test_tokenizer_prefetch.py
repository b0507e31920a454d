"""loader/tokenizer_prefetch.py: an HF directory's tokenizer read by a child process is the tokenizer read here."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoints import save_tiny_llama3_chat, save_tiny_qwen3_chat, save_tiny_with_tokenizer
from infer.loader.gguf_file import bundled_smollm2
from infer.loader.tokenizer import Tokenizer
from infer.loader.tokenizer_prefetch import TokenizerPrefetch

TEXT = "<|im_start|>user\nThe quick brown fox, 12 ünïcödé words<|im_end|>"


SAVERS = {"qwen3 chat": save_tiny_qwen3_chat, "llama3 chat": save_tiny_llama3_chat,
          "gemma3": lambda path: save_tiny_with_tokenizer("gemma3", path)}


@pytest.mark.parametrize("which", SAVERS)
def test_the_childs_tokenizer_is_the_one_read_here(tmp_path: Path, which: str) -> None:
    """The child, with torch hidden from transformers, reads the tokenizer transformers reads beside torch."""
    path = SAVERS[which](tmp_path / "model")
    prefetch = TokenizerPrefetch(path)
    assert prefetch._child is not None  # an HF directory is read by the child
    got, want = prefetch.result(), Tokenizer.from_path(path)
    assert prefetch.from_child and prefetch._child is None
    assert got.encode(TEXT) == want.encode(TEXT) and got.decode(want.encode(TEXT)) == want.decode(want.encode(TEXT))
    assert got.eos_token_ids == want.eos_token_ids and got.specials == want.specials and got.kind == want.kind
    assert got.backend.to_str() == want.backend.to_str()
    assert got.embedded_chat_template == want.embedded_chat_template


def test_a_gguf_is_read_here_without_a_child() -> None:
    prefetch = TokenizerPrefetch(bundled_smollm2())
    assert prefetch._child is None
    assert prefetch.result().encode(TEXT) == Tokenizer.from_path(bundled_smollm2()).encode(TEXT)


def test_a_directory_the_child_cannot_read_raises_the_error_read_here_would(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # no tokenizer files
    with pytest.raises(Exception) as here:
        Tokenizer.from_path(tmp_path)
    prefetch = TokenizerPrefetch(tmp_path)
    with pytest.raises(type(here.value)) as prefetched:
        prefetch.result()
    assert str(prefetched.value) == str(here.value) and not prefetch.from_child


def test_cancel_stops_the_child(tmp_path: Path) -> None:
    path = save_tiny_qwen3_chat(tmp_path / "qwen3")
    prefetch = TokenizerPrefetch(path)
    child = prefetch._child
    prefetch.cancel()
    assert child is not None and child.poll() is not None and prefetch._child is None
    assert prefetch.result().encode(TEXT) == Tokenizer.from_path(path).encode(TEXT)  # read here after a cancel
    assert not prefetch.from_child


def test_a_child_past_its_time_is_stopped_and_the_tokenizer_read_here(tmp_path: Path, monkeypatch) -> None:
    from infer.loader import tokenizer_prefetch

    path = save_tiny_qwen3_chat(tmp_path / "qwen3")
    monkeypatch.setattr(tokenizer_prefetch, "CHILD_TIMEOUT_S", 0.001)
    prefetch = TokenizerPrefetch(path)
    child = prefetch._child
    got = prefetch.result()
    assert child is not None and child.returncode != 0 and not prefetch.from_child
    assert got.encode(TEXT) == Tokenizer.from_path(path).encode(TEXT)
