#!/usr/bin/env bash
# Decode of the Qwen3-30B-A3B shape (random bf16 weights, CUDA graphs; MOE_AB_BATCHES, default 1; MOE_AB_PREFILL, the
# prefill chunk, default 256, which with the 256 tokens of a sequence sets max_seq_len: 384, or 1152 at 1024 as the
# headline run) on two trees in one call, alternated:
# the tree as it is and an earlier one unpacked under $BEFORE_SRC (`git archive REV src | tar -x -C .ab_before`,
# carried). MOE_AB_TESTS: pytest node ids run first (strict sync is the GPU tests' default); MOE_AB_ROUNDS rounds of
# (before, after); MOE_AB_ENV: extra environment for a row "env" (the after tree with it); MOE_AB_PATCH: Python run
# before the benchmark for a row "patch" (the before tree, or the after one without BEFORE_SRC), e.g.
# "import layerzero.kernels.triton.paged_attention as m; m._MIN_TOKENS_PER_SPLIT = 4096"; MOE_AB_PATCH_<NAME>: more
# such rows, one per variable, each named NAME; MOE_AB_MAX_BATCH: the engines' max_batch_size (default: 1, the batch
# measured; the headline run's engine takes 256); MOE_AB_TREES: more trees, a row each, named by their folders under
# .ab_trees/ (each holds an edited copy of src, e.g. a kernel variant; git-ignored, carried). Usage (device tool,
# carrying .whl and .ab_before):  BEFORE_SRC=.ab_before/src bash scripts/gpu_moe_ab.sh
set -uo pipefail
source scripts/gpu_env.sh
if [ -n "${MOE_AB_TESTS:-}" ]; then
  timeout "${MOE_AB_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider $MOE_AB_TESTS > "$out/ab_tests.log" 2>&1
  grep -E "^E  |passed|failed|error" "$out/ab_tests.log" | head -20
fi
run() {  # name, PYTHONPATH prefix, extra env, Python to run first
  env $3 PYTHONPATH="$2:tests:benchmarks:/tmp/site" timeout "${MOE_AB_S:-170}" python3 - "$4" "$out/moe_$1" \
    "${MOE_AB_BATCHES:-1}" "${MOE_AB_PREFILL:-256}" "${MOE_AB_MAX_BATCH:-}" > "$out/moe_$1.log" 2>&1 <<'PY'
import runpy, sys
exec(sys.argv[1])
most = ["--max-batch-size", sys.argv[5]] if sys.argv[5] else []
sys.argv = ["moe_decode.py", "--batches", sys.argv[3], "--prefill", sys.argv[4], "--no-peer", "--repeats", "3",
            "--out", sys.argv[2], *most]
runpy.run_path("benchmarks/moe_decode.py", run_name="__main__")
PY
  echo "$1: exit $? $(grep -E '^\| infer \(decode_once\)' "$out/moe_$1.log" | head -1)"
  grep -E '^\| infer \| ' "$out/moe_$1.log" | head -3
}
for round in $(seq 1 "${MOE_AB_ROUNDS:-1}"); do
  [ -n "${BEFORE_SRC:-}" ] && run "before$round" "$BEFORE_SRC" "" ""
  run "after$round" src "" ""
  for tree in ${MOE_AB_TREES:-}; do
    run "$tree$round" ".ab_trees/$tree/src" "" ""
  done
  [ -n "${MOE_AB_ENV:-}" ] && run "env$round" src "$MOE_AB_ENV" ""
  [ -n "${MOE_AB_PATCH:-}" ] && run "patch$round" "${BEFORE_SRC:-src}" "" "$MOE_AB_PATCH"
  for var in $(compgen -v MOE_AB_PATCH_); do
    run "${var#MOE_AB_PATCH_}$round" "${BEFORE_SRC:-src}" "" "${!var}"
  done
done
