"""The flag groups `infer generate` and `infer serve` share (chat template, quantization, runner, probes, prefill,
speculative decoding) and those of `serve`'s engine (EngineConfig's fields, LoRA, scale-out), with the names of
the flags each EngineConfig / ServerLimits field is read from."""

from __future__ import annotations

import argparse
import json


def _flag_defaults():  # -> EngineConfig (imported lazily: startup time)
    """EngineConfig's defaults, for the flags. Made for the CPU: device "auto" would import torch to look for CUDA
    (~2 s of every `infer` command, --help included); no flag's default is one of the fields the device sets."""
    from infer.engine.config import EngineConfig

    return EngineConfig(device="cpu")


def add_chat_template_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja2 chat template file (as transformers renders them) used instead of the model family's "
                        "bundled template; tool calls and Qwen 3's reasoning are still read in the family's format")


def add_quantization_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    from infer.engine.config import QUANTIZATIONS

    p.add_argument("--quantization", default="auto", choices=QUANTIZATIONS,
                   help="auto: weights stay as the checkpoint stores them (FP8 / INT8 checkpoints 8-bit; a GGUF's 4-bit "
                        "weights 4-bit and Q8_0 ones 8-bit); none: dequantize everything to --dtype (exact parity work); "
                        "int4 / int8 / fp8: quantize every linear weight at load to 4-bit groups of 32, int8 "
                        "per output row, or float8 e4m3 in 128x128 blocks (CUDA SM89+, or slowly on the CPU; fp8 "
                        "also quantizes a mixture of experts' experts on CUDA). See docs/quantization.md")


def add_runner_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    from infer.engine.config import RUNNERS

    p.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="execution engine: torch (CPU, CUDA) or mlx (Apple silicon through Metal; MLX's CPU backend "
                        "elsewhere; needs the mlx extra); auto picks mlx on Apple silicon with Metal, torch "
                        "elsewhere. See docs/apple.md")


def add_probe_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--probes", default=None, metavar="FILE",
                   help="a probe-set YAML file: linear probes on the residual stream, scored for every token "
                        "(docs/omniscience.md)")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
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
    add_chat_template_flag(g)
    g.add_argument("--generation-config", default=d.generation_config, metavar="auto|vllm|FOLDER",
                   help="vLLM's: auto takes the sampling fields (temperature, top_p, top_k, min_p, "
                        "repetition_penalty) of the model directory's generation_config.json as the defaults of "
                        "requests that leave them out; vllm ignores the file; a FOLDER reads its generation_config.json")
    add_quantization_flag(g)
    add_probe_flag(g)
    add_runner_flag(g)
    add_prefill_flags(g)
    add_speculative_flags(p.add_argument_group("speculative decoding"))
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


def lora_options(args: argparse.Namespace) -> dict[str, object]:
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


def add_prefill_flags(g: argparse._ArgumentGroup) -> None:
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


def add_speculative_flags(g: argparse._ArgumentGroup) -> None:
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
