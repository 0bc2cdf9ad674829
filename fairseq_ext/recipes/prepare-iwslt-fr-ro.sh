#!/usr/bin/env bash
# The IWSLT En<->Fr and Ro<->En tasks of the thesis (Sec. 5.4.1), processed like the
# IWSLT'14 recipe (tags stripped, Moses tokenization, train cleaned to 1-175 tokens /
# ratio 1.5, cased, joint BPE, fairseq-preprocess --joined-dictionary):
#
#   --pair ro-en | en-ro   IWSLT 2014 Ro-En release (about 182k training pairs);
#       valid = dev2010 + tst2010 + tst2011 + tst2012, test = tst2014.
#       Without tst2014: warning, valid = dev2010 + tst2010 + tst2011, test = tst2012.
#   --pair en-fr | fr-en   IWSLT 2015 En-Fr release (about 207k training pairs);
#       valid = dev2010 + tst2010 + tst2011 + tst2012 + tst2013 (those present),
#       test = tst2014 + tst2015. Without them: warning, test = tst2013 (or tst2012)
#       and valid = the remaining dev sets.
#   32000 BPE merges by default (the thesis reports 32k / 31k-type vocabularies).
#
#   scripts/prepare-iwslt-fr-ro.sh --pair ro-en --out data-bin/iwslt14.ro-en
#   scripts/prepare-iwslt-fr-ro.sh --pair en-fr --from DIR --out data-bin/iwslt15.en-fr
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/iwslt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/iwslt.sh"

fsx_recipe iwslt-fr-ro 32000 "$@"
PAIR=""
LOWERCASE=0
RO_EN_URL="${IWSLT14_RO_EN_URL:-https://wit3.fbk.eu/archive/2014-01/texts/ro/en/ro-en.tgz}"
EN_FR_URL="${IWSLT15_EN_FR_URL:-https://wit3.fbk.eu/archive/2015-01/texts/en/fr/en-fr.tgz}"

usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME --pair ro-en|en-ro|en-fr|fr-en --out DIR [--from DIR] [options]

Prepares the IWSLT Ro-En (2014) or En-Fr (2015) TED task for fairseq.
  --pair SRC-TGT   translation direction (required)
  --lowercase      lowercase both sides (default: keep casing, as the thesis)
--from DIR holds the unpacked WIT3 release (searched 3 levels deep; .gz or plain):
  ro-en: train.tags.ro-en.{ro,en}, IWSLT14.TED.{dev2010,tst2010,tst2011,tst2012,tst2014}.ro-en.{ro,en}.xml
  en-fr: train.tags.en-fr.{en,fr}, IWSLT15.TED.{dev2010,tst2010,...,tst2015}.en-fr.{en,fr}.xml
or the archive ro-en.tgz / en-fr.tgz. Without --from the archive is downloaded from
  ro-en: $RO_EN_URL
  en-fr: $EN_FR_URL
EOF
    fsx_common_usage
}

FSX_VALUE_OPTS=(--pair=PAIR)
FSX_FLAG_OPTS=(--lowercase=LOWERCASE:1)
fsx_parse_options "$@"
[[ -n "$PAIR" ]] || { usage >&2; fsx_die "--pair is required (ro-en, en-ro, en-fr or fr-en)"; }
case "$PAIR" in
    ro-en | en-ro) REL=ro-en; L1=ro; L2=en; URL="$RO_EN_URL" ;;
    en-fr | fr-en) REL=en-fr; L1=en; L2=fr; URL="$EN_FR_URL" ;;
    *) fsx_die "--pair must be one of ro-en, en-ro, en-fr, fr-en (not '$PAIR')" ;;
esac
SRC="${PAIR%-*}"
TGT="${PAIR#*-}"

iwslt_begin "$REL" "$URL"

if [[ "$REL" == ro-en ]]; then
    DEVSETS=(dev2010 tst2010 tst2011 tst2012)
    TESTSETS=(tst2014)
else
    DEVSETS=(dev2010 tst2010 tst2011 tst2012)
    # tst2013 is part of the 2015 release; use it for validation when present
    iwslt_have_sets "$REL" "$L1" "$L2" tst2013 && DEVSETS+=(tst2013)
    TESTSETS=(tst2014 tst2015)
fi
iwslt_need_sets "$REL" "$L1" "$L2" dev2010 tst2010 tst2011 tst2012
if iwslt_have_sets "$REL" "$L1" "$L2" "${TESTSETS[@]}"; then
    :
else
    fsx_warn "test set(s) ${TESTSETS[*]} of $REL not found under $IWSLT_IN: the thesis' test set is missing."
    TESTSETS=("${DEVSETS[-1]}")
    unset 'DEVSETS[-1]'
    fsx_warn "FALLBACK SPLIT: valid = ${DEVSETS[*]}, test = ${TESTSETS[*]}."
    fsx_warn "Scores on this test set are NOT comparable with published results."
fi
FSX_VALID_NAME="$(IFS=+; echo "${DEVSETS[*]}")"
FSX_TEST_NAME="$(IFS=+; echo "${TESTSETS[*]}")"
for l in "$L1" "$L2"; do
    iwslt_concat "$l" "$W/valid.raw.$l" "${DEVSETS[@]}"
    iwslt_concat "$l" "$W/test.raw.$l" "${TESTSETS[@]}"
done

iwslt_train "$REL" "$L1" "$L2" "${lc[@]}"
for l in "$L1" "$L2"; do mv "$W/train.clean.$l" "$W/train.tok.$l"; done
iwslt_tokenize_eval "$L1" "$L2" "${lc[@]}"

fsx_subword_and_binarize "$SRC" "$TGT"
fsx_finish_output
