#!/usr/bin/env bash
# 1, 2, 4 and 8 trainings at once on one GPU, at 2,048 and 32,768 tokens a batch, through the table runner's slots:
# the stock small config (thesis Table 3.3's baseline row) on the pack's IWSLT'15 En-Vi, fp16, BUDGET updates a run,
# decoding cut to 5 tokens (the rate, not the BLEU, is the point). Each run records its rate in its result.json
# (updates a second, seconds to start); the summary prints each run's and the sum over the runs at once.
#
#   OUT=$OUT/at-once TOKENS=2048 bash docs/benchmarks/runs-at-once.sh    # from the checkout, after source pack/install.sh
#   OUT=$OUT/at-once TOKENS=32768 bash docs/benchmarks/runs-at-once.sh   # (each about 7 minutes, estimated)
# DEVICE (default "--devices 0 --fp16"; "--cpu" to try it on a CPU), COUNTS (default "1 2 4 8"), BUDGET (200), DATA.
set -euo pipefail
OUT="${OUT:?set OUT}" BUDGET="${BUDGET:-200}" DATA="${DATA:-pack/data/iwslt15.en-vi}" DEVICE="${DEVICE:---devices 0 --fp16}"
mkdir -p "$OUT"
fp16=""; [[ "$DEVICE" == *--fp16* ]] && fp16="--fp16"
for tokens in ${TOKENS:-2048 32768}; do
    for n in ${COUNTS:-1 2 4 8}; do
        timeout 300 python3 -m fairseq_ext reproduce thesis-3.3 --rows transformer --datasets iwslt15-en-vi \
            --seeds "$(seq -s, 1 "$n")" --budget "$BUDGET" ${DEVICE/--fp16/} --per-device "$n" \
            --prepared "iwslt15-en-vi=$DATA" --work-dir "$OUT/mt$tokens-n$n" --samples 10 \
            --train-args="$fp16 --max-tokens $tokens" --generate-args="$fp16 --max-len-a 0 --max-len-b 5" \
            > "$OUT/mt$tokens-n$n.log" 2>&1 || echo "mt$tokens n$n: exit $? (see $OUT/mt$tokens-n$n.log)"
    done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
print("| tokens | at once | updates/s of each run | sum | start s |\n|---:|---:|---|---:|---:|")
for folder in sorted((f for f in glob.glob(os.path.join(sys.argv[1], "mt*-n*")) if os.path.isdir(f)), key=lambda f: (int(f.split("mt")[-1].split("-")[0]), int(f.split("-n")[-1]))):
    rates = [json.load(open(p)).get("rate") or {} for p in glob.glob(os.path.join(folder, "*", "*", "*", "result.json"))]
    ups = [r["updates_per_s"] for r in rates if r.get("updates_per_s")]
    start = [r["start_s"] for r in rates if "start_s" in r]
    tokens, n = folder.split("mt")[-1].split("-n")
    print(f"| {tokens} | {n} | {', '.join(f'{u:.2f}' for u in ups) or 'none'} | {sum(ups):.2f} | "
          f"{sum(start) / len(start) if start else float('nan'):.1f} |")
PY
