#!/usr/bin/env bash
# IWSLT'14 TED tasks of the thesis, De-En (Sec. 4.3.1) and Es-En (Sec. 3.3.1), following
# fairseq's examples/translation/prepare-iwslt14.sh:
#   strip the XML/tag lines, Moses-tokenize, clean train (1-175 tokens, ratio 1.5),
#   joint BPE, fairseq-preprocess --joined-dictionary.
#
#   --pair de-en (default; also en-de): lowercased; valid = every 23rd training pair
#       (~7k, as fairseq/He et al.), test = dev2010 + tst2010 + tst2011 + tst2012;
#       32000 BPE merges (the thesis).
#   --pair es-en (also en-es): cased; valid = dev2010 + tst2010 + tst2011 + tst2012,
#       test = tst2014 (IWSLT14.TED.tst2014.es-en.*.xml, released separately from the
#       training archive). Without tst2014 the recipe warns and falls back to
#       valid = dev2010 + tst2010 + tst2011, test = tst2012. 32000 BPE merges by default
#       (the thesis reports a 34k vocabulary).
#
#   scripts/prepare-iwslt14.sh --pair de-en --out data-bin/iwslt14.de-en
#   scripts/prepare-iwslt14.sh --pair es-en --from DIR --out data-bin/iwslt14.es-en
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/iwslt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/iwslt.sh"

fsx_recipe iwslt14 32000 "$@"
PAIR=de-en
LOWERCASE=""
DE_EN_URL="${IWSLT14_DE_EN_URL:-http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz}"
ES_EN_URL="${IWSLT14_ES_EN_URL:-https://wit3.fbk.eu/archive/2014-01/texts/es/en/es-en.tgz}"

usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME --out DIR [--pair de-en|en-de|es-en|en-es] [--from DIR] [options]

Prepares IWSLT'14 De-En or Es-En (WIT3 2014-01 release) for fairseq.
  --pair SRC-TGT      translation direction (default de-en)
  --lowercase         lowercase (default for de-en / en-de)
  --no-lowercase      keep the casing (default for es-en / en-es)
--from DIR holds the unpacked release (searched 3 levels deep; .gz or plain), i.e. for
de-en: train.tags.de-en.{de,en} and IWSLT14.TED.{dev2010,tst2010,tst2011,tst2012}.de-en.{de,en}.xml,
for es-en the same with es-en and also IWSLT14.TED.tst2014.es-en.{es,en}.xml; or it holds
the archive de-en.tgz / es-en.tgz. Without --from the archive is downloaded from
  de-en: $DE_EN_URL
  es-en: $ES_EN_URL
EOF
    fsx_common_usage
}

FSX_VALUE_OPTS=(--pair=PAIR)
FSX_FLAG_OPTS=(--lowercase=LOWERCASE:1 --no-lowercase=LOWERCASE:0)
fsx_parse_options "$@"
case "$PAIR" in
    de-en | en-de) F=de; URL="$DE_EN_URL"; : "${LOWERCASE:=1}" ;;
    es-en | en-es) F=es; URL="$ES_EN_URL"; : "${LOWERCASE:=0}" ;;
    *) fsx_die "--pair must be one of de-en, en-de, es-en, en-es (not '$PAIR')" ;;
esac
SRC="${PAIR%-*}"
TGT="${PAIR#*-}"
REL="$F-en" # the release's own pair name

iwslt_begin "$REL" "$URL"
DEVSETS=(dev2010 tst2010 tst2011 tst2012)
iwslt_need_sets "$REL" "$F" en "${DEVSETS[@]}"
iwslt_train "$REL" "$F" en "${lc[@]}"

if [[ "$F" == de ]]; then
    FSX_VALID_NAME="train-every-23rd"
    FSX_TEST_NAME="dev2010+tst2010-2012"
    fsx_tools split "$W/train.clean.$F" "$W/train.clean.en" --every 23 \
        --rest-src "$W/train.tok.$F" --rest-tgt "$W/train.tok.en" \
        --heldout-src "$W/valid.tok.$F" --heldout-tgt "$W/valid.tok.en"
    # the untokenized original of a cleaned training line is not kept: detokenize instead
    for l in "$F" en; do
        fsx_detok "$l" <"$W/valid.tok.$l" >"$W/valid.raw.$l"
        iwslt_concat "$l" "$W/test.raw.$l" "${DEVSETS[@]}"
    done
else
    for l in "$F" en; do mv "$W/train.clean.$l" "$W/train.tok.$l"; done
    if iwslt_have_sets "$REL" "$F" en tst2014; then
        FSX_VALID_NAME="dev2010+tst2010-2012"
        FSX_TEST_NAME="tst2014"
        for l in "$F" en; do
            iwslt_concat "$l" "$W/valid.raw.$l" "${DEVSETS[@]}"
            iwslt_concat "$l" "$W/test.raw.$l" tst2014
        done
    else
        fsx_warn "IWSLT14.TED.tst2014.$REL.{$F,en}.xml not found under $IWSLT_IN: the thesis' test set is missing."
        fsx_warn "FALLBACK SPLIT: valid = dev2010+tst2010+tst2011, test = tst2012."
        fsx_warn "Scores on this test set are NOT comparable with published tst2014 results."
        FSX_VALID_NAME="dev2010+tst2010-2011"
        FSX_TEST_NAME="tst2012"
        for l in "$F" en; do
            iwslt_concat "$l" "$W/valid.raw.$l" dev2010 tst2010 tst2011
            iwslt_concat "$l" "$W/test.raw.$l" tst2012
        done
    fi
fi
iwslt_tokenize_eval "$F" en "${lc[@]}"

fsx_subword_and_binarize "$SRC" "$TGT"
fsx_finish_output
