#!/usr/bin/env bash
# `make quickstart`: Multi30k En->De from raw text to a sacreBLEU score in about 13-15
# minutes on a 2-core CPU (much faster on a GPU):
#   1. scripts/prepare-multi30k.sh -> data-bin/multi30k.en-de (Moses tokenization, joint BPE
#      with 5000 merges), from MULTI30K_FROM (or $FAIRSEQ_EXT_DATA/multi30k) when present, else downloaded;
#   2. fairseq-train --user-dir fairseq_ext --arch multilayer_transformer_iwslt with a small
#      model (d 128, FFN 512, 4 heads, 3+3 layers, shared embeddings), Adam (0.9, 0.98),
#      inverse-sqrt schedule (peak 2e-3 after 300 updates), label smoothing 0.1, 2048
#      tokens per batch, for 2400 updates (about 9 epochs, ~12 min on 2 idle cores) or
#      13 minutes, whichever comes first;
#   3. scripts/evaluate.sh: beam 5 on test_2016_flickr, sacreBLEU with signatures.
# Chosen by measurement on a 2-core machine: at equal CPU time a d-128 model beat a d-192
# one (30.7 vs 29.5 BLEU after 1200 vs 800 updates), while the thesis' d-256/FFN-1024
# model manages only ~400-500 updates of 4096 tokens in 11 minutes there. README
# "Quickstart" has the measured score and time.
#
# Every setting is an environment variable (defaults in brackets), e.g.
#   MAX_UPDATE=6000 TRAIN_MINUTES=40 make quickstart        TGT_LANG=fr make quickstart
# Data:   MULTI30K_FROM [a local copy of the release files; else $FAIRSEQ_EXT_DATA/multi30k, else download]
#         SRC_LANG [en]  TGT_LANG [de] (en, de, fr, cs)  BPE_MERGES [5000]
#         DATA_DIR [data-bin/multi30k.SRC-TGT]
# Model:  ARCH [multilayer_transformer_iwslt]  LAYERS [3]  EMBED_DIM [128]  FFN_DIM [512]
#         HEADS [4]  DROPOUT [0.1]
# Train:  MAX_UPDATE [2400]  TRAIN_MINUTES [13] (fairseq --stop-time-hours)  MAX_EPOCH [0]
#         MAX_TOKENS [2048]  LR [0.002]  WARMUP [300]  SEED [1]  LOG_INTERVAL [50]
#         SAVE_DIR [checkpoints/quickstart.SRC-TGT]  EXTRA_TRAIN_ARGS [""]
# Decode: BEAM [5]  LENPEN [1.0]  MAX_LEN_A [1.2]  MAX_LEN_B [10] (output length limit
#         a*source+b: keeps an undertrained model from babbling to 200 tokens)  EXTRA_GEN_ARGS [""]
# Reruns reuse the data and the checkpoint when their settings are unchanged; FORCE=1
# redoes both. SAVE_DIR is replaced only when quickstart wrote it, DATA_DIR only when
# prepare-multi30k.sh (run by quickstart) wrote it, and only while nothing else has been
# put into them since (fairseq_ext/recipes/lib/common.sh, fsx_check_replaceable):
# SAVE_DIR=checkpoints DATA_DIR=data-bin is refused, not wiped.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPTS/.." && pwd)"
# shellcheck source=../fairseq_ext/recipes/lib/common.sh
source "$REPO/fairseq_ext/recipes/lib/common.sh" # before the cd: the directory the user started in stays protected
cd "$REPO"
fsx_setup_tools
fsx_require_cmd fairseq-train fairseq-generate

SRC_LANG="${SRC_LANG:-en}"
TGT_LANG="${TGT_LANG:-de}"
if [[ -z "${MULTI30K_FROM+x}" ]]; then
    MULTI30K_FROM=""
    [[ -n "${FAIRSEQ_EXT_DATA:-}" && -d "$FAIRSEQ_EXT_DATA/multi30k" ]] && MULTI30K_FROM="$FAIRSEQ_EXT_DATA/multi30k"
fi
BPE_MERGES="${BPE_MERGES:-5000}"
DATA_DIR="${DATA_DIR:-data-bin/multi30k.$SRC_LANG-$TGT_LANG}"
ARCH="${ARCH:-multilayer_transformer_iwslt}"
LAYERS="${LAYERS:-3}"
EMBED_DIM="${EMBED_DIM:-128}"
FFN_DIM="${FFN_DIM:-512}"
HEADS="${HEADS:-4}"
DROPOUT="${DROPOUT:-0.1}"
TRAIN_MINUTES="${TRAIN_MINUTES:-13}"
MAX_UPDATE="${MAX_UPDATE:-2400}"
MAX_EPOCH="${MAX_EPOCH:-0}"
MAX_TOKENS="${MAX_TOKENS:-2048}"
LR="${LR:-0.002}"
WARMUP="${WARMUP:-300}"
SEED="${SEED:-1}"
LOG_INTERVAL="${LOG_INTERVAL:-50}"
SAVE_DIR="${SAVE_DIR:-checkpoints/quickstart.$SRC_LANG-$TGT_LANG}"
BEAM="${BEAM:-5}"
LENPEN="${LENPEN:-1.0}"
MAX_LEN_A="${MAX_LEN_A:-1.2}"
MAX_LEN_B="${MAX_LEN_B:-10}"
FORCE="${FORCE:-0}"
read -r -a EXTRA_TRAIN <<<"${EXTRA_TRAIN_ARGS:-}"
read -r -a EXTRA_GEN <<<"${EXTRA_GEN_ARGS:-}"

T0=$(date +%s)
elapsed() { local s=$(($(date +%s) - T0)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# ---------------------------------------------------------------- 1. data
prep_value() { sed -n "s/^$1=//p" "$DATA_DIR/prep.env" 2>/dev/null; }
if [[ "$FORCE" != 1 && -f "$DATA_DIR/prep.env" && "$(prep_value recipe)" == multi30k && "$(prep_value src)" == "$SRC_LANG" &&
    "$(prep_value tgt)" == "$TGT_LANG" && "$(prep_value bpe_merges)" == "$BPE_MERGES" ]]; then
    fsx_log "[$(elapsed)] reusing $DATA_DIR (FORCE=1 to rebuild)"
else
    from=()
    [[ -n "$MULTI30K_FROM" ]] && from=(--from "$MULTI30K_FROM")
    fsx_log "[$(elapsed)] preparing Multi30k $SRC_LANG-$TGT_LANG into $DATA_DIR (source: ${MULTI30K_FROM:-download})"
    "$SCRIPTS/prepare-multi30k.sh" --src "$SRC_LANG" --tgt "$TGT_LANG" --out "$DATA_DIR" --force \
        --bpe-merges "$BPE_MERGES" "${from[@]+"${from[@]}"}"
fi

# ---------------------------------------------------------------- 2. train
DEVICE=(--cpu)
if fsx_has_gpu; then
    DEVICE=()
    fsx_log "GPU found: training on $(nvidia-smi -L | sed -n 1p)"
else
    fsx_log "no GPU: training on $(nproc) CPU core(s)"
fi
stop_hours="$("$FSX_PY" -c "print(round($TRAIN_MINUTES / 60, 4))")"
# the fixed settings are in configs/quickstart.args; the environment's come after them
CONFIG="$REPO/configs/quickstart.args"
fsx_read_config "$CONFIG" CONFIG_ARGS
TRAIN_FLAGS=(--arch "$ARCH"
    --encoder-layers "$LAYERS" --decoder-layers "$LAYERS"
    --encoder-embed-dim "$EMBED_DIM" --decoder-embed-dim "$EMBED_DIM"
    --encoder-ffn-embed-dim "$FFN_DIM" --decoder-ffn-embed-dim "$FFN_DIM"
    --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS"
    --dropout "$DROPOUT" --lr "$LR" --warmup-updates "$WARMUP"
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --max-epoch "$MAX_EPOCH"
    --stop-time-hours "$stop_hours" --log-interval "$LOG_INTERVAL" --seed "$SEED"
    "${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"}")
TRAIN_ARGS=("$DATA_DIR" "$SAVE_DIR" "${CONFIG_ARGS[@]}" "${TRAIN_FLAGS[@]}")
# a checkpoint is reused only when it was trained with these very settings on this data
SIGNATURE="$(printf '%q ' "${TRAIN_ARGS[@]}"; echo; cat "$DATA_DIR/prep.env")"
CKPT="$SAVE_DIR/checkpoint_last.pt"
if [[ "$FORCE" != 1 && -f "$CKPT" && -f "$SAVE_DIR/quickstart.settings" &&
    "$(cat "$SAVE_DIR/quickstart.settings")" == "$SIGNATURE" ]]; then
    fsx_log "[$(elapsed)] reusing $CKPT, trained with the same settings (FORCE=1 to retrain)"
else
    # SAVE_DIR is replaced only when quickstart wrote it and nothing else was put into it
    # since (never another experiment's), and never when it holds the data. The new one is
    # trained in a temporary directory beside it and moved into place when training
    # succeeded; the old one goes first (its checkpoints are stale), so that after a failed
    # run SAVE_DIR holds only train.log, never a checkpoint that looks current.
    FSX_OUT="$SAVE_DIR"
    FSX_FORCE=1
    FSX_INPUTS=("$DATA_DIR" "$MULTI30K_FROM")
    mapfile -t FSX_MARK_ENTRIES < <(fsx_writer_entries quickstart.sh)
    fsx_begin_output
    fsx_discard_old_output
    FSX_KEEP_ON_FAILURE=(train.log)
    fsx_log "[$(elapsed)] training $ARCH ($LAYERS+$LAYERS layers, d $EMBED_DIM, FFN $FFN_DIM, $HEADS heads) for $MAX_UPDATE updates or $TRAIN_MINUTES min, whichever comes first"
    PYTHONUNBUFFERED=1 "$SCRIPTS/train.sh" "$DATA_DIR" "$FSX_STAGE" --config "$CONFIG" -- "${TRAIN_FLAGS[@]}" 2>&1 |
        tee "$FSX_STAGE/train.log" |
        grep --line-buffered -E "train_inner|valid on|done training|Stopping|Error" || true
    if ! grep -q "done training" "$FSX_STAGE/train.log" || [[ ! -f "$FSX_STAGE/checkpoint_last.pt" ]]; then
        tail -n 20 "$FSX_STAGE/train.log" >&2
        fsx_die "fairseq-train failed (log: $SAVE_DIR/train.log)"
    fi
    printf '%s\n' "$SIGNATURE" >"$FSX_STAGE/quickstart.settings"
    fsx_finish_output
fi

# ---------------------------------------------------------------- 3. translate + score
fsx_log "[$(elapsed)] translating test_2016_flickr (beam $BEAM)"
"$SCRIPTS/evaluate.sh" --checkpoint "$CKPT" --data "$DATA_DIR" --split test \
    --out "$SAVE_DIR/eval-test" --beam "$BEAM" --lenpen "$LENPEN" --batch-size 128 \
    --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
    "${DEVICE[@]+"${DEVICE[@]}"}" "${EXTRA_GEN[@]+"${EXTRA_GEN[@]}"}"
fsx_log "[$(elapsed)] quickstart done; translations and scores in $SAVE_DIR/eval-test"
