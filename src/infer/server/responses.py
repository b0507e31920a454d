"""OpenAI response bodies: completions, chat completions, stream chunks, usage and logprobs."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import msgspec

from infer.sampling.logprobs import TokenLogprob
from infer.server.errors import error_body

LOGPROB_FLOOR = -9999.0  # JSON has no -inf; OpenAI uses -9999 for "very unlikely"

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]


def _plain_number(value: object) -> object:
    """What json.dumps also takes and msgspec does not: numbers of other types (numpy's float64, int64)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_JSON = msgspec.json.Encoder(enc_hook=_plain_number)


def json_text(payload: object) -> str:
    """Compact JSON of a stream chunk or event (one per token): msgspec, ~6x json.dumps. Non-ASCII text is sent
    as UTF-8 rather than escaped; NaN becomes null. Whole responses go through starlette's JSONResponse."""
    return _JSON.encode(payload).decode()


def sse(payload: dict[str, object] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json_text(payload)}\n\n"


def stream_error(error: str, client_error: bool = False) -> str:
    """The one terminal event of a stream whose generation failed (400 when the request's constraint did)."""
    return sse(error_body(400 if client_error else 500, f"generation failed: {error}"))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, object]:
    """OpenAI's usage block; cached_tokens counts prompt tokens read from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def completion_logprobs(
    entries: list[tuple[int, TokenLogprob | None]], token_text: TokenText, offset: int = 0
) -> dict[str, list]:
    """The completions `logprobs` object; entries pair each token id with its logprob (None for the first prompt token)."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, lp in entries:
        text = token_text(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if lp is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_lp(lp.logprob))
        top = {text: _lp(lp.logprob)}  # the chosen token first, then the most likely ones (vLLM's shape)
        for alt, value in lp.top:
            top.setdefault(token_text(alt), _lp(value))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries: list[TokenLogprob], token_text: TokenText, token_bytes: TokenBytes) -> dict[str, object]:
    """The chat `logprobs` object: each token's text, and its own bytes (a token may hold part of a character,
    whose text is U+FFFD; the bytes of consecutive tokens add up to the text's)."""
    def item(token_id: int, value: float) -> dict[str, object]:
        return {"token": token_text(token_id), "logprob": _lp(value), "bytes": list(token_bytes(token_id))}

    content = []
    for lp in entries:
        entry = item(lp.token_id, lp.logprob)
        entry["top_logprobs"] = [item(t, v) for t, v in lp.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def envelope(kind: str, request_id: str, created: int, model: str, choices: list, **extra: object) -> dict[str, object]:
    """The fields every response and chunk share; kind is text_completion, chat.completion(.chunk)."""
    return {"id": request_id, "object": kind, "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, **extra}
