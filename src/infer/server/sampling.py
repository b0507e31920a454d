"""Turn the OpenAI sampling fields into SamplingParams; OpenAI features infer does not have are a 400 naming the field."""

from __future__ import annotations

from collections.abc import Mapping

from infer.loader.generation_config import SAMPLING_KEYS
from infer.sampling.params import LOGIT_BIAS_LIMIT, PENALTY_LIMIT, ProbeStop, SamplingParams
from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from infer.server.state import check_text
from infer.structured import Constraint


def _unsupported(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param, "unsupported_parameter")


def check_supported(body: SamplingFields) -> None:
    """Refuse what infer cannot honour; a value that leaves generation unchanged (the default, 'text') passes."""
    if body.best_of is not None and body.best_of != 1:
        raise _unsupported("best_of", "only best_of=1 is supported (use n for several choices)")
    if body.stream_options is not None and not body.stream:
        raise APIError(422, "stream_options is only allowed with stream=true", "stream_options")
    if isinstance(body, CompletionRequest) and body.suffix:
        raise _unsupported("suffix", "is not supported (no fill-in-the-middle)")
    if isinstance(body, ChatCompletionRequest):
        if body.audio is not None or set(body.modalities or ()) - {"text"}:
            name = "audio" if body.audio is not None else "modalities"
            raise _unsupported(name, "audio output is not supported; the only modality is [\"text\"]")
        if body.web_search_options is not None:
            raise _unsupported("web_search_options", "web search is not supported")


def logit_adjustments(body: SamplingFields, max_tokens: int, vocab_size: int | None) -> dict[str, object]:
    """OpenAI's logit_bias, presence_penalty, frequency_penalty and vLLM's min_tokens, checked: out of range is a
    400 naming the field (logit_bias keys are token ids as strings, inside the vocabulary)."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
            raise APIError(400, f"{name} must be in [-2, 2], got {value}", name)
    bias: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        digits = key.strip()  # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        token = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 12 else None
        if token is None or (vocab_size is not None and token >= vocab_size):
            raise APIError(400, f"logit_bias key {key[:40]!r} is not a token id in [0, {vocab_size})", "logit_bias")
        if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise APIError(400, f"logit_bias value {value} for token {key} is outside [-100, 100]", "logit_bias")
        bias[token] = value
    if not 0 <= body.min_tokens <= max_tokens:
        raise APIError(400, f"min_tokens must be in [0, max_tokens={max_tokens}], got {body.min_tokens}", "min_tokens")
    return {"presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
            "logit_bias": bias or None, "min_tokens": body.min_tokens}


def sampling_params(
    body: SamplingFields, max_tokens: int, logprobs: int | None = None, prompt_logprobs: int | None = None,
    structured: Constraint | None = None, vocab_size: int | None = None,
    defaults: Mapping[str, float | int] | None = None, lora: str | None = None,
) -> SamplingParams:
    """The request's SamplingParams; `defaults` (the model's generation config) stand in for sampling fields the
    request leaves out; `lora`: the LoRA adapter its `model` names."""
    chosen = {name: getattr(body, name) for name in SAMPLING_KEYS}
    chosen.update({k: v for k, v in (defaults or {}).items() if k in chosen and k not in body.model_fields_set})
    try:
        probe_stop = ProbeStop(**body.probe_stop.model_dump()) if body.probe_stop is not None else None
    except ValueError as exc:
        raise APIError(400, str(exc), "probe_stop") from exc
    adjustments = logit_adjustments(body, max_tokens, vocab_size)
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    for i, stop in enumerate(stops):
        if isinstance(stop, str):
            check_text(stop, "stop" if isinstance(body.stop, str) else f"stop.{i}")
    try:
        return SamplingParams(
            **chosen, max_tokens=max_tokens, stop=body.stop,  # type: ignore[arg-type]
            **adjustments,  # type: ignore[arg-type]
            seed=body.seed, ignore_eos=body.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            structured=structured, probes=body.probes, probe_prompt=body.probe_prompt,
            probe_stop=probe_stop, skip_special_tokens=body.skip_special_tokens,
            include_stop_str_in_output=body.include_stop_str_in_output, lora=lora,
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise APIError(422, str(exc), str(exc).split(" ", 1)[0]) from exc
