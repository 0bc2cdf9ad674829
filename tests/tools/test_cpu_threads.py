"""The CPU thread default of training (fairseq_ext/standalone/cpu.py): the cores idle at the
start, never fewer than one thread per process."""
import subprocess
import sys

import pytest

from fairseq_ext.standalone import cpu


@pytest.mark.parametrize("idle,cores,processes,want", [
    (2.0, 2, 1, 2),   # an idle 2-core machine: both cores
    (1.0, 2, 1, 1),   # one competing 1-core job: one thread (70 vs 203 updates in 100 s measured)
    (0.8, 2, 1, 1),   # three quarters of a core count as free
    (0.1, 2, 1, 1),   # a fully busy machine still gets one thread
    (16.0, 16, 4, 4),  # four processes share the idle cores
    (3.0, 16, 4, 1),
])
def test_threads_follow_the_idle_cores(monkeypatch, idle, cores, processes, want):
    monkeypatch.setattr(cpu, "idle_cores", lambda seconds=0.5: (idle, cores))
    threads, why = cpu.threads_per_process(processes)
    assert threads == want
    assert why.startswith(f"{idle:.1f} of {cores} cores idle")
    assert ("busy with other work" in why) == (int(idle + 0.25) < cores)


def test_idle_cores_are_measured_on_the_usable_cores():
    idle, cores = cpu.idle_cores(0.2)
    assert cores == len(cpu.usable_cores()) >= 1 and 0.0 <= idle <= cores


def test_the_file_runs_without_the_package():
    res = subprocess.run([sys.executable, cpu.__file__, "threads", "1"], capture_output=True, text=True)
    threads, why = res.stdout.splitlines()
    assert res.returncode == 0 and int(threads) >= 1 and "cores idle" in why


@pytest.mark.parametrize("command", ["translate", "score", "evaluate"])
def test_decoding_commands_pick_their_threads_as_training_does(monkeypatch, capsys, command):
    """translate, score and evaluate set OMP_NUM_THREADS from the idle cores before torch loads
    (fairseq-generate inherits it); one the user set wins, and --help measures nothing."""
    import types

    from fairseq_ext import cli

    seen = {}
    fake = types.ModuleType("fake_decoding_command")
    fake.main = lambda argv: seen.update(threads=cli.os.environ.get("OMP_NUM_THREADS"), argv=argv)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(cli.COMMANDS, command, fake.__name__)
    monkeypatch.setattr(cpu, "idle_cores", lambda seconds=0.5: (1.0, 2))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cli.main([command, "--x"]) == 0 and seen == {"threads": "1", "argv": ["--x"]}
    assert f"[fairseq-ext {command}] CPU: 1 thread(s) (1.0 of 2 cores idle, 1 busy" in capsys.readouterr().err
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli.main([command]) == 0 and seen["threads"] == "2" and "CPU:" not in capsys.readouterr().err
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cli.main([command, "--help"]) == 0 and "OMP_NUM_THREADS" not in cli.os.environ
