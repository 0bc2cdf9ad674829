"""``--bf16`` without ``--tpu``: fairseq 0.12 turns it into ``--tpu`` (its XLA path, which dies
without torch_xla); with the plugin loaded it trains on the device it runs on, in bf16 with
fairseq's FP16Optimizer, while ``--tpu`` (or an installed torch_xla) keeps fairseq's meaning."""
import subprocess

import torch
from fairseq import options

from fairseq_ext.guards import bf16
from model_utils import TINY_TRAIN_FLAGS, USER_DIR, clean_env


def parsed(*flags):
    return options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--user-dir", USER_DIR, "--arch", "multilayer_transformer", "--cpu", *flags])


def test_bf16_alone_no_longer_means_tpu(monkeypatch):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = parsed("--bf16")
    assert args.tpu  # fairseq's own parsing: --bf16 implies --tpu
    monkeypatch.setattr("sys.argv", ["fairseq-train", "data", "--bf16"])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.bf16 and not cfg.common.tpu
    # asked for: --tpu stays
    monkeypatch.setattr("sys.argv", ["fairseq-train", "data", "--bf16", "--tpu"])
    assert convert_namespace_to_omegaconf(parsed("--bf16", "--tpu")).common.tpu
    # where torch_xla could run it, --bf16 keeps fairseq's meaning
    monkeypatch.setattr("sys.argv", ["fairseq-train", "data", "--bf16"])
    monkeypatch.setattr(bf16.importlib.util, "find_spec", lambda name: object() if name == "torch_xla" else None)
    assert convert_namespace_to_omegaconf(parsed("--bf16")).common.tpu


def test_fairseq_train_bf16_trains_a_bf16_model(tiny_trained, tmp_path):
    bin_dir, _ = tiny_trained
    res = subprocess.run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", "multilayer_transformer",
                          *TINY_TRAIN_FLAGS, "--bf16", "--max-update", "3", "--save-dir", str(tmp_path)],
                         capture_output=True, text=True, env=clean_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert "torch_xla" not in res.stderr and "training ended: 3 of 3 updates" in res.stdout + res.stderr
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    # fairseq saves the model's weights as fp32: values of a bf16 model, so each is a bf16 number
    weights = [v for k, v in state["model"].items() if k.endswith("fc1.weight")]
    assert weights and all(torch.equal(w, w.to(torch.bfloat16).to(w.dtype)) for w in weights)
    assert state["cfg"]["common"]["bf16"] and not state["cfg"]["common"]["tpu"]
