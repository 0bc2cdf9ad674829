"""The runner's child commands die with it.

``fairseq-ext reproduce`` runs long commands (train.sh -> fairseq-train, evaluate, analyses).
Each runs in its own process group, so that a SIGTERM or SIGINT (Ctrl-C, a batch system's
time limit, ``kill``) of the runner reaches the whole tree: fairseq-train's data-loader
workers and the torch.distributed processes train.sh starts included. On such a signal the
runner sends SIGTERM to every running child group, waits ``GRACE_SECONDS`` for them to end,
kills what is left, and then ends the way the signal would have ended it.
"""
import os
import signal
import subprocess
import threading
import time
from typing import Dict, List

GRACE_SECONDS = 10.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_running: Dict[int, subprocess.Popen] = {}
_lock = threading.Lock()
_previous: Dict[int, object] = {}


class _Stopped(BaseException):
    """Raised by the signal handler out of a waiting ``run`` (whose ``Popen.wait`` holds the
    lock a second wait on the same child would need)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_waiting = threading.Event()


def stop_all(grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every running child's process group, SIGKILL what is left after ``grace`` s."""
    with _lock:
        procs = list(_running.values())
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        _signal_group(proc, signal.SIGKILL)  # the child ended: end what it left in its group


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def _end_like(signum, frame=None):
    """Stop the children, then end the way ``signum`` would have ended the runner."""
    stop_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)  # e.g. Python's SIGINT handler: KeyboardInterrupt
    elif previous != signal.SIG_IGN:
        os.kill(os.getpid(), signum)


def _handle(signum, frame):
    if _waiting.is_set():
        raise _Stopped(signum)  # caught in run(), outside Popen.wait
    _end_like(signum, frame)


def install() -> None:
    """Stop the children on SIGTERM/SIGINT (idempotent; only from the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is _handle or current == signal.SIG_IGN:
            continue  # an ignored signal (nohup, a parent's choice) stays ignored
        _previous[sig] = current
        signal.signal(sig, _handle)


def run(cmd: List[str], **popen_kwargs) -> int:
    """``subprocess.run(cmd, ...).returncode`` with the child in its own process group,
    stopped with the runner (see the module docstring)."""
    install()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
    with _lock:
        _running[proc.pid] = proc
    try:
        _waiting.set()
        try:
            return proc.wait()
        finally:
            _waiting.clear()
    except _Stopped as stopped:
        _end_like(stopped.signum)
        raise  # not reached: _end_like ends the process or raises KeyboardInterrupt
    finally:
        with _lock:
            _running.pop(proc.pid, None)
