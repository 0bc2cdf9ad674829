#!/usr/bin/env bash
# Paired bootstrap resampling (Koehn, 2004) of system B against system A with sacreBLEU
# (--paired-bs, 1000 samples as in the papers; --paired-ar for approximate randomization), in
# the BLEU flavour of the compared files, plus compare-mt's (Neubig et al., 2019) analyses: BLEU
# by reference-length bucket (<10, 10-20, ..., >=50, as the thesis reports), word accuracy,
# n-grams. The p-value and mark come from sacreBLEU, the scorer of the BLEU they qualify;
# compare-mt's own BLEU treats a zero n-gram precision as 1 and can disagree (docs/evaluation.md).
#
#   scripts/significance.sh --eval-a EVAL_DIR_A --eval-b EVAL_DIR_B --out DIR   # evaluate.sh outputs
#   scripts/significance.sh --ref REF --sys-a HYP_A --sys-b HYP_B --out DIR [--src SRC]
#
# By default the Moses-tokenized files of evaluate.sh are compared (hyp.tok / ref.tok,
# multi-bleu style, sacreBLEU --tokenize none); --level detok uses the detokenized ones (13a).
# Writes DIR/significance.{txt,json} (sacreBLEU), DIR/report.txt (compare-mt's text report)
# and DIR/index.html (+ figures), all at once when both succeeded (an existing DIR
# is replaced only when significance.sh wrote it). With --eval-*, only directories that hold
# a complete evaluation (evaluate.sh's .evaluation-complete) are read. compare-mt runs through fairseq_ext/tools/compare_mt_shim.py,
# which works around compare-mt 0.2.10's undeclared dependency on `six`.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

REF=""
SYS_A=""
SYS_B=""
SRC_FILE=""
EVAL_A=""
EVAL_B=""
OUT=""
NAMES=(A B)
SAMPLES=1000
SEED=1
LEVEL=tok
LC=0
METHOD=bs
EXTRA=()

usage() {
    cat <<EOF
Usage: $FSX_PROG (--eval-a DIR --eval-b DIR | --ref REF --sys-a HYP --sys-b HYP) --out DIR [options]

  --eval-a/--eval-b DIR  output directories of scripts/evaluate.sh (same data and split)
  --ref FILE             reference; --sys-a/--sys-b FILE the two systems' outputs
  --src FILE             source sentences (optional; enables source-side analyses)
  --level tok|detok      with --eval-*: compare tokenized (default) or detokenized text
  --names "A B"          system names in the report (default "A B")
  --samples N            bootstrap samples (default 1000)
  --seed N               random seed (default 1)
  --lc                   case-insensitive BLEU (e.g. IWSLT'14 De-En)
  --paired-ar            approximate randomization instead of the paired bootstrap
  --out DIR              report directory (created; significance.txt/.json, index.html, report.txt)
Further arguments after -- go to compare-mt unchanged.
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --ref) REF="${2?--ref needs a value}"; shift 2 ;;
        --sys-a) SYS_A="${2?--sys-a needs a value}"; shift 2 ;;
        --sys-b) SYS_B="${2?--sys-b needs a value}"; shift 2 ;;
        --src) SRC_FILE="${2?--src needs a value}"; shift 2 ;;
        --eval-a) EVAL_A="${2?--eval-a needs a value}"; shift 2 ;;
        --eval-b) EVAL_B="${2?--eval-b needs a value}"; shift 2 ;;
        --level) LEVEL="${2?--level needs a value}"; shift 2 ;;
        --names) read -r -a NAMES <<<"${2?--names needs a value}"; shift 2 ;;
        --samples) SAMPLES="${2?--samples needs a value}"; shift 2 ;;
        --seed) SEED="${2?--seed needs a value}"; shift 2 ;;
        --lc) LC=1; shift ;;
        --paired-ar) METHOD=ar; shift ;;
        --paired-bs) METHOD=bs; shift ;;
        --out) OUT="${2?--out needs a value}"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) usage >&2; fsx_die "unknown option: $1" ;;
    esac
done
[[ -n "$OUT" ]] || { usage >&2; fsx_die "--out DIR is required"; }
[[ "${#NAMES[@]}" == 2 ]] || fsx_die "--names takes two names, e.g. --names \"baseline mlmha\""
case "$SAMPLES$SEED" in *[!0-9]*) fsx_die "--samples and --seed take integers" ;; esac
case "$LEVEL" in tok | detok) ;; *) fsx_die "--level must be tok or detok" ;; esac

if [[ -n "$EVAL_A" || -n "$EVAL_B" ]]; then
    [[ -n "$EVAL_A" && -n "$EVAL_B" ]] || fsx_die "give both --eval-a and --eval-b"
    [[ -z "$SYS_A$SYS_B" ]] || fsx_die "use either --eval-a/--eval-b or --sys-a/--sys-b, not both"
    fsx_check_evaluation "$EVAL_A"
    fsx_check_evaluation "$EVAL_B"
    SYS_A="$EVAL_A/hyp.$LEVEL"
    SYS_B="$EVAL_B/hyp.$LEVEL"
    REF="${REF:-$EVAL_A/ref.$LEVEL}"
    if [[ -z "$SRC_FILE" && -f "$EVAL_A/src.tok" ]]; then SRC_FILE="$EVAL_A/src.tok"; fi
    if [[ -f "$EVAL_B/ref.$LEVEL" ]] && ! cmp -s "$REF" "$EVAL_B/ref.$LEVEL"; then
        fsx_die "$EVAL_A and $EVAL_B were scored against different references (not the same data/split?)"
    fi
fi
[[ -n "$REF" && -n "$SYS_A" && -n "$SYS_B" ]] || { usage >&2; fsx_die "need --ref, --sys-a and --sys-b (or --eval-a/--eval-b)"; }

fsx_setup_tools
# --out: a directory significance.sh wrote (or a new or empty one), replaced when the
# report is complete; never one that holds the compared files
FSX_OUT="$OUT"
FSX_FORCE=1
FSX_INPUTS=("$REF" "$SYS_A" "$SYS_B" "$SRC_FILE" "$EVAL_A" "$EVAL_B")
fsx_begin_output
FSX_KEEP_ON_FAILURE=(compare-mt.log sacrebleu.log)
names=(ref sys-a sys-b)
files=("$REF" "$SYS_A" "$SYS_B")
if [[ -n "$SRC_FILE" ]]; then
    names+=(src)
    files+=("$SRC_FILE")
fi
fsx_check_parallel "${files[@]}"
# compare-mt reads copies cleaned by the reader of every script (UTF-8 checked, BOM and CRs
# removed: Python's universal newlines would split a line at a lone CR, wc -l would not)
clean=()
for i in "${!files[@]}"; do
    fsx_cat "${files[$i]}" >"$FSX_WORK/${names[$i]}"
    clean+=("$FSX_WORK/${names[$i]}")
done
OUT="$FSX_STAGE"
flavour="$LEVEL-cased"
[[ "$LC" == 1 ]] && flavour="$LEVEL-lc"
fsx_log "sacreBLEU paired $([[ $METHOD == bs ]] && echo bootstrap || echo 'approximate randomization'), $SAMPLES samples, BLEU $flavour"
if ! "$FSX_PY" -m fairseq_ext.tools.significance --ref "${clean[0]}" --baseline "${clean[1]}" \
    --baseline-name "${NAMES[0]}" --system "${NAMES[1]}=${clean[2]}" --flavour "$flavour" --method "$METHOD" \
    --samples "$SAMPLES" --seed "$SEED" --json "$OUT/significance.json" >"$OUT/significance.txt" 2>"$OUT/sacrebleu.log"; then
    tail -n 5 "$OUT/sacrebleu.log" >&2
    fsx_die "the sacreBLEU paired test failed (log: $FSX_OUT/sacrebleu.log)"
fi
rm -f "$OUT/sacrebleu.log"
cat "$OUT/significance.txt"
ci=""
[[ "$LC" == 1 ]] && ci=",case_insensitive=True"
args=("${clean[@]:0:3}" --sys_names "${NAMES[@]}"
    --compare_scores "score_type=bleu,bootstrap=$SAMPLES,prob_thresh=0.05$ci" "score_type=length"
    --compare_sentence_buckets "bucket_type=length,statistic_type=score,score_measure=bleu,bucket_cutoffs=10:20:30:40:50$ci"
    --output_directory "$OUT" --seed "$SEED"
    --report_title "${NAMES[0]} vs ${NAMES[1]}")
[[ -n "$SRC_FILE" ]] && args+=(--src_file "${clean[3]}")
fsx_log "compare-mt: paired bootstrap, $SAMPLES samples ($(basename "$SYS_A") vs $(basename "$SYS_B"))"
if ! MPLBACKEND=Agg "$FSX_PY" "$FSX_USER_DIR/tools/compare_mt_shim.py" "${args[@]}" \
    "${EXTRA[@]+"${EXTRA[@]}"}" >"$OUT/report.txt" 2>"$OUT/compare-mt.log"; then
    tail -n 15 "$OUT/compare-mt.log" >&2
    fsx_die "compare-mt failed (log: $FSX_OUT/compare-mt.log)"
fi
fsx_finish_output
fsx_log "significance: $FSX_OUT/significance.txt; compare-mt's analyses (length buckets, word accuracy): $FSX_OUT/report.txt, $FSX_OUT/index.html"
