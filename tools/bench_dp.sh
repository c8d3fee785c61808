#!/bin/bash
# Data parallelism on one machine (not a test): `dserve bench serve` against the default
# model served by one engine (DP 1, --threads 1) and by two "nodes" (DP 2: a head and a
# --headless node on localhost, --threads 1 each), with the CPU time the servers used
# (from /proc, utime + stime of each server and its children, over the run).
#
#   tools/bench_dp.sh [build/dserve] [MODEL]    (N=64 prompts, C=16 concurrent)
set -euo pipefail
B=${1:-build/dserve}
M=${2:-${DSERVE_MODEL:-${DSERVE_CACHE:-$HOME/.cache/dserve}/models/SmolLM2-135M-Instruct.Q4_1.gguf}}
N=${N:-64}; C=${C:-16}
cpu_ticks() {
  local t=0 p c s
  for p in "$@"; do
    for c in $p $(pgrep -P "$p" || true); do s=($(cat /proc/$c/stat)); t=$((t + s[13] + s[14])); done
  done
  echo $t
}
wait_ok() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done; return 1; }
run_bench() {  # port, server pids...
  local port=$1; shift
  wait_ok "$port"
  local c0 t0 c1 t1
  c0=$(cpu_ticks "$@"); t0=$(date +%s.%N)
  "$B" bench serve --base-url "http://127.0.0.1:$port" --model m --tokenizer "$M" --dataset-name random \
    --random-input-len 128 --random-output-len 128 --ignore-eos --num-prompts "$N" --max-concurrency "$C" \
    --request-rate inf --disable-tqdm 2>&1 |
    grep -E "Successful|Request throughput|Output token throughput|Mean TTFT|Median TTFT"
  c1=$(cpu_ticks "$@"); t1=$(date +%s.%N)
  echo "cores the servers used: $(echo "($c1 - $c0) / $(getconf CLK_TCK) / ($t1 - $t0)" | bc -l | cut -c1-4)"
}
COMMON=(--threads 1 --served-model-name m --max-num-seqs 32)
echo "== DP 1 (one engine, 1 thread)"
"$B" serve "$M" --host 127.0.0.1 --port 18001 "${COMMON[@]}" >/tmp/bench_dp1.log 2>&1 & P=$!
run_bench 18001 $P
kill $P; wait $P 2>/dev/null || true
echo "== DP 2 (two nodes on localhost, 1 thread each)"
DPF=(--data-parallel-size 2 --data-parallel-size-local 1 --data-parallel-address 127.0.0.1 --data-parallel-rpc-port 18100)
"$B" serve "$M" --host 127.0.0.1 --port 18002 "${COMMON[@]}" "${DPF[@]}" >/tmp/bench_dp2_head.log 2>&1 & H=$!
"$B" serve "$M" "${COMMON[@]}" "${DPF[@]}" --headless --data-parallel-start-rank 1 >/tmp/bench_dp2_node1.log 2>&1 & W=$!
run_bench 18002 $H $W
curl -s http://127.0.0.1:18002/metrics | grep -E '^vllm:request_success_total.*length' || true
kill $H $W; wait 2>/dev/null || true
