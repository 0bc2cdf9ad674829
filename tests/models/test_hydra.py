"""fairseq-hydra-train with the plugin: the package's training configs as YAML
(``fairseq-ext config-dir``), every plugin option settable under ``model:``, and a run through
hydra that is the run through fairseq-train's flags (same losses, same weights), resumes,
and decodes with fairseq-generate and fairseq-ext translate, for M-10 and MS-1+AIF."""
import logging
import os
import re
import sys

import pytest
import torch
import yaml

from fairseq_ext import resources
from fairseq_ext.tools import hydra_configs
from model_utils import USER_DIR, train_in_process
from script_utils import run

TINY = {"encoder_layers": 2, "decoder_layers": 2, "encoder_embed_dim": 32, "decoder_embed_dim": 32,
        "encoder_ffn_embed_dim": 64, "decoder_ffn_embed_dim": 64, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2}
ROWS = {"m-10": {"joint_attention": "m-10"},
        "ms-1-plus-aif": {"aux_decoder_layers": "1", "aux_fusion": "true"}}


def command(name):
    return [os.path.join(os.path.dirname(sys.executable), name)]


def test_every_training_config_is_written_as_yaml_with_its_flags(tmp_path):
    res = run([sys.executable, "-m", "fairseq_ext", "config-dir", "--out", str(tmp_path / "cfg")])
    assert res.returncode == 0 and res.stdout.strip() == str(tmp_path / "cfg"), res.stderr[-2000:]
    assert res.stderr == "", res.stderr[-2000:]  # no INFO or DEBUG lines of fairseq and hydra
    assert sorted(os.listdir(tmp_path / "cfg")) == sorted(f"{n}.yaml" for n in resources.config_names())
    quickstart = yaml.safe_load((tmp_path / "cfg" / "quickstart.yaml").read_text())
    assert quickstart["common"]["user_dir"] == USER_DIR
    assert quickstart["model"] == {"_name": "multilayer_transformer_iwslt", "share_all_embeddings": True,
                                   "attention_dropout": 0.0, "activation_dropout": 0.0}
    # the typed groups in full (each field overridable without +), linked fields as links
    assert {k: quickstart["optimizer"][k] for k in ("_name", "adam_betas", "adam_eps", "lr")} == {
        "_name": "adam", "adam_betas": "(0.9,0.98)", "adam_eps": 1e-9, "lr": "${optimization.lr}"}
    assert quickstart["criterion"]["_name"] == "label_smoothed_cross_entropy"
    assert quickstart["criterion"]["label_smoothing"] == 0.1
    assert quickstart["checkpoint"] == {"no_epoch_checkpoints": True, "keep_last_epochs": 1}
    assert quickstart["task"]["source_lang"] is None and quickstart["task"]["data"] == "DATA_BIN"
    iwslt = yaml.safe_load((tmp_path / "cfg" / "iwslt.yaml").read_text())
    assert iwslt["optimization"]["lr"] == [7e-4] and iwslt["task"]["max_source_positions"] == 150
    assert {k: iwslt["lr_scheduler"][k] for k in ("_name", "warmup_updates", "warmup_init_lr", "lr")} == {
        "_name": "cosine", "warmup_updates": 4000, "warmup_init_lr": 1e-7, "lr": "${optimization.lr}"}


def losses(log):
    return re.findall(r"loss[ =]([0-9.]+)", log)


@pytest.mark.slow
@pytest.mark.parametrize("row", sorted(ROWS))
def test_a_hydra_run_is_the_flags_run_and_resumes_and_decodes(tiny_trained, tmp_path, row, caplog):
    bin_dir, _ = tiny_trained
    cfg_dir = tmp_path / "cfg"
    hydra_configs.write_config_dir(str(cfg_dir))
    criterion = "multi_output_label_smoothed_cross_entropy" if row.startswith("ms") else "label_smoothed_cross_entropy"
    model = {**TINY, **ROWS[row]}
    overrides = [f"task.data={bin_dir}", "task.source_lang=src", "task.target_lang=tgt", "common.cpu=true",
                 "common.seed=1", "common.log_interval=1", "common.log_format=simple", "dataset.max_tokens=500",
                 "optimization.max_update=2", "optimization.lr=[0.001]", f"criterion._name={criterion}",
                 "lr_scheduler.warmup_updates=10", f"checkpoint.save_dir={tmp_path / 'hydra'}",
                 "hydra.run.dir=" + str(tmp_path / "hydra-out"), *(f"+model.{k}={v}" for k, v in model.items())]
    hydra = run(command("fairseq-hydra-train") + ["--config-dir", str(cfg_dir), "--config-name", "quickstart",
                                                   *overrides])
    assert hydra.returncode == 0, hydra.stderr[-3000:]
    flags = [f"--{k.replace('_', '-')}" + ("" if v == "true" else f"={v}") for k, v in model.items()]
    with caplog.at_level(logging.INFO):
        train_in_process([bin_dir, "--user-dir", USER_DIR,
            "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "multilayer_transformer_iwslt",
            "--share-all-embeddings", "--attention-dropout", "0.0", "--activation-dropout", "0.0", "--optimizer", "adam",
            "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-9", "--clip-norm", "0.0", "--lr-scheduler", "inverse_sqrt",
            "--warmup-init-lr", "1e-7", "--warmup-updates", "10", "--criterion", criterion, "--label-smoothing", "0.1",
            "--no-epoch-checkpoints", "--keep-last-epochs", "1", "--num-workers", "0", "--cpu", "--seed", "1",
            "--log-interval", "1", "--log-format", "simple", "--max-tokens", "500", "--max-update", "2", "--lr", "0.001",
            "--save-dir", str(tmp_path / "flags"), *flags])
    assert losses(hydra.stdout + hydra.stderr) == losses(caplog.text) != []
    a = torch.load(tmp_path / "hydra" / "checkpoint_last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "flags" / "checkpoint_last.pt", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    saved = torch.load(tmp_path / "hydra" / "checkpoint_last.pt", weights_only=False)["cfg"]["model"]
    for key, value in ROWS[row].items():  # the options (and every default) in the checkpoint
        assert str(saved[key]).lower() == value
    # resumed: the same command with a larger max_update goes on from update 2
    again = run(command("fairseq-hydra-train") + ["--config-dir", str(cfg_dir), "--config-name", "quickstart",
                                                   *[o if o != "optimization.max_update=2" else
                                                     "optimization.max_update=3" for o in overrides]])
    assert again.returncode == 0 and "(epoch 1 @ 2 updates" in again.stdout + again.stderr, again.stderr[-3000:]
    checkpoint = tmp_path / "hydra" / "checkpoint_last.pt"
    assert torch.load(checkpoint, weights_only=False)["optimizer_history"][-1]["num_updates"] == 3
    generate = run(command("fairseq-generate") + [bin_dir, "--user-dir", USER_DIR, "--path", str(checkpoint),
                                                  "--gen-subset", "test", "--beam", "2", "--cpu", "-s", "src",
                                                  "-t", "tgt"])
    assert generate.returncode == 0 and "Translated" in generate.stdout + generate.stderr, generate.stderr[-2000:]
    translate = run([sys.executable, "-m", "fairseq_ext", "translate", "--checkpoint", str(checkpoint), "--data",
                     bin_dir, "--cpu", "--beam", "2"], cwd=tmp_path)
    assert translate.returncode == 0, translate.stderr[-2000:]


# sizes as fairseq's hydra docs write them, at values no preset has (3 encoder layers, 2 decoder)
NESTED = {"encoder": {"layers": 3, "embed_dim": 32, "ffn_embed_dim": 64, "attention_heads": 4},
          "decoder": {"layers": 2, "embed_dim": 32, "ffn_embed_dim": 64, "attention_heads": 4}}
FLAT = [f"--{side}-{key.replace('_', '-')}={value}" for side, group in NESTED.items() for key, value in group.items()]


def nested_config(arch, *flags):
    """The model config of a YAML as fairseq's hydra docs write it: ``_name``, the plugin's
    options (the fields the flags change) and the sizes nested; fairseq's ``build_model``
    then applies the preset, as fairseq-hydra-train does."""
    from omegaconf import OmegaConf

    from fairseq_ext.model_builder import parse_model_args

    given, default = vars(parse_model_args(arch, *flags)), vars(parse_model_args(arch))
    options = {k: v for k, v in given.items() if v != default.get(k) and k != "joint_attention_layers"}
    return OmegaConf.create({"_name": arch, **options, **NESTED})


@pytest.mark.parametrize("name", sorted(__import__("joint_attention_reference").OPTION_SETS))
def test_nested_sizes_build_what_the_flat_flags_build(name):
    """Every option set: a config with nested sizes builds the model the flat flags build
    (n, auxiliary layers, DC, MMA heads and presets all read the sizes fairseq builds from):
    the same parameters, initialised the same, the same output."""
    from types import SimpleNamespace

    from fairseq import models

    from fairseq_ext.model_builder import build_model, make_dictionary
    from joint_attention_reference import OPTION_SETS

    dictionary = make_dictionary()
    arch = "multilayer_transformer_iwslt"
    flat, _ = build_model(arch, *FLAT, *OPTION_SETS[name], dictionary=dictionary, seed=0)
    cfg = nested_config(arch, *OPTION_SETS[name])
    torch.manual_seed(0)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    nested = models.build_model(cfg, task).eval()
    assert cfg.encoder_layers == 3 and cfg.decoder_layers == 2 and cfg.encoder_embed_dim == 32
    a, b = flat.state_dict(), nested.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    src = torch.randint(4, len(dictionary), (2, 7))
    prev = torch.randint(4, len(dictionary), (2, 5))
    with torch.no_grad():
        assert torch.equal(flat(src, torch.tensor([7, 7]), prev)[0], nested(src, torch.tensor([7, 7]), prev)[0])


@pytest.mark.slow
def test_a_hand_written_nested_yaml_trains_and_decodes(tiny_trained, tmp_path):
    """fairseq-hydra-train with a YAML written as fairseq's docs write it (sizes nested) and a
    command-line override of a nested size: M-10 over the 3 layers built, then fairseq-generate."""
    bin_dir, _ = tiny_trained
    config = {"common": {"user_dir": USER_DIR, "cpu": True, "seed": 1, "log_format": "simple"},
              "task": {"_name": "translation", "data": bin_dir, "source_lang": "src", "target_lang": "tgt"},
              "model": {"_name": "multilayer_transformer_iwslt", "share_all_embeddings": True,
                        "joint_attention": "iter-c-agg", **NESTED},
              "criterion": {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1},
              "optimizer": {"_name": "adam", "adam_betas": "(0.9,0.98)"}, "lr_scheduler": {"_name": "fixed"},
              "optimization": {"lr": [0.001], "max_update": 2},
              "dataset": {"max_tokens": 500},
              "checkpoint": {"save_dir": str(tmp_path / "ck"), "no_epoch_checkpoints": True}}
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "mine.yaml").write_text(yaml.safe_dump(config))
    hydra = run(command("fairseq-hydra-train") + ["--config-dir", str(tmp_path / "cfg"), "--config-name", "mine",
                                                   "model.encoder.layers=4", "model.joint_attention=m-10",
                                                   "hydra.run.dir=" + str(tmp_path / "out")])
    assert hydra.returncode == 0, hydra.stderr[-3000:]
    checkpoint = tmp_path / "ck" / "checkpoint_last.pt"
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["cfg"]["model"]["encoder"]["layers"] == saved["cfg"]["model"]["encoder_layers"] == 4
    assert saved["cfg"]["model"]["joint_attention_layers"] == 4  # n: every layer built
    flags = [f for f in FLAT if not f.startswith("--encoder-layers")] + ["--encoder-layers=4"]
    flat, _ = __import__("fairseq_ext.model_builder").model_builder.build_model(
        "multilayer_transformer_iwslt", "--share-all-embeddings", "--joint-attention", "m-10", *flags,
        dictionary=__import__("fairseq.data").data.Dictionary.load(os.path.join(bin_dir, "dict.src.txt")))
    assert {k: v.shape for k, v in saved["model"].items()} == {k: v.shape for k, v in flat.state_dict().items()}
    generate = run(command("fairseq-generate") + [bin_dir, "--user-dir", USER_DIR, "--path", str(checkpoint),
                                                  "--gen-subset", "test", "--beam", "2", "--cpu", "-s", "src",
                                                  "-t", "tgt"])
    assert generate.returncode == 0 and "Translated" in generate.stdout + generate.stderr, generate.stderr[-2000:]


def test_config_dir_never_replaces_a_users_yaml(tmp_path, capsys):
    """--out naming a folder with a user's iwslt.yaml, or a file, is refused in one line; a
    folder it wrote before is written again."""
    mine = tmp_path / "iwslt.yaml"
    mine.write_text("model: {_name: mine}\n")
    assert hydra_configs.main(["--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"fairseq-ext config-dir: error: --out {tmp_path}: iwslt.yaml there was not written by fairseq-ext "
        "config-dir (it would be replaced): choose another folder"]
    assert mine.read_text() == "model: {_name: mine}\n"
    assert hydra_configs.main(["--out", str(mine)]) == 1
    err = capsys.readouterr().err
    assert "exists and is not a folder" in err and len(err.strip().splitlines()) == 1
    ours = tmp_path / "ours"
    for _ in range(2):
        assert hydra_configs.main(["--out", str(ours)]) == 0
