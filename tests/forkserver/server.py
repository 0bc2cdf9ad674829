"""The suite's fork server: ``python server.py SOCKET PADDING`` imports torch and fairseq once; then, for each command
that a test's process hands it (tests/forkserver/sitecustomize.py), it forks a copy of itself that becomes the command
as a new interpreter would run it: the command's open file descriptors (at their numbers, and no others), standard
streams made anew over them, working directory, umask, environment, arguments, sys.path, signal dispositions, warnings
filters, Python's own root logger, fresh random seeds, its name and command line in /proc, ``__main__`` run as a
script or with runpy as ``-m`` does, and Python's own ending (exit status, traceback, KeyboardInterrupt as SIGINT).
Saved per fairseq command: about 3.5 CPU seconds of imports and 0.8 s of the interpreter's teardown.

A command is run only where a new interpreter would start in the same state: the same Python and sys.path (PYTHONPATH
entries before the server's may be added unless they hold a module imported here), the same sys.flags, and the same
PYTHON*, thread-count, locale and torch variables; otherwise the client is told to run it itself. The copy leads its
own process group, which is killed when its client ends first (killed with SIGKILL, say); copies die with the server,
and the server ends with the pytest worker that started it, or when that worker sends it SIGTERM."""
import ctypes
import json
import logging
import os
import selectors
import signal
import socket
import sys
import warnings

SERVER = sys.argv[1]  # sys.argv[2]: padding, the room a copy's command line is written in
SERVER_PID = os.getpid()
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1
del sys.path[0]  # this folder: a command's own sys.path[0] is set per command
BASE_PATH = list(sys.path)
STATE = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH_", "CUDA", "LC_", "LANG")


def state(env):
    """The variables that shape an interpreter's start and its imports (PYTHONPATH: compared as sys.path; $PYTHON is the
    recipes' own; PYTHONWARNINGS is set per command; torchrun's TORCH_NCCL_* are read when NCCL starts)."""
    return {key: value for key, value in env.items() if key.startswith(STATE)
            and key not in ("PYTHON", "PYTHONPATH", "PYTHONWARNINGS") and not key.startswith("TORCH_NCCL_")}


STATE_AT_START = state(os.environ)
ENV_AT_START = dict(os.environ)
FILTERS_AT_START = list(warnings.filters)  # started without PYTHONWARNINGS (conftest): Python's defaults
import fairseq  # noqa: E402, F401  (torch, numpy and fairseq's registries: what every fairseq command imports first)
import fairseq.checkpoint_utils  # noqa: E402, F401
import fairseq.options  # noqa: E402, F401
import fairseq.sequence_generator  # noqa: E402, F401
import fairseq.trainer  # noqa: E402, F401

FLAGS = list(sys.flags)
# fairseq's import runs logging.basicConfig(level=DEBUG) (fairseq/models/wav2vec/wav2vec2_classification.py): a no-op
# where the command configured logging first (fairseq_cli.train and .preprocess, to stdout), the root logger's handler
# where it did not. A command starts with Python's root logger and gets that call at its first import of fairseq.
_root = logging.getLogger()
assert len(_root.handlers) == 1 and _root.handlers[0].stream is sys.stderr and _root.level == logging.DEBUG, \
    "fairseq's import no longer configures logging as the fork server expects"
FILTERS_BY_IMPORTS = warnings.filters[:len(warnings.filters) - len(FILTERS_AT_START)]
assert warnings.filters[len(FILTERS_BY_IMPORTS):] == FILTERS_AT_START, "an import removed a warnings filter"
SET_BY_IMPORTS = {key: value for key, value in os.environ.items() if key not in ENV_AT_START}  # scikit-learn's KMP_*


def refusal(request):
    """Why the command cannot run in a copy of this process exactly as in a new interpreter (None: it can)."""
    if request["executable"] != sys.executable:
        return "another Python"
    extra = request["path"][:max(0, len(request["path"]) - len(BASE_PATH))]
    if request["path"][len(extra):] != BASE_PATH:
        return "another sys.path"
    imported = {name for name in sys.modules if "." not in name}
    for folder in extra:  # PYTHONPATH entries before this one's: fine unless they hold a module imported here
        names = {entry.split(".")[0] for entry in os.listdir(folder)} if os.path.isdir(folder) else set()
        if names & imported:
            return f"{folder} on PYTHONPATH holds {', '.join(sorted(names & imported))}"
    if request["flags"] != FLAGS:
        return "other interpreter flags"
    theirs = state(request["env"])
    if theirs != STATE_AT_START:
        return "other " + ", ".join(sorted(key for key, _ in set(theirs.items()) ^ set(STATE_AT_START.items())))
    return None


def serve():
    """Serve until a fork: returns (request, fds) in the forked copy; never returns in the server."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(SERVER + ".new")
    listener.listen(64)
    os.rename(SERVER + ".new", SERVER)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    clients = {}  # the forked copy's pid -> its client's connection (None once the client has gone)
    parent = os.getppid()
    ending = []
    signal.signal(signal.SIGTERM, lambda *_: ending.append(True))
    while os.getppid() == parent and not ending:
        for key, _ in selector.select(1.0):
            if key.fileobj is wake_r:
                os.read(wake_r, 4096)
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 253)
                    request = json.loads(message)
                except (OSError, ValueError):
                    conn.close()
                    continue
                why = refusal(request) if len(fds) == len(request["fds"]) else "not every file descriptor came"
                print("refused" if why else "runs", " ".join(request["orig_argv"][1:4]), why or "", file=sys.stderr)
                if why:
                    conn.send(json.dumps({"refused": why}).encode())
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    for other in list(clients.values()) + [listener]:
                        if other is not None:
                            other.close()
                    conn.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    return request, fds
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                clients[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            else:  # a client's connection: it ended before its command (nothing else is ever sent)
                selector.unregister(key.fileobj)
                key.fileobj.close()
                clients[key.data] = None
                try:
                    os.killpg(key.data, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while clients:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = clients.pop(pid, None)
            if conn is not None:
                selector.unregister(conn)
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass
                conn.close()
    for pid in clients:  # the pytest worker has gone, or ended the server: so do the commands it started
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sys.exit(0)


def set_command_line(argv):
    """/proc/PID/cmdline (ps, pgrep -f, the holder line of a lock) shows ``argv``: written over this process's own
    argument area, which the server's long padding argument makes room for (cut where it does not fit)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (fields 48 and 49 of proc(5))
    text = b"\0".join(word.encode("utf-8", "surrogateescape") for word in argv)[:end - start - 1]
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def standard_stream(old, fd):
    """sys.stdin, stdout or stderr made anew over descriptor ``fd``, as Python's create_stdio makes it (the encoding,
    errors and buffering are this process's: the same flags and variables; stdout's line buffering follows the
    terminal): a stream made over the server's own descriptor caches what it found there (a seekable /dev/null)."""
    import io

    if old is None or not os.path.exists(f"/proc/self/fd/{fd}"):
        return None
    writing = fd > 0
    raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
    raw.name = old.buffer.raw.name if hasattr(old.buffer, "raw") else old.buffer.name
    unbuffered = writing and isinstance(old.buffer, io.FileIO)  # -u or PYTHONUNBUFFERED
    buffer = raw if unbuffered else (io.BufferedWriter if writing else io.BufferedReader)(raw)
    stream = io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors, newline="\n",
                              line_buffering=raw.isatty() if fd == 1 else old.line_buffering,
                              write_through=unbuffered)
    stream.mode = old.mode
    return stream


def become(request, fds):
    """Turn this forked copy into the command of ``request``, as ``python -m MODULE`` or ``python SCRIPT`` starts."""
    import builtins
    import fcntl
    import importlib.machinery
    import random
    import runpy
    import types

    import numpy

    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the copy dies with the server, whatever ends it
    if os.getppid() != SERVER_PID:  # the server ended before the line above
        os._exit(70)
    libc.prctl(PR_SET_NAME, request["comm"].encode()[:15])  # ps, pgrep and /proc/PID/comm show the command's name
    set_command_line(request["orig_argv"])
    for name, ignored in request["signals"].items():  # those the client forwards, as a new interpreter has them
        number = getattr(signal, name)
        default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        signal.signal(number, signal.SIG_IGN if ignored else default)
    # the command's file descriptors at their numbers, and no other: moved out of the way, the copy's own closed
    held = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024) for fd in fds]
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd not in held:
            try:
                os.close(fd)
            except OSError:
                pass
    for number, fd in zip(request["fds"], held):
        os.dup2(fd, number)
        os.close(fd)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):  # new streams over the command's descriptors
        setattr(sys, name, standard_stream(getattr(sys, name), fd))
        setattr(sys, f"__{name}__", getattr(sys, name))
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in SET_BY_IMPORTS.items():
        os.environ.setdefault(key, value)
    options = [option for option in os.environ.get("PYTHONWARNINGS", "").split(",") if option]
    if options:  # the filters in the order a new interpreter has them: the imports', PYTHONWARNINGS', Python's
        warnings.filters[:] = FILTERS_AT_START
        sys.warnoptions[:] = options
        warnings._processoptions(options)
        warnings.filters[:0] = FILTERS_BY_IMPORTS
        warnings._filters_mutated()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    importing = builtins.__import__

    def first_import_of_fairseq(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "fairseq" or name.startswith("fairseq.")):
            builtins.__import__ = importing
            logging.basicConfig(level=logging.DEBUG)
        return importing(name, globals, locals, fromlist, level)

    builtins.__import__ = first_import_of_fairseq
    random.seed()
    numpy.random.seed()
    sys.orig_argv = request["orig_argv"]
    kind, target, args = request["target"]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    if kind == "module":
        sys.argv = ["-m", *args]
        sys.path[:] = [os.getcwd()] + request["path"]
        runpy._run_module_as_main(target, alter_argv=True)
    else:
        sys.argv = [target, *args]
        sys.path[:] = [os.path.dirname(os.path.realpath(target))] + request["path"]
        main.__file__ = os.path.abspath(target)  # as Python 3.9 on sets it
        main.__cached__ = None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", main.__file__)
        with open(target, "rb") as f:
            code = compile(f.read(), main.__file__, "exec")
        exec(code, main.__dict__)


def end(code, signalled=None):
    """End as Python ends, up to its teardown of the modules: non-daemon threads joined, atexit handlers run, standard
    streams flushed; then exit with ``code`` (or die of ``signalled``). The teardown itself (0.8 s of torch's and
    fairseq's modules) is left out: nothing a command writes waits for it."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):  # as Python's flush_std_files: a closed one is left alone
        if stream is None or stream.closed:
            continue
        try:
            stream.flush()
        except OSError:
            code = code or 120
    if signalled is not None:
        signal.signal(signalled, signal.SIG_DFL)
        os.kill(os.getpid(), signalled)
    os._exit(code)


if __name__ == "__main__":
    forked = serve()
    try:
        become(*forked)
    except SystemExit as stop:  # as Python reads SystemExit's code
        if stop.code is None or isinstance(stop.code, int):
            end(stop.code or 0)
        print(stop.code, file=sys.stderr)
        end(1)
    except BaseException as error:  # as Python ends on an uncaught exception, without this file's two frames
        traceback = error.__traceback__.tb_next
        error.__traceback__ = traceback.tb_next or traceback
        sys.excepthook(type(error), error, error.__traceback__)
        interrupted = (isinstance(error, KeyboardInterrupt)
                       and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        end(1, signal.SIGINT if interrupted else None)
    end(0)
