"""The suite's fork server (tests/forkserver) against a new interpreter: a command run in a fork of the server must see
and do what it sees and does as a new process (arguments, __file__, sys.path, working directory, environment, standard
streams, exit status, traceback, signals), and must die with the process that started it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from model_utils import clean_env


SHOW = """import os, sys
print(sys.argv, __file__, __name__, sys.path[0], sys.path[1:] == {path!r}, os.getcwd(), os.environ.get("SEEN"))
print(sys.stdin.read().upper(), flush=True)
print("to stderr", file=sys.stderr)
print(sorted(map(int, os.listdir("/proc/self/fd")))[:-1], os.write(int(os.environ["FD"]), b"via a descriptor"))
print("served:", "fairseq" in sys.modules, file=sys.stderr)
sys.exit(int(os.environ.get("STATUS", "0")))
"""


@pytest.fixture(scope="module")
def server_ready():
    """The server (conftest.forkserver), once its imports are done: it starts in the background with the run."""
    server = os.environ.get("FAIRSEQ_EXT_TEST_FORKSERVER", "off")
    if server == "off":
        pytest.skip("FAIRSEQ_EXT_TEST_FORKSERVER=off: every command runs in a new interpreter")
    for _ in range(600):
        if os.path.exists(server):
            return server
        time.sleep(0.1)
    pytest.fail(f"the fork server did not start: no {server} after 60 s")


def both(command, cwd, stdin="", pass_fds=(), **env):
    """(new interpreter, fork server) results of ``command``: return code, stdout, stderr."""
    results = []
    for fresh in ("1", ""):
        environment = dict(clean_env(), FAIRSEQ_EXT_TEST_FRESH_PYTHON=fresh, **env)
        done = subprocess.run(command, cwd=cwd, env=environment, input=stdin, capture_output=True, text=True,
                              timeout=120, pass_fds=pass_fds)
        results.append((done.returncode, done.stdout, done.stderr))
    return results


def script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("form", ["script", "module"])
def test_a_command_sees_what_a_new_interpreter_sees(server_ready, tmp_path, form):
    base_path = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                               env=clean_env(), capture_output=True, text=True, check=True).stdout
    script(tmp_path, "shown.py", SHOW.format(path=json.loads(base_path)))
    command = [sys.executable, "shown.py", "a", "b"] if form == "script" else [sys.executable, "-m", "shown", "a"]
    with open(tmp_path / "written", "wb") as held:  # a descriptor the command inherits, as a recipe's lock
        fresh, served = both(command, tmp_path, stdin="read me\n", pass_fds=(held.fileno(),), SEEN="yes", STATUS="3",
                             FD=str(held.fileno()))
    assert (tmp_path / "written").read_text() == "via a descriptor" * 2
    assert fresh[2].endswith("served: False\n") and served[2].endswith("served: True\n")
    assert served[:2] == fresh[:2] and served[0] == 3
    assert served[2].replace("True", "False") == fresh[2]
    assert "True" in served[1] and str(tmp_path) in served[1] and "yes" in served[1] and "READ ME" in served[1]


def test_an_uncaught_exception_ends_as_in_a_new_interpreter(server_ready, tmp_path):
    script(tmp_path, "fails.py", "import sys\nsys.stdout.write('partial')\ndef f():\n    raise ValueError('no')\nf()\n")
    fresh, served = both([sys.executable, "fails.py"], tmp_path)
    assert served == fresh and fresh[0] == 1 and fresh[1] == "partial"
    assert fresh[2].startswith("Traceback") and fresh[2].endswith("ValueError: no\n")
    script(tmp_path, "stops.py", "import sys\nsys.exit('stopped')\n")
    message = both([sys.executable, "stops.py"], tmp_path)
    assert message[0] == message[1] == (1, "", "stopped\n")
    script(tmp_path, "closes.py", "import io, sys\nio.TextIOWrapper(sys.stdout.buffer).write('closed')\n")
    closed = both([sys.executable, "closes.py"], tmp_path)  # the wrapper closes sys.stdout: Python ends as usual
    assert closed[0] == closed[1] == (0, "closed", "")


def test_signals_reach_the_command_and_it_dies_with_its_process(server_ready, tmp_path):
    script(tmp_path, "waits.py", "import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    for sent, last in ((signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, None)):
        process = subprocess.Popen([sys.executable, "waits.py"], cwd=tmp_path, env=clean_env(), text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pytest-xdist's workers ignore it
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        process.stdout.readline()
        process.send_signal(sent)
        _, err = process.communicate(timeout=30)
        assert process.returncode == -sent
        assert (err.strip().splitlines() or [None])[-1] == last
    process = subprocess.Popen([sys.executable, "waits.py"], cwd=tmp_path, env=clean_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pid = int(process.stdout.readline())
    assert pid != process.pid  # served: the command runs in a fork of the server, which ps shows as the command
    with open(f"/proc/{pid}/cmdline") as cmdline, open(f"/proc/{pid}/comm") as comm:
        assert cmdline.read().rstrip("\0").split("\0") == [sys.executable, "waits.py"]
        assert comm.read() == os.path.basename(sys.executable)[:15] + "\n"
    process.kill()
    process.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the command's process {pid} outlived the process that started it")


def test_what_a_fork_cannot_copy_runs_in_a_new_interpreter(server_ready, tmp_path):
    script(tmp_path, "which.py", "import sys\nprint('fairseq' in sys.modules)\n")
    served = both([sys.executable, "which.py"], tmp_path)[1]
    assert served[1] == "True\n"
    for env in ({"OMP_NUM_THREADS": "2"}, {"PYTHONHASHSEED": "7"}):
        assert both([sys.executable, "which.py"], tmp_path, **env)[1][1] == "False\n", env
    assert both([sys.executable, "-X", "utf8", "which.py"], tmp_path)[1][1] == "False\n"


@pytest.mark.parametrize("option", ["ignore", "error::UserWarning", "default"])
def test_pythonwarnings_takes_effect_as_at_start(server_ready, tmp_path, option):
    script(tmp_path, "warns.py", "import sys, warnings\nwarnings.warn('careful')\nprint(sys.warnoptions)\n")
    fresh, served = both([sys.executable, "warns.py"], tmp_path, PYTHONWARNINGS=option)
    assert served == fresh
    assert fresh[1] == ("" if option.startswith("error") else f"[{option!r}]\n")
