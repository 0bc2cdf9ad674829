#!/usr/bin/env bash
# WMT'14 English-German (about 4.5M pairs), the setup of the thesis (Sec. 3.3.1):
#   train: Europarl v7 + Common Crawl + News Commentary v9
#   valid: newstest2013 (3,000)      test: newstest2014 (full, 3,003)
# Processing as fairseq's examples/translation/prepare-wmt14en2de.sh: Moses punctuation
# normalization and non-printing-character removal, Moses tokenization with -a
# (aggressive hyphen splitting), train cleaned to 1-250 tokens / ratio 1.5; then joint
# BPE with 32000 merges (the thesis) and fairseq-preprocess --joined-dictionary.
#
#   scripts/prepare-wmt14-en-de.sh --out data-bin/wmt14.en-de --workers 16
#   scripts/prepare-wmt14-en-de.sh --from DIR --out data-bin/wmt14.en-de
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

fsx_recipe wmt14-en-de 32000 "$@"
WMT_URLS=(
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz"
    "http://statmt.org/wmt14/dev.tgz"
    "http://statmt.org/wmt14/test-full.tgz"
)
CORPORA=(europarl-v7.de-en commoncrawl.de-en news-commentary-v9.de-en)

usage() {
    cat <<EOF
Usage: $FSX_COMMAND_NAME --out DIR [--src en --tgt de | --src de --tgt en] [--from DIR] [options]

Prepares WMT'14 En-De (newstest2013 valid, newstest2014 test) for fairseq.
  --src L, --tgt L   direction (default en -> de)
  --lowercase        lowercase both sides (default: keep casing)
--from DIR holds the unpacked archives or the archives themselves (searched 3 levels
deep; .gz or plain):
  europarl-v7.de-en.{de,en}, commoncrawl.de-en.{de,en}, news-commentary-v9.de-en.{de,en}
  newstest2013.{de,en}
  newstest2014-deen-src.{en,de}.sgm and newstest2014-deen-ref.{en,de}.sgm
    (or plain newstest2014.{de,en})
Without --from these archives are downloaded:
$(printf '  %s\n' "${WMT_URLS[@]}")
EOF
    fsx_common_usage
}

fsx_parse_direction en-de de-en "$@"
FSX_VALID_NAME=newstest2013
FSX_TEST_NAME=newstest2014

fsx_start_output

IN="$(fsx_input_dir)"
if [[ -z "$FSX_FROM" ]]; then
    for url in "${WMT_URLS[@]}"; do
        fsx_download "$url" "$IN/$(basename "$url")"
    done
fi
# unpack any archives that are there (the downloaded ones, or ones given with --from)
shopt -s nullglob
archives=("$IN"/*.tgz "$IN"/*.tar.gz)
shopt -u nullglob
if [[ ${#archives[@]} -gt 0 && -z "$(fsx_find "$IN" "${CORPORA[0]}.en")" ]]; then
    for a in "${archives[@]}"; do
        fsx_log "unpacking $(basename "$a")"
        fsx_extract "$a" "$FSX_WORK/extract"
    done
    IN="$FSX_WORK/extract"
fi

W="$FSX_WORK"
HINT="expected the WMT'14 En-De release files (see --help)"
# training corpora: concatenated, then --max-lines
: >"$W/train.cat.en"
: >"$W/train.cat.de"
for c in "${CORPORA[@]}"; do
    fen="$(fsx_need "$IN" "$c.en" "$HINT")"
    fde="$(fsx_need "$IN" "$c.de" "$HINT")"
    fsx_check_parallel "$fen" "$fde"
    fsx_cat "$fen" >>"$W/train.cat.en"
    fsx_cat "$fde" >>"$W/train.cat.de"
done
fsx_take_train "$W/train.cat.en" "$W/train.cat.de" "$W/train.raw.en" "$W/train.raw.de"
rm -f "$W/train.cat.en" "$W/train.cat.de"

# valid: newstest2013 (plain text in dev.tgz; the .sgm also works)
for l in en de; do
    f="$(fsx_find "$IN" "newstest2013.$l")"
    if [[ -n "$f" ]]; then
        fsx_cat "$f" >"$W/valid.raw.$l"
    else
        f="$(fsx_need "$IN" "newstest2013-src.$l.sgm" "$HINT")"
        fsx_tools extract-segs "$f" >"$W/valid.raw.$l"
    fi
done
fsx_check_parallel "$W/valid.raw.en" "$W/valid.raw.de"

# test: newstest2014 full (src/ref sgm as in test-full.tgz; or plain newstest2014.L)
for l in en de; do
    f="$(fsx_find "$IN" "newstest2014.$l")"
    if [[ -n "$f" ]]; then
        fsx_cat "$f" >"$W/test.raw.$l"
    else
        kind=ref
        [[ "$l" == en ]] && kind=src
        f="$(fsx_need "$IN" "newstest2014-deen-$kind.$l.sgm" "$HINT")"
        fsx_tools extract-segs "$f" >"$W/test.raw.$l"
    fi
done
fsx_check_parallel "$W/test.raw.en" "$W/test.raw.de"

lc=()
[[ "$LOWERCASE" == 1 ]] && lc=(--lowercase)
fsx_log "Moses normalization + tokenization (-a) with $FSX_WORKERS workers"
for l in en de; do
    fsx_moses "$l" --normalize --aggressive "${lc[@]}" <"$W/train.raw.$l" >"$W/train.tok0.$l"
    for split in valid test; do
        fsx_moses "$l" --normalize --aggressive "${lc[@]}" <"$W/$split.raw.$l" >"$W/$split.tok.$l"
    done
done
fsx_tools clean "$W/train.tok0.en" "$W/train.tok0.de" "$W/train.tok.en" "$W/train.tok.de" \
    --min 1 --max 250 --ratio 1.5
rm -f "$W/train.tok0.en" "$W/train.tok0.de" "$W/train.raw.en" "$W/train.raw.de"

fsx_subword_and_binarize "$SRC" "$TGT"
fsx_finish_output
