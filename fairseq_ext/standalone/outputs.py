#!/usr/bin/env python3
"""The output-directory protocol: how every command of this package writes a directory (the data recipes, quickstart.sh,
``fairseq-ext evaluate``, ``fairseq-ext significance``), in one place; docs/trust.md ("Output directories") states the
rules. The marker and its manifest (:func:`mark_output`), what may be replaced (:func:`check_replaceable`), one writer
at a time (:class:`OutputLock`), a directory written atomically (:class:`StagedOutput`; common.sh's fsx_begin_output /
fsx_finish_output in bash) and the temporary directories of killed runs.

The bash recipes run this file as a plain file (it imports nothing outside standalone/)::

  outputs.py --prog NAME COMMAND ...
    check-replaceable DIR [INPUT...]  exit 1 with one line unless an existing DIR may be replaced
    mark DIR                          write the marker into DIR: the exact manifest of what it holds
    add-entries DIR ENTRY...          add entries to DIR's marker (SUB/: a nested output)
    lock DIR FD PID [WHAT]            lock DIR for the bash script PID on its open file FD of DIR's
                                      lock file: exit 1 with one line when another command holds
                                      it, 2 when a parent of PID holds it, 3 when the file was
                                      replaced meanwhile (open it again)
    stale-staging DIR                 one line about the temporary directories beside DIR that
                                      killed runs left behind (none: nothing)

``--prog`` is the running script, the name in markers and in the error line (``NAME: error:``).
Nothing crosses from a command to the commands it starts in the environment: a lock that a
parent holds is recognised by the holder line in its file (:func:`lock_fd`).
"""
import argparse
import datetime
import errno
import fcntl
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
from typing import Iterable, List, Optional, Sequence, Set, Tuple

# Every directory a script of this package writes holds this file. Its first line says which script wrote the directory;
# its second line, MANIFEST, that every other line is the exact path (relative, with "/") of one file, symlink or empty
# directory that the script wrote there, or, ending in "/", of a subdirectory that another script of the package wrote
# and that holds its own marker (a nested output: quickstart's SAVE_DIR/eval-test/). A directory is replaced only while
# it holds nothing but those entries, at any depth.
MARKER = ".fairseq_ext-output"
MANIFEST = "# manifest: exact paths"
# the names evaluation and significance write under (markers, messages)
EVALUATE = "evaluate.sh"
SIGNIFICANCE = "significance.sh"
# the directory that holds the package (a checkout or site-packages): never replaced
INSTALL_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the temporary directory DIR is written in, beside it: .DIR.tmp. and 6 characters (the
# recipes' mktemp) or 8 (Python's mkdtemp); a run killed before it finished leaves it behind
STAGING = re.compile(r"^\.(.+)\.tmp\.[A-Za-z0-9_]{6}(?:[A-Za-z0-9_]{2})?$")
# file systems without flock (some network file systems): no lock, said once, work goes on
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class OutputError(Exception):
    """A directory that may not be replaced or read; the message is the one-line error."""


class OutputBusyError(OutputError):
    """Another process is writing the directory; the message names it."""


# ---------------------------------------------------------------------------- the marker
def _is_dir(path: str) -> bool:
    """A directory itself, not a symlink to one (a symlink is an entry like a file)."""
    return os.path.isdir(path) and not os.path.islink(path)


def _listing(path: str) -> List[str]:
    return sorted(os.listdir(path), key=os.fsencode)


def manifest(directory: str) -> List[str]:
    """The exact manifest of ``directory``: every file, symlink and empty directory beneath it, as a relative path with
    "/", sorted; a subdirectory that holds its own marker (another script's output) as "SUB/"; not the marker itself. A
    name with a newline cannot be listed: it is left out, so that the directory is never replaced while it holds it."""
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


def mark_output(directory: str, *, prog: str) -> None:
    """Write the marker into ``directory``: ``prog`` wrote it, and the exact manifest of what it holds now."""
    with open(os.path.join(directory, MARKER), "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        f.write(f"# written by {prog} (fairseq_ext); it may replace this directory while it holds only:\n")
        f.write(MANIFEST + "\n")
        f.writelines(e + "\n" for e in manifest(directory))


def _read_marker(directory: str) -> Optional[Tuple[str, List[str]]]:
    """(the script that wrote ``directory``, the entries of its manifest); None without a marker that is a manifest."""
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    writer = re.match(r"# written by ([^ ;]+)", lines[0])
    if not writer or len(lines) < 2 or lines[1] != MANIFEST:
        return None
    return writer.group(1), [line for line in lines[2:] if line]


def dir_writer(directory: str) -> Optional[str]:
    """The script that wrote ``directory`` (prepare-multi30k.sh, evaluate.sh, ...), from its
    marker; None: no script of this package wrote it."""
    read = _read_marker(directory)
    return read[0] if read else None


def owned_entries(directory: str) -> List[str]:
    """The entries of ``directory``'s manifest: what its writer wrote there."""
    read = _read_marker(directory)
    return read[1] if read else []


def _unmarked(directory: str) -> str:
    """Why ``directory``, which has no manifest, is nobody's output but the user's."""
    if os.path.lexists(os.path.join(directory, MARKER)):
        return f"its {MARKER} holds no manifest of exact paths (a marker of an earlier version)"
    return f"it was not written by a fairseq_ext script (no {MARKER} in it)"


def add_output_entries(directory: str, entries: Sequence[str]) -> None:
    """Add ``entries`` to ``directory``'s marker (exact paths; "SUB/" for a nested output that another script writes
    there, such as quickstart's SAVE_DIR/eval-test/). An entry need not exist yet."""
    for entry in entries:
        path = entry[:-1] if entry.endswith("/") else entry
        if not path or "\n" in entry or path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
            raise OutputError(f"{entry!r} is not a relative path inside the directory (an entry of its {MARKER})")
    read = _read_marker(directory)
    if read is None:
        raise OutputError(f"cannot add to the marker of {directory}: {_unmarked(directory)}")
    marker = os.path.join(directory, MARKER)
    with open(marker, "rb") as f:
        text = f.read()
    with open(marker, "a", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        if text and not text.endswith(b"\n"):
            f.write("\n")
        f.writelines(e + "\n" for e in dict.fromkeys(entries) if e not in read[1])


# ---------------------------------------------------------------------------- replacing
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


def _refusal(top: str, entry: str, writer: str) -> OutputError:
    """Why ``top`` is not replaced while it holds ``entry`` (a path relative to it), which ``writer`` did not write
    there: the temporary directory of an interrupted run, another script's output, or a user's file."""
    path = os.path.join(top, entry)
    if _is_dir(path):
        stale = STAGING.match(os.path.basename(entry))
        if stale:
            whose = "evaluate.sh's" if stale.group(1).startswith("eval-") else "a fairseq_ext script's"
            return OutputError(f"refusing to replace {top}: it holds {entry}, {whose} temporary directory for "
                               f"{os.path.join(os.path.dirname(path), stale.group(1))} left by a run that was "
                               f"interrupted; nothing in it is a result: remove it with  rm -rf {shlex.quote(path)}  "
                               "and run again")
        other = dir_writer(path)
        if other:
            return OutputError(f"refusing to replace {top}: it holds {entry}, {other}'s output that {writer} did not "
                               f"write; move it elsewhere, or remove {top} yourself")
    return OutputError(f"refusing to replace {top}: it holds {entry}, which {writer} did not write there; move it "
                       f"elsewhere, or remove {top} yourself")


def _check_owned(top: str, prefix: str, writer: str, entries: Sequence[str]) -> None:
    """Raise OutputError unless the directory ``top/prefix`` holds nothing but ``entries``
    (``writer``'s manifest); messages name paths relative to ``top``."""
    directory = os.path.join(top, prefix) if prefix else top
    shown = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
    files = {e for e in entries if not e.endswith("/")}
    nested = {e[:-1] for e in entries if e.endswith("/")}
    parents = {e.rstrip("/").rsplit("/", n)[0] for e in entries for n in range(1, e.rstrip("/").count("/") + 1)}
    # a nested output's lock file lies beside it: a writer killed with SIGKILL leaves it
    locks = {os.path.join(os.path.dirname(e), f".{os.path.basename(e)}.lock") for e in nested}

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


def _check_nested(top: str, entry: str, owner: str) -> None:
    """A subdirectory ``entry`` that its parent's manifest lists as a nested output: owned
    while it holds nothing, or while its own manifest's check passes."""
    path = os.path.join(top, entry)
    read = _read_marker(path) if _is_dir(path) else None
    if read is not None:
        _check_owned(top, entry, *read)
    elif not _is_dir(path) or os.listdir(path):
        raise _refusal(top, entry, owner)


def check_replaceable(directory: str, inputs: Iterable[str] = (), *, prog: str,
                      install_dir: Optional[str] = None) -> None:
    """Raise OutputError unless an existing ``directory`` may be deleted and replaced by ``prog``. It must not be, or
    contain, /, $HOME, the working directory (no script changes it, so it is the one the user started in), the directory
    holding the package or any of ``inputs``; it must not contain a git repository (at any depth); and it must be empty,
    or hold ``prog``'s marker and nothing but the entries of its manifest: every file, symlink and empty directory, at
    any depth, and every nested output listed, itself replaceable by the same rules."""
    d = os.path.realpath(directory)
    if not os.path.lexists(d):
        return
    for p in ("/", os.environ.get("HOME") or "/", os.getcwd(), install_dir or INSTALL_DIR, *inputs):
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
    read = _read_marker(d)
    if read is None:
        raise OutputError(f"refusing to replace {d}: {_unmarked(d)}; remove it yourself or choose another directory")
    if read[0] != prog:
        raise OutputError(f"refusing to replace {d}: it was written by {read[0]}, and {prog} replaces only its own "
                          "output; remove it yourself or choose another directory")
    _check_owned(d, "", *read)


# ---------------------------------------------------------------------------- one writer
# The lock lies beside the directory, not inside: the staged writers replace the directory by a
# rename, and a lock on a file inside it would go with it. Its one line names the holder, which a
# second writer's refusal quotes. The holder removes the file when done; a holder killed with
# SIGKILL leaves it, unlocked (the kernel releases an flock when its process dies), so a stale
# file blocks nobody. A command that holds a lock may start another that writes into the same
# directory (evaluate.sh under fairseq-ext evaluate): a lock whose holder line names this process
# or one of its parents, on this host, is the caller's own, and is not taken again.
def lock_path(target: str) -> str:
    """The lock file of ``target`` (a directory, existing or not): ``PARENT/.NAME.lock`` (common.sh's
    fsx_lock_output opens the same name)."""
    parent, name = os.path.split(os.path.realpath(target).rstrip(os.sep))
    return os.path.join(parent, f".{name}.lock")


# the lock files this process holds
_HELD: Set[str] = set()
# the lock call's outcomes besides an error: the lock is ours now; a parent of ours holds it; the
# file system has no locks (nothing is locked); the file was replaced meanwhile (open it again)
TAKEN, PARENTS, UNSUPPORTED, REPLACED = "taken", "parent's", "unsupported", "replaced"


def _ancestors(pid: int) -> Set[int]:
    """``pid`` and its parents (from /proc: empty where there is none)."""
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _holder_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode("utf-8", "replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = sys.argv if pid == os.getpid() else []
    line = " ".join(shlex.quote(w) for w in words)
    line = line if len(line) <= 300 else line[:297] + "..."
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {pid} on {socket.gethostname()} since {started}: {line or '?'}"


def lock_fd(fd: int, path: str, target: str, what: str = "output directory", pid: Optional[int] = None) -> str:
    """Take the lock on the open file ``fd`` of ``path`` (``target``'s :func:`lock_path`) for the process ``pid``
    (default: this one) and write the holder line into it: :data:`TAKEN`. When another process has it: :data:`PARENTS`
    if its holder line names ``pid`` or a parent of it on this host, else :class:`OutputBusyError` naming the holder.
    :data:`UNSUPPORTED` when the file system has no locks, :data:`REPLACED` when ``path`` was replaced meanwhile (a
    holder removing it as it finished)."""
    pid = pid or os.getpid()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                holder = f.readline().strip()
        except OSError:
            holder = ""
        named = re.match(r"pid (\d+) on (\S+) since ", holder)
        if named and named.group(2) == socket.gethostname() and int(named.group(1)) in _ancestors(pid):
            return PARENTS
        raise OutputBusyError(f"{what} {target} is being written by another command "
                              f"({holder or 'another process (it has not said which yet)'}); wait for it to "
                              "finish, or write elsewhere") from None
    except OSError as e:
        if e.errno in _UNSUPPORTED:
            print(f"WARNING: no lock on {target} ({path}: {e.strerror}): a second writer would not be stopped",
                  file=sys.stderr)
            return UNSUPPORTED
        raise
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:  # the previous holder removed the file after we opened it
        fcntl.flock(fd, fcntl.LOCK_UN)
        return REPLACED
    os.ftruncate(fd, 0)
    os.pwrite(fd, (_holder_line(pid) + "\n").encode("utf-8"), 0)
    return TAKEN


class OutputLock:
    """The lock of one directory, for a ``with`` block or from :meth:`acquire` to
    :meth:`release` (a process-long lock: fairseq-train's save dir)."""

    def __init__(self, target: str, what: str = "output directory"):
        self.target = os.path.realpath(target)
        self.path = lock_path(target)
        self.what = what
        self.fd: Optional[int] = None

    def acquire(self) -> "OutputLock":
        if self.fd is not None or self.path in _HELD:
            return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                outcome = lock_fd(fd, self.path, self.target, self.what)
            except BaseException:
                os.close(fd)
                raise
            if outcome == TAKEN:
                self.fd = fd
                _HELD.add(self.path)
                return self
            os.close(fd)
            if outcome != REPLACED:  # a parent's lock, or a file system without locks: go on
                return self
        raise OutputBusyError(f"{self.what} {self.target}: its lock file {self.path} keeps being replaced; "
                              "is another command starting and stopping there?")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.remove(self.path)  # while still holding it (see lock_fd: a waiter opens it again)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        _HELD.discard(self.path)

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def lock_inherited_fd(target: str, fd: int, what: str, pid: int) -> int:
    """For bash (common.sh fsx_lock_output): lock the file descriptor ``fd`` that the script ``pid`` opened on
    :func:`lock_path` and keeps open; the lock lives as long as the script holds it. Returns 0: held (or the file system
    has no locks), 2: a parent of the script holds it, 3: the file was replaced meanwhile (open it again); raises
    :class:`OutputBusyError` when another command holds it."""
    outcome = lock_fd(fd, lock_path(target), os.path.realpath(target), what, pid=pid)
    return {TAKEN: 0, UNSUPPORTED: 0, PARENTS: 2, REPLACED: 3}[outcome]


def stale_staging(target: str) -> List[str]:
    """The temporary directories beside ``target`` of earlier runs that wrote it and were killed before they finished.
    Only meaningful while holding its lock: then no live run owns them."""
    parent, name = os.path.split(os.path.realpath(target))
    if not os.path.isdir(parent):
        return []
    return sorted(os.path.join(parent, entry) for entry in os.listdir(parent)
                  if (m := STAGING.match(entry)) and m.group(1) == name and os.path.isdir(os.path.join(parent, entry)))


def stale_staging_warning(target: str) -> Optional[str]:
    """One line about :func:`stale_staging`, or None."""
    stale = stale_staging(target)
    if not stale:
        return None
    one = len(stale) == 1
    return (f"{len(stale)} temporary director{'y' if one else 'ies'} of earlier runs that wrote {target} and were "
            f"stopped before they finished (killed, or --keep-tmp): nothing in {'it' if one else 'them'} is a "
            f"result; remove with  rm -rf {' '.join(shlex.quote(p) for p in stale)}")


# ---------------------------------------------------------------------------- written atomically
class StagedOutput:
    """Write a directory atomically, the Python twin of common.sh's fsx_begin_output /
    fsx_finish_output::

        with StagedOutput(out, prog="evaluate.sh", inputs=[data, ckpt]) as staged:
            staged.discard_old()             # optional: the old output goes at once
            ... write into staged.stage (the future ``out``), scratch in staged.work ...
            staged.finish()                  # the marker, then ``out`` replaced by renames

    ``out`` must be absent, or replaceable by ``prog`` (check_replaceable; without ``force`` an existing one is an
    error). Everything is written under a temporary directory beside ``out``; leaving the block without finish() (an
    error, an interrupt) removes it, and moves the ``keep_on_failure`` files of the stage into ``out`` when no ``out``
    is there. From the start of the block to its end ``out``'s lock is held: a second writer is refused with one line
    naming this one."""

    def __init__(self, out: str, *, prog: str, inputs: Iterable[str] = (), force: bool = True,
                 keep_on_failure: Sequence[str] = (), keep_tmp: bool = False, log=None):
        self.out = os.path.realpath(out)
        self.prog = prog
        self.inputs = [str(p) for p in inputs if p]
        self.force = force
        self.keep_on_failure = list(keep_on_failure)
        self.keep_tmp = keep_tmp
        self.log = log or (lambda message: print(f"[{prog}] {message}", file=sys.stderr, flush=True))
        self.tmp = self.work = self.stage = None
        self.done = False
        self.lock = OutputLock(self.out)

    def __enter__(self) -> "StagedOutput":
        self.lock.acquire()
        try:
            if os.path.lexists(self.out) and not self.force:
                raise OutputError(f"output directory {self.out} already exists (use --force to replace it)")
            check_replaceable(self.out, self.inputs, prog=self.prog)
            parent, base = os.path.split(self.out)
            os.makedirs(parent, exist_ok=True)
            stale = stale_staging_warning(self.out)
            if stale:
                self.log(f"WARNING: {stale}")
            self.tmp = tempfile.mkdtemp(prefix=f".{base}.tmp.", dir=parent)
            self.work, self.stage = os.path.join(self.tmp, "work"), os.path.join(self.tmp, "out")
            os.makedirs(self.work)
            os.makedirs(self.stage)
        except BaseException:
            self.lock.release()
            raise
        self.log(f"working in {self.tmp}")
        return self

    def discard_old(self) -> None:
        """Remove the previous output now rather than at the end (evaluation: from its start
        until it succeeds, ``out`` holds no result, so no stale result passes for the new one)."""
        if os.path.lexists(self.out):
            os.rename(self.out, os.path.join(self.tmp, "old"))
            shutil.rmtree(os.path.join(self.tmp, "old"))

    def finish(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        mark_output(self.stage, prog=self.prog)
        if os.path.lexists(self.out):
            check_replaceable(self.out, self.inputs, prog=self.prog)  # again: the user may have put something there
            os.rename(self.out, os.path.join(self.tmp, "old"))
        os.rename(self.stage, self.out)
        self.done = True
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.log(f"done: {self.out}")

    def __exit__(self, *exc) -> bool:
        try:
            self._clean_up()
        finally:
            self.lock.release()
        return False

    def _clean_up(self) -> None:
        if self.done or not self.tmp or not os.path.isdir(self.tmp):
            return
        if self.keep_tmp:
            self.log(f"failed; intermediate files kept in {self.tmp}")
            return
        # the logs of a failed run, where no output is (never mixed into an old one): gathered
        # and marked beside it, then renamed into place
        kept = [name for name in self.keep_on_failure if os.path.isfile(os.path.join(self.stage, name))]
        if kept and not os.path.lexists(self.out):
            failed = os.path.join(self.tmp, "failed")
            os.makedirs(failed)
            for name in kept:
                os.rename(os.path.join(self.stage, name), os.path.join(failed, name))
            mark_output(failed, prog=self.prog)
            try:
                os.rename(failed, self.out)
            except OSError:  # an output appeared meanwhile: it stays as it is
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------- the command line
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="outputs.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prog", required=True, help="the running script: the name in markers and error lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, args in (("check-replaceable", ("dir", "inputs*")), ("mark", ("dir",)),
                       ("add-entries", ("dir", "entries+")), ("lock", ("dir", "fd", "pid", "what?")),
                       ("stale-staging", ("dir",))):
        command = sub.add_parser(name)
        for arg in args:
            command.add_argument(arg.rstrip("*+?"), nargs={"*": "*", "+": "+", "?": "?"}.get(arg[-1]))
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            return lock_inherited_fd(args.dir, int(args.fd), args.what or "output directory", int(args.pid))
        if args.command == "stale-staging":
            message = stale_staging_warning(args.dir)
            if message:
                print(message)
        elif args.command == "check-replaceable":
            check_replaceable(args.dir, args.inputs, prog=args.prog)
        elif args.command == "mark":
            mark_output(args.dir, prog=args.prog)
        else:
            add_output_entries(args.dir, args.entries)
    except OutputError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
