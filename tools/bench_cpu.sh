#!/usr/bin/env bash
# CPU benchmark of the default model (not a test): prompt tokens/s on a 512-token
# prompt and decode tokens/s over 128 tokens, with 1 and 2 threads (or $THREADS),
# plus the memory bandwidth decode achieves: bytes of weights read per token x tokens/s.
#   tools/bench_cpu.sh build/dserve MODEL.gguf
set -euo pipefail
DSERVE=${1:-build/dserve}
MODEL=${2:-$HOME/.cache/dserve/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-"1 2"}
PY=${PY:-.venv/bin/python}

# Every weight is read once per decoded token (SmolLM2 ties the embedding to the output
# matrix, so the whole table is read by the output projection).
WEIGHT_BYTES=$($PY -c "import gguf,sys; r=gguf.GGUFReader(sys.argv[1]); print(sum(int(t.n_bytes) for t in r.tensors))" "$MODEL")
# A fixed 512-token prompt: ids 1000..1511 (content does not change speed).
IDS=$(seq -s, 1000 1511)

# (lscpu names ARM cores too, whose /proc/cpuinfo has no "model name" line.)
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "model: $(basename "$MODEL"), weights read per token: $WEIGHT_BYTES bytes"
printf "%-8s %-16s %-16s %-12s\n" threads "prompt tok/s" "decode tok/s" "decode GB/s"
for t in $THREADS; do
  line=$("$DSERVE" generate --model "$MODEL" --prompt-ids "$IDS" --max-tokens 128 --ignore-eos \
           --temperature 0 --threads "$t" 2>&1 >/dev/null | grep 'tokens/s' | tail -1)
  pp=$(sed -E 's/.*prompt: [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")
  tg=$(sed -E 's/.*decode: [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tokens\/s.*/\1/' <<<"$line")
  gbs=$(awk -v b="$WEIGHT_BYTES" -v r="$tg" 'BEGIN { printf "%.1f", b * r / 1e9 }')
  printf "%-8s %-16s %-16s %-12s\n" "$t" "$pp" "$tg" "$gbs"
done
