"""Turn the OpenAI sampling fields into SamplingParams, refusing what infer does not support with a 422."""

from __future__ import annotations

from infer.sampling.params import SamplingParams
from infer.server.errors import APIError
from infer.server.protocol import SamplingFields

MAX_N = 16


def check_supported(body: SamplingFields) -> None:
    """OpenAI fields with values infer cannot honour are refused rather than silently ignored."""
    if body.best_of is not None and body.best_of > 1:
        raise APIError(422, "best_of > 1 is not supported", "best_of")
    if body.presence_penalty != 0 or body.frequency_penalty != 0:
        param = "presence_penalty" if body.presence_penalty != 0 else "frequency_penalty"
        raise APIError(422, f"{param} is not supported (use repetition_penalty)", param)
    if body.logit_bias:
        raise APIError(422, "logit_bias is not supported", "logit_bias")
    if not 1 <= body.n <= MAX_N:
        raise APIError(422, f"n must be between 1 and {MAX_N}, got {body.n}", "n")
    if body.stream_options is not None and not body.stream:
        raise APIError(422, "stream_options is only allowed with stream=true", "stream_options")


def sampling_params(
    body: SamplingFields, max_tokens: int, logprobs: int | None = None, prompt_logprobs: int | None = None
) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            repetition_penalty=body.repetition_penalty, max_tokens=max_tokens, stop=body.stop,  # type: ignore[arg-type]
            seed=body.seed, ignore_eos=body.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        )
    except ValueError as exc:  # SamplingParams names the field first
        raise APIError(422, str(exc), str(exc).split(" ", 1)[0]) from exc
