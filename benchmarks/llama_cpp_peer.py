"""llama.cpp as the CPU decode peer, run by an interpreter that has `llama-cpp-python` (never a project dependency):

    python -m venv /tmp/llamacpp && /tmp/llamacpp/bin/pip install llama-cpp-python==0.3.36   # compiles llama.cpp
    /tmp/llamacpp/bin/python benchmarks/llama_cpp_peer.py MODEL.gguf THREADS

`benchmarks/cpu_decode.py --llama-cpp-python /tmp/llamacpp/bin/python` starts it and sends one JSON line per
measurement, {"ids": [...], "tokens": N}; it answers {"prompt_tok_s": ..., "decode_tok_s": ...}: the prompt's
tokens over its evaluation time, and N - 1 greedy tokens over the time after the first (EOS ignored).
"""

from __future__ import annotations

import json
import sys
import time

from llama_cpp import Llama


def measure(llm: Llama, ids: list[int], tokens: int) -> dict[str, float]:
    llm.reset()
    started = time.perf_counter()
    llm.eval(ids)
    token = llm.sample(top_k=1)
    first = time.perf_counter()
    for _ in range(tokens - 1):
        llm.eval([token])
        token = llm.sample(top_k=1)
    done = time.perf_counter()
    return {"prompt_tok_s": len(ids) / (first - started), "decode_tok_s": (tokens - 1) / (done - first)}


def main() -> None:
    model, threads = sys.argv[1], int(sys.argv[2])
    llm = Llama(model_path=model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    print(json.dumps({"ready": True, "version": __import__("llama_cpp").__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(measure(llm, request["ids"], request["tokens"])), flush=True)


if __name__ == "__main__":
    main()
