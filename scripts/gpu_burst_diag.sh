#!/usr/bin/env bash
# The fresh-connection burst once more, with the first run after start and the TTFT deciles printed (reports under $OUT).
# Usage (device tool, from the repo root, carrying .whl):  bash scripts/gpu_burst_diag.sh
set -uo pipefail
source scripts/gpu_env.sh
sysctl net.core.somaxconn net.ipv4.tcp_max_syn_backlog 2>&1; ulimit -n; nproc
OUT_DIR="$out" timeout 280 python3 benchmarks/serve_vs_offline.py --api-server-count 4 --levels 256 --repeats 2 --fresh-connections > "$out/diag.log" 2>&1
python3 -c "
import json; r=json.load(open('$out/serve_vs_offline_${gpu_tag}_api4_fresh.json'))
s=r['levels']['256']['server']; print('first', json.dumps(s['first_run'])); print('median', s['tok_s'], s['ttft_from_release_ms_deciles'])
print('offline', r['levels']['256']['offline'])"
