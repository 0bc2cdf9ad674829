# shellcheck shell=bash
# Shared functions of the data recipes (scripts/prepare-*.sh) and scripts/quickstart.sh.
# Sourced, never run; the caller has `set -euo pipefail`.
#
# A recipe:
#   1. parses its own options and hands the rest to fsx_common_opt (see fsx_common_usage);
#   2. calls fsx_begin_output: everything is written under a temporary directory next to
#      --out, which is removed on any failure (trap), so no half-written output is left;
#   3. writes into $FSX_WORK, per split S in train/valid/test:
#        S.tok.$SRC S.tok.$TGT   text as the model sees it before subword segmentation
#                                (Moses-tokenized, lowercased where the task says so)
#      and for valid/test also S.raw.$SRC S.raw.$TGT (detokenized, original casing), the
#      references of detokenized sacreBLEU;
#   4. calls fsx_subword_and_binarize (joint BPE / SentencePiece + fairseq-preprocess
#      --joined-dictionary) and fsx_finish_output, which moves the result into place.

# the recipes' directory and the fairseq_ext package (fairseq's --user-dir)
FSX_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSX_USER_DIR="$(cd "$FSX_SCRIPTS_DIR/.." && pwd)"
FSX_PROG="$(basename "$0")"
# the text helpers (corpus.py, spm.py) start their one-line errors with it, as fsx_die does
export FSX_PROG
# what the user typed to run this script, for its --help: `fairseq-ext prepare multi30k` (set
# by fairseq-ext and scripts/, for this script only), else the script's own name
FSX_COMMAND_NAME="${FSX_COMMAND:-$FSX_PROG}"
unset FSX_COMMAND

# fsx_recipe NAME MERGES "$@": a data recipe's name (prep.env's recipe=), its default BPE
# merges, and its command line (recorded in prep.env)
fsx_recipe() {
    FSX_RECIPE="$1"
    FSX_DEFAULT_MERGES="$2"
    shift 2
    FSX_ARGS="$*"
}

# fsx_parse_direction A-B B-A "$@": the options of a recipe for one language pair in either
# direction: --src/--tgt (one of the two directions; default A -> B), --lowercase (default
# off), and the common ones
fsx_parse_direction() {
    local forward="$1" backward="$2"
    shift 2
    SRC="${forward%-*}" TGT="${forward#*-}" LOWERCASE=0
    FSX_VALUE_OPTS=(--src=SRC --tgt=TGT)
    FSX_FLAG_OPTS=(--lowercase=LOWERCASE:1)
    fsx_parse_options "$@"
    fsx_check_pair "$SRC-$TGT" "$forward" "$backward"
    FSX_LOWERCASE=$LOWERCASE
}

fsx_log() { printf '[%s] %s\n' "$FSX_PROG" "$*" >&2; }
fsx_warn() { printf '[%s] WARNING: %s\n' "$FSX_PROG" "$*" >&2; }
fsx_die() {
    printf '%s: error: %s\n' "$FSX_PROG" "$*" >&2
    exit 1
}

# ---------------------------------------------------------------------------- tools
# The python that runs our helpers must have sacremoses/subword_nmt/sentencepiece; its bin
# dir goes first on PATH so fairseq-preprocess/subword-nmt come from the same environment.
fsx_setup_tools() {
    local cand
    if [[ -n "${PYTHON:-}" ]]; then
        cand="$PYTHON"
    elif command -v python >/dev/null 2>&1 &&
        python -c 'import sacremoses, subword_nmt, sentencepiece' >/dev/null 2>&1; then
        cand="$(command -v python)"
    else
        fsx_die "no python with sacremoses, subword-nmt and sentencepiece found; activate the environment fairseq_ext is installed in, or set PYTHON"
    fi
    FSX_PY="$cand"
    local bindir
    bindir="$(dirname "$FSX_PY")"
    case ":$PATH:" in
        *":$bindir:"*) ;;
        *) PATH="$bindir:$PATH" ;;
    esac
    export PATH
}

fsx_require_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || fsx_die "'$c' not found on PATH (run 'make setup', or activate .venv)"
    done
}

# fsx_has_gpu: whether a CUDA GPU is usable (nvidia-smi sees one and torch can use it)
# (torch is asked with FSX_PY, else the python beside fairseq-train, else python3)
fsx_has_gpu() {
    local py="${FSX_PY:-}"
    if [[ -z "$py" ]] && command -v fairseq-train >/dev/null 2>&1; then
        py="$(dirname "$(command -v fairseq-train)")/python"
    fi
    [[ -x "$py" ]] || py=python3
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
        "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}

# fsx_read_config FILE ARRAY: the flags of a configs/*.args file into the array ARRAY
# (one or more flags per line; '#' starts a comment)
fsx_read_config() {
    [[ -f "$1" ]] || fsx_die "no config file $1"
    read -r -a "$2" <<<"$(sed 's/#.*//' "$1" | tr '\n' ' ')"
}

# fsx_config_path NAME|FILE: a training config: an existing file as given, else one the
# package ships (fairseq_ext/configs/NAME.args: iwslt, wmt14, quickstart, ...), as
# `fairseq-ext train --config` reads it
fsx_config_path() {
    local base="${1#configs/}" candidate
    [[ -f "$1" ]] && { echo "$1"; return; }
    for candidate in "$FSX_USER_DIR/configs/$base" "$FSX_USER_DIR/configs/$base.args"; do
        [[ -f "$candidate" ]] && { echo "$candidate"; return; }
    done
    fsx_die "--config $1: no such file, and not a config of the package ($(fsx_config_names))"
}
fsx_config_names() { (cd "$FSX_USER_DIR/configs" && ls -- *.args) | sed 's/\.args$//' | paste -sd ' ' | sed 's/ /, /g'; }

# run as plain files, not modules: they import nothing outside standalone/
fsx_tools() { "$FSX_PY" "$FSX_USER_DIR/standalone/corpus.py" "$@"; }
fsx_spm() { "$FSX_PY" "$FSX_USER_DIR/standalone/spm.py" "$@"; }

# ---------------------------------------------------------------------------- options
FSX_OUT=""
FSX_FROM=""
FSX_BPE="subword_nmt"
FSX_BPE_MERGES=""
FSX_MAX_LINES=0
FSX_WORKERS="$( (nproc 2>/dev/null || echo 1) | head -n1)"
FSX_FORCE=0
FSX_KEEP_TMP=0
FSX_DOWNLOAD_DIR=""

fsx_common_usage() {
    cat <<'EOF'
Common options:
  --out DIR            output (data-bin) directory; written atomically
  --from PATH          use local copies of the release files (directory, searched 3 levels
                       deep; .gz or plain text both accepted) instead of downloading
  --download-dir DIR   keep downloaded archives here (default: a temp dir, deleted)
  --bpe KIND           subword_nmt (joint BPE, default) | sentencepiece (joint SPM, BPE type)
  --bpe-merges N       BPE merge operations; with sentencepiece: the vocabulary size
  --max-lines N        use only the first N training pairs (tests, quick runs); 0 = all
  --workers N          worker processes (tokenizer, apply-bpe, fairseq-preprocess)
  --force              replace --out if it exists and was written by a fairseq_ext script
  --keep-tmp           keep the temporary directory when the recipe fails (debugging)
  -h, --help           this help
EOF
}

# fsx_common_opt "$@": consumes one common option; sets FSX_SHIFT (0 = not ours).
fsx_common_opt() {
    FSX_SHIFT=0
    local opt="$1"
    local val="${2-}"
    case "$opt" in
        --out | --from | --bpe | --bpe-merges | --max-lines | --workers | --download-dir)
            [[ $# -ge 2 && -n "$val" && "$val" != --* ]] || fsx_die "option $opt needs a value"
            FSX_SHIFT=2
            ;;
    esac
    case "$opt" in
        --out) FSX_OUT="$val" ;;
        --from) FSX_FROM="$val" ;;
        --download-dir) FSX_DOWNLOAD_DIR="$val" ;;
        --bpe)
            case "$val" in
                subword_nmt | subword-nmt | bpe) FSX_BPE=subword_nmt ;;
                sentencepiece | spm) FSX_BPE=sentencepiece ;;
                *) fsx_die "--bpe must be subword_nmt or sentencepiece, not '$val'" ;;
            esac
            ;;
        --bpe-merges) FSX_BPE_MERGES="$val" ;;
        --max-lines) FSX_MAX_LINES="$val" ;;
        --workers) FSX_WORKERS="$val" ;;
        --force) FSX_FORCE=1 FSX_SHIFT=1 ;;
        --keep-tmp) FSX_KEEP_TMP=1 FSX_SHIFT=1 ;;
    esac
    case "$FSX_MAX_LINES$FSX_WORKERS${FSX_BPE_MERGES:-0}" in
        *[!0-9]*) fsx_die "--max-lines, --workers and --bpe-merges take non-negative integers" ;;
    esac
    # no merges: subword-nmt would learn nothing and the recipe fail only after tokenizing
    [[ -z "$FSX_BPE_MERGES" ]] || ((10#$FSX_BPE_MERGES >= 1)) ||
        fsx_die "--bpe-merges must be at least 1 (with sentencepiece: the vocabulary size), not $FSX_BPE_MERGES"
    return 0
}

# fsx_parse_options "$@": the option loop of every recipe. Before calling it, a recipe
# declares its own options and the variables they set:
#   FSX_VALUE_OPTS=(--src=SRC --tgt=TGT)         an option with a value
#   FSX_FLAG_OPTS=(--lowercase=LOWERCASE:1)      a flag, and the value it sets
# and defines usage(). Every other option is one of fsx_common_usage's.
FSX_VALUE_OPTS=()
FSX_FLAG_OPTS=()
fsx_parse_options() {
    local spec opt matched
    while [[ $# -gt 0 ]]; do
        [[ "$1" == -h || "$1" == --help ]] && { usage; exit 0; }
        matched=0
        for spec in "${FSX_VALUE_OPTS[@]+"${FSX_VALUE_OPTS[@]}"}"; do
            opt="${spec%%=*}"
            if [[ "$1" == "$opt" ]]; then
                [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || fsx_die "option $opt needs a value"
                printf -v "${spec#*=}" '%s' "$2"
                shift 2
                matched=1
                break
            fi
        done
        [[ "$matched" == 1 ]] && continue
        for spec in "${FSX_FLAG_OPTS[@]+"${FSX_FLAG_OPTS[@]}"}"; do
            opt="${spec%%=*}"
            if [[ "$1" == "$opt" ]]; then
                spec="${spec#*=}"
                printf -v "${spec%%:*}" '%s' "${spec#*:}"
                shift
                matched=1
                break
            fi
        done
        [[ "$matched" == 1 ]] && continue
        fsx_common_opt "$@"
        [[ "$FSX_SHIFT" -gt 0 ]] || { usage >&2; fsx_die "unknown option: $1"; }
        shift "$FSX_SHIFT"
    done
    fsx_check_common
}

# fsx_check_pair SRC-TGT PAIR...: die unless the direction is one of the recipe's pairs
fsx_check_pair() {
    local pair="$1" p
    shift
    for p in "$@"; do [[ "$pair" == "$p" ]] && return 0; done
    fsx_die "--src/--tgt must be one of $(echo "$@" | sed 's/ /, /g'), not ${pair/-//}"
}

# fsx_start_output: the tools a recipe needs, then its temporary output (fsx_begin_output)
fsx_start_output() {
    fsx_setup_tools
    fsx_require_cmd subword-nmt fairseq-preprocess
    fsx_begin_output
}

# fsx_input_dir: where the release files are: --from, or a fresh download directory
# (the caller downloads into it when $FSX_FROM is empty)
fsx_input_dir() {
    if [[ -n "$FSX_FROM" ]]; then realpath "$FSX_FROM"; else fsx_download_dir; fi
}

fsx_check_common() {
    [[ -n "$FSX_OUT" ]] || fsx_die "--out DIR is required"
    [[ "$FSX_WORKERS" -ge 1 ]] || FSX_WORKERS=1
    # one rule for every command (quickstart, reproduce, selfcheck-pack, prepare): without
    # --from, a local copy in $FAIRSEQ_EXT_DATA/RECIPE is read instead of downloading
    if [[ -z "$FSX_FROM" && -n "${FAIRSEQ_EXT_DATA:-}" && -d "$FAIRSEQ_EXT_DATA/$FSX_RECIPE" ]]; then
        FSX_FROM="$FAIRSEQ_EXT_DATA/$FSX_RECIPE"
        fsx_log "reading the local copy $FSX_FROM (\$FAIRSEQ_EXT_DATA/$FSX_RECIPE; --from DIR reads another)"
    fi
    if [[ -n "$FSX_FROM" && ! -e "$FSX_FROM" ]]; then
        fsx_die "--from $FSX_FROM: no such file or directory"
    fi
}

# ---------------------------------------------------------------------------- atomic output
# Every bash script of this package that writes a directory (the recipes, quickstart.sh)
# writes it through these functions (the Python tools, evaluation and significance, through
# their twin outputs.StagedOutput):
#   fsx_begin_output      FSX_OUT's lock is taken (fsx_lock_output: one writer at a time);
#                         FSX_OUT must be absent, or a directory this script wrote that holds
#                         nothing else (fsx_check_replaceable; the recipes also want --force);
#                         a temporary directory $FSX_TMP is made beside it, with $FSX_WORK
#                         (scratch) and $FSX_STAGE (the future FSX_OUT)
#   fsx_discard_old_output  (optional) the previous FSX_OUT is removed now rather than at the end
#   fsx_finish_output     the marker (the exact manifest of $FSX_STAGE) goes into $FSX_STAGE,
#                         which replaces FSX_OUT by renames
# On any failure the trap removes $FSX_TMP (--keep-tmp: keeps it), so FSX_OUT is either the
# old directory, untouched, or the new one, complete.
FSX_TMP=""
FSX_DONE=0
FSX_INPUTS=()           # paths the output must never contain (besides --from, --download-dir)
FSX_KEEP_ON_FAILURE=()  # files of $FSX_STAGE put into FSX_OUT when the script fails (logs)

# fsx_outputs COMMAND ARG...: the output-directory protocol, fairseq_ext/standalone/outputs.py
# (the marker and its manifest, what may be replaced, the locks), run as a file for this script
fsx_outputs() {
    "${FSX_PY:-python3}" "$FSX_USER_DIR/standalone/outputs.py" --prog "$FSX_PROG" "$@"
}

fsx_cleanup() {
    local rc=$? f
    if [[ "$FSX_DONE" != 1 && -n "$FSX_TMP" && -d "$FSX_TMP" ]]; then
        if [[ "$FSX_KEEP_TMP" == 1 ]]; then
            fsx_log "failed; intermediate files kept in $FSX_TMP"
        else
            # the logs of a failed run, where no output is (never mixed into an old one):
            # gathered and marked beside it (its manifest), then renamed into place
            if [[ ! -e "$FSX_OUT" ]]; then
                for f in "${FSX_KEEP_ON_FAILURE[@]+"${FSX_KEEP_ON_FAILURE[@]}"}"; do
                    [[ -f "$FSX_STAGE/$f" ]] || continue
                    mkdir -p "$FSX_TMP/failed" && mv -f "$FSX_STAGE/$f" "$FSX_TMP/failed/$f" || true
                done
                if [[ -d "$FSX_TMP/failed" ]]; then
                    fsx_outputs mark "$FSX_TMP/failed" && mv -T "$FSX_TMP/failed" "$FSX_OUT" || true
                fi
            fi
            rm -rf "$FSX_TMP"
        fi
    fi
    fsx_release_locks
    return $rc
}

# ---------------------------------------------------------------------------- one writer
# fsx_lock_output DIR [WHAT]: hold DIR's lock (PARENT/.NAME.lock) until this script exits, so
# that a second command writing DIR is refused with one line naming this one. Idempotent; a
# lock that a parent of this script holds (the command that started it: its holder line names
# it) is not taken again. fsx_begin_output takes FSX_OUT's.
FSX_LOCKS=()
fsx_lock_output() {
    local dir lock fd try status held
    dir="$(realpath -m "$1")"
    lock="$(dirname "$dir")/.$(basename "$dir").lock"
    for held in "${FSX_LOCKS[@]+"${FSX_LOCKS[@]}"}"; do
        [[ "$held" == "$lock" ]] && return 0
    done
    mkdir -p "$(dirname "$dir")"
    trap fsx_cleanup EXIT
    for try in 1 2 3 4 5; do
        exec {fd}<>"$lock" || fsx_die "cannot open the lock file $lock"
        status=0
        fsx_outputs lock "$dir" "$fd" "$$" "${2:-output directory}" || status=$?
        if [[ $status == 0 ]]; then
            FSX_LOCKS+=("$lock")
            return 0
        fi
        exec {fd}>&-
        [[ $status == 2 ]] && return 0
        [[ $status == 3 ]] || exit 1
    done
    fsx_die "the lock file $lock of $dir keeps being replaced: is another command starting and stopping there?"
}

# fsx_release_locks: remove the lock files this script holds (while still holding them; the
# locks themselves end with the script)
fsx_release_locks() {
    local lock
    for lock in "${FSX_LOCKS[@]+"${FSX_LOCKS[@]}"}"; do
        rm -f "$lock"
    done
    FSX_LOCKS=()
}

# fsx_add_output_entries DIR ENTRY...: add entries to DIR's marker; SUB/ names a nested output,
# a subdirectory that another script of this package writes with its own marker (quickstart:
# SAVE_DIR eval-test/). An entry need not exist yet.
fsx_add_output_entries() { fsx_outputs add-entries "$@" || exit 1; }

# fsx_check_replaceable DIR [INPUT...]: die unless an existing DIR may be deleted and
# replaced by this script (docs/trust.md, "Output directories")
fsx_check_replaceable() { fsx_outputs check-replaceable "$@" || exit 1; }

# fsx_begin_output: see above. Without --force (FSX_FORCE=1) an existing FSX_OUT is an error.
fsx_begin_output() {
    local parent base stale
    FSX_OUT="$(realpath -m "$FSX_OUT")"
    fsx_lock_output "$FSX_OUT"
    if [[ -e "$FSX_OUT" && "$FSX_FORCE" != 1 ]]; then
        fsx_die "output directory $FSX_OUT already exists (use --force to replace it)"
    fi
    fsx_check_replaceable "$FSX_OUT" "$FSX_FROM" "$FSX_DOWNLOAD_DIR" "${FSX_INPUTS[@]+"${FSX_INPUTS[@]}"}"
    parent="$(dirname "$FSX_OUT")"
    base="$(basename "$FSX_OUT")"
    mkdir -p "$parent"
    stale="$(fsx_outputs stale-staging "$FSX_OUT")" || exit 1
    [[ -z "$stale" ]] || fsx_warn "$stale"
    FSX_TMP="$(mktemp -d "$parent/.$base.tmp.XXXXXX")"
    trap fsx_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    FSX_WORK="$FSX_TMP/work"
    FSX_STAGE="$FSX_TMP/out"
    mkdir -p "$FSX_WORK" "$FSX_STAGE"
    fsx_log "working in $FSX_TMP"
}

# fsx_discard_old_output: remove the previous FSX_OUT at once (quickstart: from its start
# until it succeeds, --out holds no result, so no stale result can pass for the new one)
fsx_discard_old_output() {
    if [[ -e "$FSX_OUT" ]]; then
        mv "$FSX_OUT" "$FSX_TMP/old"
        rm -rf "$FSX_TMP/old"
    fi
}

fsx_finish_output() {
    rm -rf "$FSX_WORK"
    fsx_outputs mark "$FSX_STAGE" || exit 1
    if [[ -e "$FSX_OUT" ]]; then
        # checked again: the user may have put something into it while the script ran
        fsx_check_replaceable "$FSX_OUT" "$FSX_FROM" "$FSX_DOWNLOAD_DIR" "${FSX_INPUTS[@]+"${FSX_INPUTS[@]}"}"
        mv "$FSX_OUT" "$FSX_TMP/old"
    fi
    mv "$FSX_STAGE" "$FSX_OUT"
    FSX_DONE=1
    rm -rf "$FSX_TMP"
    fsx_log "done: $FSX_OUT"
}

# ---------------------------------------------------------------------------- inputs
# fsx_cat FILE: print a plain or gzipped corpus file as clean text: UTF-8 checked (an
# invalid line is an error naming the file and line), a leading BOM dropped, CR LF and a
# lone CR inside a line turned into \n and a space, a final newline (corpus.py cat).
fsx_cat() {
    [[ -f "$1" ]] || fsx_die "missing file: $1"
    fsx_tools cat "$1" || exit 1 # corpus.py said why, in one line
}

# fsx_find DIR NAME: path of NAME or NAME.gz under DIR (at most 3 levels deep), or "".
fsx_find() {
    local dir="$1" name="$2" hit
    if [[ -f "$dir/$name" ]]; then echo "$dir/$name"; return 0; fi
    if [[ -f "$dir/$name.gz" ]]; then echo "$dir/$name.gz"; return 0; fi
    hit="$(find -L "$dir" -maxdepth 3 -type f \( -name "$name" -o -name "$name.gz" \) 2>/dev/null |
        LC_ALL=C sort | sed -n 1p)"  # sed reads all: no SIGPIPE under pipefail
    echo "$hit"
}

# fsx_need DIR NAME [HINT]: like fsx_find, but a missing file is an error.
fsx_need() {
    local hit
    hit="$(fsx_find "$1" "$2")"
    [[ -n "$hit" ]] || fsx_die "missing file: $2 (or $2.gz) not found under $1${3:+ — $3}"
    echo "$hit"
}

# fsx_download URL DEST: fetch one file; on failure explain how to use --from.
fsx_download() {
    local url="$1" dest="$2"
    [[ -s "$dest" ]] && { fsx_log "using cached $dest"; return 0; }
    fsx_log "downloading $url"
    local ok=1
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --retry 2 --connect-timeout 20 -o "$dest.part" "$url" && ok=0
    elif command -v wget >/dev/null 2>&1; then
        wget -q -T 20 -t 2 -O "$dest.part" "$url" && ok=0
    else
        fsx_die "neither curl nor wget is installed; download $url yourself and pass --from DIR"
    fi
    if [[ $ok != 0 || ! -s "$dest.part" ]]; then
        rm -f "$dest.part"
        fsx_die "download failed: $url. If this machine is offline, fetch the release elsewhere and run again with --from DIR (a directory holding the files; see $FSX_PROG --help)"
    fi
    mv "$dest.part" "$dest"
}

# fsx_download_dir: where downloads go (a subdir of the temp dir unless --download-dir).
fsx_download_dir() {
    if [[ -n "$FSX_DOWNLOAD_DIR" ]]; then
        mkdir -p "$FSX_DOWNLOAD_DIR"
        realpath "$FSX_DOWNLOAD_DIR"
    else
        mkdir -p "$FSX_TMP/download"
        echo "$FSX_TMP/download"
    fi
}

# fsx_extract ARCHIVE DIR: unpack a .tgz/.tar.gz/.tar/.zip archive into DIR.
fsx_extract() {
    mkdir -p "$2"
    case "$1" in
        *.tgz | *.tar.gz) tar -xzf "$1" -C "$2" || fsx_die "cannot unpack $1 (corrupt download?)" ;;
        *.tar) tar -xf "$1" -C "$2" || fsx_die "cannot unpack $1" ;;
        *.zip) (cd "$2" && "$FSX_PY" -m zipfile -e "$1" .) || fsx_die "cannot unpack $1" ;;
        *) fsx_die "unknown archive type: $1" ;;
    esac
}

# fsx_check_parallel A B: both exist, non-empty, equal line counts (clear error otherwise).
fsx_check_parallel() {
    fsx_tools check-parallel "$@" || exit 1 # corpus.py said why, in one line
}

# fsx_take_train SRC_FILE TGT_FILE OUT_SRC OUT_TGT: copy (gunzipped), honouring --max-lines.
fsx_take_train() {
    fsx_check_parallel "$1" "$2"
    fsx_tools head "$FSX_MAX_LINES" "$1" "$3"
    fsx_tools head "$FSX_MAX_LINES" "$2" "$4"
    if [[ "$FSX_MAX_LINES" -gt 0 ]]; then
        fsx_log "--max-lines $FSX_MAX_LINES: using the first $(wc -l <"$3") training pairs"
    fi
}

# fsx_moses LANG [tokenize options...] < in > out
fsx_moses() {
    local lang="$1"
    shift
    fsx_tools tokenize -l "$lang" --workers "$FSX_WORKERS" "$@"
}

fsx_detok() { fsx_tools detokenize -l "$1"; }

# ---------------------------------------------------------------------------- subwords + binarize
# fsx_subword_and_binarize SRC TGT: needs $FSX_WORK/{train,valid,test}.tok.{SRC,TGT} and
# $FSX_WORK/{valid,test}.raw.{SRC,TGT}; fills $FSX_STAGE.
fsx_subword_and_binarize() {
    local src="$1" tgt="$2" split l
    local merges="${FSX_BPE_MERGES:-$FSX_DEFAULT_MERGES}"
    mkdir -p "$FSX_STAGE/text"
    for split in train valid test; do
        fsx_check_parallel "$FSX_WORK/$split.tok.$src" "$FSX_WORK/$split.tok.$tgt"
    done
    for split in valid test; do
        for l in "$src" "$tgt"; do
            cp "$FSX_WORK/$split.tok.$l" "$FSX_STAGE/text/$split.tok.$l"
            cp "$FSX_WORK/$split.raw.$l" "$FSX_STAGE/text/$split.raw.$l"
        done
    done

    # multi-source data (FSX_EXTRA_SRC="fr cs"): the extra sources share the BPE and the
    # dictionary, and are binarized against the same target (train.fr-de.fr, ...)
    local extra=(${FSX_EXTRA_SRC:-})
    local langs=("$src" "$tgt" "${extra[@]+"${extra[@]}"}")
    for l in "${extra[@]+"${extra[@]}"}"; do
        for split in train valid test; do
            fsx_check_parallel "$FSX_WORK/$split.tok.$src" "$FSX_WORK/$split.tok.$l"
        done
        for split in valid test; do
            cp "$FSX_WORK/$split.tok.$l" "$FSX_STAGE/text/$split.tok.$l"
            cp "$FSX_WORK/$split.raw.$l" "$FSX_STAGE/text/$split.raw.$l"
        done
    done
    local train_tok=()
    for l in "${langs[@]}"; do train_tok+=("$FSX_WORK/train.tok.$l"); done

    if [[ "$FSX_BPE" == subword_nmt ]]; then
        fsx_log "learning joint BPE, $merges merges (subword-nmt)"
        cat "${train_tok[@]}" |
            subword-nmt learn-bpe -s "$merges" >"$FSX_STAGE/code" 2>"$FSX_WORK/learn-bpe.log" ||
            fsx_die "subword-nmt learn-bpe failed: $(tail -n 3 "$FSX_WORK/learn-bpe.log")"
        for split in train valid test; do
            for l in "${langs[@]}"; do
                subword-nmt apply-bpe -c "$FSX_STAGE/code" --num-workers "$FSX_WORKERS" \
                    <"$FSX_WORK/$split.tok.$l" >"$FSX_WORK/$split.bpe.$l" ||
                    fsx_die "subword-nmt apply-bpe failed on $split.$l"
            done
        done
    else
        fsx_log "training joint SentencePiece (BPE), vocabulary $merges"
        fsx_spm train --model-prefix "$FSX_STAGE/spm" --vocab-size "$merges" \
            --threads "$FSX_WORKERS" "${train_tok[@]}"
        for split in train valid test; do
            for l in "${langs[@]}"; do
                fsx_spm encode --model "$FSX_STAGE/spm.model" \
                    <"$FSX_WORK/$split.tok.$l" >"$FSX_WORK/$split.bpe.$l"
            done
        done
    fi

    if [[ ${#extra[@]} -eq 0 ]]; then
        fsx_log "binarizing (fairseq-preprocess --joined-dictionary)"
        fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
            --trainpref "$FSX_WORK/train.bpe" --validpref "$FSX_WORK/valid.bpe" \
            --testpref "$FSX_WORK/test.bpe" --destdir "$FSX_STAGE" \
            --joined-dictionary --workers "$FSX_WORKERS" >"$FSX_WORK/preprocess.log" 2>&1 ||
            fsx_die "fairseq-preprocess failed: $(tail -n 5 "$FSX_WORK/preprocess.log")"
    else
        # one dictionary over every source and the target, then each source against the target
        fsx_log "binarizing $src+${extra[*]// /+} -> $tgt with one dictionary (fairseq-preprocess)"
        local train_bpe=()
        for l in "${langs[@]}"; do train_bpe+=("$FSX_WORK/train.bpe.$l"); done
        cat "${train_bpe[@]}" >"$FSX_WORK/dict-text.all"
        fairseq-preprocess --only-source --dict-only --trainpref "$FSX_WORK/dict-text" --source-lang all \
            --destdir "$FSX_WORK/dict" --workers "$FSX_WORKERS" >"$FSX_WORK/preprocess.log" 2>&1 ||
            fsx_die "fairseq-preprocess (dictionary) failed: $(tail -n 5 "$FSX_WORK/preprocess.log")"
        for l in "$src" "${extra[@]}"; do
            fairseq-preprocess --source-lang "$l" --target-lang "$tgt" \
                --trainpref "$FSX_WORK/train.bpe" --validpref "$FSX_WORK/valid.bpe" \
                --testpref "$FSX_WORK/test.bpe" --destdir "$FSX_STAGE" \
                --srcdict "$FSX_WORK/dict/dict.all.txt" --tgtdict "$FSX_WORK/dict/dict.all.txt" \
                --workers "$FSX_WORKERS" >>"$FSX_WORK/preprocess.log" 2>&1 ||
                fsx_die "fairseq-preprocess failed for $l-$tgt: $(tail -n 5 "$FSX_WORK/preprocess.log")"
        done
    fi
    cp "$FSX_WORK/preprocess.log" "$FSX_STAGE/preprocess.log"
    [[ -f "$FSX_STAGE/dict.$src.txt" && -f "$FSX_STAGE/train.$src-$tgt.$src.bin" ]] ||
        fsx_die "fairseq-preprocess produced no binarized data (see $FSX_STAGE/preprocess.log)"

    local n_train n_valid n_test n_dict
    n_train=$(wc -l <"$FSX_WORK/train.bpe.$src")
    n_valid=$(wc -l <"$FSX_WORK/valid.bpe.$src")
    n_test=$(wc -l <"$FSX_WORK/test.bpe.$src")
    n_dict=$(wc -l <"$FSX_STAGE/dict.$src.txt")
    {
        echo "# written by $FSX_PROG; read by scripts/evaluate.sh"
        echo "recipe=$FSX_RECIPE"
        echo "src=$src"
        echo "tgt=$tgt"
        if [[ ${#extra[@]} -gt 0 ]]; then
            local joined="${extra[*]}"
            echo "extra_src=${joined// /,}"
        fi
        echo "bpe=$FSX_BPE"
        echo "bpe_merges=$merges"
        echo "lowercase=${FSX_LOWERCASE:-0}"
        echo "valid_set=${FSX_VALID_NAME:-valid}"
        echo "test_set=${FSX_TEST_NAME:-test}"
        echo "train_pairs=$n_train"
        echo "valid_pairs=$n_valid"
        echo "test_pairs=$n_test"
        echo "dict_size=$n_dict"
        echo "command=$FSX_PROG ${FSX_ARGS:-}"
    } >"$FSX_STAGE/prep.env"
    fsx_log "train $n_train / valid $n_valid / test $n_test pairs; joined dictionary $n_dict types"
}
