#!/usr/bin/env bash
# Where a tensor-parallel start on the GPUs stops: one TP=2 engine on the tiny Llama, every process's Python stack
# dumped (SIGABRT with PYTHONFAULTHANDLER) if it has not finished within $1 seconds.
set -uo pipefail
source scripts/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONFAULTHANDLER=1
cat > /tmp/tp_debug.py <<'PY'
import time, sys
from pathlib import Path
from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
if __name__ == "__main__":
    path = save_tiny_with_tokenizer("llama", Path("/tmp/tp_debug_llama"))
    t = time.time()
    with LLM(str(path), dtype="bfloat16", tensor_parallel_size=2) as llm:
        print("built", time.time() - t, flush=True)
        print(llm.generate_ids([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids, flush=True)
    print("done", time.time() - t, flush=True)
PY
python3 /tmp/tp_debug.py > "$out/tp_debug.log" 2>&1 &
pid=$!
for i in $(seq 1 "${1:-90}"); do sleep 1; kill -0 $pid 2>/dev/null || break; done
if kill -0 $pid 2>/dev/null; then
  pkill -ABRT -f "multiprocessing.spawn" ; sleep 2; kill -ABRT $pid; sleep 3
fi
grep -v "Loading" "$out/tp_debug.log" | tail -80
