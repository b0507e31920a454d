#!/usr/bin/env bash
# Tensor and data parallelism on the lent multi-GPU machine. Reports under $OUT. NVLink multicast stays off (never
# unset NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1; they are set here if absent).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_distributed.sh MODES
# MODES joins any of (e.g. `tests,tp,tp2profile`; `all` is every one; one device call holds at most 10 minutes, so
# split the modes over calls):
#   tests      the distributed GPU tests under INFER_STRICT_SYNC=1
#   allreduce  all-reduce time per call inside graphs
#   gemv       the sharded projections' GEMV against cuBLAS
#   profiles   a batch-1 decode profile at TP=1 and TP=2
#   tpgraph    the replayed batch-1 step's critical path by kernel at TP=1 and TP=2 (rank 0), 8B shape
#   tp         TP decode, Llama-3.1-8B shape, batch 1 and 32 (TP_BATCHES), TP=1/2(/4); tp2profile adds a TP=2 profile
#   tpprobe    TP=1 and TP=2 batch-1 decode, 8B shape, each engine step logged (benchmarks/core_step_probe.py): host
#              time, the GPU's step and its idle gap before it, into tp_core_probe.md
#   tpmoe      the same on the Qwen3-30B-A3B shape: TP=1, TP=2 with the experts sliced, TP=2 with whole experts
#   dp         offline DP=2 (DP=4 on 4 GPUs; DP_SIZE) against DP=1 in process, through one core process, one core
#              given half the prompts (DP_CONFIGS picks)
#   dpserve    `infer serve -dp 2` against the offline engine (DPSERVE_LEVELS, DPSERVE_API, DPSERVE_CLIENTS,
#              DPSERVE_REPEATS, DPSERVE_R: requests each stream sends in turn; DPSERVE_DP=1 serves one core,
#              the baseline; DPSERVE_ARGS: more `infer serve` flags, e.g. "--no-prefix-caching"; DPSERVE_PROBE=1:
#              every core's steps, by 2 s windows into core_probe.md (benchmarks/core_step_probe.py); DPSERVE_PATCH:
#              Python run at the start of every process of the run, the cores' too, through a sitecustomize)
#   dpab       `infer serve -dp 1` and `-dp 2` alternated, a fresh server each turn (benchmarks/dp_serve_ab.py;
#              DPAB_SIZES, DPAB_ROUNDS, DPAB_REPEATS, DPAB_LEVEL, DPAB_R, DPAB_API, DPAB_TAG names the report;
#              DPSERVE_PROBE and DPSERVE_PATCH too)
#   tpserve    `infer serve -tp 2` against the offline TP=2 engine, 8B shape, 64 streams
set -uo pipefail
source scripts/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mode="${1:-all}"
want() { [[ "$mode" == all || ",$mode," == *",$1,"* ]]; }  # whether MODES names $1
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
tps="1 2"; [[ $gpus -ge 4 ]] && tps="1 2 4"
echo "GPUs: $gpus ($(python3 -c 'import torch; print(torch.cuda.get_device_name())')); TP sizes: $tps"
profile() {  # where TP=$1's batch-1 step time goes (rank 0's kernels; collectives include waiting for the peers)
  timeout "$2" python3 benchmarks/profile_generation.py --model llama-3.1-8b --batch 1 --steps 20 --tp "$1" \
    --out "/tmp/profile_tp$1" > /dev/null 2>&1 && cp "/tmp/profile_tp$1/kernels.md" "$out/profile_tp$1.md"
  sed -n 5,7p "$out/profile_tp$1.md" 2>/dev/null
}
if want tests; then
  INFER_STRICT_SYNC=1 timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_tensor_parallel_gpu.py tests/gpu/test_reduce_norm_gpu.py 2>&1 | tail -40 > "$out/distributed_tests.log"
  tail -3 "$out/distributed_tests.log"
fi
if want allreduce; then
  timeout 80 python3 benchmarks/allreduce_latency.py --world "$gpus" --report "$out/allreduce.md" 2>&1 | tail -13
fi
if want gemv; then
  timeout 150 python3 benchmarks/gemv_bandwidth.py --shapes llama-3.1-8b-tp2 llama-3.1-8b --rows 1 \
    --out "$out/gemv_tp2" 2>&1 | tail -9
fi
if want profiles; then
  profile 1 90
  profile 2 90
fi
if want tpgraph; then
  for tp in 1 2; do
    timeout 150 python3 benchmarks/moe_kernel_profile.py --graph --shape llama-3.1-8b --tp $tp \
      --out "$out/critical_path_tp$tp" 2>&1 | grep -v Loading | sed -n 3,20p
  done
fi
if want tp; then
  timeout "${TP_S:-270}" python3 benchmarks/tp_decode.py --shape llama-3.1-8b --tp $tps --batches ${TP_BATCHES:-1 32} \
    --repeats 2 --report "$out/tp_decode.md" 2>&1 | grep -v "Loading" | tail -16
  want tp2profile && profile 2 70
fi
if want tpprobe; then
  probe_tp=$(mktemp -d)
  printf 'import core_step_probe\ncore_step_probe.install_on_import()\n' > "$probe_tp/sitecustomize.py"
  CORE_PROBE_DIR=/tmp/tp_core_probe PYTHONPATH="$probe_tp:$PYTHONPATH" timeout "${TPPROBE_S:-200}" \
    python3 benchmarks/tp_decode.py --shape llama-3.1-8b --tp 1 2 --batches 1 --repeats 2 \
    --report "$out/tp_decode_probed.md" 2>&1 | grep -E "^TP="
  python3 benchmarks/core_step_probe.py summarize /tmp/tp_core_probe > "$out/tp_core_probe.md"
  grep -A3 "^core_" "$out/tp_core_probe.md" | cut -c1-400
fi
if want tpmoe; then  # the Qwen3-30B-A3B shape: experts sliced by their intermediate dim (TP=2) or whole (2ep)
  timeout "${TPMOE_S:-420}" python3 benchmarks/tp_decode.py --shape qwen3-30b-a3b --tp 1 2 2ep \
    --batches ${TP_BATCHES:-1 32} --repeats 2 --report "$out/tp_decode_moe.md" 2>&1 | grep -v "Loading" | tail -16
fi
if want dp; then
  nvidia-smi topo -m > "$out/topology.txt" 2>&1; lscpu >> "$out/topology.txt" 2>&1
  dps=2; [[ $gpus -ge 4 ]] && dps=4  # DP=4 where four GPUs are lent
  timeout "${DP_S:-420}" python3 benchmarks/dp_throughput.py --shape llama-3.2-1b --dp "${DP_SIZE:-$dps}" --requests 1024 --repeats 3 \
    --configs "${DP_CONFIGS:-dp,share,core}" --report "$out/dp_throughput.md" 2>&1 | grep -v "Loading" | grep -v "start-up:" | tail -8
fi
probe_site=""  # dpserve / dpab: a sitecustomize run by every process of the run, the engine cores' too
if [[ -n "${DPSERVE_PROBE:-}${DPSERVE_PATCH:-}" ]]; then
  probe_site=$(mktemp -d)
  printf '%s\n' "${DPSERVE_PATCH:-}" > "$probe_site/sitecustomize.py"
fi
if [[ -n "${DPSERVE_PROBE:-}" ]]; then  # every core's steps (benchmarks/core_step_probe.py)
  export CORE_PROBE_DIR="$out/core_probe"
  printf 'import core_step_probe\ncore_step_probe.install_on_import()\n' >> "$probe_site/sitecustomize.py"
fi
if want dpserve; then  # DPSERVE_API: API server counts to run in turn (default: what `infer serve` picks)
  for api in ${DPSERVE_API:-default}; do
    count=(); [[ $api != default ]] && count=(--api-server-count "$api")
    PYTHONPATH="${probe_site:+$probe_site:}$PYTHONPATH" OUT_DIR="$out" timeout "${DPSERVE_S:-330}" \
      python3 benchmarks/serve_vs_offline.py --levels "${DPSERVE_LEVELS:-256,1024}" \
      --repeats "${DPSERVE_REPEATS:-1}" --data-parallel-size "${DPSERVE_DP:-2}" --client-processes "${DPSERVE_CLIENTS:-8}" \
      --requests-per-stream "${DPSERVE_R:-1}" "${count[@]}" ${DPSERVE_ARGS:+--serve-arg="$DPSERVE_ARGS"} 2>&1 \
      | grep -v Loading | tail -40
  done
fi
if want dpab; then  # DPAB_SIZES (1,2), DPAB_ROUNDS (3), DPAB_REPEATS (1), DPAB_LEVEL (1024), DPAB_R (4), DPAB_API (4)
  PYTHONPATH="${probe_site:+$probe_site:}$PYTHONPATH" OUT_DIR="$out" timeout "${DPAB_S:-560}" \
    python3 benchmarks/dp_serve_ab.py --sizes "${DPAB_SIZES:-1,2}" --rounds "${DPAB_ROUNDS:-3}" \
    --repeats "${DPAB_REPEATS:-1}" --level "${DPAB_LEVEL:-1024}" --requests-per-stream "${DPAB_R:-4}" \
    --client-processes 16 --api-server-count "${DPAB_API:-4}" --tag "${DPAB_TAG:-}" 2>&1 | grep -v Loading | tail -20
fi
if [[ -n "${DPSERVE_PROBE:-}" ]]; then
  python3 benchmarks/core_step_probe.py summarize "$CORE_PROBE_DIR" > "$out/core_probe.md"
fi
if want tpserve; then
  OUT_DIR="$out" timeout 280 python3 benchmarks/serve_vs_offline.py --shape llama-3.1-8b --levels 64 --repeats 1 \
    --tensor-parallel-size 2 2>&1 | grep -v Loading | tail -4
fi
