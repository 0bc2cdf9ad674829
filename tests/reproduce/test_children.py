"""The table runner's commands die with it: SIGTERM or SIGINT of ``fairseq-ext reproduce``
leaves no fairseq-train (or its workers) running."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A command like train.sh: a shell that starts a long-running worker and waits for it.
# It writes both pids and ignores nothing (fairseq-train ends on SIGTERM).
CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {worker.pid}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    worker.wait()
""")

# The runner: fairseq_ext.reproduce.execute.run_command, the one place it starts a planned command, where the
# runner's children die with it.
RUNNER = textwrap.dedent("""
    import sys
    from fairseq_ext.reproduce import execute
    with execute.children_die_with_the_runner():
        execute.run_command([sys.executable, "-c", sys.argv[1], sys.argv[2]], sys.argv[3])
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _start(tmp_path):
    pids = tmp_path / "pids"
    # started the way a shell starts a command: SIGINT at its default (a test worker may ignore
    # it, and an ignored signal is inherited, and kept ignored by the runner)
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, CHILD, str(pids), str(tmp_path / "run" / "train.log")],
                            cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not pids.exists():
        assert proc.poll() is None, "the runner ended before its command started"
        assert time.time() < deadline, "the command did not start"
        time.sleep(0.2)
    child, worker = map(int, pids.read_text().split())
    assert _alive(child) and _alive(worker)
    return proc, child, worker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_runner_stops_its_command_and_the_commands_children(tmp_path, sig):
    proc, child, worker = _start(tmp_path)
    proc.send_signal(sig)
    returncode = proc.wait(timeout=60)
    deadline = time.time() + 15
    while (_alive(child) or _alive(worker)) and time.time() < deadline:
        time.sleep(0.2)
    leftover = [pid for pid in (child, worker) if _alive(pid)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"still running after the runner got {sig.name}: {leftover}"
    # the runner ends the way the signal ends a process (Python ends an uncaught
    # KeyboardInterrupt by SIGINT too)
    assert returncode == -sig


def test_a_command_that_ends_on_its_own_is_not_signalled(tmp_path):
    from fairseq_ext.reproduce import execute

    assert execute.run_child([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert execute._running == {}


# The table command itself, with its one planned run replaced by the command above.
MAIN = textwrap.dedent("""
    import sys
    from fairseq_ext.reproduce import __main__ as reproduce, execute
    execute.run = lambda plan, *_: execute.run_command([sys.executable, "-c", sys.argv[1], sys.argv[2]], sys.argv[3])
    reproduce.prepare_data = lambda todo: {}  # the command stands in for the run: no data to prepare
    sys.exit(reproduce.main(["thesis-3.3", "--smoke", "--rows", "transformer", "--datasets", "iwslt15-en-vi",
                             "--work-dir", sys.argv[4], "--data-root", sys.argv[4]]))
""")


def test_ctrl_c_of_the_table_command_is_one_line(tmp_path):
    """Ctrl-C while a row runs: its command is stopped, and the table command says so in one
    line (how to go on), not in two chained tracebacks."""
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", MAIN, CHILD, str(pids), str(tmp_path / "run" / "train.log"),
                             str(tmp_path / "work")], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not pids.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the command did not start"
        time.sleep(0.2)
    child, worker = map(int, pids.read_text().split())
    proc.send_signal(signal.SIGINT)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == [
        "fairseq-ext reproduce: interrupted: the running command was stopped; finished rows are kept and reused: run the same "
        "command again to go on"], stderr
    deadline = time.time() + 15
    while (_alive(child) or _alive(worker)) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(child) and not _alive(worker)
