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
# Relative paths are relative to the directory it runs in (make quickstart: the checkout).
# Data:   MULTI30K_FROM [a local copy of the release files; else $FAIRSEQ_EXT_DATA/multi30k, else download]
#         SRC_LANG [en]  TGT_LANG [de] (en, de, fr, cs)  BPE_MERGES [5000]
#         DATA_DIR [data-bin/multi30k.SRC-TGT]
# Model:  ARCH [multilayer_transformer_iwslt]  LAYERS [3]  EMBED_DIM [128]  FFN_DIM [512]
#         HEADS [4]  DROPOUT [0.1]
# Train:  MAX_UPDATE [2400]  TRAIN_MINUTES [13] (fairseq --stop-time-hours)  MAX_EPOCH [0]
#         MAX_TOKENS [2048]  LR [0.002]  WARMUP [300]  SEED [1]  LOG_INTERVAL [50]
#         SAVE_DIR [checkpoints/quickstart.SRC-TGT]  EXTRA_TRAIN_ARGS [""]
#         THREADS [the CPU cores idle when training starts, at least 1: torch's one thread per
#         core collapses when other work competes for the cores; fairseq_ext/standalone/cpu.py]
# Decode: BEAM [5]  LENPEN [1.0]  MAX_LEN_A [1.2]  MAX_LEN_B [10] (output length limit
#         a*source+b: keeps an undertrained model from babbling to 200 tokens)  EXTRA_GEN_ARGS [""]
# The last line says how many of the planned updates ran, in how many minutes, and the BLEU
# with its sacreBLEU signature; when the time cap cut training (a busy or slow machine), it
# says so and prints the command that trains the run on: CONTINUE=1 with the same settings
# resumes from SAVE_DIR/checkpoint_last.pt up to MAX_UPDATE, with no time cap unless
# TRAIN_MINUTES is given (then it counts the training time of the whole run), and scores again.
# Reruns reuse the data and the checkpoint when their settings are unchanged (the time cap is
# not one of them); FORCE=1 redoes both. SAVE_DIR is replaced only when quickstart wrote it, DATA_DIR only when
# prepare-multi30k.sh (run by quickstart) wrote it, and only while nothing else has been
# put into them since (fairseq_ext/recipes/lib/common.sh, fsx_check_replaceable):
# SAVE_DIR=checkpoints DATA_DIR=data-bin is refused, not wiped.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPTS/.." && pwd)"
# shellcheck source=../fairseq_ext/recipes/lib/common.sh
source "$REPO/fairseq_ext/recipes/lib/common.sh"
fsx_setup_tools
fsx_require_cmd fairseq-train fairseq-generate

# the settings given to this run: the command that continues it repeats them
SETTINGS=(SRC_LANG TGT_LANG BPE_MERGES DATA_DIR ARCH LAYERS EMBED_DIM FFN_DIM HEADS DROPOUT MAX_UPDATE MAX_EPOCH
    MAX_TOKENS LR WARMUP SEED LOG_INTERVAL SAVE_DIR BEAM LENPEN MAX_LEN_A MAX_LEN_B EXTRA_TRAIN_ARGS EXTRA_GEN_ARGS)
GIVEN=()
for name in "${SETTINGS[@]}" THREADS; do
    [[ -n "${!name:-}" ]] && GIVEN+=("$name=$(printf '%q' "${!name}")")
done
# quickstart_command: how this run was started, with the settings it was given
quickstart_command() {
    local how
    how="bash $(printf %q "$0")"
    [[ -n "${MAKELEVEL:-}" ]] && how="make quickstart"
    echo "${GIVEN[*]+"${GIVEN[*]} "}$how"
}

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
TRAIN_MINUTES_GIVEN="${TRAIN_MINUTES:-}"
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
CONTINUE="${CONTINUE:-0}"
THREADS="${THREADS:-}"
[[ "$FORCE" == 1 && "$CONTINUE" == 1 ]] && fsx_die "FORCE=1 retrains from scratch and CONTINUE=1 trains on: choose one"
read -r -a EXTRA_TRAIN <<<"${EXTRA_TRAIN_ARGS:-}"
read -r -a EXTRA_GEN <<<"${EXTRA_GEN_ARGS:-}"

T0=$(date +%s)
elapsed() { local s=$(($(date +%s) - T0)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# one run at a time writes SAVE_DIR (its lock, held to the end): a second quickstart, or a
# fairseq-train with --save-dir SAVE_DIR, is refused with one line naming this one
fsx_lock_output "$SAVE_DIR" "SAVE_DIR"

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
    # torch's one thread per core collapses when other work competes for the cores
    # (fairseq_ext/standalone/cpu.py has the measurement): the cores idle now, unless THREADS says
    if [[ -n "$THREADS" ]]; then
        why="THREADS=$THREADS"
    elif [[ -n "${OMP_NUM_THREADS:-}" ]]; then
        THREADS="$OMP_NUM_THREADS" why="OMP_NUM_THREADS=$OMP_NUM_THREADS"
    else
        mapfile -t cpu < <("$FSX_PY" "$REPO/fairseq_ext/standalone/cpu.py" threads 1)
        THREADS="${cpu[0]:-1}" why="${cpu[1]:-}; THREADS=N to choose"
    fi
    export OMP_NUM_THREADS="$THREADS"
    fsx_log "no GPU: training on the CPU with $THREADS thread(s) ($why)"
fi
# the fixed settings are in configs/quickstart.args; the environment's come after them
CONFIG="$REPO/configs/quickstart.args"
fsx_read_config "$CONFIG" CONFIG_ARGS
MODEL_FLAGS=(--arch "$ARCH"
    --encoder-layers "$LAYERS" --decoder-layers "$LAYERS"
    --encoder-embed-dim "$EMBED_DIM" --decoder-embed-dim "$EMBED_DIM"
    --encoder-ffn-embed-dim "$FFN_DIM" --decoder-ffn-embed-dim "$FFN_DIM"
    --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS"
    --dropout "$DROPOUT" --lr "$LR" --warmup-updates "$WARMUP"
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --max-epoch "$MAX_EPOCH"
    --log-interval "$LOG_INTERVAL" --seed "$SEED"
    "${EXTRA_TRAIN[@]+"${EXTRA_TRAIN[@]}"}")
# a checkpoint is reused (or continued) only when it was trained with these very settings on
# this data; the time cap is not one of them: it decides how far training got, not what it is
SIGNATURE="$(printf '%q ' "$DATA_DIR" "$SAVE_DIR" "${CONFIG_ARGS[@]}" "${MODEL_FLAGS[@]}"; echo; cat "$DATA_DIR/prep.env")"
CKPT="$SAVE_DIR/checkpoint_last.pt"
same_run=0
[[ -f "$CKPT" && -f "$SAVE_DIR/quickstart.settings" && "$(cat "$SAVE_DIR/quickstart.settings")" == "$SIGNATURE" ]] &&
    same_run=1
if [[ "$CONTINUE" == 1 && "$same_run" != 1 ]]; then
    fsx_die "CONTINUE=1: $SAVE_DIR holds no quickstart run with these settings to continue (run quickstart with the settings of the run you want to continue, or without CONTINUE=1 to train a new one)"
fi
# the time cap: TRAIN_MINUTES of training; a continued run counts the training time it already
# had (fairseq's --stop-time-hours), and has no cap unless TRAIN_MINUTES is given
[[ "$CONTINUE" == 1 && -z "$TRAIN_MINUTES_GIVEN" ]] && TRAIN_MINUTES=0
stop_hours="$("$FSX_PY" -c "print(round($TRAIN_MINUTES / 60, 6))")"
TRAIN_FLAGS=("${MODEL_FLAGS[@]}" --stop-time-hours "$stop_hours")

if [[ "$FORCE" != 1 && "$CONTINUE" != 1 && "$same_run" == 1 ]]; then
    fsx_log "[$(elapsed)] reusing $CKPT, trained with the same settings (FORCE=1 to retrain, CONTINUE=1 to train on to MAX_UPDATE)"
else
    # SAVE_DIR is replaced only when quickstart wrote it and nothing else was put into it
    # since (its manifest: never another experiment's, never a user's file), and never when it
    # holds the data. The run is trained in a temporary directory beside it and moved into
    # place when training succeeded. A new run discards the old one first (its checkpoints
    # are stale), so that after a failed run SAVE_DIR holds only train.log, never a checkpoint
    # that looks current; a continued run starts from a copy of the old one, which stays as it
    # was until the continued run succeeded.
    FSX_OUT="$SAVE_DIR"
    FSX_FORCE=1
    FSX_INPUTS=("$DATA_DIR" "$MULTI30K_FROM")
    fsx_begin_output
    if [[ "$CONTINUE" == 1 ]]; then
        for f in checkpoint_last.pt checkpoint_best.pt train.log; do
            [[ -f "$SAVE_DIR/$f" ]] && cp -p "$SAVE_DIR/$f" "$FSX_STAGE/$f"
        done
        fsx_log "[$(elapsed)] continuing $CKPT to $MAX_UPDATE updates ($([[ "$TRAIN_MINUTES" == 0 ]] && echo "no time cap" || echo "until $TRAIN_MINUTES min of training in all"))"
    else
        fsx_discard_old_output
        FSX_KEEP_ON_FAILURE=(train.log)
        fsx_log "[$(elapsed)] training $ARCH ($LAYERS+$LAYERS layers, d $EMBED_DIM, FFN $FFN_DIM, $HEADS heads) for $MAX_UPDATE updates or $TRAIN_MINUTES min, whichever comes first"
    fi
    # fairseq-train's closing line names SAVE_DIR (not the temporary directory it trains in)
    # and the command that continues this run, as quickstart's own closing line does
    # only this training's own lines and exit status count: a continued run's log starts with
    # the old run's, whose "done training" must not pass for a continuation that was killed
    log_start=$(($(stat -c %s "$FSX_STAGE/train.log" 2>/dev/null || echo 0) + 1))
    train_status=0
    FAIRSEQ_EXT_SHOWN_SAVE_DIR="$SAVE_DIR" FAIRSEQ_EXT_CONTINUE_COMMAND="CONTINUE=1 $(quickstart_command)" \
        PYTHONUNBUFFERED=1 "$SCRIPTS/train.sh" "$DATA_DIR" "$FSX_STAGE" --config "$CONFIG" -- "${TRAIN_FLAGS[@]}" 2>&1 |
        tee -a "$FSX_STAGE/train.log" |
        { grep --line-buffered -E "train_inner|valid on|training ended|Stopping|Error" || true; } || train_status=$?
    if [[ "$train_status" != 0 ]] || ! grep -q "done training" < <(tail -c "+$log_start" "$FSX_STAGE/train.log") ||
        [[ ! -f "$FSX_STAGE/checkpoint_last.pt" ]]; then
        tail -n 20 "$FSX_STAGE/train.log" >&2
        [[ "$CONTINUE" == 1 ]] && fsx_die "fairseq-train failed to continue the run (its last lines above); $SAVE_DIR is kept as it was"
        fsx_die "fairseq-train failed (log: $SAVE_DIR/train.log)"
    fi
    printf '%s\n' "$SIGNATURE" >"$FSX_STAGE/quickstart.settings"
    # the run's flags as a training config: `fairseq-ext train DATA DIR --config SAVE_DIR/train.args`
    # trains or warm-starts a model of these very sizes (README, "Start from a trained model")
    { echo "# make quickstart's flags for $SAVE_DIR (fairseq-ext train DATA DIR --config this file)"
      printf '%s\n' "${CONFIG_ARGS[@]}" "${MODEL_FLAGS[@]}"; } >"$FSX_STAGE/train.args"
    fsx_finish_output
fi

# ---------------------------------------------------------------- 3. translate + score
fsx_log "[$(elapsed)] translating test_2016_flickr (beam $BEAM)"
# listed first: an evaluation that fails half-way leaves an eval-test quickstart still owns
fsx_add_output_entries "$SAVE_DIR" eval-test/
"$SCRIPTS/evaluate.sh" --checkpoint "$CKPT" --data "$DATA_DIR" --split test \
    --out "$SAVE_DIR/eval-test" --beam "$BEAM" --lenpen "$LENPEN" --batch-size 128 \
    --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
    "${DEVICE[@]+"${DEVICE[@]}"}" "${EXTRA_GEN[@]+"${EXTRA_GEN[@]}"}"

# ---------------------------------------------------------------- 4. the closing line
# how far training got (fairseq_ext's closing line of fairseq-train, the last in train.log),
# the score, and when the time cap cut training, the command that trains on
ended="$(grep -o 'training ended: [0-9]* of [0-9?]* updates, [0-9.]* min of training.*' "$SAVE_DIR/train.log" | tail -n 1)"
read -r done_updates planned_updates train_min < <(sed -E 's/^training ended: ([0-9]+) of ([0-9?]+) updates, ([0-9.]+) min.*/\1 \2 \3/' <<<"$ended")
reported="$(grep '^reported BLEU' "$SAVE_DIR/eval-test/bleu.txt" | tail -n 1)"
flavour="$(sed -E 's/^reported BLEU \[([^]]*)\].*/\1/' <<<"$reported")"
score="$(sed -E 's/^reported BLEU [^:]*: ([0-9.]+) .*/\1/' <<<"$reported")"
signature="$(sed -E 's/.*signature: //' <<<"$reported")"
test_set="$(prep_value test_set)"
result="BLEU $score on ${test_set:-test} ($flavour, $signature)"
outputs="outputs in $SAVE_DIR/eval-test"
if [[ "$ended" == *"stopped by the time cap"* ]]; then
    # the command that continues: this one's settings (those not at their defaults), CONTINUE=1
    again="$(quickstart_command)"
    rate="$("$FSX_PY" -c "print(f'{$done_updates / max($train_min, 0.01):.0f}')")"
    more="$("$FSX_PY" -c "print(f'{($planned_updates - $done_updates) / max($done_updates / max($train_min, 0.01), 0.01):.0f}')")"
    fsx_log "[$(elapsed)] quickstart done, but the time cap cut training: $done_updates of $planned_updates updates in $train_min min ($rate updates/min; a busy machine trains slower), so $result is the score of an undertrained model, below a finished run's; $outputs. To train on to $planned_updates updates (about $more more minutes at this speed) and score again, run: CONTINUE=1 $again"
elif [[ -n "$ended" ]]; then
    fsx_log "[$(elapsed)] quickstart done: $done_updates of $planned_updates updates in $train_min min of training, $result; $outputs"
else
    fsx_log "[$(elapsed)] quickstart done: $result; $outputs"
fi
