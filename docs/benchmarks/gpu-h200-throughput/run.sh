#!/usr/bin/env bash
# One GPU command of at most ~9.5 minutes, from the checkout's root with pack/ beside it
# (docs/benchmarks/gpu-queue.md): the stock small config's training throughput alone at five
# batch sizes, profiled (fairseq-ext benchmark --mode updates --profile train), the same with
# OMP_NUM_THREADS=1 at the largest, then thesis Table 3.3 (baseline and Iter-C-Agg, seed 1) trained
# two at once at the batch whose predicted tokens per second for two runs at once is the highest,
# with as many updates as the time left allows. Outputs under $OUT (default gpu-out/).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
END=$((SECONDS + ${BUDGET_S:-565}))
source pack/install.sh || exit 1
export PYTHONUNBUFFERED=1
D=pack/data/iwslt15.en-vi
{ nvidia-smi; command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"; nproc; } >"$OUT/machine.txt" 2>&1
B=(python3 -m fairseq_ext benchmark --mode updates --profile train --config small --vocab 20000 --data "$D"
   --device cuda --dtype fp16 --configs)
timeout 150 "${B[@]}" --max-tokens 2048 8192 16384 32768 65536 --updates 20 --warmup 3 --settle 20 \
  --json "$OUT/sweep.json" 2>&1 | grep -v USDT | tee "$OUT/sweep.log"
OMP_NUM_THREADS=1 timeout 45 "${B[@]}" --max-tokens 65536 --updates 20 --warmup 3 --settle 0 \
  --json "$OUT/sweep-omp1.json" 2>&1 | grep -v USDT | tee "$OUT/sweep-omp1.log"
LIMIT=$((END - SECONDS - 15))
# the choice: two runs at once share the device, so a run's rate is at most 1 / max(its update alone,
# twice its device time), times 0.85 for their contention; the updates are what 80% of the training
# time left gives at that rate (the paper stage keeps 100 s for decoding and ~20 s for start-up)
python3 - "$OUT/sweep.json" "$LIMIT" >"$OUT/choice.env" <<'PY'
import json, math, sys
try:
    rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["max_tokens"] >= 8192]
except (OSError, ValueError, KeyError):
    rows = []
limit = float(sys.argv[2])
best = None
for r in rows:
    rate = 0.85 / max(1 / r["updates_per_s"], 2 * r["device_ms_per_update"] / 1e3)
    if best is None or rate * r["tgt_tokens_per_update"] > best[0]:
        best = (rate * r["tgt_tokens_per_update"], r["max_tokens"], rate)
_, mt, rate = best or (0, 8192, 10.0)
updates = max(200, int(0.8 * rate * (limit - 135) // 50 * 50))
warmup = max(50, round(updates / 6 / 50) * 50)
lr = 2e-3 if mt >= 32768 else round(1e-3 * math.sqrt(mt / 8192), 4)
print(f"MT={mt}\nUPDATES={updates}\nWARMUP={warmup}\nLR={lr:g}\nPREDICTED_UPS={rate:.2f}\nLIMIT={limit:.0f}")
PY
cat "$OUT/choice.env"
source "$OUT/choice.env"
python3 -m fairseq_ext selfcheck --out sc --stage paper --data pack/data --seed 1 --rows transformer,iter-c-agg \
  --updates "$UPDATES" --max-tokens "$MT" --lr "$LR" --warmup "$WARMUP" --time-limit "$LIMIT" \
  --train-flags "--validate-interval 5 --save-interval 5" 2>&1 | tee "$OUT/paper.log"
tar czf "$OUT/results.tgz" --exclude=checkpoints --exclude=generate-test.txt --exclude=src.tok sc \
  "$OUT/machine.txt" "$OUT"/*.json
