#!/usr/bin/env bash
# Multi30k task 1 (Elliott et al., 2016): 29,000 train / 1,014 val / 1,000 test_2016_flickr
# image captions, four-way parallel (en, de, fr, cs), raw untokenized text.
#
#   scripts/prepare-multi30k.sh --out data-bin/multi30k.en-de                       # download
#   scripts/prepare-multi30k.sh --from ~/corpora/multi30k --src en --tgt fr --out DIR
#   scripts/prepare-multi30k.sh --src en --extra-src fr --tgt de --out data-bin/multi30k.en+fr-de   # multi-source
#
# Moses tokenization (sacremoses, XML escaping as Moses does), joint BPE (default 8000
# merges), fairseq-preprocess --joined-dictionary. Splits: train / val (valid) / test set
# chosen with --test-set (default test_2016_flickr).
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

fsx_recipe multi30k 8000 "$@"
SRC=en
TGT=de
TEST_SET=test_2016_flickr
EXTRA_SRC=""
LOWERCASE=0
BASE_URL="${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}"
LANGS="en de fr cs"

usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME --out DIR [--src en] [--tgt de] [--from DIR] [options]

Prepares Multi30k task 1 for fairseq.
  --src L, --tgt L     any two of: $LANGS (default en -> de)
  --extra-src L[,L]    more source languages for multi-source translation (e.g. fr, or fr,cs):
                       one BPE and one dictionary over all sources and the target, each extra
                       source binarized against the target (train.fr-de.fr, ...); train with
                       --task multi_source_translation -s SRC -t TGT --extra-source-langs L[,L]
  --test-set NAME      test_2016_flickr (default) | test_2017_flickr | test_2017_mscoco
  --lowercase          lowercase after tokenization
--from DIR must hold train.L, val.L and <test-set>.L for both languages (.gz or plain),
e.g. ~/corpora/multi30k. Without --from the files are downloaded from
$BASE_URL
EOF
    fsx_common_usage
}

FSX_VALUE_OPTS=(--src=SRC --tgt=TGT --test-set=TEST_SET --extra-src=EXTRA_SRC)
FSX_FLAG_OPTS=(--lowercase=LOWERCASE:1)
fsx_parse_options "$@"
for l in "$SRC" "$TGT"; do
    case " $LANGS " in *" $l "*) ;; *) fsx_die "language '$l' is not in Multi30k ($LANGS)" ;; esac
done
[[ "$SRC" != "$TGT" ]] || fsx_die "--src and --tgt must differ"
EXTRA=()
IFS=',' read -r -a EXTRA <<<"$EXTRA_SRC"
for l in "${EXTRA[@]+"${EXTRA[@]}"}"; do
    case " $LANGS " in *" $l "*) ;; *) fsx_die "--extra-src: language '$l' is not in Multi30k ($LANGS)" ;; esac
    [[ "$l" != "$SRC" && "$l" != "$TGT" ]] || fsx_die "--extra-src: '$l' is already --src or --tgt"
done
[[ $(printf '%s\n' "${EXTRA[@]+"${EXTRA[@]}"}" | sort | uniq -d | wc -l) == 0 ]] || fsx_die "--extra-src: a language is given twice"
FSX_EXTRA_SRC="${EXTRA[*]+"${EXTRA[*]}"}"
ALL_LANGS=("$SRC" "$TGT" "${EXTRA[@]+"${EXTRA[@]}"}")
FSX_LOWERCASE=$LOWERCASE
FSX_VALID_NAME=val
FSX_TEST_NAME=$TEST_SET

fsx_start_output

IN="$(fsx_input_dir)"
if [[ -z "$FSX_FROM" ]]; then
    for split in train val "$TEST_SET"; do
        for l in "${ALL_LANGS[@]}"; do
            fsx_download "$BASE_URL/$split.$l.gz" "$IN/$split.$l.gz"
        done
    done
fi

declare -A FILE
for split in train val "$TEST_SET"; do
    for l in "${ALL_LANGS[@]}"; do
        FILE[$split.$l]="$(fsx_need "$IN" "$split.$l" "expected Multi30k task-1 raw files")"
    done
    fsx_check_parallel "${FILE[$split.$SRC]}" "${FILE[$split.$TGT]}"
    for l in "${EXTRA[@]+"${EXTRA[@]}"}"; do fsx_check_parallel "${FILE[$split.$SRC]}" "${FILE[$split.$l]}"; done
done

W="$FSX_WORK"
fsx_take_train "${FILE[train.$SRC]}" "${FILE[train.$TGT]}" "$W/train.raw.$SRC" "$W/train.raw.$TGT"
for l in "${EXTRA[@]+"${EXTRA[@]}"}"; do fsx_tools head "$FSX_MAX_LINES" "${FILE[train.$l]}" "$W/train.raw.$l"; done
for l in "${ALL_LANGS[@]}"; do
    fsx_cat "${FILE[val.$l]}" >"$W/valid.raw.$l"
    fsx_cat "${FILE[$TEST_SET.$l]}" >"$W/test.raw.$l"
done

lc=()
[[ "$LOWERCASE" == 1 ]] && lc=(--lowercase)
fsx_log "Moses tokenization (${ALL_LANGS[*]})"
for split in train valid test; do
    for l in "${ALL_LANGS[@]}"; do
        fsx_moses "$l" "${lc[@]}" <"$W/$split.raw.$l" >"$W/$split.tok.$l"
    done
done

fsx_subword_and_binarize "$SRC" "$TGT"
fsx_finish_output
