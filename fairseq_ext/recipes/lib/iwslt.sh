# shellcheck shell=bash
# IWSLT (WIT3) release handling shared by prepare-iwslt14.sh and prepare-iwslt-fr-ro.sh.
# Sourced after lib/common.sh. A WIT3 "texts" archive (e.g. de-en.tgz) unpacks to
#   REL/train.tags.REL.L1, REL/train.tags.REL.L2         tagged training text
#   REL/IWSLTyy.TED.SET.REL.L.xml                       dev/test sets (<seg id=..>)
# Test sets released later (tst2014, tst2015) are looked up anywhere under the input
# directory, so they can simply be put next to the unpacked release.

# iwslt_begin REL URL: the recipe's output started and the release REL opened (--from, else
# downloaded from URL); W is the work directory, lc the tokenizer's flags (--lowercase when
# LOWERCASE=1)
iwslt_begin() {
    FSX_LOWERCASE=$LOWERCASE
    fsx_start_output
    iwslt_open_release "$1" "$2"
    W="$FSX_WORK"
    lc=()
    if [[ "$LOWERCASE" == 1 ]]; then lc=(--lowercase); fi
}

# iwslt_open_release REL URL: sets IWSLT_IN to a directory holding the unpacked release
# (downloads URL unless --from; unpacks REL.tgz when only the archive is there).
iwslt_open_release() {
    local rel="$1" url="$2" archive
    if [[ -n "$FSX_FROM" ]]; then
        IWSLT_IN="$(realpath "$FSX_FROM")"
    else
        IWSLT_IN="$(fsx_download_dir)"
        fsx_download "$url" "$IWSLT_IN/$rel.tgz"
    fi
    if [[ -f "$IWSLT_IN" ]]; then # --from pointing at the archive itself
        archive="$IWSLT_IN"
    elif [[ -z "$(fsx_find "$IWSLT_IN" "train.tags.$rel.*")" ]]; then
        archive="$(fsx_find "$IWSLT_IN" "$rel.tgz")"
    else
        archive=""
    fi
    if [[ -n "$archive" ]]; then
        fsx_log "unpacking $archive"
        fsx_extract "$archive" "$FSX_WORK/extract"
        IWSLT_IN="$FSX_WORK/extract"
    fi
}

# iwslt_xml SET REL L OUT: text of IWSLT*.TED.SET.REL.L.xml (any campaign year) into OUT;
# returns 1 when the file is absent.
iwslt_xml() {
    local f
    f="$(fsx_find "$IWSLT_IN" "IWSLT*.TED.$1.$2.$3.xml")"
    [[ -n "$f" ]] || return 1
    fsx_tools extract-segs "$f" >"$4" || exit 1 # corpus.py said why
}

# iwslt_need_sets REL L1 L2 SET...: extract every SET into $FSX_WORK/SET.raw.{L1,L2};
# a missing one is an error.
iwslt_need_sets() {
    local rel="$1" l1="$2" l2="$3" set l
    shift 3
    for set in "$@"; do
        for l in "$l1" "$l2"; do
            iwslt_xml "$set" "$rel" "$l" "$FSX_WORK/$set.raw.$l" ||
                fsx_die "missing file: IWSLT*.TED.$set.$rel.$l.xml (or .gz) not found under $IWSLT_IN — expected the IWSLT $rel release (see --help)"
        done
        fsx_check_parallel "$FSX_WORK/$set.raw.$l1" "$FSX_WORK/$set.raw.$l2"
    done
}

# iwslt_have_sets REL L1 L2 SET...: like iwslt_need_sets, but returns 1 if any is absent.
iwslt_have_sets() {
    local rel="$1" l1="$2" l2="$3" set l
    shift 3
    for set in "$@"; do
        for l in "$l1" "$l2"; do
            iwslt_xml "$set" "$rel" "$l" "$FSX_WORK/$set.raw.$l" || return 1
        done
        fsx_check_parallel "$FSX_WORK/$set.raw.$l1" "$FSX_WORK/$set.raw.$l2"
    done
}

# iwslt_concat L OUT SET...: concatenate $FSX_WORK/SET.raw.L files.
iwslt_concat() {
    local l="$1" out="$2" s
    shift 2
    for s in "$@"; do cat "$FSX_WORK/$s.raw.$l"; done >"$out"
}

# iwslt_train REL L1 L2 [tokenizer options]: train.tags -> $FSX_WORK/train.clean.{L1,L2}
# (tags stripped, --max-lines, Moses-tokenized, cleaned to 1-175 tokens, ratio 1.5).
iwslt_train() {
    local rel="$1" l1="$2" l2="$3" l f
    shift 3
    for l in "$l1" "$l2"; do
        f="$(fsx_need "$IWSLT_IN" "train.tags.$rel.$l" "expected the IWSLT $rel release (see --help)")"
        fsx_cat "$f" | fsx_tools strip-tags >"$FSX_WORK/train.tags.$l"
    done
    fsx_take_train "$FSX_WORK/train.tags.$l1" "$FSX_WORK/train.tags.$l2" \
        "$FSX_WORK/train.raw.$l1" "$FSX_WORK/train.raw.$l2"
    fsx_log "Moses tokenization of the training text ($l1, $l2${1:+; $*})"
    for l in "$l1" "$l2"; do
        fsx_moses "$l" "$@" <"$FSX_WORK/train.raw.$l" >"$FSX_WORK/train.tok0.$l"
    done
    fsx_tools clean "$FSX_WORK/train.tok0.$l1" "$FSX_WORK/train.tok0.$l2" \
        "$FSX_WORK/train.clean.$l1" "$FSX_WORK/train.clean.$l2" --min 1 --max 175 --ratio 1.5
}

# iwslt_tokenize_eval L1 L2 [tokenizer options]: {valid,test}.raw -> {valid,test}.tok
# (valid only when valid.tok does not exist yet, i.e. was not held out from train).
iwslt_tokenize_eval() {
    local l1="$1" l2="$2" split l
    shift 2
    for split in valid test; do
        [[ -f "$FSX_WORK/$split.tok.$l1" ]] && continue
        for l in "$l1" "$l2"; do
            fsx_moses "$l" "$@" <"$FSX_WORK/$split.raw.$l" >"$FSX_WORK/$split.tok.$l"
        done
    done
}
