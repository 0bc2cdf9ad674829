"""One-line errors (fairseq_ext/guards/one_line_errors.py): where the plugin refuses an
option, the message is the first thing the user sees, one line naming the option, not the
end of a traceback; a traceback on request, and other exceptions keep theirs."""
import subprocess

import pytest

from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env


def train(bin_dir, save_dir, *flags, env=None):
    return subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                           *TINY_TRAIN_FLAGS, "--max-update", "1", "--save-dir", str(save_dir), *flags],
                          capture_output=True, text=True, env=env or clean_env(), timeout=300)


@pytest.mark.parametrize("flags,message", [
    (("--decoder-self-attention", "mma", "--decoder-mma-heads", "G,B"), "--decoder-mma-heads 'G,B' has G head(s)"),
    (("--decoder-mma-heads", "L,B"), "--decoder-mma-heads 'L,B' needs --decoder-self-attention mma"),
    (("--mma-heads", "G,L"), "--mma-heads 'G,L' needs --encoder-self-attention mma"),
    (("--encoder-self-attention", "dc", "--dc-kernel-size", "0"), "--dc-kernel-size (0) must be at least 1"),
    (("--joint-attention", "m-00", "--joint-attention-layers", "9"), "--joint-attention-layers (9) exceeds"),
])
def test_option_errors_are_one_line_before_fairseq_logs_anything(tiny_trained, tmp_path, flags, message):
    bin_dir, _ = tiny_trained
    result = train(bin_dir, tmp_path / "ckpt", *flags)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [f"fairseq-train: error: {errors[0].split('error: ', 1)[1]}"] and message in errors[0], \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    # refused while parsing the options: fairseq has not logged its configuration yet
    assert "fairseq_cli.train" not in result.stderr + result.stdout
    assert not (tmp_path / "ckpt").exists()


def test_traceback_on_request(tiny_trained, tmp_path):
    bin_dir, _ = tiny_trained
    env = clean_env()
    env["FAIRSEQ_EXT_TRACEBACK"] = "1"
    result = train(bin_dir, tmp_path / "ckpt", "--mma-heads", "G,L", env=env)
    assert result.returncode == 1 and "Traceback" in result.stderr and "OptionError" in result.stderr


def test_other_exceptions_keep_their_traceback():
    import sys

    result = subprocess.run([sys.executable, "-c", "import fairseq_ext; raise KeyError('x')"],
                            capture_output=True, text=True, env=clean_env())
    assert result.returncode == 1 and "Traceback" in result.stderr and "KeyError" in result.stderr
