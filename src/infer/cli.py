"""The `infer` command line: `infer generate PROMPT` streams a completion to the terminal."""

from __future__ import annotations

import argparse
import sys
import time

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
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="divide logits of already-seen tokens by R (>1 discourages repeats)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when TEXT is generated (repeatable); TEXT is not printed")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="random seed for reproducible sampling")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weight and activation dtype; auto = float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto")
    p.add_argument("--max-seq-len", type=int, default=4096, metavar="N", help="longest prompt + output, in tokens")
    p.set_defaults(func=_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infer", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_generate(sub)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from infer.llm import LLM
    from infer.sampling.params import SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens,
        repetition_penalty=args.repetition_penalty, stop=args.stop, seed=args.seed, ignore_eos=args.ignore_eos,
    )
    print(f"[infer] loading {args.model or 'the bundled SmolLM2-135M-Instruct'} ...", file=sys.stderr, flush=True)
    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_seq_len=args.max_seq_len, max_batch_size=1)
    print(f"[infer] loaded {llm.path.name} ({llm.model_config.model_type}) in {llm.load_seconds:.1f}s", file=sys.stderr)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        ids = llm.encode_chat(messages + [{"role": "user", "content": prompt}])
    else:
        ids = llm.encode(prompt)
    started, count, reason = time.perf_counter(), 0, None
    for out in llm.stream(ids, params):
        sys.stdout.write(out.text_delta)
        sys.stdout.flush()
        count, reason = out.completion_tokens, out.finish_reason
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n")
    print(f"[infer] {count} tokens in {elapsed:.2f}s ({count / elapsed:.1f} tok/s), finish_reason={reason}", file=sys.stderr)
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
