"""The `infer` command line: `infer generate PROMPT` streams a completion to the terminal."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DESCRIPTION = "infer: an LLM inference runtime (Llama 3, Qwen 3, Gemma 3; HF safetensors or GGUF)."


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a completion for one prompt and stream it to stdout",
        description="Generate text for PROMPT and stream it to stdout. Loading progress and timing go to stderr.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("prompt", metavar="PROMPT", help="the prompt text; '-' reads it from stdin")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="HF model directory (config.json + safetensors) or a .gguf file; "
                        "default: the bundled SmolLM2-135M-Instruct GGUF")
    p.add_argument("--chat", action="store_true",
                   help="wrap PROMPT as a user message in the model's chat template")
    p.add_argument("--system", default=None, metavar="TEXT", help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N", help="maximum number of new tokens")
    p.add_argument("--temperature", type=float, default=0.7, metavar="T", help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling: keep the smallest set of tokens with mass >= P")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="keep only the K most likely tokens; 0 = off")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="drop tokens less likely than P times the most likely one (after temperature); 0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="divide logits of already-seen tokens by R (>1 discourages repeats)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when TEXT is generated (repeatable); TEXT is not printed")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed for reproducible sampling")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    constraint = p.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", default=None, metavar="FILE",
                            help="constrain the output to JSON valid under the JSON schema in FILE")
    constraint.add_argument("--regex", default=None, metavar="R", help="constrain the output to match the regex R")
    p.add_argument("--lora", default=None, metavar="PATH",
                   help="answer with this PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) over the "
                        "model")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weight and activation dtype; auto = float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto")
    p.add_argument("--max-seq-len", "--max-model-len", type=int, default=4096, metavar="N",
                   help="longest prompt + output, in tokens (--max-model-len: vLLM's name)")
    _add_chat_template_flag(p)
    _add_quantization_flag(p)
    _add_probe_flag(p)
    _add_runner_flag(p)
    p.add_argument("--show-probes", nargs="?", const="", default=None, metavar="NAME",
                   help="shade each generated token by its score of probe NAME (default: the first loaded probe) "
                        "and print every probe's mean score; needs --probes. Shading is for a terminal: piped "
                        "output, or NO_COLOR set, gets plain text and the mean scores")
    _add_prefill_flags(p.add_argument_group("prefill"))
    _add_speculative_flags(p.add_argument_group("speculative decoding"))
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="shard the model over N ranks (consecutive GPUs from --device; CPU processes on gloo)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="a mixture of experts' whole experts on the --tensor-parallel-size ranks (E / N each)")
    p.set_defaults(func=_generate)


def _add_chat_template_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja2 chat template file (as transformers renders them) used instead of the model family's "
                        "bundled template; tool calls and Qwen 3's reasoning are still read in the family's format")


def _add_quantization_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    from infer.engine.config import QUANTIZATIONS

    p.add_argument("--quantization", default="auto", choices=QUANTIZATIONS,
                   help="auto: weights stay as the checkpoint stores them (FP8 / INT8 checkpoints 8-bit; a GGUF's 4-bit "
                        "weights 4-bit and Q8_0 ones 8-bit); none: dequantize everything to --dtype (exact parity work); "
                        "int4 / int8 / fp8: quantize every linear weight at load to 4-bit groups of 32, int8 "
                        "per output row, or float8 e4m3 in 128x128 blocks (CUDA SM89+, or slowly on the CPU; fp8 "
                        "also quantizes a mixture of experts' experts on CUDA). See docs/quantization.md")


def _add_runner_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    from infer.engine.config import RUNNERS

    p.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="execution engine: torch (CPU, CUDA) or mlx (Apple silicon through Metal; MLX's CPU backend "
                        "elsewhere; needs the mlx extra); auto picks mlx on Apple silicon with Metal, torch "
                        "elsewhere. See docs/apple.md")


def _add_probe_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--probes", default=None, metavar="FILE",
                   help="a probe-set YAML file: linear probes on the residual stream, scored for every token "
                        "(docs/omniscience.md)")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
                    "/v1/responses, /v1/models, /tokenize, /detokenize, /tokenizer_info, /health, /metrics).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=None, metavar="PATH",
                   help="HF model directory or a .gguf file; default: the bundled SmolLM2-135M-Instruct GGUF")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send; default: the model file or directory name")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (info logs every request)")
    p.add_argument("--api-server-count", type=int, default=None, metavar="N",
                   help="API server processes sharing the port (HTTP, tokenization, detokenization, SSE) in front of "
                        "the one engine-core process that schedules and runs the model (default: 1 on the CPU; on "
                        "CUDA one per 4 host cores, at most 4: one process formats ~35k streamed tokens/s)")
    _add_http_flags(p.add_argument_group("HTTP limits and timeouts (docs/serving.md)"))
    _add_access_flags(p.add_argument_group("access: API key, browsers, host names (docs/serving.md)"))
    _add_engine_flags(p)
    p.set_defaults(func=_serve)


def _add_http_flags(g: argparse._ArgumentGroup) -> None:
    from infer.server.limits import BODY_BYTES_PER_CONTEXT_TOKEN, RESERVED_FDS, ServerLimits

    d = ServerLimits()
    g.add_argument("--max-request-body-mb", type=float, default=None, metavar="MB",
                   help="larger request bodies are answered 413 before they are read (default: "
                        f"{BODY_BYTES_PER_CONTEXT_TOKEN} bytes per token of --max-seq-len, at least 1 MiB)")
    g.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s, metavar="S",
                   help="a connection whose request line and headers are not complete this long after it opened (or "
                        "after the first byte of its next request) is closed")
    g.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s, metavar="S",
                   help="a request body that sends nothing for this long is answered 408 and its connection closed")
    g.add_argument("--body-deadline-s", type=float, default=d.body_deadline_s, metavar="S",
                   help="a request body not complete this long after its headers (however it trickles) is answered "
                        "408 and its connection closed")
    g.add_argument("--max-connections", type=int, default=None, metavar="N",
                   help="open connections per API server; past it a new connection replaces the oldest one still "
                        "sending its request, or is answered 503 when all are being served (default: "
                        f"{RESERVED_FDS} below the file-descriptor limit, which the server first raises to "
                        "the hard limit, ulimit -Hn, up to 65,536)")
    g.add_argument("--keep-alive-timeout-s", type=float, default=d.keep_alive_timeout_s, metavar="S",
                   help="an idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)")
    g.add_argument("--shutdown-timeout-s", type=float, default=d.shutdown_timeout_s, metavar="S",
                   help="on SIGTERM or Ctrl-C: stop accepting, let running requests finish for this long, then abort "
                        "what is left (finish_reason \"abort\") and exit 0; a second signal exits at once")
    g.add_argument("--responses-store-size", type=int, default=d.responses_store_size, metavar="N",
                   help="/v1/responses each API server process keeps in memory (the N most recently used) for "
                        "previous_response_id and GET /v1/responses/{id}; 0 keeps none")


def _names(text: str) -> list[str]:
    """A flag's list of names: comma-separated, or a JSON list (as vLLM's --allowed-origins takes it)."""
    try:
        values = json.loads(text) if text.lstrip().startswith("[") else text.split(",")
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give names separated by commas, or a JSON list of strings")
    return [v.strip() for v in values if v.strip()]


def _add_access_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="every route but /health, /metrics and /version then needs the header 'Authorization: Bearer "
                        "KEY' (401 otherwise); default: the INFER_API_KEY environment variable, else no key")
    g.add_argument("--allowed-origins", type=_names, action="extend", default=[], metavar="ORIGINS",
                   help="browser origins (scheme://host[:port]) allowed to call the server (CORS), comma-separated, "
                        "repeated or a JSON list; * allows any; default: none, so no web page of another origin can")
    g.add_argument("--allowed-hosts", type=_names, action="extend", default=[], metavar="HOSTS",
                   help="Host header names served besides loopback ones (localhost, 127.0.0.1, [::1]), "
                        "comma-separated or repeated; * serves any. On a loopback --host other names are refused (421: "
                        "a web page cannot reach the server by DNS rebinding); elsewhere they are checked only when "
                        "this is given")


def _flag_defaults():  # -> EngineConfig (imported lazily: startup time)
    """EngineConfig's defaults, for the flags. Made for the CPU: device "auto" would import torch to look for CUDA
    (~2 s of every `infer` command, --help included); no flag's default is one of the fields the device sets."""
    from infer.engine.config import EngineConfig

    return EngineConfig(device="cpu")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    from infer.engine.config import BATCHING_MODES, KV_BACKENDS, LOAD_FORMATS, SCHEDULER_POLICIES, EngineConfig
    from infer.sampling.params import POOLINGS

    d = _flag_defaults()
    g = p.add_argument_group("engine")
    g.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"],
                   help="weight and activation dtype; auto = float32 on CPU, bfloat16 on CUDA")
    g.add_argument("--device", default=EngineConfig.device,
                   help="cpu, cuda, cuda:N, or auto: CUDA where a GPU is visible (CUDA_VISIBLE_DEVICES), else the CPU")
    g.add_argument("--max-seq-len", "--max-model-len", type=int, default=d.max_seq_len, metavar="N",
                   help="longest prompt + output, in tokens (--max-model-len: vLLM's name)")
    g.add_argument("--max-batch-size", "--max-num-seqs", type=int, default=None, metavar="N",
                   help="most requests running at once (default: 256 on CUDA, 32 on the CPU; --max-num-seqs: vLLM's "
                        "name)")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="most tokens in one step, decodes and prefill chunks together (default: max(8192, max-seq-len))")
    g.add_argument("--batching-mode", default=d.batching_mode, choices=BATCHING_MODES,
                   help="continuous admits requests every step; static only once the running batch has finished")
    g.add_argument("--scheduler-policy", default=d.scheduler_policy, choices=SCHEDULER_POLICIES,
                   help="fcfs: admit in arrival order; prefill_first: admit whatever fits, overtaking a blocked "
                        "request at most --fairness-steps times; decode_round_robin: prefill (chunks) every other "
                        "step while requests decode")
    g.add_argument("--fairness-steps", type=int, default=d.fairness_steps, metavar="N",
                   help="every decoding request gets a token at least once every N steps")
    g.add_argument("--kv-cache-backend", default=d.kv_cache_backend, choices=KV_BACKENDS, help="KV cache layout")
    g.add_argument("--pooling", default=d.pooling, choices=POOLINGS,
                   help="embeddings (/v1/embeddings, LLM.embed): pool the final hidden states of the last token "
                        "(decoder embedders such as Qwen3-Embedding), their mean, or the first token's")
    g.add_argument("--block-size", type=int, default=d.block_size, metavar="N", help="tokens per KV block (paged)")
    g.add_argument("--num-kv-blocks", type=int, default=None, metavar="N",
                   help="KV blocks to allocate (default: as many as --kv-cache-memory-gb holds)")
    g.add_argument("--kv-cache-memory-gb", type=float, default=None, metavar="GB",
                   help="KV cache size (default: 1 on the CPU; on CUDA what --gpu-memory-utilization leaves)")
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization, metavar="F",
                   help="CUDA: the share of the device's memory the engine may use; the KV cache gets what the "
                        "weights and the largest step's activations leave of it")
    g.add_argument("--max-waiting-requests", type=int, default=d.max_waiting_requests, metavar="N",
                   help="queued requests beyond this are answered 503")
    g.add_argument("--seed", type=int, default=d.seed, help="engine seed for requests that do not set one")
    g.add_argument("--cuda-graphs", dest="use_cuda_graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay steps as CUDA graphs captured at startup: decode by batch size, and prefill and "
                        "mixed steps by token count up to 8192 (default: on with the paged cache; on the CPU each "
                        "batch size's decode is recorded on its second step and replayed without Python, and "
                        "prefill runs eagerly); --no-cuda-graphs runs every step eagerly")
    g.add_argument("--enforce-eager", dest="use_cuda_graphs", action="store_const", const=False,
                   help="vLLM's name for --no-cuda-graphs: every step runs eagerly")
    g.add_argument("--load-format", default=d.load_format, choices=LOAD_FORMATS,
                   help="auto reads the checkpoint's weights; dummy uses random weights (benchmarking)")
    g.add_argument("--structured-compile-timeout-s", type=float, default=d.structured_compile_timeout_s,
                   metavar="S", help="a structured-output constraint whose grammar is not compiled within this is "
                                     "refused (400 naming the field); compiles run on worker threads, never on the "
                                     "path other requests share")
    _add_chat_template_flag(g)
    g.add_argument("--generation-config", default=d.generation_config, metavar="auto|vllm|FOLDER",
                   help="vLLM's: auto takes the sampling fields (temperature, top_p, top_k, min_p, "
                        "repetition_penalty) of the model directory's generation_config.json as the defaults of "
                        "requests that leave them out; vllm ignores the file; a FOLDER reads its generation_config.json")
    _add_quantization_flag(g)
    _add_probe_flag(g)
    _add_runner_flag(g)
    _add_prefill_flags(g)
    _add_speculative_flags(p.add_argument_group("speculative decoding"))
    _add_lora_flags(p.add_argument_group("LoRA adapters (docs/lora.md)"))
    _add_distributed_flags(p.add_argument_group("scale-out: tensor and data parallelism (docs/distributed.md)"))


def _lora_module(text: str) -> tuple[str, str]:
    """--lora-modules NAME=PATH (vLLM's form; its JSON form {"name": ..., "path": ...} too)."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
            return str(entry["name"]), str(entry["path"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: a JSON module needs 'name' and 'path' ({exc})") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PATH (a PEFT adapter directory)")
    return name, path


def _add_lora_flags(g: argparse._ArgumentGroup) -> None:
    d = _flag_defaults()
    g.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters over the base model: a request's `model` names one (vLLM's flags)")
    g.add_argument("--lora-modules", type=_lora_module, nargs="+", action="extend", default=[], metavar="NAME=PATH",
                   help="PEFT adapter directories served under NAME from the start (more at run time: POST "
                        "/v1/load_lora_adapter)")
    g.add_argument("--max-loras", type=int, default=d.max_loras, metavar="N",
                   help="adapters held on the device at once (a step mixes at most N; others wait their turn)")
    g.add_argument("--max-lora-rank", type=int, default=d.max_lora_rank, metavar="R",
                   help="the largest adapter rank accepted (device slots are sized for it)")
    g.add_argument("--max-cpu-loras", type=int, default=None, metavar="M",
                   help="read adapters kept in host memory, least recently used dropped first (default: --max-loras)")


def _lora_options(args: argparse.Namespace) -> dict[str, object]:
    """The LoRA fields of EngineConfig from `serve`'s flags (a duplicate NAME is an error, not a silent override)."""
    names = [name for name, _ in args.lora_modules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--lora-modules names {', '.join(twice)} more than once")
    return dict(enable_lora=args.enable_lora or bool(args.lora_modules), max_loras=args.max_loras,
                max_lora_rank=args.max_lora_rank, max_cpu_loras=args.max_cpu_loras,
                lora_modules=dict(args.lora_modules) or None)


def _add_distributed_flags(g: argparse._ArgumentGroup) -> None:
    from infer.engine.config import LOAD_BALANCE_METHODS

    d = _flag_defaults()
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=d.tensor_parallel_size, metavar="N",
                   help="shard the model over N ranks (consecutive GPUs from --device; CPU processes on gloo)")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="a mixture of experts' whole experts on the --tensor-parallel-size ranks (E / N each), "
                        "instead of every expert's slice of its intermediate dimension on every rank")
    g.add_argument("-dp", "--data-parallel-size", type=int, default=d.data_parallel_size, metavar="N",
                   help="run N engine cores, each with its own tensor-parallel group, behind the API server")
    g.add_argument("--load-balance-method", default=d.load_balance_method, choices=LOAD_BALANCE_METHODS,
                   help="how a request picks its data-parallel engine: least_load (waiting + running + in flight), "
                        "round_robin, or prefix_affinity (the same prompt prefix goes to the same engine)")
    g.add_argument("--nnodes", type=int, default=d.nnodes, metavar="N",
                   help="hosts the tensor-parallel ranks span (torchrun's NNODES / WORLD_SIZE are read when set)")
    g.add_argument("--node-rank", type=int, default=d.node_rank, metavar="R",
                   help="this host's rank among --nnodes: 0 serves, the others run headless workers")
    g.add_argument("--master-addr", default=d.master_addr, metavar="HOST", help="node 0's address for the rendezvous")
    g.add_argument("--master-port", type=int, default=d.master_port, metavar="PORT", help="node 0's rendezvous port")
    g.add_argument("--distributed-timeout-s", type=float, default=d.distributed_timeout_s, metavar="S",
                   help="a collective or a worker silent this long fails every in-flight request and stops the engine")


def _add_prefill_flags(g: argparse._ArgumentGroup) -> None:
    d = _flag_defaults()
    g.add_argument("--chunked-prefill", dest="use_chunked_prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="split long prompts into chunks that share steps with running decodes "
                                      "(default: on with continuous batching)")
    g.add_argument("--prefill-chunk-size", type=int, default=d.prefill_chunk_size, metavar="N",
                   help="most prompt tokens of one request in one step (chunked prefill)")
    g.add_argument("--max-prefill-chunks-per-step", type=int, default=None, metavar="N",
                   help="most requests prefilling in one step (default: as the token budget allows)")
    g.add_argument("--prefix-caching", "--enable-prefix-caching", dest="use_prefix_caching",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV blocks of prompt prefixes seen before (default: on with chunked prefill and the "
                        "paged cache; --enable-prefix-caching: vLLM's name)")


def _add_speculative_flags(g: argparse._ArgumentGroup) -> None:
    from infer.engine.config import DEFAULT_SPECULATIVE_TOKENS, SPECULATIVE_METHODS

    d = _flag_defaults()
    g.add_argument("--speculative-method", default=None, choices=[m for m in SPECULATIVE_METHODS if m],
                   help="propose draft tokens and verify them in one target forward (docs/speculative.md): "
                        "'ngram' looks the request's last tokens up in its own prompt and output; 'draft' runs "
                        "a smaller model (--draft-model) on the device")
    g.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                   help=f"draft tokens per step and request (default with a method: {DEFAULT_SPECULATIVE_TOKENS})")
    g.add_argument("--prompt-lookup-min", type=int, default=d.prompt_lookup_min, metavar="N",
                   help="ngram: the shortest suffix of the request looked up")
    g.add_argument("--prompt-lookup-max", type=int, default=d.prompt_lookup_max, metavar="N",
                   help="ngram: the longest suffix looked up (tried first)")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="draft: the drafter's checkpoint, with the target's tokenizer and vocabulary")
    g.add_argument("--speculative-disable-by-batch-size", type=int, default=None, metavar="N",
                   help="ngram: no drafts while N or more requests run; 0 drafts at every batch size (default: 2 on "
                        "the CPU, where n-gram drafting halved throughput from 2 requests on; 0 on CUDA, where it "
                        "still paid at batch 32 with high acceptance: docs/speculative.md)")


def _add_export_tokenizer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-tokenizer",
        help="write the model's tokenizer (with its chat template) as a Hugging Face tokenizer directory",
        description="Write the tokenizer of --model (default: the bundled SmolLM2) to DIR as tokenizer.json + "
                    "tokenizer_config.json, with the chat template the server renders, so clients that tokenize "
                    "locally (guidellm --processor DIR, aiperf --tokenizer DIR) need no hub download.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("directory", metavar="DIR", help="where to write the tokenizer files (created if missing)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="HF model directory or a .gguf file; default: the bundled SmolLM2-135M-Instruct GGUF")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="ship this Jinja2 chat template file (as `infer serve --chat-template FILE` renders with)")
    p.set_defaults(func=_export_tokenizer)


HTTP_FLAGS = ("max_request_body_mb", "header_timeout_s", "body_timeout_s", "body_deadline_s", "max_connections",
              "keep_alive_timeout_s", "shutdown_timeout_s", "responses_store_size")
PREFILL_FLAGS = ("use_chunked_prefill", "prefill_chunk_size", "max_prefill_chunks_per_step", "use_prefix_caching")
SPECULATIVE_FLAGS = ("speculative_method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_model",
                     "speculative_disable_by_batch_size")
DISTRIBUTED_FLAGS = ("tensor_parallel_size", "enable_expert_parallel", "data_parallel_size", "load_balance_method",
                     "nnodes", "node_rank", "master_addr", "master_port", "distributed_timeout_s")
ENGINE_FLAGS = ("dtype", "device", "max_seq_len", "max_batch_size", "max_num_batched_tokens", "batching_mode",
                "scheduler_policy", "fairness_steps", "kv_cache_backend", "block_size", "num_kv_blocks",
                "kv_cache_memory_gb", "gpu_memory_utilization", "max_waiting_requests", "seed", "use_cuda_graphs", "load_format", "quantization", "probes",
                "structured_compile_timeout_s", "runner", "chat_template", "generation_config", "pooling", *PREFILL_FLAGS,
                *SPECULATIVE_FLAGS, *DISTRIBUTED_FLAGS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infer", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_generate(sub)
    _add_serve(sub)
    _add_export_tokenizer(sub)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from infer.engine.config import EngineConfig
    from infer.server.launch import serve
    from infer.server.limits import ServerLimits

    if args.api_server_count is not None and args.api_server_count < 1:
        raise ValueError(f"--api-server-count={args.api_server_count}: must be >= 1")
    limits = ServerLimits(**{name: getattr(args, name) for name in HTTP_FLAGS}, access=_access(args))
    config = EngineConfig(model=args.model, **{name: getattr(args, name) for name in ENGINE_FLAGS},
                          **_lora_options(args))  # type: ignore[arg-type]
    if _headless(config):
        return _run_headless(config)
    _show_sampling_defaults(config)
    return serve(config, args.host, args.port, args.served_model_name, args.log_level, args.api_server_count, limits)


def _access(args: argparse.Namespace):  # -> AccessPolicy (imported lazily: startup time)
    """Who may call `infer serve`; one warning when it listens beyond this machine without an API key."""
    from infer.server.access import AccessPolicy, is_loopback

    key = args.api_key if args.api_key is not None else os.environ.get("INFER_API_KEY") or None
    policy = AccessPolicy(key, tuple(args.allowed_origins), tuple(args.allowed_hosts), args.host)
    if key is None and not is_loopback(args.host):
        print(f"[infer] warning: --host {args.host} listens beyond this machine and no API key is set: anyone who "
              f"can reach port {args.port} can use the server (set --api-key or INFER_API_KEY)", file=sys.stderr,
              flush=True)
    return policy


def _show_sampling_defaults(config) -> None:  # (EngineConfig) imported lazily: startup time
    """Print the sampling defaults the generation config gives requests; a bad file fails here, before loading."""
    from infer.loader.model_path import resolve_model_path
    from infer.loader.generation_config import generation_config_file, sampling_defaults

    path = resolve_model_path(config.model)
    defaults = sampling_defaults(config.generation_config, path)
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
        print(f"[infer] sampling defaults of requests that leave them out: {shown} (from "
              f"{generation_config_file(config.generation_config, path)}; --generation-config vllm ignores it)",
              file=sys.stderr, flush=True)


def _headless(config) -> bool:  # (EngineConfig) imported lazily: startup time
    from infer.distributed.torchrun import under_torchrun

    if config.node_rank == 0 and not under_torchrun():  # node 0 without torchrun: no need to import torch to say so
        return False
    from infer.distributed.startup import distributed_config, headless

    return headless(distributed_config(config))


def _run_headless(config) -> int:
    """A node (or torchrun rank) other than 0: tensor-parallel workers only, until rank 0 stops."""
    from infer.distributed.startup import distributed_config, run_headless

    config = distributed_config(config)
    print(f"[infer] headless: tensor-parallel ranks of node {config.node_rank} of {config.nnodes}, rendezvous at "
          f"{config.master_addr}:{config.master_port}", file=sys.stderr, flush=True)
    return run_headless(config)


def _constraint(args: argparse.Namespace):  # -> Constraint | None (imported lazily: startup time)
    from infer.structured import Constraint

    if args.regex is not None:
        return Constraint("regex", args.regex)
    if args.json_schema is not None:
        return Constraint.json_schema(Path(args.json_schema).read_text())
    return None


def _generate(args: argparse.Namespace) -> int:
    from infer.llm import LLM
    from infer.sampling.params import SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.show_probes is not None and args.probes is None:
        raise ValueError("--show-probes needs --probes FILE")
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, max_tokens=args.max_tokens,
        repetition_penalty=args.repetition_penalty, stop=args.stop, seed=args.seed, ignore_eos=args.ignore_eos,
        structured=_constraint(args), probes=True if args.probes else None,
    )
    options = dict(dtype=args.dtype, device=args.device, max_seq_len=args.max_seq_len, max_batch_size=1,
                   chat_template=args.chat_template,
                   probes=args.probes, quantization=args.quantization, runner=args.runner,
                   tensor_parallel_size=args.tensor_parallel_size, enable_expert_parallel=args.enable_expert_parallel,
                   **{name: getattr(args, name) for name in (*PREFILL_FLAGS, *SPECULATIVE_FLAGS)})
    if args.lora is not None:  # served under its directory's name, the device slot sized for its rank
        from dataclasses import replace

        from infer.lora.adapter import config_rank

        name = Path(args.lora).resolve().name or "adapter"
        options.update(enable_lora=True, max_lora_rank=max(16, config_rank(Path(args.lora))),
                       lora_modules={name: args.lora})
        params = replace(params, lora=name)
    if "RANK" in os.environ:  # started by torchrun: the ranks other than 0 only run workers
        from infer.engine.config import EngineConfig

        config = EngineConfig(model=args.model, **options)  # type: ignore[arg-type]
        if _headless(config):
            return _run_headless(config)
    print(f"[infer] loading {args.model or 'the bundled SmolLM2-135M-Instruct'} ...", file=sys.stderr, flush=True)
    with LLM(args.model, **options) as llm:  # closing stops a tensor-parallel engine's workers
        print(f"[infer] loaded {llm.path.name} ({llm.model_config.model_type}) in {llm.load_seconds:.1f}s",
              file=sys.stderr)
        return _stream_answer(args, llm, prompt, params)


def _stream_answer(args: argparse.Namespace, llm, prompt: str, params) -> int:
    """Stream one answer to stdout, then its rates and probe scores to stderr."""
    from omniscience.shading import legend, shade

    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = llm.encode_chat(messages + [{"role": "user", "content": prompt}])
    else:
        ids = llm.encode(prompt)
    shown = _shown_probe(llm, args.show_probes)
    if shown is not None and not _colour_ok(sys.stdout):
        print("[infer] --show-probes: no shading (stdout is not a terminal, or NO_COLOR is set); the mean scores "
              "follow the text", file=sys.stderr)
        shown = None
    started, count, reason, first = time.perf_counter(), 0, None, None
    scores: dict[str, list[float]] = {}
    for out in llm.stream(ids, params):
        if first is None and out.token_id is not None:
            first = time.perf_counter()  # the prompt's prefill and the first token
        token_scores = out.probe_dict() or {}
        for name, value in token_scores.items():
            scores.setdefault(name, []).append(value)
        text = out.text_delta
        if shown is not None:
            text = shade(text, token_scores.get(shown.name), shown.activation)
        sys.stdout.write(text)
        sys.stdout.flush()
        count, reason = out.completion_tokens, out.finish_reason
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n")
    print(f"[infer] {count} tokens in {elapsed:.2f}s ({count / elapsed:.1f} tok/s), finish_reason={reason}", file=sys.stderr)
    if first is not None and count > 1:  # the rate above includes the prompt; decode alone, from the first token on
        decode_s = time.perf_counter() - first
        print(f"[infer] first token after {first - started:.2f}s ({len(ids)} prompt tokens); decode "
              f"{(count - 1) / decode_s:.1f} tok/s over the other {count - 1} tokens", file=sys.stderr)
    if shown is not None:
        print(f"[infer] shading: {legend(shown.name, shown.layer, shown.activation)}", file=sys.stderr)
    for name, values in scores.items():
        print(f"[infer] probe {name}: mean {sum(values) / len(values):.4f} over {len(values)} tokens", file=sys.stderr)
    return 0


def _colour_ok(stream) -> bool:
    """Colour codes only for a terminal, and never with NO_COLOR set (no-color.org): pipes and files get plain text."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _shown_probe(llm, name: str | None):  # -> ProbeInfo | None
    """The probe --show-probes shades by (an empty NAME: the first loaded)."""
    if name is None:
        return None
    infos = llm.probes()
    found = next((p for p in infos if p.name == name or not name), None)
    if found is None:
        raise ValueError(f"--show-probes: unknown probe {name!r}; loaded: {', '.join(p.name for p in infos)}")
    return found


def _export_tokenizer(args: argparse.Namespace) -> int:
    from infer.families.chat_template import chat_template_name
    from infer.loader.model_path import resolve_model_path
    from infer.loader.model_loader import read_config
    from infer.loader.tokenizer import Tokenizer
    from infer.families.chat_template import ChatTemplateError, load_template_file, template_source

    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_path(path)
    if args.chat_template is not None:
        load_template_file(args.chat_template)  # ChatTemplateError (a ValueError) names the file and the line
        template = Path(args.chat_template).expanduser().read_text()
    else:
        try:
            template = template_source(chat_template_name(read_config(path).model_type, tokenizer))
        except ChatTemplateError:
            template = None  # a base model: no chat template to ship
    hf = tokenizer.to_transformers()
    hf.chat_template = template
    written = hf.save_pretrained(args.directory)
    print(f"[infer] wrote {', '.join(sorted(Path(f).name for f in written))} to {args.directory}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"infer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
