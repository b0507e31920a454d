"""The text side of output processing: deltas, stop strings found beside the API (and reported to the core),
EOS never rendered, tokens after an end dropped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine_fakes import EOS, FakeTokenizer
from infer.wire import CoreOutput
from infer.frontend.text import TextProcessor
from infer.sampling.params import SamplingParams


def _run(processor: TextProcessor, rid: str, tokens: list[int], last_reason: str | None = None) -> list:
    outs = []
    for i, token in enumerate(tokens):
        reason = last_reason if i == len(tokens) - 1 else None
        outs.append(processor.process(CoreOutput(rid, token, reason, completion_tokens=i + 1)))
    return outs


def test_deltas_join_to_the_decoded_text_and_eos_is_not_rendered():
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    state = processor.add("a", [1, 2], SamplingParams())
    outs = _run(processor, "a", [5, 6, EOS], last_reason="stop")
    assert "".join(o.text_delta for o in outs) == " t5 t6" == state.text
    assert [o.finished for o in outs] == [False, False, True] and outs[-1].finish_reason == "stop"
    assert state.token_ids == [5, 6, EOS] and "a" not in processor.states and processor.take_stopped() == []


def test_a_stop_string_ends_the_request_here_and_is_reported_for_the_core():
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    state = processor.add("a", [1], SamplingParams(stop=["t7"]))
    outs = _run(processor, "a", [5, 7, 8])
    assert outs[1].finished and outs[1].finish_reason == "stop" and outs[2] is None  # the core's next token: dropped
    assert "".join(o.text_delta for o in outs if o) == " t5 " == state.text
    assert state.token_ids == [5, 7] and processor.take_stopped() == ["a"] and processor.take_stopped() == []
    # the core's own end of it (the abort with reason "stop") is dropped too
    assert processor.process(CoreOutput("a", None, "stop")) is None


def test_stop_strings_count_only_after_min_tokens():
    """vLLM's rule: before min_tokens tokens, no stop string ends the text; a later one still does, even one
    whose start lies in the earlier text."""
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    processor.add("a", [1], SamplingParams(stop=["t5"], min_tokens=2, max_tokens=4))
    outs = _run(processor, "a", [5, 6, 5, 6])
    assert [o.finish_reason for o in outs[:2]] == [None, None] and outs[2].finish_reason == "stop"
    assert "".join(o.text_delta for o in outs[:3]) == " t5 t6 "
    processor.add("b", [1], SamplingParams(stop=["t5"], min_tokens=2, max_tokens=2))
    outs = _run(processor, "b", [5, 5], last_reason="length")
    assert outs[-1].finish_reason == "length" and "".join(o.text_delta for o in outs) == " t5 t5"


def test_probe_values_become_named_scores():
    """The core sends None for a probe a reload removed (or a NaN score); the names come from this side."""
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    processor.add("a", [1], SamplingParams(), probe_names=("x", "gone"))
    out = processor.process(CoreOutput("a", 5, probes=[0.25, None]))
    assert out is not None and out.probe_dict() == {"x": 0.25, "gone": None}


def test_finish_from_this_side_fails_the_request_once():
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    processor.add("a", [1], SamplingParams())
    out = processor.finish("a", "the engine core is gone")
    assert out is not None and out.finished and out.finish_reason == "error" and out.error == "the engine core is gone"
    assert processor.finish("a", "again") is None


@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.lists(st.sampled_from(["t1", "t2 t", "3 t"]), max_size=2))
def test_streamed_text_never_passes_a_stop_string(tokens, stops):
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    state = processor.add("a", [9], SamplingParams(stop=stops))
    outs = [o for o in _run(processor, "a", tokens, last_reason="length") if o is not None]
    text = "".join(o.text_delta for o in outs)
    full = "".join(f" t{t}" for t in tokens)
    cut = min((full.find(s) for s in stops if s in full), default=len(full))
    assert text == state.text == full[:cut]
    assert sum(o.finished for o in outs) == 1


@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.sampled_from(["length", "stop", "abort"]),
       st.booleans())
def test_text_read_only_at_the_end_is_decoded_once_and_matches_the_streamed(tokens, reason, eos_last):
    """incremental=False: every delta empty until the request ends, then the whole text, the same as streamed."""
    tokens = tokens + [EOS] if eos_last else tokens
    texts = []
    for incremental in (True, False):
        processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
        state = processor.add("a", [9], SamplingParams(), incremental=incremental)
        outs = _run(processor, "a", tokens, last_reason=reason)
        assert [o.finished for o in outs] == [False] * (len(tokens) - 1) + [True]
        if not incremental:
            assert all(o.text_delta == "" for o in outs[:-1])
        texts.append(("".join(o.text_delta for o in outs), state.text, state.token_ids))
    assert texts[0] == texts[1] and texts[0][0] == "".join(f" t{t}" for t in tokens if t != EOS)


def test_stop_strings_keep_the_text_incremental():
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    state = processor.add("a", [1], SamplingParams(stop=["t7"]), incremental=False)
    outs = _run(processor, "a", [5, 7, 8])
    assert state.incremental and outs[0].text_delta == " t5" and outs[1].finish_reason == "stop"


def test_include_stop_str_in_output_keeps_the_stop_string_at_the_end():
    processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
    state = processor.add("a", [1], SamplingParams(stop=["t7"], include_stop_str_in_output=True))
    outs = _run(processor, "a", [5, 7, 8])
    assert outs[1].finish_reason == "stop" and outs[2] is None
    assert "".join(o.text_delta for o in outs if o) == " t5 t7" == state.text


def test_skip_special_tokens_off_renders_special_tokens():
    """An EOS generated under ignore_eos is text; whether its special token shows is skip_special_tokens'."""
    for skip, text in ((True, " t5 t6"), (False, f" t5 t{EOS} t6")):
        processor = TextProcessor(FakeTokenizer())  # type: ignore[arg-type]
        state = processor.add("a", [1], SamplingParams(ignore_eos=True, skip_special_tokens=skip))
        outs = _run(processor, "a", [5, EOS, 6], last_reason="length")
        assert "".join(o.text_delta for o in outs) == text == state.text
