"""The client half of the suite's fork server (tests/forkserver/server.py), imported by every Python process that the
tests start (conftest puts this folder on PYTHONPATH). A process started as ``python -m MODULE ...`` or ``python
SCRIPT ...`` (fairseq's console scripts, ``fairseq-ext``, the recipes' ``$PYTHON -m fairseq_ext``) hands its
command, working directory, environment, signal dispositions and open file descriptors (the standard streams, a lock
a recipe holds) to the server, which forks a copy of itself that has torch and fairseq imported already and runs the
command there; this process forwards the signals it gets to that copy and ends as it ended (exit status or signal).
Anything the server cannot run exactly as a new interpreter would (other interpreter options, another Python, other
PYTHON*/thread/locale variables, no server yet) runs here as usual. FAIRSEQ_EXT_TEST_FRESH_PYTHON=1 in a command's
environment keeps it in a new interpreter."""
import os


def _hand_over(server):
    import sys

    argv = sys.orig_argv
    if len(argv) > 2 and argv[1] == "-m":
        target = ["module", argv[2], argv[3:]]
    elif len(argv) > 1 and not argv[1].startswith("-"):
        target = ["script", argv[1], argv[2:]]
    else:
        return
    import json
    import signal
    import socket

    # the signals forwarded to the copy, each with whether this process ignores it (inherited: the copy does too)
    ignored = {name: signal.getsignal(getattr(signal, name)) == signal.SIG_IGN
               for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")}
    inherited = []
    for fd in sorted(map(int, os.listdir("/proc/self/fd"))):  # the listing's own descriptor is closed by now
        try:
            os.fstat(fd)
            inherited.append(fd)
        except OSError:
            pass
    if len(inherited) > 250:  # more than one message carries
        return
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    umask = os.umask(0)
    os.umask(umask)
    request = {"target": target, "orig_argv": argv, "executable": sys.executable, "path": sys.path,
               "flags": list(sys.flags), "cwd": os.getcwd(), "umask": umask, "env": dict(os.environ),
               "signals": ignored, "fds": inherited, "comm": comm}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(server)
        socket.send_fds(sock, [json.dumps(request).encode()], inherited)
        reply = json.loads(sock.recv(1 << 16) or b"{}")
    except (OSError, ValueError):
        sock.close()
        return
    if "pid" not in reply:
        sock.close()
        return
    child = reply["pid"]

    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for name, ignoring in ignored.items():
        if not ignoring:
            signal.signal(getattr(signal, name), forward)
    message = sock.recv(1 << 16)
    if not message:  # the server ended before the command did
        os.write(2, b"tests/forkserver: the fork server ended while it ran this command\n")
        os._exit(70)
    status = json.loads(message)["status"]
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if os.environ.get("FAIRSEQ_EXT_TEST_FORKSERVER") and not os.environ.get("FAIRSEQ_EXT_TEST_FRESH_PYTHON"):
    _hand_over(os.environ["FAIRSEQ_EXT_TEST_FORKSERVER"])
