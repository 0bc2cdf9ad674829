#!/usr/bin/env bash
# Translate a split of a data-bin directory with a checkpoint and score it with sacreBLEU.
#
#   scripts/evaluate.sh --checkpoint checkpoints/x/checkpoint_best.pt \
#       --data data-bin/iwslt15.en-vi [--split test] [--out DIR] [fairseq-generate options]
#
# 1. fairseq-generate --user-dir fairseq_ext --gen-subset SPLIT, subword units removed
#    (--remove-bpe for subword-nmt, --remove-bpe sentencepiece for SentencePiece);
#    every option not listed below goes to fairseq-generate unchanged
#    (--beam 6 --lenpen 1.1 --model-overrides "{...}" --cpu --max-tokens ...);
#    defaults: --beam 5 --batch-size 128.
# 2. hypotheses detokenized with sacremoses (Moses detokenizer, XML escapes undone);
# 3. sacreBLEU, case-sensitive and -lc, on detokenized text (13a) and on Moses-tokenized
#    text (--tokenize none, multi-bleu style), each printed with its signature; then the
#    flavour the papers report for this task.
# References come from DATA/text/SPLIT.{raw,tok}.TGT written by the prepare-*.sh recipes
# (so the <unk>s of fairseq's own T- lines do not count against the system); without them
# the T- lines are used, with a warning. Files written to --out:
#   generate-SPLIT.txt  fairseq-generate output (+ .log, .cmd)
#   hyp.tok / ref.tok    tokenized text          hyp.detok / ref.detok  detokenized text
#   src.tok              source side             bleu.txt / bleu.json   the scores
#   .evaluation-complete what was evaluated; significance.sh reads only directories with it
#   .fairseq_ext-output  the marker: --out is replaced only when it holds one (or is empty)
# Multi-source data (prepare-multi30k.sh --extra-src): the task and its extra sources come
# from prep.env. Adversarial evaluation (multi-source paper, Table 2): --shuffle-source L
# [--shuffle-seed N] replaces every sentence of source L by another sentence of the split
# (inside the task, so fairseq-generate does it); default --out CKPT_DIR/eval-SPLIT-shuffle-L,
# and with an unshuffled evaluation of the same checkpoint (--unshuffled DIR, default
# CKPT_DIR/eval-SPLIT when it holds one) the BLEU drop is printed and written to adversarial.json.
# --out holds one complete evaluation or none: everything is written into a temporary
# directory beside --out, renamed into place only when the evaluation succeeded. A rerun
# removes the previous evaluation when it starts, so after a failed rerun --out holds no
# result, only the generate log and command to debug with (and significance.sh refuses it):
# a stale result never passes for the new one.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

CKPT=""
DATA=""
SPLIT=test
OUT=""
SRC=""
TGT=""
BPE=""
REF_DETOK=""
REF_TOK=""
HEADLINE=""
UNSHUFFLED=""
GEN_ARGS=()

usage() {
    cat <<EOF
Usage: $FSX_PROG --checkpoint CKPT --data DATA_BIN [--split test] [--out DIR] [options] [fairseq-generate options]

  --checkpoint PATH    model checkpoint (several joined with ':' = ensemble)
  --data DIR           binarized data (prepare-*.sh output)
  --split NAME         valid | test | ... (default test)
  --out DIR            where outputs go (default: CKPT_DIR/eval-SPLIT)
  --src L, --tgt L     languages (default: from DATA/prep.env, else fairseq's guess / required for --tgt)
  --bpe KIND           subword_nmt | sentencepiece | none (default: from DATA/prep.env)
  --ref-detok FILE     detokenized reference (default DATA/text/SPLIT.raw.TGT)
  --ref-tok FILE       tokenized reference (default DATA/text/SPLIT.tok.TGT)
  --headline FLAVOUR   detok-cased | detok-lc | tok-cased | tok-lc: the score to report
                       (default: the one the papers report for the recipe in prep.env)
  --shuffle-source L   adversarial evaluation of a multi-source model: source L's sentences
                       replaced by other sentences of the split (--shuffle-seed N, default 1)
  --unshuffled DIR     the plain evaluation to report the BLEU drop against
                       (default: CKPT_DIR/eval-SPLIT when it evaluated the same checkpoint)
Anything else is passed to fairseq-generate, e.g. --beam 6 --lenpen 1.1 --cpu
  --model-overrides "{'max_source_positions': 1024}"  (also after a lone --)
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --checkpoint | --path) CKPT="${2?--checkpoint needs a value}"; shift 2 ;;
        --data) DATA="${2?--data needs a value}"; shift 2 ;;
        --split | --gen-subset) SPLIT="${2?--split needs a value}"; shift 2 ;;
        --out) OUT="${2?--out needs a value}"; shift 2 ;;
        --src | --source-lang | -s) SRC="${2?--src needs a value}"; shift 2 ;;
        --tgt | --target-lang | -t) TGT="${2?--tgt needs a value}"; shift 2 ;;
        --bpe) BPE="${2?--bpe needs a value}"; shift 2 ;;
        --ref-detok) REF_DETOK="${2?--ref-detok needs a value}"; shift 2 ;;
        --ref-tok) REF_TOK="${2?--ref-tok needs a value}"; shift 2 ;;
        --headline) HEADLINE="${2?--headline needs a value}"; shift 2 ;;
        --unshuffled) UNSHUFFLED="${2?--unshuffled needs a value}"; shift 2 ;;
        --remove-bpe | --user-dir)
            fsx_die "$1 is set by $FSX_PROG itself (use --bpe to choose the subword kind)"
            ;;
        -h | --help) usage; exit 0 ;;
        --) shift; GEN_ARGS+=("$@"); break ;;
        *) GEN_ARGS+=("$1"); shift ;;
    esac
done
[[ -n "$CKPT" ]] || { usage >&2; fsx_die "--checkpoint is required"; }
[[ -n "$DATA" ]] || { usage >&2; fsx_die "--data is required"; }
IFS=: read -r -a ckpts <<<"$CKPT"
for c in "${ckpts[@]}"; do [[ -f "$c" ]] || fsx_die "checkpoint not found: $c"; done
[[ -d "$DATA" ]] || fsx_die "data directory not found: $DATA"
DATA="$(realpath "$DATA")"

# prep.env: key=value lines written by the recipes (parsed, not sourced)
declare -A PREP=()
if [[ -f "$DATA/prep.env" ]]; then
    while IFS='=' read -r k v; do
        [[ -z "$k" || "$k" == \#* ]] && continue
        PREP[$k]="$v"
    done <"$DATA/prep.env"
fi
SRC="${SRC:-${PREP[src]:-}}"
TGT="${TGT:-${PREP[tgt]:-}}"
BPE="${BPE:-${PREP[bpe]:-subword_nmt}}"
[[ -n "$TGT" ]] || fsx_die "cannot tell the target language: no $DATA/prep.env; pass --tgt (and --src)"
ls "$DATA/$SPLIT".*.idx >/dev/null 2>&1 || fsx_die "no binarized split '$SPLIT' in $DATA"
case "$BPE" in
    subword_nmt | subword-nmt) REMOVE_BPE=(--remove-bpe) ;;
    sentencepiece) REMOVE_BPE=(--remove-bpe sentencepiece) ;;
    none) REMOVE_BPE=() ;;
    *) fsx_die "--bpe must be subword_nmt, sentencepiece or none" ;;
esac
if [[ -z "$HEADLINE" ]]; then
    # which BLEU the papers report for each task
    case "${PREP[recipe]:-}:$SRC-$TGT" in
        iwslt14:de-en | iwslt14:en-de) HEADLINE=tok-lc; NOTE="IWSLT'14 De-En: lowercased, tokenized" ;;
        iwslt14:* | iwslt-fr-ro:*) HEADLINE=tok-cased; NOTE="IWSLT Es/Fr/Ro: multi-bleu style, tokenized" ;;
        iwslt15-en-vi:*) HEADLINE=detok-cased; NOTE="IWSLT'15 En-Vi: sacreBLEU case-sensitive" ;;
        wmt14-en-de:*) HEADLINE=detok-cased; NOTE="WMT'14: detokenized, case-sensitive, 13a" ;;
        *) HEADLINE=detok-cased; NOTE="detokenized, case-sensitive, 13a" ;;
    esac
fi

[[ -z "$REF_DETOK" || -f "$REF_DETOK" ]] || fsx_die "--ref-detok $REF_DETOK: no such file"
[[ -z "$REF_TOK" || -f "$REF_TOK" ]] || fsx_die "--ref-tok $REF_TOK: no such file"

gen_value() { # gen_value NAME: the value of fairseq-generate option NAME in GEN_ARGS (the last one)
    local i v=""
    for ((i = 0; i < ${#GEN_ARGS[@]}; i++)); do
        case "${GEN_ARGS[i]}" in
            "$1") v="${GEN_ARGS[i + 1]:-}" ;;
            "$1="*) v="${GEN_ARGS[i]#*=}" ;;
        esac
    done
    printf '%s' "$v"
}
SHUFFLE="$(gen_value --shuffle-source)"
SHUFFLE_SEED="$(gen_value --shuffle-seed)"
SHUFFLE_SEED="${SHUFFLE_SEED:-1}"
if [[ -n "$SHUFFLE" ]]; then
    [[ -n "${PREP[extra_src]:-}" || -n "$(gen_value --extra-source-langs)" ]] ||
        fsx_die "--shuffle-source $SHUFFLE: $DATA is not multi-source data (no extra_src in its prep.env)"
    [[ -n "$OUT" ]] || OUT="$(dirname "${ckpts[0]}")/eval-$SPLIT-shuffle-$SHUFFLE"
    if [[ -z "$UNSHUFFLED" && -f "$(dirname "${ckpts[0]}")/eval-$SPLIT/$FSX_EVAL_COMPLETE" ]] &&
        grep -qxF "checkpoint=$CKPT" "$(dirname "${ckpts[0]}")/eval-$SPLIT/$FSX_EVAL_COMPLETE"; then
        UNSHUFFLED="$(dirname "${ckpts[0]}")/eval-$SPLIT"
    fi
    if [[ -n "$UNSHUFFLED" ]]; then
        fsx_check_evaluation "$UNSHUFFLED"
        [[ -f "$UNSHUFFLED/bleu.json" ]] || fsx_die "--unshuffled $UNSHUFFLED: no bleu.json"
    fi
elif [[ -n "$UNSHUFFLED" ]]; then
    fsx_die "--unshuffled is for the adversarial evaluation (--shuffle-source L)"
fi
[[ -n "$OUT" ]] || OUT="$(dirname "${ckpts[0]}")/eval-$SPLIT"
fsx_setup_tools
fsx_require_cmd fairseq-generate
# --out: replaced (it must be a directory evaluate.sh wrote, or empty), never one that holds
# the data, a checkpoint or a reference
FSX_OUT="$OUT"
FSX_FORCE=1
FSX_INPUTS=("$DATA" "${ckpts[@]}" "$REF_DETOK" "$REF_TOK")
fsx_begin_output
fsx_discard_old_output
FSX_KEEP_ON_FAILURE=("generate-$SPLIT.log" "generate-$SPLIT.cmd")
OUT="$FSX_STAGE"

# the references first (read as every script reads text: UTF-8 checked, BOM and CRs
# removed), so that an unreadable one fails before the decoding, not after it
REF_TOK="${REF_TOK:-$DATA/text/$SPLIT.tok.$TGT}"
REF_DETOK="${REF_DETOK:-$DATA/text/$SPLIT.raw.$TGT}"
if [[ -f "$REF_TOK" ]]; then fsx_cat "$REF_TOK" >"$OUT/ref.tok"; fi
if [[ -f "$REF_DETOK" ]]; then fsx_cat "$REF_DETOK" >"$OUT/ref.detok"; fi

has_opt() { # has_opt NAME: whether GEN_ARGS holds option NAME
    local a
    for a in "${GEN_ARGS[@]+"${GEN_ARGS[@]}"}"; do [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0; done
    return 1
}
DEFAULTS=()
has_opt --beam || DEFAULTS+=(--beam 5)
has_opt --batch-size || has_opt --max-tokens || DEFAULTS+=(--batch-size 128)
LANG_ARGS=()
[[ -n "$SRC" ]] && LANG_ARGS+=(--source-lang "$SRC")
LANG_ARGS+=(--target-lang "$TGT")
# multi-source data (prepare-multi30k.sh --extra-src): the task and its extra sources
if [[ -n "${PREP[extra_src]:-}" ]] && ! has_opt --task; then
    LANG_ARGS+=(--task multi_source_translation --extra-source-langs "${PREP[extra_src]}")
fi

GEN="$OUT/generate-$SPLIT.txt"
fsx_log "translating '$SPLIT' of $DATA with $CKPT"
cmd=(fairseq-generate "$DATA" --user-dir "$FSX_USER_DIR" --path "$CKPT"
    --gen-subset "$SPLIT" "${LANG_ARGS[@]}" "${REMOVE_BPE[@]+"${REMOVE_BPE[@]}"}"
    "${DEFAULTS[@]+"${DEFAULTS[@]}"}" "${GEN_ARGS[@]+"${GEN_ARGS[@]}"}")
printf '%q ' "${cmd[@]}" >"$OUT/generate-$SPLIT.cmd"
echo >>"$OUT/generate-$SPLIT.cmd"
if ! "${cmd[@]}" >"$GEN" 2>"$OUT/generate-$SPLIT.log"; then
    tail -n 20 "$OUT/generate-$SPLIT.log" >&2
    fsx_die "fairseq-generate failed (full log: $FSX_OUT/generate-$SPLIT.log)"
fi
grep -h "Translated" "$GEN" "$OUT/generate-$SPLIT.log" 2>/dev/null | tail -n 1 | sed 's/^.*| //' >&2 || true

n="$(fsx_tools extract-gen "$GEN" "$OUT")" || exit 1
mv "$OUT/gen.hyp" "$OUT/hyp.tok"
mv "$OUT/gen.src" "$OUT/src.tok"
fsx_detok "$TGT" <"$OUT/hyp.tok" >"$OUT/hyp.detok"

if [[ ! -f "$OUT/ref.tok" ]]; then
    fsx_warn "no $REF_TOK: using fairseq's target lines as the tokenized reference (their <unk>s count as errors)"
    cp "$OUT/gen.ref" "$OUT/ref.tok"
fi
rm -f "$OUT/gen.ref"
if [[ ! -f "$OUT/ref.detok" ]]; then
    fsx_warn "no $REF_DETOK: detokenizing the tokenized reference for detokenized BLEU"
    fsx_detok "$TGT" <"$OUT/ref.tok" >"$OUT/ref.detok"
fi
for f in "ref.tok:$REF_TOK" "ref.detok:$REF_DETOK"; do
    m=$(wc -l <"$OUT/${f%%:*}")
    [[ "$m" == "$n" ]] || fsx_die "the reference ${f#*:} has $m lines but fairseq-generate translated $n sentences of '$SPLIT' (wrong --split or --ref-*?)"
done

fsx_log "sacreBLEU on $n sentences of '$SPLIT'"
"$FSX_PY" "$FSX_USER_DIR/tools/bleu.py" --hyp-detok "$OUT/hyp.detok" --ref-detok "$OUT/ref.detok" \
    --hyp-tok "$OUT/hyp.tok" --ref-tok "$OUT/ref.tok" --json "$OUT/bleu.json" \
    --headline "$HEADLINE" --headline-note "${NOTE:-}" | tee "$OUT/bleu.txt"
MARK=()
if [[ -n "$SHUFFLE" ]]; then
    MARK=("shuffle_source=$SHUFFLE" "shuffle_seed=$SHUFFLE_SEED")
    if [[ -n "$UNSHUFFLED" ]]; then
        "$FSX_PY" - "$OUT/bleu.json" "$UNSHUFFLED" "$HEADLINE" "$SHUFFLE" "$SHUFFLE_SEED" \
            "$OUT/adversarial.json" <<'PY' | tee -a "$OUT/bleu.txt"
import json, os, sys
bleu_json, unshuffled, flavour, lang, seed, out = sys.argv[1:]
adv = json.load(open(bleu_json, encoding="utf-8"))[flavour]["score"]
plain = json.load(open(os.path.join(unshuffled, "bleu.json"), encoding="utf-8"))
if flavour not in plain:
    sys.exit(f"evaluate.sh: --unshuffled {unshuffled}: no {flavour} BLEU in its bleu.json")
plain = plain[flavour]["score"]
res = {"shuffle_source": lang, "shuffle_seed": int(seed), "flavour": flavour, "bleu": adv,
       "unshuffled_bleu": plain, "drop": round(plain - adv, 2), "unshuffled": os.path.abspath(unshuffled)}
json.dump(res, open(out, "w", encoding="utf-8"), indent=2)
print(f"adversarial [{flavour}, {lang} shuffled, seed {seed}]: {adv:.2f}, unshuffled {plain:.2f}, "
      f"drop {plain - adv:.2f}")
PY
    fi
fi

# success: the completion marker last, then the whole directory into place
fsx_write_evaluation_complete "$OUT" "checkpoint=$CKPT" "data=$DATA" "split=$SPLIT" "sentences=$n" \
    "${MARK[@]+"${MARK[@]}"}"
fsx_finish_output
