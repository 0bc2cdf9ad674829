#!/usr/bin/env bash
# IWSLT'15 English-Vietnamese (TED), the En->Vi task of the thesis (Sec. 3.3.1): the
# Stanford NLP release (Luong & Manning, 2015), already Moses-tokenized with XML escapes.
#   train: train (133k pairs)   valid: tst2012 (1,553)   test: tst2013 (1,268)
# If tst2013 is missing from --from DIR (as in some local copies), the recipe
# says so and falls back to: test = tst2012, valid = 1,553 pairs held out from train
# (random sample, seed 1; 10% of train when train is smaller than 15,530 pairs).
#
#   scripts/prepare-iwslt15-en-vi.sh --out data-bin/iwslt15.en-vi
#   scripts/prepare-iwslt15-en-vi.sh --from ~/corpora/iwslt15-en-vi --out data-bin/iwslt15.en-vi
#
# No further tokenization; joint BPE (default 20000 merges: a joined dictionary of 19,996
# types on the full training data, near the thesis' 21k) and fairseq-preprocess
# --joined-dictionary.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

fsx_recipe iwslt15-en-vi 20000 "$@"
DEV_SIZE=1553
BASE_URL="${IWSLT15_ENVI_URL:-https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi}"

usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME --out DIR [--src en --tgt vi | --src vi --tgt en] [--from DIR] [options]

Prepares IWSLT'15 En-Vi (Stanford release) for fairseq.
  --src L, --tgt L   direction (default en -> vi)
  --lowercase        lowercase both sides (off: the thesis scores case-sensitive BLEU)
--from DIR must hold train.{en,vi} and tst2012.{en,vi}, and normally tst2013.{en,vi}
(.gz or plain). Without --from the files are downloaded from
$BASE_URL/
EOF
    fsx_common_usage
}

fsx_parse_direction en-vi vi-en "$@"

fsx_start_output

IN="$(fsx_input_dir)"
if [[ -z "$FSX_FROM" ]]; then
    for split in train tst2012 tst2013; do
        for l in en vi; do
            fsx_download "$BASE_URL/$split.$l" "$IN/$split.$l"
        done
    done
fi

TRAIN_EN="$(fsx_need "$IN" train.en "expected the Stanford IWSLT'15 En-Vi files")"
TRAIN_VI="$(fsx_need "$IN" train.vi "expected the Stanford IWSLT'15 En-Vi files")"
DEV_EN="$(fsx_need "$IN" tst2012.en)"
DEV_VI="$(fsx_need "$IN" tst2012.vi)"
TEST_EN="$(fsx_find "$IN" tst2013.en)"
TEST_VI="$(fsx_find "$IN" tst2013.vi)"
fsx_check_parallel "$DEV_EN" "$DEV_VI"

W="$FSX_WORK"
if [[ -n "$TEST_EN" && -n "$TEST_VI" ]]; then
    fsx_check_parallel "$TEST_EN" "$TEST_VI"
    fsx_take_train "$TRAIN_EN" "$TRAIN_VI" "$W/train.orig.en" "$W/train.orig.vi"
    for l in en vi; do
        dev_file=DEV_${l^^}
        test_file=TEST_${l^^}
        fsx_cat "${!dev_file}" >"$W/valid.orig.$l"
        fsx_cat "${!test_file}" >"$W/test.orig.$l"
    done
    FSX_VALID_NAME=tst2012
    FSX_TEST_NAME=tst2013
else
    fsx_warn "tst2013.{en,vi} not found under $IN: the thesis' test set is missing."
    fsx_warn "FALLBACK SPLIT: test = tst2012, valid = $DEV_SIZE pairs held out from train (random, seed 1; 10% of train if train < 10x that)."
    fsx_warn "Scores on this test set are NOT comparable with published tst2013 results."
    fsx_take_train "$TRAIN_EN" "$TRAIN_VI" "$W/all.orig.en" "$W/all.orig.vi"
    fsx_tools split "$W/all.orig.en" "$W/all.orig.vi" --size "$DEV_SIZE" --seed 1 \
        --rest-src "$W/train.orig.en" --rest-tgt "$W/train.orig.vi" \
        --heldout-src "$W/valid.orig.en" --heldout-tgt "$W/valid.orig.vi"
    for l in en vi; do
        test_file=DEV_${l^^}
        fsx_cat "${!test_file}" >"$W/test.orig.$l"
    done
    FSX_VALID_NAME=heldout-train
    FSX_TEST_NAME=tst2012
fi

# The release is tokenized already: tok = as released (optionally lowercased),
# raw = Moses-detokenized (XML escapes undone) for detokenized sacreBLEU.
for split in train valid test; do
    for l in en vi; do
        if [[ "$LOWERCASE" == 1 ]]; then
            fsx_tools lowercase <"$W/$split.orig.$l" >"$W/$split.tok.$l"
        else
            mv "$W/$split.orig.$l" "$W/$split.tok.$l"
        fi
        if [[ "$split" != train ]]; then
            src_text="$W/$split.orig.$l"
            [[ -f "$src_text" ]] || src_text="$W/$split.tok.$l"
            fsx_detok "$l" <"$src_text" >"$W/$split.raw.$l"
        fi
    done
done

fsx_subword_and_binarize "$SRC" "$TGT"
fsx_finish_output
