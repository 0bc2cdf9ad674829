#!/usr/bin/env python3
"""One writer at a time for an output directory or a save dir: an exclusive ``fcntl.flock``
on a lock file beside it (``PARENT/.NAME.lock``), held while a command writes it.

Beside and not inside, because the staged writers replace the directory itself by a rename
(:mod:`staging`, common.sh's fsx_begin_output), and a lock on a file inside it would go with
it. The file holds one line naming its holder (process id, host, start time, command line),
which a second writer's refusal quotes. It is removed by its holder when the holder is done; a
holder killed with SIGKILL leaves it behind, unlocked: the kernel releases an ``flock`` when its
process dies, so the next writer takes it at once and a stale file never blocks anybody.

A command that already holds the lock of a directory and starts another that writes into it
(``fairseq-ext evaluate`` running ``evaluate.sh``; quickstart running a recipe) passes it on:
the lock files a process holds are listed in :data:`HELD_ENV`, which its children inherit, and
a child asked for a lock listed there does not take it again.

Used by :class:`staging.StagedOutput`, common.sh (``outputs_command.py lock``, on a file
descriptor that the bash script keeps open), quickstart.sh (its SAVE_DIR, for the whole run)
and the plugin's fairseq-train guard (``--save-dir``, for the whole run).
"""
import datetime
import errno
import fcntl
import os
import shlex
import socket
import sys
from typing import List, Optional

if __package__:
    from .outputs import OutputError, lock_name
else:  # run as a file by the recipes (no package import: it would load fairseq and torch)
    from outputs import OutputError, lock_name

# the lock files held by this process or one of its parents, one a line
HELD_ENV = "FSX_HELD_LOCKS"
# file systems without flock (some network file systems): no lock, said once, work goes on
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class OutputBusyError(OutputError):
    """Another process is writing the directory; the message names it."""


def lock_path(target: str) -> str:
    """The lock file of ``target`` (a directory, existing or not): ``PARENT/.NAME.lock``."""
    target = os.path.realpath(target)
    parent, name = os.path.split(target.rstrip(os.sep))
    return os.path.join(parent, lock_name(name))


def held_by_parent(path: str) -> bool:
    return path in os.environ.get(HELD_ENV, "").split("\n")


def _remember(path: str) -> None:
    held = [p for p in os.environ.get(HELD_ENV, "").split("\n") if p]
    if path not in held:
        os.environ[HELD_ENV] = "\n".join(held + [path])


def _forget(path: str) -> None:
    held = [p for p in os.environ.get(HELD_ENV, "").split("\n") if p and p != path]
    if held:
        os.environ[HELD_ENV] = "\n".join(held)
    else:
        os.environ.pop(HELD_ENV, None)


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode("utf-8", "replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = sys.argv if pid == os.getpid() else []
    line = " ".join(shlex.quote(w) for w in words)
    return line if len(line) <= 300 else line[:297] + "..."


def holder_line(pid: Optional[int] = None) -> str:
    pid = pid or os.getpid()
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {pid} on {socket.gethostname()} since {started}: {_command_line(pid) or '?'}"


def _read_holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""


def _busy(target: str, path: str, what: str) -> OutputBusyError:
    holder = _read_holder(path) or "another process (it has not said which yet)"
    return OutputBusyError(f"{what} {target} is being written by another command ({holder}); wait for it to "
                           f"finish, or write elsewhere")


def lock_fd(fd: int, path: str, target: str, what: str = "output directory", pid: Optional[int] = None) -> bool:
    """Take the lock on the open file ``fd`` of ``path`` (a lock file of :func:`lock_path`) and
    write the holder line into it; raise :class:`OutputBusyError` naming the holder when another
    process has it. False when the file system has no locks (nothing is locked then) or when
    ``path`` was replaced meanwhile (a holder removing it as it finished: open it again)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(target, path, what) from None
    except OSError as e:
        if e.errno in _UNSUPPORTED:
            print(f"WARNING: no lock on {target} ({path}: {e.strerror}): a second writer would not be stopped",
                  file=sys.stderr)
            return False
        raise
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:  # the previous holder removed the file after we opened it
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    os.ftruncate(fd, 0)
    os.pwrite(fd, (holder_line(pid) + "\n").encode("utf-8"), 0)
    return True


class OutputLock:
    """The lock of one directory, for a ``with`` block or from :meth:`acquire` to
    :meth:`release` (a process-long lock: fairseq-train's save dir)."""

    def __init__(self, target: str, what: str = "output directory"):
        self.target = os.path.realpath(target)
        self.path = lock_path(target)
        self.what = what
        self.fd: Optional[int] = None

    def acquire(self) -> "OutputLock":
        if self.fd is not None or held_by_parent(self.path):
            return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                taken = lock_fd(fd, self.path, self.target, self.what)
            except BaseException:
                os.close(fd)
                raise
            if taken:
                self.fd = fd
                _remember(self.path)
                return self
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd), os.stat(self.path)):
                os.close(fd)  # a file system without locks: go on unlocked
                return self
            os.close(fd)
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
        _forget(self.path)

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def lock_inherited_fd(target: str, fd: int, what: str, pid: int) -> int:
    """For bash (common.sh fsx_lock_output): lock the file descriptor ``fd`` that the calling
    script opened on :func:`lock_path` and keeps open; the lock lives as long as the script
    holds it. Returns 0: held (or no locks on this file system), 3: the file was replaced
    meanwhile (open it again); raises :class:`OutputBusyError` when another command holds it."""
    path = lock_path(target)
    taken = lock_fd(fd, path, os.path.realpath(target), what, pid=pid)
    if not taken and os.path.exists(path) and not os.path.samestat(os.fstat(fd), os.stat(path)):
        return 3
    return 0


def stale_staging(target: str) -> List[str]:
    """The temporary directories of earlier runs that wrote ``target`` and were killed before
    they finished (``.NAME.tmp.`` and the random part beside it: 6 characters from the recipes'
    ``mktemp``, 8 from Python's ``tempfile.mkdtemp``). Only meaningful while holding its lock:
    then no live run owns them."""
    target = os.path.realpath(target)
    parent, name = os.path.split(target)
    if not os.path.isdir(parent):
        return []
    prefix = f".{name}.tmp."
    return sorted(os.path.join(parent, entry) for entry in os.listdir(parent)
                  if entry.startswith(prefix) and len(entry) - len(prefix) in (6, 8)
                  and entry[len(prefix):].replace("_", "").isalnum() and os.path.isdir(os.path.join(parent, entry)))


def stale_staging_warning(target: str, current: Optional[str] = None) -> Optional[str]:
    """One line about :func:`stale_staging` (``current``, this run's own, left out), or None."""
    stale = [p for p in stale_staging(target) if not current or os.path.realpath(p) != os.path.realpath(current)]
    if not stale:
        return None
    listed = " ".join(shlex.quote(p) for p in stale)
    return (f"{len(stale)} temporary director{'y' if len(stale) == 1 else 'ies'} of earlier runs that "
            f"wrote {target} and were stopped before they finished (killed, or --keep-tmp): nothing in "
            f"{'it' if len(stale) == 1 else 'them'} is a result; remove with  rm -rf {listed}")
