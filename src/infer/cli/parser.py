"""`infer`'s argument parser: its commands (generate, serve, export-tokenizer) and the flags only `serve` takes."""

from __future__ import annotations

import argparse
import json

from infer.cli import export, generate, serve
from infer.cli.flags import (
    add_chat_template_flag,
    add_engine_flags,
    add_prefill_flags,
    add_probe_flag,
    add_quantization_flag,
    add_runner_flag,
    add_speculative_flags,
)

DESCRIPTION = ("infer: an LLM inference runtime (Llama 3, Mistral, Qwen 3, Gemma 3, Phi-3, and the Qwen 3 MoE and "
               "Mixtral mixtures of experts; HF safetensors or GGUF).")


def build_parser() -> argparse.ArgumentParser:
    """`infer`'s parser: each command's parser names the function that runs it (`args.func`)."""
    parser = argparse.ArgumentParser(prog="infer", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_generate(sub).set_defaults(func=generate.run)
    _add_serve(sub).set_defaults(func=serve.run)
    _add_export_tokenizer(sub).set_defaults(func=export.run)
    return parser


def _add_generate(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    add_chat_template_flag(p)
    add_quantization_flag(p)
    add_probe_flag(p)
    add_runner_flag(p)
    p.add_argument("--show-probes", nargs="?", const="", default=None, metavar="NAME",
                   help="shade each generated token by its score of probe NAME (default: the first loaded probe) "
                        "and print every probe's mean score; needs --probes. Shading is for a terminal: piped "
                        "output, or NO_COLOR set, gets plain text and the mean scores")
    add_prefill_flags(p.add_argument_group("prefill"))
    add_speculative_flags(p.add_argument_group("speculative decoding"))
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="shard the model over N ranks (consecutive GPUs from --device; CPU processes on gloo)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="a mixture of experts' whole experts on the --tensor-parallel-size ranks (E / N each)")
    return p


def _add_serve(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    add_engine_flags(p)
    return p


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


def _add_export_tokenizer(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    return p
