#!/usr/bin/env bash
# Serving-throughput benchmark of the default model (not a test): output tokens/s of
# `dserve bench throughput` at 1, 8, 32 and 64 concurrent requests (or $CONCURRENCY),
# each the best of $REPEATS runs, with each figure's ratio to one request, and the
# ceiling this machine puts on that ratio:
#   one request reads every weight once per token, so it runs at most at memory speed;
#   C requests run C tokens per weight read, so they run at most at the speed of the
#   batched int8 kernel (measured here with build/bench/matmul_bench: 32 tokens on
#   the same threads, the model's vocabulary projection). ceiling = (kernel MAC/s / MACs per token) / (one
#   request's tokens/s), before attention, sampling and the prefill take their share.
#   tools/bench_throughput.sh build/dserve MODEL.gguf
set -euo pipefail
DSERVE=${1:-build/dserve}
MODEL=${2:-$HOME/.cache/dserve/models/SmolLM2-135M-Instruct.Q4_1.gguf}
CONCURRENCY=${CONCURRENCY:-"1 8 32 64"}
REPEATS=${REPEATS:-2}
THREADS=${THREADS:-2}
INPUT_LEN=${INPUT_LEN:-16}
OUTPUT_LEN=${OUTPUT_LEN:-128}
MATMUL_BENCH=${MATMUL_BENCH:-$(dirname "$DSERVE")/bench/matmul_bench}
PY=${PY:-.venv/bin/python}

# Multiply-accumulates per token: every 2-D weight is one matrix-vector product (the
# embedding table is read by rows, but SmolLM2 ties it to the output projection).
MACS=$($PY -c "import gguf,sys; r=gguf.GGUFReader(sys.argv[1]); print(sum(int(t.n_elements) for t in r.tensors if len(t.shape) == 2))" "$MODEL")

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, --threads $THREADS"
echo "model: $(basename "$MODEL"), $MACS MACs per token; input $INPUT_LEN, output $OUTPUT_LEN tokens"
echo
echo "| concurrent requests | output tok/s | x one request |"
echo "|---|---|---|"
one=""
for c in $CONCURRENCY; do
  best=0
  for _ in $(seq "$REPEATS"); do
    r=$("$DSERVE" bench throughput --model "$MODEL" --dataset-name random --num-prompts "$c" \
          --max-num-seqs "$c" --threads "$THREADS" --input-len "$INPUT_LEN" \
          --output-len "$OUTPUT_LEN" 2>&1 | sed -nE 's/.* ([0-9.]+) output tokens\/s.*/\1/p')
    best=$(awk -v a="$best" -v b="$r" 'BEGIN { print (b > a) ? b : a }')
  done
  [ -z "$one" ] && one=$best
  printf "| %s | %.0f | %.1f |\n" "$c" "$best" "$(awk -v a="$best" -v b="$one" 'BEGIN { print a / b }')"
done

if [ -x "$MATMUL_BENCH" ]; then
  gmacs=$(DSERVE_BENCH_THREADS=$THREADS DSERVE_BENCH_TOKENS=32 "$MATMUL_BENCH" \
            --benchmark_filter='batch32/q4_1/vocab.*prepared' 2>&1 |
          sed -nE 's/.*GMAC\/s=([0-9.]+).*/\1/p' | head -1)
  awk -v g="$gmacs" -v t="$THREADS" -v m="$MACS" -v one="$one" 'BEGIN {
    peak = g * 1e9 / m
    printf "\nbatched Q4_1 kernel: %.0f GMAC/s on %d threads -> at most %.0f tok/s for any batch;\n", g, t, peak
    printf "ceiling on the ratio to one request (%.0f tok/s): %.1fx, before attention and sampling\n", one, peak / one
  }'
fi
