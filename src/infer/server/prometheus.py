"""GET /metrics in the Prometheus text format, names mirroring vLLM's with an `infer:` prefix.

Engine gauges and counters come from the engine core; the serving histograms and token counters are the sum
over every API server (each sends its own with its heartbeat; the answering server's are current)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from infer.wire import EngineStats
from infer.frontend.metrics import Histogram, ServingMetrics
from infer.frontend.client import CoreGoneError
from infer.server.errors import APIError
from infer.server.state import ServerState

router = APIRouter()


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value}" for labels, value in samples]


def _histogram(lines: list[str], name: str, help_text: str, h: Histogram, model: str) -> None:
    samples = [(f'_bucket{{model_name="{model}",le="{le}"}}', n) for le, n in h.cumulative()]
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    lines += [f"{name}{suffix} {value}" for suffix, value in samples]
    lines += [f'{name}_sum{{model_name="{model}"}} {h.total}', f'{name}_count{{model_name="{model}"}} {h.count}']


def render(state: ServerState, stats: EngineStats, num_waiting: int, m: ServingMetrics) -> str:
    model = state.model_name
    label = f'{{model_name="{model}"}}'
    lines: list[str] = []
    _metric(lines, "infer:num_requests_running", "gauge", "Requests in the running batch.", [(label, stats.num_running)])
    _metric(lines, "infer:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
            [(label, num_waiting)])
    _metric(lines, "infer:kv_cache_blocks_used", "gauge", "KV cache blocks in use.",
            [(label, stats.kv_blocks_total - stats.kv_blocks_free)])
    _metric(lines, "infer:kv_cache_blocks_free", "gauge", "KV cache blocks free.", [(label, stats.kv_blocks_free)])
    used = (stats.kv_blocks_total - stats.kv_blocks_free) / max(stats.kv_blocks_total, 1)
    _metric(lines, "infer:kv_cache_usage_perc", "gauge", "KV cache usage (1 = full).", [(label, used)])
    _metric(lines, "infer:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", [(label, m.prompt_tokens)])
    _metric(lines, "infer:generation_tokens_total", "counter", "Generated tokens.", [(label, m.generation_tokens)])
    _metric(lines, "infer:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
            [(label, stats.prefix_cache_queries)])
    _metric(lines, "infer:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
            [(label, stats.prefix_cache_hits)])
    _metric(lines, "infer:prefix_cache_hit_rate", "gauge", "Prefix-cache hits / queries since start.",
            [(label, stats.prefix_cache_hits / max(stats.prefix_cache_queries, 1))])
    _metric(lines, "infer:num_preemptions_total", "counter", "Requests preempted for recomputation.",
            [(label, stats.num_preemptions)])
    _metric(lines, "infer:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified (speculative decoding).",
            [(label, stats.spec_drafted)])
    _metric(lines, "infer:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
            [(label, stats.spec_accepted)])
    _metric(lines, "infer:spec_decode_draft_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
            [(label, stats.spec_accepted / max(stats.spec_drafted, 1))])
    _metric(lines, "infer:spec_decode_mean_accepted_length", "gauge",
            "Tokens emitted per request-step that verified drafts (accepted drafts + 1), since start.",
            [(label, 1 + stats.spec_accepted / max(stats.spec_verified_rows, 1))])
    _metric(lines, "infer:request_success_total", "counter", "Finished requests by finish reason.",
            [(f'{{model_name="{model}",finished_reason="{r}"}}', n) for r, n in sorted(m.finished.items())])
    if state.built.config.enable_lora:
        _lora_metrics(lines, state, stats, model)
    engines, dead = state.engine.infos, state.engine.dead_engines
    _metric(lines, "infer:engines_live", "gauge", "Data-parallel engine cores serving (the others are restarting).",
            [(label, len(engines) - len(dead))])
    _metric(lines, "infer:engines_total", "gauge", "Data-parallel engine cores configured.", [(label, len(engines))])
    _histogram(lines, "infer:time_to_first_token_seconds", "Time to first token.", m.ttft, model)
    _histogram(lines, "infer:inter_token_latency_seconds", "Time between tokens of a request.", m.itl, model)
    _histogram(lines, "infer:e2e_request_latency_seconds", "Request latency, submit to last output.", m.e2e, model)
    _histogram(lines, "infer:request_queue_time_seconds", "Time from arrival to first scheduling.", m.queue, model)
    return "\n".join(lines) + "\n"


def _lora_metrics(lines: list[str], state: ServerState, stats: EngineStats, model: str) -> None:
    """Requests per LoRA adapter, and vLLM's lora_requests_info (the adapters running and waiting, the slot count)."""
    in_use = stats.lora_requests
    _metric(lines, "infer:lora_requests_running", "gauge", "Running requests per LoRA adapter.",
            [(f'{{model_name="{model}",lora_name="{name}"}}', running) for name, running, _ in in_use])
    _metric(lines, "infer:lora_requests_waiting", "gauge", "Waiting requests per LoRA adapter.",
            [(f'{{model_name="{model}",lora_name="{name}"}}', waiting) for name, _, waiting in in_use])
    running = ",".join(name for name, r, _ in in_use if r)
    waiting = ",".join(name for name, _, w in in_use if w)
    _metric(lines, "infer:lora_requests_info", "gauge", "LoRA adapters in use (vLLM's labels).",
            [(f'{{running_lora_adapters="{running}",waiting_lora_adapters="{waiting}",'
              f'max_lora="{state.built.config.max_loras}"}}', 1)])
    _metric(lines, "infer:lora_adapters_loaded", "gauge", "LoRA adapters loaded (servable by name).",
            [(f'{{model_name="{model}"}}', len(state.engine.loras))])


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> PlainTextResponse:
    state: ServerState = request.app.state.infer
    try:
        stats, num_waiting, snapshots = await state.engine.call("metrics", state.engine.metrics.snapshot())
    except CoreGoneError as exc:
        raise APIError(503, str(exc)) from exc
    return PlainTextResponse(render(state, stats, num_waiting, ServingMetrics.merged(snapshots)),
                             media_type="text/plain; version=0.0.4")
