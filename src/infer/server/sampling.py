"""Turn the OpenAI sampling fields into SamplingParams; OpenAI features infer does not have are a 400 naming the field."""

from __future__ import annotations

from infer.sampling.params import ProbeStop, SamplingParams
from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from infer.structured import Constraint


def _unsupported(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param, "unsupported_parameter")


def check_supported(body: SamplingFields) -> None:
    """Refuse what infer cannot honour; a value that leaves generation unchanged (the default, 'text') passes."""
    if body.best_of is not None and body.best_of != 1:
        raise _unsupported("best_of", "only best_of=1 is supported (use n for several choices)")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) != 0:
            raise _unsupported(name, "is not supported; use repetition_penalty")
    if body.logit_bias:
        raise _unsupported("logit_bias", "is not supported")
    if body.stream_options is not None and not body.stream:
        raise APIError(422, "stream_options is only allowed with stream=true", "stream_options")
    if isinstance(body, CompletionRequest) and body.suffix:
        raise _unsupported("suffix", "is not supported (no fill-in-the-middle)")
    if isinstance(body, ChatCompletionRequest):
        _check_tools(body)


def _check_tools(body: ChatCompletionRequest) -> None:
    """No tool or function calling yet: any tool definition or choice other than 'none' is refused."""
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise _unsupported(name, "tool and function calling are not supported")
    for name in ("tool_choice", "function_call"):
        if getattr(body, name) not in (None, "none"):
            raise _unsupported(name, "tool and function calling are not supported")


def sampling_params(
    body: SamplingFields, max_tokens: int, logprobs: int | None = None, prompt_logprobs: int | None = None,
    structured: Constraint | None = None,
) -> SamplingParams:
    try:
        probe_stop = ProbeStop(**body.probe_stop.model_dump()) if body.probe_stop is not None else None
    except ValueError as exc:
        raise APIError(400, str(exc), "probe_stop") from exc
    try:
        return SamplingParams(
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            repetition_penalty=body.repetition_penalty, max_tokens=max_tokens, stop=body.stop,  # type: ignore[arg-type]
            seed=body.seed, ignore_eos=body.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            structured=structured, probes=body.probes, probe_prompt=body.probe_prompt,
            probe_stop=probe_stop,
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise APIError(422, str(exc), str(exc).split(" ", 1)[0]) from exc
