"""Distributed training through scripts/train.sh: two CPU processes (gloo) form one world of
two and split the data, instead of two independent worlds of one; the run stops and resumes
with the same command; the two processes synchronise gradients like --update-freq 2;
train.sh names the data or option it refuses; the Slurm script runs train.sh once per node."""
import os
import re
import socket
import subprocess

import pytest

from model_utils import REPO, TINY_TRAIN_FLAGS, clean_env, make_tiny_parallel_data

TRAIN = os.path.join(REPO, "scripts", "train.sh")
FLAGS = [f for f in TINY_TRAIN_FLAGS if f != "--cpu"]  # train.sh chooses the device


def free_port() -> str:
    """A port nobody listens on now (others may run these tests on the same machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def updates_in_epoch_1(log: str) -> int:
    match = re.search(r"\| train \| epoch 001 .*?\| num_updates (\d+)", log)
    assert match, log[-3000:]
    return int(match.group(1))


@pytest.mark.slow
def test_two_cpu_processes_form_one_world(tmp_path):
    bin_dir = make_tiny_parallel_data(str(tmp_path), num_train=400)
    env = clean_env()
    env["MASTER_PORT"] = free_port()
    common = ["--", "--arch", "multilayer_transformer", "--joint-attention", "m-00", *FLAGS, "--max-epoch", "1"]
    single = subprocess.run(["bash", TRAIN, bin_dir, str(tmp_path / "one"), *common],
                            capture_output=True, text=True, env=env)
    assert single.returncode == 0, single.stderr[-3000:]
    double = subprocess.run(["bash", TRAIN, bin_dir, str(tmp_path / "two"), "--nproc", "2", *common],
                            capture_output=True, text=True, env=env, timeout=300)
    log = double.stdout + double.stderr
    assert double.returncode == 0, log[-3000:]
    assert "distributed init (rank 1): env://" in log
    assert "training on 2 devices" in log
    # each process reads half of the data: about half the updates per epoch
    one, two = updates_in_epoch_1(single.stdout + single.stderr), updates_in_epoch_1(log)
    assert two < one and abs(2 * two - one) <= 2, (one, two)
    assert (tmp_path / "two" / "checkpoint_last.pt").exists()

    # stop and resume the two-process run with the same command (with fairseq's own broadcast,
    # rank 1 cannot load the state rank 0 sends: "Unsupported global: omegaconf.dictconfig.DictConfig")
    more = [a if a != "1" or common[i - 1] != "--max-epoch" else "2" for i, a in enumerate(common)]
    env["MASTER_PORT"] = free_port()
    resumed = subprocess.run(["bash", TRAIN, bin_dir, str(tmp_path / "two"), "--nproc", "2", *more],
                             capture_output=True, text=True, env=env, timeout=300)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    assert "Unsupported global" not in log and "failed" not in log.lower(), log[-3000:]
    assert re.search(r"Loaded checkpoint \S*/two/checkpoint_last\.pt \(epoch 2 @ %d updates\)" % two, log), log[-3000:]
    assert "| train | epoch 001" not in log  # epoch 1 was not trained again
    assert re.search(r"\| train \| epoch 002 .*\| num_updates %d" % (2 * two), log), log[-3000:]
    assert "done training" in log


def test_train_sh_rejects_missing_data(tmp_path):
    result = subprocess.run(["bash", TRAIN, str(tmp_path / "nope"), str(tmp_path / "ckpt"), "--", "--arch", "x"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "no binarized data directory" in result.stderr


@pytest.mark.parametrize("flags,message", [
    (["--nproc", "abc"], "--nproc must be a positive integer (processes on this node), not 'abc'"),
    (["--nproc", "0"], "--nproc must be a positive integer"),
    (["--nnodes", "two"], "--nnodes must be a positive integer, not 'two'"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be an integer in 0..1"),
    (["--master-port", "70000"], "--master-port must be a port number (1-65535), not '70000'"),
    (["--nproc", "-1"], "--nproc must be a positive integer (processes on this node), not '-1'"),
    (["--nproc", "2", "--nnodes", "2", "--node-rank", "x"], "--node-rank must be an integer in 0..1 (--nnodes 2), not 'x'"),
    (["--master-port", "80a"], "--master-port must be a port number (1-65535), not '80a'"),
    (["--master-port", ""], "--master-port must be a port number (1-65535), not ''"),
    (["--nproc"], "option --nproc needs a value"),
    (["--nproc", "--", "--arch", "x"], "option --nproc needs a value"),
    (["--master-port", "--nproc", "2"], "option --master-port needs a value"),
    (["--config", "--nproc", "2"], "option --config needs a value"),
    (["--nprocs", "2"], "unknown option --nprocs (fairseq-train flags go after --)"),
])
def test_train_sh_names_the_option_it_refuses(tmp_path, flags, message):
    result = subprocess.run(["bash", TRAIN, str(tmp_path), str(tmp_path / "ckpt"), *flags, "--", "--arch", "x"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and f"train.sh: error: {message}" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # the message alone, no bash noise


def test_train_sh_names_a_bad_master_port_from_the_environment(tmp_path):
    env = dict(os.environ, MASTER_PORT="abc")
    result = subprocess.run(["bash", TRAIN, str(tmp_path), str(tmp_path / "ckpt"), "--", "--arch", "x"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert "train.sh: error: MASTER_PORT (from the environment) must be a port number (1-65535), not 'abc'" in \
        result.stderr
    # --master-port wins over the environment
    result = subprocess.run(["bash", TRAIN, str(tmp_path / "nope"), str(tmp_path / "ckpt"), "--nproc", "08",
                             "--master-port", "08080", "--", "--arch", "x"], capture_output=True, text=True, env=env)
    assert result.returncode == 1 and "no binarized data directory" in result.stderr, result.stderr


def _parameters(path):
    from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state

    return load_checkpoint_state(path)["model"]


@pytest.mark.slow
def test_two_processes_synchronise_gradients_like_update_freq_2(tmp_path):
    """Gradient synchronisation, not only the world size: fairseq gives rank r the batches
    r, r+2, ... of the same shuffled epoch, and one process with --update-freq 2 accumulates
    batches (0, 1), (2, 3), ...; with dropout off, both see the same sentences per update and
    must end with the same parameters (up to float summation order). A run that does not
    accumulate (update-freq 1) ends elsewhere, so the comparison can fail."""
    import torch

    bin_dir = make_tiny_parallel_data(str(tmp_path), num_train=397)
    env = clean_env()
    common = ["--arch", "multilayer_transformer", "--joint-attention", "m-00", "--aux-decoder-layers", "1",
              "--criterion", "multi_output_label_smoothed_cross_entropy", *FLAGS, "--dropout", "0",
              "--attention-dropout", "0", "--activation-dropout", "0", "--max-update", "4", "--max-epoch", "1",
              "--max-tokens", "300", "--no-save-optimizer-state", "--save-interval-updates", "0"]
    runs = {"two": ["--nproc", "2", "--", *common], "accumulated": ["--", *common, "--update-freq", "2"],
            "plain": ["--", *common]}
    for name, args in runs.items():
        env["MASTER_PORT"] = free_port()
        res = subprocess.run(["bash", TRAIN, bin_dir, str(tmp_path / name), *args], capture_output=True, text=True,
                             env=env, timeout=300)
        log = res.stdout + res.stderr
        assert res.returncode == 0, log[-3000:]
        assert "num_updates 4" in log, log[-3000:]
        if name == "two":
            assert "training on 2 devices" in log
    two, acc, plain = (_parameters(tmp_path / n / "checkpoint_last.pt") for n in ("two", "accumulated", "plain"))
    assert two.keys() == acc.keys()
    worst = max((two[k].float() - acc[k].float()).abs().max().item() for k in two)
    print(f"two processes vs --update-freq 2: max |diff| {worst:.2e}")
    assert worst < 1e-5, worst
    moved = max((plain[k].float() - acc[k].float()).abs().max().item() for k in two)
    print(f"--update-freq 1 vs 2: max |diff| {moved:.2e}")
    assert moved > 1e-3, moved
    # and the parameters did move from their initial values (4 real updates)
    assert any(not torch.equal(two[k], plain[k]) for k in two)


def test_slurm_script_runs_train_sh_once_per_node(tmp_path):
    """scripts/slurm/train.sbatch under fake scontrol/srun: one train.sh per node, each with its
    node rank, the first node as master, the GPUs per node as --nproc, the arguments passed on."""
    fake_bin, fake_repo = tmp_path / "bin", tmp_path / "repo"
    (fake_repo / "scripts").mkdir(parents=True)
    fake_bin.mkdir()
    # the second host comes late, as from a slow scontrol: a reader that stops after the first
    # line (`| head -n 1` under pipefail) kills scontrol with SIGPIPE and the job with exit 141
    (fake_bin / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-node-07\\n'; sleep 0.3; printf 'gpu-node-08\\n'\n")
    # srun: run the task once per node, as SLURM would, with SLURM_NODEID set
    (fake_bin / "srun").write_text('#!/bin/bash\nfor n in 0 1; do SLURM_NODEID=$n "${@: -3}"; done\n')
    (fake_repo / "scripts" / "train.sh").write_text('#!/bin/bash\necho "node: $*"\n')
    for f in (fake_bin / "scontrol", fake_bin / "srun"):
        f.chmod(0o755)
    env = dict(clean_env(), PATH=f"{fake_bin}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu-node-[07-08]",
               SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="4", FAIRSEQ_EXT_REPO=str(fake_repo), MASTER_PORT="29511")
    script = os.path.join(REPO, "scripts", "slurm", "train.sbatch")
    res = subprocess.run(["bash", script, "data-bin/wmt14", "ckpt", "--config", "configs/wmt14.args", "--",
                          "--arch", "multilayer_transformer_mlmha_wmt_en_de", "--fp16"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stdout.splitlines() if l.startswith("node: ")]
    common = ("data-bin/wmt14 ckpt --nproc 4 --nnodes 2 --master-addr gpu-node-07 --master-port 29511 "
              "--node-rank {} --config configs/wmt14.args -- --arch multilayer_transformer_mlmha_wmt_en_de --fp16")
    assert lines == ["node: " + common.format(0), "node: " + common.format(1)]
    bad = subprocess.run(["bash", script, "d", "c", "--nproc", "2"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--nproc comes from SLURM here" in bad.stderr


def test_train_sh_on_one_node_takes_a_free_port(tmp_path):
    """Without --master-port or MASTER_PORT, a run on one node does not take 29500, which a second
    run at once would find in use (EADDRINUSE) before it reached its save dir's lock."""
    import signal

    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 29500))
    except OSError:
        pass  # already in use: the same test
    env = {k: v for k, v in clean_env().items() if k != "MASTER_PORT"}
    proc = subprocess.Popen(["bash", TRAIN, str(tmp_path), str(tmp_path / "ckpt"), "--nproc", "2", "--", "--arch",
                             "transformer", "--cpu"], stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        line = next((l for l in proc.stderr if "[train.sh] world size" in l), "")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        busy.close()
    port = int(re.search(r", port (\d+)$", line.strip()).group(1))
    assert port != 29500 and 1024 <= port <= 65535, line
