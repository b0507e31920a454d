#!/usr/bin/env bash
# Tensor-parallel decode (benchmarks/tp_decode.py, 8B shape by default: TP_AB_SHAPE) of two trees in one call,
# alternated: an earlier tree unpacked under $BEFORE_SRC (`git archive REV src | tar -x -C .ab_before`, carried)
# and the tree as it is; then one row per patch: TP_AB_PATCH_<NAME>="python" is run at the start of every Python
# process of the row (the TP workers' too, through a sitecustomize), on the tree as it is, e.g.
#   TP_AB_PATCH_osplitk="import layerzero.kernels.triton.specs as s; s.GEMV_LONG_ROW = 2048"
# TP_AB_TP (default "1 2"), TP_AB_BATCHES (default 1), TP_AB_ROUNDS (default 1). Usage (device tool, carrying .whl
# and .ab_before, on a 2-GPU kind):  BEFORE_SRC=.ab_before/src bash scripts/gpu_tp_ab.sh
set -uo pipefail
source scripts/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run() {  # name, source tree, patch (Python, may be empty)
  local site; site=$(mktemp -d)
  [ -n "$3" ] && printf '%s\n' "$3" > "$site/sitecustomize.py"
  PYTHONPATH="$site:$2:tests:benchmarks:/tmp/site" timeout "${TP_AB_S:-200}" python3 benchmarks/tp_decode.py \
    --shape "${TP_AB_SHAPE:-llama-3.1-8b}" --tp ${TP_AB_TP:-1 2} --batches ${TP_AB_BATCHES:-1} --repeats 2 \
    --report "$out/tp_ab_$1.md" > "$out/tp_ab_$1.log" 2>&1
  echo "$1: exit $?"; grep -E "^TP=" "$out/tp_ab_$1.log"
}
for round in $(seq 1 "${TP_AB_ROUNDS:-1}"); do
  [ -n "${BEFORE_SRC:-}" ] && run "before$round" "$BEFORE_SRC" ""
  run "after$round" src ""
  for var in $(compgen -v TP_AB_PATCH_); do
    run "${var#TP_AB_PATCH_}$round" src "${!var}"
  done
done
