#!/usr/bin/env python3
"""The output-directory protocol: the one implementation of the rules by which every command
of this package writes a directory (the data recipes, quickstart.sh, ``fairseq-ext evaluate``,
``fairseq-ext significance``): the marker with the exact manifest of what a script wrote, and
the check that a directory may be replaced. docs/trust.md ("Output directories") states the
rules. The evaluation-complete file is :mod:`evaluations`, the atomic writing of a directory
:mod:`staging`, the command line the bash recipes run :mod:`outputs_command`.

What the bash side knows comes in the environment: FSX_PROG (the running script: the name in
markers and messages), FSX_REPLACES (a glob over the writers whose directories it may replace;
default FSX_PROG), FSX_CALLER_PWD (the directory the user started in), FSX_INSTALL_DIR (the
directory holding the package).
"""
import fnmatch
import os
import re
import shlex
import shutil
import sys
from typing import Iterable, List, Optional, Sequence, Tuple

# Every directory a script of this package writes holds this file. Its first line says which
# script wrote the directory; its second line, MANIFEST, that every other line is the exact
# path (relative, with "/") of one file, symlink or empty directory that the script wrote
# there, or, ending in "/", of a subdirectory that another script of the package wrote and
# that holds its own marker (a nested output: quickstart's SAVE_DIR/eval-test/). A directory is
# replaced only while it holds nothing but those entries, at any depth: whatever a user put
# into it later keeps it (docs/trust.md, "Output directories").
MARKER = ".fairseq_ext-output"
MANIFEST = "# manifest: exact paths"
# evaluation writes this file into its output last; significance reads only such directories
# (evaluations.check_evaluation).
EVAL_COMPLETE = ".evaluation-complete"
# the name evaluation writes under (markers, messages): directories written by evaluate.sh stay
# its own
EVALUATE = "evaluate.sh"
SIGNIFICANCE = "significance.sh"
# Legacy: what each script writes (names or globs of the top level), for a directory whose
# marker was written before the manifest (no MANIFEST line) or that has no marker at all and is
# known by prep.env, .evaluation-complete or quickstart.settings. Such a directory is compared
# with these entries at its top level only: the recipes' entry "text" (a directory) covers
# everything beneath it, which only these legacy markers allow; a manifest lists each file.
RECIPE_ENTRIES = ("dict.*.txt", "*.bin", "*.idx", "code", "spm.model", "spm.vocab", "text", "prep.env",
                  "preprocess.log")
EVAL_ENTRIES = ("generate-*", "hyp.*", "ref.*", "src.tok", "bleu.txt", "bleu.json", EVAL_COMPLETE, ".evaluate.tmp.*")
QUICKSTART_ENTRIES = ("checkpoint*", "train.log", "quickstart.settings", "eval-test")
# A legacy glob that a user's file can match too is read as the names the script itself
# writes: quickstart's "checkpoint*" as fairseq's checkpoint names (checkpoint_utils.
# save_checkpoint: checkpointE.pt, checkpoint_E_U.pt, checkpoint_best.pt, checkpoint_last.pt,
# checkpoint.best_METRIC_VALUE.pt), so that a user's checkpoint_avg5.pt keeps the directory.
FAIRSEQ_CHECKPOINT = re.compile(r"checkpoint(\d+|_\d+_\d+|_best|_last|\.best_\w+_-?\d+(\.\d+)?)\.pt")
NARROWED = {"checkpoint*": FAIRSEQ_CHECKPOINT}
# the directory that holds the package (a checkout or site-packages): never replaced
INSTALL_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class OutputError(Exception):
    """A directory that may not be replaced or read; the message is the one-line error."""


def _prog() -> str:
    return os.environ.get("FSX_PROG") or os.path.basename(sys.argv[0])


def default_entries(writer: str) -> Sequence[str]:
    """What ``writer`` writes into its directory, for one marked before the manifest (legacy)."""
    if writer.startswith("prepare-"):
        return RECIPE_ENTRIES
    return {EVALUATE: EVAL_ENTRIES, "quickstart.sh": QUICKSTART_ENTRIES}.get(writer, ())


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n")
    except OSError:
        return ""


def _header(prog: str) -> str:
    return f"# written by {prog} (fairseq_ext); it may replace this directory while it holds only:\n"


def _is_dir(path: str) -> bool:
    """A directory itself, not a symlink to one (a symlink is an entry like a file)."""
    return os.path.isdir(path) and not os.path.islink(path)


def _listing(path: str) -> List[str]:
    return sorted(os.listdir(path), key=os.fsencode)


def manifest(directory: str) -> List[str]:
    """The exact manifest of ``directory``: every file, symlink and empty directory beneath
    it, as a relative path with "/", sorted; a subdirectory that holds its own marker (another
    script's output) as "SUB/"; not the marker itself. A name with a newline cannot be listed:
    it is left out, so that the directory is never replaced while it holds it."""
    entries = []

    def walk(rel: str) -> None:
        for name in _listing(os.path.join(directory, rel) if rel else directory):
            path_rel = f"{rel}/{name}" if rel else name
            if path_rel == MARKER or "\n" in name:
                continue
            path = os.path.join(directory, path_rel)
            if not _is_dir(path):
                entries.append(path_rel)
            elif os.path.lexists(os.path.join(path, MARKER)):
                entries.append(path_rel + "/")
            elif os.listdir(path):
                walk(path_rel)
            else:
                entries.append(path_rel)

    walk("")
    return sorted(entries, key=os.fsencode)


def mark_output(directory: str, entries: Sequence[str] = (), prog: Optional[str] = None) -> None:
    """Write the marker into ``directory``: the exact manifest of what it holds now (every
    script of the package). ``entries`` (names or globs) write a legacy marker instead, read as
    markers written before the manifest are; kept for scripts that still list their globs."""
    prog = prog or _prog()
    with open(os.path.join(directory, MARKER), "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        f.write(_header(prog))
        if entries:
            f.writelines(e + "\n" for e in entries)
        else:
            f.write(MANIFEST + "\n")
            f.writelines(e + "\n" for e in manifest(directory))


def _check_entry(entry: str) -> None:
    path = entry[:-1] if entry.endswith("/") else entry
    parts = path.split("/")
    if not path or "\n" in entry or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OutputError(f"{entry!r} is not a relative path inside the directory (an entry of its {MARKER})")


def add_output_entries(directory: str, entries: Sequence[str]) -> None:
    """Add ``entries`` to ``directory``'s marker (exact paths; "SUB/" for a nested output that
    another script wrote there, such as quickstart's SAVE_DIR/eval-test/). An entry need not
    exist yet. A directory of the package without a marker (known by prep.env, ...) gets a
    legacy marker listing what its writer writes, and the entries."""
    for entry in entries:
        _check_entry(entry)
    read = _read_marker(directory)
    if read is None:
        writer = dir_writer(directory)
        if writer is None:
            raise OutputError(f"cannot add to the marker of {directory}: it holds no {MARKER} (no fairseq_ext "
                              "script wrote it)")
        mark_output(directory, [*default_entries(writer), *entries], prog=writer)
        return
    listed = set(read[1])
    new = [e for e in dict.fromkeys(entries) if e not in listed]
    marker = os.path.join(directory, MARKER)
    with open(marker, "rb") as f:
        text = f.read()
    with open(marker, "a", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        if text and not text.endswith(b"\n"):
            f.write("\n")
        f.writelines(e + "\n" for e in new)


def dir_writer(directory: str) -> Optional[str]:
    """The script that wrote ``directory`` (prepare-multi30k.sh, evaluate.sh, ...): from its
    marker, or for a directory written before the marker, from prep.env (a recipe's output),
    .evaluation-complete (evaluate.sh's) or quickstart.settings (quickstart.sh's). None: no
    script of this package wrote it."""
    marker = os.path.join(directory, MARKER)
    if os.path.isfile(marker):
        m = re.match(r"(# )?written by ([^ ;]+)", _first_line(marker))
        if m:
            return m.group(2)
    m = re.match(r"# written by (prepare-[^ ;]+)", _first_line(os.path.join(directory, "prep.env")))
    if m:
        return m.group(1)
    if os.path.isfile(os.path.join(directory, EVAL_COMPLETE)):
        return EVALUATE
    if os.path.isfile(os.path.join(directory, "quickstart.settings")):
        return "quickstart.sh"
    return None


def _read_marker(directory: str) -> Optional[Tuple[bool, List[str]]]:
    """(whether it is a manifest, its entries) of ``directory``'s marker; None without one."""
    marker = os.path.join(directory, MARKER)
    if not os.path.isfile(marker) or not _first_line(marker).startswith("# written by "):
        return None
    with open(marker, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        lines = f.read().split("\n")
    if len(lines) > 1 and lines[1] == MANIFEST:  # every line after the two of the header is a path
        return True, [line for line in lines[2:] if line]
    return False, [line for line in lines[1:] if line and not line.startswith("#")]


def owned_entries(directory: str, writer: str) -> List[str]:
    """The entries that ``writer`` wrote into ``directory``: those its marker lists (exact
    paths, or in a legacy marker names or globs), or for a directory written before the marker,
    what ``writer`` writes."""
    read = _read_marker(directory)
    return read[1] if read is not None else list(default_entries(writer))


def _within(directory: str, path: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _find_git(directory: str) -> Optional[str]:
    if os.path.basename(directory) == ".git":
        return directory
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            if name == ".git":
                return os.path.join(root, name)
    return None


# the temporary directory a script writes DIR in (DIR's parent/.DIR.tmp.XXXXXX, bash's mktemp
# and StagedOutput alike); a run killed before it finished leaves it behind
STAGING = re.compile(r"^\.(.+)\.tmp\.[A-Za-z0-9]{6}$")


def stale_staging_message(directory: str, entry: str, target: str) -> str:
    """Why ``directory`` is not replaced while it holds ``entry`` (a relative path), the
    temporary directory of an interrupted run that would have become ``target`` beside it, and
    the command that clears it."""
    writer = "evaluate.sh's" if target.startswith("eval-") else "a fairseq_ext script's"
    path = os.path.join(directory, entry)
    return (f"refusing to replace {directory}: it holds {entry}, {writer} temporary directory for "
            f"{os.path.join(os.path.dirname(path), target)} left by a run that was interrupted; nothing in it is a "
            f"result: remove it with  rm -rf {shlex.quote(path)}  and run again")


def _refusal(top: str, entry: str, writer: str) -> OutputError:
    """Why ``top`` is not replaced while it holds ``entry`` (a path relative to it), which
    ``writer`` did not write there."""
    path = os.path.join(top, entry)
    if _is_dir(path):
        stale = STAGING.match(os.path.basename(entry))
        if stale:
            return OutputError(stale_staging_message(top, entry, stale.group(1)))
        other = dir_writer(path)
        if other:
            return OutputError(f"refusing to replace {top}: it holds {entry}, {other}'s output that {writer} did not "
                               f"write; move it elsewhere, or remove {top} yourself")
    return OutputError(f"refusing to replace {top}: it holds {entry}, which {writer} did not write there; move it "
                       f"elsewhere, or remove {top} yourself")


def lock_name(name: str) -> str:
    """The name of the lock file of the output directory ``name``, which lies beside it
    (locks.lock_path; common.sh's fsx_lock_output writes the same name)."""
    return f".{name}.lock"


def nested_lock(entry: str) -> str:
    """The lock file (locks.lock_path) of the nested output ``entry`` (a relative path), which
    lies beside it in its parent: the writer of the nested output removes it when done, a
    writer killed with SIGKILL leaves it; it is part of the nested output, not a user's file."""
    head, name = os.path.split(entry.rstrip("/"))
    return os.path.join(head, lock_name(name))


def _check_nested(top: str, entry: str, owner: str) -> None:
    """A subdirectory ``entry`` that its parent's marker lists as a nested output: owned while
    it holds nothing, or its own marker's check passes."""
    path = os.path.join(top, entry)
    if not _is_dir(path):
        raise _refusal(top, entry, owner)
    if not os.listdir(path):
        return
    writer = dir_writer(path)
    if writer is None:
        raise _refusal(top, entry, owner)
    _check_owned(top, entry, writer)


def _check_owned(top: str, prefix: str, writer: str) -> None:
    """Raise OutputError unless the directory ``top/prefix`` holds nothing but what its marker
    (``writer``'s) lists; messages name paths relative to ``top``."""
    directory = os.path.join(top, prefix) if prefix else top
    read = _read_marker(directory)
    shown = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
    if read is None or not read[0]:
        _check_legacy(top, prefix, writer, read[1] if read is not None else list(default_entries(writer)))
        return
    files = {e for e in read[1] if not e.endswith("/")}
    nested = {e[:-1] for e in read[1] if e.endswith("/")}
    parents = {e.rstrip("/").rsplit("/", n)[0] for e in read[1] for n in range(1, e.rstrip("/").count("/") + 1)}
    locks = {nested_lock(e) for e in nested}

    def walk(rel: str) -> None:
        for name in _listing(os.path.join(directory, rel) if rel else directory):
            path_rel = f"{rel}/{name}" if rel else name
            if path_rel == MARKER or path_rel in locks:
                continue
            path = os.path.join(directory, path_rel)
            if not _is_dir(path):
                if path_rel not in files:
                    raise _refusal(top, shown(path_rel), writer)
            elif path_rel in nested:
                _check_nested(top, shown(path_rel), writer)
            elif path_rel not in parents and path_rel not in files:
                raise _refusal(top, shown(path_rel), writer)  # a directory it did not make
            elif os.path.lexists(os.path.join(path, MARKER)) and f"{path_rel}/{MARKER}" not in files:
                raise _refusal(top, shown(path_rel), writer)  # another script's output since
            else:
                walk(path_rel)

    walk("")


def _check_legacy(top: str, prefix: str, writer: str, entries: Sequence[str]) -> None:
    """A directory marked before the manifest (or known by its files): its top level against
    ``entries`` (names or globs, narrowed by NARROWED; "SUB/" a nested output)."""
    directory = os.path.join(top, prefix) if prefix else top
    globs = [e for e in entries if not e.endswith("/")]
    nested = {e[:-1] for e in entries if e.endswith("/")}
    for name in _listing(directory):
        if name == MARKER or name in {nested_lock(n) for n in nested}:
            continue
        entry = f"{prefix}/{name}" if prefix else name
        path = os.path.join(directory, name)
        if name in nested:
            _check_nested(top, entry, writer)
        elif not any(NARROWED[g].fullmatch(name) if g in NARROWED else fnmatch.fnmatchcase(name, g) for g in globs):
            raise _refusal(top, entry, writer)
        elif _is_dir(path) and os.path.lexists(os.path.join(path, MARKER)):
            # a listed directory that another script wrote (quickstart's eval-test): its own check
            _check_nested(top, entry, writer)


def check_replaceable(directory: str, inputs: Iterable[str] = (), *, prog: Optional[str] = None,
                      replaces: Optional[str] = None, caller_pwd: Optional[str] = None,
                      install_dir: Optional[str] = None) -> None:
    """Raise OutputError unless an existing ``directory`` may be deleted and replaced by
    ``prog``. It must not be, or contain, /, $HOME, the working directory (also the one the user
    started in, ``caller_pwd``), the directory holding the package or any of ``inputs``; it must
    not contain a git repository (at any depth); and it must be empty, or have been written by a
    script that ``replaces`` (a glob; default: ``prog`` itself) matches and hold nothing but the
    entries that script wrote: every file, symlink and empty directory, at any depth, listed in
    its manifest, every nested output listed and itself replaceable by the same rules."""
    prog = prog or _prog()
    replaces = replaces or os.environ.get("FSX_REPLACES") or prog
    caller_pwd = caller_pwd if caller_pwd is not None else os.environ.get("FSX_CALLER_PWD", "")
    install_dir = install_dir or os.environ.get("FSX_INSTALL_DIR") or INSTALL_DIR
    d = os.path.realpath(directory)
    if not os.path.lexists(d):
        return
    for p in ("/", os.environ.get("HOME") or "/", os.getcwd(), caller_pwd, install_dir, *inputs):
        if not p:
            continue
        p = os.path.realpath(str(p))
        if _within(d, p):
            raise OutputError(f"refusing to replace {d}: it is or contains {p}")
    if not os.path.isdir(d):
        raise OutputError(f"refusing to replace {d}: it is not a directory")
    git = _find_git(d)
    if git:
        raise OutputError(f"refusing to replace {d}: it contains a git repository ({git})")
    if not os.listdir(d):
        return
    writer = dir_writer(d)
    if writer is None:
        raise OutputError(f"refusing to replace {d}: it was not written by a fairseq_ext script (no {MARKER} in it); "
                          "remove it yourself or choose another directory")
    if not fnmatch.fnmatchcase(writer, replaces):
        raise OutputError(f"refusing to replace {d}: it was written by {writer}, and {prog} replaces only its own "
                          "output; remove it yourself or choose another directory")
    _check_owned(d, "", writer)
