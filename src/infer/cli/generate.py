"""`infer generate PROMPT`: one completion streamed to the terminal, its rates and probe scores on stderr."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from infer.cli.flags import PREFILL_FLAGS, SPECULATIVE_FLAGS
from infer.cli.nodes import headless_node, run_headless_node


def _constraint(args: argparse.Namespace):  # -> Constraint | None (imported lazily: startup time)
    from infer.structured import Constraint

    if args.regex is not None:
        return Constraint("regex", args.regex)
    if args.json_schema is not None:
        return Constraint.json_schema(Path(args.json_schema).read_text())
    return None


def run(args: argparse.Namespace) -> int:
    """`infer generate PROMPT`: load the model, stream one answer to stdout."""
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
        if headless_node(config):
            return run_headless_node(config)
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
